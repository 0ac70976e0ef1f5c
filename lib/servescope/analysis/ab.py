"""A/B comparison of configurations measured in paired, alternating repetitions."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.special import stdtr, stdtrit

from ..findings import Confidence

# Direction of "better" for each serving metric family.
HIGHER_IS_BETTER = {"output_tok_s": True, "total_tok_s": True, "request_s": True, "goodput_req_s": True}
GOODPUT = "goodput_req_s"  # requests per second that met the suite's SLO (load.metrics.good_requests)


def higher_is_better(metric: str) -> bool:
    """Throughputs go up, latencies go down."""
    return HIGHER_IS_BETTER.get(metric, metric.split("_")[0] not in {"ttft", "tpot", "itl", "e2e"})


def paired_effects(summary: pd.DataFrame, metric: str, baseline: str, treatment: str) -> pd.DataFrame:
    """Per concurrency: medians of each config over repetitions, the ratio of medians, and the range of per-rep ratios.

    Repetition r of the treatment is paired with repetition r of the baseline (they ran back to back); the medians are
    over the paired repetitions, the spreads over every repetition of each side."""
    cols = ["concurrency", "rep", "config", metric]
    s = summary[summary["config"].isin([baseline, treatment])][cols]
    rows = []
    for c, g in s.groupby("concurrency", sort=True):
        wide = g.pivot_table(index="rep", columns="config", values=metric, aggfunc="first")
        b = wide[baseline].dropna() if baseline in wide else pd.Series(dtype=float)
        t = wide[treatment].dropna() if treatment in wide else pd.Series(dtype=float)
        both = wide.dropna(subset=[x for x in (baseline, treatment) if x in wide])
        ratios = (both[treatment] / both[baseline] - 1.0) * 100 if {baseline, treatment} <= set(both) else pd.Series(dtype=float)
        test = paired_test(both[treatment] / both[baseline]) if len(ratios) else PairedTest()
        # the medians come from the paired repetitions where there are pairs: a repetition one side lacks (a launch
        # interrupted mid-recording) would otherwise move the point estimate outside the paired interval
        mb, mt = (both[baseline], both[treatment]) if len(ratios) else (b, t)
        bm, tm = (float(np.median(mb)) if len(mb) else np.nan), (float(np.median(mt)) if len(mt) else np.nan)
        rows.append({
            "concurrency": c, "metric": metric, "baseline": baseline, "treatment": treatment,
            "baseline_median": bm, "treatment_median": tm,
            "effect_pct": (tm / bm - 1.0) * 100 if bm and not np.isnan(bm) and not np.isnan(tm) else np.nan,
            "low_pct": float(ratios.min()) if len(ratios) else np.nan,
            "high_pct": float(ratios.max()) if len(ratios) else np.nan,
            "n_pairs": int(len(ratios)),
            "ci_low_pct": test.ci_low_pct, "ci_high_pct": test.ci_high_pct, "p_value": test.p_value,
            "baseline_spread_pct": _spread_pct(b), "treatment_spread_pct": _spread_pct(t),
        })
    out = pd.DataFrame(rows)
    if len(out):
        out["confidence"] = [interval_confidence(r.ci_low_pct, r.ci_high_pct, r.n_pairs) for r in out.itertuples()]
    return out


@dataclass(frozen=True)
class PairedTest:
    """One-sample t-test on the log of paired ratios: is the treatment/baseline ratio different from 1?"""

    p_value: float = float("nan")
    ci_low_pct: float = float("nan")  # 90% confidence interval of the geometric-mean effect
    ci_high_pct: float = float("nan")


def paired_test(ratios: pd.Series, level: float = 0.90) -> PairedTest:
    """t-test and confidence interval on log(ratio) over the paired repetitions (needs 2 or more)."""
    x = np.log(np.asarray(ratios, dtype=float))
    x = x[np.isfinite(x)]
    if x.size < 2:
        return PairedTest()
    mean, sd = float(x.mean()), float(x.std(ddof=1))
    if sd == 0:
        return PairedTest(0.0 if mean else 1.0, (np.exp(mean) - 1) * 100, (np.exp(mean) - 1) * 100)
    se = sd / np.sqrt(x.size)
    t = mean / se
    # Student's t from scipy.special: scipy.stats would cost every notebook kernel most of a second to import
    p = float(2 * stdtr(x.size - 1, -abs(t)))
    half = float(stdtrit(x.size - 1, 0.5 + level / 2)) * se
    return PairedTest(p, float((np.exp(mean - half) - 1) * 100), float((np.exp(mean + half) - 1) * 100))


def _spread_pct(x: pd.Series) -> float:
    """(max - min) / median over repetitions, in percent: the run-to-run noise of one configuration."""
    if len(x) < 2:
        return float("nan")
    med = float(np.median(x))
    return float((x.max() - x.min()) / med * 100) if med else float("nan")


# fewer paired repetitions than this resolve nothing and are never more than low confidence: two pairs that agree
# still give an interval a second run does not reproduce (the suites' minimum is 3 for the same reason)
MIN_PAIRS = 3
EQUIVALENCE_PCT = 5.0  # an effect whose whole 90% interval lies inside +-5% is "no change"
METHOD = ("paired t on per-repetition log ratios (df = n-1, 90% interval), the log ratio of each repetition averaged "
          "over the load levels when every level's median ratio has one sign, else taken at the highest level")


@dataclass(frozen=True)
class Headline:
    """A comparison's headline effect on one metric, built for small n: one log ratio per repetition (averaged over
    the load levels when they agree in sign, since levels of one launch are not independent), a t interval over the
    repetitions, and whether that resolves it: better / worse (the interval excludes no change), no change (the
    interval lies inside the equivalence band) or unresolved."""

    metric: str
    baseline: str
    treatment: str
    n: int  # paired repetitions
    scope: str  # 'mean over c=1, 8, 32' or 'at c=32'
    effect_pct: float  # geometric mean over repetitions
    ci_low_pct: float
    ci_high_pct: float
    p_value: float
    per_rep_pct: tuple[float, ...]
    same_sign: bool  # every paired ratio, at every level and repetition, on one side of 1
    status: str  # 'better' | 'worse' | 'no change' | 'unresolved'
    equivalence_pct: float = EQUIVALENCE_PCT
    method: str = METHOD
    levels: tuple[float, ...] = ()  # the concurrency levels the per-repetition values are taken over

    @property
    def resolved(self) -> bool:
        """Whether more repetitions would not change the call: better, worse or no change."""
        return self.status != "unresolved"

    @property
    def confidence(self) -> Confidence:
        """How sure the call is (interval_confidence); 'no change' is medium: the interval sits inside the band."""
        if self.status == "no change":
            return "medium"
        return interval_confidence(self.ci_low_pct, self.ci_high_pct, self.n, self.equivalence_pct)

    def words(self) -> str:
        """'+45.1% (90% CI +30.2..+61.9%, n=3, mean over c=1, 8, 32)'."""
        ci = (f"90% CI {self.ci_low_pct:+.1f}..{self.ci_high_pct:+.1f}%, " if np.isfinite(self.ci_low_pct) else "")
        return f"{self.effect_pct:+.1f}% ({ci}n={self.n}, {self.scope})"


def headline_effect(summary: pd.DataFrame, metric: str, baseline: str, treatment: str,
                    equivalence_pct: float = EQUIVALENCE_PCT, level: float = 0.90,
                    target: int | None = None) -> Headline | None:
    """The headline effect of treatment vs baseline on metric (None when no repetition measured both); at the
    target level alone where one is named and measured (the level the deployment serves at)."""
    s = summary[summary["config"].isin([baseline, treatment])]
    if s.empty:
        return None
    wide = s.pivot_table(index=["rep", "concurrency"], columns="config", values=metric, aggfunc="first")
    if not {baseline, treatment} <= set(wide.columns):
        return None
    logr = np.log(wide[treatment] / wide[baseline]).replace([np.inf, -np.inf], np.nan).dropna()
    if logr.empty:
        return None
    by_level = logr.groupby(level="concurrency").median()
    if target is not None and target in by_level.index:
        at = logr.xs(target, level="concurrency")
        return _finish(at, at, f"at c={int(target)}, the target",
                       (float(target),), metric, baseline, treatment, equivalence_pct, level)
    one_sign = bool((by_level > 0).all() or (by_level < 0).all())
    if one_sign and len(by_level) > 1:
        per_rep = logr.unstack("concurrency").dropna().mean(axis=1)  # repetitions that measured every level
        scope = "mean over c=" + ", ".join(str(int(c)) for c in by_level.index)
        used = tuple(float(c) for c in by_level.index)
        if per_rep.empty:
            one_sign = False
    if not one_sign and len(by_level) > 1:
        # levels disagree: where some levels resolve one way and the rest resolve nothing, the resolved ones carry
        # the headline (a noisy top level on an oversubscribed host must not hide levels that are measured)
        agree = _resolved_levels(logr, level)
        if agree:
            per_rep = logr.unstack("concurrency")[agree].dropna().mean(axis=1)
            used = tuple(float(c) for c in agree)
            rest = [c for c in by_level.index if c not in agree]
            scope = ("mean over c=" if len(agree) > 1 else "at c=") + ", ".join(str(int(c)) for c in agree) + \
                f" (c={', '.join(str(int(c)) for c in rest)} not resolved)"
            one_sign = not per_rep.empty
    if not one_sign or len(by_level) == 1:
        top = by_level.index.max()
        per_rep = logr.xs(top, level="concurrency")
        scope = f"at c={int(top)}"
        used = (float(top),)
    return _finish(logr, per_rep, scope, used, metric, baseline, treatment, equivalence_pct, level)


@dataclass(frozen=True)
class Judged:
    """A comparison's headline on the metric it is judged by: goodput where the suite sets an SLO and a ratio exists
    (both sides met it in every paired repetition of the levels used), else output tok/s with why not."""

    headline: Headline | None
    metric: str
    why_not_goodput: str = ""  # '' where goodput carries it, or no SLO was set
    left_out: tuple[float, ...] = ()  # levels goodput could not be compared at (a side met the SLO for no request)


def judged_headline(summary: pd.DataFrame, baseline: str, treatment: str, slo: bool,
                    equivalence_pct: float = EQUIVALENCE_PCT, target: int | None = None) -> Judged:
    """The headline a suite's verdicts rest on: with an SLO, goodput at the levels where both sides met it in every
    repetition (a side with no request within the SLO has no ratio: the level is left out and named); output tok/s
    where there is no SLO, no such level, or the target level is among those left out."""
    tok = lambda: headline_effect(summary, "output_tok_s", baseline, treatment, equivalence_pct,  # noqa: E731
                                  target=target)
    if not slo:
        return Judged(tok(), "output_tok_s")
    if GOODPUT not in summary:
        return Judged(tok(), "output_tok_s", "no goodput was judged for these points")
    s = summary[summary["config"].isin([baseline, treatment])]
    met = s.groupby("concurrency")[GOODPUT].agg(lambda x: bool(x.notna().all() and (x > 0).all()))
    out = tuple(float(c) for c, ok in met.items() if not ok)
    if target is not None and float(target) in out:
        return Judged(tok(), "output_tok_s", f"at c={target}, the target, a side met the SLO for no request in a "
                      "repetition (no ratio)", out)
    h = headline_effect(s[~s["concurrency"].isin(out)], GOODPUT, baseline, treatment, equivalence_pct,
                        target=target)
    if h is None:
        return Judged(tok(), "output_tok_s", "at every level a side met the SLO for no request in a repetition "
                      "(no ratio)" if out else "no level paired both sides", out)
    if out:
        left = ", ".join(str(int(c)) for c in out)
        h = dataclasses.replace(h, scope=f"{h.scope}; c={left} left out: a side met the SLO for no request there")
    return Judged(h, GOODPUT, "", out)


def _finish(logr: pd.Series, per_rep: pd.Series, scope: str, used: tuple[float, ...], metric: str, baseline: str,
            treatment: str, equivalence_pct: float, level: float) -> Headline:
    """The headline from its per-repetition log ratios: interval, status and the words' scope."""
    x = np.asarray(per_rep, dtype=float)
    test = _t(x, level)
    same_sign = bool((logr > 0).all() or (logr < 0).all())
    hib = higher_is_better(metric)
    lo, hi = test.ci_low_pct, test.ci_high_pct
    if x.size < MIN_PAIRS:
        status = "unresolved"  # two pairs give an interval, but not one that a second run reproduces
    elif np.isfinite(lo) and (lo > 0 or hi < 0):
        status = "better" if (lo > 0) == hib else "worse"
    elif np.isfinite(lo) and -equivalence_pct < lo and hi < equivalence_pct and not same_sign:
        status = "no change"  # never for an effect that pointed one way in every repetition at every level
    else:
        status = "unresolved"
    return Headline(metric=metric, baseline=baseline, treatment=treatment, n=int(x.size), scope=scope,
                    effect_pct=float((np.exp(x.mean()) - 1) * 100), ci_low_pct=lo, ci_high_pct=hi,
                    p_value=test.p_value, per_rep_pct=tuple(float((np.exp(v) - 1) * 100) for v in x),
                    same_sign=same_sign, status=status, equivalence_pct=equivalence_pct, levels=used)


def _resolved_levels(logr: pd.Series, level: float) -> list[float]:
    """The levels whose own interval excludes no change, if they all point the same way and every other level is
    unresolved (resolved levels pointing both ways give []: that is a mixed answer, not a noisy one)."""
    ups, downs, unresolved = [], [], []
    for c, x in logr.groupby(level="concurrency"):
        t = _t(np.asarray(x, dtype=float), level) if len(x) >= MIN_PAIRS else None
        if t is None or not np.isfinite(t.ci_low_pct):
            unresolved.append(c)
        elif t.ci_low_pct > 0:
            ups.append(c)
        elif t.ci_high_pct < 0:
            downs.append(c)
        else:
            unresolved.append(c)
    if bool(ups) == bool(downs) or not unresolved:
        return []
    return ups or downs


def _t(x: np.ndarray, level: float) -> PairedTest:
    return paired_test(pd.Series(np.exp(x)), level)


def interval_confidence(ci_low_pct: float, ci_high_pct: float, n_pairs: int,
                        band_pct: float = EQUIVALENCE_PCT) -> Confidence:
    """How sure an effect is, from its 90% interval, so that it does not flip between runs on a p-value boundary:
    high: the whole interval lies beyond the equivalence band on one side (it surely matters); medium: it excludes
    no change but reaches into the band; low: it includes no change, or there are fewer than MIN_PAIRS pairs; none:
    nothing paired."""
    if n_pairs == 0:
        return "none"
    if n_pairs < MIN_PAIRS or not np.isfinite(ci_low_pct) or not np.isfinite(ci_high_pct):
        return "low"
    if ci_low_pct > band_pct or ci_high_pct < -band_pct:
        return "high"
    if ci_low_pct > 0 or ci_high_pct < 0:
        return "medium"
    return "low"


def confidence(p_value: float, n_pairs: int) -> Confidence:
    """How sure it is that the effect is not run-to-run noise, from the paired t-test on log ratios.

    none: nothing paired; low: fewer than MIN_PAIRS pairs or p >= 0.05; medium: p < 0.05; high: p < 0.01.
    With 3 pairs, 'high' needs the pairs to agree closely: agreeing in sign alone happens by chance 1 time in 4."""
    if n_pairs == 0:
        return "none"
    if n_pairs < MIN_PAIRS or np.isnan(p_value) or p_value >= 0.05:
        return "low"
    return "high" if p_value < 0.01 else "medium"


def verdict(levels: pd.DataFrame) -> tuple[str, str]:
    """Say what the paired effects of one metric across load levels amount to.

    Returns (direction, text): direction is 'better', 'worse', 'mixed' or 'unresolved' for the treatment,
    judged per level on levels whose confidence is medium or high; text names the levels."""
    lv = levels[levels["n_pairs"] > 0]
    if lv.empty:
        return "unresolved", "was not measured"
    hib = higher_is_better(str(lv["metric"].iloc[0]))
    sure = lv["confidence"].isin(["high", "medium"])
    good = lv[sure & ((lv["effect_pct"] > 0) == hib)]
    bad = lv[sure & ((lv["effect_pct"] > 0) != hib)]
    unsure = lv[~sure]

    def at(df: pd.DataFrame) -> str:
        return "c=" + ", ".join(str(int(c)) for c in df["concurrency"])

    if good.empty and bad.empty:
        if (lv["n_pairs"] == 1).all():
            return "unresolved", ("was measured once per configuration; one repetition cannot separate its effect "
                                  "from run-to-run noise")
        return "unresolved", "makes no difference that this measurement can resolve"
    if not good.empty and not bad.empty:
        return "mixed", f"helps at {at(good)} but hurts at {at(bad)}"
    word, which = ("helps", good) if not good.empty else ("hurts", bad)
    direction = "better" if word == "helps" else "worse"
    if unsure.empty:
        return direction, f"{word} at every load measured ({at(which)})"
    return direction, f"{word} at {at(which)}; not resolved at {at(unsure)}"
