"""Thread 1: why are CUDA graphs off (or not what was asked)? A flag, an auto-disable rule, or a crash at capture.

Evidence, in order of strength: the configuration the running server resolved (SGLang /server_info, vLLM
/server_info in dev mode), the server's own log lines, and the static audit of the installed engine's source,
which lists every rule that turns graphs off; a rule whose condition matches a fact of the resolved
configuration is named as the reason."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from ..engines import get_engine
from ..engines.audit import graph_disable_audit
from ..engines.base import EngineInstall
from ..engines.logs import analyze_log, patterns_for
from ..engines.vllm import GRAPH_MODES
from ..errors import ServescopeError
from ..experiment import Config, Results, measure
from ..findings import Finding
from ..launch import find_install
from ..spec import EngineSpec, Knobs, LoadSpec, ModelSpec, TelemetrySpec, parse
from ..store import Store

THREAD = "01_cuda_graph_disable_reason"
CONFIG = "requested"
_VLLM_INTENT = {"NONE": "off", "PIECEWISE": "piecewise (every batch)", "FULL": "full",
                "FULL_DECODE_ONLY": "decode_only", "FULL_AND_PIECEWISE": "piecewise"}


def run(engine: dict[str, Any] | EngineSpec, model: dict[str, Any] | ModelSpec, load: dict[str, Any] | LoadSpec,
        knobs: dict[str, Any] | Knobs | None = None, store_dir: str = "", offline: bool = False, force: bool = False,
        progress: bool = True, telemetry: dict[str, Any] | TelemetrySpec | None = None) -> Results:
    """Launch once with the requested knobs (default: the engine's defaults), serve the load, keep what the server
    resolved and logged. With the suite's load and default knobs this is thread 5's first compiled point."""
    e = parse(EngineSpec, engine, "engine")
    m = parse(ModelSpec, model, "model")
    ld = parse(LoadSpec, load, "load")
    k = parse(Knobs, knobs or {}, "knobs")
    tel = parse(TelemetrySpec, telemetry or {}, "telemetry")
    return measure(e, m, [Config(CONFIG, k)], ld, repetitions=1, store=Store(store_dir or None), offline=offline,
                   force=force, progress=progress, telemetry=tel)


@dataclass
class GraphState:
    """What the server resolved, in the suite's terms (None where the server did not say)."""

    engine: str
    graphs: str | None  # intent: off / decode_only / full / piecewise
    engine_mode: str | None  # the engine's own words: 'NONE', 'decode=full prefill=disabled', ...
    compile: str | None
    facts: dict[str, Any]


def _full_resolved(res: Results) -> dict[str, Any] | None:
    if res.points.empty:
        return None
    p = Path(res.points["path"].iloc[0]) / "resolved_config.json"
    if not p.is_file():
        return None
    return json.loads(p.read_text())


def graph_state(engine: str, resolved: dict[str, Any] | None) -> GraphState:
    """Normalize a resolved configuration (vLLM /server_info or SGLang /server_info) to the graph intent."""
    if not resolved:
        return GraphState(engine, None, None, None, {})
    vc = resolved.get("vllm_config")
    if isinstance(vc, dict):
        cc, mc = vc.get("compilation_config") or {}, vc.get("model_config") or {}
        raw = cc.get("cudagraph_mode")
        name = GRAPH_MODES.get(tuple(raw) if isinstance(raw, list) else raw, str(raw)) if raw is not None else None
        facts = {"device": (vc.get("device_config") or {}).get("device"), "enforce_eager": mc.get("enforce_eager"),
                 "compilation_mode": cc.get("mode"), "cudagraph_capture_sizes": cc.get("cudagraph_capture_sizes"),
                 "TORCH_COMPILE_DISABLE": (resolved.get("vllm_env") or {}).get("TORCH_COMPILE_DISABLE")}
        return GraphState(engine, _VLLM_INTENT.get(name or ""), name, {0: "off"}.get(cc.get("mode"), "on"), facts)
    targs = resolved.get("transformers_serve_args")
    if isinstance(targs, dict):
        cg = targs.get("cb_use_cuda_graph")
        graphs = {True: "full", False: "off"}.get(cg) if cg is not None else None
        mode = f"--cb-use-cuda-graph={cg}" if cg is not None else \
            "cb_use_cuda_graph not given: transformers decides at run time (see its log)"
        return GraphState(engine, graphs, mode, "on" if targs.get("compile") else "off",
                          {k: targs.get(k) for k in ("continuous_batching", "device", "dtype", "attn_implementation")
                           if k in targs})
    r = resolved
    cfg = r.get("cuda_graph_config") if isinstance(r.get("cuda_graph_config"), dict) else {}
    dec = (cfg.get("decode") or {}).get("backend") or r.get("cuda_graph_backend_decode")
    pre = (cfg.get("prefill") or {}).get("backend") or r.get("cuda_graph_backend_prefill")
    if dec is not None or pre is not None:  # 0.5.2x per-phase backends
        dec, pre = dec or "full", pre or "disabled"
        graphs = "off" if dec == "disabled" and pre == "disabled" else "decode_only" if pre == "disabled" else \
            "full" if pre == "full" else "piecewise"
        mode = f"decode={dec} prefill={pre}"
    elif r.get("disable_cuda_graph"):
        graphs, mode = "off", "disable_cuda_graph=True"
    else:
        pcg = r.get("enable_piecewise_cuda_graph")
        if "disable_piecewise_cuda_graph" in r:
            pcg = not r["disable_piecewise_cuda_graph"]
        graphs = "piecewise" if pcg else "decode_only"
        mode = f"decode graphs, piecewise prefill {'on' if pcg else 'off'}"
    keys = ("attention_backend", "deepep_mode", "moe_a2a_backend", "enable_torch_compile", "disaggregation_mode",
            "enable_two_batch_overlap", "pp_size", "cuda_graph_max_bs", "max_running_requests", "moe_runner_backend",
            "version")
    return GraphState(engine, graphs, mode, "on" if r.get("enable_torch_compile") else "off",
                      {k: r[k] for k in keys if k in r})


def requested_vs_resolved(knobs: Knobs, state: GraphState) -> pd.DataFrame:
    """The graph and compile settings asked for against what the server resolved."""
    rows = [{"setting": "cuda_graph", "requested": knobs.cuda_graph or "engine default",
             "resolved": state.graphs or "not reported", "engine_says": state.engine_mode or ""},
            {"setting": "torch_compile", "requested": {None: "engine default", True: "on", False: "off"}[knobs.torch_compile],
             "resolved": state.compile or "not reported", "engine_says": ""}]
    df = pd.DataFrame(rows)
    df["differs"] = [r.requested not in ("engine default", r.resolved) and r.resolved != "not reported"
                     for r in df.itertuples()]
    return df


# facts of a resolved configuration -> the audit condition they satisfy (regex on the condition text)
def _fact_rules(state: GraphState) -> list[tuple[str, str]]:
    f = state.facts
    out = []
    if state.engine == "vllm" or "compilation_mode" in f:
        if f.get("device") not in (None, "cuda"):
            out.append((f"device is {f.get('device')}: this platform has no static CUDA-graph mode",
                        r"^not \(current_platform\.support_static_graph_mode\(\)\)$"))
        if f.get("device") == "cpu":
            out.append(("device is cpu: vLLM's CPU model runner has no CUDA graphs", "file:cpu_model_runner\\.py$"))
        if f.get("enforce_eager"):
            out.append(("--enforce-eager was given", r"model_config\.enforce_eager$"))
        if f.get("TORCH_COMPILE_DISABLE") in ("1", 1, True):
            out.append(("TORCH_COMPILE_DISABLE=1 in the environment", r"TORCH_COMPILE_DISABLE"))
    elif state.engine == "transformers":
        if f.get("device") != "cuda":
            out.append(("no CUDA device", r"^not torch\.cuda\.is_available\(\)$|get_accelerator_graph_name\(\) is None"))
    else:
        if f.get("attention_backend") in ("torch_native", "flex_attention"):
            out.append((f"attention backend is {f['attention_backend']}", re.escape(f"== '{f['attention_backend']}'")))
        if f.get("deepep_mode") == "normal":
            out.append(("DeepEP in normal mode", r"deepep_mode == 'normal'"))
        if f.get("enable_torch_compile"):
            out.append(("torch.compile is on", r"enable_torch_compile"))
        if f.get("disaggregation_mode") in ("prefill", "decode"):
            out.append((f"PD disaggregation, {f['disaggregation_mode']} server",
                        re.escape(f"disaggregation_mode == '{f['disaggregation_mode']}'")))
        if f.get("enable_two_batch_overlap"):
            out.append(("two-batch overlap is on", r"enable_two_batch_overlap"))
        if (f.get("pp_size") or 1) > 1:
            out.append(("pipeline parallelism", r"pp_size > 1"))
    return out


def explain(state: GraphState, audit: pd.DataFrame, log: pd.DataFrame) -> pd.DataFrame:
    """The rules that explain the resolved graph mode: audit rows whose condition a resolved fact satisfies, and the
    server's own graph lines. One row per piece of evidence: source ('audit' / 'log'), fact, where, effect, text."""
    rows = []
    for fact, rx in _fact_rules(state):
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


def state_of(res: Results, engine: dict[str, Any] | EngineSpec) -> GraphState:
    """The graph state of the measured point, from the resolved configuration stored with it (vLLM without
    /server_info: from its startup log's config line)."""
    name = parse(EngineSpec, engine, "engine").name
    resolved = _full_resolved(res)
    if resolved is None and name == "vllm" and not res.points.empty:
        from ..engines.logs import vllm_config_from_log

        folder = Path(res.points["path"].iloc[0])
        text = "\n".join(p.read_text(errors="replace") for p in (folder / "server.stderr.log",
                                                                 folder / "server.stdout.log") if p.is_file())
        resolved = vllm_config_from_log(text) if text else None
    state = graph_state(name, resolved)
    if name == "transformers" and state.graphs is None:  # its decision is only in the log
        log, _ = server_log(res, engine)
        used = log[log["name"] == "cb_cuda_graphs_used"] if len(log) else log
        if len(used):
            varlen, decode = used["varlen"].iloc[-1] == "True", used["decode"].iloc[-1] == "True"
            state.graphs = "full" if varlen and decode else "decode_only" if decode else "off" if not varlen else \
                "prefill only"
            state.engine_mode = f"(varlen, decode) = ({varlen}, {decode}), from its log"
    return state


def server_log(res: Results, engine: dict[str, Any] | EngineSpec) -> tuple[pd.DataFrame, str]:
    """The analysed server log of the point (both streams), or an empty table and why."""
    if res.points.empty:
        return pd.DataFrame(), "no point measured"
    folder = Path(res.points["path"].iloc[0])
    logs = [p for p in (folder / "server.stderr.log", folder / "server.stdout.log") if p.is_file()]
    if not logs:
        return pd.DataFrame(), f"the server log was not kept in {folder}"
    text = "\n".join(p.read_text(errors="replace") for p in logs)
    return analyze_log(text, patterns_for(parse(EngineSpec, engine, "engine").name)), ""


def audit_for(engine: dict[str, Any] | EngineSpec, install: EngineInstall | None = None) -> pd.DataFrame:
    """The graph-disable audit of the engine as installed (its managed environment or engine.python); empty for an
    external server, whose source is not here."""
    engine = parse(EngineSpec, engine, "engine")
    ad = get_engine(engine.name)
    if not ad.launches:
        return pd.DataFrame()
    if install is None:
        try:
            install = find_install(engine, create=False)
        except ServescopeError:  # not installed here (yet): nothing to read
            return pd.DataFrame()
        assert install is not None
    return graph_disable_audit(ad.source_tree(install))


def findings(engine_name: str, knobs: Knobs, state: GraphState, why: pd.DataFrame, log: pd.DataFrame,
             errors: pd.DataFrame | None = None) -> list[Finding]:
    """What thread 1 concludes: graphs as resolved, and why (rule, flag or crash), with the evidence."""
    crashed = log[log["name"].isin(["capture_failed"])] if len(log) else log
    rules = why[why["source"] == "audit"] if len(why) else why
    if errors is not None and len(errors) and state.graphs is None:
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
                        claim=f"The server did not report its graph mode ({state.engine_mode or 'no resolved config'}).",
                        reason="no /server_info (vLLM: VLLM_SERVER_DEV_MODE=1, which servescope sets when it launches) "
                               "and no graph decision in its log")]
    if len(crashed):
        claim = f"CUDA-graph capture failed: {crashed['line'].iloc[0]}"
    elif state.graphs == "off" and len(rules):
        facts = "; ".join(dict.fromkeys(rules["fact"]))
        where = ", ".join(dict.fromkeys(rules["where"]))[:300]
        claim = f"CUDA graphs are off ({state.engine_mode}) because {facts}: rule at {where}."
    elif state.graphs == "off":
        claim = f"CUDA graphs are off ({state.engine_mode}); no rule of the audit matched a resolved fact."
    else:
        claim = f"CUDA graphs resolved to {state.graphs} ({state.engine_mode})."
    rec: list[str] = []
    if state.graphs == "off" and state.facts.get("enforce_eager"):
        rec = ["drop --enforce-eager"]
    asked = knobs.cuda_graph
    differs = asked is not None and state.graphs not in (asked, None)
    return [Finding(thread=THREAD, title="Why CUDA graphs are " + ("not as requested" if differs else state.graphs or "?"),
                    claim=claim + (f" Requested: {asked}." if asked else " Requested: the engine's defaults."),
                    recommended_flags=rec, confidence="high" if len(rules) or len(crashed) else "medium",
                    evidence={"engine": engine_name, "resolved_mode": state.engine_mode, "facts": state.facts,
                              "rules": rules.head(10).to_dict("records") if len(rules) else []})]
