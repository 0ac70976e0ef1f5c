"""Engine virtual environments, kept apart from the suite's, in a per-user cache keyed by engine and version."""

from __future__ import annotations

import logging
import os
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
from ..pipsources import pip_sources_as_uv_args
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
        """True once a complete install finished there, with pip in it (an environment uv made without pip, as
        servescope did before 2026-12-03, is made again once: vLLM's /server_info lists packages with `python -m pip
        list` and answered 500 without it, so every launch's resolved tp/dp read 'not verified')."""
        return (self.folder() / COMPLETE_MARKER).is_file() and self.python().exists() and \
            (self.python().parent / "pip").exists()


# pip's and uv's lines worth repeating while a step runs: what it is fetching or doing now
_PIP_ACTIVITY = ("Collecting", "Downloading", "Installing collected", "Building", "Successfully", "Uninstalling",
                 "Resolved", "Prepared", "Installed", "Uninstalled")

def uv_binary() -> str | None:
    """The uv executable pinned with the suite, or None where it is not installed (pip is used then)."""
    try:
        import uv
        return uv.find_uv_bin()
    except (ImportError, FileNotFoundError):
        return None


def run_step(cmd: list[str], logf: TextIO, say: Callable[[str], None], heartbeat_s: float = 15.0,
             env: dict[str, str] | None = None) -> int:
    """Run one install step with its output going to logf; every heartbeat_s, say how long it has run, how many
    packages pip has collected and what it is doing now. Returns the exit code."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                            env=env)
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


Step = tuple[str, list[str], dict[str, str] | None]


def _uv_steps(spec: EngineEnvSpec, uv: str) -> list[Step]:
    py, folder = str(spec.python()), str(spec.folder())
    # the system's certificates, as pip uses them; pip's best-match across indexes rather than uv's first index
    env = {**os.environ, "UV_NATIVE_TLS": "1"}
    steps: list[Step] = [
        # --seed: pip in it, as in any environment a user makes (the engine may run it: vLLM's /server_info does)
        ("create the virtual environment (uv)", [uv, "venv", "--quiet", "--seed", "--python", sys.executable, folder],
         env),
        (f"uv pip install {' '.join(spec.requirements)}",
         # bytecode compiled now, as pip does: else the first launch compiles torch's and the engine's modules, and
         # its launch-to-first-token (a measured figure) carries a minute of it
         [uv, "pip", "install", "--python", py, "--index-strategy", "unsafe-best-match", "--compile-bytecode",
          *pip_sources_as_uv_args(), *spec.requirements], env),
    ]
    return steps + _last_steps(spec, [uv, "pip", "uninstall", "--python", py], env)


def _pip_steps(spec: EngineEnvSpec) -> list[Step]:
    py = str(spec.python())
    steps: list[Step] = [
        ("create the virtual environment", [sys.executable, "-m", "venv", str(spec.folder())], None),
        ("upgrade pip", [py, "-m", "pip", "install", "--upgrade", "pip"], None),
        (f"pip install {' '.join(spec.requirements)}", [py, "-m", "pip", "install", *spec.requirements], None),
    ]
    return steps + _last_steps(spec, [py, "-m", "pip", "uninstall", "-y"], None)


def _last_steps(spec: EngineEnvSpec, uninstall: list[str], env: dict[str, str] | None) -> list[Step]:
    """What follows either installer: remove what breaks the engine (with that installer), then the import check."""
    steps: list[Step] = []
    if spec.remove_after:
        steps.append((f"remove {' '.join(spec.remove_after)} (they break the engine's torch)",
                      [*uninstall, *spec.remove_after], env))
    if spec.import_check:
        steps.append((f"check: {spec.import_check}", [str(spec.python()), "-c", spec.import_check], None))
    return steps


def _run_steps(steps: list[Step], logf: TextIO, log_path: Path, say: Callable[[str], None], t0: float) -> None:
    for i, (label, cmd, env) in enumerate(steps, 1):
        tag = f"[{i}/{len(steps)}] {label}"
        logf.write(f"$ {' '.join(cmd)}\n")
        logf.flush()
        t_step = time.monotonic()
        rc = run_step(cmd, logf, lambda m, tag=tag: say(f"  {tag}: {m}"), env=env)
        if rc != 0:
            logf.flush()
            tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-30:])
            raise EngineEnvError(f"engine environment step failed ({rc}): {' '.join(cmd)}\n{tail}")
        say(f"  {tag}: done in {time.monotonic() - t_step:.0f} s ({time.monotonic() - t0:.0f} s in all)")


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
        uv = uv_binary()
        installer = "pip"
        with open(log_path, "w") as logf:
            if uv:
                try:
                    _run_steps(_uv_steps(spec, uv), logf, log_path, say, t0)
                    installer = "uv"
                except EngineEnvError as e:
                    # uv resolves differently from pip in corner cases; pip is slower but what the engines document
                    say(f"  uv could not install it ({str(e).splitlines()[0]}); trying again with pip")
                    shutil.rmtree(folder, ignore_errors=True)
            if installer == "pip":
                _run_steps(_pip_steps(spec), logf, log_path, say, t0)
        freeze_cmd = [uv, "pip", "freeze", "--python", str(spec.python())] if installer == "uv" else \
            [str(spec.python()), "-m", "pip", "freeze"]
        freeze = subprocess.run(freeze_cmd, capture_output=True, text=True).stdout
        atomic_write_json(
            folder / COMPLETE_MARKER,
            {"requirements": spec.requirements, "removed": spec.remove_after, "freeze": freeze.splitlines(),
             "installer": installer, "install_s": round(time.monotonic() - t0, 1)},
        )
        say(f"engine environment ready in {time.monotonic() - t0:.0f} s")
    return spec.python()
