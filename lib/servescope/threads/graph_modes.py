"""Thread 2: do piecewise / breakable CUDA graphs (attention graphed, MoE eager) help, and which graph mode to use?

The arms are the graph modes this engine version can express (off, decode only, full, piecewise = decode full graphs
and prefill piecewise/breakable graphs), each verified by its resolved state, over the suite's concurrency sweep;
each mode is compared with graphs off. Where the engine has no CUDA-graph mode at all (the CPU engine), the thread
says so with the adapter's reason, the resolved configuration and the audit's rule, and launches nothing beyond the
engine-defaults point that thread 1 measures."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from .. import plots
from ..context import RepetitionPlan, RunContext
from ..engines.base import EngineInstall
from ..findings import Finding, best_of
from ..plots import Figure
from ..spec import Knobs, ProfileSpec
from ..study import Arm, Comparison, Study, expressible, run_study
from .graph_disable import audit_for, explain_state, server_log

THREAD = "02_piecewise_cuda_graphs"
MODES = ("off", "decode_only", "full", "piecewise")
BASELINE = "off"
DEFAULTS = "engine default"
STUDIED = ("graph_decode", "graph_prefill")
CONTROLS = ("compile", "tp", "dp")


def arms() -> list[Arm]:
    """One arm per graph mode."""
    return [Arm(mode, Knobs(cuda_graph=mode), f"CUDA graphs: {mode}") for mode in MODES]


def modes(ctx: RunContext, install: EngineInstall | None = None) -> pd.DataFrame:
    """Each graph mode: whether this engine version (install, else the run's) can express it, with its flags or the
    reason it cannot (offline without the engine: whether the store holds it)."""
    return expressible(ctx, arms(), install).rename(columns={"arm": "mode"})


@dataclass
class GraphStudy:
    """The graph modes of one engine, measured (or why not), and the comparisons with graphs off."""

    modes: pd.DataFrame
    study: Study

    @property
    def compared(self) -> list[str]:
        """The graph modes measured against graphs off."""
        return [a.name for a in self.study.arms if a.name not in (BASELINE, DEFAULTS)]

    def comparisons(self) -> dict[str, Comparison]:
        """Each measured mode against graphs off."""
        return {m: self.study.compare(BASELINE, m, STUDIED, CONTROLS) for m in self.compared}

    def effects(self) -> pd.DataFrame:
        """Paired effects of every mode against graphs off, one table ('point' names mode and level)."""
        frames = [c.effects() for c in self.comparisons().values()]
        frames = [f for f in frames if len(f)]
        if not frames:
            return pd.DataFrame()
        out = pd.concat(frames, ignore_index=True)
        out["point"] = out["treatment"] + " c=" + out["concurrency"].astype(int).astype(str)
        return out

    def kernel_rates(self) -> pd.DataFrame:
        """Per mode, from its profiled windows (medians over repetitions): kernels per second, the share of the
        window the device was busy, and the share of kernels that ran inside CUDA graphs."""
        ks = self.study.kernel_summary()
        if ks.empty:
            return ks
        return ks.groupby("config", sort=False).agg(
            windows=("rep", "count"), level=("level", "first"), kernels_per_s=("kernels_per_s", "median"),
            busy_fraction=("busy_fraction", "median"), kernel_us_p50=("kernel_us_p50", "median"),
            graph_kernel_fraction=("graph_kernel_fraction", "median")).reset_index()

    def plot_effects(self) -> Figure | None:
        """Each mode / graphs off, per metric and concurrency, with 90% confidence intervals."""
        e = self.effects()
        return plots.effect_bars(e, "graph mode / graphs off, 90% confidence intervals (x1 = no change)") \
            if len(e) else None


def run(ctx: RunContext) -> GraphStudy:
    """Measure every expressible graph mode in alternating repetitions (more, within the plan, while a mode's effect
    against graphs off is not resolved); with fewer than two modes, only the engine-defaults point (thread 1's) is
    read or measured, for its resolved configuration."""
    table = modes(ctx)
    can = list(table[table["expressible"]]["mode"])
    if BASELINE in can and len(can) >= 2:
        return GraphStudy(table, run_study(THREAD, ctx, [a for a in arms() if a.name in can],
                                           headlines=[(BASELINE, mode) for mode in can if mode != BASELINE]))
    # the same store key as thread 1's launch (engine defaults, this load, repetition 0, no profile): nothing new is
    # launched when thread 1 ran first
    one = ctx.with_(plan=RepetitionPlan(1, 1), profile=ProfileSpec())
    return GraphStudy(table, run_study(THREAD, one, [Arm(DEFAULTS, Knobs(), "the engine's defaults")]))


def findings(gs: GraphStudy) -> list[Finding]:
    """The graph mode to use (the verified mode with the best throughput gain over graphs off), then each mode's
    effect; or, where the engine has no graph mode to choose, why, with its evidence."""
    if not gs.compared:
        return [_no_modes(gs)]
    rates = gs.kernel_rates()
    per_mode = []
    for mode, cmp in gs.comparisons().items():
        f = cmp.finding(f"CUDA graphs {mode}", f"CUDA graphs {mode}", better=Knobs(cuda_graph=mode),
                        worse=Knobs(cuda_graph=BASELINE))
        seen = rates[rates["config"].isin([BASELINE, mode])] if len(rates) else rates
        if len(seen) == 2:
            f.claim += " Profiled windows: " + "; ".join(
                f"{r.config} {r.kernels_per_s:,.0f} kernels/s, device busy {r.busy_fraction:.0%}, "
                f"{r.graph_kernel_fraction:.0%} of kernels in graphs ({r.level})" for r in seen.itertuples()) + "."
            f.evidence["kernel_rates"] = seen.to_dict("records")
        per_mode.append(f)
    top = best_of(per_mode)
    if top is not None:
        assert top.effect is not None
        mode = top.effect.treatment
        others = "; ".join(f"{f.effect.treatment}: {f.effect.value_pct:+.0f}% ({f.confidence})" for f in per_mode
                           if f.effect is not None and f is not top)
        head = Finding(thread=THREAD, title=f"Use CUDA graphs: {mode}", confidence=top.confidence,
                       claim=f"{mode} gave the largest verified throughput gain over graphs off: {top.effect.text()}."
                             + (f" Other modes against off: {others}." if others else ""),
                       effect=top.effect, recommended_flags=top.recommended_flags,
                       evidence={"per_mode": [f.model_dump(mode="json") for f in per_mode]})
    else:
        compared = any(f.applies for f in per_mode)
        head = Finding(thread=THREAD, title="No graph mode shown to help" if compared else "Graph modes: not compared",
                       confidence="low" if compared else "none", applies=compared,
                       claim="No graph mode gave a throughput gain over graphs off that this measurement resolves "
                             "(medium or high confidence): " + "; ".join(
                                 f"{f.title}: {f.headline}" for f in per_mode) + ".",
                       evidence={"per_mode": [f.model_dump(mode="json") for f in per_mode]})
    return [head, *per_mode]


def _no_modes(gs: GraphStudy) -> Finding:
    """No graph mode to choose: the adapter's reason, what the server resolved, and the audit rule behind it."""
    reasons = sorted(set(gs.modes[~gs.modes["expressible"]]["reason"]))
    st = gs.study.states.get(DEFAULTS)
    if st is None:
        errs = gs.study.results.errors
        first = errs["summary"].iloc[0] if len(errs) else "no point"
        return Finding(thread=THREAD, title="CUDA graph modes: not measured", applies=False, confidence="none",
                       claim=f"This engine cannot express graph modes to compare ({'; '.join(reasons)[:300]}), and "
                             f"the engine-defaults point that would show what it resolved was not measured: {first}.",
                       reason="; ".join(reasons))
    audit = audit_for(gs.study.ctx, gs.study.install)
    log, _ = server_log(gs.study)
    why = explain_state(gs.study.adapter.fact_rules(st), audit, log)
    rules = why[why["source"] == "audit"]
    where = ", ".join(dict.fromkeys(rules["where"]))[:300] if len(rules) else ""
    resolved = f"the server resolved CUDA graphs {st.graphs or 'not reported'}" + \
        (f" ({st.graph_mode}, from {st.source})" if st.graph_mode else "")
    claim = (f"Graph modes cannot be compared here: {reasons[0]}. With its defaults, {resolved}"
             + (f"; the rule: {where}." if where else "."))
    known = st.graphs == "off"
    return Finding(thread=THREAD, title="No CUDA graph modes to compare here", applies=False,
                   confidence="high" if known and where else "medium" if known else "none",
                   reason=reasons[0], claim=claim,
                   evidence={"modes": gs.modes.to_dict("records"), "resolved": st.to_dict(),
                             "rules": rules.head(10).to_dict("records")})
