"""Thread 4: data parallelism vs tensor parallelism: which layout of the devices serves this model best?

Layouts, side by side under the same load: one server with the engine's own placement; N independent replicas,
each pinned to its share of the devices (one GPU each; on a CPU build, a block of cores), with the client spreading
requests over their endpoints round-robin or to the least-outstanding one (works for every engine); the engine's own
data parallelism (SGLang --dp-size, DP attention; vLLM --data-parallel-size) and tensor parallelism where the version
and the devices allow. On a GPU, N replicas may also share one GPU (each with its memory share through the engine's
memory knob and host cores of its own), time-sliced by the driver or through an MPS daemon the suite runs: the server
is often host-bound, and several host processes can fill a GPU one cannot. A layout the engine or machine refuses is
shown with the refusal, before anything launches; one that launches and then fails is shown with its error and log
line. With two or more GPUs an all-reduce probe (NCCL) turns tensor parallelism's communication into milliseconds per
layer for the model's hidden size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from .. import probes
from ..analysis import kernels as ak
from ..context import RunContext
from ..engines.base import EngineAdapter
from ..engines.devices import visible_devices
from ..errors import KnobError, NotMeasuredError, ServescopeError, SpecError
from ..findings import Change, Finding, Outcome, best_of, sentences, weakest
from ..launch import Prepared, find_install, prepare
from ..load.metrics import per_request_tpot
from ..models import model_config, tiny_model_ready
from ..probes.run import ProbeRun
from ..probes.run import failed as probe_failed
from ..probes.run import skipped as probe_skipped
from ..spec import DeploymentSpec, Knobs, LoadSpec, ProfileSpec
from ..study import Arm, Study, drop_empty, read_or_run, run_study
from ..telemetry.base import UNMEASURED
from ..util import known
from .grouped_gemm import profiled_once

THREAD = "04_data_parallelism"
QUESTION = "Which layout serves best: one server, replicas behind a balancer, engine DP, or TP?"
ONE = "1 server"
SHARED_KINDS = ("shared GPU", "shared GPU + MPS")  # replicas on one GPU, time-sliced or through MPS
# the control fields: every layout runs the same compile and graph configuration as the one server
CONTROLS = ("compile", "graph_decode", "graph_prefill")


@dataclass(frozen=True)
class Layout:
    """One way to use the devices: its arm, what kind of layout it is, the devices it spans, and why it was not
    launched (empty when it was)."""

    arm: Arm
    kind: str  # 'one server' | 'replicas' | 'shared GPU' | 'shared GPU + MPS' | 'engine DP' | 'DP attention' | 'TP'
    devices: int
    refused: str = ""

    @property
    def shares_gpu(self) -> bool:
        """Replicas on one GPU (time-sliced or through MPS)."""
        return self.kind in SHARED_KINDS


@dataclass
class ParallelStudy:
    """The layouts (launched or refused), the measured study, and the all-reduce probe (or why there is none)."""

    layouts: list[Layout]
    study: Study
    device_kind: str  # 'GPUs' | 'cores' | 'devices'
    device_count: int
    allreduce: ProbeRun = field(default_factory=ProbeRun)  # the all-reduce probe: rows and what ran, or why not
    tp_comm: pd.DataFrame = field(default_factory=pd.DataFrame)
    tp_profile: Study | None = None  # the TP layout once more under nsys (profile_tp): what its collectives cost

    def tp_communication(self) -> pd.DataFrame:
        """Per GPU of the profiled TP point: kernel time, the collectives' time (nccl, all-reduce, custom all-reduce
        kernels) and their share of it, and the collective kernel that took most."""
        k = self.tp_profile.kernels() if self.tp_profile is not None else pd.DataFrame()
        if k.empty:
            return pd.DataFrame()
        k = k[k["rep"] == k["rep"].min()]
        rows = []
        for dev, g in k.groupby("device", sort=True):
            cats = ak.categories(g).set_index("category")
            comm = cats.loc["communication"] if "communication" in cats.index else None
            top = ak.top_kernels(g[g["category"] == "communication"], 1)["name"] if comm is not None else None
            rows.append({"config": str(g["config"].iloc[0]), "device": int(dev),
                         "kernel_ms": round(float(cats["kernel_ms"].sum()), 2),
                         "communication_ms": round(float(comm["kernel_ms"]), 2) if comm is not None else 0.0,
                         "communication_kernels": int(comm["kernels"]) if comm is not None else 0,
                         "communication_share": round(float(comm["share"]), 4) if comm is not None else 0.0,
                         "top_communication_kernel": str(top.iloc[0])[:100] if top is not None else ""})
        return pd.DataFrame(rows)

    def outcome(self, findings: list[Finding]) -> Outcome:
        """What the thread measured, for the index: the layouts' points and the TP capture's (a capture that failed is
        a failed point of this thread, not only a finding that says so)."""
        o = self.study.results.outcome(THREAD, findings)
        if self.tp_profile is None:
            return o
        p = self.tp_profile.results.outcome(THREAD, [])
        return o.model_copy(update={
            "points_planned": o.points_planned + p.points_planned, "points_measured": o.points_measured + p.points_measured,
            "points_failed": o.points_failed + p.points_failed, "points_died": o.points_died + p.points_died,
            "points_unmeasured": o.points_unmeasured + p.points_unmeasured,
            "first_error": o.first_error or p.first_error, "first_signal": o.first_signal or p.first_signal})

    def layout(self, name: str) -> Layout:
        """A layout by its arm's name."""
        return next(x for x in self.layouts if x.arm.name == name)

    def overview(self) -> pd.DataFrame:
        """One row per layout: kind, devices, flags or placement, and its status (measured n of m, refused: why,
        failed: the first error)."""
        pts, errs = self.study.results.points, self.study.results.errors
        rows = []
        for x in self.layouts:
            mine = pts[pts["config"] == x.arm.name] if len(pts) else pts
            bad = errs[errs["config"] == x.arm.name] if len(errs) else errs
            if x.refused:
                status = f"refused before launch: {x.refused}"
            elif len(mine):
                status = f"measured ({len(mine)} launches" + (f", {len(bad)} failed" if len(bad) else "") + ")"
            elif len(bad):
                status = "failed: " + str(bad["summary"].iloc[0])
            else:
                status = "not measured"
            rows.append({"layout": x.arm.name, "kind": x.kind, self.device_kind: x.devices,
                         "asks for": x.arm.knobs.label(), "status": status})
        return pd.DataFrame(rows)

    def table(self) -> pd.DataFrame:
        """Per layout and concurrency (medians over repetitions): total output tok/s, per device, TTFT and TPOT."""
        t = self.study.table()
        if t.empty:
            return t
        dev = {x.arm.name: x.devices for x in self.layouts}
        t = t.assign(**{self.device_kind: t["config"].map(dev)})
        t[f"output_tok_s_per_{self.device_kind.rstrip('s').lower()}"] = t["output_tok_s"] / t[self.device_kind]
        cols = ["config", "concurrency", "reps", self.device_kind, "output_tok_s", "output_tok_s_min",
                "output_tok_s_max", f"output_tok_s_per_{self.device_kind.rstrip('s').lower()}", "ttft_ms_p50",
                "tpot_ms_p50", "buffered_pct", "failed"]
        return drop_empty(t[[c for c in cols if c in t]])

    def balance(self) -> pd.DataFrame:
        """Per replicated layout, repetition, level and replica: its requests, output tokens, output tok/s (its tokens
        over the level's duration), TTFT and TPOT medians, and the load imbalance (largest replica's share over an
        even share, minus one)."""
        r = self.study.results.requests
        if r.empty or "replica" not in r:
            return pd.DataFrame()
        names = [x.arm.name for x in self.layouts if x.arm.knobs.replicas > 1]
        r = r[(r["phase"] == "measure") & r["config"].isin(names) & (r["status"] == "ok")]
        if r.empty:
            return pd.DataFrame()
        r = r.assign(tpot_ms=per_request_tpot(r))
        g = r.groupby(["config", "rep", "point", "replica"], as_index=False).agg(
            requests=("request_id", "count"), output_tokens=("output_tokens", "sum"),
            ttft_ms_p50=("ttft_ms", "median"), tpot_ms_p50=("tpot_ms", "median"))
        s = self.study.results.summary
        if len(s) and {"point", "duration_s"} <= set(s.columns):
            g = g.merge(s[["config", "rep", "point", "duration_s"]], on=["config", "rep", "point"], how="left")
            g["output_tok_s"] = g["output_tokens"] / g.pop("duration_s")
        n = g["config"].map({x.arm.name: x.arm.knobs.replicas for x in self.layouts})
        g["share"] = g["output_tokens"] / g.groupby(["config", "rep", "point"])["output_tokens"].transform("sum")
        g["imbalance_pct"] = 100 * (g.groupby(["config", "rep", "point"])["share"].transform("max") * n - 1)
        return g

    def replica_host(self) -> pd.DataFrame:
        """Per replicated layout, repetition, level and replica: the server tree's CPU (median of the sum over its
        processes), its memory, and its busiest thread (median share of a core), from the host sampler (each process
        tagged with its replica)."""
        tele = self.study.results.telemetry
        p = tele.get("server_procs", pd.DataFrame())
        if p.empty or "replica" not in p:
            return pd.DataFrame()
        p = p[p["replica"].notna() & ~p["phase"].str.startswith(UNMEASURED)]
        if p.empty:
            return pd.DataFrame()
        keys = ["config", "rep", "phase", "replica"]
        tree = p.groupby([*keys, "time_unix"], as_index=False).agg(cpu_pct=("cpu_pct", "sum"), rss_mib=("rss_mib", "sum"))
        out = tree.groupby(keys, as_index=False).agg(server_cpu_pct_p50=("cpu_pct", "median"),
                                                     server_rss_mib_max=("rss_mib", "max"))
        t = tele.get("server_threads", pd.DataFrame())
        if len(t) and "replica" in t:
            t = t[t["replica"].notna()]
            med = t.groupby([*keys, "thread", "tid"], as_index=False)["cpu_pct"].median()
            top = med.sort_values("cpu_pct").groupby(keys).tail(1).rename(
                columns={"thread": "busiest_thread", "cpu_pct": "busiest_thread_cpu_pct_p50"}).drop(columns="tid")
            out = out.merge(top, on=keys, how="left")
        out["replica"] = out["replica"].astype(int)
        return out.rename(columns={"phase": "point"})

    def replica_gpu_memory(self) -> pd.DataFrame:
        """Per layout whose replicas share a GPU, repetition and replica: the GPU memory its processes held at most
        (NVML's per-process reading, each process matched to its replica by pid; NaN where the driver does not say
        per process), and how NVML listed it (a compute context, or an MPS client)."""
        tele = self.study.results.telemetry
        gp, sp = tele.get("gpu_procs", pd.DataFrame()), tele.get("server_procs", pd.DataFrame())
        names = [x.arm.name for x in self.layouts if x.shares_gpu]
        if gp.empty or sp.empty or "replica" not in sp:
            return pd.DataFrame()
        owner = sp[sp["config"].isin(names)][["config", "rep", "pid", "replica"]].dropna().drop_duplicates()
        m = gp.merge(owner, on=["config", "rep", "pid"], how="inner")
        if m.empty:
            return pd.DataFrame()
        per_t = m.groupby(["config", "rep", "replica", "gpu", "context", "time_unix"], as_index=False)[
            "used_gpu_mem_mib"].sum(min_count=1)
        out = per_t.groupby(["config", "rep", "replica", "gpu", "context"], as_index=False).agg(
            used_gpu_mem_mib_max=("used_gpu_mem_mib", "max"), readings=("time_unix", "nunique"))
        out["replica"] = out["replica"].astype(int)
        return out

    def gpu_activity(self) -> pd.DataFrame:
        """Did sharing fill the GPU? Per layout and level (medians over repetitions): GPM SM activity and occupancy,
        NVML utilization, power, and the GPU memory in use at most."""
        gp = self.study.gpu_points()
        if gp.empty:
            return pd.DataFrame()
        cols = [c for c in ("sm_active_pct_p50", "sm_occupancy_pct_p50", "gpu_util_pct_p50", "power_w_p50",
                            "mem_used_mib_max") if c in gp]
        out = gp.groupby(["config", "phase", "gpu"], as_index=False, sort=False)[cols].median()
        return drop_empty(out.rename(columns={"phase": "point"}))

    def mps_check(self) -> pd.DataFrame:
        """Per point of a layout whose replicas share a GPU: how they shared it, and with MPS whose daemon served and
        whether every replica was its client (read from the daemon's server and client lists at launch)."""
        rows = []
        for (config, rep), pt in sorted(self.study.results.stored.items()):
            share = pt.gpu_share
            if share is None:
                continue
            rows.append({"config": config, "rep": rep, "mode": share.mode, "daemon": share.daemon,
                         "active_thread_pct": share.active_thread_pct,
                         "mps_servers": ", ".join(map(str, share.mps_servers)),
                         "clients": ", ".join(f"replica {r}: {'yes' if ok else 'NO'}" for r, ok in share.clients.items()),
                         "note": share.note})
        return drop_empty(pd.DataFrame(rows))

    def memory(self) -> pd.DataFrame:
        """Memory headroom per layout and level: GPU memory free at the level's peak (NVML) per GPU, or on a CPU
        build the host's available memory (median) and the server trees' resident memory."""
        gp = self.study.gpu_points()
        if len(gp) and "mem_used_mib_max" in gp:
            static = self.study.results.telemetry.get("gpu_static", pd.DataFrame())
            total = static.groupby("gpu")["mem_total_mib"].max() if "mem_total_mib" in static else pd.Series(
                dtype=float)
            g = gp.groupby(["config", "phase", "gpu"], as_index=False)["mem_used_mib_max"].median()
            g["mem_total_mib"] = g["gpu"].map(total)
            g["headroom_mib"] = g["mem_total_mib"] - g["mem_used_mib_max"]
            return drop_empty(g.rename(columns={"phase": "point"}))
        host = self.study.results.telemetry.get("host_cpu", pd.DataFrame())
        procs = self.study.results.telemetry.get("server_procs", pd.DataFrame())
        if host.empty or "mem_available_mib" not in host:
            return pd.DataFrame()
        host = host[~host["phase"].str.startswith(UNMEASURED)]
        out = host.groupby(["config", "phase"], as_index=False)["mem_available_mib"].median()
        if len(procs):
            pr = procs[~procs["phase"].str.startswith(UNMEASURED)]
            rss = pr.groupby(["config", "rep", "phase", "time_unix"], as_index=False)["rss_mib"].sum()
            rss = rss.groupby(["config", "phase"], as_index=False)["rss_mib"].max().rename(
                columns={"rss_mib": "server_rss_mib_max"})
            out = out.merge(rss, on=["config", "phase"], how="left")
        return out.rename(columns={"phase": "point", "mem_available_mib": "host_mem_available_mib"})


def _expressible(knobs: Knobs, prep: Prepared | None, deployment: DeploymentSpec | None = None) -> str:
    """'' if the engine version and this machine can run knobs (on the deployment), else why not (nothing launched)."""
    if prep is None:
        return ""
    try:
        prep.adapter.check_knobs((deployment or DeploymentSpec()).apply(knobs), prep.install, prep.engine.env,
                                 prep.model_path)
    except (KnobError, SpecError) as e:
        return str(e)
    return ""


ROUTES = ("round_robin", "least_outstanding")
SHARED = (2, 3)  # replicas on one GPU: compared where it has one
SHARE_MODES = ("time_slicing", "mps")  # how replicas share one GPU: the driver's time-slicing, or an MPS daemon


def layouts(prep: Prepared | None, replicas: int, platform: str, routes: tuple[str, ...] = ROUTES,
            shared: tuple[int, ...] = (), adapter: EngineAdapter | None = None,
            mps_active_thread_pct: int | None = None, share_modes: tuple[str, ...] = SHARE_MODES,
            deployment: DeploymentSpec | None = None) -> list[Layout]:
    """The layouts to compare on `replicas` devices' worth of this machine (replicas behind each of `routes`) and,
    on GPUs, `shared` replicas on one GPU (in each of `share_modes`: time-sliced, through MPS), each checked against
    the engine version and the machine (a refusal is kept with its reason). A deployment of several GPUs sets the
    count instead: its own layout against TP, engine DP, DP attention and replicas of TP=N/k over its N GPUs."""
    dep = deployment or DeploymentSpec()
    if dep.knobs.tp * dep.knobs.dp > 1 and platform != "cpu":
        return _deployment_layouts(prep, dep, routes)
    n = replicas
    # a CPU build's one server spreads over every core; on GPUs the engine's default is one GPU (tp=1)
    out = [Layout(Arm(ONE, Knobs(), "one server, the engine's own placement"), "one server",
                  n if platform == "cpu" else 1)]
    for route in routes:
        words = route.replace("_", "-")
        k = Knobs(replicas=n, route=route)
        out.append(Layout(Arm(f"{n} replicas, {words}", k, f"{n} servers, one share of the devices each, requests "
                              f"spread {words}"), "replicas", n, _expressible(k, prep, dep)))
    if platform == "cuda":
        out += _shared_layouts(prep, shared, routes, adapter or (prep.adapter if prep else None),
                               mps_active_thread_pct, share_modes)
    native = [("engine DP", Knobs(dp=n), f"dp={n}", "the engine's own data parallelism")]
    if platform != "cpu":
        native.append(("DP attention", Knobs(tp=n, attn_dp=n), f"dp attention={n}",
                       "attention data-parallel, MoE/MLP tensor-parallel"))
    native.append(("TP", Knobs(tp=n), f"tp={n}", "tensor parallelism over the devices"))
    for kind, k, name, words in native:
        why = "tensor parallelism is measured where there are GPUs for it" if platform == "cpu" and kind == "TP" \
            else _expressible(k, prep, dep)
        out.append(Layout(Arm(name, k, words), kind, n, why))
    return out


def _deployment_layouts(prep: Prepared | None, dep: DeploymentSpec, routes: tuple[str, ...]) -> list[Layout]:
    """The layouts of a deployment's N GPUs: the deployment itself, TP=N, the engine's DP over N, DP attention, and
    k replicas of TP=N/k behind each route; each checked on the deployment (a layout whose weights do not fit on
    its GPUs is refused with the arithmetic)."""
    n = dep.knobs.tp * dep.knobs.dp
    out = [Layout(Arm(ONE, Knobs(), f"the deployment as it runs (tp={dep.knobs.tp}, dp={dep.knobs.dp})"),
                  "one server", n)]
    for k in (d for d in range(2, n + 1) if n % d == 0):
        for route in routes:
            words = route.replace("_", "-")
            kn = Knobs(tp=n // k, dp=1, replicas=k, route=route)  # type: ignore[arg-type]
            out.append(Layout(Arm(f"{k} replicas of tp={n // k}, {words}", kn,
                                  f"{k} servers of tp={n // k}, requests spread {words}"), "replicas", n,
                              _expressible(kn, prep, dep)))
    for kind, kn, name, words in (("engine DP", Knobs(tp=1, dp=n), f"dp={n}", "the engine's own data parallelism"),
                                  ("DP attention", Knobs(tp=n, dp=1, attn_dp=n), f"dp attention={n}",
                                   "attention data-parallel, MoE/MLP tensor-parallel"),
                                  ("TP", Knobs(tp=n, dp=1), f"tp={n}", "tensor parallelism over the devices")):
        out.append(Layout(Arm(name, kn, words), kind, n, _expressible(kn, prep, dep)))
    return out


def _shared_layouts(prep: Prepared | None, shared: tuple[int, ...], routes: tuple[str, ...],
                    adapter: EngineAdapter | None, pct: int | None,
                    modes: tuple[str, ...] = SHARE_MODES) -> list[Layout]:
    """n replicas on one GPU for each n of shared and each route: time-sliced, then through MPS; each replica gets
    the engine's memory share for n (Knobs.mem_fraction) and host cores of its own."""
    out = []
    for n in shared:
        frac = adapter.shared_mem_fraction(n) if adapter is not None else None
        for mode, kind, tag in (("time_slicing", "shared GPU", ""), ("mps", "shared GPU + MPS", " with MPS")):
            if mode not in modes:
                continue
            for route in routes:
                words = route.replace("_", "-")
                k = Knobs(replicas=n, route=route, gpu_share=mode, mem_fraction=frac,  # type: ignore[arg-type]
                          mps_active_thread_pct=pct if mode == "mps" else None)
                note = (f"{n} servers on one GPU{' through an MPS daemon of the suite' if mode == 'mps' else ''}, "
                        f"each with a memory share of {frac} and cores of its own, requests spread {words}")
                why = _expressible(k, prep) if frac is not None else \
                    f"{adapter.name if adapter else 'this engine'} has no memory knob to give each replica its share"
                out.append(Layout(Arm(f"{n} replicas on 1 GPU{tag}, {words}", k, note), kind, 1, why))
    return out


def run(ctx: RunContext, replicas: int | None = None, allreduce: bool = True,
        routes: tuple[str, ...] | list[str] = ROUTES, shared: tuple[int, ...] | list[int] = SHARED,
        mps_active_thread_pct: int | None = None,
        share_modes: tuple[str, ...] | list[str] = SHARE_MODES, profile_tp: bool = False) -> ParallelStudy:
    """Check every layout before anything launches, measure the ones this engine and machine can run (the one-server
    layout is thread 1's engine-defaults point: its first repetition comes from the store when thread 1 ran), and
    run the all-reduce probe when there are two or more GPUs. shared: replica counts to put on one GPU (GPUs only;
    [] for none); mps_active_thread_pct: each MPS client's share of the SMs (default: the driver's, all);
    share_modes: how they share it, time_slicing and/or mps; profile_tp: launch the TP layout once more under nsys
    (one repetition, the load's highest level) for its collectives' share of GPU time."""
    routes, shared = _check_args(ctx, replicas, routes, shared, mps_active_thread_pct)
    modes = _check_modes(share_modes)
    # the kept checks are keyed as before shared layouts existed: an online run checks again anyway, and offline a
    # layout the measuring run did not check is shown as not measured
    parts = {"engine": ctx.engine_identity, "model": ctx.model_key, "replicas": replicas}
    lays, found, prep = _check_layouts(ctx, replicas, routes, parts, shared, mps_active_thread_pct, modes)
    arms = [x.arm for x in lays if not x.refused]
    if arms == [lays[0].arm]:  # one server alone compares with nothing: launch nothing, say why below
        arms = []
    tp = next((x.arm.name for x in lays if x.kind == "TP" and not x.refused), None)
    base = tp or ONE  # what findings compare every layout with (baseline())
    heads = [(base, a.name) for a in arms if a.name not in (ONE, base)] if any(a.name == base for a in arms) else None
    ps = ParallelStudy(lays, run_study(THREAD, ctx, arms, headlines=heads), found["kind"], found["have"])
    if allreduce:
        _probe(ps, prep, ctx, parts)
    tp_layout = next((x for x in lays if x.kind == "TP" and not x.refused), None)
    if profile_tp and tp_layout is not None:
        ps.tp_profile = _profile_tp(ctx, tp_layout.arm)
    return ps


def _profile_tp(ctx: RunContext, arm: Arm) -> Study:
    """The TP layout launched once under nsys (TP runs on GPUs only, where nsys is the profiler every engine runs
    under), the window at the load's highest level: the same key online and offline, so a render reads it back."""
    def measuring(c: RunContext) -> RunContext:
        return profiled_once(c, c.profile if c.profile.kind == "nsys" else ProfileSpec(kind="nsys"))
    study, _ = read_or_run(THREAD, ctx, [Arm(arm.name, arm.knobs, f"{arm.note}, under nsys")], measuring=measuring)
    return study


def _check_args(ctx: RunContext, replicas: int | None, routes: tuple[str, ...] | list[str],
                shared: tuple[int, ...] | list[int], pct: int | None) -> tuple[tuple[str, ...], tuple[int, ...]]:
    if replicas is not None and replicas < 2:
        raise SpecError("replicas: compare at least two replicas against one server")
    routes = tuple(routes)
    if not routes or set(routes) - set(ROUTES):
        raise SpecError(f"routes: give one or more of {', '.join(ROUTES)} (got {list(routes)})")
    shared = tuple(sorted(set(shared)))
    if any(n < 2 for n in shared):
        raise SpecError(f"shared: replica counts on one GPU are 2 or more (got {list(shared)})")
    if pct is not None and not 1 <= pct <= 100:
        raise SpecError(f"mps_active_thread_pct: a share of the SMs, 1..100 (got {pct})")
    if not ctx.adapter.launches:
        raise SpecError("layouts are launched by servescope: an external server runs as it was started")
    return routes, shared


def _check_modes(modes: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    if not modes or set(modes) - set(SHARE_MODES):
        raise SpecError(f"share_modes: give one or more of {', '.join(SHARE_MODES)} (got {list(modes)})")
    return tuple(m for m in SHARE_MODES if m in modes)


def _check_layouts(ctx: RunContext, replicas: int | None, routes: tuple[str, ...], parts: dict[str, Any],
                   shared: tuple[int, ...], pct: int | None,
                   modes: tuple[str, ...] = SHARE_MODES) -> tuple[list[Layout], dict[str, Any], Prepared | None]:
    """The layouts with the engine's and the machine's refusals, checked online (and kept, every sharing mode's:
    a later run may ask for another), read back offline."""
    prep: Prepared | None = None

    def compute() -> dict[str, Any]:
        nonlocal prep
        prep = _prepared(ctx)
        have, kind = _devices(prep)
        platform = prep.install.platform
        n = replicas or (have if platform == "cuda" and have >= 2 else 2)
        return {"platform": platform, "have": have, "kind": kind, "n": n,
                "refused": {x.arm.name: x.refused for x in layouts(prep, n, platform, routes, shared, ctx.adapter, pct,
                                                                    deployment=ctx.deployment)}}
    found, _ = ctx.memo("layouts", parts, compute, reuse_online=False, compute_offline=True)
    lays = [Layout(x.arm, x.kind, x.devices, found["refused"].get(x.arm.name, "")) for x in
            layouts(None, found["n"], found["platform"], routes, shared, ctx.adapter, pct, modes,
                    deployment=ctx.deployment)]
    return lays, found, prep


def _prepared(ctx: RunContext) -> Prepared:
    """The engine and model ready to check layouts against; offline, only with what is already here."""
    if not ctx.offline:
        return prepare(ctx.engine, ctx.model, say=lambda msg: None, adapter=ctx.adapter)
    try:  # nothing is installed or generated offline
        m = ctx.model
        if find_install(ctx.engine, ctx.adapter) is not None and (m.path or tiny_model_ready(m.tiny)):
            return prepare(ctx.engine, m, say=lambda msg: None, adapter=ctx.adapter)
    except ServescopeError:
        pass
    raise NotMeasuredError("the layouts were never checked for this engine and model (no online run into this "
                           "store) and the engine is not here to check them: run once without offline")


def _devices(prep: Prepared) -> tuple[int, str]:
    have, what = visible_devices(prep.install.platform, prep.engine.env)
    return (have or 0), ("cores" if what == "CPU cores" else what)


def _probe(ps: ParallelStudy, prep: Prepared | None, ctx: RunContext, parts: dict[str, Any]) -> None:
    """The all-reduce probe over every GPU, and TP's communication per layer for this model (or why not); kept in
    the store, so an offline render shows what the measuring run found."""
    def compute() -> dict[str, Any]:
        assert prep is not None
        _run_probe(ps, prep, ctx.load)
        return ps.allreduce.to_kept() | {"tp_comm": ps.tp_comm.to_dict("records")}
    if prep is None and not ctx.offline:
        return
    got, _ = ctx.memo("allreduce", parts, compute, reuse_online=False)
    if got is None:
        ps.allreduce = probe_skipped("offline render, and the measuring run kept no probe")
        return
    ps.allreduce, ps.tp_comm = ProbeRun.from_kept(got), pd.DataFrame(got["tp_comm"])


def _run_probe(ps: ParallelStudy, prep: Prepared, load: LoadSpec) -> None:
    if prep.install.platform != "cuda" or ps.device_count < 2:
        ps.allreduce = probe_skipped(f"needs two or more GPUs; {ps.device_count} {ps.device_kind} here")
        return
    try:
        table, info = probes.allreduce(prep.install.python, ps.device_count, "nccl", env=prep.install.env)
    except ServescopeError as e:
        ps.allreduce = probe_failed(str(e))
        return
    cfg = model_config(prep.model_path)
    hidden, layers = cfg.get("hidden_size"), cfg.get("num_hidden_layers")
    if hidden and layers:
        ps.tp_comm = probes.tp_comm(table, int(hidden), int(layers), sorted(set(load.concurrency)), ps.device_count,
                                    dtype_bytes=2 if str(cfg.get("torch_dtype", cfg.get("dtype", "bfloat16"))) in (
                                        "bfloat16", "float16") else 4)
    else:
        info["tp_comm"] = "the model's hidden size and layer count are not known here"
    ps.allreduce = ProbeRun(table, info)


def _against_words(base: str, measured: list[Finding]) -> str:
    """Each layout's effect against one server in a few words; the interval and levels of each are in its own
    finding below (said in full here, four layouts ran to 80 words)."""
    def one(f: Finding) -> str:
        e = f.effect
        if e is None or not known(e.value_pct):
            return f.title
        said = f"{f.direction}, {f.confidence} confidence" if f.direction in ("better", "worse") else "not resolved"
        return f"{e.treatment} {e.value_pct:+.1f}% ({said})"
    metric = next((f.effect.metric_words for f in measured if f.effect is not None), "output tok/s")
    return f"Against {base}, {metric}: " + "; ".join(one(f) for f in measured) + " (each layout's interval below)"


def findings(ps: ParallelStudy) -> list[Finding]:
    """The layout to use (the measured layout with the best verified throughput over one server, with its latency
    against it and, for replicas sharing a GPU, whether MPS mattered), each layout's effect against one server, MPS
    against time-slicing for the same replicas, the refusals, and TP's communication cost where the probe ran."""
    base = baseline(ps)
    said = [_layout_finding(ps, ps.layout(x.arm.name), base) for x in ps.layouts
            if not x.refused and x.arm.name not in (ONE, base)]
    per = [f for f, _ in said]
    latency = {f.effect.treatment: words for f, words in said if f.effect is not None}
    mps = _mps_findings(ps, base, per)
    refused = [x for x in ps.layouts if x.refused]
    notes = "; ".join(f"{x.arm.name}: {x.refused}" for x in refused)
    evidence = {"per_layout": [f.model_dump(mode="json") for f in per],
                "refused": {x.arm.name: x.refused for x in refused}}
    top = best_of(per)
    if top is not None:
        assert top.effect is not None
        name = top.effect.treatment
        head = Finding(thread=THREAD, kind="effect", title=f"Use {name}", confidence=top.confidence,
                       headline=f"{name} served more than {base} on the same {ps.device_kind}: {top.effect.text()}",
                       detail=(latency.get(name, "") + _balance_words(ps, name) + _mps_words(ps, mps, name)
                               + (f" Not launched: {notes}." if notes else "")).strip(),
                       effect=top.effect, change=top.change, direction=top.direction, evidence=evidence)
    elif any(f.applies for f in per):
        worse = [f for f in per if f.resolved_as("worse")]
        kept = bool(worse) and len(worse) == len([f for f in per if f.applies])
        if kept:
            title, conf = f"Keep {base}: every other layout measured served less", weakest([f.confidence for f in worse])
        else:
            title, conf = f"No layout shown to beat {base}", "low"
        head = Finding(thread=THREAD, kind="effect", title=title, confidence=conf, optimal=kept,  # type: ignore[arg-type]
                       headline=_against_words(base, [f for f in per if f.applies]),
                       detail=("".join(_mps_words(ps, mps, f.effect.treatment) for f in mps if f.effect)
                               + (f" Not launched: {notes}." if notes else "")).strip(), evidence=evidence)
    else:
        errs = ps.study.results.errors
        only = not [x for x in ps.layouts if not x.refused and x.arm.name != ONE]
        on = f"this one {ps.device_kind.rstrip('s')}" if ps.device_count == 1 else \
            f"{ps.device_count} {ps.device_kind}"
        head = Finding(thread=THREAD, kind="failure", title="Layouts: not compared", applies=False, confidence="none",
                       headline=(f"Only one server fits on {on}: no other layout could run here, so nothing was "
                                 "launched" if only else
                                 "No layout was measured against one server")
                       + (f": {errs['summary'].iloc[0]}" if len(errs) else ""),
                       detail=f"Not launched: {notes}." if notes else "",
                       reason=notes or "no data", evidence={"refused": evidence["refused"]})
    out = [head, *per, *mps]
    for x in refused:
        out.append(Finding(thread=THREAD, kind="failure", title=f"{x.arm.name}: not available here", applies=False,
                           confidence="high", **sentences(f"{x.arm.name} ({x.arm.note}) was not launched: {x.refused}"),
                           reason=x.refused))
    if len(ps.tp_comm):
        out.append(_tp_finding(ps))
    if ps.tp_profile is not None:
        out.append(_tp_profile_finding(ps))
    return out


def _layout_finding(ps: ParallelStudy, x: Layout, base: str) -> tuple[Finding, str]:
    """One layout against the baseline: throughput (the headline), TTFT and TPOT with their intervals; a layout that
    serves more at a resolved latency cost is reported as that trade, and its recommendation says which goal it
    serves. Returns the finding and its latency sentence."""
    name = x.arm.name
    cmp = ps.study.compare(base, name, studied=("tp", "dp") if x.kind in ("TP", "engine DP", "DP attention")
                           else (), controls=CONTROLS)
    words, worse_lat = _latency(cmp)
    f = cmp.finding(name, name, better=x.arm.knobs, worse=Knobs(), extra=words)
    if not f.applies:
        return f, words
    title, ev, change = f"{name} vs {base}", {}, f.change
    if x.kind in ("replicas", *SHARED_KINDS) and f.direction == "better":
        recipe = _replica_recipe(ps, x)
        if worse_lat:
            lat = " and ".join(worse_lat)
            title += f": a trade, more throughput for a higher {lat}"
            ev["trade"] = {"better": "output_tok_s", "worse": worse_lat}
            recipe = (f"for throughput, where {lat} has room under its target: {recipe}. Where {lat} targets bind, "
                      f"keep {base}")
        change = Change(knobs=x.arm.knobs, words=recipe, name=name)
    return f.extended(evidence=ev, title=title, change=change), words


def _latency(cmp: Any) -> tuple[str, list[str]]:
    """A sentence with TTFT and TPOT against the baseline (each a headline with its interval and call), and which of
    them got worse, resolved."""
    parts, worse = [], []
    buffered = cmp.buffered_words()  # a side whose output came at once has no TPOT of its decoding to compare
    for metric, short in (("ttft_ms_p50", "TTFT"), *(() if buffered else (("tpot_ms_p50", "TPOT"),))):
        h = cmp.headline(metric)
        if h is None:
            continue
        parts.append(f"{short} {h.words()}, {'higher' if h.status == 'worse' else 'lower' if h.status == 'better' else h.status}")
        if h.status == "worse":
            worse.append(short)
    parts += [buffered] if buffered else []
    return (f" Latency against {cmp.baseline} (median per level): {'; '.join(parts)}." if parts else ""), worse


def _mps_findings(ps: ParallelStudy, base: str, per: list[Finding]) -> list[Finding]:
    """For each replica count and route measured both ways on one GPU: MPS against time-slicing (did MPS matter?),
    recommended only where the MPS layout also beat the baseline."""
    out = []
    beat = {f.effect.treatment for f in per if f.effect is not None and f.resolved_as("better")}
    for x in ps.layouts:
        if x.kind != "shared GPU + MPS" or x.refused:
            continue
        k = x.arm.knobs
        ts = next((y for y in ps.layouts if y.kind == "shared GPU" and not y.refused and y.arm.knobs.replicas ==
                   k.replicas and y.arm.knobs.route == k.route), None)
        if ts is None:
            continue
        cmp = ps.study.compare(ts.arm.name, x.arm.name, (), CONTROLS)
        words, _ = _latency(cmp)
        f = cmp.finding(f"MPS with {k.replicas} replicas on 1 GPU", f"MPS with {k.replicas} replicas on 1 GPU",
                        extra=words)
        if f.applies and f.direction == "better" and x.arm.name in beat:
            # the MPS layout's recipe starts the daemon itself: said once
            f = f.extended(title=f"MPS vs time-slicing: {x.arm.name}", change=Change(
                words=_replica_recipe(ps, x) or "start the replicas under an MPS control daemon", name=x.arm.name))
        elif f.applies and x.arm.name not in beat:
            f = f.extended(f"Neither was resolved as better than {base}, so this says how to share a GPU, not to share "
                           "one.", title=f"MPS vs time-slicing: {x.arm.name}")
        elif f.applies:
            f = f.extended(title=f"MPS vs time-slicing: {x.arm.name}")
        out.append(f)
    return out


def _mps_words(ps: ParallelStudy, mps: list[Finding], name: str) -> str:
    """Whether MPS mattered for the layout named (its MPS-vs-time-slicing comparison), as a sentence."""
    for f in mps:
        if f.effect is None or name not in (f.effect.treatment, f.effect.baseline):
            continue
        status = {"better": "MPS mattered", "worse": "MPS hurt", "no change": "MPS made no difference"}.get(
            f.effect.status, "Whether MPS mattered is not resolved")
        return (f" {status} for {ps.layout(f.effect.treatment).arm.knobs.replicas} replicas: with MPS against "
                f"time-slicing, {f.effect.text()}.")
    return ""


def baseline(ps: ParallelStudy) -> str:
    """What every layout is compared with: tensor parallelism over all the GPUs where it was measured (the question
    is DP against TP), else one server."""
    pts = ps.study.results.points
    tp = next((x.arm.name for x in ps.layouts if x.kind == "TP" and not x.refused), None)
    if tp is not None and len(pts) and (pts["config"] == tp).any():
        return tp
    return ONE


def _replica_recipe(ps: ParallelStudy, x: Layout) -> str:
    """How to run the replicas the way they were measured, in the engine's spelling: each server's flags and pinning,
    the routing, and the MPS daemon where they shared a GPU through it."""
    pt = ps.study.results.point(x.arm.name)
    install = ps.study.install
    if pt is None or install is None:
        return ""
    return ps.study.adapter.replica_recipe(x.arm.knobs, install, [r.placement for r in pt.replicas])


def _balance_words(ps: ParallelStudy, name: str) -> str:
    b = ps.balance()
    b = b[b["config"] == name] if len(b) else b
    if b.empty:
        return ""
    worst = b.groupby("point")["imbalance_pct"].max()
    return " Load across replicas: the busiest replica took " + ", ".join(
        f"{v:+.0f}% over an even share at {p}" for p, v in worst.items()) + "."


def _tp_finding(ps: ParallelStudy) -> Finding:
    t = ps.tp_comm
    info = ps.allreduce.info
    per = "; ".join(f"{int(r.tokens)} tokens: {r.per_layer_ms:.3f} ms per layer, {r.per_step_ms:.2f} ms per step"
                    for r in t.itertuples() if r.per_layer_ms == r.per_layer_ms)
    big = ps.allreduce.rows.sort_values("bytes").iloc[-1]
    gpus = ", ".join(dict.fromkeys(info.get("devices", [])))
    return Finding(thread=THREAD, kind="measurement", title=f"TP={int(t['tp'].iloc[0])} communication per layer",
                   applies=True, confidence="medium",
                   headline=f"all_reduce over {info.get('world')} GPUs ({info.get('backend')}, {gpus}) "
                            f"reached {big.busbw_gbps:.0f} GB/s bus bandwidth at {big.bytes / 2**20:.0f} MiB",
                   detail=f"For this model two all-reduces per layer per step cost: {per} (decode batch = "
                          "concurrency; interpolated from the probe).",
                   evidence={"allreduce": ps.allreduce.rows.to_dict("records"), "tp_comm": t.to_dict("records"),
                             "info": info})


def _tp_profile_finding(ps: ParallelStudy) -> Finding:
    """What the TP point's collectives cost in its nsys capture, per GPU; or why there is no capture."""
    assert ps.tp_profile is not None
    t = ps.tp_communication()
    name = ps.tp_profile.arms[0].name if ps.tp_profile.arms else "TP"
    if t.empty:
        errs = ps.tp_profile.results.errors
        why = str(errs["summary"].iloc[0]) if len(errs) else "no kernel table in the store for it"
        return Finding(thread=THREAD, kind="measurement", title=f"{name} under nsys: not measured", applies=False,
                       confidence="none", headline=f"The TP point's nsys capture measured nothing: {why}",
                       reason=why)
    w = ps.tp_profile.results.profiles
    at = f" at c={int(w['concurrency'].iloc[0])}" if len(w) and "concurrency" in w else ""
    per = "; ".join(f"GPU {r.device}: {r.communication_share:.1%} of {r.kernel_ms:.0f} ms of kernel time "
                    f"({r.communication_kernels} kernels" + (f", most {r.top_communication_kernel})" if
                                                             r.communication_kernels else ")")
                    for r in t.itertuples())
    share = float(t["communication_ms"].sum() / t["kernel_ms"].sum()) if t["kernel_ms"].sum() else 0.0
    return Finding(thread=THREAD, kind="measurement", title=f"{name}: collectives take {share:.0%} of GPU time",
                   applies=True, confidence="medium",
                   **sentences(f"In one nsys capture of {name}{at}, the collective kernels (NCCL, all-reduce) took "
                               f"{share:.1%} of all GPU kernel time", f"{per}. One capture: a share, not an effect."),
                   evidence={"tp_communication": t.to_dict("records")})


def layout_effects(ps: ParallelStudy) -> pd.DataFrame:
    """Paired effects of every measured layout against one server (per metric and concurrency)."""
    frames = []
    base = baseline(ps)
    for x in ps.layouts:
        if x.refused or x.arm.name in (ONE, base):
            continue
        e = ps.study.compare(base, x.arm.name, (), CONTROLS).effects()
        if len(e):
            frames.append(e)
    if not frames:
        return pd.DataFrame()
    out = pd.concat(frames, ignore_index=True)
    out["point"] = out["treatment"] + " c=" + out["concurrency"].astype(int).astype(str)
    return out


__all__ = ["run", "findings", "layouts", "layout_effects", "ParallelStudy", "Layout"]
