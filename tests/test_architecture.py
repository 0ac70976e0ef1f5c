"""The shape of lib/: layers imported only downwards and no cycle, engines looked up by name only at entry points,
no function over 60 lines (argument parsing and the regime decision tree aside), threads that hold no file reading
and no store-or-measure logic, and a point's files named only by the store and the server."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

LIB = Path(__file__).resolve().parents[1] / "lib" / "servescope"

# lowest first; a module may import its own layer or any below it
LAYERS: list[tuple[str, ...]] = [
    ("servescope", "errors", "util", "paths", "hostcpu", "pipsources", "deaths", "spec", "plots", "_reaper",
     "_build_tiny_model", "engine_site"),
    ("server", "findings", "models", "architectures", "store", "telemetry", "load", "outputs", "probes", "mps", "install",
     "state", "raypoints"),
    ("analysis",),
    ("engines",),
    ("context", "launch", "profile", "span"),
    ("experiment", "kvlevel", "queries"),
    ("study", "comparison"),
    ("threads",),
    ("nb", "summary", "report", "suite", "doctor", "cli"),
]
# where a name becomes an adapter: the run context, the public launch call, the suite's check, the doctor, CLI verbs,
# the release matrix of `make check-engines`, and the registry itself
# report.check_baseline: a suite run's first step, before any notebook (it refuses a baseline the version cannot spell)
ENTRY_POINTS = {"context.context", "launch.prepare", "suite.load_suite", "doctor.run_doctor", "engines.__init__",
                "engines.matrix.check_engines", "report.check_baseline"}
LONG_ALLOWED = {("cli", "main"), ("analysis.regime", "decide")}
POINT_FILES = ("server.stdout.log", "server.stderr.log", "resolved_config.json", "manifest.json", "replica-")


def _modules() -> dict[str, Path]:
    out = {}
    for p in LIB.rglob("*.py"):
        rel = p.relative_to(LIB).with_suffix("")
        parts = [x for x in rel.parts if x != "__init__"]
        out[".".join(parts) or "servescope"] = p
    return out


MODULES = _modules()


def _target(mod: str, path: Path, node: ast.ImportFrom | ast.Import) -> list[str]:
    if isinstance(node, ast.Import):
        names = [a.name.removeprefix("servescope.") for a in node.names if a.name.startswith("servescope")]
    else:
        if node.level:
            pkg = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
            if mod == "servescope":
                pkg = []
            base = pkg[: len(pkg) - (node.level - 1)]
        elif (node.module or "").startswith("servescope"):
            base = []
        else:
            return []
        full = ".".join(base + ([(node.module or "").removeprefix("servescope").lstrip(".")] if node.module and
                                 node.module != "servescope" else []))
        names = [f"{full}.{a.name}".strip(".") if f"{full}.{a.name}".strip(".") in MODULES else full
                 for a in node.names]
    out = []
    for n in names:
        n = n.strip(".") or "servescope"
        while n not in MODULES and "." in n:
            n = n.rsplit(".", 1)[0]
        if n in MODULES and n != mod:
            out.append(n)
    return out


def _type_only(tree: ast.Module) -> set[int]:
    """The ids of import nodes under `if TYPE_CHECKING:`: names for annotations only, never imported at run time (a
    comparison names the study it belongs to), so neither a cycle nor an import up a layer."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            out |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return out


def _graph() -> dict[str, set[str]]:
    g: dict[str, set[str]] = defaultdict(set)
    for mod, path in MODULES.items():
        tree = ast.parse(path.read_text())
        typed = _type_only(tree)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in typed:
                g[mod].update(_target(mod, path, node))
    return g


def _layer(mod: str) -> int:
    top = mod.split(".")[0]
    for i, names in enumerate(LAYERS):
        if top in names or mod in names:
            return i
    raise AssertionError(f"{mod} is in no layer of tests/test_architecture.py: place it")


def test_every_import_goes_down_the_layers():
    up = [f"{m} (layer {_layer(m)}) imports {t} (layer {_layer(t)})" for m, ts in _graph().items() for t in ts
          if _layer(t) > _layer(m)]
    assert not up, "\n".join(up)


def test_the_import_graph_has_no_cycle():
    g = _graph()
    seen: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(m: str, path: list[str]) -> None:
        seen[m] = 1
        for t in sorted(g.get(m, ())):
            if t.startswith(m + ".") and MODULES[m].name == "__init__.py":
                continue  # a package importing its own modules to register them is not a cycle back into it
            if seen.get(t) == 1:
                cycles.append(path[path.index(t):] + [t] if t in path else [m, t])
            elif t not in seen:
                visit(t, path + [t])
        seen[m] = 2
    for m in sorted(MODULES):
        if m not in seen:
            visit(m, [m])
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def _functions(tree: ast.AST) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    out = []

    def walk(node: ast.AST, prefix: str) -> None:
        for ch in ast.iter_child_nodes(node):
            if isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((prefix + ch.name, ch))
                walk(ch, prefix + ch.name + ".")
            elif isinstance(ch, ast.ClassDef):
                walk(ch, prefix + ch.name + ".")
            else:
                walk(ch, prefix)
    walk(tree, "")
    return out


def test_engines_are_looked_up_by_name_only_at_entry_points():
    calls = []
    for mod, path in MODULES.items():
        tree = ast.parse(path.read_text())
        for name, fn in _functions(tree):
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == \
                        "get_engine":
                    calls.append(f"{mod}.{name.split('.')[0]}")
    outside = sorted({c for c in calls if c not in ENTRY_POINTS and not c.startswith("cli.")})
    assert not outside, f"get_engine called outside the entry points: {outside}"


def test_no_function_is_over_sixty_lines():
    long = [f"{mod}.{name}: {fn.end_lineno - fn.lineno + 1} lines" for mod, path in MODULES.items()
            for name, fn in _functions(ast.parse(path.read_text()))
            if fn.end_lineno - fn.lineno + 1 > 60 and (mod, name) not in LONG_ALLOWED]
    assert not long, "\n".join(long)


FILE_CALLS = {"open", "read_text", "read_bytes", "write_text", "read_parquet", "read_csv", "read_json", "load",
              "is_file", "exists", "glob", "rglob", "iterdir"}
STORE_CALLS = {"Store", "note", "put_note", "read_store", "has", "get", "keys", "put_alias", "drop_partial"}


@pytest.mark.parametrize("path", sorted((LIB / "threads").glob("*.py")), ids=lambda p: p.name)
def test_a_thread_holds_no_file_reading_and_no_store_or_measure_logic(path):
    tree = ast.parse(path.read_text())
    bad = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        owner = f.value if isinstance(f, ast.Attribute) else None
        on_store = isinstance(owner, ast.Attribute) and owner.attr == "store" or \
            isinstance(owner, ast.Name) and owner.id == "store"
        if name in FILE_CALLS and name != "get" or (name in STORE_CALLS and (on_store or isinstance(f, ast.Name))):
            bad.append(f"line {node.lineno}: {ast.unparse(node)[:80]}")
    assert not bad, "\n".join(bad)


def test_only_the_store_and_the_server_name_a_points_files():
    named = [f"{mod}: {s!r}" for mod, path in MODULES.items() if mod not in ("store", "server")
             for s in POINT_FILES if s in path.read_text()]
    assert not named, "\n".join(named)


# a finding's words: what a reader reads, never what code decides on (issue 31: a reworded sentence had changed
# what thread 07 verified and what the summary ranked)
WORDS = ("title", "claim", "reason", "headline", "detail")
# what turns words into a decision: comparing them, searching or cutting them
STRING_TESTS = ("startswith", "endswith", "split", "rsplit", "partition", "rpartition", "replace", "find", "rfind",
                "index", "count", "removeprefix", "removesuffix")
# the renderers: they put a finding's words on the page and decide nothing from them
RENDERERS = {"nb", "report"}


def _words_of(node: ast.AST) -> str | None:
    """'f.title' where node reads one of a finding's words (an attribute named in WORDS), else None."""
    if isinstance(node, ast.Attribute) and node.attr in WORDS:
        return ast.unparse(node)
    return None


def string_tests(source: str) -> list[str]:
    """Every place source tests a finding's words as a string: compares them (==, !=, in), calls a string test on
    them (startswith, split, replace, ...) or passes them to re."""
    hits = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                w = _words_of(side)
                if w is not None:
                    hits.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            w = _words_of(node.func.value)
            if w is not None and node.func.attr in STRING_TESTS:
                hits.append(f"line {node.lineno}: {ast.unparse(node)}")
            base = node.func.value
            if isinstance(base, ast.Name) and base.id == "re" and any(_words_of(a) for a in node.args):
                hits.append(f"line {node.lineno}: {ast.unparse(node)}")
    return hits


def test_no_code_outside_the_renderers_decides_on_a_findings_words():
    bad = {mod: hits for mod, path in MODULES.items() if mod not in RENDERERS
           for hits in [string_tests(path.read_text())] if hits}
    assert not bad, bad


@pytest.mark.parametrize("violation", [
    'if f.title == "torch.compile excludes piecewise CUDA graphs here":\n    pass',
    'x = f.reason.startswith("already optimal")',
    'x = f.claim.split(". ")[0]',
    'x = "Verified" in f.headline',
    'x = re.search("stalled", f.detail)',
    'f.claim = f.claim.replace("The", "the")',
])
def test_the_words_rule_catches_an_injected_violation(violation):
    """The rule fails on each way the library had decided on words (found by the read of issue 31)."""
    clean = (LIB / "threads" / "verify.py").read_text()
    assert not string_tests(clean)
    assert string_tests(clean + "\n\ndef _injected(f):\n" + "\n".join("    " + ln for ln in violation.splitlines()))


def _calls_of(name: str) -> set[str]:
    """Where a function of that name is called: module.function (module-level code as module.<module>)."""
    out = set()
    for mod, path in MODULES.items():
        tree = ast.parse(path.read_text())
        for fn in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and name in (getattr(node.func, "id", None), getattr(node.func, "attr", None)):
                    out.add(f"{mod}.{fn.name}")
    return out


def test_only_a_launch_being_prepared_creates_an_engine_environment():
    """One way to find an install (launch.find_install, which never creates one); the environment is created by
    launch.create_env, called where a launch is prepared and by the CLI verbs that ask for exactly that."""
    assert _calls_of("ensure_engine_env") == {"launch.create_env"}
    assert _calls_of("create_env") == {"launch._install_for_launch", "cli._cmd_engine_env", "cli._cmd_make_model"}
    assert _calls_of("_install_for_launch") == {"launch.prepare"}
    import inspect

    from servescope.launch import find_install
    assert list(inspect.signature(find_install).parameters) == ["engine", "adapter"]


def test_the_moe_probe_takes_one_gpus_share_of_the_deployments_layer():
    from servescope.spec import Knobs, ModelSpec
    from servescope.threads.grouped_gemm import per_gpu, shape_of

    whole = shape_of(ModelSpec(architecture="qwen3-30b-a3b"))
    assert (whole.experts, whole.top_k, whole.inter) == (128, 8, 768)
    assert per_gpu(whole, Knobs()) == (whole, "")
    tp, why = per_gpu(whole, Knobs(tp=8))
    assert (tp.experts, tp.top_k, tp.inter) == (128, 8, 96) and why.startswith("TP=8")
    ep, why = per_gpu(whole, Knobs(tp=8, ep=8))
    assert (ep.experts, ep.top_k, ep.inter) == (16, 1, 768) and "16 of 128 experts" in why


def test_every_thread_declares_itself_and_the_report_imports_none_by_name():
    """A thread is one module the registry lists: its notebook's id, its question, run(ctx, ...) returning its
    result and findings(result) taking that alone; every notebook of the project is a thread's or the summary's; the
    report and the summary reach threads through the registry."""
    import inspect

    from servescope import threads
    from servescope.suite import project_root

    reg = threads.registry()
    assert len(reg) == len(threads.MODULES) and all(t.question.endswith("?") for t in reg.values())
    for info in reg.values():
        mod = __import__(info.module, fromlist=["run", "findings"])
        assert callable(getattr(mod, "findings", None)), info.module
        assert callable(getattr(mod, "run", None)), info.module
        run, found = inspect.signature(mod.run), inspect.signature(mod.findings)
        assert next(iter(run.parameters)) == "ctx", info.module
        required = [p for p in found.parameters.values() if p.default is inspect.Parameter.empty]
        assert len(required) == 1, (info.module, list(found.parameters))
    notebooks = {p.stem for p in (project_root() / "notebooks").glob("*.ipynb")}
    assert notebooks == set(reg) | {"99_summary"}
    assert threads.by_role("verification").id == "07_verified_changes"
    g = _graph()
    for top in ("report", "summary", "nb", "suite", "cli"):
        named = sorted(m for m in g[top] if m.startswith("threads."))
        assert named == [], f"{top} imports thread modules by name: {named}"


def test_the_study_stays_a_facade():
    """study.py is what every thread passes through: arms, the study and run_study. It had grown to 1,094 lines with
    the comparison's statistics and words and the store's and engine's queries in it; those live in comparison.py and
    queries.py, and the facade stays small enough to read at once."""
    lines = MODULES["study"].read_text().splitlines()
    assert len(lines) < 500, f"study.py has {len(lines)} lines: move what is not the facade out"
    assert "class Comparison" not in MODULES["study"].read_text()
