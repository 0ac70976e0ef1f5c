"""Helpers for the tests that read a GPU recording committed under data/reference/."""

from __future__ import annotations

import shutil
from pathlib import Path

from servescope import nb
from servescope.suite import load_suite
from servescope.threads import graph_modes as t02

ROOT = Path(__file__).resolve().parents[1]


def graph_study(name: str, tmp: Path, modes: tuple[str, ...] = (), load: dict | None = None,
                baseline: dict | None = None) -> t02.GraphStudy:
    """Thread 02 computed again offline from a copy of a recording's store (its ceiling probe left out), on the
    suite's deployment, over the modes given (default every mode), with the suite's load or fields over it, and the
    run's baseline where given (how the deployment runs today: what 02 says its changes against)."""
    s = load_suite(ROOT / "data" / "suites" / f"{name}.yaml")
    shutil.copytree(ROOT / "data" / "reference" / name / "store", tmp / "store")
    ctx = nb.context(s.engine, s.model, {**s.load, **(load or {})}, repetitions=3, max_repetitions=4,
                     store_dir=str(tmp / "store"), offline=True, telemetry=s.telemetry, deployment=s.deployment,
                     baseline=baseline)
    return t02.run(ctx, ceiling=False, only=modes)
