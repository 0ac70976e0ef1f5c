"""Points on a Ray cluster (RunnerSpec kind 'ray'): each point runs as a Ray task on a node that has what its
configuration needs, in a store of the node's own, and its folders (the complete point, or its failure and the levels
it finished) come back into the driver's store as they would have been written locally. Ray is an optional
dependency (`pip install servescope[ray]`), imported only here and only when a suite names it."""

from __future__ import annotations

import io
import os
import shutil
import socket
import tarfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ServerError, SpecError
from .spec import RunnerSpec

# how long a cluster's address may take to take a connection before it is said to have none behind it
CONNECT_TIMEOUT_S = 5.0
_JOINING = threading.Lock()  # a repetition's points join from threads of their own: one ray.init
_JOINED: list[str] = []  # the address this process joined
_IN_FLIGHT: set[Any] = set()  # the points' tasks running now (cancel_all)


def ray_module() -> Any:
    """The ray package, or a one-line SpecError saying how to get it."""
    try:
        import ray
    except ImportError:
        raise SpecError("runner kind 'ray' needs Ray: pip install 'servescope[ray]' (nothing was launched)") from None
    return ray


def connect(spec: RunnerSpec) -> dict[str, Any]:
    """Join the cluster at spec.address once per process and return what it has (Ray's cluster resources and its
    nodes); an address with no cluster behind it is a SpecError, before anything launches."""
    ray = ray_module()
    with _JOINING:
        _join(ray, spec)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    return {"resources": ray.cluster_resources(), "nodes": nodes}


def _join(ray: Any, spec: RunnerSpec) -> None:
    if ray.is_initialized():
        if _JOINED and _JOINED[0] != spec.address:  # one process, one cluster: Ray joins once
            raise SpecError(f"runner: this process already runs its points on the Ray cluster at {_JOINED[0]!r}, not "
                            f"{spec.address!r}: restart the kernel to change clusters; nothing was launched")
        return
    _reachable(spec.address)
    try:
        # a point's lines reach the notebook through its queue (run), not as Ray's prefixed log stream
        ray.init(address=spec.address, log_to_driver=False, logging_level="ERROR", configure_logging=False)
    except Exception as e:  # ConnectionError, a timeout, a bad address: all mean no cluster to run on
        said = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        if spec.address.startswith("ray://"):  # the port answered (_reachable): the head's client server gave up
            raise SpecError(f"runner: Ray's client at {spec.address!r} took the connection but did not start a server "
                            f"for this driver ({said}); the head waits RAY_CLIENT_SERVER_CHECK_CHANNEL_TIMEOUT_S (30 s "
                            "unless set where the head was started) for it, which a loaded head can pass; nothing "
                            "was launched") from None
        raise SpecError(f"runner: no Ray cluster answers at {spec.address!r} ({said}); nothing was launched") from None
    _JOINED[:] = [spec.address]


def _reachable(address: str) -> None:
    """A host:port address (or ray://host:port) whose port takes no connection is refused at once: Ray's own
    client retries such an address without end."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return  # 'auto' and the like: ray.init says itself that no cluster runs here
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise SpecError(f"runner: no Ray cluster answers at {address!r} ({e.strerror or e}); nothing was "
                        "launched") from None


def check_fits(spec: RunnerSpec, gpus: int, where: str) -> None:
    """Refuse a point that needs more GPUs (or CPUs) than any one node of the cluster has, in one line naming it."""
    nodes = connect(spec)["nodes"]
    most_gpus = max((n["Resources"].get("GPU", 0.0) for n in nodes), default=0.0)
    most_cpus = max((n["Resources"].get("CPU", 0.0) for n in nodes), default=0.0)
    if gpus > most_gpus:
        total = sum(n["Resources"].get("GPU", 0.0) for n in nodes)
        raise SpecError(f"{where} needs {gpus} GPU(s) on one node; the Ray cluster at {spec.address!r} has at most "
                        f"{most_gpus:g} on a node ({total:g} in all, {len(nodes)} node(s)); nothing was launched")
    if spec.cpus_per_point > most_cpus:
        raise SpecError(f"runner.cpus_per_point={spec.cpus_per_point:g}: no node of the Ray cluster at "
                        f"{spec.address!r} has that many CPUs (at most {most_cpus:g}); nothing was launched")


def pack(root: Path, names: list[str]) -> bytes:
    """The named folders under root (those that exist) as one gzip'd tar."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for n in names:
            if (root / n).exists():
                tar.add(root / n, arcname=n)
    return buf.getvalue()


def unpack(data: bytes, root: Path) -> list[str]:
    """A pack() into root, merging with what is there; returns the top-level names it wrote."""
    root.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(root, filter="data")  # nothing outside root, no links out of it
        return sorted({m.name.split("/")[0] for m in tar.getmembers()})


def lost_errors() -> tuple[type[BaseException], ...]:
    """What Ray raises where the node, worker or actor a call depended on is gone."""
    ex = ray_module().exceptions
    return (ex.NodeDiedError, ex.WorkerCrashedError, ex.OwnerDiedError, ex.LocalRayletDiedError, ex.RayActorError,
            ex.ActorUnavailableError)


class NodeLostError(ServerError):
    """The node running a point left the cluster (or its worker died) before the point came back."""


def fitting_nodes(spec: RunnerSpec, gpus: int) -> list[str]:
    """The ids of the live nodes with room for one point of gpus GPUs, in a stable order."""
    nodes = connect(spec)["nodes"]
    return sorted(n["NodeID"] for n in nodes if n["Resources"].get("GPU", 0.0) >= gpus
                  and n["Resources"].get("CPU", 0.0) >= spec.cpus_per_point)


def run(spec: RunnerSpec, fn: Callable[..., Any], args: tuple[Any, ...], gpus: int, where: str,
        slot: int | None = None, on_line: Callable[[str], None] | None = None, bundle: Any = None,
        on_level: Callable[[Level], None] | None = None) -> Any:
    """fn(*args, tell) as a Ray task with gpus GPUs and spec.cpus_per_point CPUs, never retried (a point is measured
    once per attempt); slot: the task goes to the slot-th fitting node (mod their number) where it is alive, so that
    configurations rotate over nodes from one repetition to the next; bundle: a placement group's scheduling
    strategy instead (a server over nodes, span.py); tell: a queue the task puts lines (to on_line) and finished
    levels (Level, to on_level) in, which this process drains as they come and once more at the end, whatever
    happened to the task (None without either). Its return value, or NodeLostError naming the node and when, where
    Ray lost it."""
    ray = ray_module()
    from ray.util.queue import Queue

    # the queue lives beside the driver (on its node, or on the head for a driver attached through Ray's client): a
    # queue Ray placed on the point's node died with it (a CI run read the lost node as ActorUnavailableError from
    # the queue, not as the point's node lost), and what a lost node had put there still reaches the driver's store
    wanted = on_line is not None or on_level is not None
    tell = Queue(actor_options={"num_cpus": 0, "scheduling_strategy": _here()}) if wanted else None
    try:
        return _run(ray, spec, fn, (*args, tell), gpus, where, slot, tell, on_line, on_level, bundle)
    finally:
        if tell is not None:
            try:
                _drain(tell, on_line, on_level)
            finally:
                tell.shutdown()


@dataclass(frozen=True)
class Level:
    """One level a point finished on its node: the pack of its folder, at rel under the store's root."""

    rel: str
    data: bytes


def _drain(tell: Any, on_line: Callable[[str], None] | None, on_level: Callable[[Level], None] | None) -> None:
    if tell is None:
        return
    for item in tell.get_nowait_batch(tell.qsize()):
        if isinstance(item, Level):
            if on_level is not None:
                on_level(item)
        elif on_line is not None:
            on_line(item)


def _run(ray: Any, spec: RunnerSpec, fn: Callable[..., Any], args: tuple[Any, ...], gpus: int, where: str,
         slot: int | None, tell: Any, on_line: Callable[[str], None] | None,
         on_level: Callable[[Level], None] | None, bundle: Any = None) -> Any:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    fits = fitting_nodes(spec, gpus) if bundle is None else []
    strategy = bundle if bundle is not None else NodeAffinitySchedulingStrategy(fits[slot % len(fits)], soft=True) \
        if slot is not None and fits else "DEFAULT"
    task = ray.remote(fn).options(num_gpus=gpus, num_cpus=spec.cpus_per_point, max_retries=0,
                                  scheduling_strategy=strategy)
    ref = task.remote(*args)
    with _JOINING:
        _IN_FLIGHT.add(ref)
    try:
        while not ray.wait([ref], timeout=0.5)[0]:  # the point's lines as it says them, its levels as it ends them
            _drain(tell, on_line, on_level)
        return ray.get(ref)
    except lost_errors() as e:
        node = f" {strategy.node_id}" if slot is not None and fits else " of the server's rank 0" if bundle else ""
        raise NodeLostError(f"{where}: the Ray node{node} running it was lost at {time.strftime('%H:%M:%S')} "
                            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    except ray.exceptions.TaskCancelledError:
        raise KeyboardInterrupt from None
    except KeyboardInterrupt:
        ray.cancel(ref, force=True)  # the node's task dies, and its server tree with its reaper
        raise
    finally:
        with _JOINING:
            _IN_FLIGHT.discard(ref)


def cancel_all() -> int:
    """Ctrl-C on the driver while points run on nodes: every task in flight is killed (its worker dies, and the
    reaper of the server it launched takes that tree down); returns how many."""
    ray = ray_module()
    with _JOINING:
        refs = list(_IN_FLIGHT)
    for ref in refs:
        ray.cancel(ref, force=True)
    return len(refs)


def put_level(store_root: Path, level: Level) -> None:
    """A level a point finished on its node into this store, at the same place (Store.put_level's layout, one rename
    per level), so a node lost mid-point loses only the level in flight."""
    final = store_root / level.rel
    tmp = final.parent / f".sent-{final.name}"
    if tmp.exists():
        shutil.rmtree(tmp)
    unpack(level.data, tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp / level.rel, final)
    shutil.rmtree(tmp, ignore_errors=True)


def _here() -> Any:
    """A scheduling strategy that keeps an actor on this (the driver's) node."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(ray_module().get_runtime_context().get_node_id(), soft=False)


def node_words() -> dict[str, Any]:
    """Inside a task: which node and cards it runs on (Ray's node id, the node's address, its GPU ids)."""
    ray = ray_module()
    rc = ray.get_runtime_context()
    return {"node_id": rc.get_node_id(), "node_ip": ray.util.get_node_ip_address(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}
