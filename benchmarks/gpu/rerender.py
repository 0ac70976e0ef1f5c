"""Render a GPU suite's reference report again from its store, offline (after a recording added points): every
notebook but 00, whose environment is the GPU machine's and cannot be read here, so the findings and HTML that machine
wrote for 00 are kept and stand in the new front page (the host named there is the GPU machine's).

    .venv/bin/python benchmarks/gpu/rerender.py data/suites/sglang-h200.yaml [--reference data/reference/sglang-h200]
        [--gpu-reports /work/.device/N/reports.tgz]

--gpu-reports: a reports.tgz that benchmarks/gpu/on_gpu.py brought back; its newest run's 00 files are taken from it.
The reference folder defaults to data/reference/<suite name> (transformers-gpu.yaml's is data/reference/h200).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tarfile
import tempfile
import time
from pathlib import Path

from servescope.findings import read_findings, read_outcome
from servescope.report import NotebookRun, measured_host, notebook_status, question, run_suite, write_index
from servescope.suite import load_suite

ROOT = Path(__file__).resolve().parents[2]
KEPT = "00_environment"  # the GPU machine's own environment notebook, as that run wrote it
REFERENCES = {"transformers-gpu": "h200"}


KEEP_SUFFIXES = {".html", ".json"}  # what a reference report holds: never an executed notebook (outputs stay out)


def take_kept(gpu_reports: Path, report: Path) -> None:
    """00's HTML and JSON files from the newest run in a reports.tgz of the GPU machine that holds them."""
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(gpu_reports) as tf:
            tf.extractall(tmp, filter="data")
        runs = sorted(Path(tmp).glob(f"*/*/{KEPT}.findings.json"), key=lambda p: p.stat().st_mtime)
        if not runs:
            raise SystemExit(f"{gpu_reports} holds no {KEPT} findings")
        for f in runs[-1].parent.glob(f"{KEPT}.*"):
            if f.suffix in KEEP_SUFFIXES:
                shutil.copy(f, report / f.name)


def main() -> None:
    """Render the suite offline, keep 00 as recorded, write the front page, copy the result into the reference."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("suite", type=Path)
    ap.add_argument("--reference", type=Path)
    ap.add_argument("--gpu-reports", type=Path)
    a = ap.parse_args()
    suite = load_suite(a.suite)
    ref = a.reference or ROOT / "data" / "reference" / REFERENCES.get(suite.name, suite.name)
    report = ref / "report"
    report.mkdir(parents=True, exist_ok=True)
    if a.gpu_reports:
        take_kept(a.gpu_reports, report)
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "store"
        shutil.copytree(ref / "store", store)
        t0 = time.time()
        done = run_suite(a.suite, only=[n.id for n in suite.notebooks if n.id != KEPT], offline=True,
                         reports_dir=Path(tmp) / "r", store_dir=store, run_id=suite.name, progress=False,
                         hide_code=True,  # as `servescope run` renders a report: the code stays in the notebooks
                         inputs=False)  # 00 is the GPU's own page, copied in below
        for f in report.glob(f"{KEPT}.*"):
            shutil.copy(f, done.out_dir / f.name)
        found = read_findings(report / f"{KEPT}.findings.json")
        outcome = read_outcome(report / f"{KEPT}.findings.json")
        kept = NotebookRun(KEPT, notebook_status(False, outcome, found), 0.0, f"{KEPT}.html", findings=found,
                           question=question(KEPT), outcome=outcome)
        write_index(done.out_dir, suite, a.suite, suite.name, t0, [kept, *done.runs], host=measured_host(store))
        for f in done.out_dir.iterdir():
            if f.suffix in KEEP_SUFFIXES:
                shutil.copy(f, report / f.name)
        # thread 07's improvement documents, one per recommended change: the render's own set replaces the old one
        # (a change no longer recommended must not keep its document)
        shutil.rmtree(report / "changes", ignore_errors=True)
        if (done.out_dir / "changes").is_dir():
            shutil.copytree(done.out_dir / "changes", report / "changes")
        print(json.dumps({r.id: r.status for r in [kept, *done.runs]}, indent=1))


if __name__ == "__main__":
    main()
