"""Graph-disable audit (thread 1): every place in an engine's source that turns CUDA graphs off, narrows them, or
forces eager execution, found by a static AST scan (nothing imported, so it works on a wheel of an engine that
cannot run here). One row per place: file:line, enclosing function, the condition under which it fires (the
enclosing `if` tests, an `else` as `not (...)`), the effect, the statement, and the log message beside it."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

import pandas as pd

from .logs import call_name, is_log_call, log_template
from .source import SourceTree, parse_source

AUDIT_COLUMNS = ["file", "line", "function", "kind", "effect", "condition", "statement", "message"]

# files worth parsing: those mentioning one of these (the scan of a whole engine stays a few seconds)
_KEYWORDS = re.compile(r"disable_cuda_graph|use_cuda_graph|Backend\.DISABLED|cudagraph_mode|enforce_eager|piecewise_cuda_graph|"
                       r"def can_run|disable_prefill_cuda_graph|disable_decode_cuda_graph|CompilationMode\.NONE")
_SCOPES = {"sglang": ("sglang/srt/",), "vllm": ("vllm/config/", "vllm/v1/", "vllm/platforms/", "vllm/engine/"),
           "transformers": ("transformers/generation/continuous_batching/", "transformers/cli/")}
_CAN_RUN = re.compile(r"can_run\w*(graph|cuda)|can_run_graph|can_use_cuda_graph", re.IGNORECASE)


def _name(target: ast.AST) -> str:
    if isinstance(target, ast.Attribute):
        return target.attr
    if isinstance(target, ast.Name):
        return target.id
    if isinstance(target, ast.Subscript):
        return _const(target.slice) or ""
    return ""


def _const(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _is_true(v: ast.AST) -> bool:
    return isinstance(v, ast.Constant) and v.value is True


def _is_false(v: ast.AST) -> bool:
    return isinstance(v, ast.Constant) and v.value is False


def _setting_effect(name: str, value: ast.AST) -> str | None:
    """The effect of setting `name` to `value`, if it concerns graphs or eager execution."""
    v = ast.unparse(value)
    if name == "disable_cuda_graph" and _is_true(value):
        return "CUDA graphs off"
    if name == "disable_decode_cuda_graph" and _is_true(value):
        return "decode CUDA graph off"
    if name == "disable_prefill_cuda_graph" and _is_true(value):
        return "prefill CUDA graph off"
    if (name == "disable_piecewise_cuda_graph" and _is_true(value)) or \
            (name == "enable_piecewise_cuda_graph" and _is_false(value)):
        return "piecewise (prefill) CUDA graphs off"
    if name in ("cuda_graph_backend_decode", "cuda_graph_backend_prefill") and \
            (v.endswith("DISABLED") or _const(value) == "disabled"):
        return f"{name.rsplit('_', 1)[1]} CUDA graph off"
    if name == "cudagraph_mode" and v.endswith("CUDAGraphMode.NONE"):
        return "CUDA graphs off (cudagraph_mode NONE)"
    if name == "cudagraph_mode" and "CUDAGraphMode." in v and re.fullmatch(r"[\w.]*CUDAGraphMode\.\w+", v):
        return f"CUDA-graph mode set to {v.rsplit('.', 1)[1]}"
    if name == "enforce_eager" and _is_true(value):
        return "eager execution forced (enforce_eager)"
    if name in ("mode", "level") and v.endswith("CompilationMode.NONE"):
        return "torch.compile off (compilation mode NONE)"
    return None


def _statement_effects(st: ast.stmt, function: str) -> list[tuple[str, str]]:
    """(kind, effect) pairs of one simple statement."""
    out: list[tuple[str, str]] = []
    pairs: list[tuple[str, ast.AST]] = []
    if isinstance(st, ast.Assign):
        pairs += [(_name(t), st.value) for t in st.targets]
        # a runner's own switch (vLLM's CPU runner, transformers' continuous batching); only as an assignment:
        # the same keyword in a constructor call or a dataclass default describes a component, not the server
        v = ast.unparse(st.value)
        if any(_name(t) == "use_cuda_graph" for t in st.targets) and v in ("False", "(False, False)", "[False, False]"):
            out.append(("config", "continuous-batching CUDA graphs off (both paths)" if v != "False"
                        else "CUDA graphs off (this runner: use_cuda_graph = False)"))
    elif isinstance(st, (ast.AnnAssign, ast.AugAssign)) and st.value is not None:
        pairs.append((_name(st.target), st.value))
    for node in ast.walk(st):
        if isinstance(node, ast.Call):
            pairs += [(kw.arg, kw.value) for kw in node.keywords if kw.arg]
            fn = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if fn == "setattr" and len(node.args) == 3 and _const(node.args[1]):
                pairs.append((_const(node.args[1]) or "", node.args[2]))
            text = ast.unparse(node)
            if "Backend.DISABLED" in text:  # with_phase(cfg, Phase.X, backend=Backend.DISABLED), _set(...), ...
                phase = "decode" if "DECODE" in text else "prefill" if "PREFILL" in text else "a phase's"
                out.append(("config", f"{phase} CUDA graph off"))
    for name, value in pairs:
        eff = _setting_effect(name, value)
        if eff:
            out.append(("config", eff))
    if isinstance(st, ast.Return) and st.value is not None:
        first = st.value.elts[0] if isinstance(st.value, ast.Tuple) and st.value.elts else st.value
        if _is_false(first) and _CAN_RUN.search(function.rsplit(".", 1)[-1]):
            out.append(("runtime", "this batch runs eager (graph not replayed)"))
        elif ast.unparse(first).endswith("CUDAGraphMode.NONE") and "dispatch" in function:
            out.append(("runtime", "this step runs eager (no captured graph for it)"))
    # one row per effect even when a call names it twice (with_phase inside declare_resolution)
    return list(dict.fromkeys(out))


@dataclass
class _Ctx:
    function: str = "<module>"
    conditions: list[str] = field(default_factory=list)


def _cond_text(conds: list[str]) -> str:
    text = " and ".join(conds)
    return text if len(text) <= 400 else text[:397] + "..."


def _block_message(body: list[ast.stmt]) -> str:
    """The first logged message (warning/info/...) or raised error text in a block: the engine's own words."""
    for st in body:
        for node in ast.walk(st):
            if isinstance(node, ast.Call) and node.args and is_log_call(call_name(node)) and call_name(node) != "print":
                t = log_template(node)
                if t:
                    return t.strip()[:300]
    return ""


def _walk(body: list[ast.stmt], ctx: _Ctx, file: str, rows: list[dict]) -> None:
    message = None
    for st in body:
        if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
            _walk(st.body, _Ctx(function=f"{ctx.function}.{st.name}".removeprefix("<module>."), conditions=[]),
                  file, rows)
        elif isinstance(st, ast.ClassDef):
            _walk(st.body, _Ctx(function=f"{ctx.function}.{st.name}".removeprefix("<module>."), conditions=[]),
                  file, rows)
        elif isinstance(st, ast.If):
            test = ast.unparse(st.test)
            _walk(st.body, _Ctx(ctx.function, ctx.conditions + [test]), file, rows)
            if st.orelse:
                _walk(st.orelse, _Ctx(ctx.function, ctx.conditions + [f"not ({test})"]), file, rows)
        elif isinstance(st, (ast.For, ast.AsyncFor, ast.While)):
            head = ast.unparse(st.iter if isinstance(st, (ast.For, ast.AsyncFor)) else st.test)
            _walk(st.body, _Ctx(ctx.function, ctx.conditions + [f"(in loop over {head})"]), file, rows)
            _walk(st.orelse, ctx, file, rows)
        elif isinstance(st, (ast.With, ast.AsyncWith)):
            _walk(st.body, ctx, file, rows)
        elif isinstance(st, ast.Try) or type(st).__name__ == "TryStar":
            _walk(st.body, ctx, file, rows)  # type: ignore[attr-defined]
            for h in st.handlers:  # type: ignore[attr-defined]
                what = ast.unparse(h.type) if h.type is not None else "any exception"
                _walk(h.body, _Ctx(ctx.function, ctx.conditions + [f"(on {what})"]), file, rows)
            _walk(st.orelse + st.finalbody, ctx, file, rows)  # type: ignore[attr-defined]
        elif isinstance(st, ast.Match):
            for case in st.cases:
                _walk(case.body, _Ctx(ctx.function, ctx.conditions + [f"(case {ast.unparse(case.pattern)})"]),
                      file, rows)
        else:
            for kind, effect in _statement_effects(st, ctx.function):
                if message is None:
                    message = _block_message(body)
                rows.append({"file": file, "line": st.lineno, "function": ctx.function, "kind": kind,
                             "effect": effect, "condition": _cond_text(ctx.conditions) or "(always)",
                             "statement": ast.unparse(st)[:300], "message": message})


def audit_source(source: str, file: str) -> pd.DataFrame:
    """The graph-disabling places of one file."""
    rows: list[dict] = []
    _walk(parse_source(source).body, _Ctx(), file, rows)
    return pd.DataFrame(rows, columns=AUDIT_COLUMNS)


def graph_disable_audit(tree: SourceTree) -> pd.DataFrame:
    """Every place in the engine's source that turns CUDA graphs off or forces eager execution (a DataFrame with
    AUDIT_COLUMNS, sorted by file and line). kind: 'config' (a rule applied while resolving the configuration at
    startup) or 'runtime' (a batch or step that falls back to eager while serving)."""
    frames = []
    for prefix in _SCOPES.get(tree.package, (tree.package + "/",)):
        for f in tree.files(prefix):
            text = tree.read(f)
            if not _KEYWORDS.search(text):
                continue
            try:
                frames.append(audit_source(text, f))
            except SyntaxError:
                continue
    frames = [f for f in frames if len(f)]
    if not frames:
        return pd.DataFrame(columns=AUDIT_COLUMNS)
    df = pd.concat(frames, ignore_index=True).sort_values(["file", "line"], ignore_index=True)
    df.attrs["source"] = tree.label()
    return df


def find_rules(audit: pd.DataFrame, condition: str = "", effect: str = "", file: str = "") -> pd.DataFrame:
    """Rows whose condition / effect / file match these regexes (case-insensitive)."""
    m = pd.Series(True, index=audit.index)
    for col, rx in (("condition", condition), ("effect", effect), ("file", file)):
        if rx:
            m &= audit[col].str.contains(rx, case=False, regex=True)
    return audit[m]
