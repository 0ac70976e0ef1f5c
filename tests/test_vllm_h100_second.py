"""The second cold recording of vLLM 0.26's case, on an H100 (data/reference/vllm-h100-second, recorded through
benchmarks/gpu/on_gpu.py with data/suites/vllm-h100-second.yaml over two sessions): 02's pick and 07's verified first
change are the first recording's (data/reference/vllm-h200, on an H200).

Known answer from real hardware: in both recordings every graph mode beat graphs off by far more than the noise (high)
and no head-to-head among the three that gain most resolved (low, low); the largest point estimate differed (first:
full; second: piecewise), and both pick piecewise by the fixed rule (vLLM 0.26's own default), so both verify the same
change against the --enforce-eager launch. What is compared across the two is the pick and its direction, not the
magnitude: another card and another machine start (02: +293.8% on the H200, +399.8% on the H100; 07: +470.8%,
+328.5%)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from recordings import graph_study
from servescope.findings import collect, read_findings
from servescope.store import Store
from servescope.summary import rank, recommendations
from servescope.threads import graph_modes as t02
from servescope.threads import verify

ROOT = Path(__file__).resolve().parents[1]
FIRST, SECOND = (ROOT / "data" / "reference" / n for n in ("vllm-h200", "vllm-h100-second"))
PIECEWISE = ["--compilation-config", '{"cudagraph_mode": "FULL_AND_PIECEWISE"}']
MODES = {"off": "NONE", "decode_only": "FULL_DECODE_ONLY", "full": "FULL", "piecewise": "FULL_AND_PIECEWISE"}


@pytest.mark.parametrize(("name", "largest"), [("vllm-h200", "full"), ("vllm-h100-second", "piecewise")],
                         ids=["first", "second"])
def test_both_recordings_pick_the_engines_default_whichever_mode_led_on_points(name, largest, tmp_path):
    head = t02.findings(graph_study(name, tmp_path))[0]
    assert head.title == "Use CUDA graphs: piecewise" and head.confidence == "high"
    assert head.recommended_flags == PIECEWISE
    ev = head.evidence
    assert ev["largest_gain"] == largest and ev["chosen_by"] == "engine default"
    assert sorted(ev["tied"]) == ["decode_only", "full", "piecewise"]
    assert [h["confidence"] for h in ev["head_to_head"]] == ["low", "low"]
    assert "follows a fixed rule, not this run's noise: piecewise, the engine's own default on 0.26.0" in head.claim
    assert head.effect.n == 3 and head.effect.status == "better" and head.effect.ci_low_pct > 100


@pytest.mark.parametrize("ref", [FIRST, SECOND], ids=["first", "second"])
def test_both_recordings_rank_and_verify_the_same_first_change(ref):
    """From each committed report: 07 verifies 02's pick (with 04's change beside it in the first, whose suite ran 04)
    against the --enforce-eager launch (high, both sides resolved as asked) and 99 ranks it first."""
    by_thread = collect(ref / "report")
    first = verify.changes(by_thread)[0]
    assert first.flags == PIECEWISE and first.alternative_of == ""
    (v, *_) = read_findings(ref / "report" / "07_verified_changes.findings.json")
    assert v.title.startswith("Verified: the recommended changes together") and v.confidence == "high"
    # the first recording's suite also ran 04, whose 2-replica change the combination carries beside 02's
    assert v.recommended_flags[:2] == PIECEWISE and v.change.drop_flags == ["--enforce-eager"]
    assert v.effect.status == "better" and v.effect.ci_low_pct > 100
    assert "baseline ran as compile off, CUDA graphs off (NONE)" in v.claim
    assert "combined ran as compile on (VLLM_COMPILE), CUDA graphs piecewise (FULL_AND_PIECEWISE)" in v.claim
    recs = recommendations(rank(by_thread))
    assert recs.iloc[0]["change"].startswith(shlex.join(PIECEWISE)) and "drop --enforce-eager" in recs.iloc[0]["change"]
    (summary,) = read_findings(ref / "report" / "99_summary.findings.json")
    # 99 heads with whichever of 02's pick and the combination holding it measured more; both name piecewise
    assert summary.title.startswith("First change: ")
    assert summary.change.words.startswith(shlex.join(PIECEWISE)) and "drop --enforce-eager" in summary.change.words


def test_the_second_recording_is_its_own_cold_run_on_an_h100():
    """15 launches of its own (02's 12, 07's 3 eager baselines; 07's combined side is 02's piecewise points), all
    after the first recording's last and none read from it, each resolved as asked, on an H100."""
    pts = list(Store(SECOND / "store").points())
    started = [pt.manifest["started_unix"] for pt in pts]
    first = [pt.manifest["started_unix"] for pt in Store(FIRST / "store").points()]
    assert len(pts) == 15 and min(started) > max(first)
    for pt in pts:
        assert (pt.install.version, pt.install.platform) == ("0.26.0", "cuda"), pt.key
        knobs = pt.target["knobs"]
        if knobs.get("torch_compile") is False:
            assert (pt.resolved.eager, pt.resolved.graph_mode, pt.resolved.compile) == (True, "NONE", "off"), pt.key
        else:
            assert pt.resolved.graph_mode == MODES[knobs["cuda_graph"]], (knobs, pt.resolved)
    for log in sorted((SECOND / "gpu-logs").glob("call*.gpu.txt")):
        assert "NVIDIA H100 80GB HBM3" in log.read_text(), log.name
    (env,) = read_findings(SECOND / "report" / "00_environment.findings.json")
    assert "vllm 0.26.0 (cuda) on 1 x NVIDIA H100 80GB HBM3" in env.claim
