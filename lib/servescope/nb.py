"""Small display helpers for notebooks: each returns something Jupyter renders."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from IPython.display import Markdown

from .experiment import Results
from .findings import Finding, write_findings


def show_findings(findings: list[Finding], path: str | Path) -> Markdown:
    """Write the findings JSON and render them as Markdown."""
    p = write_findings(findings, path)
    lines = []
    for f in findings:
        lines.append(f"### {f.title}\n")
        lines.append(f"**{f.claim}**\n")
        if not f.applies:
            lines.append(f"Does not apply here: {f.reason}\n")
        if f.effect is not None:
            lines.append(f"- measured effect: {f.effect.text()} ({f.effect.treatment} vs {f.effect.baseline})")
        lines.append(f"- confidence: **{f.confidence}**")
        lines.append(f"- recommended flags: `{' '.join(f.recommended_flags)}`" if f.recommended_flags
                     else "- recommended flags: none (keep the current configuration)")
    lines.append(f"\nFindings written to `{p}`.")
    return Markdown("\n".join(lines))


def show_errors(res: Results) -> Markdown | pd.DataFrame:
    """Failed points with their error, or a line saying there were none."""
    if res.errors.empty:
        return Markdown("Every point completed.")
    return res.errors[["config", "rep", "key", "error_type", "error"]]


def show_client_health(res: Results) -> Markdown | pd.DataFrame:
    """The load client's own load per point, with a warning where it may have limited the measurement."""
    h = res.client_health()
    warnings = res.client_warnings()
    if h.empty:
        return Markdown("No points measured.")
    if h["client_cpu_pct"].isna().all():
        return Markdown("Client health was not recorded for these points (stored before it was measured).")
    if not warnings:
        return Markdown(
            f"The client never limited a measurement: at most {h['client_cpu_pct'].max():.0f}% of one core, "
            f"event-loop lag p99 at most {h['loop_lag_ms_p99'].max():.1f} ms.")
    display_md = "**Warning: the client may have limited these measurements:**\n\n" + "\n".join(f"- {w}" for w in warnings)
    return Markdown(display_md)
