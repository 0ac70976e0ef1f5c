"""The shipped suites: each loads, and the SGLang example's every configuration is spelled and accepted by SGLang
0.5.23's own flags (read from the published wheel, nothing installed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from servescope.context import context
from servescope.engines import get_engine
from servescope.errors import KnobError
from servescope.spec import EngineSpec, Knobs
from servescope.suite import load_suite
from servescope.threads import graph_modes, parallelism, torch_compile, verify

ROOT = Path(__file__).resolve().parents[1]
SUITES = sorted((ROOT / "data" / "suites").glob("*.yaml"))


@pytest.mark.parametrize("path", SUITES, ids=[p.stem for p in SUITES])
def test_every_shipped_suite_loads(path):
    suite = load_suite(path)
    assert suite.notebooks


def test_the_default_suite_runs_every_thread_that_applies_to_the_embedded_engine():
    ids = [n.id for n in load_suite(ROOT / "data" / "suites" / "default.yaml").notebooks]
    assert ids == ["00_environment", "01_cuda_graph_disable_reason", "02_piecewise_cuda_graphs",
                   "04_data_parallelism", "05_torch_compile", "06_grouped_gemm", "07_verified_changes",
                   "03_clocks_power", "99_summary"]


def test_sglang_example_is_valid_for_sglang_0_5_23(wheel_install):
    suite = load_suite(ROOT / "data" / "suites" / "sglang-example.yaml")
    assert [n.id for n in suite.notebooks][-1] == "99_summary" and len(suite.notebooks) == 9
    assert suite.baseline == {"cuda_graph": "off"}
    engine = EngineSpec(**suite.engine)
    assert engine.name == "sglang" and engine.version == "0.5.23"
    install = wheel_install("sglang-0.5.23")
    adapter = get_engine("sglang")
    modes = graph_modes.modes(context(engine, {"tiny": {}}), install)
    # off, decode only, full, piecewise: all spelled by 0.5.23; torch.compile's piecewise split (tc_piecewise, in 0.5.17)
    # is gone from 0.5.23's prefill backends, refused with that version's own list
    can = dict(zip(modes["mode"], modes["expressible"], strict=True))
    assert can == {"off": True, "decode_only": True, "full": True, "piecewise": True, "compiled_piecewise": False}
    assert "--cuda-graph-backend-prefill tc_piecewise is not accepted; it takes full, breakable, disabled" in \
        modes.set_index("mode").loc["compiled_piecewise", "reason"]
    knobs = [Knobs(cuda_graph=m) for m in modes["mode"] if can[m]]
    knobs += [a.knobs for a in torch_compile.arms(context(engine, {"tiny": {}}))]
    lays = parallelism.layouts(None, 8, "cuda")
    assert {x.kind for x in lays} == {"one server", "replicas", "engine DP", "DP attention", "TP"}
    knobs += [x.arm.knobs for x in lays]
    # thread 07's scheduler search around the suite's baseline: every setting spelled by 0.5.23
    ctx = context(engine, {"tiny": {}}, suite.load)
    tuning = [k for _, k in verify.candidates(ctx, Knobs(**suite.baseline), list(verify.SEARCH))]
    assert len(tuning) == 11  # every knob the search knows, the decode-graph batch cap too
    # around graphs off, a decode-graph batch cap has nothing to cap: refused (the search shows it not expressible)
    capped = [k for k in tuning if k.cuda_graph_max_bs is not None]
    assert len(capped) == 2
    for k in capped:
        with pytest.raises(KnobError, match="cuda_graph_max_bs given while CUDA graphs are off"):
            adapter.knob_flags(k, install)
    knobs += [k for k in tuning if k.cuda_graph_max_bs is None]
    for k in knobs:
        plan = adapter.plan(install=install, model_path=suite.model["path"], served_name="m", host="127.0.0.1",
                            port=30000, knobs=k, extra_env={})  # checks every flag against 0.5.23's flag set
        assert "--model-path" in plan.command and "--port" in plan.command
    spelled = {x.arm.name: adapter.knob_flags(x.arm.knobs, install) for x in lays}
    assert spelled["tp=8"] == ["--tp-size", "8"] and spelled["dp=8"] == ["--dp-size", "8"]
    assert spelled["dp attention=8"] == ["--tp-size", "8", "--attn-dp-size", "8"]
    assert spelled["8 replicas, round-robin"] == []  # replicas are eight plain servers, one GPU each
    assert adapter.knob_flags(tuning[0], install)[-2:] == ["--max-running-requests", "64"]  # 0.25 x c=256


def test_sglang_h200_is_valid_for_sglang_0_5_17(wheel_install):
    """The seed's case (data/suites/sglang-h200.yaml): its base arguments and every configuration its threads launch
    are spelled by 0.5.17's own flags, and the seed's baseline is 0.5.17's spelling of --disable-cuda-graph."""
    suite = load_suite(ROOT / "data" / "suites" / "sglang-h200.yaml")
    engine = EngineSpec(**suite.engine)
    install = wheel_install("sglang-0.5.17")
    adapter = get_engine("sglang")
    adapter.check_flags(list(engine.args), install)  # what every launch carries
    assert adapter.knob_flags(Knobs(**suite.baseline), install) == [
        "--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"]
    ctx = context(engine, {"tiny": {}}, suite.load)
    modes = graph_modes.modes(ctx, install)
    assert list(modes["mode"]) == ["off", "decode_only", "full", "piecewise", "compiled_piecewise"]
    assert modes["expressible"].all(), modes
    knobs = [Knobs(cuda_graph=m) for m in modes["mode"]]
    knobs += [a.knobs for a in torch_compile.arms(ctx)]
    knobs += [Knobs(torch_compile=True, cuda_graph=m) for m in torch_compile.PIECEWISE_FORMS]
    (entry,) = [n for n in suite.notebooks if n.id == "07_verified_changes"]
    tuning = [k for _, k in verify.candidates(ctx, Knobs(cuda_graph="piecewise"), entry.parameters["search"])]
    knobs += tuning
    assert {k.cuda_graph_max_bs for k in tuning} >= {16, 64}  # x0.5 and x2 of c=32
    for k in knobs:
        adapter.check_flags(adapter.knob_flags(k, install), install)
        both = {f for f in adapter.knob_flags(k, install) if f.startswith("--")} & set(engine.args)
        assert not both, f"{k.label()} sets {both}, which the suite's base arguments set too"


def test_vllm_h200_is_valid_for_vllm_0_26(wheel_install):
    """data/suites/vllm-h200.yaml: its base arguments and every configuration its threads launch are spelled by vLLM
    0.26.0's own flags (its published source), the baseline is --enforce-eager, and 02's graph modes are the four
    cudagraph_mode values 0.26 has (NONE, FULL_DECODE_ONLY, FULL, FULL_AND_PIECEWISE)."""
    suite = load_suite(ROOT / "data" / "suites" / "vllm-h200.yaml")
    engine = EngineSpec(**suite.engine)
    install = wheel_install("vllm-0.26.0")
    adapter = get_engine("vllm")
    adapter.check_flags(list(engine.args), install)
    assert adapter.knob_flags(Knobs(**suite.baseline), install) == ["--enforce-eager"]
    ctx = context(engine, {"tiny": {}}, suite.load)
    modes = graph_modes.modes(ctx, install)
    can = dict(zip(modes["mode"], modes["expressible"], strict=True))
    assert all(can[m] for m in ("off", "decode_only", "full", "piecewise")), modes
    spelled = {m: " ".join(adapter.knob_flags(Knobs(cuda_graph=m), install)) for m in ("off", "decode_only", "full",
                                                                                      "piecewise")}
    for m, mode in (("off", "NONE"), ("decode_only", "FULL_DECODE_ONLY"), ("full", "FULL"),
                    ("piecewise", "FULL_AND_PIECEWISE")):
        assert f'"cudagraph_mode": "{mode}"' in spelled[m], spelled
    knobs = [Knobs(cuda_graph=m) for m in modes["mode"] if can[m]]
    knobs += [a.knobs for a in torch_compile.arms(ctx)]
    (entry,) = [n for n in suite.notebooks if n.id == "07_verified_changes"]
    tuning = [k for _, k in verify.candidates(ctx, Knobs(), entry.parameters["search"])]
    assert {k.max_running_requests for k in tuning} - {None} and {k.chunked_prefill_size for k in tuning} - {None}
    assert {k.cuda_graph_max_bs for k in tuning} - {None}
    knobs += tuning
    for k in knobs:
        flags = adapter.knob_flags(k, install)
        adapter.check_flags(flags, install)
        assert not {f for f in flags if f.startswith("--")} & set(engine.args), k.label()


def test_a_baseline_the_version_cannot_express_is_refused_before_anything_runs(tmp_path):
    """The stub engine has one piecewise form: a suite whose baseline asks for the other is refused, naming the knob,
    before any notebook runs or anything launches (no report folder is made)."""
    import sys

    import yaml

    from servescope.errors import SpecError
    from servescope.report import run_suite

    suite = tmp_path / "s.yaml"
    suite.write_text(yaml.safe_dump({"name": "s", "engine": {"name": "stub", "python": sys.executable},
                                     "model": {"path": "stub"}, "baseline": {"cuda_graph": "compiled_piecewise"},
                                     "notebooks": [{"id": "01_cuda_graph_disable_reason"}]}))
    with pytest.raises(SpecError, match=r"baseline sets cuda_graph='compiled_piecewise', which stub 0.0-stub cannot "
                                        r"express: the stub has one piecewise form.*nothing was launched"):
        run_suite(suite, reports_dir=tmp_path / "r", store_dir=tmp_path / "st", run_id="x", progress=False)
    assert not (tmp_path / "r" / "x").exists()


@pytest.mark.parametrize("name", ["sglang-h200", "vllm-h200"])
def test_a_second_recording_repeats_the_first_but_for_the_search(name):
    """A second recording shows a headline holds only if it measures the same thing: engine, model, load, baseline
    and the parameters of 02 and 07's verification are the first recording's."""
    first = load_suite(ROOT / "data" / "suites" / f"{name}.yaml")
    second = load_suite(ROOT / "data" / "suites" / f"{name}-second.yaml")
    assert second.name != first.name  # a store of its own: on_gpu.py continues data/reference/<name>/store
    for part in ("engine", "model", "load", "telemetry", "baseline"):
        assert getattr(second, part) == getattr(first, part), part
    params = {n.id: n.parameters for n in first.notebooks}
    again = {n.id: n.parameters for n in second.notebooks}
    assert again["02_piecewise_cuda_graphs"] == params["02_piecewise_cuda_graphs"]
    verify_first = {k: v for k, v in params["07_verified_changes"].items() if not k.startswith("search")}
    assert {k: v for k, v in again["07_verified_changes"].items() if not k.startswith("search")} == verify_first
    assert again["07_verified_changes"]["search_budget_s"] == 0


# per two-GPU suite (issue 33): its one-GPU sibling, the release it is checked against, and how that release spells
# engine DP, TP and DP attention (None: refused before launch, with the words of the refusal)
TWO_GPU = {
    "sglang-h200x2": ("sglang-h200", "sglang-0.5.17", ["--dp-size", "2"], ["--tp-size", "2"],
                      {"--tp-size", "2", "--dp-size", "--enable-dp-attention"}),
    "vllm-h200x2": ("vllm-h200", "vllm-0.26.0", ["--data-parallel-size", "2"], ["--tensor-parallel-size", "2"],
                    "no separate attention-DP size"),
}


@pytest.mark.parametrize("name", sorted(TWO_GPU))
def test_a_two_gpu_suite_plans_every_layout_in_its_releases_own_flags(name, wheel_install):
    """data/suites/sglang-h200x2.yaml and vllm-h200x2.yaml (issue 33, for the nvidia-h200-x2 kind): thread 04 plans 1
    server, 2 replicas behind the balancer, the engine's own DP (SGLang's DP controller, --dp-size 2; vLLM's
    --data-parallel-size 2), DP attention (SGLang's; vLLM 0.26 has no attention-DP size of its own and is refused with
    its reason before launch) and TP across the two GPUs, each spelled by the release's own flags (its published
    source); NVLink multicast is off in every server's own environment; the TP point is captured under nsys; the
    engine build, model and load are the one-GPU suite's, so the two recordings compare."""
    sibling, release, dp, tp, dp_attention = TWO_GPU[name]
    suite = load_suite(ROOT / "data" / "suites" / f"{name}.yaml")
    one_gpu = load_suite(ROOT / "data" / "suites" / f"{sibling}.yaml")
    assert (suite.model, suite.load) == (one_gpu.model, one_gpu.load)
    assert {k: v for k, v in suite.engine.items() if k != "env"} == \
        {k: v for k, v in one_gpu.engine.items() if k != "env"}
    assert one_gpu.engine["env"].items() <= suite.engine["env"].items()
    engine = EngineSpec(**suite.engine)
    install = wheel_install(release)
    adapter = get_engine(engine.name)
    adapter.check_flags(list(engine.args), install)
    (entry,) = [n for n in suite.notebooks if n.id == "04_data_parallelism"]
    p = entry.parameters
    assert p["profile_tp"] is True and p["shared"] == [] and p["repetitions"] >= 3
    lays = parallelism.layouts(None, 2, "cuda", routes=tuple(p["routes"]), shared=tuple(p["shared"]))
    assert [(x.arm.name, x.kind, x.devices) for x in lays] == [
        ("1 server", "one server", 1), ("2 replicas, least-outstanding", "replicas", 2), ("dp=2", "engine DP", 2),
        ("dp attention=2", "DP attention", 2), ("tp=2", "TP", 2)]
    (dpa,) = [x for x in lays if x.kind == "DP attention"]
    if isinstance(dp_attention, str):
        with pytest.raises(KnobError, match=dp_attention):
            adapter.knob_flags(dpa.arm.knobs, install)
    else:
        assert set(adapter.knob_flags(dpa.arm.knobs, install)) == dp_attention
    launched = [x for x in lays if x is not dpa or not isinstance(dp_attention, str)]
    spelled = {x.arm.name: adapter.knob_flags(x.arm.knobs, install) for x in launched}
    assert (spelled["dp=2"], spelled["tp=2"]) == (dp, tp)
    multicast_off = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
    for x in launched:
        adapter.check_flags(spelled[x.arm.name], install)
        plan = adapter.plan(install=install, model_path="/m", served_name="m", host="127.0.0.1", port=30000,
                            knobs=x.arm.knobs, extra_env=dict(engine.env))
        assert multicast_off.items() <= plan.env.items(), x.arm.name


def test_sglang_qwen3_30b_is_valid_for_sglang_0_5_17(wheel_install):
    """The seed's case at real size: its deployment's knobs and flags are 0.5.17's (none of its flags a knob in
    another spelling), its architecture is one 0.5.17 serves with random weights, and its load fills every level."""
    from servescope import architectures
    from servescope.launch import check_architecture, check_deployment_args
    from servescope.spec import DeploymentSpec, LoadSpec

    suite = load_suite(ROOT / "data" / "suites" / "sglang-qwen3-30b.yaml")
    engine, dep = EngineSpec(**suite.engine), DeploymentSpec(**suite.deployment)
    install, adapter = wheel_install("sglang-0.5.17"), get_engine("sglang")
    adapter.check_flags(list(engine.args), install)
    check_deployment_args(adapter, install, dep.args)
    assert adapter.knob_flags(dep.knobs, install) == ["--cuda-graph-backend-decode", "disabled",
                                                     "--cuda-graph-backend-prefill", "disabled",
                                                     "--mem-fraction-static", "0.88"]
    check_architecture(adapter, install, str(architectures.ensure_model(suite.model["architecture"])))
    load = LoadSpec(**suite.load)
    assert all(load.level_requests(c) >= c for c in load.concurrency) and load.steady_state


def test_vllm_qwen3_30b_is_valid_for_vllm_0_26(wheel_install):
    """The same real-size case on vLLM 0.26: its deployment is 0.26's --enforce-eager with its memory share, its
    flags are 0.26's and none is a knob in another spelling, and 0.26 serves the architecture with random weights."""
    from servescope import architectures
    from servescope.launch import check_architecture, check_deployment_args
    from servescope.spec import DeploymentSpec

    suite = load_suite(ROOT / "data" / "suites" / "vllm-qwen3-30b.yaml")
    engine, dep = EngineSpec(**suite.engine), DeploymentSpec(**suite.deployment)
    install, adapter = wheel_install("vllm-0.26.0"), get_engine("vllm")
    adapter.check_flags(list(engine.args), install)
    check_deployment_args(adapter, install, dep.args)
    assert "--enforce-eager" in adapter.knob_flags(dep.knobs, install)
    check_architecture(adapter, install, str(architectures.ensure_model(suite.model["architecture"])))
