"""Telemetry of a whole experiment turned into per-point tables, one row per configuration, repetition and point."""

from __future__ import annotations

import pandas as pd

from .derive import StallThresholds, energy_per_token, gpu_by_point, host_by_point, metrics_by_point

KEY_METRICS = (
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:generation_tokens_total", "vllm:num_preemptions_total",
    "sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:gen_throughput",
    "sglang:cuda_graph_passes_total", "sglang:is_cuda_graph", "sglang:utilization",
)
IDS = ["config", "rep"]


def _by_run(frame: pd.DataFrame) -> list[tuple[tuple, pd.DataFrame]]:
    if frame.empty:
        return []
    keys = [k for k in IDS if k in frame]
    return [((k if isinstance(k, tuple) else (k,)), g) for k, g in frame.groupby(keys, sort=False)] if keys \
        else [((), frame)]


def _measured(df: pd.DataFrame) -> pd.DataFrame:
    return df[~df["phase"].str.startswith(("warmup:", "idle"))] if not df.empty else df


def gpu_points(tele: dict[str, pd.DataFrame], summary: pd.DataFrame,
               th: StallThresholds | None = None) -> pd.DataFrame:
    """GPU medians, headroom, reason shares, energy per output token and the stall verdict per point."""
    out = []
    for key, g in _by_run(tele.get("gpu", pd.DataFrame())):
        static = tele.get("gpu_static", pd.DataFrame())
        ids = dict(zip(IDS, key, strict=False))
        if not static.empty:
            for k, v in ids.items():
                static = static[static[k] == v]
        pts = gpu_by_point(_measured(g), static, th or StallThresholds())
        if pts.empty:
            continue
        s = summary
        for k, v in ids.items():
            s = s[s[k] == v] if k in s else s
        ept = energy_per_token(pts, s)
        if not ept.empty:
            pts = pts.merge(ept[["point", "energy_per_output_token_j"]], left_on="phase", right_on="point",
                            how="left").drop(columns="point")
        out.append(pts.assign(**ids))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


def host_points(tele: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The server tree's CPU and its busiest thread per point."""
    out = []
    procs, threads = tele.get("server_procs", pd.DataFrame()), tele.get("server_threads", pd.DataFrame())
    for key, p in _by_run(procs):
        ids = dict(zip(IDS, key, strict=False))
        t = threads
        for k, v in ids.items():
            t = t[t[k] == v] if k in t else t
        h = host_by_point(_measured(p), _measured(t) if not t.empty else t)
        out.append(h.assign(**ids))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


def metric_points(tele: dict[str, pd.DataFrame], names: tuple[str, ...] = KEY_METRICS) -> pd.DataFrame:
    """The engine's own metrics per point: gauges as medians, counters as rates."""
    out = []
    for key, m in _by_run(tele.get("server_metrics", pd.DataFrame())):
        m = _measured(m)
        m = m[m["metric"].str.replace(r"_(total|count|sum)$", "", regex=True).isin(
            [n.removesuffix("_total") for n in names]) | m["metric"].isin(names)]
        d = metrics_by_point(m)
        out.append(d.assign(**dict(zip(IDS, key, strict=False))))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()
