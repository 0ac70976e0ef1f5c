"""Record one known-answer case per GPU regime on a real GPU: workloads whose regime is known by construction,
measured with servescope's own telemetry (NVML with GPM, the host sampler on this process) and a short PyTorch
profiler window. Writes, per case, under OUT/<case>/: the telemetry frames (parquet), kernels.parquet and
runtime.parquet from the trace window, and case.json (what was run, what it achieved, the answer by construction).

    python3 benchmarks/gpu/record_regimes.py --out $OUT/regimes [--seconds 8] [--cases idle,host-bound,...]

Cases:
  idle                    no work is offered: the "load" sends nothing for the window.
  host-bound              a Python thread spends ~5 ms of pure-Python work per step and launches one small matmul.
  launch-bound            a tight loop of one-element kernels: each runs for a few microseconds, less than it
                          takes the host to launch the next.
  memory-bandwidth-bound  device-to-device copies of 4 GiB tensors; achieved bandwidth against the GPU's peak.
  compute-bound           back-to-back FP32 (CUDA-core) matmuls of 8192^3; achieved TFLOP/s.
  power-capped            back-to-back bf16 matmuls of 8192^3, which draw the H200's 700 W limit.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "lib"))

import torch  # noqa: E402

from servescope.profile.torch_trace import kernels_from_events, read_events, runtime_from_events  # noqa: E402
from servescope.telemetry.monitor import Telemetry  # noqa: E402

PEAK_DRAM_GB_S = {"H200": 4800.0, "H100": 3350.0}  # vendor datasheet figures (SXM)


def _peak(name: str) -> float:
    return next((v for k, v in PEAK_DRAM_GB_S.items() if k in name), float("nan"))


class Work:
    """A workload that runs on its own thread until stopped, counting its steps."""

    def __init__(self, step: Any, setup: Any = None) -> None:
        self.step, self.setup = step, setup
        self.steps = 0
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="work", daemon=True)

    def _run(self) -> None:
        state = self.setup() if self.setup else None
        while not self._stop.is_set():
            self.step(state)
            self.steps += 1
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def start(self) -> Work:
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.thread.join()


def _python_work(ms: float) -> int:
    t_end = time.perf_counter() + ms / 1e3
    n = 0
    while time.perf_counter() < t_end:
        n += sum(i * i for i in range(200))
    return n


def workloads(dev: str = "cuda") -> dict[str, tuple[Any, Any, str]]:
    """name -> (setup, step, construction in words); dev other than cuda only to smoke-test this script."""

    def host_setup() -> Any:
        return torch.randn(2048, 2048, device=dev, dtype=torch.bfloat16)

    def host_step(a: Any) -> None:
        _python_work(5.0)
        torch.mm(a, a)

    def launch_setup() -> Any:
        return torch.zeros(1, device=dev)

    def launch_step(x: Any) -> None:
        for _ in range(100):
            x.add_(1.0)

    def mem_setup() -> Any:
        n = 2 * 2**30 if dev == "cuda" else 2**20  # 2 Gi elements of fp16 = 4 GiB per tensor
        return torch.empty(n, device=dev, dtype=torch.float16), torch.empty(n, device=dev, dtype=torch.float16)

    def mem_step(ab: Any) -> None:
        ab[1].copy_(ab[0])

    def gemm_setup() -> Any:
        m = 8192 if dev == "cuda" else 256
        a = torch.randn(m, m, device=dev, dtype=torch.bfloat16)
        return a, torch.randn(m, m, device=dev, dtype=torch.bfloat16), torch.empty_like(a)

    def gemm_step(abc: Any) -> None:
        for _ in range(8):
            torch.mm(abc[0], abc[1], out=abc[2])
        if dev == "cuda":
            torch.cuda.synchronize()  # keep the queue short, so stopping does not wait out a thousand matmuls

    def fp32_setup() -> Any:
        torch.backends.cuda.matmul.allow_tf32 = False  # CUDA-core FP32: SMs busy, tensor pipes idle, under the cap
        m = 8192 if dev == "cuda" else 256
        a = torch.randn(m, m, device=dev)
        return a, torch.randn(m, m, device=dev), torch.empty_like(a)

    return {
        "idle": (None, None, "no work offered: the load generator sends no request during the window"),
        "host-bound": (host_setup, host_step, "one Python thread: ~5 ms of pure-Python work per step, then one "
                                              "2048x2048 bf16 matmul (a few microseconds of GPU work)"),
        "launch-bound": (launch_setup, launch_step, "a tight loop of one-element in-place adds: each kernel runs a "
                                                    "few microseconds, less than one launch takes on the host"),
        "memory-bandwidth-bound": (mem_setup, mem_step, "device-to-device copies of 4 GiB fp16 tensors"),
        "compute-bound": (fp32_setup, gemm_step, "back-to-back FP32 matmuls on CUDA cores (TF32 off), 8192^3"),
        "power-capped": (gemm_setup, gemm_step, "back-to-back bf16 tensor-core matmuls, 8192^3: on the H200 they "
                                                "draw the 700 W limit (recorded 2026-12-01: SW power cap set, SM "
                                                "clock at 74% of max)"),
    }


def _achieved(name: str, steps: int, seconds: float) -> dict[str, float]:
    if name == "memory-bandwidth-bound":
        gb = steps * 2 * 4 * 2**30 / 1e9  # every copy reads 4 GiB and writes 4 GiB
        return {"achieved_dram_gb_s": gb / seconds}
    if name in ("compute-bound", "power-capped"):
        return {"achieved_tflop_s": 8 * steps * 2 * 8192**3 / seconds / 1e12}
    return {"steps_per_s": steps / seconds}


def child(name: str, out: Path, seconds: float, trace_s: float, dev: str) -> None:
    """The workload's own process (as a server is): runs the work, tells the parent its phases on stdout, takes
    the profiler window, and leaves the trace and its step counts in out."""
    setup, step, _ = workloads(dev)[name]
    work = Work(step, setup) if step else None
    if work:
        print("phase warmup:load", flush=True)
        work.start()
        time.sleep(1.0)  # allocation and first launches: not part of the measured phase
    print("phase load", flush=True)
    t0 = time.perf_counter()
    steps0 = work.steps if work else 0
    time.sleep(seconds / 2)
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                              torch.profiler.ProfilerActivity.CUDA])
    with prof:
        time.sleep(trace_s)
    time.sleep(max(0.0, seconds / 2 - trace_s))
    steps = (work.steps if work else 0) - steps0
    dt = time.perf_counter() - t0
    print("phase idle", flush=True)
    if work:
        work.stop()
    trace = out / "trace.json"
    prof.export_chrome_trace(str(trace))
    (out / "child.json").write_text(json.dumps({"steps": steps, "seconds": dt}))


def record(name: str, out: Path, seconds: float, trace_s: float, dev: str = "cuda") -> dict[str, Any]:
    """Run one case in a child process under telemetry (NVML with GPM; the host sampler on the child, as on a
    server) and a profiler window; write its files; return its case record."""
    _, _, construction = workloads(dev)[name]
    out.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, __file__, "--child", name, "--out", str(out), "--seconds",
                             str(seconds), "--trace-s", str(trace_s), "--device", dev],
                            stdout=subprocess.PIPE, text=True)
    tel = Telemetry(gpu=True, gpu_hz=10.0, host_hz=5.0, server_pid=proc.pid).start()
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("phase "):
            tel.set_phase(line.split(None, 1)[1].strip())
    proc.wait()
    time.sleep(0.5)
    tel.stop()
    if proc.returncode:
        raise RuntimeError(f"workload process exited with {proc.returncode}")
    for k, df in tel.frames().items():
        if not df.empty:
            df.to_parquet(out / f"{k}.parquet", index=False)
    trace = out / "trace.json"
    ev = read_events(trace)
    kern, rt = kernels_from_events(ev), runtime_from_events(ev)
    kern.to_parquet(out / "kernels.parquet", index=False)
    rt.to_parquet(out / "runtime.parquet", index=False)
    # the window is the profiler's whole trace (every event, CPU ops included), in the kernel table's time base
    allev = [e for e in json.loads(trace.read_text()).get("traceEvents", []) if "ts" in e and e.get("ph") == "X"]
    origin = float(ev["ts_us"].min()) if len(ev) else 0.0
    window_ns = [int((min(float(e["ts"]) for e in allev) - origin) * 1e3),
                 int((max(float(e["ts"]) + float(e.get("dur", 0)) for e in allev) - origin) * 1e3)] if allev else None
    trace.unlink()
    ch = json.loads((out / "child.json").read_text())
    (out / "child.json").unlink()
    steps, dt = ch["steps"], ch["seconds"]
    static = tel.frames().get("gpu_static")
    gpu_name = str(static["name"].iloc[0]) if static is not None and not static.empty else ""
    rec = {"case": name, "expected_regime": name, "construction": construction, "seconds": dt, "steps": steps,
           **_achieved(name, steps, dt), "gpu": gpu_name, "peak_dram_gb_s": _peak(gpu_name),
           "trace_window_ns": window_ns, "trace_s": trace_s, "kernels_in_trace": len(kern),
           # the load generator's record: the idle case offers nothing; the others count a step as a request
           "load": {"requests_sent": 0 if name == "idle" else steps, "requests_completed": 0 if name == "idle"
                    else steps, "requests_failed": 0},
           "telemetry_status": tel.status, "torch": torch.__version__, "recorded": time.strftime("%Y-%m-%d")}
    (out / "case.json").write_text(json.dumps(rec, indent=1, default=str))
    return rec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--trace-s", type=float, default=0.05)
    ap.add_argument("--cases", default=",".join(workloads()))
    ap.add_argument("--device", default="cuda", help="cpu: smoke-test the script on a machine without a GPU")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child, a.out, a.seconds, a.trace_s, a.device)
        return 0
    for name in a.cases.split(","):
        t = time.time()
        try:
            rec = record(name, a.out / name, a.seconds, a.trace_s, a.device)
            extra = {k: round(v, 1) for k, v in rec.items() if k.startswith(("achieved", "steps_per"))}
            print(f"{name}: {time.time() - t:.0f} s, {rec['kernels_in_trace']} kernels in trace, {extra}",
                  flush=True)
        except Exception as e:  # one case failing must not lose the others
            print(f"{name}: FAILED {type(e).__name__}: {e}", flush=True)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
