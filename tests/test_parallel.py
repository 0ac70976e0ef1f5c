"""Thread 4's machinery: the client's router, replicas pinned to their share of the cores, the layouts checked before
launch, and the all-reduce probe (gloo on CPU processes: the same script NCCL runs on GPUs)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest

from conftest import our_processes
from servescope.context import context
from servescope.errors import KnobError, NotMeasuredError, SpecError
from servescope.experiment import Config, measure
from servescope.load.runner import Router
from servescope.probes.run import Skipped
from servescope.spec import EngineSpec, Knobs, LoadSpec, ModelSpec
from servescope.store import Store, export_points
from servescope.threads import parallelism as t04

LOAD = LoadSpec(concurrency=(1, 4), num_requests=24, output_len=8, warmup_requests=0)
MODEL = ModelSpec(path="stub")
TWO_CORES = len(os.sched_getaffinity(0)) >= 2


def test_round_robin_takes_turns_and_least_outstanding_avoids_the_busy_one():
    rr = Router(["a", "b", "c"])
    assert [rr.acquire() for _ in range(5)] == [0, 1, 2, 0, 1]
    lo = Router(["a", "b"], "least_outstanding")
    assert lo.acquire() == 0 and lo.acquire() == 1  # ties go in turn
    assert lo.acquire() == 0  # tie again (one each in flight)
    lo.release(1)
    assert lo.acquire() == 1 and lo.acquire() == 1  # replica 1 has the fewest in flight until it catches up
    assert lo.inflight == [2, 2]
    with pytest.raises(ValueError, match="unknown route"):
        Router(["a"], "random")


def test_a_route_needs_replicas():
    with pytest.raises(ValueError, match="needs replicas > 1"):
        Knobs(route="least_outstanding")
    assert Knobs(replicas=2, route="round_robin").devices == 2


@pytest.mark.skipif(not TWO_CORES, reason="needs two cores to pin two replicas")
def test_replicas_are_pinned_and_the_least_outstanding_route_avoids_a_slow_one(tmp_path, stub_engine):
    """Two stub replicas, the one on core 1 four times slower: round-robin splits requests evenly, least-outstanding
    sends the slow one fewer; every server is pinned to its core, and all are gone afterwards."""
    eng = EngineSpec(**{**stub_engine, "env": {"STUB_SLOW_CORE": "1"}})
    load = LoadSpec(concurrency=(4,), num_requests=40, output_len=16, warmup_requests=0)
    cfgs = [Config("rr", Knobs(replicas=2, route="round_robin")),
            Config("lo", Knobs(replicas=2, route="least_outstanding", extra_args=("--itl-ms", "2")))]
    res = measure(eng, MODEL, cfgs, load, repetitions=1, store=Store(tmp_path), say=lambda m: None)
    assert res.errors.empty, res.errors["summary"].tolist()
    req = res.requests[res.requests["phase"] == "measure"]
    counts = req.groupby(["config", "replica"]).size().unstack()
    assert counts.loc["rr"].tolist() == [20, 20]
    assert counts.loc["lo", 0] > counts.loc["lo", 1] * 1.5, counts
    for path in res.points["path"]:
        man = json.loads((Path(path) / "manifest.json").read_text())
        reps = man["target"]["replicas"]
        assert [r["placement"] for r in reps] == ["replica 0: cores 0", "replica 1: cores 1"]
        assert all(r["command"].startswith("taskset -c ") for r in reps)
        assert (Path(path) / "replica-1" / "server.stdout.log").read_text().count("slow") == 1
        procs = pd.read_parquet(Path(path) / "telemetry_server_procs.parquet")
        assert set(procs["replica"]) == {0, 1}  # the host sampler follows both trees
    assert not our_processes("stub_server.py")


def test_more_replicas_than_cores_is_refused_before_launch(tmp_path, stub_engine):
    n = len(os.sched_getaffinity(0)) + 1
    with pytest.raises(KnobError, match=f"{n} replicas of tp=1 x dp=1 needs {n} CPU cores"):
        measure(EngineSpec(**stub_engine), MODEL, [Config("x", Knobs(replicas=n))], LOAD, repetitions=1,
                store=Store(tmp_path), say=lambda m: None)
    assert not list(Store(tmp_path).keys())


def test_replicas_refuse_a_pinned_port(tmp_path, stub_engine):
    eng = EngineSpec(**{**stub_engine, "port": 18123})
    with pytest.raises(SpecError, match="engine.port pins one port"):
        measure(eng, MODEL, [Config("x", Knobs(replicas=2))], LOAD, repetitions=1, store=Store(tmp_path),
                say=lambda m: None)


@pytest.mark.skipif(not TWO_CORES, reason="needs two cores")
def test_thread04_on_the_stub_compares_layouts_and_shows_refusals(tmp_path, stub_engine):
    ps = t04.run(context(stub_engine, {"path": "stub"}, LOAD, repetitions=2, store_dir=str(tmp_path), progress=False))
    over = ps.overview().set_index("layout")
    assert over.loc["1 server", "status"].startswith("measured (2 launches")
    assert over.loc["2 replicas, least-outstanding", "status"].startswith("measured")
    assert over.loc["tp=2", "status"] == "refused before launch: tensor parallelism is measured where there are " \
                                         "GPUs for it"
    assert isinstance(ps.allreduce.outcome, Skipped) and "needs two or more GPUs" in ps.allreduce.why_not
    t = ps.table()
    assert {"output_tok_s_per_core", "cores"} <= set(t.columns)
    b = ps.balance()
    assert set(b["replica"]) == {0, 1} and (b["imbalance_pct"] >= 0).all()
    fs = t04.findings(ps)
    assert fs[0].thread == "04_data_parallelism" and any(f.title.startswith("tp=2: not available") for f in fs)
    per = [f for f in fs if f.title.endswith(" vs 1 server")]
    assert {f.effect.treatment for f in per if f.effect} >= {"2 replicas, round-robin", "2 replicas, least-outstanding"}
    mem = ps.memory()
    assert "host_mem_available_mib" in mem and (mem["host_mem_available_mib"] > 0).all()
    # offline: the layouts' checks and the probe's answer come from the store
    again = t04.run(context(stub_engine, {"path": "stub"}, LOAD, repetitions=2, store_dir=str(tmp_path), offline=True,
                            progress=False))
    assert again.overview().equals(ps.overview()) and again.allreduce.outcome == ps.allreduce.outcome
    exported = tmp_path / "exported"  # store-export carries the notes with the points
    export_points(Store(tmp_path), exported)
    assert (exported / "_notes" / "layouts").is_dir()
    with pytest.raises(NotMeasuredError, match="never checked"):
        t04.run(context({**stub_engine, "python": "/nonexistent/python"}, {"path": "stub"}, LOAD,
                        store_dir=str(tmp_path), offline=True))


def test_spec_errors_before_launch(tmp_path, stub_engine):
    with pytest.raises(SpecError, match="at least two replicas"):
        t04.run(context(stub_engine, {"path": "stub"}, LOAD, store_dir=str(tmp_path)), replicas=1)
    with pytest.raises(SpecError, match="routes: give one or more of round_robin, least_outstanding"):
        t04.run(context(stub_engine, {"path": "stub"}, LOAD, store_dir=str(tmp_path)), routes=["random"])
    assert not any(tmp_path.iterdir())  # refused before anything was checked, launched or noted


def test_layouts_take_the_routes_asked_for():
    names = [x.arm.name for x in t04.layouts(None, 2, "cpu", ("round_robin",)) if x.kind == "replicas"]
    assert names == ["2 replicas, round-robin"]
    both = [x.arm.knobs.route for x in t04.layouts(None, 2, "cpu") if x.kind == "replicas"]
    assert both == ["round_robin", "least_outstanding"]


def test_replicas_that_win_are_a_deployment_to_make_never_the_engines_defaults():
    """A cold run here had 2 replicas beat 1 server (+115%, high) and said "The engine's defaults already run as
    2 replicas (no flag to add)", tiered already optimal: vLLM spells replicas with no engine flag, but its defaults
    are one server. The rule for a flagless better side, as an engine that spells no flag for either side sees it."""
    from types import SimpleNamespace

    from servescope.comparison import Comparison, _advice_words

    flagless = SimpleNamespace(study=SimpleNamespace(spell=lambda knobs: ([], "")), baseline="1 server",
                               treatment="2 replicas, round-robin")
    two = Comparison._advice(flagless, Knobs(replicas=2, route="round_robin"), "better", "high", None)
    assert not two.already_optimal and _advice_words(two, None) == (None, "", "")
    # one server's own knobs with no flag: that is what the defaults run
    one = Comparison._advice(flagless, Knobs(), "better", "high", None)
    _, words, reason = _advice_words(one, None)
    assert "already run as 2 replicas, round-robin" in words and reason.startswith("already optimal")
    assert one.already_optimal


def test_the_tp_layout_is_captured_once_under_nsys_and_no_nsys_is_said(tmp_path, monkeypatch):
    """profile_tp on two (fake) GPUs: the TP layout once more, one repetition, under nsys; here no nsys is installed,
    so its finding says the capture measured nothing and why, and an offline render says the same. Without
    profile_tp nothing more is launched. The real capture is the x2 recording's (data/suites/sglang-h200x2.yaml)."""
    import sys

    from servescope.profile import nsys
    from servescope.telemetry.testing import FakeGpu, fake_nvml

    monkeypatch.setattr(nsys, "NSYS_GLOBS", (str(tmp_path / "none*/nsys"),))
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + ":/usr/bin:/bin")
    eng = {"name": "stub-gpu", "python": sys.executable, "startup_timeout_s": 30}
    load = {"concurrency": [1, 4], "num_requests": 16, "output_len": 8, "warmup_requests": 0}
    with fake_nvml([FakeGpu(), FakeGpu()]):
        plain = t04.run(context(eng, {"path": "stub"}, load, repetitions=2, store_dir=str(tmp_path / "a"),
                                progress=False), routes=["least_outstanding"], shared=[], allreduce=False)
        ps = t04.run(context(eng, {"path": "stub"}, load, repetitions=2, store_dir=str(tmp_path / "s"),
                             progress=False), routes=["least_outstanding"], shared=[], allreduce=False, profile_tp=True)
    assert plain.tp_profile is None and not [f for f in t04.findings(plain) if "under nsys" in f.title]
    assert ps.overview().set_index("layout").loc["tp=2", "status"].startswith("measured")
    assert ps.tp_profile is not None and [a.knobs for a in ps.tp_profile.arms] == [Knobs(tp=2)]
    errs = ps.tp_profile.results.errors
    assert list(errs["rep"]) == [0] and (errs["error_type"] == "ProfilingUnavailable").all()
    (f,) = [f for f in t04.findings(ps) if "under nsys" in f.title]
    assert f.title == "tp=2 under nsys: not measured" and not f.applies and "nsys) not found" in f.headline
    assert ps.tp_communication().empty
    # the failed capture is a failed point of the thread (the index shows it partial), not only a finding
    o, layouts_only = ps.outcome(t04.findings(ps)), ps.study.results.outcome(t04.THREAD, [])
    assert (o.points_planned, o.points_failed) == (layouts_only.points_planned + 1, layouts_only.points_failed + 1)
    assert "ProfilingUnavailable" in o.first_error and plain.outcome([]) == plain.study.results.outcome(t04.THREAD, [])
    with fake_nvml([FakeGpu(), FakeGpu()]):
        again = t04.run(context(eng, {"path": "stub"}, load, repetitions=2, store_dir=str(tmp_path / "s"),
                                offline=True, progress=False), routes=["least_outstanding"], shared=[],
                        allreduce=False, profile_tp=True)
    (g,) = [f for f in t04.findings(again) if "under nsys" in f.title]
    assert g.title == f.title and not g.applies


def test_the_tp_captures_collectives_are_priced_per_gpu():
    """From a TP capture's kernel table (NCCL's and SGLang's custom all-reduce kernel names, as nsys writes them):
    per GPU, the collectives' share of kernel time and the kernel that took most; the finding says one capture."""
    from types import SimpleNamespace

    from servescope.analysis import kernels as ak
    from servescope.study import Arm

    rows = []
    for dev in (0, 1):
        rows += [{"config": "tp=2", "rep": 0, "device": dev, "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
                  "dur_ns": 2_000_000 + dev * 1_000_000},
                 {"config": "tp=2", "rep": 0, "device": dev, "name": "cross_device_reduce_1stage<__nv_bfloat16, 2>",
                  "dur_ns": 1_000_000},
                 {"config": "tp=2", "rep": 0, "device": dev, "name": "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT",
                  "dur_ns": 7_000_000},
                 {"config": "tp=2", "rep": 1, "device": dev, "name": "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT",
                  "dur_ns": 9_000_000}]  # a second repetition's table is not read: one capture
    k = ak.with_categories(pd.DataFrame(rows).assign(op=None))
    study = SimpleNamespace(kernels=lambda: k, arms=[Arm("tp=2", Knobs(tp=2))],
                            results=SimpleNamespace(profiles=pd.DataFrame({"concurrency": [32]}), errors=pd.DataFrame()))
    ps = t04.ParallelStudy([], study, "GPUs", 2, tp_profile=study)
    t = ps.tp_communication().set_index("device")
    assert list(t["communication_share"]) == [0.3, 0.3636]  # 3 of 10 ms; 4 of 11 ms
    assert t.loc[1, "top_communication_kernel"] == "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"
    assert list(t["communication_kernels"]) == [2, 2]
    f = t04._tp_profile_finding(ps)
    assert f.title == "tp=2: collectives take 33% of GPU time" and f.applies and f.confidence == "medium"
    assert f.headline == ("In one nsys capture of tp=2 at c=32, the collective kernels (NCCL, all-reduce) took 33.3% of "
                          "all GPU kernel time")
    assert "GPU 1: 36.4% of 11 ms of kernel time (2 kernels, most ncclDevKernel_AllReduce_Sum_bf16_RING_LL)" in f.detail
