"""Kernel tables from real H200 recordings (Nsight Systems SQLite + stats CSVs, a PyTorch profiler trace), the
analysis on them checked against the profilers' own summaries, and the parser's speed path."""

from __future__ import annotations

import gzip
import json
import sqlite3
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from servescope.analysis import kernels as ak
from servescope.analysis.kernel_table import CATEGORIES, categorize, category_table
from servescope.errors import ProfilingUnavailable
from servescope.profile import nsys, torch_trace

FIX = Path(__file__).parent / "fixtures" / "h200_profiles"


def _union_by_loop(starts, ends) -> float:
    """Second method for busy time: a plain loop over sorted intervals."""
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(zip(starts, ends, strict=True)):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + (cur_e - cur_s if cur_e is not None else 0)


@pytest.fixture(scope="module")
def launch():
    db = FIX / "launch_bound.sqlite"
    return nsys.read_kernels(db), nsys.read_runtime(db), nsys.read_nvtx(db), nsys.read_stats(FIX / "launch_bound_stats")


def test_kernel_table_matches_nsys_stats(launch):
    k, runtime, _, stats = launch
    ks = stats["cuda_gpu_kern_sum"]
    assert len(k) == ks["Instances"].sum() == 4053
    assert k["dur_ns"].sum() == ks["Total Time (ns)"].sum()
    api = stats["cuda_api_sum"].set_index("Name")
    assert (runtime["name"] == "cudaLaunchKernel").sum() == api.loc["cudaLaunchKernel", "Num Calls"]
    assert k["graph_node"].notna().sum() == 2000  # 4 replays of a 500-kernel graph (--cuda-graph-trace=node)


def test_nvtx_ranges_match_nvtx_sum(launch):
    _, _, nv, stats = launch
    got = dict(zip(nv["text"], nv["end_ns"] - nv["start_ns"], strict=True))
    want = dict(zip(stats["nvtx_sum"]["Range"].str.lstrip(":"), stats["nvtx_sum"]["Total Time (ns)"], strict=True))
    assert got == want


def test_launch_bound_window_is_mostly_idle(launch):
    k, runtime, nv, _ = launch
    r = nv.set_index("text").loc["launch_bound"]
    (b,) = ak.busy(k, r.start_ns, r.end_ns).to_dict("records")
    inside = ak.clip(k, r.start_ns, r.end_ns)
    assert b["kernels"] == 2000 and b["graph_kernel_fraction"] == 0
    assert b["busy_fraction"] == pytest.approx(_union_by_loop(inside["start_ns"], inside["end_ns"])
                                               / (r.end_ns - r.start_ns))
    assert b["busy_fraction"] < 0.1 and b["idle_gap_us_p50"] > 5 * b["kernel_us_p50"]
    lo = ak.launch_overhead(runtime, k, r.start_ns, r.end_ns)
    assert lo["launch_calls"] == 2000 and lo["launch_to_kernel_ratio"] > 5  # the host is the bottleneck


def test_graph_replay_window_packs_kernels(launch):
    k, runtime, nv, _ = launch
    r = nv.set_index("text").loc["graph_replay"]
    (b,) = ak.busy(k, r.start_ns, r.end_ns).to_dict("records")
    assert b["kernels"] == 2000 and b["graph_kernel_fraction"] == 1.0
    assert b["idle_gap_us_p50"] < 0.5  # back to back
    lo = ak.launch_overhead(runtime, k, r.start_ns, r.end_ns)
    assert lo["graph_launch_calls"] == 4 and lo["kernels_from_graphs"] == 2000 and lo["kernels_launched_eagerly"] == 0


def test_load_phases_placed_on_the_nsys_timeline_by_wall_clock(launch):
    """A server profiled from outside: the load's phase marks (unix ns) land on the report's timeline through its
    session start, and busy per phase equals busy over the NVTX range the workload itself opened."""
    k, _, nv, _ = launch
    origin = nsys.session_start_unix_ns(FIX / "launch_bound.sqlite")
    assert origin == 1796052185659983576
    r = nv.set_index("text")
    marks = [("warmup:c=1", origin + int(r.loc["launch_bound", "start_ns"]) - 10**6),
             ("c=1", origin + int(r.loc["launch_bound", "start_ns"])),
             ("c=4", origin + int(r.loc["graph_replay", "start_ns"])),
             ("idle", origin + int(r.loc["graph_replay", "end_ns"]))]
    ph = ak.phase_windows(marks, origin)
    assert list(ph["text"]) == ["warmup:c=1", "c=1", "c=4"]
    by = ak.busy_by_range(k, ph).set_index("range")
    direct = ak.busy(k, r.loc["graph_replay", "start_ns"], r.loc["graph_replay", "end_ns"]).iloc[0]
    assert by.loc["c=4", "kernels"] == direct["kernels"] == 2000
    assert by.loc["c=4", "busy_fraction"] == pytest.approx(direct["busy_fraction"])
    assert by.loc["c=1", "kernels"] >= 2000 and by.loc["c=1", "busy_fraction"] < 0.1
    assert ak.phase_windows([("c=1", origin)], origin).empty  # a phase never ended is not guessed


def test_compute_bound_is_busy_dense_gemm():
    db = FIX / "compute_bound.sqlite"
    k, nv = nsys.read_kernels(db), nsys.read_nvtx(db)
    r = nv.set_index("text").loc["compute_bound"]
    (b,) = ak.busy(k, r.start_ns, r.end_ns).to_dict("records")
    assert b["kernels"] == 40 and b["busy_fraction"] > 0.95
    cats = ak.categories(k).set_index("category")
    assert cats.loc["dense_gemm", "share"] > 0.95
    stats = nsys.read_stats(FIX / "compute_bound_stats")["cuda_gpu_kern_sum"]
    top = stats.iloc[0]
    assert top["Name"].startswith("nvjet") and top["Instances"] == 45  # 5 warm-up + 40 measured


def test_torch_trace_moe_path_matches_the_profilers_own_table():
    """The profiler's key_averages table (recorded beside the trace) gave aten::_grouped_mm 498.144 us of CUDA time,
    13.77% of 3.617 ms: the kernel table, linked to ops through External id, must say the same."""
    k = ak.with_categories(torch_trace.read_kernels(FIX / "moe_torch_trace.json.gz"))
    assert k["dur_ns"].sum() / 1e3 == pytest.approx(3617.1, abs=0.5)
    moe = ak.moe_path(k).set_index("moe_path")
    assert list(moe.index) == ["torch_grouped_mm"]
    assert moe.loc["torch_grouped_mm", "kernel_ms"] * 1e3 == pytest.approx(498.144, abs=0.01)
    assert moe.loc["torch_grouped_mm", "share"] == pytest.approx(0.1377, abs=0.001)
    assert (k[k["op"] == "aten::_grouped_mm"]["category"] == "moe_grouped_gemm").all()
    attn = k[k["op"] == "aten::_cudnn_attention_forward"]
    assert len(attn) and (attn["category"] == "attention").all()


def test_torch_trace_streaming_matches_plain_json():
    ev = torch_trace.read_events(FIX / "moe_torch_trace.json.gz")
    raw = json.load(gzip.open(FIX / "moe_torch_trace.json.gz"))["traceEvents"]
    assert (ev["cat"] == "kernel").sum() == sum(1 for e in raw if e.get("cat") == "kernel" and e.get("ph") == "X")


def test_cpu_engine_trace_uses_top_level_ops(tmp_path):
    events = [{"ph": "X", "cat": "cpu_op", "name": "_C::cpu_fused_moe", "pid": 1, "tid": 1, "ts": 10.0, "dur": 5.0,
               "args": {"External id": 1}},
              {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 1, "tid": 1, "ts": 11.0, "dur": 1.0,
               "args": {"External id": 2}},  # nested inside the first: not counted twice
              {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": 1, "tid": 1, "ts": 20.0, "dur": 10.0,
               "args": {"External id": 3}}]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": events}))
    k = ak.with_categories(torch_trace.read_kernels(p))
    assert list(k["name"]) == ["_C::cpu_fused_moe", "aten::linear"] and (k["device"] == -1).all()
    assert list(k["category"]) == ["moe_grouped_gemm", "dense_gemm"] and k["moe_path"].iloc[0] == "cpu_experts"


@pytest.mark.parametrize("name,op,cat,path", [
    ("fused_moe_kernel", None, "moe_grouped_gemm", "triton_fused_moe"),
    ("void tensorrt_llm::kernels::expandInputRowsKernel<...>", None, "moe_grouped_gemm", "flashinfer_cutlass"),
    ("deep_gemm::fp8_gemm_kernel", None, "moe_grouped_gemm", "deep_gemm"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", None, "communication", ""),
    ("flash_fwd_splitkv_kernel", None, "attention", ""),
    ("nvjet_sm90_tst_64x48_64x15_2x4_h_bz_TNT", None, "dense_gemm", ""),
    ("void rms_norm_kernel<bf16>", None, "elementwise_norm_activation", ""),
    ("Memcpy DtoD (Device -> Device)", None, "memory_copy", ""),
    ("some_unknown_kernel", None, "other", ""),
    # vLLM's CPU build on an AMX CPU runs its dense layers as AMX-packed linears (seen on this project's Xeon VM)
    ("_C::weight_packed_linear", None, "dense_gemm", ""),
    ("void at::cuda::detail::prepare_grouped_gemm_data", "aten::_grouped_mm", "moe_grouped_gemm", "torch_grouped_mm"),
])
def test_category_table(name, op, cat, path):
    out = categorize(pd.Series([name]), None if op is None else pd.Series([op])).iloc[0]
    assert (out["category"], out["moe_path"]) == (cat, path)


def test_category_table_is_data():
    t = category_table()
    assert set(t["category"]) <= set(CATEGORIES) and t["pattern"].str.len().min() > 3


def test_bench_trace_runs_and_parses_every_row(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from bench_trace import build

    db = tmp_path / "t.sqlite"
    build(db, 5000)
    k = nsys.read_kernels(db)
    con = sqlite3.connect(db)
    n, dur = con.execute("SELECT count(*), sum(end - start) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    graph = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE graphNodeId IS NOT NULL").fetchone()[0]
    assert len(k) == n == 5000 and k["dur_ns"].sum() == dur and k["graph_node"].notna().sum() == graph
    assert np.all(np.diff(k["start_ns"]) >= 0)


def test_no_nsys_is_a_stated_reason(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(nsys, "NSYS_GLOBS", (str(tmp_path / "none*/nsys"),))
    with pytest.raises(ProfilingUnavailable, match="not found"):
        nsys.locate_nsys()
    (tmp_path / "r.qdstrm").write_text("x")
    with pytest.raises(ProfilingUnavailable, match="libdw"):
        nsys.find_report(tmp_path / "r")


def test_profile_prefix_for_capture_range():
    cmd = nsys.profile_prefix("/x/nsys", Path("/tmp/r"), capture_range="cudaProfilerApi")
    assert "--capture-range=cudaProfilerApi" in cmd and "--capture-range-end=stop" in cmd
    assert "--trace-fork-before-exec=true" in cmd and "--cuda-graph-trace=node" in cmd
    win = nsys.profile_prefix("/x/nsys", Path("/tmp/r"), delay_s=5, duration_s=3)
    assert win[win.index("--delay") + 1] == "5" and win[win.index("--duration") + 1] == "3"


def test_real_server_slice_is_launch_bound():
    db = FIX / "transformers_serve_c8_1s.sqlite"
    k, rt, nv = ak.with_categories(nsys.read_kernels(db)), nsys.read_runtime(db), nsys.read_nvtx(db)
    r = nv.set_index("text").loc["slice: 1 s of servescope c=8"]
    (b,) = ak.busy(k, r.start_ns, r.end_ns).to_dict("records")
    con = sqlite3.connect(db)
    assert b["kernels"] == con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    inside = ak.clip(k, r.start_ns, r.end_ns)
    assert b["busy_fraction"] == pytest.approx(_union_by_loop(inside["start_ns"], inside["end_ns"]) / 1e9)
    assert b["busy_fraction"] < 0.05 and b["kernels_per_s"] > 3000
    lo = ak.launch_overhead(rt, k, r.start_ns, r.end_ns)
    assert lo["launch_to_kernel_ratio"] > 2 and lo["kernels_from_graphs"] == 0  # no CUDA graphs in this server
    assert list(ak.moe_path(k)["moe_path"]) == ["torch_grouped_mm"]


def test_categories_agree_between_sqlite_slice_and_whole_capture_stats():
    """Second source: nsys's own per-name totals of the whole 7 s capture, categorised the same way."""
    s = pd.read_csv(FIX / "transformers_serve_c8_stats_cuda_gpu_kern_sum.csv")
    assert s["Instances"].sum() == 80019
    cats = categorize(s["Name"])
    whole = s.assign(c=cats["category"].astype(str)).groupby("c")["Total Time (ns)"].sum() / s["Total Time (ns)"].sum()
    part = ak.categories(nsys.read_kernels(FIX / "transformers_serve_c8_1s.sqlite")).set_index("category")["share"]
    assert whole["moe_grouped_gemm"] == pytest.approx(0.0971, abs=0.001)
    for c in ("moe_grouped_gemm", "dense_gemm", "attention", "elementwise_norm_activation"):
        assert part[c] == pytest.approx(whole[c], abs=0.03)  # a steady load: one second looks like the whole


def test_kernels_cli_on_stored_traces(capsys):
    from servescope.cli import main

    assert main(["kernels", str(FIX / "launch_bound.sqlite"), "--range", "graph_replay", "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "2000 kernels (nsys), NVTX range 'graph_replay'" in out and "kernels_from_graphs: 2000" in out
    assert main(["kernels", str(FIX / "moe_torch_trace.json.gz")]) == 0
    assert "torch_grouped_mm" in capsys.readouterr().out
    assert main(["kernels", str(FIX / "launch_bound.sqlite"), "--range", "nope"]) == 2
    assert "ranges there: ['graph_replay', 'launch_bound']" in capsys.readouterr().err


def test_open_trace_reads_stats_beside_sqlite_and_refuses_unknown(tmp_path):
    from servescope.profile.session import open_trace

    p = open_trace(FIX / "launch_bound.sqlite")
    assert p.source == "nsys" and len(p.kernels) == p.stats["cuda_gpu_kern_sum"]["Instances"].sum()
    bad = tmp_path / "trace.txt"
    bad.write_text("x")
    with pytest.raises(ProfilingUnavailable, match="not a trace servescope reads"):
        open_trace(bad)


# -- nsys's Parquet export (`nsys export --type parquetdir`), recorded on the H200 beside SQLite of one capture ----
COL = Path(__file__).parent / "fixtures" / "h200_columnar"


@pytest.fixture(scope="module")
def both_forms(tmp_path_factory):
    import gzip
    import shutil

    d = tmp_path_factory.mktemp("columnar")
    sqlite = d / "launch_bound.sqlite"
    with gzip.open(COL / "launch_bound.sqlite.gz") as src, open(sqlite, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return sqlite, COL / "launch_bound_parquetdir"


def test_parquet_and_sqlite_exports_of_one_capture_give_the_same_tables(both_forms):
    sqlite, folder = both_forms
    assert nsys.is_columnar(folder) and not nsys.is_columnar(sqlite)
    a, b = nsys.read_kernels(sqlite), nsys.read_kernels(folder)
    assert len(a) == len(b) == 4053 and int(b["graph_node"].notna().sum()) == 2000
    for c in ("start_ns", "end_ns", "dur_ns", "device", "stream", "correlation"):
        assert (a[c].to_numpy() == b[c].to_numpy()).all(), c
    assert (a["name"].astype(str).to_numpy() == b["name"].astype(str).to_numpy()).all()
    assert (a["graph_node"].isna() == b["graph_node"].isna()).all()
    ra, rb = nsys.read_runtime(sqlite), nsys.read_runtime(folder)
    assert len(ra) == len(rb) == 5267 and (ra["name"].to_numpy() == rb["name"].to_numpy()).all()
    assert nsys.read_nvtx(sqlite).to_dict("records") == nsys.read_nvtx(folder).to_dict("records")
    assert nsys.read_window(sqlite) == nsys.read_window(folder) == (542401647, 9346668609)


def test_a_parquet_export_opens_as_a_trace_and_is_checked(both_forms, tmp_path):
    from servescope.profile.session import open_trace

    p = open_trace(both_forms[1])
    assert p.source == "nsys" and len(p.kernels) == 4053 and p.window_ns == (542401647, 9346668609)
    empty = tmp_path / "not_nsys"
    empty.mkdir()
    pd.DataFrame({"x": [1]}).to_parquet(empty / "other.parquet")
    with pytest.raises(ProfilingUnavailable, match="not an nsys export"):
        nsys.check_export(empty)


def test_export_prefers_parquet_and_falls_back_to_sqlite(tmp_path):
    """A stub nsys: one that writes parquetdir, one that refuses the type (releases before 2024 have no such type)."""
    report = tmp_path / "r.nsys-rep"
    report.write_text("")
    for refuses in (False, True):
        stub = tmp_path / f"nsys{int(refuses)}"
        parquet = 'echo "unknown type" >&2; exit 1' if refuses else 'mkdir -p "$out" && echo x > "$out/StringIds.parquet"'
        stub.write_text(f"""#!/bin/sh
out=""; typ=""
while [ $# -gt 0 ]; do case "$1" in --type) typ=$2; shift;; --output) out=$2; shift;; esac; shift; done
if [ "$typ" = parquetdir ]; then {parquet}; fi
[ "$typ" = sqlite ] && echo x > "$out"
exit 0
""")
        stub.chmod(0o755)
        got = nsys.export(str(stub), report)
        assert got.name == ("r.sqlite" if refuses else "r_parquetdir"), got
        assert got.is_dir() is (not refuses)
