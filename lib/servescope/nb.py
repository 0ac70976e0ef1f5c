"""Small display helpers for notebooks: each returns something Jupyter renders."""

from __future__ import annotations

import html
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from IPython.display import HTML, Markdown, display
from pandas.io.formats.style import Styler

from .analysis.kernels import bare_name
from .analysis.telemetry import disagreements
from .context import RunContext
from .context import context as _context
from .errors import ServescopeError
from .experiment import Results
from .findings import Finding, Outcome, write_findings, write_outcome
from .probes.run import Failed, ProbeRun
from .study import Study
from .summary import change_html, each_change_once
from .util import atomic_write_text, rep_label

# long words (a verdict's "because", a flag list) wrap in the HTML report instead of ending in "..."
pd.set_option("display.max_colwidth", 400)


def context(*args: Any, **kwargs: Any) -> RunContext:
    """The run context of a notebook (servescope.context.context's parameters), its load's 'kv' level read from the
    engine: the store's note, else the deployment's own launch (kvlevel)."""
    from .kvlevel import resolve

    ctx = _context(*args, **kwargs)
    return resolve(ctx, say=print if ctx.progress else lambda m: None)


def frame_html(df: pd.DataFrame) -> str:
    """A DataFrame as a page shows it (table_or): no row numbers (an index that means something becomes columns),
    no all-empty columns, words from the left and numbers right; an empty one as a line of words."""
    shown = df if isinstance(df.index, pd.RangeIndex) and df.index.names == [None] else \
        df.reset_index(allow_duplicates=True)
    if not shown.columns.is_unique:  # a Styler refuses repeated names: pandas' own table then
        return df.to_html()
    table = table_or(shown, "")
    if not isinstance(table, Styler):  # no rows: said in words, never as pandas' "Empty DataFrame" repr
        return '<p class="servescope-empty"><em>No rows here (the text above says when that happens).</em></p>'
    rows = pd.get_option("display.max_rows")  # a long kernel list stays as long as pandas would show it
    return table.to_html(max_rows=rows) if len(shown) > rows else table.to_html()


def use_page_tables(shell: Any = None) -> None:
    """Every DataFrame a notebook shows (threads return them bare: gs.modes, ps.table()) renders as frame_html; a
    no-op outside IPython."""
    from IPython import get_ipython

    shell = shell or get_ipython()
    if shell is not None:
        shell.display_formatter.formatters["text/html"].for_type(pd.DataFrame, frame_html)


def show_findings(findings: list[Finding], path: str | Path, res: Results | None = None, thread: str = "",
                  outcome: Outcome | None = None, table_after: int | None = None) -> Markdown:
    """Write the findings JSON and, beside it, the notebook's outcome (what it measured, for the index: from res, or
    given); render the findings as Markdown (those after the first table_after as one table, where given)."""
    p = write_findings(findings, path)
    thread = thread or (findings[0].thread if findings else Path(path).name.split(".")[0])
    outcome = outcome if outcome is not None else res.outcome(thread, findings) if res is not None else Outcome(
        thread=thread, findings_total=len(findings), findings_answering=sum(f.answers for f in findings))
    write_outcome(outcome, path)
    lines = []
    # what was refused before launch or not measured (04's layouts that need more GPUs): one table at the end, not a
    # section each repeating "nothing measured to recommend from"; never the answer itself
    unmeasured = [f for f in findings[1:] if f.kind == "failure" and f.effect is None and not f.recommended_flags
                  and not f.recommendation]
    if len(unmeasured) < 2:
        unmeasured = []
    tabled = {id(u) for u in unmeasured}
    shown = [f for f in findings if id(f) not in tabled]
    rest = shown[table_after:] if table_after is not None and len(shown) > table_after + 1 else []
    if res is not None and (said := model_said(res)):
        lines.append(f"*Model: {said}.*\n")
    for f in shown[:len(shown) - len(rest)]:
        lines.append(f"### {f.title}\n")
        # the answer in a few words; how it was measured, per level and what was checked, folded below it
        lines.append(f"**{f.headline}.**\n")
        if f.detail:
            lines.append(f"<details><summary>Details</summary><p>{_inline_html(f.detail)}</p></details>\n")
        if not f.applies and f.reason not in f.claim:  # the claim often says why already, word for word
            lines.append(f"Does not apply here: {f.reason}\n")
        if f.effect is not None:
            lines.append(f"- measured effect: {f.effect.text()} ({f.effect.treatment} vs {f.effect.baseline})")
        lines.append(f"- confidence: **{f.confidence}**")
        if f.recommended_flags:
            lines.append(f"- recommended flags: `{shlex.join(f.recommended_flags)}`")  # pasted into a shell
        if f.recommendation:  # what the flags do not say: the deployment's own flags to drop, a change in words
            lines.append(f"- recommended: {f.recommendation}")
        if not f.recommended_flags and not f.recommendation:
            lines.append("- recommended flags: none (keep the current configuration)" if f.applies
                         else "- recommended flags: none (nothing measured to recommend from)")
    lines += findings_table(rest)
    if unmeasured:
        lines += [f"\n### Not launched or not measured ({len(unmeasured)})\n", "| finding | why | confidence |", "|---|---|---|"]
        lines += [f"| {_cell(f.title)} | {_cell(f.reason or f.claim)} | {f.confidence} |" for f in unmeasured]
    # the name only: a report rendered in a temporary folder and moved (the references) kept a path gone since
    lines.append(f"\nFindings written to `{Path(p).name}` (the notebook's findings_path).")
    return Markdown("\n".join(lines))


def model_said(res: Results) -> str:
    """What the page must say of the model its points served, where that is not the model itself: an architecture
    alone, with the engine's random weights ('' otherwise)."""
    from .architectures import describe

    archs = sorted({a for pt in res.stored.values() if (a := (pt.parts.get("model") or {}).get("architecture"))})
    try:
        return "; ".join(describe(a) for a in archs)
    except ServescopeError:  # the checkout no longer ships it: the name alone
        return "; ".join(f"random weights of the {a} architecture (speed is representative, outputs are not)"
                         for a in archs)


def _inline_html(words: str) -> str:
    """Words with `code` spans as HTML, on one line: a Markdown block inside <details> would end the HTML block at its
    first blank line and leave the text outside the fold."""
    parts = " ".join(words.split()).split("`")
    return "".join(f"<code>{html.escape(x)}</code>" if i % 2 else html.escape(x) for i, x in enumerate(parts))


def _cell(words: str) -> str:
    return html.escape(" ".join(words.split())).replace("|", "&#124;")


def findings_table(findings: list[Finding]) -> list[str]:
    """Many findings of one shape (03's regime per configuration) as Markdown lines: one table row each (title,
    confidence, what was read, the change), then each distinct detail (what to try, what was missing) once with the
    rows it belongs to, instead of the same paragraphs thirty times."""
    if not findings:
        return []
    changes = [shlex.join(f.recommended_flags) or f.recommendation for f in findings]
    head = ["#", "finding", "confidence", "what was read"] + (["change"] if any(changes) else [])
    out = [f"\n### {len(findings)} more, one row each\n", "| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    details: dict[str, list[int]] = {}
    for i, (f, change) in enumerate(zip(findings, changes, strict=True), 1):
        cell = "`" + " ".join(change.split()).replace("|", "\\|") + "`" if change else "none"
        out.append(f"| {i} | {_cell(f.title)} | {f.confidence} | {_cell(f.headline)} |"
                   + (f" {cell} |" if any(changes) else ""))
        if f.detail:
            details.setdefault(" ".join(f.detail.split()), []).append(i)
    if details:
        out.append("\nWhat each row adds (the rows it applies to):\n")
        out += [f"- rows {', '.join(map(str, rows))}: {d}" for d, rows in details.items()]
    return out


def show_measured(res: Results) -> Markdown:
    """One line on what was measured, and for failures the first error with the signal that ended a process."""
    o = res.outcome("", [])
    dep = f"\n\n{res.deployment}" if res.deployment else ""
    s = res.summary
    if len(s) and "filled" in s:
        unfilled = s[s["filled"].notna() & ~s["filled"].fillna(True).astype(bool)]
        if len(unfilled):
            dep += "\n\n**Levels that did not fill** (requests in flight below 90% of the concurrency over the steady " \
                   "window: they measured a lower concurrency than their label): " + "; ".join(
                       f"{r.config} {rep_label(r.rep)} {r.point} ({r.fill_pct:.0f}%)" for r in unfilled.itertuples()) + "."
    if not o.points_failed and not o.points_unmeasured:
        return Markdown((f"Measured all {o.points_planned} points." if o.points_planned else "Nothing to measure.")
                        + dep)
    if o.points_measured and o.points_failed == o.points_died and not o.points_unmeasured:
        # every failure a configuration that cannot start here: an answer, stated by the findings, not a red block
        return Markdown(f"{o.summary()}; the answer below names the exception, and its "
                        "server log is kept under the store's `_failed/` folder (table at the end)." + dep)
    none = f"the run's budget (--budget-s) ended before any of the {o.points_planned} points" \
        if res.why_unmeasured() == "budget" else f"none of the {o.points_planned} points is in the store (offline)"
    word = f"**Partly measured: {o.summary()}.**" if o.points_measured else \
        "**Failed: no point was measured.**" if o.points_failed else f"**Not measured: {none}.**"
    lines = [word, f"First error: {o.first_error}"]
    first = res.errors.iloc[0]
    if first["death"]:
        lines.append("\n```\n" + str(first["death"]) + "\n```")
    if o.points_failed:
        lines.append("Failed points keep their server logs under the store's `_failed/` folder (table at the end).")
    return Markdown("\n\n".join(lines) + dep)


def show_errors(res: Results) -> Markdown | pd.DataFrame:
    """Failed points: the error's first line and the signal that ended a server process, if any."""
    if res.errors.empty:
        return Markdown("Every point completed.")
    cols = ["config", "rep", "summary", "signal", "death", "key"]
    return res.errors[[c for c in cols if res.errors[c].astype(bool).any() or c in ("config", "rep", "summary")]]


def show_client_health(res: Results) -> Markdown:
    """The load client's own load per point, with a warning where it limited the measurement or was starved."""
    h = res.client_health()
    if h.empty:
        return Markdown("No points measured.")
    if h["client_cpu_pct"].isna().all():
        return Markdown("Client health was not recorded for these points (stored before it was measured).")
    limited, starved = res.client_warnings("limited"), res.client_warnings("starved")
    lines = [f"The client used at most {h['client_cpu_pct'].max():.0f}% of one core; its event loop woke up at "
             f"most {h['loop_lag_ms_p99'].max():.0f} ms late (p99 of a point)."]
    if limited:
        lines.append("\n**Warning: the load client limited these measurements** (the figures describe the client):\n")
        lines += [f"- {w}" for w in limited]
    if starved:
        lines.append(f"\n**The host was oversubscribed at {len(starved)} of {len(h)} points**: the client had little "
                     "to do but woke up late, so TTFT and inter-token gaps there include scheduling delay of the "
                     "machine, for both configurations alike:\n")
        lines += [f"- {w}" for w in starved]
    if not limited and not starved:
        lines.append("Neither limited nor starved at any point.")
    return Markdown("\n".join(lines))


def telemetry_status(res: Results) -> Markdown:
    """What telemetry was collected, at what rate, and why any of it is missing."""
    st = res.telemetry_status
    if st.empty:
        return Markdown("No telemetry was recorded with these points.")
    lines = []
    gpu = sorted(set(st["gpu"])) if "gpu" in st else ["unknown"]
    lines.append("- GPU: " + "; ".join(gpu))
    for name in ("gpu", "host", "server_metrics", "dcgm"):
        col = f"{name}_achieved_hz"
        if col in st:
            hz = st[col].dropna()
            cpu = st.get(f"{name}_cpu_s", pd.Series(dtype=float)).dropna()
            lines.append(f"- {name} sampler: {hz.median():.1f} Hz achieved (median over points), "
                         f"its own CPU {cpu.sum():.2f} s in all")
        if f"{name}_errors" in st:
            errs = sorted({e for e in st[f"{name}_errors"].dropna()})
            if errs:
                lines.append(f"  - {name} missing readings: {'; '.join(errs)[:400]}")
    return Markdown("\n".join(lines))


def telemetry_gpu(study: Study) -> Markdown | pd.DataFrame:
    """Per configuration, repetition, point and GPU: utilization, SM and DRAM activity (GPM), power, clocks,
    energy per token (the regime of each point is in regimes())."""
    t = study.gpu_points()
    if t.empty:
        st = study.results.telemetry_status
        why = "; ".join(sorted(set(st["gpu"]))) if "gpu" in st else "no telemetry recorded"
        return Markdown(f"No GPU readings: {why}. Nothing is shown in their place.")
    cols = ["config", "rep", "phase", "gpu", "gpu_util_pct_p50", "sm_active_pct_p50", "dram_bw_util_pct_p50",
            "tensor_active_pct_p50", "mem_util_pct_p50", "power_w_p50", "power_pct_of_limit_p50",
            "sm_clock_pct_of_max_p50", "energy_per_output_token_j", "reason_sw_power_cap_share", "temp_c_max"]
    return t[[c for c in cols if c in t]].dropna(axis=1, how="all")


def regimes(study: Study) -> Markdown | pd.DataFrame:
    """The regime of every measured point: what limited it, how sure, and what to try."""
    t = study.regimes()
    if t.empty:
        return Markdown("No measured point to judge.")
    return t.drop(columns=["action"], errors="ignore")


def telemetry_host(study: Study) -> Markdown | pd.DataFrame:
    """The server process tree's CPU per point (median over repetitions), and its busiest thread."""
    h = study.host_points()
    if h.empty:
        return Markdown("No host readings of the server process tree (an external server has none here).")
    agg = {"server_cpu_pct_p50": ("server_cpu_pct_p50", "median"), "server_cpu_pct_max": ("server_cpu_pct_max", "max"),
           "server_rss_mib_max": ("server_rss_mib_max", "max")}
    if "busiest_thread_cpu_pct_p50" in h:
        agg |= {"busiest_thread": ("busiest_thread", "first"),
                "busiest_thread_cpu_pct_p50": ("busiest_thread_cpu_pct_p50", "median")}
    return h.groupby(["config", "phase"], sort=False).agg(**agg).reset_index()


def telemetry_metrics(study: Study) -> Markdown | pd.DataFrame:
    """The engine's own Prometheus metrics per point (median over repetitions): gauges as medians, counters as rates."""
    m = study.metric_points()
    if m.empty:
        return Markdown("No engine metrics were scraped.")
    m["series"] = m["metric"] + " (" + m["stat"] + ")"
    return m.pivot_table(index=["config", "phase"], columns="series", values="value", aggfunc="median",
                         sort=False).reset_index()


def engine_counters(study: Study) -> Markdown:
    """The engine's own counters per level beside NVML's (median over repetitions), and what they disagree on."""
    t = study.engine_beside_gpu()
    if t.empty:
        return Markdown(f"{study.adapter.name} exported none of the counters servescope reads beside NVML "
                        "(or none was scraped).")
    nums = [c for c in t.columns if c not in ("config", "rep", "point", "said", "graph_passes_per_s")]
    med = t.groupby(["config", "point"], sort=False)[nums].median().reset_index()
    display(table_or(med, "No level to show."))
    # the disagreements of the medians shown, in words under the numbers (a sentence in a table cell stretched every
    # row); a configuration of several servers keeps what its rows say (its counters are one replica's)
    replica = t[t["said"].str.startswith("counters of replica")].groupby(["config", "point"])["said"].first()
    lines = [f"- {r['config']} at {r['point']}: {w}" for r in med.to_dict("records")
             if (w := replica.get((r["config"], r["point"])) or disagreements(r))]
    return Markdown("\n".join(["Where they disagree:", *lines]) if lines else "No disagreement between them.")


def probe_result(probe: ProbeRun) -> Markdown | pd.DataFrame:
    """A probe's table, or why it did not run (skipped or failed), in one line."""
    if probe.ran:
        return probe.rows
    state = "Failed" if isinstance(probe.outcome, Failed) else "Not run"
    return Markdown(f"{state}: {probe.why_not}.")


def text(words: str) -> Markdown:
    """A sentence as Markdown."""
    return Markdown(words)


def write_documents(docs: dict[str, str], report_dir: str | Path) -> list[Path]:
    """Write a thread's Markdown documents (file name -> text) into the report's changes/ folder; their paths."""
    out = Path(report_dir) / "changes"
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in docs.items():
        atomic_write_text(out / name, text)
        paths.append(out / name)
    return paths


def table_or(df: pd.DataFrame, words: str) -> Styler | Markdown:
    """The table without its all-empty columns and row numbers, or words saying why there is none."""
    if df is None or df.empty:
        return Markdown(words)
    out = df.replace("", pd.NA).dropna(axis=1, how="all")
    # a column of numbers that a missing value left as objects is formatted as the numbers it holds
    mixed = [c for c in out.columns if out[c].dtype == object and out[c].notna().any()
             and out[c].dropna().map(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)).all()]
    out = out.astype({c: "float64" for c in mixed})
    # a count column that a missing row made float (tp 1.0, 2.0) shows as the integers it holds
    whole = [c for c in out.columns if pd.api.types.is_float_dtype(out[c]) and out[c].notna().any()
             and (out[c].dropna() % 1 == 0).all()]
    out = out.astype({c: "Int64" for c in whole})
    # a yes/no column reads as words (True/False is Python's spelling)
    yes_no = [c for c in out.columns if out[c].notna().any() and out[c].dropna().map(type).eq(bool).all()]
    if yes_no:
        out = out.copy()
        for c in yes_no:
            out[c] = out[c].map({True: "yes", False: "no"})
    # the page reads words from the left (report.PAGE_CSS); numbers stay right-aligned, so their digits line up
    numbers = [c for c in out.columns if pd.api.types.is_numeric_dtype(out[c])]
    floats = [c for c in out.columns if pd.api.types.is_float_dtype(out[c])]
    names = [c for c in out.columns if str(c) in KERNEL_NAME_COLUMNS and c not in numbers]
    # text is escaped (a kernel's template arguments, <unnamed>, are not tags); a long kernel name shows its function
    # and keeps the whole signature on hover
    return out.style.hide(axis="index").format(na_rep="", escape="html") \
        .format(_number, subset=floats, na_rep="").format(_kernel_cell, subset=names, na_rep="") \
        .set_properties(subset=numbers, **{"text-align": "right"})


KERNEL_NAME_COLUMNS = ("name", "kernel", "example_kernel", "op")
LONG_NAME = 60  # characters: past this a kernel's signature is shortened to its function, the rest on hover


def _kernel_cell(v: object) -> str:
    """A kernel name as a cell: escaped; past LONG_NAME characters its bare function (no template arguments or
    signature) with the whole name on hover."""
    full = str(v)
    if len(full) <= LONG_NAME:
        return html.escape(full)
    short = bare_name(full, LONG_NAME)
    return f'<span title="{html.escape(full, quote=True)}">{html.escape(short)}…</span>'



def _number(v: float) -> str:
    """A measured value with the digits that matter: one decimal from 10 up, two from 1, three significant below
    (one decimal everywhere showed a 0.04 ms kernel or a 0.012 J token as 0.0)."""
    a = abs(v)
    return f"{v:.1f}" if a >= 10 or a == 0 else f"{v:.2f}" if a >= 1 else f"{v:.3g}"


def resolved_table(study: Study) -> Styler | Markdown:
    """What each configuration resolved to (Study.resolved()) as the page shows it: the columns where they differ,
    what every one shares said once above (a dozen columns of one value pushed the table off the page)."""
    df = study.resolved()
    if df.empty:
        return Markdown("No configuration was read back.")
    # what was read back; a configuration not measured has no values and shares none
    read = df[df["source"] != "not measured"] if "source" in df else df
    keep = ("config", "requested", "flags") + (("source",) if len(read) < len(df) else ())
    same = [c for c in df.columns if c not in keep and len(read) > 1
            and read[c].notna().all() and read[c].astype(str).nunique() == 1 and str(read[c].iloc[0]) != ""]
    out = table_or(df.drop(columns=same), "")
    if same:
        out = out.set_caption("Every configuration read back: " + "; ".join(f"{c} {_value(read[c].iloc[0])}"
                                                                            for c in same))
    return out


def _value(v: object) -> str:
    """A cell as words: a count that a missing row made a float (tp 1.0) as the integer it is."""
    return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)


def verification_table(study: Study) -> Styler | Markdown:
    """Each configuration's pinned fields (Study.verification()) in one row: those as requested, then each that
    differs or could not be verified with why (16 rows of 'as requested' and an empty why column read as nothing)."""
    v = study.verification()
    if v.empty:
        return Markdown("Nothing was read back to verify.")
    rows = []
    for cfg, g in v.groupby("config", sort=False):
        ok = g[g["status"] == "as requested"]
        other = g[g["status"] != "as requested"]
        rows.append({"config": cfg,
                     "as requested": ", ".join(f"{f} {r}" for f, r in zip(ok["field"], ok["resolved"], strict=True)),
                     "not as requested": "; ".join(
                         f"{r.field}: {r.status}" + (f" ({r.why})" if r.why else "") for r in other.itertuples())})
    return table_or(pd.DataFrame(rows), "")


# what a paired comparison's table shows on the page; the p-value, the plain range of the ratios and each side's spread
# stay in the tidy DataFrame (effects()) for whoever explores it
EFFECT_COLUMNS = ("concurrency", "metric", "baseline", "treatment", "baseline_median", "treatment_median", "effect_pct",
                  "ci_low_pct", "ci_high_pct", "n_pairs", "confidence")


def effects_table(df: pd.DataFrame, words: str = "No paired comparison measured.") -> Styler | Markdown:
    """A comparison's effects (Comparison.effects()) as the page shows them: the columns that matter, the pair's
    names only where the table holds more than one pair."""
    if df is None or df.empty:
        return Markdown(words)
    keep = [c for c in EFFECT_COLUMNS if c in df]
    if {"baseline", "treatment"} <= set(df) and len(df[["baseline", "treatment"]].drop_duplicates()) == 1:
        keep = [c for c in keep if c not in ("baseline", "treatment")]
    return table_or(df[keep], words)


def ranked_table(ranked: pd.DataFrame) -> Markdown | HTML:
    """The summary's ranking as one table, each thread a link to its answer."""
    if ranked.empty:
        return Markdown("No finding to rank: no thread of this run wrote findings.")
    ranked = each_change_once(ranked)
    # 'optimal' (what an Already-optimal setting beat) is the front page's wording of the same row
    # how sure, direction and size apart, in place of the one confidence word (readers took "high" for the size)
    df = ranked.drop(columns=["optimal", "knob_keys", "confidence", "order"], errors="ignore").rename(
        columns={"sureness": "how sure", "found_by": "found by"}).replace("", pd.NA).dropna(axis=1, how="all").fillna("")
    # a change or why in words quotes its flags in backticks: code there, as on the front page
    df = df.map(lambda v: str(change_html(str(v), words=True)))
    # the thread names its page: a column of links repeating it pushed the table past the page's edge
    df["thread"] = [f'<a href="{html.escape(h)}">{html.escape(t)}</a>' if h else html.escape(t)
                    for t, h in zip(ranked["thread"], ranked["evidence"].fillna(""), strict=True)]
    return HTML(df.drop(columns="evidence", errors="ignore").to_html(index=False, escape=False,
                                                                     classes="servescope-ranked"))


def engines_side_by_side(store_dir: str, model: dict | None = None, load: dict | None = None,
                         compare_stores: Sequence[str] = ()) -> Markdown | pd.DataFrame:
    """Two engines serving this run's model under this run's load (where given; else every model and load the store
    holds), side by side across the run's store and the suite's compare_with stores (analysis.engines), or one line
    saying why there is nothing to compare."""
    from .analysis import engines
    from .spec import LoadSpec, ModelSpec
    from .store import Store

    if not store_dir or not Path(store_dir).is_dir():
        return Markdown("Not compared: this run names no store.")
    missing = [c for c in compare_stores if not Path(c).is_dir()]
    if missing:
        return Markdown(f"Not compared: the suite's compare_with store {missing[0]} is not on this machine.")
    stores = [Store(store_dir), *(Store(c) for c in compare_stores)]
    t = engines.side_by_side(stores, ModelSpec(**model) if model else None, LoadSpec(**load) if load else None)
    if t.empty:
        where = "the run's store" + (" and the suite's compare_with stores" if compare_stores else "")
        return Markdown(f"Not compared: {where} hold no two engines serving this model under this load on one GPU "
                        f"model with {engines.MIN_REPS} or more repetitions of a configuration each.")
    display(Markdown(engines.words(t)))
    return engines.table(t)


use_page_tables()  # every notebook imports nb before it shows a table
