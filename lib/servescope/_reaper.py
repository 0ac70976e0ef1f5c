"""Watchdog that kills a server's process group if the process that launched it dies.

Run as a script (stdlib only) so it works whatever the import path: `python _reaper.py PGID GRACE_S`.
It covers the one case `finally` cannot: the launching Python (a notebook kernel, say) killed outright.
"""

from __future__ import annotations

import os
import signal
import sys
import time


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main() -> None:
    pgid, grace_s = int(sys.argv[1]), float(sys.argv[2])
    parent = os.getppid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        if not _group_alive(pgid):
            return
        if os.getppid() != parent:
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
