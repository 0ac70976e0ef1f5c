"""The adapter contract fails loudly: a method named like one of EngineAdapter's hooks is an override, marked so
(typing_extensions.override), on an adapter class; the same name on a helper class is a hook that nothing calls."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import servescope.engines as engines_pkg
from servescope.engines import engine_names, get_engine
from servescope.engines.base import EngineAdapter

HOOKS = {n for n, v in vars(EngineAdapter).items() if callable(v) and not n.startswith("__")}


def _classes() -> list[type]:
    out = []
    for info in pkgutil.iter_modules(engines_pkg.__path__):
        mod = importlib.import_module(f"servescope.engines.{info.name}")
        out += [c for _, c in inspect.getmembers(mod, inspect.isclass) if c.__module__ == mod.__name__]
    return out


def test_every_method_named_like_a_hook_is_a_marked_override_on_an_adapter():
    wrong = []
    for cls in _classes():
        for name, fn in vars(cls).items():
            if name not in HOOKS or cls is EngineAdapter:
                continue
            fn = fn.__func__ if isinstance(fn, (staticmethod, classmethod)) else fn
            if not issubclass(cls, EngineAdapter):
                wrong.append(f"{cls.__module__}.{cls.__name__}.{name}: a hook's name on a class that is no adapter")
            elif not getattr(fn, "__override__", False):
                wrong.append(f"{cls.__module__}.{cls.__name__}.{name}: overrides a hook without @override")
    assert not wrong, "\n".join(wrong)


def test_a_marked_override_names_a_hook_that_exists():
    stale = [f"{cls.__name__}.{name}" for cls in _classes() if issubclass(cls, EngineAdapter)
             for name, fn in vars(cls).items()
             if getattr(getattr(fn, "__func__", fn), "__override__", False) and name not in HOOKS]
    assert not stale, stale


def test_sglang_gives_its_own_moe_runner_advice():
    assert "--moe-runner-backend" in get_engine("sglang").grouped_moe_advice()
    generic = EngineAdapter.grouped_moe_advice(get_engine("vllm"))
    assert all(get_engine(n).grouped_moe_advice() for n in engine_names())
    assert get_engine("sglang").grouped_moe_advice() != generic
