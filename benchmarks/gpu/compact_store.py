"""Shrink a recorded store so the working tree still leaves room for the wheels in a device call (64 MiB in all):
request tables rewritten with inter-token gaps at 0.1 us (as the load client now records them; the digits below are
the event loop's jitter) and zstd. Nothing else changes: keys, manifests and every other table stay as recorded.

    .venv/bin/python benchmarks/gpu/compact_store.py data/reference/sglang-h200/store
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pandas as pd

from servescope.load.client import ITL_DECIMALS


def compact(store: Path) -> tuple[int, int]:
    """Rewrite every requests.parquet under store; (bytes before, bytes after)."""
    before = after = 0
    for f in sorted(store.rglob("requests.parquet")):
        before += f.stat().st_size
        df = pd.read_parquet(f)
        if "itl_ms" in df:
            df["itl_ms"] = [None if v is None else [round(float(x), ITL_DECIMALS) for x in v] for v in df["itl_ms"]]
        tmp = f.with_name(".requests.parquet.tmp")
        df.to_parquet(tmp, index=False, compression="zstd")
        os.replace(tmp, f)
        after += f.stat().st_size
    return before, after


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        b, a = compact(Path(arg))
        print(f"{arg}: request tables {b / 2**20:.1f} MiB -> {a / 2**20:.1f} MiB")
