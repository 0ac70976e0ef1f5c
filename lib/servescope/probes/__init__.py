"""Small measurements run in an engine's own environment (which has torch): scripts beside this module."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pandas as pd

from ..errors import ServescopeError

# 4 KB to 256 MB, doubling: decode all-reduces of small batches sit at the bottom, prefill of long prompts at the top
ALLREDUCE_SIZES = tuple(4096 * 2**i for i in range(17))


def allreduce(python: str, world: int, backend: str = "nccl", sizes: tuple[int, ...] = ALLREDUCE_SIZES,
              dtype: str = "bfloat16", reps: int = 20, timeout_s: float = 600,
              env: dict[str, str] | None = None) -> tuple[pd.DataFrame, dict[str, Any]]:
    """all_reduce time per message size over `world` ranks (see probes/allreduce.py): a table (bytes, ms_p50, ms_min,
    algbw_gbps, busbw_gbps) and what ran (backend, world, torch, devices)."""
    if world < 2:
        raise ServescopeError("an all-reduce needs two or more ranks")
    spec = {"world": world, "backend": backend, "sizes": list(sizes), "dtype": dtype, "reps": reps,
            "timeout_s": timeout_s}
    out = _run_script("allreduce.py", python, spec, timeout_s, env)
    return pd.DataFrame(out.pop("rows")), out


def tp_comm(probe: pd.DataFrame, hidden: int, layers: int, tokens: list[int], tp: int, dtype_bytes: int = 2,
            all_reduces_per_layer: int = 2) -> pd.DataFrame:
    """Tensor parallelism's communication per forward step, from the probe: each layer all-reduces its attention
    and its MLP/MoE output (tokens x hidden values) across the TP ranks; times are interpolated (log-log) between
    the probe's sizes, and sizes outside them are not extrapolated (NaN)."""
    import numpy as np

    p = probe.sort_values("bytes")
    xs, ys = np.log(p["bytes"].to_numpy(float)), np.log(p["ms_p50"].to_numpy(float))
    rows = []
    for t in tokens:
        nbytes = t * hidden * dtype_bytes
        inside = p["bytes"].min() <= nbytes <= p["bytes"].max()
        ms = float(np.exp(np.interp(np.log(nbytes), xs, ys))) if inside else float("nan")
        rows.append({"tokens": t, "message_bytes": nbytes, "all_reduce_ms": ms,
                     "per_layer_ms": ms * all_reduces_per_layer, "per_step_ms": ms * all_reduces_per_layer * layers,
                     "tp": tp})
    return pd.DataFrame(rows)


def _run_script(name: str, python: str, spec: dict[str, Any], timeout_s: float,
                env: dict[str, str] | None = None) -> dict[str, Any]:
    script = Path(__file__).with_name(name)
    try:
        res = subprocess.run([python, str(script), json.dumps(spec)], capture_output=True, text=True,
                             timeout=timeout_s, env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired as ex:  # what it said so far tells how far it got
        said = ex.stderr.decode(errors="replace") if isinstance(ex.stderr, bytes) else (ex.stderr or "")
        tail = " | ".join(said.strip().splitlines()[-3:])
        raise ServescopeError(f"{name} did not finish in {timeout_s:.0f} s under {python}"
                              + (f"; last said: {tail}" if tail else "")) from None
    if res.returncode != 0:
        tail = (res.stderr or res.stdout).strip().splitlines()[-3:]
        raise ServescopeError(f"{name} failed under {python}: {' | '.join(tail)}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def moe_ceiling(python: str, experts: int, top_k: int, hidden: int, inter: int, tokens: list[int],
                device: str = "cpu", dtype: str = "float32", reps: int = 20, seed: int = 0,
                timeout_s: float = 600, env: dict[str, str] | None = None) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Per-expert loop against one grouped product on the model's expert shapes, per token count (see
    probes/moe_ceiling.py): a table (tokens, experts_active, loop_ms, grouped_ms, speedup, launches) and what ran."""
    spec = {"experts": experts, "top_k": top_k, "hidden": hidden, "inter": inter, "tokens": list(tokens),
            "device": device, "dtype": dtype, "reps": reps, "seed": seed}
    out = _run_script("moe_ceiling.py", python, spec, timeout_s, env)
    return pd.DataFrame(out.pop("rows")), out


def graph_ceiling(python: str, shape: dict[str, int], batches: list[int], device: str = "cpu",
                  dtype: str = "float32", forms: tuple[str, ...] = ("eager", "full", "piecewise", "compile"),
                  steps: int = 20, reps: int = 7, seed: int = 0,
                  timeout_s: float = 600, env: dict[str, str] | None = None) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Milliseconds per decode step of a layer stack of the model's shapes in each form (eager, one full CUDA
    graph, piecewise with the MoE eager, torch.compile; eager and compile only on a CPU), per batch size (see
    probes/graph_ceiling.py): a table (form, batch, ms_per_step, tokens_per_s, runs_ms: every run's ms per step)
    and what ran."""
    spec = {**shape, "batches": list(batches), "device": device, "dtype": dtype, "forms": list(forms),
            "steps": steps, "reps": reps, "seed": seed}
    out = _run_script("graph_ceiling.py", python, spec, timeout_s, env)
    return pd.DataFrame(out.pop("rows"), columns=["form", "batch", "ms_per_step", "tokens_per_s", "runs_ms"]), out
