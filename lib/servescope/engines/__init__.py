"""Registry of engine adapters by name."""

from __future__ import annotations

from ..errors import UnknownEngineError
from .base import EngineAdapter, LaunchPlan

_REGISTRY: dict[str, type[EngineAdapter]] = {}


def register(cls: type[EngineAdapter]) -> type[EngineAdapter]:
    """Class decorator: make an adapter available under its name."""
    _REGISTRY[cls.name] = cls
    return cls


def engine_names() -> list[str]:
    """Names of every registered engine."""
    _load_builtin()
    return sorted(_REGISTRY)


def get_engine(name: str) -> EngineAdapter:
    """The adapter registered under name; a clear error for an unknown one."""
    _load_builtin()
    try:
        return _REGISTRY[name]()
    except KeyError:
        raise UnknownEngineError(f"no engine named {name!r}; known engines: {', '.join(sorted(_REGISTRY))}") from None


def _load_builtin() -> None:
    # imported lazily: adapter modules import this registry to register themselves
    from . import external, sglang, transformers, vllm  # noqa: F401


__all__ = ["EngineAdapter", "LaunchPlan", "engine_names", "get_engine", "register"]
