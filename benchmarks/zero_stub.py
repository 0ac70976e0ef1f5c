"""A zero-work streaming stub for measuring *client* capacity: it answers every POST at once with a canned
OpenAI completions stream of N token chunks, so the client, not the server, is what gets measured.

Raw asyncio (uvloop when the interpreter has it), keep-alive HTTP/1.1, no JSON parsing of requests.
Usage: python zero_stub.py --port P [--tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json


def canned_stream(tokens: int) -> bytes:
    chunk = {"id": "cmpl-0", "object": "text_completion", "created": 0, "model": "stub",
             "choices": [{"index": 0, "text": "x", "logprobs": None, "finish_reason": None}]}
    line = b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"
    usage = {"id": "cmpl-0", "object": "text_completion", "created": 0, "model": "stub", "choices": [],
             "usage": {"prompt_tokens": 64, "completion_tokens": tokens, "total_tokens": 64 + tokens}}
    body = line * tokens + b"data: " + json.dumps(usage, separators=(",", ":")).encode() + b"\n\ndata: [DONE]\n\n"
    head = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: keep-alive\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n")
    return head + body


def canned_json(payload: dict) -> bytes:
    body = json.dumps(payload).encode()
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: keep-alive\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


class Stub(asyncio.Protocol):
    def __init__(self, stream: bytes, models: bytes) -> None:
        self.stream, self.models = stream, models
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end]
            length = 0
            i = head.lower().find(b"content-length:")
            if i >= 0:
                length = int(head[i + 15:head.find(b"\r\n", i) if head.find(b"\r\n", i) > 0 else None].strip())
            if len(self.buf) < end + 4 + length:
                return
            self.buf = self.buf[end + 4 + length:]
            assert self.transport is not None
            self.transport.write(self.stream if head.startswith(b"POST") else self.models)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--model", default="stub")
    a = p.parse_args()
    stream = canned_stream(a.tokens)
    models = canned_json({"object": "list", "data": [{"id": a.model, "object": "model"}]})
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass

    async def serve() -> None:
        server = await asyncio.get_running_loop().create_server(lambda: Stub(stream, models), a.host, a.port,
                                                                 backlog=4096, reuse_address=True)
        async with server:
            await server.serve_forever()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
