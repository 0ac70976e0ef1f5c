"""PyTorch profiler Chrome traces (.json or .json.gz) into the kernel table, streamed with ijson so a trace of
hundreds of MB never sits in memory as one JSON document.

GPU kernels and memory copies become rows; each is linked to the CPU op that launched it through the trace's
'External id', so a kernel carries its op (e.g. aten::_grouped_mm). A trace with no GPU work (a CPU engine)
yields its top-level CPU ops instead, with device -1, so the same analysis applies."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import IO, Any

import ijson
import numpy as np
import pandas as pd

from ..analysis.kernel_table import KERNEL_COLUMNS
from ..errors import ProfilingUnavailable

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
# CPU ops that only wrap others (a torch.compile'd graph's call, its guard bytecode): on a CPU build the ops inside
# them did the work, so they are read through rather than counted as one opaque op
WRAPPER_OPS = r"^(## Call CompiledFxGraph|Torch-Compiled Region|Pregraph bytecode|CompiledFunction|## )"
KEEP_CATS = GPU_CATS | {"cpu_op", "cuda_runtime", "cuda_driver", "user_annotation", "gpu_user_annotation"}


def _open(path: Path) -> IO[bytes]:
    return gzip.open(path, "rb") if str(path).endswith(".gz") else open(path, "rb")


def read_events(path: str | Path) -> pd.DataFrame:
    """The trace's duration events of interest: cat, name, ts_us, dur_us, pid, tid, external_id, correlation,
    device, stream."""
    rows: list[tuple[Any, ...]] = []
    seen = 0
    p = Path(path)
    try:
        with _open(p) as fh:
            for ev in ijson.items(fh, "traceEvents.item", use_float=True):
                seen += 1
                cat = ev.get("cat")
                if cat not in KEEP_CATS or ev.get("ph") != "X":
                    continue
                a = ev.get("args") or {}
                rows.append((cat, ev.get("name", ""), ev.get("ts", np.nan), ev.get("dur", np.nan), ev.get("pid"),
                             ev.get("tid"), a.get("External id"), a.get("correlation"), a.get("device"),
                             a.get("stream")))
    except (ijson.JSONError, ijson.IncompleteJSONError, OSError, EOFError, UnicodeDecodeError) as e:
        raw = e.args[0] if e.args else ""
        raw = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
        first = (raw.strip().splitlines() or [type(e).__name__])[0][:80]
        raise ProfilingUnavailable(f"{p.name} is not a readable PyTorch profiler trace (truncated, empty or not "
                                   f"JSON: {first})") from None
    if not seen:
        raise ProfilingUnavailable(f"{p.name} is not a PyTorch profiler trace: it has no traceEvents")
    return pd.DataFrame(rows, columns=["cat", "name", "ts_us", "dur_us", "pid", "tid", "external_id", "correlation",
                                       "device", "stream"])


def kernels_from_events(ev: pd.DataFrame) -> pd.DataFrame:
    """Kernel table from trace events (times in ns, relative to the trace's first event)."""
    if ev.empty:
        return pd.DataFrame(columns=KERNEL_COLUMNS)
    t0 = ev["ts_us"].min()
    gpu = ev[ev["cat"].isin(GPU_CATS)]
    cpu_ops = ev[ev["cat"] == "cpu_op"]
    if gpu.empty:
        # CPU engine: the ops that did the work are the CPU ops not nested in another op of the same thread
        # (compiled-graph wrappers aside)
        ops = cpu_ops[~cpu_ops["name"].astype(str).str.match(WRAPPER_OPS)].sort_values(["pid", "tid", "ts_us"])
        end = ops["ts_us"] + ops["dur_us"]
        outer_end = end.groupby([ops["pid"], ops["tid"]]).cummax().groupby([ops["pid"], ops["tid"]]).shift()
        top = ops[~(ops["ts_us"] < outer_end)]
        out = pd.DataFrame({"name": top["name"].values, "device": -1, "stream": top["tid"].values,
                            "correlation": top["external_id"].values, "op": top["name"].values})
        start = ((top["ts_us"] - t0) * 1e3).round().astype(np.int64).values
        dur = (top["dur_us"] * 1e3).round().astype(np.int64).values
    else:
        by_ext = cpu_ops.dropna(subset=["external_id"]).drop_duplicates("external_id", keep="last")
        op = gpu["external_id"].map(by_ext.set_index("external_id")["name"])
        out = pd.DataFrame({"name": gpu["name"].values, "device": gpu["device"].values, "stream": gpu["stream"].values,
                            "correlation": gpu["correlation"].values, "op": op.values})
        start = ((gpu["ts_us"] - t0) * 1e3).round().astype(np.int64).values
        dur = (gpu["dur_us"] * 1e3).round().astype(np.int64).values
    out["start_ns"] = start
    out["dur_ns"] = dur
    out["end_ns"] = start + dur
    out["graph_node"] = np.nan  # the PyTorch profiler does not mark graph replays per kernel
    out["source"] = "torch"
    return out.sort_values("start_ns", ignore_index=True)[KERNEL_COLUMNS]


def runtime_from_events(ev: pd.DataFrame) -> pd.DataFrame:
    """CUDA runtime/driver calls in the runtime-table schema of nsys.read_runtime."""
    rt = ev[ev["cat"].isin(["cuda_runtime", "cuda_driver"])]
    t0 = ev["ts_us"].min() if len(ev) else 0.0
    start = ((rt["ts_us"] - t0) * 1e3).round().astype(np.int64)
    dur = (rt["dur_us"] * 1e3).round().astype(np.int64)
    return pd.DataFrame({"name": rt["name"].values, "start_ns": start.values, "end_ns": (start + dur).values,
                         "dur_ns": dur.values, "correlation": rt["correlation"].values, "tid": rt["tid"].values})


def read_kernels(path: str | Path) -> pd.DataFrame:
    """Kernel table of a PyTorch profiler trace."""
    return kernels_from_events(read_events(path))
