"""Profile a running configuration: the engine's PyTorch profiler over HTTP, or the whole server under Nsight
Systems; both end in the same kernel table."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ..analysis import kernels as ak
from ..engines import get_engine
from ..errors import ProfilingUnavailable
from ..launch import Prepared, serve
from ..load import load_tokenizer, run_sweep
from ..spec import Knobs, LoadSpec
from . import nsys as nsys_mod
from . import torch_trace


@dataclass
class Profile:
    """What one profiled run produced."""

    kernels: pd.DataFrame
    runtime: pd.DataFrame
    nvtx: pd.DataFrame = field(default_factory=pd.DataFrame)
    stats: dict[str, pd.DataFrame] = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)
    load_summary: pd.DataFrame = field(default_factory=pd.DataFrame)
    source: str = ""
    notes: list[str] = field(default_factory=list)
    # the load's phases on the profile's timeline (text, start_ns, end_ns); the load generator's NVTX ranges are
    # in its own process, which nsys does not trace when it profiles the server
    phases: pd.DataFrame = field(default_factory=pd.DataFrame)


def _wait_for_traces(folder: Path, timeout_s: float = 300.0) -> list[Path]:
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


def _with_flags(knobs: Knobs, flags: list[str]) -> Knobs:
    return knobs.model_copy(update={"extra_args": tuple(knobs.extra_args) + tuple(flags)})


def torch_profile(prep: Prepared, knobs: Knobs, load: LoadSpec, out_dir: str | Path,
                  say: Callable[[str], None] = print) -> Profile:
    """Launch with the engine's PyTorch profiler enabled, warm up with the load's warmup, profile one sweep of the
    load between /start_profile and /stop_profile, and parse every trace written (streamed)."""
    out = Path(out_dir)
    traces = out / "traces"
    traces.mkdir(parents=True, exist_ok=True)
    adapter = get_engine(prep.engine.name)
    load = adapter.effective_load(load, say)
    flags, env = adapter.torch_profiler_launch(prep.install, str(traces))
    tok = load_tokenizer(prep.model_path) if prep.model_path.startswith("/") else None
    with serve(prep, _with_flags(knobs, flags), out / "server", extra_env=env) as target:
        warm = load.model_copy(update={"num_requests": max(1, load.warmup_requests or 1), "warmup_requests": 0})
        run_sweep(target.base_url, target.model, warm, tok, target.api_key, progress=False)
        say("profiling: /start_profile")
        adapter.start_profile(target.base_url, str(traces))
        try:
            result = run_sweep(target.base_url, target.model, load.model_copy(update={"warmup_requests": 0}), tok,
                               target.api_key, progress=False)
        finally:
            say("profiling: /stop_profile (the engine writes its traces now)")
            adapter.stop_profile(target.base_url)
        files = _wait_for_traces(traces)
    kernels, runtime = [], []
    for f in files:
        k, r = _torch_tables(f)
        kernels.append(k.assign(trace=f.name))
        runtime.append(r.assign(trace=f.name))
    return Profile(kernels=pd.concat(kernels, ignore_index=True), runtime=pd.concat(runtime, ignore_index=True),
                   files=files, load_summary=result.summary(), source="torch")


def nsys_profile(prep: Prepared, knobs: Knobs, load: LoadSpec, out_dir: str | Path, delay_s: float = 0.0,
                 duration_s: float | None = None, say: Callable[[str], None] = print) -> Profile:
    """Launch the server under `nsys profile`; record between /start_profile and /stop_profile where the engine
    can call cudaProfilerStart/Stop, else a delay/duration window; then stats CSVs, SQLite and the kernel table."""
    nsys = nsys_mod.locate_nsys()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    adapter = get_engine(prep.engine.name)
    load = adapter.effective_load(load, say)
    hook = adapter.cuda_profiler_launch(prep.install)
    notes = []
    if hook is not None:
        flags, env = hook
        prefix = nsys_mod.profile_prefix(nsys, out / "report", capture_range="cudaProfilerApi")
        notes.append("capture range: the engine's /start_profile .. /stop_profile (cudaProfilerApi)")
    else:
        flags, env = [], {}
        prefix = nsys_mod.profile_prefix(nsys, out / "report", delay_s=delay_s or None, duration_s=duration_s)
        notes.append(f"capture window: delay {delay_s:g} s, duration {duration_s or 'until exit'} s (no engine hook)")
    tok = load_tokenizer(prep.model_path) if prep.model_path.startswith("/") else None
    with serve(prep, _with_flags(knobs, flags), out / "server", prefix=prefix, extra_env=env,
               term_grace_s=300.0) as target:
        if hook is not None:
            adapter.start_profile(target.base_url)
        marks: list[tuple[str, int]] = []
        try:
            result = run_sweep(target.base_url, target.model, load, tok, target.api_key, progress=False,
                               on_phase=lambda name: marks.append((name, time.time_ns())))
        finally:
            if hook is not None:
                adapter.stop_profile(target.base_url)
    report = nsys_mod.find_report(out / "report")
    say(f"profiling: nsys report {report}")
    stats = nsys_mod.stats(nsys, report, out / "stats")
    sqlite = nsys_mod.export_sqlite(nsys, report)
    origin = nsys_mod.session_start_unix_ns(sqlite)
    if origin is None:
        notes.append("the report has no session start time: load phases are not placed on the timeline")
    phases = ak.phase_windows(marks, origin) if origin is not None else pd.DataFrame()
    return Profile(**_nsys_tables(sqlite), stats=stats, files=[report, sqlite], load_summary=result.summary(),
                   source="nsys", notes=notes, phases=phases)


def _nsys_tables(sqlite: Path) -> dict[str, pd.DataFrame]:
    return {"kernels": nsys_mod.read_kernels(sqlite), "runtime": nsys_mod.read_runtime(sqlite),
            "nvtx": nsys_mod.read_nvtx(sqlite)}


def _torch_tables(path: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    ev = torch_trace.read_events(path)  # streamed once, both tables from it
    return torch_trace.kernels_from_events(ev), torch_trace.runtime_from_events(ev)


def open_trace(path: str | Path) -> Profile:
    """A stored trace as a Profile, no GPU needed: an nsys SQLite export, an .nsys-rep (exported with nsys, which
    must then be installed), or a PyTorch profiler Chrome trace (.json / .json.gz)."""
    path = Path(path)
    if not path.is_file():
        raise ProfilingUnavailable(f"no trace file at {path}")
    name = path.name
    if name.endswith((".json", ".json.gz")):
        kernels, runtime = _torch_tables(path)
        return Profile(kernels=kernels, runtime=runtime, files=[path], source="torch")
    if name.endswith(".nsys-rep"):
        path = nsys_mod.export_sqlite(nsys_mod.locate_nsys(), path)
    elif not name.endswith(".sqlite"):
        raise ProfilingUnavailable(f"{name}: not a trace servescope reads (.sqlite, .nsys-rep, .json, .json.gz)")
    prefix = path.with_suffix("")
    stats = {r: v for r, v in nsys_mod.read_stats(Path(f"{prefix}_stats")).items() if not v.empty}
    return Profile(**_nsys_tables(path), stats=stats, files=[path], source="nsys")


def summary(p: Profile) -> dict[str, Any]:
    """The headline figures of a profile, for findings."""
    k = ak.with_categories(p.kernels)
    per_phase = ak.busy_by_range(k, p.phases) if len(p.phases) else pd.DataFrame()
    return {"busy": ak.busy(k).to_dict("records"), "busy_by_phase": per_phase.to_dict("records"),
            "categories": ak.categories(k).to_dict("records"),
            "moe_path": ak.moe_path(k).to_dict("records"), "launch": ak.launch_overhead(p.runtime, k)}
