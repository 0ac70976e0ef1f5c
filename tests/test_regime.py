"""Regime verdicts: every regime's known-answer case recorded on an H200 (tests/fixtures/h200/regimes, GPM on; the
nsys captures in tests/fixtures/h200_profiles; the real transformers server in data/reference/h200), plus the
rules that no recording can reach here (thermal and hardware slowdown: the accelerator's settings are not ours to
change) on stated evidence."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from servescope.analysis import regime as rg
from servescope.analysis.telemetry import dcgm_by_point, gpu_by_point, gpu_points, host_by_point
from servescope.context import context
from servescope.experiment import read_store
from servescope.profile.session import open_trace
from servescope.spec import EngineSpec
from servescope.store import Store
from servescope.study import Study
from servescope.telemetry.prom import parse_metrics

ROOT = Path(__file__).resolve().parents[1]
REG = ROOT / "tests" / "fixtures" / "h200" / "regimes"
PROF = ROOT / "tests" / "fixtures" / "h200_profiles"
CASES = ("idle", "host-bound", "launch-bound", "memory-bandwidth-bound", "compute-bound", "power-capped")


def _case(name: str) -> tuple[dict, pd.Series, pd.Series | None, pd.Series, dict]:
    d = REG / name
    case = json.loads((d / "case.json").read_text())
    g = gpu_by_point(pd.read_parquet(d / "gpu.parquet"), pd.read_parquet(d / "gpu_static.parquet")).set_index("phase")
    h = host_by_point(pd.read_parquet(d / "server_procs.parquet"), pd.read_parquet(d / "server_threads.parquet"))
    h = h.set_index("phase")
    load = pd.Series({"completed": case["load"]["requests_completed"], "failed": case["load"]["requests_failed"]})
    trace = rg.trace_evidence(pd.read_parquet(d / "kernels.parquet"), pd.read_parquet(d / "runtime.parquet"),
                              tuple(case["trace_window_ns"]))
    return case, g.loc["load"], h.loc["load"] if "load" in h.index else None, load, trace


@pytest.mark.parametrize("name", CASES)
def test_every_h200_case_gets_its_known_regime(name):
    """All the evidence, and again without the trace (NVML with GPM and the threads alone): same answer."""
    case, gpu, host, load, trace = _case(name)
    assert case["expected_regime"] == name and case["gpu"] == "NVIDIA H200"
    full = rg.decide(rg.point_evidence(gpu, host, load, trace))
    assert (full.regime, full.confidence) == (name, "high"), full.words()
    assert rg.decide(rg.point_evidence(gpu, host, load)).regime == name
    assert full.action and full.thresholds["dram_bw_high_pct"] == 60.0 and full.evidence


def test_gpm_was_read_on_the_h200_and_its_dram_figure_matches_the_bytes_moved():
    """The memory-bound case against the GPU's peak: copies of 4 GiB achieved 87% of the H200's 4.8 TB/s, and GPM's
    DRAM bandwidth said 89% (within 5 points); the compute case shows tensor pipes idle (FP32 on CUDA cores) and
    the bf16 case busy."""
    case, gpu, *_ = _case("memory-bandwidth-bound")
    achieved_pct = 100 * case["achieved_dram_gb_s"] / case["peak_dram_gb_s"]
    assert 80 < achieved_pct < 95 and abs(gpu["dram_bw_util_pct_p50"] - achieved_pct) < 5
    assert gpu["tensor_active_pct_p50"] < 1
    assert _case("compute-bound")[1]["tensor_active_pct_p50"] < 1
    assert _case("power-capped")[1]["tensor_active_pct_p50"] > 80
    assert "gpm" not in json.dumps(case["telemetry_status"]).lower() or "errors" not in case["telemetry_status"]


def test_the_trace_alone_names_what_it_can():
    for name in ("launch-bound", "host-bound", "idle"):
        d = REG / name
        case = json.loads((d / "case.json").read_text())
        r = rg.trace_regime(pd.read_parquet(d / "kernels.parquet"), pd.read_parquet(d / "runtime.parquet"),
                            tuple(case["trace_window_ns"]))
        assert r.regime == name, (name, r.words())


@pytest.mark.parametrize("trace,rng,want", [
    ("launch_bound", "launch_bound", "launch-bound"),  # 2,000 tiny kernels from a Python loop, GPU busy 5%
    ("compute_bound", "compute_bound", "compute-bound"),  # bf16 4096^3 matmuls, busy 97%
    ("transformers_serve_c8_1s", "slice: 1 s of servescope c=8", "host-bound"),  # the real server
])
def test_nsys_captures_recorded_on_the_h200(trace, rng, want):
    p = open_trace(PROF / f"{trace}.sqlite")
    hit = p.nvtx[p.nvtx["text"].astype(str) == rng].iloc[0]
    r = rg.trace_regime(p.kernels, p.runtime, (int(hit.start_ns), int(hit.end_ns)))
    assert r.regime == want, r.words()


def test_kernels_verb_states_the_regime_and_window_edge_idle():
    out = subprocess.run([sys.executable, "-m", "servescope.cli", "kernels",
                          str(PROF / "transformers_serve_c8_1s.sqlite")], capture_output=True, text=True, check=True)
    assert "# regime\nhost-bound:" in out.stdout and "what to try:" in out.stdout
    assert "lead_in_ms" in out.stdout and "tail_ms" in out.stdout


def test_window_edges_are_counted_apart_from_the_gaps():
    """A window 98% idle whose longest between-kernel gap is tiny: the idle sits before and after the kernels."""
    k = pd.DataFrame({"start_ns": [10_000_000 + i * 2_000 for i in range(200)], "device": 0, "graph_node": float("nan")})
    k["end_ns"] = k["start_ns"] + 500
    k["dur_ns"] = 500
    from servescope.analysis.kernels import busy

    b = busy(k, 0, 20_000_000).iloc[0]
    assert b["busy_fraction"] < 0.01 and b["idle_gap_us_max"] < 2
    assert b["lead_in_ms"] == pytest.approx(10.0) and b["tail_ms"] == pytest.approx(20 - 10 - 0.3985, abs=1e-3)
    assert b["lead_in_ms"] + b["tail_ms"] + b["idle_between_ms"] + 200 * 0.0005 == pytest.approx(20.0)


def test_the_real_server_on_the_h200_is_host_bound(tmp_path):
    """The issue's case: transformers serve on the H200 (data/reference/h200), NVML and the server's threads: its
    busiest thread saturated a core while the GPU waited. With the nsys profile of the same level, the trace
    refines it: 36,377 kernels/s of 1.9 us, so graphs (which thread 02 measured at +46..+101%) are the lever."""
    store = Store(ROOT / "data" / "reference" / "h200" / "store")
    st = Study("t", context(EngineSpec(name="transformers"), {"tiny": {}}, store=store), [], read_store(store))
    t = st.regimes(per_rep=True).set_index(["config", "rep", "point"])
    assert (t.loc[("cuda_graph=off", 0, "c=8"), "regime"], t.loc[("cuda_graph=off", 1, "c=8"), "regime"]) == \
        ("host-bound", "host-bound")
    eager = t[t.index.get_level_values("config").str.startswith("cuda_graph=off")
              & ~t.index.get_level_values("config").str.contains("profile")]
    assert (eager.xs("c=1", level="point")["regime"] == "host-bound").all()
    # with full graphs at c=1 the GPU reads 84% busy at 34% of its power, memory controller idle: small kernels
    assert t.loc[("cuda_graph=full", 0, "c=1"), "regime"] == "launch-bound"
    assert t.loc[("cuda_graph=off (+nsys profile)", 0, "c=8"), "regime"] == "launch-bound"


def test_an_under_loaded_point_on_the_h200():
    """Recorded on the H200 (tests/fixtures/h200_underloaded, benchmarks/gpu/run_issue21_h200.sh part b, in git history):
    transformers serve with its defaults at 0.25 requests/s, open loop. Every request completed, the GPU ran kernels
    0% of the time at 18% of its power, no thread near a full core: the offered load was the limit, and the sweep's
    unbounded rate served 17.5x more, where the server read as host-bound."""
    store = Store(ROOT / "tests" / "fixtures" / "h200_underloaded" / "store")
    st = Study("t", context(EngineSpec(name="transformers"), {"tiny": {}}, store=store), [], read_store(store))
    t = st.regimes(per_rep=True).set_index("point")
    low = t.loc["rate=0.25"]
    assert (low["regime"], low["confidence"]) == ("under-loaded", "high")
    assert "rate=inf in this sweep served 17.5x the output tok/s" in low["because"]
    assert low["because"].endswith("the server first read as saturated at rate=inf (host-bound) in this sweep")
    assert "power 18% of the limit" in low["because"] and low["action"].startswith("The offered load was the limit")
    assert t.loc["rate=inf", "regime"] == "host-bound"
    # at 2 req/s the 8 drawn arrivals came out at 1.63 req/s with the client on time: its schedule says it kept up
    assert t.loc["rate=2", "regime"] == "under-loaded"
    gpu = st.gpu_points().set_index("phase")
    assert gpu.loc["rate=0.25", "gpu_util_pct_p50"] == 0 and gpu.attrs.get("gpu") is None


def test_rules_without_a_recording():
    th = rg.RegimeThresholds()
    hot = dict(gpu_util_pct=99.0, power_pct_of_limit=60.0, sm_clock_pct_of_max=70.0, requests_completed=5)
    assert rg.decide(rg.Evidence(**hot, reason_shares={"hw_thermal_slowdown": 0.5})).regime == "thermal-throttled"
    assert rg.decide(rg.Evidence(**hot, reason_shares={"hw_power_brake_slowdown": 0.3})).regime == "hw-slowdown"
    r = rg.decide(rg.Evidence(requests_completed=5, client_limited=True, client_warning="client used 97% of a core"))
    assert r.regime == "client-limited" and "97%" in r.because
    # no GPU and no trace: every GPU regime stays open
    r = rg.decide(rg.Evidence(requests_completed=5, gpu_why_missing="no NVIDIA GPU / NVML"))
    assert r.regime == "undecided" and "compute-bound" in r.candidates and r.confidence == "none"
    # busy, no GPM, memory controller busy: memory-bound at medium confidence, saying what would confirm it
    r = rg.decide(rg.Evidence(gpu_util_pct=100.0, mem_util_pct=95.0, power_pct_of_limit=70.0,
                              sm_clock_pct_of_max=100.0, requests_completed=5))
    assert (r.regime, r.confidence) == ("memory-bandwidth-bound", "medium") and "GPM" in r.missing[0]
    # a waiting GPU with no thread near a core: under-loaded; a higher level that served more makes it sure
    r = rg.decide(rg.Evidence(gpu_util_pct=40.0, busiest_thread_cpu_pct=30.0, requests_completed=5))
    assert (r.regime, r.confidence) == ("under-loaded", "medium") and "higher load level" in r.missing[0]
    r = rg.decide(rg.Evidence(gpu_util_pct=40.0, busiest_thread_cpu_pct=65.0, requests_completed=5, headroom_x=3.0,
                              headroom_point="c=32"))
    assert (r.regime, r.confidence) == ("under-loaded", "high") and "c=32 in this sweep served 3.0x" in r.because
    # a thread between half a core and saturation, and no level that served more: the wait stays open
    r = rg.decide(rg.Evidence(gpu_util_pct=40.0, busiest_thread_cpu_pct=65.0, requests_completed=5))
    assert r.regime == "undecided" and "too little load" in r.because
    # a GPU mostly idle but not below half: not called under-loaded
    assert rg.decide(rg.Evidence(gpu_util_pct=60.0, busiest_thread_cpu_pct=10.0, requests_completed=5)).regime \
        == "undecided"
    assert th.host_saturated_pct == 80.0 and th.underloaded_util_pct == 50.0


def test_a_cpu_server_gets_its_regime_from_its_cores_and_the_sweep():
    """The embedded engine computes on the CPU: a level below one that served 1.5x more is under-loaded (its cores
    read busy either way: vLLM's CPU worker spins), a level with full cores and no such headroom is compute-bound,
    and the under-loaded level names where the sweep first saturated."""
    summary = pd.DataFrame({"config": ["a"] * 3, "rep": [0] * 3, "point": ["c=1", "c=4", "c=16"],
                            "completed": [32] * 3, "failed": [0] * 3, "output_tok_s": [450.0, 500.0, 3400.0]})
    host = pd.DataFrame({"config": ["a"] * 3, "rep": [0] * 3, "phase": ["c=1", "c=4", "c=16"],
                         "server_cpu_pct_p50": [191.0, 194.0, 178.0], "busiest_thread": ["VLLM::Worker"] * 3,
                         "busiest_thread_cpu_pct_p50": [94.0, 93.0, 93.0]})
    got = {i["point"]: r for i, r in rg.point_regimes(summary, pd.DataFrame(), host, cpu_cores={("a", 0): 2})}
    assert got["c=1"].regime == got["c=4"].regime == "under-loaded"
    assert "c=16 in this sweep served 7.6x" in got["c=1"].because
    assert got["c=1"].because.endswith("first read as saturated at c=16 (compute-bound) in this sweep")
    assert (got["c=16"].regime, got["c=16"].confidence) == ("compute-bound", "medium")
    assert "89% of them" in got["c=16"].because
    # without the cores known (a GPU server whose NVML failed) the same readings decide nothing
    blind = rg.point_regimes(summary, pd.DataFrame(), host)
    assert {r.regime for _, r in blind} == {"undecided"}


def test_dcgm_exporter_fields_stand_in_for_gpm():
    """A remote GPU seen only through the DCGM exporter: its profiling fields fill SM activity, DRAM bandwidth and
    tensor activity (the exporter's text format, series names as dcgm-exporter publishes them)."""
    text = "\n".join([
        '# TYPE DCGM_FI_DEV_GPU_UTIL gauge', 'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-x"} 100',
        '# TYPE DCGM_FI_PROF_SM_ACTIVE gauge', 'DCGM_FI_PROF_SM_ACTIVE{gpu="0",UUID="GPU-x"} 0.95',
        '# TYPE DCGM_FI_PROF_DRAM_ACTIVE gauge', 'DCGM_FI_PROF_DRAM_ACTIVE{gpu="0",UUID="GPU-x"} 0.88',
        '# TYPE DCGM_FI_PROF_PIPE_TENSOR_ACTIVE gauge', 'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu="0",UUID="GPU-x"} 0.02',
    ])
    rows = parse_metrics(text, ("DCGM_",), now_unix=1.0, phase="c=8") + parse_metrics(text, ("DCGM_",), now_unix=2.0,
                                                                                    phase="c=8")
    d = pd.DataFrame(rows).assign(config="a", rep=0)
    pts = dcgm_by_point(d)
    assert pts.loc[0, "dram_bw_util_pct_p50"] == pytest.approx(88.0) and pts.loc[0, "gpu_util_pct_p50"] == 100
    merged = gpu_points({"dcgm": d}, pd.DataFrame())
    r = rg.decide(rg.point_evidence(merged.iloc[0], None, pd.Series({"completed": 3, "failed": 0})))
    assert r.regime == "memory-bandwidth-bound"


def test_thread_03_renders_the_h200_store_offline(tmp_path_factory):
    """Thread 03 over the H200 reference store (fifteen points since thread 04's shared-GPU points joined): nothing
    launched, a regime per point, energy per output token from the GPU's counter, the launch-bound profiled level
    recommending graphs in transformers' spelling."""
    from renders import rendered

    done = rendered(tmp_path_factory, "h200")  # the whole suite's render, once per session
    assert done.status["03_clocks_power"] == "ok"
    fs = json.loads((done.out_dir / "03_clocks_power.findings.json").read_text())
    head, *rest = fs
    assert head["title"] == "Not throttled: most load levels host-bound (42 of 59)" and head["confidence"] == "high"
    assert "clock-event reasons seen: none" in head["claim"]
    by = {f["evidence"]["config"]: f for f in rest}
    assert by["cuda_graph=off"]["title"].endswith("host-bound")
    # 2 replicas sharing the GPU through MPS: still host-bound (each replica's busiest thread near a core)
    assert by["gpu_share=mps, mem_fraction=0.4, replicas=2, route=least_outstanding"]["title"].endswith("host-bound")
    assert by["cuda_graph=off (+nsys profile)"]["recommended_flags"] == ["--cb-use-cuda-graph"]
    assert by["cuda_graph=full (+nsys profile)"]["recommended_flags"] == []  # it already ran with them
    html = (done.out_dir / "03_clocks_power.html").read_text()
    assert "joules_per_output_token" in html and "Timeline per configuration" in html


def test_a_level_over_in_a_few_gpu_readings_gets_no_verdict():
    """Recorded on the H200 (data/reference/sglang-h200): SGLang with graphs served c=32 x 32 requests in a few
    tenths of a second, 3 readings at 10 Hz whose GPM SM activity read 0, 2 and 0%: no regime can rest on that."""
    store = Store(ROOT / "data" / "reference" / "sglang-h200" / "store")
    res = read_store(store)
    gp = gpu_points(res.telemetry, res.summary)
    short = gp[(gp["phase"] == "c=32") & (gp["samples"] < rg.RegimeThresholds().min_gpu_samples)]
    assert len(short), "the recording has levels shorter than the guard"
    row = short.iloc[0]
    verdict = rg.decide(rg.point_evidence(gpu=row))
    assert verdict.regime == "undecided" and verdict.confidence == "none"
    assert "too few to tell" in verdict.because and "duration_s" in verdict.missing[0]
    # the same readings with the guard's floor lowered are read as before: the guard is what changed the answer
    loose = rg.decide(rg.point_evidence(gpu=row), rg.RegimeThresholds(min_gpu_samples=1))
    assert "too few to tell" not in loose.because


def test_03_takes_the_regime_most_verdicts_at_a_level_reached_and_says_how_many():
    """03 took a level's most confident verdict alone: on the vLLM and SGLang H200 stores, two undecided repetitions
    (too few GPU readings) and one host-bound read "host-bound, high". Now the regime most deciding verdicts reached,
    at most medium where fewer than three decided it (one launch's verdict included) and at most low where decided ones
    disagree, said in the finding."""
    from servescope.analysis.regime import Regime
    from servescope.threads.clocks_power import _agreed

    def v(regime: str, confidence: str) -> Regime:
        return Regime(regime, "because", {}, confidence, ("host-bound", "launch-bound") if regime == "undecided" else ())

    r, conf, words = _agreed([v("undecided", "none"), v("host-bound", "high"), v("undecided", "none")])
    assert (r.regime, conf) == ("host-bound", "medium")
    assert words == " (1 of the 3 verdicts at this level, one per repetition and device, reached it; 2 undecided: medium " \
                    "confidence at most)"
    r, conf, words = _agreed([v("compute-bound", "high"), v("host-bound", "medium"), v("host-bound", "high")])
    assert (r.regime, conf) == ("host-bound", "low") and "; 1 compute-bound: low confidence at most)" in words
    r, conf, words = _agreed([v("host-bound", "high")] * 3)
    assert (r.regime, conf, words) == ("host-bound", "high", "")
    # three that decided and agree are enough (as for an effect); the undecided one is said, not held against them
    r, conf, words = _agreed([v("host-bound", "high")] * 3 + [v("undecided", "none")])
    assert (r.regime, conf) == ("host-bound", "high") and words.endswith("reached it; 1 undecided)")
    # one launch's verdict (a search's screen) or two: too few to hold in a second run, as for an effect
    r, conf, words = _agreed([v("launch-bound", "high")])
    assert (r.regime, conf) == ("launch-bound", "medium")
    assert words == " (from one verdict at this level, one per repetition and device: medium confidence at most)"
    r, conf, words = _agreed([v("launch-bound", "low")] * 2)
    assert (r.regime, conf) == ("launch-bound", "low") and words.startswith(" (from 2 verdicts at this level")
    r, conf, words = _agreed([v("undecided", "none")] * 2)
    assert (r.regime, conf, words) == ("undecided", "none", "")
    # a tie between decided regimes goes to the more confident one, still low
    r, conf, _ = _agreed([v("compute-bound", "medium"), v("launch-bound", "high")])
    assert (r.regime, conf) == ("launch-bound", "low")


def test_03s_cpu_headline_takes_each_levels_regime_by_the_same_rule_as_a_gpus():
    """The CPU server's per-level regime counted an undecided verdict as a regime of its own (two undecided
    repetitions and one compute-bound read "undecided") and its confidence was medium whatever the verdicts; now each
    level is read as on a GPU (`_agreed`), with the tally in the claim and the top level's confidence."""
    from types import SimpleNamespace

    from servescope.analysis.regime import Regime
    from servescope.threads.clocks_power import _cpu_headline

    def v(point: str, regime: str, confidence: str = "high") -> tuple[dict, Regime]:
        return ({"config": "engine defaults", "point": point},
                Regime(regime, "because", {"server_cores": 2}, confidence,
                       ("compute-bound", "under-loaded") if regime == "undecided" else ()))

    def study(verdicts: list, target: int | None = None) -> SimpleNamespace:
        return SimpleNamespace(verdicts=verdicts, study=SimpleNamespace(
            results=SimpleNamespace(engine_default_configs=lambda: ["engine defaults"]),
            ctx=SimpleNamespace(load=SimpleNamespace(target_level=target))))

    title, claim, confidence, top = _cpu_headline(study(
        [v("c=1", "under-loaded")] * 3 + [v("c=16", "undecided", "none")] * 2 + [v("c=16", "compute-bound")]))
    assert title == "CPU server (engine defaults) at c=16: compute-bound" and confidence == "medium"
    assert top == {"c=1": "under-loaded", "c=16": "compute-bound"}
    assert claim.endswith("c=1 under-loaded (3 of 3), c=16 compute-bound (1 of 3, 2 undecided)")
    # a target level names the operating point: the title and its sureness are that level's
    aimed = _cpu_headline(study([v("c=1", "under-loaded")] * 3 + [v("c=16", "compute-bound")], target=1))
    assert aimed[0] == "CPU server (engine defaults) at c=1: under-loaded" and aimed[2] == "high"
    # three that agree: high; decided verdicts that disagree: low
    assert _cpu_headline(study([v("c=16", "compute-bound")] * 3))[2] == "high"
    assert _cpu_headline(study([v("c=16", "compute-bound")] * 3 + [v("c=16", "under-loaded")]))[2] == "low"
    assert _cpu_headline(study([v("c=16", "undecided", "none")]))[1:3] == (
        "The server computes on the CPU, so its cores are the device: per level (engine defaults; the regime most of "
        "its decided verdicts reached, of its verdicts, one per repetition) c=16 undecided (one verdict)", "none")


@pytest.mark.parametrize("sm, tensor, dram, want", [
    (44.0, 2.2, 39.0, "latency-bound"),  # vLLM's graphed decode at c=1 on the H100 (test_vllm_qwen3_30b)
    (96.7, 0.0, 4.7, "compute-bound"),  # FP32 matmuls on CUDA cores, tensor pipes idle (the H200 case)
    (60.0, 45.0, 20.0, "compute-bound"),  # matmul work in the tensor pipes
    (60.0, 10.0, 70.0, "memory-bandwidth-bound"),
    (20.0, 1.0, 5.0, "launch-bound"),
])
def test_a_busy_gpu_is_compute_bound_only_where_its_compute_is_in_use(sm, tensor, dram, want):
    ev = rg.Evidence(gpu_util_pct=100.0, power_pct_of_limit=45.0, sm_clock_pct_of_max=100.0, sm_active_pct=sm,
                     tensor_active_pct=tensor, dram_bw_util_pct=dram, gpu_samples=50)
    r = rg.decide(ev)
    assert r.regime == want, r.words()
    if want == "latency-bound":
        assert "none filling the GPU" in r.words() and "CUDA graphs will not help" in r.action
