"""The engine adapter interface: intent-level knobs in, this engine version's command out."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pandas as pd

from .. import mps
from ..errors import KnobError, ProfilingUnavailable, ServescopeError, SpecError
from ..install import EngineInstall, interpreter_env
from ..models import weights_bytes
from ..server import ReadyCheck
from ..spec import Knobs
from ..state import FIELDS, FactRule, ResolvedState, expected_state
from .devices import core_blocks, core_words, device_ids, gpu_facts, visible_devices
from .envs import EngineEnvSpec
from .flagscan import FlagSet
from .helpcheck import _help_cached, _scan_cached, known_release, reconcile_flags
from .logs import LogPattern
from .source import SourceTree


@dataclass(frozen=True)
class LaunchPlan:
    """Everything needed to start one server: the command, its environment, and what 'ready' means."""

    command: list[str]
    env: dict[str, str]
    ready: ReadyCheck
    flags: list[str] = field(default_factory=list)  # the knob-derived part of the command, for reports


@dataclass(frozen=True)
class Placement:
    """Where one replica runs: its devices (GPU ids or cores), a command prefix and the environment that pin it."""

    replica: int
    devices: tuple[int, ...]
    kind: str  # 'GPUs' | 'cores'
    prefix: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    host_cores: tuple[int, ...] = ()  # a GPU replica's host threads, pinned to these cores
    shared: bool = False  # its GPUs are every replica's

    def words(self) -> str:
        """'replica 1: cores 1', 'replica 1: GPUs 0 (shared), cores 7-13'."""
        return (f"replica {self.replica}: {self.kind} {','.join(map(str, self.devices))}"
                + (" (shared)" if self.shared else "") + (f", cores {core_words(self.host_cores)}"
                                                          if self.host_cores else ""))


def mps_recipe(active_thread_pct: int | None) -> str:
    """The MPS part of a replica recipe: the control daemon started before the servers and stopped after them."""
    pct = (f", each server with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={active_thread_pct}" if active_thread_pct else "")
    return ("; start an MPS control daemon for that GPU before the servers (`nvidia-cuda-mps-control -d`, with "
            "CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY set for it and for the servers"
            f"{pct}) and stop it after them (`echo quit | nvidia-cuda-mps-control`)")


# what a replica holds on its GPU beyond its weights, at least: the CUDA context, activations, a minimal cache
REPLICA_OVERHEAD_MIB = 1024.0


def shared_fit(basis: str, n: int, share: float, weights_mib: float, gpu: mps.GpuFacts) -> str:
    """Why n replicas, each given `share` through a memory knob counted on `basis`, do not fit on this GPU ('' where
    they do, or where NVML did not say its memory). basis: 'total' (a share of the GPU's memory, weights included),
    'free' (a share of what is free when the replica starts, weights included; the last to start finds least),
    'cache' (a share of what is free once its weights are loaded, for the KV cache alone)."""
    total, free = gpu.mem_total_mib, gpu.mem_free_mib
    if total is None or free is None:
        return ""
    need = weights_mib + REPLICA_OVERHEAD_MIB
    gib = lambda mib: f"{mib / 1024:.1f} GiB"  # noqa: E731
    head = f"{n} replicas of a {gib(weights_mib)} model do not fit on GPU {gpu.index} ({gib(free)} free of {gib(total)})"
    if basis == "total":
        if share * total < need:
            return f"{head}: each one's share ({share:g} of the GPU) is below its weights and context ({gib(need)})"
        if n * share * total > free:
            return f"{head}: {n} shares of {share:g} of the GPU need {gib(n * share * total)}"
    elif basis == "free":
        last = share * free * (1 - share) ** (n - 1)
        if last < need:
            return f"{head}: the last to start gets {share:g} of what is left, {gib(last)}, below its weights and " \
                   f"context ({gib(need)})"
    elif n * need > free * (1 - min(1.0, n * share)):
        return f"{head}: their weights and contexts ({n} x {gib(need)}) do not fit beside caches of {n} x {share:g} " \
               "of the free memory"
    return ""


class EngineAdapter(ABC):
    """One engine (family); subclasses translate Knobs for the version they find installed."""

    name: ClassVar[str]
    launches: ClassVar[bool] = True
    package: ClassVar[str] = ""  # the Python package whose source declares the flags ('' = no static scan)
    # whether its OpenAI routes take ignore_eos/min_tokens (exact output lengths); transformers serve rejects them
    accepts_ignore_eos: ClassVar[bool] = True
    distributions: ClassVar[tuple[str, ...]] = ()
    # the CUDA-graph mode both sides of a compile-vs-eager comparison pin, so that only compile differs
    compile_study_graphs: ClassVar[str] = "off"
    # disk its managed environment takes when created (GiB; 0: it has none)
    env_size_gib: ClassVar[float] = 0.0
    # its CPU build's eager workers use AMX tiles in bfloat16 attention (they need the tile permission)
    uses_amx_tiles: ClassVar[bool] = False
    # Prometheus name prefixes of its own metrics (what the scraper keeps; (): every metric the server exports)
    metric_prefixes: ClassVar[tuple[str, ...]] = ()
    # the metrics notebooks show per point (gauges' medians, counters' rates)
    key_metrics: ClassVar[tuple[str, ...]] = ()
    # its own counters under engine-neutral names, shown beside NVML's (analysis.telemetry.engine_counters): name ->
    # (Prometheus series, 'median' or 'rate_per_s', scale[, text its labels must hold])
    counters: ClassVar[dict[str, tuple[Any, ...]]] = {}
    # how its memory knob (Knobs.mem_fraction) counts, for replicas sharing a GPU (see shared_fit): 'total', 'free' or
    # 'cache'; '' where it has none
    mem_fraction_of: ClassVar[str] = ""
    # replicas sharing a GPU start one after another, each sizing its memory from what the ones before left (True),
    # or all at once (False: its share counts only what is free when its cache is made, so any order fits)
    shared_starts_in_turn: ClassVar[bool] = True
    # the flags that make it serve a config's architecture with its own seeded random weights (() where it cannot)
    random_weight_flags: ClassVar[tuple[str, ...]] = ()
    # lines of its log saying it is tearing its own process tree down after a child failed (so the signals that
    # follow are its teardown, not the cause), and lines naming the process that raised (a 'who' group)
    teardown_patterns: ClassVar[tuple[str, ...]] = ()
    raiser_patterns: ClassVar[tuple[str, ...]] = ()
    # the environment variables that move its IPC sockets out of the shared temp folder: each launch gets a private
    # folder for them, removed with the server (a killed server never unlinks its sockets)
    socket_dir_env: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def managed_env(self, version: str | None) -> EngineEnvSpec | None:
        """The environment servescope installs itself for this engine, if any."""

    @abstractmethod
    def probe(self, python: str, env: dict[str, str] | None = None) -> EngineInstall:
        """What is installed under that interpreter with its own environment: version, distribution, platform."""

    @abstractmethod
    def knob_flags(self, knobs: Knobs, install: EngineInstall) -> list[str]:
        """Flags expressing the knobs for this version; raises KnobError for what it cannot express."""

    @abstractmethod
    def plan(self, *, install: EngineInstall, model_path: str, served_name: str, host: str, port: int,
             knobs: Knobs, extra_env: dict[str, str]) -> LaunchPlan:
        """The full launch plan for one configuration."""

    def effective_load(self, load: Any, say: Any = None, model_stops: bool = True) -> Any:
        """The load as this engine can take it: without ignore_eos where it rejects the field (the records keep the
        real output lengths from usage, and points with short answers are flagged, so nothing is made up).
        model_stops: False for a generated model with no end token, which answers with the full length anyway."""
        if load.ignore_eos and not self.accepts_ignore_eos and load.endpoint != "generate":
            if say:
                say(f"{self.name} rejects ignore_eos/min_tokens: " + (
                    f"output lengths are up to {load.output_len}, as generated" if model_stops else
                    f"the generated model has no end token, so answers run to {load.output_len} tokens (checked per "
                    "request)"))
            return load.model_copy(update={"ignore_eos": False})
        return load

    def served_name(self, model_path: str, requested: str) -> str:
        """The model name the server will answer to (most engines take the one we give)."""
        return requested

    def resolved_config(self, base_url: str, timeout_s: float = 10.0) -> dict[str, Any] | None:
        """The configuration the running server actually uses, or None where it does not say."""
        return None

    def resolved_from_command(self, command: list[str]) -> dict[str, Any] | None:
        """For an engine without a config endpoint: the resolved settings its command line implies."""
        return None

    def resolved_state(self, resolved: dict[str, Any] | None, log_text: str = "") -> ResolvedState:
        """The resolved configuration (as resolved_config or resolved_from_command gave it) and the server log, as
        one engine-neutral record; fields the engine does not report stay None with the reason."""
        return ResolvedState(self.name, not_reported={f: f"{self.name}: servescope reads no resolved configuration "
                                                         "from this engine" for f in (*FIELDS, "device")})

    def expected_state(self, knobs: Knobs) -> dict[str, Any]:
        """What a request must resolve to on this engine, field by field (see state.expected_state)."""
        return expected_state(knobs)

    def node_flags(self, install: EngineInstall, nodes: int, rank: int, addr: str, port: int) -> list[str]:
        """The flags that make a launch rank `rank` of one server over `nodes` nodes, its rank 0 waiting for the
        others at addr:port (the engine's own multi-node launch); KnobError where this engine or version has none."""
        raise KnobError(f"{self.name} {install.version}: servescope knows no multi-node launch of this engine (one "
                        "server over several nodes): nodes=1 only")

    def recommended_flags(self, knobs: Knobs, install: EngineInstall) -> list[str]:
        """A recommendation in this engine's own spelling (the flags that express knobs on this version)."""
        return self.knob_flags(knobs, install)

    def check_knobs(self, knobs: Knobs, install: EngineInstall, env: dict[str, str] | None = None,
                    model_path: str = "") -> list[str]:
        """Refuse (KnobError, with the reason) what this version or this machine cannot run, before anything
        launches: knobs the version cannot express, and more TP x DP ranks than GPUs visible (or, on a CPU build,
        than cores this process may use). Returns the flags."""
        flags = self.knob_flags(knobs, install)
        if knobs.nodes > 1:  # the nodes are the cluster's (checked there): here only that the version can span them
            self.node_flags(install, knobs.nodes, 0, "127.0.0.1", 1)
        ranks = knobs.devices
        if ranks > 1 and knobs.nodes == 1:
            have, what = visible_devices(install.platform, env or {})
            if have is not None and ranks > have:
                per = f"{knobs.replicas} replicas of " if knobs.replicas > 1 and not knobs.gpu_share else ""
                raise KnobError(f"{per}tp={knobs.tp} x dp={knobs.dp} needs {ranks} {what}; {have} visible here")
        if knobs.gpu_share:
            self._check_share(knobs, install, env or {}, model_path)
        elif install.platform == "cuda" and model_path:
            self._check_fit(knobs, env or {}, model_path)
        if knobs.replicas > 1:
            self.placements(knobs, install, env)
            if install.platform in ("cpu", "cuda") and not shutil.which("taskset"):
                raise KnobError("replicas are pinned to their cores with taskset (util-linux), which is not installed "
                                "here")
        return flags

    def shared_mem_fraction(self, n: int) -> float | None:
        """Each of n replicas' memory share on one GPU in this engine's memory knob (Knobs.mem_fraction), or None
        where it has no memory knob: 0.9 of the GPU split n ways ('total', 'free'), 0.8 of the free memory for caches
        ('cache')."""
        budget = {"total": 0.9, "free": 0.9, "cache": 0.8}.get(self.mem_fraction_of)
        return None if budget is None else math.floor(100 * budget / n) / 100

    def _check_share(self, knobs: Knobs, install: EngineInstall, env: dict[str, str], model_path: str) -> None:
        """Refuse replicas on one GPU that cannot share it here: no GPU build, no memory knob or share, MPS refused
        by the driver, more replicas than fit in the GPU's memory."""
        n, v = knobs.replicas, f"{self.name} {install.version}"
        if install.platform != "cuda":
            raise KnobError(f"gpu_share puts replicas on one GPU, and {v} runs on {install.platform or 'no GPU'} here: "
                            "its replicas take blocks of cores instead")
        if not self.mem_fraction_of:
            raise KnobError(f"{v} has no memory knob to give each replica its share of one GPU")
        if knobs.mem_fraction is None:
            raise KnobError(f"replicas sharing a GPU each need their memory share: set mem_fraction "
                            f"({self.shared_mem_fraction(n)} for {n} on {self.name})")
        gpus = gpu_facts(env)[:knobs.tp * knobs.dp]
        if not gpus:
            raise KnobError("gpu_share needs the GPU's memory and modes from NVML, and NVML sees no GPU here")
        if knobs.gpu_share == "mps" and (why := mps.refusal(gpus, env)):
            raise KnobError(f"MPS: {why}")
        w = weights_bytes(model_path)
        for g in gpus if w is not None else []:
            if why := shared_fit(self.mem_fraction_of, n, knobs.mem_fraction, w / 2**20, g):
                raise KnobError(why)

    def _check_fit(self, knobs: Knobs, env: dict[str, str], model_path: str) -> None:
        """Refuse a layout whose weights cannot fit: each GPU of a server holds 1/tp of them at least (expert
        parallelism only shards further), plus its context; a replica is a server of its own."""
        w = weights_bytes(model_path)
        gpus = gpu_facts(env) if w is not None else []
        sizes = [g.mem_total_mib for g in gpus if g.mem_total_mib]
        if w is None or not sizes:
            return
        need = w / 2**20 / (knobs.tp * knobs.pp) + REPLICA_OVERHEAD_MIB
        if need > min(sizes):
            per = f"{knobs.replicas} replicas of tp={knobs.tp}" if knobs.replicas > 1 else f"tp={knobs.tp}"
            raise KnobError(f"{per} does not fit: the weights ({w / 1e9:.1f} GB) over tp={knobs.tp} need "
                            f"{need / 1024:.1f} GiB on each GPU with its context, and the GPUs here hold "
                            f"{min(sizes) / 1024:.1f} GiB (a larger tp, or GPUs with more memory)")

    def placements(self, knobs: Knobs, install: EngineInstall, env: dict[str, str] | None = None) -> list[Placement]:
        """Each replica's share of the devices: a contiguous block of GPUs (CUDA_VISIBLE_DEVICES) or of cores (the
        server tree pinned with taskset, its thread pools sized to the block); one replica keeps the engine's own
        placement. Raises KnobError when the devices do not divide."""
        if knobs.replicas == 1:
            return [Placement(0, (), "")]
        n, need = knobs.replicas, knobs.tp * knobs.dp
        if install.platform == "cpu" and knobs.gpu_share:
            raise KnobError("gpu_share puts replicas on one GPU; a CPU build's replicas take blocks of cores")
        ids = device_ids(install.platform, env or {})
        shared = knobs.gpu_share is not None
        per = need if shared and len(ids) >= need else len(ids) // n
        kind = "cores" if install.platform == "cpu" else "GPUs"
        if per < need:
            raise KnobError(f"{n} replicas of tp={knobs.tp} x dp={knobs.dp} need {need * (1 if shared else n)} "
                            f"{kind}; {len(ids)} visible here")
        out = []
        if install.platform == "cpu":
            for r in range(n):
                block = tuple(ids[r * per:(r + 1) * per])
                out.append(Placement(r, block, kind, ("taskset", "-c", ",".join(map(str, block))),
                                     self.cpu_pin_env(block)))
            return out
        # a GPU server's scheduler and tokenizer threads are what limit a host-bound one: each replica gets cores
        # of its own, and OpenMP/torch pools sized to them
        for r, cores in enumerate(core_blocks(n)):
            block = tuple(ids[:need]) if shared else tuple(ids[r * per:(r + 1) * per])
            out.append(Placement(r, block, kind, ("taskset", "-c", ",".join(map(str, cores))),
                                 {"CUDA_VISIBLE_DEVICES": ",".join(map(str, block)), "OMP_NUM_THREADS": str(len(cores))},
                                 cores, shared))
        return out

    def cpu_pin_env(self, cores: tuple[int, ...]) -> dict[str, str]:
        """Environment that keeps a CPU build's thread pools on its cores (OpenMP and torch by default)."""
        return {"OMP_NUM_THREADS": str(len(cores))}

    # what spreads requests over replicas in front of this engine's servers, in words
    balancer: ClassVar[str] = "a load balancer"

    def replica_recipe(self, knobs: Knobs, install: EngineInstall, placements: list[str]) -> str:
        """How to run knobs' replicas in production the way they were measured, in this engine's spelling: N servers
        with their flags, each pinned as measured, behind a balancer with the route, and with MPS the daemon first."""
        n, route = knobs.replicas, (knobs.route or "round_robin").replace("_", "-")
        flags = " ".join(self.recommended_flags(knobs, install))
        where = " on one GPU" if knobs.gpu_share else ""
        out = (f"run {n} {self.name} servers{where}, each with {f'`{flags}`' if flags else 'its usual flags'}, pinned "
               f"as measured ({'; '.join(placements)}), behind {self.balancer} spreading requests {route}")
        return out + (mps_recipe(knobs.mps_active_thread_pct) if knobs.gpu_share == "mps" else "")

    def default_graph_mode(self, install: EngineInstall) -> str | None:
        """The CUDA-graph mode (Knobs.cuda_graph) this version runs when no flag asks for one (None: unknown or none);
        of graph modes a measurement cannot tell apart, the one a user gets by dropping the flag that turned graphs
        off, and the one the engine's developers test most."""
        return None

    def mode_requires(self, mode: str, env: Mapping[str, str]) -> dict[str, Any]:
        """The knobs a CUDA-graph mode cannot run without on this engine (env: the suite's engine.env), which thread
        02's arm sets where the deployment sets them otherwise ({} where the mode needs nothing)."""
        return {}

    def as_measured(self, knobs: Knobs, install: EngineInstall) -> Knobs:
        """A graph mode's knobs with the engine default its effect was measured under, where the knobs leave it to the
        engine (vLLM's graphs ran inside its torch.compile, which piecewise graphs need): put on a baseline that sets
        otherwise (thread 07, a change's flags on the deployment), the change keeps what was measured."""
        return knobs

    def downgrade_rules(self, knobs: Knobs, state: ResolvedState) -> list[FactRule]:
        """Where the server resolved knobs otherwise than asked: the facts that explain it, each with the audit
        condition of the engine's rule that did it ([] where this engine knows none)."""
        return []

    def grouped_moe_advice(self) -> str:
        """How to make this engine run the experts as a grouped product, in words (thread 6's recommendation)."""
        return "Choose a fused or grouped MoE backend of the engine."

    def grouped_moe_flags(self) -> list[str]:
        """Flags that switch this engine to a grouped MoE path ([] where it is not a flag)."""
        return []

    def regime_flags(self, regime: str, install: EngineInstall) -> list[str]:
        """Flags that act on a regime in this version's spelling (launch-bound: full CUDA graphs), or [] where the
        engine offers none or the version cannot express them."""
        if regime != "launch-bound":
            return []
        try:
            return self.recommended_flags(Knobs(cuda_graph="full"), install)
        except ServescopeError:
            return []

    def fact_rules(self, state: ResolvedState) -> list[FactRule]:
        """Facts of a resolved state, each with the regex of the audit rule it satisfies and its remedy: how thread 1
        names the rule that turned graphs off, or chose them off."""
        return []

    def graph_metrics(self) -> dict[str, str]:
        """Prometheus series that count CUDA-graph use (replays, passes by mode), name -> meaning; {} if none."""
        return {}

    # scheduler knobs -> the attribute the engine's config stores them in (where a static read can tell whether any
    # code reads it)
    knob_attrs: ClassVar[dict[str, str]] = {}

    def unread_knobs(self, install: EngineInstall) -> dict[str, str]:
        """Knobs this version accepts but whose attribute no file of its source reads outside the one declaring its
        flags: a flag that cannot change anything (knob -> the evidence, in words); {} where the source is not here."""
        try:
            tree = self.source_tree(install)
            files = [f for f in tree.files(self.package + "/") if f.endswith(".py")]
        except Exception:  # noqa: BLE001 - the source is not on this machine: nothing can be said
            return {}
        out = {}
        for knob, attr in self.knob_attrs.items():
            decl = [f for f in files if f.endswith("server_args.py") and attr in tree.read(f)]
            if not decl:
                continue
            readers = [f for f in files if not f.endswith("server_args.py") and attr in tree.read(f)]
            if not readers:
                out[knob] = (f"{self.name} {install.version} declares {attr} in {decl[0]} and no other file of its "
                             "source reads it")
        return out

    def death_stage(self, log_text: str) -> str:
        """Where in its startup a server that died before it was ready had got to, as its log shows ('' where the
        engine's log does not tell)."""
        return ""

    def startup_stages(self, log_text: str) -> pd.DataFrame:
        """Seconds each startup stage took as the engine's log says (stage, seconds); empty where it does not."""
        return pd.DataFrame(columns=["stage", "seconds"])

    def graph_off_flags(self, command: list[str], install: EngineInstall) -> list[dict[str, str]]:
        """The flags of a launch command that turn CUDA graphs off (flag, phases, alias: what a deprecated spelling
        stands for on this version); [] where the engine names none."""
        return []

    def graph_counts(self, log_text: str) -> pd.DataFrame:
        """Batches per CUDA-graph runtime mode as the server's log counts them (mode, batches); empty where the
        engine logs no such counts."""
        return pd.DataFrame(columns=["mode", "batches"])

    def torch_profiler_launch(self, install: EngineInstall, out_dir: str) -> tuple[list[str], dict[str, str]]:
        """Flags and environment that let the running server's PyTorch profiler be started over HTTP."""
        raise ProfilingUnavailable(f"engine {self.name!r} has no PyTorch profiler hook in servescope")

    def idle_profiler_inert(self, install: EngineInstall, kind: str) -> str:
        """Where this version's profiler of that kind, armed at launch, does nothing until it is started: the source
        that shows it (then a launch armed for a window after its load is the same launch for that load); '' where
        that is not known, and an armed launch stays a launch of its own."""
        return ""

    def cuda_profiler_launch(self, install: EngineInstall) -> tuple[list[str], dict[str, str]] | None:
        """Flags/env making /start_profile call cudaProfilerStart (for nsys --capture-range=cudaProfilerApi);
        None when the engine has no such hook (then nsys records a delay/duration window)."""
        return None

    def start_profile(self, base_url: str, out_dir: str | None = None, timeout_s: float = 60.0) -> None:
        """Start the server's profiler."""
        raise ProfilingUnavailable(f"engine {self.name!r} has no profiler endpoint in servescope")

    def stop_profile(self, base_url: str, timeout_s: float = 600.0) -> None:
        """Stop the server's profiler (it writes its trace then)."""
        raise ProfilingUnavailable(f"engine {self.name!r} has no profiler endpoint in servescope")

    def source_tree(self, install: EngineInstall) -> SourceTree:
        """The engine's source for this install: the wheel or folder in install.source, else found under its python."""
        if not self.package:
            raise ServescopeError(f"engine {self.name!r} has no source servescope reads")
        if install.source:
            tree = SourceTree.from_wheel(install.source) if install.source.endswith(".whl") else \
                SourceTree(self.package, install.version, install.source)
            return tree
        return SourceTree.from_installed(install.python, self.package, self.distributions or (self.package,),
                                         env=install.env)

    # how to ask an installed server for its flags (argv after the interpreter); () where it has no --help
    help_command: ClassVar[tuple[str, ...]] = ()

    def flag_set(self, install: EngineInstall) -> FlagSet:
        """The CLI flags this install defines. A release `make check-engines` has read is taken from a static scan
        of its source (cached per source). An installed version it has not read is asked for its `--help` where it
        runs here: that list is the truth, the scan's choices and file:line are kept where it agrees, and every
        disagreement is listed in `FlagSet.disagreements` (and logged), not hidden."""
        tree = self.source_tree(install)
        try:
            static, failed = _scan_cached(tree), None
        except ServescopeError as e:
            static, failed = None, e
        if install.source or not self.help_command or known_release(self.name, install.version):
            if static is None:
                raise failed  # type: ignore[misc]
            return static
        helped = _help_cached(install.python, self.name, install.version, self.help_command,
                              tuple(sorted(install.env.items())))
        if helped is None:
            if static is None:
                raise failed  # type: ignore[misc]
            return static
        return reconcile_flags(static, helped, failed)

    def knob_capabilities(self, install: EngineInstall) -> pd.DataFrame:
        """For each knob and value, the flags this version uses for it, or why it cannot (one row each)."""
        rows = []
        for probe in KNOB_PROBES:
            knobs = Knobs(**probe)
            row = {"knobs": knobs.label()}
            try:
                row |= {"supported": True, "flags": " ".join(self.knob_flags(knobs, install)), "reason": ""}
            except (KnobError, SpecError) as e:
                row |= {"supported": False, "flags": "", "reason": str(e)}
            rows.append(row)
        return pd.DataFrame(rows)

    def check_flags(self, flags: list[str], install: EngineInstall) -> None:
        """KnobError before launch if a flag we built is not defined by this version, or its value is not one the
        version accepts (where the source restricts it)."""
        fs = self.flag_set(install)
        names = [f.split("=", 1)[0] for f in flags if f.startswith("--")]
        missing = [f for f in names if not fs.has(f)]
        if missing:
            raise KnobError(f"{self.name} {install.version} does not define {', '.join(missing)} "
                            f"(flags read from {fs.origin})")
        for i, f in enumerate(flags):
            if not f.startswith("--"):
                continue
            if "=" in f:
                fs.check_value(*f.split("=", 1))
            elif i + 1 < len(flags) and not flags[i + 1].startswith("-"):
                fs.check_value(f, flags[i + 1])

    def output_check_request(self, model: str, text: str, max_tokens: int) -> tuple[str, dict[str, Any]]:
        """(path, JSON body) of one greedy, non-streamed request returning the prompt's teacher-forced
        log-probabilities and the continuation's (outputs.take); CheckUnavailable where the engine gives none."""
        from ..outputs import CheckUnavailable

        raise CheckUnavailable(f"servescope reads no prompt log-probabilities from {self.name}")

    def output_check_parse(self, obj: dict[str, Any]) -> tuple[list[float | None], list[int], list[float]]:
        """(prompt log-probabilities by position, continuation token ids, their log-probabilities) of one answer."""
        from ..outputs import CheckUnavailable

        raise CheckUnavailable(f"servescope reads no prompt log-probabilities from {self.name}")

    def kv_capacity_tokens(self, log_text: str) -> int | None:
        """Tokens one server's KV cache holds, from its startup log (None where the log does not say)."""
        from .logs import kv_tokens_from_log

        return kv_tokens_from_log(log_text, self.name)

    def log_patterns(self) -> list[LogPattern]:
        """What to look for in this engine's log (see engines.logs)."""
        return []

    def metric_names(self) -> dict[str, str]:
        """Prometheus metrics worth watching, name -> meaning."""
        return {}


# the knob settings that exercise each translation (a knob that needs another set comes with it)
KNOB_PROBES: list[dict[str, Any]] = [
    {"cuda_graph": "off"}, {"cuda_graph": "decode_only"}, {"cuda_graph": "full"}, {"cuda_graph": "piecewise"},
    {"cuda_graph_max_bs": 64},
    {"torch_compile": True}, {"torch_compile": False},
    {"torch_compile": True, "torch_compile_max_bs": 16},
    {"tp": 2}, {"dp": 2}, {"tp": 2, "attn_dp": 2}, {"tp": 2, "ep": 2},
    {"moe_backend": "triton"}, {"moe_backend": "flashinfer_cutlass"}, {"moe_backend": "deep_gemm"},
    {"max_running_requests": 128}, {"num_continuous_decode_steps": 4},
    {"two_batch_overlap": True}, {"single_batch_overlap": True},
    {"chunked_prefill_size": 4096}, {"mem_fraction": 0.85},
]


_VERSION_PROBE = r"""
import importlib.metadata as md, importlib.util, json, sys
out = {}
for dist in sys.argv[2:]:
    try:
        out = {"version": md.version(dist), "distribution": dist}
        break
    except md.PackageNotFoundError:
        pass
if sys.argv[1]:
    out["found"] = importlib.util.find_spec(sys.argv[1]) is not None  # found without being imported
print(json.dumps(out))
"""


def installed_version(python: str, distributions: tuple[str, ...], label: str, package: str = "",
                      env: dict[str, str] | None = None) -> tuple[str, str]:
    """(version, distribution) of the first of these distributions installed under that interpreter (with its own
    environment), read from package metadata; where package is given, it must also be importable from there (found,
    not imported). KnobError naming the interpreter and what to change when either is missing."""
    try:
        res = subprocess.run([python, "-c", _VERSION_PROBE, package, *distributions], capture_output=True, text=True,
                             timeout=120, env=interpreter_env(env))
    except OSError as e:
        raise KnobError(f"the engine interpreter {python} does not run ({e}): set engine.python to one that "
                        f"has {label}") from None
    info = json.loads(res.stdout or "{}") if res.returncode == 0 else {}
    where = python + (f" with PYTHONPATH={env['PYTHONPATH']}" if env and env.get("PYTHONPATH") else "")
    if not info.get("version"):
        raise KnobError(f"no {label} installed under {where} ({res.stderr.strip()[-300:] or 'no package metadata'}): "
                        "set engine.python (and engine.env PYTHONPATH for a site folder) to the environment that "
                        f"has {label}")
    if package and not info.get("found"):
        raise KnobError(f"{where} cannot import {package} ({label} {info['version']}'s metadata is there, its "
                        "package is not): check engine.env PYTHONPATH")
    return info["version"], info["distribution"]


def openai_check_request(model: str, text: str, max_tokens: int) -> tuple[str, dict[str, Any]]:
    """vLLM's OpenAI completions with its extensions: the prompt's own token log-probabilities (prompt_logprobs=0:
    the prompt token's alone) and the continuation's, as token ids."""
    return "/v1/completions", {"model": model, "prompt": text, "max_tokens": max_tokens, "temperature": 0.0,
                               "logprobs": 0, "prompt_logprobs": 0, "return_tokens_as_token_ids": True,
                               "ignore_eos": True}


def openai_check_parse(obj: dict[str, Any]) -> tuple[list[float | None], list[int], list[float]]:
    """The answer of openai_check_request: prompt_logprobs is a list of None (the first token) or {id: {logprob}}."""
    ch = (obj.get("choices") or [{}])[0]
    prompt = [None if d is None else float(next(iter(d.values()))["logprob"]) for d in ch.get("prompt_logprobs") or []]
    lp = ch.get("logprobs") or {}
    ids = [int(str(t).rsplit(":", 1)[-1]) for t in lp.get("tokens") or []]
    return prompt, ids, [float(x) for x in lp.get("token_logprobs") or []]


def version_tuple(version: str) -> tuple[int, ...]:
    """'0.5.23rc1' -> (0, 5, 23): numeric release part only, for comparisons."""
    m = re.match(r"(\d+(?:\.\d+)*)", version)
    return tuple(int(x) for x in m.group(1).split(".")) if m else ()
