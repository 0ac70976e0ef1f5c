"""Server lifecycle against the loopback stub: exits at once, never ready, ready late, killed mid-way, interrupted."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from conftest import end_launcher, stub_command
from servescope.errors import PortInUseError, ServerExitedError, ServerStartTimeout
from servescope.server import ManagedServer, ReadyCheck, free_port, port_is_free, redact_command

FAST = ReadyCheck(poll_interval_s=0.1)


def _server(tmp_path: Path, *args: str, timeout: float = 20, **kw) -> ManagedServer:
    port = free_port()
    return ManagedServer(command=stub_command(port, *args), port=port, log_dir=tmp_path / "srv", model="stub",
                         startup_timeout_s=timeout, ready=FAST, **kw)


def _gone(pids: list[int]) -> bool:
    for pid in pids:
        try:
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            pass
    return True


def _pids(pid_file: Path) -> list[int]:
    for _ in range(100):
        if pid_file.exists() and pid_file.read_text().strip():
            return [int(x) for x in pid_file.read_text().split()]
        time.sleep(0.05)
    raise AssertionError("stub wrote no pid file")


def test_ready_then_teardown_kills_whole_tree(tmp_path):
    pid_file = tmp_path / "pids"
    srv = _server(tmp_path, "--children", "2", "--pid-file", str(pid_file))
    with srv:
        pids = _pids(pid_file)
        assert len(pids) == 3 and all(psutil.pid_exists(p) for p in pids)
        assert srv.timings.first_token_s is not None
        assert (tmp_path / "srv" / "command.txt").read_text().startswith(sys.executable)
    assert _gone(pids)
    assert port_is_free("127.0.0.1", srv.port)


def test_exits_at_once_raises_with_log_tail(tmp_path):
    srv = _server(tmp_path, "--mode", "exit")
    with pytest.raises(ServerExitedError) as ei:
        srv.start()
    assert "code 3" in str(ei.value)
    assert "fatal configuration error" in ei.value.log_tail


def test_never_ready_times_out_and_is_killed(tmp_path):
    pid_file = tmp_path / "pids"
    srv = _server(tmp_path, "--mode", "never", "--children", "1", "--pid-file", str(pid_file), timeout=2)
    t0 = time.monotonic()
    with pytest.raises(ServerStartTimeout) as ei:
        srv.start()
    assert 2 <= time.monotonic() - t0 < 15
    assert "health" in str(ei.value)
    assert _gone(_pids(pid_file))


def test_ready_late_waits(tmp_path):
    with _server(tmp_path, "--ready-after", "1.5") as srv:
        assert srv.timings.health_s is not None and srv.timings.health_s >= 1.5


def test_killed_mid_way_is_cleaned_up(tmp_path):
    pid_file = tmp_path / "pids"
    srv = _server(tmp_path, "--children", "2", "--pid-file", str(pid_file))
    with srv:
        pids = _pids(pid_file)
        os.kill(pids[0], signal.SIGKILL)  # the server dies under us; its children are orphaned in its group
        time.sleep(0.3)
    assert _gone(pids)


def test_keyboard_interrupt_tears_down(tmp_path):
    pid_file = tmp_path / "pids"
    srv = _server(tmp_path, "--children", "1", "--pid-file", str(pid_file))
    with pytest.raises(KeyboardInterrupt):
        with srv:
            pids = _pids(pid_file)
            raise KeyboardInterrupt
    assert _gone(pids)
    assert port_is_free("127.0.0.1", srv.port)


def test_sigterm_ignored_escalates_to_kill(tmp_path):
    pid_file = tmp_path / "pids"
    srv = _server(tmp_path, "--ignore-term", "--children", "1", "--pid-file", str(pid_file), term_grace_s=1.0)
    with srv:
        pids = _pids(pid_file)
    assert _gone(pids)


def test_port_in_use_refused_before_launch(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        srv = ManagedServer(command=stub_command(port), port=port, log_dir=tmp_path, model="stub", ready=FAST)
        with pytest.raises(PortInUseError):
            srv.start()
        assert srv.proc is None


@pytest.mark.parametrize("how", ["kill", "pkill"])
def test_reaper_kills_server_when_launcher_dies(tmp_path, how):
    """A notebook kernel killed outright cannot run `finally`; the watchdog must still end the server. pkill: the
    launcher and its watchdog TERMed together (what `pkill -f servescope` does): the watchdog ends the server on the
    way out."""
    pid_file = tmp_path / "pids"
    port = free_port()
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from conftest import stub_command
        from servescope.server import ManagedServer, ReadyCheck
        srv = ManagedServer(command=stub_command({port}, "--children", "1", "--pid-file", {str(pid_file)!r}),
                            port={port}, log_dir={str(tmp_path / 'srv')!r}, model="stub", ready=ReadyCheck(poll_interval_s=0.1),
                            socket_dir_env=("STUB_SOCKET_DIR",))
        srv.start()
        print("ready", srv.socket_dir, flush=True)
        time.sleep(600)
    """)
    launcher = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    pids: list[int] = []
    try:
        said, sockets = launcher.stdout.readline().split()
        assert said == "ready" and Path(sockets).is_dir()
        pids = _pids(pid_file)
        end_launcher(launcher, how)
        deadline = time.monotonic() + 20
        while not (_gone(pids) and not Path(sockets).exists()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _gone(pids)
        assert not Path(sockets).exists()  # the launch's socket folder went with its tree
    finally:
        launcher.kill()
        for pid in pids:  # what a failed watchdog left: not for the next test to trip over
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_launch_gets_a_socket_folder_of_its_own_removed_with_its_tree(tmp_path):
    """vLLM puts its ZMQ IPC sockets in the temp folder and never unlinks them when its tree is killed: a launch names
    a folder of its own in the adapter's variables (the server sees it), and teardown removes it; a variable the
    suite's env sets itself is left as set, and no folder is made for it."""
    pid_file = tmp_path / "pids"
    srv = _server(tmp_path, "--children", "1", "--pid-file", str(pid_file), socket_dir_env=("STUB_SOCKET_DIR",))
    with srv:
        folder = srv.socket_dir
        assert folder is not None and folder.is_dir()
        seen = {psutil.Process(p).environ().get("STUB_SOCKET_DIR") for p in _pids(pid_file)}
        assert seen == {str(folder)}
    assert not folder.exists() and srv.socket_dir is None
    mine = tmp_path / "mine"
    srv = _server(tmp_path, socket_dir_env=("STUB_SOCKET_DIR",), env={"STUB_SOCKET_DIR": str(mine)})
    with srv:
        assert srv.socket_dir is None


def test_redact_command_hides_secrets():
    shown = redact_command(["srv", "--api-key", "sk-123", "--hf-token=abc", "--port", "1"])
    assert "sk-123" not in shown and "abc" not in shown
    assert "--port 1" in shown


def test_free_ports_stay_out_of_the_ephemeral_range_and_are_never_handed_out_twice():
    from servescope.server import _ephemeral_range

    lo, _ = _ephemeral_range()
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50 and all(p < lo for p in ports)  # client sockets cannot take them meanwhile


def test_launch_retries_on_a_fresh_port_when_the_first_is_taken(tmp_path, monkeypatch, stub_engine):
    from servescope import launch
    from servescope.launch import prepare, serve
    from servescope.spec import EngineSpec, Knobs, ModelSpec

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    busy = taken.getsockname()[1]
    ports = iter([busy])
    monkeypatch.setattr(launch, "free_port", lambda host: next(ports, None) or free_port(host))
    prep = prepare(EngineSpec(**stub_engine), ModelSpec(path="stub"))
    with serve(prep, Knobs(), tmp_path) as target:
        assert not target.base_url.endswith(f":{busy}")
    taken.close()


def test_a_slow_preparation_says_where_its_time_went(monkeypatch, stub_engine):
    """A fresh GPU machine spent 2 min before its first notebook with nothing in the log: prepare names each step's
    seconds once they add up to SLOW_PREPARE_S, and says nothing on a prepared machine."""
    from servescope import launch
    from servescope.launch import prepare
    from servescope.spec import EngineSpec, ModelSpec

    said: list[str] = []
    prepare(EngineSpec(**stub_engine), ModelSpec(path="stub"), say=said.append)
    assert not said
    monkeypatch.setattr(launch, "SLOW_PREPARE_S", 0.0)
    prepare(EngineSpec(**stub_engine), ModelSpec(path="stub"), say=said.append)
    (line,) = said
    assert line.startswith("prepared before the first launch in finding the engine ")
    assert ", reading its flags " in line and ", the model " in line and line.endswith(" s")
