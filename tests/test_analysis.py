"""Paired A/B effects, confidence rules and verdicts on hand-made data with known answers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from servescope.analysis.ab import confidence, higher_is_better, paired_effects, verdict


def _summary(values: dict[tuple[str, int], list[float]], metric: str = "output_tok_s") -> pd.DataFrame:
    rows = [{"config": cfg, "concurrency": c, "rep": r, metric: v}
            for (cfg, c), vs in values.items() for r, v in enumerate(vs)]
    return pd.DataFrame(rows)


def test_paired_effects_median_ratio_and_paired_range():
    s = _summary({("a", 1): [100, 110, 90], ("b", 1): [120, 121, 117]})
    (row,) = paired_effects(s, "output_tok_s", "a", "b").to_dict("records")
    assert row["effect_pct"] == pytest.approx(20.0)  # median 120 / median 100
    assert row["low_pct"] == pytest.approx(10.0)  # rep 1: 121/110
    assert row["high_pct"] == pytest.approx(30.0)  # rep 2: 117/90
    assert row["n_pairs"] == 3 and row["confidence"] == "low"  # +10..+30%: too spread for 3 pairs
    assert row["ci_low_pct"] < 20 < row["ci_high_pct"]
    assert row["baseline_spread_pct"] == pytest.approx(20.0)


def test_unpaired_repetition_is_not_counted():
    s = _summary({("a", 4): [100, 100], ("b", 4): [150]})
    (row,) = paired_effects(s, "output_tok_s", "a", "b").to_dict("records")
    assert row["n_pairs"] == 1 and row["confidence"] == "low"


@pytest.mark.parametrize("p,n,want", [
    (0.001, 3, "high"), (0.03, 3, "medium"), (0.2, 5, "low"), (float("nan"), 1, "low"), (float("nan"), 0, "none"),
])
def test_confidence_rules(p, n, want):
    assert confidence(p, n) == want


def test_paired_test_separates_consistent_from_noisy_pairs():
    from servescope.analysis.ab import paired_test

    tight = paired_test(pd.Series([1.91, 1.97, 2.11]))  # three pairs, close together: a real doubling
    assert tight.p_value < 0.01 and 80 < tight.ci_low_pct < 100 < tight.ci_high_pct < 120
    noisy = paired_test(pd.Series([0.33, 0.62, 0.99]))  # same sign three times, but all over the place
    assert noisy.p_value > 0.05 and noisy.ci_low_pct < 0 < noisy.ci_high_pct + 100
    assert np.isnan(paired_test(pd.Series([1.5])).p_value)  # one pair: no test


def test_direction_of_better():
    assert higher_is_better("output_tok_s") and not higher_is_better("ttft_ms_p50")
    assert not higher_is_better("e2e_ms_p99") and higher_is_better("request_s")


def test_verdicts_name_the_levels():
    def lv(rows):
        return pd.DataFrame([{"metric": "output_tok_s", "concurrency": c, "effect_pct": e, "n_pairs": n,
                              "confidence": conf} for c, e, n, conf in rows])
    assert verdict(lv([(1, 50, 3, "high"), (4, 20, 3, "high")])) == ("better", "helps at every load measured (c=1, 4)")
    assert verdict(lv([(1, 50, 3, "high"), (16, 20, 3, "low")])) == ("better", "helps at c=1; not resolved at c=16")
    assert verdict(lv([(1, -30, 3, "medium")]))[0] == "worse"
    assert verdict(lv([(1, 30, 3, "high"), (16, -30, 3, "high")]))[0] == "mixed"
    assert "measured once" in verdict(lv([(1, 30, 1, "low")]))[1]
    assert "cannot resolve" not in verdict(lv([(1, 3, 3, "low")]))[1]
    ttft = lv([(1, -40, 3, "high")]).assign(metric="ttft_ms_p50")
    assert verdict(ttft)[0] == "better"  # lower latency is better
