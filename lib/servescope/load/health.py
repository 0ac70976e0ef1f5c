"""Whether the load client, not the server, set a point's figures: its own CPU, its event-loop lag, and the arrival
rate it achieved, judged by named thresholds (kept apart from the readings, so stored points are judged by the
current rules)."""

from __future__ import annotations

import math
from typing import Any

# When the client, not the server, may have limited a measurement (named so reports can quote them).
CLIENT_CPU_LIMIT_PCT = 90.0  # of one core
LOOP_LAG_LIMIT_MS = 10.0  # p99 event-loop lag
RATE_SHORTFALL = 0.95  # achieved / requested arrival rate, open loop without a cap (only where send lags are absent)
# An open-loop client keeps its schedule when it sends each request close to its drawn arrival time: behind it by
# this much (p99), or half the mean gap between arrivals where that is longer, it could not keep the rate. The
# achieved rate alone cannot say: over a short point the drawn arrivals themselves stray from the mean (8 Poisson
# arrivals at 2 req/s gave 1.63 req/s on the H200 with the client on time).
SEND_LAG_LIMIT_MS = 50.0
# A server that sends nothing for this long while requests are in flight is hung (measured phases); the limit grows
# with a slow engine's step (HANG_STEPS x the level's warm-up p99 inter-token gap) and is longer in warm-ups, where
# an engine may compile a new shape.
HANG_S = 30.0
HANG_STEPS = 50
HANG_WARMUP_S = 120.0


def hang_limit_s(phase: str, warmup_itl_ms_p99: float = float("nan"), override: float | None = None) -> float:
    """Seconds without a token (requests in flight) after which a level is declared hung: the load's own hang_s
    where it sets one, else HANG_WARMUP_S in warm-ups and max(HANG_S, HANG_STEPS x the warm-up's p99 gap)."""
    if override is not None:
        return override
    if phase == "warmup":
        return HANG_WARMUP_S
    step = 0.0 if math.isnan(warmup_itl_ms_p99) else warmup_itl_ms_p99 / 1e3
    return max(HANG_S, HANG_STEPS * step)


# A level with more than this share of its measured requests failed did not measure the server as asked: its point
# is not stored as complete and is measured again on the next run.
FAILED_SHARE_LIMIT = 0.10


def level_failure(requests: Any) -> str:
    """Why a level's measured requests do not count as a measurement ('' when they do): none sent, none completed,
    or more than FAILED_SHARE_LIMIT of them failed (with the first error)."""
    m = requests[requests["phase"] == "measure"] if "phase" in requests else requests
    if len(m) == 0:
        return "no measured request was sent"
    bad = m[m["status"] != "ok"]
    first = str(bad["error"].dropna().iloc[0])[:200] if len(bad) and "error" in bad and bad["error"].notna().any() \
        else ""
    if len(bad) == len(m):
        return f"all {len(m)} measured requests failed" + (f" (first: {first})" if first else "")
    if len(bad) > FAILED_SHARE_LIMIT * len(m):
        return (f"{len(bad)} of {len(m)} measured requests failed, above the {FAILED_SHARE_LIMIT:.0%} limit"
                + (f" (first: {first})" if first else ""))
    return ""


def judge_health(h: dict[str, Any]) -> dict[str, Any]:
    """Say from a point's raw client readings whether the client limited it, or was starved by the host.

    limited: the client itself was the bottleneck (it used most of a core, or could not keep an open-loop
    rate); starved: its event loop woke up late while it had little to do, so the host was oversubscribed and
    its timestamps (TTFT, ITL) include scheduling delay. Kept apart from the readings so stored points are
    judged by the current rules."""
    limited, starved = [], []
    cpu, lag = h.get("client_cpu_pct", float("nan")), h.get("loop_lag_ms_p99", float("nan"))
    if cpu >= CLIENT_CPU_LIMIT_PCT:
        limited.append(f"client used {cpu:.0f}% of a core")
    rate, achieved = h.get("requested_rate", float("nan")), h.get("achieved_rate", float("nan"))
    late = h.get("send_lag_ms_p99", float("nan"))
    if not h.get("capped", True) and math.isfinite(rate) and rate > 0:
        if not math.isnan(late):  # the schedule decides: was each request sent when its arrival was drawn?
            limit = max(SEND_LAG_LIMIT_MS, 0.5 * 1e3 / rate)
            if late >= limit:
                limited.append(f"client sent requests up to {late:.0f} ms behind their schedule (p99, limit "
                               f"{limit:.0f} ms): {achieved:.2f} req/s of the {rate:g} asked for")
        elif achieved < RATE_SHORTFALL * rate:
            limited.append(f"client sent {achieved:.2f} req/s of the {rate:g} asked for")
    if lag >= LOOP_LAG_LIMIT_MS:
        (limited if cpu >= CLIENT_CPU_LIMIT_PCT else starved).append(
            f"client event loop woke {lag:.0f} ms late (p99, max {h.get('loop_lag_ms_max', float('nan')):.0f} ms)"
            + ("" if cpu >= CLIENT_CPU_LIMIT_PCT else f" while using {cpu:.0f}% of a core: the host was "
               "oversubscribed, so latencies include scheduling delay"))
    if h.get("requests_retried", 0) > 0:  # the stall's other trace: the server closed connections it left idle
        starved.append(f"{h['requests_retried']} request(s) sent again: the server had closed their idle keep-alive "
                       "connection while the client's loop was held up")
    return {"client_limited": bool(limited), "client_starved": bool(starved),
            "client_warning": "; ".join(limited + starved)}
