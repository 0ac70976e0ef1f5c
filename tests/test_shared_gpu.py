"""Replicas sharing one GPU (thread 04), on stub servers under a fake NVML and a stub MPS control program: the
knobs, the memory-fit and MPS refusals before launch, placement and core pinning, the suite's MPS daemon around a
launch (clients checked; nothing left after a normal end, a fault mid-run, a replica that never became a client, an
interrupt), a daemon that already serves (used and left running; time-slicing replicas kept off it), and the
thread's layouts, tables and findings. The real driver backs the stub control program: tests/fixtures/h200_mps/ and
the H200 recording of thread 04 (data/reference/h200/)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from pathlib import Path

import psutil
import pytest

from conftest import our_processes
from servescope import mps
from servescope.context import context
from servescope.engines import get_engine
from servescope.engines.base import EngineInstall, shared_fit
from servescope.errors import KnobError, ServescopeError
from servescope.experiment import Config, measure
from servescope.launch import prepare, serve
from servescope.mps import GpuFacts, MpsDaemon
from servescope.spec import EngineSpec, Knobs, LoadSpec, ModelSpec
from servescope.store import Store
from servescope.telemetry.testing import FakeGpu, fake_nvml
from servescope.threads import parallelism as t04

STUB_MPS = Path(__file__).with_name("mps_stub.py")
LOAD = LoadSpec(concurrency=(1, 4), num_requests=16, output_len=8, warmup_requests=0)
MODEL = ModelSpec(path="stub")
TWO_CORES = len(os.sched_getaffinity(0)) >= 2
GPU_INSTALL = EngineInstall(python=sys.executable, version="0.0-stub", distribution="stub", platform="cuda")
SHARE = {"replicas": 2, "route": "round_robin", "mem_fraction": 0.45}


@pytest.fixture
def gpu_engine() -> dict:
    """EngineSpec fields of the stub that says it serves on a GPU."""
    return {"name": "stub-gpu", "python": sys.executable, "startup_timeout_s": 30}


@pytest.fixture
def mps_box(tmp_path, monkeypatch) -> Path:
    """A PATH whose nvidia-cuda-mps-control is the stub, temp folders under tmp_path (to see what is left), and no
    daemon in the default pipe directory's place."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / mps.CONTROL
    shutil.copy(STUB_MPS, exe)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr("tempfile.tempdir", None)
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "no-daemon-here"))
    return tmp


def _left(tmp: Path) -> list[str]:
    """MPS daemons, stub servers and MPS folders still there."""
    procs = our_processes("stub_server.py", mps.CONTROL)
    return [str(p.info["cmdline"]) for p in procs] + [d.name for d in tmp.glob("servescope-*mps-*")]


def test_knobs_say_what_sharing_needs():
    with pytest.raises(ValueError, match="needs replicas > 1"):
        Knobs(gpu_share="mps")
    with pytest.raises(ValueError, match="needs gpu_share='mps'"):
        Knobs(replicas=2, gpu_share="time_slicing", mps_active_thread_pct=50)
    with pytest.raises(ValueError):
        Knobs(replicas=2, gpu_share="mps", mps_active_thread_pct=0)
    assert Knobs(replicas=3, gpu_share="mps").devices == 1  # one GPU for all of them
    assert Knobs(replicas=3).devices == 3


def test_memory_fit_counts_as_each_engine_counts_its_share():
    gpu = GpuFacts(0, "Default", False, (9, 0), mem_total_mib=143_771, mem_free_mib=143_000)
    w = 5 * 1024.0  # a 5 GiB model
    assert shared_fit("total", 2, 0.45, w, gpu) == ""
    assert "need 189.5 GiB" in shared_fit("total", 3, 0.45, w, gpu)  # vLLM: three budgets of 0.45 of the GPU
    assert "below its weights" in shared_fit("total", 2, 0.03, w, gpu)
    assert shared_fit("free", 3, 0.3, w, gpu) == ""
    assert "the last to start gets" in shared_fit("free", 3, 0.03, w, gpu)  # SGLang: shares of what is left
    assert shared_fit("cache", 3, 0.26, w, gpu) == ""
    assert "do not fit beside caches" in shared_fit("cache", 3, 0.26, 60 * 1024.0, gpu)  # transformers' caches
    assert shared_fit("total", 2, 0.45, w, GpuFacts(0)) == ""  # memory not read: nothing to refuse on
    assert get_engine("transformers").shared_mem_fraction(2) == 0.4
    assert get_engine("vllm").shared_mem_fraction(3) == 0.3 and get_engine("sglang").shared_mem_fraction(2) == 0.45


@pytest.mark.skipif(not TWO_CORES, reason="needs two cores to pin two replicas")
def test_replicas_on_one_gpu_each_get_it_all_and_cores_of_their_own():
    ad = get_engine("stub-gpu")
    with fake_nvml([FakeGpu(), FakeGpu()]):
        places = ad.placements(Knobs(**SHARE, gpu_share="time_slicing"), GPU_INSTALL, {})
        apart = ad.placements(Knobs(replicas=2), GPU_INSTALL, {})
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in places] == ["0", "0"]
    assert [p.words() for p in places] == ["replica 0: GPUs 0 (shared), cores 0", "replica 1: GPUs 0 (shared), cores 1"]
    assert [p.prefix for p in places] == [("taskset", "-c", "0"), ("taskset", "-c", "1")]
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in apart] == ["0", "1"]  # separate GPUs are pinned to cores too
    assert apart[1].words() == "replica 1: GPUs 1, cores 1"


def test_what_cannot_share_a_gpu_is_refused_in_one_line(mps_box, tmp_path, monkeypatch):
    ad = get_engine("stub-gpu")
    model = tmp_path / "model"
    model.mkdir()
    with open(model / "model.safetensors", "wb") as fh:
        fh.truncate(20 * 2**30)  # a 20 GiB model, as far as sizes go (sparse)
    k = Knobs(**SHARE, gpu_share="mps")
    with fake_nvml([FakeGpu(mem_used_mib=100_000)]):  # 42.7 GiB free
        with pytest.raises(KnobError, match=r"^2 replicas of a 20.0 GiB model do not fit on GPU 0 \(42.7 GiB free of "
                                            r"140.4 GiB\): 2 shares"):
            ad.check_knobs(k, GPU_INSTALL, {}, str(model))
        with pytest.raises(KnobError, match="each need their memory share: set mem_fraction"):
            ad.check_knobs(Knobs(replicas=2, gpu_share="mps"), GPU_INSTALL, {}, "stub")
    with fake_nvml([FakeGpu(mig_enabled=True)]), pytest.raises(KnobError, match="^MPS: GPU 0 has MIG enabled"):
        ad.check_knobs(k, GPU_INSTALL, {}, "stub")
    with fake_nvml([FakeGpu(compute_mode=2)]), pytest.raises(KnobError, match="Prohibited"):
        ad.check_knobs(k, GPU_INSTALL, {}, "stub")
    with pytest.raises(KnobError, match="runs on cpu here"):
        ad.check_knobs(k, EngineInstall(sys.executable, "0", "stub", "cpu"), {}, "stub")
    monkeypatch.setenv("PATH", "/nonexistent")
    with fake_nvml([FakeGpu()]), pytest.raises(KnobError, match="^MPS: no nvidia-cuda-mps-control on PATH"):
        ad.check_knobs(k, GPU_INSTALL, {}, "stub")


def test_an_mps_layout_is_refused_before_anything_launches(mps_box, gpu_engine, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no control program: this driver has no MPS
    with fake_nvml([FakeGpu()]), pytest.raises(KnobError, match="MPS: no nvidia-cuda-mps-control on PATH.*nothing was "
                                                                "launched"):
        measure(EngineSpec(**gpu_engine), MODEL, [Config("x", Knobs(**SHARE, gpu_share="mps"))], LOAD,
                repetitions=1, store=Store(tmp_path / "store"), say=lambda m: None)
    assert not list(Store(tmp_path / "store").keys()) and not _left(mps_box)


@pytest.mark.skipif(not TWO_CORES, reason="needs two cores to pin two replicas")
def test_mps_replicas_are_the_daemons_clients_and_nothing_is_left(mps_box, gpu_engine, tmp_path):
    cfgs = [Config("mps", Knobs(**SHARE, gpu_share="mps", mps_active_thread_pct=50)),
            Config("ts", Knobs(**SHARE, gpu_share="time_slicing"))]
    with fake_nvml([FakeGpu()]):
        res = measure(EngineSpec(**gpu_engine), MODEL, cfgs, LOAD, repetitions=1, store=Store(tmp_path / "s"),
                      say=lambda m: None)
    assert res.errors.empty, res.errors["summary"].tolist()
    shares = {c: json.loads((Path(p) / "manifest.json").read_text())["target"]["gpu_share"]
              for c, p in zip(res.points["config"], res.points["path"], strict=True)}
    assert shares["mps"] == {"mode": "mps", "daemon": "servescope", "active_thread_pct": 50, "mps_servers": [1],
                             "clients": {"0": True, "1": True}}
    assert shares["ts"] == {"mode": "time_slicing"}  # two launches: the same commands, shared otherwise
    assert len(set(res.points["key"])) == 2
    assert not _left(mps_box)


@pytest.mark.skipif(not TWO_CORES, reason="needs two cores to pin two replicas")
@pytest.mark.parametrize("fault", ["a replica dies mid-run", "no replica became a client", "interrupt"])
def test_a_fault_leaves_no_daemon_and_no_folder(fault, mps_box, gpu_engine, tmp_path):
    env = {"a replica dies mid-run": {"STUB_DIE_AFTER": f"3:{tmp_path / 'die'}"},
           "no replica became a client": {"STUB_MPS_CLIENT": "0"}}
    (tmp_path / "die").write_text("")
    eng = EngineSpec(**{**gpu_engine, "env": env.get(fault, {})})
    with fake_nvml([FakeGpu()]):
        if fault == "interrupt":
            prep = prepare(eng, MODEL, say=lambda m: None)
            with pytest.raises(KeyboardInterrupt), serve(prep, Knobs(**SHARE, gpu_share="mps"), tmp_path / "log") as t:
                assert t.gpu_share is not None and t.gpu_share.clients == {0: True, 1: True}
                assert len(list(mps_box.glob("servescope-mps-*"))) == 1
                raise KeyboardInterrupt
        else:
            res = measure(eng, MODEL, [Config("mps", Knobs(**SHARE, gpu_share="mps"))], LOAD, repetitions=1,
                          store=Store(tmp_path / "s"), say=lambda m: None)
            assert len(res.errors) == 1 and res.points.empty
            if fault == "no replica became a client":
                assert "replica(s) 0, 1 are not clients of the MPS daemon" in res.errors["summary"].iloc[0]
    assert not _left(mps_box)


@pytest.mark.skipif(not TWO_CORES, reason="needs two cores to pin two replicas")
def test_a_daemon_already_serving_is_used_and_left_running(mps_box, gpu_engine, tmp_path, monkeypatch):
    theirs = MpsDaemon().start()
    try:
        monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(theirs.pipe_dir))
        cfgs = [Config("mps", Knobs(**SHARE, gpu_share="mps")), Config("ts", Knobs(**SHARE, gpu_share="time_slicing"))]
        with fake_nvml([FakeGpu()]):
            res = measure(EngineSpec(**gpu_engine), MODEL, cfgs, LOAD, repetitions=1, store=Store(tmp_path / "s"),
                          say=lambda m: None)
        assert res.errors.empty, res.errors["summary"].tolist()
        pts = {c: Store(tmp_path / "s").get(k) for c, k in zip(res.points["config"], res.points["key"], strict=True)}
        mine = pts["mps"].gpu_share
        assert mine is not None and mine.daemon == "already running" and "neither started nor stopped it" in mine.note
        assert mine.clients == {0: True, 1: True}
        assert "kept off it" in pts["ts"].gpu_share.note
        assert theirs.pid is not None and psutil.pid_exists(theirs.pid) and theirs.pipe_dir.is_dir()
        assert len(theirs.clients()) == 2  # the MPS replicas only: the time-sliced ones never connected
    finally:
        theirs.stop()
    assert not _left(mps_box)


@pytest.mark.skipif(not TWO_CORES, reason="needs two cores to pin two replicas")
def test_thread04_compares_sharing_layouts_with_one_server(mps_box, gpu_engine, tmp_path):
    class LiveProcs(dict):
        """The stub servers running now, as NVML would list the processes holding GPU memory."""

        def items(self):
            return [(p.pid, 512.0) for p in our_processes("stub_server.py")]

    load = {"concurrency": [1, 4], "num_requests": 16, "output_len": 8, "warmup_requests": 0}
    with fake_nvml([FakeGpu(procs=LiveProcs(), sm_active_pct=30.0)]):
        ctx = context(gpu_engine, {"path": "stub"}, load, repetitions=2, store_dir=str(tmp_path / "s"), progress=False)
        ps = t04.run(ctx, routes=["least_outstanding"], shared=[2, 3])
    over = ps.overview().set_index("layout")
    assert over.loc["2 replicas on 1 GPU, least-outstanding", "status"].startswith("measured (2 launches")
    assert over.loc["2 replicas on 1 GPU with MPS, least-outstanding", "status"].startswith("measured (2 launches")
    assert over.loc["3 replicas on 1 GPU with MPS, least-outstanding", "status"] == (
        "refused before launch: 3 replicas are each pinned to cores of their own; 2 cores here")
    assert over.loc["2 replicas, least-outstanding", "status"].endswith("needs 2 GPUs; 1 visible here")
    b = ps.balance()
    assert {"output_tok_s", "tpot_ms_p50", "ttft_ms_p50", "imbalance_pct"} <= set(b.columns)
    assert set(b["replica"]) == {0, 1} and (b["output_tok_s"] > 0).all()
    mem = ps.replica_gpu_memory()
    assert set(mem["replica"]) == {0, 1} and (mem["used_gpu_mem_mib_max"] == 512.0).all()
    host = ps.replica_host()
    assert "busiest_thread_cpu_pct_p50" in host and set(host["replica"]) == {0, 1}
    assert (ps.gpu_activity()["sm_active_pct_p50"] == 30.0).all()
    chk = ps.mps_check().set_index("config")
    assert set(chk.loc["2 replicas on 1 GPU with MPS, least-outstanding", "clients"]) == {
        "replica 0: yes, replica 1: yes"}
    fs = t04.findings(ps)
    per = {f.title.split(" vs ")[0]: f for f in fs if " vs 1 server" in f.title}
    assert set(per) == {"2 replicas on 1 GPU, least-outstanding", "2 replicas on 1 GPU with MPS, least-outstanding"}
    assert all("Latency against 1 server (median per level): TTFT" in f.claim and "TPOT" in f.claim
               for f in per.values())
    mps_f = [f for f in fs if f.title.startswith("MPS vs time-slicing")]
    assert len(mps_f) == 1 and mps_f[0].effect is not None
    assert mps_f[0].effect.baseline == "2 replicas on 1 GPU, least-outstanding"
    assert "MPS" in fs[0].claim and fs[0].thread == "04_data_parallelism"
    again = t04.run(context(gpu_engine, {"path": "stub"}, load, repetitions=2, store_dir=str(tmp_path / "s"),
                            offline=True, progress=False), routes=["least_outstanding"], shared=[2, 3])
    assert again.overview().equals(ps.overview())  # offline: refusals and points from the store
    assert not _left(mps_box)


def test_a_recipe_in_the_engines_spelling(wheel_install):
    k = Knobs(replicas=2, route="least_outstanding", gpu_share="mps", mem_fraction=0.45)
    sg = get_engine("sglang").replica_recipe(k, wheel_install("sglang-0.5.23"), ["replica 0: GPUs 0 (shared), cores 0-6"])
    assert sg.startswith("run 2 sglang servers on one GPU, each with `--mem-fraction-static 0.45`")
    assert "sglang_router.launch_router" in sg and "nvidia-cuda-mps-control -d" in sg
    tf = get_engine("transformers").replica_recipe(k.model_copy(update={"mem_fraction": 0.4}),
                                                   wheel_install("transformers-5.17.0"), [])
    assert "`--cb-max-memory-percent 0.4`" in tf and "spreading requests least-outstanding" in tf


def test_sharing_layouts_only_where_there_are_gpus():
    cpu = t04.layouts(None, 2, "cpu", shared=(2, 3), adapter=get_engine("vllm"))
    assert not [x for x in cpu if x.shares_gpu]  # the CPU build keeps its core-set layouts
    gpu = t04.layouts(None, 2, "cuda", ("round_robin",), (2,), get_engine("transformers"), 50)
    shared = {x.arm.name: x.arm.knobs for x in gpu if x.shares_gpu}
    assert shared == {"2 replicas on 1 GPU, round-robin": Knobs(replicas=2, route="round_robin", gpu_share="time_slicing",
                                                                  mem_fraction=0.4),
                      "2 replicas on 1 GPU with MPS, round-robin": Knobs(replicas=2, route="round_robin",
                                                                         gpu_share="mps", mem_fraction=0.4,
                                                                         mps_active_thread_pct=50)}
    with pytest.raises(ServescopeError, match="shared: replica counts on one GPU are 2 or more"):
        t04.run(context({"name": "stub", "python": sys.executable}, {"path": "stub"}, LOAD), shared=[1])


@pytest.mark.skipif(not TWO_CORES, reason="needs two cores to pin two replicas")
def test_one_sharing_mode_first_then_the_other_from_the_same_store(mps_box, gpu_engine, tmp_path):
    load = {"concurrency": [2], "num_requests": 4, "output_len": 4, "warmup_requests": 0}
    store = str(tmp_path / "s")
    with fake_nvml([FakeGpu()]):
        ps = t04.run(context(gpu_engine, {"path": "stub"}, load, repetitions=1, max_repetitions=1, store_dir=store,
                             progress=False), routes=["least_outstanding"], shared=[2], share_modes=["mps"])
        names = {x.arm.name for x in ps.layouts if x.shares_gpu}
        assert names == {"2 replicas on 1 GPU with MPS, least-outstanding"}  # the time-sliced layout is not asked for
        first = set(os.listdir(store))
        both = t04.run(context(gpu_engine, {"path": "stub"}, load, repetitions=1, max_repetitions=1, store_dir=store,
                               progress=False), routes=["least_outstanding"], shared=[2])
    new = set(os.listdir(store)) - first
    launched = [json.loads((Path(store) / k / "manifest.json").read_text())["parts"]["knobs"] for k in new
                if (Path(store) / k / "manifest.json").exists()]
    assert [k.get("gpu_share") for k in launched] == ["time_slicing"]  # 1 server and MPS came from the store
    over = both.overview().set_index("layout")
    assert over.loc["2 replicas on 1 GPU with MPS, least-outstanding", "status"].startswith("measured (1 launch")
    assert over.loc["2 replicas on 1 GPU, least-outstanding", "status"].startswith("measured (1 launch")
    with pytest.raises(ServescopeError, match="share_modes: give one or more of time_slicing, mps"):
        t04.run(context(gpu_engine, {"path": "stub"}, load), shared=[2], share_modes=["mig"])
    assert not _left(mps_box)
