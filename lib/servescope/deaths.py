"""Name the signal a server process died from, say what it usually means, and show the line that proves it.

Sources, strongest first: the root's own exit status (a negative return code is a signal), the lines engines and
Python write when a process of theirs dies (vLLM's `died unexpectedly (exit code: -4)`, multiprocessing's
`exitcode=-SIGKILL`, faulthandler's `Fatal Python error: Illegal instruction`, a shell's `Killed`), and for
SIGKILL the kernel's OOM record (cgroup `memory.events`, the kernel log) where this host lets us read it.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# What a signal usually means when it ends a serving process; the first clause is the headline.
MEANINGS: dict[str, str] = {
    "SIGILL": "illegal instruction: the process ran an instruction this CPU or VM refuses (a build for a newer "
              "instruction set, or AMX tiles used without the Linux permission a process must ask for first)",
    "SIGKILL": "killed outright: most often the kernel's out-of-memory killer, otherwise someone ran kill -9 "
               "(or a container limit was hit)",
    "SIGSEGV": "segmentation fault: a native kernel or extension read or wrote memory it does not own",
    "SIGBUS": "bus error: a memory-mapped file shrank or shared memory (/dev/shm) ran out",
    "SIGFPE": "arithmetic fault in native code (integer division by zero)",
    "SIGABRT": "aborted: a native library hit a failed assertion or an uncaught C++ exception",
    "SIGTERM": "terminated by a request to stop (from outside the server)",
    "SIGINT": "interrupted (Ctrl-C)",
    "SIGHUP": "its terminal or parent session went away",
    "SIGPIPE": "wrote to a pipe or socket whose reader had gone",
}
# faulthandler's words for the signals it catches
_FAULTHANDLER = {"Illegal instruction": "SIGILL", "Segmentation fault": "SIGSEGV", "Bus error": "SIGBUS",
                 "Floating-point exception": "SIGFPE", "Floating point exception": "SIGFPE", "Aborted": "SIGABRT"}
# a shell's words when a child dies from a signal
_SHELL = {"Illegal instruction": "SIGILL", "Segmentation fault": "SIGSEGV", "Bus error": "SIGBUS", "Killed": "SIGKILL",
          "Aborted": "SIGABRT", "Floating point exception": "SIGFPE"}

_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    # vLLM: "Worker proc VllmWorker-0 died unexpectedly (exit code: -4)"; "Process X (PID: 12) died with exit code -9"
    ("exit-code", re.compile(r"(?:(?:proc|process)\s+(?P<who>[\w.\-]+).{0,40}?)?(?:died|exited|terminated|failed)"
                             r"[^\n]{0,40}?exit\s*code[:=]?\s*\(?(?P<code>-\d+)", re.IGNORECASE)),
    # multiprocessing reprs: "exitcode=-SIGKILL" / "exitcode=-9"
    ("exitcode", re.compile(r"(?:name='(?P<who>[^']+)'[^\n]*?)?exitcode=(?P<code>-(?:\d+|SIG[A-Z]+))")),
    # vLLM: "Failed core proc(s): {'EngineCore_DP0': -9}"
    ("proc-dict", re.compile(r"proc\(s\):\s*\{[^}]*?'(?P<who>[^']+)':\s*(?P<code>-\d+)")),
    ("faulthandler", re.compile(r"Fatal Python error: (?P<words>" + "|".join(map(re.escape, _FAULTHANDLER)) + r")")),
    # "Illegal instruction (core dumped)", "bash: line 1:  4242 Killed      python ...", "/bin/sh: 1: Killed";
    # strict, because engines log words like "Aborted request ..." all the time
    ("shell", re.compile(r"^(?:\S+: (?:line )?\d+: )?(?:\s*\d+\s+)?(?P<words>" + "|".join(map(re.escape, _SHELL))
                         + r")(?: \(core dumped\))?(?:\s{2,}\S.*)?\s*$")),
]


@dataclass
class ProcessDeath:
    """One process of a server tree that died from a signal, with the evidence."""

    signal: str  # 'SIGILL'
    signum: int
    meaning: str
    process: str = ""  # its name as the evidence gives it ('VllmWorker-0', 'server root')
    evidence: str = ""  # the log line (or exit status) that shows it
    where: str = ""  # for faulthandler dumps: the innermost Python frame of the crashing thread
    oom: str = ""  # for SIGKILL: the kernel's OOM record, or why it could not be read
    line_no: int = 0  # where the log shows it (0: the root's exit status, seen after every line)

    def headline(self) -> str:
        """'VllmWorker-0 died from SIGILL (illegal instruction)'."""
        who = self.process or "a server process"
        return f"{who} died from {self.signal} ({self.meaning.split(':')[0]})"

    def text(self) -> str:
        """Headline, meaning, evidence line and where, as a few lines for errors and reports."""
        lines = [f"{self.headline()}: {self.meaning.split(': ', 1)[-1]}."]
        if self.evidence:
            lines.append(f"log: {self.evidence}")
        if self.where:
            lines.append(f"at: {self.where}")
        if self.oom:
            lines.append(f"kernel OOM record: {self.oom}")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        """Plain dict for manifests and error tables."""
        return asdict(self)


def signal_name(code: int | str) -> tuple[str, int] | None:
    """('SIGILL', 4) for -4, 4, 'SIGILL' or '-SIGILL'; None for anything that is not a signal."""
    if isinstance(code, str):
        s = code.lstrip("-")
        if s.startswith("SIG"):
            with contextlib.suppress(ValueError, AttributeError):
                return s, int(getattr(signal, s))
            return None
        try:
            code = int(code)
        except ValueError:
            return None
    n = abs(int(code))
    if n == 0:
        return None
    try:
        return signal.Signals(n).name, n
    except ValueError:
        return f"signal {n}", n


def make_death(code: int | str, process: str = "", evidence: str = "", where: str = "",
               line_no: int = 0) -> ProcessDeath | None:
    """A ProcessDeath for a signal number or name, with its usual meaning."""
    named = signal_name(code)
    if named is None:
        return None
    name, num = named
    return ProcessDeath(signal=name, signum=num, meaning=MEANINGS.get(name, "ended by a signal"), process=process,
                        evidence=evidence.strip()[:400], where=where, line_no=line_no)


def deaths_in_log(text: str) -> list[ProcessDeath]:
    """Every signal death a server log shows, in order, one per (process, signal)."""
    out: list[ProcessDeath] = []
    seen: set[tuple[str, str]] = set()
    lines = text.splitlines()
    for i, line in enumerate(lines):
        for kind, pat in _PATTERNS:
            m = pat.search(line)
            if not m:
                continue
            gd = m.groupdict()
            if kind in ("faulthandler", "shell"):
                table = _FAULTHANDLER if kind == "faulthandler" else _SHELL
                d = make_death(table[gd["words"]], "", line, _innermost_frame(lines, i) if kind == "faulthandler" else "",
                               i + 1)
            else:
                d = make_death(gd["code"], gd.get("who") or "", line, line_no=i + 1)
            if d is None or d.signal in ("SIGTERM", "SIGINT") and _teardown_line(line):
                continue
            key = (d.process, d.signal)
            if key in seen:
                continue
            seen.add(key)
            out.append(d)
            break
    return _merge(out)


def _teardown_line(line: str) -> bool:
    return "shutting down" in line.lower() and "unexpectedly" not in line.lower()


def _innermost_frame(lines: list[str], i: int) -> str:
    """faulthandler prints every thread's stack, innermost frame first; the crashing one is 'Current thread'."""
    block = lines[i + 1:i + 400]
    start = next((j for j, line in enumerate(block) if line.startswith("Current thread")), None)
    for line in block[start + 1:] if start is not None else []:
        m = re.search(r'File "([^"]+)", line (\d+) in (\S+)', line)
        if m:
            return f"{m.group(1).split('site-packages/')[-1]}:{m.group(2)} in {m.group(3)}"
        if not line.strip():
            break
    return ""


def _merge(deaths: list[ProcessDeath]) -> list[ProcessDeath]:
    """A faulthandler dump names the signal and the frame but no process; an engine line names the process:
    the same signal seen both ways is one death."""
    named = [d for d in deaths if d.process]
    anon = [d for d in deaths if not d.process]
    out = list(named)
    for a in anon:
        twin = next((d for d in out if d.signal == a.signal and not d.where), None)
        if twin is not None:
            twin.where = twin.where or a.where
            twin.evidence = twin.evidence or a.evidence
            continue
        if any(d.signal == a.signal for d in out):
            continue
        out.append(a)
    order = {id(d): i for i, d in enumerate(deaths)}
    return sorted(out, key=lambda d: order.get(id(d), 0))


# -- OOM evidence ------------------------------------------------------------------------------------------------
def _cgroup_dir() -> Path | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return Path("/sys/fs/cgroup") / line[3:].lstrip("/")
    return None


def oom_kill_count() -> int | None:
    """The cgroup v2 oom_kill counter of this process's cgroup (None where it cannot be read)."""
    d = _cgroup_dir()
    if d is None:
        return None
    with contextlib.suppress(OSError, ValueError):
        for line in (d / "memory.events").read_text().splitlines():
            k, _, v = line.partition(" ")
            if k == "oom_kill":
                return int(v)
    return None


def kernel_oom_lines(pids: set[int] | None = None) -> tuple[list[str], str]:
    """The kernel log's OOM-kill lines (for pids, when given) and '' or why the kernel log could not be read."""
    try:
        res = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired) as e:
        return [], f"dmesg could not run: {e}"
    if res.returncode != 0:
        return [], f"the kernel log is not readable here ({res.stderr.strip()[:120] or f'dmesg exit {res.returncode}'})"
    hits = []
    for line in res.stdout.splitlines():
        m = re.search(r"(?:Out of memory|oom-kill|Memory cgroup out of memory).*?[Kk]illed process (\d+)", line)
        if m and (not pids or int(m.group(1)) in pids):
            hits.append(line.strip())
    return hits, ""


def oom_record(pids: set[int] | None, oom_kills_before: int | None) -> str:
    """What the kernel says about an OOM kill of one of pids, or why that cannot be known here."""
    lines, why = kernel_oom_lines(pids)
    if lines:
        return lines[-1][:300]
    after = oom_kill_count()
    if oom_kills_before is not None and after is not None and after > oom_kills_before:
        return f"the cgroup's oom_kill counter rose by {after - oom_kills_before} while the server ran"
    parts = [why] if why else ["no OOM-kill line for these processes in the kernel log"]
    if after is None:
        parts.append("cgroup memory.events not readable")
    elif oom_kills_before is not None:
        parts.append("the cgroup's oom_kill counter did not change")
    return "; ".join(parts)


@dataclass
class TreeWatch:
    """What a server tree looked like while it ran, for naming the dead afterwards."""

    pids: dict[int, str] = field(default_factory=dict)  # pid -> name, every process ever seen in the tree
    oom_kills_at_start: int | None = None

    def update(self, root_pid: int) -> None:
        """Record the tree's current processes (cheap: one /proc walk)."""
        import psutil

        with contextlib.suppress(psutil.Error):
            root = psutil.Process(root_pid)
            for p in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    self.pids.setdefault(p.pid, p.name())


def explain(returncode: int | None, log_text: str, watch: TreeWatch | None = None) -> list[ProcessDeath]:
    """Every signal death of a server tree: the root's (from its return code) and any its log shows."""
    deaths = deaths_in_log(log_text)
    if returncode is not None and returncode < 0:
        root = make_death(returncode, "server root process", f"exit status {returncode} (Popen.returncode)")
        if root is not None and not any(d.signal == root.signal for d in deaths):
            deaths.insert(0, root)
    for d in deaths:
        if d.signal == "SIGKILL":
            d.oom = oom_record(set(watch.pids) if watch else None, watch.oom_kills_at_start if watch else None)
    return deaths


def first_death_text(deaths: list[ProcessDeath]) -> str:
    """The first death as text, or ''."""
    return deaths[0].text() if deaths else ""


def env_for_python_servers() -> dict[str, str]:
    """Environment that makes any Python process of a server print the fatal signal and its frame on SIGILL,
    SIGSEGV, SIGBUS, SIGFPE and SIGABRT (faulthandler), so a dead worker leaves a line naming its death."""
    return {"PYTHONFAULTHANDLER": os.environ.get("PYTHONFAULTHANDLER", "1")}


# -- the engine's own exception, and who tore the tree down -------------------------------------------------------
# a log line's prefix before the traceback's own text: vLLM's "(EngineCore_DP0 pid=7) ERROR 12-01 01:20:54 [x.py:1] "
_PREFIX = re.compile(r"^(?:\((?P<who>[\w.\-]+) pid=\d+\) )?(?:[A-Z]+ \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]*\] )?")
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>\S+)')
_EXC = re.compile(r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Fault|Failure|Timeout|Warning))"
                  r"(?::\s?(?P<msg>.*))?$")
_TRACEBACK = "Traceback (most recent call last):"
_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")


# torch.compile's own code: Dynamo traces the engine's Python, Inductor and AOTAutograd compile what it caught
COMPILER_FRAMES = ("torch/_dynamo/", "torch/_inductor/", "torch/_functorch/")


@dataclass
class EngineException:
    """An exception a server process raised, as its log shows it: type, message, the innermost frame in the engine's
    own code (and overall), and which process raised it where the log says."""

    type: str
    message: str
    frame: str = ""  # innermost frame inside the engine's package: 'sglang/srt/x.py:12 in replay'
    innermost: str = ""  # innermost frame overall (may be torch's)
    process: str = ""  # 'Scheduler', 'EngineCore_DP0'
    line_no: int = 0

    def headline(self) -> str:
        """'the Scheduler raised ValueError: Invalid forward mode ... (sglang/srt/x.py:12 in replay)'."""
        who = f"the {self.process}" if self.process else "a server process"
        where = f" ({w})" if (w := self.where()) else ""
        return f"{who} raised {self.said()[:300]}{where}"

    def where(self) -> str:
        """The engine's own frame, and the library frame that raised beneath it where that is another package's:
        inside torch.compile, the fault is the compiler's on that call of the engine, not the engine's code."""
        if not self.frame or not self.innermost or self.innermost == self.frame:
            return self.frame or self.innermost
        if self.innermost.startswith(COMPILER_FRAMES):
            return f"{self.innermost}, inside torch.compile compiling the call at {self.frame}"
        return f"{self.innermost}, called from {self.frame}"

    def said(self) -> str:
        """'ValueError: Invalid forward mode ...', or 'AssertionError (no message)' for a bare assert."""
        return f"{self.type}: {self.message}" if self.message.strip() else f"{self.type} (no message)"

    def as_dict(self) -> dict[str, Any]:
        """Plain dict for manifests and error tables."""
        return asdict(self)


def _short_path(path: str, package: str = "") -> str:
    for cut in ("site-packages/", "dist-packages/"):
        if cut in path:
            return path.split(cut, 1)[1]
    if package and f"/{package}/" in path:  # a site folder of its own (PYTHONPATH): from the package on
        return package + "/" + path.rsplit(f"/{package}/", 1)[1]
    return path


def exceptions_in_log(text: str, package: str = "", raisers: list[re.Pattern[str]] | None = None) -> list[EngineException]:
    """Every traceback's exception in a server log, in order (a chain of exceptions counts once: the one that
    propagated), with the innermost frame inside package (the engine's own code) and who raised it: the process
    named in the line's prefix (vLLM) or by a raiser pattern on the traceback's line (SGLang's
    'Scheduler hit an exception')."""
    lines = text.splitlines()
    out: list[EngineException] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if _TRACEBACK not in line:
            i += 1
            continue
        who = (_PREFIX.match(line).group("who") or "") if _PREFIX.match(line) else ""  # type: ignore[union-attr]
        for rx in raisers or []:
            m = rx.search(line) or (rx.search(lines[i - 1]) if i else None)
            if m and m.groupdict().get("who"):
                who = m.group("who")
        start, frames, exc, j = i, [], None, i + 1
        while j < len(lines) and j < i + 400:
            body = _PREFIX.sub("", lines[j], count=1)
            fm = _FRAME.search(body)
            if fm:
                frames.append(fm)
            elif (em := _EXC.match(body.strip())) and not body.startswith((" ", "\t")):
                exc = em
                nxt = " ".join(_PREFIX.sub("", x, count=1) for x in lines[j + 1:j + 3])
                if not any(c in nxt for c in _CHAINED):
                    break
                frames = []  # the chain goes on: what propagated is the later one
            j += 1
        if exc is not None:
            inner = frames[-1] if frames else None
            own = next((f for f in reversed(frames) if package and f"/{package}/" in f.group("file")), None)
            fmt = lambda f: f"{_short_path(f.group('file'), package)}:{f.group('line')} in {f.group('fn')}" \
                if f else ""  # noqa: E731
            out.append(EngineException(exc.group("type").rsplit(".", 1)[-1], (exc.group("msg") or "").strip(),
                                       fmt(own), fmt(inner), who, start + 1))
        i = max(j, i + 1)
    return out


@dataclass
class DeathCause:
    """Why a server tree ended, as far as its log and exit status tell: the first failure (an exception the engine
    raised, or a process killed by a signal) and who tore the rest down: the engine itself after a child failed
    ('engine'), or something outside it (the kernel's OOM killer, a kill, a timeout: 'outside')."""

    exception: EngineException | None = None
    first_death: ProcessDeath | None = None  # the first process the log shows dying from a signal, where that came first
    teardown: str = ""  # 'engine' | 'outside' | ''
    teardown_evidence: str = ""
    stage: str = ""  # where in its startup the server was, as its log shows ('during the prefill CUDA-graph capture')

    def headline(self) -> str:
        """The cause in one sentence."""
        if self.first_death is not None:
            head = self.first_death.headline()
        elif self.exception is not None:
            head = self.exception.headline()
        else:
            return ""
        if self.teardown == "engine":
            head += "; the engine then killed its own process tree, so the signals that followed are its teardown, " \
                    "not the cause"
        return head

    def text(self) -> str:
        """Headline and the evidence lines: the first death's own lines (log line, frame), the engine's exception
        and where it was raised, who tore the tree down."""
        lines = [self.headline()]
        if self.first_death is not None:
            lines += self.first_death.text().splitlines()[1:]
            if self.exception is not None:
                lines.append(f"then: {self.exception.headline()}")
        elif self.exception is not None and self.stage:
            lines.append(f"when: {self.stage}")
        if self.teardown_evidence:
            lines.append(f"teardown: {self.teardown_evidence}")
        return "\n".join(x for x in lines if x)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DeathCause:
        """The cause as as_dict wrote it (a failed point's manifest)."""
        exc, first = d.get("exception"), d.get("first_death")
        return cls(exception=EngineException(**exc) if exc else None, first_death=ProcessDeath(**first) if first else None,
                   teardown=d.get("teardown", ""), teardown_evidence=d.get("teardown_evidence", ""),
                   stage=d.get("stage", ""))

    def as_dict(self) -> dict[str, Any]:
        """Plain dict for manifests."""
        return {"exception": self.exception.as_dict() if self.exception else None,
                "first_death": self.first_death.as_dict() if self.first_death else None,
                "teardown": self.teardown, "teardown_evidence": self.teardown_evidence, "stage": self.stage,
                "headline": self.headline()}


def recorded_error_line(manifest: dict[str, Any]) -> str:
    """A failed attempt's first error line ('' where it has none), its cause worded as this version words it (where
    it was raised, ...), not as the version that recorded it did."""
    first = str(manifest.get("error", "")).splitlines()[0] if manifest.get("error") else ""
    stored = (manifest.get("cause") or {}).get("headline") or ""
    now = DeathCause.from_dict(manifest["cause"]).headline() if stored else ""
    return first.replace(stored, now) if now else first


def cause_of(text: str, deaths: list[ProcessDeath], package: str = "", teardown: list[re.Pattern[str]] | None = None,
             raisers: list[re.Pattern[str]] | None = None, killed_by_us: str = "") -> DeathCause | None:
    """The cause of a server tree's end from its log (text: stdout then stderr), the signal deaths found in it and
    its exit status: the earliest of the engine's exceptions and the signal deaths the log shows is the first
    failure; an engine teardown line (the adapter's patterns) after it says the engine killed its own tree, else a
    SIGKILL or SIGTERM of the root came from outside (killed_by_us: the suite's own reason, e.g. a timeout). None
    where the log and status show nothing."""
    excs = exceptions_in_log(text, package, raisers)
    logged = [d for d in deaths if d.line_no]
    first_exc = excs[0] if excs else None
    first_sig = min(logged, key=lambda d: d.line_no) if logged else None
    cause = DeathCause()
    if first_sig is not None and (first_exc is None or first_sig.line_no < first_exc.line_no):
        cause.first_death, cause.exception = first_sig, first_exc
    elif first_exc is not None:
        cause.exception = first_exc
    first = min([x.line_no for x in (first_exc, first_sig) if x is not None], default=0)
    for i, line in enumerate(text.splitlines(), 1):
        if i >= first and any(rx.search(line) for rx in teardown or []):
            cause.teardown, cause.teardown_evidence = "engine", line.strip()[:300]
            break
    root = next((d for d in deaths if not d.line_no), None)
    if not cause.teardown and root is not None and root.signal in ("SIGKILL", "SIGTERM", "SIGINT"):
        cause.teardown = "outside"
        cause.teardown_evidence = killed_by_us or (f"the root died from {root.signal} with no engine teardown line"
                                                   + (f"; kernel OOM record: {root.oom}" if root.oom else ""))
    if cause.exception is None and cause.first_death is None and not cause.teardown:
        return None
    return cause
