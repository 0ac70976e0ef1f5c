"""One module per research thread: what to measure, and how to turn measurements into findings.

Each module declares what it is (THREAD, its notebook's id; QUESTION, what it answers in one line; ROLE where the
report reads it for something of its own) and offers run(ctx, ...) and findings(result, ...). The registry below is
the one list of them: the report, the questions table and the checks read it, and import no thread by name."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import cache

# the thread modules, in the order a suite runs them (03 reads every point the others stored, so it runs late)
MODULES = ("environment", "graph_disable", "graph_modes", "parallelism", "torch_compile", "grouped_gemm", "verify",
           "clocks_power")


@dataclass(frozen=True)
class ThreadInfo:
    """What a thread module declares: its notebook's id, its question, its module and its role for the report."""

    id: str
    question: str
    module: str
    role: str = ""


@cache
def registry() -> dict[str, ThreadInfo]:
    """Every thread by its notebook id, from what each module declares."""
    out = {}
    for name in MODULES:
        mod = importlib.import_module(f"{__name__}.{name}")
        out[mod.THREAD] = ThreadInfo(mod.THREAD, mod.QUESTION, mod.__name__, getattr(mod, "ROLE", ""))
    return out


def by_role(role: str) -> ThreadInfo:
    """The thread the report reads for a role ('environment': what ran; 'verification': the front page's answer)."""
    hit = [t for t in registry().values() if t.role == role]
    if len(hit) != 1:
        raise LookupError(f"{len(hit)} threads declare ROLE {role!r}: exactly one must")
    return hit[0]
