"""Thread 2: do piecewise / breakable CUDA graphs (attention graphed, MoE eager) help, and which graph mode to use?

The arms are the graph modes this engine version can express (off, decode only, full, piecewise = decode full graphs
and prefill piecewise/breakable graphs), each verified by its resolved state, over the suite's concurrency sweep;
each mode is compared with graphs off. Where the engine has no CUDA-graph mode at all (the CPU engine), the thread
says so with the adapter's reason, the resolved configuration and the audit's rule, and launches nothing beyond the
engine-defaults point that thread 1 measures."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from .. import plots, probes
from ..analysis.engines import APART
from ..comparison import Comparison
from ..context import RepetitionPlan, RunContext
from ..engines.audit import explain_state
from ..engines.base import EngineInstall
from ..errors import SpecError
from ..findings import Change, Finding, best_of, sentences
from ..models import model_config
from ..plots import Figure
from ..probes.run import ProbeRun
from ..probes.run import skipped as probe_skipped
from ..queries import audit_for, expressible, kept_probe
from ..spec import Knobs, ModelSpec
from ..state import expected_state
from ..study import Arm, Study, run_study
from .graph_disable import server_log

THREAD = "02_piecewise_cuda_graphs"
QUESTION = "Do piecewise/breakable CUDA graphs (attention graphed, MoE eager) help?"
MODES = ("off", "decode_only", "full", "piecewise", "compiled_piecewise")
BASELINE = "off"
DEFAULTS = "engine default"
STUDIED = ("graph_decode", "graph_prefill")
CONTROLS = ("compile", "tp", "dp")
# the ceiling probe's decode batches: 1 to 256 on a GPU; fewer on a CPU, whose eager steps at 256 take 50 ms each
CEILING_BATCHES = {"cuda": (1, 2, 4, 8, 16, 32, 64, 128, 256), "cpu": (1, 16, 256)}
CEILING_FORMS = ("eager", "full", "piecewise", "compile")
# of graph modes a measurement cannot tell apart (and none the engine's default), the least machinery first
PREFERENCE = ("decode_only", "piecewise", "full", "compiled_piecewise")


def arms(ctx: RunContext | None = None) -> list[Arm]:
    """One arm per graph mode; where the suite's deployment sets a knob a mode cannot run without on this engine
    (vLLM's piecewise graphs under a deployment with compile off), the arm sets it too, and says so."""
    out = []
    for mode in MODES:
        needs = _needs(ctx, mode)
        words = f" (with {Knobs(**needs).label()}: the mode needs it)" if needs else ""
        out.append(Arm(mode, Knobs(cuda_graph=mode, **needs), f"CUDA graphs: {mode}{words}"))
    return out


def _needs(ctx: RunContext | None, mode: str) -> dict[str, Any]:
    """The knobs mode needs that the deployment sets otherwise: from the suite alone (the engine's name and env), so
    that a store rendered where the engine is not installed finds the same points."""
    if ctx is None or ctx.deployment.empty:
        return {}
    dep = ctx.deployment.knobs
    return {k: v for k, v in ctx.adapter.mode_requires(mode, ctx.engine.env).items()
            if k in dep.model_fields_set and getattr(dep, k) != v}


def _coupled_fields(arm: Knobs, baseline: Knobs) -> tuple[str, ...]:
    """The state fields beyond the graphs that arm pins otherwise than the baseline (what a mode's requirement set);
    the engine's eager switch with them where compile is one, since it is graphs off and compile off together."""
    a, b = expected_state(arm), expected_state(baseline)
    out = tuple(f for f in a if f not in STUDIED and f in b and a[f] != b[f])
    return out + ("eager",) if "compile" in out else out


def modes(ctx: RunContext, install: EngineInstall | None = None) -> pd.DataFrame:
    """Each graph mode: whether this engine version (install, else the run's) can express it on the deployment,
    with its flags or the reason it cannot (offline without the engine: whether the store holds it)."""
    return expressible(ctx, arms(ctx), install).drop(columns="flag_list").rename(columns={"arm": "mode"})


@dataclass
class GraphStudy:
    """The graph modes of one engine, measured (or why not), and the comparisons with graphs off."""

    modes: pd.DataFrame
    study: Study
    # the ceiling probe: rows (form, batch, ms_per_step, ...), what ran (device, dtype, MoE method), or why not
    ceiling: ProbeRun = field(default_factory=ProbeRun)
    ceiling_of: str = ""  # what part of the model the probe's stack is, where not the whole (an architecture's)

    def modes_table(self) -> pd.DataFrame:
        """The modes as the page shows them: whether the engine was asked is the flags' and reason's to say."""
        return self.modes.drop(columns="asked", errors="ignore")

    def ceiling_gains(self) -> pd.DataFrame:
        """Per batch size and form of the probe: ms per step (median of its runs), and the gain over eager with its
        range over the paired runs (the forms ran interleaved, run by run); resolved where every pair agrees."""
        c = self.ceiling.rows
        if c.empty:
            return pd.DataFrame()
        rows = []
        for b, g in c.groupby("batch", sort=True):
            eager = g[g["form"] == "eager"]
            base = list(eager["runs_ms"].iloc[0]) if len(eager) and "runs_ms" in g else []
            for r in g.itertuples():
                out = {"batch": int(b), "form": r.form, "ms_per_step": r.ms_per_step}
                runs = list(r.runs_ms) if "runs_ms" in g and r.runs_ms is not None else []
                if r.form != "eager" and len(eager):
                    ratios = sorted(e / f for e, f in zip(base, runs, strict=False) if f > 0) or \
                        [float(eager["ms_per_step"].iloc[0]) / r.ms_per_step]
                    out |= {"gain_pct": 100 * (float(eager["ms_per_step"].iloc[0]) / r.ms_per_step - 1),
                            "gain_lo_pct": 100 * (ratios[0] - 1), "gain_hi_pct": 100 * (ratios[-1] - 1),
                            "runs": len(ratios), "resolved": len(ratios) >= 3 and (ratios[0] > 1 or ratios[-1] < 1)}
                rows.append(out)
        return pd.DataFrame(rows)

    def ceiling_table(self) -> pd.DataFrame:
        """Per batch size: ms per decode step in each form of the probe, and each form's gain over eager with its
        range over the paired runs."""
        g = self.ceiling_gains()
        if g.empty:
            return g
        t = g.pivot_table(index="batch", columns="form", values="ms_per_step", aggfunc="first")
        t = t[[f for f in CEILING_FORMS if f in t.columns]].add_suffix("_ms").round(3)
        t.columns.name = None
        for form in (f for f in CEILING_FORMS if f != "eager" and f in set(g["form"])):
            sub = g[g["form"] == form].set_index("batch")
            t[f"{form}_gain"] = [f"{r.gain_pct:+.0f}% ({r.gain_lo_pct:+.0f}..{r.gain_hi_pct:+.0f})"
                                 + ("" if r.resolved else ", within noise") for r in sub.reindex(t.index).itertuples()]
        return t.reset_index()

    @property
    def compared(self) -> list[str]:
        """The graph modes measured against graphs off."""
        return [a.name for a in self.study.arms if a.name not in (BASELINE, DEFAULTS)]

    def comparisons(self) -> dict[str, Comparison]:
        """Each measured mode against graphs off; a knob the mode's arm sets because the mode needs it (vLLM's
        piecewise over --enforce-eager turns compile on) is part of what is compared, not a control that slipped."""
        out = {}
        for m in self.compared:
            dep = self.study.ctx.deployed
            coupled = _coupled_fields(dep(self.study.arm(m).knobs), dep(self.study.arm(BASELINE).knobs))
            out[m] = self.study.compare(BASELINE, m, STUDIED + coupled,
                                        tuple(c for c in CONTROLS if c not in coupled))
        return out

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


def run(ctx: RunContext, ceiling: bool = True, only: Sequence[str] = ()) -> GraphStudy:
    """Measure every expressible graph mode (or only those named, graphs off always among them) in alternating
    repetitions (more, within the plan, while a mode's effect against graphs off is not resolved); with fewer than
    two modes, only the engine-defaults point (thread 1's) is read or measured, for its resolved configuration. Then
    the ceiling probe (what graphs remove from a decode step on this hardware, engine-free), kept in the store like a
    point."""
    unknown = sorted(set(only) - set(MODES))
    if unknown:
        raise SpecError(f"modes {unknown}: not graph modes; choose among {', '.join(MODES)}")
    table = modes(ctx)
    if only:  # the others are left for a later run: said in the table, not compared
        keep = {BASELINE, *only}
        table.loc[~table["mode"].isin(keep), "reason"] = "not asked in this run (the notebook's modes)"
        table.loc[~table["mode"].isin(keep), "expressible"] = False
    can = list(table[table["expressible"]]["mode"])
    if BASELINE in can and len(can) >= 2:
        gs = GraphStudy(table, run_study(THREAD, ctx, [a for a in arms(ctx) if a.name in can],
                                         headlines=[(BASELINE, mode) for mode in can if mode != BASELINE]))
    else:
        # the same store key as thread 1's launch (engine defaults, this load, repetition 0): nothing new is launched
        # when thread 1 ran first; a profile only where the suite asks this thread for one (the default suite does:
        # its window comes after the load, and the launch is the others' first repetition where the engine leaves
        # the armed profiler idle, see experiment.launch_identity)
        one = ctx.with_(plan=RepetitionPlan(1, 1))
        gs = GraphStudy(table, run_study(THREAD, one, [Arm(DEFAULTS, Knobs(), "the engine's defaults")]))
    if ceiling:
        _ceiling(gs, ctx)
    return gs


# an architecture at real size is probed as a stack of this many of its layers (the whole model, unsharded on one
# GPU, would not fit for most: about 60 GB for a 30B MoE)
PROBE_LAYERS = 4


def stack_shape(model: ModelSpec, tp: int = 1) -> dict[str, int] | None:
    """The layer shapes the ceiling probe builds its stack from: a generated model's spec, or a local folder's (or a
    shipped architecture's) config.json; None where neither is readable (a hub id not on disk). An architecture is
    probed as PROBE_LAYERS of its layers at one GPU's shard of tp (heads and expert widths divided)."""
    if model.tiny is not None:
        t = model.tiny
        return {"layers": t.num_layers, "hidden": t.hidden_size, "heads": t.num_attention_heads,
                "kv_heads": t.num_key_value_heads, "head_dim": t.head_dim, "experts": t.num_experts,
                "top_k": t.top_k, "inter": t.moe_intermediate_size}
    if model.architecture is not None:
        from ..architectures import read_config

        cfg = read_config(model.architecture)
    else:
        cfg = model_config(model.path or "")
    if not cfg or not cfg.get("hidden_size"):
        return None
    heads = int(cfg.get("num_attention_heads") or 1)
    experts = int(cfg.get("num_experts") or cfg.get("n_routed_experts") or cfg.get("num_local_experts") or 1)
    shape = {"layers": int(cfg.get("num_hidden_layers") or 1), "hidden": int(cfg["hidden_size"]), "heads": heads,
             "kv_heads": int(cfg.get("num_key_value_heads") or heads),
             "head_dim": int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads), "experts": experts,
             "top_k": int(cfg.get("num_experts_per_tok") or 1) if experts > 1 else 1,
             "inter": int((cfg.get("moe_intermediate_size") or cfg.get("intermediate_size")) if experts > 1
                          else cfg.get("intermediate_size") or 0)}
    if model.architecture is not None:
        shape |= {"layers": min(shape["layers"], PROBE_LAYERS), "heads": max(1, heads // tp),
                  "kv_heads": max(1, shape["kv_heads"] // tp), "inter": max(1, shape["inter"] // tp)}
    return shape


def ceiling_batches(device: str, ctx: RunContext) -> list[int]:
    """The probe's batch sizes: every one on a GPU; on a CPU those the load reaches (at least 1 and 16), since batch
    256 there took half of the probe's 29 s (a cold make report's 02) for a batch no CPU suite level comes near."""
    if device != "cpu":
        return list(CEILING_BATCHES[device])
    ld = ctx.load
    top = max(ld.levels) if ld.mode == "closed" and ld.concurrency else (ld.max_concurrency or 10**9)
    return [b for b in CEILING_BATCHES[device] if b <= max(16, top)]


def _ceiling(gs: GraphStudy, ctx: RunContext) -> None:
    """The engine-free ceiling probe under the engine's interpreter, on its device, kept in the store (offline
    renders read the kept answer)."""
    shape, install = stack_shape(ctx.model, ctx.deployment.knobs.tp), gs.study.install
    if shape is None:
        gs.ceiling = probe_skipped("the model's layer shapes are not readable here")
        return
    device = "cuda" if install is not None and install.platform == "cuda" else "cpu"
    batches = ceiling_batches(device, ctx)
    if ctx.model.architecture is not None:
        gs.ceiling_of = (f" (a stack of {shape['layers']} of its layers" + (
            f", one GPU's shard of tp={ctx.deployment.knobs.tp}" if ctx.deployment.knobs.tp > 1 else "") + ")")
    parts = {"engine": ctx.engine_identity, "shape": shape, "batches": batches}

    # bf16 on a GPU as served; fp32 on a CPU, where bf16 products without AMX time the CPU's emulation of them
    gs.ceiling = kept_probe(ctx, "graph_ceiling", parts, install, lambda inst: probes.graph_ceiling(
        inst.python, shape, batches, device=device,
        dtype="bfloat16" if device == "cuda" else "float32", timeout_s=300, env=inst.env))


def _per_mode(gs: GraphStudy, deployed: Knobs | None) -> list[Finding]:
    """Each compared mode against graphs off, its change said against the deployment, with its profiled kernel
    rates where both sides were profiled."""
    rates = gs.kernel_rates()
    per_mode = []
    install = gs.study.install
    for mode, cmp in gs.comparisons().items():
        # the change as measured: a mode keeps the engine default it ran under (vLLM's graphs, inside its compile),
        # so that thread 07 does not put it on a baseline that turns that default off
        asked = next((a.knobs for a in gs.study.arms if a.name == mode), Knobs(cuda_graph=mode))
        better = asked if install is None else gs.study.adapter.as_measured(asked, install)
        f = cmp.finding(f"CUDA graphs {mode}", f"CUDA graphs {mode}", better=better, worse=Knobs(cuda_graph=BASELINE),
                        deployed=deployed)
        dep = gs.study.ctx.deployment.knobs
        if asked.torch_compile is not None and "torch_compile" in dep.model_fields_set \
                and dep.torch_compile != asked.torch_compile:
            f.detail += (f" This side also turns torch.compile {'on' if asked.torch_compile else 'off'}: "
                         f"{gs.study.engine.name} runs {mode} graphs only so (the deployment has it "
                         f"{'off' if not dep.torch_compile else 'on'}), so the effect is graphs and compile "
                         "together; thread 05 measures compile alone.")
        seen = rates[rates["config"].isin([BASELINE, mode])] if len(rates) else rates
        if len(seen) == 2:
            f.detail += " Profiled windows: " + "; ".join(
                f"{r.config} {r.kernels_per_s:,.0f} kernels/s, device busy {r.busy_fraction:.0%}, "
                f"{r.graph_kernel_fraction:.0%} of kernels in graphs ({r.level})" for r in seen.itertuples()) + "."
            f.evidence["kernel_rates"] = seen.to_dict("records")
        per_mode.append(f)
    return per_mode


def findings(gs: GraphStudy) -> list[Finding]:
    """The graph mode to use (the verified mode with the best throughput gain over graphs off), then each mode's
    effect, each change said against the deployment (the run context's baseline: how it runs today; its flags that
    would override the mode are to drop); or, where the engine has no graph mode to choose, why, with its evidence."""
    baseline = gs.study.ctx.baseline
    deployed = Knobs(**baseline) if baseline else None
    if not gs.compared:
        return [_no_modes(gs), *[f for f in [_ceiling_finding(gs, None)] if f is not None]]
    per_mode = _per_mode(gs, deployed)
    top = best_of(per_mode)
    if top is not None:
        assert top.effect is not None
        pick = _pick(gs, per_mode, top)
        mode, chosen = pick.mode, pick.finding
        assert chosen.effect is not None
        others = "; ".join(f"{f.effect.treatment}: {f.effect.value_pct:+.0f}% ({f.confidence})" for f in per_mode
                           if f.effect is not None and f is not chosen)
        if len(pick.tied) == 1:
            why, more = f"{mode} gave the largest verified throughput gain over graphs off: {chosen.effect.text()}", ""
        else:
            why = f"{mode} against graphs off: {chosen.effect.text()}"
            ahead = [h for h in pick.head_to_head if h.resolved_as("better")]
            more = (f" The modes that gain most are not told apart here "
                    f"({'; '.join(_versus(h) for h in pick.head_to_head if h not in ahead)}), so the pick among "
                    f"{', '.join(pick.tied)} follows a fixed rule, not this run's noise: {mode}, {pick.because}."
                    + (f" Told apart head to head: {'; '.join(_versus(h) for h in ahead)}." if ahead else ""))
        for f in per_mode:  # the modes the thread did not pick rank after its pick, whatever their point estimates
            if f.effect is not None and f.effect.treatment != mode and f.change is not None:
                f.change.alternative_to = mode
        # the pick's change as its per-mode finding states it: knobs, flags to add, the deployment's flags to drop
        change = Change(knobs=chosen.change.knobs, flags=chosen.change.flags, drop_flags=chosen.change.drop_flags,
                        words=chosen.change.words) if chosen.change is not None else None
        head = Finding(thread=THREAD, kind="effect", title=f"Use CUDA graphs: {mode}", confidence=chosen.confidence,
                       headline=why, detail=(more + (f" Other modes against off: {others}." if others else "")
                                             + _died(gs)).strip(),
                       effect=chosen.effect, change=change, failures=gs.study.failures(),
                       evidence={"per_mode": [f.model_dump(mode="json") for f in per_mode],
                                 "largest_gain": top.effect.treatment, "tied": pick.tied, "chosen_by": pick.rule,
                                 "head_to_head": [{"effect": h.effect.model_dump(mode="json") if h.effect else None,
                                                  "confidence": h.confidence, "words": _versus(h)}
                                                 for h in pick.head_to_head]})
    else:
        compared = any(f.applies for f in per_mode)
        head = Finding(thread=THREAD, kind="effect",
                       title="No graph mode shown to help" if compared else "Graph modes: not compared",
                       confidence="low" if compared else "none", applies=compared,
                       headline="No graph mode gave a throughput gain over graphs off that this measurement resolves "
                                "(medium or high confidence): " + "; ".join(f"{f.title}: {f.headline}" for f in per_mode),
                       detail=_died(gs).strip(),
                       failures=gs.study.failures(),
                       evidence={"per_mode": [f.model_dump(mode="json") for f in per_mode]})
    ceiling = _ceiling_finding(gs, top)
    return [head, *([ceiling] if ceiling is not None else []), *per_mode]


@dataclass
class Pick:
    """The graph mode to recommend and why: the modes tied with the largest gain, their head-to-head comparisons."""

    mode: str
    finding: Finding  # the chosen mode against graphs off
    tied: list[str]  # the helping modes not resolved below the largest gain, the largest first
    rule: str  # 'largest gain' | 'engine default' | 'least machinery'
    because: str
    head_to_head: list[Finding]


def _versus(h: Finding) -> str:
    """One head-to-head in words: 'piecewise against decode_only: +2.4% output_tok_s (90% CI ...), low'."""
    if h.effect is None:
        return f"{h.title}: {h.headline}"
    apart = ", the sides never on one machine start" if h.evidence.get("machines") == APART else ""
    return f"{h.effect.treatment} against {h.effect.baseline}: {h.effect.text()}, {h.confidence}{apart}"


def _pick(gs: GraphStudy, per_mode: list[Finding], top: Finding) -> Pick:
    """The mode with the largest gain over graphs off, unless its lead over another helping mode is not resolved
    head to head (same repetitions, paired): then, of the tied modes, the engine's own default, else the one with the
    least machinery. Two cold recordings on the H200 ranked piecewise and compiled piecewise in opposite orders with
    every head-to-head unresolved: the largest point estimate alone does not survive a second run."""
    assert top.effect is not None
    best = top.effect.treatment
    by_mode = {f.effect.treatment: f for f in per_mode if f.effect is not None}
    tied, h2h = [best], []
    for f in sorted((f for f in per_mode if f is not top and f.resolved_as("better")),
                    key=lambda f: -f.effect.value_pct):  # type: ignore[union-attr]
        other = f.effect.treatment  # type: ignore[union-attr]
        h = gs.study.compare(other, best, STUDIED, CONTROLS).finding(f"{best} vs {other}", f"{best} against {other}")
        h2h.append(h)
        if not h.resolved_as("better"):
            tied.append(other)
    if len(tied) == 1:
        return Pick(best, top, tied, "largest gain", "the largest gain", h2h)
    install = gs.study.install
    default = gs.study.adapter.default_graph_mode(install) if install is not None else None
    if install is not None and default in tied:
        return Pick(default, by_mode[default], tied, "engine default",
                    f"the engine's own default on {install.version} (the smallest "
                    "change to a launch that turned graphs off: drop that flag), the mode its developers test most",
                    h2h)
    mode = min(tied, key=lambda m: PREFERENCE.index(m) if m in PREFERENCE else len(PREFERENCE))
    return Pick(mode, by_mode[mode], tied, "least machinery",
                "the one with the least machinery (fewer graphs captured, no compile: the shortest start and the "
                "least memory)", h2h)


def _died(gs: GraphStudy) -> str:
    """The modes that died before they were ready, in a sentence ('' where none did)."""
    dead = [f for f in gs.study.failures() if f.before_ready and f.exception]
    return (" Dies at capture on this version: " + "; ".join(f"{f.config}: {f.words()}" for f in dead) + ".") \
        if dead else ""


def _no_modes(gs: GraphStudy) -> Finding:
    """No graph mode to choose: the adapter's reason, what the server resolved, and the audit rule behind it."""
    reasons = sorted(set(gs.modes[~gs.modes["expressible"]]["reason"]))
    st = gs.study.states.get(DEFAULTS)
    if st is None:
        errs = gs.study.results.errors
        first = errs["summary"].iloc[0] if len(errs) else "no point"
        return Finding(thread=THREAD, kind="failure", title="CUDA graph modes: not measured", applies=False,
                       confidence="none", **sentences(
                           f"This engine cannot express graph modes to compare ({'; '.join(reasons)[:300]}), and "
                           f"the engine-defaults point that would show what it resolved was not measured: {first}"),
                       reason="; ".join(reasons))
    audit = audit_for(gs.study.ctx, gs.study.install)
    log, _ = server_log(gs.study)
    why = explain_state(gs.study.adapter.fact_rules(st), audit, log)
    rules = why[why["source"] == "audit"]
    where = ", ".join(dict.fromkeys(rules["where"]))[:300] if len(rules) else ""
    resolved = f"the server resolved CUDA graphs {st.graphs or 'not reported'}" + \
        (f" ({st.graph_mode}, from {st.source})" if st.graph_mode else "")
    headline = f"Graph modes cannot be compared here: {reasons[0]}"
    detail = f"With its defaults, {resolved}" + (f"; the rule: {where}." if where else ".")
    known = st.graphs == "off"
    return Finding(thread=THREAD, kind="cause", title="No CUDA graph modes to compare here", applies=False,
                   confidence="high" if known and where else "medium" if known else "none",
                   reason=reasons[0], headline=headline, detail=detail,
                   evidence={"modes": gs.modes.to_dict("records"), "resolved": st.to_dict(),
                             "rules": rules.head(10).to_dict("records")})


def _ceiling_finding(gs: GraphStudy, measured: Finding | None) -> Finding | None:
    """What graphs (and compile) take off a decode step of the model's layers, engine-free, reconciled with the
    effect the engine measured: an estimate of the kernel-launch share, never called a bound where a measurement
    exceeds it."""
    g = gs.ceiling_gains()
    info = gs.ceiling.info
    if g.empty:
        why = gs.ceiling.why_not
        return Finding(thread=THREAD, kind="measurement", title="Graph ceiling: not measured", applies=False,
                       confidence="none", **sentences(f"The engine-free ceiling probe did not run: {why}"), reason=why,
                       evidence={"ceiling": gs.ceiling.to_kept()})
    gains = g[g["form"] != "eager"]
    if gains.empty:
        return None
    per_batch = "; ".join(f"batch {b}: " + ", ".join(f"{r.form} {r.gain_pct:+.0f}% ({r.gain_lo_pct:+.0f}.."
                                                     f"{r.gain_hi_pct:+.0f})" for r in sub.itertuples())
                          for b, sub in gains.groupby("batch", sort=True))
    runs = int(gains["runs"].max())
    up = gains[gains["resolved"] & (gains["gain_lo_pct"] > 0)]
    if len(up):
        at = up.loc[up["gain_pct"].idxmax()]
        head = f"Engine-free probe: {at['form']} {at['gain_pct']:+.0f}% per decode step at its best (batch " \
               f"{int(at['batch'])})"
    else:
        head = f"No form resolved above eager here ({', '.join(dict.fromkeys(gains['form']))})"
    cpu = info.get("device") == "cpu"
    of = gs.ceiling_of
    lo, hi = int(gains["batch"].min()), int(gains["batch"].max())
    ends = "; ".join(f"{form} {sub.iloc[0].gain_pct:+.0f}%" + (f" and {sub.iloc[-1].gain_pct:+.0f}%" if lo != hi else "")
                     for form, sub in gains.sort_values("batch").groupby("form", sort=False))
    # the headline keeps the ends of the batch range; every batch with its range is in the detail
    said = (f"Engine-free probe on the model's layer shapes{of} ({info.get('device')}, {info.get('dtype')}, MoE: "
            f"{info.get('moe_method')}): gain per decode step over eager at batch {lo}"
            + (f" and {hi}" if lo != hi else "") + f": {ends}")
    more = f" Per batch, with its range over {runs} paired runs: {per_batch}."
    more += " CUDA graphs need CUDA: on a CPU only eager and compile are timed." if cpu else ""
    if measured is not None and measured.effect is not None:
        more += f" Measured with the engine: {measured.effect.treatment} {measured.effect.text()}. "
        best = float(up["gain_pct"].max()) if len(up) else float("-inf")
        if measured.effect.value_pct > best:
            more += ("The engine gained more than the probe: the probe times the GPU side of a stack of layers, and "
                     "leaves out the host work a graph also removes in the engine (its per-step scheduling, sampling "
                     "and Python between launches), so it estimates the kernel-launch share of the gain, not its "
                     "ceiling.")
        else:
            more += ("The probe estimates what the launch overhead alone returns; a measured gain far below it is "
                     "host work graphs do not remove.")
    if info.get("errors"):
        more += " Forms that could not run: " + "; ".join(f"{k}: {v}" for k, v in info["errors"].items()) + "."
    return Finding(thread=THREAD, kind="measurement", title=head, applies=False,
                   confidence="medium" if len(up) else "low", headline=said, detail=more.strip(),
                   reason="an engine-free estimate of what graphs (or compile) take off a decode step here, not a change",
                   evidence={"ceiling": g.drop(columns=[c for c in ("runs",) if c in g]).to_dict("records"),
                             "ceiling_info": info})
