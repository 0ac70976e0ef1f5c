"""Streaming client for OpenAI-compatible servers and SGLang's native /generate.

One record per request; a failed request is recorded, never raised. Parsing is kept cheap because on a
small machine the client shares CPUs with the server: token chunks are recognised from their bytes and only
chunks that carry usage, errors or chat roles are decoded as JSON.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

from .datasets import Prompt

PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions", "generate": "/generate"}

_EMPTY_CHOICES = re.compile(rb'"choices"\s*:\s*\[\s*\]')
_HAS_USAGE = re.compile(rb'"usage"\s*:\s*\{')
_HAS_ERROR = re.compile(rb'"error"\s*:')
_HAS_ROLE = re.compile(rb'"role"\s*:')


# inter-token gaps in ms to 0.1 us: the digits below are the event loop's jitter, and they tripled the stored tables
ITL_DECIMALS = 4


@dataclass(slots=True)
class RequestRecord:
    """What happened to one request; durations in ms from its own start, absolute times in unix seconds."""

    request_id: int
    phase: str
    point_index: int = 0
    start_unix: float = 0.0
    scheduled_unix: float | None = None  # open loop: when the arrival process wanted it sent
    ttft_ms: float | None = None
    e2e_ms: float | None = None
    itl_ms: list[float] = field(default_factory=list)
    input_tokens: int | None = None
    output_tokens: int | None = None
    expected_output_tokens: int | None = None
    chunks: int = 0
    status: str = "ok"
    error: str = ""
    replica: int = 0  # which endpoint served it, when the load is spread over replicas
    retried: int = 0  # sent again once: its first connection was closed by the server before any answer

    def as_row(self) -> dict[str, Any]:
        """Flat dict for a DataFrame row."""
        return asdict(self)


def build_body(endpoint: str, model: str, prompt: Prompt, ignore_eos: bool = True) -> bytes:
    """The JSON request body, encoded once per request."""
    if endpoint == "generate":
        sp: dict[str, Any] = {"max_new_tokens": prompt.output_len, "temperature": 0.0}
        if ignore_eos:
            sp |= {"ignore_eos": True, "min_new_tokens": prompt.output_len}
        return json.dumps({"text": prompt.text, "sampling_params": sp, "stream": True}).encode()
    body: dict[str, Any] = {"model": model, "max_tokens": prompt.output_len, "temperature": 0.0, "stream": True,
                            "stream_options": {"include_usage": True}}
    if ignore_eos:
        body |= {"ignore_eos": True, "min_tokens": prompt.output_len}  # exact lengths where the engine supports it
    if endpoint == "chat":
        msgs = prompt.messages or (("user", prompt.text),)
        body["messages"] = [{"role": r, "content": c} for r, c in msgs]
    else:
        body["prompt"] = prompt.text
    return json.dumps(body).encode()


def _openai_line(data: bytes, chat: bool, rec: RequestRecord) -> bool:
    """Handle one OpenAI SSE payload; True when it carries a generated token (whose text may be empty)."""
    if _HAS_ERROR.search(data):
        obj = json.loads(data)
        if obj.get("error"):
            rec.status = "error"
            rec.error = str(obj["error"])[:500]
            return False
    if _HAS_USAGE.search(data):
        usage = json.loads(data)["usage"]
        rec.input_tokens = usage.get("prompt_tokens", rec.input_tokens)
        rec.output_tokens = usage.get("completion_tokens", rec.output_tokens)
    if _EMPTY_CHOICES.search(data):
        return False
    if chat and _HAS_ROLE.search(data):
        # chat streams open with a role-only delta that carries no token
        choices = json.loads(data).get("choices") or [{}]
        d = choices[0].get("delta") or {}
        return bool(d.get("content") or d.get("reasoning_content") or d.get("reasoning"))
    return b'"choices"' in data


class _Clock:
    """One stream's timing: when it was sent, when the last token arrived, and generate's running token count."""

    __slots__ = ("t0", "last", "first", "done_tokens")

    def __init__(self) -> None:
        self.t0 = self.last = time.perf_counter()
        self.first = True
        self.done_tokens = 0  # /generate: completion tokens seen so far (a chunk may carry several)

    def token(self, rec: RequestRecord, now: float) -> None:
        """An OpenAI token event arrived at now."""
        rec.chunks += 1
        if self.first:
            rec.ttft_ms = (now - self.t0) * 1e3
            self.first = False
        else:
            rec.itl_ms.append(round((now - self.last) * 1e3, ITL_DECIMALS))
        self.last = now

    def generate(self, rec: RequestRecord, data: bytes, now: float) -> None:
        """A /generate event: its completion-token count says how many tokens arrived with it."""
        meta = json.loads(data).get("meta_info") or {}
        n_done = int(meta.get("completion_tokens") or 0)
        rec.input_tokens = meta.get("prompt_tokens", rec.input_tokens)
        new = n_done - self.done_tokens
        if new <= 0:
            return
        rec.output_tokens = self.done_tokens = n_done
        rec.chunks += 1
        if self.first:
            rec.ttft_ms = (now - self.t0) * 1e3
            self.first = False
            new -= 1
        if new > 0:
            gap = (now - self.last) * 1e3 / new  # spread a multi-token chunk evenly, as SGLang's client does
            rec.itl_ms.extend([round(gap, ITL_DECIMALS)] * new)
        self.last = now


def _events(rec: RequestRecord, lines: list[bytes], now: float, clock: _Clock, chat: bool, generate: bool) -> bool:
    """Every event of one read (they arrived together); False once the stream reported an error."""
    for line in lines:
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]" or not data:
            continue
        if generate:
            clock.generate(rec, data, now)
        elif _openai_line(data, chat, rec):
            clock.token(rec, now)
        elif rec.status == "error":
            return False
    return True


async def send_request(session: aiohttp.ClientSession, url: str, endpoint: str, body: bytes, rec: RequestRecord,
                       headers: dict[str, str], progress: list[float] | None = None,
                       limit_s: float | None = None) -> RequestRecord:
    """Stream one request and fill rec: TTFT, every inter-token gap, E2E, token counts from usage. progress[0] is
    set to the time of every read from the server (the hang watchdog's clock). limit_s: the stream fails once this
    long has passed since its first token (the wait before it, queueing in a full server, is the watchdog's)."""
    rec.start_unix = time.time()
    try:
        return await _stream(session, url, endpoint, body, rec, headers, progress, limit_s)
    except aiohttp.ServerDisconnectedError:  # raised by _stream only before anything of the answer arrived
        pass
    # the server closed a pooled keep-alive connection that sat idle past its timeout (uvicorn's is 5 s) while this
    # client's loop was starved, and the request went out on it: nothing of it was served, so it is sent once more
    rec.retried = 1
    rec.start_unix = time.time()
    return await _stream(session, url, endpoint, body, rec, headers, progress, limit_s)


async def _stream(session: aiohttp.ClientSession, url: str, endpoint: str, body: bytes, rec: RequestRecord,
                  headers: dict[str, str], progress: list[float] | None, limit_s: float | None = None) -> RequestRecord:
    """One attempt of send_request; a disconnect before any token is raised, every other failure recorded."""
    chat, generate = endpoint == "chat", endpoint == "generate"
    clock = _Clock()
    try:
        async with session.post(url, data=body, headers=headers) as resp:
            if resp.status != 200:
                rec.status = "error"
                rec.error = f"HTTP {resp.status}: {(await resp.text())[:500]}"
                return rec
            buf = b""
            async for piece in resp.content.iter_any():
                now = time.perf_counter()  # arrival time of this read; every event in it arrived together
                if progress is not None:
                    progress[0] = now
                lines = (buf + piece).split(b"\n")
                buf = lines.pop()
                if not _events(rec, lines, now, clock, chat, generate):
                    return rec
                if limit_s is not None and rec.ttft_ms is not None and now - clock.t0 - rec.ttft_ms / 1e3 > limit_s:
                    raise TimeoutError(f"no end {limit_s:g} s after its first token (load.request_timeout_s)")
        rec.e2e_ms = (time.perf_counter() - clock.t0) * 1e3
        if clock.first:
            rec.status = "error"
            rec.error = "stream ended without any generated token"
        elif rec.output_tokens is None:
            rec.output_tokens = rec.chunks  # the server sent no usage: count token events
    except aiohttp.ServerDisconnectedError as e:
        if not rec.chunks and not rec.retried:
            raise
        rec.status = "error"
        rec.error = f"{type(e).__name__}: {e}"[:500]
        rec.e2e_ms = (time.perf_counter() - clock.t0) * 1e3
    except (TimeoutError, aiohttp.ClientError, json.JSONDecodeError, ValueError, KeyError) as e:
        rec.status = "error"
        rec.error = f"{type(e).__name__}: {e}"[:500]
        rec.e2e_ms = (time.perf_counter() - clock.t0) * 1e3
    return rec
