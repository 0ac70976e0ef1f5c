"""The run's answer: every finding of every thread ranked by measured effect and confidence, from the findings' data.

Tiers, in order: High, Medium, Low (a change to make, by the confidence of its measured effect; a change no
measurement backs, such as what a regime suggests, is Low), Already optimal (the current configuration is what the
measurement recommends), Measured, no change (an answer with nothing to change), Not applicable here (with why), Not
measured (a thread that could not answer). Within a tier, larger measured effects come first.
"""

from __future__ import annotations

import shlex

import pandas as pd
from markupsafe import Markup, escape

from .findings import SUMMARY as SELF
from .findings import (  # noqa: F401
    TIERS,
    Change,
    Finding,
    Verdict,
    collect,
    failed_change,
    failures_of,
    sentences,
    sureness,
    tier,
)

QUESTION = "Which changes, ranked by measured effect, should we make?"


def rank(findings: dict[str, list[Finding]], link: str = "{thread}.html#Answer") -> pd.DataFrame:
    """One row per finding, ranked: tier, thread, finding, measured effect, confidence, what to change, why, and a
    link to its evidence in the thread's HTML. A change containing a configuration that failed in this run is
    excluded, with the failure as its why."""
    rows = []
    failed = failures_of(findings)
    for thread, fs in findings.items():
        for i, f in enumerate(fs):
            t = tier(f, failed)
            change = shlex.join(f.recommended_flags)  # pasted into a shell as it is
            if f.recommendation:
                change = f"{change}; {f.recommendation}" if change else f.recommendation
            effect = f.effect.text() if f.effect is not None else ("not measured: suggested by the readings"
                                                                   if t == "Low" else "")
            rows.append({"tier": t, "thread": thread, "finding": f.title, "effect": effect,
                         "optimal": optimal_words(f) if t == "Already optimal" else "",
                         "effect_pct": abs(f.effect.value_pct) if f.effect is not None else float("nan"),
                         "confidence": f.confidence, "sureness": sureness(f.confidence, f.effect), "change": change,
                         "why": _why(f, t, failed), "evidence": link.format(thread=thread), "order": i,
                         "alternative": bool(f.change is not None and f.change.alternative_to),
                         "knob_keys": ",".join(sorted(f.change.knob_settings)) if f.change is not None else ""})
    # order: the finding's place in its thread (0: the thread's headline), as data for the pages that pick one
    cols = ["tier", "thread", "finding", "effect", "confidence", "sureness", "change", "why", "evidence", "optimal",
            "knob_keys", "order"]
    if not rows:
        return pd.DataFrame(columns=cols)
    df = pd.DataFrame(rows)
    df["_t"] = df["tier"].map(TIERS.index)
    # within a tier, a setting its thread did not pick (verify.changes says why) ranks after the picks
    df = df.sort_values(["_t", "alternative", "effect_pct", "thread", "order"],
                        ascending=[True, True, False, True, True], na_position="last", ignore_index=True)
    return df[cols]


def _why(f: Finding, t: str, failed: list) -> str:
    if f.change is not None and f.change.alternative_to and t in TIERS[:3]:
        return f"its thread picked {f.change.alternative_to} instead: {f.headline}"[:300]
    if t == "Excluded: failed here":
        x = failed_change(f, failed)
        return f"its configuration {x.config} {x.words()}"[:400] if x is not None else ""
    return f.reason if t in ("Not applicable here", "Not measured", "Already optimal") else f.headline[:300]


def optimal_words(f: Finding) -> str:
    """What is already right and what it beat: the side the measurement chose (the current configuration) against
    the one it beat, with the effect; the finding's title where it measured no pair."""
    e = f.effect
    if e is None or not e.baseline or not e.treatment:
        return f.title
    won, lost = (e.treatment, e.baseline) if f.direction == "better" else (e.baseline, e.treatment)
    return f"{won} (it beat {lost}: {e.text()})"


def _change_key(ranked: pd.DataFrame) -> pd.Series:
    """What makes two rows the same change: the same flags, or the same knobs where their findings' changes are typed
    (07's combination spells 02's mode with the deployment's flags dropped); each row gets its group's first index."""
    group: dict[int, int] = {}

    def root(i: int) -> int:
        while group.get(i, i) != i:
            i = group[i]
        return i

    first: dict[tuple[str, str], int] = {}
    for i, r in zip(ranked.index, ranked.itertuples(), strict=True):
        group[i] = i
        for kind, v in (("change", str(r.change)), ("knobs", str(getattr(r, "knob_keys", "") or ""))):
            if not v:
                continue
            if (kind, v) in first:
                a, b = root(first[kind, v]), root(i)
                group[max(a, b)] = min(a, b)
            else:
                first[kind, v] = i
    return pd.Series([root(i) for i in ranked.index], index=ranked.index)


def each_change_once(ranked: pd.DataFrame) -> pd.DataFrame:
    """The ranking with each recommended change on one row, its best-ranked finding's, and found_by naming every
    thread that found it (02's mode, 02's headline and 07's verification name one fix)."""
    if ranked.empty:
        return ranked
    recs = ranked["tier"].isin(TIERS[:3]) & (ranked["change"].astype(str) != "")
    key = _change_key(ranked)
    found = ranked[recs].groupby(key[recs], sort=False)["thread"].agg(lambda t: ", ".join(dict.fromkeys(t)))
    keep = ~recs | ~key.where(recs).duplicated(keep="first")
    out = ranked[keep].copy()
    out["found_by"] = [found.get(k, "") if r else "" for k, r in zip(key[keep], recs[keep], strict=True)]
    # one thread alone is the thread column already
    out.loc[~out["found_by"].str.contains(",", regex=False), "found_by"] = ""
    return out.reset_index(drop=True)


def recommendations(ranked: pd.DataFrame, n: int = 5) -> pd.DataFrame:
    """The top changes to make (tiers High, Medium, Low), best first, each change once (a thread's headline and its
    per-mode finding, or a regime's suggestion, may name the same flags: the best-ranked one stands for them)."""
    recs = ranked[ranked["tier"].isin(TIERS[:3])]
    # every thread that found the same change, said beside the one that stands for it
    key = _change_key(recs)
    found = recs.groupby(key, sort=False)["thread"].agg(lambda t: ", ".join(dict.fromkeys(t)))
    recs = recs[~key.duplicated(keep="first")].assign(found_by=lambda d: _change_key(d).map(found))
    if "knob_keys" in recs:  # alternatives for the same knob (graph modes, say): the best-ranked one stands
        keyed = recs["knob_keys"].astype(str) != ""
        recs = recs[~keyed | ~recs["knob_keys"].duplicated(keep="first")]
    return recs.head(n).reset_index(drop=True)


def regime(findings: dict[str, list[Finding]]) -> str:
    """The regime of the server under load, as thread 03 found it (its headline and per-configuration regimes), or
    why it is not known."""
    fs = findings.get("03_clocks_power")
    if not fs:
        return "not measured: thread 03 (clocks, power and regimes) did not run"
    lines = [f.title for f in fs]
    shown = lines[:4]
    return "; ".join(shown) + (f"; and {len(lines) - len(shown)} more in 03_clocks_power" if len(lines) > 4 else "")


def findings(ranked: pd.DataFrame, by_thread: dict[str, list[Finding]]) -> list[Finding]:
    """The summary's own answer: the top change with its measured effect, or that nothing measured asks for one."""
    top = recommendations(ranked, 1)
    # a thread that could not answer: every one of its findings is Not measured
    failed = sorted(t for t, g in ranked.groupby("thread") if (g["tier"] == "Not measured").all()) if len(ranked) \
        else []
    evidence = {"ranked": ranked.to_dict("records"), "regime": regime(by_thread), "not_measured": failed}
    if len(top):
        r = top.iloc[0]
        return [Finding(thread=SELF, kind="ranking", title=f"First change: {r.finding}", applies=True,
                        confidence=r.confidence if r.confidence in ("high", "medium", "low") else "low",
                        headline=f"{r.finding} ({r.thread}): {r.effect or 'no measured effect'}; change: {r.change}",
                        detail=f"{len(recommendations(ranked, 99))} change(s) ranked in all; regime under load: "
                               f"{regime(by_thread)}.", change=Change(words=r.change), evidence=evidence)]
    answered = int((ranked["tier"] != "Not measured").sum()) if len(ranked) else 0
    if not answered:
        return [Finding(thread=SELF, kind="ranking", title="Nothing measured to rank", applies=False,
                        confidence="none", headline="No thread of this run stated an answer", reason="no findings",
                        evidence=evidence)]
    return [Finding(thread=SELF, kind="ranking", title="No change to recommend", applies=True, confidence="medium",
                    **sentences(f"{answered} findings answered and none asks for a change"
                                + (f" ({', '.join(failed)} could not answer)" if failed else "") + "; regime under load: "
                                f"{regime(by_thread)}."), evidence=evidence)]


NONE_VERIFIED = "no scheduler setting was verified: "


def front_line(verification: list[Finding]) -> str:
    """The report's first line, rendered from thread 07's verdicts (the combined changes', then the scheduler
    search's): the verified answer, with the scheduler setting where one was verified too. Every way of verifying no
    setting opens the scheduler half the same: a second run whose one-launch lead happened to clear the floor, then
    failed its repetitions, says what the first run said."""
    head, tune = ([f.verdict for f in verification] + [None, None])[:2]

    def said(v: Verdict) -> str:
        return ("Verified: " if v.verified else "Not verified: ") + v.words

    if tune is None:
        return said(head) if head is not None else ""
    if not tune.verified:
        return (f"{said(head)}; " if head is not None else "") + NONE_VERIFIED + tune.words
    if head is not None and head.verified:
        return f"{said(head)}; scheduler tuning on top: {tune.words}"
    return f"Verified: {tune.words}" + (f" (not verified: {head.words})" if head is not None else "")


def change_html(change: str, words: bool = False) -> Markup:
    """A change or claim for the front page: flags alone as one code span (words=True: as text); a change in words (04's
    layout) as text with its `quoted` flags as code, not one code span showing the backticks."""
    if "`" not in change:
        return escape(change) if words else Markup("<code>{}</code>").format(change)
    parts = change.split("`")
    return Markup("").join(Markup("<code>{}</code>").format(p) if i % 2 else escape(p) for i, p in enumerate(parts))
