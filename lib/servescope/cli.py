"""Command line: `servescope run SUITE`, plus small verbs a user reaches for alone."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

from .errors import ServescopeError


def _cmd_run(a: argparse.Namespace) -> int:
    from .report import run_suite

    done = run_suite(a.suite, only=a.only or (), offline=a.offline, hide_code=not a.show_code,
                     reports_dir=a.reports_dir, store_dir=a.store_dir, run_id=a.run_id, progress=False,
                     echo=None if a.quiet else sys.stdout, budget_s=a.budget_s or 0.0)
    if done.interrupted:  # the conventional code of a process stopped by that signal
        print(f"servescope: interrupted by {done.interrupted}; report of what ran: {done.out_dir / 'index.html'}",
              file=sys.stderr)
        return 128 + done.exit_signal
    bad = done.failing
    partial = [r for r in done.runs if r.status == "partial"]
    for r in bad + partial:
        print(f"servescope: {r.id}: {r.status}" + (f" — {r.first_error}" if r.first_error else ""), file=sys.stderr)
    if bad or partial:
        hint = "" if a.tolerate_failures else " (exit 1; --tolerate-failures exits 0)"
        what = []
        if bad:
            what.append(f"{len(bad)} of {len(done.runs)} notebooks failed or measured nothing")
        if partial:
            what.append(f"{len(partial)} answered with some points failed or not in the store")
        print(f"servescope: {'; '.join(what)}{hint}; `make doctor` checks this machine end to end", file=sys.stderr)
    return 1 if (bad or partial) and not a.tolerate_failures else 0


def _cmd_doctor(a: argparse.Namespace) -> int:
    from .doctor import run_doctor, table

    t0 = time.monotonic()
    checks = run_doctor(a.suite, quick=a.quick, say=lambda m: print(m, file=sys.stderr, flush=True))
    print(table(checks))
    bad = [c for c in checks if c.failed()]
    took = f"{time.monotonic() - t0:.0f} s" + (", quick: token results from the cache" if a.quick else "")
    if bad:
        print(f"doctor: {len(bad)} check(s) failed ({', '.join(c.check for c in bad)}); {took}", file=sys.stderr)
        return 1
    warn = [c.check for c in checks if c.status == "warn"]
    print(f"doctor: nothing known to fail here; to look at: {', '.join(warn)} ({took})" if warn else
          f"doctor: everything the suite needs works here ({took})", file=sys.stderr)
    return 0


def _cmd_engines(a: argparse.Namespace) -> int:
    from .engines import engine_names, get_engine

    for name in engine_names():
        ad = get_engine(name)
        env = ad.managed_env(None)
        print(f"{name:10s} launches={'yes' if ad.launches else 'no':3s} managed_env={env.key if env else '-'}"
              f"{' (ready)' if env and env.is_ready() else ''}")
    return 0


def _cmd_engine_env(a: argparse.Namespace) -> int:
    from .engines import get_engine
    from .launch import create_env

    ad = get_engine(a.engine)
    if ad.managed_env(a.version) is None:
        raise ServescopeError(f"engine {a.engine!r} has no managed environment")
    print(create_env(ad, a.version, _progress))
    return 0


def _progress(msg: str) -> None:
    """Progress lines go to stderr, so they show even when the printed result (a path) is captured."""
    print(time.strftime("%H:%M:%S"), msg, file=sys.stderr, flush=True)


def _cmd_make_model(a: argparse.Namespace) -> int:
    from .engines import get_engine
    from .launch import create_env
    from .models import ensure_tiny_model
    from .spec import TinyModelSpec, parse

    spec = parse(TinyModelSpec, json.loads(a.spec) if a.spec else {}, "tiny model spec")
    python = a.python
    if not python:
        python = str(create_env(get_engine("vllm"), None, _progress))
    print(ensure_tiny_model(spec, python))
    return 0


def _cmd_store_export(a: argparse.Namespace) -> int:
    from pathlib import Path

    from .store import Store, export_points

    keys = export_points(Store(a.store_dir), Path(a.dest), keep_logs=a.keep_logs)
    print(f"copied {len(keys)} complete points to {a.dest}")
    return 0


def _cmd_import_bench(a: argparse.Namespace) -> int:
    from pathlib import Path

    from .load.importers import import_bench

    if a.out:
        _check_out(a.out, folder=True)
    summary, requests = import_bench(a.file)
    cols = ["source", "point", "completed", "failed", "request_s", "output_tok_s", "ttft_ms_p50", "ttft_ms_p99",
            "tpot_ms_p50", "itl_ms_p50", "e2e_ms_p50"]
    print(summary[cols].to_string(index=False))
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        summary.to_parquet(out / "summary.parquet", index=False)
        if not requests.empty:
            requests.to_parquet(out / "requests.parquet", index=False)
        print(f"written to {out}")
    return 0


def _cmd_kernels(a: argparse.Namespace) -> int:
    import pandas as pd

    from .analysis import kernels as ak
    from .analysis.regime import trace_regime
    from .profile.session import open_trace

    p = open_trace(a.trace)
    k = ak.with_categories(p.kernels)
    start, end = p.window_ns if p.window_ns else (None, None)
    if a.range:
        hit = p.nvtx[p.nvtx["text"].astype(str) == a.range] if len(p.nvtx) else p.nvtx
        if hit.empty:
            have = sorted(set(p.nvtx["text"].astype(str)))[:20] if len(p.nvtx) else []
            raise ServescopeError(f"no NVTX range {a.range!r} in {a.trace}; ranges there: {have}")
        start, end = int(hit["start_ns"].iloc[0]), int(hit["end_ns"].iloc[-1])
        k = ak.clip(k, start, end)
    with pd.option_context("display.width", 160, "display.max_colwidth", 70):
        print(f"{a.trace}: {len(k)} kernels ({p.source})" + (f", NVTX range {a.range!r}" if a.range else
                                                              ", the whole capture" if p.window_ns else ""))
        verdict = trace_regime(k, p.runtime, (start, end) if start is not None and end is not None else None)
        print(f"\n# regime\n{verdict.words()}\nwhat to try: {verdict.action}")
        print("\n# busy (lead_in_ms / tail_ms: idle before the first kernel and after the last)\n"
              + ak.busy(k, start, end).round(4).to_string(index=False))
        if len(p.runtime):
            lo = ak.launch_overhead(p.runtime, k, start, end)
            print("\n# launch API vs kernels\n" + "\n".join(f"{key}: {v:.4g}" for key, v in lo.items()))
        print("\n# categories\n" + ak.categories(k).round(4).to_string(index=False))
        moe = ak.moe_path(k)
        print("\n# MoE path\n" + (moe.round(4).to_string(index=False) if len(moe) else "no MoE kernels"))
        top = ak.top_kernels(k, a.top).round(4)
        top["name"] = top["name"].str.slice(0, 90)
        print(f"\n# top {a.top} kernels\n" + top.to_string(index=False))
    return 0


def _check_out(path: str, folder: bool) -> None:
    """Refuse an output that cannot be written, before any work: its folder (or itself, for a folder) must be, or
    be creatable under, a writable directory."""
    from pathlib import Path

    p = Path(path).expanduser().resolve()
    probe = p if folder else p.parent
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise ServescopeError(f"cannot write {path}: {probe} is a file, not a folder")
    if not os.access(probe, os.W_OK):
        raise ServescopeError(f"cannot write {path}: {probe} is not writable")


def _install_for(a: argparse.Namespace):
    """The engine install a verb reads: a published wheel (--wheel dist==version), an interpreter, or the managed
    environment."""
    from .engines import get_engine
    from .engines.base import EngineInstall
    from .launch import find_install
    from .spec import EngineSpec

    ad = get_engine(a.engine)
    if a.wheel:
        dist, _, version = a.wheel.partition("==")
        if not version:
            raise ServescopeError(f"--wheel wants dist==version (e.g. sglang==0.5.23), not {a.wheel!r}")
        names = ad.distributions or (ad.package or ad.name,)
        if dist.lower().replace("_", "-") not in names:
            raise ServescopeError(f"--wheel {a.wheel} is not a {ad.name} wheel (it reads {' or '.join(names)}); "
                                  f"did you mean `{dist.split('-')[0]}` as the engine?")
        from .engines.matrix import source_tree

        # the release's published source as check-engines reads it (vLLM: its sdist, not the 336 MB wheel)
        return ad, EngineInstall(python=sys.executable, version=version, distribution=dist, platform="cuda",
                                 source=source_tree(ad, version).location)
    if not a.python and ad.managed_env(None) is None:
        raise ServescopeError(f"engine {a.engine!r} has no managed environment: give --python or --wheel")
    return ad, find_install(EngineSpec(name=a.engine, python=a.python), ad)


def _cmd_audit(a: argparse.Namespace) -> int:
    import pandas as pd

    from .engines.audit import find_rules, graph_disable_audit

    if a.out:
        _check_out(a.out, folder=False)
    ad, inst = _install_for(a)
    audit = find_rules(graph_disable_audit(ad.source_tree(inst)), condition=a.condition or "", effect=a.effect or "")
    if a.kind:
        audit = audit[audit["kind"] == a.kind]
    if a.form:
        audit = audit[audit["form"] == a.form]
    with pd.option_context("display.width", 200, "display.max_colwidth", 90, "display.max_rows", 500):
        chooses = int((audit["form"] == "chooses").sum())
        print(f"{ad.name} {inst.version}: {len(audit) - chooses} places that turn CUDA graphs off or force eager, "
              f"{chooses} that choose graph use")
        print(audit[["file", "line", "function", "kind", "form", "rule", "effect", "resolves_to", "condition",
                     "message"]].to_string(index=False))
    if a.out:
        audit.to_csv(a.out, index=False)
    return 0


def _cmd_flags(a: argparse.Namespace) -> int:
    import pandas as pd

    ad, inst = _install_for(a)
    fs = ad.flag_set(inst)
    with pd.option_context("display.width", 200, "display.max_colwidth", 110, "display.max_rows", 1000):
        print(f"{ad.name} {inst.version}: {len(fs)} flags ({fs.origin})")
        if a.all:
            print(fs.table[["flag", "file", "line", "deprecated", "kind"]].to_string(index=False))
        print(ad.knob_capabilities(inst).to_string(index=False))
    return 0


def _cmd_check_engines(a: argparse.Namespace) -> int:
    import pandas as pd

    from .engines.matrix import CI_SUBSET, check_engines, readme_table, write_readme_table
    from .paths import project_root

    engines = a.engine or ["sglang", "vllm", "transformers"]
    versions: dict[str, list[str]] = {e: list(CI_SUBSET[e]) for e in engines} if a.subset else {}
    for spec in a.version or []:
        eng, _, vs = spec.partition("=")
        if eng not in engines or not vs:
            raise ServescopeError(f"--version wants ENGINE=V1,V2 for one of {', '.join(engines)}, not {spec!r}")
        versions[eng] = vs.split(",")
    for out in (a.csv, a.knobs_csv):
        _check_out(out, folder=False)
    matrix, knobs = check_engines(engines, versions)
    Path(a.csv).parent.mkdir(parents=True, exist_ok=True)
    matrix.to_csv(a.csv, index=False)
    knobs.to_csv(a.knobs_csv, index=False)
    with pd.option_context("display.width", 250, "display.max_colwidth", 60, "display.max_rows", 500):
        print(matrix.drop(columns=["problems", "phases", "declared"]).to_string(index=False))
    bad = matrix[matrix["problems"] != ""]
    print(f"\n{len(matrix)} releases, {len(bad)} with problems; matrix in {a.csv}, knob plans in {a.knobs_csv}")
    for r in bad.itertuples():
        print(f"  {r.engine} {r.version}: {r.problems}")
    if a.readme and not len(bad) and not a.subset:
        write_readme_table(project_root() / "docs" / "engines.md", readme_table(matrix))
        print("docs/engines.md engine table written")
    return 1 if len(bad) else 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `servescope` command."""
    p = argparse.ArgumentParser(prog="servescope", description=__doc__)
    p.add_argument("-v", "--verbose", action="store_true", help="log library activity")
    sub = p.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("run", help="run a suite of notebooks and render the report")
    r.add_argument("suite", help="suite YAML, e.g. data/suites/default.yaml")
    r.add_argument("--only", action="append", help="run only notebooks whose id starts with this (repeatable); the "
                   "notebooks before one that reads the run's findings (07, 99) render offline from the store first")
    r.add_argument("--offline", action="store_true", help="render from the result store only; launch nothing")
    r.add_argument("--show-code", action="store_true",
                   help="keep code cells in the HTML (default: the shared view, answers and evidence without code)")
    r.add_argument("--hide-code", action="store_true", help=argparse.SUPPRESS)  # the default now; kept for scripts
    r.add_argument("--reports-dir", help="default: <project>/reports")
    r.add_argument("--store-dir", help="default: <project>/data/runs")
    r.add_argument("--run-id", help="default: <timestamp>-<suite name>")
    r.add_argument("--tolerate-failures", action="store_true",
                   help="exit 0 even when a notebook failed, measured nothing, or lost some points (default: exit 1)")
    r.add_argument("--quiet", action="store_true", help="do not stream the notebooks' progress lines")
    r.add_argument("--budget-s", type=float, metavar="S",
                   help="launch no point that would not finish within S seconds of the start (judged by the longest "
                        "a point like it took in the store); a later run goes on from the store")
    r.set_defaults(fn=_cmd_run)

    d = sub.add_parser("doctor", help="check this machine end to end: environments, CPU, model, one real token per "
                       "configuration class, NVML, nsys, disk")
    d.add_argument("--suite", help="the suite whose engine and model to check (default data/suites/default.yaml)")
    d.add_argument("--quick", action="store_true",
                   help="launch nothing: token results from the cache of this engine environment, CPU and model")
    d.set_defaults(fn=_cmd_doctor)

    e = sub.add_parser("engines", help="list engines and their managed environments")
    e.set_defaults(fn=_cmd_engines)

    ee = sub.add_parser("engine-env", help="create an engine's managed environment if missing; print its python")
    ee.add_argument("engine", nargs="?", default="vllm")
    ee.add_argument("--version")
    ee.set_defaults(fn=_cmd_engine_env)

    m = sub.add_parser("make-model", help="build the tiny random-weight MoE model if missing; print its folder")
    m.add_argument("--spec", help='JSON of TinyModelSpec fields, e.g. \'{"num_layers": 2}\'')
    m.add_argument("--python", help="interpreter with torch+transformers (default: the managed vLLM env)")
    m.set_defaults(fn=_cmd_make_model)

    x = sub.add_parser("store-export", help="copy complete points of a store (e.g. into data/reference/store)")
    x.add_argument("dest")
    x.add_argument("--store-dir", help="default: <project>/data/runs")
    x.add_argument("--keep-logs", action="store_true", help="also copy the server logs")
    x.set_defaults(fn=_cmd_store_export)

    ib = sub.add_parser("import-bench", help="read a vllm bench serve JSON or sglang bench_serving JSONL result")
    ib.add_argument("file")
    ib.add_argument("--out", help="folder to write summary.parquet (and requests.parquet) into")
    ib.set_defaults(fn=_cmd_import_bench)

    kk = sub.add_parser("kernels", help="analyse a stored trace: nsys .sqlite, parquetdir folder or .nsys-rep, or PyTorch "
                        "profiler .json(.gz)")
    kk.add_argument("trace")
    kk.add_argument("--range", help="only this NVTX range (e.g. 'servescope c=8')")
    kk.add_argument("--top", type=int, default=15, help="how many kernels to list (default 15)")
    kk.set_defaults(fn=_cmd_kernels)

    ce = sub.add_parser("check-engines", help="every SGLang / vLLM / transformers release from its published source: "
                                             "flags, each knob's plan, audit rows (network to the package index)")
    ce.add_argument("--engine", action="append", choices=["sglang", "vllm", "transformers"],
                    help="only this engine (repeatable; default all three)")
    ce.add_argument("--version", action="append", help="only these releases, e.g. sglang=0.5.14,0.5.23 (repeatable)")
    ce.add_argument("--subset", action="store_true", help="the releases CI reads: one per declaration and audit form")
    ce.add_argument("--csv", default="data/engines/matrix.csv", help="matrix CSV (default data/engines/matrix.csv)")
    ce.add_argument("--knobs-csv", default="data/engines/knobs.csv", help="every release's knob plans")
    ce.add_argument("--readme", action="store_true", help="write the engine table of docs/engines.md (full run, clean only)")
    ce.set_defaults(fn=_cmd_check_engines)

    for name, fn, what in (("audit", _cmd_audit, "list every place in an engine's source that turns CUDA graphs off "
                                                 "or chooses graph use"),
                           ("flags", _cmd_flags, "the CLI flags an engine version defines and how each knob maps")):
        v = sub.add_parser(name, help=what)
        v.add_argument("engine", nargs="?", default="vllm", help="sglang, vllm or transformers (default vllm)")
        v.add_argument("--wheel", help="read a published version without installing it, e.g. sglang==0.5.23")
        v.add_argument("--python", help="interpreter of an environment with the engine (default: managed one)")
        if name == "audit":
            v.add_argument("--condition", help="only rules whose condition matches this regex")
            v.add_argument("--effect", help="only rules whose effect matches this regex")
            v.add_argument("--kind", choices=["startup", "per-batch"])
            v.add_argument("--form", choices=["disables", "chooses"], help="only rules that turn graphs off, or only "
                           "those that choose graph use from a computed condition")
            v.add_argument("--out", help="also write the table as CSV")
        else:
            v.add_argument("--all", action="store_true", help="list every flag with file:line")
        v.set_defaults(fn=fn)

    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO if a.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return a.fn(a)
    except ServescopeError as ex:
        print(f"servescope: error: {ex}", file=sys.stderr)
        return 2
    except OSError as ex:  # an unwritable --out, a full disk: one line, not a traceback
        print(f"servescope: error: {ex.strerror or ex}: {ex.filename or ''}".rstrip(": "), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("servescope: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
