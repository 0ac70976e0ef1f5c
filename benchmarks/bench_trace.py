"""make bench-trace: parse a 1,000,000-kernel timeline in the Nsight Systems SQLite schema, end to end, beside the
obvious pandas route; then a 10,000,000-kernel timeline (a ten-minute capture of a busy server) in a fresh process,
with its peak resident memory. Goals: at least 2,000,000 rows/s, at most 2 GB for 10M rows.

Builds (untimed) an SQLite file with the tables and columns `nsys export --type sqlite` writes (StringIds,
CUPTI_ACTIVITY_KIND_KERNEL, CUPTI_ACTIVITY_KIND_RUNTIME, NVTX_EVENTS; column names as recorded on the H200
machine), 300 kernel names from a real MoE serving mix, a third of the kernels as CUDA-graph nodes. Then times
reading the kernel table, categorising every kernel, the busy fraction and idle gaps, the category and MoE
breakdowns, and the trace's regime. Last line (the 10M-row run):
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))

from servescope.analysis import kernels as ak  # noqa: E402
from servescope.profile.nsys import read_kernels  # noqa: E402

NAMES = ["fused_moe_kernel", "moe_align_block_size_kernel", "flash_fwd_splitkv_kernel", "nvjet_sm90_tst_64x48",
         "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "rms_norm_kernel", "act_and_mul_kernel",
         "vectorized_elementwise_kernel", "direct_copy_kernel_cuda", "rotary_embedding_kernel"]


def build(path: Path, n: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    names = [f"void {NAMES[i % len(NAMES)]}<{i}>(int, float*)" for i in range(300)]
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
    dur = rng.integers(800, 200_000, n)
    gap = rng.integers(50, 20_000, n)
    start = np.cumsum(gap + np.concatenate([[0], dur[:-1]])) + 1_000_000_000
    name = rng.integers(0, len(names), n)
    graph = np.where(rng.random(n) < 1 / 3, np.arange(n), -1)
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


def child(path: Path) -> int:
    """Analyse one timeline in this fresh process and print its figures and peak RSS as JSON."""
    out = analyse(path)
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kB
    print(json.dumps(out))
    return 0


def big(rows: int, tmp: Path) -> dict[str, float]:
    """Build a timeline of `rows` kernels and analyse it in a child process (so its peak RSS is its own)."""
    path = tmp / "big.sqlite"
    t0 = time.perf_counter()
    build(path, rows, seed=1)
    print(f"built {rows:,} kernels ({path.stat().st_size / 2**20:,.0f} MiB on disk) in {time.perf_counter() - t0:.0f} s"
          " (not timed)", flush=True)
    base = subprocess.run([sys.executable, "-c", "import resource, pandas, pyarrow; print(resource.getrusage("
                           "resource.RUSAGE_SELF).ru_maxrss / 1024)"], capture_output=True, text=True, check=True)
    res = subprocess.run([sys.executable, __file__, "--child", str(path)], capture_output=True, text=True, check=True)
    out = json.loads(res.stdout.strip().splitlines()[-1])
    out["baseline_rss_mb"] = float(base.stdout.strip())
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--big-rows", type=int, default=10_000_000, help="the long timeline (0: skip it)")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a.child)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "timeline.sqlite"
        t0 = time.perf_counter()
        build(path, a.rows)
        print(f"built {a.rows} kernels in the nsys SQLite schema in {time.perf_counter() - t0:.1f} s (not timed)")
        best = float("inf")
        for i in range(a.repeat):
            r = analyse(path)
            best = min(best, r["seconds"])
            print(f"run {i + 1}: {r['seconds']:.2f} s  (busy {r['busy']:.3f}, {r['categories']} categories, "
                  f"MoE paths {r['moe_paths']}, regime {r['regime']})")
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
        print(f"peer (pandas.read_sql of the join, same analysis): {peer_s:.2f} s = {a.rows / peer_s:.0f} rows/s; "
              f"ours {peer_s / best:.1f}x faster")
        print(f"{a.rows:,} rows: best of {a.repeat} {best:.2f} s = {a.rows / best:,.0f} rows/s")
        if not a.big_rows:
            print(f"trace_parse: rows={a.rows} seconds={best:.2f} rows_per_s={a.rows / best:.0f} peak_rss_mb=nan")
            return 0
        b = big(a.big_rows, Path(d))
    print(f"{b['rows']:,} rows in a fresh process: {b['seconds']:.1f} s, peak RSS {b['peak_rss_mb']:,.0f} MB "
          f"(the interpreter with pandas and pyarrow alone: {b['baseline_rss_mb']:,.0f} MB); busy {b['busy']:.3f}, "
          f"regime {b['regime']}")
    ok = b["rows"] / b["seconds"] >= 2_000_000 and b["peak_rss_mb"] <= 2048
    print(f"goals (>= 2,000,000 rows/s, <= 2 GB at 10M rows): {'met' if ok else 'NOT met'}")
    print(f"trace_parse: rows={b['rows']} seconds={b['seconds']:.2f} rows_per_s={b['rows'] / b['seconds']:.0f} "
          f"peak_rss_mb={b['peak_rss_mb']:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
