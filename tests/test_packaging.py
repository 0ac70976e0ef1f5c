"""Dependencies are pinned, and environment.yml agrees with pyproject.toml."""

from __future__ import annotations

import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _pyproject_pins() -> dict[str, str]:
    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(proj["dependencies"]) + [r for extra in proj["optional-dependencies"].values() for r in extra]
    return dict(r.split("==", 1) for r in reqs)


def test_every_dependency_is_pinned():
    proj = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(proj["dependencies"]) + [r for extra in proj["optional-dependencies"].values() for r in extra]
    assert reqs and all("==" in r for r in reqs), [r for r in reqs if "==" not in r]


def test_environment_yml_agrees_with_pyproject():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    env_pins = dict(r.split("==", 1) for r in pip if "==" in r)
    assert env_pins == _pyproject_pins()
    py = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python="))
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == ">=" + py.split("=")[1]


def test_the_makefiles_uv_is_the_pinned_one():
    """`make venv` installs uv before the suite (to install the suite): the same uv the suite pins."""
    import re

    (pin,) = re.findall(r"^UV_PIN := uv==(\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert _pyproject_pins()["uv"] == pin
