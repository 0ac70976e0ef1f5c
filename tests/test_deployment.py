"""The user's deployment as every thread's base, the startup limit that follows the first launch, and a launch that
timed out recorded as a death (the stub engine on loopback; SGLang/vLLM flag spellings from their published
sources in test_engine_versions)."""

from __future__ import annotations

import re

import pytest

from servescope.context import context
from servescope.errors import KnobError, SpecError
from servescope.experiment import Config, run_configs, startup_timeout
from servescope.spec import DeploymentSpec, Knobs, LoadSpec
from servescope.store import Store

LOAD = LoadSpec(concurrency=(2,), num_requests=4, output_len=4, warmup_requests=0)


def _ctx(tmp_path, engine, deployment=None, reps=1, **kw):
    return context(engine, {"path": "stub"}, LOAD, repetitions=reps, store=Store(tmp_path), progress=False,
                   deployment=deployment, **kw)


def test_every_arm_launches_the_deployment_with_only_its_own_knobs_over_it(tmp_path, stub_engine):
    dep = {"knobs": {"max_running_requests": 3, "torch_compile": False}, "args": ["--ttft-ms", "2"]}
    ctx = _ctx(tmp_path, stub_engine, dep)
    res = run_configs(ctx, [Config("as deployed", Knobs()), Config("compiled", Knobs(torch_compile=True))],
                      say=lambda m: None)
    assert res.errors.empty, res.errors
    flags = dict(zip(res.points["config"], res.points["flag_list"], strict=True))
    # the deployment's cap and flags on both; compile replaced on one side only
    for side in flags.values():
        assert side[side.index("--max-running") + 1] == "3" and "--ttft-ms" in side
    knobs = {c: pt.parts["knobs"] for (c, _), pt in res.stored.items()}
    assert knobs["as deployed"]["torch_compile"] is False and knobs["compiled"]["torch_compile"] is True
    assert knobs["compiled"]["max_running_requests"] == 3
    # the page says what was deployed and what each arm changed
    assert "deployment (torch_compile=False, max_running_requests=3; flags --ttft-ms 2)" in res.deployment
    assert "as deployed: none" in res.deployment and "compiled: torch_compile=True" in res.deployment


def test_a_suite_without_deployment_keeps_its_keys(tmp_path, stub_engine):
    from servescope.experiment import point_parts

    plain = _ctx(tmp_path, stub_engine)
    empty = _ctx(tmp_path, stub_engine, {})
    k = Knobs(cuda_graph="full")
    assert point_parts(plain, k, 0) == point_parts(empty, k, 0)
    assert point_parts(plain, k, 0)["knobs"] == {"cuda_graph": "full"}


def test_a_thread_knob_replaces_the_deployments_even_at_its_default():
    dep = DeploymentSpec(knobs=Knobs(tp=8, mem_fraction=0.88, cuda_graph="off"))
    assert dep.apply(Knobs(tp=1)).tp == 1  # a layout of one GPU asks for tp=1 explicitly
    assert dep.apply(Knobs()).tp == 8 and dep.apply(Knobs(cuda_graph="full")).mem_fraction == 0.88
    assert dep.changed(Knobs(cuda_graph="full", tp=8)) == ["cuda_graph"]


def test_a_deployment_flag_that_is_a_knob_in_another_spelling_is_refused(tmp_path, stub_engine):
    ctx = _ctx(tmp_path, stub_engine, {"args": ["--max-running", "3"]})
    said: list[str] = []
    with pytest.raises(SpecError, match="deployment.args sets --max-running, which is the knob max_running_requests"):
        run_configs(ctx, [Config("a", Knobs())], say=said.append)
    assert not any("launching" in m for m in said)  # refused before anything launched


@pytest.mark.parametrize("args,knob", [(["--tp-size", "2"], "tp"), (["--tensor-parallel-size", "2"], "tp"),
                                       (["--disable-cuda-graph"], "cuda_graph"),
                                       (["--mem-fraction-static", "0.8"], "mem_fraction"),
                                       (["--chunked-prefill-size", "4096"], "chunked_prefill_size")])
def test_sglang_deployment_flags_that_are_knobs_are_refused_in_any_spelling(wheel_install, args, knob):
    from servescope.engines import get_engine
    from servescope.launch import check_deployment_args

    install, adapter = wheel_install("sglang-0.5.17"), get_engine("sglang")
    with pytest.raises(SpecError, match=f"which is the knob {knob} on sglang 0.5.17"):
        check_deployment_args(adapter, install, tuple(args))
    check_deployment_args(adapter, install, ("--attention-backend", "triton", "--sampling-backend", "pytorch"))
    with pytest.raises(KnobError, match="deployment.args: sglang 0.5.17 does not define --no-such-flag"):
        check_deployment_args(adapter, install, ("--no-such-flag",))


def test_the_startup_limit_follows_the_first_launch(tmp_path, stub_engine):
    engine = {k: v for k, v in stub_engine.items() if k != "startup_timeout_s"}
    ctx = _ctx(tmp_path, engine)
    limit, why = startup_timeout(ctx)
    assert limit == 1800 and "first launch" in why
    run_configs(ctx, [Config("a", Knobs())], say=lambda m: None)
    limit, why = startup_timeout(ctx)
    assert limit == 300 and "slowest ready time" in why  # 4 x a fraction of a second, floored
    given = _ctx(tmp_path, {**engine, "startup_timeout_s": 45})
    assert startup_timeout(given) == (45, "engine.startup_timeout_s")


def test_a_launch_that_timed_out_is_a_death_and_is_not_launched_again(tmp_path, stub_engine):
    engine = {**stub_engine, "startup_timeout_s": 2, "env": {"STUB_READY_AFTER": "60"}}
    said: list[str] = []
    ctx = _ctx(tmp_path, engine, reps=3)
    res = run_configs(ctx, [Config("slow", Knobs())], say=said.append)
    assert sum("launching" in m for m in said) == 1  # not again at every repetition
    assert res.errors["error_type"].tolist() == ["ServerStartTimeout"]
    again: list[str] = []
    res2 = run_configs(_ctx(tmp_path, engine, reps=3), [Config("slow", Knobs())], say=again.append)
    assert not any("launching" in m for m in again)  # a later run reads the recorded death
    assert res2.errors["error_type"].tolist() == ["RecordedFailure"]
    assert "not ready after 2 s" in res2.errors["summary"].iloc[0]


def test_a_configuration_whose_only_partner_died_is_not_launched_again(tmp_path, stub_engine, capsys):
    """Thread 05 at real size: compiled died at capture (minutes into its launch), and eager's next two launches
    would have measured a side with nothing to compare it with. Compiled never becomes ready here; eager is launched
    once (other threads read it), not three times, and the run says why it stopped; a later run reads both from the
    store and launches nothing."""
    from servescope.study import Arm, run_study

    engine = {**stub_engine, "startup_timeout_s": 2, "env": {"STUB_NEVER_READY": "compiled"}}
    arms = [Arm("compiled", Knobs(torch_compile=True)), Arm("eager", Knobs(torch_compile=False))]

    def launched() -> list[str]:
        return [ln.split(": launching")[0].split()[-1] for ln in capsys.readouterr().out.splitlines()
                if ": launching" in ln]

    capsys.readouterr()
    st = run_study("05_torch_compile", _ctx(tmp_path, engine, reps=3), arms)
    assert launched() == ["compiled/3", "eager/3"]
    assert st.results.points["config"].tolist() == ["eager"]
    assert st.results.stopped == ("eager not launched again: every configuration it is compared with died before it "
                                  "was ready, so another launch would compare nothing")
    st2 = run_study("05_torch_compile", _ctx(tmp_path, engine, reps=3), arms)
    assert launched() == [] and st2.results.points["config"].tolist() == ["eager"]
    # with a partner alive the rule does not apply: both are repeated as planned
    run_study("05_torch_compile", _ctx(tmp_path / "b", stub_engine, reps=2), arms)
    assert len(launched()) == 4


def test_outputs_are_checked_on_every_point_and_a_perturbed_configuration_is_never_recommended(tmp_path, stub_engine):
    """Known answer on the stub: every launch answers the check set alone and batched; 'full' answers as 'off' does
    (within the batch jitter), 'piecewise' is fault-injected (STUB_PERTURB) and is caught, so 02 never picks it
    although it is the fastest, and names it as changing outputs whether or not its speed is resolved. An
    oversubscribed host can starve one repetition's client (a CI run here: off read 75 tok/s beside 276 and 295):
    the plan goes on up to 6 repetitions while the headline is unresolved, as a user's would."""
    from servescope.threads import graph_modes as t02

    engine = {**stub_engine, "env": {"STUB_PERTURB": "piecewise"}}
    ctx = context(engine, {"path": "stub"}, LOAD, repetitions=3, max_repetitions=6, store=Store(tmp_path),
                  progress=False)
    gs = t02.run(ctx, ceiling=False)
    checks = gs.study.results.output_checks
    assert set(checks["config"]) >= {"off", "full", "piecewise"} and set(checks["pass"]) == {"alone", "batched"}
    assert set(checks["rep"]) >= {0, 1, 2}
    same = gs.study.output_verdict("full", "off")
    assert same.status == "same" and 0 < same.floor < 1e-4, same
    wrong = gs.study.output_verdict("piecewise", "off")
    assert wrong.changes_outputs and wrong.max_dev == pytest.approx(0.5, abs=1e-3), wrong
    fs = t02.findings(gs)
    head = fs[0]
    assert head.title != "Use CUDA graphs: piecewise" and head.change is not None
    assert "piecewise" not in str(head.change.knob_settings)
    bad = next(f for f in fs if f.title.endswith("piecewise changes outputs"))
    assert bad.kind == "failure" and bad.change is None
    assert any(x.outputs for x in bad.failures)
    good = next(f for f in fs if f.title.startswith("CUDA graphs full"))
    assert "answers as off does" in good.detail


def test_a_mode_that_changes_outputs_fails_whatever_its_speed(tmp_path, stub_engine):
    """Known answer on the stub: piecewise answers wrongly and is paced as off is (its effect unresolved, equivalent,
    or resolved either way by a few percent: a CI run read it +2.5%, 90% CI +1.5..+3.4%): whatever its speed it is
    named as changing outputs, a failure with no change, never a plain effect, its words fitting its direction."""
    from servescope.threads import graph_modes as t02

    engine = {**stub_engine, "env": {"STUB_PERTURB": "piecewise", "STUB_AS_OFF": "piecewise"}}
    ctx = context(engine, {"path": "stub"}, LOAD, repetitions=3, store=Store(tmp_path), progress=False)
    fs = t02.findings(t02.run(ctx, ceiling=False, only=["piecewise"]))
    bad = next((f for f in fs if f.title.endswith("piecewise changes outputs")), None)
    assert bad is not None, [f.title for f in fs]
    assert bad.kind == "failure" and bad.change is None and "never recommended" in bad.headline
    said = re.match(r"piecewise (is faster than|is slower than|is as fast as|is not told apart in speed from) off "
                    r"\(.*\) (but|and) changes outputs", bad.headline)
    assert said is not None, bad.headline
    assert (said.group(2) == "but") == (said.group(1) == "is faster than"), bad.headline
    assert fs[0].change is None and fs[0].title != "Use CUDA graphs: piecewise"


def test_output_verdicts_need_a_noise_floor_and_say_when_they_cannot_be_made():
    import pandas as pd

    from servescope.outputs import verdict

    assert verdict(pd.DataFrame(), "off", "full").status == "not verified"
    one = pd.DataFrame([{"config": "off", "rep": 0, "pass": "alone", "prompt": 0, "prompt_tokens": 3,
                         "kind": "prompt", "position": 1, "token_id": -1, "logprob": -2.0}])
    v = verdict(one, "off", "full")
    assert v.status == "not verified" and "full has no answers" in v.why


def test_a_layout_whose_weights_cannot_fit_is_refused_before_launch(monkeypatch, tmp_path):
    """Mixtral-8x7B (93 GB in bf16) on 80 GB GPUs: tp=1 is refused with the arithmetic, tp=2 fits; Qwen3-30B-A3B
    (61 GB) fits one. The weights are the architecture's, estimated from its config (nothing downloaded)."""
    from servescope import architectures
    from servescope.engines import base
    from servescope.engines.base import EngineInstall
    from servescope.mps import GpuFacts
    from stub_engine import StubAdapter

    monkeypatch.setenv("SERVESCOPE_CACHE", str(tmp_path))
    monkeypatch.setattr(base, "gpu_facts", lambda env: [GpuFacts(i, mem_total_mib=81559.0) for i in range(2)])
    monkeypatch.setattr(base, "visible_devices", lambda platform, env: (2, "GPUs"))
    install = EngineInstall(python="python", version="0", distribution="stub", platform="cuda")
    adapter = StubAdapter()
    mixtral, qwen = (str(architectures.ensure_model(n)) for n in ("mixtral-8x7b", "qwen3-30b-a3b"))
    with pytest.raises(KnobError, match=r"tp=1 does not fit: the weights \(93.4 GB\) over tp=1 need 88.\d GiB"):
        adapter.check_knobs(Knobs(), install, {}, mixtral)
    adapter.check_knobs(Knobs(tp=2), install, {}, mixtral)
    adapter.check_knobs(Knobs(), install, {}, qwen)
    with pytest.raises(KnobError, match="2 replicas of tp=1 does not fit"):
        adapter.check_knobs(Knobs(replicas=2), install, {}, mixtral)


def test_thread_04_compares_the_layouts_of_the_deployments_gpus_and_refuses_those_that_do_not_fit(monkeypatch,
                                                                                                 tmp_path):
    """A deployment of tp=2 serving Mixtral-8x7B (93 GB) on two 80 GB GPUs: TP=2, DP attention and the deployment
    itself fit; engine DP over 2 (a whole copy per GPU) and 2 replicas of tp=1 are refused with the arithmetic."""
    from servescope import architectures
    from servescope.engines import base
    from servescope.engines.base import EngineInstall
    from servescope.launch import Prepared
    from servescope.mps import GpuFacts
    from servescope.spec import EngineSpec
    from servescope.threads.parallelism import layouts
    from stub_engine import StubAdapter

    monkeypatch.setenv("SERVESCOPE_CACHE", str(tmp_path))
    monkeypatch.setattr(base, "gpu_facts", lambda env: [GpuFacts(i, mem_total_mib=81559.0) for i in range(2)])
    monkeypatch.setattr(base, "visible_devices", lambda platform, env: (2, "GPUs"))
    adapter = StubAdapter()
    install = EngineInstall(python="python", version="0", distribution="stub", platform="cuda")
    prep = Prepared(EngineSpec(name="stub", python="python"), install, str(architectures.ensure_model("mixtral-8x7b")),
                    "m", adapter, True)
    dep = DeploymentSpec(knobs=Knobs(tp=2))
    lays = {x.arm.name: x for x in layouts(prep, 2, "cuda", ("round_robin",), (), adapter, deployment=dep)}
    assert set(lays) == {"1 server", "2 replicas of tp=1, round-robin", "dp=2", "dp attention=2", "tp=2"}
    assert not lays["1 server"].refused and not lays["tp=2"].refused and not lays["dp attention=2"].refused
    assert "does not fit" in lays["dp=2"].refused and "does not fit" in lays["2 replicas of tp=1, round-robin"].refused
    assert lays["2 replicas of tp=1, round-robin"].arm.knobs.tp == 1  # the thread's tp replaces the deployment's


def test_every_measuring_notebook_receives_the_suites_deployment(tmp_path):
    """What papermill injects: the deployment reaches every notebook that launches or reads points (all but 99),
    and 07's baseline is the deployment's knobs where the suite names no other."""
    from pathlib import Path

    from servescope.report import plan_parameters
    from servescope.suite import load_suite, notebook_file

    path = Path(__file__).resolve().parents[1] / "data" / "suites" / "sglang-qwen3-30b.yaml"
    suite = load_suite(path)
    for e in suite.notebooks:
        params = plan_parameters(suite, notebook_file(path, e), e.id, e.parameters, tmp_path, tmp_path, True)
        if e.id == "99_summary":
            assert "deployment" not in params
            continue
        assert params["deployment"]["knobs"] == {"cuda_graph": "off", "mem_fraction": 0.88}, e.id
        if "baseline" in params:
            assert params["baseline"] == {"cuda_graph": "off", "mem_fraction": 0.88}


def test_telemetry_reads_the_gpus_the_server_was_given_not_this_processs(monkeypatch):
    """engine.env CUDA_VISIBLE_DEVICES=2,3 on a 4-GPU host: NVML samples GPUs 2 and 3 (the suite's own process sees
    all four)."""
    from servescope.experiment import server_gpus
    from servescope.telemetry.testing import FakeGpu, fake_nvml

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with fake_nvml([FakeGpu(), FakeGpu(), FakeGpu(), FakeGpu()]):
        assert server_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}) == [2, 3]
        assert server_gpus({}) is None


def test_stored_telemetry_is_read_table_by_table_when_a_thread_asks(tmp_path, stub_engine, monkeypatch):
    from servescope.experiment import read_store
    from servescope.store import Point

    ctx = _ctx(tmp_path, stub_engine, reps=2)
    run_configs(ctx, [Config("a", Knobs())], say=lambda m: None)
    read: list[str] = []
    real = Point.table
    monkeypatch.setattr(Point, "table", lambda self, name, **kw: (read.append(name), real(self, name, **kw))[1])
    res = read_store(ctx.store)
    assert not [n for n in read if n.startswith("telemetry_")]  # nothing of it read yet
    host = res.telemetry["host_cpu"]
    assert not host.empty and set(host["rep"]) == {0, 1}
    assert {n for n in read if n.startswith("telemetry_")} == {"telemetry_host_cpu"}
    assert res.select(list(set(res.points["config"]))).telemetry["host_cpu"].shape == host.shape
    assert res.select(["another"]).telemetry["host_cpu"].empty


def test_vllms_own_counters_on_the_h200_recording_show_the_toys_empty_kv_cache():
    """Known answer from the vllm-h200 recording: at c=32 the 8-layer toy's KV cache was nearly empty
    (vllm:kv_cache_usage_perc about 0.06%), what the real-size issue was filed for."""
    from pathlib import Path

    from servescope import nb
    from servescope.queries import stored_points
    from servescope.study import Study
    from servescope.suite import load_suite

    root = Path(__file__).resolve().parents[1]
    s = load_suite(root / "data" / "suites" / "vllm-h200.yaml")
    ctx = nb.context(s.engine, s.model, s.load, store_dir=str(root / "data" / "reference" / "vllm-h200" / "store"),
                     offline=True, telemetry=s.telemetry)
    t = Study("03", ctx, [], stored_points(ctx)).engine_beside_gpu()
    top = t[t["point"] == "c=32"]
    assert len(top) and (top["kv_used_pct"] < 1).all() and (top["running"] > 20).any()
    # its counters, scraped once a second, saw levels of a few tenths of a second: no rate, and no disagreement made up
    assert not top["said"].str.contains("generated tok/s").any()


def test_bf16_kernel_differences_are_not_changed_outputs_and_garbage_is():
    """Known answer from the embedded engine (vLLM 0.32 CPU, the tiny model's own random weights): compiled against
    eager differ by 0.0011 nats on average (0.0136 at most) on a 0.2-nat spread, on an engine whose own floor is 0
    (batch-invariant): the same answers. Answers shifted by a fifth of their spread are not."""
    import numpy as np
    import pandas as pd

    from servescope.outputs import verdict

    rng = np.random.default_rng(0)
    base = rng.normal(-8, 0.2, 500)

    def rows(config, rep, values):
        return [{"config": config, "rep": rep, "pass": p, "prompt": 0, "prompt_tokens": 500, "kind": "prompt",
                 "position": i, "token_id": -1, "logprob": v} for p in ("alone", "batched") for i, v in enumerate(values)]

    kernels = base + rng.normal(0, 0.0014, 500)  # a mean |difference| of about 0.0011
    garbled = base + 0.04 + rng.normal(0, 0.04, 500)
    checks = pd.DataFrame(rows("eager", 0, base) + rows("eager", 1, base) + rows("compiled", 0, kernels)
                          + rows("garbled", 0, garbled))
    ok = verdict(checks, "eager", "compiled")
    assert ok.status == "same" and ok.floor == 0 and 0.0008 < ok.mean_dev < 0.0015 and ok.threshold > ok.mean_dev
    assert verdict(checks, "eager", "garbled").changes_outputs


def test_an_architecture_the_engine_version_does_not_know_is_refused_before_launch(wheel_install, tmp_path):
    """SGLang 0.5.17's source registers Qwen3MoeForCausalLM (shipped qwen3-30b-a3b serves); a config naming an
    architecture no file of its models names is refused in one line, before anything launches."""
    import json

    from servescope.engines import get_engine
    from servescope.launch import check_architecture

    install, adapter = wheel_install("sglang-0.5.17"), get_engine("sglang")
    known = tmp_path / "known"
    known.mkdir()
    (known / "config.json").write_text(json.dumps({"architectures": ["Qwen3MoeForCausalLM"]}))
    check_architecture(adapter, install, str(known))
    unknown = tmp_path / "unknown"
    unknown.mkdir()
    (unknown / "config.json").write_text(json.dumps({"architectures": ["NoSuchMoeForCausalLM"]}))
    with pytest.raises(SpecError, match="sglang 0.5.17 does not know the architecture NoSuchMoeForCausalLM"):
        check_architecture(adapter, install, str(unknown))
