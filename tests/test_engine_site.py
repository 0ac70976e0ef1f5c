"""engine_site: every Python process of a launched server asks Linux for the AMX tile permission (vLLM CPU's bfloat16
kernels use AMX and never ask); where the CPU has no AMX it asks nothing and changes nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from servescope import hostcpu
from servescope.errors import ServerError
from servescope.server import ENGINE_SITE, ManagedServer, engine_site_path, free_port

FIXTURES = Path(__file__).parent / "fixtures" / "amx"


def _site_says(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "import sitecustomize as s; print(s.AMX)"], capture_output=True,
                          text=True, env={**os.environ, **env}, timeout=60)


def test_the_engine_site_leads_the_servers_pythonpath_once():
    assert engine_site_path() == str(ENGINE_SITE)
    assert engine_site_path(f"/a{os.pathsep}{ENGINE_SITE}{os.pathsep}/b") == os.pathsep.join([str(ENGINE_SITE), "/a",
                                                                                               "/b"])


def test_on_this_cpu_it_asks_exactly_when_linux_offers_amx_tile_data():
    r = _site_says({"PYTHONPATH": engine_site_path()})
    assert r.returncode == 0
    if hostcpu.amx_tile_data_supported_by_kernel():
        assert r.stdout.strip() == "granted" and "AMX tile permission granted" in r.stderr
    else:  # no AMX (this development VM is an EPYC): nothing asked, nothing printed, nothing changed
        assert r.stdout.strip() == "not asked: no AMX tile data on this CPU" and r.stderr == ""


def test_it_can_be_turned_off():
    r = _site_says({"PYTHONPATH": engine_site_path(), "SERVESCOPE_AMX_PERMISSION": "0"})
    assert r.stdout.strip() == "off: SERVESCOPE_AMX_PERMISSION=0" and r.stderr == ""


def test_a_sitecustomize_it_shadows_still_runs(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['OTHER_SITE_RAN'] = '1'\n")
    r = subprocess.run([sys.executable, "-c", "import os, sitecustomize as s; print(s.AMX != '', "
                        "os.environ.get('OTHER_SITE_RAN'))"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": engine_site_path(str(other))})
    assert r.stdout.split() == ["True", "1"], r.stderr


def test_a_launched_server_process_runs_it(tmp_path):
    # a stand-in server that reports what its interpreter's sitecustomize did and exits before it is ready
    script = tmp_path / "srv.py"
    script.write_text("import sitecustomize\nprint('site:', sitecustomize.AMX, flush=True)\n")
    srv = ManagedServer(command=[sys.executable, str(script)], port=free_port(), model="m", log_dir=tmp_path / "logs",
                        startup_timeout_s=20)
    with pytest.raises(ServerError):
        srv.start()
    srv.stop()
    out = (tmp_path / "logs" / "server.stdout.log").read_text()
    assert "site: " in out and ("granted" in out or "no AMX tile data" in out), out


def test_the_recorded_amx_cpu_shows_the_permission_is_what_keeps_tiles_alive():
    """Recorded on the H200 machine's host (an AMX Xeon VM) with benchmarks/gpu/amx_site_check.py: without the
    permission a tile instruction dies from SIGILL (what killed eager vLLM CPU workers); with engine_site on the
    PYTHONPATH it runs, in the process, in a spawned interpreter (how vLLM starts workers) and in a forked child."""
    text = (FIXTURES / "site_check_xeon_amx_vm.txt").read_text()
    cases = {ln.split()[0].removeprefix("case="): ln.split("result=", 1)[1] for ln in text.splitlines()
             if ln.startswith("case=")}
    assert "amx_flags=amx_bf16 amx_tile amx_int8" in text and "sitecustomize_says=granted" in text
    assert cases["without_permission"] == "signal SIGILL"
    assert all(cases[c].startswith("exit 0") for c in ("with_permission", "spawn_child", "fork_child")), cases
    assert cases["spawn_child"].count("permission granted") == 3  # the parent, spawn's helper, and the child
    # the development VM (EPYC, no AMX): nothing asked, nothing run
    epyc = (FIXTURES / "site_check_epyc_no_amx.txt").read_text()
    assert "sitecustomize_says=not asked: no AMX tile data on this CPU" in epyc and "result=skipped" in epyc


def test_it_raises_the_loggers_an_engine_keeps_below_its_decisions():
    """transformers 5.17 logs its CUDA-graph decision at INFO on 'ContinuousBatchingLogger', a logger of its own that
    `--log-level` does not reach (seen on the H200, 2026-12-02: the line was missing at --log-level info)."""
    code = ("import logging; import sitecustomize as s; "
            "print(s.LOGGERS, logging.getLogger('ContinuousBatchingLogger').getEffectiveLevel())")
    env = {**os.environ, "PYTHONPATH": engine_site_path(),
           "SERVESCOPE_LOGGER_LEVELS": "ContinuousBatchingLogger=INFO, bad=NOPE"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert r.stdout.split() == ["['ContinuousBatchingLogger']", "20"], r.stderr
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PYTHONPATH": engine_site_path()})
    assert plain.stdout.split() == ["[]", "30"]  # nothing asked: the engine's own default (WARNING) stands
