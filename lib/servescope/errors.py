"""The library's own errors, so callers can tell a bad input from a dead server."""

from __future__ import annotations

from typing import Any


class ServescopeError(Exception):
    """Base of every error the library raises on purpose."""


class SpecError(ServescopeError, ValueError):
    """The input (suite, parameters, knobs) is invalid; raised before anything is launched."""


class UnknownEngineError(SpecError):
    """No engine adapter is registered under that name."""


class KnobError(SpecError):
    """An intent the installed engine version cannot express."""


class EngineEnvError(ServescopeError):
    """The engine's virtual environment could not be created."""


class ServerError(ServescopeError):
    """A server failed to start, died, or could not be torn down cleanly; deaths names any process of its tree that
    died from a signal (servescope.deaths.ProcessDeath), first one first."""

    def __init__(self, message: str, log_tail: str = "", deaths: list | None = None, cause: Any = None) -> None:
        self.deaths = list(deaths or [])
        self.cause = cause  # servescope.deaths.DeathCause: the engine's own exception and who tore the tree down
        said = cause.headline() if cause is not None else ""
        head = f"{message}: {said}" if said else f"{message}: {self.deaths[0].headline()}" if self.deaths else message
        body = f"\n{cause.text()}" if said else ""
        body += "".join(f"\n{d.text()}" for d in self.deaths[:3])
        super().__init__(head + body + (f"\n--- server log tail ---\n{log_tail}" if log_tail else ""))
        self.log_tail = log_tail

    @property
    def signal(self) -> str:
        """Name of the first fatal signal ('SIGILL'), or ''."""
        return self.deaths[0].signal if self.deaths else ""


class ServerExitedError(ServerError):
    """The server process exited before it became ready."""


class ServerDiedError(ServerError):
    """A process of the server's tree died (or the server exited) after it was ready: what it served is suspect."""


class ServerStartTimeout(ServerError):
    """The server did not become ready within the startup timeout."""


class PortInUseError(ServerError):
    """The port is taken (before launch) or still taken after teardown."""


class LevelFailedError(ServescopeError):
    """A load level did not measure what it was asked (too many failed requests): the point is not complete."""


class HungError(ServescopeError):
    """The server stopped producing tokens with requests in flight for longer than the hang limit."""


class NotMeasuredError(ServescopeError):
    """Offline rendering asked for a point the store does not hold."""


class NotLaunchedError(NotMeasuredError):
    """The run's budget (servescope run --budget-s) would end before this point could finish: it was not launched, and
    a later run launches it (a launch cut short by the budget would measure nothing and spend its time)."""


# the error types of points asked for and not measured, which are not failures of their configuration
UNMEASURED = (NotMeasuredError.__name__, NotLaunchedError.__name__)


class ProfilingUnavailable(ServescopeError):
    """A profiler cannot run here (no nsys, no GPU, no hook in the engine); the message says why."""


class RecordedFailure(ServescopeError):
    """A configuration whose earlier attempt (kept in the store's _failed/) died before it was ready with the engine's
    own exception: not launched again (a forced run retries it); carries that attempt's cause."""

    def __init__(self, message: str, cause: Any, recorded: str, before_ready: bool = True) -> None:
        super().__init__(message)
        self.cause, self.recorded, self.before_ready, self.deaths = cause, recorded, before_ready, []
