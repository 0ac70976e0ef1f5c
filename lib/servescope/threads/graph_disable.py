"""Thread 1: why are CUDA graphs off (or not what was asked)? A flag, an auto-disable rule, or a crash at capture.

Evidence, in order of strength: the configuration the running server resolved (read by the engine's adapter into one
engine-neutral record), the server's own log lines, and the static audit of the installed engine's source, which
lists every rule that turns graphs off; a rule whose condition matches a fact of the resolved configuration is named
as the reason."""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd

from ..analysis.regime import point_level
from ..context import RepetitionPlan, RunContext
from ..engines.audit import explain_state
from ..engines.base import EngineInstall
from ..engines.logs import analyze_log
from ..engines.matrix import source_tree as published_source
from ..errors import KnobError, ServescopeError, SpecError
from ..findings import Change, Failure, Finding, sentences
from ..queries import audit_for, stored_failures, stored_points
from ..spec import Knobs, ProfileSpec, parse
from ..state import ResolvedState
from ..study import Arm, Study, run_study
from ..util import known

THREAD = "01_cuda_graph_disable_reason"
QUESTION = "Why are CUDA graphs off: a flag, an auto-disable rule, or a crash at capture?"
ARM = "requested"


def arms(knobs: dict[str, Any] | Knobs | None = None) -> list[Arm]:
    """One arm: the requested knobs (default: the engine's defaults)."""
    return [Arm(ARM, parse(Knobs, knobs or {}, "knobs"), "as requested")]


@dataclass
class DisableStudy:
    """Thread 1's result: the one launch, its analysed server log (or why there is none), the graph audit of the
    engine that ran, and the evidence that explains the resolved graph mode."""

    study: Study
    log: pd.DataFrame
    log_reason: str
    audit: pd.DataFrame
    why: pd.DataFrame


def run(ctx: RunContext, knobs: dict[str, Any] | Knobs | None = None) -> DisableStudy:
    """Launch once with the requested knobs, serve the load, keep what the server resolved and logged; read the
    log and the engine's rules that explain the graph mode it resolved to."""
    arm = arms(knobs)  # a bad knob is refused before anything launches
    study = run_study(THREAD, ctx.with_(plan=RepetitionPlan(1, 1), profile=ProfileSpec()), arm)
    log, log_reason = server_log(study)
    audit = audit_for(ctx, study.install)
    return DisableStudy(study, log, log_reason, audit, explain(study, audit, log))


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


# the graph modes thread 1 recommends, in order of preference where nothing better is known: piecewise (the
# engines' own default where they have it), decode graphs alone, then full graphs
ON_MODES = ("piecewise", "decode_only", "full", "compiled_piecewise")


def graph_modes_seen(study: Study) -> tuple[list[str], dict[str, Failure]]:
    """The graph modes the store holds served points of for this engine and model (most served first), and those
    that failed there (mode -> its failure)."""
    served: dict[str, int] = {}
    for pt in study.ctx.store.points(study.ctx.engine_identity, study.ctx.model_key):
        mode = (pt.parts.get("knobs") or {}).get("cuda_graph")
        if mode and mode != "off" and set(pt.parts.get("knobs") or {}) == {"cuda_graph"}:
            served[mode] = served.get(mode, 0) + 1
    # a mode failed here only where it was asked alone: compile with piecewise graphs dying says nothing of piecewise
    # graphs without compile (SGLang 0.5.17 on the H200 served the one and died in the other)
    failed = {str(f.knobs["cuda_graph"]): f for f in [*stored_failures(study.ctx), *study.failures()]
              if f.knobs.get("cuda_graph") not in (None, "off") and set(f.knobs) == {"cuda_graph"}}
    rank = {m: i for i, m in enumerate(ON_MODES)}
    return sorted((m for m in served if m not in failed), key=lambda m: rank.get(m, len(rank))), failed


def graphs_on(study: Study) -> tuple[str, list[str]]:
    """The graph mode to turn graphs on with and its flags in this engine version's spelling: a mode the store holds
    served points of, else the first of ON_MODES this version expresses; never one that failed here. ('', []) without
    CUDA, or where the version has no such knob or its install is unknown. Where the install is not on this machine,
    the published release of the same version spells them."""
    install = study.install
    if install is None or not study.adapter.launches or install.platform != "cuda":  # no graphs without CUDA
        return "", []
    served, failed = graph_modes_seen(study)
    order = [*served, *(m for m in ON_MODES if m not in served and m not in failed)]
    for inst in (install, None):
        try:
            inst = inst or replace(install, source=published_source(study.adapter, install.version).location)
            for intent in order:
                try:
                    return intent, study.adapter.knob_flags(parse(Knobs, {"cuda_graph": intent}, "knobs"), inst)
                except (KnobError, SpecError):
                    continue
            return "", []
        except (ServescopeError, OSError):  # not here: try the published release (no network: nothing)
            continue
    return "", []


def graphs_on_flags(study: Study) -> list[str]:
    """The flags of graphs_on."""
    return graphs_on(study)[1]


def launch_off_flags(study: Study) -> list[dict[str, str]]:
    """The flags of the measured launch's own command that turn CUDA graphs (or a phase) off, in the version's
    spelling, with what a deprecated alias stands for (the adapter reads them)."""
    pts = study.results.points
    if not len(pts) or study.install is None:
        return []
    cmd = str(pts["command"].iloc[0] or "")
    return study.adapter.graph_off_flags(shlex.split(cmd), readable_install(study)) if cmd else []


def readable_install(study: Study) -> EngineInstall:
    """The install the study ran on, or, where its source is not on this machine (an offline render elsewhere), the
    published release of the same version (fetched once, cached per user), so the version's own flags are read."""
    install = study.install
    assert install is not None
    try:
        study.adapter.source_tree(install)
        return install
    except (ServescopeError, OSError):
        pass
    try:
        return replace(install, source=published_source(study.adapter, install.version).location)
    except (ServescopeError, OSError):  # no network to the index and nothing cached: the flags stay unqualified
        return install


def startup_stages(study: Study) -> pd.DataFrame:
    """What the launch cost: each startup stage its log times (weights, each graph capture), and launch to first
    token."""
    pt = study.results.point(ARM)
    rows = study.adapter.startup_stages(pt.log()) if pt is not None and pt.has_log() else pd.DataFrame()
    start = study.startup()
    if len(start):
        rows = pd.concat([rows, pd.DataFrame([{"stage": "launch to first token (all of it)",
                                               "seconds": float(start["first_token_s"].iloc[0])}])], ignore_index=True)
    return rows


def causes(study: Study, why: pd.DataFrame) -> pd.DataFrame:
    """The three causes thread 1 checks, each with what was found: the launch's own flags, a rule of the engine whose
    condition a resolved fact meets, and a crash at capture (this launch, or a graph or compile configuration of this
    engine and model that the store saw die)."""
    own = launch_off_flags(study)
    rules = why[why["source"] == "audit"] if len(why) else why
    _, failed = graph_modes_seen(study)
    died = [*{f.config: f for f in [*study.failures(), *stored_failures(study.ctx)]
              if f.before_ready and (f.knobs.get("cuda_graph") not in (None, "off") or f.knobs.get("torch_compile")
                                     or f.config == ARM)}.values()]
    rows = [{"cause": "a flag of the launch", "found": bool(own),
             "evidence": "; ".join(f"`{x['flag']}` turns off {x['phases']}" + (f" ({x['alias']})" if x["alias"] else "")
                                   for x in own) or "no graph-off flag in the launch command"},
            {"cause": "an automatic rule of the engine", "found": bool(len(rules)),
             "evidence": "; ".join(dict.fromkeys(f"{r.fact}: {r.where}" for r in rules.itertuples()))[:600]
             if len(rules) else "no audit rule's condition matched a resolved fact"},
            {"cause": "a crash at capture", "found": bool(died),
             "evidence": "; ".join(f"{f.config} {f.words()}" for f in died)[:800] or
             "no graph or compile configuration of this engine and model died here (this launch and the store)"}]
    return pd.DataFrame(rows)


def graph_twin(study: Study, apart: float = 1.3) -> Finding | None:
    """Where the server did not say its graph mode, which side of a stored explicit pair (graphs off, graphs on, same
    engine, model and load) its throughput resembles, level by level: an inference from speed, stated as one. None
    without such a pair, or where the pair's sides are not `apart` times apart at a level both measured."""
    mine = study.results.summary
    if mine.empty:
        return None
    stored = stored_points(study.ctx).summary
    if stored.empty:
        return None
    sides = {"off": stored[stored["config"] == "cuda_graph=off"],
             "on": stored[stored["config"].isin(["cuda_graph=full", "cuda_graph=decode_only"])]}
    if any(g.empty for g in sides.values()):
        return None
    rows = []
    for point, g in mine.groupby("point"):
        me = float(g["output_tok_s"].median())
        off, on = (float(sides[k].loc[sides[k]["point"] == point, "output_tok_s"].median()) for k in ("off", "on"))
        if not (known(off) and known(on) and me > 0) or max(on, off) < apart * min(on, off):
            continue
        near = "off" if abs(math.log(me / off)) < abs(math.log(me / on)) else "on"
        rows.append({"point": point, "output_tok_s": me, "off_tok_s": off, "on_tok_s": on, "resembles": near})
    if not rows:
        return None
    rows.sort(key=lambda r: point_level(str(r["point"])))
    sides_seen = {r["resembles"] for r in rows}
    words = "; ".join(f"{r['point']}: {r['output_tok_s']:.0f} tok/s against off {r['off_tok_s']:.0f}, on "
                      f"{r['on_tok_s']:.0f}" for r in rows)
    state = state_of(study)
    if len(sides_seen) > 1:
        return Finding(thread=THREAD, kind="cause", title="Resolved graph mode unknown (speed between graphs off and "
                       "on)", applies=False, confidence="none", reason=state.why_missing("graph_decode"),
                       headline=f"The server did not report its graph mode ({state.why_missing('graph_decode')}); its "
                                f"speed resembles neither side of the stored pair at every level: {words}",
                       evidence={"resolved": state.to_dict(), "pair": rows})
    side = sides_seen.pop()
    return Finding(thread=THREAD, kind="cause", title=f"CUDA graphs probably {side} (inferred from speed)",
                   applies=False, confidence="medium" if len(rows) >= 2 else "low", reason="an inference from "
                   "throughput, not the engine's own report",
                   headline=f"The server did not report its graph mode ({state.why_missing('graph_decode')})",
                   detail=f"At {'every' if len(rows) > 1 else 'the one'} level where the stored explicit pair differs "
                          f"by {apart:.1f}x or more, its throughput is nearer the graphs-{side} side: {words}. "
                          "This is inferred from speed, not read from the engine.",
                   evidence={"resolved": state.to_dict(), "pair": rows, "inferred": side})


def _turn_on(on: list[str], on_mode: str, own: list[dict[str, str]], rules: pd.DataFrame) -> str:
    """'To turn them on: drop the launch's own flags, and launch with FLAGS (mode)', with the rules' remedies."""
    remedies = [r for r in dict.fromkeys(rules["remedy"]) if r] if len(rules) and "remedy" in rules else []
    names = [f"`{x['flag']}`" for x in own]
    drop = f"drop {', '.join(names[:-1])} and {names[-1]}, and launch with " if len(names) > 1 else \
        f"drop {names[0]}, and launch with " if names else ""
    mode = f" ({on_mode})" if own else ""
    return f" To turn them on: {drop}`{' '.join(on)}`{mode}" + (f", {'; '.join(remedies)}" if remedies else "") + "."


def _not_started(study: Study, knobs: Knobs, first: pd.Series) -> Finding:
    """The launch failed: a death before ready with the engine's own exception is the answer (a crash at capture);
    anything else says what is known of it."""
    err = str(first["error"])
    dead = study.failure(ARM)
    if dead is not None and dead.before_ready and dead.exception:
        return Finding(thread=THREAD, kind="failure", title="The launch dies before it is ready", applies=True,
                       confidence="high", reason=dead.words(), failures=[dead],
                       headline=f"The server launched with {knobs.label()} {dead.words()}"
                       + ("; the engine then tore its own process tree down" if dead.teardown == "engine" else ""),
                       detail="Its log is under the store's _failed/ folder.",
                       evidence={"error": err[-2000:], "signal": first["signal"]})
    said = (f"{first['death']}" if first["death"] else
            f"last line of its log: {[ln for ln in err.splitlines() if ln.strip()][-1][:300]}")
    return Finding(thread=THREAD, kind="failure", title="The server did not start", applies=False, confidence="none",
                   **sentences(str(first["summary"]), said), failures=study.failures(),
                   reason="launch failed; its log is under data/runs/_failed/",
                   evidence={"error": err[-2000:], "signal": first["signal"]})


def _flags_said(own: list[dict[str, str]]) -> str:
    """The launch's own graph flags in words, flags that one explanation covers said together (the pair SGLang's
    --disable-cuda-graph stands for was said twice, once per flag)."""
    groups: dict[str, list[dict[str, str]]] = {}
    for x in own:
        groups.setdefault(x["alias"], []).append(x)
    parts = []
    for alias, xs in groups.items():
        flags = " and ".join(f"`{x['flag']}`" for x in xs)
        phases = " and ".join(dict.fromkeys(p for x in xs for p in x["phases"].split(" and ")))
        parts.append(f"{flags} turn{'s' if len(xs) == 1 else ''} off {phases} graphs"
                     + (f" ({alias})" if alias else ""))
    return "; ".join(parts)


def findings(ds: DisableStudy) -> list[Finding]:
    """What thread 1 concludes: graphs as resolved, and why (rule, flag or crash), with the evidence."""
    study, why, log = ds.study, ds.why, ds.log
    state, knobs, errors = state_of(study), study.arm(ARM).knobs, study.results.errors
    crashed = log[log["name"].isin(["capture_failed"])] if len(log) else log
    rules = why[why["source"] == "audit"] if len(why) else why
    if len(errors) and state.graphs is None:
        return [_not_started(study, knobs, errors.iloc[0])]
    if state.graphs is None:
        twin = graph_twin(study)
        if twin is not None:
            return [twin]
        return [Finding(thread=THREAD, kind="cause", title="Resolved graph mode unknown", applies=False,
                        headline=f"The server did not report its graph mode: {state.why_missing('graph_decode')}, and "
                                 "no stored pair of graphs-off and graphs-on launches of this engine and model to "
                                 "compare its speed with",
                        reason=state.why_missing("graph_decode"), evidence={"resolved": state.to_dict()})]
    mode = state.graph_mode or state.graphs
    own = launch_off_flags(study) if state.graphs != "full" else []
    on_mode, on = graphs_on(study) if (state.graphs == "off" or own) and not state.eager else ("", [])
    detail = ""
    if len(crashed):
        headline = f"CUDA-graph capture failed: {crashed['line'].iloc[0]}"
    elif own:
        said = _flags_said(own)
        headline = f"CUDA graphs are {state.graphs or 'partly off'} ({mode}) because the launch asked for it: {said}"
        detail = (f" Rules of the engine that would also turn them off here: "
                  f"{'; '.join(dict.fromkeys(rules['fact']))}." if len(rules) else "")
    elif state.graphs == "off" and len(rules):
        facts = "; ".join(dict.fromkeys(rules["fact"]))
        where = ", ".join(dict.fromkeys(rules["where"]))[:300]
        headline = f"CUDA graphs are off ({mode}) because {facts}: rule at {where}"
    elif state.graphs == "off":
        headline = f"CUDA graphs are off ({mode}); no rule of the audit matched a resolved fact"
    else:
        headline = f"CUDA graphs resolved to {state.graphs} ({mode})"
    _, failed = graph_modes_seen(study)
    if on and not len(crashed):
        detail += _turn_on(on, on_mode, own, rules)
    if failed:
        # the modes that died, by name: the mode recommended above is one that served
        detail += f" Not {', '.join(failed)}, which died here: " + "; ".join(
            f"{m} {f.words()}" for m, f in failed.items()) + "."
    if state.graphs == "off" and state.eager and not own:
        detail += " The server was started with the engine's eager switch, which turns graphs off: drop it."
    if state.dtype:
        detail += f" Weights served in {state.dtype_words()}."
    asked = knobs.cuda_graph
    differs = asked is not None and state.graphs not in (asked, None)
    evidence = {"engine": study.engine.name, "resolved_mode": state.graph_mode, "resolved": state.to_dict(),
                "facts": state.facts, "rules": rules.head(10).to_dict("records") if len(rules) else [],
                "launch_flags": own}
    # what a later thread composes (07), and what the summary checks against what failed here
    change = Change(knobs=Knobs(cuda_graph=on_mode), flags=on) if on else None  # type: ignore[arg-type]
    title = ("Why CUDA graphs are " + ("not as requested" if differs else state.graphs)) if not own else \
        f"CUDA graphs are {state.graphs or 'partly off'} because of the launch's own flag"
    return [Finding(thread=THREAD, kind="cause", title=title, headline=headline,
                    detail=(detail + f" Requested: {_requested(study, knobs)}.").strip(),
                    confidence="high" if len(rules) or len(crashed) or own else "medium", change=change,
                    evidence=evidence, failures=list(failed.values()))]


def _requested(study: Study, knobs: Knobs) -> str:
    """What the launch asked for: the suite's deployment with the thread's knobs over it, or the engine's defaults."""
    dep = study.ctx.deployment
    own = knobs.label() if knobs != Knobs() else ""
    if dep.empty:
        return own or "the engine's defaults"
    return f"the suite's deployment ({dep.words()})" + (f" with {own}" if own else "")
