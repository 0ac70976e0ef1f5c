"""Engine environments: install steps report progress instead of minutes of silence."""

from __future__ import annotations

import io
import sys

import pytest

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
def test_environment_creation_prints_a_line_per_step(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVESCOPE_CACHE", str(tmp_path))
    said: list[str] = []
    spec = EngineEnvSpec(key="tiny-env", requirements=("pip",), import_check="import pip")
    python = ensure_engine_env(spec, said.append)
    assert python.exists() and spec.is_ready()
    done = [s for s in said if ": done in " in s]
    assert [s.split("]")[0].strip() for s in done] == ["[1/4", "[2/4", "[3/4", "[4/4"]
    assert "create the virtual environment" in done[0] and "s in all)" in done[-1]
    assert said[-1].startswith("engine environment ready in ")
