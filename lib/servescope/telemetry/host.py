"""Host sampler (psutil): per-core CPU, and the server process tree's CPU and memory, down to its busiest threads.

A host-bound server shows here as one thread (a scheduler loop) at 100% of a core while the GPU waits."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from typing import Any

import psutil

from .base import Phase, Sampler


class HostSampler(Sampler):
    """Per-core CPU %, and for each process of the server tree its CPU %, RSS, and threads above thread_min_pct."""

    name = "host"
    closes_phases = True

    def __init__(self, rate_hz: float = 2.0, server_pid: int | Sequence[int] | None = None,
                 phase: Phase | None = None, thread_min_pct: float = 5.0) -> None:
        super().__init__(rate_hz, phase)
        # several roots: the replicas of one configuration, each row tagged with its replica's index
        self.roots = [] if server_pid is None else [server_pid] if isinstance(server_pid, int) else list(server_pid)
        self.server_pid = self.roots[0] if self.roots else None
        self.replica_of: dict[int, int] = {}
        self.thread_min_pct = thread_min_pct
        self.procs: dict[int, psutil.Process] = {}
        self.proc_rows: list[dict[str, Any]] = []
        self.thread_rows: list[dict[str, Any]] = []
        self._last_thread: dict[tuple[int, int], float] = {}
        self._last_t = 0.0

    def setup(self) -> None:
        """Prime psutil's interval counters."""
        psutil.cpu_percent(percpu=True)
        self._tree()  # prime the server's processes so the first tick already reads them
        self._last_t = time.monotonic()

    def _tree(self) -> list[psutil.Process]:
        """The server tree's processes already primed; new ones are primed now and read from the next tick
        (cpu_percent measures since the previous call on the same Process object)."""
        current = []
        for i, pid in enumerate(self.roots):
            try:
                root = self.procs.get(pid) or psutil.Process(pid)
                tree = [root, *root.children(recursive=True)]
            except psutil.Error:
                continue
            for p in tree:
                self.replica_of.setdefault(p.pid, i)
            current += tree
        out = []
        for p in current:
            known = self.procs.get(p.pid)
            if known is None:
                self.procs[p.pid] = p
                with contextlib.suppress(psutil.Error):
                    p.cpu_percent(None)
                continue
            out.append(known)
        return out

    def sample(self, now_unix: float, phase: str) -> list[dict[str, Any]]:
        """Core rows (returned) plus process and thread rows (kept aside)."""
        avail = psutil.virtual_memory().available / 2**20  # the host's memory headroom, beside its cores
        rows = [{"time_unix": now_unix, "phase": phase, "cpu": i, "cpu_pct": v, "mem_available_mib": avail}
                for i, v in enumerate(psutil.cpu_percent(percpu=True))]
        now = time.monotonic()
        dt = max(now - self._last_t, 1e-6)
        self._last_t = now
        for p in self._tree():
            try:
                with p.oneshot():
                    cpu = p.cpu_percent(None)
                    rss = p.memory_info().rss / 2**20
                    name = p.name()
                    threads = p.threads()
            except psutil.Error:
                continue
            row = {"time_unix": now_unix, "phase": phase, "pid": p.pid, "name": name, "cpu_pct": cpu, "rss_mib": rss}
            if len(self.roots) > 1:
                row["replica"] = self.replica_of.get(p.pid, 0)
            self.proc_rows.append(row)
            for t in threads:
                total = t.user_time + t.system_time
                key = (p.pid, t.id)
                prev = self._last_thread.get(key)
                self._last_thread[key] = total
                if prev is None:
                    continue
                pct = 100.0 * (total - prev) / dt
                if pct >= self.thread_min_pct:
                    trow = {"time_unix": now_unix, "phase": phase, "pid": p.pid, "tid": t.id,
                            "thread": _thread_name(p.pid, t.id), "process": name, "cpu_pct": pct}
                    if len(self.roots) > 1:
                        trow["replica"] = self.replica_of.get(p.pid, 0)
                    self.thread_rows.append(trow)
        return rows


def _thread_name(pid: int, tid: int) -> str:
    try:
        with open(f"/proc/{pid}/task/{tid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def cpu_count() -> int:
    """CPUs this process may run on."""
    return len(os.sched_getaffinity(0))
