"""Profiles as one kernel table: a stored trace opened without a GPU (nsys SQLite / .nsys-rep, PyTorch Chrome trace),
and the headline figures of a profile. Profiles of measured points are taken through the store
(servescope.profile.window, ProfileSpec)."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ..analysis import kernels as ak
from ..errors import ProfilingUnavailable
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
    # the capture's own window on the kernel timeline (start_ns, end_ns); None: first kernel to last
    window_ns: tuple[int, int] | None = None


def _nsys_tables(sqlite: Path) -> dict[str, pd.DataFrame]:
    return {"kernels": nsys_mod.read_kernels(sqlite), "runtime": nsys_mod.read_runtime(sqlite),
            "nvtx": nsys_mod.read_nvtx(sqlite)}


def _torch_tables(path: Path) -> tuple[pd.DataFrame, pd.DataFrame, tuple[int, int] | None]:
    ev = torch_trace.read_events(path)  # streamed once, every table from it
    window = None
    if len(ev):  # the traced span: every event read (CPU ops included), on the kernel table's time base
        window = (0, int(round(float((ev["ts_us"] + ev["dur_us"]).max() - ev["ts_us"].min()) * 1e3)))
    return torch_trace.kernels_from_events(ev), torch_trace.runtime_from_events(ev), window


def open_trace(path: str | Path) -> Profile:
    """A stored trace as a Profile, no GPU needed: an nsys export (SQLite file, or the folder of `--type
    parquetdir`), an .nsys-rep (exported with nsys, which must then be installed), or a PyTorch profiler Chrome trace
    (.json / .json.gz)."""
    path = Path(path)
    if path.is_dir():
        nsys_mod.check_export(path)
        return Profile(**_nsys_tables(path), files=[path], source="nsys", window_ns=nsys_mod.read_window(path))
    if not path.is_file():
        raise ProfilingUnavailable(f"no trace file at {path}")
    if path.stat().st_size == 0:
        raise ProfilingUnavailable(f"{path} is empty")
    name = path.name
    if name.endswith((".json", ".json.gz")):
        kernels, runtime, window = _torch_tables(path)
        if kernels.empty:
            raise ProfilingUnavailable(f"{path} holds no GPU kernel and no CPU op: nothing to analyse")
        return Profile(kernels=kernels, runtime=runtime, files=[path], source="torch", window_ns=window)
    if name.endswith(".nsys-rep"):
        path = nsys_mod.export(nsys_mod.locate_nsys(), path)
        if path.is_dir():
            return open_trace(path)
    elif not name.endswith(".sqlite"):
        raise ProfilingUnavailable(f"{name}: not a trace servescope reads (.sqlite, a parquetdir folder, .nsys-rep, "
                                   ".json, .json.gz)")
    prefix = path.with_suffix("")
    try:
        nsys_mod.check_export(path)
        tables = _nsys_tables(path)
        window = nsys_mod.read_window(path)
    except sqlite3.DatabaseError as e:
        raise ProfilingUnavailable(f"{path} is not a readable SQLite database (truncated or corrupt: {e})") from None
    stats = {r: v for r, v in nsys_mod.read_stats(Path(f"{prefix}_stats")).items() if not v.empty}
    return Profile(**tables, stats=stats, files=[path], source="nsys", window_ns=window)


def summary(p: Profile) -> dict[str, Any]:
    """The headline figures of a profile, for findings."""
    k = ak.with_categories(p.kernels)
    per_phase = ak.busy_by_range(k, p.phases) if len(p.phases) else pd.DataFrame()
    return {"busy": ak.busy(k).to_dict("records"), "busy_by_phase": per_phase.to_dict("records"),
            "categories": ak.categories(k).to_dict("records"),
            "moe_path": ak.moe_path(k).to_dict("records"), "launch": ak.launch_overhead(p.runtime, k)}
