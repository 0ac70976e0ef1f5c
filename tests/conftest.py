"""Shared test fixtures: the loopback stub server, and a 'stub' engine adapter that launches it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from servescope.engines import register
from servescope.engines.base import EngineAdapter, EngineInstall, LaunchPlan
from servescope.server import ReadyCheck
from servescope.spec import Knobs

STUB = Path(__file__).with_name("stub_server.py")


def stub_command(port: int, *args: str) -> list[str]:
    """Command line that runs the stub server on port."""
    return [sys.executable, str(STUB), "--port", str(port), *args]


@register
class StubAdapter(EngineAdapter):
    """Launches the stub server; torch_compile=False makes it slower per token, so A/B tests see an effect."""

    name = "stub"

    def managed_env(self, version):
        return None

    def probe(self, python):
        return EngineInstall(python=python, version="0.0-stub", distribution="stub", platform="cpu")

    def knob_flags(self, knobs: Knobs, install):
        flags = ["--itl-ms", "4" if knobs.torch_compile is False else "1"]
        return flags + list(knobs.extra_args)

    def plan(self, *, install, model_path, served_name, host, port, knobs, extra_env):
        flags = self.knob_flags(knobs, install)
        cmd = stub_command(port, "--model", served_name, "--host", host, *flags)
        return LaunchPlan(command=cmd, env=dict(extra_env), ready=ReadyCheck(poll_interval_s=0.1), flags=flags)


@pytest.fixture
def stub_engine() -> dict:
    """EngineSpec fields for the stub engine."""
    return {"name": "stub", "python": sys.executable, "startup_timeout_s": 30}


# the published engine versions the adapters and the audit are tested against (wheels fetched once per user into
# the servescope cache with `pip download --no-deps`, read as zips, never installed or committed)
ENGINE_WHEELS = {"sglang-0.4.10": ("sglang", "0.4.10"), "sglang-0.5.9": ("sglang", "0.5.9"),
                 "sglang-0.5.23": ("sglang", "0.5.23"), "vllm-0.32.0": ("vllm", "0.32.0"),
                 "transformers-5.17.0": ("transformers", "5.17.0")}


@pytest.fixture(scope="session")
def wheel_install():
    """EngineInstall reading its source from a published wheel: wheel_install('sglang-0.5.9')."""
    from servescope.engines.source import fetch_wheel

    def make(key: str) -> EngineInstall:
        dist, version = ENGINE_WHEELS[key]
        return EngineInstall(python=sys.executable, version=version, distribution=dist, platform="cuda",
                             source=str(fetch_wheel(dist, version)))
    return make
