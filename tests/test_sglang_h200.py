"""The seed's case on a real SGLang: 0.5.17 on the H200 (data/reference/sglang-h200, recorded through
benchmarks/gpu/on_gpu.py), rendered offline here. Known answers recorded on real hardware: the launch's own flag turns
graphs off, full prefill graphs die at capture with the engine's own ValueError (SGLang then kills its own tree), and
piecewise (breakable) graphs are the verified first change against the seed's graphs-off launch."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from answers import check_answers
from renders import rendered
from servescope.deaths import cause_of, deaths_in_log
from servescope.engines import get_engine
from servescope.findings import read_findings

ROOT = Path(__file__).resolve().parents[1]
REF = ROOT / "data" / "reference" / "sglang-h200"
SUITE = ROOT / "data" / "suites" / "sglang-h200.yaml"


def _failed(kind: str, says: str = "") -> Path:
    """The recorded attempt whose manifest has this error type (and whose error says this)."""
    for d in sorted((REF / "store" / "_failed").iterdir()):
        m = json.loads((d / "manifest.json").read_text())
        if m.get("error_type") == kind and says in m.get("error", ""):
            return d
    raise AssertionError(f"no {kind} attempt saying {says!r} in {REF}/store/_failed")


def test_real_sglang_death_names_the_engines_exception_its_frame_and_its_own_teardown():
    """The H200's full-prefill-graph launch: its log, read again as the server reported it."""
    d = _failed("ServerExitedError", "ValueError")
    log = (d / "server.stdout.log").read_text() + "\n" + (d / "server.stderr.log").read_text()
    ad = get_engine("sglang")
    cause = cause_of(log, deaths_in_log(log), ad.package, [re.compile(x) for x in ad.teardown_patterns],
                     [re.compile(x) for x in ad.raiser_patterns])
    exc = cause.exception
    assert (exc.type, exc.process) == ("ValueError", "Scheduler")
    assert exc.message == "Invalid forward mode: forward_mode=<ForwardMode.EXTEND: 1> for CUDA Graph replay."
    assert exc.frame == "sglang/srt/layers/attention/triton_backend.py:1201 in _apply_cuda_graph_metadata"
    assert cause.teardown == "engine" and "Received sigquit from a child process" in cause.teardown_evidence
    assert ad.death_stage(log) == "during the target prefill CUDA-graph capture"
    # what the measuring run wrote: the signal of the root is not the headline
    m = json.loads((d / "manifest.json").read_text())
    assert m["error"].startswith("ServerExitedError: server exited with code -9 before it was ready")
    assert "the Scheduler raised ValueError" in m["error"].splitlines()[0]


def test_interrupted_attempts_are_not_failures():
    """The recording's budget stops (SIGTERM) left KeyboardInterrupt attempts in _failed/: not a configuration's
    failure, never recorded as a death that blocks a relaunch."""
    from servescope.store import Store

    d = _failed("KeyboardInterrupt")
    assert Store(REF / "store").recorded_death(d.name.rsplit("-", 2)[0]) is None


@pytest.fixture(scope="module")
def offline_run(tmp_path_factory):
    """Threads 01, 02, 04, 05, 06, 07 and 99 of the suite rendered offline from a copy of the H200 store."""
    return rendered(tmp_path_factory, "sglang-h200").out_dir  # once per test session: tests/renders.py


def test_the_h200_store_renders_the_recorded_answers(offline_run):
    """Every answer of the offline render of data/reference/sglang-h200 is the recorded one (tests/answers.py)."""
    check_answers(offline_run, "sglang-h200")


def test_thread01_names_the_launchs_own_flag_and_recommends_a_mode_that_served(offline_run):
    (f,) = read_findings(offline_run / "01_cuda_graph_disable_reason.findings.json")
    assert f.title == "CUDA graphs are off because of the launch's own flag" and f.confidence == "high"
    # the pair said once, with what the seed's one flag stands for (it was said once per flag)
    assert ("`--cuda-graph-backend-decode disabled` and `--cuda-graph-backend-prefill disabled` turn off decode and "
            "prefill graphs (together, what `--disable-cuda-graph` stands for") in f.claim
    assert "what `--disable-cuda-graph` stands for on sglang 0.5.17, where that flag is a deprecated alias" in \
        json.dumps(f.evidence["launch_flags"])
    # the mode to turn on served here; full died here and is named as not recommended, with the engine's words
    assert f.recommended_flags == ["--cuda-graph-backend-decode", "full", "--cuda-graph-backend-prefill", "breakable"]
    assert [x.config for x in f.failures] == ["cuda_graph=full"]
    assert "full dies before it is ready (during the target prefill CUDA-graph capture): ValueError" in f.claim
    # the mode recommended served: only the one that died is named as not to use
    assert "(piecewise). Not full, which died here: full dies before it is ready" in f.claim


def test_thread02_says_full_dies_at_capture_and_picks_piecewise(offline_run):
    fs = read_findings(offline_run / "02_piecewise_cuda_graphs.findings.json")
    head = fs[0]
    assert head.title == "Use CUDA graphs: piecewise" and head.confidence == "high"
    assert head.effect.n == 3 and head.effect.ci_low_pct > 100  # +532% (90% CI +341..+807%) on the H200
    (dead,) = [f for f in fs if "dies before it is ready" in f.title]
    assert dead.title == "CUDA graphs full: full dies before it is ready on sglang 0.5.17"
    assert "at sglang/srt/layers/attention/triton_backend.py:1201" in dead.claim and dead.confidence == "high"
    assert [x.config for x in head.failures] == ["full"]


def test_front_page_opens_with_the_verified_effect_against_the_seeds_launch(offline_run):
    (summary,) = read_findings(offline_run / "99_summary.findings.json")
    assert summary.title == "First change: Use CUDA graphs: piecewise"
    assert "--cuda-graph-backend-prefill breakable" in summary.recommendation
    page = (offline_run / "index.html").read_text()
    line = re.sub(r"<[^>]+>", "", re.search(r'id="verified"[^>]*><b>(.*?)</b>', page, flags=re.S).group(1))
    assert line.startswith("Verified: +532.3% output_tok_s (90% CI +340.9..+807.0%, n=3")
    assert "with --cuda-graph-backend-decode full --cuda-graph-backend-prefill breakable, against the baseline " \
        "cuda_graph=off (--cuda-graph-backend-decode disabled --cuda-graph-backend-prefill disabled)" in line
    # and what the scheduler search found: nothing it could tell from the combination's own spread
    assert line.endswith("no scheduler setting was verified: none of the 5 tried at c=32 led the recommended changes "
                         "combined by more than the combination&#39;s own launches spread there (38%), so none could be "
                         "told from noise")
    assert "NVIDIA H200" in page and "rendered offline" in page  # where it was measured, not this machine
    # one improvement document: the other graph modes are alternatives for the same knob, said inside it
    (doc,) = sorted((offline_run / "changes").glob("*.md"))
    # said against the seed's launch: its decode backend goes from disabled to full, its prefill stays disabled
    assert "Measured alternative, not taken: --cuda-graph-backend-decode full (" in doc.read_text()
    assert "Remove `--cuda-graph-backend-decode disabled --cuda-graph-backend-prefill disabled` from the launch command " \
        "and add `--cuda-graph-backend-decode full --cuda-graph-backend-prefill breakable`." in doc.read_text()


def test_committed_reference_report_says_the_same():
    page = (REF / "report" / "index.html").read_text()
    assert "Verified: +532.3% output_tok_s" in page
    (env,) = read_findings(REF / "report" / "00_environment.findings.json")
    assert "sglang 0.5.17 (cuda) on 1 x NVIDIA H200" in env.claim  # written on the H200 itself


def test_real_sglang_compile_death_at_decode_capture_names_the_bare_assert():
    """The H200's compiled launch (torch.compile with decode graphs): the Scheduler's bare AssertionError in SGLang's
    multi-platform op dispatch while decode graphs were captured, then SGLang's own teardown."""
    d = _failed("ServerExitedError", "AssertionError")
    log = (d / "server.stdout.log").read_text() + "\n" + (d / "server.stderr.log").read_text()
    ad = get_engine("sglang")
    cause = cause_of(log, deaths_in_log(log), ad.package, [re.compile(x) for x in ad.teardown_patterns],
                     [re.compile(x) for x in ad.raiser_patterns])
    exc = cause.exception
    assert (exc.type, exc.process, exc.message) == ("AssertionError", "Scheduler", "")
    assert exc.frame == "sglang/srt/layers/utils/multi_platform.py:83 in forward"
    assert exc.said() == "AssertionError (no message)" and cause.teardown == "engine"
    assert ad.death_stage(log) == "during the target decode CUDA-graph capture"


def test_thread05_says_compile_dies_at_decode_capture_with_and_without_piecewise(offline_run):
    """Issue 30's question: whatever the engine does with compile is the answer. On 0.5.17's slim sm_90 build (triton
    attention) every compiled launch died while capturing decode graphs: with decode graphs alone, and with each
    piecewise prefill form, so 'compile excludes piecewise' cannot even be asked here."""
    head, excl = read_findings(offline_run / "05_torch_compile.findings.json")
    assert head.title == "torch.compile: compiled dies before it is ready on sglang 0.5.17" and \
        head.confidence == "high" and head.effect is None
    assert "(cuda_graph=decode_only, torch_compile=True)" in head.claim
    assert "during the target decode CUDA-graph capture): AssertionError" in head.claim
    assert "sglang/srt/layers/utils/multi_platform.py:83 in forward" in head.claim
    # the probes died as the compiled arm did without piecewise graphs: their deaths say nothing about piecewise
    assert excl.title == "torch.compile with piecewise CUDA graphs: not verified (compile dies without them too)"
    assert excl.confidence == "none" and not excl.applies and excl.evidence["verdict"] == "dies without piecewise too"
    assert "the compiled arm (decode_only graphs) and the probes (piecewise, compiled_piecewise) each dies before it " \
        "is ready (during the target decode CUDA-graph capture)" in excl.claim
    assert excl.claim.endswith("so whether compile excludes piecewise graphs cannot be told here.")


def test_thread06_names_the_triton_fused_moe_path_from_the_real_servers_nsys_capture(offline_run):
    (moe,) = read_findings(offline_run / "06_grouped_gemm.findings.json")
    assert moe.title == "MoE already grouped: triton_fused_moe" and moe.confidence == "high"
    # sgl-kernel's expert sort (count_and_sort_expert_tokens_kernel) is the path's too: 66.3% and 2,176 launches
    # while the pattern table left it to 'unknown'
    assert "triton_fused_moe (67.1% of GPU time, 2720 launches)" in moe.claim
    assert [p["moe_path"] for p in moe.evidence["paths"]] == ["triton_fused_moe"]
    # 68 forward steps from the KV-cache write (once per layer per step), not 136 from a norm that runs twice
    assert "5.0 MoE launches per MoE layer per step" in moe.claim
    assert moe.evidence["probe_info"]["device"] == "cuda"


def test_thread07_search_with_sglangs_scheduler_knobs_verifies_nothing_it_could_not_tell_from_noise(offline_run):
    """One launch per setting at c=32 against the median of the verification's three launches; the spread of those
    launches (38%) is the floor no one-launch lead beat. The H200 run launched 10 settings of the grid then (calls 5,
    14 and 15; the 300 s budget left chunked_prefill_size=8192 untried). Rendered today, the settings that could not
    change anything are not shown as measured: --num-continuous-decode-steps (declared by 0.5.17, read nowhere else in
    its source), running-request caps of 32 and 64 at c=32, and a prefill chunk of 8,192 tokens (what SGLang resolved
    the reference's to: the same launch); the grid's caps below the level that run did not try (8, 24) are said to be
    untried."""
    head, tune = read_findings(offline_run / "07_verified_changes.findings.json")
    assert head.title == "Verified: the recommended changes together, +532.3% output tok/s"
    assert tune.title == "Scheduler tuning: no setting beat the recommended changes combined"
    rows = {r["setting"]: r for r in tune.evidence["search"]}
    measured = {k: r["vs_combined_pct"] for k, r in rows.items() if r["status"] == "measured" and k[0] != "("}
    assert measured == {"max_running_requests=16": -35.4, "chunked_prefill_size=512": -18.5,
                        "cuda_graph_max_bs=16": -88.1, "chunked_prefill_size=2048": -21.9,
                        "cuda_graph_max_bs=64": -16.8}
    assert rows["chunked_prefill_size=8192"]["status"] == "not launched: the reference already runs with " \
        "chunked_prefill_size 8192 (what its engine resolved it to): the same launch"
    for n in (2, 4, 8):
        r = rows[f"num_continuous_decode_steps={n}"]
        assert r["state"] == "not read" and "no other file of its source reads it" in r["status"]
        assert r["vs_combined_pct"] is None and r["output_tok_s"] is None  # its launch is not shown
    assert rows["max_running_requests=8"]["status"] == "not tried by the measuring run"
    assert "max_running_requests=32" not in rows  # the grid stays below the level now
    assert "highest over lowest (38%), so none was verified" in tune.claim


def test_thread04_on_one_h200_mps_beats_time_slicing_but_no_layout_beats_one_server(offline_run):
    """Calls 6-9 (2026-12-03): 1 server against 2 replicas sharing the GPU, time-sliced and through MPS (each with
    --mem-fraction-static 0.45 and 7 host cores of its own), 3 launches each in alternating order. The one server's
    c=32 spread (its launches gave 5.8k to 8.9k tok/s) leaves both replica layouts unresolved against it, while MPS
    against time-slicing is resolved at c=32; the layouts that need two GPUs are refused, naming the count."""
    fs = {f.title: f for f in read_findings(offline_run / "04_data_parallelism.findings.json")}
    head = fs["No layout shown to beat 1 server"]
    assert head.confidence == "low" and not head.recommended_flags
    for name in ("2 replicas on 1 GPU, least-outstanding", "2 replicas on 1 GPU with MPS, least-outstanding"):
        f = fs[f"{name} vs 1 server"]
        assert f.effect.n == 3 and f.effect.ci_low_pct < 0 < f.effect.ci_high_pct, f.claim  # unresolved
        assert "ran as compile off, CUDA graphs piecewise (decode=full prefill=breakable)" in f.claim
    mps = fs["MPS vs time-slicing: 2 replicas on 1 GPU with MPS, least-outstanding"]
    assert mps.confidence == "high" and mps.effect.ci_low_pct > 0  # +9.1% (90% CI +6.3..+12.0%) at c=32
    assert "this says how to share a GPU, not to share one" in mps.claim
    for name in ("tp=2", "dp=2", "dp attention=2", "2 replicas, least-outstanding"):
        assert "needs 2 GPUs; 1 visible here" in fs[f"{name}: not available here"].claim


def test_thread04_three_replicas_fit_one_h200_and_lose_at_c8(offline_run):
    """Calls 10-13 (2026-12-03, 6 launches of 188-250 s: replicas start one after another with 4 cores each): 3 replicas
    at --mem-fraction-static 0.3 each. Time-sliced, 3 launches: no better than 1 server anywhere and resolved worse at
    c=8 (-29%, 90% CI -40..-16%), with TPOT higher. Through MPS, 3 launches: not resolved against 1 server at any level,
    but resolved better than the same 3 replicas time-sliced (+17.9%, 90% CI +0.6..+38.1%, medium), TPOT lower."""
    fs = {f.title: f for f in read_findings(offline_run / "04_data_parallelism.findings.json")}
    ts = fs["3 replicas on 1 GPU, least-outstanding vs 1 server"]
    assert ts.effect.n == 3 and ts.effect.ci_high_pct < 50, ts.claim
    assert "c=8: -29% (-40..-16%, high)" in ts.claim and "TPOT +35.9%" in ts.claim
    mps = fs["3 replicas on 1 GPU with MPS, least-outstanding vs 1 server"]
    assert mps.effect.n == 3 and mps.confidence == "low" and mps.effect.ci_low_pct < 0 < mps.effect.ci_high_pct
    assert "3 replicas on 1 GPU with MPS, least-outstanding is not resolved" in mps.claim
    share = fs["MPS vs time-slicing: 3 replicas on 1 GPU with MPS, least-outstanding"]
    assert share.confidence == "medium" and share.effect.n == 3 and share.effect.ci_low_pct > 0, share.claim
    assert "MPS with 3 replicas on 1 GPU helps: +17.9% (90% CI +0.6..+38.1%" in share.claim
    assert "TPOT -14.2% (90% CI -24.4..-2.8%, n=3, mean over c=1, 8, 32), lower" in share.claim
    # every per-level point estimate lies inside its own interval
    per_level = re.findall(r"c=\d+: ([+-]\d+)% \(([+-]\d+)\.\.([+-]\d+)%", share.claim + mps.claim + ts.claim)
    assert per_level and all(int(lo) <= int(pt) <= int(hi) for pt, lo, hi in per_level), per_level
    head = fs["No layout shown to beat 1 server"]
    assert "3 replicas on 1 GPU, least-outstanding -17.8% (not resolved)" in head.headline  # its interval below
