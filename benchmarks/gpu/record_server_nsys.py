"""A real server under Nsight Systems on the H200 machine, with servescope's load generator in the profiled process.

  python3 record_server_nsys.py harness OUT   # (run under nsys) launch transformers serve, load it, exit
  python3 record_server_nsys.py run OUT       # build the nsys commands with servescope and run both captures:
        nvtx:   --capture-range=nvtx on the load generator's 'servescope c=8' range (the client marks its points)
        window: the whole program (startup included), to compare against
      then nsys stats + SQLite export, and servescope's kernel analysis of each, printed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "lib"))


def harness(out: Path) -> None:
    from servescope.load import load_tokenizer, run_sweep
    from servescope.models import ensure_tiny_model
    from servescope.server import ManagedServer, ReadyCheck, free_port
    from servescope.spec import LoadSpec, TinyModelSpec

    spec = TinyModelSpec(hidden_size=512, num_attention_heads=8, num_key_value_heads=4, head_dim=64,
                         intermediate_size=1024, moe_intermediate_size=256, num_experts=64, top_k=8)
    model = ensure_tiny_model(spec, sys.executable)
    port = free_port()
    cmd = [sys.executable, "-m", "transformers.cli.transformers", "serve", str(model), "--host", "127.0.0.1",
           "--port", str(port), "--continuous-batching", "--device", "cuda", "--dtype", "bfloat16"]
    load = LoadSpec(concurrency=(8,), num_requests=64, duration_s=6, input_len=64, output_len=64, endpoint="chat",
                    warmup_requests=8, ignore_eos=False)
    with ManagedServer(command=cmd, port=port, log_dir=out / "server", model=str(model), startup_timeout_s=300,
                       ready=ReadyCheck(health_path="/health", models_path=None, generate_path=None)) as srv:
        t0 = time.time()
        res = run_sweep(srv.base_url, str(model), load, load_tokenizer(model), progress=False)
        print(f"load ran {time.time() - t0:.1f} s:", res.summary()[["point", "completed", "output_tok_s"]].to_string(),
              flush=True)


def analyse(out: Path, name: str) -> None:
    from servescope.analysis import kernels as ak
    from servescope.profile import nsys

    exe = nsys.locate_nsys()
    report = nsys.find_report(out / name)
    nsys.stats(exe, report, out / f"{name}_stats")
    db = nsys.export_sqlite(exe, report)
    k = ak.with_categories(nsys.read_kernels(db))
    nv = nsys.read_nvtx(db)
    print(f"== {name}: {len(k)} kernels, NVTX ranges: {nv['text'].tolist()[:8]}")
    window = nv[nv["text"] == "servescope c=8"]
    s, e = (int(window["start_ns"].iloc[0]), int(window["end_ns"].iloc[0])) if len(window) else (None, None)
    print(ak.busy(k, s, e).round(4).to_string())
    print(json.dumps(ak.launch_overhead(nsys.read_runtime(db), k, s, e)))
    print(ak.categories(ak.clip(k, s, e)).round(4).to_string())
    print(ak.moe_path(ak.clip(k, s, e)).round(4).to_string())


def run(out: Path) -> None:
    from servescope.profile import nsys

    exe = nsys.locate_nsys()
    prog = [sys.executable, str(Path(__file__).resolve()), "harness", str(out)]
    variants = {
        "nvtx": nsys.profile_prefix(exe, out / "nvtx", nvtx_capture="servescope c=8@servescope"),
        "window": nsys.profile_prefix(exe, out / "window"),  # the whole program, for comparison
    }
    for name, prefix in variants.items():
        t0 = time.time()
        r = subprocess.run(prefix + prog, capture_output=True, text=True)
        print(f"-- {name}: rc={r.returncode} in {time.time() - t0:.0f} s\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}",
              flush=True)
        try:
            analyse(out, name)
        except Exception as e:  # keep the other variant
            print(f"analysis of {name} failed: {type(e).__name__}: {e}", flush=True)


if __name__ == "__main__":
    {"harness": harness, "run": run}[sys.argv[1]](Path(sys.argv[2]))
