"""Which command-line flags an engine version defines, from its source (no import, no install), or from its
`--help` where it runs. Knob translation checks every flag it emits against this set.

Where the flags are declared:
- SGLang up to 0.5.9: argparse `add_argument("--flag", ...)` in `sglang/srt/server_args.py`.
- SGLang 0.5.2x: annotated msgspec fields (`name: A[type, "help"]` or `A[type, Arg(...)]`) under
  `sglang/srt/arg_groups/fields/`, each `--name-with-dashes` unless `Arg(no_cli=True)`, plus `cli_name`/`aliases`,
  plus the argparse calls left in `server_args.py` (deprecated spellings among them).
- vLLM: `add_argument` calls in `vllm/engine/arg_utils.py` (engine arguments) and the frontend dataclass fields
  (`*FrontendArgs`) and calls in `vllm/entrypoints/launchers/cli_args.py` (older: `entrypoints/openai/cli_args.py`).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

import pandas as pd

from ..errors import ServescopeError
from .source import SourceTree, parse_source

FLAG_COLUMNS = ["flag", "dest", "file", "line", "deprecated", "kind", "choices"]


@dataclass(frozen=True)
class FlagSet:
    """The flags one engine version defines (a table, one row per spelling)."""

    engine: str
    version: str
    table: pd.DataFrame
    origin: str  # what was read: 'sglang 0.5.23 (wheel)', '--help of ...'

    def has(self, flag: str) -> bool:
        """Whether the version defines this spelling."""
        return flag in self._flags

    def is_deprecated(self, flag: str) -> bool:
        """Whether the version marks this spelling deprecated."""
        rows = self.table[self.table["flag"] == flag]
        return bool(len(rows)) and bool(rows["deprecated"].all())

    def choices(self, flag: str) -> list[str] | None:
        """Literal choices of a flag where the source lists them inline, else None."""
        rows = self.table[(self.table["flag"] == flag) & self.table["choices"].notna()]
        return list(rows["choices"].iloc[0]) if len(rows) else None

    @property
    def _flags(self) -> frozenset[str]:
        return frozenset(self.table["flag"])

    def __len__(self) -> int:
        return len(self._flags)


def _const_str(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _str_list(node: ast.AST | None, constants: dict[str, list[str]] | None = None) -> list[str]:
    """Literal strings of a list/tuple/set, or of a module-level list it names (e.g. MOE_RUNNER_BACKEND_CHOICES)."""
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [s for e in node.elts if (s := _const_str(e)) is not None]
    if isinstance(node, ast.Name) and constants:
        return list(constants.get(node.id, []))
    return []


def literal_lists(source: str) -> dict[str, list[str]]:
    """Module-level `NAME = [\"a\", \"b\", ...]` assignments of one file."""
    out = {}
    for st in parse_source(source).body:
        if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name) and \
                isinstance(st.value, (ast.List, ast.Tuple)):
            vals = [s for e in st.value.elts if (s := _const_str(e)) is not None]
            if vals and len(vals) == len(st.value.elts):
                out[st.targets[0].id] = vals
    return out


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


def argparse_flags(source: str, file: str, constants: dict[str, list[str]] | None = None) -> list[dict]:
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
        choices = _str_list(_kw(node, "choices"), constants) or None
        bool_opt = "BooleanOptionalAction" in ast.unparse(_kw(node, "action") or ast.Constant(""))
        for n in names:
            rows.append({"flag": n, "dest": dest, "file": file, "line": node.lineno, "deprecated": _is_deprecated(node),
                         "kind": "argparse", "choices": choices})
            if bool_opt and n.startswith("--"):
                rows.append({"flag": "--no-" + n[2:], "dest": dest, "file": file, "line": node.lineno,
                             "deprecated": _is_deprecated(node), "kind": "argparse", "choices": None})
    return rows


def _annotated_meta(ann: ast.AST) -> ast.AST | None:
    """The metadata element of `A[type, meta]` / `Annotated[type, meta]`, else None."""
    if not isinstance(ann, ast.Subscript):
        return None
    base = ann.value.attr if isinstance(ann.value, ast.Attribute) else getattr(ann.value, "id", "")
    if base not in ("A", "Annotated") or not isinstance(ann.slice, ast.Tuple) or len(ann.slice.elts) < 2:
        return None
    return ann.slice.elts[1]


def sglang_field_flags(source: str, file: str, constants: dict[str, list[str]] | None = None) -> list[dict]:
    """CLI flags of SGLang's annotated config fields (0.5.2x `srt/arg_groups/fields/`)."""
    rows = []
    for cls in ast.walk(parse_source(source)):
        if not isinstance(cls, ast.ClassDef):
            continue
        for st in cls.body:
            if not (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)):
                continue
            meta = _annotated_meta(st.annotation)
            if meta is None:
                continue
            name = st.target.id
            if _const_str(meta) is not None:
                names, choices, bool_opt, help_text = ["--" + name.replace("_", "-")], None, False, _const_str(meta)
            elif isinstance(meta, ast.Call) and getattr(meta.func, "id", "") == "Arg":
                no_cli = _kw(meta, "no_cli")
                if isinstance(no_cli, ast.Constant) and no_cli.value is True:
                    continue
                cli = _const_str(_kw(meta, "cli_name")) if _kw(meta, "cli_name") is not None else None
                names = [cli or "--" + name.replace("_", "-"), *_str_list(_kw(meta, "aliases"))]
                choices = _str_list(_kw(meta, "choices"), constants) or None
                bool_opt = "BooleanOptionalAction" in ast.unparse(_kw(meta, "action") or ast.Constant(""))
                help_text = _const_str(_kw(meta, "help")) or "" if _kw(meta, "help") is not None else ""
            else:
                continue
            deprecated = bool(re.match(r"\W*\(?deprecated", help_text or "", re.IGNORECASE))
            for n in names:
                rows.append({"flag": n, "dest": name, "file": file, "line": st.lineno, "deprecated": deprecated,
                             "kind": "field", "choices": choices})
            if bool_opt:
                rows.append({"flag": "--no-" + names[0][2:], "dest": name, "file": file, "line": st.lineno,
                             "deprecated": deprecated, "kind": "field", "choices": None})
    return rows


def vllm_frontend_flags(source: str, file: str) -> list[dict]:
    """vLLM's frontend arguments: fields of the `*FrontendArgs` dataclasses, each `--field-name`."""
    rows = []
    for cls in ast.walk(parse_source(source)):
        if not (isinstance(cls, ast.ClassDef) and cls.name.endswith("FrontendArgs")):
            continue
        for st in cls.body:
            if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and not st.target.id.startswith("_"):
                flag = "--" + st.target.id.replace("_", "-")
                rows.append({"flag": flag, "dest": st.target.id, "file": file, "line": st.lineno, "deprecated": False,
                             "kind": "field", "choices": None})
                if ast.unparse(st.annotation) == "bool":
                    rows.append({"flag": "--no-" + flag[2:], "dest": st.target.id, "file": file, "line": st.lineno,
                                 "deprecated": False, "kind": "field", "choices": None})
    return rows


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


def scan_flags(tree: SourceTree) -> FlagSet:
    """The CLI flags the engine version in this source tree defines (static: nothing imported)."""
    rows: list[dict] = []
    if tree.package == "sglang":
        constants: dict[str, list[str]] = {}
        for f in ("sglang/srt/arg_groups/choices.py", "sglang/srt/server_args.py"):
            if tree.exists(f):
                constants |= literal_lists(tree.read(f))
        for f in tree.files("sglang/srt/arg_groups/fields/"):
            rows += sglang_field_flags(tree.read(f), f, constants)
        if tree.exists("sglang/srt/server_args.py"):
            rows += argparse_flags(tree.read("sglang/srt/server_args.py"), "sglang/srt/server_args.py", constants)
    elif tree.package == "vllm":
        for f in ("vllm/engine/arg_utils.py", "vllm/entrypoints/launchers/cli_args.py",
                  "vllm/entrypoints/openai/cli_args.py"):
            if tree.exists(f):
                text = tree.read(f)
                rows += argparse_flags(text, f) + vllm_frontend_flags(text, f)
        # FlexibleArgumentParser rewrites -O<n> to --optimization-level, and takes -cc.<key> dotted overrides
    elif tree.package == "transformers":
        if tree.exists("transformers/cli/serve.py"):
            rows += typer_flags(tree.read("transformers/cli/serve.py"), "transformers/cli/serve.py")
    else:
        raise ServescopeError(f"no flag scan for package {tree.package!r} (knows sglang, vllm, transformers)")
    if not rows:
        raise ServescopeError(f"{tree.label()}: no CLI flags found where this version should declare them")
    table = pd.DataFrame(rows, columns=FLAG_COLUMNS).drop_duplicates("flag", keep="first", ignore_index=True)
    return FlagSet(engine=tree.package, version=tree.version, table=table, origin=tree.label())


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
    for chunk in usage + options:
        for m in _HELP_FLAG.finditer(chunk):
            flag = m.group(1).rstrip(".,")
            if flag != "-h" and len(flag) > 2:
                rows.append({"flag": flag, "dest": None, "file": None, "line": None, "deprecated": False,
                             "kind": "help", "choices": None})
    table = pd.DataFrame(rows, columns=FLAG_COLUMNS).drop_duplicates("flag", ignore_index=True)
    return FlagSet(engine=engine, version=version, table=table, origin=origin)
