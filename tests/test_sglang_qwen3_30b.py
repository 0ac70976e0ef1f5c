"""The seed's case at real size (data/reference/sglang-qwen3-30b, recorded cold on an H200 through
benchmarks/gpu/on_gpu.py with data/suites/sglang-qwen3-30b.yaml): SGLang 0.5.17 serving the Qwen3-30B-A3B
architecture with its own random weights, deployed with CUDA graphs off by flag, under a steady load of mixed lengths
at c=1, 16 and 128.

Known answer from real hardware: SGLang 0.5.17's default graphs (decode full, prefill breakable) against the seed's
graphs-off launch, three alternating repetitions each, every one answering the output check as graphs off does."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from recordings import graph_study
from servescope.findings import read_findings
from servescope.store import Store
from servescope.threads import graph_modes as t02

ROOT = Path(__file__).resolve().parents[1]
REF = ROOT / "data" / "reference" / "sglang-qwen3-30b"
PIECEWISE = ["--cuda-graph-backend-decode", "full", "--cuda-graph-backend-prefill", "breakable"]
OFF = ["--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"]


def test_every_point_is_the_real_size_deployment_under_a_steady_load():
    pts = list(Store(REF / "store").points())
    assert len(pts) == 6
    for pt in pts:
        assert pt.parts["model"]["architecture"] == "qwen3-30b-a3b"
        knobs = pt.parts["knobs"]
        assert knobs["mem_fraction"] == 0.88 and knobs["extra_args"] == ["--cuda-graph-max-bs-prefill", "2048"]
        assert "--load-format dummy" in pt.target["command"] and pt.install.version == "0.5.17"
        s = pt.table("summary")
        assert set(s["figures_over"]) == {"steady window"} and s["filled"].all(), pt.key
        busy = s[s["concurrency"] > 1]  # c=1 sends three requests: its means are three draws
        assert (busy["mean_input_tokens"] > 800).all() and (busy["mean_output_tokens"] > 150).all()
        req = pt.table("requests")
        assert req.loc[req["phase"] == "measure", "input_tokens"].nunique() > 20  # mixed lengths, not one wave
        assert not pt.table("output_check").empty
    assert {pt.manifest["output_check"]["prompts"] for pt in pts} == {6}


def test_graphs_against_the_seeds_launch_help_at_every_level_and_answer_the_same(tmp_path):
    gs = graph_study("sglang-qwen3-30b", tmp_path, modes=("piecewise",),
                     baseline={"cuda_graph": "off", "mem_fraction": 0.88})
    fs = t02.findings(gs)
    head = fs[0]
    assert head.title == "Use CUDA graphs: piecewise" and head.confidence == "high"
    assert head.change.flags == PIECEWISE and head.change.drop_flags == OFF
    assert head.effect.n == 3 and head.effect.ci_low_pct > 200
    per = next(f for f in fs if f.title.startswith("CUDA graphs piecewise"))
    levels = {k: v for k, v in per.evidence["effects"].items() if k.startswith("output_tok_s@")}
    assert levels["output_tok_s@c=1"]["ci_low_pct"] > 500  # launch overhead of 48 layers at one request
    assert 30 < levels["output_tok_s@c=128"]["effect_pct"] < 120  # what is left at a full batch
    assert all(v["confidence"] == "high" for v in levels.values())
    assert per.evidence["outputs"]["outputs"] == "same" and "answers as off does" in per.claim
    assert gs.study.output_verdict("piecewise", "off").spread < 1e-3  # random weights: near-uniform, said so


def test_a_target_level_judges_the_same_points_there(tmp_path):
    """An engineer who serves at c=128 names it: the same stored launches give the gain at that level (about +63%,
    where the mean over the levels is +286%), said as the target's, and the repetitions still resolve it."""
    gs = graph_study("sglang-qwen3-30b", tmp_path, modes=("piecewise",), load={"target": 128},
                     baseline={"cuda_graph": "off", "mem_fraction": 0.88})
    head = t02.findings(gs)[0]
    assert head.title == "Use CUDA graphs: piecewise" and head.confidence == "high"
    assert head.effect.n == 3 and 40 < head.effect.value_pct < 100 and head.effect.ci_low_pct > 30
    assert head.effect.at == "at c=128, the target"
    assert "at c=128, the target" in head.headline


def test_the_front_page_opens_with_the_verified_change_and_its_output_check():
    index = (REF / "report" / "index.html").read_text()
    assert "Verified: +286.1% output_tok_s (90% CI +246.5..+330.3%, n=3" in index
    assert "random weights of the Qwen3-30B-A3B architecture" in index
    (v, *_) = read_findings(REF / "report" / "07_verified_changes.findings.json")
    assert v.confidence == "high" and v.change.drop_flags == OFF
    assert "Outputs: combined answers as baseline does" in v.claim
    (cause,) = [f for f in read_findings(REF / "report" / "01_cuda_graph_disable_reason.findings.json")
                if f.kind == "cause"]
    assert cause.title == "CUDA graphs are off because of the launch's own flag"


def test_the_top_level_regime_is_decided_for_both_sides():
    fs = read_findings(REF / "report" / "03_clocks_power.findings.json")
    titles = {f.title for f in fs}
    assert "the deployment at c=128: host-bound" in titles  # the scheduler thread saturated, kernels 53% of the time
    assert "cuda_graph=piecewise at c=128: memory-bandwidth-bound" in titles
    assert not any("undecided" in t for t in titles)
    summary = pd.read_parquet(next((REF / "store").glob("*/summary.parquet")))
    assert summary["steady_window_s"].min() > 5  # no level over after a few readings


def test_the_engines_counters_stand_beside_nvml_and_their_disagreements_are_said():
    from servescope import nb
    from servescope.queries import stored_points
    from servescope.study import Study
    from servescope.suite import load_suite

    s = load_suite(ROOT / "data" / "suites" / "sglang-qwen3-30b.yaml")
    ctx = nb.context(s.engine, s.model, s.load, store_dir=str(REF / "store"), offline=True, deployment=s.deployment,
                     telemetry=s.telemetry)
    t = Study("03", ctx, [], stored_points(ctx)).engine_beside_gpu().set_index(["config", "rep", "point"])
    off, pw = t.loc[("the deployment", 0, "c=128")], t.loc[("cuda_graph=piecewise", 0, "c=1")]
    # SGLang's own count of graphed passes (a rate needs ten scrapes: c=1 with graphs lasted 2.6 s and has none)
    assert off["graph_pass_pct"] == 0 and t.loc[("cuda_graph=piecewise", 0, "c=16"), "graph_pass_pct"] > 95
    assert off["kv_capacity_tokens"] == 715543 and 10 < off["kv_used_pct"] < 30  # the KV cache was not full
    assert off["running"] >= 120 and off["queued"] == 0
    # one request in graphs keeps NVML at 100% while the SMs are active 38% of the time: said, not taken for busy
    assert "NVML reads the GPU 100% utilized while its SMs were active 38%" in pw["said"]


def test_the_h100_store_holds_the_same_points_on_its_own_card():
    """data/reference/sglang-qwen3-30b-h100: the same deployment, model and load on an H100. Its keys are the H200
    store's (keys do not name the card), which is why it is a store of its own; the card is read from NVML per point,
    and the engines side by side never mix cards."""
    h100 = [pt for pt in Store(ROOT / "data" / "reference" / "sglang-qwen3-30b-h100" / "store").points()
            if len(pt.parts["load"]["concurrency"]) == 3  # 02's launches; the H100's search points hold c=128 only
            and pt.parts["knobs"]["cuda_graph"] in ("off", "piecewise")]  # the modes both stores hold
    h200 = {pt.key: pt for pt in Store(REF / "store").points()}
    assert {pt.key for pt in h100} <= set(h200)
    pt = next(pt for pt in h100 if pt.parts["rep"] == 0 and pt.parts["knobs"]["cuda_graph"] == "off")
    assert pt.card == "NVIDIA H100 80GB HBM3" and h200[pt.key].card == "NVIDIA H200"
    assert "--cuda-graph-backend-decode disabled" in pt.target["command"] and pt.install.version == "0.5.17"
    s = pt.table("summary").set_index("concurrency")
    assert list(s.index) == [1, 16, 128] and s["filled"].all()
    # graphs off on the H100 machine ran below the H200 machine at every level (host-bound: the CPUs differ)
    s200 = h200[pt.key].table("summary").set_index("concurrency")
    assert (s["output_tok_s"] < s200["output_tok_s"]).all()
