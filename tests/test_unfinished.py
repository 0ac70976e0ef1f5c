"""Thread 07 after an earlier thread did not finish: its "nothing to verify" must not read as an answer. Known answer
from real hardware: vllm-h100-second's first two calls on the H100 (2026-12-05; tests/fixtures/h100_unfinished, the
report folders as they came back, notebooks with outputs stripped). In call 1 the budget's SIGTERM stopped 02 before
it wrote its findings; in call 2 02 ended partial (one repetition of each graph mode, so no mode resolved and no
change recommended), and 07, finding no change, said "Nothing to verify" and was shown ok."""

from __future__ import annotations

import shutil
from pathlib import Path

from servescope import nb
from servescope.findings import collect, unfinished
from servescope.suite import load_suite
from servescope.summary import front_line
from servescope.threads import verify as t07

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "h100_unfinished"
PARTIAL = "partial: 5 of 9 points measured, 4 not in the store"


def test_a_notebook_stopped_before_its_findings_is_unfinished():
    assert unfinished(FIX / "call1") == {
        "02_piecewise_cuda_graphs": "failed: the notebook stopped before it wrote its findings"}


def test_a_partial_thread_is_unfinished_and_the_finished_ones_are_not():
    assert unfinished(FIX / "call2") == {"02_piecewise_cuda_graphs": PARTIAL}


def test_a_point_that_failed_is_a_finished_answer():
    """sglang-h200's 02 and 05 (a mode that died before it was ready, recorded on the H200): partial, not unfinished;
    h200's 04 (a repetition the budget never launched): unfinished."""
    ref = ROOT / "data" / "reference"
    assert unfinished(ref / "sglang-h200" / "report") == {}
    # 07 waits for 04 (its search would tune what 04 may change): it plans nothing, so it is no gap of its own
    assert unfinished(ref / "h200" / "report") == {
        "04_data_parallelism": "partial: 4 of 5 points measured, 1 not in the store"}


def _verify(tmp: Path, **kw) -> tuple[t07.Verification, list]:
    d = tmp / "report"
    shutil.copytree(FIX / "call2", d, ignore=shutil.ignore_patterns("07_*"))  # 07 as it starts: its own not there
    s = load_suite(ROOT / "data" / "suites" / "vllm-h100-second.yaml")
    ctx = nb.context(s.engine, s.model, s.load, repetitions=3, store_dir=str(tmp / "store"), offline=True,
                     telemetry=s.telemetry, progress=False, baseline={"torch_compile": False})
    v = t07.run(ctx, collect(d), **kw)
    return v, t07.findings(v)


def test_nothing_to_verify_after_an_unfinished_thread_is_not_an_answer(tmp_path):
    v, fs = _verify(tmp_path, unfinished=unfinished(FIX / "call2"))
    head = fs[0]
    assert head.title == "Not verified: an earlier thread did not finish" and not head.answers
    assert head.verdict is not None and not head.verdict.verified
    assert v.outcome(fs).status() == "no result"  # never "ok" for a thread that measured nothing
    assert front_line(fs) == ("Not verified: no change to verify yet: 02_piecewise_cuda_graphs (" + PARTIAL +
                              ") did not finish; a run that finishes it may name one")
    assert head.evidence["unfinished"] == {"02_piecewise_cuda_graphs": PARTIAL}


def test_without_the_unfinished_threads_07_said_nothing_to_verify_and_ok(tmp_path):
    """What the recorded call 2 showed (the fixture's own 07): the defect this guards against."""
    recorded = collect(FIX / "call2")["07_verified_changes"][0]
    assert recorded.title == "Nothing to verify: no recommended change"
    v, fs = _verify(tmp_path)
    assert fs[0].title == recorded.title and v.outcome(fs).status() == "ok"
