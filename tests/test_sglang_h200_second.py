"""The second cold recording of the seed's case on SGLang 0.5.17 on the H200 (data/reference/sglang-h200-second,
recorded through benchmarks/gpu/on_gpu.py with data/suites/sglang-h200-second.yaml): 02's headline and 07's verified
first change hold.

Known answer from real hardware: every graph mode that served beat graphs off by +400% or more in both recordings
(high), but the order of the three modes that served flipped (first: piecewise +532%, decode only +414%, compiled
piecewise +405%; second: compiled piecewise +507%, piecewise +452%, decode only +439%), with every head-to-head of the
second unresolved. Picking the largest point estimate made the second recording verify another first change
(compiled piecewise); the pick among modes not told apart now follows a fixed rule (the engine's default), and both
recordings verify piecewise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recordings import graph_study
from servescope.engines import get_engine
from servescope.engines.base import EngineInstall
from servescope.findings import collect, read_findings
from servescope.summary import rank, recommendations
from servescope.threads import graph_modes as t02
from servescope.threads import verify

ROOT = Path(__file__).resolve().parents[1]
FIRST, SECOND = (ROOT / "data" / "reference" / n for n in ("sglang-h200", "sglang-h200-second"))
PIECEWISE = ["--cuda-graph-backend-decode", "full", "--cuda-graph-backend-prefill", "breakable"]
SEED = ["--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"]  # cuda_graph=off on 0.5.17


@pytest.fixture(scope="module")
def second(tmp_path_factory) -> t02.GraphStudy:
    return graph_study("sglang-h200-second", tmp_path_factory.mktemp("second"))


def test_the_second_recording_picks_the_engines_default_of_modes_it_cannot_tell_apart(second):
    head = t02.findings(second)[0]
    assert head.title == "Use CUDA graphs: piecewise" and head.confidence == "high"
    assert head.recommended_flags == PIECEWISE
    ev = head.evidence
    # the largest point estimate was compiled piecewise; no head-to-head resolved it over the other two
    assert ev["largest_gain"] == "compiled_piecewise" and ev["chosen_by"] == "engine default"
    assert ev["tied"] == ["compiled_piecewise", "piecewise", "decode_only"]
    assert [h["confidence"] for h in ev["head_to_head"]] == ["low", "low"]
    assert "follows a fixed rule, not this run's noise: piecewise, the engine's own default on 0.5.17" in head.claim
    assert head.effect.n == 3 and head.effect.ci_low_pct > 100  # +452% (90% CI +220..+852%)


def test_without_an_engine_default_the_least_machinery_is_picked(second, monkeypatch):
    """Where the adapter knows no default (or it is not among the tied), the pick is the mode with the fewest graphs
    and no compile, still never the point estimate."""
    monkeypatch.setattr(type(second.study.adapter), "default_graph_mode", lambda self, install: None)
    head = t02.findings(second)[0]
    assert head.title == "Use CUDA graphs: decode_only" and head.evidence["chosen_by"] == "least machinery"


def test_the_first_recording_resolved_its_pick_head_to_head(tmp_path):
    """The first recording's piecewise led both other modes head to head (high), so its pick is the largest gain."""
    head = t02.findings(graph_study("sglang-h200", tmp_path))[0]
    assert head.title == "Use CUDA graphs: piecewise" and head.evidence["chosen_by"] == "largest gain"
    assert head.evidence["tied"] == ["piecewise"]
    assert [h["confidence"] for h in head.evidence["head_to_head"]] == ["high", "high"]


@pytest.mark.parametrize("ref", [FIRST, SECOND], ids=["first", "second"])
def test_both_recordings_rank_and_verify_the_same_first_change(ref):
    """From each committed report: 07 composes 02's pick (the modes it did not pick rank after it, whatever their
    point estimates), verifies it against the seed's graphs-off launch (high), and 99 ranks it first."""
    by_thread = collect(ref / "report")
    first = verify.changes(by_thread)[0]
    assert first.flags == PIECEWISE and first.alternative_of == ""
    assert all(c.alternative_of == "piecewise" for c in verify.changes(by_thread)[1:] if c.thread == t02.THREAD
               and c.knobs != first.knobs)
    (v, *_) = read_findings(ref / "report" / "07_verified_changes.findings.json")
    assert v.title.startswith("Verified: the recommended changes together") and v.confidence == "high"
    assert v.recommended_flags == PIECEWISE and v.effect.ci_low_pct > 100
    recs = recommendations(rank(by_thread))
    assert recs.iloc[0]["change"] == " ".join(PIECEWISE) + "; drop " + " ".join(SEED)
    (summary,) = read_findings(ref / "report" / "99_summary.findings.json")
    assert summary.title == "First change: Use CUDA graphs: piecewise"


def test_the_second_recording_is_its_own_cold_run():
    """Its store holds no point of the first's recording run: every launch was its own, on 2026-12-03, after the
    first recording's piecewise launches of 02 (the first store has later piecewise launches with a scheduler knob
    set: 07's search, recorded after this one)."""
    started = [json.loads(m.read_text())["started_unix"] for m in (SECOND / "store").glob("*/manifest.json")]
    first = [json.loads(m.read_text()) for m in (FIRST / "store").glob("*/manifest.json")]
    scheduler = ("max_running_requests", "num_continuous_decode_steps", "chunked_prefill_size", "cuda_graph_max_bs")
    graphs_02 = [m["started_unix"] for m in first if m["target"]["knobs"].get("cuda_graph") == "piecewise"
                 and not any(m["target"]["knobs"].get(k) is not None for k in scheduler)]
    assert len(started) == 12 and len(graphs_02) >= 3 and min(started) > max(graphs_02)
    assert not set(started) & {m["started_unix"] for m in first}  # no launch read from the first store
    (env,) = read_findings(SECOND / "report" / "00_environment.findings.json")
    assert "sglang 0.5.17 (cuda) on 1 x NVIDIA H200" in env.claim


@pytest.mark.parametrize(("engine", "version", "platform", "mode"), [
    ("sglang", "0.5.17", "cuda", "piecewise"), ("sglang", "0.5.9", "cuda", "decode_only"),
    ("vllm", "0.26.0", "cuda", "piecewise"), ("vllm", "0.10.2", "cuda", None), ("vllm", "0.32.0", "cpu", None)])
def test_each_engines_default_graph_mode(engine, version, platform, mode):
    install = EngineInstall(python="python3", version=version, distribution=engine, platform=platform)
    assert get_engine(engine).default_graph_mode(install) == mode


def test_sglang_0517s_default_is_what_its_defaults_resolved_to_on_the_h200():
    """The adapter's table against the real thing: every launch of the first recording with no graph flag (04's one
    server) resolved decode=full prefill=breakable, the mode the suite calls piecewise."""
    ad = get_engine("sglang")
    resolved = {json.loads(m.read_text())["resolved"]["graph_mode"]
                for m in (FIRST / "store").glob("*/manifest.json")
                if not json.loads(m.read_text())["target"]["flags"]}
    assert resolved == {"decode=full prefill=breakable"}
    install = EngineInstall(python="python3", version="0.5.17", distribution="sglang", platform="cuda")
    assert ad.expected_state(t02.Knobs(cuda_graph=ad.default_graph_mode(install)))["graph_prefill"] == "piecewise"
