"""The fault matrix: what a fault does to a run, and that nothing measured is lost, nothing broken is stored as
complete, and no process is left behind. Stub servers where a real engine is not needed."""

from __future__ import annotations

import json

import pandas as pd
import psutil
import pytest

from conftest import our_processes
from servescope.experiment import Config, measure
from servescope.load.health import FAILED_SHARE_LIMIT, level_failure
from servescope.spec import EngineSpec, Knobs, LoadSpec, ModelSpec
from servescope.store import Store

LOAD = LoadSpec(concurrency=(1, 4), num_requests=8, output_len=8, warmup_requests=0)
MODEL = ModelSpec(path="stub")


def _stub_processes() -> list[int]:
    return [p.pid for p in our_processes("stub_server.py")]


def test_kill_9_mid_load_keeps_the_finished_level_and_the_rerun_resumes(tmp_path, stub_engine):
    """The server is killed (SIGKILL) at the first request of c=4: the point is failed, not complete; c=1, finished
    before, is on disk; the rerun measures only c=4 and the point completes with both levels."""
    flag = tmp_path / "die"
    flag.write_text("1")
    engine = EngineSpec(**{**stub_engine, "env": {"STUB_DIE_AFTER": f"9:{flag}"}})  # 1 readiness + 8 at c=1
    store = Store(tmp_path / "store")
    said: list[str] = []
    res = measure(engine, MODEL, [Config("a", Knobs())], LOAD, repetitions=1, store=store, say=said.append)
    key = res.errors["key"].iloc[0]
    assert res.errors["error_type"].iloc[0] in ("ServerDiedError", "LevelFailedError")
    assert not store.has(key) and list(store.finished_levels(key)) == ["c=1"]
    assert any("level c=1 written" in m for m in said)
    failed = store.failed_attempts(key)
    assert len(failed) == 1 and json.loads((failed[0] / "manifest.json").read_text())["status"] == "failed"
    assert _stub_processes() == []
    flag.unlink()  # the server lives this time
    said.clear()
    again = measure(engine, MODEL, [Config("a", Knobs())], LOAD, repetitions=1, store=store, say=said.append)
    assert again.errors.empty and store.has(key)
    assert any("resuming: levels c=1" in m for m in said) and not any("level c=1 written" in m for m in said)
    assert again.summary["point"].tolist() == ["c=1", "c=4"] and (again.summary["completed"] == 8).all()
    m = store.get(key).manifest
    assert m["levels"] == {"resumed": ["c=1"], "measured_now": ["c=4"]}
    assert not store.partial_dir(key).exists()
    tel = store.get(key).table("telemetry_server_procs")
    assert {"c=1", "c=4"} <= set(tel["phase"])  # the resumed level's telemetry came along
    assert _stub_processes() == []


def test_a_level_of_failed_requests_is_not_a_measurement(tmp_path, stub_engine):
    """Every other request answered HTTP 500: the level is over the failed-request limit, the point is stored as
    failed (with the failed level's records), never served from the store, and measured again on the next run."""
    engine = EngineSpec(**{**stub_engine, "env": {"STUB_FAIL_EVERY": "2"}})
    store = Store(tmp_path / "store")
    res = measure(engine, MODEL, [Config("a", Knobs())], LOAD, repetitions=1, store=store, say=lambda m: None)
    (err,) = res.errors.itertuples()
    assert err.error_type == "LevelFailedError" and "above the 10% limit" in err.summary
    assert "first: HTTP 500" in err.summary
    assert not store.has(err.key) and res.summary.empty
    (failed,) = store.failed_attempts(err.key)
    assert (failed / "failed_level_c1_requests.parquet").is_file()
    said: list[str] = []
    measure(engine, MODEL, [Config("a", Knobs())], LOAD, repetitions=1, store=store, say=said.append)
    assert not any("from store" in m for m in said) and any("launching" in m for m in said)


@pytest.mark.parametrize("statuses,want", [
    (["ok"] * 10, ""),
    (["ok"] * 9 + ["error"], ""),  # 10%: at the limit, still a measurement
    (["ok"] * 8 + ["error"] * 2, "2 of 10 measured requests failed, above the 10% limit"),
    (["error"] * 3, "all 3 measured requests failed"),
    ([], "no measured request was sent"),
])
def test_level_failure_rule(statuses, want):
    df = pd.DataFrame({"phase": ["measure"] * len(statuses), "status": statuses, "error": [None] * len(statuses)})
    assert level_failure(df) == want and FAILED_SHARE_LIMIT == 0.10


# --- bad input stops before anything launches ------------------------------------------------------------------

def test_a_missing_or_unreadable_model_path_is_refused_before_launch(tmp_path, stub_engine):
    from servescope.errors import SpecError
    from servescope.models import check_model_path

    with pytest.raises(SpecError, match="does not exist"):
        check_model_path(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(SpecError, match="no config.json"):
        check_model_path(str(tmp_path / "empty"))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{not json")
    with pytest.raises(SpecError, match="cannot be read"):
        check_model_path(str(tmp_path / "bad"))
    check_model_path("Qwen/Qwen3-30B-A3B")  # a hub id the user named: the engine fetches it
    with pytest.raises(SpecError, match="does not exist"):
        measure(EngineSpec(**stub_engine), ModelSpec(path=str(tmp_path / "nope")), [Config("a", Knobs())], LOAD,
                repetitions=1, store=Store(tmp_path / "s"), say=lambda m: None)
    assert _stub_processes() == []


def test_more_ranks_than_the_machine_has_are_refused_before_any_launch(tmp_path, stub_engine):
    """tp x dp above the cores of a CPU build (GPUs visible on a CUDA one): refused with the reason, for the second
    configuration too, before the first is launched."""
    import os

    from servescope.errors import KnobError

    cores = len(os.sched_getaffinity(0))
    said: list[str] = []
    with pytest.raises(KnobError, match=rf"configuration 'big': tp={cores + 1} x dp=1 needs {cores + 1} CPU cores; "
                                        rf"{cores} visible here \(nothing was launched\)"):
        measure(EngineSpec(**stub_engine), MODEL, [Config("ok", Knobs()), Config("big", Knobs(tp=cores + 1))], LOAD,
                repetitions=1, store=Store(tmp_path / "s"), say=said.append)
    assert not any("launching" in m for m in said) and _stub_processes() == []


def test_visible_gpus_follow_cuda_visible_devices():
    from servescope.engines.devices import visible_devices
    from servescope.telemetry.testing import FakeGpu, fake_nvml

    with fake_nvml([FakeGpu(), FakeGpu()]):
        assert visible_devices("cuda", {}) == (2, "GPUs")
        assert visible_devices("cuda", {"CUDA_VISIBLE_DEVICES": "1"}) == (1, "GPUs")
        assert visible_devices("cuda", {"CUDA_VISIBLE_DEVICES": ""}) == (0, "GPUs")


# --- the small verbs: one line and a non-zero exit for every bad input ------------------------------------------

def _bad_inputs(tmp_path):
    import sqlite3
    from pathlib import Path

    good = Path(__file__).parent / "fixtures" / "h200_profiles" / "launch_bound.sqlite"
    (tmp_path / "empty.sqlite").write_bytes(b"")
    (tmp_path / "trunc.sqlite").write_bytes(good.read_bytes()[:100_000])
    con = sqlite3.connect(tmp_path / "other.sqlite")
    con.execute("CREATE TABLE foo (a INTEGER)")
    con.commit()
    con.close()
    con = sqlite3.connect(tmp_path / "nokernels.sqlite")  # an nsys export whose capture saw no GPU work
    con.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
    con.execute("CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INTEGER)")
    con.commit()
    con.close()
    (tmp_path / "notrace.json").write_text('{"a": 1}')
    (tmp_path / "empty.json").write_text("")
    (tmp_path / "binary.json").write_bytes(bytes(range(256)) * 8)
    (tmp_path / "afile").write_text("x")
    return tmp_path


@pytest.mark.parametrize("args,msg", [
    ("kernels {d}/empty.sqlite", "is empty"),
    ("kernels {d}/trunc.sqlite", "not a readable SQLite database"),
    ("kernels {d}/other.sqlite", "is not an nsys export (no nsys tables; tables: foo)"),
    ("kernels {d}/nokernels.sqlite", "the capture recorded no GPU kernel"),
    ("kernels {d}/notrace.json", "not a PyTorch profiler trace: it has no traceEvents"),
    ("kernels {d}/empty.json", "is empty"),
    ("kernels {d}/binary.json", "not a readable PyTorch profiler trace"),
    ("kernels {d}/nothere.sqlite", "no trace file at"),
    ("import-bench {d}/empty.json", "is empty: not a benchmark result"),
    ("import-bench {d}/binary.json", "not a text file"),
    ("import-bench {d}/notrace.json", "entry 0 is not a benchmark result"),
    ("import-bench {d}/notrace.json --out {d}/afile/out", "is a file, not a folder"),
    ("audit vllm --wheel sglang==0.5.9", "is not a vllm wheel"),
    ("flags sglang --wheel vllm==0.32.0", "is not a sglang wheel"),
    ("flags vllm --wheel vllm", "wants dist==version"),
])
def test_small_verbs_refuse_bad_input_in_one_line(tmp_path, args, msg):
    import subprocess
    import sys

    d = _bad_inputs(tmp_path)
    out = subprocess.run([sys.executable, "-m", "servescope.cli", *args.format(d=d).split()], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("servescope: error:") and msg in lines[0], out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""


# --- interrupts: Ctrl-C and SIGTERM to `servescope run` ---------------------------------------------------------

def _run_and_signal(tmp_path, sig):
    """`servescope run` on a suite whose stub server stalls in its second level; once the first level is written,
    send sig to the run's process group (what Ctrl-C in a terminal does, or a scheduler's SIGTERM)."""
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[1]
    stall = tmp_path / "stall"
    stall.write_text("1")
    suite = {"name": "intr", "engine": {"name": "vllm"}, "model": {"path": "stub"},
             "notebooks": [{"id": "96_stub_stall", "path": str(root / "tests/fixtures/notebooks/96_stub_stall.ipynb"),
                            "parameters": {"tests_dir": str(root / "tests"), "stall_file": str(stall)}},
                           {"id": "96_never_reached", "path": str(root / "tests/fixtures/notebooks/96_stub_stall.ipynb"),
                            "parameters": {"tests_dir": str(root / "tests"), "stall_file": str(stall)}}]}
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(suite))
    proc = subprocess.Popen([sys.executable, "-m", "servescope.cli", "run", str(tmp_path / "suite.yaml"),
                             "--reports-dir", str(tmp_path / "reports"), "--store-dir", str(tmp_path / "store"),
                             "--run-id", "r"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if "level c=1 written" in line:  # the server answers nothing after c=1's requests: c=4 is in flight
            time.sleep(1.0)
            t0 = time.monotonic()
            os.killpg(proc.pid, sig)
            break
    rest, _ = proc.communicate(timeout=90)
    return proc.returncode, time.monotonic() - t0, "".join(lines) + rest


@pytest.mark.parametrize("sig,code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_an_interrupt_stops_the_run_keeps_finished_levels_and_writes_the_report(tmp_path, sig, code):
    import signal as _signal

    rc, took, out = _run_and_signal(tmp_path, getattr(_signal, sig))
    assert rc == code, out
    assert took < 30, out  # within seconds: the kernel is interrupted, not waited for
    index = (tmp_path / "reports" / "r" / "index.html").read_text()
    assert f"Interrupted by {sig}" in index and "Not run: 96_never_reached" in index
    store = Store(tmp_path / "store")
    parts = [p for p in (tmp_path / "store" / "_partial").iterdir()]
    assert len(parts) == 1 and list(store.finished_levels(parts[0].name)) == ["c=1"]
    assert not [p for p in (tmp_path / "store").iterdir() if p.name.startswith(".tmp")]  # no stray folder
    (failed,) = store.failed_attempts(parts[0].name)
    assert "KeyboardInterrupt" in json.loads((failed / "manifest.json").read_text())["error"]
    assert _stub_processes() == []
    # the rerun resumes after c=1, and the point completes
    import subprocess
    import sys

    (tmp_path / "stall").unlink()
    again = subprocess.run([sys.executable, "-m", "servescope.cli", "run", str(tmp_path / "suite.yaml"), "--only",
                            "96_stub_stall", "--reports-dir", str(tmp_path / "reports"), "--store-dir",
                            str(tmp_path / "store"), "--run-id", "r2"], capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "resuming: levels c=1" in again.stdout, again.stdout + again.stderr
    assert store.has(parts[0].name) and not parts[0].exists()


def test_a_dead_kernel_leaves_no_server_and_no_half_written_point(tmp_path):
    """The notebook's kernel is killed (SIGKILL) while a level is in flight: the servers' reaper takes the server
    tree down, the run reports the notebook as failed and goes on, the half-written folder is moved to _failed/
    as abandoned, the finished level is kept."""
    import os
    import signal as _signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[1]
    stall = tmp_path / "stall"
    stall.write_text("1")
    entry = {"path": str(root / "tests/fixtures/notebooks/96_stub_stall.ipynb"),
             "parameters": {"tests_dir": str(root / "tests"), "stall_file": str(stall)}}
    suite = {"name": "dead", "engine": {"name": "vllm"}, "model": {"path": "stub"},
             "notebooks": [{"id": "96_killed", **entry}]}
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(suite))
    proc = subprocess.Popen([sys.executable, "-m", "servescope.cli", "run", str(tmp_path / "suite.yaml"),
                             "--reports-dir", str(tmp_path / "reports"), "--store-dir", str(tmp_path / "store"),
                             "--run-id", "r"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if "level c=1 written" in line:
            time.sleep(1.0)
            kernels = [c for c in psutil.Process(proc.pid).children(recursive=True)
                       if any("ipykernel" in x for x in c.cmdline())]
            assert kernels
            for k in kernels:
                os.kill(k.pid, _signal.SIGKILL)
            break
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, out
    deadline = time.monotonic() + 30  # the reaper polls its parent; give it its grace
    while _stub_processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _stub_processes() == []
    store_root = tmp_path / "store"
    assert not [p for p in store_root.iterdir() if p.name.startswith(".tmp")]
    abandoned = [p for p in (store_root / "_failed").iterdir() if "-abandoned-" in p.name]
    assert len(abandoned) == 1 and "died" in json.loads((abandoned[0] / "manifest.json").read_text())["error"]
    key = abandoned[0].name.split("-abandoned-")[0]
    assert list(Store(store_root).finished_levels(key)) == ["c=1"]
    assert "96_killed" in (tmp_path / "reports" / "r" / "index.html").read_text()


# --- hangs -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("warmup", [0, 4])
def test_a_silent_server_is_declared_hung_with_its_log_and_the_finished_level_kept(tmp_path, stub_engine, warmup):
    """The stub answers nothing after c=1 (as a SIGSTOPped server would): within the hang limit, not the request
    timeout, the level (or its warm-up) is declared hung, with the server's last log lines; c=1 is kept."""
    import time

    stall = tmp_path / "stall"
    stall.write_text("1")
    n = 1 + warmup + 8  # readiness, c=1 (with its warm-up requests)
    engine = EngineSpec(**{**stub_engine, "env": {"STUB_STALL": f"{n}:{stall}"}})
    load = LOAD.model_copy(update={"hang_s": 2.0, "warmup_requests": warmup or 0})
    store = Store(tmp_path / "store")
    t0 = time.monotonic()
    res = measure(engine, MODEL, [Config("a", Knobs())], load, repetitions=1, store=store, say=lambda m: None)
    assert time.monotonic() - t0 < 20
    (err,) = res.errors.itertuples()
    where = "warm-up of c=4" if warmup else "c=4"
    assert err.error_type == "HungError" and err.summary.startswith(f"HungError: {where}: no token for ")
    assert "requests in flight (hang limit 2 s)" in err.summary
    assert "last lines of server.stderr.log" in err.error or "last lines of server.stdout.log" in err.error
    assert ("py-spy dump of" in err.error) or ("no stack dump: py-spy is not installed" in err.error)
    assert list(store.finished_levels(err.key)) == ["c=1"] and _stub_processes() == []


def test_warm_up_stalls_are_kept_in_the_point_record(tmp_path, stub_engine):
    store = Store(tmp_path / "store")
    res = measure(EngineSpec(**stub_engine), MODEL, [Config("a", Knobs())],
                  LOAD.model_copy(update={"warmup_requests": 2}), repetitions=1, store=store, say=lambda m: None)
    h = store.get(res.points["key"].iloc[0]).table("health")
    assert {"warmup_max_silence_s", "warmup_e2e_ms_max", "max_silence_s"} <= set(h.columns)
    assert (h["warmup_e2e_ms_max"] > 0).all()


def test_hang_limit_scales_with_the_engine_step():
    from servescope.load.health import HANG_S, HANG_WARMUP_S, hang_limit_s

    assert hang_limit_s("measure") == HANG_S == 30.0 and hang_limit_s("warmup") == HANG_WARMUP_S
    assert hang_limit_s("measure", warmup_itl_ms_p99=2000.0) == 100.0  # 50 steps of a 2 s step
    assert hang_limit_s("measure", 2000.0, override=5.0) == 5.0 and hang_limit_s("warmup", override=5.0) == 5.0


def test_a_sigstopped_server_is_hung_and_still_torn_down_quickly(tmp_path, stub_engine):
    """kill -STOP of the server mid-load (the issue's 60 s stop): declared hung at the limit, and teardown continues
    it (SIGCONT) so SIGTERM ends it without waiting out the kill grace."""
    import time

    engine = EngineSpec(**{**stub_engine, "env": {"STUB_STOP_AFTER": "9"}})
    load = LOAD.model_copy(update={"hang_s": 2.0})
    t0 = time.monotonic()
    res = measure(engine, MODEL, [Config("a", Knobs())], load, repetitions=1, store=Store(tmp_path / "s"),
                  say=lambda m: None)
    assert time.monotonic() - t0 < 12  # 2 s to call it hung; teardown without the 15 s SIGKILL grace
    (err,) = res.errors.itertuples()
    assert err.error_type == "HungError" and "c=4: no token for" in err.summary
    assert _stub_processes() == []


def test_disk_full_while_writing_a_point_keeps_finished_levels(tmp_path, stub_engine, monkeypatch):
    """ENOSPC while the point's tables are written: the point fails with the OS's reason, the server is gone, the
    levels written before are intact, and the rerun resumes."""
    import errno

    from servescope.store import PointWriter

    real = PointWriter.put_table

    def full(self, name, df):
        if name == "requests":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, name, df)

    monkeypatch.setattr(PointWriter, "put_table", full)
    store = Store(tmp_path / "s")
    res = measure(EngineSpec(**stub_engine), MODEL, [Config("a", Knobs())], LOAD, repetitions=1, store=store,
                  say=lambda m: None)
    (err,) = res.errors.itertuples()
    assert "No space left on device" in err.summary and not store.has(err.key)
    assert list(store.finished_levels(err.key)) == ["c=1", "c=4"] and _stub_processes() == []
    monkeypatch.setattr(PointWriter, "put_table", real)
    said: list[str] = []
    again = measure(EngineSpec(**stub_engine), MODEL, [Config("a", Knobs())], LOAD, repetitions=1, store=store,
                    say=said.append)
    assert again.errors.empty and any("resuming: levels c=1, c=4" in m for m in said)


def test_jupyterlab_interrupt_kernel_stops_the_level_and_tears_down(tmp_path):
    """What JupyterLab's "interrupt kernel" does (jupyter_client's interrupt_kernel on a running cell): the level in
    flight is cancelled at once, the cell ends in KeyboardInterrupt, the server tree is gone, c=1 is kept."""
    import queue
    import time
    from pathlib import Path

    from jupyter_client import KernelManager

    root = Path(__file__).resolve().parents[1]
    stall = tmp_path / "stall"
    stall.write_text("1")
    code = (f"import sys; sys.path.insert(0, {str(root / 'tests')!r})\n"
            "import stub_engine\n"
            "from servescope.experiment import Config, measure\n"
            "from servescope.spec import EngineSpec, Knobs, LoadSpec, ModelSpec\n"
            "from servescope.store import Store\n"
            f"measure(EngineSpec(name='stub', python=sys.executable, env={{'STUB_STALL': '9:{stall}'}}), "
            "ModelSpec(path='stub'), [Config('a', Knobs())], LoadSpec(concurrency=(1, 4), num_requests=8, "
            f"output_len=8, warmup_requests=0), repetitions=1, store=Store({str(tmp_path / 'store')!r}), "
            "say=lambda m: print(m, flush=True))\n")
    km = KernelManager(kernel_name="python3")
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        msg_id = kc.execute(code)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                m = kc.get_iopub_msg(timeout=1)
            except queue.Empty:
                continue
            if m["msg_type"] == "stream" and "level c=1 written" in m["content"]["text"]:
                break
        time.sleep(1.0)
        t0 = time.monotonic()
        km.interrupt_kernel()
        reply = kc.get_shell_msg(timeout=60)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = kc.get_shell_msg(timeout=60)
        took = time.monotonic() - t0
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
    assert took < 20
    assert _stub_processes() == []
    parts = list((tmp_path / "store" / "_partial").iterdir())
    assert len(parts) == 1 and list(Store(tmp_path / "store").finished_levels(parts[0].name)) == ["c=1"]
