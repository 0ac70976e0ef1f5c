"""The engine adapter interface: intent-level knobs in, this engine version's command out."""

from __future__ import annotations

import json
import re
import urllib.request
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..errors import ProfilingUnavailable
from ..server import ReadyCheck
from ..spec import Knobs
from .envs import EngineEnvSpec


@dataclass(frozen=True)
class EngineInstall:
    """An installed engine: which interpreter, which version, which build."""

    python: str
    version: str
    distribution: str
    platform: str  # "cuda", "cpu", "rocm", ... as far as the install tells

    def as_dict(self) -> dict[str, str]:
        """Plain dict for manifests."""
        return {"python": self.python, "version": self.version, "distribution": self.distribution,
                "platform": self.platform}


@dataclass(frozen=True)
class LaunchPlan:
    """Everything needed to start one server: the command, its environment, and what 'ready' means."""

    command: list[str]
    env: dict[str, str]
    ready: ReadyCheck
    flags: list[str] = field(default_factory=list)  # the knob-derived part of the command, for reports


class EngineAdapter(ABC):
    """One engine (family); subclasses translate Knobs for the version they find installed."""

    name: ClassVar[str]
    launches: ClassVar[bool] = True

    @abstractmethod
    def managed_env(self, version: str | None) -> EngineEnvSpec | None:
        """The environment servescope installs itself for this engine, if any."""

    @abstractmethod
    def probe(self, python: str) -> EngineInstall:
        """What is installed under that interpreter: version, distribution, platform."""

    @abstractmethod
    def knob_flags(self, knobs: Knobs, install: EngineInstall) -> list[str]:
        """Flags expressing the knobs for this version; raises KnobError for what it cannot express."""

    @abstractmethod
    def plan(self, *, install: EngineInstall, model_path: str, served_name: str, host: str, port: int,
             knobs: Knobs, extra_env: dict[str, str]) -> LaunchPlan:
        """The full launch plan for one configuration."""

    def resolved_config(self, base_url: str, timeout_s: float = 10.0) -> dict[str, Any] | None:
        """The configuration the running server actually uses, or None where it does not say."""
        return None

    def torch_profiler_launch(self, install: EngineInstall, out_dir: str) -> tuple[list[str], dict[str, str]]:
        """Flags and environment that let the running server's PyTorch profiler be started over HTTP."""
        raise ProfilingUnavailable(f"engine {self.name!r} has no PyTorch profiler hook in servescope")

    def cuda_profiler_launch(self, install: EngineInstall) -> tuple[list[str], dict[str, str]] | None:
        """Flags/env making /start_profile call cudaProfilerStart (for nsys --capture-range=cudaProfilerApi);
        None when the engine has no such hook (then nsys records a delay/duration window)."""
        return None

    def start_profile(self, base_url: str, out_dir: str | None = None, timeout_s: float = 60.0) -> None:
        """Start the server's profiler."""
        raise ProfilingUnavailable(f"engine {self.name!r} has no profiler endpoint in servescope")

    def stop_profile(self, base_url: str, timeout_s: float = 600.0) -> None:
        """Stop the server's profiler (it writes its trace then)."""
        raise ProfilingUnavailable(f"engine {self.name!r} has no profiler endpoint in servescope")

    def knob_capabilities(self, install: EngineInstall) -> dict[str, str]:
        """For each knob, how this version expresses it (or why it cannot)."""
        return {}


def post(url: str, body: dict[str, Any] | None = None, timeout_s: float = 60.0) -> int:
    """POST JSON (or nothing); the HTTP status, raising on transport errors and 4xx/5xx."""
    data = json.dumps(body).encode() if body is not None else b""
    req = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return resp.status


def get_json(url: str, timeout_s: float = 10.0) -> Any:
    """GET a URL and decode JSON (raises on HTTP errors)."""
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return json.loads(resp.read())


def version_tuple(version: str) -> tuple[int, ...]:
    """'0.5.23rc1' -> (0, 5, 23): numeric release part only, for comparisons."""
    m = re.match(r"(\d+(?:\.\d+)*)", version)
    return tuple(int(x) for x in m.group(1).split(".")) if m else ()
