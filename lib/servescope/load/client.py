"""Streaming OpenAI-compatible client: one record per request, a failed request is recorded, never raised."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

from .datasets import Prompt


@dataclass
class RequestRecord:
    """What happened to one request; times in ms relative to its own start unless named *_unix."""

    request_id: int
    phase: str
    concurrency: int
    start_unix: float
    ttft_ms: float | None = None
    e2e_ms: float | None = None
    itl_ms: list[float] = field(default_factory=list)
    input_tokens: int | None = None
    output_tokens: int | None = None
    status: str = "ok"
    error: str = ""

    def as_row(self) -> dict[str, Any]:
        """Flat dict for a DataFrame row."""
        return asdict(self)


def _body(endpoint: str, model: str, prompt: Prompt) -> dict[str, Any]:
    common: dict[str, Any] = {
        "model": model,
        "max_tokens": prompt.output_len,
        "min_tokens": prompt.output_len,  # exact output length where the engine supports it
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if endpoint == "chat":
        return {**common, "messages": [{"role": "user", "content": prompt.text}]}
    return {**common, "prompt": prompt.text}


def _is_token_event(chunk: dict[str, Any], endpoint: str) -> bool:
    """Does this chunk carry a generated token? Its text may be empty (a special token, half a UTF-8 character),
    so text is not the test; the usage-only chunk (no choices) and chat's role-only opening delta are not tokens."""
    choices = chunk.get("choices")
    if not choices:
        return False
    if endpoint == "chat":
        d = choices[0].get("delta") or {}
        if "role" in d and not (d.get("content") or d.get("reasoning_content") or d.get("reasoning")):
            return False
    return True


async def send_request(
    session: aiohttp.ClientSession, url: str, endpoint: str, model: str, prompt: Prompt, rec: RequestRecord,
    headers: dict[str, str],
) -> RequestRecord:
    """Stream one request and fill rec: TTFT, every inter-token gap, E2E, token counts from usage."""
    body = _body(endpoint, model, prompt)
    t0 = time.perf_counter()
    rec.start_unix = time.time()
    last = t0
    got_first = False
    try:
        async with session.post(url, json=body, headers=headers) as resp:
            if resp.status != 200:
                rec.status = "error"
                rec.error = f"HTTP {resp.status}: {(await resp.text())[:500]}"
                return rec
            buf = b""
            async for piece in resp.content.iter_any():
                buf += piece
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    line = line.strip()
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        continue
                    chunk = json.loads(data)
                    if "error" in chunk:
                        rec.status = "error"
                        rec.error = str(chunk["error"])[:500]
                        return rec
                    now = time.perf_counter()
                    if _is_token_event(chunk, endpoint):
                        if not got_first:
                            rec.ttft_ms = (now - t0) * 1e3
                            got_first = True
                        else:
                            rec.itl_ms.append((now - last) * 1e3)
                        last = now
                    usage = chunk.get("usage")
                    if usage:
                        rec.input_tokens = usage.get("prompt_tokens")
                        rec.output_tokens = usage.get("completion_tokens")
        rec.e2e_ms = (time.perf_counter() - t0) * 1e3
        if not got_first:
            rec.status = "error"
            rec.error = "stream ended without any generated token"
        elif rec.output_tokens is None:
            rec.output_tokens = len(rec.itl_ms) + 1  # server sent no usage: count streamed chunks
    except (TimeoutError, aiohttp.ClientError, json.JSONDecodeError, ValueError) as e:
        rec.status = "error"
        rec.error = f"{type(e).__name__}: {e}"[:500]
        rec.e2e_ms = (time.perf_counter() - t0) * 1e3
    return rec
