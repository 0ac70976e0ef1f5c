"""One call from a spec to a serving endpoint: prepare the engine and model, launch, yield, tear down."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from . import mps
from .engines import get_engine
from .engines.base import EngineAdapter, EngineInstall, LaunchPlan
from .engines.envs import EngineEnvSpec, ensure_engine_env
from .errors import KnobError, PortInUseError, ServescopeError, SpecError
from .models import model_config, resolve_model
from .mps import SharedGpu
from .server import ManagedServer, ReadyCheck, free_port, replica_log_dir, write_resolved
from .spec import EngineSpec, Knobs, ModelSpec
from .util import redact_mapping


@dataclass
class Prepared:
    """An engine install and a model ready to serve (nothing launched yet)."""

    engine: EngineSpec
    install: EngineInstall
    model_path: str
    served_name: str
    adapter: EngineAdapter
    random_weights: bool = False  # an architecture alone: every launch asks the engine for its own random weights


@dataclass
class Target:
    """A serving endpoint the load generator can hit, with what is known about how it was configured."""

    base_url: str
    model: str
    engine: str
    install: EngineInstall
    knobs: Knobs
    flags: list[str] = field(default_factory=list)
    command: str = ""
    resolved_config: dict[str, Any] | None = None
    startup: dict[str, float | None] = field(default_factory=dict)
    log_dir: Path | None = None
    api_key: str | None = field(default=None, repr=False)
    pid: int | None = None  # the launched server's root process (None for external servers)
    metrics_url: str | None = None
    # raises ServerDiedError when a process of the launched tree has died (None: an external server)
    check_alive: Callable[[], None] | None = field(default=None, repr=False, compare=False)
    placement: str = ""  # where this server runs when it is one replica of several ('replica 1: cores 1')
    replica: int = 0  # its index among them
    replicas: list[Target] = field(default_factory=list)  # every replica, this one first, when there are several
    gpu_share: SharedGpu | None = None  # replicas on one GPU: how they shared it
    # one server over several nodes: the other ranks' RankServer actors (span.py) and every rank's record
    followers: list[Any] = field(default_factory=list, repr=False, compare=False)
    ranks: list[dict[str, Any]] = field(default_factory=list)

    @property
    def base_urls(self) -> list[str]:
        """Every endpoint of the configuration: the replicas', or this one."""
        return [r.base_url for r in self.replicas] or [self.base_url]

    @property
    def pids(self) -> list[int]:
        """Root processes of every replica's server tree."""
        return [r.pid for r in (self.replicas or [self]) if r.pid is not None]

    def describe(self) -> dict[str, Any]:
        """Manifest-friendly description (no secrets, no bulky resolved config)."""
        d = {"base_url": self.base_url, "model": self.model, "engine": self.engine,
             "install": self.install.as_dict(), "knobs": self.knobs.model_dump(mode="json"),
             "flags": self.flags, "command": self.command, "startup": self.startup}
        if self.replicas:
            d["replicas"] = [{"replica": r.replica, "base_url": r.base_url, "placement": r.placement, "command": r.command,
                              "startup": r.startup, "pid": r.pid} for r in self.replicas]
        if self.gpu_share is not None:
            d["gpu_share"] = self.gpu_share.to_dict()
        if self.ranks:
            d["ranks"] = self.ranks
        return d


def _api_key(engine: EngineSpec) -> str | None:
    if engine.api_key_env is None:
        return None
    if engine.api_key_env not in os.environ:
        raise SpecError(f"engine.api_key_env names {engine.api_key_env!r}, which is not set in the environment")
    return os.environ[engine.api_key_env]


# a preparation longer than this is said, step by step (a built model, a cold engine import)
SLOW_PREPARE_S = 10.0


def prepare(engine: EngineSpec, model: ModelSpec, say: Callable[[str], None] = print,
            adapter: EngineAdapter | None = None) -> Prepared:
    """Create the engine environment and the model if missing; validate everything that can be checked early.

    An entry point: given no adapter, the engine is looked up by its name here."""
    adapter = adapter or get_engine(engine.name)
    if not adapter.launches:
        if not engine.url:
            raise SpecError("engine 'external' needs engine.url")
        served = model.served_name or model.path or ""
        return Prepared(engine, adapter.probe(""), model.path or "", served, adapter)
    if engine.url:
        raise SpecError(f"engine.url is only for engine 'external'; {engine.name!r} is launched by servescope")
    steps: dict[str, float] = {}

    def timed(step: str, work: Callable[[], Any]) -> Any:
        t0 = time.monotonic()
        try:
            return work()
        finally:
            steps[step] = time.monotonic() - t0

    install = timed("finding the engine", lambda: _install_for_launch(engine, adapter, say))
    timed("reading its flags", lambda: check_base_args(engine, adapter, install))
    path, served = timed("the model", lambda: resolve_model(model, install.python, install.env))
    if model.random_weights:
        timed("checking the architecture", lambda: check_architecture(adapter, install, path))
    # a fresh machine's first preparation took minutes before anything launched (the H200, 2026-12-05), with nothing
    # in the log: say where they went, once they are long enough to matter
    if sum(steps.values()) >= SLOW_PREPARE_S:
        say("prepared before the first launch in " + ", ".join(f"{w} {s:.0f} s" for w, s in steps.items()))
    return Prepared(engine, install, path, adapter.served_name(path, served), adapter, model.random_weights)


def check_architecture(adapter: EngineAdapter, install: EngineInstall, model_path: str) -> None:
    """Refuse, before launch, an architecture this engine version cannot serve with its own random weights: no
    random-weight loader, or no file of its source naming the config's architecture class."""
    if not adapter.random_weight_flags:
        raise SpecError(f"{adapter.name} {install.version} has no random-weight loader servescope knows: serve a model "
                        "folder with weights (model.path) or a generated one (model.tiny) instead (nothing was "
                        "launched)")
    adapter.check_flags(list(adapter.random_weight_flags), install)
    arch = (model_config(model_path).get("architectures") or [""])[0]
    try:
        tree = adapter.source_tree(install)
        # engines register architectures in their models/ folders (vllm's model_executor/models/registry.py, sglang's
        # srt/models/*.py EntryClass)
        files = [f for f in tree.files(adapter.package + "/") if f.endswith(".py") and "/models/" in f]
    except Exception:  # noqa: BLE001 - the source is not here: the launch says it
        return
    if arch and not any(arch in tree.read(f) for f in files):
        raise SpecError(f"{adapter.name} {install.version} does not know the architecture {arch} (no file of its "
                        f"source names it): choose another architecture or engine version (nothing was launched)")


def launch_plan(prep: Prepared, knobs: Knobs, port: int, extra_env: dict[str, str] | None = None) -> LaunchPlan:
    """The adapter's plan for knobs, with the suite's base arguments (engine.args) after the knobs' flags, the
    engine's random-weight loader where the model is an architecture alone, and the engine's own environment under
    the launch's."""
    engine = prep.engine
    plan = prep.adapter.plan(install=prep.install, model_path=prep.model_path, served_name=prep.served_name,
                             host=engine.host, port=port, knobs=knobs, extra_env={**engine.env, **(extra_env or {})})
    base = [*engine.args, *(prep.adapter.random_weight_flags if prep.random_weights else ())]
    return dataclasses.replace(plan, command=[*plan.command, *base]) if base else plan


def check_base_args(engine: EngineSpec, adapter: EngineAdapter, install: EngineInstall) -> None:
    """Refuse, before launch, base arguments (engine.args) this version does not define or whose value it does not
    accept, naming the flag and the version."""
    if not engine.args:
        return
    try:
        adapter.check_flags(list(engine.args), install)
    except KnobError as e:
        raise KnobError(f"engine.args: {e}; change or drop it in the suite's engine section (nothing was "
                        "launched)") from None


def knob_settings(adapter: EngineAdapter, install: EngineInstall) -> dict[str, str]:
    """Every setting a knob can set on this version, by the flag's destination (what aliases share), -> the knob's
    name: how a flag written in another spelling is still known as a knob's."""
    from .engines.base import KNOB_PROBES

    dest = flag_dests(adapter, install)
    out: dict[str, str] = {}
    for probe in KNOB_PROBES:
        try:
            flags = adapter.knob_flags(Knobs(**probe), install)
        except (KnobError, SpecError):
            continue
        name = list(probe)[-1]
        for f in flags:
            if f.startswith("--"):
                flag = f.split("=", 1)[0]
                out.setdefault(dest.get(flag, flag), name)
    return out


def flag_dests(adapter: EngineAdapter, install: EngineInstall) -> dict[str, str]:
    try:
        table = adapter.flag_set(install).table
    except ServescopeError:
        return {}
    return {f: str(d) for f, d in zip(table["flag"], table["dest"], strict=True) if d}


def check_deployment_args(adapter: EngineAdapter, install: EngineInstall, args: tuple[str, ...]) -> None:
    """Refuse, before launch, deployment flags this version does not define, and any that sets what a knob sets (in
    any spelling): a thread that varies that knob could not replace it, so it must be written as the knob."""
    if not args:
        return
    try:
        adapter.check_flags(list(args), install)
    except KnobError as e:
        raise KnobError(f"deployment.args: {e} (nothing was launched)") from None
    except ServescopeError:  # no source to read the version's flags from: the launch itself says what it rejects
        pass
    dest, settings = flag_dests(adapter, install), knob_settings(adapter, install)
    for a in args:
        flag = a.split("=", 1)[0]
        knob = settings.get(dest.get(flag, flag)) if flag.startswith("--") else None
        if knob is None and flag.startswith("--") and adapter.graph_off_flags([flag], install):
            knob = "cuda_graph"
        if knob is not None:
            raise SpecError(f"deployment.args sets {flag}, which is the knob {knob} on {adapter.name} "
                            f"{install.version}: write it under deployment.knobs ({knob}: ...) so that a thread that "
                            "changes it replaces it (nothing was launched)")


def check_env_paths(env: dict[str, str]) -> None:
    """Refuse an engine environment whose PYTHONPATH names a folder that is not there (a site folder not installed
    yet, or a typo), before anything runs under it."""
    for entry in filter(None, env.get("PYTHONPATH", "").split(os.pathsep)):
        if not Path(entry).is_dir():
            raise SpecError(f"engine.env PYTHONPATH names {entry}, which is not a folder here: install the engine's "
                            "site folder there first, or correct the path")


def find_install(engine: EngineSpec, adapter: EngineAdapter) -> EngineInstall | None:
    """The engine as installed, the one way every part finds it (nothing is created here: prepare does that): under
    engine.python, else in its managed environment (a ServescopeError where that is not created yet); None for an
    engine servescope does not launch."""
    if not adapter.launches:
        return None
    check_env_paths(engine.env)
    if engine.python:
        python = engine.python
        if not Path(python).exists():
            raise SpecError(f"engine.python {python!r} does not exist")
    else:
        env_spec = _managed(adapter, engine.version)
        if not env_spec.is_ready():
            raise ServescopeError(f"the {env_spec.key} environment is not created yet (make engine, or any run "
                                  "creates it)")
        python = str(env_spec.python())
    install = adapter.probe(python, dict(engine.env))
    if engine.version and install.version != engine.version:
        raise SpecError(f"engine.version is {engine.version} but {python} has {engine.name} {install.version}")
    return install


def _managed(adapter: EngineAdapter, version: str | None) -> EngineEnvSpec:
    env_spec = adapter.managed_env(version)
    if env_spec is None:
        raise SpecError(f"engine {adapter.name!r} has no managed environment; set engine.python")
    return env_spec


def create_env(adapter: EngineAdapter, version: str | None, say: Callable[[str], None] = print) -> Path:
    """The engine's managed environment for version, created where missing (under a lock); its interpreter. Called
    by a launch being prepared, and by the CLI verbs that ask for exactly this (`engine-env`, `make-model`)."""
    return ensure_engine_env(_managed(adapter, version), say)


def _install_for_launch(engine: EngineSpec, adapter: EngineAdapter, say: Callable[[str], None]) -> EngineInstall:
    """find_install, creating the engine's managed environment first where it is missing."""
    if adapter.launches and not engine.python:
        check_env_paths(engine.env)
        create_env(adapter, engine.version, say)
    install = find_install(engine, adapter)
    assert install is not None
    return install


@contextlib.contextmanager
def serve(prep: Prepared, knobs: Knobs, log_dir: Path, prefix: list[str] | None = None,
          extra_env: dict[str, str] | None = None, term_grace_s: float = 15.0, span: Any = None) -> Iterator[Target]:
    """Launch one configuration and yield its Target; the whole server tree is gone when the block ends.

    prefix wraps the command (e.g. `nsys profile ...`); give such a wrapper a long term_grace_s, since it
    writes its report after the server exits. knobs.replicas > 1: that many servers start at once, each pinned to
    its share of the devices (replica 0 logs into log_dir, replica i into its own sub-folder; prefix and extra_env
    go to replica 0 alone, so a profile is of replica 0), and the Target yielded is replica 0's with all of them in
    .replicas. span (span.Span, on a Ray node): one server over that placement group's nodes, rank 0 here."""
    if span is not None:
        from . import span as spans

        with spans.serve(span, prep, knobs, Path(log_dir), _serve_one, rank_server, prefix, extra_env,
                         term_grace_s) as target:
            yield target
        return
    if knobs.replicas > 1 and prep.adapter.launches:
        with _serve_replicas(prep, knobs, Path(log_dir), prefix, extra_env, term_grace_s) as target:
            yield target
        return
    with _serve_one(prep, knobs, log_dir, prefix, extra_env, term_grace_s) as target:
        yield target


@contextlib.contextmanager
def _serve_replicas(prep: Prepared, knobs: Knobs, log_dir: Path, prefix: list[str] | None,
                    extra_env: dict[str, str] | None, term_grace_s: float) -> Iterator[Target]:
    if prep.engine.port:
        raise SpecError(f"engine.port pins one port, but knobs ask for {knobs.replicas} replicas: leave port unset")
    places = prep.adapter.placements(knobs, prep.install, prep.engine.env)
    # the sharing outlives the replicas: entered first, left last (an MPS daemon stops once its clients are gone)
    with contextlib.ExitStack() as stack:
        share = stack.enter_context(mps.sharing(knobs.gpu_share, knobs.mps_active_thread_pct))
        in_turn = share is not None and prep.adapter.shared_starts_in_turn
        entered, errors = _start_replicas(prep, knobs, log_dir, places, prefix, extra_env, term_grace_s,
                                          share.env if share is not None else {}, in_turn)
        for cm, _ in entered:
            stack.push(cm.__exit__)
        if errors:
            raise errors[0]
        reps = sorted((t for _, t in entered), key=lambda t: t.replica)
        if share is not None:
            share.check({r.replica: _tree(r.pid) for r in reps})
        head = dataclasses.replace(reps[0], replicas=reps, gpu_share=share.record() if share is not None else None)

        def check_alive() -> None:
            for r in reps:
                if r.check_alive is not None:
                    r.check_alive()

        head.check_alive = check_alive
        yield head


def _start_replicas(prep: Prepared, knobs: Knobs, log_dir: Path, places: list[Any], prefix: list[str] | None,
                    extra_env: dict[str, str] | None, term_grace_s: float, share_env: dict[str, str],
                    in_turn: bool) -> tuple[list[tuple[Any, Target]], list[BaseException]]:
    """Start every replica, all at once or (in_turn) each once the one before is ready; the entered servers (to
    leave) and the errors. prefix and extra_env go to replica 0 alone."""
    entered: list[tuple[Any, Target]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def start(pl: Any) -> None:
        first = pl.replica == 0
        cm = _serve_one(prep, knobs, replica_log_dir(log_dir, pl.replica),
                        [*pl.prefix, *((prefix or []) if first else [])],
                        {**pl.env, **share_env, **((extra_env or {}) if first else {})}, term_grace_s)
        try:
            t = cm.__enter__()
        except BaseException as e:  # noqa: BLE001 - reported by the caller, after every start has ended
            with lock:
                errors.append(e)
            return
        t.placement, t.replica = pl.words(), pl.replica
        with lock:
            entered.append((cm, t))

    if in_turn:
        for pl in places:
            start(pl)
            if errors:
                break
        return entered, errors
    threads = [threading.Thread(target=start, args=(pl,), daemon=True) for pl in places]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return entered, errors


def _tree(pid: int | None) -> list[int]:
    """A server's process and its descendants (where a CUDA context may live)."""
    if pid is None:
        return []
    try:
        root = psutil.Process(pid)
        return [pid, *(c.pid for c in root.children(recursive=True))]
    except psutil.Error:
        return [pid]


# a launch outside a measured run (the doctor's token) with no startup_timeout_s of its own
DEFAULT_STARTUP_S = 900.0


def managed_server(prep: Prepared, plan: LaunchPlan, port: int, log_dir: Path, ready: ReadyCheck,
                   prefix: list[str] | None = None, term_grace_s: float = 15.0) -> ManagedServer:
    """The server process tree of one launch plan (not started), with how its engine's log tells its own deaths."""
    adapter, engine = prep.adapter, prep.engine
    return ManagedServer(command=[*(prefix or []), *plan.command], port=port, host=engine.host, log_dir=log_dir,
                         model=prep.served_name, env=plan.env,
                         startup_timeout_s=engine.startup_timeout_s or DEFAULT_STARTUP_S, ready=ready,
                         term_grace_s=term_grace_s, package=adapter.package,
                         teardown_patterns=adapter.teardown_patterns, raiser_patterns=adapter.raiser_patterns,
                         stage_of=adapter.death_stage, socket_dir_env=adapter.socket_dir_env)


def rank_server(prep: Prepared, knobs: Knobs, log_dir: Path) -> ManagedServer:
    """One other rank of a server over several nodes (span.RankServer): its launch plan on a free port here, with
    no readiness of its own (rank 0 serves for all)."""
    port = free_port(prep.engine.host)
    return managed_server(prep, launch_plan(prep, knobs, port), port, log_dir,
                          ReadyCheck(health_path=None, models_path=None, generate_path=None))


@contextlib.contextmanager
def _serve_one(prep: Prepared, knobs: Knobs, log_dir: Path, prefix: list[str] | None = None,
               extra_env: dict[str, str] | None = None, term_grace_s: float = 15.0) -> Iterator[Target]:
    engine, adapter = prep.engine, prep.adapter
    api_key = _api_key(engine)
    if not adapter.launches:
        adapter.knob_flags(knobs, prep.install)  # raises if knobs were asked of a server we do not control
        assert engine.url is not None
        resolved = adapter.resolved_config(engine.url)
        resolved = redact_mapping(resolved) if resolved is not None else None
        if resolved is not None:
            write_resolved(Path(log_dir), resolved)
        yield Target(base_url=engine.url.rstrip("/"), model=prep.served_name, engine=engine.name,
                     install=prep.install, knobs=knobs, api_key=api_key, resolved_config=resolved,
                     metrics_url=engine.url.rstrip("/") + "/metrics", log_dir=Path(log_dir))
        return
    for attempt in range(3):
        port = engine.port or free_port(engine.host)
        plan = launch_plan(prep, knobs, port, extra_env)
        server = managed_server(prep, plan, port, Path(log_dir), dataclasses.replace(plan.ready, api_key=api_key),
                                prefix, term_grace_s)
        try:
            server.start()
            break
        except PortInUseError:
            if engine.port or attempt == 2:  # a port the user chose is theirs to free
                raise
    with server:
        resolved = adapter.resolved_config(server.base_url)
        if resolved is None:
            resolved = adapter.resolved_from_command(plan.command)
        resolved = redact_mapping(resolved) if resolved is not None else None
        if resolved is not None:
            write_resolved(Path(log_dir), resolved)
        target = Target(base_url=server.base_url, model=prep.served_name, engine=engine.name, install=prep.install,
                        knobs=knobs, flags=plan.flags, command=server.shown_command,
                        resolved_config=resolved, startup=server.timings.as_dict(), log_dir=Path(log_dir),
                        api_key=api_key, pid=server.proc.pid if server.proc else None,
                        metrics_url=server.base_url + "/metrics", check_alive=server.check_alive)
        try:
            yield target
        except Exception:
            server.check_alive()  # what failed in the block may be the symptom of a dead server: name the cause
            raise
        # a server that lost a process while it served has measured something else than what was asked
        server.check_alive()
