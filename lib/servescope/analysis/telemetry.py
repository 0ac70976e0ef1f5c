"""Per load point: medians of the GPU readings (NVML, GPM where the GPU has it, or the DCGM exporter's fields),
energy per output token, clock and power headroom, throttle reason shares; the server tree's CPU and the engine's
own metrics. The regime of each point is decided from these in analysis.regime."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd

from ..telemetry.base import measured
from ..telemetry.nvml import GPM_METRICS, REASONS
from ..util import known

GPM_COLUMNS = tuple(GPM_METRICS)
# the DCGM exporter's profiling fields (ratios 0..1) and device fields, as the GPM / NVML columns they stand for
DCGM_FIELDS = {"DCGM_FI_PROF_SM_ACTIVE": ("sm_active_pct", 100.0), "DCGM_FI_PROF_SM_OCCUPANCY":
               ("sm_occupancy_pct", 100.0), "DCGM_FI_PROF_DRAM_ACTIVE": ("dram_bw_util_pct", 100.0),
               "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("tensor_active_pct", 100.0),
               "DCGM_FI_DEV_GPU_UTIL": ("gpu_util_pct", 1.0), "DCGM_FI_DEV_MEM_COPY_UTIL": ("mem_util_pct", 1.0),
               "DCGM_FI_DEV_POWER_USAGE": ("power_w", 1.0), "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_mhz", 1.0)}


def _median(g: pd.DataFrame, col: str) -> float:
    return float(g[col].median()) if col in g and g[col].notna().any() else float("nan")


def dcgm_by_point(dcgm: pd.DataFrame) -> pd.DataFrame:
    """One row per (phase, GPU) from the DCGM exporter's series, in the columns gpu_by_point uses (…_p50), so a
    remote GPU without NVML here still gets SM activity, DRAM bandwidth and tensor activity."""
    if dcgm.empty:
        return pd.DataFrame()
    d = dcgm[dcgm["metric"].isin(DCGM_FIELDS)].copy()
    if d.empty:
        return pd.DataFrame()
    d["gpu"] = d["labels"].map(lambda s: int(json.loads(s).get("gpu", 0)) if s else 0)
    d["column"] = d["metric"].map(lambda m: DCGM_FIELDS[m][0])
    d["value"] = d["value"] * d["metric"].map(lambda m: DCGM_FIELDS[m][1])
    med = d.groupby(["phase", "gpu", "column"])["value"].median().unstack("column")
    med.columns = [f"{c}_p50" for c in med.columns]
    out = med.reset_index()
    out["source"] = "dcgm"
    return out

def _energy_j(g: pd.DataFrame, next_reading: float = float("nan")) -> float:
    """Energy over the window from the GPU's own counter: from the phase's first reading to the next phase's first
    reading when there is one, else to its last reading plus power integrated over the rest of the window.
    Power integrated over the whole window where the counter is absent, instantaneous power where the GPU gives
    it: nvmlDeviceGetPowerUsage is a 1 s average on H200 and lags every change (seen on the H200 recordings)."""
    col = "power_instant_w" if "power_instant_w" in g and g["power_instant_w"].notna().any() else "power_w"
    p = g[["time_unix", col]].dropna().rename(columns={col: "power_w"})
    e = g[["time_unix", "energy_j"]].dropna() if "energy_j" in g else pd.DataFrame()
    if len(e) and not np.isnan(next_reading) and next_reading >= e["energy_j"].iloc[0]:
        return float(next_reading - e["energy_j"].iloc[0])
    if len(e) >= 1:
        tail = p[p["time_unix"] >= e["time_unix"].iloc[-1]]
        rest = float(np.trapezoid(tail["power_w"], tail["time_unix"])) if len(tail) >= 2 else 0.0
        return float(e["energy_j"].iloc[-1] - e["energy_j"].iloc[0]) + rest
    if len(p) < 2:
        return float("nan")
    return float(np.trapezoid(p["power_w"], p["time_unix"]))


def gpu_by_point(gpu: pd.DataFrame, static: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (phase, GPU): medians (GPM ones included), headroom, reason shares and energy."""
    if gpu.empty:
        return pd.DataFrame()
    smax = {}
    if static is not None and not static.empty:
        smax = static.set_index("gpu")["sm_clock_max_mhz"].to_dict()
    rows = []
    gpu = gpu.sort_values("time_unix")
    # the counter read on the first tick of each phase closes the previous phase's window
    firsts = {}
    if "energy_j" in gpu:
        for idx, gg in gpu.groupby("gpu"):
            change = gg["phase"].ne(gg["phase"].shift())
            starts = gg[change]
            firsts[idx] = list(zip(starts["phase"], starts["energy_j"], strict=True))
    for (phase, idx), g in gpu.groupby(["phase", "gpu"], sort=False):
        seq = firsts.get(idx, [])
        nxt = float("nan")
        for i, (ph, _) in enumerate(seq[:-1]):
            if ph == phase:
                nxt = seq[i + 1][1]

        masks = g["clock_event_mask"].dropna().astype(int) if "clock_event_mask" in g else pd.Series(dtype=int)
        shares = {name: float(((masks & bit) > 0).mean()) if len(masks) else float("nan")
                  for bit, name in REASONS.items()}
        limit = float(g["power_limit_w"].median())
        power = float(g["power_w"].median())
        clock = float(g["sm_clock_mhz"].median())
        clock_max = float(smax.get(idx, np.nan))
        power_pct = 100 * power / limit if limit else float("nan")
        clock_pct = 100 * clock / clock_max if clock_max else float("nan")
        util = float(g["gpu_util_pct"].median())
        rows.append({
            "phase": phase, "gpu": idx, "samples": len(g),
            "duration_s": float(g["time_unix"].iloc[-1] - g["time_unix"].iloc[0]),
            "power_w_p50": power, "power_w_max": float(g["power_w"].max()), "power_limit_w": limit,
            "power_pct_of_limit_p50": power_pct, "sm_clock_mhz_p50": clock, "sm_clock_max_mhz": clock_max,
            "sm_clock_pct_of_max_p50": clock_pct, "gpu_util_pct_p50": util,
            "mem_util_pct_p50": float(g["mem_util_pct"].median()), "temp_c_max": float(g["temp_c"].max()),
            "pstate_p50": float(g["pstate"].median()), "mem_used_mib_max": float(g["mem_used_mib"].max()),
            "pcie_tx_mb_s_p50": float(g["pcie_tx_mb_s"].median()) if "pcie_tx_mb_s" in g else float("nan"),
            "pcie_rx_mb_s_p50": float(g["pcie_rx_mb_s"].median()) if "pcie_rx_mb_s" in g else float("nan"),
            "energy_j": _energy_j(g, nxt),
            **{f"{m}_p50": _median(g, m) for m in GPM_COLUMNS},
            **{f"reason_{k}_share": v for k, v in shares.items()},
        })
    return pd.DataFrame(rows)


def energy_per_token(gpu_points: pd.DataFrame, load_summary: pd.DataFrame) -> pd.DataFrame:
    """Joules per output token for each load point: energy of every GPU over the point / tokens it produced."""
    if gpu_points.empty or load_summary.empty:
        return pd.DataFrame()
    e = gpu_points.groupby("phase", as_index=False)["energy_j"].sum()
    s = load_summary[["point", "output_tok_s", "duration_s"]].copy()
    s["output_tokens"] = s["output_tok_s"] * s["duration_s"]
    out = s.merge(e, left_on="point", right_on="phase", how="inner").drop(columns="phase")
    out["energy_per_output_token_j"] = out["energy_j"] / out["output_tokens"]
    return out


def host_by_point(procs: pd.DataFrame, threads: pd.DataFrame) -> pd.DataFrame:
    """Per phase: the server tree's CPU (sum over its processes), its RSS, and its busiest thread."""
    if procs.empty:
        return pd.DataFrame()
    tree = procs.groupby(["phase", "time_unix"], as_index=False).agg(cpu_pct=("cpu_pct", "sum"),
                                                                      rss_mib=("rss_mib", "sum"))
    out = tree.groupby("phase").agg(server_cpu_pct_p50=("cpu_pct", "median"), server_cpu_pct_max=("cpu_pct", "max"),
                                    server_rss_mib_max=("rss_mib", "max")).reset_index()
    if not threads.empty:
        med = threads.groupby(["phase", "process", "thread", "tid"], as_index=False)["cpu_pct"].median()
        top = med.sort_values("cpu_pct").groupby("phase").tail(1)
        top = top.rename(columns={"cpu_pct": "busiest_thread_cpu_pct_p50", "thread": "busiest_thread",
                                  "process": "busiest_thread_process"})[
            ["phase", "busiest_thread", "busiest_thread_process", "busiest_thread_cpu_pct_p50"]]
        out = out.merge(top, on="phase", how="left")
    return out


def metrics_by_point(metrics: pd.DataFrame) -> pd.DataFrame:
    """Per phase and series: counters (…_total, _count, _sum) as a rate over the phase, gauges as their median."""
    if metrics.empty:
        return pd.DataFrame()
    rows: list[dict[str, Any]] = []
    for (phase, metric, labels), g in metrics.sort_values("time_unix").groupby(["phase", "metric", "labels"]):
        counter = metric.endswith(("_total", "_count", "_sum"))
        if counter:
            dt = g["time_unix"].iloc[-1] - g["time_unix"].iloc[0]
            value = (g["value"].iloc[-1] - g["value"].iloc[0]) / dt if dt > 0 else float("nan")
        else:
            value = float(g["value"].median())
        rows.append({"phase": phase, "metric": metric, "labels": labels, "stat": "rate_per_s" if counter else "median",
                     "value": value, "samples": len(g)})
    return pd.DataFrame(rows)


def label_value(labels: str, key: str) -> str:
    """One label out of the JSON labels column."""
    return json.loads(labels).get(key, "")


# -- per-point tables over every point of a run (what notebooks show) ----------------------------------------
IDS = ["config", "rep"]


def _by_run(frame: pd.DataFrame) -> list[tuple[tuple, pd.DataFrame]]:
    if frame.empty:
        return []
    keys = [k for k in IDS if k in frame]
    return [((k if isinstance(k, tuple) else (k,)), g) for k, g in frame.groupby(keys, sort=False)] if keys \
        else [((), frame)]


def _measured(df: pd.DataFrame) -> pd.DataFrame:
    return measured(df)


def gpu_points(tele: dict[str, pd.DataFrame], summary: pd.DataFrame) -> pd.DataFrame:
    """GPU medians, headroom, reason shares and energy per output token per point (NVML; the DCGM exporter's
    fields fill SM activity, DRAM bandwidth and tensor activity where NVML has none)."""
    out = []
    for key, g in _by_run(tele.get("gpu", pd.DataFrame())):
        static = tele.get("gpu_static", pd.DataFrame())
        ids = dict(zip(IDS, key, strict=False))
        if not static.empty:
            for k, v in ids.items():
                static = static[static[k] == v]
        pts = gpu_by_point(_measured(g), static)
        if pts.empty:
            continue
        s = summary
        for k, v in ids.items():
            s = s[s[k] == v] if k in s else s
        ept = energy_per_token(pts, s)
        if not ept.empty:
            pts = pts.merge(ept[["point", "energy_per_output_token_j"]], left_on="phase", right_on="point",
                            how="left").drop(columns="point")
        out.append(pts.assign(**ids, source="nvml"))
    nvml = pd.concat(out, ignore_index=True) if out else pd.DataFrame()
    dcgm = [dcgm_by_point(_measured(d)).assign(**dict(zip(IDS, key, strict=False)))
            for key, d in _by_run(tele.get("dcgm", pd.DataFrame()))]
    dcgm = [d for d in dcgm if "phase" in d]
    if not dcgm:
        return nvml
    d = pd.concat(dcgm, ignore_index=True)
    if nvml.empty:
        return d
    keys = [c for c in ["phase", "gpu", *IDS] if c in nvml and c in d]
    merged = nvml.set_index(keys)
    fill = d.set_index(keys).drop(columns="source")
    merged = merged.combine_first(fill[[c for c in fill.columns if c in merged.columns or c.endswith("_p50")]])
    return merged.reset_index()


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


def metric_points(tele: dict[str, pd.DataFrame], names: tuple[str, ...]) -> pd.DataFrame:
    """The engine's own metrics per point (those named: the adapter's key_metrics), gauges as medians, counters as
    rates."""
    out = []
    for key, m in _by_run(tele.get("server_metrics", pd.DataFrame())):
        m = _measured(m)
        m = m[m["metric"].str.replace(r"_(total|count|sum)$", "", regex=True).isin(
            [n.removesuffix("_total") for n in names]) | m["metric"].isin(names)]
        d = metrics_by_point(m)
        out.append(d.assign(**dict(zip(IDS, key, strict=False))))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


# -- the engine's own counters beside the GPU's ----------------------------------------------------------------
# what the engine says of a level where it disagrees with NVML or the load: thresholds, named
QUEUED_SHARE = 0.9  # the engine ran fewer than this share of the requests the client kept in flight
KV_FULL_PCT = 90.0  # its KV cache at least this full
BUSY_UTIL_PCT, IDLE_SM_PCT = 90.0, 50.0  # NVML "utilization" this high while GPM SM activity stays below this
COUNT_GAP = 0.2  # the engine's token rate and the client's differ by more than this share
OCCUPANCY_GAP_PCT = 25.0  # the engine's own forward-pass occupancy and NVML's utilization differ by more points
# scrapes of a counter within a level (its steady window, where the load has one) before its rate is read: at 1 Hz a
# 3 s level's rate, ramp and drain in, read 27% off the client's, a 0.2 s level's had one scrape; five scrapes of a
# steady window give that window's own rate
MIN_RATE_SAMPLES = 5


def engine_counters(tele: dict[str, pd.DataFrame], counters: dict[str, tuple[Any, ...]]) -> pd.DataFrame:
    """Per configuration, repetition and level: the engine's own counters under engine-neutral names (counters: name
    -> (its Prometheus series, 'median' or 'rate_per_s', a scale[, text its labels must hold]), the adapter's),
    labelled series summed; graph_pass_pct where it gives passes in graphs and in all."""
    out = []
    wanted = {c[0] for c in counters.values()}
    for key, m in _by_run(tele.get("server_metrics", pd.DataFrame())):
        m = _measured(m)
        d = metrics_by_point(m[m["metric"].isin(wanted)])
        if d.empty:
            continue
        row_of: dict[str, dict[str, Any]] = {}
        for name, (metric, stat, scale, *only) in counters.items():
            got = d[(d["metric"] == metric) & (d["stat"] == stat)]
            if stat == "rate_per_s":  # a counter read at fewer points than this over a level gives no rate
                got = got[got["samples"] >= MIN_RATE_SAMPLES]
            if only:
                got = got[got["labels"].str.contains(only[0], regex=False)]
            for phase, g in got.groupby("phase"):
                row_of.setdefault(phase, {})[name] = float(g["value"].sum()) * scale
        for vals in row_of.values():
            if vals.get("passes_per_s"):
                vals["graph_pass_pct"] = 100.0 * vals.get("graph_passes_per_s", 0.0) / vals["passes_per_s"]
        out += [{**dict(zip(IDS, key, strict=False)), "point": ph, **vals} for ph, vals in row_of.items()]
    return pd.DataFrame(out)


def engine_beside_gpu(engine: pd.DataFrame, gpu: pd.DataFrame, summary: pd.DataFrame,
                      replicas: dict[str, int] | None = None) -> pd.DataFrame:
    """The engine's counters per level beside NVML's and the client's readings, with what they disagree on said in
    words (QUEUED_SHARE, KV_FULL_PCT, BUSY_UTIL_PCT/IDLE_SM_PCT, OCCUPANCY_GAP_PCT, COUNT_GAP). replicas: configurations served by
    several servers, whose counters are the first replica's alone (said, and not compared with the client's)."""
    if engine.empty:
        return engine
    several = {c: n for c, n in (replicas or {}).items() if n > 1}
    g = gpu.rename(columns={"phase": "point"}) if len(gpu) else pd.DataFrame(columns=["config", "rep", "point"])
    g = g.groupby(["config", "rep", "point"], as_index=False)[[c for c in ("gpu_util_pct_p50", "sm_active_pct_p50",
                                                                          "power_pct_of_limit_p50") if c in g]].mean()
    cols = [c for c in ("config", "rep", "point", "concurrency", "output_tok_s") if c in summary]
    out = engine.merge(g, on=["config", "rep", "point"], how="left")
    if len(summary):
        out = out.merge(summary[cols].rename(columns={"output_tok_s": "client_output_tok_s"}),
                        on=["config", "rep", "point"], how="left")
    out["said"] = [f"counters of replica 0 of {several[r['config']]} only" if r["config"] in several
                   else disagreements(r) for r in out.to_dict("records")]
    return out


def disagreements(r: dict[str, Any]) -> str:
    """What a level's engine counters and NVML's and the client's readings disagree on, in words ('' for nothing)."""
    said = []
    c, run, q = r.get("concurrency"), r.get("running"), r.get("queued")
    if known(c) and known(run) and run < QUEUED_SHARE * c and known(q) and q >= 1:
        said.append(f"the engine ran {run:.0f} of the {c:.0f} requests in flight and queued {q:.0f}: a cap (its KV "
                    "cache or running limit) held the batch below the load")
    if known(r.get("kv_used_pct")) and r["kv_used_pct"] >= KV_FULL_PCT:
        said.append(f"KV cache {r['kv_used_pct']:.0f}% full")
    u, sm = r.get("gpu_util_pct_p50"), r.get("sm_active_pct_p50")
    if known(u) and known(sm) and u >= BUSY_UTIL_PCT and sm < IDLE_SM_PCT:
        said.append(f"NVML reads the GPU {u:.0f}% utilized while its SMs were active {sm:.0f}% of the time (GPM): "
                    "a kernel was running, not the whole GPU")
    occ = r.get("fwd_occupancy_pct")
    if known(occ) and known(u) and abs(u - occ) > OCCUPANCY_GAP_PCT:
        said.append(f"the engine's own timer has its forward passes on the GPU {occ:.0f}% of the time, NVML reads "
                    f"it {u:.0f}% utilized" + (": the rest is time between passes (scheduling, sampling, the host)"
                                               if occ < u else ""))
    e, cl = r.get("engine_gen_tok_s"), r.get("client_output_tok_s")
    if known(e) and known(cl) and cl > 0 and abs(e - cl) / cl > COUNT_GAP:
        said.append(f"the engine counts {e:,.0f} generated tok/s, the client {cl:,.0f}")
    return "; ".join(said)
