"""`transformers serve` adapter: a real OpenAI-compatible server from Hugging Face transformers (it runs on the H200
machine and on CPU), with continuous batching, torch.compile and CUDA graphs for continuous batching as its knobs.
The model is positional in 5.17-5.19 (`transformers serve MODEL`); releases that declare `--force-model` get that."""

from __future__ import annotations

import subprocess
from typing import Any

from typing_extensions import override

from ..errors import KnobError
from ..models import config_dtype, short_dtype
from ..server import ReadyCheck
from ..spec import Knobs
from ..state import FactRule, ResolvedState
from .base import EngineAdapter, EngineInstall, LaunchPlan, installed_version, interpreter_env
from .envs import EngineEnvSpec
from .logs import LogPattern, patterns_for


class TransformersAdapter(EngineAdapter):
    """`python -m transformers.cli.transformers serve`, always with continuous batching (the serving mode that
    batches concurrent requests)."""

    name = "transformers"
    help_command = ("-m", "transformers.cli.transformers", "serve", "--help")
    package = "transformers"
    accepts_ignore_eos = False  # its request validation answers 422 to fields it does not know
    distributions = ("transformers",)
    # --cb-max-memory-percent: the KV cache's share of the memory free once the weights are loaded
    # (generation/continuous_batching/cache.py get_available_memory), taken when its cache is made: replicas on one
    # GPU start together, and n shares of 0.8/n leave room for every replica's weights in any order
    mem_fraction_of = "cache"
    shared_starts_in_turn = False

    @override
    def grouped_moe_advice(self) -> str:
        """transformers chooses the experts implementation from the model's config, not from a serve flag."""
        return ('transformers takes the experts implementation from the model config: set "experts_implementation": '
                '"grouped_mm" in config.json (5.x; it falls back to the per-expert "eager" loop where '
                "torch._grouped_mm cannot run on the device and dtype).")

    @override
    def managed_env(self, version: str | None) -> EngineEnvSpec | None:
        """No environment of its own: point engine.python at one with transformers, torch, fastapi, uvicorn."""
        return None

    @override
    def probe(self, python: str, env: dict[str, str] | None = None) -> EngineInstall:
        """Version from package metadata; platform from whether torch sees a GPU (torch is imported, briefly)."""
        version, dist = installed_version(python, self.distributions, "transformers", "transformers", env)
        gpu = subprocess.run([python, "-c", "import torch; print(int(torch.cuda.is_available()))"],
                             capture_output=True, text=True, timeout=300, env=interpreter_env(env))
        platform = "cuda" if gpu.stdout.strip() == "1" else "cpu"
        return EngineInstall(python=python, version=version, distribution=dist, platform=platform, env=dict(env or {}))

    @override
    def graph_off_flags(self, command: list[str], install: EngineInstall) -> list[dict[str, str]]:
        """--no-cb-use-cuda-graph."""
        return [{"flag": a, "phases": "decode and prefill", "alias": ""} for a in command
                if a == "--no-cb-use-cuda-graph"]

    @override
    def served_name(self, model_path: str, requested: str) -> str:
        """transformers serve answers to the model id it was started with, nothing else."""
        return model_path

    @override
    def knob_flags(self, knobs: Knobs, install: EngineInstall) -> list[str]:
        """Translate intent; transformers has no parallelism, MoE-backend or scheduler knobs."""
        v = f"transformers {install.version}"
        if knobs.cuda_graph not in (None, "off", "full"):  # known before reading the source
            raise KnobError(f"{v} has one CUDA-graph switch for continuous batching (--cb-use-cuda-graph): "
                            f"cuda_graph can be 'off' or 'full', not {knobs.cuda_graph!r}")
        fs = self.flag_set(install)
        out: list[str] = []

        def add(flag: str, value: Any = None) -> None:
            if not fs.has(flag):
                raise KnobError(f"{v} does not define {flag}")
            out.extend([flag] if value is None else [flag, str(value)])

        if knobs.cuda_graph is not None:
            if knobs.cuda_graph == "off":
                add("--no-cb-use-cuda-graph")
            else:
                add("--cb-use-cuda-graph")
        if knobs.torch_compile:
            add("--compile")
        # compile off is its default (it compiles only with --compile), so compile off adds no flag: the command is
        # the same as leaving compile unset, and thread 02's graphs-off server is thread 05's eager one, measured once
        if knobs.chunked_prefill_size is not None:
            add("--cb-max-batch-tokens", knobs.chunked_prefill_size)
        if knobs.mem_fraction is not None:
            add("--cb-max-memory-percent", knobs.mem_fraction)
        unsupported = {"cuda_graph_max_bs": "capture sizes", "torch_compile_max_bs": "a compile batch-size cap",
                       "attn_dp": "DP attention", "ep": "expert parallelism", "moe_backend": "a MoE backend choice",
                       "max_running_requests": "a running-request cap (nearest: chunked_prefill_size = "
                                               "--cb-max-batch-tokens)",
                       "num_continuous_decode_steps": "continuous decode steps",
                       "two_batch_overlap": "two-batch overlap", "single_batch_overlap": "single-batch overlap"}
        for knob, what in unsupported.items():
            if getattr(knobs, knob) not in (None, False):
                raise KnobError(f"{v} serve has no knob for {what}")
        if knobs.tp > 1 or knobs.dp > 1 or knobs.pp > 1:
            raise KnobError(f"{v} serve runs one process on one device: no tp/pp/dp (run several servers for "
                            "replicas)")
        return out + list(knobs.extra_args)

    @override
    def plan(self, *, install: EngineInstall, model_path: str, served_name: str, host: str, port: int,
             knobs: Knobs, extra_env: dict[str, str]) -> LaunchPlan:
        """`transformers serve` with the model pinned (positional, or --force-model where declared)."""
        flags = self.knob_flags(knobs, install)
        fs = self.flag_set(install)
        model = ["--force-model", model_path] if fs.has("--force-model") else [model_path]
        cmd = [install.python, "-m", "transformers.cli.transformers", "serve", *model, "--host", host,
               "--port", str(port), "--continuous-batching"]
        if fs.has("--log-level"):  # its CUDA-graph decision is logged at INFO (thread 1 reads it)
            cmd += ["--log-level", "info"]
        if install.platform == "cuda":
            cmd += ["--device", "cuda", "--dtype", "bfloat16"]
        else:  # 'auto' places the model with a device map, which needs accelerate
            cmd += ["--device", "cpu"]
        env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"} if model_path.startswith("/") else {}
        # continuous batching logs its CUDA-graph decision at INFO on a logger of its own, which --log-level does not
        # reach: the engine site module (on every launched server's PYTHONPATH) raises it
        env["SERVESCOPE_LOGGER_LEVELS"] = "ContinuousBatchingLogger=INFO"
        env |= extra_env
        return LaunchPlan(command=cmd + flags, env=env,
                          ready=ReadyCheck(health_path="/health", models_path=None), flags=flags)

    @override
    def resolved_config(self, base_url: str, timeout_s: float = 10.0) -> dict[str, Any] | None:
        """transformers serve has no config endpoint: see resolved_from_command."""
        return None

    @override
    def resolved_from_command(self, command: list[str]) -> dict[str, Any] | None:
        """Its resolved settings are the arguments it was started with (booleans default off)."""
        args = command[command.index("serve") + 1:]
        out: dict[str, Any] = {"model": args[0] if args and not args[0].startswith("--") else None}
        i = 0
        while i < len(args):
            if args[i].startswith("--"):
                key = args[i][2:].replace("-", "_")
                if i + 1 < len(args) and not args[i + 1].startswith("--"):
                    out[key] = args[i + 1]
                    i += 2
                    continue
                out[key.removeprefix("no_")] = not key.startswith("no_")
            i += 1
        out.setdefault("compile", False)
        return {"transformers_serve_args": out}

    @override
    def resolved_state(self, resolved: dict[str, Any] | None, log_text: str = "") -> ResolvedState:
        """From the arguments it was started with (it has no config endpoint) and its log's CUDA-graph decision
        ('Using cuda graphs for (varlen, decode) paths: (True, False)'), which wins where it is logged."""
        from .logs import analyze_log

        args = (resolved or {}).get("transformers_serve_args")
        st = ResolvedState("transformers", source="command line" if isinstance(args, dict) else "")
        if isinstance(args, dict):
            st.compile = "on" if args.get("compile") else "off"  # --compile is off unless given
            st.compile_mode = "torch.compile" if args.get("compile") else None
            cg = args.get("cb_use_cuda_graph")
            if cg is not None:
                st.graph_decode = st.graph_prefill = "full" if cg else "off"
                st.graph_mode = f"--{'' if cg else 'no-'}cb-use-cuda-graph"
            st.tp = st.dp = 1  # one process on one device, by construction
            st.attention_backend = args.get("attn_implementation") or None
            st.device = args.get("device")
            model = args.get("force_model") or args.get("model")
            st.config_dtype = config_dtype(str(model or ""))
            given = args.get("dtype")
            # 'auto' (its default) loads the dtype the config declares
            st.dtype = short_dtype(given) if given and given != "auto" else st.config_dtype
            st.facts = {k: args.get(k) for k in ("continuous_batching", "device", "dtype", "attn_implementation")
                        if k in args}
        lines = analyze_log(log_text, self.log_patterns()) if log_text else None
        if lines is not None and len(lines):
            used = lines[lines["name"] == "cb_cuda_graphs_used"]
            if len(used) and "varlen" in used and used["varlen"].notna().any():
                varlen, decode = str(used["varlen"].iloc[-1]), str(used["decode"].iloc[-1])
                st.graph_prefill = "full" if varlen == "True" else "off"
                st.graph_decode = "full" if decode == "True" else "off"
                st.graph_mode = f"log: (varlen, decode) = ({varlen}, {decode})"
                st.source += " + log"
            inputs = lines[lines["name"] == "cb_graph_inputs"]
            if len(inputs) and "attn_mask_needed" in inputs:
                st.facts["is_attn_mask_needed"] = inputs["attn_mask_needed"].iloc[-1] == "True"
            if len(lines[lines["name"] == "cb_cuda_graph_off"]):
                st.graph_decode = st.graph_prefill = "off"
                st.graph_mode = "log: graphs asked for, turned off (no graph backend: no CUDA)"
        return st.complete_missing({
            "graph_decode": "cb_use_cuda_graph not given and the decision was not logged: transformers decides at "
                            "run time",
            "graph_prefill": "cb_use_cuda_graph not given and the decision was not logged: transformers decides at "
                             "run time",
            "eager": "transformers serve has no eager switch: compile and CUDA graphs are set apart",
            "ep": "transformers serve has no expert parallelism", "moe_backend": "transformers serve does not report "
            "its MoE implementation", "attention_backend": "--attn-implementation not given (the model's default)",
            "compile": "no command line recorded", "tp": "no command line recorded", "dp": "no command line recorded",
            "device": "--device not given",
            "dtype": "--dtype not given and the model's config is not readable here"})

    @override
    def fact_rules(self, state: ResolvedState) -> list[FactRule]:
        """No CUDA device: continuous batching turns its graphs off. On CUDA, with graphs neither asked for nor
        refused: its default chooses them per path, on iff the attention needs no mask, i.e. iff a flash attention
        was requested (`is_attn_mask_needed = not is_flash_attention_requested(config)`)."""
        f = state.facts
        if f.get("device") != "cuda":
            return [FactRule("no CUDA device", r"^not torch\.cuda\.is_available\(\)$|get_accelerator_graph_name\(\) is None")]
        if state.graph_mode and state.graph_mode.startswith("--"):  # --(no-)cb-use-cuda-graph: as given
            return []
        attn = f.get("attn_implementation")
        logged = f.get("is_attn_mask_needed")
        if logged is False or (logged is None and attn and "flash" in str(attn)):
            return []
        said = ("it logged is_attn_mask_needed = True" if logged else
                f"--attn-implementation {attn} is not a flash one" if attn else
                "--attn-implementation not given: the model's default, not a flash one")
        return [FactRule(f"the attention needs an attention mask ({said}), and neither --cb-use-cuda-graph nor "
                         "--no-cb-use-cuda-graph was given: continuous batching's default then chooses graphs off "
                         "for both paths", r"\bnot is_attn_mask_needed\b",
                         "or serve a flash attention implementation (`--attn-implementation flash_attention_2`, with "
                         "the flash-attn package installed), for which its default chooses graphs on")]

    @override
    def log_patterns(self) -> list[LogPattern]:
        """Uvicorn start, CUDA-graph lines, common errors."""
        return patterns_for("transformers")
