"""make bench-telemetry: what sampling costs. Runs the NVML sampler alone at 10 Hz and at 100 Hz for a few seconds
each and reports the CPU its thread used, as a share of one core, and the rate it achieved. On a machine without
a GPU NVML is replaced by servescope.telemetry.testing's fake (2 GPUs), which measures our own overhead only;
with a GPU the real NVML is used. Last line:
  telemetry_overhead: cpu_pct_at_10hz=N cpu_pct_at_100hz=N achieved_hz=N
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))

from servescope.telemetry.nvml import Nvml, NvmlSampler, NvmlUnavailable  # noqa: E402
from servescope.telemetry.testing import FakeGpu, fake_nvml  # noqa: E402


def run(rate_hz: float, seconds: float) -> tuple[float, float, int, float]:
    """(CPU % of a core while sampling, achieved Hz, GPUs, one-off setup+teardown CPU ms)."""
    s = NvmlSampler(rate_hz=rate_hz).start()
    time.sleep(seconds)
    s.stop()
    if s.errors.get("setup"):
        raise RuntimeError(s.errors["setup"])
    return 100.0 * s.cpu_s / (s._t1 - s._t0), s.achieved_hz, len(s.static), 1e3 * s.setup_cpu_s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--fake", action="store_true", help="use the fake NVML even if a GPU is present")
    a = ap.parse_args()
    real = False
    if not a.fake:
        try:
            Nvml().close()
            real = True
        except NvmlUnavailable as e:
            print(f"no NVML here ({e}); using the fake NVML with 2 GPUs: this measures servescope's own overhead")
    ctx = contextlib.nullcontext() if real else fake_nvml([FakeGpu(), FakeGpu()])
    with ctx:
        c10, hz10, n, s10 = run(10, a.seconds)
        c100, hz100, _, s100 = run(100, a.seconds)
    print(f"{'NVML':5} {'GPUs':>4} {'rate':>6} {'achieved Hz':>11} {'CPU % of a core':>15} {'setup+teardown CPU ms':>21}")
    print(f"{'real' if real else 'fake':5} {n:>4} {10:>6} {hz10:>11.1f} {c10:>15.2f} {s10:>21.1f}")
    print(f"{'real' if real else 'fake':5} {n:>4} {100:>6} {hz100:>11.1f} {c100:>15.2f} {s100:>21.1f}")
    print("(CPU % is the sampling thread's CPU while it samples, energy and PCIe reads included; setup (nvmlInit,"
          " static reads) and teardown are paid once per point and shown apart)")
    print(f"telemetry_overhead: cpu_pct_at_10hz={c10:.2f} cpu_pct_at_100hz={c100:.2f} achieved_hz={hz100:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
