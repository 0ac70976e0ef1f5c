"""SGLang adapter, 0.4.x to 0.5.23: every flag it emits is checked against the flags the installed version defines
(static scan of its source), so the same intent becomes the right spelling on each version, and an intent the
version cannot express raises an error that says what it can do instead.

Graph intents on SGLang (see ../shared/knob-catalogue.md sections 1, 2):
- 0.4.x: decode graphs only (prefill always eager); `--disable-cuda-graph`.
- 0.5.3.post2-0.5.9: piecewise prefill graphs opt-in, `--enable-piecewise-cuda-graph`.
- ~0.5.10+: piecewise on by default, `--disable-piecewise-cuda-graph`.
- 0.5.14+: per phase, `--cuda-graph-backend-decode/prefill full|breakable|disabled`; what each phase accepts is
  read from the version (0.5.14 has no full prefill graph, so cuda_graph='full' is refused there).
"""

from __future__ import annotations

import re
import urllib.error
from pathlib import Path
from typing import Any

import pandas as pd
from typing_extensions import override

from ..errors import KnobError
from ..models import config_dtype, short_dtype
from ..server import ReadyCheck
from ..spec import Knobs
from ..state import FactRule, ResolvedState
from .base import EngineAdapter, EngineInstall, LaunchPlan, installed_version, mps_recipe, version_tuple
from .envs import EngineEnvSpec
from .flagscan import FlagSet
from .http import get_json_patiently, post
from .logs import LogPattern, patterns_for

# old per-backend switches, before --moe-runner-backend existed
_OLD_MOE_FLAGS = {"flashinfer_cutlass": "--enable-flashinfer-cutlass-moe",
                  "flashinfer_trtllm": "--enable-flashinfer-trtllm-moe",
                  "flashinfer_mxfp4": "--enable-flashinfer-mxfp4-moe",
                  "triton_kernel": "--enable-triton-kernel-moe"}

# (decode, prefill) backends of each graph intent from 0.5.14 (--cuda-graph-backend-decode/prefill)
_PHASE_BACKENDS = {"off": ("disabled", "disabled"), "decode_only": ("full", "disabled"), "full": ("full", "full"),
                   "piecewise": ("full", "breakable"), "compiled_piecewise": ("full", "tc_piecewise")}
# a phase's backend as the engine-neutral record names it
_PHASE_STATE = {"disabled": "off", "full": "full", "breakable": "piecewise", "piecewise": "piecewise",
                "tc_piecewise": "compiled_piecewise"}
# the flags of a launch that turn graphs (or one phase) off, and which phases: what thread 1 names as the user's cause
_OFF_FLAGS = {"--disable-cuda-graph": ("decode", "prefill"), "--disable-prefill-cuda-graph": ("prefill",),
              "--disable-decode-cuda-graph": ("decode",), "--disable-piecewise-cuda-graph": ("prefill",)}

METRICS = {
    "sglang:num_running_reqs": "requests in the running batch",
    "sglang:num_queue_reqs": "requests waiting",
    "sglang:token_usage": "KV-cache token usage (0-1)",
    "sglang:gen_throughput": "generation throughput, tokens/s",
    "sglang:cache_hit_rate": "prefix-cache hit rate",
    "sglang:is_cuda_graph": "1 while the last batch ran as a CUDA graph",
    "sglang:cuda_graph_passes_total": "forward passes by mode (decode_cuda_graph, decode_none, prefill_...)",
    "sglang:utilization": "scheduler's view of utilization",
    "sglang:fwd_occupancy": "forward GPU time over wall time",
    "sglang:num_retracted_reqs": "requests retracted for lack of KV space",
}


class _Flags:
    """Emits flags only after checking the version defines them."""

    def __init__(self, fs: FlagSet, version: str) -> None:
        self.fs = fs
        self.v = f"SGLang {version}"
        self.out: list[str] = []

    def has(self, *flags: str) -> bool:
        return all(self.fs.has(f) for f in flags)

    def add(self, flag: str, value: Any = None, knob: str = "") -> None:
        if not self.fs.has(flag):
            raise KnobError(f"{self.v} does not define {flag}")
        if value is not None:
            try:
                self.fs.check_value(flag, value)
            except KnobError as e:
                raise KnobError(f"{knob}: {e}" if knob else str(e)) from None
        self.out += [flag] if value is None else [flag, str(value)]


# 'Prefill batch, ... cuda graph: True, ...' / 'Decode batch, ... cuda graph: False, ...' (metrics_reporter.py)
_BATCH_LINE = re.compile(r"(?P<phase>Prefill|Decode) batch\b[^\n]*?cuda graph: (?P<graph>True|False)")
# 'Load weight end. elapsed=1.2 s', 'Capture target decode CUDA graph begin. backend=full', '... end. elapsed=3.4 s'
_STAGE = re.compile(r"Load weight end\. elapsed=(?P<load_s>[\d.]+) s|Capture (?P<what>[\w ]+?) (?:CUDA|cuda) graph "
                    r"(?P<begin>begin)\. backend=(?P<backend>\w+)|Capture (?P<what2>[\w ]+?) (?:CUDA|cuda) graph end\. "
                    r"(?:Time elapsed: |elapsed=)(?P<capture_s>[\d.]+) s")

SGLANG_KEY_METRICS = ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
                      "sglang:gen_throughput", "sglang:cuda_graph_passes_total", "sglang:is_cuda_graph",
                      "sglang:utilization")


class SglangAdapter(EngineAdapter):
    """SGLang, launched as `python -m sglang.launch_server`."""

    name = "sglang"
    random_weight_flags = ("--load-format", "dummy")
    metric_prefixes = ("sglang:",)
    key_metrics = SGLANG_KEY_METRICS
    counters = {"running": ("sglang:num_running_reqs", "median", 1.0),
                "queued": ("sglang:num_queue_reqs", "median", 1.0),
                "kv_used_pct": ("sglang:token_usage", "median", 100.0),
                "kv_capacity_tokens": ("sglang:max_total_num_tokens", "median", 1.0),
                "engine_gen_tok_s": ("sglang:gen_throughput", "median", 1.0),
                "passes_per_s": ("sglang:cuda_graph_passes_total", "rate_per_s", 1.0),
                "graph_passes_per_s": ("sglang:cuda_graph_passes_total", "rate_per_s", 1.0, '_cuda_graph"'),
                "process_cpu_pct": ("sglang:process_cpu_seconds_total", "rate_per_s", 100.0),
                # GPU time of forward passes over wall time (CUDA events, read without a sync), where plan() turns
                # its timer on (SGLANG_ENABLE_METRICS_DEVICE_TIMER, 0.5.17 on); NaN without it
                "fwd_occupancy_pct": ("sglang:fwd_occupancy", "median", 1.0),
                # the same timer's GPU seconds of forward passes, as a share of wall time (the rest: the scheduler
                # between passes, or idle)
                "fwd_busy_pct": ("sglang:forward_execution_seconds_total", "rate_per_s", 100.0)}
    # --mem-fraction-static counts from the memory free when the server starts (weights and KV pool together), and
    # its pool is what is left of that after its weights: replicas start one after another
    mem_fraction_of = "free"
    help_command = ("-m", "sglang.launch_server", "--help")
    # SGLang compiles the model inside its decode CUDA-graph runner: with graphs off, --enable-torch-compile does
    # nothing, so compile is compared with decode graphs on both sides
    compile_study_graphs = "decode_only"
    package = "sglang"
    distributions = ("sglang",)
    # a child's failure makes the launcher kill its whole tree (entrypoints/engine.py: SIGQUIT handler ->
    # kill_process_tree), and the scheduler names itself when it raises (managers/scheduler.py)
    teardown_patterns = (r"Received sigquit from a child process",)
    knob_attrs = {"num_continuous_decode_steps": "num_continuous_decode_steps",
                  "max_running_requests": "max_running_requests", "chunked_prefill_size": "chunked_prefill_size"}
    raiser_patterns = (r"(?P<who>[A-Z]\w+) hit an exception",)

    balancer = ("sglang-router (`python -m sglang_router.launch_router --worker-urls URL1 URL2 ... --policy "
                "round_robin`, the sglang-router package)")

    @override
    def grouped_moe_advice(self) -> str:
        """SGLang's MoE runner is a flag."""
        return "Choose a grouped MoE runner with --moe-runner-backend (triton, deep_gemm, flashinfer_cutlass, ...)."

    @override
    def output_check_request(self, model: str, text: str, max_tokens: int) -> tuple[str, dict[str, Any]]:
        """SGLang's native /generate with return_logprob from the prompt's first token."""
        return "/generate", {"text": text, "return_logprob": True, "logprob_start_len": 0,
                             "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}}

    @override
    def output_check_parse(self, obj: dict[str, Any]) -> tuple[list[float | None], list[int], list[float]]:
        """meta_info's input_token_logprobs and output_token_logprobs: [logprob, token id, text] each."""
        meta = (obj[0] if isinstance(obj, list) else obj).get("meta_info") or {}
        prompt = [None if x[0] is None else float(x[0]) for x in meta.get("input_token_logprobs") or []]
        out = meta.get("output_token_logprobs") or []
        return prompt, [int(x[1]) for x in out], [float(x[0]) for x in out]

    @override
    def replica_recipe(self, knobs: Knobs, install: EngineInstall, placements: list[str]) -> str:
        """Replicas on one GPU: the version's native same-GPU data parallelism where it declares it
        (`--same-gpu-replicas N`, one endpoint behind its own DP controller), else N servers behind sglang-router."""
        try:
            native = bool(knobs.gpu_share) and self.flag_set(install).has("--same-gpu-replicas")
        except Exception:  # noqa: BLE001 - offline without the release's source: the recipe that needs no flag
            native = False
        if not native:
            return super().replica_recipe(knobs, install, placements)
        flags = " ".join(["--same-gpu-replicas", str(knobs.replicas), *self.recommended_flags(knobs, install)])
        out = f"run one SGLang {install.version} server with `{flags}` (its own DP controller spreads requests)"
        return out + (mps_recipe(knobs.mps_active_thread_pct) if knobs.gpu_share == "mps" else "")

    @override
    def managed_env(self, version: str | None) -> EngineEnvSpec | None:
        """SGLang needs a CUDA machine: servescope never installs it, point engine.python at yours."""
        return None

    @override
    def probe(self, python: str, env: dict[str, str] | None = None) -> EngineInstall:
        """Version from the interpreter's package metadata, the package found there (SGLang is not imported)."""
        version, dist = installed_version(python, self.distributions, "SGLang", "sglang", env)
        return EngineInstall(python=python, version=version, distribution=dist, platform="cuda", env=dict(env or {}))

    # ---- knobs -------------------------------------------------------------------------------------------------

    def _graph(self, f: _Flags, mode: str) -> None:
        per_phase = f.has("--cuda-graph-backend-decode", "--cuda-graph-backend-prefill")
        pcg_opt_in = f.has("--enable-piecewise-cuda-graph") and not f.has("--disable-piecewise-cuda-graph")
        pcg_default = f.has("--disable-piecewise-cuda-graph")
        prefill_ok = (f.fs.choices("--cuda-graph-backend-prefill") or ["full"]) if per_phase else []
        can = ["off", "decode_only"] + ([m for m in ("full", "piecewise", "compiled_piecewise")
                                         if _PHASE_BACKENDS[m][1] in prefill_ok] if per_phase else
                                        ["piecewise"] if (pcg_opt_in or pcg_default) else [])
        if mode == "compiled_piecewise" and not per_phase:
            raise KnobError(f"{f.v}'s piecewise graphs are torch.compile's already: ask for cuda_graph 'piecewise' "
                            f"(it can: {', '.join(can)})")
        if per_phase:  # 0.5.14+ says each phase's backend outright
            decode, prefill = _PHASE_BACKENDS[mode]
            f.add("--cuda-graph-backend-decode", decode, knob=f"cuda_graph={mode!r} needs decode={decode}")
            f.add("--cuda-graph-backend-prefill", prefill, knob=f"cuda_graph={mode!r} needs prefill={prefill}")
        elif mode == "off":
            f.add("--disable-cuda-graph")
        elif mode == "decode_only":
            if pcg_default:
                f.add("--disable-piecewise-cuda-graph")
            # else: decode graphs are this version's default and prefill runs eager
        elif mode == "full":
            raise KnobError(f"{f.v} cannot capture prefill as one full graph (it can: {', '.join(can)})")
        elif mode == "piecewise":
            if pcg_opt_in:
                f.add("--enable-piecewise-cuda-graph")
            elif not pcg_default:
                raise KnobError(f"{f.v} has no piecewise CUDA graphs: prefill always runs eager (it can: "
                                f"{', '.join(can)}); piecewise prefill graphs arrived in "
                                "0.5.3.post2 (--enable-piecewise-cuda-graph)")
            # else: piecewise is this version's default (auto-disable rules may still turn it off: thread 1)

    @override
    def node_flags(self, install: EngineInstall, nodes: int, rank: int, addr: str, port: int) -> list[str]:
        """SGLang's own multi-node launch: the same command on every node with its rank, rank 0 listening for the
        others' process groups at --dist-init-addr and serving HTTP alone."""
        f = _Flags(self.flag_set(install), install.version)
        f.add("--nnodes", nodes, knob="nodes")
        f.add("--node-rank", rank, knob="nodes")
        f.add("--dist-init-addr", f"{addr}:{port}", knob="nodes")
        return f.out

    @override
    def default_graph_mode(self, install: EngineInstall) -> str | None:
        """Decode graphs always; prefill graphs (breakable) by default from 0.5.10 (knob catalogue, "Prefill graphs";
        0.5.17's defaults resolved decode=full prefill=breakable on the H200, data/reference/sglang-h200)."""
        return "piecewise" if version_tuple(install.version) >= (0, 5, 10) else "decode_only"

    @override
    def knob_flags(self, knobs: Knobs, install: EngineInstall) -> list[str]:
        """Translate intent into this SGLang version's flags; KnobError names the version and the alternative."""
        f = _Flags(self.flag_set(install), install.version)
        if knobs.cuda_graph is not None:
            self._graph(f, knobs.cuda_graph)
        if knobs.cuda_graph_max_bs is not None:
            if knobs.cuda_graph == "off":
                raise KnobError(f"{f.v}: cuda_graph_max_bs given while CUDA graphs are off")
            f.add("--cuda-graph-max-bs-decode" if f.has("--cuda-graph-max-bs-decode") else "--cuda-graph-max-bs",
                  knobs.cuda_graph_max_bs)
        if knobs.torch_compile:
            f.add("--enable-torch-compile")
        if knobs.torch_compile_max_bs is not None:
            if not knobs.torch_compile:
                raise KnobError(f"{f.v}: torch_compile_max_bs needs torch_compile=True")
            f.add("--torch-compile-max-bs", knobs.torch_compile_max_bs)
        self._parallel(f, knobs)
        if knobs.moe_backend is not None:
            self._moe_backend(f, knobs.moe_backend)
        self._scheduler(f, knobs)
        return f.out + list(knobs.extra_args)

    @staticmethod
    def _parallel(f: _Flags, knobs: Knobs) -> None:
        if knobs.tp > 1:
            f.add("--tp-size", knobs.tp)
        if knobs.pp > 1:
            f.add("--pp-size", knobs.pp)
        if knobs.attn_dp is not None:
            if knobs.dp > 1:
                raise KnobError(f"{f.v}: dp={knobs.dp} replicas together with attn_dp={knobs.attn_dp} is rejected "
                                "by SGLang; run DP attention inside one replica (dp=1) or replicas without it")
            if knobs.attn_dp > knobs.tp:
                raise KnobError(f"{f.v}: attn_dp={knobs.attn_dp} must divide tp={knobs.tp} (DP attention splits the "
                                "TP group)")
            if f.has("--attn-dp-size"):
                f.add("--attn-dp-size", knobs.attn_dp)
            else:  # older spelling: the attention-DP size is --dp-size, switched by --enable-dp-attention
                f.add("--dp-size", knobs.attn_dp)
                f.add("--enable-dp-attention")
        elif knobs.dp > 1:
            f.add("--dp-size", knobs.dp)
        if knobs.ep is not None:
            f.add("--ep-size", knobs.ep)
            if f.has("--enable-ep-moe") and not f.has("--moe-a2a-backend") and knobs.ep > 1:
                f.add("--enable-ep-moe")  # 0.4.x: the EP MoE layer is a separate switch

    @staticmethod
    def _moe_backend(f: _Flags, backend: str) -> None:
        if f.has("--moe-runner-backend"):
            choices = f.fs.choices("--moe-runner-backend")
            if choices and backend not in choices:
                raise KnobError(f"{f.v}: moe_backend {backend!r} is not one of {choices}")
            f.add("--moe-runner-backend", backend)
        elif backend in ("triton", "auto"):
            pass  # the Triton fused MoE is the default before --moe-runner-backend existed
        elif backend in _OLD_MOE_FLAGS and f.has(_OLD_MOE_FLAGS[backend]):
            f.add(_OLD_MOE_FLAGS[backend])
        else:
            have = [k for k, flag in _OLD_MOE_FLAGS.items() if f.has(flag)]
            raise KnobError(f"{f.v} has no --moe-runner-backend and no switch for {backend!r}; it can: "
                            f"triton (default), {', '.join(have) or 'nothing else'}")

    @staticmethod
    def _scheduler(f: _Flags, knobs: Knobs) -> None:
        if knobs.max_running_requests is not None:
            f.add("--max-running-requests", knobs.max_running_requests)
        if knobs.num_continuous_decode_steps is not None:
            f.add("--num-continuous-decode-steps", knobs.num_continuous_decode_steps)
        if knobs.two_batch_overlap:
            if not f.has("--enable-two-batch-overlap"):
                raise KnobError(f"{f.v} has no two-batch overlap")
            f.add("--enable-two-batch-overlap")
        if knobs.single_batch_overlap:
            if not f.has("--enable-single-batch-overlap"):
                raise KnobError(f"{f.v} has no single-batch overlap; it can: two_batch_overlap"
                                if f.has("--enable-two-batch-overlap") else f"{f.v} has no single-batch overlap")
            f.add("--enable-single-batch-overlap")
        if knobs.chunked_prefill_size is not None:
            f.add("--chunked-prefill-size", knobs.chunked_prefill_size)
        if knobs.mem_fraction is not None:
            f.add("--mem-fraction-static", knobs.mem_fraction)

    @override
    def plan(self, *, install: EngineInstall, model_path: str, served_name: str, host: str, port: int,
             knobs: Knobs, extra_env: dict[str, str]) -> LaunchPlan:
        """`python -m sglang.launch_server --model-path M ...` with Prometheus metrics on."""
        flags = self.knob_flags(knobs, install)
        fs = self.flag_set(install)
        base = _Flags(fs, install.version)
        base.add("--model-path", model_path)
        base.add("--served-model-name", served_name)
        base.add("--host", host)
        base.add("--port", port)
        base.add("--enable-metrics")
        cmd = [install.python, "-m", "sglang.launch_server", *base.out, *flags]
        env = {"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "0",  # /health answers without generating
               # sglang:fwd_occupancy, the engine's own GPU-busy share beside NVML's (versions without it ignore it)
               "SGLANG_ENABLE_METRICS_DEVICE_TIMER": "1"}
        if model_path.startswith("/"):
            env |= {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        env |= extra_env
        return LaunchPlan(command=cmd, env=env, ready=ReadyCheck(), flags=flags)

    # ---- running server ------------------------------------------------------------------------------------------

    @override
    def resolved_config(self, base_url: str, timeout_s: float = 10.0) -> dict[str, Any] | None:
        """`/server_info` (0.4.x: `/get_server_info`): resolved server args, version, internal states."""
        for path in ("/server_info", "/get_server_info"):
            try:
                return get_json_patiently(base_url.rstrip("/") + path, timeout_s)
            except urllib.error.HTTPError as e:
                if e.code != 404:
                    return None
            except OSError:
                return None
        return None

    @override
    def resolved_state(self, resolved: dict[str, Any] | None, log_text: str = "") -> ResolvedState:
        """From `/server_info` (its server args): per-phase backends on 0.5.2x, disable_cuda_graph and the piecewise
        switch before; backends 'auto' or unset are taken from the log lines that name them."""
        r = resolved or {}
        st = ResolvedState("sglang", source="/server_info" if r else "")
        if r:
            cfg = r.get("cuda_graph_config") if isinstance(r.get("cuda_graph_config"), dict) else {}
            dec = (cfg.get("decode") or {}).get("backend") or r.get("cuda_graph_backend_decode")
            pre = (cfg.get("prefill") or {}).get("backend") or r.get("cuda_graph_backend_prefill")
            if dec is not None or pre is not None:  # 0.5.14+ per-phase backends
                dec, pre = dec or "full", pre or "disabled"
                st.graph_decode, st.graph_prefill = _PHASE_STATE.get(dec, dec), _PHASE_STATE.get(pre, pre)
                st.graph_mode = f"decode={dec} prefill={pre}"
            elif r.get("disable_cuda_graph"):
                st.graph_decode, st.graph_prefill, st.graph_mode = "off", "off", "disable_cuda_graph=True"
            elif "disable_cuda_graph" in r:
                pcg = r.get("enable_piecewise_cuda_graph")
                if "disable_piecewise_cuda_graph" in r:
                    pcg = not r["disable_piecewise_cuda_graph"]
                st.graph_decode, st.graph_prefill = "full", "piecewise" if pcg else "off"
                st.graph_mode = f"decode graphs, piecewise prefill {'on' if pcg else 'off'}"
            if "enable_torch_compile" in r:
                st.compile = "on" if r["enable_torch_compile"] else "off"
                st.compile_mode = "torch.compile" if r["enable_torch_compile"] else None
            st.tp, st.dp, st.ep = r.get("tp_size"), r.get("dp_size"), r.get("ep_size")
            moe = r.get("moe_runner_backend")
            st.moe_backend = moe if moe not in (None, "auto") else None
            st.attention_backend = r.get("attention_backend") or None
            st.device = r.get("device")
            st.config_dtype = config_dtype(str(r.get("model_path") or ""))
            given = r.get("dtype")  # 'auto' (the default) serves the config's dtype
            st.dtype = short_dtype(given) if given and given != "auto" else st.config_dtype
            keys = ("attention_backend", "deepep_mode", "moe_a2a_backend", "enable_torch_compile",
                    "disaggregation_mode", "enable_two_batch_overlap", "pp_size", "cuda_graph_max_bs",
                    "max_running_requests", "chunked_prefill_size", "moe_runner_backend", "version",
                    "enable_dp_attention")
            st.facts = {k: r[k] for k in keys if k in r}
        self._from_log(st, log_text)
        no_info = "no /server_info answer (0.4.x serves /get_server_info; servescope asks both)"
        return st.complete_missing({
            "eager": "SGLang has no eager switch: compile and CUDA graphs are set apart",
            "moe_backend": "moe_runner_backend is 'auto' or absent and the log names none",
            "attention_backend": "attention_backend unset (chosen at run time) and the log names none",
            **{f: no_info if not r else "this version's server args do not carry it"
               for f in ("compile", "graph_decode", "graph_prefill", "tp", "dp", "ep", "device", "dtype")}})

    def _from_log(self, st: ResolvedState, log_text: str) -> None:
        """What the log says beyond the server args: a piecewise prefill graph turned off at run time (0.5.9's
        compile conflict, 0.5.17's capture skipped), backends the args left to 'auto'."""
        from .logs import analyze_log

        lines = analyze_log(log_text, self.log_patterns()) if log_text else None
        if lines is not None and len(lines):
            # 0.5.9 checks compile against piecewise graphs at run time: its args still say piecewise, its log not
            if (lines["name"] == "piecewise_compile_conflict").any() and st.graph_prefill == "piecewise":
                st.graph_prefill = "off"
                st.graph_mode = f"{st.graph_mode}; log: piecewise disabled (conflict with torch compile)"
            # 0.5.17 may still run a configured prefill graph eagerly (too little memory left to capture, no
            # capture size fits, layers it cannot split): its log says so, its args do not
            skipped = lines[lines["name"] == "prefill_graph_skipped"]
            if len(skipped) and st.graph_prefill not in (None, "off"):
                st.graph_prefill = "off"
                st.graph_mode = f"{st.graph_mode}; log: prefill graph not captured ({skipped['line'].iloc[0][:160]})"
            for fld, kind in (("moe_backend", "moe_backend"), ("attention_backend", "attention_backend")):
                hit = lines[lines["kind"] == kind]
                if getattr(st, fld) is None and len(hit) and "backend" in hit:
                    setattr(st, fld, str(hit["backend"].dropna().iloc[0]) if hit["backend"].notna().any() else None)

    @override
    def fact_rules(self, state: ResolvedState) -> list[FactRule]:
        """Attention backend, DeepEP mode, compile, PD disaggregation, two-batch overlap, pipeline parallelism."""
        f, out = state.facts, []
        if f.get("attention_backend") in ("torch_native", "flex_attention"):
            out.append(FactRule(f"attention backend is {f['attention_backend']}", re.escape(f"== '{f['attention_backend']}'")))
        if f.get("deepep_mode") == "normal":
            out.append(FactRule("DeepEP in normal mode", r"deepep_mode == 'normal'"))
        if f.get("enable_torch_compile"):
            out.append(FactRule("torch.compile is on", r"enable_torch_compile"))
        if f.get("disaggregation_mode") in ("prefill", "decode"):
            out.append(FactRule(f"PD disaggregation, {f['disaggregation_mode']} server",
                        re.escape(f"disaggregation_mode == '{f['disaggregation_mode']}'")))
        if f.get("enable_two_batch_overlap"):
            out.append(FactRule("two-batch overlap is on", r"enable_two_batch_overlap"))
        if (f.get("pp_size") or 1) > 1:
            out.append(FactRule("pipeline parallelism", r"pp_size > 1"))
        return out

    @override
    def graph_counts(self, log_text: str) -> pd.DataFrame:
        """Logged batches per phase and whether each ran as a CUDA graph (the 'cuda graph: True|False' field of
        SGLang's 'Prefill batch' and 'Decode batch' lines; decode lines come every decode_log_interval batches, so
        these count logged batches, not all)."""
        rows = [(f"{m.group('phase').lower()} {'graph' if m.group('graph') == 'True' else 'eager'}",)
                for m in _BATCH_LINE.finditer(log_text)]
        if not rows:
            return pd.DataFrame(columns=["mode", "batches"])
        df = pd.DataFrame(rows, columns=["mode"]).assign(batches=1)
        return df.groupby("mode", sort=True, as_index=False)["batches"].sum()

    @override
    def startup_stages(self, log_text: str) -> pd.DataFrame:
        """Seconds each startup stage took, as the log says (weights, each CUDA-graph capture with its backend)."""
        rows, backend = [], {}
        for m in _STAGE.finditer(log_text):
            if m.group("begin"):
                backend[m.group("what")] = m.group("backend") or ""
            elif m.group("load_s"):
                rows.append({"stage": "load weights", "seconds": float(m.group("load_s"))})
            else:
                what = m.group("what2")
                rows.append({"stage": f"capture {what} graph" + (f" ({backend[what]})" if backend.get(what) else ""),
                             "seconds": float(m.group("capture_s"))})
        return pd.DataFrame(rows, columns=["stage", "seconds"])

    @override
    def death_stage(self, log_text: str) -> str:
        """A capture begun and not ended: during it; every capture ended: at the warm-up after them, where the
        first prefill and decode batches replay the graphs; no capture: before any."""
        begun = [m.group("what") for m in _STAGE.finditer(log_text) if m.group("begin")]
        ended = [m.group("what2") for m in _STAGE.finditer(log_text) if m.group("capture_s")]
        open_ = [w for w in begun if w not in ended]
        if open_:
            return f"during the {open_[-1]} CUDA-graph capture"
        if begun:
            return f"after capturing its {' and '.join(dict.fromkeys(w.split()[-1] for w in begun))} CUDA graphs, " \
                   "at the warm-up that first replays them"
        return "before any CUDA-graph capture" if "Load weight end" in log_text else ""

    @override
    def graph_off_flags(self, command: list[str], install: EngineInstall) -> list[dict[str, str]]:
        """The flags of a launch command that turn CUDA graphs (or a phase) off, each with the phases it turns off
        and, where this version marks it deprecated, what it stands for now."""
        out = []
        try:
            fs = self.flag_set(install)
        except Exception:  # noqa: BLE001 - offline without the source: the flags are still named, unqualified
            fs = None
        for i, arg in enumerate(command):
            name, _, inline = arg.partition("=")
            value = inline or (command[i + 1] if i + 1 < len(command) else "")
            phases: tuple[str, ...] = ()
            if name in _OFF_FLAGS:
                phases = _OFF_FLAGS[name]
            elif name in ("--cuda-graph-backend-decode", "--cuda-graph-backend-prefill") and value == "disabled":
                phases = (name.rsplit("-", 1)[-1],)
            if not phases:
                continue
            shown = f"{name} {value}" if name.startswith("--cuda-graph-backend") else name
            alias = ""
            if fs is not None and fs.is_deprecated(name):
                new = " ".join(f"--cuda-graph-backend-{p} disabled" for p in phases)
                alias = f"a deprecated alias on {self.name} {install.version}: it stands for `{new}`" \
                    if fs.has("--cuda-graph-backend-decode") else f"deprecated on {self.name} {install.version}"
            out.append({"flag": shown, "phases": " and ".join(phases), "alias": alias})
        both = {x["flag"] for x in out} >= {"--cuda-graph-backend-decode disabled", "--cuda-graph-backend-prefill disabled"}
        if both and fs is not None and fs.has("--disable-cuda-graph") and fs.is_deprecated("--disable-cuda-graph"):
            for x in out:  # the pair is what the seed's one flag stands for on this version
                if x["flag"].startswith("--cuda-graph-backend-"):
                    x["alias"] = (f"together, what `--disable-cuda-graph` stands for on {self.name} "
                                  f"{install.version}, where that flag is a deprecated alias")
        return out

    @override
    def graph_metrics(self) -> dict[str, str]:
        """Forward passes by mode (`mode` label: decode_cuda_graph, decode_none, ...), where the version exports it."""
        return {"sglang:cuda_graph_passes_total": "forward passes by mode (CUDA graph or not)",
                "sglang:is_cuda_graph": "whether the last batch ran as a CUDA graph"}

    @override
    def torch_profiler_launch(self, install: EngineInstall, out_dir: str) -> tuple[list[str], dict[str, str]]:
        """Nothing to add at launch: /start_profile takes output_dir; the env var sets the fallback folder."""
        return [], {"SGLANG_TORCH_PROFILER_DIR": str(Path(out_dir).resolve())}

    @override
    def cuda_profiler_launch(self, install: EngineInstall) -> tuple[list[str], dict[str, str]] | None:
        """/start_profile with activities ['CUDA_PROFILER'] calls cudaProfilerStart in the first GPU's process."""
        return [], {}

    @override
    def start_profile(self, base_url: str, out_dir: str | None = None, timeout_s: float = 60.0,
                      activities: tuple[str, ...] | None = None) -> None:
        """POST /start_profile {output_dir, activities}; CUDA_PROFILER alone when no output folder is given
        (the nsys capture-range case), else the PyTorch profiler on CPU and GPU."""
        acts = list(activities or (("CPU", "GPU") if out_dir else ("CUDA_PROFILER",)))
        body: dict[str, Any] = {"activities": acts}
        if out_dir:
            body["output_dir"] = str(Path(out_dir).resolve())
        post(base_url.rstrip("/") + "/start_profile", body, timeout_s)

    @override
    def stop_profile(self, base_url: str, timeout_s: float = 600.0) -> None:
        """POST /stop_profile (SGLang writes the traces after answering, at times)."""
        post(base_url.rstrip("/") + "/stop_profile", None, timeout_s)

    @override
    def log_patterns(self) -> list[LogPattern]:
        """SGLang's graph, MoE, startup lines plus the common error lines."""
        return patterns_for("sglang")

    @override
    def metric_names(self) -> dict[str, str]:
        """SGLang Prometheus metrics (needs --enable-metrics, which plan() sets)."""
        return dict(METRICS)
