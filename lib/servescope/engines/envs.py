"""Engine virtual environments, kept apart from the suite's, in a per-user cache keyed by engine and version."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import EngineEnvError
from ..paths import cache_root
from ..util import atomic_write_json, file_lock

log = logging.getLogger(__name__)

COMPLETE_MARKER = ".servescope-complete.json"


@dataclass(frozen=True)
class EngineEnvSpec:
    """What to pip-install into an engine's environment (and what to remove afterwards)."""

    key: str
    requirements: tuple[str, ...]
    remove_after: tuple[str, ...] = ()
    import_check: str = ""

    def folder(self) -> Path:
        """The environment's folder in the per-user cache."""
        return cache_root() / "envs" / self.key

    def python(self) -> Path:
        """The environment's interpreter."""
        return self.folder() / "bin" / "python"

    def is_ready(self) -> bool:
        """True once a complete install finished there."""
        return (self.folder() / COMPLETE_MARKER).is_file() and self.python().exists()


def ensure_engine_env(spec: EngineEnvSpec, say: Callable[[str], None] = print) -> Path:
    """Create the environment if missing (under a lock, idempotent); return its interpreter."""
    if spec.is_ready():
        return spec.python()
    folder = spec.folder()
    with file_lock(folder.parent / f".{spec.key}.lock"):
        if spec.is_ready():
            return spec.python()
        if folder.exists():
            say(f"removing incomplete engine environment {folder}")
            shutil.rmtree(folder)
        say(f"creating engine environment {folder} ({' '.join(spec.requirements)}); first time takes a few minutes")
        t0 = time.monotonic()
        log_path = folder.parent / f"{spec.key}.install.log"
        steps = [
            [sys.executable, "-m", "venv", str(folder)],
            [str(spec.python()), "-m", "pip", "install", "--upgrade", "pip"],
            [str(spec.python()), "-m", "pip", "install", *spec.requirements],
        ]
        if spec.remove_after:
            steps.append([str(spec.python()), "-m", "pip", "uninstall", "-y", *spec.remove_after])
        if spec.import_check:
            steps.append([str(spec.python()), "-c", spec.import_check])
        with open(log_path, "w") as logf:
            for cmd in steps:
                logf.write(f"$ {' '.join(cmd)}\n")
                logf.flush()
                rc = subprocess.call(cmd, stdout=logf, stderr=subprocess.STDOUT)
                if rc != 0:
                    tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-30:])
                    raise EngineEnvError(f"engine environment step failed ({rc}): {' '.join(cmd)}\n{tail}")
        freeze = subprocess.run([str(spec.python()), "-m", "pip", "freeze"], capture_output=True, text=True).stdout
        atomic_write_json(
            folder / COMPLETE_MARKER,
            {"requirements": spec.requirements, "removed": spec.remove_after, "freeze": freeze.splitlines(),
             "install_s": round(time.monotonic() - t0, 1)},
        )
        say(f"engine environment ready in {time.monotonic() - t0:.0f} s")
    return spec.python()
