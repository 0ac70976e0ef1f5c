"""Serving metrics per load point, from per-request records."""

from __future__ import annotations

import numpy as np
import pandas as pd

PCTS = (50, 90, 99)


def _stats(values: pd.Series | np.ndarray, name: str) -> dict[str, float]:
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    out = {f"{name}_mean": float(v.mean()) if v.size else float("nan")}
    for p in PCTS:
        out[f"{name}_p{p}"] = float(np.percentile(v, p)) if v.size else float("nan")
    return out


def summarize(requests: pd.DataFrame, by: list[str] | None = None) -> pd.DataFrame:
    """One row per load point (grouped by `by` + concurrency): throughput and latency statistics."""
    keys = [*(by or []), "concurrency"]
    rows = []
    for key, g in requests[requests["phase"] == "measure"].groupby(keys, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        ok = g[g["status"] == "ok"]
        end = (g["start_unix"] + g["e2e_ms"].fillna(0) / 1e3).max()
        duration_s = float(end - g["start_unix"].min()) if len(g) else float("nan")
        out_tok = float(ok["output_tokens"].sum())
        in_tok = float(ok["input_tokens"].fillna(0).sum())
        tpot = (ok["e2e_ms"] - ok["ttft_ms"]) / (ok["output_tokens"] - 1).where(ok["output_tokens"] > 1)
        itl = np.concatenate([np.asarray(x, dtype=float) for x in ok["itl_ms"]]) if len(ok) else np.array([])
        row = dict(zip(keys, key, strict=True))
        row |= {
            "completed": int(len(ok)),
            "failed": int(len(g) - len(ok)),
            "duration_s": duration_s,
            "request_s": len(ok) / duration_s if duration_s > 0 else float("nan"),
            "output_tok_s": out_tok / duration_s if duration_s > 0 else float("nan"),
            "total_tok_s": (out_tok + in_tok) / duration_s if duration_s > 0 else float("nan"),
            "mean_output_tokens": float(ok["output_tokens"].mean()) if len(ok) else float("nan"),
        }
        row |= _stats(ok["ttft_ms"], "ttft_ms") | _stats(tpot, "tpot_ms") | _stats(itl, "itl_ms")
        row |= _stats(ok["e2e_ms"], "e2e_ms")
        rows.append(row)
    return pd.DataFrame(rows)
