"""make bench-ray: a suite's points through the Ray runner against the local runner, side by side in one run.

The same configurations and repetitions (stub servers whose tokens come at a fixed pace, so a point's length is its
load, not this machine's cores) measured twice from empty stores: once one after another by the local runner, once
through a local Ray cluster of simulated nodes (Ray's own cluster utilities, one CPU each), where a repetition's
configurations run at once on separate nodes. Each run is checked to hold the same points. Last line:
  ray_runner: local_s=N ray_s=N nodes=N points=N speedup=R
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, local_cluster

TESTS = ROOT / "tests"
sys.path.insert(0, str(TESTS))
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)

import stub_engine  # noqa: E402,F401  (registers the stub engine)
from servescope.experiment import Config, measure  # noqa: E402
from servescope.spec import EngineSpec, Knobs, LoadSpec, ModelSpec  # noqa: E402
from servescope.store import Store  # noqa: E402


def run(configs: list[Config], load: LoadSpec, reps: int, store: Path, runner: dict | None) -> tuple[float, int]:
    """Wall seconds to measure every point, and how many points the store then holds."""
    t0 = time.monotonic()
    res = measure(EngineSpec(name="stub", python=sys.executable, startup_timeout_s=30), ModelSpec(path="stub"),
                  configs, load, repetitions=reps, store=Store(store), say=lambda m: None, runner=runner)
    took = time.monotonic() - t0
    if not res.errors.empty:
        raise SystemExit(f"points failed: {res.errors[['config', 'rep', 'summary']].to_dict('records')}")
    return took, len(res.points)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=2, help="simulated nodes (one point at a time each)")
    ap.add_argument("--configs", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--itl-ms", type=float, default=40.0, help="the stub's pace: a point's length is its load")
    a = ap.parse_args()

    configs = [Config(f"c{i}", Knobs(extra_args=("--itl-ms", f"{a.itl_ms + i:g}"))) for i in range(a.configs)]
    load = LoadSpec(concurrency=(1, 4), num_requests=8, output_len=16, warmup_requests=0)
    with local_cluster(a.nodes) as address, tempfile.TemporaryDirectory() as d:
        local_s, n_local = run(configs, load, a.reps, Path(d) / "local", None)
        print(f"local runner: {n_local} points in {local_s:.1f} s", flush=True)
        ray_s, n_ray = run(configs, load, a.reps, Path(d) / "ray", {"kind": "ray", "address": address})
        print(f"ray runner ({a.nodes} nodes): {n_ray} points in {ray_s:.1f} s", flush=True)
        if n_ray != n_local:
            raise SystemExit(f"the runs hold different points: {n_local} against {n_ray}")
    print(f"ray_runner: local_s={local_s:.1f} ray_s={ray_s:.1f} nodes={a.nodes} points={n_ray} "
          f"speedup={local_s / ray_s:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
