"""Specs: bad input is a clear SpecError before anything launches."""

from __future__ import annotations

import pytest

from servescope.engines import engine_names, get_engine
from servescope.errors import SpecError, UnknownEngineError
from servescope.spec import EngineSpec, Knobs, LoadSpec, ModelSpec, TinyModelSpec, parse


def test_unknown_engine_names_the_known_ones():
    """The spec holds a name; the registry (which the spec does not import) names the known ones when suites and
    threads look the adapter up, before anything launches (tests/test_report.py, tests/test_experiment.py)."""
    spec = parse(EngineSpec, {"name": "vlm"}, "engine")
    with pytest.raises(UnknownEngineError, match="no engine named 'vlm'.*vllm"):
        get_engine(spec.name)
    assert issubclass(UnknownEngineError, SpecError)
    assert {"vllm", "external"} <= set(engine_names())


@pytest.mark.parametrize("data,msg", [
    ({"concurrency": []}, "concurrency"),
    ({"concurrency": [1, -2]}, "concurrency"),
    ({"num_requests": 0}, "num_requests"),
    ({"endpoint": "responses"}, "endpoint"),
    ({"typo_field": 1}, "typo_field"),
])
def test_load_spec_errors(data, msg):
    with pytest.raises(SpecError, match=msg):
        parse(LoadSpec, data, "load")


def test_model_spec_needs_exactly_one_source():
    with pytest.raises(SpecError, match="exactly one"):
        parse(ModelSpec, {}, "model")
    with pytest.raises(SpecError, match="exactly one"):
        parse(ModelSpec, {"path": "/m", "tiny": {}}, "model")
    with pytest.raises(SpecError, match="top_k"):
        parse(ModelSpec, {"tiny": {"num_experts": 4, "top_k": 8}}, "model")


def test_knobs_label_and_digest():
    assert Knobs().label() == "engine defaults"
    k = Knobs(torch_compile=False, cuda_graph="off")
    assert "torch_compile=False" in k.label() and "cuda_graph=off" in k.label()
    assert k.digest() != Knobs().digest()
    assert TinyModelSpec().digest() == TinyModelSpec().digest()
    with pytest.raises(SpecError, match="cuda_graph"):
        parse(Knobs, {"cuda_graph": "sometimes"}, "knobs")


def test_load_target_is_a_measured_level_and_no_part_of_a_point_key():
    """The target names where headlines are judged: one of the closed-loop levels ('kv' resolved with it), refused
    otherwise, and never in a point's key or a note's (the same points are re-read under another target)."""
    plain = LoadSpec(concurrency=(1, 16, 128), requests_per_slot=3)
    aimed = LoadSpec(concurrency=(1, 16, 128), requests_per_slot=3, target=128)
    assert aimed.key_dump() == plain.key_dump() and aimed.full_dump() == plain.full_dump()
    assert aimed.target_level == 128 and plain.target_level is None
    with pytest.raises(SpecError, match="target 64 must be one of the closed-loop levels"):
        parse(LoadSpec, {"concurrency": [1, 16], "target": 64}, "load")
    kv = LoadSpec(concurrency=(1, 32, "kv"), requests_per_slot=3, target="kv")
    assert kv.target_level is None
    resolved = kv.with_kv(550)
    assert resolved.concurrency == (1, 32, 550) and resolved.target_level == 550
    assert LoadSpec(concurrency=(1, 32, "kv"), requests_per_slot=3, target=32).with_kv(550).target_level == 32
