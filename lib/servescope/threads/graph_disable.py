"""Thread 1: why are CUDA graphs off (or not what was asked)? A flag, an auto-disable rule, or a crash at capture.

Evidence, in order of strength: the configuration the running server resolved (read by the engine's adapter into one
engine-neutral record), the server's own log lines, and the static audit of the installed engine's source, which
lists every rule that turns graphs off; a rule whose condition matches a fact of the resolved configuration is named
as the reason."""

from __future__ import annotations

from typing import Any

import pandas as pd

from ..context import RepetitionPlan, RunContext
from ..engines.audit import graph_disable_audit
from ..engines.base import EngineInstall
from ..engines.logs import analyze_log
from ..engines.state import ResolvedState
from ..errors import ServescopeError
from ..findings import Finding
from ..launch import find_install
from ..spec import Knobs, ProfileSpec, parse
from ..study import Arm, Study, run_study

THREAD = "01_cuda_graph_disable_reason"
ARM = "requested"


def arms(knobs: dict[str, Any] | Knobs | None = None) -> list[Arm]:
    """One arm: the requested knobs (default: the engine's defaults)."""
    return [Arm(ARM, parse(Knobs, knobs or {}, "knobs"), "as requested")]


def run(ctx: RunContext, knobs: dict[str, Any] | Knobs | None = None) -> Study:
    """Launch once with the requested knobs, serve the load, keep what the server resolved and logged."""
    arm = arms(knobs)  # a bad knob is refused before anything launches
    return run_study(THREAD, ctx.with_(plan=RepetitionPlan(1, 1), profile=ProfileSpec()), arm)


def state_of(study: Study) -> ResolvedState:
    """What the server resolved (every field 'not reported' when the launch failed)."""
    return study.states.get(ARM) or study.adapter.resolved_state(None)


def requested_vs_resolved(study: Study) -> pd.DataFrame:
    """The graph and compile settings asked for against what the server resolved, per field."""
    st = state_of(study)
    knobs = study.arm(ARM).knobs
    rows = [{"setting": "cuda_graph", "requested": knobs.cuda_graph or "engine default",
             "resolved": st.graphs or "not reported", "engine_says": st.graph_mode or st.why_missing("graph_decode")},
            {"setting": "torch_compile", "requested": {None: "engine default", True: "on", False: "off"}[knobs.torch_compile],
             "resolved": st.shown("compile"), "engine_says": st.compile_mode or st.why_missing("compile")},
            {"setting": "dtype", "requested": st.config_dtype or "the model's config", "resolved": st.shown("dtype"),
             "engine_says": st.dtype_words() if st.dtype else st.why_missing("dtype")}]
    df = pd.DataFrame(rows)
    df["differs"] = [r.requested not in ("engine default", r.resolved) and r.resolved != "not reported"
                     for r in df.itertuples()]
    return df


def server_log(study: Study) -> tuple[pd.DataFrame, str]:
    """The analysed server log of the point (both streams), or an empty table and why."""
    pt = study.results.point(ARM) or next(iter(study.results.stored.values()), None)
    if pt is None:
        return pd.DataFrame(), "no point measured"
    if not pt.has_log():
        return pd.DataFrame(), f"the server log was not kept in {pt.path}"
    return analyze_log(pt.log(stderr_first=True), study.adapter.log_patterns()), ""


def explain(study: Study, audit: pd.DataFrame, log: pd.DataFrame) -> pd.DataFrame:
    """The rules that explain the resolved graph mode: audit rows whose condition a resolved fact satisfies (the
    adapter maps facts to conditions), and the server's own graph lines. One row per piece of evidence."""
    return explain_state(study.adapter.fact_rules(state_of(study)), audit, log)


def explain_state(fact_rules: list[tuple[str, str]], audit: pd.DataFrame, log: pd.DataFrame) -> pd.DataFrame:
    """explain() for given fact rules: source ('audit' / 'log'), fact, where, effect, text."""
    rows = []
    for fact, rx in fact_rules:
        col, rx = ("file", rx[5:]) if rx.startswith("file:") else ("condition", rx)  # 'file:<regex>' matches paths
        hit = audit[audit[col].str.contains(rx, regex=True)] if len(audit) else audit
        for r in hit.itertuples():
            rows.append({"source": "audit", "fact": fact, "where": f"{r.file}:{r.line} {r.function}",
                         "effect": r.effect, "text": r.condition if not r.message else f"{r.condition} -> {r.message}"})
    if len(log):
        for r in log[log["kind"].isin(["graph_disabled", "graph_capture"])].itertuples():
            rows.append({"source": "log", "fact": r.meaning, "where": f"log line {r.line_no}", "effect": r.name,
                         "text": r.line})
    return pd.DataFrame(rows, columns=["source", "fact", "where", "effect", "text"])


def audit_for(ctx: RunContext, install: EngineInstall | None = None) -> pd.DataFrame:
    """The graph-disable audit of the engine as installed (its managed environment or engine.python); empty for an
    external server, whose source is not here."""
    ad = ctx.adapter
    if not ad.launches:
        return pd.DataFrame()
    if install is None:
        try:
            install = find_install(ctx.engine, ad, create=False)
        except ServescopeError:  # not installed here (yet): nothing to read
            return pd.DataFrame()
        assert install is not None
    try:
        return graph_disable_audit(ad.source_tree(install))
    except ServescopeError:  # an engine whose source servescope does not read (or is not here)
        return pd.DataFrame()


def findings(study: Study, why: pd.DataFrame, log: pd.DataFrame) -> list[Finding]:
    """What thread 1 concludes: graphs as resolved, and why (rule, flag or crash), with the evidence."""
    state, knobs, errors = state_of(study), study.arm(ARM).knobs, study.results.errors
    crashed = log[log["name"].isin(["capture_failed"])] if len(log) else log
    rules = why[why["source"] == "audit"] if len(why) else why
    if len(errors) and state.graphs is None:
        first = errors.iloc[0]
        err = str(first["error"])
        said = (f"{first['death']}" if first["death"] else
                f"last line of its log: {[ln for ln in err.splitlines() if ln.strip()][-1][:300]}")
        return [Finding(thread=THREAD, title="The server did not start", applies=False, confidence="none",
                        claim=f"{first['summary']}. {said}",
                        reason="launch failed; its log is under data/runs/_failed/",
                        evidence={"error": err[-2000:], "signal": first["signal"]})]
    if state.graphs is None:
        return [Finding(thread=THREAD, title="Resolved graph mode unknown", applies=False,
                        claim=f"The server did not report its graph mode: {state.why_missing('graph_decode')}.",
                        reason=state.why_missing("graph_decode"), evidence={"resolved": state.to_dict()})]
    mode = state.graph_mode or state.graphs
    if len(crashed):
        claim = f"CUDA-graph capture failed: {crashed['line'].iloc[0]}"
    elif state.graphs == "off" and len(rules):
        facts = "; ".join(dict.fromkeys(rules["fact"]))
        where = ", ".join(dict.fromkeys(rules["where"]))[:300]
        claim = f"CUDA graphs are off ({mode}) because {facts}: rule at {where}."
    elif state.graphs == "off":
        claim = f"CUDA graphs are off ({mode}); no rule of the audit matched a resolved fact."
    else:
        claim = f"CUDA graphs resolved to {state.graphs} ({mode})."
    if state.graphs == "off" and state.eager:
        claim += " The server was started with the engine's eager switch, which turns graphs off: drop it."
    if state.dtype:
        claim += f" Weights served in {state.dtype_words()}."
    asked = knobs.cuda_graph
    differs = asked is not None and state.graphs not in (asked, None)
    return [Finding(thread=THREAD, title="Why CUDA graphs are " + ("not as requested" if differs else state.graphs),
                    claim=claim + (f" Requested: {asked}." if asked else " Requested: the engine's defaults."),
                    confidence="high" if len(rules) or len(crashed) else "medium",
                    evidence={"engine": study.engine.name, "resolved_mode": state.graph_mode,
                              "resolved": state.to_dict(), "facts": state.facts,
                              "rules": rules.head(10).to_dict("records") if len(rules) else []})]
