"""Graph-disable audit (thread 1): every place in an engine's source that turns CUDA graphs off, narrows them, or
forces eager execution, found by a static AST scan (nothing imported, so it works on a wheel of an engine that
cannot run here). One row per place: file:line, enclosing function, the condition under which it fires (the
enclosing `if` tests, an `else` as `not (...)`), the effect, the statement, and the log message beside it ('silent'
where the engine logs nothing).

Forms read: flags and config fields set to off (`disable_cuda_graph = True`, `enforce_eager`, `cudagraph_mode =
NONE`); a disabled backend assigned to a phase (`cfg.prefill.backend = Backend.DISABLED`, `_set(Phase.DECODE,
"backend", Backend.DISABLED)`, `with_phase(cfg, Phase.PREFILL, backend=Backend.DISABLED)`); tables of (name,
condition) rules applied in a loop, one row per named rule; early returns of a graph runner's initialisation or
capture; `False` returned by a graph runner's `can_run*` method. kind: 'startup' (resolved once, at start) or
'per-batch' (a batch or step that runs eager while serving). Not rules, not listed: a predicate that only tests
whether a phase is disabled, a flag's registration (`add_argument`, a dataclass field's default).

Rules that choose graph use (form 'chooses'), not only those that turn it off (form 'disables'): a graph switch given a
computed value (transformers' `cb_config.use_cuda_graph = tuple(use_cuda_graph)` built per path from the attention
implementation; vLLM's `cudagraph_mode = fallback_mode` downgrades), or set on (`use_cuda_graph = (True, True)`, a
phase's backend set to FULL or BREAKABLE, a mode set to PIECEWISE). `resolves_to` shows the value with the function's
local names replaced by what they hold; a rule with no log line in its own block takes the function's next log line
about graphs (transformers logs its choice after the if-chain)."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

import pandas as pd

from ..state import FactRule
from .logs import call_name, is_log_call, log_template, template_of
from .source import SourceTree, parse_source

AUDIT_COLUMNS = ["file", "line", "function", "kind", "form", "rule", "effect", "resolves_to", "condition", "statement",
                 "message"]
STARTUP, PER_BATCH, SILENT = "startup", "per-batch", "silent"
DISABLES, CHOOSES = "disables", "chooses"

# files worth parsing: those mentioning one of these (the scan of a whole engine stays a few seconds)
_KEYWORDS = re.compile(r"disable_cuda_graph|use_cuda_graph|Backend\.DISABLED|cudagraph_mode|enforce_eager|piecewise_cuda_graph|"
                       r"def can_run|disable_prefill_cuda_graph|disable_decode_cuda_graph|CompilationMode\.NONE|"
                       r"cuda_graph_backend_(?:decode|prefill)|Backend\.(?:FULL|BREAKABLE)")
_SCOPES = {"sglang": ("sglang/srt/",), "vllm": ("vllm/config/", "vllm/v1/", "vllm/platforms/", "vllm/engine/"),
           "transformers": ("transformers/generation/continuous_batching/", "transformers/cli/")}
_CAN_RUN = re.compile(r"^(can_run|can_replay|can_use_cuda_graph)", re.IGNORECASE)
_RUNNER_CLASS = re.compile(r"Graph|ModelRunner|Runner", re.IGNORECASE)
_INIT_METHOD = re.compile(r"^(__init__|_?init\w*|_?capture\w*)$")
_OFF_WORDS = re.compile(r"disable|DISABLED|enforce_eager|\bNONE\b|fully_disabled")
# calls that only test or read a phase's backend (predicates), or register a flag: not rules
_NOT_A_SETTER = re.compile(r"^(check|is_|has_|get|should|can_|assert|add_argument|Arg$|field$)|disabled$", re.IGNORECASE)
_PHASE = re.compile(r"\b(decode|prefill)\b", re.IGNORECASE)
# the switches through which an engine resolves graph use; a computed value for one of them is a choosing rule
_SWITCHES = {"use_cuda_graph": "CUDA-graph use", "cudagraph_mode": "CUDA-graph mode",
             "disable_cuda_graph": "CUDA graphs off", "enforce_eager": "eager execution",
             "cuda_graph_backend_decode": "decode CUDA-graph backend", "cuda_graph_backend_prefill":
             "prefill CUDA-graph backend", "disable_piecewise_cuda_graph": "piecewise CUDA graphs off",
             "enable_piecewise_cuda_graph": "piecewise CUDA graphs", "disable_decode_cuda_graph": "decode CUDA graph off",
             "disable_prefill_cuda_graph": "prefill CUDA graph off"}
_OFF_EFFECT = re.compile(r"\boff\b|eager|captures nothing|NONE")
_GRAPH_WORDS = re.compile(r"(?i)cuda ?graph|cudagraph")


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


def _is_disabled(value: ast.AST) -> bool:
    return ast.unparse(value).endswith("Backend.DISABLED") or _const(value) == "disabled"


def _phase_of(text: str) -> str:
    m = _PHASE.search(text)
    return m.group(1).lower() if m else "a phase's"


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
    if name in ("cuda_graph_backend_decode", "cuda_graph_backend_prefill") and _is_disabled(value):
        return f"{name.rsplit('_', 1)[1]} CUDA graph off"
    if name == "cudagraph_mode" and v.endswith("CUDAGraphMode.NONE"):
        return "CUDA graphs off (cudagraph_mode NONE)"
    if name == "cudagraph_mode" and "CUDAGraphMode." in v and re.fullmatch(r"[\w.]*CUDAGraphMode\.\w+", v):
        return f"CUDA-graph mode set to {v.rsplit('.', 1)[1]}"
    if name == "enforce_eager" and _is_true(value):
        return "eager execution forced (enforce_eager)"
    if name in ("cuda_graph_backend_decode", "cuda_graph_backend_prefill") and re.fullmatch(r"[\w.]*Backend\.\w+", v):
        return f"{name.rsplit('_', 1)[1]} CUDA graph set to {v.rsplit('.', 1)[1]}"
    if name in ("mode", "level") and v.endswith("CompilationMode.NONE"):
        return "torch.compile off (compilation mode NONE)"
    return None


def _call_name(node: ast.Call) -> str:
    return node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")


def _with_locals(value: ast.AST, assigned: dict[str, str]) -> str:
    """A value as written, followed by what each local name in it holds."""
    text = ast.unparse(value)
    names = dict.fromkeys(n.id for n in ast.walk(value) if isinstance(n, ast.Name) and n.id in assigned)
    held = "; ".join(f"{n} = {assigned[n]}" for n in names)
    out = f"{text}, where {held}" if held else text
    return out if len(out) <= 400 else out[:397] + "..."


def _is_fixed(value: ast.AST) -> bool:
    """A literal or an enum member (`CUDAGraphMode.NONE`, `Backend.FULL`): a setting, not a computed choice."""
    return isinstance(value, ast.Constant) or bool(re.fullmatch(r"[A-Z]\w*(\.[A-Z_]\w*)+", ast.unparse(value))) or \
        isinstance(value, (ast.Tuple, ast.List)) and all(isinstance(e, ast.Constant) for e in value.elts)


def _server_switch(target: ast.AST) -> bool:
    """A switch of the server's configuration. `use_cuda_graph` also names components' own options (an attention
    wrapper's, a LoRA backend's): only a config object's counts (`cb_config.use_cuda_graph`)."""
    name = _name(target)
    if name != "use_cuda_graph":
        return name in _SWITCHES
    return isinstance(target, ast.Attribute) and bool(re.search(r"(config|cfg|args)$", ast.unparse(target.value)))


def _chosen(target: ast.AST, value: ast.AST, assigned: dict[str, str]) -> str | None:
    """The effect of giving a graph switch a computed value (None for a literal, or a read/write-back of itself)."""
    name = _name(target)
    if not _server_switch(target) or _is_fixed(value):
        return None
    if isinstance(value, (ast.Name, ast.Attribute)) and _name(value) == name:  # self.x = x, x = cfg.x
        return None
    passed = [n for n in ast.walk(value) if isinstance(n, ast.Name) and n.id == name and n.id not in assigned]
    if passed:  # self.x = bool(x): the caller's value, kept
        return None
    return f"{_SWITCHES[name]} chosen from a computed value"


def _phase_setting(node: ast.Call) -> tuple[str, ast.AST] | None:
    """A phase's backend given a value: with_phase(cfg, Phase.X, backend=V) or _set(Phase.X, "backend", V)."""
    args = " ".join(ast.unparse(a) for a in node.args)
    if not re.search(r"\bPhase\.|\bphase\b", args):  # a backend of something else (attention, compile)
        return None
    for kw in node.keywords:
        if kw.arg == "backend":
            return _phase_of(args), kw.value
    consts = [_const(a) for a in node.args]
    if "backend" in consts and consts.index("backend") + 1 < len(node.args):
        return _phase_of(" ".join(ast.unparse(a) for a in node.args)), node.args[consts.index("backend") + 1]
    return None


def _phase_effect(phase: str, value: ast.AST) -> str:
    if _is_disabled(value):
        return f"{phase} CUDA graph off"
    if _is_fixed(value):
        return f"{phase} CUDA graph set to {ast.unparse(value).rsplit('.', 1)[-1]}"
    return f"{phase} CUDA-graph backend chosen from a computed value"


def _assignment_effects(st: ast.stmt, assigned: dict[str, str]) -> tuple[list[tuple[str, str, str]],
                                                                          list[tuple[str, ast.AST]]]:
    """An assignment's rows (a runner's switch, a phase's backend, a switch given a computed value), and the
    (name, value) settings left for _setting_effect."""
    out: list[tuple[str, str, str]] = []
    pairs: list[tuple[str, ast.AST]] = []
    if isinstance(st, (ast.Assign, ast.AnnAssign)) and st.value is not None:
        targets = st.targets if isinstance(st, ast.Assign) else [st.target]
        v = ast.unparse(st.value)
        # a runner's own switch (vLLM's CPU runner, transformers' continuous batching); only as an assignment:
        # the same keyword in a constructor call or a dataclass default describes a component, not the server
        if any(_name(t) == "use_cuda_graph" for t in targets) and v in ("False", "(False, False)", "[False, False]"):
            out.append((STARTUP, "continuous-batching CUDA graphs off (both paths)" if v != "False"
                        else "CUDA graphs off (this runner: use_cuda_graph = False)", v))
        if any(_server_switch(t) and _name(t) == "use_cuda_graph" for t in targets) and \
                v in ("True", "(True, True)", "[True, True]"):
            out.append((STARTUP, "CUDA graphs on" + (" (both paths)" if v != "True" else ""), v))
        for t in targets:
            # cfg.prefill.backend = Backend.DISABLED; only a phase's graph backend (not attention's, compile's)
            where = ast.unparse(t)
            if _name(t) == "backend" and _PHASE.search(where) and (_is_disabled(st.value) or "graph" in where or
                                                                   re.fullmatch(r"[\w.]*Backend\.\w+", v)):
                out.append((STARTUP, _phase_effect(_phase_of(ast.unparse(t)), st.value),
                            _with_locals(st.value, assigned)))
            chosen = _chosen(t, st.value, assigned)
            if chosen:
                out.append((STARTUP, chosen, _with_locals(st.value, assigned)))
            elif _name(t) != "use_cuda_graph" or v not in ("False", "(False, False)", "[False, False]"):
                pairs.append((_name(t), st.value))
    elif isinstance(st, ast.AugAssign):
        pairs.append((_name(st.target), st.value))
    return out, pairs


def _statement_effects(st: ast.stmt, function: str, cls: str = "",
                       assigned: dict[str, str] | None = None) -> list[tuple[str, str, str]]:
    """(kind, effect, resolves_to) triples of one simple statement."""
    assigned = assigned or {}
    out, pairs = _assignment_effects(st, assigned)
    for node in ast.walk(st):
        if isinstance(node, ast.Call):
            fn = _call_name(node)
            if _NOT_A_SETTER.search(fn):
                continue
            pairs += [(kw.arg, kw.value) for kw in node.keywords if kw.arg and kw.arg != "backend"]
            if fn == "setattr" and len(node.args) == 3 and _const(node.args[1]):
                pairs.append((_const(node.args[1]) or "", node.args[2]))
            phase = _phase_setting(node)  # with_phase(cfg, Phase.X, backend=...), _set(Phase.X, "backend", ...)
            if phase is not None:
                out.append((STARTUP, _phase_effect(*phase), _with_locals(phase[1], assigned)))
            elif any(_is_disabled(a) for a in node.args):
                out.append((STARTUP, f"{_phase_of(' '.join(ast.unparse(a) for a in node.args))} CUDA graph off",
                            "Backend.DISABLED"))
    for name, value in pairs:
        eff = _setting_effect(name, value)
        if eff:
            out.append((STARTUP, eff, ast.unparse(value)))
    if isinstance(st, ast.Return) and st.value is not None:
        first = st.value.elts[0] if isinstance(st.value, ast.Tuple) and st.value.elts else st.value
        method = function.rsplit(".", 1)[-1]
        if _is_false(first) and _CAN_RUN.search(method) and _RUNNER_CLASS.search(cls):
            out.append((PER_BATCH, "this batch runs eager (graph not replayed)", "False"))
        elif ast.unparse(first).endswith("CUDAGraphMode.NONE") and "dispatch" in function:
            out.append((PER_BATCH, "this step runs eager (no captured graph for it)", "CUDAGraphMode.NONE"))
    # one row per effect even when a call names it twice (with_phase inside declare_resolution)
    seen: dict[str, tuple[str, str, str]] = {}
    for row in out:
        seen.setdefault(row[1], row)
    return list(seen.values())


def _can_run_verdict(st: ast.stmt, ctx: _Ctx) -> list[str]:
    """The conjuncts of a graph runner's `can_run*` verdict returned as an expression (SGLang 0.4.x: `return
    is_bs_supported and is_encoder_lens_supported and ...`), each local name shown with what it was assigned."""
    method = ctx.function.rsplit(".", 1)[-1]
    if not (isinstance(st, ast.Return) and st.value is not None and _CAN_RUN.search(method) and
            ctx.cls and _RUNNER_CLASS.search(ctx.cls)):
        return []
    value = st.value.elts[0] if isinstance(st.value, ast.Tuple) and st.value.elts else st.value
    if isinstance(value, ast.Constant):
        return []
    parts = value.values if isinstance(value, ast.BoolOp) and isinstance(value.op, ast.And) else [value]
    return [f"{ast.unparse(p)} := {ctx.assigned[p.id]}" if isinstance(p, ast.Name) and p.id in ctx.assigned
            else ast.unparse(p) for p in parts]


def _assignments(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, str]:
    """Local names of a function and the (last) expression assigned to each, for conditions that name them."""
    out: dict[str, str] = {}
    found = [st for st in ast.walk(fn) if isinstance(st, ast.Assign) and len(st.targets) == 1 and
             isinstance(st.targets[0], ast.Name)]
    # `xs = []` then `xs.append(a)` (transformers builds its per-path choice so): what each append may add
    appends = [st for st in ast.walk(fn) if isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) and
               _call_name(st.value) == "append" and isinstance(st.value.func, ast.Attribute) and
               isinstance(st.value.func.value, ast.Name) and len(st.value.args) == 1]
    for st in sorted(found + appends, key=lambda x: x.lineno):  # type: ignore[operator]
        if isinstance(st, ast.Expr):
            name, item = st.value.func.value.id, ast.unparse(st.value.args[0])  # type: ignore[attr-defined]
            if name in out:
                out[name] += (" | " if ", appended per item: " in out[name] else ", appended per item: ") + item
            continue
        name = st.targets[0].id  # type: ignore[attr-defined]
        text = ast.unparse(st.value)
        if name in out:  # `x = x and more`: the earlier value in its place
            prev = f"({out[name]})"
            text = re.sub(rf"(?<![\w.]){re.escape(name)}(?!\w)", lambda _m, p=prev: p, text)
        out[name] = text if len(text) <= 300 else text[:297] + "..."
    return out


def _early_return(st: ast.stmt, ctx: _Ctx) -> tuple[str, str] | None:
    """A bare `return` in a graph runner's initialisation or capture, under a condition that turns graphs off:
    the runner never captures."""
    if not (isinstance(st, ast.Return) and (st.value is None or _const(st.value) is None and
                                            isinstance(st.value, ast.Constant) and st.value.value is None)):
        return None
    method = ctx.function.rsplit(".", 1)[-1]
    if not (ctx.cls and "Graph" in ctx.cls and _INIT_METHOD.match(method) and ctx.conditions and
            _OFF_WORDS.search(ctx.conditions[-1])):
        return None
    return STARTUP, "this graph runner captures nothing (returns before capture)"


@dataclass
class _Ctx:
    function: str = "<module>"
    conditions: list[str] = field(default_factory=list)
    cls: str = ""  # the class the function belongs to
    in_function: bool = False
    rule: str = ""  # the named rule of a rule table this block runs for
    subst: dict[str, str] = field(default_factory=dict)  # loop variables -> the rule's own name / condition
    assigned: dict[str, str] = field(default_factory=dict)  # local names of the function -> what they hold
    logs: list[tuple[int, str]] = field(default_factory=list)  # the function's log calls: (line, template)
    built: dict[str, list[tuple[int, str]]] = field(default_factory=dict)  # logged local -> (line, `=` template)

    def but(self, condition: str | None = None, **kw: object) -> _Ctx:
        """A copy with one more condition (loop variables replaced by the rule's own text)."""
        conds = self.conditions
        if condition is not None:
            for k, v in self.subst.items():
                condition = re.sub(rf"(?<![\w.]){re.escape(k)}(?!\w)", v, condition)
            conds = conds + [condition]
        base = {"function": self.function, "conditions": conds, "cls": self.cls, "in_function": self.in_function,
                "rule": self.rule, "subst": self.subst, "assigned": self.assigned, "logs": self.logs,
                "built": self.built}
        return _Ctx(**(base | kw))  # type: ignore[arg-type]


def _cond_text(conds: list[str]) -> str:
    text = " and ".join(conds)
    return text if len(text) <= 400 else text[:397] + "..."


def _block_message(body: list[ast.stmt], direct: bool = False) -> str:
    """The first logged message (warning/info/...) or raised error text in a block: the engine's own words (with
    direct, only a log call that is itself a statement of the block, not one nested in a branch of it)."""
    for st in body:
        if direct and not isinstance(st, ast.Expr):
            continue
        for node in ast.walk(st):
            if isinstance(node, ast.Call) and node.args and is_log_call(call_name(node)) and call_name(node) != "print":
                t = log_template(node)
                if t:
                    return t.strip()[:300]
    return ""


def _function_logs(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[tuple[int, str]]:
    """The log calls about graphs that are statements of the function's own body (after its branches, not inside
    one), in line order: (line, template)."""
    out = []
    for st in fn.body:
        if isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) and st.value.args and \
                is_log_call(call_name(st.value)) and call_name(st.value) != "print":
            t = log_template(st.value)
            if t and _GRAPH_WORDS.search(t):
                out.append((st.lineno, t.strip()[:300]))
    return out


def _built_messages(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, list[tuple[int, str]]]:
    """Messages a function builds in a local before logging it (vLLM: `msg = f"..."`, `msg += "; setting
    cudagraph_mode=PIECEWISE"`, then `logger.warning(msg)`): local -> its `msg = template` assignments by line."""
    logged = {node.args[0].id for node in ast.walk(fn) if isinstance(node, ast.Call) and node.args and
              is_log_call(call_name(node)) and isinstance(node.args[0], ast.Name)}
    out: dict[str, list[tuple[int, str]]] = {}
    for st in ast.walk(fn):
        if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name) and \
                st.targets[0].id in logged:
            t = template_of(st.value)
            if t:
                out.setdefault(st.targets[0].id, []).append((st.lineno, t))
    return {k: sorted(v) for k, v in out.items()}


def _appended_message(body: list[ast.stmt], built: dict[str, list[tuple[int, str]]]) -> str:
    """A block's own part of a built message (`msg += "..."`), after the message's start."""
    for st in body:
        if isinstance(st, ast.AugAssign) and isinstance(st.op, ast.Add) and isinstance(st.target, ast.Name) and \
                st.target.id in built:
            tail = template_of(st.value) or ""
            start = [t for line, t in built[st.target.id] if line < st.lineno]
            return ((start[-1] if start else "") + tail).strip()[:300]
    return ""


def _rule_table(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, list[tuple[str | None, str]]]:
    """Local tables of named rules in a function: `rules = [("name", lambda: cond), ...]` -> (name, cond) rows."""
    out: dict[str, list[tuple[str | None, str]]] = {}
    for st in ast.walk(fn):
        if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name) and \
                isinstance(st.value, (ast.List, ast.Tuple)) and st.value.elts and \
                all(isinstance(e, ast.Tuple) and len(e.elts) == 2 for e in st.value.elts):
            rows = []
            for e in st.value.elts:
                name, cond = e.elts  # type: ignore[attr-defined]
                if not (isinstance(name, ast.Constant) and (name.value is None or isinstance(name.value, str))):
                    break
                body = cond.body if isinstance(cond, ast.Lambda) else cond
                rows.append((name.value, ast.unparse(body)))
            else:
                out[st.targets[0].id] = rows
    return out


def _walk(body: list[ast.stmt], ctx: _Ctx, file: str, rows: list[dict],
          tables: dict[str, list[tuple[str | None, str]]] | None = None) -> None:
    tables = tables or {}
    for st in body:
        if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
            _walk(st.body, _Ctx(function=f"{ctx.function}.{st.name}".removeprefix("<module>."), cls=ctx.cls,
                                in_function=True, assigned=_assignments(st), logs=_function_logs(st),
                                built=_built_messages(st)), file, rows, _rule_table(st))
        elif isinstance(st, ast.ClassDef):
            _walk(st.body, _Ctx(function=f"{ctx.function}.{st.name}".removeprefix("<module>."), cls=st.name),
                  file, rows)
        elif isinstance(st, ast.If):
            test = ast.unparse(st.test)
            _walk(st.body, ctx.but(test), file, rows, tables)
            if st.orelse:
                _walk(st.orelse, ctx.but(f"not ({test})"), file, rows, tables)
        elif isinstance(st, (ast.For, ast.AsyncFor)) and isinstance(st.iter, ast.Name) and st.iter.id in tables \
                and isinstance(st.target, ast.Tuple) and len(st.target.elts) == 2:
            name_var, cond_var = (ast.unparse(t) for t in st.target.elts)
            for name, cond in tables[st.iter.id]:  # one row per named rule of the table
                sub = {f"{cond_var}()": f"({cond})", name_var: repr(name)}
                _walk(st.body, ctx.but(None, rule=name or "(unnamed rule)", subst=ctx.subst | sub), file, rows, tables)
        elif isinstance(st, (ast.For, ast.AsyncFor, ast.While)):
            head = ast.unparse(st.iter if isinstance(st, (ast.For, ast.AsyncFor)) else st.test)
            _walk(st.body, ctx.but(f"(in loop over {head})"), file, rows, tables)
            _walk(st.orelse, ctx, file, rows, tables)
        elif isinstance(st, (ast.With, ast.AsyncWith)):
            _walk(st.body, ctx, file, rows, tables)
        elif isinstance(st, ast.Try) or type(st).__name__ == "TryStar":
            _walk(st.body, ctx, file, rows, tables)  # type: ignore[attr-defined]
            for h in st.handlers:  # type: ignore[attr-defined]
                what = ast.unparse(h.type) if h.type is not None else "any exception"
                _walk(h.body, ctx.but(f"(on {what})"), file, rows, tables)
            _walk(st.orelse + st.finalbody, ctx, file, rows, tables)  # type: ignore[attr-defined]
        elif isinstance(st, ast.Match):
            for case in st.cases:
                _walk(case.body, ctx.but(f"(case {ast.unparse(case.pattern)})"), file, rows, tables)
        elif ctx.in_function:  # class-body fields and module constants are defaults and registrations, not rules
            _leaf_rows(st, body, ctx, file, rows)


def _leaf_rows(st: ast.stmt, body: list[ast.stmt], ctx: _Ctx, file: str, rows: list[dict]) -> None:
    """The rows of one simple statement of a function, with the engine's words from its block."""
    effects = [(k, e, r, ctx.conditions) for k, e, r in _statement_effects(st, ctx.function, ctx.cls, ctx.assigned)]
    early = _early_return(st, ctx)
    if early:
        effects.append((*early, "", ctx.conditions))
    for part in _can_run_verdict(st, ctx):  # `return a and b`: each false conjunct is an eager batch
        effects.append((PER_BATCH, "this batch runs eager (graph not replayed)", "False",
                        ctx.conditions + [f"not ({part})"]))
    for kind, effect, resolves_to, conds in effects:
        said = _block_message(body) or _appended_message(body, ctx.built)
        if ctx.rule:  # the loop logs the rule's own name, or nothing for an unnamed one
            said = said.replace("%s", ctx.rule, 1) if ctx.rule != "(unnamed rule)" else ""
        form = DISABLES if _OFF_EFFECT.search(effect) else CHOOSES
        if form == CHOOSES and not ctx.rule:  # a choice is logged beside it, or once after the branches
            said = _block_message(body, direct=True) or _appended_message(body, ctx.built) or \
                next((t for ln, t in ctx.logs if ln > st.lineno), "")
        rows.append({"file": file, "line": st.lineno, "function": ctx.function, "kind": kind, "form": form,
                     "rule": ctx.rule, "effect": effect, "resolves_to": resolves_to,
                     "condition": _cond_text(conds) or "(always)", "statement": ast.unparse(st)[:300],
                     "message": said or SILENT})


def audit_source(source: str, file: str) -> pd.DataFrame:
    """The graph-disabling places of one file."""
    rows: list[dict] = []
    _walk(parse_source(source).body, _Ctx(), file, rows)
    return pd.DataFrame(rows, columns=AUDIT_COLUMNS)


def graph_disable_audit(tree: SourceTree) -> pd.DataFrame:
    """Every place in the engine's source that turns CUDA graphs off or forces eager execution (a DataFrame with
    AUDIT_COLUMNS, sorted by file and line). kind: 'startup' (a rule applied while resolving the configuration at
    startup) or 'per-batch' (a batch or step that falls back to eager while serving)."""
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
    """Rows whose condition (or rule name) / effect / file match these regexes (case-insensitive)."""
    m = pd.Series(True, index=audit.index)
    for col, rx in (("condition", condition), ("effect", effect), ("file", file)):
        if rx:
            hit = audit[col].str.contains(rx, case=False, regex=True)
            if col == "condition" and "rule" in audit:
                hit |= audit["rule"].fillna("").str.contains(rx, case=False, regex=True)
            m &= hit
    return audit[m]


def explain_state(fact_rules: list[FactRule], audit: pd.DataFrame, log: pd.DataFrame) -> pd.DataFrame:
    """The evidence for given fact rules (threads.graph_disable.explain, a comparison's downgrades): source ('audit'
    / 'log'), fact, where, effect, text, remedy."""
    rows = []
    for rule in fact_rules:
        fact, rx, remedy = FactRule(*rule)
        if not len(audit):
            continue
        if rx.startswith("file:"):  # 'file:<regex>' matches paths
            hit = audit[audit["file"].str.contains(rx[5:], regex=True)]
        else:  # a rule that turns graphs off by its condition, or chooses them by what it resolves to
            chosen = audit["resolves_to"].fillna("") if "resolves_to" in audit else pd.Series("", index=audit.index)
            hit = audit[audit["condition"].str.contains(rx, regex=True) | chosen.str.contains(rx, regex=True)]
        for r in hit.itertuples():
            text = r.condition if getattr(r, "form", "") != "chooses" else f"{r.condition}: {r.resolves_to}"
            rows.append({"source": "audit", "fact": fact, "where": f"{r.file}:{r.line} {r.function}",
                         "effect": r.effect, "text": text if not r.message else f"{text} -> {r.message}",
                         "remedy": remedy})
    if len(log):
        for r in log[log["kind"].isin(["graph_disabled", "graph_capture"])].itertuples():
            rows.append({"source": "log", "fact": r.meaning, "where": f"log line {r.line_no}", "effect": r.name,
                         "text": r.line, "remedy": ""})
    return pd.DataFrame(rows, columns=["source", "fact", "where", "effect", "text", "remedy"])
