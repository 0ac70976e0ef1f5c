"""Registry of engine adapters by name: the built-in ones are registered at the end of this module, in one place;
register() adds others (a test's stub engine, a user's own)."""

from __future__ import annotations

from ..errors import UnknownEngineError
from .base import EngineAdapter, LaunchPlan

_REGISTRY: dict[str, type[EngineAdapter]] = {}


def register(cls: type[EngineAdapter]) -> type[EngineAdapter]:
    """Make an adapter available under its name (usable as a class decorator)."""
    _REGISTRY[cls.name] = cls
    return cls


def engine_names() -> list[str]:
    """Names of every registered engine."""
    return sorted(_REGISTRY)


def get_engine(name: str) -> EngineAdapter:
    """The adapter registered under name; a clear error for an unknown one."""
    try:
        return _REGISTRY[name]()
    except KeyError:
        raise UnknownEngineError(f"no engine named {name!r}; known engines: {', '.join(sorted(_REGISTRY))}") from None


__all__ = ["EngineAdapter", "LaunchPlan", "engine_names", "get_engine", "register"]

from .external import ExternalAdapter  # noqa: E402  (the adapters import base, which this module imports first)
from .sglang import SglangAdapter  # noqa: E402
from .transformers import TransformersAdapter  # noqa: E402
from .vllm import VllmAdapter  # noqa: E402

for _adapter in (VllmAdapter, SglangAdapter, TransformersAdapter, ExternalAdapter):
    register(_adapter)
