"""Nsight Systems: find it, wrap a command in `nsys profile`, and read what it wrote (stats CSVs, SQLite export)
into DataFrames. Reading is vectorized SQL + pandas: no Python loop per kernel."""

from __future__ import annotations

import glob
import io
import os
import shutil
import sqlite3
import subprocess
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv

from ..errors import ProfilingUnavailable
from .kernels import KERNEL_COLUMNS

STATS_REPORTS = ("cuda_gpu_kern_sum", "cuda_api_sum", "nvtx_sum", "cuda_gpu_mem_time_sum")
# Where Nsight Systems lives when it is not on PATH (the H200 image has it inside Nsight Compute's folder).
NSYS_GLOBS = ("/opt/nvidia/nsight-systems/*/bin/nsys", "/opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys",
              "/usr/local/cuda/bin/nsys")


def locate_nsys() -> str:
    """Path of an nsys binary, or ProfilingUnavailable with where it looked."""
    if env := os.environ.get("SERVESCOPE_NSYS"):
        if Path(env).is_file():
            return env
        raise ProfilingUnavailable(f"SERVESCOPE_NSYS={env} does not exist")
    if found := shutil.which("nsys"):
        return found
    for pattern in NSYS_GLOBS:
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[-1]
    raise ProfilingUnavailable("Nsight Systems (nsys) not found on PATH or in " + ", ".join(NSYS_GLOBS))


def profile_prefix(nsys: str, output: Path, *, capture_range: str | None = None, nvtx_capture: str | None = None,
                   delay_s: float | None = None, duration_s: float | None = None, trace: str = "cuda,nvtx") -> list[str]:
    """`nsys profile ...` to put before a command. capture_range='cudaProfilerApi' records only between the
    engine's cudaProfilerStart/Stop (vLLM --profiler-config profiler=cuda, SGLang activities CUDA_PROFILER);
    nvtx_capture='servescope c=8@servescope' records only while the load generator's range for that point is open
    (when the profiled process is the one running the load); else delay_s/duration_s bound the window."""
    cmd = [nsys, "profile", "-o", str(output), "--force-overwrite=true", f"--trace={trace}", "--sample=none",
           "--cpuctxsw=none", "--trace-fork-before-exec=true", "--cuda-graph-trace=node"]
    if nvtx_capture:
        cmd += ["--capture-range=nvtx", f"--nvtx-capture={nvtx_capture}", "--capture-range-end=stop",
                "--env-var=NSYS_NVTX_PROFILER_REGISTER_ONLY=0"]
    elif capture_range:
        cmd += [f"--capture-range={capture_range}", "--capture-range-end=stop"]
    if delay_s is not None:
        cmd += ["--delay", f"{delay_s:g}"]
    if duration_s is not None:
        cmd += ["--duration", f"{duration_s:g}"]
    return cmd


def find_report(output: Path) -> Path:
    """The .nsys-rep nsys wrote for -o output (it appends the suffix, and a number when asked to)."""
    output = Path(output)
    cands = sorted(output.parent.glob(output.name + "*.nsys-rep"), key=lambda p: p.stat().st_mtime)
    if not cands:
        left = sorted(output.parent.glob(output.name + "*.qdstrm"))
        hint = (f"; only {left[-1].name} was written: nsys could not finish the report (on the H200 image it needs "
                "libdw.so.1, see ../shared/tools/gpu-nsys-libs.sh)") if left else ""
        raise ProfilingUnavailable(f"no Nsight Systems report at {output}*.nsys-rep{hint}")
    return cands[-1]


def stats(nsys: str, report: Path, out_prefix: Path, reports: tuple[str, ...] = STATS_REPORTS) -> dict[str, pd.DataFrame]:
    """`nsys stats --format csv` for each report, read back as DataFrames (empty where nsys had nothing)."""
    subprocess.run([nsys, "stats", "--report", ",".join(reports), "--format", "csv", "--output", str(out_prefix),
                    "--force-export=true", str(report)], check=True, capture_output=True, text=True)
    return read_stats(out_prefix, reports)


def read_stats(out_prefix: Path, reports: tuple[str, ...] = STATS_REPORTS) -> dict[str, pd.DataFrame]:
    """The CSVs `nsys stats --output PREFIX` wrote (PREFIX_<report>.csv)."""
    out = {}
    for r in reports:
        p = Path(f"{out_prefix}_{r}.csv")
        out[r] = pd.read_csv(p) if p.is_file() and p.stat().st_size > 0 else pd.DataFrame()
    return out


def export_sqlite(nsys: str, report: Path) -> Path:
    """`nsys export --type sqlite` next to the report."""
    out = report.with_suffix(".sqlite")
    subprocess.run([nsys, "export", "--type", "sqlite", "--output", str(out), "--force-overwrite=true", str(report)],
                   check=True, capture_output=True, text=True)
    return out


def _strings(con: sqlite3.Connection) -> tuple[np.ndarray, np.ndarray]:
    ids, values = zip(*con.execute("SELECT id, value FROM StringIds").fetchall(), strict=True) \
        if con.execute("SELECT count(*) FROM StringIds").fetchone()[0] else ((), ())
    ids_a = np.asarray(ids, dtype=np.int64)
    lookup = np.full(int(ids_a.max()) + 1 if len(ids_a) else 1, -1, dtype=np.int64)
    lookup[ids_a] = np.arange(len(ids_a))
    return lookup, np.asarray(values, dtype=object)


def _names(codes: np.ndarray, lookup: np.ndarray, values: np.ndarray) -> pd.Categorical:
    """String ids to a Categorical without touching each row in Python (ids missing from StringIds become NaN)."""
    inside = (codes >= 0) & (codes < len(lookup))
    pos = np.where(inside, lookup[np.clip(codes, 0, len(lookup) - 1)], -1)
    cats = pd.Index(values)
    if cats.is_unique:
        return pd.Categorical.from_codes(pos, categories=cats)
    return pd.Categorical(np.where(pos >= 0, values[np.clip(pos, 0, None)], None))


def _columns(con: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in con.execute(f"PRAGMA table_info({table})")}


def _has(con: sqlite3.Connection, table: str) -> bool:
    return con.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (table,)).fetchone() is not None


def _columns_parallel(sqlite: Path, table: str, exprs: tuple[str, ...]) -> list[np.ndarray]:
    """Several integer columns, each scanned on its own read-only connection: sqlite3 releases the GIL while a
    query runs, so the scans overlap on a multi-core host (1.6x on 2 cores for a million kernels)."""
    def one(expr: str) -> np.ndarray:
        con = sqlite3.connect(f"file:{sqlite}?mode=ro", uri=True, check_same_thread=False)
        try:
            return _column(con, table, expr)
        finally:
            con.close()
    workers = max(1, min(len(exprs), os.cpu_count() or 1))
    if workers == 1:
        return [one(e) for e in exprs]
    with ThreadPoolExecutor(workers, thread_name_prefix="servescope-sqlite") as ex:
        return list(ex.map(one, exprs))


def _column(con: sqlite3.Connection, table: str, expr: str) -> np.ndarray:
    """One integer expression over a table, in scan order, as int64. SQLite joins the values into one string in C
    and numpy parses it: several times faster than a Python tuple per row. NULL must be mapped by expr."""
    text = con.execute(f"SELECT group_concat({expr}, ',') FROM {table}").fetchone()[0]
    if not text:
        return np.array([], dtype=np.int64)
    try:
        with warnings.catch_warnings():  # numpy's text mode of fromstring is deprecated but 3x faster than the rest
            warnings.simplefilter("ignore", DeprecationWarning)
            return np.fromstring(text, dtype=np.int64, sep=",")
    except (AttributeError, ValueError, TypeError):
        return pacsv.read_csv(io.BytesIO(text.replace(",", "\n").encode()),
                              read_options=pacsv.ReadOptions(column_names=["v"])).column(0).to_numpy()


def read_kernels(sqlite: Path) -> pd.DataFrame:
    """Every GPU kernel of an `nsys export --type sqlite` file as a kernel table (times in ns since session start).

    graph_node is set for kernels that ran as nodes of a CUDA graph (needs --cuda-graph-trace=node)."""
    con = sqlite3.connect(f"file:{sqlite}?mode=ro", uri=True)
    try:
        if not _has(con, "CUPTI_ACTIVITY_KIND_KERNEL"):
            return pd.DataFrame(columns=KERNEL_COLUMNS)
        cols = _columns(con, "CUPTI_ACTIVITY_KIND_KERNEL")
        t = "CUPTI_ACTIVITY_KIND_KERNEL"
        name = "demangledName" if "demangledName" in cols else "shortName"
        graph = "(graphNodeId IS NOT NULL)" if "graphNodeId" in cols else "0"
        # small fields packed into one integer per row (device 8 bits, stream 23, graph flag 1, name id 32)
        packed = f"((deviceId & 255) << 56) | ((streamId & 8388607) << 33) | ({graph} << 32) | ({name} & 4294967295)"
        lookup, values = _strings(con)
    finally:
        con.close()
    start, end, pack, corr = _columns_parallel(sqlite, t, ("start", "end", packed, "correlationId"))
    if start.size > 1 and not np.all(start[1:] >= start[:-1]):  # nsys writes in time order; sort only if not
        order = np.argsort(start, kind="stable")
        start, end, pack, corr = start[order], end[order], pack[order], corr[order]
    pack = pack.view(np.uint64)
    n = len(start)
    name = _names((pack & np.uint64(0xFFFFFFFF)).astype(np.int64), lookup, values)
    # through Arrow with one block per column: pandas' own constructor copies every int64 column into one block,
    # a second of ten million rows
    table = pa.table({
        "name": pa.DictionaryArray.from_arrays(pa.array(name.codes, mask=name.codes < 0),
                                               pa.array(np.asarray(name.categories, dtype=object), pa.string())),
        "start_ns": start, "end_ns": end, "device": (pack >> np.uint64(56)).astype(np.int64),
        "stream": ((pack >> np.uint64(33)) & np.uint64(0x7FFFFF)).astype(np.int64), "correlation": corr,
        "graph_node": np.where((pack >> np.uint64(32)) & np.uint64(1), 1.0, np.nan),  # 1 = ran as a graph node
        "dur_ns": end - start, "op": pa.nulls(n, pa.string()),
        "source": pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, dtype=np.int8)), pa.array(["nsys"])),
    })
    df = table.to_pandas(split_blocks=True, self_destruct=True)
    df["graph_node"] = df["graph_node"].astype(float)  # Arrow reads NaN back as null; keep it a float column
    return df


def read_runtime(sqlite: Path) -> pd.DataFrame:
    """CUDA runtime API calls (launches, graph launches, syncs): name, start_ns, end_ns, dur_ns, correlation, tid."""
    con = sqlite3.connect(f"file:{sqlite}?mode=ro", uri=True)
    try:
        if not _has(con, "CUPTI_ACTIVITY_KIND_RUNTIME"):
            return pd.DataFrame(columns=["name", "start_ns", "end_ns", "dur_ns", "correlation", "tid"])
        t = "CUPTI_ACTIVITY_KIND_RUNTIME"
        data = {c: _column(con, t, f"COALESCE({expr}, -1)") for c, expr in (
            ("start", "start"), ("end", "end"), ("name_id", "nameId"), ("correlation", "correlationId"),
            ("tid", "globalTid"))}
        lookup, values = _strings(con)
    finally:
        con.close()
    order = np.argsort(data["start"], kind="stable")
    df = pd.DataFrame({"name": _names(data["name_id"][order], lookup, values),
                       "start_ns": data["start"][order], "end_ns": data["end"][order],
                       "correlation": data["correlation"][order], "tid": data["tid"][order]})
    df["dur_ns"] = df["end_ns"] - df["start_ns"]
    # versioned names (cudaLaunchKernel_v7000) read as the API users know
    df["name"] = df["name"].astype(str).str.replace(r"_v\d+$", "", regex=True)
    return df


def read_nvtx(sqlite: Path) -> pd.DataFrame:
    """NVTX ranges: text, start_ns, end_ns (push/pop and start/end ranges that closed)."""
    con = sqlite3.connect(f"file:{sqlite}?mode=ro", uri=True)
    try:
        if not _has(con, "NVTX_EVENTS"):
            return pd.DataFrame(columns=["text", "start_ns", "end_ns"])
        rows = con.execute("SELECT e.start, e.end, COALESCE(e.text, s.value) FROM NVTX_EVENTS e "
                           "LEFT JOIN StringIds s ON s.id = e.textId WHERE e.end IS NOT NULL ORDER BY e.start").fetchall()
    finally:
        con.close()
    df = pd.DataFrame(rows, columns=["start_ns", "end_ns", "text"])
    return df[["text", "start_ns", "end_ns"]]


def session_start_unix_ns(sqlite: Path) -> int | None:
    """Wall-clock time of the session start, to place load phases (unix times) on the nsys timeline."""
    con = sqlite3.connect(f"file:{sqlite}?mode=ro", uri=True)
    try:
        if not _has(con, "TARGET_INFO_SESSION_START_TIME"):
            return None
        row = con.execute("SELECT * FROM TARGET_INFO_SESSION_START_TIME").fetchone()
        return int(row[0]) if row else None
    finally:
        con.close()


def read_window(sqlite: Path) -> tuple[int, int] | None:
    """The capture's own window on the kernel timeline (ANALYSIS_DETAILS start and stop), so idle before the first
    kernel and after the last is counted; None where the export has no such table."""
    con = sqlite3.connect(f"file:{sqlite}?mode=ro", uri=True)
    try:
        if not _has(con, "ANALYSIS_DETAILS"):
            return None
        row = con.execute("SELECT startTime, stopTime FROM ANALYSIS_DETAILS").fetchone()
        return (int(row[0]), int(row[1])) if row and row[1] > row[0] else None
    finally:
        con.close()


NSYS_MARKERS = ("TARGET_INFO_SESSION_START_TIME", "ANALYSIS_DETAILS", "TARGET_INFO_GPU", "StringIds")


def check_export(sqlite: Path) -> None:
    """Raise ProfilingUnavailable unless the file is an nsys SQLite export holding GPU kernels (a plain SQLite, or
    an export whose capture recorded no kernel, says which)."""
    con = sqlite3.connect(f"file:{sqlite}?mode=ro", uri=True)
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not tables & set(NSYS_MARKERS):
            shown = ", ".join(sorted(tables)[:8]) or "none"
            raise ProfilingUnavailable(f"{sqlite} is not an nsys export (no nsys tables; tables: {shown})")
        if "CUPTI_ACTIVITY_KIND_KERNEL" not in tables or \
                con.execute("SELECT 1 FROM CUPTI_ACTIVITY_KIND_KERNEL LIMIT 1").fetchone() is None:
            raise ProfilingUnavailable(f"{sqlite}: the capture recorded no GPU kernel (was --trace=cuda on, and did "
                                       "the capture range cover GPU work?)")
    finally:
        con.close()
