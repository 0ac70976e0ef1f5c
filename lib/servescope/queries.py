"""What the store and the engine say for a run context, asked without launching: stored points and failures, whether
an engine version can express a set of knobs, its graph audit, probes kept like points, and a command line's flags in
groups."""

from __future__ import annotations

import contextlib
import dataclasses
import shlex
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from .context import RunContext
from .engines.audit import graph_disable_audit
from .engines.base import EngineInstall
from .engines.matrix import source_tree as published_source
from .engines.source import fetch_wheel
from .errors import KnobError, ServescopeError, SpecError
from .experiment import Results, point_parts, read_store
from .findings import Failure
from .launch import find_install, prepare
from .probes.run import ProbeRun
from .probes.run import failed as probe_failed
from .probes.run import skipped as probe_skipped
from .util import known

if TYPE_CHECKING:
    from .study import Arm

def flag_groups(flags: list[str]) -> list[tuple[str, ...]]:
    """A command line's flags, each with the values that follow it (`--compilation-config {...}` is one)."""
    groups: list[list[str]] = []
    for f in flags:
        if f.startswith("-") or not groups:
            groups.append([f])
        else:
            groups[-1].append(f)
    return [tuple(g) for g in groups]


def kept_probe(ctx: RunContext, kind: str, parts: dict[str, Any], install: EngineInstall | None,
               run: Callable[[EngineInstall], tuple[pd.DataFrame, dict[str, Any]]]) -> ProbeRun:
    """A probe run under the engine's interpreter (run(install) -> rows, what ran), kept in the store like a point
    so that offline renders read the kept answer; where it did not run, why (skipped or failed)."""
    def compute() -> dict[str, Any]:
        if install is None:
            return probe_skipped("nothing was measured, so the engine's environment is not known").to_kept()
        try:
            rows, info = run(install)
        except ServescopeError as ex:
            return probe_failed(str(ex)).to_kept()
        return ProbeRun(rows, info).to_kept()
    got, _ = ctx.memo(kind, parts, compute, keep=lambda a: "outcome" not in a)  # only what measured is kept
    if got is None:
        return probe_skipped("offline, and the measuring run kept no probe")
    return ProbeRun.from_kept(got)


def _gpu_read(status: pd.Series) -> bool:
    """Whether a point's GPU telemetry read a GPU: its gpu_read record; points stored before that record existed
    said it only in words (NVML 'ok', or a replayed sampler), read as they were written then."""
    read = status.get("gpu_read")
    if isinstance(read, (bool, np.bool_)):
        return bool(read)
    words = status.get("gpu")
    return not known(words) or words == "ok" or str(words).startswith("replayed")


# how an attempt stopped from outside is recorded: not a failure of its configuration
INTERRUPTS = ("KeyboardInterrupt", "SystemExit", "Interrupted")


def _error_type(man: dict[str, Any]) -> str:
    """The exception's type a failed point's manifest records; manifests written before that field existed give it
    only as their error's first word (the store writes 'Type: message')."""
    return str(man.get("error_type") or str(man.get("error", "")).partition(":")[0])


def stored_failures(ctx: RunContext) -> list[Failure]:
    """Every configuration of this engine and model whose attempt the store kept as failed (_failed/), one per
    configuration (the newest), with the engine's exception where its log had one."""
    from .deaths import DeathCause, recorded_error_line
    from .experiment import point_label

    out: dict[str, Failure] = {}
    for man in ctx.store.failed_manifests(ctx.engine_identity, ctx.model_key):
        if _error_type(man) in INTERRUPTS:
            continue  # stopped from outside (a budget's SIGTERM, Ctrl-C): the configuration did not fail
        parts = man.get("parts") or {}
        cause = DeathCause.from_dict(man["cause"]) if man.get("cause") else None
        exc = cause.exception if cause is not None else None
        name = point_label(parts, ctx.deployment)
        flags = (man.get("target") or {}).get("flags") or []
        # the knobs the thread asked for, not the deployment's under them: a change is matched against those
        out[name] = Failure(config=name, knobs=ctx.deployment.relative(parts.get("knobs") or {}), flags=list(flags),
                            summary=recorded_error_line(man)[:400],
                            exception=exc.said()[:400] if exc is not None else "",
                            frame=exc.where() if exc is not None else "",
                            stage=cause.stage if cause is not None else "",
                            teardown=cause.teardown if cause is not None else "",
                            before_ready=man.get("error_type") in ("ServerExitedError", "ServerStartTimeout",
                                                                   "RecordedFailure"),
                            recorded=f"_failed/{man['folder']}")
    return list(out.values())


def stored_points(ctx: RunContext) -> Results:
    """Every complete point the store holds for this engine and model (what other threads measured), read without
    launching anything."""
    return read_store(ctx.store, ctx.engine_identity, ctx.model_key, ctx.deployment, ctx.load.slo_ms)


def expressible(ctx: RunContext, arms: Sequence[Arm], install: EngineInstall | None = None) -> pd.DataFrame:
    """Per arm: whether this engine version (install, else the run's own, created if missing) can express its knobs,
    with their flags or the reason it cannot, and whether the engine was asked (False: only the store was read).
    Offline where the engine is not installed here: the arms whose first repetition the store holds."""
    adapter = ctx.adapter
    try:
        if install is None and adapter.launches:  # online, as a launch would: prepared (created where missing)
            install = find_install(ctx.engine, adapter) if ctx.offline else \
                prepare(ctx.engine, ctx.model, say=lambda m: None, adapter=adapter).install
    except ServescopeError as ex:
        if not ctx.offline:
            raise
        return pd.DataFrame([stored_row(ctx, a, str(ex)) for a in arms])
    rows = []
    for a in arms:
        try:
            if install is None:
                raise SpecError("an external server runs as it was started: its settings cannot be chosen from here")
            adapter.knob_flags(ctx.deployed(a.knobs), install)  # what launches: refused there, refused here
            flags = adapter.knob_flags(a.knobs, install)
            rows.append({"arm": a.name, "expressible": True, "flags": shlex.join(flags) or "(none: the default)",
                         "flag_list": list(flags), "reason": "", "asked": True})
        except (KnobError, SpecError) as ex:
            rows.append({"arm": a.name, "expressible": False, "flags": "", "flag_list": [], "reason": str(ex),
                         "asked": True})
    return pd.DataFrame(rows)


def stored_row(ctx: RunContext, a: Arm, why: str) -> dict[str, Any]:
    """An arm's expressible row where the engine cannot be asked (why): expressible if the store holds its first
    repetition, or saw it die before it was ready."""
    store = ctx.store
    key = store.key(point_parts(ctx, a.knobs, 0))
    # a launch the store saw die before it was ready was expressible: its death is what the store holds of it
    have = store.has(key) or store.recorded_death(key) is not None
    spelled = _spelled_as_stored(ctx, a, store.get(key).install) if store.has(key) else None
    return {"arm": a.name, "expressible": have,
            "flags": "" if not have else "(read from the store)" if spelled is None else
            shlex.join(spelled) or "(none: the default)",
            "flag_list": None,  # not asked of the engine: its stored launch's release spelled them, or nothing did
            "reason": "" if have else f"not in the store, and the engine is not here to ask ({why})",
            "asked": False}  # the engine was not asked: a setting missing here is not measured, not refused


def _spelled_as_stored(ctx: RunContext, a: Arm, install: EngineInstall | None) -> list[str] | None:
    """The arm's own flags as the release its stored launch ran spells them (the flags read from that release's
    published source, cached per user, where the install is not here), or None where neither can be read."""
    if install is None:
        return None
    with contextlib.suppress(ServescopeError, OSError):
        return ctx.adapter.knob_flags(a.knobs, install)
    with contextlib.suppress(ServescopeError, OSError, IndexError):  # the published release: its wheel's flags
        wheel = fetch_wheel(ctx.adapter.distributions[0], install.version)
        return ctx.adapter.knob_flags(a.knobs, dataclasses.replace(install, source=str(wheel)))
    return None


def audit_for(ctx: RunContext, install: EngineInstall | None = None) -> pd.DataFrame:
    """The graph audit of the engine that ran (`install`, as the study's points recorded it; else the one installed
    here: its managed environment or engine.python). Where that install's source is not on this machine (a store
    rendered offline elsewhere), the published release of the same version is read instead (fetched from the
    package index once, cached per user). Empty for an external server, whose source is not known."""
    ad = ctx.adapter
    if not ad.launches:
        return pd.DataFrame()
    if install is None:
        try:
            install = find_install(ctx.engine, ad)
        except ServescopeError:  # not installed here (yet): nothing to read
            return pd.DataFrame()
        assert install is not None
    try:
        return graph_disable_audit(ad.source_tree(install))
    except (ServescopeError, OSError):  # the install is not on this machine, or its source is not readable
        pass
    if not (install.version and ad.distributions):
        return pd.DataFrame()
    try:
        audit = graph_disable_audit(published_source(ad, install.version))
    except (ServescopeError, OSError):  # no network to the index and nothing cached
        return pd.DataFrame()
    audit.attrs["source"] = f"{audit.attrs.get('source', '')} (the published release of the version that ran)"
    return audit
