"""Thread 5: does torch.compile help this server, and does it exclude piecewise CUDA graphs here?

Two arms ask for their state explicitly: compiled (compile on) and eager (compile off), both with the CUDA-graph mode
the engine compares compile under (off; SGLang: decode graphs, inside which it compiles). The study checks that
each side resolved to what it asked before it states an effect."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ..comparison import Comparison
from ..context import RepetitionPlan, RunContext
from ..engines.audit import find_rules
from ..errors import KnobError, ServescopeError
from ..findings import Change, Conflict, Failure, Finding, sentences
from ..queries import stored_row
from ..spec import Knobs, ProfileSpec
from ..study import Arm, Study, run_study

THREAD = "05_torch_compile"
QUESTION = "Does torch.compile help, and does it exclude piecewise graphs here?"
BASELINE, TREATMENT = "eager", "compiled"
# 'eager' belongs to the studied change: where an engine has an eager switch (vLLM --enforce-eager), that switch is
# how it spells compile off
STUDIED = ("compile", "eager")
CONTROLS = ("graph_decode", "graph_prefill", "tp", "dp")


def arms(ctx: RunContext) -> list[Arm]:
    """Compiled and eager, each asking for its compile state, both pinning the same graph mode."""
    graphs = ctx.adapter.compile_study_graphs
    return [Arm(TREATMENT, Knobs(torch_compile=True, cuda_graph=graphs), f"torch.compile on, CUDA graphs {graphs}"),
            Arm(BASELINE, Knobs(torch_compile=False, cuda_graph=graphs), f"torch.compile off, CUDA graphs {graphs}")]


@dataclass
class CompileStudy:
    """Thread 5's result: compiled against eager, and whether compile excludes piecewise graphs (None: not asked)."""

    study: Study
    exclusion: Exclusion | None = None

    @property
    def comparison(self) -> Comparison:
        """Compiled against eager (comparison())."""
        return comparison(self.study)


def run(ctx: RunContext, exclusion: bool = True) -> CompileStudy:
    """Measure both arms in alternating repetitions: at least the plan's minimum, more within it while compile's
    effect is not resolved; then, where exclusion, ask compile for each piecewise form (piecewise_exclusion)."""
    study = run_study(THREAD, ctx, arms(ctx), headlines=[(BASELINE, TREATMENT)])
    return CompileStudy(study, piecewise_exclusion(study) if exclusion else None)


def comparison(study: Study) -> Comparison:
    """Compiled against eager: compile is what differs; graphs and parallelism must not."""
    return study.compare(BASELINE, TREATMENT, STUDIED, CONTROLS)


PROBE = "compiled+piecewise"
# the piecewise forms a version may offer: graphs split by the engine (SGLang breakable) and by torch.compile itself
PIECEWISE_FORMS = {"piecewise": PROBE, "compiled_piecewise": "compiled+compiled_piecewise"}


@dataclass
class Exclusion:
    """Whether compile excludes piecewise CUDA graphs on this engine version, and the evidence."""

    verdict: str  # 'excludes', 'coexist', 'dies', 'dies without piecewise too', 'not expressible', 'not verified'
    words: str
    evidence: pd.DataFrame
    failures: list[Failure] = field(default_factory=list)


def piecewise_exclusion(study: Study) -> Exclusion:
    """Ask this engine version for compile with each piecewise form it can express (the engine's own split and
    torch.compile's, where it offers both): if it can express neither, say why; else launch each once (one
    repetition, the lightest load level) and read what it resolved, or how it died. The audit's rules that turn
    graphs off when compile is on are listed with it."""
    rows: list[dict[str, Any]] = []
    install = study.install
    if install is None:
        return Exclusion("not verified", "not asked: no point of the comparison was measured, and the probes ask the "
                         "engine install those points ran on", _with_audit(study, rows))
    ld = study.ctx.load
    level = min(ld.concurrency) if ld.mode == "closed" else 1
    probe_load = ld.model_copy(update={"concurrency": (level,), "num_requests": max(4, 2 * level), "duration_s": None})
    one = study.ctx.with_(load=probe_load, plan=RepetitionPlan(1, 1), progress=False, profile=ProfileSpec())
    arms = []
    unasked = []  # the forms the engine was not here to ask, and the store does not hold
    for mode, name in PIECEWISE_FORMS.items():
        arm = Arm(name, Knobs(torch_compile=True, cuda_graph=mode), f"compile on, {mode} graphs asked")
        try:
            flags = study.adapter.knob_flags(arm.knobs, install)
        except KnobError as e:  # the version cannot ask for both
            rows.append({"source": "knobs", "where": mode, "text": str(e)})
            continue
        except (ServescopeError, OSError) as e:
            # the engine is not here to ask (an offline render of another machine's run): what the measuring run
            # launched, or saw die, is in the store
            stored = stored_row(one, arm, str(e))
            if not stored["expressible"]:
                rows.append({"source": "knobs", "where": mode, "text": stored["reason"]})
                unasked.append(mode)
                continue
            flags = [stored["flags"]]
        rows.append({"source": "knobs", "where": mode, "text": " ".join(flags)})
        arms.append(arm)
    if not arms and len(unasked) == len(rows):
        return Exclusion("not verified", "neither form is in the store, and the engine is not here to ask: "
                         + rows[0]["text"], _with_audit(study, rows))
    if not arms:
        return Exclusion("not expressible", "this engine version cannot ask for piecewise graphs with compile: "
                         + next(r["text"] for r in rows if r["where"] not in unasked),
                         _with_audit(study, rows))
    probe = run_study(THREAD, one, arms)
    verdicts = [_probe_verdict(probe, a, rows) for a in arms]
    said = "; ".join(f"{a.knobs.cuda_graph}: {w}" for a, (_, w) in zip(arms, verdicts, strict=True))
    verdict, said = _verdict([v for v, _ in verdicts], said, study.failure(TREATMENT), probe)
    return Exclusion(verdict, said, _with_audit(study, rows), probe.failures())


def _verdict(kinds: list[str], said: str, alone: Failure | None, probe: Study) -> tuple[str, str]:
    """The probes' verdicts as one, in words; a death is not read as an exclusion where compile died without
    piecewise graphs too (alone: the compiled arm's failure)."""
    if "coexist" in kinds:
        return "coexist", said
    if "excludes" in kinds:
        return "excludes", said
    if "dies" not in kinds:
        return "not verified", said
    if alone is None or not alone.before_ready:
        return "dies", said
    # the probes' death says nothing about piecewise when compile dies without it: the question stays open
    dead = [f for f in probe.failures() if f.before_ready]
    graphs = alone.knobs.get("cuda_graph", "its own")
    if all(f.frame == alone.frame and f.exception == alone.exception for f in dead):
        said = (f"not told: compile dies here with or without piecewise graphs: the compiled arm ({graphs} "
                f"graphs) and the probes ({', '.join(f.knobs.get('cuda_graph', f.config) for f in dead)}) each "
                f"{alone.words()}")
    else:
        said = (f"not told: compile dies here without piecewise graphs too (the compiled arm, {graphs} graphs, "
                f"{alone.words()}); " + said)
    return "dies without piecewise too", said + "; so whether compile excludes piecewise graphs cannot be told here"


def _probe_verdict(probe: Study, arm: Arm, rows: list[dict[str, Any]]) -> tuple[str, str]:
    """One probe arm's verdict: coexist, excludes, dies (before it is ready, with the engine's exception) or not
    verified, in words."""
    st = probe.states.get(arm.name)
    mode = arm.knobs.cuda_graph
    if st is None:
        dead = probe.failure(arm.name)
        if dead is not None and dead.before_ready and dead.exception:
            rows.append({"source": "died", "where": dead.frame, "text": dead.words()})
            return "dies", f"asking for both, the server {dead.words()}"
        err = probe.results.errors["summary"].iloc[0] if len(probe.results.errors) else "no point"
        return "not verified", f"the probe launch did not measure: {err}"
    rows.append({"source": "resolved", "where": st.source, "text": f"{mode}: compile {st.shown('compile')}, graphs "
                 f"{st.graphs or 'not reported'} ({st.graph_mode or st.why_missing('graph_prefill')})"})
    if st.compile == "on" and st.graph_prefill == mode:
        return "coexist", f"compile and {mode} graphs resolved together ({st.graph_mode})"
    if st.compile == "on" and st.graph_prefill in ("off", "full", "piecewise", "compiled_piecewise"):
        return "excludes", f"with compile on, the {mode} request resolved to prefill graphs {st.graph_prefill} " \
                           f"({st.graph_mode})"
    return "not verified", (f"the probe resolved compile {st.shown('compile')}, prefill graphs "
                            f"{st.shown('graph_prefill')}: {st.why_missing('graph_prefill') or 'no answer'}")


def _with_audit(study: Study, rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The evidence rows, plus every audit rule of the installed source that turns graphs off when compile is on."""
    if study.install is not None:
        from ..engines.audit import graph_disable_audit

        try:
            audit = find_rules(graph_disable_audit(study.adapter.source_tree(study.install)),
                               condition=r"torch_compile|enable_compile")
        except Exception:  # noqa: BLE001 - the engine's source is not readable here: no rows to add
            audit = pd.DataFrame()
        for r in audit.itertuples():
            rows.append({"source": "audit", "where": f"{r.file}:{r.line} {r.function}",
                         "text": f"{r.condition} -> {r.effect}"})
    return pd.DataFrame(rows, columns=["source", "where", "text"])


def findings(cs: CompileStudy) -> list[Finding]:
    """The thread's conclusion: compile's measured effect on throughput, what each side resolved to, the startup
    cost, and what to set, in the engine's spelling (against the run's baseline where the suite gives one); then
    whether compile excludes piecewise graphs here (where it was asked)."""
    study, exclusion = cs.study, cs.exclusion
    cmp = comparison(study)
    start = study.startup()
    st = dict(zip(start["config"], start["first_token_s"], strict=True)) if len(start) else {}
    extra = ""
    if TREATMENT in st and BASELINE in st:
        cost = st[TREATMENT] - st[BASELINE]
        extra = (f" Compile adds {cost:.0f} s to startup (median launch to first token)." if cost >= 0.5 else
                 f" Compile adds no startup time here ({cost:+.1f} s, median launch to first token).")
    f = cmp.finding("torch.compile", "torch.compile", better=Knobs(torch_compile=True),
                    worse=Knobs(torch_compile=False), extra=extra,
                    deployed=_deployed(study))
    if f.applies and TREATMENT in st and BASELINE in st:
        f.evidence["startup_cost_s"] = round(float(st[TREATMENT] - st[BASELINE]), 1)
    if exclusion is None:
        return [f]
    f.kind = "effect"
    known = exclusion.verdict in ("excludes", "coexist", "dies")
    title = {"excludes": "torch.compile excludes piecewise CUDA graphs here",
             "coexist": "torch.compile and piecewise CUDA graphs run together here",
             "dies": "torch.compile with piecewise CUDA graphs dies at capture here",
             "dies without piecewise too": "torch.compile with piecewise CUDA graphs: not verified (compile dies "
                                           "without them too)"}.get(
        exclusion.verdict, f"torch.compile with piecewise CUDA graphs: {exclusion.verdict}")
    said = sentences(exclusion.words[0].upper() + exclusion.words[1:])
    # the rule as data: what thread 07 leaves out of a combination (never read from this finding's words)
    conflicts = [Conflict(knobs={"cuda_graph": "piecewise"}, why=f"{title}: {said['headline']}.")] \
        if exclusion.verdict == "excludes" else []
    x = Finding(thread=THREAD, kind="rule", title=title, **said, applies=known,
                reason="" if known else exclusion.words, confidence="high" if known else "none",
                change=Change(knobs=Knobs(torch_compile=True), excludes=conflicts) if conflicts else None,
                evidence={"rows": exclusion.evidence.to_dict("records"), "verdict": exclusion.verdict},
                failures=exclusion.failures)
    if conflicts and f.change is not None and f.change.knob_settings.get("torch_compile") is True:
        f.change.excludes = conflicts  # the recommended compile says what it excludes too
    return [f, x]


def _deployed(study: Study) -> Knobs | None:
    """How the deployment runs today (the run's baseline), None where it runs the engine's defaults."""
    return Knobs(**study.ctx.baseline) if study.ctx.baseline else None
