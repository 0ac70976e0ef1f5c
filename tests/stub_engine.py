"""The 'stub' engine: an adapter that launches tests/stub_server.py (for tests, and for fixture notebooks that
papermill runs in a separate kernel, which import this module to register it)."""

from __future__ import annotations

import sys
from pathlib import Path

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
    """Launches the stub server; torch_compile=False makes it slower per token, so A/B tests see an effect.
    engine.env STUB_DIES=eager makes every eager launch's worker child die from SIGILL at the first request (the
    shape of vLLM CPU's eager bf16 crash on AMX machines); STUB_DIES=all does it to every launch."""

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
        dies = extra_env.get("STUB_DIES", "")
        if dies == "all" or dies == "eager" and knobs.torch_compile is False:
            flags += ["--child-sigill-at", "1"]
        cmd = stub_command(port, "--model", served_name, "--host", host, *flags)
        return LaunchPlan(command=cmd, env=dict(extra_env), ready=ReadyCheck(poll_interval_s=0.1), flags=flags)
