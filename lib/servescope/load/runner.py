"""Run load points: closed loop (N workers, each sends its next request when the last one ends) or open loop
(arrivals from a seeded Poisson/gamma process, optionally capped), while watching the client's own health."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import itertools
import math
import multiprocessing
import resource
import threading
import time
from collections.abc import Callable, Collection, Coroutine, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import aiohttp
import numpy as np
import pandas as pd
from tokenizers import Tokenizer
from tqdm import tqdm

from ..errors import HungError
from ..spec import LoadPoint, LoadSpec
from .client import PATHS, RequestRecord, build_body, send_request
from .datasets import Prompt, jsonl_prompts, random_prompts, sharegpt_prompts
from .health import HANG_S, hang_limit_s, judge_health
from .metrics import summarize

T = TypeVar("T")



try:  # NVTX ranges cost nothing unless a profiler (nsys) is attached to this process
    import nvtx as _nvtx
except ImportError:  # pragma: no cover - nvtx is a dependency; a stripped install still runs
    _nvtx = None


def nvtx_range(label: str) -> Any:
    """An NVTX range named 'servescope <label>' in the 'servescope' domain (a no-op context without nvtx)."""
    if _nvtx is None:
        return contextlib.nullcontext()
    return _nvtx.annotate(f"servescope {label}", domain="servescope")


def run_coro(coro_fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to completion from sync code, also inside Jupyter, whose own event loop is already running
    (then on a thread of its own). An interrupt of the calling thread (Ctrl-C, JupyterLab's interrupt) cancels the
    coroutine at once rather than waiting for the level to end."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro_fn())
    box: dict[str, Any] = {}
    started = threading.Event()

    async def main() -> T:
        box["loop"], box["task"] = asyncio.get_running_loop(), asyncio.current_task()
        started.set()
        return await coro_fn()

    def runner() -> None:
        try:
            box["result"] = asyncio.run(main())
        except BaseException as e:  # handed to the caller's thread
            box["error"] = e
        finally:
            started.set()

    t = threading.Thread(target=runner, name="servescope-load", daemon=True)
    t.start()
    try:
        t.join()
    except BaseException:
        started.wait(5)
        loop, task = box.get("loop"), box.get("task")
        if loop is not None and task is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(task.cancel)
        t.join(15)
        raise
    if "error" in box:
        raise box["error"]
    return box["result"]


def ensure_fd_limit(needed: int) -> int:
    """Raise the soft open-file limit towards the hard one so `needed` sockets fit; returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard if hard != resource.RLIM_INFINITY else needed, max(soft, needed))
    if want > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        soft = want
    return soft


def make_prompts(load: LoadSpec, tok: Tokenizer | None, n: int, seed: int) -> list[Prompt]:
    """n prompts from the load's dataset (random ones of the load's lengths, drawn per prompt where it says)."""
    if load.dataset == "sharegpt":
        return sharegpt_prompts(load.dataset_path, tok, n, None, seed)
    if load.dataset == "jsonl":
        return jsonl_prompts(load.dataset_path, tok, n, load.output_len, seed)
    lengths = load.lengths_for(n, seed) if load.lengths != "fixed" else None
    return random_prompts(tok, n, load.input_len, load.output_len, seed, lengths)


class PromptPool:
    """The prompts of one level, each sent once: a fixed list, or (a timed level of random prompts) one that grows by
    seeded chunks made off the event loop when the level outruns it, so no prompt repeats into the prefix cache."""

    def __init__(self, endpoint: str, model: str, prompts: Sequence[Prompt], ignore_eos: bool,
                 grow: Callable[[int], list[Prompt]] | None = None) -> None:
        self.endpoint, self.model, self.ignore_eos, self.grow = endpoint, model, ignore_eos, grow
        self.prompts: list[Prompt] = list(prompts)
        self.bodies = [build_body(endpoint, model, p, ignore_eos) for p in self.prompts]
        self.grown = 0  # chunks added while the level ran
        self.exhausted = False  # a request found no prompt left (the level ended before its duration)
        self._lock: asyncio.Lock | None = None

    def __len__(self) -> int:
        return len(self.bodies)

    async def take(self, i: int) -> tuple[bytes, int] | None:
        """The body and asked output length of request i, or None where the pool has no prompt i."""
        if i >= len(self.bodies) and self.grow is not None:
            self._lock = self._lock or asyncio.Lock()
            async with self._lock:
                while i >= len(self.bodies):
                    more = await asyncio.to_thread(self.grow, self.grown)
                    self.grown += 1
                    self.prompts += more
                    self.bodies += [build_body(self.endpoint, self.model, p, self.ignore_eos) for p in more]
        if i >= len(self.bodies):
            self.exhausted = True
            return None
        return self.bodies[i], self.prompts[i].output_len


@dataclass
class PointResult:
    """The records of one point and what the client saw of itself while it ran."""

    records: list[RequestRecord]
    health: dict[str, Any]


class _LoopLag:
    """Samples how late the event loop wakes up: a busy client inflates every timestamp it takes."""

    def __init__(self, interval_s: float = 0.01) -> None:
        self.interval_s = interval_s
        self.lags_ms: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(self.interval_s)
            self.lags_ms.append(max(0.0, (time.perf_counter() - t - self.interval_s) * 1e3))

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass


class Router:
    """Which of several endpoints takes the next request: round_robin (in turn) or least_outstanding (the one with
    the fewest requests in flight, ties in turn), as a load balancer in front of replicas would."""

    def __init__(self, urls: Sequence[str], route: str = "round_robin") -> None:
        if not urls:
            raise ValueError("no endpoint to send to")
        if route not in ("round_robin", "least_outstanding"):
            raise ValueError(f"unknown route {route!r}")
        self.urls = list(urls)
        self.route = route
        self.inflight = [0] * len(self.urls)
        self._next = 0

    def acquire(self) -> int:
        """The replica for the next request (counted in flight until release)."""
        n = len(self.urls)
        if self.route == "least_outstanding":
            low = min(self.inflight)
            i = next(j % n for j in range(self._next, self._next + n) if self.inflight[j % n] == low)
        else:
            i = self._next % n
        self._next = (i + 1) % n
        self.inflight[i] += 1
        return i

    def release(self, i: int) -> None:
        """A request to replica i ended."""
        self.inflight[i] -= 1


@dataclass
class _InFlight:
    """What the watchdog of one point watches: requests in flight, the last time the server sent anything (or a
    request ended), and the longest silence while something was asked."""

    n: int = 0
    progress: list[float] = field(default_factory=lambda: [time.perf_counter()])
    silence_s: float = 0.0

    def started(self) -> None:
        if self.n == 0:
            self.progress[0] = time.perf_counter()  # silence is counted only while something is asked
        self.n += 1

    def ended(self) -> None:
        self.n -= 1
        self.progress[0] = time.perf_counter()


async def _watchdog(state: _InFlight, hang_s: float, phase: str, label: str) -> None:
    """HungError once the server has sent nothing for hang_s with requests in flight."""
    while True:
        await asyncio.sleep(min(1.0, hang_s / 4))
        if state.n == 0:
            continue
        quiet = time.perf_counter() - state.progress[0]
        state.silence_s = max(state.silence_s, quiet)
        if quiet > hang_s:
            raise HungError(f"{'warm-up of ' if phase == 'warmup' else ''}{label}: no token for {quiet:.0f} s with "
                            f"{state.n} requests in flight (hang limit {hang_s:.0f} s)")


async def _race(work: Coroutine[Any, Any, None], watch: Coroutine[Any, Any, None], lag: _LoopLag) -> None:
    """Run the point's requests beside its watchdog: a hang cancels the requests and is raised."""
    w, d = asyncio.create_task(work), asyncio.create_task(watch)
    await asyncio.wait({w, d}, return_when=asyncio.FIRST_COMPLETED)
    if d.done() and d.exception() is not None:
        w.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await w
        await lag.stop()
        raise d.exception()  # type: ignore[misc]
    d.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await d
    w.result()
    await lag.stop()


def _session_timeout(load: LoadSpec) -> aiohttp.ClientTimeout:
    """No limit on a request as a whole: in a full server it queues before its first token for as long as the level's
    other requests take (the watchdog fails the level if nothing at all comes); request_timeout_s runs from its first
    token (send_request), and connecting stays bounded."""
    return aiohttp.ClientTimeout(total=None, sock_connect=min(60.0, load.request_timeout_s))


async def _point(
    url: str | Sequence[str], endpoint: str, model: str, prompts: Sequence[Prompt] | PromptPool, point: LoadPoint,
    load: LoadSpec, phase: str, headers: dict[str, str], ids: itertools.count, bar: tqdm | None, count: int | None,
    hang_s: float = HANG_S, route: str = "round_robin",
) -> PointResult:
    """One point. count=None with load.duration_s: run for that long (or until the prompt pool is used up: no prompt
    is sent twice); else send `count` requests. Several urls: the replicas of one configuration, each request sent to
    the one route picks (its index kept in the record)."""
    router = Router([url] if isinstance(url, str) else url, route)
    pool = prompts if isinstance(prompts, PromptPool) else PromptPool(endpoint, model, prompts, load.ignore_eos)
    records: list[RequestRecord] = []
    conns = point.concurrency or (count or len(pool))
    ensure_fd_limit(2 * conns + 256)
    # the event loop's own thread: what saturates first in a one-loop client, at the clock's resolution (the process'
    # tick-counted times put a 0.1 s level over 100%, and count any other thread of the host process)
    lag = _LoopLag()
    cpu0, t_start = time.thread_time(), time.perf_counter()
    deadline = t_start + load.duration_s if count is None and load.duration_s else math.inf
    total = count if count is not None else math.inf
    sent_times: list[float] = []
    send_lags_ms: list[float] = []
    state = _InFlight()
    async with aiohttp.ClientSession(timeout=_session_timeout(load),
                                     connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)) as session:
        lag.start()

        async def one(i: int, scheduled: float | None) -> bool:
            got = await pool.take(i)
            if got is None:
                return False
            body, expected = got
            rec = RequestRecord(request_id=next(ids), phase=phase, point_index=point.index,
                                expected_output_tokens=expected)
            if scheduled is not None:
                rec.scheduled_unix = time.time() - (time.perf_counter() - scheduled)
            sent_times.append(time.perf_counter())
            state.started()
            rec.replica = router.acquire()
            try:
                records.append(await send_request(session, router.urls[rec.replica], endpoint, body, rec, headers,
                                                  state.progress, load.request_timeout_s))
            finally:
                router.release(rec.replica)
                state.ended()
            if bar is not None:
                bar.update(1)
            return True

        await _race(_drive(point, load, total, deadline, one, send_lags_ms),
                    _watchdog(state, hang_s, phase, point.label), lag)
    wall_s = time.perf_counter() - t_start
    cpu_s = time.thread_time() - cpu0
    health = _health(point, load, wall_s, cpu_s, lag.lags_ms, send_lags_ms, sent_times,
                     sum(r.retried for r in records))
    health["max_silence_s"] = state.silence_s
    health |= {"prompts": len(pool), "prompts_grown_chunks": pool.grown,
               "pool_exhausted": bool(pool.exhausted and count is None)}
    return PointResult(records, health)


async def _drive(point: LoadPoint, load: LoadSpec, total: float, deadline: float,
                 one: Callable[[int, float | None], Coroutine[Any, Any, bool]], send_lags_ms: list[float]) -> None:
    """Send the point's requests: closed loop (a fixed number of slots) or open loop (arrivals at a rate)."""
    if point.mode == "closed":
        counter = itertools.count()

        async def worker() -> None:
            while True:
                i = next(counter)
                if i >= total or time.perf_counter() >= deadline:
                    return
                if not await one(i, None):
                    return

        n_workers = int(min(point.concurrency or 1, total))
        await asyncio.gather(*(worker() for _ in range(n_workers)))
    else:
        rate = point.request_rate or math.inf
        rng = np.random.default_rng(load.seed + 7919 * point.index)
        sem = asyncio.Semaphore(point.concurrency) if point.concurrency else None
        tasks: list[asyncio.Task[None]] = []

        async def capped(i: int, scheduled: float) -> None:
            if sem is None:
                await one(i, scheduled)
                return
            async with sem:
                await one(i, scheduled)

        t_next = time.perf_counter()
        try:
            for i in itertools.count():
                if i >= total or t_next >= deadline:
                    break
                delay = t_next - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                send_lags_ms.append(max(0.0, (time.perf_counter() - t_next) * 1e3))
                tasks.append(asyncio.create_task(capped(i, t_next)))
                if math.isfinite(rate):
                    # gamma(shape=k, scale=1/(rate*k)) has mean 1/rate; k=1 is Poisson, k<1 burstier
                    t_next += float(rng.gamma(load.burstiness, 1.0 / (rate * load.burstiness)))
            await asyncio.gather(*tasks)
        finally:  # cancelled (a hang, an interrupt): no request outlives the level
            for t in tasks:
                t.cancel()


def _health(point: LoadPoint, load: LoadSpec, wall_s: float, cpu_s: float, lags_ms: list[float],
            send_lags_ms: list[float], sent_times: list[float], retried: int = 0) -> dict[str, Any]:
    lag = np.asarray(lags_ms, dtype=float)
    pct = (lambda q: float(np.percentile(lag, q))) if lag.size else (lambda q: float("nan"))
    span = (max(sent_times) - min(sent_times)) if len(sent_times) > 1 else float("nan")
    achieved = (len(sent_times) - 1) / span if span and span > 0 else float("nan")
    h: dict[str, Any] = {
        "point_index": point.index, "client_wall_s": wall_s,
        "client_cpu_pct": 100.0 * cpu_s / wall_s if wall_s > 0 else float("nan"),
        "loop_lag_ms_p50": pct(50), "loop_lag_ms_p99": pct(99), "loop_lag_ms_max": pct(100),
        "requested_rate": point.request_rate if point.request_rate is not None else float("nan"),
        "achieved_rate": achieved,
        "send_lag_ms_p99": float(np.percentile(send_lags_ms, 99)) if send_lags_ms else float("nan"),
        "requests_retried": retried,
    }
    h["capped"] = bool(point.concurrency) if point.mode == "open" else True
    return h | judge_health(h)


@dataclass
class LoadResult:
    """A sweep's per-request records and per-point client health, as tidy DataFrames."""

    requests: pd.DataFrame
    health: pd.DataFrame

    def summary(self, slo_ms: dict[str, float] | None = None) -> pd.DataFrame:
        """One row per point (see metrics.summarize)."""
        return summarize(self.requests, self.health, slo_ms)


def run_sweep(base_url: str | Sequence[str], model: str, load: LoadSpec, tokenizer: Tokenizer | None,
              api_key: str | None = None, progress: bool = True, label: str = "",
              on_phase: Callable[[str], None] | None = None, skip: Collection[str] = (),
              on_level: Callable[[str, pd.DataFrame, dict[str, Any]], None] | None = None,
              route: str = "round_robin") -> LoadResult:
    """Every point of the load spec not in skip, each with its warmup first; warmup records are kept, tagged
    phase='warmup'. Several base urls (replicas): requests are spread over them by route, warm-ups included.

    on_phase is told 'warmup:<point>', '<point>' and finally 'idle', so telemetry joins each reading to its point;
    on_level(label, records, health) is called as each level finishes (to write it; raising stops the sweep)."""
    tell = on_phase or (lambda _: None)
    urls = [u.rstrip("/") + PATHS[load.endpoint] for u in ([base_url] if isinstance(base_url, str) else base_url)]
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    ids = itertools.count()
    rows: list[dict[str, Any]] = []
    health: list[dict[str, Any]] = []
    for pt in load.points():
        if pt.label in skip:
            continue
        first_row = len(rows)
        prompts, pool = _level_pool(load, tokenizer, model, pt)
        warm_rows, warm_itl_p99, warm_stats = _warm_up(urls, model, load, tokenizer, pt, headers, ids, route, tell)
        rows += warm_rows
        count = None if load.duration_s else len(prompts)
        total = count if count is not None else None
        unit = "req" if count is not None else "req (timed)"
        bar = tqdm(total=total, desc=f"{label}{pt.label}", unit=unit, leave=True, disable=not progress,
                   mininterval=1.0)
        tell(pt.label)
        try:
            with nvtx_range(pt.label):
                hang = hang_limit_s("measure", warm_itl_p99, load.hang_s)
                res = _in_processes(urls, model, pool, pt, load, headers, ids, count, hang, route, bar, tokenizer) \
                    if load.client_processes > 1 and (pt.concurrency or 0) >= load.client_processes else \
                    run_coro(partial(_point, urls, load.endpoint, model, pool, pt, load, "measure", headers, ids,
                                     bar, count, hang, route))
        finally:
            bar.close()
        rows += [_row(r, pt, prompts) for r in res.records]
        health.append({"point": pt.label, **res.health, **warm_stats, "asked_concurrency": pt.concurrency,
                       "steady_state": load.steady_state})
        tell("idle")
        if on_level is not None:
            on_level(pt.label, pd.DataFrame(rows[first_row:]), health[-1])
    return LoadResult(pd.DataFrame(rows), pd.DataFrame(health))


# output tokens of each warm-up request of a steady-state load (it warms batch sizes, not the cache)
WARMUP_OUTPUT_TOKENS = 16


def _warm_up(urls: list[str], model: str, load: LoadSpec, tokenizer: Tokenizer | None, pt: LoadPoint,
             headers: dict[str, str], ids: itertools.count, route: str,
             tell: Callable[[str], None]) -> tuple[list[dict[str, Any]], float, dict[str, Any]]:
    """A level's unmeasured warm-up (one request per slot unless the load says otherwise), spread as the level will
    be: its rows, its p99 inter-token gap (the level's hang limit follows it) and what it saw of silences."""
    n_warm = load.warmup_requests if load.warmup_requests is not None else (pt.concurrency or 1)
    if not n_warm:
        return [], float("nan"), {}
    tell(f"warmup:{pt.label}")
    warm = _warm_prompts(load, tokenizer, n_warm, pt)
    closed = LoadPoint(pt.index, pt.label, "closed", pt.concurrency or 1, None)
    with nvtx_range(f"warmup:{pt.label}"):
        # spread as the level will be: each replica warms the batch size it will see
        res = run_coro(partial(_point, urls, load.endpoint, model, warm, closed, load, "warmup", headers, ids, None,
                               n_warm, hang_limit_s("warmup", override=load.hang_s), route))
    gaps = [g for r in res.records for g in r.itl_ms]
    stats = {"warmup_max_silence_s": res.health.get("max_silence_s", float("nan")),
             "warmup_e2e_ms_max": max((r.e2e_ms for r in res.records if r.e2e_ms is not None), default=float("nan"))}
    return [_row(r, pt, warm) for r in res.records], float(np.percentile(gaps, 99)) if gaps else float("nan"), stats


def _in_processes(urls: list[str], model: str, pool: PromptPool, pt: LoadPoint, load: LoadSpec,
                  headers: dict[str, str], ids: itertools.count, count: int | None, hang_s: float, route: str,
                  bar: tqdm | None, tokenizer: Tokenizer | None) -> PointResult:
    """One level driven by load.client_processes processes, each with its share of the slots (and of an open loop's
    rate) and every P-th prompt (none sent twice), merged into one result: their records, and the client's health as
    its busiest process saw it (each is a core of its own)."""
    n = load.client_processes
    slots = [(pt.concurrency or 0) // n + (1 if i < (pt.concurrency or 0) % n else 0) for i in range(n)]
    jobs = []
    for i in range(n):
        mine = pool.prompts[i::n]
        grow = partial(_more_prompts, load, tokenizer, len(mine), load.seed + 1000 * pt.index + 104_729 * (i + 1)) \
            if pool.grow is not None else None
        sub = LoadPoint(pt.index, pt.label, pt.mode, slots[i],
                        pt.request_rate / n if pt.request_rate is not None else None)
        jobs.append((urls, model, mine, grow, sub, load.model_copy(update={"seed": load.seed + i}), headers,
                     len(mine) if count is not None else None, hang_s, route))
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no event loop or threads of the parent's
    # the processes start one after another (an interpreter each): they begin sending together, at a barrier, or the
    # first one's ramp would be measured as a level that did not fill
    with ctx.Manager() as manager, concurrent.futures.ProcessPoolExecutor(n, mp_context=ctx) as ex:
        barrier = manager.Barrier(n)
        parts = list(ex.map(_child_level, [(*j, barrier) for j in jobs]))
    records = sorted((r for p in parts for r in p.records), key=lambda r: r.start_unix)
    for r in records:
        r.request_id = next(ids)
    if bar is not None:
        bar.update(len(records))
    hs = [p.health for p in parts]
    worst = max(hs, key=lambda h: (h.get("client_cpu_pct") or 0))
    health = {**worst, "client_processes": n, "client_wall_s": max(h["client_wall_s"] for h in hs),
              "loop_lag_ms_p99": max(h["loop_lag_ms_p99"] for h in hs),
              "loop_lag_ms_max": max(h["loop_lag_ms_max"] for h in hs),
              "requests_retried": sum(h.get("requests_retried", 0) for h in hs),
              "prompts": sum(h.get("prompts", 0) for h in hs),
              "pool_exhausted": any(h.get("pool_exhausted") for h in hs)}
    if pt.request_rate is not None:
        health["requested_rate"], health["achieved_rate"] = pt.request_rate, sum(h["achieved_rate"] for h in hs)
    return PointResult(records, health | judge_health(health))


def _child_level(job: tuple[Any, ...]) -> PointResult:
    """One client process's share of a level (run in a child interpreter)."""
    urls, model, prompts, grow, pt, load, headers, count, hang_s, route, barrier = job
    pool = PromptPool(load.endpoint, model, prompts, load.ignore_eos, grow)
    barrier.wait(timeout=120)
    return run_coro(partial(_point, urls, load.endpoint, model, pool, pt, load, "measure", headers, itertools.count(),
                            None, count, hang_s, route))


def _warm_prompts(load: LoadSpec, tokenizer: Tokenizer | None, n: int, pt: LoadPoint) -> list[Prompt]:
    """A level's warm-up prompts (seeded apart from its measured ones); a steady load's are short: one request per
    slot warms each batch size, where a full-length wave would be a level of its own."""
    warm = make_prompts(load, tokenizer, n, load.seed - 1 - pt.index)
    if load.steady_state:
        warm = [dataclasses.replace(w, output_len=min(w.output_len, WARMUP_OUTPUT_TOKENS)) for w in warm]
    return warm


def _level_pool(load: LoadSpec, tokenizer: Tokenizer | None, model: str,
                pt: LoadPoint) -> tuple[list[Prompt], PromptPool]:
    """A level's prompts (seeded by the level) and the pool that sends each once; a timed level of random prompts
    that outruns them gets more, never the same again."""
    seed = load.seed + 1000 * pt.index
    prompts = make_prompts(load, tokenizer, load.level_requests(pt.concurrency), seed)
    grow = partial(_more_prompts, load, tokenizer, len(prompts), seed) \
        if load.duration_s and load.dataset == "random" else None
    return prompts, PromptPool(load.endpoint, model, prompts, load.ignore_eos, grow)


def _more_prompts(load: LoadSpec, tok: Tokenizer | None, first: int, seed: int, chunk: int) -> list[Prompt]:
    """The chunk-th extension of a level's prompt pool (seeded apart from the first prompts and each other)."""
    n = max(first, 16)
    return make_prompts(load, tok, n, seed + 7_919_000 * (chunk + 1))


def _row(r: RequestRecord, pt: LoadPoint, prompts: Sequence[Prompt]) -> dict[str, Any]:
    row = r.as_row()
    row |= {"point": pt.label, "mode": pt.mode, "concurrency": pt.concurrency, "request_rate": pt.request_rate,
            "input_len_exact": bool(prompts and prompts[0].exact)}
    return row


def run_level(base_url: str, model: str, load: LoadSpec, concurrency: int, prompts: Sequence[Prompt],
              warmup: Sequence[Prompt] = (), api_key: str | None = None, progress: bool = True,
              label: str = "") -> list[RequestRecord]:
    """One closed-loop level with the given prompts (for callers that bring their own)."""
    url = base_url.rstrip("/") + PATHS[load.endpoint]
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {api_key}"} if api_key else {})
    ids = itertools.count()
    pt = LoadPoint(0, f"c={concurrency}", "closed", concurrency, None)
    out: list[RequestRecord] = []
    if warmup:
        out += run_coro(partial(_point, url, load.endpoint, model, warmup, pt, load, "warmup", headers, ids, None,
                                len(warmup))).records
    bar = tqdm(total=len(prompts), desc=f"{label}{pt.label}", unit="req", disable=not progress, mininterval=1.0)
    try:
        out += run_coro(partial(_point, url, load.endpoint, model, prompts, pt, load, "measure", headers, ids, bar,
                                len(prompts))).records
    finally:
        bar.close()
    return out
