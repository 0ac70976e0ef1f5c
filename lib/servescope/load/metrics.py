"""Serving metrics per load point, from per-request records (the same schema as imported peer benchmarks)."""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
import pandas as pd

from .health import judge_health

PCTS = (50, 90, 95, 99)
LATENCIES = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
POINT_COLS = ["point_index", "point", "mode", "concurrency", "request_rate"]


def stats(values: Any, name: str) -> dict[str, float]:
    """mean and percentiles of one latency, NaN when there are no values."""
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    out = {f"{name}_mean": float(v.mean()) if v.size else float("nan")}
    for p in PCTS:
        out[f"{name}_p{p}"] = float(np.percentile(v, p)) if v.size else float("nan")
    return out


# A request whose tokens after the first all arrived within this long of it got its output buffered: the server
# flushed a queue it had not streamed as it decoded (vLLM CPU on 2 cores: its API process starved by the engine's,
# 22-75% of one server's requests at a level; none of vLLM's or SGLang's on the H200). Its TTFT then includes the
# decoding and its TPOT measures delivery, not decoding.
BUFFERED_MS = 1.0


def buffered(df: pd.DataFrame) -> pd.Series:
    """Per request: whether its whole output after the first token arrived within BUFFERED_MS of it."""
    return (df["output_tokens"] > 1) & ((df["e2e_ms"] - df["ttft_ms"]) < BUFFERED_MS)


def per_request_tpot(df: pd.DataFrame) -> pd.Series:
    """Time per output token after the first, per request (NaN for single-token outputs)."""
    return (df["e2e_ms"] - df["ttft_ms"]) / (df["output_tokens"] - 1).where(df["output_tokens"] > 1)


def good_requests(ok: pd.DataFrame, slo_ms: dict[str, float]) -> pd.Series:
    """Which successful requests met every SLO (TTFT, TPOT, E2E thresholds in ms)."""
    good = pd.Series(True, index=ok.index)
    values = {"ttft_ms": ok["ttft_ms"], "e2e_ms": ok["e2e_ms"], "tpot_ms": per_request_tpot(ok)}
    for metric, limit in slo_ms.items():
        good &= values[metric].fillna(0) <= limit
    return good


def _rate(count: float, duration_s: float) -> float:
    return count / duration_s if duration_s > 0 else float("nan")


# a closed-loop level whose mean requests in flight over its steady window reach this share of the asked concurrency
# filled; below it the level measured a lower concurrency than its label says
FILLED = 0.9


def _steady_levels(health: pd.DataFrame | None) -> dict[Any, Any]:
    """point_index -> asked concurrency, for the levels whose load asked for steady-state figures."""
    if health is None or health.empty or "steady_state" not in health:
        return {}
    h = health[health["steady_state"].fillna(False).astype(bool)]
    asked = h["asked_concurrency"] if "asked_concurrency" in h else pd.Series(np.nan, index=h.index)
    return {int(i): (int(a) if pd.notna(a) else None) for i, a in zip(h["point_index"], asked, strict=True)}


def steady_window(g: pd.DataFrame) -> tuple[float, float] | None:
    """A closed-loop level's steady window in unix seconds: from the first request that completed (every slot had
    started and the first wave has broken up) to the last request sent (after it, requests in flight only fall);
    None where there is no such window (one wave)."""
    if g.empty:
        return None
    ends = g["start_unix"] + g["e2e_ms"] / 1e3
    w0, w1 = float(ends.min()), float(g["start_unix"].max())
    return (w0, w1) if w1 > w0 else None


def _overlap(a0: pd.Series, a1: pd.Series, w0: float, w1: float) -> pd.Series:
    return (np.minimum(a1, w1) - np.maximum(a0, w0)).clip(lower=0)


def _level_figures(g: pd.DataFrame, ok: pd.DataFrame) -> dict[str, Any]:
    """Rates over the whole level, from its first send to its last answer (ramp and drain in)."""
    end = (g["start_unix"] + g["e2e_ms"].fillna(0) / 1e3).max()
    duration_s = float(end - g["start_unix"].min()) if len(g) else float("nan")
    out_tok = float(ok["output_tokens"].sum())
    in_tok = float(ok["input_tokens"].fillna(0).sum())
    per_s = partial(_rate, duration_s=duration_s)
    return {"completed": int(len(ok)), "failed": int(len(g) - len(ok)), "duration_s": duration_s,
            "request_s": per_s(len(ok)), "input_tok_s": per_s(in_tok), "output_tok_s": per_s(out_tok),
            "total_tok_s": per_s(out_tok + in_tok),
            "achieved_concurrency": float(ok["e2e_ms"].sum() / 1e3 / duration_s) if duration_s > 0 else float("nan")}


def _window_figures(g: pd.DataFrame, w0: float, w1: float) -> dict[str, Any]:
    """Rates over the steady window: output tokens delivered in it (each request's tokens after its first spread
    evenly over its decode), prefills finished in it, requests completed in it, and the mean requests in flight."""
    span = w1 - w0
    ok = g[g["status"] == "ok"]
    first = ok["start_unix"] + ok["ttft_ms"].fillna(0) / 1e3
    end = ok["start_unix"] + ok["e2e_ms"] / 1e3
    first_in = (first >= w0) & (first <= w1)
    decode_s = (end - first)
    rest = (ok["output_tokens"] - 1).clip(lower=0)
    share = (_overlap(first, end, w0, w1) / decode_s.where(decode_s > 0)).fillna(((end >= w0) & (end <= w1)) * 1.0)
    out_tok = float(first_in.sum() + (rest * share).sum())
    in_tok = float(ok.loc[first_in, "input_tokens"].fillna(0).sum())
    done = int(((end >= w0) & (end <= w1)).sum())
    g_end = g["start_unix"] + g["e2e_ms"].fillna(0) / 1e3
    inflight = float(_overlap(g["start_unix"], g_end, w0, w1).sum() / span)
    t0 = float(g["start_unix"].min())
    started = g[(g["start_unix"] >= w0) & (g["start_unix"] <= w1)]
    return {"completed": int((started["status"] == "ok").sum()), "failed": int((started["status"] != "ok").sum()),
            "duration_s": span, "request_s": done / span, "input_tok_s": in_tok / span, "output_tok_s": out_tok / span,
            "total_tok_s": (in_tok + out_tok) / span, "achieved_concurrency": inflight,
            "figures_over": "steady window", "steady_window_s": span, "steady_from_s": w0 - t0,
            "steady_to_s": w1 - t0, "level_s": float(g_end.max() - t0), "_started": started}


def slo_words(slo_ms: dict[str, float]) -> str:
    """An SLO as the pages say it: 'ttft_ms<=2000, tpot_ms<=50'."""
    return ", ".join(f"{k}<={v:g}" for k, v in slo_ms.items())


GOODPUT_COLUMNS = ("good_requests", "goodput_req_s", "slo")  # what an SLO adds to a level's row


def summarize(requests: pd.DataFrame, health: pd.DataFrame | None = None,
              slo_ms: dict[str, float] | None = None, by: list[str] | None = None) -> pd.DataFrame:
    """One row per load point: counts, throughputs, latency statistics, goodput, and the client's health."""
    if requests.empty:
        return pd.DataFrame()
    keys = [*(by or []), *[c for c in POINT_COLS if c in requests.columns]]
    m = requests[requests["phase"] == "measure"]
    steady = _steady_levels(health)
    rows = []
    for key, g in m.groupby(keys, sort=True, dropna=False):
        row = dict(zip(keys, key, strict=True))
        asked = steady.get(row.get("point_index"))
        window = steady_window(g) if asked is not None else None
        if window is not None:
            row |= _window_figures(g, *window)
            g = row.pop("_started")  # latencies of the requests that started in the steady window
            ok = g[g["status"] == "ok"]
        else:
            ok = g[g["status"] == "ok"]
            row |= _level_figures(g, ok)
            if asked is not None:
                row |= {"figures_over": "whole level: no steady window (no request completed before the last was "
                                        "sent: one wave)", "steady_window_s": 0.0}
        if asked is not None:
            c = asked or row.get("concurrency")
            fill = row["achieved_concurrency"] / c if c else float("nan")
            row |= {"asked_concurrency": c, "fill_pct": 100 * fill, "filled": bool(fill >= FILLED)}
        # a reader judging goodput again reads the requests without their per-token gaps (the bulk of the table)
        itl = np.concatenate([np.asarray(x, dtype=float) for x in ok["itl_ms"]]) if len(ok) and "itl_ms" in ok \
            else np.array([])
        per_s = partial(_rate, duration_s=row["duration_s"])
        row |= {
            "mean_input_tokens": float(ok["input_tokens"].mean()) if len(ok) else float("nan"),
            "mean_output_tokens": float(ok["output_tokens"].mean()) if len(ok) else float("nan"),
        }
        if "expected_output_tokens" in ok:
            row["short_outputs"] = int((ok["output_tokens"] < ok["expected_output_tokens"]).sum())
        row |= stats(ok["ttft_ms"], "ttft_ms") | stats(per_request_tpot(ok), "tpot_ms") | stats(itl, "itl_ms")
        row |= stats(ok["e2e_ms"], "e2e_ms")
        if slo_ms:
            good = int(good_requests(ok, slo_ms).sum())
            row |= {"good_requests": good, "goodput_req_s": per_s(good),
                    "slo": slo_words(slo_ms)}
        rows.append(row)
    out = pd.DataFrame(rows)
    if health is not None and not health.empty and "point_index" in out:
        raw = health[[c for c in health.columns if c not in ("point", "client_limited", "client_starved",
                                                              "client_warning", "asked_concurrency")]]
        judged = pd.DataFrame([r | judge_health(r) for r in raw.to_dict("records")])
        out = out.merge(judged, on="point_index", how="left")
    out["source"] = "servescope"
    return out


def rejudge(summary: pd.DataFrame) -> pd.DataFrame:
    """Apply the current client-health rules to a stored summary's raw client readings."""
    if summary.empty or "client_cpu_pct" not in summary:
        return summary
    judged = pd.DataFrame([judge_health(r) for r in summary.to_dict("records")], index=summary.index)
    return summary.assign(**{c: judged[c] for c in judged.columns})
