"""A stub that speaks SGLang's HTTP protocol (never for measurements): the OpenAI routes and /generate of
stub_server.py, plus /health_generate, /server_info (or only /get_server_info, as 0.4.x), /start_profile and
/stop_profile (writing a small Chrome trace into output_dir), and sglang:* /metrics. Its command line is
`sglang.launch_server`'s: it accepts any --flag [value] and reports them back, resolved, in /server_info, so the
adapter's command, readiness, resolved-config, profiler and log paths are exercised without a GPU.

Resolution rules it imitates (from the real source): attention backend torch_native turns CUDA graphs off, with
SGLang's own warning line; --enable-torch-compile turns piecewise graphs off (0.5.9's rule). With --nnodes > 1 each
rank prints what it received (its argv and environment) and only rank 0 serves, as SGLang's own multi-node launch.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import signal
import sys
import time
from pathlib import Path

from aiohttp import web

sys.path.insert(0, str(Path(__file__).parent))
from stub_server import build_app  # noqa: E402


def parse_launch_args(argv: list[str]) -> dict:
    """--a-b value / --flag into {'a_b': value, 'flag': True} (values parsed as JSON where they are)."""
    out: dict = {}
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok.startswith("--"):
            key = tok[2:].replace("-", "_")
            if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                raw = argv[i + 1]
                try:
                    out[key] = json.loads(raw)
                except ValueError:
                    out[key] = raw
                i += 2
                continue
            out[key] = True
        i += 1
    return out


def _per_phase(version: str) -> bool:
    return tuple(int(x) for x in version.split(".")[:3]) >= (0, 5, 14)


def resolve(args: dict, version: str) -> dict:
    """The resolved server args an SGLang of that version would report, as far as the stub models it."""
    r = {"attention_backend": "flashinfer", "disable_cuda_graph": False, "enable_torch_compile": False,
         "cuda_graph_max_bs": 160, "moe_runner_backend": "auto", "tp_size": 1, "dp_size": 1} | args
    notes = []
    if _per_phase(version):  # 0.5.14+: per-phase backends folded into cuda_graph_config (server_args.py)
        dec = r.get("cuda_graph_backend_decode") or "full"
        pre = r.get("cuda_graph_backend_prefill") or "breakable"
        if r["disable_cuda_graph"]:
            dec = pre = "disabled"
        if r.get("disable_prefill_cuda_graph"):
            pre = "disabled"
        r["cuda_graph_config"] = {"decode": {"backend": dec, "max_bs": r.get("cuda_graph_max_bs_decode") or 160},
                                  "prefill": {"backend": pre, "max_bs": 4096}}
    if r["attention_backend"] == "torch_native":
        r["disable_cuda_graph"] = True
        notes.append("Cuda graph is disabled because of using torch native attention backend")
    if r.get("enable_piecewise_cuda_graph") and r["enable_torch_compile"]:
        r["enable_piecewise_cuda_graph"] = False
        notes.append("Disable piecewise CUDA graph because piecewise_cuda_graph has conflict with torch compile")
    r["version"] = version
    return {"resolved": r, "notes": notes}


def main() -> None:
    argv = sys.argv[1:]
    args = parse_launch_args(argv)
    version = str(args.pop("stub_version", "0.5.9"))
    if int(args.get("nnodes", 1)) > 1:  # SGLang's multi-node launch: each rank records what it received
        seen = {"node_rank": int(args.get("node_rank", 0)), "argv": argv,
                "env": {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "PYTHONPATH")}}
        print(f"[stub rank] {json.dumps(seen)}", file=sys.stderr, flush=True)
        if seen["node_rank"] > 0:  # no HTTP on the other ranks: they serve through rank 0
            while True:
                time.sleep(3600)
    res = resolve(args, version)
    for line in res["notes"]:
        print(f"[2026-11-30 12:00:00] WARNING server_args.py: {line}", file=sys.stderr, flush=True)
    cfg = res["resolved"].get("cuda_graph_config")
    if cfg:  # 0.5.17's startup lines (model_runner.py, cuda_graph_setup.py)
        say = lambda m: print(f"[2026-11-30 12:00:00] {m}", file=sys.stderr, flush=True)  # noqa: E731
        say("Load weight end. elapsed=1.25 s, type=Qwen3MoeForCausalLM, avail mem=120.00 GB, mem usage=4.70 GB.")
        for phase in ("decode", "prefill"):
            backend = cfg[phase]["backend"]
            if backend != "disabled":
                say(f"Capture target {phase} CUDA graph begin. backend={backend}, avail mem=100.00 GB")
                say(f"Capture target {phase} CUDA graph end. elapsed=2.50 s, mem usage=0.50 GB, avail mem=99.50 GB.")
        if cfg["prefill"]["backend"] == "full" and res["resolved"].get("attention_backend") == "triton":
            # what the real 0.5.17 does with full prefill graphs on triton attention: the scheduler raises at the
            # warm-up's first prefill replay, and the launcher kills its own tree
            print("[2026-11-30 12:00:01] Scheduler hit an exception: Traceback (most recent call last):\n"
                  '  File "/site/sglang/srt/managers/scheduler.py", line 3300, in run_batch\n'
                  "    batch_result = self.model_worker.forward_batch_generation(batch)\n"
                  '  File "/site/sglang/srt/layers/attention/triton_backend.py", line 1202, in '
                  "_init_forward_metadata_cuda_graph\n"
                  '    raise ValueError(\n'
                  "ValueError: Invalid forward mode: forward_mode=<ForwardMode.EXTEND: 1> for CUDA Graph replay.",
                  file=sys.stderr, flush=True)
            say("Received sigquit from a child process. It usually means the child failed.")
            os.kill(os.getpid(), signal.SIGKILL)
    a = argparse.Namespace(port=int(args["port"]), host=args.get("host", "127.0.0.1"),
                           model=args.get("served_model_name") or args.get("model_path", "stub"), mode="ok",
                           ready_after=0.0, fail_every=0, ttft_ms=0.0, itl_ms=1.0, chunk_tokens=1)
    app = build_app(a)
    prof: dict = {}
    if cfg:
        @web.middleware
        async def batch_lines(request: web.Request, handler):  # SGLang logs each batch with its graph use
            if request.path.startswith(("/v1/", "/generate")):
                pre, dec = cfg["prefill"]["backend"] != "disabled", cfg["decode"]["backend"] != "disabled"
                print(f"[2026-11-30 12:00:02] Prefill batch, #new-seq: 1, #new-token: 8, #cached-token: 0, "
                      f"#running-req: 0, #queue-req: 0, cuda graph: {pre}, input throughput (token/s): 0.00",
                      file=sys.stderr, flush=True)
                print(f"[2026-11-30 12:00:02] Decode batch, #running-req: 1, #token: 9, token usage: 0.00, "
                      f"cuda graph: {dec}, gen throughput (token/s): 0.00, #queue-req: 0", file=sys.stderr, flush=True)
            return await handler(request)
        app.middlewares.append(batch_lines)

    async def server_info(_: web.Request) -> web.Response:
        return web.json_response({**res["resolved"], "internal_states": [{"last_gen_throughput": 0.0}]})

    async def health_generate(_: web.Request) -> web.Response:
        return web.Response(status=200)

    async def start_profile(req: web.Request) -> web.Response:
        body = await req.json() if req.can_read_body else {}
        prof.update(body=body, t0=time.time())
        print(f"[2026-11-30 12:00:01] Profiling starts. Traces will be saved to: {body.get('output_dir')}",
              file=sys.stderr, flush=True)
        return web.Response(text="Start profiling.\n")

    async def stop_profile(_: web.Request) -> web.Response:
        body = prof.get("body") or {}
        out = Path(body.get("output_dir") or "/tmp")
        out.mkdir(parents=True, exist_ok=True)
        if "CUDA_PROFILER" not in body.get("activities", []):
            t0 = 1_000_000.0
            events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": t0, "dur": 50,
                       "args": {"External id": 7}},
                      {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t0 + 5,
                       "dur": 4, "args": {"correlation": 11, "External id": 7}},
                      {"ph": "X", "cat": "kernel", "name": "fused_moe_kernel", "pid": 0, "tid": 7, "ts": t0 + 12,
                       "dur": 30, "args": {"correlation": 11, "device": 0, "stream": 7, "External id": 7}},
                      {"ph": "X", "cat": "kernel", "name": "nvjet_sm90_tst_64x8", "pid": 0, "tid": 7, "ts": t0 + 45,
                       "dur": 10, "args": {"correlation": 12, "device": 0, "stream": 7}}]
            with gzip.open(out / f"{int(prof.get('t0', 0))}-TP-0.trace.json.gz", "wt") as fh:
                json.dump({"traceEvents": events}, fh)
        return web.Response(text="Stop profiling. This will take some time.\n")

    routes = [web.get("/health_generate", health_generate), web.post("/start_profile", start_profile),
              web.post("/stop_profile", stop_profile), web.get("/get_server_info", server_info)]
    if not version.startswith("0.4"):
        routes.append(web.get("/server_info", server_info))
    app.add_routes(routes)
    print("[2026-11-30 12:00:00] The server is fired up and ready to roll!", file=sys.stderr, flush=True)
    web.run_app(app, host=a.host, port=a.port, print=None)


if __name__ == "__main__":
    main()
