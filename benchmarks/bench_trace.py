"""make bench-trace: analyse a 1,000,000-kernel timeline end to end in both forms Nsight Systems exports (its Parquet
folder, which the suite reads where nsys writes it, and SQLite), beside the obvious pandas route; then a
10,000,000-kernel timeline (a ten-minute capture of a busy server) in a fresh process per form, with its peak
resident memory. Goals: at least 2,000,000 rows/s, at most 2 GB for 10M rows, on the form the suite reads.

Builds (untimed) the tables and columns `nsys export --type sqlite` and `--type parquetdir` write (StringIds,
CUPTI_ACTIVITY_KIND_KERNEL, CUPTI_ACTIVITY_KIND_RUNTIME, NVTX_EVENTS; names and Parquet types as recorded on the
H200 machine, tests/fixtures/h200_columnar), 300 kernel names from a real MoE serving mix, a third of the kernels as
CUDA-graph nodes. Then times reading the kernel table, categorising every kernel, the busy fraction and idle gaps,
the category and MoE breakdowns, and the trace's regime. Last line (the 10M-row run of the Parquet form):
  trace_parse: rows=N seconds=S rows_per_s=N peak_rss_mb=N
"""

from __future__ import annotations

import argparse
import json
import resource
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))

from servescope.analysis import kernels as ak  # noqa: E402
from servescope.profile.nsys import read_kernels  # noqa: E402

NAMES = ["fused_moe_kernel", "moe_align_block_size_kernel", "flash_fwd_splitkv_kernel", "nvjet_sm90_tst_64x48",
         "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "rms_norm_kernel", "act_and_mul_kernel",
         "vectorized_elementwise_kernel", "direct_copy_kernel_cuda", "rotary_embedding_kernel"]


def _timeline(n: int, seed: int) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    names = [f"void {NAMES[i % len(NAMES)]}<{i}>(int, float*)" for i in range(300)]
    dur = rng.integers(800, 200_000, n)
    gap = rng.integers(50, 20_000, n)
    start = np.cumsum(gap + np.concatenate([[0], dur[:-1]])) + 1_000_000_000
    name = rng.integers(0, len(names), n)
    graph = np.where(rng.random(n) < 1 / 3, np.arange(n), -1)
    return names, start, dur, name, graph


def build_parquet(folder: Path, n: int, seed: int = 0) -> None:
    """The same timeline as build(), as `nsys export --type parquetdir` writes it: one file per table, nsys's types."""
    names, start, dur, name, graph = _timeline(n, seed)
    folder.mkdir(parents=True, exist_ok=True)
    u64, u32 = pa.uint64(), pa.uint32()
    pq.write_table(pa.table({"id": pa.array(np.arange(len(names), dtype=np.int32)),
                             "value": pa.array(names, pa.large_string())}), folder / "StringIds.parquet")
    zeros = np.zeros(n, dtype=np.int64)
    pq.write_table(pa.table({
        "start": pa.array(start), "end": pa.array(start + dur), "deviceId": pa.array(zeros, u32),
        "contextId": pa.array(zeros + 1, u64), "streamId": pa.array(zeros + 7, u64),
        "correlationId": pa.array(np.arange(n), u32), "globalPid": pa.array(zeros + 1, u64),
        "demangledName": pa.array(name, u64), "shortName": pa.array(name, u64),
        "gridId": pa.array(np.arange(n)), "graphNodeId": pa.array(graph, u64, mask=graph < 0)}),
        folder / "CUPTI_ACTIVITY_KIND_KERNEL.parquet")
    pq.write_table(pa.table({"start": pa.array([int(start[0])]), "end": pa.array([int(start[-1] + dur[-1])]),
                             "eventType": pa.array([59], u32), "text": pa.array(["servescope:c=64"], pa.large_string()),
                             "textId": pa.array([None], u32)}), folder / "NVTX_EVENTS.parquet")


def build(path: Path, n: int, seed: int = 0) -> None:
    names, start, dur, name, graph = _timeline(n, seed)
    con = sqlite3.connect(path)
    con.executescript("""
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER,
          contextId INTEGER, greenContextId INTEGER, streamId INTEGER, correlationId INTEGER, globalPid INTEGER,
          demangledName INTEGER, shortName INTEGER, mangledName INTEGER, launchType INTEGER, cacheConfig INTEGER,
          registersPerThread INTEGER, gridX INTEGER, gridY INTEGER, gridZ INTEGER, blockX INTEGER, blockY INTEGER,
          blockZ INTEGER, staticSharedMemory INTEGER, dynamicSharedMemory INTEGER, localMemoryPerThread INTEGER,
          localMemoryTotal INTEGER, gridId INTEGER, sharedMemoryExecuted INTEGER, graphNodeId INTEGER,
          sharedMemoryLimitConfig INTEGER);
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER, end INTEGER, eventClass INTEGER, globalTid INTEGER,
          correlationId INTEGER, nameId INTEGER, returnValue INTEGER, callchainId INTEGER);
        CREATE TABLE NVTX_EVENTS (start INTEGER, end INTEGER, eventType INTEGER, rangeId INTEGER, category INTEGER,
          color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, textId INTEGER, domainId INTEGER,
          uint64Value INTEGER, int64Value INTEGER, doubleValue REAL, uint32Value INTEGER, int32Value INTEGER,
          floatValue REAL, jsonTextId INTEGER, jsonText TEXT, binaryData TEXT);
    """)
    con.executemany("INSERT INTO StringIds VALUES (?, ?)", enumerate(names))
    rows = ((int(s), int(s + d), 0, 1, None, 7, i, 1, int(m), int(m), None, 1, 0, 32, 1, 1, 1, 128, 1, 1, 0, 0, 0, 0,
             i, 0, int(g) if g >= 0 else None, 0) for i, (s, d, m, g) in enumerate(zip(start, dur, name, graph,
                                                                                       strict=True)))
    con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (" + ",".join("?" * 28) + ")", rows)
    con.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text) VALUES (?, ?, 59, 'servescope:c=64')",
                (int(start[0]), int(start[-1] + dur[-1])))
    con.commit()
    con.close()


def analyse(path: Path) -> dict[str, float]:
    """Everything `servescope kernels` computes from a timeline, timed: read, categorise, busy with window edges,
    categories, MoE path, regime."""
    from servescope.analysis.regime import trace_regime

    t0 = time.perf_counter()
    k = ak.with_categories(read_kernels(path))
    b = ak.busy(k)
    cats = ak.categories(k)
    moe = ak.moe_path(k)
    verdict = trace_regime(k, None)
    return {"rows": len(k), "seconds": time.perf_counter() - t0, "busy": float(b["busy_fraction"].iloc[0]),
            "categories": len(cats), "moe_paths": list(moe["moe_path"]), "regime": verdict.regime}


def peak_rss_mb() -> float:
    """This process's peak resident memory since it started (VmHWM: getrusage's ru_maxrss survives exec, so a child
    would report the parent's peak at fork)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # not Linux: the best there is


def child(path: Path) -> int:
    """Analyse one timeline in this fresh process and print its figures and peak RSS as JSON."""
    out = analyse(path)
    out["peak_rss_mb"] = peak_rss_mb()
    print(json.dumps(out))
    return 0


def big(rows: int, tmp: Path, form: str) -> dict[str, float]:
    """Build a timeline of `rows` kernels in one export form and analyse it in a child process (so its peak RSS is
    its own)."""
    path = tmp / ("big.sqlite" if form == "sqlite" else "big_parquetdir")
    t0 = time.perf_counter()
    (build if form == "sqlite" else build_parquet)(path, rows, seed=1)
    size = path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.iterdir())
    print(f"built {rows:,} kernels as {form} ({size / 2**20:,.0f} MiB on disk) in {time.perf_counter() - t0:.0f} s"
          " (not timed)", flush=True)
    base = subprocess.run([sys.executable, "-c", "import pathlib, pandas, pyarrow; print(next(int(x.split()[1]) / 1024 "
                           "for x in pathlib.Path('/proc/self/status').read_text().splitlines() if "
                           "x.startswith('VmHWM:')))"], capture_output=True, text=True, check=True)
    runs = []
    for _ in range(3):  # a fresh process each: the first touch of its memory is part of what a user waits for
        res = subprocess.run([sys.executable, __file__, "--child", str(path)], capture_output=True, text=True,
                             check=True)
        runs.append(json.loads(res.stdout.strip().splitlines()[-1]))
    out = sorted(runs, key=lambda r: r["seconds"])[1]  # the median run
    out["runs_s"] = [round(r["seconds"], 2) for r in runs]
    out["peak_rss_mb"] = max(r["peak_rss_mb"] for r in runs)
    out["baseline_rss_mb"] = float(base.stdout.strip())
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--big-rows", type=int, default=10_000_000, help="the long timeline (0: skip it)")
    ap.add_argument("--big-sqlite", action=argparse.BooleanOptionalAction, default=True,
                    help="also the long timeline as SQLite (about a minute to build)")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a.child)
    with tempfile.TemporaryDirectory() as d:
        best = {}
        for form in ("parquetdir", "sqlite"):
            path = Path(d) / ("timeline.sqlite" if form == "sqlite" else "timeline_parquetdir")
            t0 = time.perf_counter()
            (build if form == "sqlite" else build_parquet)(path, a.rows)
            print(f"built {a.rows:,} kernels as {form} in {time.perf_counter() - t0:.1f} s (not timed)")
            best[form] = float("inf")
            for i in range(a.repeat):
                r = analyse(path)
                best[form] = min(best[form], r["seconds"])
                print(f"  {form} run {i + 1}: {r['seconds']:.2f} s  (busy {r['busy']:.3f}, {r['categories']} "
                      f"categories, MoE paths {r['moe_paths']}, regime {r['regime']})")
        # the peer: the obvious pandas route (read_sql of the join, then the same analysis), timed once
        t0 = time.perf_counter()
        con = sqlite3.connect(path)
        peer = pd.read_sql("SELECT s.value AS name, k.start AS start_ns, k.end AS end_ns, k.deviceId AS device, "
                           "k.streamId AS stream, k.correlationId AS correlation, k.graphNodeId AS graph_node "
                           "FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName", con)
        con.close()
        peer["dur_ns"] = peer["end_ns"] - peer["start_ns"]
        peer = ak.with_categories(peer)
        ak.busy(peer), ak.categories(peer), ak.moe_path(peer)
        peer_s = time.perf_counter() - t0
        print(f"peer (pandas.read_sql of the SQLite join, same analysis): {peer_s:.2f} s = {a.rows / peer_s:,.0f} "
              f"rows/s; ours {peer_s / best['sqlite']:.1f}x faster on SQLite, {peer_s / best['parquetdir']:.1f}x on "
              "Parquet")
        for form, s in best.items():
            print(f"{a.rows:,} rows, {form}: best of {a.repeat} {s:.2f} s = {a.rows / s:,.0f} rows/s")
        if not a.big_rows:
            s = best["parquetdir"]
            print(f"trace_parse: rows={a.rows} seconds={s:.2f} rows_per_s={a.rows / s:.0f} peak_rss_mb=nan")
            return 0
        bigs = {form: big(a.big_rows, Path(d), form) for form in (("sqlite", "parquetdir") if a.big_sqlite
                                                                   else ("parquetdir",))}
    for form, b in bigs.items():
        print(f"{b['rows']:,} rows of {form}, median of 3 fresh processes {b['runs_s']}: {b['seconds']:.1f} s = "
              f"{b['rows'] / b['seconds']:,.0f} rows/s, highest peak RSS {b['peak_rss_mb']:,.0f} MB (the interpreter "
              "with pandas and pyarrow alone: "
              f"{b['baseline_rss_mb']:,.0f} MB); busy {b['busy']:.3f}, regime {b['regime']}")
    b = bigs["parquetdir"]
    ok = b["rows"] / b["seconds"] >= 2_000_000 and b["peak_rss_mb"] <= 2048
    print(f"goals on the Parquet export the suite reads (>= 2,000,000 rows/s, <= 2 GB at 10M rows): "
          f"{'met' if ok else 'NOT met'}")
    print(f"trace_parse: rows={b['rows']} seconds={b['seconds']:.2f} rows_per_s={b['rows'] / b['seconds']:.0f} "
          f"peak_rss_mb={b['peak_rss_mb']:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
