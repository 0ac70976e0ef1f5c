"""Exercise servescope's Nsight Systems paths end to end on the H200 machine.

1. capture range cudaProfilerApi: a torch program that runs kernels, then calls cudaProfilerStart/Stop around
   100 more; only those must be in the report (what an engine's /start_profile does with nsys).
2. a study point with an nsys profile (servescope.profile.window through the store): a real transformers serve
   (no profiler hook, so nsys records the whole run and the window's kernels are kept), loaded, torn down, its
   report exported and the window's kernel table stored with the point.
Usage: python3 check_nsys_session.py OUT
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "lib"))

from servescope.analysis import kernels as ak  # noqa: E402
from servescope.profile import nsys  # noqa: E402

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

    from servescope.context import context
    from servescope.spec import Knobs
    from servescope.study import Arm, run_study

    tiny = {"hidden_size": 512, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64,
            "intermediate_size": 1024, "moe_intermediate_size": 256, "num_experts": 64, "top_k": 8, "dtype": "bfloat16"}
    ctx = context({"name": "transformers", "python": sys.executable, "startup_timeout_s": 300}, {"tiny": tiny},
                  {"concurrency": [4], "num_requests": 16, "input_len": 32, "output_len": 32}, repetitions=1,
                  store_dir=str(out / "store"), profile={"kind": "nsys", "concurrency": 4, "num_requests": 8})
    study = run_study("nsys-check", ctx, [Arm("default", Knobs())])
    print(study.results.profiles.drop(columns=["traces"], errors="ignore").to_string())
    print(study.kernel_summary().round(4).to_string())
    k = study.kernels()
    print(ak.categories(k).round(4).to_string())
    print(ak.moe_path(k).round(4).to_string())


if __name__ == "__main__":
    main(Path(sys.argv[1]))
