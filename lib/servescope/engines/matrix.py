"""`servescope check-engines`: every engine release a user may run, read from its published source. Per release:
the flags the scan finds (and that the core flags are among them), every knob's launch plan (built, or refused with
that version's own reason), and the graph audit's rows by kind and how many rules choose graph use. Anything
inconsistent (a scan that fails, a plan that emits a flag or value the version does not define, an audit that finds
nothing) fails the check."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..errors import KnobError, ServescopeError, SpecError
from ..spec import Knobs
from .audit import CHOOSES, PER_BATCH, SILENT, STARTUP, graph_disable_audit
from .base import KNOB_PROBES, EngineAdapter, EngineInstall
from .flagscan import FlagSet
from .source import SourceTree, fetch_sdist, fetch_wheel, index_files

MATRIX_COLUMNS = ["engine", "version", "source", "declared", "flags", "core", "choices", "phases", "knobs_built",
                  "knobs_refused", "audit_startup", "audit_per_batch", "audit_chooses", "audit_named_rules", "audit_silent",
                  "graph_intents", "scan_s", "problems"]

# the releases the check covers (issue 15): SGLang from 0.4.0 (the last patch of each 0.4 minor, every 0.5.x),
# vLLM 0.26-0.33 (0.26: the release recorded on the H200), transformers 5.17-5.23; pre-releases are left out
SELECTION = {"sglang": ((0, 4), (0, 6)), "vllm": ((0, 26), (0, 34)), "transformers": ((5, 17), (5, 24))}
# the subset CI reads: one release per declaration form and audit form
CI_SUBSET = {"sglang": ("0.4.10.post2", "0.5.9", "0.5.14", "0.5.23"), "vllm": ("0.33.0",), "transformers": ("5.23.0",)}
# vLLM's wheels are 330 MB of compiled code around the Python source; its sdist (45 MB) is the source as published
PREFER_SDIST = {"vllm"}

_RELEASE = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?(?:\.(\d+))?(?:\.post(\d+))?$")


def release_key(version: str) -> tuple[int, ...]:
    """'0.4.10.post2' -> (0, 4, 10, 0, 2): sortable; pre-releases are not matched (ValueError)."""
    m = _RELEASE.match(version)
    if not m:
        raise ValueError(version)
    return tuple(int(g or 0) for g in m.groups())


def select_releases(engine: str, versions: list[str]) -> list[str]:
    """The releases of one engine the check covers, oldest first, from the versions the index lists."""
    lo, hi = SELECTION[engine]
    keep = sorted({v for v in versions if _RELEASE.match(v) and lo <= release_key(v)[:2] < hi}, key=release_key)
    if engine == "sglang":  # 0.4.x: the last patch of each minor
        last: dict[tuple[int, ...], str] = {}
        for v in keep:
            if release_key(v)[:2] == (0, 4):
                last[release_key(v)[:3]] = v
        keep = [v for v in keep if release_key(v)[:2] != (0, 4) or last[release_key(v)[:3]] == v]
    return keep


def index_versions(distribution: str) -> list[str]:
    """Every version the package index lists a file for (yanked files left out)."""
    out = set()
    for f in index_files(distribution):
        if f.get("yanked"):
            continue
        m = re.match(rf"{re.escape(distribution)}-(\d[^-]*?)(?:-|\.tar\.gz$)", f["filename"].replace("_", "-"),
                     re.IGNORECASE)
        if m:
            out.add(m.group(1))
    return sorted(out)


def source_tree(adapter: EngineAdapter, version: str) -> SourceTree:
    """The published source of one release (cached per user): the sdist for vLLM, else the wheel."""
    dist = adapter.distributions[0]
    if adapter.name in PREFER_SDIST:
        return SourceTree.from_sdist(fetch_sdist(dist, version), adapter.package)
    return SourceTree.from_wheel(fetch_wheel(dist, version))


def declared_as(fs: FlagSet) -> str:
    """How this release declares its flags, in words (from where the scan found them)."""
    t = fs.table
    forms = []
    for (kind, file), n in t.groupby(["kind", "file"]).size().sort_values(ascending=False).items():
        kind = {"field": "annotated fields", "option": "typer options"}.get(kind, kind)
        where = re.sub(r"^(sglang/srt|vllm|transformers)/", "", str(file))
        where = re.sub(r"arg_groups/fields/\w+\.py", "arg_groups/fields/", where)
        forms.append((f"{kind} in {where}", n))
    merged: dict[str, int] = {}
    for f, n in forms:
        merged[f] = merged.get(f, 0) + n
    return "; ".join(f for f, n in sorted(merged.items(), key=lambda x: -x[1]) if n >= 5) or \
        "; ".join(merged)


@dataclass
class ReleaseCheck:
    """One release's row of the matrix, and its knob plans (one row per knob setting)."""

    row: dict
    knobs: pd.DataFrame


def check_release(adapter: EngineAdapter, tree: SourceTree) -> ReleaseCheck:
    """Scan, plan every knob, audit: one release."""
    t0 = time.time()
    problems: list[str] = []
    row: dict = {"engine": adapter.name, "version": tree.version, "source": "sdist" if tree.origin else "wheel"}
    install = EngineInstall(python="python", version=tree.version, distribution=adapter.distributions[0],
                            platform="cuda", source=tree.location)
    knob_rows: list[dict] = []
    try:
        fs = adapter.flag_set(install)
    except ServescopeError as e:
        row |= {"flags": 0, "core": "missing", "problems": f"flag scan: {e}", "scan_s": round(time.time() - t0, 1)}
        return ReleaseCheck(row, pd.DataFrame(knob_rows))
    row |= {"declared": declared_as(fs), "flags": len(fs), "core": "present",
            "choices": int(fs.table["choices"].notna().sum()),
            "phases": "; ".join(f"{p}: {'|'.join(v)}" for p, v in fs.phases.items())}
    intents = []
    for probe in KNOB_PROBES:
        knobs = Knobs(**probe)
        rec = {"engine": adapter.name, "version": tree.version, "knobs": knobs.label()}
        try:
            plan = adapter.plan(install=install, model_path="/models/m", served_name="m", host="127.0.0.1",
                                port=30000, knobs=knobs, extra_env={})
            cmd = plan.command
            first = next((i for i, c in enumerate(cmd) if c.startswith("--")), len(cmd))
            adapter.check_flags(cmd[first:], install)  # every flag defined, every value accepted
            rec |= {"status": "built", "flags": " ".join(plan.flags), "reason": ""}
            if "cuda_graph" in probe and len(probe) == 1:
                intents.append(probe["cuda_graph"])
        except (KnobError, SpecError) as e:
            rec |= {"status": "refused", "flags": "", "reason": str(e)}
        except Exception as e:  # noqa: BLE001 - anything else is a defect of the adapter on this release
            rec |= {"status": "error", "flags": "", "reason": f"{type(e).__name__}: {e}"}
            problems.append(f"{knobs.label()}: {type(e).__name__}: {e}")
        knob_rows.append(rec)
    kdf = pd.DataFrame(knob_rows)
    row |= {"knobs_built": int((kdf["status"] == "built").sum()), "knobs_refused": int((kdf["status"] == "refused").sum()),
            "graph_intents": ", ".join(intents)}
    try:
        audit = graph_disable_audit(tree)
    except (ServescopeError, SyntaxError) as e:
        audit = None
        problems.append(f"audit: {e}")
    if audit is not None:
        row |= {"audit_startup": int((audit["kind"] == STARTUP).sum()),
                "audit_per_batch": int((audit["kind"] == PER_BATCH).sum()),
                "audit_chooses": int((audit["form"] == CHOOSES).sum()),
                "audit_named_rules": int(audit["rule"].fillna("").ne("").sum()),
                "audit_silent": int((audit["message"] == SILENT).sum())}
        if not len(audit):
            problems.append("audit found no place that turns CUDA graphs off")
    row |= {"scan_s": round(time.time() - t0, 1), "problems": "; ".join(problems)}
    return ReleaseCheck(row, kdf)


def check_engines(engines: list[str], versions: dict[str, list[str]] | None = None,
                  say: Callable[[str], None] = print) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The matrix (one row per release) and the knob plans of every release; `versions` pins releases per engine
    (else the index's releases of SELECTION)."""
    from . import get_engine

    rows, knobs = [], []
    for name in engines:
        ad = get_engine(name)
        dist = ad.distributions[0]
        chosen = (versions or {}).get(name) or select_releases(name, index_versions(dist))
        for v in chosen:
            try:
                tree = source_tree(ad, v)
            except ServescopeError as e:
                rows.append({"engine": name, "version": v, "problems": f"source: {e}"})
                say(f"{name} {v}: could not fetch its source: {e}")
                continue
            res = check_release(ad, tree)
            rows.append(res.row)
            knobs.append(res.knobs)
            r = res.row
            say(f"{name:<12} {v:<12} {r.get('flags', 0):>4} flags  {r.get('knobs_built', 0):>2} built "
                f"{r.get('knobs_refused', 0):>2} refused  audit {r.get('audit_startup', 0):>3} startup "
                f"{r.get('audit_per_batch', 0):>3} per-batch {r.get('audit_chooses', 0):>3} choosing  "
                f"{'PROBLEM: ' + r['problems'] if r.get('problems') else 'ok'}")
    matrix = pd.DataFrame(rows).reindex(columns=MATRIX_COLUMNS)
    matrix["problems"] = matrix["problems"].fillna("")
    return matrix, (pd.concat(knobs, ignore_index=True) if knobs else pd.DataFrame())


def readme_table(matrix: pd.DataFrame) -> str:
    """The engine table of docs/engines.md: consecutive releases that declare flags alike and build the same knobs merged
    into one row."""
    def span(col: pd.Series) -> str:
        lo, hi = int(col.min()), int(col.max())
        return f"{lo}" if lo == hi else f"{lo}–{hi}"

    lines = ["| Engine | Releases | Flags declared as | Flags | CUDA-graph intents it can run | "
             f"Knob plans built (of {len(KNOB_PROBES)}) | Audit rows (startup / per-batch) | Rules that choose graph use | "
             "Check |", "|---|---|---|---|---|---|---|---|---|"]
    for engine, g in matrix.groupby("engine", sort=False):
        g = g.reset_index(drop=True)
        start = 0
        for i in range(len(g) + 1):
            if i < len(g) and i > start and all(
                    g.at[i, c] == g.at[start, c] for c in ("declared", "graph_intents", "phases")) \
                    and bool(g.at[i, "problems"]) == bool(g.at[start, "problems"]):
                continue
            if i > start:
                block = g.iloc[start:i]
                vs = block["version"].tolist()
                rel = vs[0] if len(vs) == 1 else f"{vs[0]} – {vs[-1]} ({len(vs)})"
                ok = "clean" if not block["problems"].astype(bool).any() else "problems"
                lines.append(f"| {engine} | {rel} | {block['declared'].iloc[0]} | {span(block['flags'])} | "
                             f"{block['graph_intents'].iloc[0] or '—'} | {span(block['knobs_built'])} | "
                             f"{span(block['audit_startup'])} / {span(block['audit_per_batch'])} | "
                             f"{span(block['audit_chooses'])} | {ok} |")
            start = i
    return "\n".join(lines)


def write_readme_table(readme: Path, table: str) -> None:
    """Replace the table between the engine-table markers of a Markdown file (docs/engines.md)."""
    text = readme.read_text()
    begin, end = "<!-- engines:begin -->", "<!-- engines:end -->"
    if begin not in text or end not in text:
        raise ServescopeError(f"{readme}: no {begin} ... {end} markers to write the engine table between")
    head, rest = text.split(begin, 1)
    readme.write_text(f"{head}{begin}\n{table}\n{end}{rest.split(end, 1)[1]}")
