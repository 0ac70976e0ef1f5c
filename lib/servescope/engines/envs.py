"""Engine virtual environments, kept apart from the suite's, in a per-user cache keyed by engine and version."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

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


# pip's lines worth repeating while a step runs: what it is fetching or doing now
_PIP_ACTIVITY = ("Collecting", "Downloading", "Installing collected", "Building", "Successfully", "Uninstalling")


def run_step(cmd: list[str], logf: TextIO, say: Callable[[str], None], heartbeat_s: float = 15.0) -> int:
    """Run one install step with its output going to logf; every heartbeat_s, say how long it has run, how many
    packages pip has collected and what it is doing now. Returns the exit code."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    seen = {"collected": 0, "now": ""}

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            logf.write(line)
            logf.flush()
            text = line.strip()
            if text.startswith("Collecting"):
                seen["collected"] += 1
            if text.startswith(_PIP_ACTIVITY):
                seen["now"] = text[:110]

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    next_beat = t0 + heartbeat_s
    while proc.poll() is None:
        time.sleep(0.1)
        if time.monotonic() >= next_beat:
            parts = [f"{time.monotonic() - t0:.0f} s"]
            if seen["collected"]:
                parts.append(f"{seen['collected']} packages collected")
            if seen["now"]:
                parts.append(f"now: {seen['now']}")
            say(", ".join(parts))
            next_beat += heartbeat_s
    reader.join()
    return proc.returncode


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
        say(f"creating engine environment {folder} ({' '.join(spec.requirements)}); the first time takes a few minutes")
        t0 = time.monotonic()
        log_path = folder.parent / f"{spec.key}.install.log"
        py = str(spec.python())
        steps = [
            ("create the virtual environment", [sys.executable, "-m", "venv", str(folder)]),
            ("upgrade pip", [py, "-m", "pip", "install", "--upgrade", "pip"]),
            (f"pip install {' '.join(spec.requirements)}", [py, "-m", "pip", "install", *spec.requirements]),
        ]
        if spec.remove_after:
            steps.append((f"remove {' '.join(spec.remove_after)} (they break the engine's torch)",
                          [py, "-m", "pip", "uninstall", "-y", *spec.remove_after]))
        if spec.import_check:
            steps.append((f"check: {spec.import_check}", [py, "-c", spec.import_check]))
        with open(log_path, "w") as logf:
            for i, (label, cmd) in enumerate(steps, 1):
                tag = f"[{i}/{len(steps)}] {label}"
                logf.write(f"$ {' '.join(cmd)}\n")
                logf.flush()
                t_step = time.monotonic()
                rc = run_step(cmd, logf, lambda m, tag=tag: say(f"  {tag}: {m}"))
                if rc != 0:
                    tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-30:])
                    raise EngineEnvError(f"engine environment step failed ({rc}): {' '.join(cmd)}\n{tail}")
                say(f"  {tag}: done in {time.monotonic() - t_step:.0f} s ({time.monotonic() - t0:.0f} s in all)")
        freeze = subprocess.run([str(spec.python()), "-m", "pip", "freeze"], capture_output=True, text=True).stdout
        atomic_write_json(
            folder / COMPLETE_MARKER,
            {"requirements": spec.requirements, "removed": spec.remove_after, "freeze": freeze.splitlines(),
             "install_s": round(time.monotonic() - t0, 1)},
        )
        say(f"engine environment ready in {time.monotonic() - t0:.0f} s")
    return spec.python()
