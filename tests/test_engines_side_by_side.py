"""The same model under the same load on two engines, side by side: the H200 recordings of SGLang 0.5.17
(data/reference/sglang-h200) and vLLM 0.26 (data/reference/vllm-h200) share the model shape and the load, so a store
holding both says which engine serves that model better at each level, with intervals, in the summary (99)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from servescope.analysis.engines import side_by_side, table, words
from servescope.report import run_suite
from servescope.store import Store

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def both(tmp_path_factory) -> Path:
    """One store holding both recordings' complete points."""
    store = tmp_path_factory.mktemp("both") / "store"
    store.mkdir()
    for ref in ("sglang-h200", "vllm-h200"):
        for p in (ROOT / "data" / "reference" / ref / "store").iterdir():
            if not p.name.startswith("_"):
                shutil.copytree(p, store / p.name)
    return store


def test_sglang_serves_the_h200_model_better_than_vllm_at_every_level(both):
    """Known answer recorded on the H200: SGLang 0.5.17's best graph mode beats vLLM 0.26's at c=1, 8 and 32 (-30%,
    -40%, -29% for vLLM; each 90% interval below zero), each side's best of the configurations it measured 3 times or
    more: SGLang's four graph modes; vLLM's four, its eager launch and 07's first combination (which resolved NONE)."""
    from servescope.spec import LoadSpec, ModelSpec
    from servescope.suite import load_suite

    suite = load_suite(ROOT / "data" / "suites" / "vllm-h200.yaml")
    t = side_by_side(Store(both), ModelSpec(**suite.model), LoadSpec(**suite.load))
    assert list(t["concurrency"]) == [1, 8, 32]
    assert set(t["engine_a"]) == {"sglang 0.5.17"} and set(t["engine_b"]) == {"vllm 0.26.0"}
    assert (t["better"] == "sglang 0.5.17").all(), t
    assert (t["ci_high_pct"] < 0).all() and (t["n_a"] >= 3).all() and (t["n_b"] >= 3).all()
    assert set(t["configs_a"]) == {4} and set(t["configs_b"]) == {6}
    said = words(t)
    assert said.startswith("On NVIDIA H200: sglang 0.5.17 serves it better at c=1, 8, 32. Each side is its "
                           "configuration measured 3 or more times: sglang 0.5.17 (its best per level), the best of 4")
    assert len(said.split()) < 90  # a few sentences, the figures in the table
    shown = table(t)
    assert list(shown.columns[:3]) == ["c", "sglang 0.5.17 output_tok_s", "vllm 0.26.0 output_tok_s"]
    assert "card" not in shown and shown["90% CI %"].iloc[0].startswith("-")
    assert set(t["card"]) == {"NVIDIA H200"}


def test_engines_measured_on_different_cards_are_not_compared(both, tmp_path):
    """The same model and load on two engines, but one engine's points on another GPU model: no comparison."""
    import pandas as pd

    store = tmp_path / "store"
    shutil.copytree(both, store)
    for pt in Store(store).points():
        if pt.install is not None and pt.install.distribution == "sglang":
            f = pt.path / "telemetry_gpu_static.parquet"
            pd.read_parquet(f).assign(name="NVIDIA H100 80GB HBM3").to_parquet(f)
    assert side_by_side(Store(store)).empty


def test_one_engine_alone_is_not_compared():
    t = side_by_side(Store(ROOT / "data" / "reference" / "vllm-h200" / "store"))
    assert t.empty and words(t) == ""


def test_the_summary_says_when_the_stores_hold_one_engine(tmp_path):
    """The page with both engines is test_a_suite_compares_against_another_engines_store_it_names's (and
    test_vllm_h200's render, through the suite's own compare_with); without compare_with, one engine alone."""
    import yaml

    raw = yaml.safe_load((ROOT / "data" / "suites" / "vllm-h200.yaml").read_text())
    raw.pop("compare_with", None)  # the store alone: one engine
    (tmp_path / "alone.yaml").write_text(yaml.safe_dump(raw))
    alone = run_suite(tmp_path / "alone.yaml", only=["99"], offline=True, inputs=False,
                      reports_dir=tmp_path / "r2", store_dir=ROOT / "data" / "reference" / "vllm-h200" / "store",
                      run_id="t", progress=False)
    assert "hold no two engines serving this model" in (alone.out_dir / "99_summary.html").read_text()


def test_a_suite_compares_against_another_engines_store_it_names(tmp_path):
    """compare_with: the vLLM recording's suite, pointed at the SGLang recording's store, sets the two engines side by
    side from its own store alone, as the store holding both does; the other store is read, never written."""
    import yaml

    src = ROOT / "data" / "suites" / "vllm-h200.yaml"
    raw = yaml.safe_load(src.read_text())
    raw["compare_with"] = [str(ROOT / "data" / "reference" / "sglang-h200" / "store")]
    suite = tmp_path / "vllm-h200.yaml"
    suite.write_text(yaml.safe_dump(raw))
    other = ROOT / "data" / "reference" / "sglang-h200" / "store"
    before = sorted(p.name for p in other.iterdir())
    store = tmp_path / "store"
    shutil.copytree(ROOT / "data" / "reference" / "vllm-h200" / "store", store)
    done = run_suite(suite, only=["99"], offline=True, inputs=False, reports_dir=tmp_path / "r", store_dir=store, run_id="t",
                     progress=False)
    page = (done.out_dir / "99_summary.html").read_text()
    assert "Engines side by side" in page and "sglang 0.5.17 serves it better" in page
    assert sorted(p.name for p in other.iterdir()) == before


def test_stores_read_together_count_each_point_once(both):
    """Two stores holding the same points (or one point under an alias) give the figures of one store: a repetition
    read twice would narrow the interval."""
    one = side_by_side(Store(both))
    twice = side_by_side([Store(both), Store(both)])
    assert one.equals(twice) and (one["n_a"] >= 3).all()


def test_a_compare_with_that_is_no_store_is_refused_before_anything_launches(tmp_path):
    from servescope.spec import SpecError
    from servescope.suite import load_suite

    suite = tmp_path / "s.yaml"
    suite.write_text("name: s\ncompare_with: [no/such/store]\nnotebooks: [{id: 99_summary}]\n")
    with pytest.raises(SpecError, match="compare_with 'no/such/store' is no store with points"):
        load_suite(suite)


def test_only_the_runs_model_and_load_are_compared(both):
    """The summary compares the engines on its own run's model and load: the recordings' suite model and load give
    the same three levels; 04's timed 3 s levels compare the two engines' defaults (one server each, 3 launches a
    side: no resolved difference at any level, vLLM -21%, -9%, -16%); another model gives nothing."""
    from servescope.spec import LoadSpec, ModelSpec
    from servescope.suite import load_suite

    suite = load_suite(ROOT / "data" / "suites" / "vllm-h200.yaml")
    model, load = ModelSpec(**suite.model), LoadSpec(**suite.load)
    t = side_by_side(Store(both), model, load)
    assert list(t["concurrency"]) == [1, 8, 32] and (t["better"] == "sglang 0.5.17").all()
    timed = side_by_side(Store(both), model, load.model_copy(update={"duration_s": 3.0}))
    assert list(timed["concurrency"]) == [1, 8, 32] and (timed["better"] == "no resolved difference").all()
    assert set(timed["config_a"]) == set(timed["config_b"]) == {"engine defaults"} and (timed["n_b"] == 3).all()
    unfiltered = side_by_side(Store(both))
    assert len(unfiltered) == 6 and unfiltered["load"].nunique() == 2
    other = ModelSpec(**{**suite.model, "tiny": {**suite.model["tiny"], "num_layers": 4}})
    assert side_by_side(Store(both), other, load).empty
