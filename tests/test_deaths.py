"""Naming the signal a server process died from: parser on real logs, and the lifecycle against the stub."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from conftest import stub_command
from servescope.deaths import deaths_in_log, explain, make_death, signal_name
from servescope.errors import ServerDiedError, ServerExitedError
from servescope.server import ManagedServer, ReadyCheck, free_port

FIXTURES = Path(__file__).parent / "fixtures"


def _real_vllm_log() -> str:
    d = FIXTURES / "vllm_cpu" / "worker_sigill"
    return (d / "server.stdout.log").read_text() + "\n" + (d / "server.stderr.log").read_text()


def test_real_vllm_worker_sigill_is_named_with_its_line_and_frame():
    (d,) = explain(0, _real_vllm_log())  # the API server itself exited 0
    assert d.signal == "SIGILL" and d.signum == 4 and d.process == "VllmWorker-0"
    assert "died unexpectedly (exit code: -4)" in d.evidence
    assert d.where == "zmq/sugar/poll.py:106 in poll"  # the crashing thread's innermost frame, not another thread's
    assert d.headline() == "VllmWorker-0 died from SIGILL (illegal instruction)"
    assert "instruction this CPU or VM refuses" in d.text()


@pytest.mark.parametrize("line,signal_,who", [
    ("(EngineCore pid=7) ERROR [utils.py:587] Process EngineCore_DP0 (PID: 123) died with exit code -9", "SIGKILL",
     "EngineCore_DP0"),
    ("RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore_DP0': -11}",
     "SIGSEGV", "EngineCore_DP0"),
    ("<SpawnProcess name='SpawnProcess-1' pid=99 parent=1 stopped exitcode=-SIGBUS>", "SIGBUS", "SpawnProcess-1"),
    ("Fatal Python error: Aborted", "SIGABRT", ""),
    ("Illegal instruction (core dumped)", "SIGILL", ""),
    ("bash: line 1:  4242 Killed                  python -m server", "SIGKILL", ""),
])
def test_death_line_forms(line, signal_, who):
    (d,) = deaths_in_log(f"INFO starting\n{line}\nINFO more\n")
    assert (d.signal, d.process) == (signal_, who)


@pytest.mark.parametrize("line", [
    "INFO 12-01 [async_llm.py:500] Aborted request cmpl-123.",
    "Killed 3 stale requests",
    "Worker proc VllmWorker-0 exited (exit code: 0)",
    "INFO: child exited with exit code 1",
    "(EngineCore pid=7) INFO [multiproc_executor.py:479] [shutdown] Executor: waiting for worker exit count=0",
])
def test_ordinary_lines_are_no_deaths(line):
    assert deaths_in_log(line) == []


def test_root_status_and_signal_names():
    assert signal_name(-4) == ("SIGILL", 4) and signal_name("-SIGKILL") == ("SIGKILL", 9) and signal_name(0) is None
    (d,) = explain(-11, "")
    assert d.signal == "SIGSEGV" and d.process == "server root process" and "-11" in d.evidence
    assert make_death(1) is not None and make_death("x") is None


def test_sigkill_carries_the_oom_record_or_why_it_cannot_be_read():
    (d,) = explain(-9, "")
    assert d.oom  # the kernel's OOM line, the cgroup counter, or the reason neither could be read here
    assert "kernel OOM record: " in d.text()


FAST = ReadyCheck(poll_interval_s=0.1)


def _server(tmp_path: Path, *args: str) -> ManagedServer:
    port = free_port()
    return ManagedServer(command=stub_command(port, *args), port=port, log_dir=tmp_path / "srv", model="stub",
                         startup_timeout_s=20, ready=FAST)


def test_child_dying_from_sigill_at_the_first_request_is_named(tmp_path):
    """The stub's worker child kills itself with SIGILL at the readiness check's request; the stub logs nothing
    about it and exits 0. The error names the signal from the child's own faulthandler line."""
    srv = _server(tmp_path, "--child-sigill-at", "1")
    with pytest.raises(ServerExitedError) as ei:
        srv.start()
    e = ei.value
    assert e.signal == "SIGILL"
    assert "server exited with code 0 before it was ready" in str(e)
    assert "died from SIGILL (illegal instruction)" in str(e).splitlines()[0]
    assert "log: Fatal Python error: Illegal instruction" in str(e)
    assert srv.proc is None  # torn down


def test_child_dying_while_serving_is_a_dead_server(tmp_path):
    import urllib.request

    srv = _server(tmp_path, "--child-sigill-at", "2")
    with srv:
        srv.check_alive()  # fine after the readiness check's request
        req = urllib.request.Request(f"{srv.base_url}/v1/completions", data=b'{"prompt": "x", "max_tokens": 2}',
                                     headers={"Content-Type": "application/json"})
        with pytest.raises(OSError):
            urllib.request.urlopen(req, timeout=10)
        deadline = time.monotonic() + 10
        while srv.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(ServerDiedError) as ei:
            srv.check_alive()
    assert ei.value.signal == "SIGILL" and "while serving" in str(ei.value)


def test_root_killed_while_serving_names_sigkill(tmp_path):
    srv = _server(tmp_path)
    with srv:
        os.kill(srv.proc.pid, signal.SIGKILL)
        srv.proc.wait(timeout=10)
        with pytest.raises(ServerDiedError) as ei:
            srv.check_alive()
    d = ei.value.deaths[0]
    assert d.signal == "SIGKILL" and d.process == "server root process" and "out-of-memory" in d.meaning and d.oom


def test_real_vllm_sigill_is_the_first_failure_and_the_executor_error_its_consequence():
    """vLLM CPU on an AMX Xeon (tests/fixtures/vllm_cpu/worker_sigill): the worker's SIGILL came first; the engine
    core's 'Executor failed.' and the API server's EngineDeadError follow from it, and the engine tore its own tree
    down ('died unexpectedly ... shutting down executor')."""
    import re

    from servescope.deaths import cause_of, exceptions_in_log
    from servescope.engines import get_engine

    text = _real_vllm_log()
    ad = get_engine("vllm")
    cause = cause_of(text, explain(0, text), ad.package, [re.compile(x) for x in ad.teardown_patterns])
    assert cause.first_death.process == "VllmWorker-0" and cause.first_death.signal == "SIGILL"
    assert cause.exception.type == "RuntimeError" and cause.exception.process == "EngineCore"
    assert cause.exception.frame == "vllm/v1/engine/core.py:1702 in _handle_client_request"
    assert cause.teardown == "engine" and "shutting down executor" in cause.teardown_evidence
    assert cause.headline().startswith("VllmWorker-0 died from SIGILL (illegal instruction); the engine then killed")
    # a chained traceback counts once, as what propagated; the API server's follow-on error names its process
    excs = exceptions_in_log(text, "vllm")
    assert [e.type for e in excs][:2] == ["RuntimeError", "EngineDeadError"] and excs[1].process == "APIServer"


def test_a_kill_from_outside_is_told_apart_from_the_engines_teardown():
    from servescope.deaths import cause_of

    root = make_death(-9, "server root process", "exit status -9")
    cause = cause_of("INFO serving\nINFO still serving\n", [root])
    assert cause.teardown == "outside" and "no engine teardown line" in cause.teardown_evidence
    assert cause_of("INFO serving\n", [], killed_by_us="") is None


@pytest.mark.parametrize("innermost,said", [
    ("torch/_dynamo/symbolic_convert.py:2177 in jump", "torch/_dynamo/symbolic_convert.py:2177 in jump, inside "
     "torch.compile compiling the call at sglang/srt/layers/rotary.py:83 in forward"),
    ("triton/runtime/jit.py:40 in run", "triton/runtime/jit.py:40 in run, called from sglang/srt/layers/rotary.py:83 in "
     "forward"),
    ("sglang/srt/layers/rotary.py:83 in forward", "sglang/srt/layers/rotary.py:83 in forward"),
    ("", "sglang/srt/layers/rotary.py:83 in forward"),
])
def test_where_an_exception_was_raised_names_the_library_beneath_the_engine(innermost, said):
    """An assert inside torch.compile's tracer is the compiler's fault on that call of the engine, not the engine's
    line: both are named, the raiser first."""
    from servescope.deaths import EngineException

    e = EngineException("AssertionError", "", "sglang/srt/layers/rotary.py:83 in forward", innermost, "Scheduler")
    assert e.where() == said and e.headline() == f"the Scheduler raised AssertionError (no message) ({said})"
