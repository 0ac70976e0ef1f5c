"""pip's package sources as uv arguments. Standard library only: `make venv` runs this file with the bare
interpreter, before anything of the suite is installed, so that the suite's own environment and the engines' are
installed from the same sources.

    python lib/servescope/pipsources.py    # prints the arguments, shell-quoted, on one line
"""

from __future__ import annotations

import shlex
import subprocess
import sys

# pip settings that say where packages come from; uv reads none of pip's configuration, so they are handed over
_PIP_SOURCES = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
                "constraint": "--constraint"}


def pip_sources_as_uv_args(python: str = sys.executable) -> list[str]:
    """This machine's pip index settings (config files and PIP_* variables) as uv arguments, so both installers
    see the same packages (a local wheel folder, a mirror, a constraints file)."""
    res = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True)
    found: dict[str, list[str]] = {}
    for line in res.stdout.splitlines():
        name, _, value = line.partition("=")
        key = name.rsplit(".", 1)[-1]
        if key not in _PIP_SOURCES:
            continue
        for item in value.strip().strip("'\"").split():
            if item not in found.setdefault(key, []):
                found[key].append(item)
    args: list[str] = []
    for key, flag in _PIP_SOURCES.items():
        values = found.get(key, [])
        if key == "index-url":
            values = values[-1:]  # pip lists its sources from the lowest precedence up: the last one wins
        for v in values:
            args += [flag, v]
    return args


if __name__ == "__main__":
    print(shlex.join(pip_sources_as_uv_args()))
