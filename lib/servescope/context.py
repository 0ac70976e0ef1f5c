"""The run context: everything a thread runs with, built once from a notebook's (or a suite's) parameters.

`context(...)` is where the engine's name becomes its adapter: below it, code is handed the adapter and never looks
an engine up by name. A thread takes a RunContext and declares its arms; the study and the store do the rest.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from .analysis.ab import EQUIVALENCE_PCT
from .engines import get_engine
from .engines.base import EngineAdapter
from .errors import ServescopeError, SpecError
from .spec import (
    DeploymentSpec,
    EngineSpec,
    Knobs,
    LoadSpec,
    ModelSpec,
    ProfileSpec,
    RunnerSpec,
    TelemetrySpec,
    parse,
)
from .store import Store


@dataclass(frozen=True)
class RepetitionPlan:
    """How many repetitions: at least min_reps; more, one at a time, while the study's `until` callback names
    configurations whose headline effect is not resolved, up to max_reps and while the next repetition fits in
    budget_s of wall time (0: no time limit)."""

    min_reps: int = 3
    max_reps: int = 3
    budget_s: float = 0.0

    def __post_init__(self) -> None:
        if self.min_reps < 1:
            raise ServescopeError("repetitions must be at least 1")
        if self.max_reps < self.min_reps:
            raise ServescopeError(f"max_repetitions ({self.max_reps}) is below repetitions ({self.min_reps})")
        if self.budget_s < 0:
            raise ServescopeError("budget_s must be 0 (no limit) or more")


@dataclass(frozen=True)
class RunContext:
    """Engine (spec and adapter), model, load, store, offline/force, telemetry, profile and repetition plan of one
    run; threads read it, the study measures through it."""

    engine: EngineSpec
    adapter: EngineAdapter
    model: ModelSpec
    load: LoadSpec
    store: Store
    offline: bool = False
    force: bool = False
    progress: bool = True
    telemetry: TelemetrySpec = field(default_factory=TelemetrySpec)
    profile: ProfileSpec = field(default_factory=ProfileSpec)
    plan: RepetitionPlan = field(default_factory=RepetitionPlan)
    equivalence_pct: float = EQUIVALENCE_PCT
    # the user's deployment: every configuration a thread measures is launched as it, with the thread's knobs over it
    deployment: DeploymentSpec = field(default_factory=DeploymentSpec)
    # the load's 'kv' level as it was read (kvlevel.resolve): the engine's KV capacity, where from, the level
    kv_level: dict[str, Any] | None = None
    # how the deployment runs today, as knobs (the suite's baseline; {}: the engine's defaults): what 02 and 05 say
    # their changes against and 07 verifies against, set once for the run
    baseline: dict[str, Any] = field(default_factory=dict)
    # a point that must be measured in one machine start (the search's reference, beside the settings it judges):
    # the start's boot id joins its key, so another start launches its own instead of reading this one's
    pinned_start: str = ""
    # where the points run: children of this process (local), or Ray tasks on a cluster's nodes (raypoints)
    runner: RunnerSpec = field(default_factory=RunnerSpec)

    def deployed(self, knobs: Knobs) -> Knobs:
        """What a configuration launches: the deployment with the configuration's own knobs over it."""
        return self.deployment.apply(knobs)

    def kv_level_words(self) -> str:
        """'the load's KV-capacity level is c=84: ...' for a page ('' where the load has none)."""
        kv, ld = self.kv_level, self.load
        if not kv:
            return ""
        return (f"the load's KV-capacity level is c={kv['level']}: the deployment's KV cache holds "
                f"{kv['kv_tokens']:,} tokens (its own startup log, {kv.get('engine', 'the engine')}), "
                f"{ld.input_len + ld.output_len:,} per request at the load's mean lengths ({ld.input_len:,} in, "
                f"{ld.output_len:,} out)")

    def with_(self, **changes: Any) -> RunContext:
        """The same context with some fields replaced (a lighter load, one repetition, no profile)."""
        return dataclasses.replace(self, **changes)

    @cached_property
    def engine_identity(self) -> str:
        """What a store key says about the engine, computable without installing anything."""
        e = self.engine
        if e.url:
            return f"external:{e.url}"
        if e.python:
            return f"{e.name}:{e.python}:{e.version or ''}"
        env = self.adapter.managed_env(e.version)
        return f"{e.name}:managed:{env.key if env else ''}"

    @property
    def model_key(self) -> dict[str, Any]:
        """The model as store keys name it (architectures.model_key)."""
        from .architectures import model_key

        return model_key(self.model)

    def recall(self, kind: str, parts: dict[str, Any]) -> Any:
        """What a run kept under kind and parts (memo's answer), or None: read before deciding how to compute it."""
        return self.store.note(kind, parts)

    def memo(self, kind: str, parts: dict[str, Any], compute: Callable[[], Any],
             keep: Callable[[Any], bool] = lambda _: True, reuse_online: bool = True,
             compute_offline: bool = False, unfinished: Callable[[Any], bool] = lambda _: False) -> tuple[Any, bool]:
        """A kept answer (a probe's rows, a layout decision) keyed like points, the one way threads reuse what an
        earlier run found: offline, or online when reuse_online and not forced, the kept answer; else (and offline
        with none kept, where compute_offline: from what is already here) compute() and keep it where keep(answer)
        says it is worth keeping; online, a kept answer that unfinished(answer) says stopped short (a budget spent) is
        computed again. None offline when none was kept and none computed. Returns (answer, whether it came from the
        store)."""
        reuse = self.offline or (reuse_online and not self.force)
        saved = self.store.note(kind, parts) if reuse else None
        if saved is not None and not self.offline and unfinished(saved):
            saved = None
        if saved is not None or (self.offline and not compute_offline):
            return saved, saved is not None
        answer = compute()
        if keep(answer):
            self.store.put_note(kind, parts, answer)
        return answer, False


def context(engine: dict[str, Any] | EngineSpec, model: dict[str, Any] | ModelSpec,
            load: dict[str, Any] | LoadSpec | None = None, *, repetitions: int = 3, max_repetitions: int | None = None,
            budget_s: float = 0.0, store: Store | str | None = None, store_dir: str = "", offline: bool = False,
            force: bool = False, progress: bool = True, telemetry: dict[str, Any] | TelemetrySpec | None = None,
            profile: dict[str, Any] | ProfileSpec | None = None,
            equivalence_pct: float = EQUIVALENCE_PCT,
            deployment: dict[str, Any] | DeploymentSpec | None = None,
            baseline: dict[str, Any] | None = None,
            runner: dict[str, Any] | RunnerSpec | None = None) -> RunContext:
    """Validate every parameter (before anything launches) and resolve the engine to its adapter, once (a load's
    'kv' level stays a word: nb.context, or kvlevel.resolve, reads it from the engine). runner: where the points run;
    by default the suite's (`servescope run` hands it to the notebooks' kernels in RUNNER_ENV), else local."""
    e = parse(EngineSpec, engine, "engine")
    try:
        plan = RepetitionPlan(repetitions, max(repetitions, max_repetitions or repetitions), float(budget_s))
    except ServescopeError as ex:
        raise SpecError(str(ex)) from None
    parse(Knobs, baseline or {}, "baseline")  # a knob that does not exist is refused before anything launches
    st = store if isinstance(store, Store) else Store(store or store_dir or None)
    return RunContext(engine=e, adapter=get_engine(e.name), model=parse(ModelSpec, model, "model"),
                      load=parse(LoadSpec, load or {}, "load"), store=st, offline=offline, force=force,
                      progress=progress, telemetry=parse(TelemetrySpec, telemetry or {}, "telemetry"),
                      profile=parse(ProfileSpec, profile or {}, "profile"), plan=plan,
                      equivalence_pct=equivalence_pct, deployment=parse(DeploymentSpec, deployment or {}, "deployment"),
                      baseline=dict(baseline or {}), runner=parse(RunnerSpec, runner or _suite_runner(), "runner"))


# the suite's runner, as `servescope run` hands it to the notebooks' kernels (JSON)
RUNNER_ENV = "SERVESCOPE_RUNNER"


def _suite_runner() -> dict[str, Any]:
    raw = os.environ.get(RUNNER_ENV, "")
    try:
        return dict(json.loads(raw)) if raw else {}
    except (ValueError, TypeError):
        raise SpecError(f"{RUNNER_ENV}={raw!r}: a JSON object (servescope run sets it from the suite's runner)") from None
