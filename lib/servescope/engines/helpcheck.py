"""An installed engine's flags from its own `--help`, reconciled with the static scan of its source."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
from functools import cache
from pathlib import Path

import pandas as pd

from ..errors import ServescopeError
from ..paths import cache_root
from ..util import atomic_write_text
from .flagscan import FlagSet, help_flags, scan_flags
from .source import SourceTree


@cache
def _scan_cached(tree: SourceTree) -> FlagSet:
    return scan_flags(tree)


@cache
def known_release(engine: str, version: str) -> bool:
    """Whether `make check-engines` read this release (data/engines/matrix.csv): its static scan is trusted."""
    from ..paths import project_root

    path = project_root() / "data" / "engines" / "matrix.csv"
    if not path.is_file():
        return False
    m = pd.read_csv(path, dtype=str, keep_default_na=False)
    return bool(((m["engine"] == engine) & (m["version"] == version) & (m["problems"] == "")).any())


def run_help(python: str, engine: str, version: str, argv: tuple[str, ...], timeout_s: float = 300.0,
             env: dict[str, str] | None = None) -> FlagSet:
    """The flags an installed engine's `--help` lists (run with the engine's own environment); ServescopeError where
    it does not run. An environment the suite made keeps the text it printed (help_cache_file)."""
    saved = help_cache_file(python, version, argv, env)
    if saved is not None and saved.is_file():
        return help_flags(saved.read_text(), engine, version, f"--help of {engine} {version} under {python}")
    try:
        res = subprocess.run([python, *argv], capture_output=True, text=True, timeout=timeout_s,
                             env={**os.environ, **(env or {}), "COLUMNS": "200"})
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ServescopeError(f"{engine} --help did not run: {e}") from e
    if res.returncode != 0 or "usage" not in res.stdout.lower():
        raise ServescopeError(f"{engine} --help failed: {res.stderr.strip()[-300:]}")
    if saved is not None:
        atomic_write_text(saved, res.stdout)
    return help_flags(res.stdout, engine, version, f"--help of {engine} {version} under {python}")


def help_cache_file(python: str, version: str, argv: tuple[str, ...], env: dict[str, str] | None) -> Path | None:
    """Where `--help`'s text is kept for an engine environment the suite made (inside it: making the environment
    again drops it; one engine version per environment, so its help never changes), or None for any other
    interpreter (a user's own environment may be upgraded or edited in place). Each `--help` is a cold import of the
    engine, ~10 s of every thread 00 here."""
    envs = (cache_root() / "envs").resolve()
    prefix = Path(python).parent.parent
    try:
        prefix.resolve().relative_to(envs)
    except ValueError:
        return None
    key = hashlib.sha256(json.dumps([str(python), version, list(argv), sorted((env or {}).items())]).encode())
    return prefix / "servescope-help" / f"{key.hexdigest()[:16]}.txt"


@cache
def _help_cached(python: str, engine: str, version: str, argv: tuple[str, ...],
                 env: tuple[tuple[str, str], ...] = ()) -> FlagSet | None:
    """run_help once per install, or None where it cannot run here (logged: the static scan is used)."""
    try:
        return run_help(python, engine, version, argv, env=dict(env))
    except ServescopeError as e:
        logging.getLogger(__name__).warning("%s %s: %s; using the static scan", engine, version, e)
        return None


def flag_disagreements(static: FlagSet, helped: FlagSet) -> pd.DataFrame:
    """The flags the static scan and `--help` do not share (flag, in: 'source only' / '--help only'); `--no-x`
    negations and positionals aside."""
    a, b = set(static.table["flag"]), set(helped.table["flag"])
    rows = [{"flag": f, "in": "source only"} for f in sorted(a - b) if len(f) > 2 and not f.startswith("<")] + \
           [{"flag": f, "in": "--help only"} for f in sorted(b - a) if not f.startswith("--no-") and f != "--help"]
    return pd.DataFrame(rows, columns=["flag", "in"])


_WARNED: set[tuple[str, str, str]] = set()


def reconcile_flags(static: FlagSet | None, helped: FlagSet, scan_error: Exception | None = None) -> FlagSet:
    """`--help` as the source of truth: its flags, with choices/file/line/deprecation from the static scan where it
    knows the flag (choices `--help` prints win); the flags each lists that the other does not, in disagreements."""
    table = helped.table.copy()
    if static is not None:
        known = static.table.set_index("flag")
        for col in ("dest", "file", "line", "deprecated"):
            table[col] = [known.at[f, col] if f in known.index else v for f, v in zip(table["flag"], table[col],
                                                                                      strict=True)]
        table["choices"] = [c if c is not None else (known.at[f, "choices"] if f in known.index else None)
                            for f, c in zip(table["flag"], table["choices"], strict=True)]
        dis = flag_disagreements(static, helped)
        both = len(set(static.table["flag"]) & set(helped.table["flag"]))
        origin = f"{helped.origin} (the truth; static scan of {static.origin}: {both} flags in both)"
    else:
        dis = pd.DataFrame([{"flag": "(all)", "in": f"--help only: the static scan failed ({scan_error})"}])
        origin = f"{helped.origin} (the truth; the static scan failed)"
    if len(dis) and (helped.engine, helped.version, helped.origin) not in _WARNED:
        _WARNED.add((helped.engine, helped.version, helped.origin))
        logging.getLogger(__name__).warning("%s %s: --help and the static scan disagree on %d flags (%s)",
                                            helped.engine, helped.version, len(dis),
                                            ", ".join(f"{f} ({w})" for f, w in zip(dis["flag"].head(8),
                                                                                   dis["in"].head(8), strict=True)))
    return FlagSet(engine=helped.engine, version=helped.version, table=table, origin=origin,
                   phases=static.phases if static else {}, enums=static.enums if static else {},
                   disagreements=dis)
