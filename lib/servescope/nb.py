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


def show_client_health(res: Results) -> Markdown:
    """The load client's own load per point, with a warning where it limited the measurement or was starved."""
    h = res.client_health()
    if h.empty:
        return Markdown("No points measured.")
    if h["client_cpu_pct"].isna().all():
        return Markdown("Client health was not recorded for these points (stored before it was measured).")
    limited, starved = res.client_warnings("limited"), res.client_warnings("starved")
    lines = [f"The client used at most {h['client_cpu_pct'].max():.0f}% of one core; its event loop woke up at "
             f"most {h['loop_lag_ms_p99'].max():.0f} ms late (p99 of a point)."]
    if limited:
        lines.append("\n**Warning: the load client limited these measurements** (the figures describe the client):\n")
        lines += [f"- {w}" for w in limited]
    if starved:
        lines.append(f"\n**The host was oversubscribed at {len(starved)} of {len(h)} points**: the client had little "
                     "to do but woke up late, so TTFT and inter-token gaps there include scheduling delay of the "
                     "machine, for both configurations alike:\n")
        lines += [f"- {w}" for w in starved]
    if not limited and not starved:
        lines.append("Neither limited nor starved at any point.")
    return Markdown("\n".join(lines))
