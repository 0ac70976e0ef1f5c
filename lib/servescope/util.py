"""Small shared helpers: file locks and atomic writes."""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Exclusive advisory lock held for the block (so two clones never build one cache entry at once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary file beside path, then rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; reports are meant to be shared
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: Path, text: str) -> None:
    """Text flavour of atomic_write_bytes."""
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: Path, obj: Any) -> None:
    """JSON flavour of atomic_write_bytes (indented, keys sorted)."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


_SECRET_WORDS = ("token", "secret", "password", "api_key", "apikey", "credential")


def redact_mapping(obj: Any) -> Any:
    """Copy of a JSON-like object with every non-empty value under a secret-looking key replaced by '***'."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if isinstance(k, str) and any(w in k.lower() for w in _SECRET_WORDS) and v not in (None, "", [], {}) \
                    and not isinstance(v, (bool, int, float, dict, list)):
                out[k] = "***"
            else:
                out[k] = redact_mapping(v)
        return out
    if isinstance(obj, list):
        return [redact_mapping(v) for v in obj]
    return obj


def rep_label(rep: Any) -> str:
    """'rep 1' for a point's first repetition: stores and keys count from 0, every page and log line from 1."""
    return f"rep {int(rep) + 1}"


def known(x: Any) -> bool:
    """Whether a reading holds a value: not None and not NaN (a table's missing reading), so that a missing value is
    tested as what it is, not by a NaN's inequality with itself."""
    if x is None:
        return False
    try:
        return not math.isnan(x)
    except TypeError:  # not a number: a value all the same
        return True
