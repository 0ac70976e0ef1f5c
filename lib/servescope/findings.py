"""Findings as data: what a thread concluded, the measured effect with its spread, and what to change."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field, field_serializer, model_validator

from .spec import Knobs
from .util import atomic_write_text

Confidence = Literal["high", "medium", "low", "none"]
# weakest first: the one order every comparison of confidences uses
CONFIDENCE_ORDER: tuple[Confidence, ...] = ("none", "low", "medium", "high")
# which way a comparison's treatment moved throughput ('' where no comparison was made)
Direction = Literal["better", "worse", "no change", "mixed", "unresolved", ""]


def confidence_rank(c: Confidence) -> int:
    """Position of a confidence in CONFIDENCE_ORDER (none 0 .. high 3)."""
    return CONFIDENCE_ORDER.index(c)


def capped(c: Confidence, cap: Confidence | None) -> Confidence:
    """c, lowered to cap where cap is lower (a state that could not be verified caps what an effect can claim)."""
    return c if cap is None or confidence_rank(c) <= confidence_rank(cap) else cap


def weakest(cs: list[Confidence]) -> Confidence:
    """The lowest of several confidences ('none' for none)."""
    return min(cs, key=confidence_rank) if cs else "none"


class Effect(BaseModel):
    """A measured relative effect: the geometric mean of paired per-repetition ratios (analysis.ab.Headline), its 90%
    confidence interval (t over the repetitions' log ratios), the per-repetition effects and their min..max, whether
    it is resolved, and how the repetitions ended."""

    model_config = ConfigDict(extra="forbid")

    metric: str
    value_pct: float
    ci_low_pct: float | None = None
    ci_high_pct: float | None = None
    range_low_pct: float | None = None
    range_high_pct: float | None = None
    p_value: float | None = None
    n: int = Field(ge=0, description="paired repetitions behind the number")
    at: str = ""
    baseline: str = ""
    treatment: str = ""
    per_rep_pct: list[float] = Field(default_factory=list, description="the effect in each paired repetition")
    status: str = ""  # 'better' | 'worse' | 'no change' | 'unresolved' (analysis.ab.Headline)
    stopped: str = ""  # how the repetitions ended: resolved after n, or a budget spent
    method: str = ""  # the statistics behind the interval

    def text(self) -> str:
        """'+12.3% output_tok_s (90% CI +8.1..+15.0%, n=3, at c=16)'."""
        ci = (f"90% CI {self.ci_low_pct:+.1f}..{self.ci_high_pct:+.1f}%, " if self.ci_low_pct is not None
              and self.ci_high_pct is not None and self.ci_low_pct == self.ci_low_pct else "")
        at = f", {self.at}" if self.at.startswith(("mean", "at ")) else f", at {self.at}" if self.at else ""
        return f"{self.value_pct:+.1f}% {self.metric} ({ci}n={self.n}{at})"

    @property
    def metric_words(self) -> str:
        """The metric in a title's words ('output tok/s', 'goodput' under an SLO)."""
        return METRIC_WORDS.get(self.metric, self.metric)


METRIC_WORDS = {"output_tok_s": "output tok/s", "goodput_req_s": "goodput"}


DIRECTION_WORDS = {"high": "certain", "medium": "likely", "low": "not resolved", "none": "not measured"}


def sureness(confidence: str, effect: Effect | None) -> str:
    """How sure a finding is, direction and size apart ('direction: certain; size: +246..+330%'): a confidence
    says the sign is known, the interval says how large the effect may be."""
    direction = f"direction: {DIRECTION_WORDS.get(confidence, confidence)}"
    if effect is None or effect.ci_low_pct is None or effect.ci_high_pct is None \
            or effect.ci_low_pct != effect.ci_low_pct:
        return direction
    return f"{direction}; size: {effect.ci_low_pct:+.0f}..{effect.ci_high_pct:+.0f}% (90% CI, n={effect.n})"


class Failure(BaseModel):
    """A configuration that failed in this run (or in the store for this engine, version and model): its knobs and
    flags, what failed (the engine's own exception and frame where its log has one), whether it died before it was
    ready (at CUDA-graph capture, compile or warm-up), and who tore its tree down."""

    model_config = ConfigDict(extra="forbid")

    config: str
    knobs: dict[str, Any] = Field(default_factory=dict)
    flags: list[str] = Field(default_factory=list)
    summary: str = ""
    exception: str = ""  # 'ValueError: Invalid forward mode ...'
    frame: str = ""  # 'sglang/srt/layers/attention/triton_backend.py:1202 in ...'
    stage: str = ""  # where in the startup it died, as the log shows ('during the prefill CUDA-graph capture', ...)
    teardown: str = ""  # 'engine' | 'outside' | ''
    before_ready: bool = False
    recorded: str = ""  # '' (this run), or where an earlier run recorded it
    outputs: str = ""  # it served, but answers otherwise than its baseline: the output check's words

    def words(self) -> str:
        """'dies before it is ready (during the prefill CUDA-graph capture): ValueError: ... (at frame)'."""
        if self.outputs:
            return self.outputs
        when = f"dies before it is ready ({self.stage})" if self.before_ready and self.stage else \
            "dies before it is ready" if self.before_ready else "fails while serving"
        what = self.exception or self.summary
        return f"{when}: {what}" + (f" (at {self.frame})" if self.frame else "")

    def matches(self, knobs: dict[str, Any]) -> bool:
        """Whether a change setting knobs contains this failed configuration (every knob it set, set the same)."""
        return bool(self.knobs) and all(knobs.get(k) == v for k, v in self.knobs.items())


# what question a finding answers: the summary and thread 07 act on its fields, never on its words
Kind = Literal[
    "effect",  # two configurations measured against each other (an A/B with an interval)
    "failure",  # a configuration that dies, or could not be measured: the answer for it
    "cause",  # why the engine runs as it does (thread 01: what disables CUDA graphs)
    "rule",  # what this engine cannot run together (thread 05: compile and piecewise graphs)
    "regime",  # what bounds the server under load (thread 03)
    "kernel_path",  # which kernels run and their share of GPU time (thread 06)
    "measurement",  # figures without a comparison (a graph ceiling, communication per layer)
    "environment",  # what the run ran on (thread 00)
    "verification",  # the recommended changes measured together (thread 07)
    "search",  # the scheduler search and its verified setting (thread 07)
    "ranking",  # the summary's answer (99)
]


class Conflict(BaseModel):
    """A setting a change cannot run together with on this engine, and why (the rule, as its thread found it)."""

    model_config = ConfigDict(extra="forbid")

    knobs: dict[str, Any]  # the other setting, as knobs: {'cuda_graph': 'piecewise'}
    why: str


class Change(BaseModel):
    """What a finding recommends changing, as data: the knobs it sets, the engine's flags for them (or the
    deployment's flags to drop), the change in words where it is no flag, the setting its own thread picked instead
    (an alternative measured but not chosen), and the settings it cannot run together with."""

    model_config = ConfigDict(extra="forbid")

    knobs: Knobs | None = None  # None: a change no knob expresses (a model config key, a layout in words)
    flags: list[str] = Field(default_factory=list)  # the engine's flags to add
    drop_flags: list[str] = Field(default_factory=list)  # the deployment's own flags to remove
    words: str = ""  # the change in words where flags do not say it ('drop --enforce-eager')
    # a short name where the words are a recipe (a layout: '2 replicas on 1 GPU with MPS, least-outstanding'), for
    # the places that name the change in a line (07's verdict, its leave-one-out arms, a document's title)
    name: str = ""
    alternative_to: str = ""  # the setting its thread picked instead ('' for the pick itself)
    excludes: list[Conflict] = Field(default_factory=list)

    @field_serializer("knobs")
    def _set_only(self, k: Knobs | None) -> dict[str, Any] | None:
        # the knobs the change sets, not every default: compose and failures compare the keys
        return None if k is None else k.model_dump(mode="json", exclude_defaults=True)

    @property
    def knob_settings(self) -> dict[str, Any]:
        """The knobs the change sets, as a dict ({} where it sets none)."""
        return {} if self.knobs is None else self.knobs.model_dump(mode="json", exclude_defaults=True)

    @property
    def recommends(self) -> bool:
        """True when the change is one to make (flags to add or drop, or words); False for a fact about a setting
        that is not recommended (what it excludes)."""
        return bool(self.flags or self.drop_flags or self.words)


# a finding's texts computed from its fields: written to its JSON for readers, dropped when it is read back
DERIVED = ("claim", "recommended_flags", "recommendation")


class Verdict(BaseModel):
    """What thread 07 verified, as data: whether its effect is verified, and what, in words without the opening the
    front page gives it ('Verified: ', 'Not verified: '); summary.front_line renders the first line from it."""

    model_config = ConfigDict(extra="forbid")

    verified: bool
    words: str


class Finding(BaseModel):
    """One conclusion of one thread, with its evidence: its headline and detail (the words), and its verdict as
    fields (kind, applies, direction, confidence, optimal, the change) that every decision reads."""

    model_config = ConfigDict(extra="forbid")

    thread: str
    kind: Kind
    title: str
    headline: str  # the answer in one sentence, without its closing period
    detail: str = ""  # the sentences after it
    applies: bool = True
    reason: str = ""
    effect: Effect | None = None
    change: Change | None = None
    confidence: Confidence = "none"
    direction: Direction = ""
    evidence: dict[str, Any] = Field(default_factory=dict)
    # configurations this finding saw fail: no change containing one of them is recommended (summary, thread 07)
    failures: list[Failure] = Field(default_factory=list)
    # the measurement recommends what already runs: the engine's defaults are the better side, the deployed layout
    # beat every other, the MoE path is already grouped (99's tier "Already optimal"; 07 verifies nothing of it)
    optimal: bool = False
    verdict: Verdict | None = None  # thread 07's findings: what they verified, for the front page

    def resolved_as(self, direction: Direction, at_least: Confidence = "medium") -> bool:
        """True for a comparison that applies and moved the way asked, with at least that confidence."""
        return self.applies and self.direction == direction and confidence_rank(self.confidence) >= \
            confidence_rank(at_least)

    @model_validator(mode="before")
    @classmethod
    def _derived_in(cls, data: Any) -> Any:
        # the JSON carries the derived texts for its readers (jq, a diff): they are computed again, never read back
        if isinstance(data, dict) and "headline" in data:
            return {k: v for k, v in data.items() if k not in DERIVED}
        if isinstance(data, dict) and "claim" in data:
            raise ValueError("claim is computed from headline= and detail= (give those); a findings file written "
                             "before findings stated their headline, kind and change as fields is rendered again "
                             "from its store (servescope run SUITE --offline)")
        return data

    @computed_field  # type: ignore[prop-decorator]
    @property
    def claim(self) -> str:
        """The headline and the detail as one text."""
        return f"{self.headline}." + (f" {self.detail}" if self.detail else "")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def recommended_flags(self) -> list[str]:
        """The engine's flags the finding recommends adding ([] for none)."""
        return list(self.change.flags) if self.change is not None and self.change.recommends else []

    @computed_field  # type: ignore[prop-decorator]
    @property
    def recommendation(self) -> str:
        """The recommended change in words where it is no flag to add ('' for none)."""
        return self.change.words if self.change is not None and self.change.recommends else ""

    @property
    def recommends(self) -> bool:
        """True when the finding recommends a change (flags, flags to drop, or words)."""
        return self.change is not None and self.change.recommends

    @property
    def answers(self) -> bool:
        """True when the finding states an answer: an effect or state that applies, or a 'does not apply here'
        backed by evidence (a confidence); False for 'not measured' and the like."""
        return self.applies or self.confidence != "none"

    def extended(self, more: str = "", evidence: dict[str, Any] | None = None, **fields: Any) -> Finding:
        """A copy with sentences appended to its detail, evidence merged in and the given fields set (a thread that
        builds on a comparison's finding builds its own, leaving that one as it was)."""
        return self.model_copy(update={"detail": f"{self.detail} {more.strip()}".strip(),
                                       "evidence": {**self.evidence, **(evidence or {})}, **fields})


def sentences(headline: str, detail: str = "") -> dict[str, str]:
    """headline= and detail= for a Finding from its first sentence and the rest (a trailing period dropped)."""
    return {"headline": headline.rstrip().removesuffix("."), "detail": detail.strip()}


def best_of(findings: list[Finding], direction: Direction = "better") -> Finding | None:
    """Of comparisons, the one with the largest effect among those resolved in that direction (medium or high
    confidence), or None."""
    got = [f for f in findings if f.effect is not None and f.resolved_as(direction)]
    if not got:
        return None
    return max(got, key=lambda f: f.effect.value_pct if direction != "worse" else -f.effect.value_pct)  # type: ignore[union-attr]


def write_findings(findings: list[Finding], path: str | Path) -> Path:
    """Write findings as a JSON list (atomically)."""
    p = Path(path)
    atomic_write_text(p, json.dumps([f.model_dump(mode="json") for f in findings], indent=2, default=str) + "\n")
    return p


def read_findings(path: str | Path) -> list[Finding]:
    """Read a findings JSON written by write_findings."""
    return [Finding.model_validate(x) for x in json.loads(Path(path).read_text())]


Status = Literal["ok", "partial", "no result", "failed"]


class Outcome(BaseModel):
    """What a notebook measured, written beside its findings; the index's status is computed from it."""

    model_config = ConfigDict(extra="forbid")

    thread: str
    points_planned: int = Field(0, ge=0, description="server launches the notebook asked for (configs x repetitions)")
    points_measured: int = Field(0, ge=0)
    points_failed: int = Field(0, ge=0)
    # asked for, but an offline render found no stored point (never launched by the run that recorded the store):
    # not a failure, and not measured either
    points_unmeasured: int = Field(0, ge=0)
    # failed points whose configuration died before it was ready with the engine's own exception (the thread's
    # findings state it): the answer for that configuration (it cannot run here), not a gap in its measurement
    points_died: int = Field(0, ge=0)
    first_error: str = ""
    first_signal: str = ""  # 'SIGILL' when the first failure was a process dying from a signal
    findings_total: int = 0
    findings_answering: int = 0  # findings that state an answer (Finding.answers)

    def status(self) -> Status:
        """failed: planned points and none measured; no result: no finding states an answer; partial: an answer,
        but some points failed (other than configurations that die at launch with the engine's own exception) or
        are not in the store; ok otherwise."""
        if self.points_planned and not self.points_measured:
            return "failed"
        if not self.findings_answering:
            return "no result"
        if self.points_failed > self.points_died or self.points_unmeasured:
            return "partial"
        return "ok"

    def summary(self) -> str:
        """'4 of 6 points measured, 1 failed, 1 not in the store' (or '' for a notebook that launches nothing)."""
        if not self.points_planned:
            return ""
        s = f"{self.points_measured} of {self.points_planned} points measured"
        lost = self.points_failed - self.points_died
        died = f"{self.points_died} died at launch (a finding)" if self.points_died else ""
        return s + (f", {lost} failed" if lost else "") + (f", {died}" if died else "") + \
            (f", {self.points_unmeasured} not in the store" if self.points_unmeasured else "")


FINDINGS_SUFFIX = ".findings.json"


def _thread_of(findings_path: Path) -> str:
    """The notebook a findings file belongs to (X.findings.json -> X)."""
    n = findings_path.name
    return n[: -len(FINDINGS_SUFFIX)] if n.endswith(FINDINGS_SUFFIX) else findings_path.stem


def outcome_path(findings_path: str | Path) -> Path:
    """Where a notebook's outcome sits: beside its findings (X.findings.json -> X.outcome.json)."""
    p = Path(findings_path)
    return p.with_name(f"{_thread_of(p)}.outcome.json")


def write_outcome(outcome: Outcome, findings_path: str | Path) -> Path:
    """Write the outcome JSON beside the findings (atomically)."""
    p = outcome_path(findings_path)
    atomic_write_text(p, outcome.model_dump_json(indent=2) + "\n")
    return p


def read_outcome(findings_path: str | Path) -> Outcome | None:
    """The outcome written beside findings_path, or None if the notebook wrote none."""
    p = outcome_path(findings_path)
    return Outcome.model_validate_json(p.read_text()) if p.is_file() else None


# 99's tiers (servescope.summary ranks by them; thread 07 reads the High and Medium ones)
TIERS = ("High", "Medium", "Low", "Excluded: failed here", "Already optimal", "Measured, no change",
         "Not applicable here", "Not measured")
SUMMARY = "99_summary"  # the summary notebook: collect leaves its own findings out


def failures_of(by_thread: dict[str, list[Finding]]) -> list[Failure]:
    """Every failed configuration the run's findings carry."""
    return [x for fs in by_thread.values() for f in fs for x in f.failures]


def failed_change(f: Finding, failed: list[Failure]) -> Failure | None:
    """The failed configuration a finding's recommended change contains, if any (its knobs set every knob the
    failure set, the same way)."""
    knobs = f.change.knob_settings if f.change is not None else {}
    return next((x for x in failed if knobs and x.matches(knobs)), None)


def tier(f: Finding, failed: list[Failure] | None = None) -> str:
    """Which of 99's tiers a finding falls in (see servescope.summary's docstring); a change that contains a
    configuration that failed here (failed: failures_of the run) is excluded."""
    if not f.answers:
        return "Not measured"
    if f.applies and f.recommends and failed and failed_change(f, failed):
        return "Excluded: failed here"
    if f.applies and f.recommends:
        if f.effect is None:
            return "Low"
        return {"high": "High", "medium": "Medium"}.get(f.confidence, "Low")
    if f.optimal:
        return "Already optimal"
    if not f.applies:
        return "Not applicable here"
    return "Measured, no change"


def unfinished(report_dir: str | Path) -> dict[str, str]:
    """The threads of a report folder that did not finish, with their status and why in words ('partial: 5 of 9
    points measured, 4 not in the store'): stopped before their findings, nothing measured, or points never measured
    (the budget ended first). A point that failed is a finished answer (that configuration dies here), and a thread
    with nothing to measure here is not unfinished; the summary's own left out."""
    d, out = Path(report_dir), {}
    # every notebook the run executed (its .ipynb, finished or not) or wrote findings for (a rendered reference
    # keeps no .ipynb)
    threads = {p.stem for p in d.glob("*.ipynb")} | {_thread_of(p) for p in d.glob(f"*{FINDINGS_SUFFIX}")}
    for thread in sorted(threads - {SUMMARY}):
        p = d / f"{thread}{FINDINGS_SUFFIX}"
        if not p.is_file():
            out[thread] = "failed: the notebook stopped before it wrote its findings"
        elif (o := read_outcome(p)) is not None and (o.status() == "failed" or o.points_unmeasured):
            out[thread] = f"{o.status()}: {o.summary()}"
    return out


def collect(report_dir: str | Path) -> dict[str, list[Finding]]:
    """Every thread's findings in a report folder (X.findings.json), the summary's own left out (99's tiers:
    summary)."""
    out = {}
    for p in sorted(Path(report_dir).glob(f"*{FINDINGS_SUFFIX}")):
        if (thread := _thread_of(p)) != SUMMARY:
            out[thread] = read_findings(p)
    return out
