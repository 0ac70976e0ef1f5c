"""Engine log analysis: the lines that say whether CUDA graphs were captured or turned off (and why), which MoE
backend was chosen, out-of-memory and CUDA errors, and startup timings. Patterns are written against the
message templates found in the engines' own source (`logged_messages` extracts them; the tests check every
pattern against the versions it names)."""

from __future__ import annotations

import ast
import bisect
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from .source import SourceTree, parse_source

KINDS = ("graph_capture", "graph_disabled", "compile", "moe_backend", "attention_backend", "oom", "cuda_error",
         "startup", "config", "teardown")
# placeholder written for an f-string's {expression} when a template is rebuilt from source
HOLE = "\u2039x\u203a"


@dataclass(frozen=True)
class LogPattern:
    """One kind of log line: a regex (named groups become columns) and where it comes from."""

    name: str
    kind: str
    regex: str
    meaning: str
    engine: str  # 'sglang', 'vllm', 'transformers' or '*' (any Python server)
    versions: str = ""  # versions whose source has the message, e.g. '0.4.10 0.5.9 0.5.23'

    def compiled(self) -> re.Pattern[str]:
        """The compiled regex."""
        return re.compile(self.regex)


SGLANG_PATTERNS = [
    LogPattern("capture_begin", "graph_capture", r"Capture (?P<what>[\w ./-]*?)(?:cuda|CUDA) graph begin",
               "CUDA-graph capture started", "sglang", "0.4.10 0.5.9 0.5.23"),
    LogPattern("capture_backend", "graph_capture",
               r"Capture (?P<role>\w+) (?P<phase>prefill|decode|verify) (?:CUDA|cuda) graph begin\. backend=(?P<backend>\w+)",
               "a phase's CUDA-graph capture started, with the backend it captures with", "sglang", "0.5.17"),
    LogPattern("prefill_graph_skipped", "graph_disabled",
               r"Disabling auto-selected prefill CUDA graph|Disable prefill CUDA graph(?: capture)? because",
               "a prefill CUDA graph the configuration asked for was not captured (the line says why); prefill runs "
               "eager", "sglang", "0.5.17"),
    LogPattern("sigquit_teardown", "teardown", r"Received sigquit from a child process",
               "a child process failed and SGLang killed its own process tree", "sglang", "0.5.17"),
    LogPattern("scheduler_exception", "teardown", r"(?P<who>[A-Z]\w+) hit an exception",
               "a process of the server raised (the traceback follows)", "sglang", "0.5.17"),
    LogPattern("capture_end", "graph_capture",
               r"Capture (?P<what>[\w ./-]*?)(?:cuda|CUDA) graph end\. (?:Time elapsed: |elapsed=)(?P<capture_s>[\d.]+) s",
               "CUDA-graph capture finished (seconds it took)", "sglang", "0.4.10 0.5.9 0.5.23"),
    LogPattern("graph_disabled_deepep", "graph_disabled", r"Cuda graph is disabled because deepep_mode=`normal`",
               "DeepEP normal mode turns CUDA graphs off", "sglang", "0.4.10 0.5.9 0.5.23"),
    LogPattern("graph_disabled_prefill_server", "graph_disabled", r"Cuda graph is disabled for prefill server",
               "a PD-disaggregated prefill server runs without CUDA graphs", "sglang", "0.4.10 0.5.9"),
    LogPattern("graph_disabled_reason", "graph_disabled",
               r"(?i)(?:cuda graph|cuda_graph)\w*[^\n]{0,40}(?:is disabled|disabled because|disable)[^\n]*",
               "some rule turned CUDA graphs (or a phase of them) off; the line says which", "sglang",
               "0.4.10 0.5.9 0.5.23"),
    LogPattern("piecewise_compile_conflict", "graph_disabled",
               r"Disable piecewise CUDA graph because piecewise_cuda_graph has conflict with torch compile",
               "piecewise graphs off because torch.compile is on", "sglang", "0.5.9"),
    LogPattern("moe_backend_override", "moe_backend", r"Use (?P<backend>\w+) as MoE runner backend",
               "a model override chose the MoE runner backend", "sglang", "0.5.23"),
    LogPattern("moe_backend_auto", "moe_backend", r"auto set moe_runner_backend=`(?P<backend>\w+)`",
               "the MoE runner backend set automatically", "sglang", "0.5.23"),
    LogPattern("attention_backend", "attention_backend",
               r"(?i)(?:attention backend|attention_backend)\W+(?:is |to |=\s*)?(?P<backend>\w+)",
               "attention backend in use", "sglang", ""),
    LogPattern("kv_cache_size", "startup", r"KV Cache is allocated\. #tokens: (?P<kv_tokens>\d[\d.]*)|"
               r"(?:is allocated|allocated)\. dtype: [^,]+, #tokens: (?P<kv_tokens_dtype>\d[\d.]*)",
               "KV cache size in tokens", "sglang", "0.4.10 0.5.9 0.5.23"),
    LogPattern("load_weight", "startup", r"Load weight end\. (?:elapsed=(?P<load_s>[\d.]+) s|type=)",
               "weights loaded (seconds it took, where the version says)", "sglang", "0.4.10 0.5.9 0.5.17 0.5.23"),
    LogPattern("server_ready", "startup", r"The server is fired up and ready to roll",
               "the server answered its warm-up request", "sglang", "0.4.10 0.5.9 0.5.23"),
]

VLLM_PATTERNS = [
    LogPattern("non_default_args", "config", r"non-default args: (?P<args>.*)",
               "the arguments given that differ from vLLM's defaults", "vllm", "0.32.0"),
    LogPattern("engine_config", "config", r"Initializing a V1 LLM engine \(v(?P<version>[^)]+)\) with config: (?P<config>.*)",
               "the resolved engine configuration (one line)", "vllm", "0.32.0"),
    LogPattern("graph_capture_done", "graph_capture",
               r"Graph capturing finished in (?P<capture_s>[\d.]+) secs?",
               "CUDA-graph capture finished", "vllm", "0.32.0"),
    LogPattern("cudagraph_mode_change", "graph_disabled",
               r"(?i)(?:cudagraph_mode|cudagraph mode|CUDA graph)[^\n]{0,80}(?:not supported|disabled|"
               r"overrid\w+|fall\w* back|downgrad\w+|set to|setting)[^\n]*",
               "vLLM changed or dropped the CUDA-graph mode; the line says why", "vllm", "0.32.0"),
    LogPattern("enforce_eager", "graph_disabled", r"Enforce eager set, disabling torch\.compile, CUDAGraphs",
               "--enforce-eager: no torch.compile and no CUDA graphs", "vllm", "0.32.0"),
    LogPattern("compile_time", "compile", r"torch\.compile took (?P<compile_s>[\d.]+) s in total",
               "torch.compile time at startup", "vllm", ""),
    LogPattern("compile_range", "compile",
               r"Compiling a graph for compile range (?P<range>.+?) takes (?P<compile_s>[\d.]+) s",
               "torch.compile of one shape range", "vllm", "0.32.0"),
    LogPattern("moe_backend", "moe_backend", r"Using (?P<backend>.+?) (?:\w+ )?MoE backend",
               "the MoE kernel path chosen ('Using TRITON Fp8 MoE backend out of potential backends', "
               "'Using CPU Unquantized MoE backend')", "vllm", "0.32.0"),
    LogPattern("attention_backend", "attention_backend", r"Using (?P<backend>[\w.]+) attention backend out of potential backends",
               "attention backend in use", "vllm", "0.32.0"),
    LogPattern("kv_cache", "startup", r"(?P<device>\w+) KV cache size: (?P<kv_tokens>[\d,.]+) tokens",
               "KV cache size in tokens", "vllm", "0.32.0"),
    LogPattern("model_loading", "startup", r"Model loading took (?P<load_gib>[\d.]+) GiB (?:memory )?and "
               r"(?P<load_s>[\d.]+) seconds", "weights loaded", "vllm", "0.32.0"),
    LogPattern("engine_init", "startup", r"init engine \(profile, create kv cache, warmup model\) took "
               r"(?P<init_s>[\d.]+) s", "engine initialisation time", "vllm", "0.32.0"),
]

COMMON_PATTERNS = [
    LogPattern("cuda_oom", "oom", r"(?:torch\.)?(?:cuda\.)?OutOfMemoryError|CUDA out of memory|out of memory",
               "ran out of GPU memory", "*"),
    LogPattern("cuda_error", "cuda_error",
               r"CUDA error: (?P<error>[^\n]+)|cudaErrorIllegalAddress|illegal memory access|"
               r"CUBLAS_STATUS_\w+|NCCL error|CUDA driver error", "a CUDA/cuBLAS/NCCL error", "*"),
    LogPattern("capture_failed", "graph_capture",
               r"(?i)(?:capture cuda graph failed|cuda graph capture (?:failed|error)|during cuda graph capture)",
               "CUDA-graph capture crashed", "*"),
    LogPattern("traceback", "cuda_error", r"^Traceback \(most recent call last\):", "a Python exception", "*"),
]

TRANSFORMERS_PATTERNS = [
    LogPattern("uvicorn_ready", "startup", r"Uvicorn running on (?P<url>\S+)", "the HTTP server is up",
               "transformers"),
    LogPattern("cb_cuda_graphs_used", "graph_capture",
               r"Using cuda graphs for \(varlen, decode\) paths: (?:\((?P<varlen>True|False), (?P<decode>True|False)\))?",
               "continuous batching's CUDA-graph decision for its prefill (varlen) and decode paths", "transformers",
               "5.17.0"),
    LogPattern("cb_graph_inputs", "graph_capture",
               r"because use_cuda_graphs = (?P<use_cuda_graphs>\w+(?:\.\d+)?) and "
               r"is_attn_mask_needed = (?P<attn_mask_needed>\w+(?:\.\d+)?)",
               "the inputs continuous batching chose from: graphs in use, and whether its attention needs a mask "
               "(graphs are chosen off when it does)", "transformers", "5.17.0 5.23.0"),
    # its source builds this message in a local before logging it, so no literal template carries it: no version
    LogPattern("cb_flash_advice", "attention_backend", r"Continuous batching is much better when using flash attention",
               "the attention implementation is not a flash one", "transformers"),
    LogPattern("cb_cuda_graph_off", "graph_disabled", r"turning off (?:cuda|accelerator) graphs",
               "CUDA graphs asked for but no graph backend (no CUDA) is available (5.17: 'cuda', 5.19: 'accelerator')",
               "transformers", "5.17.0"),
]


def patterns_for(engine: str) -> list[LogPattern]:
    """The patterns that apply to an engine (its own, then the common ones)."""
    own = {"sglang": SGLANG_PATTERNS, "vllm": VLLM_PATTERNS, "transformers": TRANSFORMERS_PATTERNS}.get(engine, [])
    return own + COMMON_PATTERNS


def analyze_log(text: str, patterns: list[LogPattern]) -> pd.DataFrame:
    """Every matching line: line_no, kind, name, meaning, the line, and the named groups (one row per line and
    pattern; a later, more specific pattern does not hide an earlier one)."""
    rows = []
    compiled = [(p, p.compiled()) for p in patterns]
    for i, line in enumerate(text.splitlines(), 1):
        for p, rx in compiled:
            m = rx.search(line)
            if m:
                groups = {k: v[:300] for k, v in m.groupdict().items() if v is not None}
                rows.append({"line_no": i, "kind": p.kind, "name": p.name, "meaning": p.meaning,
                             "line": line.strip()[:400], **groups})
    cols = ["line_no", "kind", "name", "meaning", "line"]
    df = pd.DataFrame(rows)
    return df if len(df) else pd.DataFrame(columns=cols)


def analyze_log_file(path: str | Path, engine: str) -> pd.DataFrame:
    """analyze_log over a log file with the engine's patterns."""
    return analyze_log(Path(path).read_text(errors="replace"), patterns_for(engine))


def template_of(node: ast.AST) -> str | None:
    """A message template from a string literal, an f-string (holes for expressions) or implicit concatenation."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else HOLE for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)):
        left = template_of(node.left)
        right = template_of(node.right) if isinstance(node.op, ast.Add) else ""
        return None if left is None else left + (right or "")
    return None


_LEVELS = ("debug", "info", "warning", "warn", "error", "exception", "critical", "print")
_LOG_HELPER = re.compile(r"^log_\w+|\w+_on_rank0$|^print_\w+")  # SGLang's log_info_on_rank0(logger, msg), ...
# a file that is_log_call could find a call in has one of those names before a parenthesis: the text test is cheap
_MAY_LOG = re.compile("(?:" + "|".join(_LEVELS) + r")(?:_once)?\s*\(|log_\w+\s*\(|_on_rank0\s*\(|print_\w+\s*\(")


def call_name(node: ast.Call) -> str:
    """The called function's last name (logger.warning -> 'warning')."""
    fn = node.func
    return fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")


def is_log_call(name: str) -> bool:
    """A logger method (info, warning_once, ...) or a logging helper of the engines (log_info_on_rank0, ...)."""
    return name.removesuffix("_once") in _LEVELS or bool(_LOG_HELPER.match(name))


def log_template(node: ast.Call) -> str | None:
    """The message template of a log call: its first argument, or the second where the first is the logger."""
    for arg in node.args[:2]:
        t = template_of(arg)
        if t:
            return t
    return None


def logged_messages(tree: SourceTree, prefix: str = "") -> pd.DataFrame:
    """Every message template passed to a logger call (logger.info/warning/... , logger.info_once, print) in the
    source: file, line, level, template (with %-placeholders as written and f-string holes as HOLE)."""
    rows = []
    for f in tree.files(prefix or tree.package + "/"):
        text = tree.read(f)
        if not _MAY_LOG.search(text):  # two thirds of an engine's files call no logger: their parse was most of it
            continue
        try:
            mod = parse_source(text)
        except SyntaxError:
            continue
        near = [i for i, ln in enumerate(text.splitlines(), 1) if _NAME_ON_LINE.search(ln)]
        for node in _calls_spanning(mod, near):
            if not node.args:
                continue
            level = call_name(node)
            if not is_log_call(level):
                continue
            t = log_template(node)
            if t:
                rows.append({"file": f, "line": node.lineno, "level": level, "template": t})
    return pd.DataFrame(rows, columns=["file", "line", "level", "template"]).sort_values(
        ["file", "line"], kind="stable", ignore_index=True)


# the line a log call's name sits on (its parenthesis there or on the next line): a call spans one of these
_NAME_ON_LINE = re.compile(r"(?:(?:" + "|".join(_LEVELS) + r")(?:_once)?|log_\w+|_on_rank0|print_\w+)\s*(?:\(|$)")


def _calls_spanning(mod: ast.AST, lines: list[int]) -> Iterator[ast.Call]:
    """The calls in mod whose lines hold one of lines (ascending), without walking the subtrees that hold none: most
    of an engine's code logs nothing (the same calls as a whole walk, in 15-25% less time over the five releases
    the tests read)."""
    stack = [mod]
    while stack:
        for child in ast.iter_child_nodes(stack.pop()):
            lo = getattr(child, "lineno", None)
            if lo is not None:
                i = bisect.bisect_left(lines, lo)
                if i == len(lines) or lines[i] > (getattr(child, "end_lineno", None) or lo):
                    continue
            if isinstance(child, ast.Call):
                yield child
            stack.append(child)


def example_line(template: str) -> str:
    """A log line as the template would print it: %-placeholders and f-string holes filled with plausible values."""
    t = re.sub(r"%(?:\.\d+)?[sdifr]", "1.5", template)
    return t.replace(HOLE, "1.5")


def vllm_config_from_log(text: str) -> dict | None:
    """vLLM's resolved settings from its startup log, for a server without /server_info (no VLLM_SERVER_DEV_MODE):
    the 'non-default args' line and the engine 'config:' line, in the shape of /server_info's vllm_config."""
    out: dict = {}
    m = re.search(r"non-default args: (\{.*\})", text)
    if m:
        try:
            out["non_default_args"] = ast.literal_eval(m.group(1))
        except (ValueError, SyntaxError):
            out["non_default_args"] = m.group(1)
    line = next((ln for ln in text.splitlines() if "LLM engine (v" in ln and "with config:" in ln), "")
    if not line and not out:
        return None
    cc: dict = {}
    for key, rx in (("mode", r"'mode': <CompilationMode\.\w+: (\d+)>"),
                    ("cudagraph_mode", r"'cudagraph_mode': <CUDAGraphMode\.\w+: (\d+)>")):
        if mm := re.search(rx, line):
            cc[key] = int(mm.group(1))
    eager = re.search(r"enforce_eager=(True|False)", line)
    device = re.search(r"device_config=(\w+)", line)
    dtype = re.search(r"\bdtype=torch\.(\w+)", line)
    model = re.search(r"\bmodel='([^']+)'", line)
    mc = ({"enforce_eager": eager.group(1) == "True"} if eager else {}) | ({"dtype": dtype.group(1)} if dtype else {}) \
        | ({"model": model.group(1)} if model else {})
    return {"vllm_config": {"compilation_config": cc, "model_config": mc,
                            "device_config": {"device": device.group(1)} if device else {}},
            "from_log": out}


def kv_tokens_from_log(text: str, engine: str) -> int | None:
    """Tokens one engine's KV cache holds, as its startup log says (the last such line: a restart says it again),
    or None where the log has no such line."""
    rows = analyze_log(text, [p for p in patterns_for(engine) if p.name in ("kv_cache", "kv_cache_size")])
    for col in ("kv_tokens", "kv_tokens_dtype"):
        if col not in rows:
            rows[col] = None
    values = rows["kv_tokens"].fillna(rows["kv_tokens_dtype"]).dropna()
    return int(float(str(values.iloc[-1]).replace(",", ""))) if len(values) else None
