"""One server over several nodes (Knobs.nodes > 1) on the Ray runner: a placement group of one bundle per node (a
node each, STRICT_SPREAD), the point's task in bundle 0 as rank 0 (the HTTP server the load reaches), and a
RankServer actor in each other bundle that launches the same command with its rank's flags (the engine's own
multi-node launch: adapter.node_flags) and samples telemetry on its node. Every rank's command, environment, node and
log come back into the point's folder (rank<r>/); a rank that dies fails the point naming its node."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from .errors import ServerError, SpecError
from .spec import Knobs, RunnerSpec, TelemetrySpec

# a placement group the cluster cannot give within this long is refused, naming what it asked for
PLACEMENT_TIMEOUT_S = 60.0
# a follower's GPUs read as 100 x its rank + its NVML index there: one server's GPUs stay apart across nodes
GPU_INDEX_PER_RANK = 100
# the environment a rank's record keeps (the rest of a node's environment is the node's, not the launch's)
RANK_ENV = ("CUDA_VISIBLE_DEVICES", "PYTHONPATH", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "OMP_NUM_THREADS")


@dataclass(frozen=True)
class Span:
    """Where one server over nodes runs: its placement group (bundle r holds rank r) and each node's share."""

    pg: Any
    nodes: int
    gpus_per_node: int
    cpus_per_node: float


def check_fits(spec: RunnerSpec, knobs: Knobs, gpus_per_node: int, where: str) -> None:
    """Refuse, in one line before anything launches, a server over more nodes than the cluster has with room for
    one rank each (its GPUs and the runner's CPUs per point)."""
    from . import raypoints

    nodes = raypoints.connect(spec)["nodes"]
    room = raypoints.fitting_nodes(spec, gpus_per_node)
    if len(room) < knobs.nodes:
        raise SpecError(f"{where} spans {knobs.nodes} nodes of {gpus_per_node} GPU(s) and {spec.cpus_per_point:g} "
                        f"CPU(s) each; the Ray cluster at {spec.address!r} has {len(room)} such node(s) of "
                        f"{len(nodes)}; nothing was launched")


@contextlib.contextmanager
def placement(spec: RunnerSpec, knobs: Knobs, gpus_per_node: int, where: str) -> Iterator[Span]:
    """A placement group of one bundle per node of the server (each on a node of its own), removed when the block
    ends; one the cluster cannot give in PLACEMENT_TIMEOUT_S (others hold its nodes) fails the point, naming it."""
    from . import raypoints

    ray = raypoints.ray_module()
    from ray.util.placement_group import placement_group, remove_placement_group

    bundle = {"CPU": spec.cpus_per_point, **({"GPU": float(gpus_per_node)} if gpus_per_node else {})}
    pg = placement_group([dict(bundle) for _ in range(knobs.nodes)], strategy="STRICT_SPREAD")
    try:
        ready, _ = ray.wait([pg.ready()], timeout=PLACEMENT_TIMEOUT_S)
        if not ready:
            raise ServerError(f"{where}: the Ray cluster gave no {knobs.nodes} nodes of {bundle} at once within "
                            f"{PLACEMENT_TIMEOUT_S:.0f} s (other points hold them, or the cluster lacks them)")
        yield Span(pg, knobs.nodes, gpus_per_node, spec.cpus_per_point)
    finally:
        remove_placement_group(pg)


def in_bundle(span: Span, rank: int) -> Any:
    """The scheduling strategy that puts a task or actor on rank's node (its bundle)."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return PlacementGroupSchedulingStrategy(span.pg, placement_group_bundle_index=rank)


class RankServer:
    """A Ray actor on one node of a server over several nodes: the engine launched there as rank `rank` (no HTTP of
    its own: rank 0 serves), its telemetry, and its logs. Its process tree has the reaper every launch has, so it
    goes with the actor if the actor dies."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        # named as the point folder names it (rank<r>/), so its pack unpacks there as it is
        self.dir = Path(tempfile.mkdtemp(prefix="servescope-rank-")) / f"rank{rank}"
        self.server: Any = None
        self.tel: Any = None

    def start(self, prep: Any, knobs: Knobs, flags: list[str], rank_server: Callable[..., Any]) -> dict[str, Any]:
        """Launch this rank (rank_server: launch's server for knobs, as rank 0's command, with its own node flags);
        started, not waited on: the ranks meet each other inside the engine. Returns the rank's record: node,
        command, environment, pid."""
        from . import raypoints

        own = knobs.model_copy(update={"extra_args": (*knobs.extra_args, *flags)})
        self.server = rank_server(prep, own, self.dir)
        self.server.start()
        env = {**os.environ, **self.server.env}
        return {"rank": self.rank, **raypoints.node_words(), "command": self.server.shown_command,
                "flags": flags, "env": {k: env[k] for k in RANK_ENV if k in env}, "pid": self.server.proc.pid}

    def alive(self) -> str | None:
        """None while every process of this rank lives; else what died, with its log's tail."""
        try:
            self.server.check_alive()
        except ServerError as e:
            return f"{e}\n{self.server.log_tail(20)}"
        return None

    def tel_start(self, spec: TelemetrySpec) -> dict[str, Any]:
        """Start sampling this node: its GPUs (NVML, the ones Ray gave this rank) and this rank's process tree."""
        from .telemetry import Telemetry

        self.tel = Telemetry(gpu=spec.gpu, gpu_hz=spec.gpu_hz, host_hz=spec.host_hz,
                             server_pid=self.server.proc.pid).start()
        return dict(self.tel.status)

    def tel_phase(self, label: str) -> None:
        """Tag this node's readings from now on with label."""
        self.tel.set_phase(label)

    def tel_frames(self) -> dict[str, pd.DataFrame]:
        """This node's tables so far."""
        return self.tel.frames()

    def tel_stop(self) -> dict[str, Any]:
        """Stop sampling; how each sampler did."""
        self.tel.stop()
        return dict(self.tel.status)

    def stop(self) -> bytes:
        """Stop this rank's tree and hand back its log folder (packed)."""
        from . import raypoints

        if self.server is not None:
            self.server.stop(check_port=False)
        return raypoints.pack(self.dir.parent, [self.dir.name])


@contextlib.contextmanager
def serve(span: Span, prep: Any, knobs: Knobs, log_dir: Path, serve_one: Callable[..., Any],
          rank_server: Callable[..., Any], prefix: list[str] | None = None, extra_env: dict[str, str] | None = None,
          term_grace_s: float = 15.0) -> Iterator[Any]:
    """Rank 0 here (this task runs in bundle 0, through serve_one: launch's one-server block, prefix and extra_env
    its alone) and a RankServer in every other bundle (rank_server's process), all with the engine's node flags
    (rank 0 listens at this node's address); yields rank 0's Target with .followers (the actors) and .ranks (every
    rank's record); every rank is stopped, and its log brought into log_dir/rank<r>/, as it ends."""
    import ray

    from . import raypoints
    from .server import free_port

    me = raypoints.node_words()
    addr = me["node_ip"]
    port = free_port(addr)
    adapter, install = prep.adapter, prep.install
    actor = ray.remote(RankServer)
    followers = [actor.options(num_cpus=span.cpus_per_node, num_gpus=span.gpus_per_node, max_restarts=0,
                               scheduling_strategy=in_bundle(span, r)).remote(r) for r in range(1, span.nodes)]
    records: list[dict[str, Any]] = []
    try:
        records = ray.get([f.start.remote(prep, knobs, adapter.node_flags(install, span.nodes, r, addr, port),
                                          rank_server) for r, f in enumerate(followers, start=1)])
        flags0 = adapter.node_flags(install, span.nodes, 0, addr, port)
        own = knobs.model_copy(update={"extra_args": (*knobs.extra_args, *flags0)})
        with serve_one(prep, own, log_dir, prefix, extra_env, term_grace_s) as target:
            cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
            rank0 = {"rank": 0, **me, "command": target.command, "flags": flags0, "pid": target.pid,
                     "env": {k: v for k, v in (("CUDA_VISIBLE_DEVICES", cvd),) if v is not None}}
            head = dataclasses.replace(target, knobs=knobs, followers=followers, ranks=[rank0, *records])
            head.check_alive = _checker(target.check_alive, followers, records)
            yield head
    except raypoints.lost_errors() as e:
        raise ServerError(f"a rank of the server over {span.nodes} nodes was lost at {time.strftime('%H:%M:%S')} "
                          f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    finally:
        _stop(followers, Path(log_dir))


def _checker(own: Callable[[], None] | None, followers: list[Any], records: list[dict[str, Any]]
             ) -> Callable[[], None]:
    """Rank 0's liveness check, then every other rank's: a rank that died (or whose node left) fails the point."""
    import ray

    from . import raypoints

    def check() -> None:
        if own is not None:
            own()
        for f, rec in zip(followers, records, strict=True):
            where = f"rank {rec['rank']} on node {rec['node_id'][:12]} ({rec['node_ip']})"
            try:
                why = ray.get(f.alive.remote(), timeout=30)
            except raypoints.lost_errors() as e:
                raise ServerError(f"{where} was lost at {time.strftime('%H:%M:%S')}: {type(e).__name__}") from None
            if why:
                raise ServerError(f"{where} died: {why}")
    return check


def _stop(followers: list[Any], log_dir: Path) -> None:
    """Every other rank stopped and its log folder brought in as log_dir/rank<r>; a lost one is killed."""
    import ray

    from . import raypoints

    for f in followers:
        try:
            raypoints.unpack(ray.get(f.stop.remote(), timeout=120), log_dir)  # as log_dir/rank<r>
        except (*raypoints.lost_errors(), ray.exceptions.GetTimeoutError):
            pass  # its node is gone: the reaper there takes its tree down with the actor
        finally:
            ray.kill(f)


class SpanTelemetry:
    """Telemetry of a server over several nodes: rank 0's here and each other rank's on its node, one phase for
    all; the tables carry node_rank, and a follower's GPUs read GPU_INDEX_PER_RANK x rank + their index there."""

    def __init__(self, local: Any, followers: list[Any], spec: TelemetrySpec) -> None:
        self.local, self.followers, self.spec = local, followers, spec
        self.status: dict[str, Any] = dict(local.status)

    def set_phase(self, label: str) -> None:
        """Every node's readings tagged with label from now on."""
        import ray

        self.local.set_phase(label)
        ray.get([f.tel_phase.remote(label) for f in self.followers])

    def start(self) -> SpanTelemetry:
        """Every node's samplers started."""
        import ray

        self.local.start()
        starts = ray.get([f.tel_start.remote(self.spec) for f in self.followers])
        self.status["ranks"] = {str(r): st for r, st in enumerate(starts, start=1)}
        return self

    def stop(self) -> None:
        """Every node's samplers stopped, each one's status kept (under ranks)."""
        import ray

        self.local.stop()
        self.status.update(self.local.status)
        stops = ray.get([f.tel_stop.remote() for f in self.followers])
        self.status["ranks"] = {str(r): st for r, st in enumerate(stops, start=1)}

    def frames(self) -> dict[str, pd.DataFrame]:
        """Every node's tables, rank 0's first."""
        import ray

        out = {k: _ranked(v, 0) for k, v in self.local.frames().items()}
        for r, frames in enumerate(ray.get([f.tel_frames.remote() for f in self.followers]), start=1):
            for k, v in frames.items():
                if not v.empty:
                    out[k] = pd.concat([out.get(k, pd.DataFrame()), _ranked(v, r)], ignore_index=True)
        return out


def _ranked(frame: pd.DataFrame, rank: int) -> pd.DataFrame:
    if frame.empty:
        return frame
    frame = frame.assign(node_rank=rank)
    if rank and "gpu" in frame:
        frame["gpu"] = GPU_INDEX_PER_RANK * rank + frame["gpu"].astype(int)
    return frame
