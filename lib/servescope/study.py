"""Studies: a question answered by measuring named configurations (arms) of one engine, checking that each resolved to
what it asked for, and comparing arms in pairs.

A thread holds its question, its arms and the words of its finding; everything else is here. `Study` is built once
over the measured arms and its methods return DataFrames (HolisticTraceAnalysis' TraceAnalysis is the model);
`Study.compare(baseline, treatment)` returns a `Comparison` (its TraceDiff.compare_traces), whose `finding()` states
the measured effect with its confidence, lowered where a state could not be verified or where the arms differed in
more than the studied knob.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd

from . import outputs, plots
from .analysis import kernels as ak
from .analysis import telemetry as at
from .analysis.ab import (
    Headline,
    judged_headline,
)
from .analysis.regime import Regime, point_regimes, regime_table
from .comparison import Comparison
from .context import RepetitionPlan, RunContext
from .engines.base import EngineAdapter, EngineInstall
from .engines.matrix import source_tree as published_source
from .errors import UNMEASURED, SpecError
from .experiment import Config, Results, run_configs
from .findings import Failure, Finding, Outcome
from .load.metrics import buffered
from .outputs import OutputVerdict
from .plots import Figure
from .queries import (  # noqa: F401
    INTERRUPTS,
    _gpu_read,
    audit_for,
    expressible,
    flag_groups,
    kept_probe,
    stored_failures,
    stored_points,
    stored_row,
)
from .spec import EngineSpec, Knobs
from .state import ResolvedState, verify
from .util import rep_label


@dataclass(frozen=True)
class Arm:
    """One configuration of a study: a name, the knobs it asks for (intent), and what it is, in words."""

    name: str
    knobs: Knobs
    note: str = ""


def run_study(thread: str, ctx: RunContext, arms: Sequence[Arm],
              headlines: Sequence[tuple[str, str]] | None = None) -> Study:
    """Measure the arms in alternating repetitions through the store (each point with a kernel profile if the
    context asks for one) and return the Study over them.

    The plan's repetitions are the minimum; up to its maximum, one more repetition runs while a headline effect
    (each (baseline, treatment) pair of headlines; default: every arm against the first) is not resolved
    (study.Headline), as long as it fits the plan's budget."""
    names = [a.name for a in arms]
    pairs = list(headlines) if headlines is not None else [(names[0], n) for n in names[1:]] if names else []
    for b, t in pairs:
        if b not in names or t not in names:
            raise SpecError(f"headline ({b!r}, {t!r}) names an arm the study does not have ({', '.join(names)})")

    def until(res: Results) -> set[str]:
        need: set[str] = set()
        for b, t in pairs:
            h = judged_headline(res.summary, b, t, bool(ctx.load.slo_ms), ctx.equivalence_pct,
                                ctx.load.target_level).headline if len(res.summary) else None
            if h is not None and needs_repetition(h):
                need |= {b, t}
        return need

    partners: dict[str, set[str]] = {}
    for b, t in pairs:
        partners.setdefault(b, set()).add(t)
        partners.setdefault(t, set()).add(b)
    res = run_configs(ctx, [Config(a.name, a.knobs) for a in arms], until=until, partners=partners)
    return Study(thread, ctx, list(arms), res)


def needs_repetition(h: Headline) -> bool:
    """Whether a headline asks for another repetition: unresolved, or resolved in sign only (medium: its interval
    reaches into the equivalence band). Two cold runs here tiered compile +44% (90% CI +2.5..+104%) medium and
    +64% (+30..+106%) high: a medium effect is settled in sign, not in size."""
    return not h.resolved or h.status in ("better", "worse") and h.confidence == "medium"


@dataclass
class Study:
    """Measured arms of one engine; every method returns a DataFrame (or a Figure, or a Comparison)."""

    thread: str
    ctx: RunContext
    arms: list[Arm]
    results: Results

    @property
    def engine(self) -> EngineSpec:
        """The engine as the run named it."""
        return self.ctx.engine

    @property
    def adapter(self) -> EngineAdapter:
        """The engine's adapter: everything engine-specific goes through it."""
        return self.ctx.adapter

    @property
    def equivalence_pct(self) -> float:
        """The band within which an effect counts as no change."""
        return self.ctx.equivalence_pct

    @property
    def plan(self) -> RepetitionPlan:
        """How many repetitions the run asked for."""
        return self.ctx.plan

    def arm(self, name: str) -> Arm:
        """An arm by name."""
        return next(a for a in self.arms if a.name == name)

    def _points(self, name: str) -> pd.DataFrame:
        p = self.results.points
        return p[p["config"] == name] if len(p) else p

    # -- what each arm resolved to ---------------------------------------------------------------------------
    @cached_property
    def states(self) -> dict[str, ResolvedState]:
        """Each measured arm's resolved state, read by the adapter from its first point's stored evidence
        (resolved configuration and server log); arms with no measured point are absent."""
        out = {}
        for a in self.arms:
            pt = self.results.point(a.name)
            if pt is not None:
                out[a.name] = self.adapter.resolved_state(pt.resolved_config, pt.log())
        return out

    def resolved(self) -> pd.DataFrame:
        """One row per arm: the flags it launched with and what the server resolved ('not reported' where it did
        not say)."""
        rows = []
        for a in self.arms:
            pts = self._points(a.name)
            st = self.states.get(a.name)
            row = {"config": a.name, "requested": a.knobs.label(), "flags": pts["flags"].iloc[0] if len(pts) else ""}
            rows.append(row | (st.row() if st else {"source": "not measured"}))
        return drop_empty(pd.DataFrame(rows))

    def verification(self) -> pd.DataFrame:
        """Per arm and pinned field: requested, resolved, and whether it is as requested, differs, or not verified."""
        frames = []
        for a in self.arms:
            st = self.states.get(a.name)
            if st is None:
                continue
            v = verify(self.adapter.expected_state(a.knobs), st)
            status, words = self.graph_check(a.name) if a.knobs.cuda_graph is not None else ("", "")
            if words and status != "no profile":  # the profiled window's own graph launches
                v = pd.concat([v, pd.DataFrame([{"field": "graphs in trace", "requested": a.knobs.cuda_graph,
                                                 "resolved": words, "status": status,
                                                 "why": "" if status == "as requested" else words}])],
                              ignore_index=True)
            frames.append(v.assign(config=a.name))
        if not frames:
            return pd.DataFrame(columns=["config", "field", "requested", "resolved", "status", "why"])
        out = pd.concat(frames, ignore_index=True)
        return out[["config", "field", "requested", "resolved", "status", "why"]]

    # -- what was measured -----------------------------------------------------------------------------------
    def table(self) -> pd.DataFrame:
        """Median over repetitions per arm and concurrency (min..max of throughput), with output-length checks."""
        s = self.results.summary
        if s.empty:
            return pd.DataFrame()
        if "short_outputs" not in s:
            s = s.assign(short_outputs=np.nan)
        g = s.groupby(["config", "concurrency"], sort=False)
        out = g.agg(reps=("rep", "nunique"), output_tok_s=("output_tok_s", "median"),
                    output_tok_s_min=("output_tok_s", "min"), output_tok_s_max=("output_tok_s", "max"),
                    ttft_ms_p50=("ttft_ms_p50", "median"), tpot_ms_p50=("tpot_ms_p50", "median"),
                    e2e_ms_p50=("e2e_ms_p50", "median"), mean_output_tokens=("mean_output_tokens", "median"),
                    short_outputs=("short_outputs", "sum"), failed=("failed", "sum")).reset_index()
        share = self._buffered().groupby(["config", "concurrency"], sort=False).mean().mul(100).rename("buffered_pct")
        if share.gt(0).any():  # a column only where some output came buffered (its TTFT and TPOT say so)
            out = out.merge(share.reset_index(), on=["config", "concurrency"], how="left")
        return drop_empty(out)

    def _buffered(self) -> pd.Series:
        """Per measured request of more than one token (config, concurrency): whether its output came buffered."""
        r = self.results.requests
        if r.empty or not {"e2e_ms", "ttft_ms", "output_tokens", "concurrency"} <= set(r):
            return pd.Series(dtype=bool, index=pd.MultiIndex.from_tuples([], names=["config", "concurrency"]))
        ok = r[(r["phase"] == "measure") & (r["status"] == "ok") & (r["output_tokens"] > 1)]
        return buffered(ok).set_axis(pd.MultiIndex.from_frame(ok[["config", "concurrency"]]))

    def buffered_share(self, config: str) -> float:
        """Share of a configuration's measured requests whose output after the first token came buffered (at once,
        load.metrics.BUFFERED_MS); NaN where it has none."""
        b = self._buffered()
        b = b[b.index.get_level_values("config") == config]
        return float(b.mean()) if len(b) else float("nan")

    def short_outputs(self) -> list[str]:
        """Points whose requests came back shorter than asked (their throughput is mostly prefill)."""
        s = self.results.summary
        if s.empty or "short_outputs" not in s:
            return []
        bad = s[s["short_outputs"].fillna(0) > 0]
        return [f"{r.config} {rep_label(r.rep)} c={int(r.concurrency)}: {int(r.short_outputs)} of {int(r.completed)} requests "
                f"ended early (mean {r.mean_output_tokens:.0f} output tokens)" for r in bad.itertuples()]

    def startup(self) -> pd.DataFrame:
        """Seconds from launch to the first generated token, per arm (median and range over launches)."""
        st = self.results.startup
        if st.empty or "first_token_s" not in st:
            return pd.DataFrame()
        return st.groupby("config", sort=False).agg(
            launches=("rep", "count"), first_token_s=("first_token_s", "median"),
            first_token_s_min=("first_token_s", "min"), first_token_s_max=("first_token_s", "max")).reset_index()

    def graph_metrics(self) -> pd.DataFrame:
        """The engine's own CUDA-graph counters per arm and point (rates of counters, medians of gauges), where it
        exports them."""
        names = set(self.adapter.graph_metrics())
        m = at.metric_points(self.results.telemetry, tuple(names))
        if m.empty or not names:
            return pd.DataFrame()
        m = m[m["metric"].str.replace("_total$", "", regex=True).isin({n.removesuffix("_total") for n in names})]
        return m.reset_index(drop=True)

    def graph_counts(self) -> pd.DataFrame:
        """Batches per CUDA-graph runtime mode, per arm and repetition, where the engine's log counts them (vLLM
        --cudagraph-metrics); empty where it does not."""
        frames = []
        for (config, rep), pt in self.results.stored.items():
            c = self.adapter.graph_counts(pt.log())
            if len(c):
                frames.append(c.assign(config=config, rep=rep))
        if not frames:
            return pd.DataFrame(columns=["config", "rep", "mode", "batches"])
        out = pd.concat(frames, ignore_index=True)
        out["share"] = out["batches"] / out.groupby(["config", "rep"])["batches"].transform("sum")
        return out[["config", "rep", "mode", "batches", "share"]]

    def gpu_points(self) -> pd.DataFrame:
        """Per arm, repetition, point and GPU: NVML medians, power and clock headroom, energy per token, verdict."""
        return self._gpu_points.copy()

    def host_points(self) -> pd.DataFrame:
        """Per arm, repetition and point: the server process tree's CPU and memory, and its busiest thread."""
        return self._host_points.copy()

    # read once per study: thread 03's page asks for them six times (2.5 s each on the H200 store's 57 points)
    @cached_property
    def _gpu_points(self) -> pd.DataFrame:
        return at.gpu_points(self.results.telemetry, self.results.summary)

    @cached_property
    def _host_points(self) -> pd.DataFrame:
        return at.host_points(self.results.telemetry)

    def regime_verdicts(self) -> list[tuple[dict[str, Any], Regime]]:
        """Per arm, repetition and point (and GPU): the regime, from the load records, GPU counters, the server's
        threads and a stored profile of the same level, each with its numbers, thresholds and action."""
        r = self.results
        summary = r.client_health().merge(r.summary[[c for c in ("config", "rep", "point", "completed", "failed",
                                                                  "output_tok_s") if c in r.summary]],
                                          on=["config", "rep", "point"], how="left") if len(r.summary) else r.summary
        status = {}
        if len(r.telemetry_status) and "gpu" in r.telemetry_status:
            status = {(row["config"], row["rep"]): "" if _gpu_read(row) else str(row["gpu"])
                      for _, row in r.telemetry_status.iterrows()}
        # a server that computes on the CPU: its cores are the device its regime is read from
        cpu = {key: pt.cpu_count for key, pt in r.stored.items()
               if pt.install is not None and pt.install.platform == "cpu" and pt.cpu_count}
        return point_regimes(summary, self.gpu_points(), self.host_points(), r.kernels, r.runtime, r.profiles,
                             status, cpu_cores=cpu)

    def regimes(self, per_rep: bool = False) -> pd.DataFrame:
        """The regime verdicts as a table: arm, point, GPU, regime, how many repetitions reached it (or one row per
        repetition), confidence, why, what was missing, action."""
        return drop_empty(regime_table(self.regime_verdicts(), per_rep=per_rep))

    def metric_points(self) -> pd.DataFrame:
        """Per arm, repetition and point: the engine's own Prometheus metrics (gauges' medians, counters' rates)."""
        return at.metric_points(self.results.telemetry, self.adapter.key_metrics)

    def engine_beside_gpu(self) -> pd.DataFrame:
        """Per arm, repetition and level: the engine's own counters (requests running and queued, KV cache use and
        capacity, its token rate, graph passes, its CPU) beside NVML's and the client's, and where they disagree."""
        eng = at.engine_counters(self.results.telemetry, self.adapter.counters)
        replicas = {c: int((pt.parts.get("knobs") or {}).get("replicas", 1)) for (c, _), pt in
                    self.results.stored.items()}
        return at.engine_beside_gpu(eng, self.gpu_points(), self.results.summary, replicas)

    def kernels(self) -> pd.DataFrame:
        """The stored kernel tables of profiled points (config, rep), each kernel with its category and MoE path."""
        k = self.results.kernels
        return ak.with_categories(k) if len(k) else k

    def kernel_summary(self) -> pd.DataFrame:
        """Per profiled point: the window (level, seconds), kernels, kernels per second, the busy fraction, the
        median kernel, and the share of kernels run inside CUDA graphs."""
        k, w = self.results.kernels, self.results.profiles
        if k.empty:
            return pd.DataFrame()
        rows = []
        for (cfg, rep), g in k.groupby(["config", "rep"], sort=False):
            win = w[(w["config"] == cfg) & (w["rep"] == rep)]
            for r in ak.busy(g).itertuples():
                rows.append({"config": cfg, "rep": rep, "level": f"c={int(win['concurrency'].iloc[0])}" if len(win)
                             else "", "device": r.device, "window_ms": r.window_ms, "kernels": r.kernels,
                             "kernels_per_s": r.kernels_per_s, "busy_fraction": r.busy_fraction,
                             "kernel_us_p50": r.kernel_us_p50, "graph_kernel_fraction": r.graph_kernel_fraction})
        return pd.DataFrame(rows)

    def graph_traces(self) -> pd.DataFrame:
        """Per profiled point: whether its traced window ran CUDA graphs, from the trace alone (graph launches in
        the runtime table, kernels marked as graph nodes): graphs on / partly / off, with the counts."""
        k, rt = self.results.kernels, self.results.runtime
        if k.empty:
            return pd.DataFrame(columns=["config", "rep", "graphs", "why"])
        rows = []
        for (cfg, rep), g in k.groupby(["config", "rep"], sort=False):
            r = rt[(rt["config"] == cfg) & (rt["rep"] == rep)] if len(rt) and "config" in rt else rt
            rows.append({"config": cfg, "rep": rep, **ak.graph_use(g, r)})
        return pd.DataFrame(rows)

    def graph_check(self, arm: str) -> tuple[str, str]:
        """What an arm's profiled windows say of its graph use against what it asked for: (status, words), status
        'as requested' / 'differs' / 'not verified' (a trace that cannot tell) / 'no profile' (no profiled window of
        that arm)."""
        t = self.graph_traces()
        t = t[(t["config"].astype(str).str.replace(r" \(\+\w+ profile\)$", "", regex=True) == arm) & (t["graphs"] != "")]
        if t.empty:
            return "no profile", f"no profiled window of {arm}"
        seen = t["graphs"].value_counts().idxmax()
        words = f"{arm}'s profiled window{'s' if len(t) > 1 else ''}: graphs {seen} ({t['why'].iloc[0]})"
        asked = self.arm(arm).knobs.cuda_graph if arm in {a.name for a in self.arms} else None
        if asked is None:
            return "not verified", words
        ok = (seen == "off") if asked == "off" else (seen in ("on", "partly"))
        return ("as requested" if ok else "differs"), words

    def traced_whole_run(self) -> int:
        """How many points ran their measured load under a whole-run nsys capture (no engine profiler hook)."""
        w = self.results.profiles
        if w.empty or "notes" not in w:
            return 0
        return int(w["notes"].apply(lambda n: any("whole run" in x for x in (n if isinstance(n, list) else []))).sum())

    def plot(self, title: str = "") -> Figure | None:
        """Throughput vs concurrency and latency vs throughput, every arm."""
        s = self.results.summary
        return plots.throughput_latency(s, title) if not s.empty else None

    def outcome(self, findings: list[Finding]) -> Outcome:
        """What the study measured, for the index."""
        return self.results.outcome(self.thread, findings)

    def failures(self) -> list[Failure]:
        """The arms that failed (in this run, or as an earlier run recorded in the store), one per arm: knobs,
        flags, the engine's exception and frame, where in its startup it died; offline gaps are no failures."""
        out: dict[str, Failure] = {}
        e = self.results.errors
        for r in e.to_dict("records") if len(e) else []:
            if r["error_type"] in (*UNMEASURED, *INTERRUPTS) or r["config"] in out:
                continue
            arm = next((a for a in self.arms if a.name == r["config"]), None)
            knobs = arm.knobs if arm is not None else Knobs()
            flags, _ = self.spell(knobs) if arm is not None else ([], "")
            out[r["config"]] = Failure(config=r["config"], knobs=knobs.model_dump(mode="json", exclude_defaults=True),
                                       flags=flags, summary=str(r["summary"])[:400], exception=str(r["exception"] or ""),
                                       frame=str(r["frame"] or ""), stage=str(r.get("stage") or ""),
                                       teardown=str(r["teardown"] or ""), before_ready=bool(r["before_ready"]),
                                       recorded=str(r.get("recorded") or ""))
        return list(out.values())

    def output_verdict(self, config: str, baseline: str) -> OutputVerdict:
        """config's answers to the output check against baseline's (outputs.verdict over the stored tables)."""
        return outputs.verdict(self.results.output_checks, baseline, config)

    def output_failure(self, config: str, baseline: str, verdict: OutputVerdict | None = None) -> Failure | None:
        """config as a failed configuration where it changes outputs against baseline (never recommended), else
        None; verdict: the one already read (output_verdict), where the caller has it."""
        v = verdict or self.output_verdict(config, baseline)
        if not v.changes_outputs:
            return None
        arm = next((a for a in self.arms if a.name == config), None)
        knobs = arm.knobs if arm is not None else Knobs()
        flags, _ = self.spell(knobs) if arm is not None else ([], "")
        return Failure(config=config, knobs=knobs.model_dump(mode="json", exclude_defaults=True), flags=flags,
                       summary=v.words()[:400], outputs=v.words())

    def output_table(self, baseline: str) -> pd.DataFrame:
        """Every arm's output check against baseline (one row each: verdict, largest deviation, noise floor)."""
        return pd.DataFrame([self.output_verdict(a.name, baseline).row() for a in self.arms if a.name != baseline])

    def failure(self, arm: str) -> Failure | None:
        """An arm's failure (Study.failures), or None where it did not fail."""
        return next((f for f in self.failures() if f.config == arm), None)

    # -- comparisons -----------------------------------------------------------------------------------------
    def compare(self, baseline: str, treatment: str, studied: tuple[str, ...], controls: tuple[str, ...] = ()) -> Comparison:
        """Treatment against baseline; studied: the state fields the comparison is about; controls: the fields that
        must be equal on both sides for the effect to be the studied knob's alone."""
        return Comparison(self, baseline, treatment, studied, controls)

    @cached_property
    def install(self) -> EngineInstall | None:
        """The engine install the points ran on, as their manifests recorded it (None if nothing was measured)."""
        pts = self.results.points
        pt = self.results.point(str(pts["config"].iloc[0])) if len(pts) else None
        return pt.install if pt is not None else None

    def spell(self, knobs: Knobs) -> tuple[list[str], str]:
        """Flags for knobs in this engine version's own spelling, and '' or why they could not be spelled here."""
        if self.install is None:
            return [], "nothing was measured"
        try:
            return self.adapter.recommended_flags(knobs, self.install), ""
        except Exception as e:  # offline on another machine: the engine's source may not be here
            try:  # the release as published (cached per user), read as the installed one would be
                tree = published_source(self.adapter, self.install.version)
                return self.adapter.recommended_flags(knobs, dataclasses.replace(self.install,
                                                                                 source=tree.location)), ""
            except Exception:  # noqa: BLE001 - no network and no cache: what the launches recorded
                pass
            deployment = self.ctx.deployment
            for a in self.arms:  # an arm that asked for exactly these knobs recorded their spelling at launch
                pts = self._points(a.name)
                if a.knobs == knobs and len(pts) and deployment.empty:
                    return list(pts["flag_list"].iloc[0]), ""
            return [], f"could not spell {knobs.label()} for this engine here ({type(e).__name__}: {e})"


def drop_empty(df: pd.DataFrame) -> pd.DataFrame:
    """Tables show the columns that matter: all-empty columns go."""
    if df.empty:
        return df
    keep = [c for c in df.columns if not (df[c].isna() | (df[c].astype(str) == "")).all()]
    return df[keep]


def read_or_run(thread: str, ctx: RunContext, arms: Sequence[Arm],
                reuse: Callable[[Results], tuple[Results, list[Arm]] | None] | None = None,
                measure_offline: bool = True,
                measuring: Callable[[RunContext], RunContext] | None = None) -> tuple[Study, str]:
    """A study over stored points that reuse(stored) picks (unless forced), else over the arms measured here (under
    measuring(ctx) where given: what only a launch needs is decided only then). Offline with nothing to reuse, the
    arms are still run (each reported as not measured) when measure_offline, else the study is empty. Returns the
    study and where its points came from: 'stored', 'measured' or 'none'."""
    stored = stored_points(ctx) if (reuse is not None and not ctx.force) or ctx.offline else None
    picked = reuse(stored) if reuse is not None and stored is not None and not ctx.force else None
    if picked is not None:
        res, picked_arms = picked
        return Study(thread, ctx, picked_arms, res), "stored"
    if ctx.offline and not measure_offline:
        assert stored is not None
        return Study(thread, ctx, [], stored.select([])), "none"
    return run_study(thread, measuring(ctx) if measuring is not None else ctx, arms), "measured"
