"""Watchdog that kills a server's process group if the process that launched it dies.

Run as a script (stdlib only) so it works whatever the import path: `python _reaper.py PGID GRACE_S [DIR]` (DIR:
the launch's socket folder, removed once the group is gone), or
`python _reaper.py --mps ROOT CONTROL PARENT_PID` for the suite's MPS control daemon (tell it to quit, kill it,
remove ROOT).
It covers the one case `finally` cannot: the launching Python (a notebook kernel, say) killed outright.
"""

from __future__ import annotations

import os
import signal
import sys
import time

# set by SIGTERM: `pkill -f servescope` (or a host's shutdown) TERMs this watchdog with its launcher, which leaves the
# server group behind unless the watchdog takes it down on the way out
_TOLD = [False]


def _on_term(signum: int, frame: object) -> None:
    _TOLD[0] = True


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _mps(root: str, control: str, parent: int) -> None:
    """Wait for the parent (its pid given: it may die before this script reads its own parent) to die, then end the
    MPS daemon whose pipe and log directories are under root."""
    import shutil
    import subprocess

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _on_term)
    while os.getppid() == parent and os.path.isdir(root) and not _TOLD[0]:
        time.sleep(0.5)
    if not os.path.isdir(root):
        return
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=os.path.join(root, "pipe"),
               CUDA_MPS_LOG_DIRECTORY=os.path.join(root, "log"))
    try:
        subprocess.run([control], input="quit\n", env=env, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        with open(os.path.join(root, "pipe", "nvidia-cuda-mps-control.pid")) as f:
            pid = int(f.read().strip())
        time.sleep(1.0)
        with open(f"/proc/{pid}/cmdline", "rb") as f:  # still that daemon, not a process that reused its pid
            if b"mps" in f.read():
                os.kill(pid, signal.SIGKILL)
    except (OSError, ValueError):
        pass
    shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    if sys.argv[1] == "--mps":
        _mps(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    pgid, grace_s = int(sys.argv[1]), float(sys.argv[2])
    scratch = sys.argv[3] if len(sys.argv) > 3 else ""
    parent = os.getppid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _on_term)
    try:
        _reap(pgid, grace_s, parent)
    finally:
        if scratch:  # the group is gone, or killed: nothing of it uses its sockets any more
            import shutil

            shutil.rmtree(scratch, ignore_errors=True)


def _reap(pgid: int, grace_s: float, parent: int) -> None:
    while True:
        if not _group_alive(pgid):
            return
        if os.getppid() != parent or _TOLD[0]:
            break
        time.sleep(0.5)
    try:
        os.killpg(pgid, signal.SIGTERM)
        os.killpg(pgid, signal.SIGCONT)  # a stopped server acts on TERM only once continued
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _group_alive(pgid):
        time.sleep(0.2)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


if __name__ == "__main__":
    main()
