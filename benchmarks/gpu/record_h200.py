"""Record real telemetry on the H200 machine (run there through the `device` tool; see ../../data/reference/README.md).

Stages, each one independent (a failure is logged and the next runs):
  1. synthetic loads on every visible GPU at once, each ~S seconds, tagged as phases:
     idle; launch_bound (a Python loop of tiny kernels: the GPU idles between launches);
     stalled (a CUDA graph of 2,000 tiny kernels replayed back to back: busy GPU, little power);
     compute_bound (8192^3 bf16 matrix products: power at the limit).
  2. the NVML sampler's own overhead with the real NVML (bench_telemetry.py).
  3. a real server: `transformers serve` with a generated tiny MoE, driven by servescope's load generator at
     several concurrencies while telemetry runs.
Everything lands in OUT_DIR (tables as CSV/parquet, a log); pack it with tar afterwards.
Usage: python3 record_h200.py OUT_DIR [--seconds 12]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "lib"))

from servescope.telemetry import Telemetry  # noqa: E402


def log(msg: str) -> None:
    print(time.strftime("%H:%M:%S"), msg, flush=True)


def synthetic(out: Path, seconds: float) -> None:
    import torch

    n = torch.cuda.device_count()
    log(f"torch {torch.__version__}, {n} GPUs: {[torch.cuda.get_device_name(i) for i in range(n)]}")
    stop = threading.Event()
    mode = {"name": "idle"}

    capture_lock = threading.Lock()  # graph capture must not overlap other threads' CUDA calls

    def worker(dev: int) -> None:
        torch.cuda.set_device(dev)
        small = torch.ones(64, 64, device="cuda")
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        g = torch.cuda.CUDAGraph()
        with capture_lock:
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                for _ in range(3):
                    small.add_(1.0)
            torch.cuda.synchronize()
            # torch caches one default capture stream, made on the first GPU that captured: give each its own
            with torch.cuda.graph(g, stream=torch.cuda.Stream(device=dev), capture_error_mode="thread_local"):
                for _ in range(2000):
                    small.add_(1.0)
            torch.cuda.synchronize()
        log(f"GPU {dev}: graph of 2000 kernels captured")
        while not stop.is_set():
            m = mode["name"]
            if m == "launch_bound":
                for _ in range(200):
                    small.add_(1.0)
                torch.cuda.synchronize()
            elif m == "stalled":
                for _ in range(5):
                    g.replay()
                torch.cuda.synchronize()
            elif m == "compute_bound":
                for _ in range(4):
                    a @ b
                torch.cuda.synchronize()
            else:
                time.sleep(0.01)

    threads = [threading.Thread(target=worker, args=(d,), daemon=True) for d in range(n)]
    for t in threads:
        t.start()
    time.sleep(8)  # allocations and graph capture before anything is recorded
    with Telemetry(gpu_hz=20, host_hz=2, server_pid=None) as tel:
        for name in ("idle", "launch_bound", "stalled", "compute_bound", "idle_after"):
            mode["name"] = name if name != "idle_after" else "idle"
            tel.set_phase(name)
            log(f"phase {name}")
            time.sleep(seconds if not name.startswith("idle") else 4)
    stop.set()
    for t in threads:
        t.join(timeout=30)
    f = tel.frames()
    f["gpu"].to_csv(out / "synthetic_gpu.csv", index=False)
    (out / "synthetic_gpu.static.json").write_text(json.dumps(f["gpu_static"].to_dict("records"), indent=1))
    (out / "synthetic_status.json").write_text(json.dumps(tel.status, indent=1, default=str))
    log(f"synthetic: {len(f['gpu'])} GPU rows; status {tel.status}")


def overhead() -> None:
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_telemetry.py"), "--seconds", "5"],
                       capture_output=True, text=True)
    log("bench_telemetry (real NVML):\n" + r.stdout + r.stderr[-2000:])


def server(out: Path, duration_s: float, python: str, device: str) -> None:
    from servescope.load import load_tokenizer, run_sweep
    from servescope.models import ensure_tiny_model
    from servescope.server import ManagedServer, ReadyCheck, free_port
    from servescope.spec import LoadSpec, TinyModelSpec

    spec = TinyModelSpec(hidden_size=512, num_attention_heads=8, num_key_value_heads=4, head_dim=64,
                         intermediate_size=1024, moe_intermediate_size=256, num_experts=64, top_k=8)
    t0 = time.monotonic()
    model = ensure_tiny_model(spec, python)
    log(f"tiny model built in {time.monotonic() - t0:.0f} s: {model}")
    port = free_port()
    cmd = [python, "-m", "transformers.cli.transformers", "serve", str(model), "--host", "127.0.0.1",
           "--port", str(port), "--continuous-batching", "--device", device, "--dtype", "bfloat16"]
    srv = ManagedServer(command=cmd, port=port, log_dir=out / "server", model=str(model), startup_timeout_s=300,
                        ready=ReadyCheck(health_path="/health", models_path=None, generate_path=None))
    load = LoadSpec(concurrency=(1, 8, 32), num_requests=64, duration_s=duration_s, input_len=64, output_len=64,
                    endpoint="chat", warmup_requests=4, request_timeout_s=120,
                    ignore_eos=False)  # transformers serve rejects ignore_eos and min_tokens (HTTP 422)
    with srv:
        log(f"transformers serve ready in {srv.timings.health_s:.0f} s")
        with Telemetry(gpu_hz=20, host_hz=2, server_pid=srv.proc.pid, metrics_url=None) as tel:
            res = run_sweep(srv.base_url, str(model), load, load_tokenizer(model), progress=False,
                            on_phase=tel.set_phase)
    summ = res.summary()
    cols = ["point", "completed", "failed", "output_tok_s", "ttft_ms_p50", "tpot_ms_p50", "mean_output_tokens",
            "client_cpu_pct", "loop_lag_ms_p99"]
    log("server load summary:\n" + summ[[c for c in cols if c in summ]].to_string(index=False))
    res.requests.to_parquet(out / "server_requests.parquet", index=False)
    summ.to_parquet(out / "server_summary.parquet", index=False)
    f = tel.frames()
    f["gpu"].to_csv(out / "server_gpu.csv", index=False)
    (out / "server_gpu.static.json").write_text(json.dumps(f["gpu_static"].to_dict("records"), indent=1))
    for name in ("server_procs", "server_threads", "host_cpu"):
        if not f[name].empty:
            f[name].to_csv(out / f"server_{name}.csv", index=False)
    (out / "server_status.json").write_text(json.dumps(tel.status, indent=1, default=str))
    (out / "server_model.json").write_text(json.dumps(spec.model_dump(), indent=1))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seconds", type=float, default=12.0)
    ap.add_argument("--server-seconds", type=float, default=20.0)
    ap.add_argument("--skip", action="append", default=[])
    ap.add_argument("--serve-python", default=sys.executable, help="interpreter with torch+transformers for the server")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, fn in (("synthetic", lambda: synthetic(out, a.seconds)), ("overhead", overhead),
                     ("server", lambda: server(out, a.server_seconds, a.serve_python, a.device))):
        if name in a.skip:
            continue
        try:
            fn()
        except Exception:
            log(f"stage {name} failed:\n{traceback.format_exc()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
