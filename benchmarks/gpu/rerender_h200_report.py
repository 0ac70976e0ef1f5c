"""Render data/reference/h200/report again from data/reference/h200/store, offline, after points were added to the
store (thread 04's shared-GPU points of issue 22): every notebook but 00, whose environment is the H200's and cannot be
read here, so its recorded findings and HTML are kept and stand in the new front page.

    .venv/bin/python benchmarks/gpu/rerender_h200_report.py
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

from servescope.findings import read_findings, read_outcome
from servescope.report import QUESTIONS, NotebookRun, _write_index, notebook_status, run_suite
from servescope.suite import load_suite

ROOT = Path(__file__).resolve().parents[2]
REF = ROOT / "data" / "reference" / "h200"
SUITE = ROOT / "data" / "suites" / "transformers-gpu.yaml"
KEPT = "00_environment"  # the H200 machine's own environment notebook, as that run wrote it


def main() -> None:
    """Render the suite offline, keep 00 as recorded, write the front page, copy the result into the reference."""
    suite = load_suite(SUITE)
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "store"
        shutil.copytree(REF / "store", store)
        t0 = time.time()
        done = run_suite(SUITE, only=[n.id for n in suite.notebooks if n.id != KEPT], offline=True,
                         reports_dir=Path(tmp) / "r", store_dir=store, run_id="h200", progress=False)
        for f in REF.joinpath("report").glob(f"{KEPT}.*"):
            shutil.copy(f, done.out_dir / f.name)
        found = read_findings(REF / "report" / f"{KEPT}.findings.json")
        outcome = read_outcome(REF / "report" / f"{KEPT}.findings.json")
        kept = NotebookRun(KEPT, notebook_status(False, outcome, found), 0.0, f"{KEPT}.html", findings=found,
                           question=QUESTIONS.get(KEPT, ""), outcome=outcome)
        _write_index(done.out_dir, suite, SUITE, "h200", t0, [kept, *done.runs])
        for f in done.out_dir.iterdir():
            if f.suffix in {".html", ".json"}:
                shutil.copy(f, REF / "report" / f.name)
        if (done.out_dir / "changes").is_dir():  # thread 07's improvement documents, one per recommended change
            shutil.copytree(done.out_dir / "changes", REF / "report" / "changes", dirs_exist_ok=True)
        print(json.dumps({r.id: r.status for r in [kept, *done.runs]}, indent=1))


if __name__ == "__main__":
    main()
