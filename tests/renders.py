"""Each committed reference rendered offline once per test session, whichever worker asks first: `make test`'s
pytest-xdist workers share one folder under the session's base temp, and a file lock makes the others wait for the
render instead of repeating it (a render of a whole suite is 60-90 s on the loaded 2-core host)."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from servescope.report import run_suite

ROOT = Path(__file__).resolve().parents[1]
SUITES = ROOT / "data" / "suites"
REFERENCE = ROOT / "data" / "reference"
FAILS = {"id": "98_fails", "path": str(ROOT / "tests" / "fixtures" / "notebooks" / "98_fails.ipynb"),
         "parameters": {"message": "boom from the fixture"}}


@dataclass(frozen=True)
class Reference:
    """What a committed reference renders: its suite, its store, the notebooks (default: the suite's) and any
    fixture notebook run before them."""

    suite: Path
    store: Path
    only: tuple[str, ...] = ()
    before: tuple[dict, ...] = ()


REFERENCES = {
    # the default suite's store from a real cold run on the embedded engine, with a notebook that fails first
    "default": Reference(SUITES / "default.yaml", REFERENCE / "store", before=(FAILS,)),
    "h200": Reference(SUITES / "transformers-gpu.yaml", REFERENCE / "h200" / "store"),
    "sglang-h200": Reference(SUITES / "sglang-h200.yaml", REFERENCE / "sglang-h200" / "store",
                             only=("01", "02", "04", "05", "06", "07", "99")),
    "vllm-h200": Reference(SUITES / "vllm-h200.yaml", REFERENCE / "vllm-h200" / "store",
                           only=("01", "02", "05", "06", "04", "07", "03", "99")),
}


def _shared(factory: pytest.TempPathFactory) -> Path:
    """The folder every worker of this session sees: the workers' base temps are siblings under the session's."""
    base = factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "references"
    root.mkdir(exist_ok=True)
    return root


@dataclass(frozen=True)
class Rendered:
    """A reference's offline render: its report folder (read it, never write into it) and each notebook's status."""

    out_dir: Path
    status: dict[str, str]


def rendered(factory: pytest.TempPathFactory, name: str) -> Rendered:
    """Reference `name` rendered offline (its notebooks' HTML, findings and index), by the first worker that asks."""
    ref = REFERENCES[name]
    root = _shared(factory)
    work, done = root / name, root / f"{name}.done"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(work, ignore_errors=True)  # a worker that failed mid-render left it half written
            shutil.copytree(ref.store, work / "store")
            suite = ref.suite
            if ref.before:  # a copy beside the render (the suites that have one name no path relative to theirs)
                data = yaml.safe_load(ref.suite.read_text())
                suite = work / "suite.yaml"
                suite.write_text(yaml.safe_dump({**data, "notebooks": [*ref.before, *data["notebooks"]]}))
            out = run_suite(suite, only=ref.only, offline=True, inputs=False,
                            reports_dir=work / "reports", store_dir=work / "store", run_id="r", progress=False)
            done.write_text(json.dumps({"out_dir": str(out.out_dir), "status": {r.id: r.status for r in out.runs}}))
    got = json.loads(done.read_text())
    return Rendered(Path(got["out_dir"]), got["status"])
