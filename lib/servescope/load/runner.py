"""Closed-loop load: at each concurrency level, N workers each send their next request when the last one ends."""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

import aiohttp
import pandas as pd
from tokenizers import Tokenizer
from tqdm import tqdm

from ..spec import LoadSpec
from .client import RequestRecord, send_request
from .datasets import Prompt, random_prompts

T = TypeVar("T")


async def _closed_loop(
    url: str, endpoint: str, model: str, prompts: Sequence[Prompt], concurrency: int, phase: str,
    headers: dict[str, str], timeout_s: float, ids: itertools.count, bar: tqdm | None,
) -> list[RequestRecord]:
    queue = list(enumerate(prompts))
    queue.reverse()
    records: list[RequestRecord] = []
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:

        async def worker() -> None:
            while queue:
                _, prompt = queue.pop()
                rec = RequestRecord(request_id=next(ids), phase=phase, concurrency=concurrency, start_unix=0.0)
                records.append(await send_request(session, url, endpoint, model, prompt, rec, headers))
                if bar is not None:
                    bar.update(1)

        await asyncio.gather(*(worker() for _ in range(min(concurrency, len(prompts)))))
    return records


def run_coro(coro_fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to completion from sync code, also inside Jupyter, whose own event loop is already running."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro_fn())
    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="servescope-load") as ex:
        return ex.submit(lambda: asyncio.run(coro_fn())).result()


def run_level(
    base_url: str, model: str, load: LoadSpec, concurrency: int, prompts: Sequence[Prompt],
    warmup: Sequence[Prompt] = (), api_key: str | None = None, progress: bool = True, label: str = "",
) -> list[RequestRecord]:
    """Warm up, then measure one concurrency level; returns every record (warmup ones tagged phase='warmup')."""
    path = "/v1/chat/completions" if load.endpoint == "chat" else "/v1/completions"
    url = base_url.rstrip("/") + path
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    ids = itertools.count()
    out: list[RequestRecord] = []
    if warmup:
        out += run_coro(lambda: _closed_loop(url, load.endpoint, model, warmup, concurrency, "warmup", headers,
                                             load.request_timeout_s, ids, None))
    bar = tqdm(total=len(prompts), desc=f"{label}c={concurrency}", leave=False, disable=not progress)
    try:
        out += run_coro(lambda: _closed_loop(url, load.endpoint, model, prompts, concurrency, "measure", headers,
                                             load.request_timeout_s, ids, bar))
    finally:
        bar.close()
    return out


def run_sweep(
    base_url: str, model: str, load: LoadSpec, tokenizer: Tokenizer | None, api_key: str | None = None,
    progress: bool = True, label: str = "",
) -> pd.DataFrame:
    """Every concurrency level of the load spec; one tidy row per request."""
    rows: list[dict] = []
    for i, c in enumerate(load.concurrency):
        prompts = random_prompts(tokenizer, load.num_requests, load.input_len, load.output_len, load.seed + 1000 * i)
        n_warm = c if load.warmup_requests is None else load.warmup_requests
        warm = random_prompts(tokenizer, n_warm, load.input_len, load.output_len, load.seed - 1 - i)
        t0 = time.time()
        recs = run_level(base_url, model, load, c, prompts, warm, api_key, progress, label)
        for r in recs:
            row = r.as_row()
            row["level_start_unix"] = t0
            row["input_len_exact"] = prompts[0].exact if prompts else False
            rows.append(row)
    return pd.DataFrame(rows)
