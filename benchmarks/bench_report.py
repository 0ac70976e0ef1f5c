"""`make bench-report`: `make report` cold, as a new user's first one, timed: the engine's environment, the tiny model
and the doctor's quick check in an empty per-user cache (and empty uv and vLLM compile caches), then the default suite
from an empty store, with the launch count beside what one launch per configuration allows.

launches: server launches the run made (one per stored point folder, plus failed attempts); configurations x
repetitions: distinct launch identities (the command and environment the adapter built, port and paths left out,
with the load, repetition and profile), over every point the threads asked for, aliases included. Equal when no
configuration was launched twice. Goal (issue 20): wall_s <= 900 on the 2-core machine, launches equal to
configurations x repetitions, engine environment included. Prints one line per step and notebook, then
`bench-report: ...` last. --warm-cache keeps the per-user caches (only the suite is timed then).

Usage: python benchmarks/bench_report.py [--suite data/suites/default.yaml] [--keep DIR] [--warm-cache]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

from servescope.report import SuiteRun, run_suite  # noqa: E402
from servescope.spec import stable_hash  # noqa: E402
from servescope.store import Store  # noqa: E402


def launch_identity(manifest: dict[str, Any]) -> str:
    """A stored point's launch, as the store recorded it: its command less port and model path, and its key's parts
    less the knobs (two points with the same identity are one configuration launched twice)."""
    target = manifest.get("target") or {}
    cmd = re.sub(r"--port \d+", "--port {port}", str(target.get("command", "")))
    parts = {k: v for k, v in (manifest.get("parts") or {}).items() if k != "knobs"}
    return stable_hash({"command": cmd, "parts": parts,
                        "replicas": len(target.get("replicas") or []) or 1,
                        "route": (target.get("knobs") or {}).get("route")}, n=16)


def count_launches(store_dir: Path) -> dict[str, int]:
    """Launches made and distinct configuration-repetitions in a store."""
    store = Store(store_dir)
    idents = [launch_identity(store.get(k).manifest) for k in store.keys()]
    failed = len(list((store_dir / "_failed").glob("*"))) if (store_dir / "_failed").is_dir() else 0
    aliases = len(list((store_dir / "_notes" / "aliases").glob("*.json"))) if (store_dir / "_notes").is_dir() else 0
    return {"launches": len(idents) + failed, "configuration_repetitions": len(set(idents)), "failed": failed,
            "read_as_alias": aliases}


def run_cold(suite: Path, work: Path, tag: str) -> tuple[SuiteRun, float, dict[str, int]]:
    """The suite from an empty store under work/; its run, wall seconds and launch counts."""
    store, reports = work / f"store-{tag}", work / f"reports-{tag}"
    t0 = time.monotonic()
    done = run_suite(suite, reports_dir=reports, store_dir=store, run_id=tag, hide_code=True)
    wall = time.monotonic() - t0
    return done, wall, count_launches(store)


def cold_caches(work: Path) -> None:
    """Point the per-user caches a first `make report` fills (engine environment, model, uv's wheels, vLLM's compile
    cache) at empty folders under work/, for this process and the ones it starts."""
    for var, sub in (("SERVESCOPE_CACHE", "servescope-cache"), ("UV_CACHE_DIR", "uv-cache"),
                     ("VLLM_CACHE_ROOT", "vllm-cache")):
        os.environ[var] = str(work / sub)


def setup_steps(suite: Path) -> list[tuple[str, float]]:
    """What `make report` does before the suite (as its Makefile rule does), each timed: (step, seconds)."""
    cli = [sys.executable, "-m", "servescope.cli"]
    out = []
    for name, args in (("engine environment", ["engine-env", "vllm"]), ("tiny model", ["make-model"]),
                       ("doctor --quick", ["doctor", "--quick", "--suite", str(suite)])):
        t0 = time.monotonic()
        subprocess.run(cli + args, check=True, stdout=subprocess.DEVNULL)
        out.append((name, time.monotonic() - t0))
        print(f"{name}: {out[-1][1]:.0f} s", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default=str(ROOT / "data" / "suites" / "default.yaml"))
    ap.add_argument("--keep", help="keep the store and reports in this folder (default: a temporary one, removed)")
    ap.add_argument("--warm-cache", action="store_true", help="keep the per-user caches: time the suite alone")
    a = ap.parse_args()
    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="servescope-bench-report-"))
    try:
        if not a.warm_cache:
            cold_caches(work)
        setup = setup_steps(Path(a.suite))
        done, wall, n = run_cold(Path(a.suite), work, "cold")
        for r in done.runs:
            print(f"{r.id}: {r.status} in {r.duration_s:.0f} s")
        print(json.dumps(n))
        ok = sum(r.status == "ok" for r in done.runs)
        setup_s = sum(s for _, s in setup)
        print(f"bench-report: wall_s={setup_s + wall:.0f} (setup_s={setup_s:.0f} "
              f"{'cold caches' if not a.warm_cache else 'warm caches'}, suite_s={wall:.0f}) "
              f"notebooks_ok={ok}/{len(done.runs)} launches={n['launches']} "
              f"configurations_x_repetitions={n['configuration_repetitions']} read_as_alias={n['read_as_alias']}")
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
