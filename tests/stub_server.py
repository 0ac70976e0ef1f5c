"""A small OpenAI-compatible stub server on loopback, for lifecycle and load tests (never for measurements).

Behaviours are chosen on the command line: exit at once, never ready, ready late, spawn children,
ignore SIGTERM, fail some requests, stream N tokens with a fixed gap.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import zlib

from aiohttp import web


async def _until(deadline: float) -> None:
    """Sleep until a time.monotonic() deadline (at once when it has passed)."""
    await asyncio.sleep(max(0.0, deadline - time.monotonic()))


def build_app(a: argparse.Namespace, worker: subprocess.Popen | None = None) -> web.Application:
    t0 = time.monotonic()
    counter = {"n": 0}
    # a scheduler's running-request cap: requests past it wait for a slot (their time to first token grows)
    running = asyncio.Semaphore(a.max_running) if getattr(a, "max_running", 0) else None

    def maybe_kill_worker() -> None:
        """Like an engine whose worker process runs the model: at request N the worker dies from SIGILL (it signals
        itself; faulthandler, enabled by the launcher's environment, prints the fatal error), and the front end
        exits with code 0, as vLLM's API server does. The stub itself prints nothing about it."""
        if worker is None or counter["n"] != a.child_sigill_at:
            return
        assert worker.stdin is not None
        worker.stdin.write(b"die\n")
        worker.stdin.flush()
        worker.wait(timeout=10)
        os._exit(0)

    def ready() -> bool:
        return a.mode != "never" and time.monotonic() - t0 >= a.ready_after

    async def health(_: web.Request) -> web.Response:
        return web.Response(status=200 if ready() else 503)

    async def models(_: web.Request) -> web.Response:
        if not ready():
            return web.Response(status=503)
        return web.json_response({"object": "list", "data": [{"id": a.model, "object": "model"}]})

    async def completions(req: web.Request) -> web.StreamResponse:
        if not ready():
            return web.Response(status=503)
        body = await req.json()
        counter["n"] += 1
        maybe_kill_worker()
        die_after, die_if = getattr(a, "die_after", 0), getattr(a, "die_if_file", "")
        if die_after and counter["n"] > die_after and (not die_if or os.path.exists(die_if)):
            os.kill(os.getpid(), signal.SIGKILL)  # kill -9 of the server mid-load
        if a.fail_every and counter["n"] % a.fail_every == 0:
            return web.json_response({"error": {"message": "stub failure"}}, status=500)
        if getattr(a, "stop_after", 0) and counter["n"] == a.stop_after + 1:
            os.kill(os.getpid(), signal.SIGSTOP)  # kill -STOP of the server mid-load
        stall = getattr(a, "stall_if_file", "")
        while stall and counter["n"] > getattr(a, "stall_after", 0) and os.path.exists(stall):  # a hung server
            await asyncio.sleep(0.2)
        n = int(body.get("max_tokens") or 16)
        chat = req.path.endswith("/chat/completions")
        if body.get("prompt_logprobs") is not None:  # vLLM's extension: the output check's teacher-forced answer
            inflight["n"] += 1
            try:
                await asyncio.sleep(0.05)  # long enough for a batched pass to overlap
                return web.json_response(_logprobs(str(body.get("prompt", "")), n))
            finally:
                inflight["n"] -= 1
        if not body.get("stream"):
            text = "x" * n
            choice = {"index": 0, "message": {"role": "assistant", "content": text}} if chat else {"index": 0, "text": text}
            return web.json_response({"choices": [choice], "usage": {"prompt_tokens": 4, "completion_tokens": n}})
        if running is not None:
            async with running:
                return await _stream(req, body, n, chat)
        return await _stream(req, body, n, chat)

    def _logprobs(text: str, n: int) -> dict:
        """Log-probabilities that follow from the words alone (the same on every launch), a tiny batch-dependent
        jitter (as real kernels have), and --perturb-outputs added where a configuration answers wrongly."""
        words = text.split()
        jitter = 1e-6 * min(inflight["n"], 8)
        lp = [None] + [-1.0 - (zlib.crc32(f"{w}|{i}".encode()) % 1000) / 100 + jitter + a.perturb_outputs
                       for i, w in enumerate(words[1:], 1)]
        ids = [zlib.crc32(f"{text}|{k}".encode()) % 500 + (1 if a.perturb_outputs else 0) for k in range(n)]
        return {"choices": [{"index": 0, "text": "x" * n,
                             "prompt_logprobs": [None if v is None else {"7": {"logprob": v}} for v in lp],
                             "logprobs": {"tokens": [f"token_id:{t}" for t in ids], "token_logprobs": [-2.0] * n}}],
                "usage": {"prompt_tokens": len(words), "completion_tokens": n}}

    async def _stream(req: web.Request, body: dict, n: int, chat: bool) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(req)
        if chat:  # OpenAI servers open a chat stream with a role-only delta that carries no token
            role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
            await resp.write(b"data: " + json.dumps(role).encode() + b"\n\n")
        if a.ttft_ms:
            await asyncio.sleep(a.ttft_ms / 1e3)
        text = " ".join(m.get("content", "") for m in body["messages"]) if chat else str(body.get("prompt", ""))
        prompt_tokens = len(text.split())  # the stub's "tokenizer": one token per word
        if a.log_prompts:  # what it was asked, one line a request (prompt reuse is visible to tests)
            with open(a.log_prompts, "a") as f:
                f.write(json.dumps({"prompt": text, "max_tokens": n}) + "\n")
        # tokens are paced to a schedule from the first one, not by gaps that each add the host's own lateness: on a
        # loaded 2-core host a 2 ms sleep can take 10, which shrinks the known effects the tests check toward nothing
        start = time.monotonic()
        for i in range(n):
            if i and a.itl_ms:
                await _until(start + i * a.itl_ms / 1e3)
            piece = "" if i == 1 else "x"  # a token that decodes to no text (special token, half a character)
            delta = {"delta": {"content": piece}} if chat else {"text": piece}
            await resp.write(b"data: " + json.dumps({"choices": [{"index": 0, **delta}]}).encode() + b"\n\n")
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}
        await resp.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def generate(req: web.Request) -> web.StreamResponse:
        """SGLang's native endpoint: each chunk carries the text so far and meta_info token counts."""
        if not ready():
            return web.Response(status=503)
        body = await req.json()
        counter["n"] += 1
        if a.fail_every and counter["n"] % a.fail_every == 0:
            return web.json_response({"error": {"message": "stub failure"}}, status=500)
        n = int(body["sampling_params"]["max_new_tokens"])
        prompt_tokens = len(str(body.get("text", "")).split())
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(req)
        if a.ttft_ms:
            await asyncio.sleep(a.ttft_ms / 1e3)
        done = 0
        start = time.monotonic()
        while done < n:
            if done and a.itl_ms:
                await _until(start + (done - 1 + a.chunk_tokens) * a.itl_ms / 1e3)
            done = min(n, done + (1 if done == 0 else a.chunk_tokens))
            chunk = {"text": "x" * done, "meta_info": {"prompt_tokens": prompt_tokens, "completion_tokens": done}}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    inflight = {"n": 0}

    async def metrics(_: web.Request) -> web.Response:
        """A few series named as SGLang names them, with values that follow the stub's own counters."""
        text = (
            "# HELP sglang:num_running_reqs The number of running requests.\n"
            "# TYPE sglang:num_running_reqs gauge\n"
            f'sglang:num_running_reqs{{model_name="{a.model}"}} {inflight["n"]}\n'
            "# HELP sglang:cuda_graph_passes The number of forward passes by mode.\n"
            "# TYPE sglang:cuda_graph_passes counter\n"
            f'sglang:cuda_graph_passes_total{{mode="decode_cuda_graph"}} {counter["n"] * 10}\n'
            f'sglang:cuda_graph_passes_total{{mode="decode_none"}} {counter["n"]}\n'
            "# HELP other_metric Not an engine metric.\n# TYPE other_metric gauge\nother_metric 1\n")
        return web.Response(text=text, content_type="text/plain")

    async def server_info(_: web.Request) -> web.Response:
        """The state the launcher told the stub to report (like SGLang's /server_info)."""
        return web.json_response(json.loads(a.state))

    app = web.Application()
    if getattr(a, "state", ""):  # told nothing: no /server_info at all (404), like a server without one
        app.add_routes([web.get("/server_info", server_info)])
    app.add_routes([web.get("/health", health), web.get("/v1/models", models), web.post("/generate", generate),
                    web.get("/metrics", metrics),
                    web.post("/v1/completions", completions), web.post("/v1/chat/completions", completions)])
    return app


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--model", default="stub")
    p.add_argument("--mode", choices=["ok", "exit", "never"], default="ok")
    p.add_argument("--ready-after", type=float, default=0.0)
    p.add_argument("--children", type=int, default=0, help="spawn this many sleeping grandchildren")
    p.add_argument("--ignore-term", action="store_true")
    p.add_argument("--fail-every", type=int, default=0, help="answer every Nth request with HTTP 500")
    p.add_argument("--ttft-ms", type=float, default=0.0)
    p.add_argument("--itl-ms", type=float, default=0.0)
    p.add_argument("--chunk-tokens", type=int, default=1, help="/generate: tokens per streamed chunk after the first")
    p.add_argument("--keepalive-s", type=float, default=75.0, help="close a connection idle this long (uvicorn: 5)")
    p.add_argument("--pid-file", default="")
    p.add_argument("--kv-tokens", type=int, default=0, help="say at startup, as vLLM does, that the KV cache holds so "
                   "many tokens")
    p.add_argument("--perturb-outputs", type=float, default=0.0,
                   help="add this to every prompt log-probability (a configuration that answers wrongly)")
    p.add_argument("--log-prompts", default="", help="append each completion request's prompt to this JSONL file")
    p.add_argument("--mem-fraction", type=float, default=None, help="accepted and ignored (the stub-gpu memory knob)")
    p.add_argument("--max-running", type=int, default=0, help="serve at most this many requests at once (0: no cap)")
    p.add_argument("--fast-once", default="", help="while this file exists: remove it and serve 4x faster")
    p.add_argument("--state", default="", help="JSON served at /server_info (the stub's 'resolved configuration')")
    p.add_argument("--child-sigill-at", type=int, default=0,
                   help="run a worker child that dies from SIGILL at the Nth completion request (1 = the readiness check)")
    p.add_argument("--die-after", type=int, default=0, help="SIGKILL itself at the completion request after the Nth")
    p.add_argument("--stop-after", type=int, default=0, help="SIGSTOP itself at the request after the Nth")
    p.add_argument("--stall-if-file", default="", help="answer nothing while this file exists (a hung server)")
    p.add_argument("--stall-after", type=int, default=0, help="... from the request after the Nth on")
    p.add_argument("--die-if-file", default="", help="only while this file exists (so a rerun of the same point lives)")
    p.add_argument("--slow-on-core", type=int, default=-1,
                   help="when pinned to exactly this core (a replica's share), answer 4x slower: an uneven replica")
    a = p.parse_args()
    if a.slow_on_core >= 0 and os.sched_getaffinity(0) == {a.slow_on_core}:
        a.itl_ms *= 4
        a.ttft_ms = a.ttft_ms * 4 or 2.0
        print(f"stub: pinned to core {a.slow_on_core}: slow", flush=True)
    if a.fast_once and os.path.exists(a.fast_once):
        os.remove(a.fast_once)
        a.itl_ms /= 4
        print("stub: fast, this once", flush=True)
    if a.mode == "exit":
        print("stub: fatal configuration error, exiting", file=sys.stderr, flush=True)
        sys.exit(3)
    if a.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    kids = [subprocess.Popen([sys.executable, "-c", "import signal,time; "
                              + ("signal.signal(signal.SIGTERM, signal.SIG_IGN); " if a.ignore_term else "")
                              + "time.sleep(3600)"]) for _ in range(a.children)]
    worker = None
    if a.child_sigill_at:
        worker = subprocess.Popen([sys.executable, "-c", "import os, signal, sys; sys.stdin.readline(); "
                                   "os.kill(os.getpid(), signal.SIGILL)"], stdin=subprocess.PIPE)
        kids.append(worker)
    _join_mps()
    if a.pid_file:
        with open(a.pid_file, "w") as fh:
            fh.write(" ".join(str(x) for x in [os.getpid(), *[k.pid for k in kids]]))
    if a.kv_tokens:
        print(f"stub: GPU KV cache size: {a.kv_tokens:,} tokens", flush=True)
    print(f"stub: serving on {a.host}:{a.port}", flush=True)
    web.run_app(build_app(a, worker), host=a.host, port=a.port, print=None, handle_signals=not a.ignore_term,
                keepalive_timeout=a.keepalive_s)


def _join_mps() -> None:
    """Behave as a CUDA process does under MPS: where a control daemon listens in CUDA_MPS_PIPE_DIRECTORY (the stub
    control program of tests/mps_stub.py), become a client of its server 1 (the stub answers get_server_list and
    get_client_list from these files); STUB_MPS_CLIENT=0 stays away, as a process that never reached the GPU."""
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
    if not pipe or os.environ.get("STUB_MPS_CLIENT") == "0" or not os.path.exists(
            os.path.join(pipe, "nvidia-cuda-mps-control.pid")):
        return
    with open(os.path.join(pipe, "servers"), "w") as fh:
        fh.write("1\n")
    with open(os.path.join(pipe, "clients-1"), "a") as fh:
        fh.write(f"{os.getpid()}\n")


if __name__ == "__main__":
    main()
