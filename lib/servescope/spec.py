"""Validated specifications: what to launch (engine, model), how to configure it (knobs), how to load it."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import SpecError


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def digest(self) -> str:
        """Stable short hash of the content (the store's key material)."""
        return stable_hash(self.model_dump(mode="json"))


def stable_hash(obj: Any, n: int = 12) -> str:
    """sha256 of canonical JSON, shortened."""
    raw = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(raw).hexdigest()[:n]


class TinyModelSpec(_Spec):
    """A random-weight Qwen3-MoE generated locally; its size is a parameter."""

    architecture: Literal["qwen3_moe"] = "qwen3_moe"
    num_layers: int = Field(4, ge=1, le=64)
    hidden_size: int = Field(128, ge=32)
    num_attention_heads: int = Field(4, ge=1)
    num_key_value_heads: int = Field(2, ge=1)
    head_dim: int = Field(32, ge=8)
    intermediate_size: int = Field(256, ge=8)
    moe_intermediate_size: int = Field(64, ge=8)
    num_experts: int = Field(16, ge=2)
    top_k: int = Field(4, ge=1)
    vocab_size: int = Field(512, ge=300, description="BPE target size; the byte alphabet alone is 256")
    max_position_embeddings: int = Field(4096, ge=256)
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    seed: int = 0

    @model_validator(mode="after")
    def _check(self) -> TinyModelSpec:
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k ({self.top_k}) exceeds num_experts ({self.num_experts})")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        return self


class ModelSpec(_Spec):
    """Which model to serve: an existing folder or hub id, or a generated tiny model."""

    path: str | None = None
    tiny: TinyModelSpec | None = None
    served_name: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        if (self.path is None) == (self.tiny is None):
            raise ValueError("give exactly one of model.path or model.tiny")
        return self


CudaGraphMode = Literal["off", "decode_only", "full", "piecewise"]


class Knobs(_Spec):
    """Intent-level configuration; an engine adapter translates it into the installed version's flags.

    None means "leave the engine's default"."""

    cuda_graph: CudaGraphMode | None = None
    cuda_graph_max_bs: int | None = Field(None, ge=1)
    torch_compile: bool | None = None
    torch_compile_max_bs: int | None = Field(None, ge=1)
    tp: int = Field(1, ge=1)
    dp: int = Field(1, ge=1)
    attn_dp: int | None = Field(None, ge=1)
    ep: int | None = Field(None, ge=1)
    moe_backend: str | None = None
    max_running_requests: int | None = Field(None, ge=1)
    num_continuous_decode_steps: int | None = Field(None, ge=1)
    two_batch_overlap: bool | None = None
    single_batch_overlap: bool | None = None
    chunked_prefill_size: int | None = None
    mem_fraction: float | None = Field(None, gt=0, le=1)
    extra_args: tuple[str, ...] = ()

    def label(self) -> str:
        """Short human label listing only the knobs that are set."""
        parts = [f"{k}={v}" for k, v in self.model_dump(exclude_defaults=True).items() if k != "extra_args"]
        if self.extra_args:
            parts.append(" ".join(self.extra_args))
        return ", ".join(parts) or "engine defaults"


class EngineSpec(_Spec):
    """Which engine to run and where; `url` alone means an external server (nothing launched)."""

    name: str = "vllm"
    version: str | None = None
    python: str | None = Field(None, description="interpreter of an existing engine environment; default: the managed one")
    url: str | None = None
    host: str = "127.0.0.1"
    port: int | None = Field(None, ge=1, le=65535)
    startup_timeout_s: float = Field(900, gt=0)
    env: dict[str, str] = Field(default_factory=dict)
    api_key_env: str | None = Field(None, description="name of the environment variable holding the API key")

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        from .engines import engine_names

        if v not in engine_names():
            raise ValueError(f"no engine named {v!r}; known engines: {', '.join(engine_names())}")
        return v


class LoadSpec(_Spec):
    """A closed-loop load: a number of streamed requests at each concurrency level."""

    concurrency: tuple[int, ...] = (1, 4, 16)
    num_requests: int = Field(32, ge=1, description="measured requests per concurrency level")
    warmup_requests: int | None = Field(
        None, ge=0, description="unmeasured requests before each level; None = one per concurrent slot, so every "
        "batch size the level reaches is warmed (compiled engines build code per shape)")
    input_len: int = Field(64, ge=1)
    output_len: int = Field(64, ge=1)
    endpoint: Literal["completions", "chat"] = "completions"
    request_timeout_s: float = Field(300, gt=0)
    seed: int = 0

    @field_validator("concurrency")
    @classmethod
    def _positive(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if not v or any(c < 1 for c in v):
            raise ValueError("concurrency levels must be a non-empty list of positive integers")
        return v


def parse(model: type[_Spec], data: Any, where: str) -> Any:
    """Validate data into a spec, turning pydantic's error into a SpecError that says where."""
    if isinstance(data, model):
        return data
    try:
        return model.model_validate(data or {})
    except ValidationError as e:
        lines = [f"{'.'.join(str(p) for p in err['loc']) or where}: {err['msg']}" for err in e.errors()]
        raise SpecError(f"invalid {where}:\n  " + "\n  ".join(lines)) from None
