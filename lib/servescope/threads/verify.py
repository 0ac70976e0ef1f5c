"""Thread 7: the run's recommended changes measured together against the baseline, then the scheduler tuned around
them.

The changes are the High and Medium findings of the threads before it (99's tiers) that name knobs. They are composed
in rank order into one configuration: a change that sets a knob a higher-ranked one already set, that an audit rule
of this engine excludes (thread 05's compile-and-piecewise verdict), or that the engine version cannot express
together with the rest, is left out with that reason. The combined configuration is measured against the baseline (the
engine's defaults, or the suite's baseline knobs: the deployment as it runs today) in alternating repetitions until
the effect is resolved; each change's share comes from leaving it out (where the budget allows). The scheduler knobs
this engine version can express are then searched on a coarse grid, one knob at a time around the combined
configuration, at the load's target level (else its highest), one launch per setting within a budget; the best
setting is verified against the combined configuration with repetitions of its own."""

from __future__ import annotations

import shlex
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import pandas as pd

from ..comparison import Comparison
from ..context import RepetitionPlan, RunContext
from ..errors import SpecError
from ..experiment import is_stored
from ..findings import Change as FindingChange
from ..findings import Finding, Outcome, Verdict, failures_of, tier
from ..install import EngineInstall
from ..queries import expressible, flag_groups
from ..spec import Knobs, ProfileSpec
from ..store import boot_id
from ..study import Arm, Study, drop_empty, run_study
from ..telemetry.base import UNMEASURED
from ..util import known

THREAD = "07_verified_changes"
QUESTION = "Do the recommended changes, made together, deliver, and which scheduler setting adds to them?"
ROLE = "verification"  # what the report reads this thread for (threads.by_role)
BASELINE, COMBINED = "baseline", "combined"
TIERS = ("High", "Medium")  # the recommended changes: a measured effect of high or medium confidence
# the scheduler knobs searched, as multiples of the load's highest concurrency (running requests) or absolute values
SEARCH: dict[str, tuple[float, ...]] = {
    # x the highest concurrency: a cap at or above it cannot bind (at most that many requests are in flight)
    "max_running_requests": (0.25, 0.5, 0.75),
    "chunked_prefill_size": (512, 2048, 8192),  # tokens per step: prefill chunking (transformers: --cb-max-batch-tokens)
    "num_continuous_decode_steps": (2, 4, 8),
    "cuda_graph_max_bs": (0.5, 2.0),  # x the highest concurrency: decode batches above it run without a graph
}
# what `search=None` searches (the decode-graph batch cap is asked for by name: a suite of a GPU engine lists it)
DEFAULT_SEARCH = ("max_running_requests", "chunked_prefill_size", "num_continuous_decode_steps")
# the resolved-state fields (what the engine says it ran as) each knob moves; the others must stay equal
# ('eager' goes with compile: where an engine has an eager switch, vLLM's --enforce-eager, that is how it spells
# compile off, and dropping it is the change)
STATE = {"torch_compile": ("compile", "eager"), "cuda_graph": ("graph_decode", "graph_prefill"), "tp": ("tp",),
         "dp": ("dp",)}
FIELDS = ("compile", "eager", "graph_decode", "graph_prefill", "tp", "dp")

# how a search setting ended: launched (measured or failed), or not launched and why
SearchState = Literal["measured", "failed", "not measured", "not expressible", "budget spent", "count reached",
                      "run budget spent", "not tried by the measuring run", "not read", "cannot bind", "the default",
                      "other machine start"]
LAUNCHED: tuple[SearchState, ...] = ("measured", "failed", "other machine start")
# the words of the states a measuring run keeps in the store for an offline render (and earlier runs kept)
SKIPPED_WORDS: dict[SearchState, str] = {"budget spent": "not tried: search budget spent",
                                         "count reached": "not tried: search_settings reached",
                                         "run budget spent": "not tried: the run's budget (--budget-s) ended first"}
BUDGET_SPENT, COUNT_REACHED = SKIPPED_WORDS["budget spent"], SKIPPED_WORDS["count reached"]
# a search stopped by a budget goes on where it stopped when run again online
UNFINISHED = (BUDGET_SPENT, SKIPPED_WORDS["run budget spent"])


@dataclass(frozen=True)
class SearchRow:
    """One scheduler setting of the search: its one launch's throughput against the reference, or why it was not
    launched (state and reason apart)."""

    setting: str
    state: SearchState
    reason: str = ""
    flags: str = ""
    output_tok_s: float = float("nan")
    vs_combined_pct: float = float("nan")
    reference: bool = False  # the configuration the search tunes around
    launches: int = 0  # measured launches: one per machine start the setting ran in, each against its start's reference
    low_pct: float = float("nan")  # the lowest and highest lead over those launches (where more than one)
    high_pct: float = float("nan")

    @property
    def status(self) -> str:
        """The state in words: 'measured', 'failed: why', 'not tried: search budget spent', ..."""
        if self.state in ("not read", "cannot bind", "the default"):
            return f"not launched: {self.reason}"
        if self.state == "other machine start":
            return f"shown apart: {self.reason}"
        return SKIPPED_WORDS.get(self.state) or (f"{self.state}: {self.reason}" if self.reason else self.state)

    def as_dict(self) -> dict[str, Any]:
        """The row for a table: its fields, with the state in words."""
        return {"setting": self.setting, "flags": self.flags, "output_tok_s": self.output_tok_s,
                "vs_combined_pct": self.vs_combined_pct, "status": self.status, "state": self.state,
                "reason": self.reason, "reference": self.reference}


@dataclass
class Candidate:
    """One recommended change of the run: the finding behind it (its typed change), and whether it joined the
    combination (excluded: why not)."""

    thread: str
    finding: Finding
    tier: str
    excluded: str = ""
    alternative_to: str = ""  # the higher-ranked change that sets the same knob otherwise (an alternative, not a change)

    @property
    def change(self) -> FindingChange:
        """The change the finding recommends (changes() takes only findings that name one)."""
        assert self.finding.change is not None
        return self.finding.change

    @property
    def title(self) -> str:
        """The title of the finding behind it."""
        return self.finding.title

    @property
    def knobs(self) -> dict[str, Any]:
        """The knobs the change sets."""
        return self.change.knob_settings

    @property
    def flags(self) -> list[str]:
        """The engine's flags to add."""
        return list(self.change.flags)

    @property
    def drop_flags(self) -> list[str]:
        """The deployment's flags the change removes."""
        return list(self.change.drop_flags)

    @property
    def alternative_of(self) -> str:
        """The setting its own thread picked instead of this one ('' for a pick)."""
        return self.change.alternative_to

    @property
    def effect(self) -> str:
        """Its measured effect alone, in words ('' where none)."""
        return self.finding.effect.text() if self.finding.effect is not None else ""

    @property
    def effect_pct(self) -> float:
        """The size of its measured effect alone, in % (0 where none)."""
        return abs(self.finding.effect.value_pct) if self.finding.effect is not None else 0.0

    @property
    def label(self) -> str:
        """The change in the engine's spelling, else its short name (a layout), its words, or its knobs."""
        return shlex.join(self.flags) or self.change.name or self.change.words or Knobs(**self.knobs).label()

    @property
    def layout(self) -> str:
        """Its name where no flag of the engine says it (a layout of servers: '2 replicas on 1 GPU with MPS, ...'),
        else ''."""
        return self.change.name if not self.flags and self.change.name else ""


def changes(by_thread: dict[str, list[Finding]]) -> list[Candidate]:
    """The run's recommended changes that name knobs (High, then Medium; larger measured effects first), from the
    findings of the threads before this one."""
    out: list[Candidate] = []
    failed = failures_of(by_thread)
    for thread, fs in by_thread.items():
        if thread == THREAD:
            continue
        for f in fs:
            t = tier(f, failed)
            if t in TIERS and f.change is not None and f.change.knob_settings:
                out.append(Candidate(thread, f, t))
    # a setting its thread measured but did not pick (a graph mode not told apart from the one it chose) ranks after
    # the pick, so that the pick, not the larger point estimate, takes the knob
    out.sort(key=lambda c: (TIERS.index(c.tier), bool(c.alternative_of), -c.effect_pct))
    seen: set[str] = set()
    uniq = []
    for c in out:  # a headline and its per-mode finding may name the same change: the best-ranked one stands
        key = repr(sorted(c.knobs.items()))
        if key not in seen:
            seen.add(key)
            uniq.append(c)
    return uniq


Rule = tuple[dict[str, Any], dict[str, Any], str]  # two knob settings this engine cannot run together, and why


def exclusion_rules(by_thread: dict[str, list[Finding]]) -> list[Rule]:
    """Pairs of knob settings this engine cannot run together, with the rule, as the run's findings carry them (the
    excludes of their changes: thread 05's compile and piecewise graphs)."""
    out: list[Rule] = []
    for c in (f.change for fs in by_thread.values() for f in fs):
        for x in c.excludes if c is not None else []:
            rule = (c.knob_settings, dict(x.knobs), x.why)
            if not any(r[:2] == rule[:2] for r in out):
                out.append(rule)
    return out


def compose(baseline: Knobs, found: list[Candidate], rules: Sequence[Rule] = ()) -> tuple[Knobs, list[Candidate]]:
    """The baseline with every change applied in rank order; a change that conflicts with one ranked above it (the
    same knob set otherwise, or an exclusion rule) is left out with why. Returns the combined knobs and the changes,
    each marked."""
    merged = baseline.model_dump()
    taken: dict[str, Candidate] = {}
    for c in found:
        clash = [k for k, v in c.knobs.items() if k in taken and taken[k].knobs.get(k) != v]
        if clash:
            k = clash[0]
            c.excluded = (f"sets {k}={c.knobs[k]}, which the higher-ranked {taken[k].label} sets to "
                          f"{taken[k].knobs[k]}")
            c.alternative_to = taken[k].label
            continue
        trial = {**merged, **c.knobs}
        broken = next((why for a, b, why in rules if _has(trial, a) and _has(trial, b)
                       and not (_has(merged, a) and _has(merged, b))), "")
        if broken:
            c.excluded = f"excluded by a rule of this engine, the higher-ranked change wins: {broken[:300]}"
            continue
        try:
            Knobs(**trial)
        except ValueError as e:
            c.excluded = f"cannot join the others: {e}"
            continue
        merged = trial
        for k in c.knobs:
            taken[k] = c
    return Knobs(**merged), found


def _has(knobs: dict[str, Any], want: dict[str, Any]) -> bool:
    return all(knobs.get(k) == v for k, v in want.items())


def _without(combined: Knobs, baseline: Knobs, c: Candidate) -> Knobs:
    """The combined configuration with one change taken back to the baseline's values."""
    d = combined.model_dump()
    base = baseline.model_dump()
    for k in c.knobs:
        d[k] = base[k]
    if d.get("replicas", 1) == 1:  # a layout change taken back takes its routing with it
        d.update(route=None, gpu_share=None, mps_active_thread_pct=None)
    return Knobs(**d)


@dataclass(frozen=True)
class Search:
    """The scheduler search, built once: one row per setting (launched or not, and why), how it was run, the floor a
    one-launch lead had to clear, the lead, and the lead's verification (None where none led or it only screened)."""

    rows: list[SearchRow]
    note: str
    level: int | None
    floor_pct: float
    floor_why: str
    floor_from_spread: bool  # the floor is the reference's own spread (else the equivalence band)
    lead: tuple[str, float] | None = None  # the setting that led by more than the floor, and its lead in %
    unread: dict[str, str] = field(default_factory=dict)  # knob -> what the version's source says of it
    studies: list[Study] = field(default_factory=list)  # the search's one-launch studies
    tuned: Study | None = None  # combined vs the best setting, at the suite's load
    tuned_knobs: Knobs | None = None
    tuned_setting: str = ""

    def table(self) -> pd.DataFrame:
        """One row per setting: its one launch against the reference, or why it was not launched (and, where a
        setting ran in several machine starts, how many and the spread of its leads)."""
        out = pd.DataFrame([r.as_dict() for r in self.rows])
        if any(r.launches > 1 for r in self.rows):
            out.insert(4, "launches", [r.launches or float("nan") for r in self.rows])
            out.insert(5, "vs_combined_range_pct", [f"{r.low_pct:+.1f}..{r.high_pct:+.1f}"
                                                    if r.launches > 1 and not r.reference else "" for r in self.rows])
        out["source_says"] = [next((w for k, w in self.unread.items() if r.setting.startswith(f"{k}=")), "")
                              if r.state != "not read" else "" for r in self.rows]  # its status says it already
        return out

    @property
    def measured(self) -> list[SearchRow]:
        """The settings whose one launch measured (the reference first)."""
        return [r for r in self.rows if r.state == "measured"]


@dataclass(frozen=True)
class Verification:
    """What thread 7 measured: the changes and how they combined, the combined study, the scheduler search and its
    verification."""

    ctx: RunContext
    baseline: Knobs
    baseline_words: str
    changes: list[Candidate]
    combined: Knobs
    study: Study | None = None  # baseline vs combined (and leave-one-out arms)
    loo: list[tuple[Candidate, str]] = field(default_factory=list)  # (change, its leave-one-out arm)
    verify_lead: bool = True  # False: the search screens only; a lead is named, not verified (no launch spent on it)
    tuning: Search | None = None
    # threads before this one that did not finish (thread: status and why, findings.unfinished): a change they
    # would recommend may be missing from the combination
    unfinished: dict[str, str] = field(default_factory=dict)

    @property
    def search(self) -> pd.DataFrame:
        """The search's rows as a table (empty where nothing was searched)."""
        return self.tuning.table() if self.tuning is not None else pd.DataFrame()

    def search_table(self) -> pd.DataFrame:
        """The search's rows as the report shows them: setting, flags, throughput, lead, status, what the source
        says."""
        t = self.search
        return drop_empty(t.drop(columns=["state", "reason", "reference"])) if len(t) else t

    def studies(self) -> list[Study]:
        """Every study this thread ran, in order."""
        t = self.tuning
        return [s for s in (self.study, *(t.studies if t else ()), t.tuned if t else None) if s is not None]

    def outcome(self, fs: list[Finding]) -> Outcome:
        """Points planned, measured and failed over every study of the thread (for the index)."""
        parts = [s.results.outcome(THREAD, fs) for s in self.studies()]
        first = next((o for o in parts if o.first_error), None)
        # a search setting an offline render finds no point for was asked and not measured (its run stopped before
        # it): counted like a repetition the store lacks (not in the store), so the thread reads partial, not ok
        unmeasured = [r for r in (self.tuning.rows if self.tuning else []) if r.state == "not measured" and not r.reference]
        error = first.first_error if first else \
            f"search {unmeasured[0].setting}: {unmeasured[0].status}" if unmeasured else ""
        return Outcome(thread=THREAD, points_planned=sum(o.points_planned for o in parts) + len(unmeasured),
                       points_measured=sum(o.points_measured for o in parts),
                       points_failed=sum(o.points_failed for o in parts), points_died=sum(o.points_died for o in parts),
                       points_unmeasured=sum(o.points_unmeasured for o in parts) + len(unmeasured),
                       first_error=error, first_signal=first.first_signal if first else "",
                       findings_total=len(fs), findings_answering=sum(f.answers for f in fs))

    def table(self) -> pd.DataFrame:
        """Throughput and latency per configuration and level, medians over repetitions (every study)."""
        frames = [s.table() for s in self.studies()]
        frames = [f for f in frames if len(f)]
        return pd.concat(frames, ignore_index=True).drop_duplicates() if frames else pd.DataFrame()

    def compare(self) -> Comparison:
        """Combined against the baseline: the fields the joined changes move are studied, the others controlled."""
        assert self.study is not None
        moved = {f for c in self.included for k in c.knobs for f in STATE.get(k, ())}
        fields = _fields(self.study, BASELINE, COMBINED)
        return self.study.compare(BASELINE, COMBINED, tuple(f for f in fields if f in moved),
                                  tuple(f for f in fields if f not in moved))

    @property
    def tune_base(self) -> str:
        """What the scheduler search tunes around, by name: the combination, or the baseline where nothing joined."""
        return tune_base(self.study, self.baseline_words)

    @property
    def included(self) -> list[Candidate]:
        """The changes that joined the combined configuration."""
        return [c for c in self.changes if not c.excluded]

    def changes_table(self) -> pd.DataFrame:
        """One row per recommended change: its rank, source, measured effect alone, and whether it joined."""
        rows = [{"rank": i + 1, "change": c.label, "finding": c.title, "thread": c.thread, "tier": c.tier,
                 "effect_alone": c.effect, "joined": "no: " + c.excluded if c.excluded else "yes"}
                for i, c in enumerate(self.changes)]
        return pd.DataFrame(rows, columns=["rank", "change", "finding", "thread", "tier", "effect_alone", "joined"])

    def effects(self) -> pd.DataFrame:
        """Combined against the baseline: every metric at every level, with its interval (tidy)."""
        if self.study is None:
            return pd.DataFrame()
        return self.compare().effects()

    def memory(self) -> pd.DataFrame:
        """Peak memory per configuration, median over its repetitions and levels: GPU memory used (NVML), or on a CPU
        build the server processes' resident memory."""
        if self.study is None:
            return pd.DataFrame()
        gp = self.study.gpu_points()
        if len(gp) and "mem_used_mib_max" in gp:
            per = gp.groupby(["config", "rep", "phase"], as_index=False)["mem_used_mib_max"].sum()
            out = per.groupby("config", as_index=False)["mem_used_mib_max"].median()
            return out.rename(columns={"mem_used_mib_max": "gpu_mem_used_mib"})
        procs = self.study.results.telemetry.get("server_procs", pd.DataFrame())
        if procs.empty or "rss_mib" not in procs:
            return pd.DataFrame()
        pr = procs[~procs["phase"].str.startswith(UNMEASURED)]
        rss = pr.groupby(["config", "rep", "phase", "time_unix"], as_index=False)["rss_mib"].sum()
        rss = rss.groupby(["config", "rep", "phase"], as_index=False)["rss_mib"].max()
        return rss.groupby("config", as_index=False)["rss_mib"].median().rename(
            columns={"rss_mib": "server_rss_mib"})

    def memory_words(self) -> str:
        """The combination's peak memory against the baseline's, in words ('' where neither was read)."""
        m = self.memory()
        if m.empty:
            return ""
        col = m.columns[1]
        by = dict(zip(m["config"], m[col], strict=True))
        if BASELINE not in by or COMBINED not in by or not by[BASELINE]:
            return ""
        what = "GPU memory used" if col == "gpu_mem_used_mib" else "the server's resident memory"
        return (f" Memory: {what} at peak {by[BASELINE]:,.0f} MiB with the baseline, {by[COMBINED]:,.0f} MiB combined "
                f"({100 * (by[COMBINED] / by[BASELINE] - 1):+.0f}%, medians over repetitions and levels).")

    def shares(self) -> pd.DataFrame:
        """Each change's share of the combined effect: the combined configuration against it left out."""
        rows = []
        for c, arm in self.loo:
            h = self.study.compare(arm, COMBINED, ()).headline() if self.study is not None else None
            rows.append({"change": c.label, "without_it": arm,
                         "share_pct": round(h.effect_pct, 1) if h is not None else float("nan"),
                         "ci_low_pct": round(h.ci_low_pct, 1) if h is not None else float("nan"),
                         "ci_high_pct": round(h.ci_high_pct, 1) if h is not None else float("nan"),
                         "n": h.n if h is not None else 0, "resolved": bool(h.resolved) if h is not None else False})
        return pd.DataFrame(rows)


def tune_base(study: Study | None, baseline_words: str) -> str:
    """What the scheduler search tunes around, by name: the combination, or the baseline where nothing joined."""
    return COMBINED if study is not None else baseline_words


def run(ctx: RunContext, by_thread: dict[str, list[Finding]], leave_one_out: bool = True,
        search: list[str] | None = None, search_budget_s: float = 0.0,
        search_settings: int = 0, verify_lead: bool = True, unfinished: dict[str, str] | None = None) -> Verification:
    """Compose the run's recommended changes (by_thread: the findings of the threads before this one, as
    findings.collect reads a report folder), measure them together against the run context's baseline ({}: the
    engine's defaults) and each one left out where leave_one_out and more than one joined, then
    search the scheduler knobs (search: which; default all this engine can express) within search_budget_s (0: no
    search), launching at most search_settings of them (0: as many as the budget allows), and verify the best
    (unless verify_lead is False: then the search only screens); unfinished: the threads before this one that did
    not finish (findings.unfinished)."""
    baseline = ctx.baseline
    base = Knobs(**(baseline or {}))
    spelled = _spelled(ctx, base) if baseline else ""
    words = f"the baseline {base.label()}{spelled}" if baseline else "the engine's defaults"
    wanted = list(DEFAULT_SEARCH) if search is None else list(search)
    bad = sorted(set(wanted) - set(SEARCH))
    if bad:
        raise SpecError(f"search: knobs to search are {', '.join(SEARCH)} (got {bad})")
    if search_budget_s < 0:
        raise SpecError("search_budget_s: seconds of searching, 0 for none")
    if search_settings < 0:
        raise SpecError("search_settings: how many settings the search launches at most, 0 for as many as "
                        "search_budget_s allows")
    combined, found = compose(base, changes(by_thread), exclusion_rules(by_thread))
    combined = _expressible(ctx, base, combined, found)
    arms = [Arm(BASELINE, base, words)]
    loo: list[tuple[Candidate, str]] = []
    study = None
    if combined != base:
        joined = [c for c in found if not c.excluded]
        arms.append(Arm(COMBINED, combined, "every recommended change that joined: " +
                        "; ".join(c.label for c in joined)))
        if leave_one_out and len(joined) > 1:
            for c in joined:
                loo.append((c, f"without {c.label}"))
                arms.append(Arm(f"without {c.label}", _without(combined, base, c), f"combined, {c.label} left out"))
        study = run_study(THREAD, ctx, arms, headlines=[(BASELINE, COMBINED)])
        if baseline and not spelled:  # the engine was not here to spell it: its launch was
            words = f"the baseline {base.label()}{_launched_as(ctx, study)}"
    gaps = {t: w for t, w in (unfinished or {}).items() if t != THREAD}
    # no change yet because a thread did not finish: a search around the baseline would tune what the finished
    # thread may replace, so it waits with the verification
    waits = not found and bool(gaps)
    tuning = _search(ctx, study, combined, words, wanted, search_budget_s, search_settings, verify_lead) \
        if search_budget_s > 0 and wanted and not waits else None
    return Verification(ctx, base, words, found, combined, study, loo, verify_lead, tuning, gaps)


def _removed_only(flags: list[str], drop: list[str]) -> str:
    """The dropped flag groups ('--enforce-eager') whose option the added flags do not set again, in one string."""
    reset = {g[0].split("=", 1)[0] for g in flag_groups(flags)}
    return " ".join(" ".join(g) for g in flag_groups(drop) if g[0].split("=", 1)[0] not in reset)


def _spelled(ctx: RunContext, knobs: Knobs) -> str:
    """' (`--enforce-eager`)': the baseline in the engine's spelling, where it can be spelled here; '' otherwise."""
    try:
        ex = expressible(ctx, [Arm(BASELINE, knobs)])
    except Exception:  # noqa: BLE001 - the engine is not here to spell it (offline elsewhere): the knobs say it
        return ""
    spelled = ex["flag_list"].iloc[0] if len(ex) and bool(ex["expressible"].iloc[0]) else None
    return f" (`{shlex.join(spelled)}`)" if spelled else ""  # None: not asked; []: the engine's default


def _launched_as(ctx: RunContext, study: Study) -> str:
    """' (`--enforce-eager`)': the baseline's knobs as its stored launch spelled them (the deployment's own extra
    flags left out, as the engine would spell the knobs alone); '' where it has no stored launch."""
    pt = study.results.point(BASELINE)
    flags = list((pt.target.get("flags") or []) if pt is not None else [])
    extra = list(ctx.deployment.args)
    if extra and flags[len(flags) - len(extra):] == extra:
        flags = flags[:len(flags) - len(extra)]
    return f" (`{shlex.join(flags)}`)" if flags else ""


def _expressible(ctx: RunContext, base: Knobs, combined: Knobs, found: list[Candidate]) -> Knobs:
    """The combined configuration, made expressible on this engine version: while it is not, the lowest-ranked change
    that joined is left out with the engine's reason (marked on it) and the rest composed again. Offline the store
    decides what was measured."""
    while not ctx.offline and combined != base:
        ex = expressible(ctx, [Arm(COMBINED, combined)])
        if ex.empty or bool(ex["expressible"].iloc[0]):
            break
        joined = [c for c in found if not c.excluded]
        joined[-1].excluded = ("this engine version cannot run it with the changes ranked above: "
                               f"{ex['reason'].iloc[0]}")
        combined, _ = compose(base, [c for c in found if not c.excluded])
    return combined


def candidates(ctx: RunContext, combined: Knobs, wanted: list[str]) -> list[tuple[str, Knobs]]:
    """The scheduler settings to try, one knob at a time around the combined configuration: (setting, knobs)."""
    top = _search_level(ctx) or 64
    out = []
    # value by value across the knobs, so that a small budget still tries each knob once
    for i in range(max(len(SEARCH[k]) for k in wanted) if wanted else 0):
        for knob in wanted:
            if i >= len(SEARCH[knob]):
                continue
            x = SEARCH[knob][i]
            value = max(1, int(round(x * top))) if knob in ("max_running_requests", "cuda_graph_max_bs") else int(x)
            k = combined.model_copy(update={knob: value})
            if k != combined:
                out.append((f"{knob}={value}", k))
    return out


@dataclass
class _Trial:
    """The search's launches, kept for the memo: the rows its compute made and the studies it ran."""

    rows: list[SearchRow] = field(default_factory=list)
    studies: list[Study] = field(default_factory=list)


def _search(ctx: RunContext, study: Study | None, combined: Knobs, baseline_words: str, wanted: list[str],
            budget_s: float, count: int, verify_lead: bool) -> Search:
    """Coarse grid at the load's target level (else its highest), one launch per setting (and one of the combined
    configuration, the reference), within budget_s and at most count settings (0: no limit); then the best setting
    against the combined configuration at the suite's load, with repetitions until resolved (unless verify_lead is
    False)."""
    level = _search_level(ctx)
    base = tune_base(study, baseline_words)
    one = ctx.with_(load=ctx.load.model_copy(update={"concurrency": (level,)}) if level else ctx.load,
                    plan=RepetitionPlan(1, 1), profile=ProfileSpec())
    parts = _search_parts(ctx, one, combined, wanted, budget_s, count)
    said = ctx.recall("verify_search", parts)
    # the settings and their reference in one machine start: pinned to it where the verification ran in another
    pinned = _reference_start(ctx, study, level, said)
    by_start = _tried_by_start(said)
    earlier = [x for x in by_start if x != pinned]
    cands = candidates(ctx, combined, wanted)
    arms = [Arm(f"tune {s}", k, s) for s, k in cands]
    if not ctx.offline:  # a new machine start launches the settings no earlier start measured first
        arms.sort(key=lambda a: any(a.note in by_start[x] for x in earlier))
    one = one.with_(pinned_start=pinned)
    # asked at the search's own load: offline without the engine, the store is asked for the point the search
    # launched (one level), not one at the suite's load
    ex = expressible(one, arms) if arms else pd.DataFrame(columns=["arm", "expressible", "flags", "flag_list", "reason",
                                                                      "asked"])
    flags = dict(zip(ex["arm"], ex["flags"], strict=True))
    # what earlier machine starts measured, each setting against the reference of its own start (nothing launches)
    past, studies = _earlier_starts(one, earlier, by_start, cands, study, combined, level, base, flags)
    ref, ref_tok, ref_note = _reference(one, study, combined, level)
    studies += [ref] if ref is not study else []
    now, kept = _this_start(one, parts, arms, ex, _frame_of(ref, study, level, ref_tok), ref.install, by_start,
                            budget_s, count)
    rows = _merged([*past, [_reference_row(base, ref, ref_tok), *now.rows]], [f"({base})", *(x for x, _ in cands)])
    studies += now.studies
    if past:
        ref_note = (f"one launch of the combined configuration in each of the {len(past) + 1} machine starts the "
                    "settings ran in; each setting is held against the reference of its own start, and one launched "
                    "in several starts by the mean of its leads")
    note = _how_searched(level, count, budget_s, ref_note)
    floor_pct, floor_why, spread = _floor_of(ctx, study, level)
    tried = [r for r in rows if r.state == "measured" and not r.reference and r.vs_combined_pct == r.vs_combined_pct]
    lead = max(tried, key=lambda r: r.vs_combined_pct) if tried else None
    unread = (kept or {}).get("unread") or {}
    if lead is None or not lead.vs_combined_pct > floor_pct:
        return Search(rows, note, level, floor_pct, floor_why, spread, None, unread, studies)
    found = Search(rows, note, level, floor_pct, floor_why, spread, (lead.setting, lead.vs_combined_pct), unread,
                   studies)
    if not verify_lead:  # a screen: its verification (repetitions of the suite's whole load) is not paid for here
        return found
    knobs = _knobs_of(lead.setting, cands)
    assert knobs is not None  # a lead is one of the settings, or a pair of them
    tuned = run_study(THREAD, ctx, [Arm(base, combined, "the combined configuration"),
                                    Arm(lead.setting, knobs, f"{base} with {lead.setting}")],
                      headlines=[(base, lead.setting)])
    return replace(found, tuned=tuned, tuned_knobs=knobs, tuned_setting=lead.setting)


def _search_parts(ctx: RunContext, one: RunContext, combined: Knobs, wanted: list[str], budget_s: float,
                  count: int) -> dict[str, Any]:
    """What the search is kept under: which settings the measuring run tried is kept, so an offline render (or a
    rerun) reads the same ones, and says of the others what that run said (a budget spent is not seen from the
    data); a count joins only where set (keys of earlier runs' searches kept)."""
    return {"engine": ctx.engine_identity, "model": ctx.model_key, "load": one.load.full_dump(),
            "around": combined.model_dump(mode="json", exclude_defaults=True), "search": wanted,
            "budget_s": budget_s} | ({"settings": count} if count else {})


def _reference_row(base: str, ref: Study, ref_tok: float) -> SearchRow:
    """The search's reference as a row: measured, or why not (the run's budget; not in the store, offline; failed)."""
    why = ref.results.why_unmeasured()
    state: SearchState = "measured" if known(ref_tok) else "run budget spent" if why == "budget" else \
        "not measured" if why == "store" else "failed"
    return SearchRow(f"({base})", state, "not in the store" if state == "not measured" else "", output_tok_s=ref_tok,
                     vs_combined_pct=0.0, reference=True, launches=int(state == "measured"))


def _this_start(one: RunContext, parts: dict[str, Any], arms: list[Arm], ex: pd.DataFrame, frame: _Frame,
                install: EngineInstall | None, by_start: dict[str, list[str]], budget_s: float,
                count: int) -> tuple[_Trial, dict[str, Any] | None]:
    """The settings of this machine start (one's pinned start): launched where the search is new or its budget cut it
    short, else read as the measuring run kept them; and the search's kept note."""
    pinned, trial = one.pinned_start, _Trial()
    before = [x for st, tried in by_start.items() if st != pinned for x in tried]

    def measure() -> dict[str, Any]:
        # read before anything launches: a knob this version never reads is not worth a launch
        unread = one.adapter.unread_knobs(install) if install is not None else {}
        trial.rows, trial.studies = _trials(one, arms, ex, replace(frame, unread=unread), budget_s, None, count)
        now = [r.setting for r in trial.rows if r.state in LAUNCHED]
        return {"tried": list(dict.fromkeys([*before, *now])),
                "skipped": {r.setting: SKIPPED_WORDS[r.state] for r in trial.rows
                            if r.state in SKIPPED_WORDS and r.setting not in before},
                "unread": unread, "reference_start": pinned, "by_start": {**by_start, pinned: now}}

    # a search that ran out of budget goes on where it stopped when run again online: the settings it launched come
    # back from the store at no cost (in an earlier machine start: read, each against its own start's reference), the
    # budget then goes to those it had no time for
    kept, _ = one.memo("verify_search", parts, measure, keep=lambda _: not one.offline, compute_offline=True,
                       unfinished=_unfinished)
    if not trial.rows and not trial.studies:
        here = {**kept, "tried": _tried_by_start(kept).get(pinned, [])} if kept else None
        trial.rows, trial.studies = _trials(one, arms, ex, replace(frame, unread=(kept or {}).get("unread") or {}),
                                            budget_s, here, count)
    return trial, kept


def _unfinished(kept: dict[str, Any]) -> bool:
    """Whether a kept search stopped short (a budget spent): run again online, it goes on."""
    return bool(set(UNFINISHED) & set((kept.get("skipped") or {}).values()))


def _tried_by_start(said: dict[str, Any] | None) -> dict[str, list[str]]:
    """The settings each machine start of a kept search launched, in the order of the starts (a search kept before
    the starts were: all it tried, in its one start)."""
    if not said:
        return {}
    if "by_start" in said:
        return {str(x): list(v) for x, v in said["by_start"].items()}
    return {str(said.get("reference_start") or ""): list(said.get("tried") or [])}


def _knobs_of(setting: str, cands: Sequence[tuple[str, Knobs]]) -> Knobs | None:
    """The knobs of a setting of the grid, or of a pair of them ('a=1 + b=2'); None for one the grid lacks."""
    grid = dict(cands)
    one = setting.split(PAIR)
    if any(x not in grid for x in one):
        return None
    knobs = grid[one[0]]
    for x in one[1:]:
        knob = x.split("=", 1)[0]
        knobs = knobs.model_copy(update={knob: getattr(grid[x], knob)})
    return knobs


def _earlier_starts(one: RunContext, starts: list[str], by_start: dict[str, list[str]],
                    cands: Sequence[tuple[str, Knobs]], study: Study | None, combined: Knobs, level: int | None,
                    base: str, flags: dict[str, str]) -> tuple[list[list[SearchRow]], list[Study]]:
    """Each earlier machine start's rows, read from the store (nothing launches, whatever start one is pinned to):
    its reference, then the settings
    it launched, each held against that reference; and the studies read."""
    out: list[list[SearchRow]] = []
    studies: list[Study] = []
    for start in starts:
        there = one.with_(pinned_start=start, offline=True)
        ref, ref_tok, _ = _reference(there, study, combined, level)
        studies += [ref] if ref is not study else []
        frame = _frame_of(ref, study, level, ref_tok)
        rows = [_reference_row(base, ref, ref_tok)]
        for setting in by_start[start]:
            knobs = _knobs_of(setting, cands)
            if knobs is None or not is_stored(there, knobs):
                continue
            arm = Arm(f"tune {setting}", knobs, setting)
            st = run_study(THREAD, there, [arm])
            studies.append(st)
            # offline, a setting's flags are asked of its own start's point (this start may not have one)
            fl = flags.get(arm.name) or str(next(iter(expressible(there, [arm])["flags"]), ""))
            rows.append(frame.row(setting, st, arm.name, fl))
        out.append(rows)
    return out, studies


def _merged(per_start: Sequence[Sequence[SearchRow]], order: Sequence[str]) -> list[SearchRow]:
    """One row per setting over the machine starts it ran in: measured in several, the mean of its leads (each
    against its own start's reference) and their range; measured in none, what became of it (a launch that failed
    before a budget's word)."""
    seen = [r.setting for rows in per_start for r in rows]
    out = []
    for setting in dict.fromkeys([*(x for x in order if x in seen), *seen]):
        rows = [r for rs in per_start for r in rs if r.setting == setting]
        got = [r for r in rows if r.state == "measured"]
        if not got:
            out.append(next((r for r in reversed(rows) if r.state in LAUNCHED), rows[-1]))
            continue
        pct = [r.vs_combined_pct for r in got]
        many = len(got) > 1
        out.append(replace(got[-1], output_tok_s=sum(r.output_tok_s for r in got) / len(got),
                           vs_combined_pct=round(sum(pct) / len(pct), 1), launches=len(got),
                           low_pct=min(pct) if many else float("nan"), high_pct=max(pct) if many else float("nan")))
    return out


def _reference_start(ctx: RunContext, study: Study | None, level: int | None, said: dict[str, Any] | None) -> str:
    """The machine start the search's reference must be launched in ('' where the verification's own launches serve):
    offline, or where the kept search finished, the last one it ran in; online, this machine's start unless the
    verification's combined configuration ran at the search's level in it (settings are judged only against a
    reference of their own start)."""
    if ctx.offline or (said is not None and not _unfinished(said)):  # a finished search is read, not run again
        return str((said or {}).get("reference_start") or "")
    here = boot_id()
    ran = study is not None and level and _at_level(study, COMBINED, level)[1] and here in _starts(study, COMBINED)
    return "" if ran else here


def _reference(one: RunContext, study: Study | None, combined: Knobs, level: int | None) -> tuple[Study, float, str]:
    """The search's reference: the combined configuration at the search's level, as the verification measured it
    (its launches at the suite's load reach that level too: one launch per configuration), or, where pinned to a
    machine start or the verification has none, one launch of its own: (the study it is read from, its output tok/s,
    how it was had)."""
    pinned = one.pinned_start
    ref_tok, ref_n = _at_level(study, COMBINED, level) if study is not None and level else (float("nan"), 0)
    if ref_n and study is not None and not pinned:
        return study, ref_tok, (f"the combined configuration at c={level}: the median of the verification's {ref_n} "
                                "repetitions (no launch of its own)")
    ref = run_study(THREAD, one, [Arm(f"tune {COMBINED}", combined, "the combined configuration")])
    why = (" in the settings' machine start" + (" (the verification's launches ran in another)" if ref_n else "")
           if pinned else "")
    return ref, _tok(ref, f"tune {COMBINED}"), f"one launch of the combined configuration{why}"


PAIR = " + "  # two settings launched together


def _pair(rows: Sequence[SearchRow], cands: Sequence[tuple[str, Knobs]]) -> list[tuple[str, Knobs]]:
    """The best setting of each of the two knobs whose best single setting led the reference most (both ahead of
    it), as one setting: the seed's gain came from two scheduler knobs together. [] where fewer than two led."""
    best: dict[str, SearchRow] = {}
    for r in rows:
        if r.state == "measured" and not r.reference and PAIR not in r.setting and r.vs_combined_pct > 0:
            knob = r.setting.split("=", 1)[0]
            if knob not in best or r.vs_combined_pct > best[knob].vs_combined_pct:
                best[knob] = r
    if len(best) < 2:
        return []
    a, b = sorted(best.values(), key=lambda r: -r.vs_combined_pct)[:2]
    setting = f"{a.setting}{PAIR}{b.setting}"
    knobs = _knobs_of(setting, cands)
    return [(setting, knobs)] if knobs is not None else []


def _trials(one: RunContext, arms: list[Arm], ex: pd.DataFrame, frame: _Frame, budget_s: float,
            kept: dict[str, Any] | None, count: int) -> tuple[list[SearchRow], list[Study]]:
    """The settings one knob at a time, then the pair of the two best (_pair), within the budget and count."""
    t0 = time.monotonic()
    rows, studies = _try(one, arms, ex, frame, budget_s, kept, count)
    pair = _pair(rows, [(a.note, a.knobs) for a in arms])
    launched = sum(r.state in LAUNCHED for r in rows)
    if not pair or (count and launched >= count):
        return rows, studies
    parm = [Arm(f"tune {pair[0][0]}", pair[0][1], pair[0][0])]
    more, st = _try(one, parm, expressible(one, parm), frame, max(0.0, budget_s - (time.monotonic() - t0)), kept)
    return rows + more, studies + st


@dataclass(frozen=True)
class _Frame:
    """What every setting of the search is held against: the level, the reference's throughput there and the
    machine starts its launches ran in, and the knobs this version's source never reads (knob -> the evidence)."""

    level: int | None
    ref_tok: float
    ref_starts: frozenset[str] = frozenset()
    unread: dict[str, str] = field(default_factory=dict)
    # the searched knobs' values the reference resolved to, where its engine says (the running-request cap, the
    # prefill chunk, ...)
    defaults: dict[str, int] = field(default_factory=dict)

    def refused(self, setting: str) -> tuple[SearchState, str] | None:
        """Why a setting is not launched at all (a knob the version never reads, the value the reference already
        runs with, a cap that cannot bind), or None."""
        cap = self.defaults.get("max_running_requests")
        for one in setting.split(PAIR):
            knob, _, value = one.partition("=")
            if knob in self.unread:
                return "not read", f"no effect: {self.unread[knob]}"
            if str(self.defaults.get(knob)) == value:  # one launch of it is one more launch of the reference
                return "the default", (f"the reference already runs with {knob} {value} (what its engine resolved "
                                       "it to): the same launch")
            # a cap at or above the level holds nothing back, unless it lifts a lower cap the engine chose itself
            if knob == "max_running_requests" and self.level and int(value) >= self.level and not (
                    cap is not None and cap < self.level):
                return "cannot bind", (f"a cap of {value} running requests cannot bind at c={self.level}: at most "
                                       f"{self.level} are in flight")
        return None

    def row(self, setting: str, st: Study, arm: str, flags: str) -> SearchRow:
        """A launched setting's row: its lead over the reference where both ran in one machine start, else its
        throughput shown apart."""
        tok = _tok(st, arm)
        if not known(tok):
            return SearchRow(setting, "failed", _first_error(st), flags=flags)
        starts = _starts(st, arm)
        if self.ref_starts and starts and not starts & self.ref_starts:
            return SearchRow(setting, "other machine start", "launched in another machine start than the reference: "
                             "not compared with it", flags=flags, output_tok_s=tok)
        return SearchRow(setting, "measured", flags=flags, output_tok_s=tok, launches=1,
                         vs_combined_pct=round(100 * (tok / self.ref_tok - 1), 1) if self.ref_tok else float("nan"))


def _how_searched(level: int | None, count: int, budget_s: float, ref_note: str) -> str:
    """How the search ran, in words."""
    return (f"coarse grid, one knob at a time around the combined configuration (then the best settings of the two "
            f"best knobs together), at c={level}, one launch per setting, "
            f"{f'at most {count} settings, ' if count else ''}within search_budget_s={budget_s:.0f}; the reference: "
            f"{ref_note}")


def _frame_of(ref: Study, study: Study | None, level: int | None, ref_tok: float) -> _Frame:
    """The search's frame from its reference (the verification's combined arm, or a launch of its own)."""
    arm = COMBINED if ref is study else f"tune {COMBINED}"
    facts = st.facts if (st := ref.states.get(arm)) is not None else {}
    defaults = {k: v for k in SEARCH if isinstance(v := facts.get(k), int) and not isinstance(v, bool)}
    return _Frame(level, ref_tok, _starts(ref, arm), defaults=defaults)


def _starts(study: Study, arm: str) -> frozenset[str]:
    """The machine starts an arm's stored points ran in (none named for points stored before they were kept)."""
    return frozenset(pt.machine_start for (c, _), pt in study.results.stored.items()
                     if c == arm and pt.machine_start)


def _try(one: RunContext, arms: list[Arm], ex: pd.DataFrame, frame: _Frame, budget_s: float,
         kept: dict[str, Any] | None, count: int = 0) -> tuple[list[SearchRow], list[Study]]:
    """One launch per expressible setting while the budget lasts and fewer than count (0: any number) have launched
    (or, kept, the settings the measuring run tried, the others with what it said of them): the rows and studies."""
    ok = dict(zip(ex["arm"], ex["expressible"], strict=True))
    why = dict(zip(ex["arm"], ex["reason"], strict=True))
    asked = dict(zip(ex["arm"], ex["asked"], strict=True)) if "asked" in ex else {}
    said = {words: state for state, words in SKIPPED_WORDS.items()}
    rows: list[SearchRow] = []
    studies: list[Study] = []
    t0, took = time.monotonic(), 0.0
    for a in arms:
        flags = str(ex.loc[ex["arm"] == a.name, "flags"].iloc[0]) if a.name in ok else ""
        if (refused := frame.refused(a.note)) is not None:  # before the store: a measured one is not shown either
            rows.append(SearchRow(a.note, refused[0], refused[1], flags=flags))
            continue
        # what the measuring run said of it (a spent budget), unless it was launched as that run stopped: the point
        # it finished is in the store, and a render reads it rather than say it was not tried
        late = kept is not None and kept["skipped"].get(a.note) in UNFINISHED and ok.get(a.name, False) \
            and is_stored(one, a.knobs)
        if kept is not None and a.note in kept["skipped"] and not late:
            rows.append(SearchRow(a.note, said[kept["skipped"][a.note]], flags=flags))
            continue
        if not ok.get(a.name, False):
            # offline without the engine, a setting the store lacks cannot be asked about: not measured, not refused;
            # one the measuring run's grid did not hold (the grid changed since) was not tried, not lost
            unasked = kept is not None and a.note not in kept["tried"] and a.note not in kept["skipped"]
            state: SearchState = "not expressible" if asked.get(a.name, True) else \
                "not tried by the measuring run" if unasked else "not measured"
            rows.append(SearchRow(a.note, state, "" if unasked and state != "not expressible" else why.get(a.name, "")))
            continue
        launched = sum(r.state in LAUNCHED for r in rows)
        # a count makes the settings tried the same from run to run; a clock alone depends on how fast launches were
        skip: SearchState | None = ("not tried by the measuring run" if a.note not in kept["tried"] and not late
                                    else None) \
            if kept is not None else "count reached" if count and launched >= count else \
            "budget spent" if time.monotonic() - t0 + took > budget_s else None
        if skip is not None:
            rows.append(SearchRow(a.note, skip, flags=flags))
            continue
        t1 = time.monotonic()
        st = run_study(THREAD, one, [a])
        studies.append(st)
        took = max(took, time.monotonic() - t1) if st.results.points.shape[0] else took
        if _tok(st, a.name) != _tok(st, a.name) and st.results.why_unmeasured() == "budget":
            rows.append(SearchRow(a.note, "run budget spent", flags=flags))
            continue
        rows.append(frame.row(a.note, st, a.name, flags))
    return rows, studies


def _floor_of(ctx: RunContext, study: Study | None, level: int | None) -> tuple[float, str, bool]:
    """The lead a one-launch setting needs to be verified, where it comes from, and whether that is the reference's
    own spread. One launch each: a lead inside
    the equivalence band is noise, not worth repetitions; so is a lead inside the spread the reference itself showed
    over its launches at that level (on a busy 2-core host one launch at c=16 varies by a factor of 3: no single
    launch there can lead by more than chance)."""
    spread, n = _spread_at_level(study, COMBINED, level) if study is not None else (0.0, 0)
    if spread > ctx.equivalence_pct:
        return (spread, f"the spread of the combined configuration's own {n} launches at that level, highest over "
                "lowest", True)
    return float(ctx.equivalence_pct), "the equivalence band", False


def _search_level(ctx: RunContext) -> int | None:
    """The level the search runs at: the load's target, else its highest (closed loop); None in open loop."""
    ld = ctx.load
    if ld.mode != "closed" or not ld.concurrency:
        return None
    return ld.target_level or max(ld.levels)


def _spread_at_level(study: Study, arm: str, level: int | None) -> tuple[float, int]:
    """How far an arm's launches at one level spread, highest over lowest in %, and how many (0, n<2: none)."""
    x = _level_values(study, arm, level)
    if len(x) < 2 or x.min() <= 0:
        return 0.0, len(x)
    return float(100 * (x.max() / x.min() - 1)), len(x)


def _fields(study: Study, a: str, b: str) -> tuple[str, ...]:
    """The state fields two arms are checked in: an eager switch only on engines that have one (vLLM), since
    elsewhere it is no control left unverified."""
    has_eager = any(st is not None and st.value("eager") is not None for st in (study.states.get(a),
                                                                                  study.states.get(b)))
    return tuple(f for f in FIELDS if f != "eager" or has_eager)


def _at_level(study: Study, arm: str, level: int) -> tuple[float, int]:
    """An arm's output tokens/s at one concurrency level: the median over its repetitions, and how many."""
    x = _level_values(study, arm, level)
    return (float(x.median()), len(x)) if len(x) else (float("nan"), 0)


def _level_values(study: Study, arm: str, level: int | None) -> pd.Series:
    """An arm's output tokens/s at one concurrency level, one value per repetition (empty where none)."""
    s = study.results.summary
    if level is None or s.empty or "concurrency" not in s:
        return pd.Series(dtype=float)
    return s[(s["config"] == arm) & (s["concurrency"] == level)]["output_tok_s"].dropna()


def _tok(study: Study, arm: str) -> float:
    s = study.results.summary
    s = s[s["config"] == arm] if len(s) else s
    return float(s["output_tok_s"].median()) if len(s) else float("nan")


def _first_error(study: Study) -> str:
    e = study.results.errors
    return str(e["summary"].iloc[0]) if len(e) else "no point"


WORSE_METRICS = {"ttft_ms_p50": "TTFT", "tpot_ms_p50": "TPOT"}


def _worse(study: Study, base: str, treat: str) -> tuple[list[str], str]:
    """Latency metrics that got resolvedly worse (medium or high confidence) at some level, in words; and why TPOT
    was not compared, where a side's output came buffered ('' otherwise)."""
    cmp = study.compare(base, treat, ())
    e, out, buffered = cmp.effects(), [], cmp.buffered_words()
    for m, words in WORSE_METRICS.items():
        if m == "tpot_ms_p50" and buffered:  # a buffered side's TPOT is its delivery's, not a cost
            continue
        r = e[(e["metric"] == m) & (e["n_pairs"] > 0) & (e["effect_pct"] > 0) & e["confidence"].isin(["high", "medium"])]
        if len(r):
            w = r.sort_values("effect_pct", ascending=False).iloc[0]
            out.append(f"{words} {w.effect_pct:+.0f}% at c={int(w.concurrency)} (90% CI {w.ci_low_pct:+.0f}.."
                       f"{w.ci_high_pct:+.0f}%, {w.confidence})")
    return out, buffered


def findings(v: Verification) -> list[Finding]:
    """The verified answer first (the recommended changes together against the baseline, or why nothing was
    verified), then the scheduler setting the search found, verified against the combined configuration."""
    return [_combined_finding(v), _tuning_finding(v)]


def _combined_finding(v: Verification) -> Finding:
    left = [c for c in v.changes if c.excluded]
    left_words = ("Left out: " + "; ".join(f"{c.label} ({c.excluded})" for c in left) + ".") if left else ""
    ev: dict[str, Any] = {"changes": v.changes_table().to_dict("records"), "baseline": v.baseline_words}
    gaps = "; ".join(f"{t} ({w})" for t, w in v.unfinished.items())
    if not v.changes and gaps:
        # no change because a thread that could name one did not finish: not an answer, and never "nothing to do"
        words = f"no change to verify yet: {gaps} did not finish; a run that finishes it may name one"
        return Finding(thread=THREAD, kind="verification", title="Not verified: an earlier thread did not finish",
                       applies=False, confidence="none", reason="an earlier thread did not finish",
                       headline=f"Not verified: {words}", evidence={**ev, "unfinished": v.unfinished},
                       verdict=Verdict(verified=False, words=words))
    if not v.changes:
        words = "this run recommends no change to verify (no High or Medium finding names one)"
        return Finding(thread=THREAD, kind="verification", title="Nothing to verify: no recommended change",
                       applies=True, confidence="none", headline=f"Not verified: {words}", evidence=ev,
                       verdict=Verdict(verified=False, words=words))
    if v.study is None:
        words = "the recommended changes could not be combined"
        return Finding(thread=THREAD, kind="verification", title="Recommended changes: not combined", applies=False,
                       confidence="none", headline=f"Not verified: {words}", detail=left_words,
                       reason="no change joined the combination", evidence=ev,
                       verdict=Verdict(verified=False, words=words))
    cmp = v.compare()
    # the deployment is the baseline: where the combination is the engine's defaults, the change is to drop the
    # baseline's own flags, never "already optimal"
    f = cmp.finding("Recommended changes combined", "The combination", better=v.combined, worse=v.baseline,
                    deployed=v.baseline, named="the combination")
    how, f = _how(v, f)
    worse, buffered = _worse(v.study, BASELINE, COMBINED)
    shares = v.shares()
    extra = ""
    if len(shares):
        extra += " Each change's share (combined against it left out): " + "; ".join(
            f"{r.change} {r.share_pct:+.1f}% (90% CI {r.ci_low_pct:+.1f}..{r.ci_high_pct:+.1f}%, n={r.n}"
            f"{'' if r.resolved else ', not resolved'})" for r in shares.itertuples()) + "."
        ev["shares"] = shares.to_dict("records")
    elif len(v.included) > 1:
        extra += " Each change's share: not measured (leave_one_out off)."
    extra += (" Worse with the changes: " + "; ".join(worse) + ".") if worse else \
        f" No latency metric got resolvedly worse ({'TTFT' if buffered else 'TTFT, TPOT'})."
    extra += f" {buffered}." if buffered else ""
    extra += v.memory_words() or " Memory: not read for these points."
    eff = f.effect
    if f.applies and eff is not None and f.direction == "better" and f.confidence in ("high", "medium"):
        verdict = Verdict(verified=True, words=f"{eff.text()} {how}, against {v.baseline_words}")
        title = f"Verified: the recommended changes together, {eff.value_pct:+.1f}% {eff.metric_words}"
    elif eff is not None and f.applies:
        verdict = Verdict(verified=False, words=f"the recommended changes together measured {eff.text()} against "
                                                f"{v.baseline_words}")
        title = f"Not verified: the recommended changes together ({f.direction or 'unresolved'})"
    else:
        title = f.title
        verdict = Verdict(verified=False, words=title)
    if gaps:
        extra += f" Not finished, so a change it would name may be missing here: {gaps}."
        ev["unfinished"] = v.unfinished
    return f.extended(extra + (f" {left_words}" if left_words else ""), ev, kind="verification", title=title,
                      verdict=verdict)


def _how(v: Verification, f: Finding) -> tuple[str, Finding]:
    """How the verified line says the change ('with FLAGS, as LAYOUT, and without DROPPED'), and the combined finding
    with its change saying the layout too (99 ranks that change)."""
    flags = shlex.join(f.recommended_flags)  # as pasted into a shell
    labels = "; ".join(c.label for c in v.included)
    how = f"with {flags}" if flags else f"by the change{'s' if len(v.included) > 1 else ''} ({labels})"
    # a layout (replicas sharing the GPU) is no flag: the flags are each server's, and the line says how they run
    layouts = [c.layout for c in v.included if c.layout]
    if flags and layouts:
        how += f", as {' and '.join(layouts)}"
    # the deployment's own flags that would override the combination are part of the change (its document says so);
    # one the change sets again to another value is said by its new value already, and a change of no flags to add
    # is said by its label ('drop --enforce-eager')
    if flags and (gone := _removed_only(f.change.flags, f.change.drop_flags) if f.change is not None else ""):
        how += f"{',' if layouts else ''} and without {gone}"
    if layouts and f.change is not None:
        f = f.extended(change=f.change.model_copy(update={"words": "; ".join(
            [w for w in (f.change.words, *(f"run as {x} (thread 04)" for x in layouts)) if w])}))
    return how, f


def _search_waits(v: Verification) -> Finding:
    """The search not run: an unfinished thread may yet name the change it would tune around."""
    gaps = "; ".join(f"{t} ({w})" for t, w in v.unfinished.items())
    return Finding(thread=THREAD, kind="search", title="Scheduler tuning: waits for an earlier thread", applies=False,
                   confidence="none", headline=f"The scheduler knobs were not searched: {gaps} did not finish, and "
                   "the search tunes the configuration the recommended changes make",
                   reason="an earlier thread did not finish", evidence={"search": [], "method": ""})


def _tuning_finding(v: Verification) -> Finding:
    s = v.tuning
    if s is None and not v.changes and v.unfinished:
        return _search_waits(v)
    if s is None or not s.rows:
        return Finding(thread=THREAD, kind="search", title="Scheduler tuning: not searched", applies=False,
                       confidence="none", headline="The scheduler knobs were not searched (search_budget_s=0 or no "
                       "knob to search)", reason="not searched", evidence={"search": [], "method": ""})
    ev: dict[str, Any] = {"search": v.search.to_dict("records"), "method": s.note}
    measured = s.measured
    if len(measured) <= 1:
        return Finding(thread=THREAD, kind="search", title="Scheduler tuning: nothing measured", applies=False,
                       confidence="none", headline=f"No scheduler setting was measured ({s.note}): "
                       + _by_status(s.rows), reason="no setting measured", evidence=ev)
    tried = "; ".join(_lead_words(r) for r in measured if not r.reference)
    skipped = [r for r in s.rows if r.state != "measured"]
    sk = f"Not tried: {_by_status(skipped, listed=True)}." if skipped else ""
    against = "the recommended changes combined" if v.study is not None else v.baseline_words
    if s.tuned is None and not v.verify_lead:
        return _screened(v, s, len(measured) - 1, tried, sk, against, ev)
    if s.tuned is None:
        return Finding(thread=THREAD, kind="search", title=f"Scheduler tuning: no setting beat {against}",
                       applies=True, confidence="low",
                       headline=f"{_launches(s)}{_at(s)}; output tok/s against {against}: {tried}",
                       detail=f"None led by more than {_floor(s)}, so none was verified. How: {s.note}. {sk}".strip(),
                       evidence=ev,
                       verdict=Verdict(verified=False, words=_none_verified(s, len(measured) - 1, against)))
    base, setting = v.tune_base, s.tuned_setting
    cmp = s.tuned.compare(base, setting, (), _fields(s.tuned, base, setting))
    f = cmp.finding(f"Scheduler: {setting}", setting, better=s.tuned_knobs, worse=v.combined)
    more = (f"Found by the search ({s.note}): {tried}; the lead of one launch is verified with repetitions before it "
            f"counts, and {base}'s side reads any launch of the same configuration the store already holds (another "
            f"thread's points of this run) instead of launching it again.{f' {sk}' if sk else ''}")
    worse, buffered = _worse(s.tuned, base, setting)
    if worse:
        more += " Worse with it: " + "; ".join(worse) + "."
    more += f" {buffered}." if buffered else ""
    eff, title, verdict, change = f.effect, f.title, f.verdict, f.change
    # a search picks the fastest of several one-launch settings, so its lead is biased upward: it counts only when
    # its verified interval clears the equivalence band ('high'), not merely zero (a stub's +4.5% at one level did)
    if eff is not None and f.direction == "better" and f.confidence == "high":
        title = f"Verified scheduler setting: {setting}, {eff.value_pct:+.1f}% over {against}"
        verdict = Verdict(verified=True, words=f"{eff.text()} with {shlex.join(f.recommended_flags)}, against {against}")
    elif eff is not None and f.applies:
        if f.direction == "worse" and f.confidence in ("high", "medium"):
            held = "hurts"
        elif f.direction == "better" and f.confidence == "medium":
            held = f"{eff.value_pct:+.1f}%, inside the {v.ctx.equivalence_pct:.0f}% equivalence band"
        else:
            held = "not resolved" if f.direction in ("unresolved", "mixed", "") else f.direction
        title = f"Scheduler tuning: the search's lead {setting} did not hold up ({held} when verified)"
        # a lead that hurts 'recommends' its other side, the combination: that is the first finding's, said in full
        change = None
        verdict = Verdict(verified=False, words=f"the search's lead, {setting}, did not hold up when verified "
                                                f"({eff.text()} against {against})")
    elif eff is None and s.lead is not None:  # its repetitions measured nothing (not in the store, a budget)
        title = f"Scheduler tuning: the search's lead {setting} ({s.lead[1]:+.1f}% in one launch) is not verified yet"
        verdict = Verdict(verified=False, words=f"the search's lead, {setting}, led by {s.lead[1]:+.1f}% in one "
                                                f"launch; its repetitions {_unmeasured_why(s.tuned, f.reason)}")
    return f.extended(more, ev | {"tuned_setting": setting}, kind="search", title=title, verdict=verdict, change=change)


def _unmeasured_why(st: Study, reason: str) -> str:
    """Why a study measured nothing, in words for the front line: not in the store, the run's budget, or its error."""
    why = st.results.why_unmeasured()
    return ("are not in the store" if why == "store" else
            "were not launched: the run's budget (--budget-s) ended first" if why == "budget" else
            f"measured nothing ({reason})")


def _screened(v: Verification, s: Search, n: int, tried: str, sk: str, against: str, ev: dict[str, Any]) -> Finding:
    """The search as a screen (verify_lead False): what each setting measured in its one launch, and the lead worth
    verifying elsewhere, if one led by more than the floor; the front line is the same whether one did or not."""
    lead = (f"{s.lead[0]} led by {s.lead[1]:+.1f}% in its one launch, more than {_floor(s)}: worth verifying with "
            f"repetitions (verify_lead: true), not verified here." if s.lead is not None else
            f"None led by more than {_floor(s)}.")
    words = (f"this suite's search only screens ({n} setting{'s' if n != 1 else ''}{_at(s)}, one launch each, "
             "verify_lead: false)")
    return Finding(thread=THREAD, kind="search", title="Scheduler tuning: screened, not verified", applies=True,
                   confidence="low", headline=f"{_launches(s)}{_at(s)}; output tok/s against {against}: "
                   f"{tried}", detail=f"{lead} How: {s.note}. {sk}".strip(), verdict=Verdict(verified=False, words=words),
                   evidence=ev | {"lead": list(s.lead) if s.lead is not None else None})


def _lead_words(r: SearchRow) -> str:
    """A setting's lead in words: '+3.1%', or over several machine starts 'mean -57.8% (2 starts: -59.1..-56.4%)'."""
    if r.launches > 1:
        return f"{r.setting} mean {r.vs_combined_pct:+.1f}% ({r.launches} starts: {r.low_pct:+.1f}..{r.high_pct:+.1f}%)"
    return f"{r.setting} {r.vs_combined_pct:+.1f}%"


def _launches(s: Search) -> str:
    """How many launches each setting had, in words for the headline."""
    return "One launch per setting and machine start" if any(r.launches > 1 for r in s.rows) else \
        "One launch per setting"


def _by_status(rows: Sequence[SearchRow], listed: bool = False) -> str:
    """Settings grouped by what became of them, each reason said once: 'measured: (combined); not measured: not in
    the store ...: a=1, b=2', or listed, 'a=1, b=2 (not measured: not in the store ...)'."""
    groups: dict[str, list[str]] = {}
    for r in rows:
        groups.setdefault(r.status, []).append(r.setting)
    return "; ".join(f"{', '.join(settings)} ({status})" if listed else f"{status}: {', '.join(settings)}"
                     for status, settings in groups.items())


def _floor(s: Search) -> str:
    """The lead a one-launch setting needed, in words: where it comes from and its size."""
    return f"{s.floor_why} ({s.floor_pct:.0f}%)"


def _at(s: Search) -> str:
    """' at c=16': the search's level, where it has one."""
    return f" at c={s.level}" if s.level else ""


def _none_verified(s: Search, n: int, against: str) -> str:
    """The front line's scheduler half when no setting led by more than the floor."""
    return (f"none of the {n} tried{_at(s)} led {against} by more than the combination's own launches spread there "
            f"({s.floor_pct:.0f}%), so none could be told from noise" if s.floor_from_spread else
            f"none of the {n} tried{_at(s)} beat {against} by more than {s.floor_pct:.0f}%")
