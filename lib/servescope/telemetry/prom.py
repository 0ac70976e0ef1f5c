"""Scrape a Prometheus /metrics endpoint during load: the engine's own (sglang:*, vllm:*) or a DCGM exporter's."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from .base import Phase, Sampler

DCGM_PREFIXES = ("DCGM_FI_",)


def parse_metrics(text: str, prefixes: tuple[str, ...] | None = None, keep_buckets: bool = False,
                  now_unix: float = 0.0, phase: str = "") -> list[dict[str, Any]]:
    """Tidy rows (metric, labels as sorted JSON, value) from Prometheus text exposition."""
    rows = []
    for fam in text_string_to_metric_families(text):
        if prefixes and not fam.name.startswith(prefixes):
            continue
        for s in fam.samples:
            if not keep_buckets and s.name.endswith("_bucket"):
                continue
            if s.name.endswith("_created"):
                continue
            rows.append({"time_unix": now_unix, "phase": phase, "metric": s.name,
                         "labels": json.dumps(s.labels, sort_keys=True), "value": float(s.value)})
    return rows


class MetricsScraper(Sampler):
    """GET url every 1/rate_hz seconds and keep the samples whose names start with one of prefixes."""

    name = "metrics"

    def __init__(self, url: str, rate_hz: float = 1.0, prefixes: tuple[str, ...] | None = None,
                 phase: Phase | None = None, timeout_s: float = 2.0, name: str = "metrics") -> None:
        super().__init__(rate_hz, phase)
        self.url = url
        self.prefixes = prefixes
        self.timeout_s = timeout_s
        self.name = name
        self.failures = 0

    def sample(self, now_unix: float, phase: str) -> list[dict[str, Any]]:
        """One scrape (a failed scrape is counted, its reason kept once, and sampling goes on)."""
        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout_s) as resp:
                text = resp.read().decode()
        except OSError as e:
            self.failures += 1
            self.errors.setdefault("scrape", f"{type(e).__name__}: {e}")
            return []
        return parse_metrics(text, self.prefixes, now_unix=now_unix, phase=phase)
