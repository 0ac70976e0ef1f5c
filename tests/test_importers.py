"""Peer benchmark results (vLLM JSON, SGLang JSONL) imported into the summary schema; recorded from real runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from servescope.errors import SpecError
from servescope.load import summarize
from servescope.load.importers import import_bench

FIX = Path(__file__).parent / "fixtures" / "peer_bench"


def test_vllm_bench_serve_json():
    raw = json.loads((FIX / "vllm_bench_serve.json").read_text())
    summary, requests = import_bench(FIX / "vllm_bench_serve.json")
    (s,) = summary.to_dict("records")
    assert s["source"] == "vllm bench serve" and s["point"] == "c=8" and s["mode"] == "closed"
    assert s["completed"] == raw["completed"] == 32 and s["failed"] == 0
    assert s["request_s"] == raw["request_throughput"] and s["output_tok_s"] == raw["output_throughput"]
    assert s["total_tok_s"] == raw["total_token_throughput"]
    assert s["ttft_ms_p50"] == raw["median_ttft_ms"] and s["ttft_ms_p99"] == raw["p99_ttft_ms"]
    assert s["e2e_ms_p90"] == raw["p90_e2el_ms"] and s["tpot_ms_mean"] == raw["mean_tpot_ms"]
    assert len(requests) == 32 and (requests["status"] == "ok").all()
    assert requests["ttft_ms"].tolist() == pytest.approx([t * 1e3 for t in raw["ttfts"]])
    # second method: our own summary over the peer's per-request records gives the peer's percentiles back
    again = summarize(requests.assign(mode="closed", concurrency=8, request_rate=np.inf)).iloc[0]
    assert again["ttft_ms_p50"] == pytest.approx(raw["median_ttft_ms"], rel=1e-6)
    assert again["e2e_ms_p99"] == pytest.approx(raw["p99_e2el_ms"], rel=1e-6)
    assert again["tpot_ms_mean"] == pytest.approx(raw["mean_tpot_ms"], rel=1e-6)


def test_sglang_bench_serving_jsonl_two_runs():
    lines = [json.loads(x) for x in (FIX / "sglang_bench_serving.jsonl").read_text().splitlines()]
    summary, requests = import_bench(FIX / "sglang_bench_serving.jsonl")
    assert summary["source"].unique().tolist() == ["sglang bench_serving"]
    assert summary["point"].tolist() == ["c=2", "c=8"] and summary["concurrency"].tolist() == [2, 8]
    for s, raw in zip(summary.to_dict("records"), lines, strict=True):
        assert s["request_s"] == raw["request_throughput"] and s["e2e_ms_p50"] == raw["median_e2e_latency_ms"]
        assert s["achieved_concurrency"] == raw["concurrency"] and s["failed"] == 0
        assert s["ttft_ms_p99"] == raw["p99_ttft_ms"]
        assert not np.isnan(s["ttft_ms_p90"])  # not reported by 0.4.10; recomputed from its per-request TTFTs
    assert len(requests) == 32 and requests.groupby("point").size().to_dict() == {"c=2": 16, "c=8": 16}


def test_sglang_05_result_keys_map(tmp_path):
    """Keys as SGLang 0.5.23's benchmark/serving.py writes them (read from its source; no 0.5 client runs here)."""
    d = {"backend": "sglang", "request_rate": float("inf"), "max_concurrency": 64, "duration": 10.0, "completed": 100,
         "total_input_tokens": 1000, "total_output_tokens": 5000, "total_output_tokens_retokenized": 5000,
         "request_throughput": 10.0, "input_throughput": 100.0, "output_throughput": 500.0, "total_throughput": 600.0,
         "mean_e2e_latency_ms": 1.0, "median_e2e_latency_ms": 2.0, "p90_e2e_latency_ms": 3.0, "p95_e2e_latency_ms": 4.0,
         "p99_e2e_latency_ms": 5.0, "mean_ttft_ms": 6.0, "median_ttft_ms": 7.0, "p90_ttft_ms": 8.0, "p95_ttft_ms": 9.0,
         "p99_ttft_ms": 10.0, "mean_tpot_ms": 11.0, "median_tpot_ms": 12.0, "p90_tpot_ms": 13.0, "p95_tpot_ms": 14.0,
         "p99_tpot_ms": 15.0, "mean_itl_ms": 16.0, "median_itl_ms": 17.0, "p90_itl_ms": 18.0, "p95_itl_ms": 19.0,
         "p99_itl_ms": 20.0, "concurrency": 55.5}
    path = tmp_path / "sglang05.jsonl"
    path.write_text(json.dumps(d) + "\n")
    (s,) = import_bench(path)[0].to_dict("records")
    assert s["source"] == "sglang bench_serving" and s["concurrency"] == 64 and s["total_tok_s"] == 600.0
    assert [s[f"e2e_ms_{k}"] for k in ("mean", "p50", "p90", "p95", "p99")] == [1, 2, 3, 4, 5]
    assert [s[f"itl_ms_{k}"] for k in ("mean", "p50", "p90", "p95", "p99")] == [16, 17, 18, 19, 20]
    assert s["achieved_concurrency"] == 55.5


def test_not_a_result_file(tmp_path):
    p = tmp_path / "x.json"
    p.write_text('{"hello": 1}')
    with pytest.raises(SpecError, match="not a benchmark result"):
        import_bench(p)
    p.write_text("not json at all")
    with pytest.raises(SpecError, match="neither a JSON object nor JSONL"):
        import_bench(p)
    with pytest.raises(SpecError, match="cannot read"):
        import_bench(tmp_path / "missing.json")
