"""A background sampler thread with drift-free timing and phase tags."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pandas as pd

log = logging.getLogger(__name__)


class Phase:
    """The current phase label (e.g. 'warmup:c=16', 'c=16', 'idle'), shared by every sampler of a run."""

    def __init__(self, label: str = "idle") -> None:
        self._label = label
        self._lock = threading.Lock()

    def set(self, label: str) -> None:
        """Switch phase; samples taken from now on carry this label."""
        with self._lock:
            self._label = label

    def get(self) -> str:
        """The label in force now."""
        with self._lock:
            return self._label


class Sampler:
    """Calls `sample()` rate_hz times a second on its own thread until stopped; rows carry time and phase."""

    name = "sampler"

    def __init__(self, rate_hz: float, phase: Phase | None = None) -> None:
        if not 0 < rate_hz <= 1000:
            raise ValueError(f"{self.name}: rate_hz must be in (0, 1000], got {rate_hz}")
        self.rate_hz = rate_hz
        self.phase = phase or Phase()
        self.rows: list[dict[str, Any]] = []
        self.ticks = 0
        self.cpu_s = 0.0  # CPU time this sampler's thread spent sampling, while it ran (its steady overhead)
        self.setup_cpu_s = 0.0  # CPU time of setup and teardown (e.g. nvmlInit and static reads), once per run
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0
        self._t1 = 0.0
        self.errors: dict[str, str] = {}

    def sample(self, now_unix: float, phase: str) -> list[dict[str, Any]]:
        """Rows for one tick (override)."""
        raise NotImplementedError

    def setup(self) -> None:
        """Called on the sampler's thread before the first tick (override)."""

    def teardown(self) -> None:
        """Called on the sampler's thread after the last tick (override)."""

    def _run(self) -> None:
        c0 = time.thread_time()
        try:
            self.setup()
        except Exception as e:  # a sampler that cannot start reports why and leaves the others running
            self.errors["setup"] = f"{type(e).__name__}: {e}"
            log.warning("%s could not start: %s", self.name, e)
            return
        period = 1.0 / self.rate_hz
        c1 = time.thread_time()
        self._t0 = start = time.perf_counter()
        k = 0
        while not self._stop.is_set():
            try:
                self.rows.extend(self.sample(time.time(), self.phase.get()))
            except Exception as e:  # keep sampling: one bad read must not end the series
                self.errors.setdefault("sample", f"{type(e).__name__}: {e}")
            self.ticks += 1
            k += 1
            delay = start + k * period - time.perf_counter()
            if delay < 0:  # fell behind: skip the missed ticks rather than bursting
                k += int(-delay // period) + 1
                delay = start + k * period - time.perf_counter()
            self._stop.wait(max(0.0, delay))
        self._t1 = time.perf_counter()
        c2 = time.thread_time()
        self.cpu_s = c2 - c1
        try:
            self.teardown()
        finally:
            self.setup_cpu_s = (c1 - c0) + (time.thread_time() - c2)

    def start(self) -> Sampler:
        """Start the thread."""
        self._thread = threading.Thread(target=self._run, name=f"servescope-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread and wait for it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    @property
    def achieved_hz(self) -> float:
        """Ticks per second actually made."""
        span = self._t1 - self._t0
        return self.ticks / span if span > 0 else float("nan")

    def frame(self) -> pd.DataFrame:
        """Everything sampled so far, one row per reading."""
        return pd.DataFrame(self.rows)
