"""What became of one probe: its table and what ran, or why it did not run (skipped: it could not apply here;
failed: it ran and broke), as data that a renderer puts into words."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import pandas as pd


@dataclass(frozen=True)
class Skipped:
    """The probe could not apply here (no second GPU, offline with nothing kept, shapes not readable)."""

    why: str
    state: Literal["skipped"] = "skipped"


@dataclass(frozen=True)
class Failed:
    """The probe ran and broke (its script's error, a timeout)."""

    why: str
    state: Literal["failed"] = "failed"


Outcome = Skipped | Failed


@dataclass(frozen=True)
class ProbeRun:
    """One probe's rows and what ran (device, dtype, method, ...), or the outcome that left it without rows."""

    rows: pd.DataFrame = field(default_factory=pd.DataFrame)
    info: dict[str, Any] = field(default_factory=dict)
    outcome: Outcome | None = None

    @property
    def ran(self) -> bool:
        """True when the probe measured something."""
        return self.outcome is None and len(self.rows) > 0

    @property
    def why_not(self) -> str:
        """Why there are no rows ('' where there are)."""
        if self.outcome is not None:
            return self.outcome.why
        return "" if len(self.rows) else "it measured nothing"

    def to_kept(self) -> dict[str, Any]:
        """For the store and a finding's evidence: rows, info and, where it did not run, the outcome."""
        out: dict[str, Any] = {"rows": self.rows.to_dict("records"), "info": self.info}
        if self.outcome is not None:
            out["outcome"] = {"state": self.outcome.state, "why": self.outcome.why}
        return out

    @classmethod
    def from_kept(cls, kept: dict[str, Any]) -> ProbeRun:
        """Read back what to_kept wrote; also the older shape, where a probe that did not run was kept as
        {'skipped' | 'failed': why} in place of, or inside, its info."""
        info = dict(kept.get("info") or {})
        out = kept.get("outcome")
        old = {k: info.pop(k, None) or kept.get(k) for k in ("skipped", "failed")}  # the older shape, out of info
        outcome: Outcome | None = None
        if isinstance(out, dict):
            outcome = (Failed if out.get("state") == "failed" else Skipped)(str(out.get("why") or ""))
        elif old["failed"]:
            outcome = Failed(str(old["failed"]))
        elif old["skipped"]:
            outcome = Skipped(str(old["skipped"]))
        return cls(pd.DataFrame(kept.get("rows") or []), info, outcome)


def skipped(why: str) -> ProbeRun:
    """A probe that could not apply here."""
    return ProbeRun(outcome=Skipped(why))


def failed(why: str) -> ProbeRun:
    """A probe that ran and broke."""
    return ProbeRun(outcome=Failed(why))
