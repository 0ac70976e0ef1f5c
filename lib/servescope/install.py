"""An installed engine as every layer sees it: which interpreter, version, build, and the environment it runs with
(found and created by launch; recorded in each point's manifest and read back by the store)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from .util import redact_mapping


@dataclass(frozen=True)
class EngineInstall:
    """An installed engine: which interpreter, which version, which build."""

    python: str
    version: str
    distribution: str
    platform: str  # "cuda", "cpu", "rocm", ... as far as the install tells
    source: str = ""  # where the engine's source is read from (a wheel, or the folder holding the package)
    # the interpreter's own environment (engine.env: PYTHONPATH of a site folder, ...): every process run under
    # python (the server, its --help, the probes) gets it
    env: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """Plain dict for manifests (the environment's secret-looking values hidden)."""
        out: dict[str, Any] = {"python": self.python, "version": self.version, "distribution": self.distribution,
                               "platform": self.platform}
        return out | ({"env": redact_mapping(dict(self.env))} if self.env else {})

    def environ(self) -> dict[str, str]:
        """The environment a process run under this interpreter gets: this one's, with the install's on top."""
        return interpreter_env(self.env)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EngineInstall:
        """Read back what a manifest recorded (as_dict; the environment there may be redacted)."""
        return cls(python=str(d.get("python") or ""), version=str(d.get("version") or ""),
                   distribution=str(d.get("distribution") or ""), platform=str(d.get("platform") or ""),
                   source=str(d.get("source") or ""), env={str(k): str(v) for k, v in (d.get("env") or {}).items()})


def interpreter_env(env: dict[str, str] | None) -> dict[str, str]:
    """os.environ with an engine's own variables on top."""
    return {**os.environ, **(env or {})}
