"""Measure configurations of one engine under one load, with alternating repetitions, through the store."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import psutil

from .engines import get_engine
from .errors import HungError, KnobError, LevelFailedError, NotMeasuredError, ServescopeError, SpecError
from .findings import Finding, Outcome
from .launch import Prepared, prepare, serve
from .load import load_tokenizer, run_sweep
from .load.health import level_failure
from .load.metrics import rejudge
from .load.runner import LoadResult
from .models import model_info
from .profile import window as profiling
from .server import tail_lines
from .spec import EngineSpec, Knobs, LoadSpec, ModelSpec, ProfileSpec, TelemetrySpec
from .store import Store
from .telemetry import Telemetry

TELEMETRY_TABLES = ("gpu", "gpu_static", "host_cpu", "server_procs", "server_threads", "server_metrics", "dcgm")


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
    resolved: dict[str, dict[str, Any]] = field(default_factory=dict)
    telemetry: dict[str, pd.DataFrame] = field(default_factory=dict)  # table name -> rows of every point
    telemetry_status: pd.DataFrame = field(default_factory=pd.DataFrame)
    planned: int = 0  # points asked for: configurations x repetitions
    kernels: pd.DataFrame = field(default_factory=pd.DataFrame)  # kernel tables of profiled points (config, rep)
    profiles: pd.DataFrame = field(default_factory=pd.DataFrame)  # one row per profiled window: level, seconds, ...
    runtime: pd.DataFrame = field(default_factory=pd.DataFrame)  # launch/runtime API calls of profiled points
    stopped: str = ""  # why the repetitions ended (resolved after n, a budget, the store's extent offline)

    def outcome(self, thread: str, findings: list[Finding]) -> Outcome:
        """Points planned, measured and failed, the first error (and signal), and how many findings answer."""
        first = self.errors.iloc[0] if len(self.errors) else None
        return Outcome(thread=thread, points_planned=self.planned, points_measured=len(self.points),
                       points_failed=len(self.errors),
                       first_error="" if first is None else f"{first['config']} rep {first['rep']}: {first['summary']}",
                       first_signal="" if first is None else str(first.get("signal") or ""),
                       findings_total=len(findings), findings_answering=sum(f.answers for f in findings))

    def select(self, configs: Sequence[str]) -> Results:
        """The same tables holding only these configurations (planned counts the points kept)."""
        keep = set(configs)
        pick = lambda df: df[df["config"].isin(keep)].reset_index(drop=True) if "config" in df else df  # noqa: E731
        return Results(summary=pick(self.summary), requests=pick(self.requests), startup=pick(self.startup),
                       points=pick(self.points), errors=pick(self.errors),
                       resolved={k: v for k, v in self.resolved.items() if k in keep},
                       telemetry={k: pick(v) for k, v in self.telemetry.items()},
                       telemetry_status=pick(self.telemetry_status), planned=int(self.points["config"].isin(
                           keep).sum()) if len(self.points) else 0, kernels=pick(self.kernels),
                       profiles=pick(self.profiles), runtime=pick(self.runtime), stopped=self.stopped)

    def client_health(self) -> pd.DataFrame:
        """Per configuration, repetition and point: how busy the load client was, whether it limited the
        measurement, or was starved by an oversubscribed host (NaN for points stored before this was measured)."""
        cols = ["config", "rep", "point", "client_cpu_pct", "loop_lag_ms_p99", "loop_lag_ms_max", "achieved_rate",
                "requested_rate", "client_limited", "client_starved", "client_warning"]
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
        return [f"{r.config} rep {r.rep} {r.point}: {r.client_warning}" for r in bad.itertuples()]


class _Tables:
    """The tables of stored points, gathered point by point and turned into Results."""

    def __init__(self) -> None:
        self.summaries: list[pd.DataFrame] = []
        self.requests: list[pd.DataFrame] = []
        self.startups: list[dict[str, Any]] = []
        self.points: list[dict[str, Any]] = []
        self.errors: list[dict[str, Any]] = []
        self.kernels: list[pd.DataFrame] = []
        self.windows: list[dict[str, Any]] = []
        self.runtimes: list[pd.DataFrame] = []
        self.tele: dict[str, list[pd.DataFrame]] = {name: [] for name in TELEMETRY_TABLES}
        self.tele_status: list[dict[str, Any]] = []
        self.resolved: dict[str, dict[str, Any]] = {}

    def add(self, pt: Any, key: str, ids: dict[str, Any]) -> None:
        """Every table of one stored point, tagged with ids (config, rep)."""
        self.summaries.append(rejudge(pt.table("summary")).assign(**ids))
        self.requests.append(pt.table("requests").assign(**ids))
        m = pt.manifest
        self.startups.append({**ids, **(m.get("target", {}).get("startup") or {})})
        self.points.append({**ids, "key": key, "path": str(pt.path),
                            "flags": " ".join(m.get("target", {}).get("flags", [])),
                            "command": m.get("target", {}).get("command", ""),
                            "started_unix": m.get("started_unix"), "ended_unix": m.get("ended_unix")})
        if m.get("resolved") and ids["config"] not in self.resolved:
            self.resolved[ids["config"]] = m["resolved"]
        k = pt.table("kernels")
        if not k.empty:
            self.kernels.append(k.assign(**ids))
            rt = pt.table("kernel_runtime")
            if not rt.empty:
                self.runtimes.append(rt.assign(**ids))
            self.windows.append({**ids, **(m.get("profile") or {})})
        for name in TELEMETRY_TABLES:
            t = pt.table(f"telemetry_{name}")
            if not t.empty:
                self.tele[name].append(t.assign(**ids))
        if "telemetry" in m:
            self.tele_status.append({**ids, **{k: v if not isinstance(v, dict) else str(v)
                                               for k, v in m["telemetry"].items()}})

    def results(self, planned: int) -> Results:
        """The gathered tables as Results."""
        cat = lambda xs: pd.concat(xs, ignore_index=True) if xs else pd.DataFrame()  # noqa: E731
        return Results(summary=cat(self.summaries), requests=cat(self.requests), startup=pd.DataFrame(self.startups),
                       points=pd.DataFrame(self.points),
                       errors=pd.DataFrame(self.errors, columns=list(ERROR_COLUMNS)), resolved=self.resolved,
                       telemetry={k: cat(v) for k, v in self.tele.items()},
                       telemetry_status=pd.DataFrame(self.tele_status), planned=planned, kernels=cat(self.kernels),
                       profiles=pd.DataFrame(self.windows), runtime=cat(self.runtimes))


def point_label(parts: dict[str, Any]) -> str:
    """A readable name for a stored point's configuration: its knobs (or 'engine defaults'), and its profile."""
    knobs = parts.get("knobs") or {}
    label = ", ".join(f"{k}={v}" for k, v in sorted(knobs.items())) or "engine defaults"
    prof = (parts.get("profile") or {}).get("kind")
    return f"{label} (+{prof} profile)" if prof else label


def read_store(store: Store, engine: str | None = None, model: dict[str, Any] | None = None) -> Results:
    """Every complete point in a store (optionally only one engine identity and model) as Results, each named by
    its knobs: what other threads measured, read without launching anything."""
    acc = _Tables()
    for key in store.keys():
        pt = store.get(key)
        parts = pt.manifest.get("parts") or {}
        if engine is not None and parts.get("engine") != engine:
            continue
        if model is not None and parts.get("model") != model:
            continue
        acc.add(pt, key, {"config": point_label(parts), "rep": int(parts.get("rep", 0))})
    return acc.results(planned=len(acc.points))


def _say(msg: str) -> None:
    print(time.strftime("%H:%M:%S"), msg, flush=True)


def engine_identity(engine: EngineSpec) -> str:
    """What the store key says about the engine, computable without installing anything."""
    if engine.url:
        return f"external:{engine.url}"
    if engine.python:
        return f"{engine.name}:{engine.python}:{engine.version or ''}"
    env = get_engine(engine.name).managed_env(engine.version)
    return f"{engine.name}:managed:{env.key if env else ''}"


def point_parts(engine: EngineSpec, model: ModelSpec, knobs: Knobs, load: LoadSpec, rep: int,
                profile: ProfileSpec | None = None) -> dict[str, Any]:
    """Key material of one point: engine identity, model, knobs, load, repetition index, and the profile when one is
    taken (a launch with its profiler armed is another launch).

    Fields left at their defaults are left out, so adding a field keeps old keys valid; changing a default
    would silently change what old points mean, which tests/test_experiment.py guards against."""
    parts = {"engine": engine_identity(engine), "engine_env": dict(sorted(engine.env.items())),
             "model": model.model_dump(mode="json", exclude_none=True),  # a tiny model in full: it is the model
             "knobs": knobs.model_dump(mode="json", exclude_defaults=True),
             "load": load.model_dump(mode="json", exclude_defaults=True), "rep": rep}
    if profile is not None and profile.kind != "none":
        parts["profile"] = profile.model_dump(mode="json", exclude_defaults=True)
    return parts


@dataclass(frozen=True)
class RepetitionPlan:
    """How many repetitions: at least min_reps; more, one at a time, while the study's `until` callback names
    configurations whose headline effect is not resolved, up to max_reps and while the next repetition fits in
    budget_s of wall time (0: no time limit)."""

    min_reps: int = 3
    max_reps: int = 3
    budget_s: float = 0.0

    def __post_init__(self) -> None:
        if self.min_reps < 1:
            raise ServescopeError("repetitions must be at least 1")
        if self.max_reps < self.min_reps:
            raise ServescopeError(f"max_repetitions ({self.max_reps}) is below repetitions ({self.min_reps})")
        if self.budget_s < 0:
            raise ServescopeError("budget_s must be 0 (no limit) or more")


# until(results so far) -> the configurations that need another repetition (empty: every headline is resolved)
Until = Callable[[Results], set[str]]


def measure(
    engine: EngineSpec, model: ModelSpec, configs: Sequence[Config], load: LoadSpec, repetitions: int = 3,
    store: Store | None = None, offline: bool = False, force: bool = False, progress: bool = False,
    say: Callable[[str], None] = _say, telemetry: TelemetrySpec | None = None, profile: ProfileSpec | None = None,
    plan: RepetitionPlan | None = None, until: Until | None = None,
) -> Results:
    """Each repetition launches every configuration once, alternating their order (ABBA...) so drift cancels; past
    the plan's minimum, a repetition runs only the configurations `until` names, and the loop ends when it names
    none, at the plan's maximum, or when the next repetition would not fit the time budget (Results.stopped says
    which). Completed points come from the store; a failing point is recorded and the rest go on."""
    plan = plan or RepetitionPlan(repetitions, repetitions)
    if len({c.name for c in configs}) != len(configs):
        raise ServescopeError("configuration names must be unique")
    store = store or Store()
    prep: Prepared | None = None
    telemetry = telemetry or TelemetrySpec()
    acc = _Tables()
    t0, planned, rep_s = time.monotonic(), 0, 0.0
    active, stopped = list(configs), ""
    rep = 0
    while rep < plan.max_reps:
        if rep >= plan.min_reps:
            need = until(acc.results(planned)) if until is not None else set()
            active = [c for c in configs if c.name in need]
            if not active:
                stopped = f"resolved after {rep} repetitions"
                break
            if plan.budget_s and time.monotonic() - t0 + rep_s > plan.budget_s:
                stopped = (f"time budget spent: {time.monotonic() - t0:.0f} s of budget_s={plan.budget_s:.0f}, and "
                           f"a repetition takes about {rep_s:.0f} s")
                break
        order = active if rep % 2 == 0 else list(reversed(active))
        t_rep, launched, missing = time.monotonic(), False, False
        for cfg in order:
            parts = point_parts(engine, model, cfg.knobs, load, rep, profile)
            key = store.key(parts)
            tag = f"rep {rep + 1} {cfg.name}" + (f" (of at least {plan.min_reps})" if plan.max_reps > plan.min_reps
                                                 else f"/{plan.max_reps}")
            try:
                if store.has(key) and not force:
                    say(f"{tag}: from store ({key})")
                elif rep >= 1 and offline:  # a repetition the measuring run did not take (or an older, shorter run)
                    missing = True
                    continue
                else:
                    if offline:
                        raise NotMeasuredError(f"{tag}: not in the store ({key}) and offline=True")
                    if prep is None:
                        prep = prepare(engine, model, say)
                        _check_all(prep, configs)  # before the first launch, every configuration at once
                    shared = None if force else _shared_point(store, key, parts, prep, cfg, profile)
                    if shared is not None:
                        say(f"{tag}: the same launch as stored point {shared} (one configuration, measured once)")
                    else:
                        if force:
                            store.drop_partial(key)
                        launched = True
                        _run_point(store, key, parts, prep, cfg, load, progress, tag, say, telemetry, profile)
                pt = store.get(key)
            except SpecError:  # bad input (model path, a knob this version or machine cannot run): stop, launch nothing
                raise
            except Exception as e:  # a failed point must not lose the others
                planned += 1
                acc.errors.append(error_row(cfg.name, rep, key, e))
                say(f"{tag}: FAILED: {acc.errors[-1]['summary']}")
                if acc.errors[-1]["death"]:
                    say("  " + acc.errors[-1]["death"].replace("\n", "\n  "))
                continue
            planned += 1
            acc.add(pt, key, {"config": cfg.name, "rep": rep})
        if missing:
            stopped = f"the store holds {rep} repetition{'s' if rep > 1 else ''} (offline: nothing more is measured)"
            break
        if launched:
            rep_s = time.monotonic() - t_rep
        rep += 1
    else:
        stopped = f"max_repetitions={plan.max_reps} reached" if plan.max_reps > plan.min_reps else \
            f"{plan.max_reps} repetitions, as asked"
    res = acc.results(planned)
    # the measuring run's reason stands in offline renders of the same store (a budget is not seen from the data)
    note = {"points": [point_parts(engine, model, c.knobs, load, 0, profile) for c in configs],
            "plan": [plan.min_reps, plan.max_reps, plan.budget_s]}
    if offline:
        said = store.note("repetitions", note)
        res.stopped = said["stopped"] if said and said.get("reps") == rep else stopped
    else:
        store.put_note("repetitions", note, {"stopped": stopped, "reps": rep})
        res.stopped = stopped
    return res


def launch_identity(prep: Prepared, cfg: Config, parts: dict[str, Any]) -> dict[str, Any]:
    """What makes two points the same measurement: the command and environment the adapter builds for the
    configuration (port and paths left out), how many servers and how requests are routed, and everything else of
    the point's key but the knobs (engine, model, load, repetition, profile)."""
    adapter = get_engine(prep.engine.name)
    plan = adapter.plan(install=prep.install, model_path=prep.model_path, served_name=prep.served_name,
                        host=prep.engine.host, port=1, knobs=cfg.knobs, extra_env=dict(prep.engine.env))
    cmd = ["{port}" if a == "1" and i and plan.command[i - 1] == "--port" else a for i, a in enumerate(plan.command)]
    cmd = [a.replace(prep.model_path, "{model}") for a in cmd]
    return {**{k: v for k, v in parts.items() if k != "knobs"}, "command": cmd, "env": dict(sorted(plan.env.items())),
            "replicas": cfg.knobs.replicas, "route": cfg.knobs.route or "round_robin"}


def _shared_point(store: Store, key: str, parts: dict[str, Any], prep: Prepared, cfg: Config,
                  profile: ProfileSpec | None) -> str | None:
    """A stored point that is the same launch as this one (another thread asked for it with other knobs): recorded as
    an alias of this key so that both read one measurement, and returned; None when there is none."""
    if not get_engine(prep.engine.name).launches or (profile is not None and profile.kind != "none"):
        return None  # an external server is not launched; a profiled launch carries its own output paths
    try:
        ident = store.key(launch_identity(prep, cfg, parts))
    except (ServescopeError, OSError, ValueError):
        return None
    other = store.launch_point(ident)
    if other is None or other == key:
        store.index_launch(ident, key)  # this key will be the measurement of that launch
        return None
    store.put_alias(key, other)
    return other

ERROR_COLUMNS = ("config", "rep", "key", "error_type", "summary", "signal", "death", "error", "traceback")


def error_row(config: str, rep: int, key: str, e: BaseException) -> dict[str, Any]:
    """One failed point: its first line, the signal a server process died from (if any) with its evidence, the
    end of the error (where servers put their log tail) and the traceback."""
    text = str(e)
    deaths = getattr(e, "deaths", None) or []
    first_line = text.splitlines()[0] if text else ""
    return {"config": config, "rep": rep, "key": key, "error_type": type(e).__name__,
            "summary": f"{type(e).__name__}: {first_line}"[:400], "signal": deaths[0].signal if deaths else "",
            "death": deaths[0].text() if deaths else "", "error": text[-3000:],
            "traceback": traceback.format_exc()[-4000:]}


def _telemetry_for(spec: TelemetrySpec, target: Any) -> Telemetry | None:
    if not spec.enabled:
        return None
    return Telemetry(gpu=spec.gpu, gpu_indices=list(spec.gpu_indices) if spec.gpu_indices else None,
                     gpu_hz=spec.gpu_hz, host_hz=spec.host_hz,
                     server_pid=target.pids if len(target.pids) > 1 else target.pid,
                     metrics_url=target.metrics_url if spec.server_metrics else None, metrics_hz=spec.metrics_hz,
                     dcgm_url=spec.dcgm_url)


def _run_point(store: Store, key: str, parts: dict[str, Any], prep: Prepared, cfg: Config, load: LoadSpec,
               progress: bool, tag: str, say: Callable[[str], None], telemetry: TelemetrySpec,
               profile: ProfileSpec | None = None) -> None:
    tokenizer = load_tokenizer(prep.model_path) if prep.model_path.startswith("/") else None
    stops = model_info(prep.model_path).get("spec", {}).get("stops_at_eos", True) if prep.model_path.startswith("/") \
        else True
    adapter = get_engine(prep.engine.name)
    load = adapter.effective_load(load, say, model_stops=stops)
    done = store.finished_levels(key)
    if done:
        say(f"{tag}: resuming: levels {', '.join(done)} were written by an earlier attempt")
    with store.writing(key, parts) as w:
        armed, window = None, None
        knobs = cfg.knobs
        if profile is not None and profile.kind != "none":
            armed = profiling.arm(profile, adapter, prep.install, w.dir / "profile")
            knobs = knobs.model_copy(update={"extra_args": (*knobs.extra_args, *armed.flags)})
        say(f"{tag}: launching {prep.engine.name} {prep.install.version} ({cfg.knobs.label()})"
            + (f", {profile.kind} profile armed" if armed else ""))
        t0 = time.monotonic()
        with serve(prep, knobs, w.dir, prefix=armed.prefix if armed else None, extra_env=armed.env if armed else None,
                   term_grace_s=armed.term_grace_s if armed else 15.0) as target:
            points = ", ".join(p.label for p in load.points())
            say(f"{tag}: ready in {time.monotonic() - t0:.0f} s; load {points}"
                + (f"; {len(target.replicas)} replicas ({'; '.join(r.placement for r in target.replicas)}), "
                   f"route {cfg.knobs.route or 'round_robin'}" if target.replicas else ""))
            w.manifest["target"] = target.describe()
            # the engine-neutral record, for people reading the store (studies re-read the evidence files)
            log = "\n".join(p.read_text(errors="replace") for p in (w.dir / "server.stdout.log", w.dir /
                                                                      "server.stderr.log") if p.is_file())
            w.manifest["resolved"] = get_engine(prep.engine.name).resolved_state(target.resolved_config, log).to_dict()
            tel = _telemetry_for(telemetry, target)
            if tel is not None:
                tel.start()
            on_level = _level_writer(store, key, tel, target, w, tag, say)
            try:
                try:
                    result = run_sweep(target.base_urls, target.model, load, tokenizer, target.api_key, progress,
                                       f"{cfg.name} ", on_phase=tel.set_phase if tel else None, skip=set(done),
                                       on_level=on_level, route=cfg.knobs.route or "round_robin")
                except HungError as e:  # the server is alive but silent: what it was doing, where it can be read
                    raise HungError(f"{e}\n{hang_evidence(target)}") from None
                if armed is not None:  # after the measured load, on the same server: the figures stay unprofiled
                    window = profiling.take(armed, adapter, target, load, tokenizer, tel.set_phase if tel else
                                            (lambda _: None))
            finally:
                if tel is not None:
                    tel.stop()
                    w.manifest["telemetry"] = tel.status
            # the point's tables: the levels this attempt and earlier ones finished, in the load's order
            levels = store.level_tables(key)
            w.manifest["levels"] = {"resumed": list(done), "measured_now": [p.label for p in load.points()
                                                                            if p.label not in done]}
            tele = {n: list(f) for n, f in levels.items() if n.startswith("telemetry_")}
            if tel is not None:  # what fell outside the levels (idle, the profiled window) from this attempt
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
        if armed is not None and window is not None:  # nsys writes its report once the server has exited
            kernels, runtime, info = profiling.read(armed, window)
            w.put_table("kernels", kernels)
            w.put_table("kernel_runtime", runtime)
            w.manifest["profile"] = info
            say(f"{tag}: profile: {info['kernels']} kernels in a {info['window_s']:.1f} s window at "
                f"c={info['concurrency']}")
        say(f"{tag}: done; output tok/s: " + ", ".join(f"{r.point}: {r.output_tok_s:.0f}" for r in summ.itertuples()))
        bad = int(summ["failed"].sum()) if len(summ) else 0
        if bad:
            say(f"{tag}: {bad} requests failed (kept in the records)")
        for r in summ.itertuples():
            if getattr(r, "client_limited", False):
                say(f"{tag}: WARNING at {r.point}: the load client limited this measurement: {r.client_warning}")
            elif getattr(r, "client_starved", False):
                say(f"{tag}: note at {r.point}: {r.client_warning}")


def hang_evidence(target: Any, lines: int = 20) -> str:
    """For a hung server: the last lines of its logs and, where py-spy is installed, a stack dump of every Python
    process of its tree (else why there is none)."""
    out = []
    for name in ("server.stderr.log", "server.stdout.log"):
        tail = tail_lines(Path(target.log_dir or ".") / name, lines)
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


def _check_all(prep: Prepared, configs: Sequence[Config]) -> None:
    """Refuse, before anything launches, a configuration this engine version or this machine cannot run."""
    adapter = get_engine(prep.engine.name)
    if not adapter.launches:
        return
    for cfg in configs:
        if cfg.knobs.replicas > 1 and prep.engine.port:
            raise SpecError(f"configuration {cfg.name!r}: engine.port pins one port, but it asks for "
                            f"{cfg.knobs.replicas} replicas: leave engine.port unset (nothing was launched)")
        try:
            adapter.check_knobs(cfg.knobs, prep.install, prep.engine.env, prep.model_path)
        except KnobError as e:
            raise KnobError(f"configuration {cfg.name!r}: {e} (nothing was launched)") from None


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


__all__ = ["Config", "Results", "RepetitionPlan", "measure", "point_parts", "engine_identity", "launch_identity",
           "Path"]
