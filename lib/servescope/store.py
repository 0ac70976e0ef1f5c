"""Result store: one folder per experiment point, keyed by a hash of what was measured; written atomically."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import platform
import shutil
import socket
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd
import psutil
import pyarrow.parquet as pq

from . import __version__
from .install import EngineInstall
from .mps import SharedGpu
from .paths import default_store_dir
from .server import STDERR_LOG, STDOUT_LOG, has_logs, read_logs, read_resolved, replica_log_dir
from .spec import stable_hash
from .state import ResolvedState
from .util import atomic_write_json

MANIFEST = "manifest.json"


def boot_id() -> str:
    """This machine's boot id (Linux), '' where it cannot be read."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class Replica:
    """One server of a point's configuration, as data: its index, where it ran, and where it logged."""

    index: int
    placement: str
    base_url: str
    log_dir: Path


@dataclass
class Point:
    """A completed point read back from the store: its tables, its manifest, and what its server left (resolved
    record and configuration, install, replicas, logs). Every reader of a point goes through this."""

    key: str
    path: Path
    manifest: dict[str, Any]
    _logs: dict[tuple[int, bool], str] = field(default_factory=dict, repr=False, compare=False)

    def table(self, name: str, columns: list[str] | None = None, exclude: tuple[str, ...] = ()) -> pd.DataFrame:
        """A parquet table of this point, or only its columns named, or all but those excluded (empty DataFrame if
        it has none)."""
        p = self.path / f"{name}.parquet"
        if not p.is_file():
            return pd.DataFrame()
        if exclude and columns is None:
            columns = [c for c in pq.read_schema(p).names if c not in exclude]
        return pd.read_parquet(p, columns=columns)

    @property
    def parts(self) -> dict[str, Any]:
        """The key material the point was stored under."""
        return self.manifest.get("parts") or {}

    @property
    def target(self) -> dict[str, Any]:
        """The launched configuration as the manifest describes it (flags, command, install, startup, replicas)."""
        return self.manifest.get("target") or {}

    @property
    def resolved(self) -> ResolvedState | None:
        """The engine-neutral resolved record written at launch, None in older stores."""
        d = self.manifest.get("resolved")
        return ResolvedState.from_dict(d) if isinstance(d, dict) else None

    @cached_property
    def resolved_config(self) -> dict[str, Any] | None:
        """The configuration the server reported about itself, as kept beside its logs (read once)."""
        return read_resolved(self.path)

    @property
    def install(self) -> EngineInstall | None:
        """The engine install the point ran on, as its manifest recorded it (None where it recorded none)."""
        inst = self.target.get("install")
        return EngineInstall.from_dict(inst) if isinstance(inst, dict) and inst else None

    @property
    def machine_start(self) -> str:
        """The boot of the machine the point ran on ('' for points stored before it was recorded): two points of one
        machine start share it, and a card, a driver and a host's noise with it."""
        return str(self.manifest.get("boot_id") or "")

    @cached_property
    def card(self) -> str:
        """The GPU model NVML named while this point ran ('' where none was read: a CPU build, an external server)."""
        s = self.table("telemetry_gpu_static")
        return str(s["name"].iloc[0]) if len(s) and "name" in s else ""

    @property
    def cpu_count(self) -> int | None:
        """The cores the suite could use when the point ran (the manifest's cpu_count)."""
        n = self.manifest.get("cpu_count")
        return int(n) if isinstance(n, (int, float)) else None

    @property
    def flags(self) -> list[str]:
        """The engine flags the configuration launched with."""
        return list(self.target.get("flags") or [])

    @property
    def replicas(self) -> list[Replica]:
        """Every server of the configuration, in index order (one, replica 0, for a single server)."""
        reps = self.target.get("replicas") or [{"replica": 0, "placement": "", "base_url": self.target.get("base_url",
                                                                                                       "")}]
        return sorted((Replica(int(r.get("replica", i)), str(r.get("placement") or ""), str(r.get("base_url") or ""),
                               replica_log_dir(self.path, int(r.get("replica", i)))) for i, r in enumerate(reps)),
                      key=lambda r: r.index)

    @property
    def gpu_share(self) -> SharedGpu | None:
        """How its replicas shared one GPU (None where they did not): mode, and with MPS the daemon, who started it and
        whether each replica was its client."""
        share = self.target.get("gpu_share")
        return SharedGpu.from_dict(share) if isinstance(share, dict) and share else None

    def log(self, replica: int = 0, stderr_first: bool = False) -> str:
        """The server log (both streams) a replica left ('' where none was kept, as in exported stores)."""
        if (replica, stderr_first) not in self._logs:  # read once: every reader of the point shares it
            order = (STDERR_LOG, STDOUT_LOG) if stderr_first else (STDOUT_LOG, STDERR_LOG)
            self._logs[(replica, stderr_first)] = read_logs(replica_log_dir(self.path, replica), order)
        return self._logs[(replica, stderr_first)]

    def has_log(self, replica: int = 0) -> bool:
        """True when the replica's server log was kept."""
        return has_logs(replica_log_dir(self.path, replica))


@dataclass
class PointWriter:
    """Collects a point's tables and manifest in a temporary folder until it completes."""

    key: str
    dir: Path
    manifest: dict[str, Any] = field(default_factory=dict)

    def put_table(self, name: str, df: pd.DataFrame) -> None:
        """Write a table as parquet (atomically, so even a failed point keeps what it had)."""
        tmp = self.dir / f".{name}.parquet.tmp"
        df.to_parquet(tmp, index=False, compression="zstd")
        os.replace(tmp, self.dir / f"{name}.parquet")


class Store:
    """The source of truth for results; notebooks re-render from it alone."""

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.root = Path(root) if root else default_store_dir()

    @staticmethod
    def key(parts: dict[str, Any]) -> str:
        """Content key of an experiment point."""
        return stable_hash(parts, n=16)

    def path(self, key: str) -> Path:
        """Folder of a completed point."""
        return self.root / key

    def has(self, key: str) -> bool:
        """True when a completed point is stored under key (or under the key it is an alias of)."""
        m = self.path(self.resolve(key)) / MANIFEST
        if not m.is_file():
            return False
        return json.loads(m.read_text()).get("status") == "complete"

    # -- one launch, one measurement: keys whose configurations launch the same server share a point ----------
    def resolve(self, key: str) -> str:
        """The key whose folder holds key's measurement: key itself, or the point it is an alias of."""
        if (self.root / key).is_dir():
            return key
        p = self.root / "_notes" / "aliases" / f"{key}.json"
        return str(json.loads(p.read_text())["data"]["key"]) if p.is_file() else key

    def put_alias(self, key: str, target: str) -> None:
        """Record that key is measured by target's point (the same launch asked for with other knobs)."""
        p = self.root / "_notes" / "aliases" / f"{key}.json"
        p.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(p, {"parts": {"alias_of": target}, "data": {"key": target}})

    def launch_point(self, launch_key: str) -> str | None:
        """The completed point that measured this launch (see experiment.launch_identity), or None."""
        p = self.root / "_notes" / "launches" / f"{launch_key}.json"
        if not p.is_file():
            return None
        key = str(json.loads(p.read_text())["data"]["key"])
        return key if self.has(key) else None

    def index_launch(self, launch_key: str, key: str) -> None:
        """Note that key is (or is about to be) the measurement of this launch."""
        p = self.root / "_notes" / "launches" / f"{launch_key}.json"
        p.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(p, {"parts": {"launch": launch_key}, "data": {"key": key}})

    def keys(self) -> list[str]:
        """Keys of every completed point, oldest first (by the start its manifest recorded, so the order survives
        a copy or a clone, which reset file times)."""
        if not self.root.is_dir():
            return []
        done = [p for p in self.root.iterdir() if p.is_dir() and not p.name.startswith((".", "_")) and self.has(p.name)]

        def started(p: Path) -> tuple[float, str]:
            try:
                return float(json.loads((p / MANIFEST).read_text()).get("started_unix") or 0.0), p.name
            except (OSError, ValueError):
                return (p / MANIFEST).stat().st_mtime, p.name
        return [p.name for p in sorted(done, key=started)]

    def points(self, engine: str | None = None, model: dict[str, Any] | None = None) -> Iterator[Point]:
        """Every complete point, oldest first, optionally only of one engine identity and model."""
        for key in self.keys():
            pt = self.get(key)
            if engine is not None and pt.parts.get("engine") != engine:
                continue
            if model is not None and pt.parts.get("model") != model:
                continue
            yield pt

    def get(self, key: str) -> Point:
        """Read a completed point (an alias reads the point it names)."""
        real = self.resolve(key)
        p = self.path(real)
        return Point(real, p, json.loads((p / MANIFEST).read_text()))

    # -- levels written as they finish, kept across failed attempts until the point completes ------------------
    def partial_dir(self, key: str) -> Path:
        """Where the finished levels of a point not yet complete are kept."""
        return self.root / "_partial" / key

    def finished_levels(self, key: str) -> dict[str, Path]:
        """Label -> folder of every level a previous attempt finished and wrote, in the order they were written."""
        d = self.partial_dir(key) / "levels"
        if not d.is_dir():
            return {}
        done = [p for p in d.iterdir() if p.is_dir() and (p / "level.json").is_file()]
        metas = sorted(((json.loads((p / "level.json").read_text()), p) for p in done), key=lambda mp: mp[0]["order"])
        return {m["label"]: p for m, p in metas}

    def put_level(self, key: str, label: str, tables: dict[str, pd.DataFrame], meta: dict[str, Any]) -> Path:
        """Write one finished level (its tables and a level.json) in one rename, so a fault loses at most the level
        in flight."""
        d = self.partial_dir(key) / "levels"
        d.mkdir(parents=True, exist_ok=True)
        order = len(self.finished_levels(key))
        name = "".join(c if c.isalnum() or c in "=._-" else "_" for c in label)
        tmp = d / f".tmp-{name}-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        for t, df in tables.items():
            if df is not None and not df.empty:
                df.to_parquet(tmp / f"{t}.parquet", index=False, compression="zstd")
        atomic_write_json(tmp / "level.json", {**meta, "label": label, "order": order, "written_unix": time.time()})
        final = d / name
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        return final

    def level_tables(self, key: str) -> dict[str, list[pd.DataFrame]]:
        """Every table of the finished levels, by table name, in level order."""
        out: dict[str, list[pd.DataFrame]] = {}
        for p in self.finished_levels(key).values():
            for f in sorted(p.glob("*.parquet")):
                out.setdefault(f.stem, []).append(pd.read_parquet(f))
        return out

    def drop_partial(self, key: str) -> None:
        """Forget the finished levels of key (after the point completes, or to measure it afresh)."""
        shutil.rmtree(self.partial_dir(key), ignore_errors=True)

    def put_note(self, kind: str, parts: dict[str, Any], data: Any) -> Path:
        """Keep a small JSON fact beside the points (a before-launch check's answer), keyed like a point, so an
        offline render reads what the online run decided without the engine."""
        p = self.root / "_notes" / kind / f"{self.key(parts)}.json"
        p.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(p, {"parts": parts, "data": data})
        return p

    def note(self, kind: str, parts: dict[str, Any]) -> Any:
        """A note put_note kept for these parts, or None."""
        p = self.root / "_notes" / kind / f"{self.key(parts)}.json"
        return json.loads(p.read_text())["data"] if p.is_file() else None

    def failed_attempts(self, key: str) -> list[Path]:
        """Folders of earlier failed attempts at key (kept for their logs)."""
        d = self.root / "_failed"
        return sorted(d.glob(f"{key}-*")) if d.is_dir() else []

    def measured_where(self) -> dict[str, Any]:
        """The machine most of the complete points were measured on (host, platform, CPUs, the GPU NVML named and
        how many), and how many points; {} for an empty store."""
        seen: collections.Counter[tuple[str, str, str]] = collections.Counter()
        gpu: dict[str, Any] = {}
        for pt in self.points():
            m = pt.manifest
            seen[(str(m.get("host", "?")), str(m.get("platform", "")).split("-with-")[0], str(m.get("cpu_count", "?")))] += 1
            if not gpu and pt.card:
                gpu = {"gpu": pt.card, "gpus": len(pt.table("telemetry_gpu_static"))}
        if not seen:
            return {}
        (host, plat, cpus), n = seen.most_common(1)[0]
        return {"host": host, "platform": plat, "cpus": cpus, "points": n, **gpu}

    def longest_point_s(self, parts: dict[str, Any]) -> float | None:
        """The longest a complete point like this one took here, launch to teardown: another repetition of the same
        configuration and load where there is one (a graphed launch is not judged by an eager one's length), else a
        launch of the same knobs, then of the same graphs and compile, whose load asked for more levels (less the
        levels this one does not ask for), else of the same engine identity and model with as many replicas and a
        profile armed or not, else any of that engine and model; None when the store holds none (nothing to judge a
        launch's length by)."""
        def shape(p: dict[str, Any]) -> tuple[int, bool]:
            return int((p.get("knobs") or {}).get("replicas", 1)), "profile" in p

        def config(p: dict[str, Any]) -> tuple[Any, ...]:
            return shape(p), json.dumps(p.get("knobs"), sort_keys=True), json.dumps(p.get("load"), sort_keys=True)

        def launch(p: dict[str, Any]) -> tuple[Any, ...]:  # what sets a launch's length: its graphs and compile
            k = p.get("knobs") or {}
            return shape(p), k.get("cuda_graph"), k.get("torch_compile")

        same, fewer, kin, alike, any_ = [], [], [], [], []
        for pt in self.points(parts.get("engine"), parts.get("model")):
            m = pt.manifest
            took = float(m.get("ended_unix") or 0) - float(m.get("started_unix") or 0)
            if took > 0:
                any_.append(took)
                if shape(pt.parts) == shape(parts):
                    alike.append(took)
                if config(pt.parts) == config(parts):
                    same.append(took)
                elif launch(pt.parts) == launch(parts) and (cut := _with_fewer_levels(pt, parts, took)):
                    # 07's search: another scheduler setting of the same graphs, at the top level alone
                    (fewer if config(pt.parts)[:2] == config(parts)[:2] else kin).append(cut)
        return max(same or fewer or kin or alike or any_) if any_ else None

    def slowest_ready_s(self, engine: str | None, model: dict[str, Any] | None) -> float | None:
        """The longest a launch of this engine identity and model took to serve its first token here (its replicas'
        slowest); None where the store holds none."""
        out = []
        for pt in self.points(engine, model):
            for st in [pt.target.get("startup") or {}, *[r.get("startup") or {} for r in pt.target.get("replicas") or []]]:
                if st.get("first_token_s"):
                    out.append(float(st["first_token_s"]))
        return max(out) if out else None

    def failed_manifests(self, engine: str | None = None, model: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """The manifests of every failed attempt kept in _failed/ (optionally of one engine identity and model),
        oldest first, each with its folder's name under 'folder'."""
        d = self.root / "_failed"
        out = []
        for f in sorted(d.iterdir()) if d.is_dir() else []:
            m = f / MANIFEST
            if not m.is_file():
                continue
            man = json.loads(m.read_text())
            parts = man.get("parts") or {}
            if (engine is not None and parts.get("engine") != engine) or (model is not None and parts.get("model") != model):
                continue
            out.append({**man, "folder": f.name})
        return out

    def recorded_death(self, key: str) -> tuple[Path, dict[str, Any]] | None:
        """The newest failed attempt at key that died before it was ready with the engine's own exception (a death
        that repeats: the same launch raises the same way), as (its folder, its manifest); None where there is none."""
        for d in reversed(self.failed_attempts(key)):
            m = d / MANIFEST
            if not m.is_file():
                continue
            man = json.loads(m.read_text())
            cause = man.get("cause") or {}
            if cause.get("exception") and man.get("error_type") in ("ServerExitedError", "RecordedFailure"):
                return d, man
            # a launch that never became ready in its time: minutes each, and the next attempt waits as long
            if man.get("error_type") == "ServerStartTimeout" or man.get("timed_out"):
                return d, man
        return None

    def sweep_abandoned(self) -> list[Path]:
        """Move the temporary folders of writers that died (a killed kernel: its pid is gone) to _failed/, marked
        abandoned, so no half-written folder lingers; returns where they went."""
        moved = []
        if not self.root.is_dir():
            return moved
        for tmp in self.root.glob(".tmp-*"):
            bits = tmp.name.split("-")  # .tmp-<key>-<pid>-<ms>
            if len(bits) < 4 or not bits[2].isdigit() or psutil.pid_exists(int(bits[2])):
                continue
            m = tmp / MANIFEST
            manifest = json.loads(m.read_text()) if m.is_file() else {"key": bits[1]}
            manifest |= {"status": "failed", "error": "abandoned: the process writing this point died "
                         f"(pid {bits[2]}) before it finished"}
            atomic_write_json(m, manifest)
            dest = self.root / "_failed" / f"{bits[1]}-abandoned-{bits[3]}"
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, dest)
            moved.append(dest)
        return moved

    @contextlib.contextmanager
    def writing(self, key: str, parts: dict[str, Any]) -> Iterator[PointWriter]:
        """Yield a writer; on success the point appears complete in one rename, on failure it moves to _failed/."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.sweep_abandoned()
        tmp = self.root / f".tmp-{key}-{os.getpid()}-{int(time.time() * 1e3)}"
        tmp.mkdir()
        w = PointWriter(key, tmp, {
            "key": key, "parts": parts, "servescope_version": __version__, "host": socket.gethostname(),
            "platform": platform.platform(), "cpu_count": os.cpu_count(), "started_unix": time.time(),
            "boot_id": boot_id(),
        })
        try:
            yield w
        except BaseException as e:
            w.manifest |= {"status": "failed", "ended_unix": time.time(),
                           "error": f"{type(e).__name__}: {e}"[-4000:], "traceback": traceback.format_exc()[-8000:],
                           "deaths": [d.as_dict() for d in getattr(e, "deaths", None) or []],
                           "cause": c.as_dict() if (c := getattr(e, "cause", None)) is not None else None,
                           "error_type": type(e).__name__}
            atomic_write_json(tmp / MANIFEST, w.manifest)
            dest = self.root / "_failed" / f"{key}-{time.strftime('%Y%m%d-%H%M%S')}"
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, dest)
            raise
        w.manifest |= {"status": "complete", "ended_unix": time.time()}
        atomic_write_json(tmp / MANIFEST, w.manifest)
        final = self.path(key)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        self.drop_partial(key)


def export_points(src: Store, dest: Path, keep_logs: bool = False) -> list[str]:
    """Copy every complete point of src into dest (e.g. data/reference/store), server logs left out unless asked,
    and the store's notes."""
    dest = Path(dest)
    copied = []
    for p in sorted(src.root.iterdir()) if src.root.is_dir() else []:
        if p.name.startswith((".", "_")) or not src.has(p.name):
            continue
        ignore = None if keep_logs else shutil.ignore_patterns(STDOUT_LOG, STDERR_LOG)
        target = dest / p.name
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(p, target, ignore=ignore)
        copied.append(p.name)
    if (src.root / "_notes").is_dir():  # before-launch checks and probe answers: offline renders read them
        shutil.copytree(src.root / "_notes", dest / "_notes", dirs_exist_ok=True)
    return copied


def _with_fewer_levels(pt: Point, parts: dict[str, Any], took: float) -> float | None:
    """How long a stored launch of the same configuration would have taken under parts' load, where that load differs
    from its own only in asking for some of its levels (07's search: the top level alone): its length less the levels
    not asked for (each level's own length, as its summary says); None otherwise."""
    mine, want = dict(pt.parts.get("load") or {}), dict(parts.get("load") or {})
    have, asked = mine.pop("concurrency", None), want.pop("concurrency", None)
    if mine != want or not have or not asked or not set(asked) < set(have):
        return None
    s = pt.table("summary")
    if s.empty or "level_s" not in s or "concurrency" not in s or not set(have) <= set(s["concurrency"]):
        return None
    dropped = float(s.loc[~s["concurrency"].isin(asked), "level_s"].sum())
    return took - dropped if 0 < dropped < took else None
