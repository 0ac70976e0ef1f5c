"""The real-size case on vLLM 0.26 (data/reference/vllm-qwen3-30b, recorded on an H100 through benchmarks/gpu/on_gpu.py
with data/suites/vllm-qwen3-30b.yaml): the Qwen3-30B-A3B architecture with vLLM's own random weights, deployed with
--enforce-eager, under a steady load of mixed lengths at c=1, 16 and 128.

Known answers from real hardware, three repetitions of each side: piecewise graphs (inside compile, which the
thread's arm turns on over the eager deployment) far ahead at every level, answering as eager does, verified by 07
(dropping --enforce-eager); the top level fills vLLM's KV cache."""

from __future__ import annotations

from pathlib import Path

from recordings import graph_study
from servescope.store import Store
from servescope.threads import graph_modes as t02

ROOT = Path(__file__).resolve().parents[1]
REF = ROOT / "data" / "reference" / "vllm-qwen3-30b"


def test_the_piecewise_arm_ran_with_compile_over_the_eager_deployment():
    pts = list(Store(REF / "store").points())
    knobs = sorted((pt.parts["knobs"].get("cuda_graph") or "", pt.parts["knobs"]["torch_compile"]) for pt in pts)
    assert knobs == [("", False)] + [("off", False)] * 2 + [("piecewise", True)] * 3
    for pt in pts:
        cmd = pt.target["command"]
        assert "--load-format dummy" in cmd and "--max-model-len 8192" in cmd and pt.install.version == "0.26.0"
        assert ("--enforce-eager" in cmd) == (pt.parts["knobs"]["torch_compile"] is False)
        s = pt.table("summary")
        assert set(s["figures_over"]) == {"steady window"} and s["filled"].all(), pt.key


def test_three_repetitions_resolve_the_gain_of_graphs_with_compile_and_its_outputs_are_the_same(tmp_path):
    gs = graph_study("vllm-qwen3-30b", tmp_path, modes=("piecewise",),
                     baseline={"torch_compile": False, "mem_fraction": 0.88})
    fs = t02.findings(gs)
    head = fs[0]
    assert head.title == "Use CUDA graphs: piecewise" and head.confidence == "high"
    per = next(f for f in fs if f.title.startswith("CUDA graphs piecewise"))
    assert per.effect.n == 3 and per.effect.ci_low_pct > 200 and per.confidence == "high"
    assert per.evidence["outputs"]["outputs"] == "same"
    assert "also turns torch.compile on: vllm runs piecewise graphs only so" in per.detail
    # compile is part of what the arm asked for, not a control that slipped: no "also differed" caveat
    assert "also differed" not in per.detail and "also differed" not in per.headline


def test_07_verifies_dropping_enforce_eager_from_02s_launches():
    from servescope.findings import read_findings

    fs = read_findings(REF / "report" / "07_verified_changes.findings.json")
    head = fs[0]
    assert head.title.startswith("Verified: the recommended changes together") and head.confidence == "high"
    assert head.effect.n == 3 and head.effect.ci_low_pct > 200
    assert "drop --enforce-eager" in (head.change.words if head.change else "") or \
        "--enforce-eager" in head.headline


def test_the_top_level_fills_the_kv_cache():
    for pt in Store(REF / "store").points():
        m = pt.table("telemetry_server_metrics")
        kv = m[m["metric"] == "vllm:kv_cache_usage_perc"].groupby("phase")["value"].max()
        assert kv["c=128"] > 0.95 and kv["c=16"] < 0.5, pt.key


def test_the_kv_level_of_this_deployment_is_read_from_its_stored_launch(tmp_path):
    """vLLM 0.26 said 108,080 tokens on the H100: at 1,024 in and 256 out that is 84 requests, below the c=128 that
    queued; offline, from the deployment's stored point, no launch."""
    import shutil

    from servescope import nb
    from servescope.suite import load_suite

    s = load_suite(ROOT / "data" / "suites" / "vllm-qwen3-30b.yaml")
    shutil.copytree(REF / "store", tmp_path / "store")
    ctx = nb.context(s.engine, s.model, {**s.load, "concurrency": [1, 16, "kv"]}, store_dir=str(tmp_path / "store"),
                     offline=True, deployment=s.deployment)
    assert ctx.load.concurrency == (1, 16, 84)
    assert ctx.kv_level["kv_tokens"] == 108_080 and ctx.kv_level["from_point"] == "85a4e5ee712b4f28"


def test_thread_01_names_the_flag_and_the_deployment_it_was_asked_for():
    from servescope.findings import read_findings

    (cause,) = [f for f in read_findings(REF / "report" / "01_cuda_graph_disable_reason.findings.json")
                if f.kind == "cause"]
    assert "`--enforce-eager` turns off decode and prefill graphs" in cause.headline
    assert "Requested: the suite's deployment (torch_compile=False, mem_fraction=0.88; flags --max-model-len 8192)" \
        in cause.detail


def test_a_graphed_decode_at_one_request_is_latency_bound_not_compute_bound():
    """vLLM with piecewise graphs at c=1 on the H100: NVML 'utilization' ~100% and no host gap, yet SMs active ~44%,
    tensor pipes ~2%, DRAM ~39% of peak: kernels back to back, none filling the GPU. The eager deployment at c=1 is
    host-bound, and both sides at c=128 (KV full) are what they were."""
    from servescope import nb
    from servescope.experiment import read_store
    from servescope.study import Study
    from servescope.suite import load_suite

    s = load_suite(ROOT / "data" / "suites" / "vllm-qwen3-30b.yaml")
    ctx = nb.context(s.engine, s.model, s.load, store_dir=str(REF / "store"), offline=True, deployment=s.deployment)
    t = Study("03", ctx, [], read_store(ctx.store)).regimes(per_rep=True)
    got = [(r.config, r.point, r.regime) for r in t.itertuples()]
    assert [v for c, p, v in got if "piecewise" in c and p == "c=1"] == ["latency-bound"] * 3, got
    assert {v for c, p, v in got if "piecewise" not in c and p == "c=1"} == {"host-bound"}
    assert {v for c, p, v in got if "piecewise" in c and p == "c=128"} == {"memory-bandwidth-bound"}


def test_sides_measured_on_different_cards_are_not_a_verified_effect(tmp_path):
    """The same store with one eager repetition relabelled as run on an H200: the comparison says the sides ran on
    different GPU models and does not call the effect resolved beyond low."""
    import pandas as pd

    gs = graph_study("vllm-qwen3-30b", tmp_path, modes=("piecewise",),
                     baseline={"torch_compile": False, "mem_fraction": 0.88})
    pt = Store(tmp_path / "store").get("294bc7968c1bd8fc")
    f = pt.path / "telemetry_gpu_static.parquet"
    pd.read_parquet(f).assign(name="NVIDIA H200").to_parquet(f)
    gs = t02.run(gs.study.ctx, ceiling=False, only=("piecewise",))  # read again, over the relabelled point
    per = next(f for f in t02.findings(gs) if f.title.startswith("CUDA graphs piecewise"))
    assert per.confidence == "low" and "ran on different GPU models" in per.detail + per.headline


def test_the_change_document_deploys():
    """07's document for dropping --enforce-eager: both launch commands paste into bash as one command each, and it
    gives the per-level gain with its interval and p50/p99 latencies, the KV capacity and startup cost the engine's
    own log and the launches show, the output check and the counters to watch."""
    import re
    import shlex

    (doc,) = sorted((REF / "report" / "changes").glob("*.md"))
    text = doc.read_text()
    before, after = re.findall(r"```bash\n(.*?)\n```", text, flags=re.S)
    assert "--enforce-eager" in shlex.split(before) and "--enforce-eager" not in shlex.split(after)
    assert shlex.split(after)[-2:] == ["--compilation-config", '{"cudagraph_mode": "FULL_AND_PIECEWISE"}']
    for part in ("## Measured", "## What it costs", "## Output check", "## What to watch after deploying",
                 "| c | output tok/s | effect (90% CI) | TTFT p50 / p99 ms | TPOT p50 / p99 ms |",
                 "at c=1 to 128 (the range it was measured on",
                 "KV cache (the engine's own token capacity, from its startup log): 108,080 tokens before, 100,896 "
                 "after (-6.6%)", "Startup (launch to first token):",
                 "`vllm:kv_cache_usage_perc`", "`vllm:num_requests_waiting`", "answers as the baseline does"):
        assert part in text, part
    assert re.search(r"\| 128 \| 1,139 -> 2,404 \| \+111\.0% \(\+50\.0\.\.\+162\.1%\) \|", text)


def _verified_under(slo: dict, tmp_path: Path):
    """07 rendered offline from the recorded store, the suite's load given an SLO."""
    import shutil

    from servescope import nb
    from servescope.findings import collect
    from servescope.suite import load_suite
    from servescope.threads import verify as t07

    suite = load_suite(ROOT / "data" / "suites" / "vllm-qwen3-30b.yaml")
    if not (tmp_path / "store").exists():
        shutil.copytree(REF / "store", tmp_path / "store")
    ctx = nb.context(suite.engine, suite.model, {**suite.load, "slo_ms": slo}, repetitions=3, max_repetitions=3,
                     offline=True, store_dir=str(tmp_path / "store"), deployment=suite.deployment,
                     baseline=suite.baseline_knobs, telemetry=suite.telemetry)
    v = t07.run(ctx, collect(REF / "report"))
    return v, t07.findings(v)


def test_an_slo_reads_the_same_store_and_the_change_document_gives_goodput(tmp_path):
    """An SLO is how the deployment is judged, not what was measured: set on the recorded suite, it names no new
    point (07 renders offline from the same store) and each level's goodput is judged again from the stored requests.
    Known answer at TTFT <= 2 s and TPOT <= 50 ms: eager decodes at 50 ms or more per token, so no request of the
    deployment met it at any level; goodput has no ratio and the verdict stays on output tok/s, saying why."""
    import re

    from servescope.spec import LoadSpec
    from servescope.suite import load_suite
    from servescope.threads import change_docs

    suite = load_suite(ROOT / "data" / "suites" / "vllm-qwen3-30b.yaml")
    slo = {"ttft_ms": 2000, "tpot_ms": 50}
    with_slo, without = LoadSpec.model_validate({**suite.load, "slo_ms": slo}), LoadSpec.model_validate(suite.load)
    assert with_slo.key_dump() == without.key_dump()
    # notes (a search's kept settings, probes) are keyed by the whole load, the SLO at its default as they were
    # written: an SLO, or none, reads the same notes
    assert with_slo.full_dump() == without.full_dump() and without.full_dump()["slo_ms"] == {}
    v, fs = _verified_under(slo, tmp_path)
    head = fs[0]
    assert head.title.startswith("Verified: the recommended changes together") and head.effect.metric == "output_tok_s"
    assert "Judged on output tok/s, not goodput under the SLO (ttft_ms<=2000, tpot_ms<=50): at every level a side " \
           "met the SLO for no request" in head.claim
    s = v.study.results.summary
    good = s.groupby("config")["goodput_req_s"].median()
    assert good["baseline"] == 0 and good["combined"] > 0 and set(s["slo"]) == {"ttft_ms<=2000, tpot_ms<=50"}
    (text,) = change_docs.documents(v, fs).values()
    assert "| goodput req/s (ttft_ms<=2000, tpot_ms<=50) |" in text
    assert re.search(r"\| 1 \| .*\| 0\.00 -> \d+\.\d\d \|\n", text)


def test_with_an_slo_both_sides_meet_the_verdict_is_on_goodput(tmp_path):
    """TPOT <= 100 ms: both sides met it at every level, so the verification is judged on goodput (requests per
    second within the SLO) over every level; at TTFT <= 5 s and TPOT <= 150 ms the deployment met it for no request
    at c=128 in a repetition: that level is left out of the goodput headline and named."""
    v, fs = _verified_under({"tpot_ms": 100}, tmp_path)
    head = fs[0]
    assert head.effect.metric == "goodput_req_s" and head.confidence == "high"
    assert head.title.startswith("Verified: the recommended changes together, +") and head.title.endswith("% goodput")
    assert head.effect.at == "mean over c=1, 16, 128" and head.effect.ci_low_pct > 0
    assert "Goodput: the requests per second that met the SLO (tpot_ms<=100)" in head.claim
    v, fs = _verified_under({"ttft_ms": 5000, "tpot_ms": 150}, tmp_path)
    head = fs[0]
    assert head.effect.metric == "goodput_req_s" and "c=128 left out: a side met the SLO for no request there" in \
        head.effect.at
    assert "c=128:" not in head.claim.split("Per level, ratio of medians")[1].split(".")[0]


def test_a_host_bound_launch_without_graphs_is_pointed_at_graphs_first():
    """03 at c=128: the eager deployment is host-bound; its advice reads the launch's resolved state (no CUDA
    graphs) and sends the reader to graphs first, with the flags that turn them on; the graphed launch, bound by DRAM
    there, gets no such line."""
    from servescope.findings import read_findings
    from servescope.threads.clocks_power import GRAPHS_OFF_ACTION

    fs = {f.title: f for f in read_findings(REF / "report" / "03_clocks_power.findings.json")}
    eager = fs["the deployment at c=128: host-bound"]
    assert GRAPHS_OFF_ACTION in eager.detail and "cut host work per step" in eager.detail
    graphed = next(f for t, f in fs.items() if t.startswith("cuda_graph=piecewise") and t.endswith("c=128: "
                                                                                                  "memory-bandwidth-bound"))
    assert GRAPHS_OFF_ACTION not in graphed.detail


def test_99_sets_vllm_beside_sglang_on_the_same_card():
    """compare_with names SGLang's H100 store: vLLM's graphed configuration 11.1% behind SGLang's at c=128 (KV full),
    three launches a side."""
    import re

    page = re.sub(r"<[^>]+>", "", (REF / "report" / "99_summary.html").read_text())
    assert "On NVIDIA H100 80GB HBM3: sglang 0.5.17 serves it better at c=1, 128" in page and "-11.1" in page


def test_the_baseline_is_spelled_as_it_was_launched_where_the_engine_is_not_here():
    """Offline on a machine without vLLM, 07's answer names the baseline in the flags its launch carried (the user's
    --enforce-eager), not only in the suite's knob words; the deployment's own extra flag is left out."""
    from servescope.findings import read_findings

    head = read_findings(REF / "report" / "07_verified_changes.findings.json")[0]
    assert head.verdict.words.endswith("against the baseline torch_compile=False, mem_fraction=0.88 (`--enforce-eager "
                                       "--gpu-memory-utilization 0.88`)")
