"""Where things live: the project folder, the per-user cache, the result store."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """Per-user cache shared by every clone: engine environments and generated models."""
    if env := os.environ.get("SERVESCOPE_CACHE"):
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "servescope"


def project_root() -> Path:
    """The checkout that holds data/ and reports/ (found upward from cwd, else from the package)."""
    if env := os.environ.get("SERVESCOPE_PROJECT"):
        return Path(env).expanduser().resolve()
    for start in (Path.cwd(), Path(__file__).resolve().parent):
        for cand in (start, *start.parents):
            if (cand / "pyproject.toml").is_file() and (cand / "lib" / "servescope").is_dir():
                return cand
    return Path.cwd()


def default_store_dir() -> Path:
    """The result store: one folder per experiment."""
    return project_root() / "data" / "runs"


def default_reports_dir() -> Path:
    """Rendered reports, one folder per suite run plus `latest`."""
    return project_root() / "reports"
