"""Replay a recorded GPU telemetry CSV as if it were being sampled now (for tests and offline demos).

Rows are emitted on a thread at their recorded time offsets (optionally sped up), re-stamped with the current
time and tagged with the phase in force when they are emitted, so the whole pipeline (phases, derivation,
verdicts) runs on real recorded readings without a GPU."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pandas as pd

from .base import Phase, Sampler


class ReplaySampler(Sampler):
    """Emits a recording's rows at their own pace; `static` is the recorded per-GPU static info."""

    name = "nvml-replay"

    def __init__(self, recording: pd.DataFrame | str | Path,
                 static: list[dict[str, Any]] | pd.DataFrame | None = None,
                 speed: float = 1.0, phase: Phase | None = None, loop: bool = True) -> None:
        super().__init__(rate_hz=100.0, phase=phase)
        df = pd.read_csv(recording) if isinstance(recording, (str, Path)) else recording.copy()
        if static is None and isinstance(recording, (str, Path)):
            side = Path(recording).with_suffix(".static.json")
            static = json.loads(side.read_text()) if side.is_file() else []
        if isinstance(static, pd.DataFrame):
            static = static.to_dict("records")
        self.static = static or []
        self.speed = speed
        self.loop = loop
        t = df["time_unix"].to_numpy()
        self._offsets = (t - t.min()) / speed
        self._records = df.drop(columns=[c for c in ("phase",) if c in df]).to_dict("records")
        self._span = float(self._offsets.max()) + (1.0 / speed) * 0.1 if len(df) else 0.0

    def _run(self) -> None:
        c0 = time.thread_time()
        self._t0 = start = time.perf_counter()
        base = 0.0
        i = 0
        n = len(self._records)
        while not self._stop.is_set() and n:
            due = start + base + self._offsets[i]
            self._stop.wait(max(0.0, due - time.perf_counter()))
            if self._stop.is_set():
                break
            row = dict(self._records[i], time_unix=time.time(), phase=self.phase.get())
            self.rows.append(row)
            self.ticks += 1
            i += 1
            if i == n:
                if not self.loop:
                    break
                i, base = 0, base + self._span
        self._t1 = time.perf_counter()
        self.cpu_s = time.thread_time() - c0

    def start(self) -> ReplaySampler:
        """Start emitting."""
        self._thread = threading.Thread(target=self._run, name="servescope-replay", daemon=True)
        self._thread.start()
        return self
