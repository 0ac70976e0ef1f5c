"""Server lifecycle: launch an engine command in its own process group, wait until it really serves, tear the whole tree down."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from . import deaths as _deaths
from .deaths import ProcessDeath, TreeWatch
from .errors import PortInUseError, ServerDiedError, ServerError, ServerExitedError, ServerStartTimeout
from .util import atomic_write_json

log = logging.getLogger(__name__)

# Flags whose value is a secret: the logged command shows them redacted.
SECRET_FLAGS = frozenset({"--api-key", "--hf-token", "--token", "--admin-api-key"})


def redact_command(command: list[str]) -> str:
    """The command as one shell-quoted line, with secret flag values hidden."""
    out: list[str] = []
    hide_next = False
    for arg in command:
        if hide_next:
            out.append("***")
            hide_next = False
            continue
        name, eq, _ = arg.partition("=")
        if name in SECRET_FLAGS:
            if eq:
                out.append(f"{name}=***")
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(arg)
    return shlex.join(out)


def port_is_free(host: str, port: int) -> bool:
    """True when nothing listens on host:port (TIME_WAIT leftovers do not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


_handed_out: dict[int, float] = {}  # port -> when free_port gave it, so parallel launches never share one
_port_lock = threading.Lock()
_PORT_FLOOR = 10000
_HOLD_S = 120.0


def _ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


ENGINE_SITE = Path(__file__).with_name("engine_site")


def engine_site_path(pythonpath: str = "") -> str:
    """PYTHONPATH for a launched server: servescope's engine_site first (its sitecustomize asks Linux for the AMX tile
    permission in every Python process of the tree, which vLLM's CPU kernels need and never ask for), then the rest."""
    rest = [p for p in pythonpath.split(os.pathsep) if p and Path(p) != ENGINE_SITE]
    return os.pathsep.join([str(ENGINE_SITE), *rest])


def free_port(host: str = "127.0.0.1") -> int:
    """A port that is free now on host, below the kernel's ephemeral range (client sockets, such as a load
    generator's or another launch's readiness polls, take ephemeral ports and could take it before the server
    binds), and not handed out by this process in the last two minutes."""
    lo, _ = _ephemeral_range()
    rng = random.Random()
    with _port_lock:
        now = time.monotonic()
        for port, t in list(_handed_out.items()):
            if now - t > _HOLD_S:
                del _handed_out[port]
        candidates = [rng.randrange(_PORT_FLOOR, lo) for _ in range(200)] if lo > _PORT_FLOOR + 1000 else []
        for port in candidates:
            if port not in _handed_out and port_is_free(host, port):
                _handed_out[port] = now
                return port
        while True:  # no room below the ephemeral range: let the kernel choose
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((host, 0))
                port = int(s.getsockname()[1])
            if port not in _handed_out:
                _handed_out[port] = now
                return port


# What a launched server leaves in its log folder: both streams, the configuration it reported, and one sub-folder
# per further replica. Only this module and store.py name these files.
STDOUT_LOG, STDERR_LOG = "server.stdout.log", "server.stderr.log"
RESOLVED_CONFIG = "resolved_config.json"


def replica_log_dir(log_dir: Path, replica: int) -> Path:
    """Where replica `replica` of a configuration logs (replica 0: the point's own folder)."""
    return Path(log_dir) if replica == 0 else Path(log_dir) / f"replica-{replica}"


def read_logs(log_dir: Path, order: tuple[str, ...] = (STDOUT_LOG, STDERR_LOG)) -> str:
    """Both streams a server wrote into log_dir, joined ('' where it kept none)."""
    paths = [Path(log_dir) / n for n in order]
    return "\n".join(p.read_text(errors="replace") for p in paths if p.is_file())


def has_logs(log_dir: Path) -> bool:
    """True when a server's log was kept in log_dir."""
    return any((Path(log_dir) / n).is_file() for n in (STDOUT_LOG, STDERR_LOG))


def write_resolved(log_dir: Path, resolved: dict[str, Any]) -> None:
    """Keep the configuration the server reported beside its logs."""
    atomic_write_json(Path(log_dir) / RESOLVED_CONFIG, resolved)


def read_resolved(log_dir: Path) -> dict[str, Any] | None:
    """The configuration a server reported, as kept beside its logs (None where it reported none)."""
    p = Path(log_dir) / RESOLVED_CONFIG
    return json.loads(p.read_text()) if p.is_file() else None


def log_tails(log_dir: Path, lines: int = 20) -> list[tuple[str, list[str]]]:
    """The last lines of each stream (stderr first: where servers put their errors)."""
    return [(n, tail_lines(Path(log_dir) / n, lines)) for n in (STDERR_LOG, STDOUT_LOG)]


def tail_lines(path: Path, lines: int) -> list[str]:
    """The last lines of a log file ([] when it does not exist)."""
    return path.read_text(errors="replace").splitlines()[-lines:] if path.is_file() else []


@dataclass(frozen=True)
class ReadyCheck:
    """What 'ready' means: health answers, the model is listed, and one real token comes back."""

    health_path: str | None = "/health"
    models_path: str | None = "/v1/models"
    generate_path: str | None = "/v1/completions"
    request_timeout_s: float = 5.0
    generate_timeout_s: float = 120.0
    poll_interval_s: float = 0.5
    api_key: str | None = None


@dataclass
class StartupTimings:
    """Seconds from launch until each readiness step first succeeded."""

    health_s: float | None = None
    models_s: float | None = None
    first_token_s: float | None = None

    def as_dict(self) -> dict[str, float | None]:
        """Plain dict for manifests."""
        return {"health_s": self.health_s, "models_s": self.models_s, "first_token_s": self.first_token_s}


def _http(
    method: str, url: str, timeout_s: float, body: dict[str, Any] | None = None, api_key: str | None = None
) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read() or b""


@dataclass
class ManagedServer:
    """A server process tree owned by this Python process; use as a context manager."""

    command: list[str]
    port: int
    log_dir: Path
    model: str
    host: str = "127.0.0.1"
    env: dict[str, str] = field(default_factory=dict)
    startup_timeout_s: float = 600.0
    ready: ReadyCheck = field(default_factory=ReadyCheck)
    term_grace_s: float = 15.0
    cwd: Path | None = None
    # how the engine's log tells its own failures (the adapter's): its package (frames in its code), lines that say
    # it is tearing its own tree down after a child failed, and lines that name the process that raised
    package: str = ""
    teardown_patterns: tuple[str, ...] = ()
    raiser_patterns: tuple[str, ...] = ()
    stage_of: Any = None  # log text -> where in its startup the server was (the adapter's death_stage)
    # the variables naming where the engine puts its IPC sockets (the adapter's socket_dir_env): set to a folder of
    # this launch's own, unless env sets them, and removed with the tree (by stop, or by the reaper)
    socket_dir_env: tuple[str, ...] = ()

    proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    timings: StartupTimings = field(default_factory=StartupTimings, init=False)
    _reaper: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _files: list[Any] = field(default_factory=list, init=False, repr=False)
    watch: TreeWatch = field(default_factory=TreeWatch, init=False, repr=False)
    _ready_offsets: tuple[int, int] = field(default=(0, 0), init=False, repr=False)
    socket_dir: Path | None = field(default=None, init=False, repr=False)

    @property
    def base_url(self) -> str:
        """http://host:port of the running server."""
        return f"http://{self.host}:{self.port}"

    @property
    def shown_command(self) -> str:
        """The command as logs and reports show it (one shell-quoted line, secrets hidden)."""
        return redact_command(self.command)

    @property
    def stdout_path(self) -> Path:
        """Where the server's stdout goes."""
        return Path(self.log_dir) / STDOUT_LOG

    @property
    def stderr_path(self) -> Path:
        """Where the server's stderr goes."""
        return Path(self.log_dir) / STDERR_LOG

    def log_text(self, since: tuple[int, int] = (0, 0)) -> str:
        """stdout then stderr of the server, each from a byte offset."""
        parts = []
        for p, start in zip((self.stdout_path, self.stderr_path), since, strict=True):
            if p.exists():
                with open(p, "rb") as fh:
                    fh.seek(start)
                    parts.append(fh.read().decode(errors="replace"))
        return "\n".join(parts)

    def _offsets(self) -> tuple[int, int]:
        return tuple(p.stat().st_size if p.exists() else 0 for p in (self.stdout_path, self.stderr_path))  # type: ignore[return-value]

    def deaths(self, since_ready: bool = False) -> list[ProcessDeath]:
        """Processes of the tree that died from a signal: the root's exit status and what the logs show
        (since the server became ready, if asked)."""
        rc = self.proc.poll() if self.proc is not None else None
        text = self.log_text(self._ready_offsets if since_ready else (0, 0))
        return _deaths.explain(rc, text, self.watch)

    def cause(self, deaths: list[ProcessDeath], since_ready: bool = False,
              killed_by_us: str = "") -> _deaths.DeathCause | None:
        """Why the tree failed, from its log: the engine's own first exception or the first signal death, and
        whether the engine tore its own tree down (servescope.deaths.cause_of)."""
        text = self.log_text(self._ready_offsets if since_ready else (0, 0))
        cause = _deaths.cause_of(text, deaths, self.package, [re.compile(x) for x in self.teardown_patterns],
                                 [re.compile(x) for x in self.raiser_patterns], killed_by_us)
        if cause is not None and not since_ready and self.stage_of is not None:
            cause.stage = self.stage_of(self.log_text())
        return cause

    def check_alive(self) -> None:
        """Raise ServerDiedError if the server exited or a process of its tree died since it became ready."""
        found = self.deaths(since_ready=True)
        rc = self.proc.poll() if self.proc is not None else None
        if found or rc is not None:
            what = f"server exited with code {rc} while serving" if rc is not None else "a server process died while serving"
            raise ServerDiedError(what, self.log_tail(), found, self.cause(found, since_ready=True))

    def log_tail(self, lines: int = 40) -> str:
        """Last lines of the server's stdout then stderr."""
        parts = []
        for p in (self.stdout_path, self.stderr_path):
            text = tail_lines(p, lines)
            if text:
                parts.append(f"[{p.name}]\n" + "\n".join(text))
        return "\n".join(parts)

    # -- launch -------------------------------------------------------------------------------
    def start(self) -> ManagedServer:
        """Launch and block until ready; on any failure the tree is torn down before raising."""
        if not port_is_free(self.host, self.port):
            raise PortInUseError(f"port {self.host}:{self.port} is already in use; nothing was launched")
        log_dir = Path(self.log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
        shown = self.shown_command
        (log_dir / "command.txt").write_text(shown + "\n")
        log.info("launching: %s", shown)
        out = open(self.stdout_path, "ab")
        err = open(self.stderr_path, "ab")
        self._files = [out, err]
        # plain logs (they are parsed and shown in reports); faulthandler so a Python process dying from a signal says so
        wanted = [k for k in self.socket_dir_env if k not in self.env]
        self.socket_dir = Path(tempfile.mkdtemp(prefix="servescope-ipc-")) if wanted else None
        own = {k: str(self.socket_dir) for k in wanted}
        env = {**os.environ, "NO_COLOR": "1", **_deaths.env_for_python_servers(), **own, **self.env}
        env["PYTHONPATH"] = engine_site_path(env.get("PYTHONPATH", ""))  # each Python process may use its CPU's AMX
        self.watch = TreeWatch(oom_kills_at_start=_deaths.oom_kill_count())
        self._t0 = time.monotonic()
        self.proc = subprocess.Popen(
            self.command,
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=self.cwd,
            start_new_session=True,  # own session and process group: one killpg reaches every child
        )
        self._reaper = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("_reaper.py")), str(self.proc.pid), str(self.term_grace_s),
             *([str(self.socket_dir)] if self.socket_dir else [])],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            self._wait_ready()
        except BaseException:
            self.stop(check_port=False)
            raise
        self.watch.update(self.proc.pid)
        self._ready_offsets = self._offsets()
        (log_dir / "startup.json").write_text(json.dumps(self.timings.as_dict(), indent=2))
        return self

    def _check_alive(self) -> None:
        assert self.proc is not None
        rc = self.proc.poll()
        if rc is not None:
            found = self.deaths()
            raise ServerExitedError(
                f"server exited with code {rc} before it was ready ({time.monotonic() - self._t0:.1f} s after launch)",
                self.log_tail(), found, self.cause(found),
            )
        self.watch.update(self.proc.pid)

    def _poll(self, step: str, attempt: Any, deadline: float) -> float:
        last = ""
        while True:
            self._check_alive()
            if time.monotonic() > deadline:
                found = self.deaths()
                raise ServerStartTimeout(
                    f"server not ready after {self.startup_timeout_s:.0f} s "
                    f"(stuck at step '{step}'; last answer: {last or 'none'})",
                    self.log_tail(), found,
                    self.cause(found, killed_by_us=f"servescope stopped it after its startup timeout "
                                                   f"({self.startup_timeout_s:.0f} s)"),
                )
            try:
                ok, last = attempt()
            except (OSError, urllib.error.URLError, TimeoutError) as e:
                ok, last = False, f"{type(e).__name__}: {e}"
            if ok:
                return time.monotonic() - self._t0
            time.sleep(self.ready.poll_interval_s)

    def _wait_ready(self) -> None:
        r = self.ready
        deadline = self._t0 + self.startup_timeout_s
        url = self.base_url

        if r.health_path:

            def health() -> tuple[bool, str]:
                code, _ = _http("GET", url + r.health_path, r.request_timeout_s, api_key=r.api_key)
                return code == 200, f"HTTP {code}"

            self.timings.health_s = self._poll("health", health, deadline)
        if r.models_path:

            def models() -> tuple[bool, str]:
                code, body = _http("GET", url + r.models_path, r.request_timeout_s, api_key=r.api_key)
                if code != 200:
                    return False, f"HTTP {code}"
                ids = [m.get("id") for m in json.loads(body).get("data", [])]
                return self.model in ids, f"models listed: {ids}"

            self.timings.models_s = self._poll("models", models, deadline)
        if r.generate_path:

            def generate() -> tuple[bool, str]:
                body = {"model": self.model, "prompt": "Hello", "max_tokens": 1, "temperature": 0.0}
                code, raw = _http("POST", url + r.generate_path, r.generate_timeout_s, body, api_key=r.api_key)
                if code != 200:
                    return False, f"HTTP {code}: {raw[:300].decode(errors='replace')}"
                choices = json.loads(raw).get("choices") or []
                return bool(choices), f"choices: {choices!r:.200}"

            self.timings.first_token_s = self._poll("first token", generate, deadline)

    # -- teardown -----------------------------------------------------------------------------
    def stop(self, check_port: bool = True) -> None:
        """TERM the whole tree, wait, KILL what is left, reap, then check the port is free."""
        proc = self.proc
        if proc is None:
            return
        pgid = proc.pid  # start_new_session made the server its group's leader
        tree = _tree_and_group(proc.pid, pgid)
        self._signal_all(pgid, tree, signal.SIGTERM)
        self._signal_all(pgid, tree, signal.SIGCONT)  # a stopped (SIGSTOP) process only acts on TERM once continued
        alive = _wait_gone(proc, tree, self.term_grace_s)
        if alive:
            log.warning("%d server processes alive %.0f s after SIGTERM; sending SIGKILL", len(alive), self.term_grace_s)
            self._signal_all(pgid, alive, signal.SIGKILL)
            alive = _wait_gone(proc, alive, 5.0)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        if self._reaper is not None:
            with contextlib.suppress(ProcessLookupError):
                self._reaper.kill()
            self._reaper.wait()
        for f in self._files:
            f.close()
        self._files = []
        self.proc = None
        if self.socket_dir is not None and not alive:
            shutil.rmtree(self.socket_dir, ignore_errors=True)
            self.socket_dir = None
        if alive:
            raise ServerError(f"processes {[p.pid for p in alive]} of the server tree survived SIGKILL")
        if check_port:
            deadline = time.monotonic() + 10
            while not port_is_free(self.host, self.port):
                if time.monotonic() > deadline:
                    raise PortInUseError(f"port {self.host}:{self.port} still in use after teardown")
                time.sleep(0.2)

    @staticmethod
    def _signal_all(pgid: int, procs: list[psutil.Process], sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
        # children that left the group (setsid) are reached one by one
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.send_signal(sig)

    def __enter__(self) -> ManagedServer:
        return self if self.proc is not None else self.start()  # a server started already is entered as it is

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            self.stop()
        except ServerError:
            if exc_type is None:
                raise
            log.exception("teardown failed while handling %s", exc_type.__name__)


def _tree_and_group(pid: int, pgid: int) -> list[psutil.Process]:
    """The root, its descendants, and anything else still in its process group."""
    procs: dict[int, psutil.Process] = {}
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        procs[root.pid] = root
        for c in root.children(recursive=True):
            procs[c.pid] = c
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if p.pid not in procs and os.getpgid(p.pid) == pgid:
                procs[p.pid] = p
    return list(procs.values())


def _wait_gone(root: subprocess.Popen[bytes], procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait until every process is gone (zombies count as gone); return those still alive."""
    deadline = time.monotonic() + timeout_s
    while True:
        root.poll()  # reap our direct child so it does not linger as a zombie
        alive = [p for p in procs if _alive(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
