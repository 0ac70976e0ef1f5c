"""Plots for the notebooks; Figures are built without pyplot so a notebook shows each exactly once."""

from __future__ import annotations

import base64
import html
import io

import numpy as np
import pandas as pd
from matplotlib.figure import Figure as _Figure


class Figure(_Figure):
    """A matplotlib Figure that Jupyter displays by itself (no pyplot, so it is shown exactly once): a PNG with its
    titles and axis labels as alternative text (nbconvert's HTML export warns of every image without one, and a
    screen reader has nothing else to read)."""

    def _repr_html_(self) -> str:
        buf = io.BytesIO()
        self.savefig(buf, format="png", dpi=110)
        png = base64.b64encode(buf.getvalue()).decode()
        return f'<img alt="{html.escape(self.description())}" style="max-width:100%" src="data:image/png;base64,{png}">'

    def description(self) -> str:
        """The figure in words: its title, then each plot's title and axes ('Figure' where it has none)."""
        parts = [self._suptitle.get_text()] if self._suptitle is not None and self._suptitle.get_text() else []
        for ax in self.axes:
            said = " vs ".join(x for x in (ax.get_ylabel(), ax.get_xlabel()) if x)
            parts.append(": ".join(x for x in (ax.get_title(), said) if x))
        return "; ".join(x for x in parts if x) or "Figure"


def throughput_latency(summary: pd.DataFrame, title: str = "") -> Figure:
    """Left: output tok/s vs concurrency (median over repetitions, bars = min..max). Right: median TTFT vs tok/s."""
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    for cfg, g in summary.groupby("config", sort=False):
        agg = g.groupby("concurrency").agg(
            tok=("output_tok_s", "median"), lo=("output_tok_s", "min"), hi=("output_tok_s", "max"),
            ttft=("ttft_ms_p50", "median"), tpot=("tpot_ms_p50", "median"))
        x = agg.index.to_numpy()
        ax1.errorbar(x, agg["tok"], yerr=[agg["tok"] - agg["lo"], agg["hi"] - agg["tok"]], marker="o",
                     capsize=3, label=cfg)
        ax2.plot(agg["tok"], agg["ttft"], marker="o", label=cfg)
        for xi, ti, yi in zip(x, agg["tok"], agg["ttft"], strict=True):
            ax2.annotate(f"c={xi}", (ti, yi), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax1.set_xscale("log", base=2)
    levels = sorted(summary["concurrency"].unique())
    ax1.set_xticks(levels, [str(int(c)) for c in levels])
    ax1.minorticks_off()
    ax1.set_xlabel("concurrency (closed loop)")
    ax1.set_ylabel("output tokens/s")
    ax1.set_title("throughput (median, bars: min..max over repetitions)")
    ax1.grid(alpha=0.3)
    ax1.legend()
    ax2.set_xlabel("output tokens/s")
    ax2.set_ylabel("median TTFT (ms)")
    ax2.set_title("latency vs throughput")
    ax2.grid(alpha=0.3)
    ax2.legend()
    if title:
        fig.suptitle(title)
    return fig


def effect_bars(effects: pd.DataFrame, title: str = "") -> Figure:
    """Treatment / baseline ratio per concurrency on a log axis (x1 = no change), with its 90% confidence interval,
    one panel per metric. Intervals wider than 16x either way are cut at the frame and marked."""
    metrics = list(dict.fromkeys(effects["metric"]))
    fig = Figure(figsize=(4 * max(1, len(metrics)), 3.4), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, max(1, len(metrics))))
    lim_lo, lim_hi = 1 / 16, 16.0
    for ax, m in zip(axes, metrics, strict=True):
        e = effects[effects["metric"] == m]
        x = np.arange(len(e))
        ratio = 1 + e["effect_pct"].to_numpy(dtype=float) / 100
        lo = 1 + e["ci_low_pct"].to_numpy(dtype=float) / 100
        hi = 1 + e["ci_high_pct"].to_numpy(dtype=float) / 100
        shown_lo = np.clip(np.nan_to_num(lo, nan=1.0), lim_lo, lim_hi)
        shown_hi = np.clip(np.nan_to_num(hi, nan=1.0), lim_lo, lim_hi)
        ax.bar(x, ratio - 1, bottom=1, color="#4c72b0", width=0.6)
        ax.errorbar(x, ratio, yerr=[np.clip(ratio - shown_lo, 0, None), np.clip(shown_hi - ratio, 0, None)],
                    fmt="none", ecolor="black", capsize=3)
        for xi, h, lw in zip(x, hi, lo, strict=True):
            if h > lim_hi or lw < lim_lo:
                ax.annotate("CI cut", (xi, lim_hi if h > lim_hi else lim_lo), ha="center", fontsize=7,
                            xytext=(0, -10 if h > lim_hi else 4), textcoords="offset points")
        ax.set_yscale("log", base=2)
        finite = np.concatenate([ratio, shown_lo, shown_hi])
        finite = finite[np.isfinite(finite) & (finite > 0)]
        ax.set_ylim(max(lim_lo, finite.min() / 1.3) if finite.size else 0.5,
                    min(lim_hi, finite.max() * 1.3) if finite.size else 2)
        ax.yaxis.set_major_formatter(lambda v, _: f"x{v:g}")
        ax.axhline(1, color="black", lw=0.8)
        ax.set_xticks(x, list(e["point"]) if "point" in e else [f"c={c}" for c in e["concurrency"]])
        ax.set_title(m)
        ax.grid(alpha=0.3, axis="y")
    if title:
        fig.suptitle(title)
    return fig
