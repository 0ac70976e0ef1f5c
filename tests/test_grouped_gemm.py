"""Thread 6's verdicts on traces recorded on this CPU (tests/fixtures/moe_paths) and on the H200 (a real
transformers serve capture: torch _grouped_mm), and the model facts it reads."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from servescope.profile import nsys
from servescope.profile.torch_trace import read_kernels
from servescope.spec import ModelSpec
from servescope.threads import grouped_gemm as t06

FIX = Path(__file__).parent / "fixtures"
META = json.loads((FIX / "moe_paths" / "meta.json").read_text())
SHAPE = t06.MoeShape(META["experts"], META["top_k"], META["hidden"], META["inter"], META["layers"], META["layers"],
                     "float32")


def _verdict(impl: str) -> tuple[dict, dict]:
    info = t06.path_of(read_kernels(FIX / "moe_paths" / f"{impl}.json.gz"), SHAPE)
    return info, t06.verdict(info, SHAPE)


def test_transformers_eager_experts_on_cpu_are_a_per_expert_loop():
    info, v = _verdict("eager")
    assert info["steps"] == META["forward_steps"] and "scaled_dot_product_attention" in info["steps_from"]
    assert v["verdict"] == "per-expert" and v["dense_per_layer_step"] > v["threshold"] == 8 + META["top_k"]
    assert 0 < v["expert_share"] < 1
    probe = pd.DataFrame([{"tokens": 4, "speedup": 2.0}])  # with a probe, the saving is half the experts' share
    v2 = t06.verdict(info, SHAPE, probe)
    assert v2["saving_share"] == pytest.approx(v["expert_share"] / 2)


def test_transformers_grouped_mm_on_cpu_is_already_grouped_two_launches_per_layer_step():
    info, v = _verdict("grouped_mm")
    assert v == {"verdict": "already grouped", "paths": ["torch_grouped_mm"]}
    assert info["moe_launches_per_layer_step"] == 2.0 and 0 < info["moe_share"] < 1


def test_a_batched_bmm_is_not_claimed_either_way():
    _, v = _verdict("batched_mm")
    assert v["verdict"] == "undecided" and "do not show a per-expert loop" in v["why"]


def test_transformers_serve_on_the_h200_runs_grouped_mm():
    """The real server capture (1 s of c=8 on the H200; tests/fixtures/h200_profiles): CUTLASS grouped GEMM from
    torch._grouped_mm, already grouped."""
    k = nsys.read_kernels(FIX / "h200_profiles" / "transformers_serve_c8_1s.sqlite")
    shape = t06.MoeShape(64, 8, 512, 128, 4, 4, "bfloat16")
    info = t06.path_of(k, shape)
    assert t06.verdict(info, shape)["verdict"] == "already grouped" and info["grouped_paths"] == ["torch_grouped_mm"]
    assert info["device"] == "GPU" and 0 < info["moe_share"] < 0.5


def test_not_moe_and_model_facts(tmp_path):
    dense = t06.MoeShape(0, 0, 128, 256, 4, 0, "bfloat16")
    assert t06.verdict({}, dense)["verdict"] == "not MoE"
    cfg = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_hidden_layers": 6,
           "hidden_size": 64, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
           "decoder_sparse_step": 1, "mlp_only_layers": [0, 5], "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    s = t06.shape_of(ModelSpec(path=str(tmp_path)))
    assert (s.experts, s.top_k, s.layers, s.moe_layers, s.inter) == (8, 2, 6, 4, 32) and s.is_moe
    tiny = t06.shape_of(ModelSpec(tiny={}))
    assert (tiny.experts, tiny.top_k, tiny.moe_layers, tiny.dtype) == (16, 4, 4, "bfloat16")


def test_the_profiled_point_loads_only_the_windows_level():
    """06 reads the profiled window alone: its point runs the window's level (the load's highest, or the profile's
    own), not the lower levels threads 01-05 measured; an open-loop load is left as it is."""
    from servescope.spec import LoadSpec, ProfileSpec

    load = LoadSpec(concurrency=(1, 4, 16), num_requests=32)
    assert t06.profiled_load(ProfileSpec(kind="torch"), load).concurrency == (16,)
    assert t06.profiled_load(ProfileSpec(kind="torch", concurrency=4), load).concurrency == (4,)
    assert t06.profiled_load(ProfileSpec(kind="torch"), load).num_requests == 32
    open_loop = LoadSpec(mode="open", request_rate=(2.0, 8.0), max_concurrency=8)
    assert t06.profiled_load(ProfileSpec(kind="nsys"), open_loop) == open_loop


def test_the_moe_launches_per_layer_step_name_the_kernels_that_make_them():
    """The same Triton fused-MoE path reads 5.0 launches per MoE layer per step on SGLang 0.5.17 and 7.0 on vLLM 0.26
    (H200 recordings): each page names the kernels behind its number, so the difference is seen (vLLM files its
    top-k gating, activation and expert sum in the MoE category), and kernel names are shortened to their function."""
    from servescope.findings import read_findings
    from servescope.threads.grouped_gemm import kernel_label

    assert kernel_label("void at::native::(anonymous namespace)::sort_kernel<c10::BFloat16>(int)") == "sort_kernel"
    assert kernel_label("void vllm::moe::topkGating<8>(float*)") == "topkGating"
    assert kernel_label("void <unnamed>::act_and_mul_kernel<__nv_bfloat16, (bool)1>(<unnamed>::P)") == "act_and_mul_kernel"
    ref = Path(__file__).resolve().parents[1] / "data" / "reference"
    sg = read_findings(ref / "sglang-h200" / "report" / "06_grouped_gemm.findings.json")[0].headline
    vl = read_findings(ref / "vllm-h200" / "report" / "06_grouped_gemm.findings.json")[0].headline
    assert "5.0 MoE launches per MoE layer per step (fused_moe_kernel 2.0, moe_align_block_size_kernel 1.0" in sg
    assert "7.0 MoE launches per MoE layer per step (fused_moe_kernel 2.0," in vl
    assert "topkGating 1.0" in vl and "moe_sum_vec_kernel 1.0" in vl and "void" not in sg + vl
    # a library's launcher is named by the kernel it runs
    assert kernel_label("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<int>>(T1::Params)") == \
        "GemmUniversal"
