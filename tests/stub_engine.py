"""The 'stub' engine: an adapter that launches tests/stub_server.py (for tests, and for fixture notebooks that
papermill runs in a separate kernel, which import this module to register it)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from servescope.engines import register
from servescope.engines.base import EngineAdapter, EngineInstall, LaunchPlan, openai_check_parse, openai_check_request
from servescope.engines.http import get_json
from servescope.engines.sglang import SglangAdapter
from servescope.errors import KnobError
from servescope.server import ReadyCheck
from servescope.spec import Knobs
from servescope.state import GRAPH_PHASES, ResolvedState

STUB = Path(__file__).with_name("stub_server.py")
# the stub's inter-token gap factor per graph mode (a known answer for thread 2: piecewise is best); an unset mode
# (engine default) keeps the 1 ms gap, so thread 5's recommendation reads --itl-ms 1
GRAPH_SPEED = {"off": 16.0, "decode_only": 8.0, "full": 4.0, "piecewise": 2.0}


def stub_command(port: int, *args: str) -> list[str]:
    """Command line that runs the stub server on port."""
    return [sys.executable, str(STUB), "--port", str(port), *args]


@register
class StubAdapter(EngineAdapter):
    """Launches the stub server; torch_compile=False makes it slower per token, so A/B tests see an effect.
    engine.env STUB_DIES=eager makes every eager launch's worker child die from SIGILL at the first request (the
    shape of vLLM CPU's eager bf16 crash on AMX machines); STUB_DIES=all does it to every launch.

    It reports its 'resolved configuration' at /server_info: compile and graphs as asked, unless engine.env
    STUB_STATE says otherwise: 'silent' (no /server_info), 'compile_off' (compile resolves off whatever was asked),
    'graphs_full_when_compiled' (the compiled side also runs full graphs)."""

    name = "stub"
    # it exports SGLang-shaped metrics beside one of its own (which the scraper must leave out)
    metric_prefixes = SglangAdapter.metric_prefixes
    key_metrics = SglangAdapter.key_metrics

    def managed_env(self, version):
        return None

    def probe(self, python, env=None):
        return EngineInstall(python=python, version="0.0-stub", distribution="stub", platform="cpu", env=dict(env or {}))

    def knob_flags(self, knobs: Knobs, install):
        return self._flags(knobs, 1.0)

    def output_check_request(self, model, text, max_tokens):
        return openai_check_request(model, text, max_tokens)

    def kv_capacity_tokens(self, log_text):
        from servescope.engines.logs import kv_tokens_from_log

        return kv_tokens_from_log(log_text, "vllm")  # the stub says it in vLLM's words (--kv-tokens)

    def output_check_parse(self, obj):
        return openai_check_parse(obj)

    @staticmethod
    def _flags(knobs: Knobs, itl_ms: float) -> list[str]:
        if knobs.cuda_graph == "compiled_piecewise":
            raise KnobError("the stub has one piecewise form: ask for cuda_graph 'piecewise'")
        itl = itl_ms * (4.0 if knobs.torch_compile is False else 1.0)
        itl *= GRAPH_SPEED.get(knobs.cuda_graph, 1.0) if knobs.cuda_graph else 1.0
        flags = ["--itl-ms", f"{itl:g}"]
        if knobs.max_running_requests is not None:  # the stub's scheduler cap (default: none, or STUB_MAX_RUNNING)
            flags += ["--max-running", str(knobs.max_running_requests)]
        return flags + list(knobs.extra_args)

    def plan(self, *, install, model_path, served_name, host, port, knobs, extra_env):
        # STUB_ITL_MS: the base gap between tokens (1 ms); a timing test whose effect must outweigh a 2-core host's
        # hiccups (a few hundred ms under the full suite) sets it longer
        # STUB_AS_OFF: this graph mode serves as fast as graphs off
        paced = knobs.model_copy(update={"cuda_graph": "off"}) \
            if knobs.cuda_graph and extra_env.get("STUB_AS_OFF") == knobs.cuda_graph else knobs
        flags = self._flags(paced, float(extra_env.get("STUB_ITL_MS", 1.0)))
        once = extra_env.get("STUB_FAST_ONCE", "")  # the first server asking for batch tokens is 4x faster, once
        if once and knobs.chunked_prefill_size is not None:
            flags += ["--fast-once", once]
        dies = extra_env.get("STUB_DIES", "")
        if dies == "all" or dies == "eager" and knobs.torch_compile is False:
            flags += ["--child-sigill-at", "1"]
        if extra_env.get("STUB_DIE_AFTER"):  # "N:FILE": kill -9 itself after N requests while FILE exists
            n, _, path = extra_env["STUB_DIE_AFTER"].partition(":")
            flags += ["--die-after", n, "--die-if-file", path]
        if extra_env.get("STUB_STOP_AFTER"):  # SIGSTOP itself after N requests
            flags += ["--stop-after", extra_env["STUB_STOP_AFTER"]]
        if extra_env.get("STUB_STALL"):  # "N:FILE": answers nothing after N requests while FILE exists
            n, _, path = extra_env["STUB_STALL"].partition(":")
            flags += ["--stall-after", n, "--stall-if-file", path]
        if extra_env.get("STUB_SLOW_CORE"):  # a replica pinned to this core serves 4x slower
            flags += ["--slow-on-core", extra_env["STUB_SLOW_CORE"]]
        if extra_env.get("STUB_MAX_RUNNING") and knobs.max_running_requests is None:  # a default cap to tune away
            flags += ["--max-running", extra_env["STUB_MAX_RUNNING"]]
        if extra_env.get("STUB_READY_AFTER"):  # seconds before it answers /health: a launch of known length
            flags += ["--ready-after", extra_env["STUB_READY_AFTER"]]
        if extra_env.get("STUB_NEVER_READY") == "compiled" and knobs.torch_compile:  # its compiled launches hang
            flags += ["--ready-after", "3600"]
        if extra_env.get("STUB_PERTURB") and knobs.cuda_graph == extra_env["STUB_PERTURB"]:  # answers wrongly
            flags += ["--perturb-outputs", "0.5"]
        if extra_env.get("STUB_FAIL_EVERY"):
            flags += ["--fail-every", extra_env["STUB_FAIL_EVERY"]]
        mode = extra_env.get("STUB_STATE", "")
        compiled = knobs.torch_compile is not False and mode != "compile_off"
        graphs = "full" if mode == "graphs_full_when_compiled" and compiled else knobs.cuda_graph or "off"
        state = [] if mode == "silent" else ["--state", json.dumps({"compile": compiled, "graphs": graphs})]
        cmd = stub_command(port, "--model", served_name, "--host", host, *flags, *state)
        return LaunchPlan(command=cmd, env=dict(extra_env), ready=ReadyCheck(poll_interval_s=0.1), flags=flags)

    def resolved_config(self, base_url, timeout_s=10.0):
        try:
            return get_json(f"{base_url}/server_info", timeout_s)
        except OSError:
            return None

    def resolved_state(self, resolved, log_text=""):
        if not resolved:
            return ResolvedState("stub", not_reported={f: "the stub was told to report nothing" for f in
                                                       ("compile", "graph_decode", "graph_prefill", "tp", "dp")})
        dec, pre = GRAPH_PHASES[resolved["graphs"]]
        return ResolvedState("stub", source="/server_info", compile="on" if resolved["compile"] else "off",
                             graph_decode=dec, graph_prefill=pre, graph_mode=resolved["graphs"], tp=1, dp=1)


@register
class StubGpuAdapter(StubAdapter):
    """The stub as if it served on a GPU, for tests of replicas sharing one GPU under a fake NVML: its memory knob
    (--mem-fraction, accepted and ignored) counts on the GPU's total like vLLM's, and replicas sharing a GPU start one
    after another. Each server becomes a client of a stub MPS daemon listening in its CUDA_MPS_PIPE_DIRECTORY."""

    name = "stub-gpu"
    mem_fraction_of = "total"

    def probe(self, python, env=None):
        return EngineInstall(python=python, version="0.0-stub", distribution="stub", platform="cuda", env=dict(env or {}))

    def knob_flags(self, knobs: Knobs, install):
        flags = super().knob_flags(knobs, install)
        return flags + (["--mem-fraction", str(knobs.mem_fraction)] if knobs.mem_fraction is not None else [])
