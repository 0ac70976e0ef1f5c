"""Kernel-level analysis, pure functions over a kernel table (analysis.kernel_table.KERNEL_COLUMNS): how busy the GPU
was, how long it idled between kernels, how many kernels ran and how long they took, launch API time against
kernel time, graph replay against eager launches, categories, the MoE path and its share, top kernels."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from .kernel_table import categorize

LAUNCH_APIS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
               "cudaLaunchCooperativeKernel", "cudaGraphLaunch", "cuGraphLaunch")


def clip(k: pd.DataFrame, start_ns: int | None = None, end_ns: int | None = None) -> pd.DataFrame:
    """Kernels overlapping [start_ns, end_ns), cut to it."""
    if start_ns is None and end_ns is None:
        return k
    s = -np.inf if start_ns is None else start_ns
    e = np.inf if end_ns is None else end_ns
    k = k[(k["end_ns"] > s) & (k["start_ns"] < e)].copy()
    k["start_ns"] = k["start_ns"].clip(lower=s)
    k["end_ns"] = k["end_ns"].clip(upper=e)
    k["dur_ns"] = k["end_ns"] - k["start_ns"]
    return k


def _union(starts: np.ndarray, ends: np.ndarray) -> tuple[float, np.ndarray]:
    """Total covered time of intervals (overlaps counted once) and the idle gaps between them, vectorized, with as
    few arrays of the table's length as it can (each fresh one of ten million rows costs its page faults)."""
    if starts.size == 0:
        return 0.0, np.array([])
    if starts.size > 1 and not np.all(starts[1:] >= starts[:-1]):
        o = np.argsort(starts, kind="stable")
        starts, ends = starts[o], ends[o]
    s, e = starts, ends
    if s.size > 1 and np.all(e[:-1] <= s[1:]):  # one stream's kernels, none overlapping: every gap is its own
        gaps = s[1:] - e[:-1]
        if gaps.size and gaps.min() <= 0:
            gaps = gaps[gaps > 0]
    else:
        reach = np.maximum.accumulate(e)
        gaps = s[1:] - reach[:-1]
        del reach
        gaps = gaps[gaps > 0]  # a kernel that starts after everything before it ended opens a new busy stretch
    # covered time: from the first start to the last end, less the gaps between busy stretches
    busy = float(int(e.max()) - s[0]) - float(gaps.sum())
    return busy, gaps


def busy(k: pd.DataFrame, start_ns: int | None = None, end_ns: int | None = None) -> pd.DataFrame:
    """Per device over a window (default: first kernel start to last kernel end): busy fraction (time any kernel
    ran), idle at the window's edges (lead-in, tail) and between kernels, the between-kernel gap distribution,
    kernel count, kernels per second, median kernel duration."""
    k = clip(k, start_ns, end_ns)
    rows = []
    devices = pd.unique(k["device"])
    # one device (the usual capture): use the table itself, not a per-group copy of ten million rows
    groups = [(devices[0], k)] if len(devices) == 1 else list(k.groupby("device", sort=True))
    for dev, g in sorted(groups, key=lambda x: x[0]):
        s, e = g["start_ns"].to_numpy(np.int64), g["end_ns"].to_numpy(np.int64)
        w0 = start_ns if start_ns is not None else int(s.min())
        w1 = end_ns if end_ns is not None else int(e.max())
        span = max(w1 - w0, 1)
        covered, gaps = _union(s, e)
        g50, g90 = np.percentile(gaps, [50, 90]) if gaps.size else (0.0, 0.0)
        rows.append({
            "device": dev, "window_ms": span / 1e6, "kernels": len(g), "kernels_per_s": len(g) / (span / 1e9),
            "busy_fraction": covered / span,
            # idle at the window's edges: before the first kernel and after the last, apart from the gaps between
            "lead_in_ms": max(int(s.min()) - w0, 0) / 1e6, "tail_ms": max(w1 - int(e.max()), 0) / 1e6,
            "idle_between_ms": float(gaps.sum()) / 1e6,
            "kernel_time_ms": float(g["dur_ns"].sum()) / 1e6,
            "kernel_us_p50": float(np.median(g["dur_ns"].to_numpy())) / 1e3,
            "idle_gap_us_p50": float(g50) / 1e3, "idle_gap_us_p90": float(g90) / 1e3,
            "idle_gap_us_max": float(gaps.max()) / 1e3 if gaps.size else 0.0,
            "idle_gaps": int(gaps.size),
            "graph_kernel_fraction": float(g["graph_node"].notna().mean()),
        })
    return pd.DataFrame(rows)


def busy_by_range(k: pd.DataFrame, ranges: pd.DataFrame) -> pd.DataFrame:
    """busy() over each named range (NVTX ranges, or load phases from phase_windows), one row per range and device."""
    out = [busy(k, int(r.start_ns), int(r.end_ns)).assign(range=r.text) for r in ranges.itertuples()]
    out = [o for o in out if len(o)]
    if not out:
        return pd.DataFrame(columns=["range", "device", "busy_fraction"])
    df = pd.concat(out, ignore_index=True)
    return df[["range"] + [c for c in df.columns if c != "range"]]


def phase_windows(marks: list[tuple[str, int]], origin_unix_ns: int, end_unix_ns: int | None = None) -> pd.DataFrame:
    """Load phases as ranges on a profile's timeline (text, start_ns, end_ns): each phase mark (name, unix ns) lasts
    until the next; origin_unix_ns is the timeline's zero (nsys: the session start); 'idle' marks only end one."""
    rows = []
    for i, (name, t) in enumerate(marks):
        end = marks[i + 1][1] if i + 1 < len(marks) else end_unix_ns
        if name == "idle" or end is None:
            continue
        rows.append({"text": name, "start_ns": t - origin_unix_ns, "end_ns": end - origin_unix_ns})
    return pd.DataFrame(rows, columns=["text", "start_ns", "end_ns"])


def idle_gaps(k: pd.DataFrame, device: int, start_ns: int | None = None, end_ns: int | None = None) -> np.ndarray:
    """Every idle gap (ns) between kernels of one device, for a histogram."""
    g = clip(k, start_ns, end_ns)
    g = g[g["device"] == device]
    return _union(g["start_ns"].to_numpy(np.int64), g["end_ns"].to_numpy(np.int64))[1]


def launch_overhead(runtime: pd.DataFrame, k: pd.DataFrame, start_ns: int | None = None,
                    end_ns: int | None = None) -> dict[str, float]:
    """Host time spent in launch APIs against GPU time spent in kernels over a window, and graph vs eager counts."""
    r = runtime
    if start_ns is not None or end_ns is not None:
        s = -np.inf if start_ns is None else start_ns
        e = np.inf if end_ns is None else end_ns
        r = r[(r["start_ns"] >= s) & (r["start_ns"] < e)]
    kk = clip(k, start_ns, end_ns)
    launches = r[r["name"].astype(str).isin(LAUNCH_APIS)]
    graph_launches = launches["name"].astype(str).isin(["cudaGraphLaunch", "cuGraphLaunch"])
    launch_ms = float(launches["dur_ns"].sum()) / 1e6
    kernel_ms = float(kk["dur_ns"].sum()) / 1e6
    return {"launch_api_ms": launch_ms, "kernel_ms": kernel_ms,
            "launch_to_kernel_ratio": launch_ms / kernel_ms if kernel_ms else float("nan"),
            "launch_calls": int(len(launches)), "graph_launch_calls": int(graph_launches.sum()),
            "kernels_from_graphs": int(kk["graph_node"].notna().sum()),
            "kernels_launched_eagerly": int(kk["graph_node"].isna().sum())}


def with_categories(k: pd.DataFrame) -> pd.DataFrame:
    """The kernel table with 'category' and 'moe_path' columns (as is, where it has them)."""
    if "category" in k and "moe_path" in k:
        return k
    has_op = "op" in k and k["op"].notna().any()
    cats = categorize(k["name"], k["op"] if has_op else None)
    return k.assign(category=cats["category"].values, moe_path=cats["moe_path"].values)


def categories(k: pd.DataFrame) -> pd.DataFrame:
    """GPU time, kernel count and share of kernel time per category, largest first."""
    k = k if "category" in k else with_categories(k)
    total = float(k["dur_ns"].sum()) or 1.0
    out = k.groupby("category", as_index=False).agg(kernel_ms=("dur_ns", "sum"), kernels=("dur_ns", "size"))
    out["kernel_ms"] = out["kernel_ms"] / 1e6
    out["share"] = out["kernel_ms"] * 1e6 / total
    return out.sort_values("kernel_ms", ascending=False, ignore_index=True)


def moe_path(k: pd.DataFrame) -> pd.DataFrame:
    """Which MoE implementation ran (by kernel name, or launching op), with its kernels' share of all kernel time."""
    k = k if "category" in k else with_categories(k)
    total = float(k["dur_ns"].sum()) or 1.0
    m = k[k["category"] == "moe_grouped_gemm"]
    if m.empty:
        return pd.DataFrame(columns=["moe_path", "kernel_ms", "kernels", "share", "example_kernel"])
    out = m.groupby("moe_path", as_index=False).agg(kernel_ms=("dur_ns", "sum"), kernels=("dur_ns", "size"),
                                                     example_kernel=("name", "first"))
    out["share"] = out["kernel_ms"] / total
    out["kernel_ms"] = out["kernel_ms"] / 1e6
    out["example_kernel"] = out["example_kernel"].astype(str).str.slice(0, 120)
    return out.sort_values("kernel_ms", ascending=False, ignore_index=True)[
        ["moe_path", "kernel_ms", "kernels", "share", "example_kernel"]]


def bare_name(name: str, width: int = 60) -> str:
    """A kernel's name without its template arguments and signature (its namespaces kept), at most width characters."""
    bare = name.removeprefix("void ").replace("<unnamed>::", "").strip()
    return (bare.split("<", 1)[0].split("(", 1)[0].strip() or bare)[:width]


def top_kernels(k: pd.DataFrame, n: int = 15) -> pd.DataFrame:
    """The n kernels (by name) with the most total time."""
    k = k if "category" in k else with_categories(k)
    total = float(k["dur_ns"].sum()) or 1.0
    g = k.groupby(k["name"].astype(str), as_index=False, sort=False).agg(
        kernel_ms=("dur_ns", "sum"), kernels=("dur_ns", "size"), us_p50=("dur_ns", "median"),
        category=("category", "first"), op=("op", "first"))
    g["kernel_ms"] /= 1e6
    g["us_p50"] /= 1e3
    g["share"] = g["kernel_ms"] * 1e6 / total
    return g.sort_values("kernel_ms", ascending=False, ignore_index=True).head(n)


GRAPH_LAUNCH_APIS = ("cudaGraphLaunch", "cuGraphLaunch")


def graph_use(k: pd.DataFrame, runtime: pd.DataFrame | None = None, on_share: float = 0.5) -> dict[str, Any]:
    """Whether a traced window ran CUDA graphs, from the trace alone: graph launches in the runtime table (nsys or the
    PyTorch profiler) and kernels that ran as graph nodes (nsys with node tracing). 'on' where most kernels ran from
    graphs (or, without node marks, where graph launches are at least a tenth of the launch calls), 'partly' where
    some did, 'off' where none did; '' with the reason where the trace cannot tell (no GPU kernel: a CPU engine)."""
    gpu = k[k["device"] >= 0] if "device" in k else k
    if gpu.empty:
        return {"graphs": "", "why": "no GPU kernel in the trace (a CPU engine has no CUDA graphs to see)"}
    rt = runtime if runtime is not None else pd.DataFrame(columns=["name"])
    names = rt["name"].astype(str) if len(rt) else pd.Series([], dtype=str)
    launches = names.isin(LAUNCH_APIS)
    graph_calls = int(names.isin(GRAPH_LAUNCH_APIS).sum())
    # nsys marks each kernel a graph ran (NaN: launched eagerly); the PyTorch profiler marks none
    marked = "graph_node" in gpu and (gpu["graph_node"].notna().any() or
                                      ("source" in gpu and bool((gpu["source"].astype(str) == "nsys").all())))
    node_share = float(gpu["graph_node"].notna().mean()) if "graph_node" in gpu else 0.0
    call_share = graph_calls / int(launches.sum()) if int(launches.sum()) else 0.0
    in_graphs = int(gpu["graph_node"].notna().sum()) if "graph_node" in gpu else 0
    if graph_calls == 0 and in_graphs == 0:
        state = "off"
    elif marked:
        state = "on" if node_share >= on_share else "partly"
    else:
        state = "on" if call_share >= 0.1 else "partly"
    return {"graphs": state, "graph_launches": graph_calls, "launch_calls": int(launches.sum()),
            "kernels": int(len(gpu)), "kernels_in_graphs": int(gpu["graph_node"].notna().sum()) if marked else None,
            "why": (f"{graph_calls} graph launches of {int(launches.sum())} launch calls"
                    + (f"; {node_share:.0%} of {len(gpu)} kernels ran as graph nodes" if marked else
                       "; the trace does not mark graph nodes per kernel"))}
