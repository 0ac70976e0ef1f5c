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
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from ..analysis.kernel_table import KERNEL_COLUMNS
from ..errors import ProfilingUnavailable

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


def export(nsys: str, report: Path) -> Path:
    """The report exported for reading: nsys's Parquet directory where this nsys writes one (2024 releases and later:
    on the H200 it exported 200,000 kernels in 1.0 s against 1.8 s for SQLite, and reads several times faster),
    else `nsys export --type sqlite`."""
    out = report.with_name(report.name.removesuffix(".nsys-rep") + "_parquetdir")
    r = subprocess.run([nsys, "export", "--type", "parquetdir", "--output", str(out), "--force-overwrite=true",
                        str(report)], capture_output=True, text=True)
    if r.returncode == 0 and out.is_dir() and any(out.glob("*.parquet")):
        return out
    shutil.rmtree(out, ignore_errors=True)
    return export_sqlite(nsys, report)


def is_columnar(export: Path) -> bool:
    """True for an `nsys export --type parquetdir` folder (one <TABLE>.parquet per table), False for SQLite."""
    return Path(export).is_dir()


def export_size(export: Path) -> int:
    """Bytes of an export on disk (a Parquet folder's files together)."""
    p = Path(export)
    return sum(f.stat().st_size for f in p.iterdir() if f.is_file()) if p.is_dir() else p.stat().st_size


def _pq_table(folder: Path, table: str, columns: tuple[str, ...] | None = None) -> pa.Table | None:
    """One table of a Parquet export (only the columns it has of those asked), or None where it has no such table."""
    p = Path(folder) / f"{table}.parquet"
    if not p.is_file():
        return None
    names = set(pq.read_schema(p).names)
    return pq.read_table(p, columns=[c for c in columns if c in names] if columns else None)


def _pq_int(t: pa.Table, column: str, null: int = -1) -> np.ndarray:
    """An integer column as int64 (nsys writes unsigned types; nulls become `null`)."""
    if column not in t.column_names:
        return np.full(t.num_rows, null, dtype=np.int64)
    col = t.column(column).cast(pa.int64())
    return (pc.fill_null(col, null) if col.null_count else col).to_numpy()


def _strings_lookup(ids: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lookup = np.full(int(ids.max()) + 1 if len(ids) else 1, -1, dtype=np.int64)
    lookup[ids] = np.arange(len(ids))
    return lookup, values


def _strings(con: sqlite3.Connection) -> tuple[np.ndarray, np.ndarray]:
    ids, values = zip(*con.execute("SELECT id, value FROM StringIds").fetchall(), strict=True) \
        if con.execute("SELECT count(*) FROM StringIds").fetchone()[0] else ((), ())
    return _strings_lookup(np.asarray(ids, dtype=np.int64), np.asarray(values, dtype=object))


def _pq_strings(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    t = _pq_table(folder, "StringIds", ("id", "value"))
    if t is None or t.num_rows == 0:
        return _strings_lookup(np.array([], dtype=np.int64), np.array([], dtype=object))
    return _strings_lookup(_pq_int(t, "id"), np.asarray(t.column("value").to_pylist(), dtype=object))


def _names(codes: np.ndarray, lookup: np.ndarray, values: np.ndarray) -> pd.Categorical:
    """String ids to a Categorical without touching each row in Python (ids missing from StringIds become NaN)."""
    small = np.int16 if len(values) < 2**15 else np.int32  # category codes as pandas keeps them: one gather
    table = lookup.astype(small)
    if codes.size and 0 <= int(codes.min()) and int(codes.max()) < len(table):
        pos = table[codes]
    else:
        inside = (codes >= 0) & (codes < len(table))
        pos = np.where(inside, table[np.clip(codes, 0, len(table) - 1)], -1).astype(small)
    cats = pd.Index(values)
    if cats.is_unique:
        return pd.Categorical.from_codes(pos, categories=cats)
    return pd.Categorical(np.where(pos >= 0, values[np.clip(pos, 0, None)], None))


def _columns(con: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in con.execute(f"PRAGMA table_info({table})")}


def _has(con: sqlite3.Connection, table: str) -> bool:
    return con.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (table,)).fetchone() is not None


def _scan(sqlite: Path, table: str, exprs: tuple[str, ...]) -> list[np.ndarray]:
    """Several integer expressions over a table, in rowid order, from one scan: every value is turned into text and
    joined by SQLite in C (group_concat) and parsed by numpy, several times faster than a Python tuple per row. The
    rowids are split into one range per core, each scanned on its own read-only connection (sqlite3 releases the
    GIL while a query runs). NULL must be mapped by each expression."""
    con = sqlite3.connect(f"file:{sqlite}?mode=ro", uri=True)
    try:
        lo, hi = con.execute(f"SELECT min(rowid), max(rowid) FROM {table}").fetchone()
    finally:
        con.close()
    if lo is None:
        return [np.array([], dtype=np.int64) for _ in exprs]
    workers = max(1, min(os.cpu_count() or 1, 8, (hi - lo) // 100_000 + 1))
    step = (hi - lo) // workers + 1
    aggs = ", ".join(f"group_concat({e}, ',')" for e in exprs)

    def one(a: int) -> list[np.ndarray]:
        c = sqlite3.connect(f"file:{sqlite}?mode=ro", uri=True, check_same_thread=False)
        try:
            row = c.execute(f"SELECT {aggs} FROM {table} WHERE rowid >= ? AND rowid < ?", (a, a + step)).fetchone()
        finally:
            c.close()
        return [_parse_ints(text) for text in row]
    starts = [lo + i * step for i in range(workers)]
    if workers == 1:
        parts = [one(starts[0])]
    else:
        with ThreadPoolExecutor(workers, thread_name_prefix="servescope-sqlite") as ex:
            parts = list(ex.map(one, starts))
    return [np.concatenate([p[i] for p in parts]) for i in range(len(exprs))]


def _parse_ints(text: str | None) -> np.ndarray:
    if not text:
        return np.array([], dtype=np.int64)
    try:
        with warnings.catch_warnings():  # numpy's text mode of fromstring is deprecated but 3x faster than the rest
            warnings.simplefilter("ignore", DeprecationWarning)
            return np.fromstring(text, dtype=np.int64, sep=",")
    except (AttributeError, ValueError, TypeError):
        return pacsv.read_csv(io.BytesIO(text.replace(",", "\n").encode()),
                              read_options=pacsv.ReadOptions(column_names=["v"])).column(0).to_numpy()


KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"


def _sqlite_kernels(sqlite: Path) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray] | None:
    con = sqlite3.connect(f"file:{sqlite}?mode=ro", uri=True)
    try:
        if not _has(con, KERNEL_TABLE):
            return None
        cols = _columns(con, KERNEL_TABLE)
        lookup, values = _strings(con)
    finally:
        con.close()
    name = "demangledName" if "demangledName" in cols else "shortName"
    graph = "(graphNodeId IS NOT NULL)" if "graphNodeId" in cols else "0"
    # group_concat skips NULLs, which would shift one column against the others: every expression maps them
    # small fields packed into one integer per row (device 8 bits, stream 23, graph flag 1, name id 32): fewer
    # values to turn into text and back
    packed = (f"((COALESCE(deviceId, 0) & 255) << 56) | ((COALESCE(streamId, 0) & 8388607) << 33) | ({graph} << 32)"
              f" | (COALESCE({name}, -1) & 4294967295)")
    start, dur, pack, corr = _scan(sqlite, KERNEL_TABLE, ("COALESCE(start, 0)", "COALESCE(end - start, 0)", packed,
                                                          "COALESCE(correlationId, -1)"))
    pack = pack.view(np.uint64)
    return {"start": start, "end": start + dur, "device": (pack >> np.uint64(56)).astype(np.int64),
            "stream": ((pack >> np.uint64(33)) & np.uint64(0x7FFFFF)).astype(np.int64),
            "graph": ((pack >> np.uint64(32)) & np.uint64(1)).astype(bool),
            "name": (pack & np.uint64(0xFFFFFFFF)).astype(np.int64), "correlation": corr}, lookup, values


def _parquet_kernels(folder: Path) -> tuple[dict[str, Any], np.ndarray, np.ndarray] | None:
    """The kernel columns of a Parquet export, cast by Arrow into their final types (Arrow's allocator reuses its
    memory; each fresh numpy array of ten million rows costs a page fault per 4 kB)."""
    t = _pq_table(folder, KERNEL_TABLE, ("start", "end", "deviceId", "streamId", "correlationId", "demangledName",
                                         "shortName", "graphNodeId"))
    if t is None:
        return None
    name = "demangledName" if "demangledName" in t.column_names else "shortName"
    n = t.num_rows

    def col(c: str, typ: pa.DataType, null: int = -1) -> pa.ChunkedArray:
        if c not in t.column_names:
            return pa.chunked_array([pa.array(np.full(n, null), typ)])
        x = pc.cast(t.column(c), typ)
        return pc.fill_null(x, null) if x.null_count else x
    graph = pc.is_valid(t.column("graphNodeId")) if "graphNodeId" in t.column_names \
        else pa.chunked_array([pa.array(np.zeros(n, dtype=bool))])
    cols = {"start": col("start", pa.int64()), "end": col("end", pa.int64()), "device": col("deviceId", pa.int16()),
            "stream": col("streamId", pa.int32()), "graph": graph, "name": col(name, pa.int32()),
            "correlation": col("correlationId", pa.int64())}
    return (cols, *_pq_strings(folder))


def read_kernels(export: Path) -> pd.DataFrame:
    """Every GPU kernel of an nsys export (a Parquet folder or an SQLite file) as a kernel table (times in ns since
    session start).

    graph_node is set for kernels that ran as nodes of a CUDA graph (needs --cuda-graph-trace=node)."""
    got = _parquet_kernels(export) if is_columnar(export) else _sqlite_kernels(export)
    if got is None:
        return pd.DataFrame(columns=KERNEL_COLUMNS)
    c, lookup, values = got
    c = {k: pa.chunked_array([v]) if isinstance(v, np.ndarray) else v for k, v in c.items()}
    ordered = pc.all(pc.greater_equal(pc.pairwise_diff(c["start"].combine_chunks()), 0)).as_py() \
        if len(c["start"]) > 1 else True
    if ordered is False:  # nsys writes in time order; sort only if not
        order = pc.sort_indices(c["start"])
        c = {k: v.take(order) for k, v in c.items()}
    n = len(c["start"])
    ids = c.pop("name").to_numpy()
    name = _names(ids, lookup, values)
    del ids
    # one Arrow table, handed to pandas a column at a time (split_blocks, self_destruct): pandas' own constructor
    # copies every int64 column into one block, a second of ten million rows
    table = pa.table({
        "name": pa.DictionaryArray.from_arrays(pa.array(name.codes, mask=name.codes < 0),
                                               pa.array(np.asarray(name.categories, dtype=object), pa.string())),
        "start_ns": c["start"], "end_ns": c["end"], "device": c["device"], "stream": c["stream"],
        "correlation": c["correlation"],
        # 1 = ran as a graph node, NaN = launched on its own
        "graph_node": pc.if_else(c["graph"], pa.scalar(1.0, pa.float32()), pa.scalar(float("nan"), pa.float32())),
        "dur_ns": pc.subtract(c["end"], c["start"]),
        "op": pa.DictionaryArray.from_arrays(pa.nulls(n, pa.int8()), pa.array([], pa.string())),
        "source": pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, dtype=np.int8)), pa.array(["nsys"])),
    })
    del c
    return table.to_pandas(split_blocks=True, self_destruct=True)


RUNTIME_TABLE = "CUPTI_ACTIVITY_KIND_RUNTIME"
RUNTIME_COLUMNS = ["name", "start_ns", "end_ns", "dur_ns", "correlation", "tid"]


def read_runtime(export: Path) -> pd.DataFrame:
    """CUDA runtime API calls (launches, graph launches, syncs): name, start_ns, end_ns, dur_ns, correlation, tid."""
    if is_columnar(export):
        t = _pq_table(export, RUNTIME_TABLE, ("start", "end", "nameId", "correlationId", "globalTid"))
        if t is None:
            return pd.DataFrame(columns=RUNTIME_COLUMNS)
        data = {c: _pq_int(t, col) for c, col in (("start", "start"), ("end", "end"), ("name_id", "nameId"),
                                                  ("correlation", "correlationId"), ("tid", "globalTid"))}
        lookup, values = _pq_strings(export)
    else:
        con = sqlite3.connect(f"file:{export}?mode=ro", uri=True)
        try:
            if not _has(con, RUNTIME_TABLE):
                return pd.DataFrame(columns=RUNTIME_COLUMNS)
            lookup, values = _strings(con)
        finally:
            con.close()
        names = ("start", "end", "name_id", "correlation", "tid")
        exprs = tuple(f"COALESCE({e}, -1)" for e in ("start", "end", "nameId", "correlationId", "globalTid"))
        data = dict(zip(names, _scan(export, RUNTIME_TABLE, exprs), strict=True))
    order = np.argsort(data["start"], kind="stable")
    df = pd.DataFrame({"name": _names(data["name_id"][order], lookup, values),
                       "start_ns": data["start"][order], "end_ns": data["end"][order],
                       "correlation": data["correlation"][order], "tid": data["tid"][order]})
    df["dur_ns"] = df["end_ns"] - df["start_ns"]
    # versioned names (cudaLaunchKernel_v7000) read as the API users know
    df["name"] = df["name"].astype(str).str.replace(r"_v\d+$", "", regex=True)
    return df


def read_nvtx(export: Path) -> pd.DataFrame:
    """NVTX ranges: text, start_ns, end_ns (push/pop and start/end ranges that closed)."""
    cols = ["text", "start_ns", "end_ns"]
    if is_columnar(export):
        t = _pq_table(export, "NVTX_EVENTS", ("start", "end", "text", "textId"))
        if t is None:
            return pd.DataFrame(columns=cols)
        df = t.to_pandas()
        if "textId" in df and df["text"].isna().any():
            lookup, values = _pq_strings(export)
            ids = df["textId"].fillna(-1).astype(np.int64).to_numpy()
            df["text"] = df["text"].fillna(pd.Series(np.asarray(_names(ids, lookup, values), dtype=object)))
        df = df[df["end"].notna()].sort_values("start", kind="stable")
        return pd.DataFrame({"text": df["text"].to_numpy(), "start_ns": df["start"].astype(np.int64).to_numpy(),
                             "end_ns": df["end"].astype(np.int64).to_numpy()}, columns=cols)
    con = sqlite3.connect(f"file:{export}?mode=ro", uri=True)
    try:
        if not _has(con, "NVTX_EVENTS"):
            return pd.DataFrame(columns=cols)
        rows = con.execute("SELECT e.start, e.end, COALESCE(e.text, s.value) FROM NVTX_EVENTS e "
                           "LEFT JOIN StringIds s ON s.id = e.textId WHERE e.end IS NOT NULL ORDER BY e.start").fetchall()
    finally:
        con.close()
    df = pd.DataFrame(rows, columns=["start_ns", "end_ns", "text"])
    return df[cols]


def _first_row(export: Path, table: str, columns: tuple[str, ...]) -> tuple[Any, ...] | None:
    """The first row of a small table (session start, capture window) of either export form, or None."""
    if is_columnar(export):
        t = _pq_table(export, table, columns)
        if t is None or t.num_rows == 0 or any(c not in t.column_names for c in columns):
            return None
        return tuple(t.column(c)[0].as_py() for c in columns)
    con = sqlite3.connect(f"file:{export}?mode=ro", uri=True)
    try:
        if not _has(con, table):
            return None
        return con.execute(f"SELECT {', '.join(columns)} FROM {table}").fetchone()
    finally:
        con.close()


def session_start_unix_ns(export: Path) -> int | None:
    """Wall-clock time of the session start, to place load phases (unix times) on the nsys timeline."""
    row = _first_row(export, "TARGET_INFO_SESSION_START_TIME", ("utcEpochNs",))
    return int(row[0]) if row and row[0] is not None else None


def read_window(export: Path) -> tuple[int, int] | None:
    """The capture's own window on the kernel timeline (ANALYSIS_DETAILS start and stop), so idle before the first
    kernel and after the last is counted; None where the export has no such table."""
    row = _first_row(export, "ANALYSIS_DETAILS", ("startTime", "stopTime"))
    return (int(row[0]), int(row[1])) if row and row[1] > row[0] else None


NSYS_MARKERS = ("TARGET_INFO_SESSION_START_TIME", "ANALYSIS_DETAILS", "TARGET_INFO_GPU", "StringIds")


def check_export(export: Path) -> None:
    """Raise ProfilingUnavailable unless the path is an nsys export (SQLite file or Parquet folder) holding GPU
    kernels (a plain SQLite, or an export whose capture recorded no kernel, says which)."""
    if is_columnar(export):
        tables = {p.stem for p in Path(export).glob("*.parquet")}
        has_kernels = KERNEL_TABLE in tables and pq.read_metadata(Path(export) / f"{KERNEL_TABLE}.parquet").num_rows > 0
    else:
        con = sqlite3.connect(f"file:{export}?mode=ro", uri=True)
        try:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            has_kernels = KERNEL_TABLE in tables and \
                con.execute(f"SELECT 1 FROM {KERNEL_TABLE} LIMIT 1").fetchone() is not None
        finally:
            con.close()
    if not tables & set(NSYS_MARKERS):
        shown = ", ".join(sorted(tables)[:8]) or "none"
        raise ProfilingUnavailable(f"{export} is not an nsys export (no nsys tables; tables: {shown})")
    if not has_kernels:
        raise ProfilingUnavailable(f"{export}: the capture recorded no GPU kernel (was --trace=cuda on, and did "
                                   "the capture range cover GPU work?)")
