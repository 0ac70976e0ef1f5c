"""Record tests/fixtures/peer_bench/: real result files of the engines' own benchmark clients.

Runs `vllm bench serve` (0.32, engine environment) and SGLang 0.4.10's standalone `bench_serving.py` (read from
its wheel, fetched with `pip download --no-deps` into the per-user cache, never committed) against the embedded
vLLM server, with per-request details, on a small workload. Usage: python benchmarks/record_peer_fixtures.py
"""

from __future__ import annotations

import subprocess
import sys
import time
import zipfile
from pathlib import Path

from common import ROOT, engine_python, run_vllm_bench, serve_embedded

from servescope.paths import cache_root

OUT = ROOT / "tests" / "fixtures" / "peer_bench"
SGLANG_WHEEL = "sglang==0.4.10"


def sglang_bench_script() -> Path:
    wheels = cache_root() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    found = sorted(wheels.glob("sglang-0.4.10-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", SGLANG_WHEEL, "-d", str(wheels)],
                       check=True)
        found = sorted(wheels.glob("sglang-0.4.10-*.whl"))
    target = cache_root() / "peers" / "sglang-0.4.10" / "bench_serving.py"
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(found[0]) as z:
        target.write_bytes(z.read("sglang/bench_serving.py"))
    return target


def main() -> int:
    python = engine_python()
    script = sglang_bench_script()
    OUT.mkdir(parents=True, exist_ok=True)
    prep, server = serve_embedded(ROOT / "data" / "runs" / "_bench" / f"peers-{time.strftime('%Y%m%d-%H%M%S')}")
    with server as target:
        run_vllm_bench(python, target.base_url, target.model, prep.model_path, 32, 8, 32, 16, warmups=0,
                       extra=["--save-detailed"], keep=OUT / "vllm_bench_serve.json")
        sgl = OUT / "sglang_bench_serving.jsonl"
        sgl.unlink(missing_ok=True)
        for conc in (2, 8):  # two runs appended to one JSONL, as users collect sweeps
            subprocess.run([python, str(script), "--backend", "vllm", "--base-url", target.base_url,
                            "--model", target.model, "--tokenizer", prep.model_path, "--dataset-name", "random-ids",
                            "--random-input-len", "32", "--random-output-len", "16", "--random-range-ratio", "1",
                            "--num-prompts", "16", "--max-concurrency", str(conc), "--output-file", str(sgl),
                            "--output-details", "--seed", "1"],
                           check=True, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": str(Path.home())})
    for p in sorted(OUT.iterdir()):
        print(p, p.stat().st_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
