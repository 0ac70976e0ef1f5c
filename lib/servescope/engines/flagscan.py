"""Which command-line flags an engine version defines, from its source (no import, no install), or from its
`--help` where it runs. Knob translation checks every flag it emits against this set.

Where the flags are declared:
- SGLang up to 0.5.9: argparse `add_argument("--flag", ...)` in `sglang/srt/server_args.py`.
- SGLang 0.5.2x: annotated msgspec fields (`name: A[type, "help"]` or `A[type, Arg(...)]`) under
  `sglang/srt/arg_groups/fields/`, each `--name-with-dashes` unless `Arg(no_cli=True)`, plus `cli_name`/`aliases`,
  plus the argparse calls left in `server_args.py` (deprecated spellings among them).
- SGLang 0.5.14-0.5.19: the same annotated fields, in the `ServerArgs` dataclass of `server_args.py`.
  Choices: `Arg(choices=...)` (a list, a named constant, a class constant such as `Backend.ALL`, an enum), else the
  field's `Literal[...]` type; per-phase backends narrowed by `ALLOWED_BACKENDS_PER_PHASE`.
- vLLM: `add_argument` calls in `vllm/engine/arg_utils.py` (engine arguments; choices from the Literal type of the
  config field behind each) and the `FrontendArgs` dataclass (with its bases) in `vllm/entrypoints/*/cli_args.py`
  (openai/ before 0.31, launchers/ in 0.31-0.32, common/ in 0.33).
- transformers: typer parameters of `transformers/cli/serve.py` (the model is the positional `force_model`).
A scan that misses a flag every launch needs (CORE_FLAGS) raises instead of returning a short list.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ..errors import KnobError, ServescopeError
from .source import SourceTree, parse_source

FLAG_COLUMNS = ["flag", "dest", "file", "line", "deprecated", "kind", "choices"]


@dataclass(frozen=True)
class FlagSet:
    """The flags one engine version defines (a table, one row per spelling)."""

    engine: str
    version: str
    table: pd.DataFrame
    origin: str  # what was read: 'sglang 0.5.23 (wheel)', '--help of ...'
    phases: dict[str, list[str]] = field(default_factory=dict)  # per-phase allowed values, where the version has them
    enums: dict[str, list[str]] = field(default_factory=dict)  # members of enums whose names are knob values
    # where `--help` was the truth: flags it and the static scan do not share (flag, in: 'source only'/'--help only')
    disagreements: pd.DataFrame | None = None

    def check_value(self, flag: str, value: Any) -> None:
        """KnobError if the version restricts this flag's values and this one is not among them."""
        allowed = self.choices(flag)
        if allowed is not None and str(value) not in allowed:
            raise KnobError(f"{self.engine} {self.version}: {flag} {value} is not accepted; it takes "
                            f"{', '.join(allowed)} (read from {self.origin})")

    def has(self, flag: str) -> bool:
        """Whether the version defines this spelling."""
        return flag in self._flags

    def is_deprecated(self, flag: str) -> bool:
        """Whether the version marks this spelling deprecated."""
        rows = self.table[self.table["flag"] == flag]
        return bool(len(rows)) and bool(rows["deprecated"].all())

    def choices(self, flag: str) -> list[str] | None:
        """The values a flag accepts where the source restricts them (inline lists, named constants, Literal types,
        enums; per-phase flags narrowed to what their phase allows), else None."""
        rows = self.table[(self.table["flag"] == flag) & self.table["choices"].notna()]
        return list(rows["choices"].iloc[0]) if len(rows) else None

    @property
    def _flags(self) -> frozenset[str]:
        return frozenset(self.table["flag"])

    def __len__(self) -> int:
        return len(self._flags)


def _const_str(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


_ENUM_BASES = ("Enum", "StrEnum", "IntEnum")
_SEQ_CALLS = ("list", "tuple", "sorted", "set", "frozenset")


class Constants:
    """String constants an engine's flag declarations refer to, read statically: module-level lists, tuples, sets
    and dicts (their keys), class attributes (`Backend.ALL = (FULL, BREAKABLE)`), enum members, and `Literal[...]`
    type aliases, gathered from the declaring files and the engine modules they import."""

    def __init__(self) -> None:
        self.nodes: dict[str, tuple[ast.AST, str | None]] = {}  # name or Class.attr -> (value, class it lives in)
        self.enums: dict[str, dict[str, ast.AST]] = {}  # enum class -> member -> value node

    def add(self, source: str | ast.Module) -> Constants:
        """Take the constants of one file (later files do not override earlier ones)."""
        mod = parse_source(source) if isinstance(source, str) else source
        for st in mod.body:
            self._take(st, None)
            if isinstance(st, ast.ClassDef):
                bases = {b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in st.bases}
                members: dict[str, ast.AST] = {}
                for sub in st.body:
                    self._take(sub, st.name)
                    if isinstance(sub, ast.Assign) and len(sub.targets) == 1 and isinstance(sub.targets[0], ast.Name):
                        members[sub.targets[0].id] = sub.value
                if bases & set(_ENUM_BASES) and members:
                    self.enums.setdefault(st.name, members)
        return self

    def _take(self, st: ast.stmt, cls: str | None) -> None:
        target, value = None, None
        if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name):
            target, value = st.targets[0].id, st.value
        elif isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and st.value is not None:
            target, value = st.target.id, st.value
        if target is not None and value is not None:
            self.nodes.setdefault(f"{cls}.{target}" if cls else target, (value, cls))

    def enum_members(self, name: str) -> list[str] | None:
        """Member names of an enum class (e.g. CUDAGraphMode), None if not found."""
        return list(self.enums[name]) if name in self.enums else None

    def resolve(self, node: ast.AST | None, cls: str | None = None, depth: int = 0) -> list[str] | None:
        """The strings a choices expression or Literal stands for; None where any part cannot be read statically
        (a partial list would refuse values the engine accepts)."""
        if node is None or depth > 12:
            return None
        r = lambda n, c=cls: self.resolve(n, c, depth + 1)  # noqa: E731
        if isinstance(node, ast.Constant):
            return [] if node.value is None else [str(node.value)] if isinstance(node.value, (str, int)) else None
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            parts = [r(e.value if isinstance(e, ast.Starred) else e) for e in node.elts]
            return None if any(p is None for p in parts) else [x for p in parts for x in p]  # type: ignore[union-attr]
        if isinstance(node, ast.Dict):
            return r(ast.List(elts=[k for k in node.keys if k is not None]))
        if isinstance(node, ast.Name):
            if cls and f"{cls}.{node.id}" in self.nodes:
                return r(*self.nodes[f"{cls}.{node.id}"])
            if node.id in self.nodes:
                return r(*self.nodes[node.id])
            if node.id in self.enums:
                return self._enum_values(node.id, depth)
            return None
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            owner, attr = node.value.id, node.attr
            if owner in self.enums and attr in self.enums[owner]:
                return r(self.enums[owner][attr], owner)
            if f"{owner}.{attr}" in self.nodes:
                return r(*self.nodes[f"{owner}.{attr}"])
            return None
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = r(node.left), r(node.right)
            return None if left is None or right is None else left + right
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):  # Literal[...] | None
            left, right = r(node.left), r(node.right)
            return None if left is None or right is None else left + right
        return self._resolve_compound(node, cls, depth)

    def _resolve_compound(self, node: ast.AST, cls: str | None, depth: int) -> list[str] | None:
        """resolve() of calls (list(...), d.keys()), comprehensions over enums, and Literal/Optional/Union."""
        r = lambda n, c=cls: self.resolve(n, c, depth + 1)  # noqa: E731
        if isinstance(node, ast.Call):
            fn = node.func
            if isinstance(fn, ast.Name) and fn.id in _SEQ_CALLS and len(node.args) == 1:
                return r(node.args[0])
            if isinstance(fn, ast.Attribute) and fn.attr == "keys" and not node.args:
                return r(fn.value)
            return None
        if isinstance(node, (ast.ListComp, ast.GeneratorExp, ast.SetComp)) and len(node.generators) == 1:
            it = node.generators[0].iter
            name = it.id if isinstance(it, ast.Name) else None
            if name in self.enums:
                if isinstance(node.elt, ast.Attribute) and node.elt.attr == "name":
                    return list(self.enums[name])
                return self._enum_values(name, depth)
            return None
        if isinstance(node, ast.Subscript):
            base = node.value.attr if isinstance(node.value, ast.Attribute) else getattr(node.value, "id", "")
            if base == "Literal":
                return r(node.slice if isinstance(node.slice, ast.Tuple) else ast.Tuple(elts=[node.slice]))
            if base == "Optional":
                return r(node.slice)
            if base == "Union" and isinstance(node.slice, ast.Tuple):
                return r(ast.BinOp(left=node.slice.elts[0], op=ast.BitOr(),
                                   right=node.slice.elts[1] if len(node.slice.elts) == 2 else
                                   ast.Subscript(value=ast.Name("Union"), slice=ast.Tuple(elts=node.slice.elts[1:]))))
            return None
        return None

    def _enum_values(self, name: str, depth: int) -> list[str] | None:
        out: list[str] = []
        for v in self.enums[name].values():
            got = self.resolve(v, name, depth + 1)
            if got is None:
                return None
            out += got
        return out

    def literal(self, annotation: ast.AST | None) -> list[str] | None:
        """Choices of a field typed `Literal[...]` (also inside Optional/Union/`| None`, or through a type alias)."""
        if annotation is None:
            return None
        names = {n.id if isinstance(n, ast.Name) else getattr(n, "attr", "") for n in ast.walk(annotation)}
        via_alias = any(isinstance(self.nodes.get(n, (None,))[0], ast.Subscript) and "Literal" in
                        ast.unparse(self.nodes[n][0]) for n in names if n)
        if "Literal" not in names and not via_alias:
            return None
        got = self.resolve(annotation)
        return got or None


def _choices(node: ast.AST | None, constants: Constants | None) -> list[str] | None:
    if node is None:
        return None
    if constants is None:
        constants = Constants()
    return constants.resolve(node) or None


def _is_deprecated(call: ast.Call) -> bool:
    for kw in call.keywords:
        if kw.arg == "action" and "Deprecated" in ast.unparse(kw.value):
            return True
        if kw.arg == "help":
            text = _const_str(kw.value) or (ast.unparse(kw.value) if isinstance(kw.value, ast.JoinedStr) else "")
            if re.match(r"\W*\(?deprecated", text, re.IGNORECASE):
                return True
    return False


def _kw(call: ast.Call, name: str) -> ast.AST | None:
    return next((kw.value for kw in call.keywords if kw.arg == name), None)


def argparse_flags(source: str, file: str, constants: Constants | None = None) -> list[dict]:
    """Every `*.add_argument('--x', '-y', ...)` with literal option strings in one file."""
    rows = []
    for node in ast.walk(parse_source(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"):
            continue
        names = [s for a in node.args if (s := _const_str(a)) is not None and s.startswith("-")]
        if not names:
            continue
        dest = _const_str(_kw(node, "dest")) if _kw(node, "dest") is not None else None
        dest = dest or next((n for n in names if n.startswith("--")), names[0]).lstrip("-").replace("-", "_")
        choices = _choices(_kw(node, "choices"), constants)
        bool_opt = "BooleanOptionalAction" in ast.unparse(_kw(node, "action") or ast.Constant(""))
        for n in names:
            rows.append({"flag": n, "dest": dest, "file": file, "line": node.lineno, "deprecated": _is_deprecated(node),
                         "kind": "argparse", "choices": choices})
            if bool_opt and n.startswith("--"):
                rows.append({"flag": "--no-" + n[2:], "dest": dest, "file": file, "line": node.lineno,
                             "deprecated": _is_deprecated(node), "kind": "argparse", "choices": None})
    return rows


def _annotated(ann: ast.AST) -> tuple[ast.AST, ast.AST] | None:
    """(type, metadata) of `A[type, meta]` / `Annotated[type, meta]`, else None."""
    if not isinstance(ann, ast.Subscript):
        return None
    base = ann.value.attr if isinstance(ann.value, ast.Attribute) else getattr(ann.value, "id", "")
    if base not in ("A", "Annotated") or not isinstance(ann.slice, ast.Tuple) or len(ann.slice.elts) < 2:
        return None
    return ann.slice.elts[0], ann.slice.elts[1]


def _annotated_meta(ann: ast.AST) -> ast.AST | None:
    got = _annotated(ann)
    return got[1] if got else None


def sglang_field_flags(source: str, file: str, constants: Constants | None = None) -> list[dict]:
    """CLI flags of SGLang's annotated config fields, `name: A[type, "help"]` or `A[type, Arg(...)]`: in the
    `ServerArgs` dataclass of `srt/server_args.py` (0.5.14-0.5.19) or under `srt/arg_groups/fields/` (0.5.20+).
    Choices as SGLang derives them: `Arg(choices=...)` first, else a `Literal[...]` type."""
    rows = []
    for cls in ast.walk(parse_source(source)):
        if not isinstance(cls, ast.ClassDef):
            continue
        for st in cls.body:
            if not (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)):
                continue
            got = _annotated(st.annotation)
            if got is None:
                continue
            typ, meta = got
            name = st.target.id
            literal = constants.literal(typ) if constants else None
            if _const_str(meta) is not None:
                names, choices, help_text = ["--" + name.replace("_", "-")], literal, _const_str(meta)
                action = ""
            elif isinstance(meta, ast.Call) and getattr(meta.func, "id", "") == "Arg":
                no_cli = _kw(meta, "no_cli")
                if isinstance(no_cli, ast.Constant) and no_cli.value is True:
                    continue
                cli = _const_str(_kw(meta, "cli_name")) if _kw(meta, "cli_name") is not None else None
                aliases = _choices(_kw(meta, "aliases"), constants) or []
                names = [cli or "--" + name.replace("_", "-"), *aliases]
                choices = _choices(_kw(meta, "choices"), constants) if _kw(meta, "choices") is not None else literal
                action = ast.unparse(_kw(meta, "action") or ast.Constant(""))
                help_text = _const_str(_kw(meta, "help")) or "" if _kw(meta, "help") is not None else ""
            else:
                continue
            deprecated = bool(re.match(r"\W*\(?deprecated", help_text or "", re.IGNORECASE))
            for n in names:
                rows.append({"flag": n, "dest": name, "file": file, "line": st.lineno, "deprecated": deprecated,
                             "kind": "field", "choices": choices})
            if "BooleanOptionalAction" in action:
                rows.append({"flag": "--no-" + names[0][2:], "dest": name, "file": file, "line": st.lineno,
                             "deprecated": deprecated, "kind": "field", "choices": None})
    return rows


def vllm_frontend_flags(source: str, file: str, constants: Constants | None = None) -> list[dict]:
    """vLLM's server arguments: fields of its `FrontendArgs` dataclass and the classes it derives from in the same
    file (`BaseFrontendArgs` in 0.33), each `--field-name`."""
    rows = []
    classes = {c.name: c for c in ast.walk(parse_source(source)) if isinstance(c, ast.ClassDef)}
    wanted, todo = set(), ["FrontendArgs"]
    while todo:
        name = todo.pop()
        if name in classes and name not in wanted:
            wanted.add(name)
            todo += [b.id for b in classes[name].bases if isinstance(b, ast.Name)]
    for cls in (classes[n] for n in wanted):
        for st in cls.body:
            if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and not st.target.id.startswith("_"):
                flag = "--" + st.target.id.replace("_", "-")
                choices = constants.literal(st.annotation) if constants else None
                rows.append({"flag": flag, "dest": st.target.id, "file": file, "line": st.lineno, "deprecated": False,
                             "kind": "field", "choices": choices})
                if ast.unparse(st.annotation) == "bool":
                    rows.append({"flag": "--no-" + flag[2:], "dest": st.target.id, "file": file, "line": st.lineno,
                                 "deprecated": False, "kind": "field", "choices": None})
    return rows


def config_field_choices(source: str, constants: Constants) -> dict[str, list[str]]:
    """Literal choices of the fields of every class in a file (vLLM derives a flag's choices from the Literal type
    of the config field behind it: `moe_backend: MoEBackend = "auto"`)."""
    out: dict[str, list[str]] = {}
    for cls in ast.walk(parse_source(source)):
        if isinstance(cls, ast.ClassDef):
            for st in cls.body:
                if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
                    got = constants.literal(st.annotation)
                    if got:
                        out.setdefault(st.target.id, got)
    return out


def typer_flags(source: str, file: str) -> list[dict]:
    """Parameters declared `name: Annotated[T, typer.Option(...)]` (flag `--name`, bools also `--no-name`) or
    `typer.Argument(...)` (positional, recorded as `<name>`), as `transformers serve` declares its CLI."""
    rows = []
    for fn in ast.walk(parse_source(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for arg in fn.args.args + fn.args.kwonlyargs:
            meta = _annotated_meta(arg.annotation) if arg.annotation is not None else None
            if not (isinstance(meta, ast.Call) and isinstance(meta.func, ast.Attribute)):
                continue
            kind = meta.func.attr
            if kind == "Argument":
                rows.append({"flag": f"<{arg.arg}>", "dest": arg.arg, "file": file, "line": arg.lineno,
                             "deprecated": False, "kind": "positional", "choices": None})
            elif kind == "Option":
                names = [s for a in meta.args if (s := _const_str(a)) and s.startswith("-")] or \
                    ["--" + arg.arg.replace("_", "-")]
                typ = ast.unparse(arg.annotation.slice.elts[0])  # type: ignore[attr-defined]
                for n in names:
                    rows.append({"flag": n, "dest": arg.arg, "file": file, "line": arg.lineno, "deprecated": False,
                                 "kind": "option", "choices": None})
                if typ.split("|")[0].strip() == "bool" and names[0].startswith("--"):
                    rows.append({"flag": "--no-" + names[0][2:], "dest": arg.arg, "file": file, "line": arg.lineno,
                                 "deprecated": False, "kind": "option", "choices": None})
    return rows


def _module_file(tree: SourceTree, here: str, node: ast.ImportFrom) -> str | None:
    """The package file an `import from` names (absolute within the package, or relative to `here`)."""
    if node.level:
        base = here.rsplit("/", node.level)[0]
        mod = f"{base}/{node.module.replace('.', '/')}" if node.module else base
    elif node.module and node.module.split(".")[0] == tree.package:
        mod = node.module.replace(".", "/")
    else:
        return None
    for cand in (f"{mod}.py", f"{mod}/__init__.py"):
        if tree.exists(cand):
            return cand
    return None


def _constants_for(tree: SourceTree, files: list[str]) -> Constants:
    """The constants of these files and of the package modules they import (one level: where SGLang keeps
    `Backend`, `ALLOWED_BACKENDS_PER_PHASE` and its choices lists)."""
    c = Constants()
    seen: set[str] = set()
    for f in files:
        mod = parse_source(tree.read(f))
        c.add(mod)
        seen.add(f)
        for node in ast.walk(mod):
            if isinstance(node, ast.ImportFrom) and (dep := _module_file(tree, f, node)) and dep not in seen:
                seen.add(dep)
                try:
                    c.add(tree.read(dep))
                except SyntaxError:
                    continue
    return c


def phase_values(constants: Constants) -> dict[str, list[str]]:
    """Per-phase allowed values (SGLang's `ALLOWED_BACKENDS_PER_PHASE = {Phase.DECODE: (...), ...}`), phase name ->
    values; {} where the version has no such table."""
    for name, (node, cls) in constants.nodes.items():
        if cls is None and "PER_PHASE" in name and isinstance(node, ast.Dict):
            out = {}
            for k, v in zip(node.keys, node.values, strict=True):
                key, vals = constants.resolve(k), constants.resolve(v)
                if key and vals is not None:
                    out[key[0]] = vals
            if out:
                return out
    return {}


# the flags every launch needs, per engine: each entry is alternatives (a positional is written <name>)
CORE_FLAGS = {"sglang": (("--model-path",), ("--host",), ("--port",)),
              "vllm": (("--model", "<model_tag>"), ("--host",), ("--port",)),
              "transformers": (("<force_model>", "--force-model"), ("--host",), ("--port",))}


def scan_flags(tree: SourceTree) -> FlagSet:
    """The CLI flags the engine version in this source tree defines (static: nothing imported). Raises when the
    scan misses a flag every launch needs (the declarations moved to a form this scan does not read)."""
    rows: list[dict] = []
    phases: dict[str, list[str]] = {}
    enums: dict[str, list[str]] = {}
    if tree.package == "sglang":
        decl = [f for f in ("sglang/srt/server_args.py",) if tree.exists(f)] + tree.files("sglang/srt/arg_groups/fields/")
        extra = [f for f in ("sglang/srt/arg_groups/choices.py", "sglang/srt/model_executor/cuda_graph_config.py")
                 if tree.exists(f)]
        consts = _constants_for(tree, decl + extra)
        phases = phase_values(consts)
        for f in decl:
            text = tree.read(f)
            rows += sglang_field_flags(text, f, consts) + argparse_flags(text, f, consts)
    elif tree.package == "vllm":
        # the server's frontend arguments moved between releases (entrypoints/openai/, launchers/, common/)
        decl = [f for f in ("vllm/engine/arg_utils.py",) if tree.exists(f)] + \
            [f for f in tree.files("vllm/entrypoints/") if f.endswith("/cli_args.py")]
        cfg_files = tree.files("vllm/config/")
        consts = _constants_for(tree, decl + cfg_files)
        fields: dict[str, list[str]] = {}
        for f in cfg_files:
            try:
                fields |= {k: v for k, v in config_field_choices(tree.read(f), consts).items() if k not in fields}
            except SyntaxError:
                continue
        for f in decl:
            text = tree.read(f)
            rows += argparse_flags(text, f, consts) + vllm_frontend_flags(text, f, consts)
        for r in rows:  # EngineArgs takes a flag's choices from the Literal type of its config field
            if r["choices"] is None and r["kind"] == "argparse" and r["dest"] in fields and \
                    not r["flag"].startswith("--no-"):
                r["choices"] = fields[r["dest"]]
        enums = {k: list(v) for k, v in consts.enums.items() if k in ("CUDAGraphMode", "CompilationMode")}
        # FlexibleArgumentParser rewrites -O<n> to --optimization-level, and takes -cc.<key> dotted overrides
    elif tree.package == "transformers":
        if tree.exists("transformers/cli/serve.py"):
            rows += typer_flags(tree.read("transformers/cli/serve.py"), "transformers/cli/serve.py")
    else:
        raise ServescopeError(f"no flag scan for package {tree.package!r} (knows sglang, vllm, transformers)")
    if not rows:
        raise ServescopeError(f"{tree.label()}: no CLI flags found where this version should declare them")
    table = pd.DataFrame(rows, columns=FLAG_COLUMNS).drop_duplicates("flag", keep="first", ignore_index=True)
    if phases:  # a per-phase flag accepts only what its phase allows
        for i, r in table.iterrows():
            phase = next((p for p in phases if str(r["dest"]).endswith("_" + p)), None)
            if phase and r["choices"] is not None and set(r["choices"]) & set(phases[phase]):
                table.at[i, "choices"] = [c for c in r["choices"] if c in phases[phase]]
    fs = FlagSet(engine=tree.package, version=tree.version, table=table, origin=tree.label(), phases=phases,
                 enums=enums)
    missing = [" or ".join(alt) for alt in CORE_FLAGS.get(tree.package, ()) if not any(fs.has(f) for f in alt)]
    if missing:
        raise ServescopeError(f"{tree.label()}: the flag scan found {len(fs)} flags but not {', '.join(missing)}, "
                              "which every launch needs: this version declares its flags in a form servescope does "
                              "not read yet (pass its --help with engine.help_from_server, or report it)")
    return fs


_HELP_FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][\w.-]*)")


def help_flags(help_text: str, engine: str, version: str, origin: str) -> FlagSet:
    """The flags a `--help` text lists: the usage block and the option column of each option line (a second
    opinion beside the static scan, for engines that run here)."""
    lines = help_text.splitlines()
    usage: list[str] = []
    for i, line in enumerate(lines):
        if line.startswith("usage:"):
            usage = lines[i:]
            usage = usage[:next((j for j, u in enumerate(usage) if not u.strip()), len(usage))]
            break
    options = [re.split(r"\s{2,}", ln.strip(), maxsplit=1)[0] for ln in lines if ln.strip().startswith("-")]
    rows = []
    for chunk in options + usage:  # option lines first: they carry the choices ('--x {a,b}')
        for m in _HELP_FLAG.finditer(chunk):
            flag = m.group(1).rstrip(".,")
            after = re.match(r"[ =]?\{([^{}]+)\}", chunk[m.end():])
            choices = [c.strip() for c in after.group(1).split(",")] if after else None
            if flag != "-h" and len(flag) > 2:
                rows.append({"flag": flag, "dest": None, "file": None, "line": None, "deprecated": False,
                             "kind": "help", "choices": choices})
    table = pd.DataFrame(rows, columns=FLAG_COLUMNS).drop_duplicates("flag", ignore_index=True)
    return FlagSet(engine=engine, version=version, table=table, origin=origin)
