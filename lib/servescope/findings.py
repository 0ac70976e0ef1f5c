"""Findings as data: what a thread concluded, the measured effect with its spread, and what to change."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .util import atomic_write_text

Confidence = Literal["high", "medium", "low", "none"]


class Effect(BaseModel):
    """A measured relative effect: ratio of medians over paired repetitions, its 90% confidence interval
    (t-test on log ratios), and the min..max of the per-repetition effects."""

    model_config = ConfigDict(extra="forbid")

    metric: str
    value_pct: float
    ci_low_pct: float | None = None
    ci_high_pct: float | None = None
    range_low_pct: float | None = None
    range_high_pct: float | None = None
    p_value: float | None = None
    n: int = Field(ge=0, description="paired repetitions behind the number")
    at: str = ""
    baseline: str = ""
    treatment: str = ""

    def text(self) -> str:
        """'+12.3% output_tok_s (90% CI +8.1..+15.0%, n=3, at c=16)'."""
        ci = (f"90% CI {self.ci_low_pct:+.1f}..{self.ci_high_pct:+.1f}%, " if self.ci_low_pct is not None
              and self.ci_high_pct is not None and self.ci_low_pct == self.ci_low_pct else "")
        at = f", at {self.at}" if self.at else ""
        return f"{self.value_pct:+.1f}% {self.metric} ({ci}n={self.n}{at})"


class Finding(BaseModel):
    """One conclusion of one thread, with its evidence."""

    model_config = ConfigDict(extra="forbid")

    thread: str
    title: str
    claim: str
    applies: bool = True
    reason: str = ""
    effect: Effect | None = None
    recommended_flags: list[str] = Field(default_factory=list)
    confidence: Confidence = "none"
    evidence: dict[str, Any] = Field(default_factory=dict)


def write_findings(findings: list[Finding], path: str | Path) -> Path:
    """Write findings as a JSON list (atomically)."""
    p = Path(path)
    atomic_write_text(p, json.dumps([f.model_dump(mode="json") for f in findings], indent=2, default=str) + "\n")
    return p


def read_findings(path: str | Path) -> list[Finding]:
    """Read a findings JSON written by write_findings."""
    return [Finding.model_validate(x) for x in json.loads(Path(path).read_text())]
