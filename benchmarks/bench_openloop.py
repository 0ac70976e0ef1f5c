"""`make bench-openloop`: the rate our load client achieves in open loop against the zero-work stub.

Poisson arrivals at 1,000 requests/s for 3 s (3,000 requests, 8 tokens each) on loopback, three times; prints each
run's achieved rate, the client's CPU and whether it called itself the limit, then `bench-openloop: ...` last. The
test suite checks only that every request is answered (tests/test_load.py); the rate is a timing and belongs here.

Usage: python benchmarks/bench_openloop.py [--rate 1000] [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "lib"))

from servescope.load import run_sweep  # noqa: E402
from servescope.server import ManagedServer, ReadyCheck, free_port  # noqa: E402
from servescope.spec import LoadSpec  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    n = int(a.rate * 3)
    rates = []
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        stub = ManagedServer(command=[sys.executable, str(ROOT / "benchmarks" / "zero_stub.py"), "--port", str(port),
                                      "--tokens", "8"], port=port, log_dir=Path(tmp), model="stub",
                             ready=ReadyCheck(generate_path=None, poll_interval_s=0.1))
        load = LoadSpec(mode="open", request_rate=(a.rate,), num_requests=n, output_len=8, warmup_requests=0)
        with stub:
            for i in range(a.runs):
                res = run_sweep(stub.base_url, "stub", load, None, progress=False)
                h, ok = res.health.iloc[0], int((res.requests["status"] == "ok").sum())
                rates.append(float(h["achieved_rate"]))
                print(f"run {i + 1}: achieved {h['achieved_rate']:.0f} req/s of {a.rate:.0f}, {ok}/{n} ok, client "
                      f"CPU {h['client_cpu_pct']:.0f}%, client_limited={bool(h['client_limited'])}", flush=True)
    print(f"bench-openloop: requested={a.rate:.0f} achieved_median={statistics.median(rates):.0f} "
          f"achieved_min={min(rates):.0f} ratio={statistics.median(rates) / a.rate:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
