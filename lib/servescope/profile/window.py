"""A profile taken with a measured point: arm the launch, profile one short window after the point's load on the same
server, and read the kernel table back once the server is gone (nsys writes its report at exit)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ..analysis import kernels as ak
from ..engines.base import EngineAdapter, EngineInstall
from ..errors import ProfilingUnavailable
from ..load import run_sweep
from ..spec import LoadSpec, ProfileSpec
from . import nsys as nsys_mod
from . import torch_trace

NSYS_TERM_GRACE_S = 300.0  # nsys writes its report after the server exits


@dataclass
class Armed:
    """How a launch is armed for its profile, and where the profiler writes."""

    spec: ProfileSpec
    flags: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    prefix: list[str] | None = None
    term_grace_s: float = 15.0
    folder: Path = Path(".")
    hook: bool = True  # nsys: the engine's /start_profile brackets the capture (else the whole run is recorded)
    notes: list[str] = field(default_factory=list)


def arm(spec: ProfileSpec, adapter: EngineAdapter, install: EngineInstall, folder: Path) -> Armed:
    """Flags, environment and command prefix for a launch whose point carries a profile (ProfilingUnavailable before
    anything launches when the engine or host cannot)."""
    folder.mkdir(parents=True, exist_ok=True)
    if spec.kind == "torch":
        flags, env = adapter.torch_profiler_launch(install, str(folder))
        return Armed(spec, flags, env, folder=folder, notes=["PyTorch profiler, /start_profile .. /stop_profile"])
    nsys = nsys_mod.locate_nsys()
    hook = adapter.cuda_profiler_launch(install)
    if hook is not None:
        flags, env = hook
        prefix = nsys_mod.profile_prefix(nsys, folder / "report", capture_range="cudaProfilerApi")
        return Armed(spec, flags, env, prefix, NSYS_TERM_GRACE_S, folder,
                     notes=["nsys, capture range the engine's /start_profile .. /stop_profile (cudaProfilerApi)"])
    prefix = nsys_mod.profile_prefix(nsys, folder / "report")
    return Armed(spec, [], {}, prefix, NSYS_TERM_GRACE_S, folder, hook=False,
                 notes=["nsys over the whole run (no engine hook); kernels kept for the window on the timeline"])


# a steady load's profiled window: each request's output is cut to this many tokens (the kernels of a decode step
# repeat; a window of the whole output at a top level of hundreds held tens of millions of kernels)
WINDOW_OUTPUT_TOKENS = 32


def window_load(spec: ProfileSpec, load: LoadSpec) -> LoadSpec:
    """The profiled window: one closed-loop level (default the load's highest), one request per slot by default, with
    prompts of its own (the measured level's would hit the prefix cache and leave prefill out of the kernel mix);
    for a steady load, outputs cut to WINDOW_OUTPUT_TOKENS so the window stays bounded."""
    level = spec.concurrency or (max(load.levels) if load.mode == "closed" else (load.max_concurrency or 4))
    n = spec.num_requests or max(2, level)
    update = {"mode": "closed", "concurrency": (level,), "num_requests": n, "warmup_requests": 0, "duration_s": None,
              "requests_per_slot": None, "seed": load.seed + 1_000_003}
    if load.steady_state:
        update |= {"output_len": min(load.output_len, WINDOW_OUTPUT_TOKENS), "steady_state": False}
    return load.model_copy(update=update)


def take(armed: Armed, adapter: EngineAdapter, target: Any, load: LoadSpec, tokenizer: Any,
         tell: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Profile one window on the running server; returns what it was (level, requests, wall-clock bounds)."""
    wl = window_load(armed.spec, load)
    use_hook = armed.spec.kind == "torch" or armed.hook
    if use_hook:
        adapter.start_profile(target.base_url, str(armed.folder) if armed.spec.kind == "torch" else None)
    t0 = time.time_ns()
    try:
        res = run_sweep(target.base_url, target.model, wl, tokenizer, target.api_key, progress=False,
                        on_phase=lambda p: tell(f"profile:{p}" if p != "idle" else "idle"))
    finally:
        t1 = time.time_ns()
        if use_hook:
            adapter.stop_profile(target.base_url)
    s = res.summary()
    return {"kind": armed.spec.kind, "concurrency": int(wl.concurrency[0]), "requests": wl.num_requests,
            "output_tokens_asked": wl.output_len, "prompts": "its own (seed apart from the measured levels')",
            "completed": int(s["completed"].sum()) if len(s) else 0, "start_unix_ns": t0, "end_unix_ns": t1,
            "window_s": (t1 - t0) / 1e9, "notes": list(armed.notes)}


def read(armed: Armed, window: dict[str, Any], timeout_s: float = 300.0) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """The kernel and runtime tables of the window, once the profiler has written them; the raw traces are removed
    (they are large; the tables are what analysis reads). Returns (kernels, runtime, info)."""
    info = dict(window)
    if armed.spec.kind == "torch":
        files = _wait_for_traces(armed.folder, timeout_s)
        kernels, runtime = [], []
        for f in files:
            ev = torch_trace.read_events(f)  # streamed once, both tables from it
            kernels.append(torch_trace.kernels_from_events(ev).assign(trace=f.name))
            runtime.append(torch_trace.runtime_from_events(ev).assign(trace=f.name))
        info["traces"] = {f.name: f.stat().st_size for f in files}
        k, r = pd.concat(kernels, ignore_index=True), pd.concat(runtime, ignore_index=True)
    else:
        nsys = nsys_mod.locate_nsys()
        report = nsys_mod.find_report(armed.folder / "report")
        exported = nsys_mod.export(nsys, report)
        k, r = nsys_mod.read_kernels(exported), nsys_mod.read_runtime(exported)
        info["traces"] = {report.name: report.stat().st_size, exported.name: nsys_mod.export_size(exported)}
        if not armed.hook:  # the whole run was recorded: keep the window's kernels
            origin = nsys_mod.session_start_unix_ns(exported)
            if origin is None:
                raise ProfilingUnavailable(f"{exported.name} has no session start time: the window cannot be placed")
            lo, hi = window["start_unix_ns"] - origin, window["end_unix_ns"] - origin
            k, r = ak.clip(k, lo, hi), r[(r["start_ns"] < hi) & (r["end_ns"] > lo)] if len(r) else r
    shutil.rmtree(armed.folder, ignore_errors=True)
    info["kernels"] = int(len(k))
    return k, r, info


def _wait_for_traces(folder: Path, timeout_s: float) -> list[Path]:
    """Trace files once their sizes stop changing (engines write them after /stop_profile returns, at times)."""
    deadline = time.monotonic() + timeout_s
    last: dict[Path, int] = {}
    while time.monotonic() < deadline:
        found = sorted(p for p in folder.rglob("*") if p.name.endswith((".json", ".json.gz")))
        sizes = {p: p.stat().st_size for p in found}
        if found and sizes == last:
            return found
        last = sizes
        time.sleep(2.0)
    raise ProfilingUnavailable(f"no complete PyTorch profiler trace appeared in {folder} within {timeout_s:.0f} s")
