"""Shared test fixtures: the loopback stub server, and a 'stub' engine adapter that launches it."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time
import uuid

import psutil
import pytest

from servescope.engines.base import EngineInstall
from stub_engine import STUB, StubAdapter, stub_command  # noqa: F401  (registers the 'stub' engine)

# every process a test starts (kernels, servers, their workers) inherits this mark: the real-engine tests tell the
# servers they started from any other vLLM on the machine by it
MARK = "SERVESCOPE_TEST_MARK"
os.environ[MARK] = uuid.uuid4().hex


def _marked(wanted) -> list[psutil.Process]:
    """Live processes that carry this session's mark (every process it starts inherits it) and that wanted(p)."""
    out = []
    for p in psutil.process_iter(["name", "cmdline", "status"]):
        if p.info["status"] == psutil.STATUS_ZOMBIE or not wanted(p):
            continue
        try:
            if p.environ().get(MARK) == os.environ[MARK]:
                out.append(p)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue  # another user's, or gone
    return out


def our_processes(*needles: str) -> list[psutil.Process]:
    """Live processes this test session started (they carry its mark) whose command line holds one of the needles:
    `make test` runs two sessions at once (pytest-xdist), and one must not count the other's servers as left over."""
    return _marked(lambda p: any(n in " ".join(p.info["cmdline"] or []) for n in needles))


def watchdog_of(pid: int) -> psutil.Process:
    """pid's one _reaper.py child, once it has its SIGTERM handler (a TERM before that kills it the default way)."""
    (dog,) = [c for c in psutil.Process(pid).children() if any(a.endswith("_reaper.py") for a in c.cmdline())]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        caught = next(int(line.split()[1], 16) for line in open(f"/proc/{dog.pid}/status") if line.startswith("SigCgt"))
        if caught & (1 << (signal.SIGTERM - 1)):
            return dog
        time.sleep(0.05)
    raise AssertionError(f"watchdog {dog.pid} never caught SIGTERM")


def end_launcher(launcher: subprocess.Popen, how: str) -> None:
    """End a process that launched something under a watchdog: 'kill' SIGKILLs it alone (a kernel killed outright),
    'pkill' TERMs it and its watchdog together (what `pkill -f servescope` does)."""
    if how == "pkill":
        dog = watchdog_of(launcher.pid)
        launcher.terminate()
        dog.terminate()
    else:
        launcher.kill()
    launcher.wait()


def vllm_processes() -> list[str]:
    """vLLM server processes this test session started that are still running. Zombies do not count: they run
    nothing and hold no port, and where PID 1 reaps orphans lazily (this VM's init does) an engine's worker can linger
    as one. Another vLLM on the machine (a user's, another checkout's test run) is not this suite's: a CI run failed
    on one."""
    return [f"{p.pid} {p.info['name']} {p.info['status']} {' '.join(p.info['cmdline'] or [])[:100]}"
            for p in our_vllm() if p.info["status"] != psutil.STATUS_ZOMBIE]


def our_vllm() -> list[psutil.Process]:
    """vLLM processes (its API server, engine core and workers) that carry this session's mark in their
    environment: every process the suite starts inherits it (tests/conftest.py, MARK)."""
    return _marked(lambda p: (p.info["name"] or "").startswith("VLLM")
                   or "vllm.entrypoints" in " ".join(p.info["cmdline"] or []))


@pytest.fixture
def stub_engine() -> dict:
    """EngineSpec fields for the stub engine."""
    return {"name": "stub", "python": sys.executable, "startup_timeout_s": 30}


# the published engine versions the adapters and the audit are tested against (wheels fetched once per user into
# the servescope cache with `pip download --no-deps`, read as zips, never installed or committed)
ENGINE_WHEELS = {"sglang-0.4.10": ("sglang", "0.4.10"), "sglang-0.5.9": ("sglang", "0.5.9"),
                 "sglang-0.5.14": ("sglang", "0.5.14"), "sglang-0.5.17": ("sglang", "0.5.17"),
                 "sglang-0.5.23": ("sglang", "0.5.23"),
                 "vllm-0.32.0": ("vllm", "0.32.0"), "transformers-5.17.0": ("transformers", "5.17.0"),
                 "transformers-5.23.0": ("transformers", "5.23.0")}
# releases read from their source archive (vLLM's sdist is 47 MB against a 336 MB wheel), unpacked once per user
ENGINE_SDISTS = {"vllm-0.33.0": ("vllm", "0.33.0"), "vllm-0.26.0": ("vllm", "0.26.0")}


@pytest.fixture(scope="session")
def wheel_install():
    """EngineInstall reading its source from a published wheel: wheel_install('sglang-0.5.9')."""
    from servescope.engines.source import SourceTree, fetch_sdist, fetch_wheel

    def make(key: str) -> EngineInstall:
        if key in ENGINE_SDISTS:
            dist, version = ENGINE_SDISTS[key]
            tree = SourceTree.from_sdist(fetch_sdist(dist, version), dist)
            return EngineInstall(python=sys.executable, version=version, distribution=dist, platform="cuda",
                                 source=tree.location)
        dist, version = ENGINE_WHEELS[key]
        return EngineInstall(python=sys.executable, version=version, distribution=dist, platform="cuda",
                             source=str(fetch_wheel(dist, version)))
    return make


# `make test` hands whole files to three workers (--dist loadfile --no-loadscope-reorder), which take them in the
# order below: the files with most tests first (xdist's own order), except the one-test end-to-end file, dealt fourth
# so that it starts behind the first file to finish instead of running alone at the end (docs/testing.md)
END_TO_END = "test_embedded_report.py"
END_TO_END_AT = 3


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files by their number of tests, most first, with the end-to-end file fourth; a file's tests keep their order."""
    counts = collections.Counter(item.path for item in items)
    files = sorted(counts, key=lambda path: -counts[path])  # stable: ties keep the collection's order
    e2e = [path for path in files if path.name == END_TO_END]
    files = [path for path in files if path.name != END_TO_END]
    files[END_TO_END_AT:END_TO_END_AT] = e2e
    rank = {path: i for i, path in enumerate(files)}
    items.sort(key=lambda item: rank[item.path])
