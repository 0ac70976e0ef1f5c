"""A probe's outcome is typed (rows and what ran, or Skipped / Failed with a reason), and the stores written before
it was (a probe that did not run kept as {'skipped' | 'failed': why} in place of, or inside, its info) read the same."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from servescope.nb import probe_result
from servescope.probes.run import Failed, ProbeRun, Skipped, failed, skipped

ROOT = Path(__file__).resolve().parents[1]


def test_a_probe_that_ran_and_one_that_did_not_survive_the_store():
    ran = ProbeRun(pd.DataFrame([{"bytes": 4096, "ms_p50": 0.02}]), {"backend": "nccl", "world": 2})
    for p in (ran, skipped("needs two or more GPUs; 1 GPUs here"), failed("allreduce.py failed: NCCL error")):
        back = ProbeRun.from_kept(json.loads(json.dumps(p.to_kept())))
        assert back.outcome == p.outcome and back.info == p.info and back.rows.equals(p.rows) and back.ran == p.ran
    assert ran.ran and not ran.why_not
    assert probe_result(ran) is ran.rows


def test_the_older_kept_shapes_read_as_their_outcome():
    # thread 04's kept all-reduce note before the outcome was typed: the reason inside info
    old04 = {"rows": [], "info": {"skipped": "needs two or more GPUs; 1 GPUs here"}, "tp_comm": []}
    got = ProbeRun.from_kept(old04)
    assert got.outcome == Skipped("needs two or more GPUs; 1 GPUs here") and got.info == {} and not got.ran
    assert ProbeRun.from_kept({"failed": "timed out"}).outcome == Failed("timed out")
    assert probe_result(got).data == "Not run: needs two or more GPUs; 1 GPUs here."
    assert probe_result(ProbeRun.from_kept({"failed": "timed out"})).data == "Failed: timed out."


def test_every_kept_all_reduce_note_of_the_references_reads():
    """The notes 04 kept in the committed reference stores (GPU and CPU), whichever shape they were written in."""
    allreduce = [json.loads(p.read_text())["data"] for p in (ROOT / "data" / "reference").rglob("_notes/allreduce/*.json")]
    assert len(allreduce) >= 2, "the kept all-reduce notes of data/reference are gone"
    for k in allreduce:
        got = ProbeRun.from_kept(k)
        assert got.ran or (got.outcome is not None and got.why_not), k
        assert "skipped" not in got.info and "failed" not in got.info
