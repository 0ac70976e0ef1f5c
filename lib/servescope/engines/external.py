"""An already running OpenAI-compatible server: URL only, nothing is launched."""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from ..errors import SpecError
from ..spec import Knobs
from ..state import FIELDS, ResolvedState
from .base import EngineAdapter, EngineInstall, LaunchPlan
from .envs import EngineEnvSpec
from .http import get_json
from .sglang import SglangAdapter
from .vllm import VllmAdapter


class ExternalAdapter(EngineAdapter):
    """A server someone else runs; knobs cannot be changed from here."""

    name = "external"
    launches = False
    # whichever engine it is: the metrics of the engines whose format servescope reads
    metric_prefixes = (*VllmAdapter.metric_prefixes, *SglangAdapter.metric_prefixes)
    key_metrics = (*VllmAdapter.key_metrics, *SglangAdapter.key_metrics)

    @override
    def managed_env(self, version: str | None) -> EngineEnvSpec | None:
        """Nothing to install."""
        return None

    @override
    def probe(self, python: str, env: dict[str, str] | None = None) -> EngineInstall:
        """An external server is not installed here."""
        return EngineInstall(python="", version="unknown", distribution="external", platform="unknown")

    @override
    def knob_flags(self, knobs: Knobs, install: EngineInstall) -> list[str]:
        """Only engine defaults can be measured on a server we do not launch."""
        if knobs != Knobs():
            raise SpecError(f"an external server runs as it was started; knobs ({knobs.label()}) cannot be applied")
        return []

    @override
    def plan(self, **_: object) -> LaunchPlan:
        """Never called: external servers are not launched."""
        raise SpecError("an external server is not launched by servescope")

    @override
    def resolved_config(self, base_url: str, timeout_s: float = 10.0) -> dict[str, Any] | None:
        """What the server says about itself, where it says it: vLLM's `/server_info` (dev mode), SGLang's
        `/server_info` or `/get_server_info`."""
        for path in ("/server_info?config_format=json", "/get_server_info"):
            try:
                got = get_json(base_url.rstrip("/") + path, timeout_s)
            except (OSError, ValueError):
                continue
            if isinstance(got, dict):
                return got
        return None

    @override
    def resolved_state(self, resolved: dict[str, Any] | None, log_text: str = "") -> ResolvedState:
        """Read by the adapter whose format the server's answer has; else nothing is known."""
        if resolved and isinstance(resolved.get("vllm_config"), dict):
            st = VllmAdapter().resolved_state(resolved)
        elif resolved and ("tp_size" in resolved or "disable_cuda_graph" in resolved):
            st = SglangAdapter().resolved_state(resolved)
        else:
            why = "the external server answers no /server_info servescope can read (vLLM: VLLM_SERVER_DEV_MODE=1)"
            return ResolvedState("external", not_reported={f: why for f in (*FIELDS, "device")})
        st.engine = f"external ({st.engine})"
        return st
