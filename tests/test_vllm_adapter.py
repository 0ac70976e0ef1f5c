"""vLLM adapter: intent to flags for 0.32, and clear errors for intents vLLM cannot express."""

from __future__ import annotations

import dataclasses
import json

import pytest

from servescope.engines import get_engine
from servescope.engines.base import EngineInstall
from servescope.errors import KnobError
from servescope.spec import Knobs

CPU = EngineInstall(python="/x/python", version="0.32.0", distribution="vllm-cpu", platform="cpu")
GPU = EngineInstall(python="/x/python", version="0.32.0", distribution="vllm", platform="cuda")
vllm = get_engine("vllm")


def _cc(flags: list[str]) -> dict:
    return json.loads(flags[flags.index("--compilation-config") + 1])


def test_defaults_add_nothing():
    assert vllm.knob_flags(Knobs(), CPU) == []


def test_eager_is_enforce_eager():
    assert vllm.knob_flags(Knobs(torch_compile=False, cuda_graph="off"), CPU) == ["--enforce-eager"]


def test_no_compile_keeps_graph_choice():
    flags = vllm.knob_flags(Knobs(torch_compile=False, cuda_graph="decode_only", cuda_graph_max_bs=64), GPU)
    assert _cc(flags) == {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY", "max_cudagraph_capture_size": 64}


@pytest.mark.parametrize("mode,name", [("off", "NONE"), ("piecewise", "FULL_AND_PIECEWISE"),
                                       ("decode_only", "FULL_DECODE_ONLY"), ("full", "FULL")])
def test_graph_modes(mode, name):
    assert _cc(vllm.knob_flags(Knobs(cuda_graph=mode), GPU))["cudagraph_mode"] == name


def test_parallel_and_scheduling_flags():
    flags = vllm.knob_flags(Knobs(tp=2, dp=2, ep=4, max_running_requests=64, chunked_prefill_size=4096,
                                  mem_fraction=0.85, moe_backend="triton", extra_args=("--seed", "1")), GPU)
    s = " ".join(flags)
    for want in ["--tensor-parallel-size 2", "--data-parallel-size 2", "--enable-expert-parallel",
                 "--max-num-seqs 64", "--max-num-batched-tokens 4096", "--gpu-memory-utilization 0.85",
                 "--moe-backend triton", "--seed 1"]:
        assert want in s


@pytest.mark.parametrize("knobs,msg", [
    (Knobs(attn_dp=2), "use dp instead"),
    (Knobs(tp=2, ep=3), "ep=tp\\*dp"),
    (Knobs(num_continuous_decode_steps=4), "async-scheduling"),
    (Knobs(single_batch_overlap=True), "enable-dbo"),
    (Knobs(torch_compile_max_bs=8), "compile_sizes"),
    (Knobs(torch_compile=False, cuda_graph="off", cuda_graph_max_bs=8), "graphs are off"),
])
def test_inexpressible_intent_names_version_and_alternative(knobs, msg):
    with pytest.raises(KnobError, match=msg) as ei:
        vllm.knob_flags(knobs, GPU)
    assert "vLLM 0.32.0" in str(ei.value)


def test_cpu_build_has_no_memory_fraction():
    with pytest.raises(KnobError, match="VLLM_CPU_KVCACHE_SPACE"):
        vllm.knob_flags(Knobs(mem_fraction=0.5), CPU)


def test_plan_command_and_env(wheel_install):
    cpu = dataclasses.replace(CPU, source=wheel_install("vllm-0.32.0").source)
    plan = vllm.plan(install=cpu, model_path="/m", served_name="tiny", host="127.0.0.1", port=8123,
                     knobs=Knobs(), extra_env={"VLLM_CPU_KVCACHE_SPACE": "2"})
    assert plan.command[:3] == ["/x/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert "--port" in plan.command and "8123" in plan.command
    assert plan.env["VLLM_SERVER_DEV_MODE"] == "1" and plan.env["HF_HUB_OFFLINE"] == "1"
    assert plan.env["VLLM_CPU_KVCACHE_SPACE"] == "2"  # the user's env wins


def test_plan_refuses_flags_the_version_lacks(wheel_install, monkeypatch):
    """A knob translation that names a flag this vLLM does not define is stopped before launch."""
    cpu = dataclasses.replace(CPU, source=wheel_install("vllm-0.32.0").source)
    monkeypatch.setattr(type(vllm), "knob_flags", lambda self, knobs, install: ["--no-such-flag"])
    with pytest.raises(KnobError, match="vllm 0.32.0 does not define --no-such-flag"):
        vllm.plan(install=cpu, model_path="/m", served_name="tiny", host="127.0.0.1", port=8123, knobs=Knobs(),
                  extra_env={})


def test_cuda_launches_log_graph_counts_cpu_launches_do_not(wheel_install):
    """--cudagraph-metrics (defined by 0.32) on CUDA, where thread 2 reads batches per graph mode from the log; the
    CPU build has no graphs to count, and refuses graph modes before launch."""
    import pytest

    from servescope.errors import KnobError
    from servescope.spec import Knobs

    ad = get_engine("vllm")
    cuda = wheel_install("vllm-0.32.0")
    plan = ad.plan(install=cuda, model_path="/m", served_name="m", host="h", port=1, knobs=Knobs(cuda_graph="piecewise"),
                   extra_env={})
    assert "--cudagraph-metrics" in plan.command
    assert "--enable-mfu-metrics" in plan.command  # its estimated FLOPs and bytes per GPU, beside NVML's
    cpu = EngineInstall(**{**cuda.as_dict(), "platform": "cpu", "source": cuda.source})
    plan = ad.plan(install=cpu, model_path="/m", served_name="m", host="h", port=1, knobs=Knobs(), extra_env={})
    assert "--cudagraph-metrics" not in plan.command and "--enable-mfu-metrics" not in plan.command
    with pytest.raises(KnobError, match="CPU build has no CUDA graphs"):
        ad.knob_flags(Knobs(cuda_graph="full"), cpu)


def test_cpu_build_refuses_data_parallel_moe_before_launch(tmp_path):
    """Seen on this machine (vllm-cpu 0.32.0, tiny MoE, dp=2 through measure()): the engine core died 48 s after
    launch with NotImplementedError from the CPU communicator's all_gatherv in the DP/EP MoE dispatch. Refused now,
    with the alternative; a dense model is let through (not seen failing)."""
    moe, dense = tmp_path / "moe", tmp_path / "dense"
    for d, cfg in ((moe, {"model_type": "qwen3_moe", "num_experts": 16}), (dense, {"model_type": "qwen3"})):
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(KnobError, match="cannot run dp=2 with an MoE model.*use replicas"):
        vllm.check_knobs(Knobs(dp=2), CPU, {}, str(moe))
    assert vllm.check_knobs(Knobs(dp=1), CPU, {}, str(moe)) == vllm.knob_flags(Knobs(), CPU)


def test_the_armed_torch_profiler_is_inert_only_where_its_source_was_read():
    """vLLM 0.32 builds its worker's torch profiler on the first /start_profile and its front end's wrapper keeps
    only arguments (read in the 0.32 source): an armed launch is the same launch for the load there; nsys, or a
    version not read, is not claimed."""
    assert "first /start_profile" in vllm.idle_profiler_inert(CPU, "torch")
    assert vllm.idle_profiler_inert(CPU, "nsys") == ""
    assert vllm.idle_profiler_inert(dataclasses.replace(GPU, version="0.26.0"), "torch") == ""


def _fake_vllm(root, fa: tuple[int, ...] = (), flashinfer: bool = False):
    """A site folder whose vllm package holds only the FlashAttention kernels named (as the slim sm_90 build holds
    FA3 alone), and flashinfer where asked."""
    (root / "vllm" / "vllm_flash_attn").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("")
    for v in fa:
        (root / "vllm" / "vllm_flash_attn" / f"_vllm_fa{v}_C.abi3.so").write_bytes(b"")
    if flashinfer:
        (root / "flashinfer").mkdir()
        (root / "flashinfer" / "__init__.py").write_text("")
    return {"PYTHONPATH": str(root)}


@pytest.mark.parametrize("flags, kernels, refused", [
    (["--attention-backend", "FLASH_ATTN"], {"fa": (3,)}, None),  # the H200 recording's launch: FA3 serves it
    (["--attention-backend", "FLASH_ATTN", "--attention-config", '{"flash_attn_version": 2}'], {"fa": (3,)},
     "has no FlashAttention-2 kernels"),
    (["--attention-config", '{"backend": "FLASH_ATTN", "flash_attn_version": 2}'], {"fa": (3,)},
     "has no FlashAttention-2 kernels"),
    (["--attention-backend", "FLASH_ATTN", "--attention-config", '{"flash_attn_version": 2}'], {"fa": (2, 3)}, None),
    (["--attention-backend", "FLASH_ATTN"], {"fa": ()}, "has no FlashAttention kernels"),
    (["--attention-backend", "FLASHINFER"], {"fa": (3,)}, "cannot import flashinfer"),
    (["--attention-backend", "FLASHINFER"], {"fa": (3,), "flashinfer": True}, None),
    # vLLM's dotted overrides of a config flag: read as that flag (the scan used to call them undefined)
    (["--attention-backend", "FLASH_ATTN", "--attention-config.flash_attn_version=3"], {"fa": (3,)}, None),
    (["--attention-backend", "FLASH_ATTN", "--attention-config.flash_attn_version=2"], {"fa": (3,)},
     "has no FlashAttention-2 kernels"),
    (["--compilation-config.mode", "3", "--attention-backend", "FLASH_ATTN"], {"fa": (3,)}, None),
    (["--attention-confg.flash_attn_version=3"], {"fa": (3,)}, "does not define --attention-confg.flash_attn_version"),
])
def test_an_attention_backend_whose_kernels_are_not_installed_is_refused_before_launch(
        wheel_install, tmp_path, flags, kernels, refused):
    """vLLM 0.26's own flags (its source), checked against what the install holds: the slim sm_90 wheel that served
    on the H200 (data/reference/vllm-h200) drops FA2 and flashinfer."""
    install = dataclasses.replace(wheel_install("vllm-0.26.0"), env=_fake_vllm(tmp_path, **kernels))
    ad = get_engine("vllm")
    if refused is None:
        ad.check_flags(flags, install)
    else:
        with pytest.raises(KnobError, match=refused) as e:
            ad.check_flags(flags, install)
        assert "\n" not in str(e.value)


def test_piecewise_graphs_without_compile_are_refused_before_launch():
    """vLLM overrides FULL_AND_PIECEWISE when its compile is off (0.26 to NONE: the recorded H200 point of
    tests/test_vllm_h200.py), so asking for both is refused, naming the rule; with breakable graphs in engine.env it
    is spelled, and graph modes that need no compile are not refused."""
    with pytest.raises(KnobError, match="requires_piecewise_compilation.*VLLM_USE_BREAKABLE_CUDAGRAPH"):
        vllm.knob_flags(Knobs(torch_compile=False, cuda_graph="piecewise"), GPU)
    breakable = dataclasses.replace(GPU, env={"VLLM_USE_BREAKABLE_CUDAGRAPH": "1"})
    assert _cc(vllm.knob_flags(Knobs(torch_compile=False, cuda_graph="piecewise"), breakable)) == {
        "mode": 0, "cudagraph_mode": "FULL_AND_PIECEWISE"}
    for mode in ("decode_only", "full"):
        assert _cc(vllm.knob_flags(Knobs(torch_compile=False, cuda_graph=mode), GPU))["mode"] == 0


def test_a_graph_change_carries_the_compile_it_was_measured_with():
    """Thread 02 measures vLLM's graph modes with compile at its default (on): the changes it hands to 07 say so, and
    are spelled as measured; elsewhere (graphs off, CPU build, breakable graphs, SGLang) nothing is added."""
    for mode in ("decode_only", "full", "piecewise"):
        asked = Knobs(cuda_graph=mode)
        assert vllm.as_measured(asked, GPU) == Knobs(cuda_graph=mode, torch_compile=True)
        assert vllm.knob_flags(vllm.as_measured(asked, GPU), GPU) == vllm.knob_flags(asked, GPU)
    piecewise = Knobs(cuda_graph="piecewise")
    assert vllm.as_measured(Knobs(cuda_graph="off"), GPU) == Knobs(cuda_graph="off")
    assert vllm.as_measured(piecewise, CPU) == piecewise
    assert vllm.as_measured(piecewise, dataclasses.replace(GPU, env={"VLLM_USE_BREAKABLE_CUDAGRAPH": "1"})) == piecewise
    sglang = EngineInstall(python="/x/python", version="0.5.17", distribution="sglang", platform="cuda")
    assert get_engine("sglang").as_measured(piecewise, sglang) == piecewise


def test_a_deployment_with_compile_off_gets_piecewise_graphs_with_compile_on(tmp_path):
    """vLLM's --enforce-eager deployment (compile off): thread 02's piecewise arm turns compile on itself, says so,
    and is expressible; FULL runs without compile, SGLang's modes need nothing, breakable graphs need no compile."""
    from servescope.context import context
    from servescope.spec import LoadSpec
    from servescope.store import Store
    from servescope.threads import graph_modes

    def ctx(name, env=None, dep=True):
        return context({"name": name, "version": "0.26.0", "python": "/x/python", "env": env or {}}, {"path": "stub"},
                       LoadSpec(concurrency=(1,), num_requests=1), store=Store(tmp_path), progress=False,
                       deployment={"knobs": {"torch_compile": False}} if dep else None)

    arms = {a.name: a for a in graph_modes.arms(ctx("vllm"))}
    assert arms["piecewise"].knobs == Knobs(cuda_graph="piecewise", torch_compile=True)
    assert "torch_compile=True: the mode needs it" in arms["piecewise"].note
    assert arms["full"].knobs == Knobs(cuda_graph="full") and arms["off"].knobs == Knobs(cuda_graph="off")
    # the store keys of suites without a deployment stay as they were
    assert {a.name: a.knobs for a in graph_modes.arms(ctx("vllm", dep=False))}["piecewise"] == Knobs(cuda_graph="piecewise")
    assert {a.name: a.knobs for a in graph_modes.arms(ctx("sglang"))}["piecewise"] == Knobs(cuda_graph="piecewise")
    breakable = ctx("vllm", {"VLLM_USE_BREAKABLE_CUDAGRAPH": "1"})
    assert {a.name: a.knobs for a in graph_modes.arms(breakable)}["piecewise"] == Knobs(cuda_graph="piecewise")
    # expressible on the deployment, as launched (before, the deployment's compile-off refused it at launch)
    gpu26 = dataclasses.replace(GPU, version="0.26.0")
    table = graph_modes.modes(ctx("vllm"), gpu26).set_index("mode")
    assert table.loc["piecewise", "expressible"], table.loc["piecewise", "reason"]
    assert "FULL_AND_PIECEWISE" in table.loc["piecewise", "flags"] and '"mode"' not in table.loc["piecewise", "flags"]
