"""Thread 7's improvement documents: one Markdown page per recommended change, written beside the report (its
changes/ folder). Each says what was found, the launch command before and after (shell-quoted, so it pastes), the
gain at each level measured with its interval and p50/p99 latencies, what it costs in KV capacity and startup, the
output check, the engine counters to watch once deployed, what it excludes or risks, and a rollback of this change
alone."""

from __future__ import annotations

import re
import shlex
from typing import Any

import pandas as pd

from ..findings import Finding
from ..queries import flag_groups
from ..spec import Knobs
from ..util import known
from .verify import BASELINE, COMBINED, Candidate, Verification, _worse


def _commands(v: Verification, c: Any) -> list[str]:
    """The launch command measured as the baseline and the same command with this change alone, shell-quoted so each
    pastes as one command ([] where the baseline's command is not stored or the change is not flags)."""
    pt = v.study.results.point(BASELINE) if v.study is not None else None
    before = str(pt.target.get("command") or "") if pt is not None else ""
    if not before or not (c.flags or c.drop_flags):
        return []
    argv = shlex.split(before)
    for group in flag_groups(list(c.drop_flags)):
        argv = _drop_sequence(argv, list(group))
    after = argv + list(c.flags)
    return ["Before (the baseline as launched here):", "", "```bash", before, "```", "",
            "After (this change alone):", "", "```bash", shlex.join(after), "```", ""]


WATCH = ("running", "queued", "kv_used_pct", "preemptions_per_s")  # the counters a change of the batch moves


def _deployed_sections(v: Verification, c: Candidate) -> list[str]:
    """What deploying it costs and gives, from the combination it joined against the baseline: per level
    throughput (effect, 90% CI) and p50/p99 TTFT and TPOT, the KV capacity and startup of each side, the output
    check, and the engine counters to watch ([] where the combination was not measured)."""
    if v.study is None or c.excluded:
        return []
    s = v.study.results.summary
    if s.empty or not {BASELINE, COMBINED} <= set(s["config"]):
        return []
    n = len(v.included)
    whose = "this change" if n == 1 else f"the combination of the {n} changes it joined"
    eff = v.compare().effects()
    tok = eff[eff["metric"] == "output_tok_s"].set_index("concurrency") if len(eff) else pd.DataFrame()
    med = s.groupby(["config", "concurrency"])[[m for m in ("output_tok_s", "ttft_ms_p50", "ttft_ms_p99",
                                                             "tpot_ms_p50", "tpot_ms_p99", "goodput_req_s")
                                                  if m in s]].median()
    reps = s.groupby("config")["rep"].nunique()
    # goodput where the suite sets an SLO: the requests per second that met it (judged from the stored requests)
    slo = str(s["slo"].dropna().iloc[0]) if "slo" in s and "goodput_req_s" in med and s["slo"].notna().any() else ""
    good = f" goodput req/s ({slo}) |" if slo else ""
    rows = [f"| c | output tok/s | effect (90% CI) | TTFT p50 / p99 ms | TPOT p50 / p99 ms |{good}",
            "|---|---|---|---|---|" + ("---|" if slo else "")]
    for lvl in sorted(set(s["concurrency"])):
        if (BASELINE, lvl) not in med.index or (COMBINED, lvl) not in med.index:
            continue
        a, b = med.loc[(BASELINE, lvl)], med.loc[(COMBINED, lvl)]
        e = tok.loc[lvl] if lvl in tok.index else None
        said = f"{e['effect_pct']:+.1f}% ({e['ci_low_pct']:+.1f}..{e['ci_high_pct']:+.1f}%)" if e is not None \
            and known(e["ci_low_pct"]) else f"{e['effect_pct']:+.1f}% (no interval)" if e is not None else ""

        def pair(m50: str, m99: str, x: pd.Series = a, y: pd.Series = b) -> str:
            return f"{x.get(m50, float('nan')):,.0f} / {x.get(m99, float('nan')):,.0f} -> " \
                   f"{y.get(m50, float('nan')):,.0f} / {y.get(m99, float('nan')):,.0f}"

        rows.append(f"| {int(lvl)} | {a['output_tok_s']:,.0f} -> {b['output_tok_s']:,.0f} | {said} | "
                    f"{pair('ttft_ms_p50', 'ttft_ms_p99')} | {pair('tpot_ms_p50', 'tpot_ms_p99')} |"
                    + (f" {a['goodput_req_s']:.2f} -> {b['goodput_req_s']:.2f} |" if slo else ""))
    levels = sorted(int(x) for x in set(s["concurrency"]))
    out = ["## Measured", "", f"{whose[:1].upper()}{whose[1:]} against the baseline, medians over "
           f"{int(reps.get(COMBINED, 0))} and {int(reps.get(BASELINE, 0))} repetitions, at c={levels[0]} to "
           f"{levels[-1]} (the range it was measured on: outside it, measure again); before -> after:", "", *rows, ""]
    out += ["## What it costs", "", *(f"- {x}" for x in _costs(v)), ""]
    verdict = v.study.output_verdict(COMBINED, BASELINE)
    out += ["## Output check", "", f"With {whose}, the server {verdict.words().replace('as baseline', 'as the baseline')}.",
            ""]
    watch = _watch(v)
    if watch:
        out += ["## What to watch after deploying", "", "The engine's own counters on its `/metrics` (medians per "
                "level over the repetitions, before -> after), to see the change working in production:", "",
                *watch, ""]
    return out


def _costs(v: Verification) -> list[str]:
    """Each side's KV capacity (the engine's own token count from its startup log) and time to its first token."""
    assert v.study is not None
    said = []
    kv = {}
    for side in (BASELINE, COMBINED):
        got = [v.ctx.adapter.kv_capacity_tokens(pt.log()) for (cfg, _), pt in v.study.results.stored.items()
               if cfg == side and pt.has_log()]
        got = [x for x in got if x]
        if got:
            kv[side] = (min(got), max(got))
    if len(kv) == 2:
        (a, _), (b, _) = kv[BASELINE], kv[COMBINED]
        said.append(f"KV cache (the engine's own token capacity, from its startup log): {a:,} tokens before, "
                    f"{b:,} after ({100 * (b / a - 1):+.1f}%)")
    else:
        said.append("KV cache: not read (the engine's startup log does not give its token capacity here)")
    st = v.study.results.startup
    if len(st) and "first_token_s" in st:
        r = st.groupby("config")["first_token_s"].agg(["min", "max"])
        if {BASELINE, COMBINED} <= set(r.index):
            a, b = r.loc[BASELINE], r.loc[COMBINED]
            said.append(f"Startup (launch to first token): {a['min']:.0f}-{a['max']:.0f} s before, "
                        f"{b['min']:.0f}-{b['max']:.0f} s after")
    return said


def _watch(v: Verification) -> list[str]:
    """One line per engine counter of WATCH: its series and its medians per level before and after."""
    assert v.study is not None
    t = v.study.engine_beside_gpu()
    counters = v.ctx.adapter.counters
    if t.empty:
        return []
    med = t.groupby(["config", "concurrency"])[[c for c in WATCH if c in t]].median()
    out = []
    for name in (c for c in WATCH if c in t and c in counters):
        per = [f"c={int(lvl)}: {_num(med.loc[(BASELINE, lvl), name])} -> {_num(med.loc[(COMBINED, lvl), name])}"
               for lvl in sorted(set(t["concurrency"]))
               if (BASELINE, lvl) in med.index and (COMBINED, lvl) in med.index]
        if per:
            out.append(f"- {name} (`{counters[name][0]}`): " + "; ".join(per))
    return out


def _num(x: float) -> str:
    """A counter's median as shown: one decimal, or 'not read'."""
    return f"{x:,.1f}" if known(x) else "not read"


def _drop_sequence(argv: list[str], drop: list[str]) -> list[str]:
    """argv with the sequence drop taken out where it occurs (each flag with its values)."""
    n = len(drop)
    if not n:
        return list(argv)
    out, i = [], 0
    while i < len(argv):
        if argv[i:i + n] == drop:
            i += n
            continue
        out.append(argv[i])
        i += 1
    return out


def _slug(words: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", words.lower()).strip("-")[:60] or "change"


def documents(v: Verification, fs: list[Finding]) -> dict[str, str]:
    """One Markdown improvement document per recommended change (file name -> text; nb.write_documents puts them in
    the report's changes/): what was found (with a link to the evidence), the change in the engine's spelling, its
    effect alone and in combination, per level with p50/p99 latencies (_deployed_sections), its KV capacity and startup
    cost, the output check, the counters to watch, what it excludes or risks, and how to roll it back."""
    head = fs[0] if fs else None
    shares = {r["change"]: r for r in v.shares().to_dict("records")}
    docs = {}
    # an alternative setting of a knob a higher-ranked change sets is said in that change's document, not its own
    kept = [c for c in v.changes if not c.alternative_to]
    for i, c in enumerate(kept, 1):
        share = shares.get(c.label)
        alternatives = [x for x in v.changes if x.alternative_to == c.label]
        if c.excluded:
            together = f"Not in the combination: {c.excluded}."
        elif head is not None and head.effect is not None:
            together = f"All {len(v.included)} joined change(s) together: {head.effect.text()} against " \
                       f"{v.baseline_words} ({head.title})."
            if share is not None:
                together += (f" Its share (the combination against it left out): {share['share_pct']:+.1f}% "
                             f"(90% CI {share['ci_low_pct']:+.1f}..{share['ci_high_pct']:+.1f}%, n={share['n']}).")
        else:
            together = "Not measured in combination in this run."
        risks = [f"Excluded: {c.excluded}"] if c.excluded else []
        risks += [f"{x.label} was left out because of it: {x.excluded}" for x in v.changes
                  if x.excluded and not x.alternative_to and c.label in x.excluded]
        risks += [f"Measured alternative, not taken: {x.label} ({x.effect} alone, {x.tier})" for x in alternatives]
        worse = _worse(v.study, BASELINE, COMBINED)[0] if v.study is not None and not c.excluded else []
        risks += [f"With the combination: {w}" for w in worse]
        dropped, added = shlex.join(c.drop_flags), shlex.join(c.flags)
        rollback = (f"Remove `{added}` from the launch command"
                    + (f" and put `{dropped}` back" if dropped else "") if c.flags
                    else f"Add `{dropped}` back to the launch command" if dropped
                    else "Run one server again in place of the replicas and their balancer" +
                    (" (and stop the MPS control daemon)" if c.knobs.get("gpu_share") == "mps" else "") if c.layout
                    else f"Set {', '.join(c.knobs)} back to {v.baseline_words}") + \
            f" and restart: the server then runs as {v.baseline_words} again."
        change = (f"Remove `{dropped}` from the launch command and add `{added}`." if c.flags and dropped
                  else f"`{added}`" if c.flags else
                  f"Remove `{dropped}` from the launch command: the engine's defaults then run as "
                  f"{Knobs(**c.knobs).label()}." if dropped else
                  f"{c.change.words[:1].upper()}{c.change.words[1:]} (knobs: {Knobs(**c.knobs).label()})."
                  if c.change.words else f"Knobs: {Knobs(**c.knobs).label()}")
        text = "\n".join([
            f"# Change {i}: {c.label}", "",
            f"Rank {i} of {len(kept)} ({c.tier}), from [{c.thread}](../{c.thread}.html#Answer).", "",
            "## What was found", "", f"**{c.title}.** {c.finding.claim}", "",
            "## The change", "", change, "", *_commands(v, c),
            "## Effect", "", f"- Alone (its own thread, against its own baseline): {c.effect or 'no measured effect'}"
            f" ({c.finding.confidence} confidence).", f"- Together: {together}", "", *_deployed_sections(v, c),
            "## What it excludes or risks", "", *(f"- {r}" for r in risks or
                                                   ["Nothing this run measured: no exclusion rule, no latency "
                                                    "metric resolvedly worse."]), "",
            "## Roll back", "", rollback, ""])
        docs[f"{i:02d}-{_slug(c.label)}.md"] = text
    return docs
