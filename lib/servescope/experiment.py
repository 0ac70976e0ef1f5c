"""Measure configurations of one engine under one load, with alternating repetitions, through the store."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import psutil

from . import outputs
from .context import RepetitionPlan, RunContext, context
from .engines.base import EngineAdapter
from .errors import (
    UNMEASURED,
    HungError,
    KnobError,
    LevelFailedError,
    NotLaunchedError,
    NotMeasuredError,
    RecordedFailure,
    ServerError,
    ServerExitedError,
    ServerStartTimeout,
    ServescopeError,
    SpecError,
)
from .findings import Finding, Outcome
from .launch import Prepared, check_deployment_args, flag_dests, launch_plan, prepare, serve
from .load import load_tokenizer, run_sweep
from .load.health import level_failure
from .load.metrics import GOODPUT_COLUMNS, rejudge, summarize
from .load.runner import LoadResult
from .models import model_config, model_info
from .profile import window as profiling
from .server import log_tails, read_logs
from .spec import DeploymentSpec, EngineSpec, Knobs, LoadSpec, ModelSpec, ProfileSpec, RunnerSpec, TelemetrySpec
from .store import MANIFEST, Point, Store
from .telemetry import Telemetry
from .util import atomic_write_json, rep_label

TELEMETRY_TABLES = ("gpu", "gpu_static", "gpu_procs", "host_cpu", "server_procs", "server_threads", "server_metrics",
                    "dcgm")


class LazyTables(Mapping[str, pd.DataFrame]):
    """The telemetry tables of many stored points, each read (every point's rows, tagged with its ids) the first time
    a thread asks for it: at real size a store's telemetry runs to gigabytes, and most threads read one or two
    tables of it."""

    def __init__(self, sources: list[tuple[Point, dict[str, Any]]]) -> None:
        self._sources = sources
        self._read: dict[str, pd.DataFrame] = {}
        self._windows: dict[str, dict[str, tuple[float, float]]] = {}

    def _window(self, pt: Point) -> dict[str, tuple[float, float]]:
        if pt.key not in self._windows:
            self._windows[pt.key] = steady_windows(pt)
        return self._windows[pt.key]

    def __getitem__(self, name: str) -> pd.DataFrame:
        if name not in TELEMETRY_TABLES:
            raise KeyError(name)
        if name not in self._read:
            frames = [steady_phases(t, self._window(pt)).assign(**ids) for pt, ids in self._sources
                      if not (t := pt.table(f"telemetry_{name}")).empty]
            self._read[name] = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        return self._read[name]

    def __iter__(self) -> Iterator[str]:
        return iter(TELEMETRY_TABLES)

    def __len__(self) -> int:
        return len(TELEMETRY_TABLES)

    def select(self, configs: set[str]) -> LazyTables:
        """The same tables of the points of these configurations only (still unread)."""
        return LazyTables([(pt, ids) for pt, ids in self._sources if ids["config"] in configs])


def steady_windows(pt: Point) -> dict[str, tuple[float, float]]:
    """Per level measured over its steady window (load.steady_state), that window in unix seconds: its offsets in the
    summary from the level's first send, which its requests give (their start times alone are read)."""
    s = pt.table("summary")
    if s.empty or "steady_from_s" not in s or "figures_over" not in s:
        return {}
    s = s[(s["figures_over"] == "steady window") & s["steady_from_s"].notna()]
    if s.empty:
        return {}
    req = pt.table("requests", columns=["phase", "point_index", "start_unix"])
    t0 = req[req["phase"] == "measure"].groupby("point_index")["start_unix"].min()
    return {str(r.point): (t0[r.point_index] + r.steady_from_s, t0[r.point_index] + r.steady_to_s)
            for r in s.itertuples() if r.point_index in t0.index}


def steady_phases(t: pd.DataFrame, windows: dict[str, tuple[float, float]]) -> pd.DataFrame:
    """Telemetry readings of a level outside its steady window (steady_windows) relabelled 'ramp:<level>' (ramp and
    drain), so that every figure read from them covers what the load's figures cover."""
    if not windows or "phase" not in t or "time_unix" not in t:
        return t
    phase = t["phase"].astype(str).copy()
    for label, (w0, w1) in windows.items():
        outside = (phase == label) & ((t["time_unix"] < w0) | (t["time_unix"] > w1))
        phase[outside] = "ramp:" + label
    return t.assign(phase=phase)


@dataclass(frozen=True)
class Config:
    """A named configuration to measure."""

    name: str
    knobs: Knobs


@dataclass
class Results:
    """Everything measured (or read back) for a set of configurations, as tidy DataFrames."""

    summary: pd.DataFrame
    requests: pd.DataFrame
    startup: pd.DataFrame
    points: pd.DataFrame
    errors: pd.DataFrame
    stored: dict[tuple[str, int], Point] = field(default_factory=dict)  # (config, rep) -> the stored point
    telemetry: Mapping[str, pd.DataFrame] = field(default_factory=dict)  # table name -> rows of every point (lazy)
    telemetry_status: pd.DataFrame = field(default_factory=pd.DataFrame)
    planned: int = 0  # points asked for: configurations x repetitions
    kernels: pd.DataFrame = field(default_factory=pd.DataFrame)  # kernel tables of profiled points (config, rep)
    profiles: pd.DataFrame = field(default_factory=pd.DataFrame)  # one row per profiled window: level, seconds, ...
    runtime: pd.DataFrame = field(default_factory=pd.DataFrame)  # launch/runtime API calls of profiled points
    stopped: str = ""  # why the repetitions ended (resolved after n, a budget, the store's extent offline)
    deployment: str = ""  # the deployment every configuration launched and what the configurations changed of it
    output_checks: pd.DataFrame = field(default_factory=pd.DataFrame)  # each point's answers to the check set

    def outcome(self, thread: str, findings: list[Finding]) -> Outcome:
        """Points planned, measured and failed, the first error (and signal), and how many findings answer."""
        first = self.errors.iloc[0] if len(self.errors) else None
        gaps = int(self.errors["error_type"].isin(UNMEASURED).sum()) if len(self.errors) else 0
        died = int(self.died_at_launch().sum()) if len(self.errors) else 0
        return Outcome(thread=thread, points_planned=self.planned, points_measured=len(self.points),
                       points_failed=len(self.errors) - gaps, points_unmeasured=gaps, points_died=died,
                       first_error="" if first is None else f"{first['config']} {rep_label(first['rep'])}: {first['summary']}",
                       first_signal="" if first is None else str(first.get("signal") or ""),
                       findings_total=len(findings), findings_answering=sum(f.answers for f in findings))

    def died_at_launch(self) -> pd.Series:
        """Per failed point: whether its server died before it was ready with the engine's own exception (the
        configuration cannot run here: the thread's answer for it, stated as a finding, not a gap)."""
        e = self.errors
        return ~e["error_type"].isin(UNMEASURED) & e["before_ready"].astype(bool) & e["exception"].astype(bool)

    def why_unmeasured(self) -> str:
        """Where every point asked for went unmeasured for one reason: 'budget' (the run's --budget-s left them
        unlaunched), 'store' (offline, not in the store); '' otherwise (a failure among them, or no error)."""
        kinds = set(self.errors["error_type"]) if len(self.errors) else set()
        return {frozenset({NotLaunchedError.__name__}): "budget",
                frozenset({NotMeasuredError.__name__}): "store"}.get(frozenset(kinds), "")

    def point(self, config: str, rep: int | None = None) -> Point | None:
        """A configuration's stored point (its first repetition unless rep is given), or None if it has none."""
        reps = sorted(r for c, r in self.stored if c == config and (rep is None or r == rep))
        return self.stored[(config, reps[0])] if reps else None

    def machine_starts(self, configs: Sequence[str]) -> dict[str, set[str]]:
        """Per configuration of configs, the machine starts its stored points ran on ('' for one not recorded)."""
        return self._per_config(configs, lambda pt: pt.machine_start)

    def cards(self, configs: Sequence[str]) -> dict[str, set[str]]:
        """Per configuration of configs, the GPU models its stored points ran on (none named for a CPU build)."""
        return {c: seen - {""} for c, seen in self._per_config(configs, lambda pt: pt.card or "").items()}

    def _per_config(self, configs: Sequence[str], of: Callable[[Point], str]) -> dict[str, set[str]]:
        """Per configuration of configs, the values of(point) over its stored points."""
        out: dict[str, set[str]] = {c: set() for c in configs}
        for (c, _), pt in self.stored.items():
            if c in out:
                out[c].add(of(pt))
        return out

    def engine_default_configs(self) -> set[str]:
        """The configurations that set no knob (the engine's defaults, profiled or not), by name."""
        pts = self.points
        return set(pts.loc[pts["engine_defaults"].astype(bool), "config"]) if "engine_defaults" in pts else set()

    def select(self, configs: Sequence[str]) -> Results:
        """The same tables holding only these configurations (planned counts the points kept)."""
        keep = set(configs)
        pick = lambda df: df[df["config"].isin(keep)].reset_index(drop=True) if "config" in df else df  # noqa: E731
        return Results(summary=pick(self.summary), requests=pick(self.requests), startup=pick(self.startup),
                       points=pick(self.points), errors=pick(self.errors),
                       stored={k: v for k, v in self.stored.items() if k[0] in keep},
                       telemetry=self.telemetry.select(keep) if isinstance(self.telemetry, LazyTables)
                       else {k: pick(v) for k, v in self.telemetry.items()},
                       telemetry_status=pick(self.telemetry_status), planned=int(self.points["config"].isin(
                           keep).sum()) if len(self.points) else 0, kernels=pick(self.kernels),
                       profiles=pick(self.profiles), runtime=pick(self.runtime), stopped=self.stopped,
                       deployment=self.deployment, output_checks=pick(self.output_checks))

    def client_health(self) -> pd.DataFrame:
        """Per configuration, repetition and point: how busy the load client was, whether it limited the
        measurement, or was starved by an oversubscribed host (NaN for points stored before this was measured)."""
        cols = ["config", "rep", "point", "client_cpu_pct", "loop_lag_ms_p99", "loop_lag_ms_max", "send_lag_ms_p99",
                "achieved_rate", "requested_rate", "client_limited", "client_starved", "client_warning"]
        if self.summary.empty:
            return pd.DataFrame(columns=cols)
        s = self.summary.copy()
        if "point" not in s:
            s["point"] = "c=" + s["concurrency"].astype(int).astype(str)
        for c in cols:
            if c not in s:
                s[c] = {"client_limited": False, "client_starved": False, "client_warning": ""}.get(c, float("nan"))
        return s[cols]

    def client_warnings(self, kind: str = "limited") -> list[str]:
        """One line per point where the client limited the figure (kind='limited') or was starved ('starved')."""
        h = self.client_health()
        bad = h[h[f"client_{kind}"].fillna(False).astype(bool)]
        return [f"{r.config} {rep_label(r.rep)} {r.point}: {r.client_warning}" for r in bad.itertuples()]


class _Tables:
    """The tables of stored points, gathered point by point and turned into Results; slo_ms (the suite's SLO, none
    kept with a point) judges each point's goodput from its stored requests."""

    def __init__(self, slo_ms: dict[str, float] | None = None) -> None:
        self.slo_ms = dict(slo_ms or {})
        self.summaries: list[pd.DataFrame] = []
        self.requests: list[pd.DataFrame] = []
        self.startups: list[dict[str, Any]] = []
        self.points: list[dict[str, Any]] = []
        self.errors: list[dict[str, Any]] = []
        self.kernels: list[pd.DataFrame] = []
        self.windows: list[dict[str, Any]] = []
        self.runtimes: list[pd.DataFrame] = []
        self.checks: list[pd.DataFrame] = []
        self.tele: list[tuple[Point, dict[str, Any]]] = []  # read table by table when a thread asks (LazyTables)
        self.tele_status: list[dict[str, Any]] = []
        self.stored: dict[tuple[str, int], Point] = {}

    def add(self, pt: Point, key: str, ids: dict[str, Any]) -> None:
        """Every table of one stored point, tagged with ids (config, rep)."""
        self.summaries.append(with_goodput(rejudge(pt.table("summary")), pt, self.slo_ms).assign(**ids))
        # every request's per-token gaps (a list per request, the bulk of the table at real size) are read by no
        # thread: the load's figures were computed from them when the level was written
        self.requests.append(pt.table("requests", exclude=("itl_ms",)).assign(**ids))
        m = pt.manifest
        self.startups.append({**ids, **(pt.target.get("startup") or {})})
        # cuda_graph and flag_list as data: a reader picks points by knob, not by the label's words
        self.points.append({**ids, "key": key, "path": str(pt.path), "flags": " ".join(pt.flags),
                            "flag_list": list(pt.flags), "cuda_graph": (pt.parts.get("knobs") or {}).get("cuda_graph"),
                            "engine_defaults": not pt.parts.get("knobs"),
                            "command": pt.target.get("command", ""),
                            "started_unix": m.get("started_unix"), "ended_unix": m.get("ended_unix")})
        self.stored.setdefault((ids["config"], int(ids["rep"])), pt)
        oc = pt.table("output_check")
        if not oc.empty:
            self.checks.append(oc.assign(**ids))
        k = pt.table("kernels")
        if not k.empty:
            self.kernels.append(k.assign(**ids))
            rt = pt.table("kernel_runtime")
            if not rt.empty:
                self.runtimes.append(rt.assign(**ids))
            self.windows.append({**ids, **(m.get("profile") or {})})
        self.tele.append((pt, ids))
        if "telemetry" in m:
            self.tele_status.append({**ids, **{k: v if not isinstance(v, dict) else str(v)
                                               for k, v in m["telemetry"].items()}})

    def results(self, planned: int) -> Results:
        """The gathered tables as Results."""
        cat = lambda xs: pd.concat(xs, ignore_index=True) if xs else pd.DataFrame()  # noqa: E731
        return Results(summary=cat(self.summaries), requests=cat(self.requests), startup=pd.DataFrame(self.startups),
                       points=pd.DataFrame(self.points),
                       errors=pd.DataFrame(self.errors, columns=list(ERROR_COLUMNS)), stored=self.stored,
                       telemetry=LazyTables(list(self.tele)),  # a snapshot: the loop goes on adding points
                       telemetry_status=pd.DataFrame(self.tele_status), planned=planned, kernels=cat(self.kernels),
                       profiles=pd.DataFrame(self.windows), runtime=cat(self.runtimes),
                       output_checks=cat(self.checks))


def point_label(parts: dict[str, Any], deployment: DeploymentSpec | None = None) -> str:
    """A readable name for a stored point's configuration: its knobs (or 'engine defaults'; with a deployment, the
    knobs it changed of it, or 'the deployment'), and its profile."""
    knobs = parts.get("knobs") or {}
    if deployment is not None and not deployment.empty:
        knobs = deployment.relative(knobs)
    shown = [f"{k}={v}" for k, v in sorted(knobs.items()) if k != "extra_args"]
    if knobs.get("extra_args"):
        shown.append(" ".join(map(str, knobs["extra_args"])))
    none = "the deployment" if deployment is not None and not deployment.empty else "engine defaults"
    label = ", ".join(shown) or none
    prof = (parts.get("profile") or {}).get("kind")
    return f"{label} (+{prof} profile)" if prof else label


def with_goodput(summary: pd.DataFrame, pt: Point, slo_ms: dict[str, float]) -> pd.DataFrame:
    """A stored point's summary with its goodput under slo_ms, judged again from its stored requests: an SLO is the
    reader's, not the measurement's (it names no point), so a new one reads the same store."""
    kept = summary.drop(columns=[c for c in GOODPUT_COLUMNS if c in summary])
    if not slo_ms or kept.empty or "point_index" not in kept:
        return kept
    again = summarize(pt.table("requests", exclude=("itl_ms",)), pt.table("health"), slo_ms)
    if again.empty or "point_index" not in again:
        return kept
    return kept.merge(again[["point_index", *GOODPUT_COLUMNS]], on="point_index", how="left")


def read_store(store: Store, engine: str | None = None, model: dict[str, Any] | None = None,
               deployment: DeploymentSpec | None = None, slo_ms: dict[str, float] | None = None) -> Results:
    """Every complete point in a store (optionally only one engine identity and model) as Results, each named by
    its knobs (those it changed of the deployment, where one is given): what other threads measured, read without
    launching anything."""
    acc = _Tables(slo_ms)
    for pt in store.points(engine, model):
        acc.add(pt, pt.key, {"config": point_label(pt.parts, deployment), "rep": int(pt.parts.get("rep", 0))})
    return acc.results(planned=len(acc.points))


def _say(msg: str) -> None:
    print(time.strftime("%H:%M:%S"), msg, flush=True)


def point_parts(ctx: RunContext, knobs: Knobs, rep: int, load: LoadSpec | None = None,
                profile: ProfileSpec | None = None) -> dict[str, Any]:
    """Key material of one point: engine identity, model, knobs (the deployment's with the configuration's over them),
    load (the context's unless given), repetition
    index, and the profile when one is taken (a point with its profiler armed is another point; whether it is
    another launch for the load, launch_identity decides).

    Fields left at their defaults are left out, so adding a field keeps old keys valid; changing a default
    would silently change what old points mean, which tests/test_experiment.py guards against."""
    profile = ctx.profile if profile is None else profile
    knobs = ctx.deployed(knobs)  # the deployment's settings are the point's too: a thread's knobs only change some
    parts = {"engine": ctx.engine_identity, "engine_env": dict(sorted(ctx.engine.env.items())),
             **({"engine_args": list(ctx.engine.args)} if ctx.engine.args else {}),
             "model": ctx.model_key, "knobs": knobs.model_dump(mode="json", exclude_defaults=True),
             "load": (load or ctx.load).key_dump(), "rep": rep}
    if profile.kind != "none":
        parts["profile"] = profile.model_dump(mode="json", exclude_defaults=True)
    if ctx.pinned_start:
        parts["machine_start"] = ctx.pinned_start
    return parts


def is_stored(ctx: RunContext, knobs: Knobs, rep: int = 0) -> bool:
    """Whether the store holds the context's point of these knobs at repetition rep (completed)."""
    return ctx.store.has(ctx.store.key(point_parts(ctx, knobs, rep)))


# until(results so far) -> the configurations that need another repetition (empty: every headline is resolved)
Until = Callable[[Results], set[str]]


def measure(
    engine: EngineSpec, model: ModelSpec, configs: Sequence[Config], load: LoadSpec, repetitions: int = 3,
    store: Store | None = None, offline: bool = False, force: bool = False, progress: bool = False,
    say: Callable[[str], None] = _say, telemetry: TelemetrySpec | None = None, profile: ProfileSpec | None = None,
    plan: RepetitionPlan | None = None, until: Until | None = None, runner: dict[str, Any] | None = None,
) -> Results:
    """Measure configurations of an engine named by its spec (an entry point: the engine is resolved here, once);
    see run_configs."""
    ctx = context(engine, model, load, repetitions=repetitions, store=store or Store(), offline=offline, force=force,
                  progress=progress, telemetry=telemetry, profile=profile, runner=runner)
    return run_configs(ctx.with_(plan=plan) if plan is not None else ctx, configs, until=until, say=say)


@dataclass
class _Loop:
    """The state of one run_configs call: what was gathered, planned, and the engine once prepared."""

    ctx: RunContext
    configs: Sequence[Config]
    say: Callable[[str], None]
    acc: _Tables = field(default_factory=_Tables)
    planned: int = 0

    def __post_init__(self) -> None:
        self.acc.slo_ms = dict(self.ctx.load.slo_ms)
    prep: Prepared | None = None
    launched: bool = False  # a launch was attempted in the current repetition (it times the next one)
    # a Ray runner measures a repetition's configurations at once (run_configs): one preparation, one writer of acc
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def tag(self, rep: int, cfg: Config) -> str:
        plan = self.ctx.plan
        return f"{rep_label(rep)} {cfg.name}" + (f" (of at least {plan.min_reps})" if plan.max_reps > plan.min_reps
                                              else f"/{plan.max_reps}")

    def point(self, rep: int, cfg: Config, slot: int | None = None) -> str:
        """Measure (or read) one configuration's point of repetition rep: 'launched', 'stored', 'missing' (offline,
        a repetition the store does not hold) or 'late' (the run's budget would end first); a failure is recorded,
        not raised."""
        ctx, store, tag = self.ctx, self.ctx.store, self.tag(rep, cfg)
        parts = point_parts(ctx, cfg.knobs, rep)
        key, how = store.key(parts), "stored"
        try:
            if store.has(key) and not ctx.force:
                self.say(f"{tag}: from store ({key})")
            elif (died := None if ctx.force else store.recorded_death(key)) is not None:
                raise recorded_failure(*died)
            elif rep >= 1 and ctx.offline:  # a repetition the measuring run did not take (or an older, shorter run)
                return "missing"
            else:
                how = self._launch(rep, Config(cfg.name, ctx.deployed(cfg.knobs)), key, parts, tag, slot)
            pt = store.get(key)
        except SpecError:  # bad input (model path, a knob this version or machine cannot run): stop, launch nothing
            raise
        except NotLaunchedError as e:  # the run's budget: asked, not measured, and nothing after it launches either
            with self.lock:
                self.planned += 1
                self.acc.errors.append(error_row(cfg.name, rep, key, e))
            self.say(f"{e}")
            return "late"
        except Exception as e:  # a failed point must not lose the others
            row = error_row(cfg.name, rep, key, e)
            with self.lock:
                self.planned += 1
                self.acc.errors.append(row)
            self.say(f"{tag}: FAILED: {row['summary']}")
            if row["death"] and not row["recorded"]:
                self.say("  " + row["death"].replace("\n", "\n  "))
            # a launch that dies before it is ready with the engine's own exception dies the same way again: its
            # later repetitions are not launched (they would spend the same startup to learn nothing)
            # so does one that never became ready in its time (a launch of minutes each), and one the store already
            # holds as such a death
            repeats = row["exception"] or row["error_type"] in (ServerStartTimeout.__name__, RecordedFailure.__name__)
            return "dead" if row["before_ready"] and repeats else "failed"
        with self.lock:
            self.planned += 1
            self.acc.add(pt, key, {"config": cfg.name, "rep": rep})
        return how

    def _launch(self, rep: int, cfg: Config, key: str, parts: dict[str, Any], tag: str, slot: int | None) -> str:
        ctx = self.ctx
        if ctx.offline:
            raise NotMeasuredError(f"{tag}: not in the store ({key}) and offline=True")
        with self.lock:
            if self.prep is None:
                self.prep = prepare(ctx.engine, ctx.model, self.say, adapter=ctx.adapter)
                # before the first launch, every configuration at once, as launched (the deployment under each)
                _check_all(self.prep, [Config(c.name, ctx.deployed(c.knobs)) for c in self.configs],
                           ctx.deployment.args, ctx.runner)
        shared = None if ctx.force else _shared_point(ctx, key, parts, self.prep, cfg)
        if shared is not None:
            self.say(f"{tag}: the same launch as stored point {shared} (one configuration, measured once)")
            return "stored"
        late = _past_deadline(ctx.store, parts)
        if late:
            raise NotLaunchedError(f"{tag}: not launched: {late}")
        if ctx.force:
            ctx.store.drop_partial(key)
        self.launched = True
        _measure(ctx, key, parts, self.prep, cfg, tag, self.say, slot)
        return "launched"


# the end of the run's budget, as a Unix time: servescope run --budget-s sets it for the notebooks' kernels
DEADLINE_ENV = "SERVESCOPE_LAUNCH_DEADLINE"


def _past_deadline(store: Store, parts: dict[str, Any]) -> str:
    """Why this point would not finish within the run's budget ('' where it would, or no budget is set): the time left
    against the longest a point like it took in this store (a point with none like it before is launched)."""
    raw = os.environ.get(DEADLINE_ENV, "")
    if not raw:
        return ""
    try:
        left = float(raw) - time.time()
    except ValueError:
        raise SpecError(f"{DEADLINE_ENV}={raw!r}: a Unix time (servescope run --budget-s sets it)") from None
    took = store.longest_point_s(parts) if left > 0 else 0.0
    if took is None or left >= took > 0:
        return ""
    return (f"the run's budget (--budget-s) ends in {max(left, 0):.0f} s"
            + (f" and a point like it took up to {took:.0f} s here" if took else "") + "; a later run launches it")


def _stop_reason(loop: _Loop, rep: int, until: Until | None, t0: float, rep_s: float) -> tuple[list[Config], str]:
    """Past the plan's minimum: the configurations that need another repetition, or why the loop ends."""
    plan = loop.ctx.plan
    need = until(loop.acc.results(loop.planned)) if until is not None else set()
    active = [c for c in loop.configs if c.name in need]
    if not active:
        return [], f"resolved after {rep} repetitions"
    if plan.budget_s and time.monotonic() - t0 + rep_s > plan.budget_s:
        return [], (f"time budget spent: {time.monotonic() - t0:.0f} s of budget_s={plan.budget_s:.0f}, and a "
                    f"repetition takes about {rep_s:.0f} s")
    return active, ""


def run_configs(ctx: RunContext, configs: Sequence[Config], until: Until | None = None,
                say: Callable[[str], None] = _say, partners: dict[str, set[str]] | None = None) -> Results:
    """Each repetition launches every configuration once, alternating their order (ABBA...) so drift cancels; past
    the plan's minimum, a repetition runs only the configurations `until` names, and the loop ends when it names
    none, at the plan's maximum, or when the next repetition would not fit the time budget (Results.stopped says
    which). Completed points come from the store; a failing point is recorded and the rest go on. partners: the
    configurations each is compared with; one whose partners all died before they were ready is not launched
    again (nothing is left to compare it with), though its stored repetitions are read."""
    if len({c.name for c in configs}) != len(configs):
        raise ServescopeError("configuration names must be unique")
    plan, loop = ctx.plan, _Loop(ctx, configs, say)
    t0, rep_s, rep, active, stopped = time.monotonic(), 0.0, 0, list(configs), ""
    gone: set[str] = set()  # offline: configurations whose next repetition the store does not hold
    dead: set[str] = set()  # died before they were ready, the same way each launch
    alone: list[str] = []  # stopped because every configuration they are compared with is dead
    while rep < plan.max_reps:
        if rep >= plan.min_reps:
            active, stopped = _stop_reason(loop, rep, until, t0, rep_s)
            active = [c for c in active if c.name not in gone]
            if not active:
                break
        if rep and partners and (left := _partnerless(ctx, rep, active, partners, dead)):
            alone += left
            gone |= set(left)
            active = [c for c in active if c.name not in gone]
            if not active:
                break
        t_rep, loop.launched = time.monotonic(), False
        order = active if rep % 2 == 0 else list(reversed(active))
        hows = _points_of(loop, rep, order)
        # a shorter run of one configuration must not hide the repetitions the store holds of the others; a
        # configuration that died before it was ready is not launched again
        gone |= {c.name for c, how in zip(order, hows, strict=True) if how in ("missing", "dead", "late")}
        dead |= {c.name for c, how in zip(order, hows, strict=True) if how == "dead"}
        active = [c for c in active if c.name not in gone]
        if not active:
            break
        if loop.launched:
            rep_s = time.monotonic() - t_rep
        rep += 1
    else:
        stopped = f"max_repetitions={plan.max_reps} reached" if plan.max_reps > plan.min_reps else \
            f"{plan.max_reps} repetitions, as asked"
    said = _late_offline(loop, configs, rep) if ctx.offline else None
    unlaunched = sorted({(r["config"], int(r["rep"])) for r in loop.acc.errors
                         if r["error_type"] == NotLaunchedError.__name__})
    late = sorted({c for c, _ in unlaunched})
    if late:
        stopped = (f"the run's budget (--budget-s) ended before {', '.join(late)} could launch: a later run goes on "
                   "from the store")
    elif alone:
        they = "it is" if len(alone) == 1 else "they are"
        stopped = (f"{', '.join(alone)} not launched again: every configuration {they} compared with died before it "
                   "was ready, so another launch would compare nothing")
    elif gone - {r["config"] for r in loop.acc.errors if r["before_ready"] and r["exception"]}:
        stopped = _held(loop, configs)
    res = loop.acc.results(loop.planned)
    res.stopped = _keep_stopped(ctx, configs, rep, stopped, unlaunched, said)
    res.deployment = deployment_words(ctx, configs)
    return res


def _partnerless(ctx: RunContext, rep: int, active: Sequence[Config], partners: dict[str, set[str]],
                 dead: set[str]) -> list[str]:
    """The active configurations whose partners all died before they were ready and whose next repetition the store
    lacks: launching it would cost a startup and compare nothing (a stored one is read, as any other)."""
    return [c.name for c in active if c.name not in dead and (ps := partners.get(c.name)) and ps <= dead
            and not is_stored(ctx, c.knobs, rep)]


def _points_of(loop: _Loop, rep: int, order: Sequence[Config]) -> list[str]:
    """One repetition's points: one after another, or at once on a Ray runner that asks for it (each point a task on
    a node of its own choosing; their order in the repetition then only orders their submission)."""
    r = loop.ctx.runner
    # a server over several nodes takes them whole: its points go one at a time, never waiting on each other's nodes
    spans = any(c.knobs.nodes > 1 for c in order)
    if r.kind != "ray" or not r.parallel or len(order) < 2 or loop.ctx.offline or spans:
        return [loop.point(rep, cfg) for cfg in order]
    from concurrent.futures import ThreadPoolExecutor

    # each configuration moves one node on per repetition, so a difference between cards cancels over repetitions
    # instead of biasing one side
    slot = {c.name: i + rep for i, c in enumerate(loop.configs)}
    from . import raypoints

    raypoints.connect(r)  # joined from this thread, not the points' (Ray sets its signal handlers in the first)
    with ThreadPoolExecutor(max_workers=len(order), thread_name_prefix="servescope-point") as pool:
        try:
            return list(pool.map(lambda cfg: loop.point(rep, cfg, slot[cfg.name]), order))
        except KeyboardInterrupt:  # Ctrl-C reaches this thread alone: the points' tasks on their nodes end too
            raypoints.cancel_all()
            raise


def point_gpus(knobs: Knobs, platform: str) -> int:
    """The GPUs one point of knobs takes on each of its nodes (Knobs.devices, over Knobs.nodes); none for a CPU
    build."""
    if platform == "cpu":
        return 0
    return knobs.ranks_per_node if knobs.nodes > 1 else knobs.devices


def _measure(ctx: RunContext, key: str, parts: dict[str, Any], prep: Prepared, cfg: Config, tag: str,
             say: Callable[[str], None], slot: int | None = None) -> None:
    """One point measured where the run's runner puts it: here (_run_point), or as a Ray task on a node of the
    cluster, in a store of the node's own (its finished levels sent along, so it resumes), whose folders come back
    into this store as a local point's would have been written, with the node it ran on in its manifest."""
    if ctx.runner.kind == "local":
        _run_point(ctx, key, parts, prep, cfg, tag, say)
        return
    from . import raypoints

    gpus = point_gpus(cfg.knobs, prep.install.platform)
    sent = raypoints.pack(ctx.store.root, [f"_partial/{key}"])
    with contextlib.ExitStack() as stack:
        span = None
        if cfg.knobs.nodes > 1:  # one server over nodes: a bundle per node, this point's task in bundle 0 (rank 0)
            from . import span as spans

            spans.check_fits(ctx.runner, cfg.knobs, gpus, tag)
            span = stack.enter_context(spans.placement(ctx.runner, cfg.knobs, gpus, tag))
        else:
            raypoints.check_fits(ctx.runner, gpus, tag)
        data, err, node = raypoints.run(ctx.runner, _point_on_node, (ctx, key, parts, cfg, tag, startup_timeout(ctx),
                                        sent, span), gpus, tag, slot, on_line=say,
                                        bundle=spans.in_bundle(span, 0) if span is not None else None,
                                        on_level=lambda level: raypoints.put_level(ctx.store.root, level))
    where = {"kind": "ray", "address": ctx.runner.address, **node}
    raypoints.unpack(data, ctx.store.root)
    for m in [ctx.store.root / key / MANIFEST, *(p / MANIFEST for p in (ctx.store.root / "_failed").glob(f"{key}-*"))]:
        if m.is_file():
            manifest = json.loads(m.read_text())
            if "runner" not in manifest:
                atomic_write_json(m, manifest | {"runner": where})
    if ctx.store.has(key):
        ctx.store.drop_partial(key)
    if err is not None:
        raise err


class _MirroredStore(Store):
    """A Ray node's store for one point: each level it finishes is also put on the driver's queue (tell) at once,
    which the driver drains into its own store."""

    def __init__(self, root: str | os.PathLike[str], tell: Any) -> None:
        super().__init__(root)
        self.tell = tell

    def put_level(self, key: str, label: str, tables: dict[str, pd.DataFrame], meta: dict[str, Any]) -> Path:
        """Store.put_level, then the level put on the driver's queue (waited for: it is off this node once this
        returns)."""
        from . import raypoints

        final = super().put_level(key, label, tables, meta)
        rel = final.relative_to(self.root).as_posix()
        self.tell.put(raypoints.Level(rel, raypoints.pack(self.root, [rel])))
        return final


def _point_on_node(ctx: RunContext, key: str, parts: dict[str, Any], cfg: Config, tag: str,
                   limit: tuple[float, str], sent: bytes, span: Any,
                   tell: Any) -> tuple[bytes, BaseException | None, dict[str, Any]]:
    """A Ray task (raypoints.run): the point measured on this node into a store of its own, started from the levels
    the driver had (sent), each level it finishes and each line it says put on the driver's queue (tell) as they
    come; span: the placement group of a server over several nodes (this task its rank 0). Returns its folders
    packed, its failure (None where it completed) and the node it ran on."""
    import pickle
    import tempfile

    from . import raypoints

    def say(m: str) -> None:
        tell.put(m)

    with tempfile.TemporaryDirectory(prefix="servescope-point-") as d:
        store = _MirroredStore(d, tell)
        raypoints.unpack(sent, store.root)
        err: BaseException | None = None
        try:
            prep = prepare(ctx.engine, ctx.model, say, adapter=ctx.adapter)
            _run_point(ctx.with_(store=store), key, parts, prep, cfg, tag, say, limit=limit, span=span)
        except Exception as e:  # said on the driver, as a local point's failure is
            err = e
            try:
                pickle.loads(pickle.dumps(e))
            except Exception:  # an exception that cannot cross to the driver crosses as its words and deaths
                err = ServerError(f"{type(e).__name__}: {e}")
                err.deaths = getattr(e, "deaths", None)  # type: ignore[attr-defined]
        back = [key, f"_partial/{key}", *(f"_failed/{p.name}" for p in (store.root / "_failed").glob(f"{key}-*"))]
        return raypoints.pack(store.root, back), err, raypoints.node_words()


def deployment_words(ctx: RunContext, configs: Sequence[Config]) -> str:
    """What a page says of the deployment: every configuration launched it, and which of its settings each changed
    ('' where the suite names none)."""
    dep = ctx.deployment
    kv = ctx.kv_level_words()
    kv = f" {kv[0].upper()}{kv[1:]}; every configuration sends that level." if kv else ""
    if dep.empty:
        return kv.strip()
    changes = [f"{c.name}: {', '.join(f'{k}={getattr(c.knobs, k)}' for k in dep.changed(c.knobs)) or 'none'}"
               for c in configs]
    return (f"Every configuration launches the suite's deployment ({dep.words()}), with only its own knobs over it "
            f"(a knob it sets replaces the deployment's): " + "; ".join(changes) + "." + kv)


def _held(loop: _Loop, configs: Sequence[Config]) -> str:
    """Offline, where the store ran out: how many repetitions it holds of each configuration."""
    n = {c.name: sum(1 for name, _ in loop.acc.stored if name == c.name) for c in configs}
    counts = sorted(set(n.values()), reverse=True)
    if len(counts) == 1:
        held = f"{counts[0]} repetition{'s' if counts[0] != 1 else ''}"
    else:
        held = "; ".join(f"{k} repetition{'s' if k != 1 else ''} of {' and '.join(c for c in n if n[c] == k)}"
                         for k in counts)
    return f"the store holds {held} (offline: nothing more is measured)"


def _rep_note(ctx: RunContext, configs: Sequence[Config]) -> dict[str, Any]:
    """What the note of a study's repetitions is kept under: its configurations' first points and its plan."""
    plan = ctx.plan
    return {"points": [point_parts(ctx, c.knobs, 0) for c in configs],
            "plan": [plan.min_reps, plan.max_reps, plan.budget_s]}


def _late_offline(loop: _Loop, configs: Sequence[Config], reps: int) -> dict[str, Any] | None:
    """Offline, the points the measuring run's budget left unlaunched (its note names them) and the store still lacks
    count as asked and not measured, as they did in that run: a thread cut short by a budget stays partial in every
    render of its store, and the threads after it know. Returns the note read (None where there is none)."""
    ctx = loop.ctx
    said = ctx.store.note("repetitions", _rep_note(ctx, configs))
    if not said or said.get("reps") != reps:
        return said
    by_name = {c.name: c for c in configs}
    for name, rep in said.get("late") or []:
        cfg = by_name.get(name)
        if cfg is None:
            continue
        key = ctx.store.key(point_parts(ctx, cfg.knobs, rep))
        if not ctx.store.has(key):
            # a first repetition missing offline was counted already ("not in the store"): the budget is its why
            seen = [r for r in loop.acc.errors if (r["config"], r["rep"]) == (name, rep)]
            loop.acc.errors[:] = [r for r in loop.acc.errors if r not in seen]
            loop.planned += 0 if seen else 1
            loop.acc.errors.append(error_row(name, rep, key, NotLaunchedError(
                f"{loop.tag(rep, cfg)}: not launched: the measuring run's budget ended first; a later run launches it")))
    return said


def _keep_stopped(ctx: RunContext, configs: Sequence[Config], reps: int, stopped: str,
                  late: Sequence[tuple[str, int]] = (), said: dict[str, Any] | None = None) -> str:
    """The measuring run's reason (said: its note, as _late_offline read it) stands in offline renders of the same
    store (a budget is not seen from the data); online, the note keeps it with the points the budget left
    unlaunched."""
    if ctx.offline:
        return said["stopped"] if said and said.get("reps") == reps else stopped
    ctx.store.put_note("repetitions", _rep_note(ctx, configs),
                       {"stopped": stopped, "reps": reps, "late": [list(x) for x in late]})
    return stopped


def launch_identity(prep: Prepared, cfg: Config, parts: dict[str, Any], adapter: EngineAdapter | None = None
                    ) -> dict[str, Any]:
    """What makes two points the same measurement: the command and environment the adapter builds for the
    configuration (port and paths left out), how many servers, how requests are routed and how the servers share a
    GPU, and everything else of the point's key but the knobs (engine, model, load, repetition, profile). A profile
    whose armed profiler the adapter shows to be inert until started is left out: its window comes after the load."""
    prof = (parts.get("profile") or {}).get("kind")
    if prof and adapter is not None and adapter.idle_profiler_inert(prep.install, prof):
        parts = {k: v for k, v in parts.items() if k != "profile"}
    plan = launch_plan(prep, cfg.knobs, 1)
    cmd = ["{port}" if a == "1" and i and plan.command[i - 1] == "--port" else a for i, a in enumerate(plan.command)]
    cmd = [a.replace(prep.model_path, "{model}") for a in cmd]
    out = {**{k: v for k, v in parts.items() if k != "knobs"}, "command": cmd, "env": dict(sorted(plan.env.items())),
           "replicas": cfg.knobs.replicas, "route": cfg.knobs.route or "round_robin"}
    if cfg.knobs.gpu_share:  # the same commands on one GPU, time-sliced or through MPS, are different launches
        out |= {"gpu_share": cfg.knobs.gpu_share, "mps_active_thread_pct": cfg.knobs.mps_active_thread_pct}
    return out


def _shared_point(ctx: RunContext, key: str, parts: dict[str, Any], prep: Prepared, cfg: Config) -> str | None:
    """A stored point that is the same launch as this one (another thread asked for it with other knobs): recorded as
    an alias of this key so that both read one measurement, and returned; None when there is none."""
    if not ctx.adapter.launches:
        return None  # an external server is not launched
    store = ctx.store
    try:
        ident = store.key(launch_identity(prep, cfg, parts, ctx.adapter))
    except (ServescopeError, OSError, ValueError):
        return None
    other = store.launch_point(ident)
    if other is None:
        store.index_launch(ident, key)  # this key will be the measurement of that launch
    # a profiled launch carries its own profile and output paths: it is launched, never read from another point;
    # where its armed profiler is inert, the points of the same launch without one read it (the index above)
    if other is None or other == key or ctx.profile.kind != "none":
        return None
    store.put_alias(key, other)
    return other


ERROR_COLUMNS = ("config", "rep", "key", "error_type", "summary", "signal", "death", "exception", "frame", "teardown",
                 "stage", "before_ready", "recorded", "error", "traceback")


def error_row(config: str, rep: int, key: str, e: BaseException) -> dict[str, Any]:
    """One failed point: its first line, the signal a server process died from (if any) with its evidence, the
    engine's own exception and its frame, who tore the tree down, whether it died before it was ready, the end of the
    error (where servers put their log tail) and the traceback."""
    text = str(e)
    deaths = getattr(e, "deaths", None) or []
    cause = getattr(e, "cause", None)
    exc = cause.exception if cause is not None else None
    first_line = text.splitlines()[0] if text else ""
    return {"config": config, "rep": rep, "key": key, "error_type": type(e).__name__,
            "summary": f"{type(e).__name__}: {first_line}"[:600], "signal": deaths[0].signal if deaths else "",
            "death": (cause.text() if cause is not None and cause.headline() else "")
            or (deaths[0].text() if deaths else ""),
            "exception": exc.said()[:400] if exc is not None else "",
            "frame": exc.where() if exc is not None else "",
            "teardown": cause.teardown if cause is not None else "",
            "stage": cause.stage if cause is not None else "",
            "before_ready": isinstance(e, (ServerExitedError, ServerStartTimeout)) or bool(getattr(e, "before_ready", 0)),
            "recorded": getattr(e, "recorded", ""), "error": text[-3000:],
            "traceback": traceback.format_exc()[-4000:]}


def recorded_failure(folder: Path, manifest: dict[str, Any]) -> RecordedFailure:
    """The failure an earlier attempt recorded, raised again instead of launching the same configuration to die the
    same way."""
    from .deaths import DeathCause, recorded_error_line

    cause = DeathCause.from_dict(manifest.get("cause") or {})
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(manifest.get("ended_unix") or 0))
    first = recorded_error_line(manifest)
    return RecordedFailure(f"{first or cause.headline()} [recorded {when} in _failed/{folder.name}; not launched "
                           "again: a forced run retries it]", cause, f"_failed/{folder.name} ({when})")


def server_gpus(engine_env: dict[str, str]) -> list[int] | None:
    """The NVML indices of the GPUs the server sees (its own CUDA_VISIBLE_DEVICES, from engine.env), or None where it
    sets none (then this process's, else all) or NVML cannot resolve them."""
    cvd = engine_env.get("CUDA_VISIBLE_DEVICES")
    if cvd is None:
        return None
    from .telemetry.nvml import Nvml, NvmlUnavailable

    try:
        n = Nvml(cuda_visible_devices=cvd)
    except NvmlUnavailable:
        return None
    try:
        return list(n.indices)
    finally:
        n.close()


def _telemetry_for(spec: TelemetrySpec, target: Any, adapter: EngineAdapter,
                   engine_env: dict[str, str] | None = None) -> Telemetry | None:
    if not spec.enabled:
        return None
    # the GPUs the server was given (engine.env), not this process's: a server pinned to GPU 3 is read on GPU 3
    indices = list(spec.gpu_indices) if spec.gpu_indices else server_gpus(engine_env or {}) if spec.gpu else None
    return Telemetry(gpu=spec.gpu, gpu_indices=indices,
                     gpu_hz=spec.gpu_hz, host_hz=spec.host_hz,
                     server_pid=target.pids if len(target.pids) > 1 else target.pid,
                     metrics_url=target.metrics_url if spec.server_metrics else None, metrics_hz=spec.metrics_hz,
                     dcgm_url=spec.dcgm_url, metric_prefixes=adapter.metric_prefixes)


def _point_load(ctx: RunContext, prep: Prepared, say: Callable[[str], None]) -> tuple[LoadSpec, Any]:
    """The load as this engine and model can run it (adapter.effective_load), and the tokenizer that counts it."""
    local = prep.model_path.startswith("/")
    tokenizer = load_tokenizer(prep.model_path) if local else None
    stops = model_info(prep.model_path).get("spec", {}).get("stops_at_eos", True) if local else True
    return ctx.adapter.effective_load(ctx.load, say, model_stops=stops), tokenizer


def _run_point(ctx: RunContext, key: str, parts: dict[str, Any], prep: Prepared, cfg: Config, tag: str,
               say: Callable[[str], None], limit: tuple[float, str] | None = None, span: Any = None) -> None:
    """Launch one configuration, sweep its load level by level (each written as it finishes), then write the
    point's tables and read its profile; the point appears in the store only when all of it is written. limit: the
    startup timeout and why, where the store that times it is not this one (a Ray node's); span: the nodes of a
    server over several (span.Span)."""
    store, adapter = ctx.store, ctx.adapter
    load, tokenizer = _point_load(ctx, prep, say)
    limit_s, why = limit or startup_timeout(ctx)
    prep = dataclasses.replace(prep, engine=prep.engine.model_copy(update={"startup_timeout_s": limit_s}))
    done = store.finished_levels(key)
    if done:
        say(f"{tag}: resuming: levels {', '.join(done)} were written by an earlier attempt")
    with store.writing(key, parts) as w:
        armed, knobs = None, cfg.knobs
        if ctx.profile.kind != "none":
            armed = profiling.arm(ctx.profile, adapter, prep.install, w.dir / "profile")
            knobs = knobs.model_copy(update={"extra_args": (*knobs.extra_args, *armed.flags)})
        say(f"{tag}: launching {prep.engine.name} {prep.install.version} ({cfg.knobs.label()})"
            + (f", {ctx.profile.kind} profile armed" if armed else "") + f"; ready within {limit_s:.0f} s ({why})")
        t0 = time.monotonic()
        with serve(prep, knobs, w.dir, prefix=armed.prefix if armed else None, extra_env=armed.env if armed else None,
                   term_grace_s=armed.term_grace_s if armed else 15.0, span=span) as target:
            _say_ready(tag, say, target, load, cfg, time.monotonic() - t0)
            w.manifest["target"] = target.describe()
            # the engine-neutral record, for people reading the store (studies re-read the evidence through Point)
            w.manifest["resolved"] = adapter.resolved_state(target.resolved_config, read_logs(w.dir)).to_dict()
            window, summ = _sweep(ctx, key, w, target, cfg, load, tokenizer, done, armed, tag, say, prep.model_path)
        if armed is not None and window is not None:  # nsys writes its report once the server has exited
            kernels, runtime, info = profiling.read(armed, window)
            w.put_table("kernels", kernels)
            w.put_table("kernel_runtime", runtime)
            w.manifest["profile"] = info
            say(f"{tag}: profile: {info['kernels']} kernels in a {info['window_s']:.1f} s window at "
                f"c={info['concurrency']}")
        _say_done(tag, say, summ)


# a launch with no earlier one of its engine and model in the store to go by may take this long to its first token
FIRST_STARTUP_S = 1800.0
# later launches: this multiple of the slowest ready time stored for the engine and model, and at least STARTUP_FLOOR_S
STARTUP_FACTOR, STARTUP_FLOOR_S = 4.0, 300.0


def startup_timeout(ctx: RunContext) -> tuple[float, str]:
    """How long a launch may take to be ready, and why: engine.startup_timeout_s where the suite gives it, else
    STARTUP_FACTOR x the slowest ready time of this engine and model in the store (at least STARTUP_FLOOR_S), else
    FIRST_STARTUP_S for the first."""
    if ctx.engine.startup_timeout_s is not None:
        return ctx.engine.startup_timeout_s, "engine.startup_timeout_s"
    slowest = ctx.store.slowest_ready_s(ctx.engine_identity, ctx.model_key)
    if slowest is None:
        return FIRST_STARTUP_S, "the first launch of this engine and model here"
    limit = max(STARTUP_FLOOR_S, STARTUP_FACTOR * slowest)
    return limit, f"{STARTUP_FACTOR:g} x the slowest ready time stored for this engine and model ({slowest:.0f} s)"


def _say_ready(tag: str, say: Callable[[str], None], target: Any, load: LoadSpec, cfg: Config, ready_s: float) -> None:
    points = ", ".join(p.label for p in load.points())
    say(f"{tag}: ready in {ready_s:.0f} s; load {points}"
        + (f"; {len(target.replicas)} replicas ({'; '.join(r.placement for r in target.replicas)}), "
           f"route {cfg.knobs.route or 'round_robin'}" if target.replicas else ""))


def _sweep(ctx: RunContext, key: str, w: Any, target: Any, cfg: Config, load: LoadSpec, tokenizer: Any,
           done: dict[str, Path], armed: Any, tag: str, say: Callable[[str], None],
           model_path: str = "") -> tuple[dict[str, Any] | None, pd.DataFrame]:
    """The measured load on a ready server with telemetry around it, then the profiled window where one is armed;
    the point's tables are written from every finished level. Returns the profiled window (or None) and the
    summary."""
    window = None
    tel = _telemetry_for(ctx.telemetry, target, ctx.adapter, ctx.engine.env)
    if tel is not None and target.followers:  # a server over nodes: every node's telemetry, one phase for all
        from .span import SpanTelemetry

        tel = SpanTelemetry(tel, target.followers, ctx.telemetry)
    if tel is not None:
        tel.start()
    on_level = _level_writer(ctx.store, key, tel, target, w, tag, say)
    try:
        try:
            run_sweep(target.base_urls, target.model, load, tokenizer, target.api_key, ctx.progress, f"{cfg.name} ",
                      on_phase=tel.set_phase if tel else None, skip=set(done), on_level=on_level,
                      route=cfg.knobs.route or "round_robin")
        except HungError as e:  # the server is alive but silent: what it was doing, where it can be read
            raise HungError(f"{e}\n{hang_evidence(target)}") from None
        # after the measured load (its figures stay the load's): does this configuration answer as the others do?
        _check_outputs(ctx, w, target, tokenizer, model_path, say, tag)
        if armed is not None:  # after the measured load, on the same server: the figures stay unprofiled
            window = profiling.take(armed, ctx.adapter, target, load, tokenizer,
                                    tel.set_phase if tel else (lambda _: None))
    finally:
        if tel is not None:
            tel.stop()
            w.manifest["telemetry"] = tel.status
    return window, _write_point_tables(ctx.store, key, w, tel, load, done)


# a CPU build answers the check set's long prompts slowly on a few cores: its set stops below this many tokens
CPU_CHECK_MAX_TOKENS = 600


def _check_outputs(ctx: RunContext, w: Any, target: Any, tokenizer: Any, model_path: str, say: Callable[[str], None],
                   tag: str) -> None:
    """The check set answered on the running server (outputs.take), stored as the point's output_check table; where
    the engine gives no log-probabilities, the reason is kept in the manifest and the point is 'not verified'."""
    install = target.install
    limit = model_config(model_path).get("max_position_embeddings") if model_path else None
    if install.platform == "cpu":
        limit = min(int(limit or CPU_CHECK_MAX_TOKENS), CPU_CHECK_MAX_TOKENS)
    t0 = time.monotonic()
    try:
        prompts = outputs.check_prompts(tokenizer, int(limit) if limit else None)
        table = outputs.take(ctx.adapter, target.base_urls[0], target.model, prompts, target.api_key)
    except (outputs.CheckUnavailable, OSError, ValueError, KeyError, TypeError) as e:
        w.manifest["output_check"] = {"status": "unavailable", "reason": f"{type(e).__name__}: {e}"[:500]}
        say(f"{tag}: outputs not checked: {e}")
        return
    w.put_table("output_check", table)
    w.manifest["output_check"] = {"status": "taken", "prompts": len(prompts), "seconds": time.monotonic() - t0,
                                  "prompt_tokens": [p.input_tokens for p in prompts]}
    say(f"{tag}: outputs checked: {len(prompts)} prompts of {', '.join(str(p.input_tokens) for p in prompts)} "
        f"tokens, alone and batched, in {time.monotonic() - t0:.0f} s")


def _write_point_tables(store: Store, key: str, w: Any, tel: Telemetry | None, load: LoadSpec,
                        done: dict[str, Path]) -> pd.DataFrame:
    """The point's tables: the levels this attempt and earlier ones finished, in the load's order, and the telemetry
    that fell outside them (idle, the profiled window). Returns the summary."""
    levels = store.level_tables(key)
    w.manifest["levels"] = {"resumed": list(done), "measured_now": [p.label for p in load.points()
                                                                    if p.label not in done]}
    tele = {n: list(f) for n, f in levels.items() if n.startswith("telemetry_")}
    if tel is not None:
        for name, frame in tel.frames().items():
            rest = frame[~frame["phase"].isin(_level_phases(load))] if "phase" in frame else frame
            if not rest.empty:
                tele.setdefault(f"telemetry_{name}", []).append(rest)
    for name, frames in tele.items():
        w.put_table(name, pd.concat(frames, ignore_index=True))
    cat = lambda n: pd.concat(levels[n], ignore_index=True) if levels.get(n) else pd.DataFrame()  # noqa: E731
    result = LoadResult(cat("requests"), cat("health"))
    w.put_table("requests", result.requests)
    w.put_table("health", result.health)
    summ = result.summary(load.slo_ms)
    w.put_table("summary", summ)
    return summ


def _say_done(tag: str, say: Callable[[str], None], summ: pd.DataFrame) -> None:
    say(f"{tag}: done; output tok/s: " + ", ".join(f"{r.point}: {r.output_tok_s:.0f}" for r in summ.itertuples()))
    bad = int(summ["failed"].sum()) if len(summ) else 0
    if bad:
        say(f"{tag}: {bad} requests failed (kept in the records)")
    for r in summ.itertuples():
        filled = getattr(r, "filled", True)
        if not pd.isna(filled) and not bool(filled):
            say(f"{tag}: WARNING at {r.point}: the level did not fill: {r.fill_pct:.0f}% of its concurrency in flight "
                "over its steady window, so it measured a lower concurrency than its label")
        if getattr(r, "client_limited", False):
            say(f"{tag}: WARNING at {r.point}: the load client limited this measurement: {r.client_warning}")
        elif getattr(r, "client_starved", False):
            say(f"{tag}: note at {r.point}: {r.client_warning}")


def hang_evidence(target: Any, lines: int = 20) -> str:
    """For a hung server: the last lines of its logs and, where py-spy is installed, a stack dump of every Python
    process of its tree (else why there is none)."""
    out = []
    for name, tail in log_tails(Path(target.log_dir or "."), lines):
        if tail:
            out.append(f"last lines of {name}:\n" + "\n".join(tail))
    spy = shutil.which("py-spy")
    if not spy:
        out.append("no stack dump: py-spy is not installed (pip install py-spy)")
    elif target.pid:
        try:
            procs = [psutil.Process(target.pid), *psutil.Process(target.pid).children(recursive=True)]
        except psutil.Error:
            procs = []
        for pr in procs:
            with contextlib.suppress(psutil.Error, OSError, subprocess.SubprocessError):
                if "python" not in pr.name().lower():
                    continue
                r = subprocess.run([spy, "dump", "--pid", str(pr.pid)], capture_output=True, text=True, timeout=20)
                out.append(f"py-spy dump of {pr.pid} ({pr.name()}):\n" + (r.stdout or r.stderr).strip()[-4000:])
    return "\n".join(out)


def _check_all(prep: Prepared, configs: Sequence[Config], deployment_args: tuple[str, ...] = (),
               runner: RunnerSpec | None = None) -> None:
    """Refuse, before anything launches, a configuration this engine version, this machine or the runner cannot
    run."""
    adapter = prep.adapter
    if not adapter.launches:
        return
    for cfg in configs:
        if cfg.knobs.nodes > 1 and (runner is None or runner.kind != "ray"):
            raise SpecError(f"configuration {cfg.name!r} spans {cfg.knobs.nodes} nodes: that needs the Ray runner "
                            "(runner: {kind: ray, address: ...}), whose cluster has the nodes (nothing was launched)")
    check_deployment_args(adapter, prep.install, deployment_args)
    dest = flag_dests(adapter, prep.install)

    def name(flag: str) -> str:  # aliases share a destination
        return dest.get(flag.split("=", 1)[0], flag.split("=", 1)[0])

    for cfg in configs:
        if cfg.knobs.replicas > 1 and prep.engine.port:
            raise SpecError(f"configuration {cfg.name!r}: engine.port pins one port, but it asks for "
                            f"{cfg.knobs.replicas} replicas: leave engine.port unset (nothing was launched)")
        try:
            flags = adapter.check_knobs(cfg.knobs, prep.install, prep.engine.env, prep.model_path)
        except KnobError as e:
            raise KnobError(f"configuration {cfg.name!r}: {e} (nothing was launched)") from None
        own = flags[:len(flags) - len(cfg.knobs.extra_args)] if cfg.knobs.extra_args else flags
        both = sorted({f.split("=", 1)[0] for f in prep.engine.args if f.startswith("--")
                       and name(f) in {name(g) for g in own if g.startswith("--")}})
        if both:
            raise SpecError(f"configuration {cfg.name!r} sets {', '.join(both)} through its knobs, and engine.args "
                            "sets it too: leave it to the knobs (nothing was launched)")


def _level_phases(load: LoadSpec) -> set[str]:
    return {x for p in load.points() for x in (p.label, f"warmup:{p.label}")}


def _level_writer(store: Store, key: str, tel: Telemetry | None, target: Any, w: Any, tag: str,
                  say: Callable[[str], None]) -> Callable[[str, pd.DataFrame, dict[str, Any]], None]:
    """What happens as each level finishes: the server must still be whole, the level must have measured (failed
    requests within the limit), and then it is written at once with its telemetry, so a fault loses at most the
    level in flight and a rerun resumes after it."""
    def on_level(label: str, records: pd.DataFrame, health: dict[str, Any]) -> None:
        if target.check_alive is not None:
            target.check_alive()  # a dead server's level measured something else: the point fails, named
        why = level_failure(records)
        if why:
            w.put_table(f"failed_level_{label.replace('=', '')}_requests", records)  # evidence, with the attempt
            raise LevelFailedError(f"level {label}: {why}")
        tables = {"requests": records, "health": pd.DataFrame([health])}
        if tel is not None:
            phases = {label, f"warmup:{label}"}
            for name, frame in tel.frames().items():
                if "phase" in frame:
                    tables[f"telemetry_{name}"] = frame[frame["phase"].isin(phases)]
        store.put_level(key, label, tables, {"target": target.describe()})
        say(f"{tag}: level {label} written")
    return on_level


def python_version() -> str:
    """This interpreter's version, for manifests."""
    return sys.version.split()[0]


__all__ = ["Config", "Results", "RepetitionPlan", "RunContext", "measure", "run_configs", "point_parts",
           "launch_identity", "Path"]
