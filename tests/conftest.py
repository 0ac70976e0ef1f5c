"""Shared test fixtures: the loopback stub server, and a 'stub' engine adapter that launches it."""

from __future__ import annotations

import os
import sys
import uuid

import psutil
import pytest

from servescope.engines.base import EngineInstall
from stub_engine import STUB, StubAdapter, stub_command  # noqa: F401  (registers the 'stub' engine)

# every process a test starts (kernels, servers, their workers) inherits this mark: the real-engine tests tell the
# servers they started from any other vLLM on the machine by it
MARK = "SERVESCOPE_TEST_MARK"
os.environ[MARK] = uuid.uuid4().hex


def our_processes(*needles: str) -> list[psutil.Process]:
    """Live processes this test session started (they carry its mark) whose command line holds one of the needles:
    `make test` runs two sessions at once (pytest-xdist), and one must not count the other's servers as left over."""
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        if p.info["status"] == psutil.STATUS_ZOMBIE or not any(n in " ".join(p.info["cmdline"] or []) for n in needles):
            continue
        try:
            if p.environ().get(MARK) == os.environ[MARK]:
                out.append(p)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue  # another user's, or gone
    return out


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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The real-engine files first: `make test` hands whole files to two workers (--dist loadfile), and the longest
    started last would leave one worker idle while the other finishes it."""
    items.sort(key=lambda item: 0 if item.get_closest_marker("slow") else 1)
