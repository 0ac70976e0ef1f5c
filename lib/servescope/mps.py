"""CUDA Multi-Process Service (MPS) for replicas that share one GPU, managed by the suite.

The suite starts a control daemon of its own, in a private pipe and log directory (CUDA_MPS_PIPE_DIRECTORY,
CUDA_MPS_LOG_DIRECTORY), before the replicas, and gives them those variables; it checks that the replicas are the
daemon's clients (its server and client lists); at teardown, on a fault or an interrupt, it tells the daemon to quit,
kills what is left of it and removes its directories. A watchdog does the same if the launching process is killed
outright. Nothing here changes the GPU's compute mode or any other device setting: where the device or driver
refuses MPS (no control program, MIG, a prohibited compute mode, a GPU older than Volta) the layout is refused
before anything launches, with the reason; where a daemon already serves the GPU, the suite says so and uses it
rather than start a second one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ServescopeError

CONTROL = "nvidia-cuda-mps-control"
PID_FILE = "nvidia-cuda-mps-control.pid"
DEFAULT_PIPE_DIR = "/tmp/nvidia-mps"  # where a daemon started without CUDA_MPS_PIPE_DIRECTORY listens


class MpsError(ServescopeError):
    """MPS cannot be used here, or the daemon did not behave."""


@dataclass(frozen=True)
class GpuFacts:
    """What decides whether MPS can serve a GPU (read by the caller from NVML; None where not read)."""

    index: int
    compute_mode: str | None = None  # 'Default' | 'Exclusive_Process' | 'Prohibited'
    mig_enabled: bool | None = None
    compute_capability: tuple[int, int] | None = None
    mem_total_mib: float | None = None
    mem_free_mib: float | None = None


def refusal(gpus: list[GpuFacts], env: dict[str, str] | None = None) -> str:
    """Why MPS cannot serve these GPUs here, in one line ('' where it can): no control program on PATH, MIG
    enabled, a prohibited compute mode, a GPU older than Volta, or no GPU at all."""
    env = dict(os.environ) | (env or {})
    if not gpus:
        return "no NVIDIA GPU here: MPS shares a GPU between processes"
    if shutil.which(CONTROL, path=env.get("PATH")) is None:
        return f"no {CONTROL} on PATH (the driver's MPS is not installed here)"
    for g in gpus:
        if g.mig_enabled:
            return f"GPU {g.index} has MIG enabled: servescope does not run MPS inside MIG instances"
        if g.compute_mode == "Prohibited":
            return f"GPU {g.index}'s compute mode is Prohibited: no process may use it, and servescope changes no " \
                   "device setting"
        if g.compute_capability is not None and g.compute_capability < (7, 0):
            return (f"GPU {g.index} has compute capability {g.compute_capability[0]}.{g.compute_capability[1]}: "
                    "servescope runs MPS on Volta (7.0) and newer")
    return ""


def existing_daemon(env: dict[str, str] | None = None) -> str:
    """The pipe directory of an MPS control daemon already running for this user's view ('' where none): the one
    CUDA_MPS_PIPE_DIRECTORY names, else the driver's default."""
    env = dict(os.environ) | (env or {})
    pipe = Path(env.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_PIPE_DIR)
    pid = _read_pid(pipe / PID_FILE)
    return str(pipe) if pid is not None and _alive(pid) else ""


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class MpsDaemon:
    """One control daemon of the suite's own (a context manager): start() before the replicas, client_env() into
    their environment, clients() to check them, stop() at teardown (also on a fault or an interrupt)."""

    active_thread_pct: int | None = None  # CUDA_MPS_ACTIVE_THREAD_PERCENTAGE for each client, where asked
    control: str = CONTROL
    start_timeout_s: float = 15.0
    root: Path | None = field(default=None, init=False)
    pid: int | None = field(default=None, init=False)
    adopted: Path | None = field(default=None, init=False)  # the pipe directory of a daemon that was already running
    _watchdog: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    @classmethod
    def adopt(cls, pipe_dir: str, active_thread_pct: int | None = None) -> MpsDaemon:
        """A daemon that already serves (from existing_daemon): its clients and lists are used, and stop() leaves it
        running, since servescope did not start it."""
        d = cls(active_thread_pct)
        d.adopted = Path(pipe_dir)
        d.pid = _read_pid(d.adopted / PID_FILE)
        return d

    @property
    def pipe_dir(self) -> Path:
        """CUDA_MPS_PIPE_DIRECTORY of this daemon."""
        if self.adopted is not None:
            return self.adopted
        assert self.root is not None, "the daemon is not started"
        return self.root / "pipe"

    @property
    def log_dir(self) -> Path:
        """CUDA_MPS_LOG_DIRECTORY of this daemon (its control.log and server.log)."""
        assert self.root is not None, "the daemon is not started"
        return self.root / "log"

    def env(self) -> dict[str, str]:
        """The variables that point the control program and the daemon's clients at this daemon."""
        if self.adopted is not None:
            return {"CUDA_MPS_PIPE_DIRECTORY": str(self.adopted)}
        return {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir), "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir)}

    def client_env(self) -> dict[str, str]:
        """What each replica's environment needs to be this daemon's client."""
        extra = {} if self.active_thread_pct is None else \
            {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(self.active_thread_pct)}
        return self.env() | extra

    def start(self) -> MpsDaemon:
        """Start the daemon in private directories and wait until it answers; MpsError (with its log) if not."""
        if self.active_thread_pct is not None and not 1 <= self.active_thread_pct <= 100:
            raise MpsError(f"active_thread_pct must be 1..100, not {self.active_thread_pct}")
        self.root = Path(tempfile.mkdtemp(prefix="servescope-mps-"))
        for d in (self.pipe_dir, self.log_dir):
            d.mkdir(mode=0o700)
        try:
            said = self.log_dir / "start.out"  # a file, not a pipe: the daemon it forks may keep its fds open
            with said.open("w") as out:
                res = subprocess.run([self.control, "-d"], env=dict(os.environ) | self.env(), stdin=subprocess.DEVNULL,
                                     stdout=out, stderr=subprocess.STDOUT, timeout=self.start_timeout_s)
            if res.returncode != 0:
                raise MpsError(f"{self.control} -d failed (exit {res.returncode}): "
                               f"{said.read_text().strip()[-300:]}")
            deadline = time.monotonic() + self.start_timeout_s
            while self.pid is None and time.monotonic() < deadline:
                self.pid = _read_pid(self.pipe_dir / PID_FILE)
                if self.pid is None:
                    time.sleep(0.1)
            if self.pid is None:
                raise MpsError(f"the MPS control daemon wrote no pid file in {self.start_timeout_s:.0f} s; its "
                               f"log: {self._log_tail()}")
            self._watchdog = subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("_reaper.py")), "--mps", str(self.root), self.control,
                 str(os.getpid())])
        except BaseException as ex:  # an interrupt too: nothing of a half-started daemon is left behind
            self.stop()
            if isinstance(ex, (OSError, subprocess.TimeoutExpired)):
                raise MpsError(f"could not start the MPS control daemon: {ex}") from None
            raise
        return self

    def command(self, text: str, timeout_s: float = 10.0) -> str:
        """Send one command to the daemon (what `echo CMD | nvidia-cuda-mps-control` does) and return its answer."""
        res = subprocess.run([self.control], input=text + "\n", env=dict(os.environ) | self.env(),
                             capture_output=True, text=True, timeout=timeout_s)
        if res.returncode != 0:
            raise MpsError(f"MPS command {text!r} failed (exit {res.returncode}): {res.stderr.strip()[-300:]}")
        return res.stdout

    def servers(self) -> list[int]:
        """The MPS server processes the daemon runs (one per user and GPU set once a client connected)."""
        return [int(x) for x in self.command("get_server_list").split() if x.isdigit()]

    def clients(self) -> list[int]:
        """Every client process of every server of this daemon."""
        out: list[int] = []
        for s in self.servers():
            out += [int(x) for x in self.command(f"get_client_list {s}").split() if x.isdigit()]
        return out

    def check_clients(self, trees: dict[int, list[int]]) -> dict[int, bool]:
        """Per replica (its process tree's pids): whether one of its processes is a client of this daemon."""
        mine = set(self.clients())
        return {replica: bool(mine & set(pids)) for replica, pids in trees.items()}

    def stop(self, grace_s: float = 10.0) -> None:
        """Tell the daemon to quit, kill what is left of it, remove its directories and the watchdog; safe to call
        twice, and after a failed start; a daemon that was already running is left as it was."""
        if self.root is None or self.adopted is not None:
            return
        self.pid = self.pid or _read_pid(self.pipe_dir / PID_FILE)  # a start that gave up may have one running
        if self.pid is not None and _alive(self.pid):
            try:
                self.command("quit", timeout_s=grace_s)
            except (MpsError, OSError, subprocess.TimeoutExpired):
                pass  # a daemon that does not answer is killed below
            deadline = time.monotonic() + grace_s
            while _alive(self.pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            for sig in (signal.SIGTERM, signal.SIGKILL):
                if _alive(self.pid):
                    try:
                        os.kill(self.pid, sig)
                    except ProcessLookupError:
                        break
                    time.sleep(0.5)
        if self._watchdog is not None:
            self._watchdog.kill()
            self._watchdog.wait()
            self._watchdog = None
        shutil.rmtree(self.root, ignore_errors=True)
        self.root, self.pid = None, None

    def _log_tail(self) -> str:
        try:
            return " | ".join((self.log_dir / "control.log").read_text().strip().splitlines()[-3:]) or "empty"
        except OSError:
            return "none written"

    def __enter__(self) -> MpsDaemon:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


@dataclass(frozen=True)
class SharedGpu:
    """How the replicas of one launch shared their GPU, as the point's manifest keeps it: the mode and, with MPS, who
    started the daemon, its thread share, its servers and whether each replica was its client."""

    mode: str  # 'time_slicing' | 'mps'
    daemon: str = ""  # MPS: 'servescope' | 'already running'
    active_thread_pct: int | None = None
    mps_servers: tuple[int, ...] = ()
    clients: dict[int, bool] = field(default_factory=dict)  # replica -> a client of the daemon
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        """For the point's manifest (the shape the stores have always held)."""
        d: dict[str, Any] = {"mode": self.mode}
        if self.daemon:
            d |= {"daemon": self.daemon, "active_thread_pct": self.active_thread_pct,
                  "mps_servers": list(self.mps_servers), "clients": {str(r): ok for r, ok in sorted(self.clients.items())}}
        if self.note:
            d["note"] = self.note
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SharedGpu:
        """Read back what to_dict wrote."""
        pct = d.get("active_thread_pct")
        return cls(str(d.get("mode") or ""), str(d.get("daemon") or ""), int(pct) if pct is not None else None,
                   tuple(int(x) for x in d.get("mps_servers") or ()),
                   {int(r): bool(ok) for r, ok in (d.get("clients") or {}).items()}, str(d.get("note") or ""))


@dataclass
class Sharing:
    """How the replicas of one launch share their GPU: the environment each replica gets and, with MPS, the daemon
    they must be clients of (checked once they are ready)."""

    mode: str  # 'time_slicing' | 'mps'
    env: dict[str, str] = field(default_factory=dict)
    daemon: MpsDaemon | None = None
    origin: str = ""  # MPS: 'servescope' (started and stopped by the suite) | 'already running' (used, left running)
    note: str = ""
    clients: dict[int, bool] = field(default_factory=dict)
    servers: list[int] = field(default_factory=list)

    def check(self, trees: dict[int, list[int]]) -> None:
        """With MPS, every replica (the pids of its process tree) must be a client of the daemon's server, else
        MpsError naming it: its kernels would not go through MPS, and the point would measure something else."""
        if self.daemon is None:
            return
        self.servers = self.daemon.servers()
        self.clients = self.daemon.check_clients(trees)
        missing = [r for r, ok in self.clients.items() if not ok]
        if missing:
            raise MpsError(f"replica(s) {', '.join(map(str, missing))} are not clients of the MPS daemon "
                           f"({self.pipe_words()}; servers {self.servers or 'none'}): their kernels would not run "
                           "through MPS")

    def pipe_words(self) -> str:
        """Where the daemon listens."""
        return f"pipe directory {self.daemon.pipe_dir}" if self.daemon is not None else "no daemon"

    def record(self) -> SharedGpu:
        """What the point's manifest keeps: the mode, the daemon and who started it, its servers, each replica's check."""
        if self.daemon is None:
            return SharedGpu(self.mode, note=self.note)
        return SharedGpu(self.mode, self.origin, self.daemon.active_thread_pct, tuple(self.servers), dict(self.clients),
                         self.note)


@contextlib.contextmanager
def sharing(mode: str | None, active_thread_pct: int | None = None) -> Iterator[Sharing | None]:
    """The sharing of one launch's replicas, for as long as they run: None without gpu_share; with MPS the suite's own
    daemon (started here, stopped at the end, on a fault or an interrupt too), or one already serving (used and left
    running); time-slicing replicas are kept off a daemon that already serves, with an empty pipe directory of their
    own (a client that finds no daemon there runs without MPS)."""
    if mode is None:
        yield None
        return
    existing = existing_daemon()
    if mode == "time_slicing":
        if not existing:
            yield Sharing(mode)
            return
        root = Path(tempfile.mkdtemp(prefix="servescope-nomps-"))
        try:
            yield Sharing(mode, {"CUDA_MPS_PIPE_DIRECTORY": str(root)},
                          note=f"an MPS daemon already serves this machine ({existing}): these replicas were kept off "
                               "it, with an empty pipe directory of their own")
        finally:
            shutil.rmtree(root, ignore_errors=True)
        return
    if existing:
        d = MpsDaemon.adopt(existing, active_thread_pct)
        yield Sharing(mode, d.client_env(), d, "already running",
                      note=f"an MPS daemon already served this machine ({existing}): the replicas used it; servescope "
                           "neither started nor stopped it")
        return
    with MpsDaemon(active_thread_pct) as d:
        yield Sharing(mode, d.client_env(), d, "servescope")
