"""The kernel table shared by every profiler (one row per GPU kernel, or per CPU op on a CPU engine), and the
name-pattern data table that sorts kernels into categories and names the MoE path."""

from __future__ import annotations

import csv
import re
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd

# Columns every kernel table has (extra columns are allowed).
KERNEL_COLUMNS = ["name", "start_ns", "end_ns", "dur_ns", "device", "stream", "correlation", "graph_node", "op",
                  "source"]
CATEGORIES = ["attention", "moe_grouped_gemm", "dense_gemm", "communication", "elementwise_norm_activation",
              "memory_copy", "other"]


@cache
def category_table() -> pd.DataFrame:
    """The ordered pattern table (first match wins), from kernel_categories.csv beside this module."""
    with open(Path(__file__).with_name("kernel_categories.csv"), newline="") as fh:
        rows = list(csv.DictReader(fh))
    df = pd.DataFrame(rows)
    for p in df["pattern"]:
        re.compile(p)  # fail at import, not mid-analysis, on a bad pattern
    return df


def categorize(names: pd.Series, ops: pd.Series | None = None) -> pd.DataFrame:
    """Category and MoE path of each kernel, from its name (and, where a profiler gives it, its launching op).

    Patterns run once per distinct (name, op), so a million kernels of a few hundred names cost little; a
    categorical name column is never expanded into a million strings."""
    key = names if ops is None else names.astype(str) + "\x00" + ops.fillna("").astype(str)
    codes, uniq = pd.factorize(key, use_na_sentinel=False)
    text = pd.Series(np.asarray(uniq, dtype=object)).fillna("").astype(str)
    table = category_table()
    paths = sorted(set(table["moe_path"]) | {""})
    cat = np.full(len(text), CATEGORIES.index("other"), dtype=np.int16)
    path = np.full(len(text), paths.index(""), dtype=np.int16)
    done = np.zeros(len(text), dtype=bool)
    for row in table.itertuples():
        hit = ~done & text.str.contains(row.pattern, case=False, regex=True).to_numpy()
        cat[hit] = CATEGORIES.index(row.category)
        path[hit] = paths.index(row.moe_path)
        done |= hit
    return pd.DataFrame({"category": pd.Categorical.from_codes(cat[codes], categories=CATEGORIES),
                         "moe_path": pd.Categorical.from_codes(path[codes], categories=paths)}, index=names.index)


def empty_kernel_table() -> pd.DataFrame:
    """A kernel table with no rows but every column."""
    return pd.DataFrame({c: pd.Series(dtype=object if c in ("name", "op", "source") else "float64")
                         for c in KERNEL_COLUMNS})
