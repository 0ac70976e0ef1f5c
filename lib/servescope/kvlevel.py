"""A load's 'kv' level: the concurrency whose requests, at the load's mean lengths, fill the deployment's KV cache.

The engine says how many tokens its cache holds only once it has started, and the number depends on the card, the
memory share and the graphs it captured. So the level is read once per store from a launch of the deployment itself
(started, read, stopped: nothing measured), or from a stored point of that launch, and kept as a note keyed like
points: every configuration, repetition and later run of the store then sends the same level, and a store rendered
where the engine is not installed finds the same points. Notebooks resolve it as they make their run context
(nb.context)."""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .context import RunContext
from .errors import SpecError
from .spec import KV_LEVEL, Knobs

NOTE = "kv_level"


def level_for(kv_tokens: int, input_len: int, output_len: int) -> int:
    """The most requests whose whole contexts (prompt and output at the load's means) fit in kv_tokens together."""
    return max(1, kv_tokens // (input_len + output_len))


def resolve(ctx: RunContext, say: Callable[[str], None] = print) -> RunContext:
    """The context with its load's 'kv' level replaced by a number (the store's note, else read from a launch of the
    deployment); unchanged where the load has no such level."""
    if not ctx.load.kv_level:
        return ctx
    if not ctx.adapter.launches:
        raise SpecError(f"load.concurrency {KV_LEVEL!r}: an external server's KV capacity cannot be read from its "
                        "launch here; give the level as a number")
    deployed = ctx.deployed(Knobs())
    parts = {"engine": ctx.engine_identity, "engine_env": dict(sorted(ctx.engine.env.items())),
             "engine_args": list(ctx.engine.args), "model": ctx.model_key,
             "knobs": deployed.model_dump(mode="json", exclude_defaults=True)}
    # offline: the note, else a stored point of the deployment; never a launch
    answer, _ = ctx.memo(NOTE, parts, lambda: stored_capacity(ctx, parts) or (
        None if ctx.offline else read_capacity(ctx, deployed, say)), keep=lambda a: bool(a and a.get("kv_tokens")),
        compute_offline=True)
    if not answer:
        raise SpecError(f"load.concurrency {KV_LEVEL!r}: no launch of this deployment has said its KV capacity into "
                        f"this store ({ctx.store.root}); run the suite online once, or give the level as a number")
    if not answer.get("kv_tokens"):
        raise SpecError(f"load.concurrency {KV_LEVEL!r}: {answer.get('why', 'the engine did not say its KV capacity')}"
                        "; give the level as a number")
    level = level_for(int(answer["kv_tokens"]), ctx.load.input_len, ctx.load.output_len)
    return ctx.with_(load=ctx.load.with_kv(level), kv_level={**answer, "level": level})


def _servers(knobs: Knobs) -> int:
    """KV caches the deployment holds: data-parallel engines and replicas each hold one of the size a log says."""
    return max(1, knobs.dp or 1) * max(1, knobs.replicas)


def stored_capacity(ctx: RunContext, parts: dict[str, Any]) -> dict[str, Any] | None:
    """The KV capacity a stored point of this very launch (the deployment as it is, any load) said in its log: no
    launch needed (None where the store has none)."""
    same = ("engine", "engine_env", "model", "knobs")
    for pt in ctx.store.points():
        p = pt.parts
        if all(p.get(k, {} if k == "engine_env" else None) == parts[k] for k in same) \
                and list(p.get("engine_args") or []) == parts["engine_args"] and pt.has_log():
            tokens = ctx.adapter.kv_capacity_tokens(pt.log())
            if tokens:
                knobs = Knobs(**p["knobs"])
                servers = _servers(knobs)
                return {"kv_tokens": tokens * servers, "per_server_tokens": tokens, "servers": servers,
                        "from_point": pt.key, "engine": f"{ctx.engine.name} {pt.install.version if pt.install else ''}",
                        "knobs": knobs.label()}
    return None


def read_capacity(ctx: RunContext, knobs: Knobs, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Launch the deployment, wait until it is ready, read how many tokens its KV cache holds from its log, stop it."""
    from .experiment import startup_timeout
    from .launch import prepare, serve
    from .server import read_logs

    prep = prepare(ctx.engine, ctx.model, say=say, adapter=ctx.adapter)
    limit_s, why = startup_timeout(ctx)
    prep = dataclasses.replace(prep, engine=prep.engine.model_copy(update={"startup_timeout_s": limit_s}))
    say(f"load level {KV_LEVEL!r}: launching the deployment ({knobs.label()}) to read its KV capacity; ready within "
        f"{limit_s:.0f} s ({why})")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="servescope-kv-") as tmp:
        with serve(prep, knobs, Path(tmp)):
            ready_s = time.monotonic() - t0
        text = read_logs(Path(tmp))
    per_server = ctx.adapter.kv_capacity_tokens(text)
    if per_server is None:
        return {"kv_tokens": None, "why": f"{ctx.engine.name} {prep.install.version}'s startup log names no KV cache "
                                          "size", "ready_s": round(ready_s, 1)}
    servers = _servers(knobs)
    total = per_server * servers
    say(f"load level {KV_LEVEL!r}: the deployment's KV cache holds {total:,} tokens"
        + (f" ({servers} x {per_server:,})" if servers > 1 else "") + f" (ready in {ready_s:.0f} s)")
    return {"kv_tokens": total, "per_server_tokens": per_server, "servers": servers, "ready_s": round(ready_s, 1),
            "engine": f"{ctx.engine.name} {prep.install.version}", "knobs": knobs.label()}

