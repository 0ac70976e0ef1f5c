"""Engine environments: install steps report progress instead of minutes of silence."""

from __future__ import annotations

import io
import json
import sys

import pytest

from servescope.engines import envs
from servescope.engines.envs import EngineEnvSpec, ensure_engine_env, run_step


def test_a_long_step_says_how_long_and_what_pip_does():
    script = ("import time\nfor n in ('a', 'b', 'c'):\n    print(f'Collecting pkg-{n}', flush=True)\n"
              "    time.sleep(0.3)\nprint('Installing collected packages: pkg-a, pkg-b, pkg-c', flush=True)\n"
              "time.sleep(0.3)\n")
    said: list[str] = []
    log = io.StringIO()
    assert run_step([sys.executable, "-c", script], log, said.append, heartbeat_s=0.25) == 0
    assert len(said) >= 3 and all(s.split()[0].isdigit() and s.split()[1] == "s," for s in said)
    assert any("packages collected" in s and "now: Collecting pkg-" in s for s in said)
    assert "now: Installing collected packages" in said[-1]
    assert log.getvalue().count("Collecting pkg-") == 3  # everything still goes to the install log


def test_a_failing_step_returns_its_code():
    assert run_step([sys.executable, "-c", "import sys; sys.exit(3)"], io.StringIO(), lambda m: None) == 3


@pytest.mark.slow  # creates a virtual environment and asks the package index
@pytest.mark.parametrize("installer,steps", [("uv", 3), ("pip", 4)])
def test_environment_creation_prints_a_line_per_step(tmp_path, monkeypatch, installer, steps):
    monkeypatch.setenv("SERVESCOPE_CACHE", str(tmp_path))
    if installer == "pip":
        monkeypatch.setattr(envs, "uv_binary", lambda: None)
    said: list[str] = []
    spec = EngineEnvSpec(key="tiny-env", requirements=("pip",), import_check="import pip")
    python = ensure_engine_env(spec, said.append)
    assert python.exists() and spec.is_ready()
    done = [s for s in said if ": done in " in s]
    assert [s.split("]")[0].strip() for s in done] == [f"[{i}/{steps}" for i in range(1, steps + 1)]
    assert "create the virtual environment" in done[0] and "s in all)" in done[-1]
    assert said[-1].startswith("engine environment ready in ")
    marker = json.loads((spec.folder() / envs.COMPLETE_MARKER).read_text())
    assert marker["installer"] == installer
    if installer == "uv":  # pip's own freeze leaves pip out; uv's lists it
        assert any(line.lower().startswith("pip==") for line in marker["freeze"])


def test_an_environment_without_pip_is_not_ready(tmp_path, monkeypatch):
    """uv made engine environments without pip until 2026-12-03, and vLLM's /server_info (which runs `python -m pip
    list`) then answered 500 at every launch, so no launch's tp/dp could be verified: such an environment is made
    again, with pip seeded (the test fails against the old readiness rule)."""
    monkeypatch.setenv("SERVESCOPE_CACHE", str(tmp_path))
    spec = EngineEnvSpec(key="no-pip", requirements=("x",))
    bin_dir = spec.python().parent
    bin_dir.mkdir(parents=True)
    spec.python().write_text("")
    (spec.folder() / envs.COMPLETE_MARKER).write_text("{}")
    assert not spec.is_ready()
    (bin_dir / "pip").write_text("")
    assert spec.is_ready()
    assert "--seed" in envs._uv_steps(spec, "uv")[0][1]


def test_pip_sources_reach_uv(tmp_path, monkeypatch):
    """uv reads none of pip's configuration: the index, extra indexes, wheel folders and constraints pip would use
    are handed to it, from pip's config files and PIP_* variables alike."""
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nindex-url = http://mirror.example/simple\n"
                    "extra-index-url = file:///a/simple file:///b/simple\nconstraint = /c/constraints.txt\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    monkeypatch.setenv("PIP_FIND_LINKS", "/wheels/here")
    args = envs.pip_sources_as_uv_args()
    pairs = list(zip(args[::2], args[1::2], strict=True))
    assert ("--index-url", "http://mirror.example/simple") in pairs
    assert {("--extra-index-url", "file:///a/simple"), ("--extra-index-url", "file:///b/simple"),
            ("--find-links", "/wheels/here"), ("--constraint", "/c/constraints.txt")} <= set(pairs)
    assert sum(1 for flag, _ in pairs if flag == "--index-url") == 1
