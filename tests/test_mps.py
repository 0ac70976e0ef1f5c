"""The suite's MPS control daemon on a stub control program (tests/mps_stub.py): its lifecycle, a fault mid-run and a
killed launcher leave no daemon and no directory behind; what refuses MPS is said before anything starts."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import end_launcher
from servescope import mps
from servescope.mps import GpuFacts, MpsDaemon, MpsError

STUB = Path(__file__).with_name("mps_stub.py")


@pytest.fixture
def stub_path(tmp_path, monkeypatch) -> Path:
    """A PATH whose nvidia-cuda-mps-control is the stub."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / mps.CONTROL
    shutil.copy(STUB, exe)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return bin_dir


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie of ours is gone for every purpose here
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _gone(pid: int, root: Path, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not _alive(pid) and not root.exists():
            return True
        time.sleep(0.1)
    return False


def test_what_refuses_mps_is_said_in_one_line(stub_path, monkeypatch):
    ok = GpuFacts(0, "Default", False, (9, 0))
    assert mps.refusal([ok]) == ""
    assert "no NVIDIA GPU" in mps.refusal([])
    assert "MIG enabled" in mps.refusal([GpuFacts(0, "Default", True, (9, 0))])
    assert "Prohibited" in mps.refusal([GpuFacts(1, "Prohibited", False, (9, 0))])
    assert "Volta" in mps.refusal([GpuFacts(0, "Default", False, (6, 1))])
    monkeypatch.setenv("PATH", "/nonexistent")
    assert f"no {mps.CONTROL} on PATH" in mps.refusal([ok])


def test_the_daemon_lives_in_private_directories_and_leaves_nothing(stub_path):
    with MpsDaemon(active_thread_pct=50) as d:
        root, pid = d.root, d.pid
        assert root is not None and pid is not None and _alive(pid)
        assert stat.S_IMODE(d.pipe_dir.stat().st_mode) == 0o700 and d.log_dir.is_dir()
        env = d.client_env()
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(d.pipe_dir) and env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
        # the replicas are its clients: the daemon's server lists them
        (d.pipe_dir / "servers").write_text("4242\n")
        (d.pipe_dir / "clients-4242").write_text(f"{os.getpid()}\n")
        assert d.servers() == [4242] and d.clients() == [os.getpid()]
        assert d.check_clients({0: [os.getpid(), 1], 1: [999999]}) == {0: True, 1: False}
        assert mps.existing_daemon({"CUDA_MPS_PIPE_DIRECTORY": str(d.pipe_dir)}) == str(d.pipe_dir)
    assert _gone(pid, root) and d.root is None
    assert mps.existing_daemon({"CUDA_MPS_PIPE_DIRECTORY": str(root / "pipe")}) == ""
    d.stop()  # twice is harmless


def test_a_fault_mid_run_stops_the_daemon_and_removes_its_directories(stub_path):
    seen = {}
    with pytest.raises(RuntimeError, match="replica died"):
        with MpsDaemon() as d:
            seen["root"], seen["pid"] = d.root, d.pid
            raise RuntimeError("replica died")
    assert _gone(seen["pid"], seen["root"])


def test_a_daemon_that_does_not_start_is_refused_with_nothing_left(stub_path, monkeypatch):
    monkeypatch.setenv("STUB_MPS_FAIL_START", "1")
    before = set(Path(os.environ.get("TMPDIR", "/tmp")).glob("servescope-mps-*"))
    with pytest.raises(MpsError, match="MPS is not supported"):
        MpsDaemon().start()
    assert set(Path(os.environ.get("TMPDIR", "/tmp")).glob("servescope-mps-*")) == before
    with pytest.raises(MpsError, match="1..100"):
        MpsDaemon(active_thread_pct=0).start()


@pytest.mark.parametrize("how", ["kill", "pkill"])
def test_a_killed_launcher_leaves_no_daemon(stub_path, tmp_path, how):
    """The launching process (a notebook kernel) killed outright: the watchdog ends the daemon and its folder; pkill:
    the launcher and its watchdog TERMed together, as `pkill -f servescope` does."""
    code = ("import sys, time; from servescope.mps import MpsDaemon; d = MpsDaemon().start(); "
            "print(d.root, d.pid, flush=True); time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, PYTHONPATH=str(Path(mps.__file__).parents[1])))
    assert child.stdout is not None
    root, pid = child.stdout.readline().split()
    assert _alive(int(pid)) and Path(root).is_dir()
    end_launcher(child, how)
    assert _gone(int(pid), Path(root), within_s=15)


def test_the_daemon_on_the_real_driver_of_the_h200():
    """Recorded on the H200 (tests/fixtures/h200_mps): the same class against the real nvidia-cuda-mps-control: its
    server took both CUDA processes as clients, and nothing of the daemon was left after it stopped."""
    import json

    rep = json.loads((Path(__file__).parent / "fixtures" / "h200_mps" / "mps.json").read_text())
    assert rep["refusal"] == "" and rep["existing_before"] == "" and rep["gpus"][0]["compute_capability"] == [9, 0]
    assert rep["clients_ready"] == ["ready", "ready"] and len(rep["servers"]) == 1 and len(rep["clients"]) == 2
    assert rep["check"] == {"0": True, "1": True} and "is ACTIVE" in rep["server_log"]
    assert not rep["after_root_exists"] and not rep["after_daemon_alive"] and rep["after_mps_processes"] == []
    assert rep["after_servers_alive"] == [] and rep["existing_after"] == ""
