"""Small GPU programs to profile on the H200 machine (see record_profiles.sh). Each phase is an NVTX range.

  python3 profile_workloads.py launch_bound   # 2,000 tiny kernels from a Python loop, then a CUDA graph of 500
                                              # tiny kernels replayed 4 times
  python3 profile_workloads.py compute_bound  # 40 bf16 4096^3 matrix products
  python3 profile_workloads.py many_kernels   # 200,000 tiny kernels (half of them as CUDA-graph nodes): export sizes
  python3 profile_workloads.py moe_torch OUT  # the tiny Qwen3-MoE forward under the PyTorch profiler -> OUT
"""

from __future__ import annotations

import sys

import torch


def launch_bound() -> None:
    x = torch.ones(64, 64, device="cuda")
    for _ in range(50):  # warm up outside the ranges
        x.add_(1.0)
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("launch_bound")
    for _ in range(2000):
        x.add_(1.0)
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=torch.cuda.Stream()):
        for _ in range(500):
            x.add_(1.0)
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("graph_replay")
    for _ in range(4):
        g.replay()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()


def compute_bound() -> None:
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        a @ b
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("compute_bound")
    for _ in range(40):
        a @ b
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()


def many_kernels() -> None:
    x = torch.ones(64, 64, device="cuda")
    torch.cuda.nvtx.range_push("many_kernels")
    for _ in range(100_000):
        x.add_(1.0)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=torch.cuda.Stream()):
        for _ in range(1000):
            x.add_(1.0)
    for _ in range(100):
        g.replay()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()


def moe_torch(out: str) -> None:
    sys.path.insert(0, "lib")
    from transformers import AutoModelForCausalLM

    from servescope.models import ensure_tiny_model
    from servescope.spec import TinyModelSpec

    spec = TinyModelSpec(hidden_size=512, num_attention_heads=8, num_key_value_heads=4, head_dim=64,
                         intermediate_size=1024, moe_intermediate_size=256, num_experts=64, top_k=8)
    path = ensure_tiny_model(spec, sys.executable)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda().eval()
    ids = torch.randint(0, 400, (8, 64), device="cuda")
    with torch.no_grad():
        for _ in range(3):
            model(ids)
        torch.cuda.synchronize()
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=acts) as prof:
            for _ in range(3):
                model(ids)
            torch.cuda.synchronize()
    prof.export_chrome_trace(out)
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15))


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "moe_torch":
        moe_torch(sys.argv[2])
    else:
        {"launch_bound": launch_bound, "compute_bound": compute_bound, "many_kernels": many_kernels}[what]()
