"""Thread 0: what are we measuring on? Host, GPUs (NVML), the engine's version, build and source, the flags it
defines and how each intent-level knob is spelled on it (or why it cannot be)."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from typing import Any

import pandas as pd
import psutil

from .. import hostcpu
from ..context import RunContext
from ..engines.base import EngineInstall
from ..engines.flagscan import FlagSet
from ..engines.helpcheck import flag_disagreements, run_help
from ..errors import ServescopeError
from ..findings import Finding, sentences
from ..launch import find_install

THREAD = "00_environment"
QUESTION = "What hardware, driver, engine version and capabilities are we measuring on?"
ROLE = "environment"  # what the report reads this thread for (threads.by_role)


def host() -> pd.DataFrame:
    """The machine the suite runs on (one row per fact)."""
    freq = psutil.cpu_freq()
    facts = {"hostname": platform.node(), "os": f"{platform.system()} {platform.release()}",
             "cpu": hostcpu.cpu_model(), "cpu_isa": hostcpu.isa_text(), "amx": hostcpu.amx_note(),
             "cpu_cores_logical": psutil.cpu_count(), "cpu_cores_physical": psutil.cpu_count(False),
             "cpu_max_mhz": round(freq.max) if freq and freq.max else None,
             "memory_gib": round(psutil.virtual_memory().total / 2**30, 1), "python": platform.python_version(),
             "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", "(not set)")}
    return pd.DataFrame({"fact": list(facts), "value": [str(v) for v in facts.values()]})


def gpus() -> tuple[pd.DataFrame, str]:
    """Every visible NVIDIA GPU (name, driver, limits, maxima, memory) through NVML; or no rows and the reason."""
    from ..telemetry.nvml import Nvml, NvmlUnavailable

    try:
        n = Nvml()
    except NvmlUnavailable as e:
        return pd.DataFrame(), f"no NVIDIA GPU / NVML: {e}"
    try:
        return pd.DataFrame(n.static()), ""
    finally:
        n.close()


def _install(ctx: RunContext) -> EngineInstall | None:
    return find_install(ctx.engine, ctx.adapter)  # describing the environment never installs one


def engine_info(ctx: RunContext) -> pd.DataFrame:
    """Engine name, version, build, interpreter, where its source lies and how many flags it defines."""
    e, ad = ctx.engine, ctx.adapter
    try:
        inst = _install(ctx)
    except ServescopeError as ex:
        return pd.DataFrame({"fact": ["engine", "not available"], "value": [e.name, str(ex)]})
    if inst is None:
        return pd.DataFrame({"fact": ["engine", "url"], "value": [e.name, e.url or ""]})
    tree = ad.source_tree(inst)
    fs = ad.flag_set(inst)
    facts = {"engine": e.name, "version": inst.version, "distribution": inst.distribution, "platform": inst.platform,
             "python": inst.python, "source": tree.location, "cli_flags_in_source": len(fs)}
    return pd.DataFrame({"fact": list(facts), "value": [str(v) for v in facts.values()]})


def model_facts(ctx: RunContext) -> pd.DataFrame:
    """The model the suite serves: where it is, what its config declares (dtype, experts), and the dtype the engine
    served it in as read back from this engine's stored points (not measured until a thread has launched it)."""
    from ..models import config_dtype, model_config, tiny_model_dir

    m = ctx.model
    path = str(tiny_model_dir(m.tiny)) if m.tiny is not None else (m.path or "")
    cfg = model_config(path)
    declared = config_dtype(path) or (m.tiny.dtype if m.tiny is not None else None)
    facts: dict[str, Any] = {"model": path + ("" if cfg or not path else " (not readable here)"),
                             "architecture": ", ".join(cfg.get("architectures") or []) or "not readable here",
                             "declared_dtype": declared or "not declared"}
    try:
        ident: str | None = ctx.engine_identity
    except ServescopeError:
        ident = None
    served = [d for pt in ctx.store.points(ident, ctx.model_key) if pt.resolved is not None and (d := pt.resolved.dtype)]
    if served:
        kinds = sorted(set(served))
        changed = f" (the engine changed it from {declared})" if declared and kinds != [declared] else ""
        facts["served_dtype"] = f"{', '.join(kinds)}{changed}: read back from {len(served)} stored launch(es)"
    else:
        facts["served_dtype"] = "not measured yet: every launch reads it back from the server (thread 01 shows it)"
    return pd.DataFrame({"fact": list(facts), "value": [str(v) for v in facts.values()]})


def flags_check(ctx: RunContext, timeout_s: float = 180.0) -> pd.DataFrame:
    """The static flag scan against the engine's own `--help` (where it runs here): flags each one lists that the
    other does not (`--no-x` negations of booleans aside)."""
    ad = ctx.adapter
    try:
        inst = _install(ctx)
    except ServescopeError as ex:
        out = pd.DataFrame(columns=["flag", "in"])
        out.attrs["summary"] = f"not checked: {ex}"
        return out
    if inst is None:
        return pd.DataFrame()
    static = ad.flag_set(inst)
    if static.disagreements is not None:  # --help was already the truth for this version: its disagreements
        out = static.disagreements.copy()
        out.attrs["summary"] = f"{len(static)} flags from {static.origin}"
        return out
    helped = engine_help(ctx, inst, timeout_s)
    a, b = set(static.table["flag"]), set(helped.table["flag"])
    out = flag_disagreements(static, helped)
    out.attrs["summary"] = f"{len(a)} flags in the source, {len(b)} in --help, {len(a & b)} in both"
    return out


def engine_help(ctx: RunContext, inst: EngineInstall, timeout_s: float = 180.0) -> FlagSet:
    """Flags from running the engine's `--help`."""
    return run_help(inst.python, ctx.engine.name, inst.version, ctx.adapter.help_command, timeout_s, env=inst.env)


def capabilities(ctx: RunContext) -> pd.DataFrame:
    """For each intent-level knob setting: the flags this engine version uses, or why it cannot express it."""
    try:
        inst = _install(ctx)
    except ServescopeError as ex:
        return pd.DataFrame({"knobs": ["(any)"], "supported": [False], "flags": [""], "reason": [str(ex)]})
    if inst is None:
        return pd.DataFrame({"knobs": ["(any)"], "supported": [False], "flags": [""],
                             "reason": ["an external server runs as it was started"]})
    return ctx.adapter.knob_capabilities(inst)


@dataclass
class Environment:
    """Thread 0's result: the host, its GPUs (or why none is read), the engine, the model's facts, the static flag
    scan against the engine's own --help (None: not asked) and the knobs this version can express."""

    host: pd.DataFrame
    gpu: pd.DataFrame
    gpu_reason: str
    info: pd.DataFrame
    model: pd.DataFrame
    check: pd.DataFrame | None
    caps: pd.DataFrame


def run(ctx: RunContext, check_help: bool = True) -> Environment:
    """Read the machine, the engine and the model this report describes (launching nothing but the engine's
    --help, where check_help)."""
    gpu, gpu_reason = gpus()
    return Environment(host(), gpu, gpu_reason, engine_info(ctx), model_facts(ctx),
                       flags_check(ctx) if check_help else None, capabilities(ctx))


def findings(env: Environment) -> list[Finding]:
    """The environment as one finding (no effect: it qualifies every other finding)."""
    info, gpu, gpu_reason, caps = env.info, env.gpu, env.gpu_reason, env.caps
    facts = dict(zip(info["fact"], info["value"], strict=True))
    if "not available" in facts:
        return [Finding(thread=THREAD, kind="environment", title="Engine not available here", applies=False,
                        **sentences(f"{facts['engine']}: {facts['not available']}"), reason=facts["not available"])]
    where = f"{len(gpu)} x {gpu['name'].iloc[0]}" if len(gpu) else \
        f"a host with no NVIDIA GPU ({gpu_reason.removeprefix('no NVIDIA GPU / NVML: ')})"
    n_ok = int(caps["supported"].sum()) if len(caps) else 0
    return [Finding(thread=THREAD, kind="environment", title="Measured on", applies=True, confidence="high",
                    headline=f"{facts.get('engine')} {facts.get('version', '')} ({facts.get('platform', '')}) on "
                             f"{where}; {n_ok} of {len(caps)} knob settings expressible on this version",
                    evidence={"engine": facts, "gpus": gpu.to_dict("records")})]
