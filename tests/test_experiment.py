"""measure() and thread 5 end to end on the stub engine: alternation, the store, failures kept apart, offline."""

from __future__ import annotations

import pytest

from servescope.experiment import Config, measure
from servescope.spec import EngineSpec, Knobs, LoadSpec, ModelSpec
from servescope.store import Store
from servescope.threads import torch_compile as t05

LOAD = LoadSpec(concurrency=(1, 4), num_requests=8, output_len=8, warmup_requests=0)
MODEL = ModelSpec(path="stub")


def test_alternating_repetitions_and_store_reuse(tmp_path, stub_engine):
    store = Store(tmp_path)
    cfgs = [Config("a", Knobs()), Config("b", Knobs(torch_compile=False))]
    res = measure(EngineSpec(**stub_engine), MODEL, cfgs, LOAD, repetitions=3, store=store, say=lambda m: None)
    assert res.errors.empty
    order = res.points.sort_values("started_unix")[["config", "rep"]].values.tolist()
    assert order == [["a", 0], ["b", 0], ["b", 1], ["a", 1], ["a", 2], ["b", 2]]
    assert set(res.summary["concurrency"]) == {1, 4} and len(res.summary) == 12
    assert (res.summary["completed"] == 8).all()
    said: list[str] = []
    again = measure(EngineSpec(**stub_engine), MODEL, cfgs, LOAD, repetitions=3, store=store, say=said.append)
    assert all("from store" in m for m in said) and len(said) == 6
    assert again.summary["output_tok_s"].tolist() == res.summary["output_tok_s"].tolist()


def test_failing_config_is_recorded_and_others_complete(tmp_path, stub_engine):
    store = Store(tmp_path)
    cfgs = [Config("good", Knobs()), Config("bad", Knobs(extra_args=("--mode", "exit")))]
    res = measure(EngineSpec(**stub_engine), MODEL, cfgs, LOAD, repetitions=1, store=store, say=lambda m: None)
    assert set(res.summary["config"]) == {"good"}
    assert res.errors["config"].tolist() == ["bad"]
    assert res.errors["error_type"].iloc[0] == "ServerExitedError"
    key = res.errors["key"].iloc[0]
    failed = store.failed_attempts(key)
    assert len(failed) == 1 and (failed[0] / "server.stderr.log").read_text().count("fatal") == 1
    assert not store.has(key)


def test_offline_reads_store_and_reports_missing(tmp_path, stub_engine):
    store = Store(tmp_path)
    cfg = [Config("a", Knobs())]
    measure(EngineSpec(**stub_engine), MODEL, cfg, LOAD, repetitions=1, store=store, say=lambda m: None)
    res = measure(EngineSpec(**stub_engine), MODEL, cfg, LOAD, repetitions=2, store=store, offline=True,
                  say=lambda m: None)
    assert res.summary["rep"].unique().tolist() == [0]
    assert res.errors["error_type"].tolist() == ["NotMeasuredError"]


def test_thread05_finds_known_effect(tmp_path, stub_engine):
    """The stub streams 4x slower per token when torch_compile=False: the thread must say compile helps."""
    load = {"concurrency": [1, 4], "num_requests": 8, "output_len": 16, "warmup_requests": 0}
    res = t05.run(stub_engine, {"path": "stub"}, load, repetitions=3, store_dir=str(tmp_path))
    eff = t05.effects(res)
    tok = eff[eff["metric"] == "output_tok_s"]
    assert (tok["effect_pct"] > 50).all() and (tok["n_pairs"] == 3).all()
    (f,) = t05.findings(res)
    assert f.confidence == "high" and f.effect.value_pct > 50 and f.effect.n == 3
    assert f.claim.startswith("torch.compile helps")
    assert f.recommended_flags == []
    assert t05.plot(res) is not None and t05.plot_effects(res) is not None


def test_thread05_bad_input_fails_before_launch(tmp_path):
    with pytest.raises(Exception, match="no engine named 'sglangx'"):
        t05.run({"name": "sglangx"}, {"tiny": {}}, {}, store_dir=str(tmp_path))
    with pytest.raises(Exception, match="concurrency"):
        t05.run({"name": "vllm"}, {"tiny": {}}, {"concurrency": [0]}, store_dir=str(tmp_path))
    assert not any(tmp_path.iterdir())


def test_thread05_nothing_measured_says_so(tmp_path, stub_engine):
    res = t05.run(stub_engine, {"path": "stub"}, {"concurrency": [1]}, repetitions=1, store_dir=str(tmp_path),
                  offline=True)
    (f,) = t05.findings(res)
    assert not f.applies and f.confidence == "none" and f.effect is None
    assert "NotMeasuredError" in f.reason


def test_store_keys_of_defaults_are_stable():
    """Changing a spec default changes what stored points mean: this pins the defaults' key.

    If it fails, you changed a default of Knobs/LoadSpec/ModelSpec/TinyModelSpec; put the old value back and add
    a new field instead, or re-record data/reference (see its README) and update the key here."""
    from servescope.experiment import point_parts

    parts = point_parts(EngineSpec(), ModelSpec(tiny={}), Knobs(), LoadSpec(), 0)
    assert parts["knobs"] == {} and parts["load"] == {}
    assert Store.key(parts) == "193031dbb2a2aefd"  # float32 tiny model since issue 10
