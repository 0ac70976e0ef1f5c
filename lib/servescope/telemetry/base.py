"""A background sampler thread with drift-free timing and phase tags."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pandas as pd

log = logging.getLogger(__name__)


# phases whose readings belong to no measured figure: a level's warm-up, the server idle, and, for a level measured
# over its steady window, its ramp and drain (relabelled when read back: experiment.steady_phases)
UNMEASURED = ("warmup:", "idle", "ramp:")


def measured(df: pd.DataFrame) -> pd.DataFrame:
    """The readings of measured phases only."""
    return df[~df["phase"].astype(str).str.startswith(UNMEASURED)] if len(df) and "phase" in df else df


class Phase:
    """The current phase label (e.g. 'warmup:c=16', 'c=16', 'idle'), shared by every sampler of a run."""

    def __init__(self, label: str = "idle") -> None:
        self._label = label
        self._lock = threading.Lock()
        self._closers: list[Callable[[str], None]] = []

    def subscribe(self, close: Callable[[str], None]) -> None:
        """Have close(old_label) called before every switch, so a sampler can read the phase that is ending."""
        with self._lock:
            self._closers.append(close)

    def unsubscribe(self, close: Callable[[str], None]) -> None:
        """Stop calling close."""
        with self._lock:
            if close in self._closers:
                self._closers.remove(close)

    def set(self, label: str) -> None:
        """Switch phase; samples taken from now on carry this label. Subscribed samplers first take one reading
        of the phase that ends, so even a phase shorter than a sampling period has a reading of its own."""
        with self._lock:
            old, closers = self._label, list(self._closers)
        if old != label:
            for close in closers:
                close(old)
        with self._lock:
            self._label = label

    def get(self) -> str:
        """The label in force now."""
        with self._lock:
            return self._label


class Sampler:
    """Calls `sample()` rate_hz times a second on its own thread until stopped; rows carry time and phase."""

    name = "sampler"
    closes_phases = False  # take a reading when a phase ends (cheap local reads only: it holds up the switch)
    close_timeout_s = 1.0

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
        self._wake = threading.Event()
        self._closing: list[tuple[str, threading.Event]] = []
        self._closing_lock = threading.Lock()
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
        next_t = start
        while True:
            self._serve_closing()
            if self._stop.is_set():
                break
            if time.perf_counter() >= next_t:
                self._tick(time.time(), self.phase.get())
                self.ticks += 1
                k += 1
                next_t = start + k * period
                if next_t < time.perf_counter():  # fell behind: skip the missed ticks rather than bursting
                    k += int((time.perf_counter() - next_t) // period) + 1
                    next_t = start + k * period
            self._wake.wait(max(0.0, next_t - time.perf_counter()))
            self._wake.clear()
        self._t1 = time.perf_counter()
        c2 = time.thread_time()
        self.cpu_s = c2 - c1
        try:
            self.teardown()
        finally:
            self.setup_cpu_s = (c1 - c0) + (time.thread_time() - c2)

    def _tick(self, now_unix: float, phase: str) -> None:
        try:
            self.rows.extend(self.sample(now_unix, phase))
        except Exception as e:  # keep sampling: one bad read must not end the series
            self.errors.setdefault("sample", f"{type(e).__name__}: {e}")

    def _serve_closing(self) -> None:
        with self._closing_lock:
            pending, self._closing = self._closing, []
        for label, done in pending:
            self._tick(time.time(), label)
            done.set()

    def close_phase(self, label: str) -> None:
        """Take one reading tagged with the ending phase, on the sampler's own thread, and wait for it."""
        if self._thread is None or not self._thread.is_alive() or self._stop.is_set():
            return
        done = threading.Event()
        with self._closing_lock:
            self._closing.append((label, done))
        self._wake.set()
        done.wait(self.close_timeout_s)

    def start(self) -> Sampler:
        """Start the thread."""
        if self.closes_phases:
            self.phase.subscribe(self.close_phase)
        self._thread = threading.Thread(target=self._run, name=f"servescope-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread and wait for it."""
        self.phase.unsubscribe(self.close_phase)
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    @property
    def achieved_hz(self) -> float:
        """Ticks per second actually made."""
        span = self._t1 - self._t0
        return self.ticks / span if span > 0 else float("nan")

    def frame(self) -> pd.DataFrame:
        """Everything sampled so far, one row per reading (a snapshot: the sampler may still be appending)."""
        return pd.DataFrame(list(self.rows))
