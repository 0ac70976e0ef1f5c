"""Thread 3: is the GPU throttled (power cap, temperature, hardware slowdown) or stalled (high "utilization", low
power), and what limited each load point?

It reads the telemetry of the points other threads already measured for this engine and model (no launch where
the store has them; one engine-defaults sweep where it has none), decides one regime per point
(servescope.analysis.regime) and shows the timeline, the energy per output token and tokens/s against joules per
token. Without a GPU it says so and shows the host and server side; nothing is made up."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ..analysis.ab import MIN_PAIRS
from ..analysis.regime import Regime, point_level, regime_table
from ..context import RepetitionPlan, RunContext
from ..errors import ServescopeError
from ..experiment import Results
from ..findings import CONFIDENCE_ORDER, Change, Finding, sentences
from ..plots import Figure
from ..queries import flag_groups
from ..spec import Knobs, ProfileSpec
from ..study import Arm, Study, read_or_run
from ..telemetry.nvml import REASONS
from ..util import known

THREAD = "03_clocks_power"
QUESTION = "Are the GPUs throttled, or stalled (high utilization, low power)?"


@dataclass
class PowerStudy:
    """The points read (or measured) for this engine and model, and a regime for each."""

    study: Study
    source: str  # where the points came from, in words
    verdicts: list[tuple[dict[str, Any], Regime]] = field(default_factory=list)

    @property
    def has_gpu(self) -> bool:
        """Whether any point has GPU readings."""
        return not self.study.results.telemetry.get("gpu", pd.DataFrame()).empty

    def gpu_missing_reason(self) -> str:
        """Why there are no GPU readings (the telemetry's own status), '' when there are."""
        if self.has_gpu:
            return ""
        st = self.study.results.telemetry_status
        return "; ".join(sorted(set(st["gpu"].astype(str)))) if "gpu" in st else "no telemetry was recorded"

    def regimes(self) -> pd.DataFrame:
        """One row per point (and GPU): regime, confidence, why, what was missing, what to try."""
        t = regime_table(self.verdicts)
        # what to try is in each finding; here the evidence, so the table fits the page
        return t.drop(columns=["action"]).replace("", pd.NA).dropna(axis=1, how="all") if len(t) else t

    def energy(self) -> pd.DataFrame:
        """Per point: output tok/s, energy, joules per output token, median power and clock headroom."""
        g = self.study.gpu_points()
        s = self.study.results.summary
        if g.empty or s.empty:
            return pd.DataFrame()
        agg = g.groupby(["config", "rep", "phase"], as_index=False).agg(
            energy_j=("energy_j", "sum"), power_w_p50=("power_w_p50", "sum"),
            power_pct_of_limit_p50=("power_pct_of_limit_p50", "max"),
            sm_clock_pct_of_max_p50=("sm_clock_pct_of_max_p50", "min"),
            joules_per_output_token=("energy_per_output_token_j", "sum"))
        out = s[["config", "rep", "point", "concurrency", "output_tok_s"]].merge(
            agg, left_on=["config", "rep", "point"], right_on=["config", "rep", "phase"]).drop(columns="phase")
        return out.sort_values(["config", "concurrency", "rep"], ignore_index=True)

    def plot_energy(self) -> Figure | None:
        """Output tokens/s against joules per output token, one line per configuration (points labelled)."""
        e = self.energy()
        if e.empty or e["joules_per_output_token"].isna().all():
            return None
        fig = Figure(figsize=(7.5, 4.2), layout="constrained")
        ax = fig.subplots()
        for cfg, g in e.groupby("config", sort=False):
            m = g.groupby("concurrency").agg(tok=("output_tok_s", "median"), j=("joules_per_output_token", "median"))
            ax.plot(m["tok"], m["j"], marker="o", label=cfg)
            for c, row in m.iterrows():
                ax.annotate(f"c={c}", (row["tok"], row["j"]), textcoords="offset points", xytext=(4, 4), fontsize=8)
        ax.set_xlabel("output tokens/s")
        ax.set_ylabel("joules per output token")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title("throughput against energy per token (median over repetitions)")
        return fig

    def plot_timeline(self) -> Figure | None:
        """One panel per configuration (its first launch; at most TIMELINE_PANELS), seconds from its load's start, its
        measured load levels shaded and named: with a GPU, power (% of limit), SM clock (% of max), utilization, SM
        activity, DRAM bandwidth and throttle reasons as ticks on top; without one, the server's CPU and its busiest
        thread."""
        tele = self.study.results.telemetry
        gpu = tele.get("gpu", pd.DataFrame())
        frame = gpu if len(gpu) else tele.get("server_procs", pd.DataFrame())
        if frame.empty:
            return None
        pts = self.study.results.points
        runs = _first_runs(frame, pts)
        configs = list(dict.fromkeys(runs.sort_values("time_unix")["config"]))
        shown = configs[:TIMELINE_PANELS]
        fig = Figure(figsize=(11, 1.2 + 2.1 * len(shown)), layout="constrained")
        axes = np.atleast_1d(fig.subplots(len(shown), 1, sharex=True, squeeze=False)[:, 0])
        threads = tele.get("server_threads", pd.DataFrame())
        for ax, config in zip(axes, shown, strict=True):
            g = runs[runs["config"] == config]
            if len(gpu):
                _gpu_panel(ax, g, tele)
            else:
                _host_panel(ax, g, threads)
            for phase, ph in g[~g["phase"].astype(str).str.startswith(("warmup", "idle", "profile", "ramp"))
                               ].groupby("phase", sort=False):
                ax.axvspan(ph["t"].min(), ph["t"].max(), color="tab:green", alpha=0.12)
                ax.annotate(str(phase), (ph["t"].min(), 1.0), xycoords=("data", "axes fraction"), fontsize=7,
                            va="bottom")
            n = int((pts["config"] == config).sum())
            ax.set_title(f"{config}" + (f" (the first of {n} launches)" if n > 1 else ""), fontsize=8, loc="left",
                         pad=10)
            ax.set_ylabel("% of one core" if not len(gpu) else "%", fontsize=8)
            ax.grid(alpha=0.3)
        handles = {lab: h for ax in axes for h, lab in zip(*ax.get_legend_handles_labels(), strict=True)}
        fig.legend(handles.values(), handles.keys(), fontsize=7, loc="outside upper center", ncol=5)
        more = f"; {len(configs) - len(shown)} more configurations not drawn" if len(configs) > len(shown) else ""
        axes[-1].set_xlabel(f"seconds from the load's start (shaded: the measured load levels){more}")
        return fig


TIMELINE_PANELS = 8  # past this a page of panels is no longer read at a glance; the regime table holds every point
SHOWN_MARKS = {"sw_power_cap": "v", "sw_thermal_slowdown": "x", "hw_thermal_slowdown": "X", "hw_slowdown": "s",
               "hw_power_brake_slowdown": "D"}


def _first_runs(frame: pd.DataFrame, points: pd.DataFrame) -> pd.DataFrame:
    """Each configuration's first launch (its readings between the point's start and end: one configuration and
    repetition can name points of several loads, e.g. a search's one level beside a sweep), seconds from its first
    reading."""
    parts = []
    for config, pt in points.sort_values("started_unix").groupby("config", sort=False):
        first = pt.iloc[0]
        g = frame[(frame["config"] == config) & frame["time_unix"].between(first["started_unix"], first["ended_unix"])]
        # from the first reading: readings start with the load, a launch's seconds before it are its own to show
        parts.append(g.assign(t=g["time_unix"] - g["time_unix"].min()))
    return pd.concat(parts).sort_values("time_unix") if parts else frame.iloc[:0].assign(t=[])


def _gpu_panel(ax: Any, g: pd.DataFrame, tele: dict[str, pd.DataFrame]) -> None:
    """Power and SM clock (% of limit and max), activity (utilization, GPM), throttle reasons as ticks at 105%."""
    static = tele.get("gpu_static", pd.DataFrame())
    smax = float(static["sm_clock_max_mhz"].max()) if len(static) else float("nan")
    several = g["gpu"].nunique() > 1
    for idx, one in g.groupby("gpu"):
        on = f" (GPU {idx})" if several else ""
        ax.plot(one["t"], 100 * one["power_w"] / one["power_limit_w"], lw=0.9, label=f"power % of limit{on}")
        if known(smax):
            ax.plot(one["t"], 100 * one["sm_clock_mhz"] / smax, lw=0.9, label=f"SM clock % of max{on}")
        for col, lab in (("gpu_util_pct", "utilization"), ("sm_active_pct", "SM active (GPM)"),
                         ("dram_bw_util_pct", "DRAM bandwidth % of peak"), ("tensor_active_pct", "tensor pipes"),
                         ("mem_util_pct", "NVML memory util")):
            if col in one and one[col].notna().any():
                ax.plot(one["t"], one[col], lw=0.7, label=f"{lab}{on}")
        masks = one["clock_event_mask"].fillna(0).astype(int) if "clock_event_mask" in one else one["t"] * 0
        for name, marker in SHOWN_MARKS.items():
            bit = next(b for b, n in REASONS.items() if n == name)
            hit = one["t"][(masks & bit) > 0]
            if len(hit):
                ax.plot(hit, np.full(len(hit), 105.0), marker, ms=3, ls="", color="tab:red", label=name + on)
    ax.set_ylim(0, 110)


def _host_panel(ax: Any, g: pd.DataFrame, threads: pd.DataFrame) -> None:
    """Without a GPU: the server's process tree CPU and its busiest thread."""
    tree = g.groupby(["time_unix", "t"], as_index=False)["cpu_pct"].sum()
    ax.plot(tree["t"], tree["cpu_pct"], lw=0.9, label="server process tree CPU % (of one core)")
    if len(threads):
        th = threads.merge(g[["config", "rep", "time_unix", "t"]].drop_duplicates(), on=["config", "rep", "time_unix"])
        if len(th):
            top = th.groupby("t", as_index=False)["cpu_pct"].max()
            ax.plot(top["t"], top["cpu_pct"], lw=0.9, label="busiest server thread CPU %")


def _reuse(res: Results) -> tuple[Results, list[Arm]] | None:
    return (res, []) if len(res.points) else None


GRAPH_FIRST = ("host-bound", "launch-bound")
GRAPHS_OFF_ACTION = ("This launch ran without CUDA graphs (its resolved state): turn them on first (thread 02 "
                     "measures each mode on this engine), since every decode step's kernel launches are host work "
                     "that graphs remove; what is left after that is the rest of this advice.")


def run(ctx: RunContext) -> PowerStudy:
    """The points the store holds for this engine and model (measured by other threads); where it holds none,
    one engine-defaults sweep measured here (not offline)."""
    one = ctx.with_(plan=RepetitionPlan(1, 1), profile=ProfileSpec())
    study, came = read_or_run(THREAD, one, [Arm("engine defaults", Knobs())], reuse=_reuse, measure_offline=False)
    res = study.results
    source = {"stored": f"{len(res.points)} points other threads measured ({res.points['config'].nunique()} "
                        "configurations), read from the store: nothing launched" if len(res.points) else "",
              "none": "the store holds no point of this engine and model, and offline=True: nothing measured",
              "measured": "no stored point of this engine and model: one engine-defaults sweep measured here"}[came]
    return PowerStudy(study, source, study.regime_verdicts())


def findings(ps: PowerStudy) -> list[Finding]:
    """Per configuration, the regime at its highest-throughput point with what to try (in the engine's flags where
    there is one), and whether the GPU was throttled; or, without a GPU, that clocks and power cannot be read."""
    res = ps.study.results
    out: list[Finding] = []
    if res.points.empty:
        return [Finding(thread=THREAD, kind="failure", title="Clocks and power: not measured",
                        headline=f"No point was measured or stored for this engine and model ({ps.source})",
                        applies=False, reason=ps.source)]
    if not ps.has_gpu:
        why = ps.gpu_missing_reason()
        cpu = _cpu_headline(ps)
        title = cpu[0] if cpu else "No GPU here: clocks, power and GPU regimes not measured"
        said = f"The telemetry read no GPU ({why}): clocks and power are not measured; the host and server side " \
            "are shown instead."
        out.append(Finding(thread=THREAD, kind="regime", title=title,
                           **(sentences(cpu[1], said) if cpu else sentences(said)),
                           applies=False, reason=why, confidence=cpu[2] if cpu else "high",
                           evidence={"gpu_status": why, "cpu_regimes": cpu[3] if cpu else {}}))
    if ps.has_gpu:
        out.append(_headline(ps))
    s = res.summary
    target = ps.study.ctx.load.target_level
    for cfg, g in s.groupby("config", sort=False):
        top = _operating_point(g.groupby("point")["output_tok_s"].median(), target)
        vs = [(i, r) for i, r in ps.verdicts if i["config"] == cfg and i["point"] == top]
        if not vs:
            continue
        r, confidence, agreement = _agreed([r for _, r in vs])
        if not ps.has_gpu and r.regime == "undecided":
            continue  # said once above: GPU regimes cannot be told without GPU counters
        decided = r.regime != "undecided"
        # a flag it already ran with, value and all, is no advice; compared as whole flags with their values (token
        # by token, a vLLM point run with --compilation-config '{...PIECEWISE}' kept FULL's value without its flag)
        ran_with = {g for fl in res.points.loc[res.points["config"] == cfg, "flag_list"] for g in flag_groups(list(fl))}
        # the advice reads the launch as it resolved: without graphs, the host work a step costs is first its
        # kernel launches, which graphs remove (02 measures it), whatever else the regime suggests
        st = ps.study.states.get(cfg) or next((pt.resolved for (c, _), pt in res.stored.items()
                                               if c == cfg and pt.resolved is not None), None)
        graphless = decided and r.regime in GRAPH_FIRST and "server_cores" not in r.evidence and st is not None \
            and st.value("graph_decode") == "off"  # a CPU build has no CUDA graphs to turn on
        action = (GRAPHS_OFF_ACTION + " " + r.action) if graphless else r.action
        # graphs' flags are 02's to name (the mode it measured best, with what the deployment must drop)
        flags = [f for g in flag_groups(_flags(ps, r.regime)) if g not in ran_with for f in g]
        head = r.regime if decided else "undecided (" + " or ".join(r.candidates) + ")"
        out.append(Finding(
            thread=THREAD, kind="regime", title=f"{cfg} at {top}: {head}", headline=r.headline() + agreement,
            detail=(r.missing_words() + (f" What to try: {action}" if decided else "")).strip(),
            applies=decided, reason="" if decided else f"the readings cannot separate {', '.join(r.candidates)}",
            change=Change(flags=flags) if flags else None, confidence=confidence if decided else "none",
            evidence={"config": cfg, "point": top, "regime": r.as_dict(),
                      "points_with_regime": _counts(ps, cfg)}))
    return out


THROTTLES = ("power-capped", "thermal-throttled", "hw-slowdown")


def _agreed(regimes: list[Regime]) -> tuple[Regime, str, str]:
    """Of one level's verdicts (one per repetition and device): the regime most of those that decided one reached (an
    undecided verdict had too few readings, not another answer), its most confident verdict, the confidence the
    verdicts allow (at most medium on fewer than MIN_PAIRS that agree, low where decided ones disagree), and the words
    that say so, to close the verdict's sentence. It was the most confident verdict alone: two undecided repetitions
    and one host-bound read "host-bound, high", and one launch's verdict (a search's screen) was "high" on its own."""
    def sure(x: Regime) -> int:
        return CONFIDENCE_ORDER.index(x.confidence)
    decided = [x for x in regimes if x.regime != "undecided"]
    if not decided:
        r = max(regimes, key=sure)
        return r, r.confidence, ""
    counts = Counter(x.regime for x in decided)
    top = max(counts, key=lambda g: (counts[g], max(sure(x) for x in decided if x.regime == g)))
    r = max((x for x in decided if x.regime == top), key=sure)
    # decided verdicts that disagree leave the regime in doubt; fewer than MIN_PAIRS that agree are too few to hold in
    # a second run, as for an effect (a level's regime flips between launches near a boundary)
    cap = "low" if len(counts) > 1 else "medium" if counts[top] < MIN_PAIRS else "high"
    confidence = min(r.confidence, cap, key=CONFIDENCE_ORDER.index)
    capped = f"{cap} confidence at most" if cap != "high" else ""
    if counts[top] == len(regimes):
        n = len(regimes)
        return r, confidence, (f" (from {'one verdict' if n == 1 else f'{n} verdicts'} at this level, one per "
                               f"repetition and device: {capped})" if capped else "")
    others = Counter(x.regime for x in regimes if x.regime != top)
    words = ", ".join(f"{v} {g}" for g, v in others.items())
    return r, confidence, (f" ({counts[top]} of the {len(regimes)} verdicts at this level, one per repetition and device, "
                           f"reached it; {words}{': ' + capped if capped else ''})")


def _at_target(points: Iterable[str], target: int | None) -> str | None:
    """The point of the load's target level among points (None: no target, or not measured)."""
    return next((p for p in points if point_level(p) == target), None) if target is not None else None


def _operating_point(by_point: pd.Series, target: int | None) -> str:
    """The point a configuration is judged at: the load's target level where it was measured, else the one with
    the highest throughput."""
    return _at_target(by_point.index, target) or str(by_point.idxmax())


def _cpu_headline(ps: PowerStudy) -> tuple[str, str, str, dict[str, str]] | None:
    """A server that computes on the CPU: its regime per level (what most verdicts that decided one reached, as on a
    GPU) for the first configuration (the engine's defaults where measured), as (title, claim, confidence of the
    highest level, level -> regime); None without a CPU verdict."""
    cpu = [(i, r) for i, r in ps.verdicts if "server_cores" in r.evidence]
    if not cpu:
        return None
    cfgs = list(dict.fromkeys(i["config"] for i, _ in cpu))
    # the engine's defaults, else their profiled launch (the default suite's 02 is one), else the first
    defaults = ps.study.results.engine_default_configs()
    cfg = "engine defaults" if "engine defaults" in cfgs else next((c for c in cfgs if c in defaults), cfgs[0])
    per: dict[str, list[Regime]] = {}
    for i, r in cpu:
        if i["config"] == cfg:
            per.setdefault(i["point"], []).append(r)
    levels = sorted(per, key=point_level)
    agreed = {p: _agreed(per[p]) for p in levels}
    top = {p: agreed[p][0].regime for p in levels}

    def tally(p: str) -> str:
        if len(per[p]) == 1:
            return f"{p} {top[p]} (one verdict)"
        others = Counter(r.regime for r in per[p] if r.regime != top[p])
        n = len(per[p]) - sum(others.values())
        return f"{p} {top[p]} ({n} of {len(per[p])}" + "".join(f", {v} {g}" for g, v in others.items()) + ")"
    claim = (f"The server computes on the CPU, so its cores are the device: per level ({cfg}; the regime most of "
             f"its decided verdicts reached, of its verdicts, one per repetition) {', '.join(tally(p) for p in levels)}")
    # the title names the operating point (the target, else the highest level) only: a lower level's regime sits
    # near a boundary (two cold runs here called c=4 under-loaded and compute-bound) and is in the claim
    target = ps.study.ctx.load.target_level
    at = _at_target(levels, target) or levels[-1]
    sure = agreed[at][1] if top[at] != "undecided" else "none"
    return f"CPU server ({cfg}) at {at}: {top[at]}", claim, sure, top


def _headline(ps: PowerStudy) -> Finding:
    """Throttled or not, over every load level with GPU readings (a launch's points are its levels, per GPU), and the
    regime most of them had."""
    g = ps.study.gpu_points()
    counts: dict[str, int] = {}
    for _, r in ps.verdicts:
        counts[r.regime] = counts.get(r.regime, 0) + 1
    n = sum(counts.values())
    throttled = {k: v for k, v in counts.items() if k in THROTTLES}
    top, k = max(counts.items(), key=lambda kv: kv[1])
    power = float(g["power_pct_of_limit_p50"].max()) if "power_pct_of_limit_p50" in g else float("nan")
    clock = float(g["sm_clock_pct_of_max_p50"].min()) if "sm_clock_pct_of_max_p50" in g else float("nan")
    reasons = {c[len("reason_"):-len("_share")]: float(g[c].max()) for c in g.columns
               if c.startswith("reason_") and c.endswith("_share") and c[7:-6] not in ("gpu_idle",)
               and g[c].max() > 0}
    words = (f"power at most {power:.0f}% of the limit (median per load level), SM clock at least {clock:.0f}% of its "
             f"maximum; clock-event reasons seen: " + (", ".join(f"{r} in up to {100 * v:.0f}% of readings"
                                                           for r, v in reasons.items()) or "none"))
    if throttled:
        title = "Throttled at " + ", ".join(f"{v} of {n} load levels ({r})" for r, v in throttled.items())
    else:
        title = f"Not throttled: most load levels {top} ({k} of {n})"
    tally = ", ".join(f"{r} {v}" for r, v in sorted(counts.items(), key=lambda kv: -kv[1]))
    detail = f"Regimes over the {n} load levels (one per configuration, repetition, concurrency and GPU): {tally}."
    return Finding(thread=THREAD, kind="regime", title=title, headline=words, detail=detail, applies=bool(throttled),
                   reason="" if throttled else "no load level was throttled",
                   confidence="high", evidence={"regime_counts": counts, "max_power_pct_of_limit": power,
                                                "min_sm_clock_pct_of_max": clock, "reasons_max_share": reasons})


def _counts(ps: PowerStudy, cfg: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for i, r in ps.verdicts:
        if i["config"] == cfg:
            out[r.regime] = out.get(r.regime, 0) + 1
    return out


def _flags(ps: PowerStudy, regime: str) -> list[str]:
    """The engine's flags for what the regime implies, where there are any for this engine version."""
    install = ps.study.install
    try:
        if install is not None:
            return ps.study.adapter.regime_flags(regime, install)
    except (ServescopeError, OSError):  # the engine is not installed here (a store read offline)
        pass
    if regime == "launch-bound":  # the spelling a stored point with full graphs ran with, if there is one
        pts = ps.study.results.points
        hit = pts[pts["cuda_graph"] == "full"] if len(pts) else pts
        if len(hit) and hit["flag_list"].iloc[0]:
            return list(hit["flag_list"].iloc[0])
    return []
