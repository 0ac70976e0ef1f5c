"""Validated specifications: what to launch (engine, model), how to configure it (knobs), how to load it."""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import SpecError


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="strings")

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
    # bfloat16, what LLM servers run; vLLM CPU serves float32 configs in bfloat16 anyway ("Attempted to load weight
    # ... float32 into parameter with dtype torch.bfloat16"), and its bfloat16 kernels take AMX paths on CPUs that
    # report AMX: servescope's engine_site asks Linux for the tile permission in every engine process
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    # False: the model and generation configs carry no end-of-sequence token (the tokenizer keeps its own), so an
    # engine that cannot be told ignore_eos (transformers serve) still answers with the requested length
    stops_at_eos: bool = False
    seed: int = 0

    @model_validator(mode="after")
    def _check(self) -> TinyModelSpec:
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k ({self.top_k}) exceeds num_experts ({self.num_experts})")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        return self


class ModelSpec(_Spec):
    """Which model to serve: an existing folder or hub id, a generated tiny model, or a real architecture without its
    weights (a shipped name such as qwen3-30b-a3b, or a folder holding a config.json), served with the engine's own
    seeded random weights."""

    path: str | None = None
    tiny: TinyModelSpec | None = None
    architecture: str | None = None
    served_name: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        if sum(x is not None for x in (self.path, self.tiny, self.architecture)) != 1:
            raise ValueError("give exactly one of model.path, model.tiny or model.architecture")
        return self

    @property
    def random_weights(self) -> bool:
        """Served with the engine's own random weights (an architecture alone): speed is real, outputs are not."""
        return self.architecture is not None


# off: no graphs; decode_only: decode batches as full graphs, prefill eager; full: decode and prefill as full graphs;
# piecewise: decode full, prefill/mixed batches as piecewise graphs with the unsafe parts (attention, MoE) eager, by the
# engine's default mechanism (SGLang's breakable capture); compiled_piecewise: the same split made by torch.compile
# (SGLang's tc_piecewise), where an engine offers both
CudaGraphMode = Literal["off", "decode_only", "full", "piecewise", "compiled_piecewise"]
# how the client spreads requests over replicas: in turn, or to the one with the fewest requests in flight
Route = Literal["round_robin", "least_outstanding"]
# replicas on the same GPU(s): the driver's time-slicing between their contexts, or one MPS server running their
# kernels side by side
GpuShare = Literal["time_slicing", "mps"]


class Knobs(_Spec):
    """Intent-level configuration; an engine adapter translates it into the installed version's flags.

    None means "leave the engine's default"."""

    cuda_graph: CudaGraphMode | None = None
    cuda_graph_max_bs: int | None = Field(None, ge=1)
    torch_compile: bool | None = None
    torch_compile_max_bs: int | None = Field(None, ge=1)
    tp: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)
    dp: int = Field(1, ge=1)
    # one server over this many nodes, its tp x pp x dp ranks split evenly, launched with the engine's own multi-node
    # flags, a process per node (needs runner kind ray: the nodes are the cluster's)
    nodes: int = Field(1, ge=1)
    attn_dp: int | None = Field(None, ge=1)
    ep: int | None = Field(None, ge=1)
    moe_backend: str | None = None
    max_running_requests: int | None = Field(None, ge=1)
    num_continuous_decode_steps: int | None = Field(None, ge=1)
    two_batch_overlap: bool | None = None
    single_batch_overlap: bool | None = None
    chunked_prefill_size: int | None = None
    mem_fraction: float | None = Field(None, gt=0, le=1)
    # independent servers of this configuration, each on its own share of the devices (GPUs, or cores on a CPU
    # build), with the client spreading requests over their endpoints by route (default round_robin)
    replicas: int = Field(1, ge=1)
    route: Route | None = None
    # the replicas share the same GPU(s) instead of one share each (each then needs its memory share: mem_fraction)
    gpu_share: GpuShare | None = None
    # MPS only: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE of each replica (the share of the SMs its kernels may occupy)
    mps_active_thread_pct: int | None = Field(None, ge=1, le=100)
    extra_args: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _routed(self) -> Knobs:
        if self.route is not None and self.replicas == 1:
            raise ValueError("route spreads requests over replicas: it needs replicas > 1")
        if self.gpu_share is not None and self.replicas == 1:
            raise ValueError("gpu_share puts replicas on the same GPU: it needs replicas > 1")
        if self.mps_active_thread_pct is not None and self.gpu_share != "mps":
            raise ValueError("mps_active_thread_pct is a share of MPS: it needs gpu_share='mps'")
        if self.nodes > 1:
            ranks = self.tp * self.pp * self.dp
            if ranks % self.nodes:
                raise ValueError(f"nodes={self.nodes} must divide the server's tp x pp x dp = {ranks} ranks evenly")
            if self.replicas > 1 or self.gpu_share is not None:
                raise ValueError("nodes spreads one server over nodes: it takes no replicas and no gpu_share")
        return self

    @property
    def ranks_per_node(self) -> int:
        """Devices one node of the server holds: its tp x pp x dp ranks over its nodes."""
        return self.tp * self.pp * self.dp // self.nodes

    @property
    def devices(self) -> int:
        """Devices (GPUs, or cores on a CPU build) the configuration asks for at least: TP x PP x DP ranks per replica
        (over all its nodes), times the replicas unless they share the same devices."""
        return self.tp * self.pp * self.dp * (1 if self.gpu_share else self.replicas)

    def label(self) -> str:
        """Short human label listing only the knobs that are set."""
        parts = [f"{k}={v}" for k, v in self.model_dump(exclude_defaults=True).items() if k != "extra_args"]
        if self.extra_args:
            parts.append(" ".join(self.extra_args))
        return ", ".join(parts) or "engine defaults"


_UNSET = object()


def flags_first(args: tuple[str, ...], where: str) -> tuple[str, ...]:
    """Extra arguments as given, once they start with a flag (a value first is a misplaced line)."""
    if args and not args[0].startswith("-"):
        raise ValueError(f"{where} must start with a flag (--name), not {args[0]!r}")
    return args


class DeploymentSpec(_Spec):
    """The user's deployment as it runs today: every arm of every thread launches it, with only the thread's own knobs
    changed (a thread's knob replaces the deployment's value of the same setting). knobs: its settings in intent
    (parallelism, memory share, graph mode); args: any other flags, in the engine's own spelling."""

    knobs: Knobs = Field(default_factory=Knobs)
    args: tuple[str, ...] = ()

    @field_validator("args")
    @classmethod
    def _args(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return flags_first(v, "deployment.args")

    @property
    def empty(self) -> bool:
        """No deployment named: the engine's defaults."""
        return not self.args and not self.knobs.model_dump(exclude_defaults=True)

    def apply(self, knobs: Knobs) -> Knobs:
        """The deployment with a thread's knobs over it: each knob the thread set (explicitly, defaults included)
        replaces the deployment's; the deployment's flags come first among the extra arguments."""
        own = knobs.model_dump(include=knobs.model_fields_set - {"extra_args"})
        merged = {**self.knobs.model_dump(exclude_defaults=True, exclude={"extra_args"}), **own}
        merged["extra_args"] = (*self.knobs.extra_args, *self.args, *knobs.extra_args)
        return Knobs(**merged)

    def changed(self, knobs: Knobs) -> list[str]:
        """The settings a thread's knobs change from the deployment (names)."""
        base = self.knobs.model_dump()
        return sorted(k for k in knobs.model_fields_set - {"extra_args"} if getattr(knobs, k) != base.get(k))

    def relative(self, knobs: dict[str, Any]) -> dict[str, Any]:
        """A stored point's knobs (the deployment's with a thread's over them) as the thread asked for them: the
        settings equal to the deployment's and the deployment's flags left out."""
        if self.empty:
            return dict(knobs)
        base = self.knobs.model_dump(mode="json", exclude_defaults=True)
        out = {k: v for k, v in knobs.items() if k != "extra_args" and base.get(k, _UNSET) != v}
        ours = [*self.knobs.extra_args, *self.args]
        extra = list(knobs.get("extra_args") or [])
        if ours and extra[:len(ours)] == ours:
            extra = extra[len(ours):]
        if extra:
            out["extra_args"] = extra
        return out

    def words(self) -> str:
        """'cuda_graph=off, mem_fraction=0.88; flags --foo 1' or 'the engine's defaults'."""
        parts = [self.knobs.label()] if self.knobs.model_dump(exclude_defaults=True) else []
        if self.args:
            parts.append("flags " + " ".join(self.args))
        return "; ".join(parts) or "the engine's defaults"


class EngineSpec(_Spec):
    """Which engine to run and where; `url` alone means an external server (nothing launched)."""

    name: str = "vllm"
    version: str | None = None
    python: str | None = Field(None, description="interpreter of an existing engine environment; default: the managed one")
    url: str | None = None
    host: str = "127.0.0.1"
    port: int | None = Field(None, ge=1, le=65535)
    startup_timeout_s: float | None = Field(
        None, gt=0, description="seconds a launch may take to serve its first token; default: the first launch of "
        "this engine and model gets FIRST_STARTUP_S, every later one a multiple of the slowest ready time the store "
        "holds for them (a launch of minutes is normal at real size; a hung one is caught in that time)")
    env: dict[str, str] = Field(default_factory=dict, description="the engine's own environment: every process run "
                                "under engine.python (the server, its --help, the probes) gets it, e.g. PYTHONPATH of "
                                "a site folder the engine is installed in")
    args: tuple[str, ...] = Field((), description="base arguments every launch of this suite carries (checked "
                                  "against the version's flags before launch), e.g. --attention-backend triton")
    api_key_env: str | None = Field(None, description="name of the environment variable holding the API key")

    @field_validator("args")
    @classmethod
    def _args(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return flags_first(v, "engine.args")


class TelemetrySpec(_Spec):
    """What to sample while load runs (not part of a point's identity: it observes, it does not change it)."""

    enabled: bool = True
    gpu: bool = True
    gpu_indices: tuple[int, ...] | None = Field(None, description="NVML indices; default: CUDA_VISIBLE_DEVICES, else all")
    gpu_hz: float = Field(10.0, gt=0, le=100)
    host_hz: float = Field(2.0, gt=0, le=50)
    metrics_hz: float = Field(1.0, gt=0, le=20)
    server_metrics: bool = Field(True, description="scrape the engine's Prometheus /metrics")
    dcgm_url: str | None = Field(None, description="a DCGM exporter's /metrics, for GPUs on another machine")


class ProfileSpec(_Spec):
    """A kernel profile taken with each measured point: after the point's load, on the same server, one more short
    closed-loop window is profiled and its kernel table stored with the point. Part of a point's identity when on
    (a server launched with its profiler armed is not the same launch)."""

    kind: Literal["none", "torch", "nsys"] = Field(
        "none", description="torch: the engine's PyTorch profiler over HTTP; nsys: the server under Nsight Systems")
    concurrency: int | None = Field(None, ge=1, description="level of the profiled window; default: the load's highest")
    num_requests: int | None = Field(None, ge=1, description="requests in the window; default: two per slot")


class RunnerSpec(_Spec):
    """Where the points run (not part of a point's identity: the same launch on another node is the same point).
    local: as children of the notebook's kernel, one after another. ray: each point (launch, load, telemetry, output
    check, profile, teardown) as a Ray task on a node of the cluster at address with the GPUs its configuration needs
    (a CPU build's point takes cpus_per_point), its folder brought back into the driver's store; with parallel, the
    configurations of one repetition run at once where the cluster has room."""

    kind: Literal["local", "ray"] = "local"
    address: str = Field("", description="ray: the cluster's address (host:port of its head, ray://host:10001 "
                         "through Ray's client, or 'auto': the cluster started on this machine by `ray start`)")
    parallel: bool = Field(True, description="ray: a repetition's configurations at once where the cluster has room")
    cpus_per_point: float = Field(1.0, gt=0, description="ray: the Ray CPUs a point reserves on its node")

    @model_validator(mode="after")
    def _address(self) -> RunnerSpec:
        if self.kind == "ray" and not self.address:
            raise ValueError("runner kind 'ray' needs an address (host:port, ray://host:10001 or auto)")
        if self.kind == "local" and self.address:
            raise ValueError("runner kind 'local' takes no address (kind: ray reaches a cluster)")
        return self


SLO_METRICS = ("ttft_ms", "tpot_ms", "e2e_ms")
# LoadSpec fields added after stores and notes were recorded (LoadSpec.full_dump)
KV_LEVEL = "kv"  # a load's top level read from the engine: the concurrency its KV cache holds
# how the measurement is read, not what was measured: out of every point's and note's key, so a new target or SLO
# reads the same store (goodput is judged again from each point's stored requests)
READER_FIELDS = {"target", "slo_ms"}
ADDED_LATER = ("requests_per_slot", "lengths", "length_sigma", "steady_state", "client_processes")


@dataclass(frozen=True)
class LoadPoint:
    """One point of a load sweep: a closed-loop concurrency level or an open-loop arrival rate."""

    index: int
    label: str
    mode: str
    concurrency: int | None  # closed loop: the level; open loop: the in-flight cap, if any
    request_rate: float | None  # open loop: requests per second (inf = all at once)


class LoadSpec(_Spec):
    """How to load a server: closed-loop concurrency levels or open-loop arrival rates, and what to send."""

    mode: Literal["closed", "open"] = "closed"
    concurrency: tuple[int | Literal["kv"], ...] = Field(
        (1, 4, 16), description="closed loop: one point per level; 'kv' (last): the level whose requests, at the "
        "load's mean lengths, fill the deployment's KV cache, read from the engine before the first point")
    request_rate: tuple[float, ...] = Field((), description="open loop: one point per rate, requests/s (inf allowed)")
    burstiness: float = Field(1.0, gt=0, description="gamma shape of inter-arrival times: 1 = Poisson, <1 burstier")
    max_concurrency: int | None = Field(None, ge=1, description="open loop: cap on requests in flight")
    num_requests: int = Field(32, ge=1, description="measured requests per point (the prompt pool, with duration_s)")
    requests_per_slot: float | None = Field(
        None, gt=0, description="requests per concurrent slot: a level of concurrency c sends at least "
        "requests_per_slot x c (so every level fills and runs past its ramp; num_requests is the floor)")
    duration_s: float | None = Field(None, gt=0, description="if set, each point runs this long instead of a count "
                                     "(or until its prompt pool is used up: prompts never repeat)")
    warmup_requests: int | None = Field(
        None, ge=0, description="unmeasured requests before each point; None = one per concurrent slot, so every "
        "batch size the point reaches is warmed (compiled engines build code per shape)")
    dataset: Literal["random", "sharegpt", "jsonl"] = "random"
    dataset_path: str | None = Field(None, description="ShareGPT JSON or JSONL prompts file")
    input_len: int = Field(64, ge=1, description="random dataset: prompt tokens (the mean, with a distribution)")
    output_len: int = Field(64, ge=1, description="output tokens asked for (the mean, with a distribution; files may "
                            "give their own per prompt)")
    lengths: Literal["fixed", "lognormal"] = Field(
        "fixed", description="random dataset: every request input_len/output_len, or lengths drawn per request from "
        "a seeded lognormal of those means (so prefill and decode mix instead of marching in waves)")
    length_sigma: float = Field(0.6, gt=0, le=2, description="lognormal: sigma of log length")
    client_processes: int = Field(
        1, ge=1, le=64, description="load-client processes sharing each level's slots and prompts (one asyncio "
        "process parses every token: past some tens of thousands of tokens/s it limits the measurement)")
    steady_state: bool = Field(
        False, description="figures of each closed-loop level over its steady window only: from the first request "
        "that completed (the end of the ramp, when every slot had started) to the last request sent (the start of the "
        "drain); a level with no such window is said")
    ignore_eos: bool = Field(True, description="ask for exact output lengths (ignore_eos and min_tokens)")
    endpoint: Literal["completions", "chat", "generate"] = "completions"
    slo_ms: dict[str, float] = Field(default_factory=dict, description="goodput SLOs, e.g. {ttft_ms: 500, tpot_ms: 50}")
    target: int | Literal["kv"] | None = Field(
        None, description="the level the deployment serves at (one of concurrency, or 'kv'): every headline and "
        "verdict is judged there; None: over the levels that agree. Not part of a point's identity: changing it "
        "re-reads the same points")
    request_timeout_s: float = Field(
        300, gt=0, description="a request fails this long after its first token; before it (queueing in a full "
        "server) it waits while the server sends tokens to anyone (hang_s bounds a server that sends nothing)")
    hang_s: float | None = Field(None, gt=0, description="no token for this long with requests in flight: the server "
                                 "is hung (default: 30 s or 50 warm-up steps, whichever is longer; 120 s in warm-up)")
    seed: int = 0

    @field_validator("concurrency")
    @classmethod
    def _positive(cls, v: tuple[int | str, ...]) -> tuple[int | str, ...]:
        if any(c != KV_LEVEL and c < 1 for c in v):
            raise ValueError("concurrency levels must be positive integers")
        if KV_LEVEL in v[:-1]:
            raise ValueError(f"{KV_LEVEL!r} is the highest level: put it last, once")
        return v

    @field_validator("request_rate")
    @classmethod
    def _rates(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        if any(not r > 0 for r in v):
            raise ValueError("request rates must be positive (inf allowed)")
        return v

    @field_validator("slo_ms")
    @classmethod
    def _slos(cls, v: dict[str, float]) -> dict[str, float]:
        bad = [k for k in v if k not in SLO_METRICS]
        if bad:
            raise ValueError(f"unknown SLO metric(s) {bad}; use {list(SLO_METRICS)}")
        return v

    def full_dump(self) -> dict[str, Any]:
        """Every field, as notes kept before the steady-load fields existed name the load: those fields are left out
        while at their defaults, so those notes keep their keys (the target never: it names no launch)."""
        later = {f for f in ADDED_LATER if getattr(self, f) == type(self).model_fields[f].default}
        # notes written before the SLO was a reader's field hold it at its default ({}): it stays there, whatever is set
        return self.model_dump(mode="json", exclude=later | READER_FIELDS) | {"slo_ms": {}}

    def key_dump(self) -> dict[str, Any]:
        """The load as a point's key names it: the fields set away from their defaults, the target left out (where
        the headline is judged does not change what was measured)."""
        return self.model_dump(mode="json", exclude_defaults=True, exclude=READER_FIELDS)

    @property
    def target_level(self) -> int | None:
        """The target as a number (None while it is the unresolved 'kv' level, or not set)."""
        return self.target if isinstance(self.target, int) else None

    @property
    def kv_level(self) -> bool:
        """Whether the top level is 'kv', still to be read from the engine (KvLevel.resolve)."""
        return self.mode == "closed" and KV_LEVEL in self.concurrency

    @property
    def levels(self) -> tuple[int, ...]:
        """The closed-loop levels, as numbers (raises while the 'kv' level is not resolved)."""
        if self.kv_level:
            raise SpecError("the load's 'kv' level is not resolved yet: it is read from the engine when the run's "
                            "context is made (servescope.context)")
        return tuple(int(c) for c in self.concurrency)

    def with_kv(self, level: int) -> LoadSpec:
        """The load with its 'kv' level replaced by a number: the levels in order, each once."""
        numbers = {int(c) for c in self.concurrency if c != KV_LEVEL} | {max(1, int(level))}
        target = max(1, int(level)) if self.target == KV_LEVEL else self.target
        return self.model_copy(update={"concurrency": tuple(sorted(numbers)), "target": target})

    def level_requests(self, concurrency: int | None) -> int:
        """Requests one level sends (a count), or its prompt pool (with duration_s)."""
        n = self.num_requests
        if self.requests_per_slot is not None and concurrency:
            n = max(n, math.ceil(self.requests_per_slot * concurrency))
        return n

    def lengths_for(self, n: int, seed: int) -> list[tuple[int, int]]:
        """(input, output) tokens of n requests: the configured lengths, or seeded lognormal draws of those means
        (capped at 4x the mean, at least 1)."""
        if self.lengths == "fixed":
            return [(self.input_len, self.output_len)] * n
        rng = random.Random(seed)
        s = self.length_sigma

        def draw(mean: int) -> int:
            return max(1, min(4 * mean, round(mean * math.exp(rng.gauss(-s * s / 2, s)))))
        return [(draw(self.input_len), draw(self.output_len)) for _ in range(n)]

    @model_validator(mode="after")
    def _consistent(self) -> LoadSpec:
        if self.mode == "closed" and not self.concurrency:
            raise ValueError("closed-loop load needs at least one concurrency level")
        if self.target is not None and (self.mode != "closed" or self.target not in self.concurrency):
            raise ValueError(f"target {self.target!r} must be one of the closed-loop levels "
                             f"{list(self.concurrency)} (the headline is judged at a level that is measured)")
        if self.mode == "open" and not self.request_rate:
            raise ValueError("open-loop load needs at least one request_rate")
        if self.kv_level and self.requests_per_slot is None:
            raise ValueError(f"a {KV_LEVEL!r} level is known only once the engine says how many tokens its KV cache "
                             "holds: give requests_per_slot (e.g. 3), so that every level sends enough to fill it")
        if self.kv_level and self.dataset != "random":
            raise ValueError(f"a {KV_LEVEL!r} level is sized from the random dataset's mean lengths (input_len + "
                             "output_len): with a prompts file, give the level as a number")
        top = max((c for c in self.concurrency if c != KV_LEVEL), default=0) if self.mode == "closed" else 0
        if top and self.level_requests(top) < top:
            raise ValueError(f"{self.level_requests(top)} requests cannot fill the level c={top}: every slot needs one "
                             f"at least (set requests_per_slot, e.g. 4, or num_requests >= {top})")
        if self.mode == "open" and self.duration_s and any(r == float("inf") for r in self.request_rate):
            raise ValueError("an infinite request_rate sends everything at once: give num_requests, not duration_s")
        if self.dataset != "random":
            if not self.dataset_path:
                raise ValueError(f"dataset {self.dataset!r} needs dataset_path")
            if not Path(self.dataset_path).expanduser().is_file():
                raise ValueError(f"dataset_path {self.dataset_path!r} does not exist")
        return self

    def points(self) -> list[LoadPoint]:
        """The sweep's points in order."""
        if self.mode == "closed":
            return [LoadPoint(i, f"c={c}", "closed", c, None) for i, c in enumerate(self.levels)]
        cap = f", cap={self.max_concurrency}" if self.max_concurrency else ""
        return [LoadPoint(i, f"rate={r:g}{cap}", "open", self.max_concurrency, r)
                for i, r in enumerate(self.request_rate)]


def parse(model: type[_Spec], data: Any, where: str) -> Any:
    """Validate data into a spec, turning pydantic's error into a SpecError that says where."""
    if isinstance(data, model):
        return data
    try:
        return model.model_validate(data or {})
    except ValidationError as e:
        lines = [f"{'.'.join(str(p) for p in err['loc']) or where}: {err['msg']}" for err in e.errors()]
        raise SpecError(f"invalid {where}:\n  " + "\n  ".join(lines)) from None
