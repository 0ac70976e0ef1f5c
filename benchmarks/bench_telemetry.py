"""make bench-telemetry: what sampling costs. Runs the NVML sampler alone at 10 Hz and at 100 Hz for a few seconds
each, with GPM metrics off and on, and reports the CPU its thread used, as a share of one core, and the rate it
achieved. On a machine without a GPU NVML is replaced by servescope.telemetry.testing's fake (2 GPUs), which
measures our own overhead only; with a GPU the real NVML is used. Last line:
  telemetry_overhead: cpu_pct_at_10hz=N cpu_pct_at_100hz=N achieved_hz=N gpm=on|unavailable  (GPM on)
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


def run(rate_hz: float, seconds: float, gpm: bool = True) -> tuple[float, float, int, float]:
    """(CPU % of a core while sampling, achieved Hz, GPUs, one-off setup+teardown CPU ms)."""
    s = NvmlSampler(rate_hz=rate_hz, gpm=gpm).start()
    time.sleep(seconds)
    s.stop()
    if s.errors.get("setup"):
        raise RuntimeError(s.errors["setup"])
    return 100.0 * s.cpu_s / (s._t1 - s._t0), s.achieved_hz, len(s.static), 1e3 * s.setup_cpu_s


def _gpm_state() -> str:
    """'read' when the GPUs gave GPM metrics, else why not."""
    n = Nvml()
    try:
        n.read(0)
        row = n.read(0)
        return "read" if row["sm_active_pct"] == row["sm_active_pct"] else n.errors.get("gpm", "no value")
    finally:
        n.close()


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
    rows = []
    with ctx:
        for gpm in (False, True):
            for hz in (10, 100):
                rows.append((gpm, hz, *run(hz, a.seconds, gpm)))
        gpm_state = _gpm_state()
    print(f"GPM metrics: {gpm_state}")
    print(f"{'NVML':5} {'GPUs':>4} {'GPM':>4} {'rate':>6} {'achieved Hz':>11} {'CPU % of a core':>15} "
          f"{'setup+teardown CPU ms':>21}")
    for gpm, hz, cpu, ach, n, setup in rows:
        print(f"{'real' if real else 'fake':5} {n:>4} {'on' if gpm else 'off':>4} {hz:>6} {ach:>11.1f} {cpu:>15.2f} "
              f"{setup:>21.1f}")
    print("(CPU % is the sampling thread's CPU while it samples, energy and PCIe reads included; setup (nvmlInit,"
          " static reads) and teardown are paid once per point and shown apart)")
    on = {hz: (cpu, ach) for gpm, hz, cpu, ach, *_ in rows if gpm}
    print(f"telemetry_overhead: cpu_pct_at_10hz={on[10][0]:.2f} cpu_pct_at_100hz={on[100][0]:.2f} "
          f"achieved_hz={on[100][1]:.1f} gpm={'on' if gpm_state == 'read' else 'unavailable'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
