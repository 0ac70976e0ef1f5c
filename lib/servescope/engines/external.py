"""An already running OpenAI-compatible server: URL only, nothing is launched."""

from __future__ import annotations

from ..errors import SpecError
from ..spec import Knobs
from . import register
from .base import EngineAdapter, EngineInstall, LaunchPlan
from .envs import EngineEnvSpec


@register
class ExternalAdapter(EngineAdapter):
    """A server someone else runs; knobs cannot be changed from here."""

    name = "external"
    launches = False

    def managed_env(self, version: str | None) -> EngineEnvSpec | None:
        """Nothing to install."""
        return None

    def probe(self, python: str) -> EngineInstall:
        """An external server is not installed here."""
        return EngineInstall(python="", version="unknown", distribution="external", platform="unknown")

    def knob_flags(self, knobs: Knobs, install: EngineInstall) -> list[str]:
        """Only engine defaults can be measured on a server we do not launch."""
        if knobs != Knobs():
            raise SpecError(f"an external server runs as it was started; knobs ({knobs.label()}) cannot be applied")
        return []

    def plan(self, **_: object) -> LaunchPlan:
        """Never called: external servers are not launched."""
        raise SpecError("an external server is not launched by servescope")
