"""servescope doctor: checks, the cache of token results, and stopping early on a configuration known to die."""

from __future__ import annotations

import sys

import pytest
import yaml

from servescope import doctor, hostcpu
from servescope.cli import main
from servescope.engines import get_engine
from servescope.spec import ModelSpec


def _suite(tmp_path, dies: str) -> str:
    p = tmp_path / "suite.yaml"
    p.write_text(yaml.safe_dump({
        "name": "stubdoc", "engine": {"name": "stub", "python": sys.executable, "startup_timeout_s": 30,
                                      "env": {"STUB_DIES": dies}},
        "model": {"path": "stub"}, "notebooks": [{"id": "00_environment"}]}))
    return str(p)


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVESCOPE_CACHE", str(tmp_path / "cache"))


def test_doctor_names_the_configuration_that_dies_and_quick_stops_on_it(tmp_path, capsys):
    suite = _suite(tmp_path, "eager")
    checks = {c.check: c for c in doctor.run_doctor(suite, say=lambda m: None)}
    assert checks["token: compiled"].status == "ok"
    eager = checks["token: eager"]
    assert eager.status == "fail" and "died from SIGILL (illegal instruction)" in eager.detail
    assert "Fatal Python error: Illegal instruction" in eager.detail  # the log line that shows it
    assert checks["engine environment"].status == "ok" and checks["suite environment"].status in ("ok", "warn")
    # quick: nothing launched, the cached failure stops the run (what `make report` does first)
    assert main(["doctor", "--quick", "--suite", suite]) == 1
    out, err = capsys.readouterr()
    assert "token: eager" in err and "SIGILL" in out and "[cached " in out


def test_quick_without_cached_tokens_warns_and_passes(tmp_path, capsys):
    assert main(["doctor", "--quick", "--suite", _suite(tmp_path, "none")]) == 0
    out, _ = capsys.readouterr()
    assert "not checked on this CPU, engine environment and model yet (make doctor)" in out


def test_full_doctor_passes_and_caches_per_cpu(tmp_path):
    suite = _suite(tmp_path, "none")
    checks = doctor.run_doctor(suite, say=lambda m: None)
    assert all(c.status != "fail" for c in checks), doctor.table(checks)
    engine, model = doctor._suite_parts(suite)
    _, key, _ = doctor.check_engine(engine, get_engine(engine.name))
    cached = doctor._read_cache(doctor.cache_path(key, model))
    assert set(cached) == {"eager", "compiled"} and all(c.status == "ok" and c.cached for c in cached.values())


def test_missing_engine_is_a_failure_that_says_what_to_run(tmp_path):
    checks = {c.check: c for c in doctor.run_doctor(None, quick=True)}  # the default suite, with an empty cache
    assert checks["engine environment"].status == "fail" and "make engine" in checks["engine environment"].detail
    assert checks["token: eager"].status == "fail"


def test_cpu_check_says_what_amx_means_and_warns_only_when_the_permission_is_turned_off(monkeypatch):
    monkeypatch.setattr(hostcpu, "isa", lambda: {f: True for f in hostcpu.ISA_FLAGS})
    monkeypatch.setattr(hostcpu, "amx_tile_data_supported_by_kernel", lambda: True)
    vllm = get_engine("vllm")
    ok = doctor.check_cpu(ModelSpec(tiny={}), vllm)
    assert ok.status == "ok" and "asks at start" in ok.detail
    monkeypatch.setenv("SERVESCOPE_AMX_PERMISSION", "0")
    warn = doctor.check_cpu(ModelSpec(tiny={}), vllm)
    assert warn.status == "warn" and "SIGILL" in warn.detail
    monkeypatch.setattr(hostcpu, "isa", lambda: {f: f not in ("amx_tile", "amx_bf16", "amx_int8") for f in
                                                 hostcpu.ISA_FLAGS})
    assert doctor.check_cpu(ModelSpec(tiny={}), vllm).status == "ok"  # no AMX: nothing to warn about


def test_table_lists_every_check():
    text = doctor.table([doctor.Check("a", "ok", "fine", 1.0), doctor.Check("bb", "fail", "broken", cached="x")])
    lines = text.splitlines()
    assert lines[0].split() == ["check", "result", "detail"] and "ok (1 s)" in lines[1] and "broken [cached x]" in lines[2]
