"""Thread 5: does torch.compile help this server, measured as compiled (the engine's default) vs eager?"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from .. import plots
from ..analysis.ab import higher_is_better, paired_effects, verdict
from ..engines.vllm import COMPILE_MODES, GRAPH_MODES
from ..experiment import Config, Results, measure
from ..findings import Effect, Finding
from ..plots import Figure
from ..spec import EngineSpec, Knobs, LoadSpec, ModelSpec, TelemetrySpec, parse
from ..store import Store

THREAD = "05_torch_compile"
BASELINE, TREATMENT = "eager", "compiled"
CONFIGS = (
    Config(TREATMENT, Knobs()),  # the engine's default: vLLM compiles unless told otherwise
    Config(BASELINE, Knobs(torch_compile=False, cuda_graph="off")),  # vLLM: --enforce-eager
)
METRICS = ("output_tok_s", "ttft_ms_p50", "tpot_ms_p50")

VLLM_COMPILE_MODES, VLLM_GRAPH_MODES = COMPILE_MODES, GRAPH_MODES


def run(engine: dict[str, Any] | EngineSpec, model: dict[str, Any] | ModelSpec, load: dict[str, Any] | LoadSpec,
        repetitions: int = 3, store_dir: str = "", offline: bool = False, force: bool = False,
        progress: bool = True, telemetry: dict[str, Any] | TelemetrySpec | None = None) -> Results:
    """Validate the inputs (before anything launches), then measure both configurations in alternating repetitions."""
    e = parse(EngineSpec, engine, "engine")
    m = parse(ModelSpec, model, "model")
    ld = parse(LoadSpec, load, "load")
    tel = parse(TelemetrySpec, telemetry or {}, "telemetry")
    return measure(e, m, CONFIGS, ld, repetitions=repetitions, store=Store(store_dir or None), offline=offline,
                   force=force, progress=progress, telemetry=tel)


def _mode_name(table: dict[Any, str], value: Any) -> str:
    key = tuple(value) if isinstance(value, list) else value
    return table.get(key, str(value)) if value is not None else "unknown"


def resolved_table(res: Results) -> pd.DataFrame:
    """What each configuration actually ran with, as the server reported it."""
    rows = []
    for cfg in CONFIGS:
        r = res.resolved.get(cfg.name, {})
        pts = res.points[res.points["config"] == cfg.name] if len(res.points) else pd.DataFrame()
        rows.append({
            "config": cfg.name,
            "flags": pts["flags"].iloc[0] if len(pts) else "",
            "compilation_mode": _mode_name(VLLM_COMPILE_MODES, r.get("compilation_mode")),
            "cudagraph_mode": _mode_name(VLLM_GRAPH_MODES, r.get("cudagraph_mode")),
            "enforce_eager": r.get("enforce_eager"),
            "device": r.get("device"),
        })
    return pd.DataFrame(rows)


def table(res: Results) -> pd.DataFrame:
    """Median over repetitions per configuration and concurrency, with the repetition count."""
    if res.summary.empty:
        return pd.DataFrame()
    g = res.summary.groupby(["config", "concurrency"], sort=True)
    out = g.agg(reps=("rep", "nunique"), output_tok_s=("output_tok_s", "median"),
                output_tok_s_min=("output_tok_s", "min"), output_tok_s_max=("output_tok_s", "max"),
                ttft_ms_p50=("ttft_ms_p50", "median"), tpot_ms_p50=("tpot_ms_p50", "median"),
                e2e_ms_p50=("e2e_ms_p50", "median"), failed=("failed", "sum")).reset_index()
    return out


def startup_table(res: Results) -> pd.DataFrame:
    """Seconds from launch to first generated token, per configuration (median and range over launches)."""
    if res.startup.empty or "first_token_s" not in res.startup:
        return pd.DataFrame()
    return res.startup.groupby("config").agg(
        launches=("rep", "count"), first_token_s=("first_token_s", "median"),
        first_token_s_min=("first_token_s", "min"), first_token_s_max=("first_token_s", "max")).reset_index()


def effects(res: Results) -> pd.DataFrame:
    """Compiled vs eager, per concurrency, for each headline metric."""
    if res.summary.empty:
        return pd.DataFrame()
    return pd.concat([paired_effects(res.summary, m, BASELINE, TREATMENT) for m in METRICS], ignore_index=True)


def plot(res: Results) -> Figure | None:
    """Throughput vs concurrency and latency vs throughput, both configurations."""
    return plots.throughput_latency(res.summary, "torch.compile: compiled vs eager") if not res.summary.empty else None


def plot_effects(res: Results) -> Figure | None:
    """Relative change compiled vs eager, per metric and concurrency, with its 90% confidence interval."""
    e = effects(res)
    return plots.effect_bars(e, "compiled / eager, with 90% confidence intervals (x1 = no change)") if len(e) else None


def _r(x: float, digits: int = 2) -> float | None:
    return None if x is None or np.isnan(x) else round(float(x), digits)


def _ci(r: Any) -> str:
    if np.isnan(r.ci_low_pct):
        return f"one run: {r.effect_pct:+.0f}%" if r.n_pairs == 1 else "no CI"
    return f"{r.ci_low_pct:+.0f}..{r.ci_high_pct:+.0f}%"


def findings(res: Results) -> list[Finding]:
    """The thread's conclusion: the measured effect of compile on peak throughput, its spread, and what to set."""
    e = effects(res)
    errors = res.errors.to_dict("records") if len(res.errors) else []
    if e.empty or e[e["metric"] == "output_tok_s"]["n_pairs"].max() == 0:
        first = next((x for x in errors if x.get("signal")), errors[0] if errors else None)
        cause = f" First failure: {first['config']} rep {first['rep']}: {first['summary']}" if first else ""
        return [Finding(thread=THREAD, title="torch.compile: not measured", applies=False, confidence="none",
                        claim="No paired measurement of compiled vs eager completed, so no effect can be stated."
                              + cause,
                        reason="; ".join(f"{x['config']} rep {x['rep']}: {x['signal'] or x['error_type']}"
                                         for x in errors) or "no data",
                        evidence={"errors": [{k: v for k, v in x.items() if k != "traceback"} for x in errors]})]
    tok = e[(e["metric"] == "output_tok_s") & (e["n_pairs"] > 0)]
    peak = tok.loc[tok["concurrency"].idxmax()]
    rt = resolved_table(res)
    modes = {r.config: r for r in rt.itertuples()}
    start = startup_table(res)
    st = {r.config: r.first_token_s for r in start.itertuples()} if len(start) else {}
    startup_cost_s = st.get(TREATMENT, np.nan) - st.get(BASELINE, np.nan)
    graphs_differ = modes[TREATMENT].cudagraph_mode != modes[BASELINE].cudagraph_mode
    effect = Effect(metric="output_tok_s", value_pct=_r(peak.effect_pct), ci_low_pct=_r(peak.ci_low_pct),
                    ci_high_pct=_r(peak.ci_high_pct), range_low_pct=_r(peak.low_pct), range_high_pct=_r(peak.high_pct),
                    p_value=_r(peak.p_value, 4), n=int(peak.n_pairs), at=f"c={int(peak.concurrency)}",
                    baseline=BASELINE, treatment=TREATMENT)
    conf = peak.confidence  # the effect ranked in the summary is the one at peak load, the throughput operating point
    install = ""
    if len(res.points):
        install = res.points["command"].iloc[0].split(" -m ")[0]
    direction, verdict_text = verdict(tok)
    flags: list[str] = ["--enforce-eager"] if direction == "worse" else []
    per_level = "; ".join(f"c={int(r.concurrency)}: {r.effect_pct:+.0f}% ({_ci(r)}, {r.confidence})"
                          for r in tok.itertuples())
    claim = (f"torch.compile {verdict_text}. Output tok/s, compiled vs eager, ratio of medians over {effect.n} "
             f"paired repetitions (90% CI, confidence): {per_level}. Compiled ran as "
             f"{modes[TREATMENT].compilation_mode}, eager as {modes[BASELINE].compilation_mode}.")
    if not np.isnan(startup_cost_s):
        claim += f" Compile adds {startup_cost_s:+.0f} s to startup (median launch to first token)."
    if graphs_differ:
        claim += (f" CUDA graphs also differ ({modes[TREATMENT].cudagraph_mode} vs {modes[BASELINE].cudagraph_mode}),"
                  " so this effect mixes compile with graphs; thread 2 separates them.")
    else:
        claim += f" CUDA graph mode is {modes[TREATMENT].cudagraph_mode} in both, so the effect is compile alone."
    client, starved = res.client_warnings("limited"), res.client_warnings("starved")
    if client:
        claim += f" Caution: the load client limited {len(client)} point(s) (evidence.client_warnings)."
    if starved:
        claim += (f" The host was oversubscribed at {len(starved)} of {len(res.client_health())} points, so "
                  "latencies there include scheduling delay (evidence.client_starved).")
    other = {f"{r.metric}@c={int(r.concurrency)}": {"effect_pct": r.effect_pct, "ci_low_pct": r.ci_low_pct,
                                                     "ci_high_pct": r.ci_high_pct, "p_value": r.p_value,
                                                     "range_low_pct": r.low_pct, "range_high_pct": r.high_pct,
                                                     "n": r.n_pairs, "confidence": r.confidence,
                                                     "higher_is_better": higher_is_better(r.metric)}
             for r in e.itertuples()}
    return [Finding(
        thread=THREAD, title="torch.compile vs eager", claim=claim, effect=effect, recommended_flags=flags,
        confidence=conf,
        evidence={"effects": other, "resolved": rt.to_dict("records"), "startup_first_token_s": st,
                  "startup_cost_s": None if np.isnan(startup_cost_s) else round(float(startup_cost_s), 1),
                  "errors": errors, "engine_python": install, "client_warnings": client, "client_starved": starved,
                  "noise_pct": {"baseline": peak.baseline_spread_pct, "treatment": peak.treatment_spread_pct}},
    )]
