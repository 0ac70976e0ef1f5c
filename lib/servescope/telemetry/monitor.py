"""Run the samplers together around a load, tagging every reading with the load phase it belongs to."""

from __future__ import annotations

import logging
from typing import Any

import pandas as pd

from .base import Phase, Sampler
from .host import HostSampler
from .nvml import Nvml, NvmlSampler, NvmlUnavailable
from .prom import DCGM_PREFIXES, MetricsScraper

log = logging.getLogger(__name__)


class Telemetry:
    """GPU (NVML or an injected sampler), host and server-metrics sampling, as one context manager.

    Without a GPU the GPU part reports why (status['gpu']) and the rest still runs; nothing is made up."""

    def __init__(self, *, gpu: bool = True, gpu_indices: list[int] | None = None, gpu_hz: float = 10.0,
                 host_hz: float = 2.0, server_pid: int | list[int] | None = None, metrics_url: str | None = None,
                 metrics_hz: float = 1.0, dcgm_url: str | None = None, gpu_sampler: Sampler | None = None,
                 metric_prefixes: tuple[str, ...] = ()) -> None:
        self.phase = Phase()
        self.status: dict[str, Any] = {}
        self.samplers: dict[str, Sampler] = {}
        if gpu_sampler is not None:
            gpu_sampler.phase = self.phase
            self.samplers["gpu"] = gpu_sampler
            self.status["gpu"] = f"replayed ({type(gpu_sampler).__name__})"
            self.status["gpu_read"] = True  # as data: readers never parse the words above
        elif gpu:
            try:
                Nvml(gpu_indices).close()  # fail here, with the reason, rather than silently on the thread
                self.samplers["gpu"] = NvmlSampler(gpu_hz, gpu_indices, self.phase)
                self.status["gpu"] = "ok"
                self.status["gpu_read"] = True
            except NvmlUnavailable as e:
                self.status["gpu"] = f"no NVIDIA GPU / NVML: {e}"
                self.status["gpu_read"] = False
        else:
            self.status["gpu"] = "not asked for"
            self.status["gpu_read"] = False
        self.samplers["host"] = HostSampler(host_hz, server_pid, self.phase)
        if metrics_url:
            self.samplers["server_metrics"] = MetricsScraper(metrics_url, metrics_hz, metric_prefixes or None,
                                                             self.phase)
        if dcgm_url:
            self.samplers["dcgm"] = MetricsScraper(dcgm_url, metrics_hz, DCGM_PREFIXES, self.phase, name="dcgm")

    def set_phase(self, label: str) -> None:
        """Tag readings from now on with label (e.g. 'warmup:c=16', 'c=16', 'idle')."""
        self.phase.set(label)

    def start(self) -> Telemetry:
        """Start every sampler."""
        for s in self.samplers.values():
            s.start()
        return self

    def stop(self) -> None:
        """Stop every sampler and record how each did (achieved rate, own CPU time, missing fields)."""
        for name, s in self.samplers.items():
            s.stop()
            self.status[f"{name}_achieved_hz"] = round(s.achieved_hz, 2)
            self.status[f"{name}_cpu_s"] = round(s.cpu_s, 3)
            self.status[f"{name}_setup_cpu_s"] = round(s.setup_cpu_s, 3)
            if s.errors:
                self.status[f"{name}_errors"] = dict(s.errors)
            if isinstance(s, MetricsScraper):
                self.status[f"{name}_failed_scrapes"] = s.failures

    def __enter__(self) -> Telemetry:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def frames(self) -> dict[str, pd.DataFrame]:
        """Tidy tables of everything sampled: gpu, gpu_static, gpu_procs (GPU memory per process), host_cpu,
        server_procs, server_threads, server_metrics, dcgm (absent ones empty)."""
        out: dict[str, pd.DataFrame] = {}
        g = self.samplers.get("gpu")
        out["gpu"] = g.frame() if g else pd.DataFrame()
        out["gpu_static"] = pd.DataFrame(getattr(g, "static", []) if g else [])
        out["gpu_procs"] = pd.DataFrame(list(getattr(g, "proc_rows", []))) if g else pd.DataFrame()
        h = self.samplers["host"]
        assert isinstance(h, HostSampler)
        out["host_cpu"] = h.frame()
        # list() snapshots the rows at once: frames() is also read while the samplers run (each level as it ends)
        out["server_procs"] = pd.DataFrame(list(h.proc_rows))
        out["server_threads"] = pd.DataFrame(list(h.thread_rows))
        for name in ("server_metrics", "dcgm"):
            s = self.samplers.get(name)
            out[name] = s.frame() if s else pd.DataFrame()
        return out
