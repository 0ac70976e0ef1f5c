"""Paired A/B effects, confidence rules and verdicts on hand-made data with known answers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from servescope.analysis.ab import confidence, headline_effect, higher_is_better, interval_confidence, paired_effects, verdict


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
    # +10..+30%: the 90% interval (+4..+38%) excludes no change but reaches into +-5%
    assert row["n_pairs"] == 3 and row["confidence"] == "medium"
    assert 0 < row["ci_low_pct"] < 5 and row["ci_low_pct"] < 20 < row["ci_high_pct"]
    assert row["baseline_spread_pct"] == pytest.approx(20.0)


def test_unpaired_repetition_is_not_counted():
    s = _summary({("a", 4): [100, 100], ("b", 4): [150]})
    (row,) = paired_effects(s, "output_tok_s", "a", "b").to_dict("records")
    assert row["n_pairs"] == 1 and row["confidence"] == "low"


def test_point_estimate_comes_from_the_pairs_when_one_side_lacks_a_repetition():
    # the H200's 3-replica MPS arm lost its third launch to the device budget: time-sliced had 3 repetitions, MPS 2, and
    # the median over all three put -6% beside a paired interval of +3..+5%
    s = _summary({("ts", 1): [100, 104, 130], ("mps", 1): [103, 109]})
    (row,) = paired_effects(s, "output_tok_s", "ts", "mps").to_dict("records")
    assert row["n_pairs"] == 2
    assert row["ci_low_pct"] <= row["effect_pct"] <= row["ci_high_pct"]
    assert row["effect_pct"] == pytest.approx(106 / 102 * 100 - 100)  # medians of the pairs: 102 and 106
    assert row["baseline_spread_pct"] == pytest.approx(30 / 104 * 100)  # the spread still sees every repetition


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


@pytest.mark.parametrize("lo,hi,n,want", [
    (6.0, 30.0, 3, "high"), (-40.0, -8.0, 3, "high"), (2.0, 30.0, 3, "medium"), (-3.0, 30.0, 3, "low"),
    (float("nan"), float("nan"), 1, "low"), (float("nan"), float("nan"), 0, "none"), (6.0, 30.0, 2, "low"),
])
def test_interval_confidence_rules(lo, hi, n, want):
    assert interval_confidence(lo, hi, n) == want


# Thread 02 on the H200, run cold on 2026-12-01 (transformers serve 5.17, CUDA graphs full vs off, output tok/s), two
# repetitions: graphs won in both at every level. Two pairs are never enough to resolve (the standard: a verdict must
# survive a second run), however one-sided they look: the headline says what it saw and asks for a third.
H200_COLD = {("off", 1): [51, 54], ("full", 1): [112, 113], ("off", 8): [428, 331], ("full", 8): [715, 716],
             ("off", 32): [965, 1075], ("full", 32): [1589, 1636]}


def test_two_repetitions_resolve_nothing_however_one_sided():
    h = headline_effect(_summary(H200_COLD), "output_tok_s", "off", "full")
    assert h.status == "unresolved" and not h.resolved and h.same_sign and h.n == 2
    assert h.scope == "mean over c=1, 8, 32" and h.confidence == "low"
    assert h.ci_low_pct > 50 and 80 < h.effect_pct < 90  # the interval is still computed and shown
    assert [round(v) for v in h.per_rep_pct] == [82, 90]  # one value per repetition: levels of a launch, averaged
    third = {k: [*v, v[0]] for k, v in H200_COLD.items()}  # a third repetition like the first
    h3 = headline_effect(_summary(third), "output_tok_s", "off", "full")
    assert h3.status == "better" and h3.n == 3 and h3.confidence == "high"


def test_one_sign_everywhere_is_never_no_change():
    # +1..+2% in every repetition at every level, noisy enough that the interval would sit inside +-5%
    s = _summary({("a", 1): [100, 100, 100], ("b", 1): [100.2, 104.0, 100.4],
                  ("a", 4): [100, 100, 100], ("b", 4): [100.1, 103.6, 100.3]})
    h = headline_effect(s, "output_tok_s", "a", "b")
    assert h.same_sign and h.status != "no change"
    flat = _summary({("a", 1): [100, 100, 100, 100], ("b", 1): [101, 99, 100.5, 99.5]})
    assert headline_effect(flat, "output_tok_s", "a", "b").status == "no change"


def test_levels_that_disagree_in_sign_headline_at_the_highest_level():
    s = _summary({("a", 1): [100, 100, 100], ("b", 1): [150, 160, 155], ("a", 16): [100, 100, 100],
                  ("b", 16): [80, 82, 79]})
    h = headline_effect(s, "output_tok_s", "a", "b")
    assert h.scope == "at c=16" and h.status == "worse" and not h.same_sign


def test_graph_use_from_a_trace_alone():
    """Graph launches in the runtime table and kernels marked as graph nodes decide a window's graph use; a CPU
    trace (no GPU kernel) cannot tell, and says why."""
    from servescope.analysis.kernels import graph_use

    def kernels(n: int, nodes: int, source: str) -> pd.DataFrame:
        return pd.DataFrame({"name": ["k"] * n, "device": [0] * n, "source": [source] * n,
                             "graph_node": [1.0] * nodes + [float("nan")] * (n - nodes)})

    def runtime(graphs: int, eager: int) -> pd.DataFrame:
        return pd.DataFrame({"name": ["cudaGraphLaunch"] * graphs + ["cudaLaunchKernel"] * eager})

    assert graph_use(kernels(100, 0, "nsys"), runtime(0, 100))["graphs"] == "off"
    on = graph_use(kernels(100, 97, "nsys"), runtime(3, 3))
    assert on["graphs"] == "on" and on["kernels_in_graphs"] == 97 and "97% of 100 kernels" in on["why"]
    assert graph_use(kernels(100, 20, "nsys"), runtime(1, 80))["graphs"] == "partly"
    # the PyTorch profiler marks no graph node: the launch calls decide
    torch_on = graph_use(kernels(50, 0, "torch"), runtime(10, 40))
    assert torch_on["graphs"] == "on" and "does not mark graph nodes" in torch_on["why"]
    assert graph_use(kernels(50, 0, "torch"), runtime(0, 50))["graphs"] == "off"
    cpu = graph_use(pd.DataFrame({"name": ["aten::mm"], "device": [-1], "source": ["torch"],
                                  "graph_node": [float("nan")]}))
    assert cpu["graphs"] == "" and "CPU engine" in cpu["why"]


def test_a_noisy_top_level_does_not_hide_the_resolved_levels():
    """The case of issue 34 (a cold `make report` on the oversubscribed 2-core machine): compile against eager,
    c=1 and c=4 resolved (+37%, +98%), c=16 per repetition +608%, +19%, -25%, -17%. The headline was 'at c=16' and
    unresolved; the resolved levels now carry it, and the scope says which level was left out and why."""
    rows = []
    for rep, (a, b, c) in enumerate([(1.36, 1.95, 7.08), (1.38, 2.01, 1.19), (1.37, 1.97, 0.75), (1.35, 1.99, 0.83)]):
        for conc, ratio in ((1, a), (4, b), (16, c)):
            rows += [{"config": "eager", "rep": rep, "concurrency": conc, "output_tok_s": 100.0},
                     {"config": "compiled", "rep": rep, "concurrency": conc, "output_tok_s": 100.0 * ratio}]
    h = headline_effect(pd.DataFrame(rows), "output_tok_s", "eager", "compiled")
    assert h.scope == "mean over c=1, 4 (c=16 not resolved)" and h.status == "better" and h.n == 4
    assert 60 < h.effect_pct < 70 and h.ci_low_pct > 50
    # resolved levels pointing both ways are a mixed answer, not noise: the top level stays the headline
    flip = pd.DataFrame(rows)
    flip.loc[(flip["config"] == "compiled") & (flip["concurrency"] == 4), "output_tok_s"] = 50.0
    assert headline_effect(flip, "output_tok_s", "eager", "compiled").scope == "at c=16"


def _starved_words(head_width: float, level_widths: dict[int, float], scope: str = "mean over c=1, 4") -> str:
    """Comparison._starved_intervals over a hand-built study: every point starved, the given interval widths."""
    from types import SimpleNamespace

    import pandas as pd

    from servescope.comparison import Comparison

    health = pd.DataFrame([{"config": cfg, "point": f"c={c}", "client_starved": True}
                           for c in level_widths for cfg in ("eager", "compiled") for _ in range(3)])
    effects = pd.DataFrame([{"metric": "output_tok_s", "concurrency": c, "n_pairs": 3, "ci_low_pct": 10.0,
                             "ci_high_pct": 10.0 + w} for c, w in level_widths.items()])
    study = SimpleNamespace(results=SimpleNamespace(client_health=lambda: health))
    levels = (1.0, 4.0) if scope.startswith("mean over") else (1.0,)  # the levels the scope's words name
    head = SimpleNamespace(ci_low_pct=20.0, ci_high_pct=20.0 + head_width, scope=scope, levels=levels)

    class Fixed(Comparison):
        def headline(self, metric: str = "output_tok_s"):  # noqa: ANN201 - the stand-in's shape
            return head

    from servescope.analysis.ab import Judged

    cmp = Fixed(study, "eager", "compiled", ("compile",))  # type: ignore[arg-type]
    cmp._effects = effects
    cmp._judged = Judged(head, "output_tok_s")  # type: ignore[arg-type]
    return cmp._starved_intervals()


def test_the_starved_note_says_the_headline_is_narrower_only_when_it_is():
    narrower = _starved_words(40.0, {1: 75.0, 4: 148.0})
    assert "c=1: 6 of 6 points, 75 points wide; c=4: 6 of 6 points, 148 points wide" in narrower
    assert "is 40 points wide, narrower than any one level's: each repetition's mean" in narrower
    wider = _starved_words(97.0, {1: 75.0, 4: 148.0})
    assert "is 97 points wide." in wider and "narrower" not in wider
    # a headline carried by one level is that level's own interval: nothing averaged, nothing to explain
    one = _starved_words(40.0, {1: 75.0, 4: 148.0}, scope="at c=1 (c=4 not resolved)")
    assert "narrower" not in one


def test_a_medium_effect_asks_for_another_repetition():
    """Resolved in sign but reaching into the band (the first cold run's compile, +44.4%, 90% CI +2.5..+103.5%) asks
    for one more repetition; wholly beyond the band (the second's, +30.2..+105.6%) or 'no change' does not."""
    from servescope.analysis.ab import Headline
    from servescope.study import needs_repetition

    def h(status: str, lo: float, hi: float, n: int = 3) -> Headline:
        return Headline(metric="output_tok_s", baseline="eager", treatment="compiled", n=n, scope="mean over c=1",
                        effect_pct=(lo + hi) / 2, ci_low_pct=lo, ci_high_pct=hi, p_value=0.04, per_rep_pct=(1.0,) * n,
                        same_sign=True, status=status)

    assert needs_repetition(h("better", 2.5, 103.5)) and h("better", 2.5, 103.5).confidence == "medium"
    assert not needs_repetition(h("better", 30.2, 105.6))
    assert needs_repetition(h("unresolved", -10.0, 50.0))
    assert not needs_repetition(h("no change", -2.0, 3.0))
    assert needs_repetition(h("worse", -60.0, -1.0))


def test_a_target_level_carries_the_headline_alone():
    """Where the suite names the level the deployment serves at, the headline is judged there, whatever the other
    levels say (here they disagree in sign, which alone would put it at the highest level)."""
    s = _summary({("a", 1): [100, 100, 100], ("b", 1): [150, 160, 155], ("a", 16): [100, 100, 100],
                  ("b", 16): [80, 82, 79], ("a", 64): [100, 100, 100], ("b", 64): [90, 91, 89]})
    h = headline_effect(s, "output_tok_s", "a", "b", target=1)
    assert h.scope == "at c=1, the target" and h.levels == (1.0,) and h.status == "better" and h.same_sign
    assert 50 < h.effect_pct < 60
    # a target the comparison did not measure leaves the rule over the levels
    assert headline_effect(s, "output_tok_s", "a", "b", target=32).scope == "at c=64"


def test_an_slo_judges_on_goodput_where_both_sides_met_it_and_names_the_levels_left_out():
    """Goodput is a ratio only where both sides met the SLO: a repetition with no request within it on one side
    (0 req/s) would be a log ratio of minus infinity, dropped, biasing the headline toward the side that met it. Such
    a level is left out and named; with none left, or the target among them, the verdict stays on output tok/s."""
    from servescope.analysis.ab import judged_headline

    tok = _summary({("a", 1): [100, 101, 99], ("b", 1): [200, 199, 202], ("a", 8): [400, 390, 410],
                    ("b", 8): [600, 610, 590]})
    good = _summary({("a", 1): [1.0, 1.1, 0.9], ("b", 1): [2.0, 2.1, 1.9], ("a", 8): [0.0, 2.0, 1.0],
                     ("b", 8): [3.0, 3.1, 2.9]}, "goodput_req_s")
    s = tok.merge(good, on=["config", "concurrency", "rep"])
    plain = judged_headline(s, "a", "b", slo=False)
    assert plain.metric == "output_tok_s" and plain.headline is not None and plain.headline.levels == (1.0, 8.0)
    j = judged_headline(s, "a", "b", slo=True)
    assert j.metric == "goodput_req_s" and j.left_out == (8.0,) and j.headline.levels == (1.0,)
    assert j.headline.scope == "at c=1; c=8 left out: a side met the SLO for no request there"
    assert j.headline.effect_pct == pytest.approx(100.0, abs=3)
    at8 = judged_headline(s, "a", "b", slo=True, target=8)
    assert at8.metric == "output_tok_s" and "at c=8, the target" in at8.why_not_goodput
    none = s.assign(goodput_req_s=0.0)
    j = judged_headline(none, "a", "b", slo=True)
    assert j.metric == "output_tok_s" and j.why_not_goodput.startswith("at every level a side met the SLO for no")
