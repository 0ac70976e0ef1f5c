"""SGLang adapter, 0.4.x to 0.5.23: every flag it emits is checked against the flags the installed version defines
(static scan of its source), so the same intent becomes the right spelling on each version, and an intent the
version cannot express raises an error that says what it can do instead.

Graph intents on SGLang (see ../shared/knob-catalogue.md sections 1, 2):
- 0.4.x: decode graphs only (prefill always eager); `--disable-cuda-graph`.
- 0.5.4-0.5.9: piecewise prefill graphs opt-in, `--enable-piecewise-cuda-graph`.
- ~0.5.10+: piecewise on by default, `--disable-piecewise-cuda-graph`.
- 0.5.2x: per phase, `--cuda-graph-backend-decode/prefill full|breakable|disabled`.
"""

from __future__ import annotations

import urllib.error
from pathlib import Path
from typing import Any

from ..errors import KnobError
from ..server import ReadyCheck
from ..spec import Knobs
from . import register
from .base import EngineAdapter, EngineInstall, LaunchPlan, get_json, installed_version, post
from .envs import EngineEnvSpec
from .flagscan import FlagSet
from .logs import LogPattern, patterns_for

# old per-backend switches, before --moe-runner-backend existed
_OLD_MOE_FLAGS = {"flashinfer_cutlass": "--enable-flashinfer-cutlass-moe",
                  "flashinfer_trtllm": "--enable-flashinfer-trtllm-moe",
                  "flashinfer_mxfp4": "--enable-flashinfer-mxfp4-moe",
                  "triton_kernel": "--enable-triton-kernel-moe"}

# (decode, prefill) backends of each graph intent on 0.5.2x (--cuda-graph-backend-decode/prefill)
_PHASE_BACKENDS = {"off": ("disabled", "disabled"), "decode_only": ("full", "disabled"), "full": ("full", "full"),
                   "piecewise": ("full", "breakable")}

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

    def add(self, flag: str, value: Any = None) -> None:
        if not self.fs.has(flag):
            raise KnobError(f"{self.v} does not define {flag}")
        self.out += [flag] if value is None else [flag, str(value)]


@register
class SglangAdapter(EngineAdapter):
    """SGLang, launched as `python -m sglang.launch_server`."""

    name = "sglang"
    package = "sglang"
    distributions = ("sglang",)

    def managed_env(self, version: str | None) -> EngineEnvSpec | None:
        """SGLang needs a CUDA machine: servescope never installs it, point engine.python at yours."""
        return None

    def probe(self, python: str) -> EngineInstall:
        """Version from the interpreter's package metadata (SGLang is not imported)."""
        version, dist = installed_version(python, self.distributions, "SGLang")
        return EngineInstall(python=python, version=version, distribution=dist, platform="cuda")

    # ---- knobs -------------------------------------------------------------------------------------------------

    def _graph(self, f: _Flags, mode: str) -> None:
        per_phase = f.has("--cuda-graph-backend-decode", "--cuda-graph-backend-prefill")
        pcg_opt_in = f.has("--enable-piecewise-cuda-graph") and not f.has("--disable-piecewise-cuda-graph")
        pcg_default = f.has("--disable-piecewise-cuda-graph")
        can = ["off", "decode_only"] + (["full", "piecewise"] if per_phase else
                                        ["piecewise"] if (pcg_opt_in or pcg_default) else [])
        if per_phase:  # 0.5.2x says each phase's backend outright
            decode, prefill = _PHASE_BACKENDS[mode]
            f.add("--cuda-graph-backend-decode", decode)
            f.add("--cuda-graph-backend-prefill", prefill)
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
                                f"{', '.join(can)}); piecewise prefill graphs arrived in 0.5.4 "
                                "(--enable-piecewise-cuda-graph)")
            # else: piecewise is this version's default (auto-disable rules may still turn it off: thread 1)

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
        if knobs.tp > 1:
            f.add("--tp-size", knobs.tp)
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
        if knobs.moe_backend is not None:
            if f.has("--moe-runner-backend"):
                choices = f.fs.choices("--moe-runner-backend")
                if choices and knobs.moe_backend not in choices:
                    raise KnobError(f"{f.v}: moe_backend {knobs.moe_backend!r} is not one of {choices}")
                f.add("--moe-runner-backend", knobs.moe_backend)
            elif knobs.moe_backend in ("triton", "auto"):
                pass  # the Triton fused MoE is the default before --moe-runner-backend existed
            elif knobs.moe_backend in _OLD_MOE_FLAGS and f.has(_OLD_MOE_FLAGS[knobs.moe_backend]):
                f.add(_OLD_MOE_FLAGS[knobs.moe_backend])
            else:
                have = [k for k, flag in _OLD_MOE_FLAGS.items() if f.has(flag)]
                raise KnobError(f"{f.v} has no --moe-runner-backend and no switch for {knobs.moe_backend!r}; it can: "
                                f"triton (default), {', '.join(have) or 'nothing else'}")
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
        return f.out + list(knobs.extra_args)

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
        env = {"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "0"}  # /health answers without generating
        if model_path.startswith("/"):
            env |= {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        env |= extra_env
        return LaunchPlan(command=cmd, env=env, ready=ReadyCheck(), flags=flags)

    # ---- running server ------------------------------------------------------------------------------------------

    def resolved_config(self, base_url: str, timeout_s: float = 10.0) -> dict[str, Any] | None:
        """`/server_info` (0.4.x: `/get_server_info`): resolved server args, version, internal states."""
        for path in ("/server_info", "/get_server_info"):
            try:
                return get_json(base_url.rstrip("/") + path, timeout_s)
            except urllib.error.HTTPError as e:
                if e.code != 404:
                    return None
            except OSError:
                return None
        return None

    def torch_profiler_launch(self, install: EngineInstall, out_dir: str) -> tuple[list[str], dict[str, str]]:
        """Nothing to add at launch: /start_profile takes output_dir; the env var sets the fallback folder."""
        return [], {"SGLANG_TORCH_PROFILER_DIR": str(Path(out_dir).resolve())}

    def cuda_profiler_launch(self, install: EngineInstall) -> tuple[list[str], dict[str, str]] | None:
        """/start_profile with activities ['CUDA_PROFILER'] calls cudaProfilerStart in the first GPU's process."""
        return [], {}

    def start_profile(self, base_url: str, out_dir: str | None = None, timeout_s: float = 60.0,
                      activities: tuple[str, ...] | None = None) -> None:
        """POST /start_profile {output_dir, activities}; CUDA_PROFILER alone when no output folder is given
        (the nsys capture-range case), else the PyTorch profiler on CPU and GPU."""
        acts = list(activities or (("CPU", "GPU") if out_dir else ("CUDA_PROFILER",)))
        body: dict[str, Any] = {"activities": acts}
        if out_dir:
            body["output_dir"] = str(Path(out_dir).resolve())
        post(base_url.rstrip("/") + "/start_profile", body, timeout_s)

    def stop_profile(self, base_url: str, timeout_s: float = 600.0) -> None:
        """POST /stop_profile (SGLang writes the traces after answering, at times)."""
        post(base_url.rstrip("/") + "/stop_profile", None, timeout_s)

    def log_patterns(self) -> list[LogPattern]:
        """SGLang's graph, MoE, startup lines plus the common error lines."""
        return patterns_for("sglang")

    def metric_names(self) -> dict[str, str]:
        """SGLang Prometheus metrics (needs --enable-metrics, which plan() sets)."""
        return dict(METRICS)
