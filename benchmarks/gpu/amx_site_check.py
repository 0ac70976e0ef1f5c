"""Does servescope's engine_site give every Python process of a server the AMX tile permission, on a CPU with AMX?

Each case starts a fresh interpreter the way a server's processes start (PYTHONPATH from servescope.server's
engine_site_path), which then runs one AMX tile instruction sequence (amx_tiles.so, built from amx_tiles.c):
  without_permission: SERVESCOPE_AMX_PERMISSION=0, so nothing asks: SIGILL expected on an AMX CPU
  with_permission:    the sitecustomize asks at interpreter start: exit 0 expected
  spawn_child:        a multiprocessing 'spawn' child (a new interpreter, as vLLM starts its workers) uses the tiles
  fork_child:         a forked child of a process that asked (the permission is inherited on fork)
Prints facts, then one `case=NAME result=...` line per case. Recorded: tests/fixtures/amx/site_check_*.txt.

Usage: python3 amx_site_check.py PATH/TO/amx_tiles.so   (run from the repository root)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "lib"))

from servescope.server import engine_site_path  # noqa: E402

USE = "import ctypes, sys; ctypes.CDLL(sys.argv[1]).servescope_use_tiles()"
# a spawned child imports the parent's main module, so this one runs from a file, not -c
SPAWN = ("import multiprocessing as mp, ctypes, sys\n"
         "def use(so):\n    ctypes.CDLL(so).servescope_use_tiles()\n"
         "if __name__ == '__main__':\n"
         "    p = mp.get_context('spawn').Process(target=use, args=(sys.argv[1],)); p.start(); p.join()\n"
         "    code = p.exitcode or 0\n"
         "    sys.exit(0 if code == 0 else 100 - code if code < 0 else 50 + code)\n")
FORK = ("import os, ctypes, sys\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    ctypes.CDLL(sys.argv[1]).servescope_use_tiles(); os._exit(0)\n"
        "_, st = os.waitpid(pid, 0)\n"
        "sys.exit(0 if st == 0 else 100 + (st & 0x7f) if st & 0x7f else 50 + (st >> 8))\n")


def run(name: str, code: str, so: str, permission: bool) -> str:
    env = {**os.environ, "PYTHONPATH": engine_site_path(os.environ.get("PYTHONPATH", ""))}
    if not permission:
        env["SERVESCOPE_AMX_PERMISSION"] = "0"
    with tempfile.TemporaryDirectory() as d:
        script = Path(d) / f"{name}.py"
        script.write_text(code)
        r = subprocess.run([sys.executable, str(script), so], env=env, capture_output=True, text=True, timeout=120)
    if r.returncode < 0:
        result = f"signal {signal.Signals(-r.returncode).name}"
    elif r.returncode > 100:
        result = f"child signal {signal.Signals(r.returncode - 100).name}"
    elif r.returncode > 50:
        result = f"child exit {r.returncode - 50}: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ''}"
    else:
        result = f"exit {r.returncode}"
    said = " | ".join(ln for ln in r.stderr.splitlines() if ln.startswith("servescope:"))
    return f"case={name} result={result}" + (f" stderr={said}" if said else "")


def main() -> int:
    so = str(Path(sys.argv[1]).resolve())
    flags = next((ln.split(":", 1)[1].split() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                  if ln.startswith("flags")), [])
    model = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                  if ln.startswith("model name")), "?")
    print(f"cpu={model}")
    print(f"amx_flags={' '.join(f for f in flags if f.startswith('amx'))}")
    print(f"kernel={os.uname().release}")
    print(f"python={sys.version.split()[0]}")
    probe = subprocess.run([sys.executable, "-c", "import sitecustomize as s; print(s.AMX)"], capture_output=True,
                           text=True, env={**os.environ, "PYTHONPATH": engine_site_path()})
    print(f"sitecustomize_says={probe.stdout.strip()}")
    if "amx_tile" not in flags:
        print("case=all result=skipped (no amx_tile on this CPU)")
        return 0
    print(run("without_permission", USE, so, permission=False))
    print(run("with_permission", USE, so, permission=True))
    print(run("spawn_child", SPAWN, so, permission=True))
    print(run("fork_child", FORK, so, permission=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
