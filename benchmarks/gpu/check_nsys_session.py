"""Exercise servescope's Nsight Systems paths end to end on the H200 machine.

1. capture range cudaProfilerApi: a torch program that runs kernels, then calls cudaProfilerStart/Stop around
   100 more; only those must be in the report (what an engine's /start_profile does with nsys).
2. servescope.profile.session.nsys_profile(): a real server (transformers serve, through a small adapter defined
   here: the real one is issue 6's) launched by serve(prefix=nsys ...), loaded, torn down, its report found,
   stats and SQLite read back.
Usage: python3 check_nsys_session.py OUT
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "lib"))

from servescope.analysis import kernels as ak  # noqa: E402
from servescope.engines import register  # noqa: E402
from servescope.engines.base import EngineAdapter, EngineInstall, LaunchPlan  # noqa: E402
from servescope.profile import nsys  # noqa: E402
from servescope.server import ReadyCheck  # noqa: E402

TOY = """
import torch
x = torch.ones(64, 64, device="cuda")
for _ in range(300):
    x.add_(1.0)
torch.cuda.synchronize()
torch.cuda.profiler.start()
for _ in range(100):
    x.mul_(1.0)
torch.cuda.synchronize()
torch.cuda.profiler.stop()
for _ in range(300):
    x.add_(1.0)
torch.cuda.synchronize()
"""


@register
class TransformersServeForCheck(EngineAdapter):
    """Just enough of `transformers serve` to launch it (no profiler hook: nsys records the whole run)."""

    name = "transformers-check"

    def managed_env(self, version):
        return None

    def probe(self, python):
        import transformers

        return EngineInstall(python=python, version=transformers.__version__, distribution="transformers",
                             platform="cuda")

    def knob_flags(self, knobs, install):
        return list(knobs.extra_args)

    def plan(self, *, install, model_path, served_name, host, port, knobs, extra_env):
        cmd = [install.python, "-m", "transformers.cli.transformers", "serve", model_path, "--host", host,
               "--port", str(port), "--continuous-batching", "--device", "cuda", "--dtype", "bfloat16"]
        return LaunchPlan(command=cmd, env=dict(extra_env),
                          ready=ReadyCheck(health_path="/health", models_path=None, generate_path=None), flags=[])


def main(out: Path) -> None:
    exe = nsys.locate_nsys()
    out.mkdir(parents=True, exist_ok=True)
    toy = out / "toy.py"
    toy.write_text(TOY)
    subprocess.run(nsys.profile_prefix(exe, out / "toy", capture_range="cudaProfilerApi") + [sys.executable, str(toy)],
                   check=True, capture_output=True)
    db = nsys.export_sqlite(exe, nsys.find_report(out / "toy"))
    k = nsys.read_kernels(db)
    names = k["name"].astype(str)
    print(f"capture range cudaProfilerApi: {len(k)} kernels, mul {names.str.contains('Mul').sum()}, "
          f"add {names.str.contains('add').sum()}", flush=True)

    from servescope.launch import prepare
    from servescope.profile.session import nsys_profile
    from servescope.spec import EngineSpec, Knobs, LoadSpec, ModelSpec, TinyModelSpec

    spec = TinyModelSpec(hidden_size=512, num_attention_heads=8, num_key_value_heads=4, head_dim=64,
                         intermediate_size=1024, moe_intermediate_size=256, num_experts=64, top_k=8)
    prep = prepare(EngineSpec(name="transformers-check", python=sys.executable, startup_timeout_s=300),
                   ModelSpec(tiny=spec), say=print)
    prep.served_name = prep.model_path  # transformers serve is pinned to the path it was given
    load = LoadSpec(concurrency=(4,), num_requests=16, input_len=32, output_len=32, endpoint="chat",
                    warmup_requests=2, ignore_eos=False)
    p = nsys_profile(prep, Knobs(), load, out / "server", say=print)
    kk = ak.with_categories(p.kernels)
    print(f"nsys_profile: {p.notes}; files {[f.name for f in p.files]}; {len(kk)} kernels; "
          f"stats kernels {p.stats['cuda_gpu_kern_sum']['Instances'].sum()}; NVTX {sorted(set(p.nvtx['text']))[:6]}")
    print(p.load_summary[["point", "completed", "output_tok_s"]].to_string())
    print("load phases on the nsys timeline:\n" + p.phases.to_string())
    print(ak.busy_by_range(kk, p.phases)[["range", "kernels", "busy_fraction", "kernel_us_p50",
                                          "idle_gap_us_p50"]].round(4).to_string())
    print(ak.moe_path(kk).round(4).to_string())


if __name__ == "__main__":
    main(Path(sys.argv[1]))
