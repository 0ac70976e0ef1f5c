"""Run a suite: execute each notebook with papermill, render HTML, and write an index with each key finding."""

from __future__ import annotations

import contextlib
import html
import os
import platform
import shlex
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import nbformat
import papermill as pm
import psutil
from jinja2 import Environment, FileSystemLoader, select_autoescape
from nbconvert import HTMLExporter

from . import summary
from .context import RUNNER_ENV
from .engines import get_engine
from .errors import KnobError, SpecError
from .experiment import DEADLINE_ENV
from .findings import Finding, Outcome, read_findings, read_outcome
from .launch import check_deployment_args, prepare
from .paths import default_reports_dir, default_store_dir
from .spec import DeploymentSpec, EngineSpec, Knobs, ModelSpec, RunnerSpec, TinyModelSpec, parse
from .store import Store
from .suite import NotebookEntry, Suite, load_suite, notebook_file
from .summary import change_html
from .threads import by_role, registry
from .util import atomic_write_text

# Statuses that mean the notebook gave no answer: the run exits non-zero when any notebook ends in one.
FAILING = ("failed", "no result")


@dataclass
class NotebookRun:
    """Outcome of one notebook in a suite run."""

    id: str
    status: str = "ok"  # ok | partial | no result | failed (see notebook_status)
    duration_s: float = 0.0
    html: str = ""
    error: str = ""  # the notebook's own exception, if it raised
    findings: list[Finding] = field(default_factory=list)
    question: str = ""
    outcome: Outcome | None = None

    @property
    def css(self) -> str:
        """CSS class of the status: green ok, amber partial / no result, red failed."""
        return {"ok": "ok", "partial": "warn", "no result": "warn"}.get(self.status, "failed")

    @property
    def first_error(self) -> str:
        """The first failed point's error (with its signal), else the notebook's own error's first line."""
        if self.outcome is not None and self.outcome.first_error:
            sig = self.outcome.first_signal
            sig = f" [{sig}]" if sig and sig not in self.outcome.first_error else ""
            return self.outcome.first_error + sig
        return self.error.splitlines()[0] if self.error else ""


def notebook_status(raised: bool, outcome: Outcome | None, findings: list[Finding]) -> str:
    """failed if the notebook raised or measured none of its points; no result if no finding states an answer;
    partial if it answered although some points failed (or, offline, are not in the store); ok otherwise."""
    if raised:
        return "failed"
    if outcome is not None:
        return outcome.status()
    return "ok" if any(f.answers for f in findings) else "no result"


@dataclass
class SuiteRun:
    """A finished suite run: where its report is, and each notebook's outcome."""

    out_dir: Path
    runs: list[NotebookRun]
    interrupted: str = ""  # 'SIGINT' or 'SIGTERM' when the run was stopped by one
    skipped: list[str] = field(default_factory=list)  # notebooks the interruption left unrun

    @property
    def exit_signal(self) -> int:
        """The signal number that stopped the run (0 if none), for the conventional exit code 128 + n."""
        return {"SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM}.get(self.interrupted, 0)

    @property
    def failing(self) -> list[NotebookRun]:
        """Notebooks that failed or gave no result."""
        return [r for r in self.runs if r.status in FAILING]


def question(nb_id: str) -> str:
    """What a notebook answers, in one line (its thread's QUESTION; '' for a notebook of the user's own)."""
    if nb_id == summary.SELF:
        return summary.QUESTION
    info = registry().get(nb_id)
    return info.question if info is not None else ""


def plan_parameters(suite: Suite, path: Path, nb_id: str, overrides: dict[str, Any], out_dir: Path,
                    store_dir: Path, offline: bool, compare_stores: Sequence[Path] = ()) -> dict[str, Any]:
    """Parameters papermill injects: suite-wide engine/model/load, the notebook's overrides, and run paths."""
    declared = pm.inspect_notebook(str(path))
    params: dict[str, Any] = {}
    suite_wide = {"engine": suite.engine, "model": suite.model, "load": suite.load, "telemetry": suite.telemetry,
                  "profile": suite.profile, "baseline": suite.baseline_knobs, "deployment": suite.deployment,
                  "store_dir": str(store_dir), "offline": offline,
                  "compare_stores": [str(c) for c in compare_stores],
                  "findings_path": str(out_dir / f"{nb_id}.findings.json"), "report_dir": str(out_dir)}
    for k, v in suite_wide.items():
        if k in declared:
            params[k] = v
    for k, v in overrides.items():
        if k not in declared:
            raise SpecError(f"suite gives parameter {k!r} to {nb_id}, which declares only: {', '.join(declared)}")
        params[k] = {**params[k], **v} if isinstance(v, dict) and isinstance(params.get(k), dict) else v
    return params


def collapse_progress(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Merge each cell's consecutive stream outputs and keep only what a terminal would show after carriage
    returns, so a progress bar appears once, in its final state, not once per update."""
    for cell in nb.cells:
        if cell.get("cell_type") != "code":
            continue
        merged: list[nbformat.NotebookNode] = []
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and merged and merged[-1].get("output_type") == "stream" \
                    and merged[-1].get("name") == out.get("name"):
                merged[-1]["text"] += out["text"]
            else:
                merged.append(out)
        for out in merged:
            if out.get("output_type") == "stream" and "\r" in out["text"]:
                lines = out["text"].replace("\r\n", "\n").split("\n")
                out["text"] = "\n".join(line.rsplit("\r", 1)[-1] for line in lines)
        cell["outputs"] = merged
    return nb


ANSWER = "## Answer"


def progress_last(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The printed output (progress, 'level written', client-health notes) of the cells before the answer, moved
    into a collapsed 'How it ran' section at the end, so that the page opens with the question and the answer; the
    executed notebook itself keeps every output where it was printed."""
    at = next((i for i, c in enumerate(nb.cells) if c.get("cell_type") == "markdown"
               and "".join(c.get("source", "")).lstrip().startswith(ANSWER)), None)
    if at is None:
        return nb
    moved: list[str] = []
    for cell in nb.cells[:at]:
        if cell.get("cell_type") != "code":
            continue
        text = "".join(o["text"] for o in cell.get("outputs", []) if o.get("output_type") == "stream")
        cell["outputs"] = [o for o in cell.get("outputs", []) if o.get("output_type") != "stream"]
        if text.strip():
            moved.append(text.rstrip("\n"))
    if moved:
        body = html.escape("\n".join(moved))
        nb.cells.append(nbformat.v4.new_markdown_cell(
            "## How it ran\nWhat the measuring cells printed while they ran (also in the executed notebook).\n\n"
            f"<details><summary>{sum(t.count(chr(10)) + 1 for t in moved)} lines of progress output</summary>"
            f"<pre>{body}</pre></details>"))
    return nb


def render_html(ipynb: Path, html_path: Path, hide_code: bool = False) -> None:
    """Self-contained HTML (images embedded) of an executed notebook, progress bars collapsed and printed progress
    moved after the evidence (progress_last)."""
    nb = progress_last(collapse_progress(nbformat.read(str(ipynb), as_version=4)))
    exporter = HTMLExporter(template_name="lab", embed_images=True, exclude_input=hide_code,
                            exclude_input_prompt=hide_code, exclude_output_prompt=hide_code)
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": ipynb.stem}})
    atomic_write_text(html_path, body.replace("</head>", PAGE_CSS + "</head>", 1))


# JupyterLab's stylesheet right-aligns every cell of an output's table (numbers' habit), which left ragged columns of
# flags and sentences; a table wider than the page ran off its edge instead of scrolling
PAGE_CSS = """<style>
:not(.jp-RenderedMarkdown).jp-RenderedHTMLCommon table td,
:not(.jp-RenderedMarkdown).jp-RenderedHTMLCommon table th { text-align: left; vertical-align: top; }
.jp-OutputArea-output.jp-RenderedHTMLCommon { overflow-x: auto; }
</style>
"""


def _error_excerpt(e: BaseException) -> str:
    """The exception's own line first (the progress line and the index show it), then the traceback's tail: cut from
    the front, a long traceback would otherwise leave the middle of a source line as the "first error"."""
    if isinstance(e, pm.PapermillExecutionError):
        tb = "\n".join(e.traceback[-6:]) if e.traceback else ""
        import re

        tb = re.sub(r"\x1b\[[0-9;]*m", "", tb)  # ANSI colours from IPython tracebacks
        head = f"{e.ename}: {e.evalue}".replace("\n", " ")[:500]
        return f"{head}\n{tb[-2000:]}"
    return f"{type(e).__name__}: {e}".replace("\n", " ")[:2500]


def check_baseline(suite: Suite) -> None:
    """Refuse, before any notebook runs, a baseline or deployment (the deployment as it runs today) this engine
    version cannot express, naming the knob and the version's reason, and deployment flags that are a knob's in
    another spelling. The engine's environment is created here where it is missing (every launch needs it anyway);
    an engine servescope does not launch has no baseline to spell."""
    deployment = parse(DeploymentSpec, suite.deployment, "deployment")
    if not suite.baseline and deployment.empty:
        return
    engine = parse(EngineSpec, suite.engine, "engine")
    adapter = get_engine(engine.name)
    if not adapter.launches:
        raise SpecError(f"baseline {suite.baseline_knobs}: an external server runs as it was started; leave baseline "
                        "and deployment empty")
    # the first launch's preparation, done here: it creates the engine's environment where it is missing
    install = prepare(engine, parse(ModelSpec, suite.model, "model"), say=lambda m: print(m, flush=True),
                      adapter=adapter).install
    sides = [("baseline", suite.baseline), ("deployment", deployment.knobs.model_dump(exclude_defaults=True))]
    for side, knobs in sides:
        for knob, value in knobs.items():
            if knob == "extra_args":
                continue
            try:
                adapter.knob_flags(Knobs(**{knob: value}), install)
            except (KnobError, SpecError) as e:
                raise SpecError(f"the suite's {side} sets {knob}={value!r}, which {engine.name} {install.version} "
                                f"cannot express: {e} (nothing was launched)") from None
    check_deployment_args(adapter, install, deployment.args)


def run_suite(
    suite_path: str | Path, only: Sequence[str] = (), offline: bool = False, hide_code: bool = False,
    reports_dir: str | Path | None = None, store_dir: str | Path | None = None, run_id: str | None = None,
    kernel_name: str | None = None, progress: bool = True, echo: TextIO | None = None, budget_s: float = 0.0,
    inputs: bool = True,
) -> SuiteRun:
    """Execute the suite's notebooks into reports/<run-id>/, render HTML, write index.html, point reports/latest at it.
    Every notebook runs even when one fails; the returned SuiteRun says which did not give an answer. echo: where the
    lines the notebooks print (their progress) go as they run; their tables stay in the notebooks and the HTML.
    budget_s (0: none): no point is launched that would not finish within it, going by the longest a point like it
    took in the store; the notebooks still run and say what they did not measure. inputs: where only picks a
    notebook that reads the run's findings (07, 99), the suite's notebooks before it that only leaves out are
    rendered offline from the store first (launching nothing), so that it reads what the suite would give it."""
    # the budget counts from here: check_baseline's first preparation (a random model: 102 s on the H100) is part of it
    t_start = time.time()
    if budget_s < 0:
        raise SpecError(f"budget_s: seconds the run may take, 0 for no limit (got {budget_s})")
    suite = load_suite(suite_path)
    files = {e.id: notebook_file(suite_path, e) for e in suite.notebooks}
    entries, from_store, readers = select_notebooks(suite, files, only, inputs)
    reports, store = Path(reports_dir or default_reports_dir()), Path(store_dir or default_store_dir())
    run_id = run_id or f"{time.strftime('%Y%m%d-%H%M%S')}-{suite.name}"
    out_dir = (reports / run_id).resolve()
    plans = {e.id: plan_parameters(suite, files[e.id], e.id, e.parameters, out_dir, store.resolve(),
                                    offline or e.id in from_store, suite.compare_stores(suite_path))
             for e in entries}
    runner = parse(RunnerSpec, suite.runner, "runner")
    if not offline:  # before anything launches: the cluster answers, the deployment is one the engine can run
        check_runner(runner)
        check_baseline(suite)
    out_dir.mkdir(parents=True, exist_ok=False)
    runs: list[NotebookRun] = []
    stop = _Interrupts()
    with stop, _for_kernels(DEADLINE_ENV, f"{t_start + budget_s:.3f}" if budget_s else ""), _for_kernels(
            RUNNER_ENV, runner.model_dump_json() if runner.kind != "local" else ""):
        for i, entry in enumerate(entries, 1):
            if stop.signal:
                break
            print(f"[{i}/{len(entries)}] {entry.id}: running" + (
                f" offline, from the store (its findings are {' and '.join(readers)}'s inputs)"
                if entry.id in from_store else ""), flush=True)
            run = _run_notebook(entry.id, files[entry.id], plans[entry.id], out_dir, stop, kernel_name, progress,
                                hide_code, echo)
            measured = run.outcome.summary() if run.outcome is not None else ""
            print(f"[{i}/{len(entries)}] {entry.id}: {run.status} in {run.duration_s:.0f} s"
                  + (f"; {measured}" if measured else "") + (f" — {run.first_error}" if run.first_error else ""),
                  flush=True)
            runs.append(run)
            Store(store).sweep_abandoned()  # a kernel that died mid-point leaves its temporary folder behind
            write_index(out_dir, suite, Path(suite_path), run_id, t_start, runs,
                        host=measured_host(store) if offline else "")
    skipped = [e.id for e in entries[len(runs):]]
    if stop.signal:
        print(f"interrupted by {stop.signal}: the report holds what ran" + (f"; not run: {', '.join(skipped)}"
                                                                            if skipped else ""), flush=True)
    write_index(out_dir, suite, Path(suite_path), run_id, t_start, runs, stop.signal, skipped,
                host=measured_host(store) if offline else "")
    _point_latest(reports, out_dir)
    print(f"report: {out_dir / 'index.html'}", flush=True)
    return SuiteRun(out_dir, runs, stop.signal, skipped)


def select_notebooks(suite: Suite, files: dict[str, Path], only: Sequence[str] = (),
                     inputs: bool = True) -> tuple[list[NotebookEntry], set[str], list[str]]:
    """The notebooks a run executes (suite order), those of them rendered offline as a picked reader's inputs, and
    the picked notebooks that read the run's findings."""
    picked = [n for n in suite.notebooks if not only or any(n.id.startswith(o) for o in only)]
    if not picked:
        raise SpecError(f"--only {list(only)} matches no notebook of the suite ({[n.id for n in suite.notebooks]})")
    readers = [e.id for e in picked if _reads_findings(files[e.id])] if only and inputs else []
    # a reader's inputs are the suite's notebooks before it; left out, it would recommend nothing and measure (or
    # search around) the deployment itself instead of the changes
    ids = [e.id for e in suite.notebooks]
    upto = max((ids.index(r) for r in readers), default=-1)
    chosen = {e.id for e in picked}
    entries = [e for i, e in enumerate(suite.notebooks) if e.id in chosen or i < upto]
    return entries, {e.id for e in entries if e.id not in chosen}, readers


def _reads_findings(path: Path) -> bool:
    """Whether a notebook reads the findings of the notebooks before it (it declares report_dir)."""
    return "report_dir" in pm.inspect_notebook(str(path))


@contextlib.contextmanager
def _for_kernels(name: str, value: str) -> Iterator[None]:
    """While the suite runs, value in the environment variable name, where the notebooks' kernels (children) read
    it; '' leaves it unset."""
    saved = os.environ.pop(name, None)
    if value:
        os.environ[name] = value
    try:
        yield
    finally:
        os.environ.pop(name, None)
        if saved is not None:
            os.environ[name] = saved


def check_runner(runner: RunnerSpec) -> None:
    """Refuse, before any notebook runs, a runner the suite cannot use: Ray not installed, or no cluster at its
    address (one line; nothing launched)."""
    if runner.kind == "ray":
        from . import raypoints

        raypoints.connect(runner)


class _Indented:
    """A notebook's printed lines, indented under its progress line (papermill's stdout_file: only the cells' stdout
    streams reach it, never a table or a figure)."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def write(self, text: str) -> None:
        """Each line as '  line'."""
        self.out.write("".join(f"  {ln}\n" for ln in text.splitlines() if ln.strip()))

    def flush(self) -> None:
        """Flush the terminal."""
        self.out.flush()


def _run_notebook(nb_id: str, file: Path, params: dict[str, Any], out_dir: Path, stop: _Interrupts,
                  kernel_name: str | None, progress: bool, hide_code: bool, echo: TextIO | None = None) -> NotebookRun:
    """Execute one notebook into out_dir, render its HTML, read its findings and outcome; a failure is kept in the
    run, never raised."""
    t0 = time.monotonic()
    run = NotebookRun(id=nb_id, question=question(nb_id))
    executed = out_dir / f"{nb_id}.ipynb"
    raised = False
    try:
        _execute(file, executed, params, kernel_name, progress, hide_code, echo, stop)
    except (Exception, KeyboardInterrupt) as e:  # a failing notebook is reported, the others still run
        raised = True
        run.error = _error_excerpt(e) if isinstance(e, Exception) else "interrupted"
    if stop.signal:
        run.error = (f"interrupted by {stop.signal}: the notebook stopped where it was; every level it had "
                     f"finished is kept in the store\n" + run.error)
    run.duration_s = time.monotonic() - t0
    if executed.exists():
        html_path = out_dir / f"{nb_id}.html"
        try:
            render_html(executed, html_path, hide_code)
            run.html = html_path.name
        except Exception as e:  # rendering trouble must not hide the measurement
            run.error += f"\n(HTML rendering failed: {type(e).__name__}: {e})"
    fpath = Path(params.get("findings_path", out_dir / f"{nb_id}.findings.json"))
    if fpath.is_file() and not (stop.signal and raised):
        run.findings = read_findings(fpath)
        run.outcome = read_outcome(fpath)
    run.status = notebook_status(raised, run.outcome, run.findings)
    return run


# jupyter_client picks a kernel's ports free, then the kernel binds them: another process may take one between
# (pytest workers starting kernels at once did: "Address already in use", the kernel dead before it replied), so a
# kernel that never started is started again; nothing of the notebook ran
_NEVER_STARTED = "Kernel died before replying to kernel_info"
_KERNEL_STARTS = 3


def _execute(file: Path, executed: Path, params: dict[str, Any], kernel_name: str | None, progress: bool,
             hide_code: bool, echo: TextIO | None, stop: _Interrupts) -> None:
    """papermill over one notebook, on a fresh kernel where the last one died before it started (not after an
    interrupt: the run is stopping)."""
    for start in range(1, _KERNEL_STARTS + 1):
        try:
            pm.execute_notebook(str(file), str(executed), parameters=params, cwd=str(file.parent),
                                kernel_name=kernel_name, progress_bar=progress, log_output=False,
                                report_mode=hide_code, stdout_file=_Indented(echo) if echo is not None else None,
                                # the kernel's own log went to the terminal between the progress lines: a warning
                                # per notebook ("running over TCP without encryption") and, now and then, an error
                                # from the SIGINT jupyter_client sends every kernel it shuts down; a kernel that
                                # dies is told by nbclient, in the notebook's failure
                                extra_arguments=["--IPKernelApp.log_level=CRITICAL"],
                                # live, the executed notebook is saved after every cell (a run's progress can be
                                # opened while it measures); offline a cell takes a fraction of a second, and those
                                # saves were 11% of a suite's render (5 of 46 s, 493 writes of notebooks with plots)
                                request_save_on_cell_execute=not params.get("offline", False))
            return
        except RuntimeError as e:
            if _NEVER_STARTED not in str(e) or start == _KERNEL_STARTS or stop.signal:
                raise
            print(f"  its kernel died before it started (start {start} of {_KERNEL_STARTS}); starting another",
                  file=echo or sys.stdout, flush=True)


class _Interrupts:
    """While a suite runs: Ctrl-C or SIGTERM interrupts the notebook's kernel (as JupyterLab's interrupt does), so
    the cell stops, the server tree is torn down and finished levels stay stored; the run then writes the report of
    what exists and stops. A kernel that has not stopped after grace_s is killed (its servers' reapers then take
    them down); a second signal kills it at once."""

    def __init__(self, grace_s: float = 20.0) -> None:
        self.signal = ""
        self.grace_s = grace_s
        self._saved: dict[int, Any] = {}
        self._timer: threading.Timer | None = None

    def __enter__(self) -> _Interrupts:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._saved[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, h in self._saved.items():
            signal.signal(sig, h)
        if self._timer is not None:
            self._timer.cancel()

    def _on_signal(self, signum: int, _frame: Any) -> None:
        first = not self.signal
        self.signal = self.signal or signal.Signals(signum).name
        kernels = _kernel_processes()
        if first:
            print(f"\n{self.signal}: interrupting the running notebook (again to stop at once)", flush=True)
            for k in kernels:
                with contextlib.suppress(psutil.Error):
                    k.send_signal(signal.SIGINT)
            self._timer = threading.Timer(self.grace_s, _kill, args=(kernels,))
            self._timer.daemon = True
            self._timer.start()
        else:
            _kill(kernels)


def _kernel_processes() -> list[psutil.Process]:
    """The notebook kernels this process started (papermill's ipykernel children)."""
    out = []
    for c in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if any("ipykernel" in part for part in c.cmdline()):
                out.append(c)
    return out


def _kill(procs: list[psutil.Process]) -> None:
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()


def measured_host(store_dir: Path) -> str:
    """Where a store's points were measured (Store.measured_where): what an offline render's front page names, since
    the machine rendering it measured nothing ('' for an empty store)."""
    where = Store(store_dir).measured_where()
    if not where:
        return ""
    gpus = f", {where['gpus']} x {where['gpu']}" if where.get("gpu") else ""
    return (f"{where['host']} ({where['platform']}, {where['cpus']} CPUs{gpus}), where {where['points']} of the "
            "store's points were measured; rendered offline")


def write_index(out_dir: Path, suite: Suite, suite_path: Path, run_id: str, t_start: float,
                runs: list[NotebookRun], interrupted: str = "", skipped: Sequence[str] = (),
                host: str = "") -> None:
    """The front page (index.html) of a run's report folder, from its notebooks' runs; host: where the figures were
    measured (default: this machine)."""
    env = Environment(loader=FileSystemLoader(str(Path(__file__).with_name("templates"))),
                      autoescape=select_autoescape(["html", "j2"]))
    env.filters["shell"] = shlex.join  # flags as pasted into a shell
    by_thread = {r.id: r.findings for r in runs if r.id != summary.SELF}
    ranked = summary.rank(by_thread)
    html_of = {r.id: r.html for r in runs}
    recs = summary.recommendations(ranked).to_dict("records")
    for rec in recs:  # a link only where the thread's HTML exists
        rec["href"] = rec["evidence"] if html_of.get(rec["thread"]) else ""
        rec["change_html"] = change_html(rec["change"])
    optimal = ranked[ranked["tier"] == "Already optimal"]
    # one entry per thread, its headline where that is among them: the headline already says what its comparisons found
    optimal = optimal.assign(_head=optimal["order"] == 0).sort_values("_head", ascending=False, kind="stable") \
        .drop_duplicates("thread").sort_index().drop(columns="_head").to_dict("records")
    verify, environment = by_role("verification").id, by_role("environment").id
    checked = by_thread.get(verify)
    verified = summary.front_line(checked) if checked else \
        f"Not verified: this run did not measure the recommended changes together ({verify} did not run)"
    # the release that ran, as 00 read it back (a suite of servescope's own environment names none)
    ran = next((f.evidence["engine"] for f in by_thread.get(environment, [])
                if isinstance(f.evidence.get("engine"), dict)), None)
    docs = sorted(p.name for p in (out_dir / "changes").glob("*.md")) if (out_dir / "changes").is_dir() else []
    page = env.get_template("index.html.j2").render(
        recs=recs, optimal=optimal, change_html=change_html, verified=verified, documents=docs,
        verified_href=f"{verify}.html#Answer" if html_of.get(verify) else "",
        regime=summary.regime(by_thread) if by_thread else "",
        summary_html=html_of.get(summary.SELF, ""), tiers=ranked["tier"].value_counts().to_dict(),
        suite=suite, suite_path=str(suite_path), run_id=run_id, rows=runs, interrupted=interrupted, skipped=skipped,
        started=time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t_start)), total_s=time.time() - t_start,
        engine_line=engine_words(suite.engine, ran), model_line=model_words(suite.model), toy=toy_words(suite.model),
        host=host or f"{socket.gethostname()} ({platform.machine()}, {os.cpu_count()} CPUs)")
    atomic_write_text(out_dir / "index.html", page)


def engine_words(engine: dict[str, Any], ran: dict[str, Any] | None = None) -> str:
    """The suite's engine as the page's header says it: name and version (with the release that ran, ran: what 00
    read back, where the suite named none or another), then what else the suite set, in words."""
    name = engine.get("name") or "vllm"
    head = " ".join([name, *([str(engine["version"])] if engine.get("version") else [])])
    ran = ran or {}
    if ran.get("version") and (ran["version"] != engine.get("version") or ran.get("distribution", name) != name):
        # the suite named no release (servescope's own environment) or another build: what 00 read back
        head += f" (ran {ran.get('distribution') or name} {ran['version']}" + \
            (f", {ran['platform']})" if ran.get("platform") else ")")
    said = {"args": lambda v: "args " + shlex.join(v),
            "env": lambda v: "env " + " ".join(f"{n}={x}" for n, x in v.items()),
            "url": lambda v: f"at {v} (running already, nothing launched)"}
    rest = [said.get(k, lambda v, k=k: f"{k} {v}")(v) for k, v in engine.items()
            if k not in ("name", "version") and v not in (None, "", [], {}, ())]
    return "; ".join([head, *rest])


def model_words(model: dict[str, Any]) -> str:
    """The suite's model in words: a path as given, a generated one by its shape (defaults filled in, as served), an
    architecture alone by its size and what its random weights mean."""
    if model.get("architecture"):
        from .architectures import describe

        try:
            words = describe(model["architecture"])
        except SpecError:
            words = f"random weights of the {model['architecture']} architecture"
        return words + (f"; served as {model['served_name']}" if model.get("served_name") else "")
    if model.get("tiny") is None:
        return "; ".join(f"{k} {v}" for k, v in model.items() if v is not None)
    t = TinyModelSpec(**model["tiny"])
    words = (f"random-weight Qwen3-MoE generated locally: {t.num_layers} layers, hidden {t.hidden_size}, "
             f"{t.num_attention_heads} heads ({t.num_key_value_heads} KV, dim {t.head_dim}), {t.num_experts} experts "
             f"top-{t.top_k} (expert FFN {t.moe_intermediate_size}), vocab {t.vocab_size}, {t.dtype}, seed {t.seed}")
    return words + (f"; served as {model['served_name']}" if model.get("served_name") else "")


# the real-size reference a toy's front page points to
REAL_SIZE = "data/reference/sglang-qwen3-30b"


def toy_words(model: dict[str, Any]) -> str:
    """What a front page says first where its model is a generated toy ('' for any other model): its size, and that
    its effects are mostly launch overhead that will not transfer."""
    if model.get("tiny") is None:
        return ""
    t = TinyModelSpec(**model["tiny"])
    return (f"The model is a random-weight toy of {t.num_layers} layers (hidden {t.hidden_size}) generated here: the "
            "effect sizes below are mostly launch overhead and the KV cache stays nearly empty, so they will not "
            f"transfer to a real deployment. {REAL_SIZE} is the seed's case at real size.")


def _point_latest(reports: Path, out_dir: Path) -> None:
    """reports/latest -> this run, replaced atomically so it is never missing or half-made."""
    link = reports / "latest"
    tmp = reports / f".latest-{os.getpid()}"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(out_dir.name)
    os.replace(tmp, link)
