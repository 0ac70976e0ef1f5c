"""The SGLang adapter end to end against SGLang's protocol stub: a fake `sglang` package whose launch_server runs
tests/sglang_stub.py and whose server_args.py is the real 0.5.9 file (so the flag scan reads real flags)."""

from __future__ import annotations

import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from servescope.context import context
from servescope.engines import get_engine
from servescope.engines.logs import analyze_log_file
from servescope.launch import prepare, serve
from servescope.load import run_sweep
from servescope.spec import EngineSpec, Knobs, LoadSpec, ModelSpec

STUB = Path(__file__).with_name("sglang_stub.py")


def fake_sglang(root: Path, wheel: str, version: str) -> str:
    """A site folder with a fake sglang (real server_args.py, stub launch_server) and an interpreter using it."""
    site = root / "site"
    pkg = site / "sglang"
    (pkg / "srt").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "srt" / "__init__.py").write_text("")
    with zipfile.ZipFile(wheel) as z:  # the flags' file, and where 0.5.14+ declares the graph backends' names
        for name in z.namelist():
            if name == "sglang/srt/server_args.py" or name.endswith("model_executor/cuda_graph_config.py") or \
                    name.startswith("sglang/srt/arg_groups/") and name.endswith(".py"):
                (site / name).parent.mkdir(parents=True, exist_ok=True)
                (site / name).write_bytes(z.read(name))
    (pkg / "launch_server.py").write_text(textwrap.dedent(f"""
        import runpy, sys
        sys.argv = [{str(STUB)!r}, "--stub-version", {version!r}] + sys.argv[1:]
        runpy.run_path({str(STUB)!r}, run_name="__main__")
    """))
    dist = site / f"sglang-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
    py = root / "python"
    py.write_text(f'#!/bin/sh\nPYTHONPATH="{site}:$PYTHONPATH" exec "{sys.executable}" "$@"\n')
    py.chmod(0o755)
    return str(py)


@pytest.fixture
def sglang_059(tmp_path, wheel_install):
    py = fake_sglang(tmp_path, wheel_install("sglang-0.5.9").source, "0.5.9")
    return prepare(EngineSpec(name="sglang", python=py, startup_timeout_s=60),
                   ModelSpec(path="org/moe", served_name="moe"), say=lambda _: None)


def test_launch_resolved_config_metrics_and_log(sglang_059, tmp_path):
    prep = sglang_059
    assert prep.install.version == "0.5.9" and prep.install.distribution == "sglang"
    knobs = Knobs(cuda_graph="piecewise", torch_compile=True, cuda_graph_max_bs=32)
    with serve(prep, knobs, tmp_path / "run") as target:
        assert target.flags == ["--enable-piecewise-cuda-graph", "--cuda-graph-max-bs", "32", "--enable-torch-compile"]
        cmd = target.command
        assert " -m sglang.launch_server --model-path org/moe --served-model-name moe " in cmd and "--enable-metrics" in cmd
        r = target.resolved_config
        assert r["version"] == "0.5.9" and r["cuda_graph_max_bs"] == 32 and r["enable_torch_compile"] is True
        assert r["enable_piecewise_cuda_graph"] is False  # the stub applies 0.5.9's compile-vs-piecewise rule
        load = LoadSpec(concurrency=(2,), num_requests=4, input_len=8, output_len=4, endpoint="generate")
        res = run_sweep(target.base_url, target.model, load, None, progress=False)
        assert res.summary()["completed"].iloc[0] == 4
    log = analyze_log_file(tmp_path / "run" / "server.stderr.log", "sglang")
    assert {"piecewise_compile_conflict", "server_ready"} <= set(log["name"])


def test_get_server_info_on_04x(tmp_path, wheel_install):
    py = fake_sglang(tmp_path, wheel_install("sglang-0.4.10").source, "0.4.10")
    prep = prepare(EngineSpec(name="sglang", python=py, startup_timeout_s=60), ModelSpec(path="org/moe"),
                   say=lambda _: None)
    with serve(prep, Knobs(cuda_graph="off"), tmp_path / "run") as target:
        assert target.flags == ["--disable-cuda-graph"]
        assert target.resolved_config["disable_cuda_graph"] is True  # read from /get_server_info (no /server_info)


def test_torch_profile_is_stored_with_the_point(sglang_059, tmp_path):
    """A study point with a torch profile: /start_profile and /stop_profile around one window after the point's load,
    the trace parsed into the kernel table stored with the point (the raw trace removed), read back offline."""
    from servescope.study import Arm, run_study

    engine = {"name": "sglang", "python": sglang_059.install.python, "startup_timeout_s": 60}
    model = {"path": "org/moe", "served_name": "moe"}
    load = {"concurrency": [1], "num_requests": 2, "input_len": 8, "output_len": 4, "endpoint": "generate"}
    prof = {"kind": "torch", "num_requests": 2}
    study = run_study("t", context(engine, model, load, repetitions=1, store_dir=str(tmp_path), progress=False,
                                   telemetry={"enabled": False}, profile=prof), [Arm("default", Knobs())])
    k = study.kernels()
    assert set(k["name"].astype(str)) == {"fused_moe_kernel", "nvjet_sm90_tst_64x8"}
    from servescope.analysis import kernels as ak
    moe = ak.moe_path(k)
    assert list(moe["moe_path"]) == ["triton_fused_moe"] and moe["share"].iloc[0] == pytest.approx(30 / 40)
    (w,) = study.results.profiles.to_dict("records")
    assert w["kind"] == "torch" and w["concurrency"] == 1 and w["completed"] == 2 and w["kernels"] == len(k)
    assert list(w["traces"]) == [n for n in w["traces"] if n.endswith(".trace.json.gz")] and len(w["traces"]) == 1
    point = Path(study.results.points["path"].iloc[0])
    assert not (point / "profile").exists() and (point / "kernels.parquet").is_file()
    # the profile is part of the point's identity; offline, the same study reads it from the store
    again = run_study("t", context(engine, model, load, repetitions=1, store_dir=str(tmp_path), offline=True,
                                   profile=prof), [Arm("default", Knobs())])
    assert len(again.kernels()) == len(k) and len(again.kernel_summary()) == 1


def test_cuda_profiler_activity_for_nsys(sglang_059, tmp_path, monkeypatch):
    sent = {}
    monkeypatch.setattr("servescope.engines.sglang.post", lambda url, body, timeout_s: sent.update(url=url, body=body))
    get_engine("sglang").start_profile("http://h:1")
    assert sent == {"url": "http://h:1/start_profile", "body": {"activities": ["CUDA_PROFILER"]}}


def test_thread05_on_sglang_compares_under_decode_graphs_and_finds_the_piecewise_exclusion(sglang_059, tmp_path,
                                                                                         wheel_install):
    """SGLang compiles inside its decode graphs, so both sides pin decode graphs; the probe asking compile and
    piecewise at once resolves (0.5.9's rule, logged at run time) to prefill graphs off."""
    from servescope.threads import torch_compile as t05

    engine = {"name": "sglang", "python": sglang_059.install.python, "startup_timeout_s": 60}
    model = {"path": "org/moe", "served_name": "moe"}
    load = {"concurrency": [1, 2], "num_requests": 4, "input_len": 8, "output_len": 4, "endpoint": "generate"}
    cs = t05.run(context(engine, model, load, repetitions=2, store_dir=str(tmp_path), progress=False,
                         telemetry={"enabled": False}), exclusion=False)
    study = cs.study
    flags = dict(zip(study.results.points["config"], study.results.points["flags"], strict=False))
    assert flags == {"compiled": "--enable-torch-compile", "eager": ""}  # decode graphs are 0.5.9's default
    v = study.verification()
    assert set(v[v["field"].isin(["compile", "graph_decode", "graph_prefill"])]["status"]) == {"as requested"}
    excl = t05.piecewise_exclusion(study)
    assert excl.verdict == "excludes" and "prefill graphs off" in excl.words
    study.__dict__["install"] = wheel_install("sglang-0.5.9")  # the fake package holds server_args.py alone
    audit = t05._with_audit(study, [])
    assert audit["where"].str.contains("can_run_piecewise_cuda_graph").any()  # the real source's rule, listed
    f, x = t05.findings(t05.CompileStudy(study, excl))
    assert x.title == "torch.compile excludes piecewise CUDA graphs here" and x.applies and x.confidence == "high"
    assert "eager ran as compile off, CUDA graphs decode_only" in f.claim


def test_thread02_on_sglang_059_expresses_its_modes_and_reads_its_graph_counters(sglang_059, tmp_path):
    """SGLang 0.5.9 can ask for off, decode-only and piecewise graphs (not full prefill graphs, which came with the
    per-phase backends); each arm resolves as asked; its cuda_graph_passes counter comes back per point."""
    from servescope.threads import graph_modes as t02

    engine = {"name": "sglang", "python": sglang_059.install.python, "startup_timeout_s": 60}
    load = {"concurrency": [2], "num_requests": 16, "input_len": 8, "output_len": 32, "endpoint": "generate"}
    gs = t02.run(context(engine, {"path": "org/moe", "served_name": "moe"}, load, repetitions=1,
                         store_dir=str(tmp_path), progress=False, telemetry={"metrics_hz": 20}))
    modes = dict(zip(gs.modes["mode"], gs.modes["expressible"], strict=True))
    assert modes == {"off": True, "decode_only": True, "full": False, "piecewise": True, "compiled_piecewise": False}
    assert "piecewise graphs are torch.compile's already" in gs.modes.set_index("mode").loc["compiled_piecewise",
                                                                                             "reason"]
    assert "0.5.9" in gs.modes.set_index("mode").loc["full", "reason"]
    assert set(gs.study.verification()["status"]) == {"as requested"}
    counters = gs.study.graph_metrics()
    assert set(counters["metric"]) == {"sglang:cuda_graph_passes_total"}
    assert set(counters["config"]) == {"off", "decode_only", "piecewise"}


# -- 0.5.17: a site folder and base arguments given by the suite, per-phase graph backends, a death at capture ------
BASE = ("--attention-backend", "triton", "--sampling-backend", "pytorch")


@pytest.fixture
def sglang_0517(tmp_path, wheel_install):
    """SGLang 0.5.17's protocol stub in a site folder of its own, reached only through engine.env (PYTHONPATH), the
    way the H200 machine runs it, with the suite's base arguments."""
    fake_sglang(tmp_path, wheel_install("sglang-0.5.17").source, "0.5.17")
    return {"name": "sglang", "python": sys.executable, "env": {"PYTHONPATH": str(tmp_path / "site")},
            "args": list(BASE), "startup_timeout_s": 60}


def test_0517_site_folder_and_base_args_reach_every_launch(sglang_0517, tmp_path):
    from servescope.spec import parse

    prep = prepare(parse(EngineSpec, sglang_0517, "engine"), ModelSpec(path="org/moe", served_name="moe"),
                   say=lambda _: None)
    assert (prep.install.version, prep.install.env) == ("0.5.17", sglang_0517["env"])
    with serve(prep, Knobs(cuda_graph="off"), tmp_path / "run") as target:
        assert target.flags == ["--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"]
        assert target.command.endswith(" ".join(BASE))
        r = target.resolved_config
        assert r["attention_backend"] == "triton" and r["cuda_graph_config"]["prefill"]["backend"] == "disabled"
        run_sweep(target.base_url, target.model, LoadSpec(concurrency=(1,), num_requests=2, input_len=8,
                                                           output_len=4, endpoint="generate"), None, progress=False)
    ad = get_engine("sglang")
    log = (tmp_path / "run" / "server.stderr.log").read_text()
    st = ad.resolved_state(r, log)
    assert (st.graphs, st.graph_mode) == ("off", "decode=disabled prefill=disabled")
    counts = ad.graph_counts(log)
    assert set(counts["mode"]) == {"prefill eager", "decode eager"} and counts["batches"].min() >= 2


def test_0517_every_graph_mode_is_spelled_and_read_back(wheel_install):
    ad, inst = get_engine("sglang"), wheel_install("sglang-0.5.17")
    spelled = {m: ad.knob_flags(Knobs(cuda_graph=m), inst) for m in
               ("off", "decode_only", "full", "piecewise", "compiled_piecewise")}
    assert spelled["compiled_piecewise"] == ["--cuda-graph-backend-decode", "full", "--cuda-graph-backend-prefill",
                                             "tc_piecewise"]
    assert spelled["piecewise"][-1] == "breakable" and spelled["full"][-1] == "full"
    for mode, (dec, pre) in {"compiled_piecewise": ("full", "tc_piecewise"), "piecewise": ("full", "breakable"),
                             "decode_only": ("full", "disabled")}.items():
        st = ad.resolved_state({"cuda_graph_config": {"decode": {"backend": dec}, "prefill": {"backend": pre}}})
        assert st.graphs == mode
    with pytest.raises(Exception, match="does not define --enable-piecewise-cuda-graph"):
        ad.check_flags(["--enable-piecewise-cuda-graph"], inst)
    # an auto-selected prefill graph its log says was not captured runs eager
    st = ad.resolved_state({"cuda_graph_config": {"decode": {"backend": "full"}, "prefill": {"backend": "breakable"}}},
                           "[x] Disabling auto-selected prefill CUDA graph: only 1.00 GiB is free after model/KV")
    assert st.graphs == "decode_only" and "not captured" in st.graph_mode


def test_0517_user_flag_is_named_with_its_alias(wheel_install):
    ad, inst = get_engine("sglang"), wheel_install("sglang-0.5.17")
    (hit,) = ad.graph_off_flags(["python", "-m", "sglang.launch_server", "--disable-cuda-graph", "--port", "1"], inst)
    assert hit["flag"] == "--disable-cuda-graph" and hit["phases"] == "decode and prefill"
    assert "deprecated alias on sglang 0.5.17" in hit["alias"] and "--cuda-graph-backend-decode disabled" in hit["alias"]


def test_0517_bad_base_argument_and_missing_site_are_refused_before_launch(sglang_0517, tmp_path):
    from servescope.errors import KnobError, SpecError
    from servescope.spec import parse

    bad = parse(EngineSpec, {**sglang_0517, "args": ["--enable-piecewise-cuda-graph"]}, "engine")
    with pytest.raises(KnobError, match=r"engine.args: sglang 0.5.17 does not define --enable-piecewise-cuda-graph"):
        prepare(bad, ModelSpec(path="org/moe"), say=lambda _: None)
    gone = parse(EngineSpec, {**sglang_0517, "env": {"PYTHONPATH": str(tmp_path / "nowhere")}}, "engine")
    with pytest.raises(SpecError, match="PYTHONPATH names .*nowhere, which is not a folder"):
        prepare(gone, ModelSpec(path="org/moe"), say=lambda _: None)
    empty = tmp_path / "empty"
    empty.mkdir()
    none = parse(EngineSpec, {**sglang_0517, "env": {"PYTHONPATH": str(empty)}}, "engine")
    with pytest.raises(KnobError, match="no SGLang installed under .* with PYTHONPATH="):
        prepare(none, ModelSpec(path="org/moe"), say=lambda _: None)


def test_0517_full_prefill_graphs_die_with_the_engines_own_exception(sglang_0517, tmp_path):
    """The stub dies as the real 0.5.17 on the H200 did: the scheduler raises at the first prefill replay, the
    launcher kills its own tree; the failure names the exception and its frame, not the teardown's SIGKILL."""
    from servescope.errors import ServerExitedError
    from servescope.spec import parse

    prep = prepare(parse(EngineSpec, sglang_0517, "engine"), ModelSpec(path="org/moe"), say=lambda _: None)
    with pytest.raises(ServerExitedError) as ei, serve(prep, Knobs(cuda_graph="full"), tmp_path / "run"):
        pass
    e = ei.value
    assert e.cause.exception.type == "ValueError" and e.cause.exception.process == "Scheduler"
    assert e.cause.exception.frame == "sglang/srt/layers/attention/triton_backend.py:1202 in " \
        "_init_forward_metadata_cuda_graph"
    assert e.cause.teardown == "engine" and "Received sigquit" in e.cause.teardown_evidence
    head = str(e).splitlines()[0]
    assert "the Scheduler raised ValueError: Invalid forward mode" in head and "SIGKILL" not in head


def test_0517_declares_continuous_decode_steps_and_never_reads_it(wheel_install):
    """Said upstream to be a no-op: 0.5.17's source declares num_continuous_decode_steps and no other file reads it
    (thread 07's search says so beside what its launch measured); the running-request cap is read."""
    unread = get_engine("sglang").unread_knobs(wheel_install("sglang-0.5.17"))
    assert set(unread) == {"num_continuous_decode_steps"}
    assert "no other file of its source reads it" in unread["num_continuous_decode_steps"]


def test_0517_launches_turn_on_the_engines_own_forward_occupancy_and_it_stands_beside_nvml(wheel_install):
    """SGLang 0.5.17 times its forward passes with CUDA events when SGLANG_ENABLE_METRICS_DEVICE_TIMER is set and
    exports the share as sglang:fwd_occupancy (read from the published wheel); every SGLang launch sets it, the
    counter is read, and where it and NVML's utilization disagree the page says so."""
    import pandas as pd

    from servescope.analysis.telemetry import engine_beside_gpu

    ad, inst = get_engine("sglang"), wheel_install("sglang-0.5.17")
    tree = ad.source_tree(inst)
    assert "SGLANG_ENABLE_METRICS_DEVICE_TIMER = EnvBool(False)" in tree.read("sglang/srt/environ.py")
    assert 'name="sglang:fwd_occupancy"' in tree.read("sglang/srt/observability/metrics_collector.py")
    plan = ad.plan(install=inst, model_path="/m", served_name="m", host="h", port=1, knobs=Knobs(), extra_env={})
    assert plan.env["SGLANG_ENABLE_METRICS_DEVICE_TIMER"] == "1"
    assert ad.counters["fwd_occupancy_pct"][0] == "sglang:fwd_occupancy"
    assert 'name="sglang:forward_execution_seconds_total"' in tree.read("sglang/srt/observability/metrics_collector.py")
    assert ad.counters["fwd_busy_pct"][:2] == ("sglang:forward_execution_seconds_total", "rate_per_s")
    row = {"config": "off", "rep": 0, "point": "c=128", "fwd_occupancy_pct": 41.0}
    gpu = pd.DataFrame([{"config": "off", "rep": 0, "phase": "c=128", "gpu_util_pct_p50": 100.0}])
    said = engine_beside_gpu(pd.DataFrame([row]), gpu, pd.DataFrame())["said"].iloc[0]
    assert "forward passes on the GPU 41% of the time, NVML reads it 100% utilized" in said
    agree = engine_beside_gpu(pd.DataFrame([{**row, "fwd_occupancy_pct": 92.0}]), gpu, pd.DataFrame())
    assert agree["said"].iloc[0] == ""
