"""Device counting for launches: the GPUs NVML sees under a launch's CUDA_VISIBLE_DEVICES, or a CPU build's cores."""

from __future__ import annotations

import os

from ..errors import KnobError
from ..mps import GpuFacts


def visible_devices(platform: str, env: dict[str, str]) -> tuple[int | None, str]:
    """How many devices a launch on this platform may use, and their name: GPUs NVML sees under the launch's
    CUDA_VISIBLE_DEVICES (None where NVML cannot tell), or cores this process may run on for a CPU build."""
    if platform == "cpu":
        return len(os.sched_getaffinity(0)), "CPU cores"
    if platform != "cuda":
        return None, "devices"
    from ..telemetry.nvml import Nvml, NvmlUnavailable

    try:
        n = Nvml(cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES"))
    except NvmlUnavailable as e:
        return (0, "GPUs") if "no NVIDIA GPU visible" in str(e) else (None, "GPUs")
    n.close()
    return len(n.indices), "GPUs"


def device_ids(platform: str, env: dict[str, str]) -> list[int]:
    """The devices a launch may use, by id: GPU indices under the launch's CUDA_VISIBLE_DEVICES (as the server will
    number them: 0..n-1 are positions in that list), or the cores this process may run on for a CPU build."""
    if platform == "cpu":
        return sorted(os.sched_getaffinity(0))
    have, _ = visible_devices(platform, env)
    if have is None:
        raise KnobError("cannot count the GPUs here (NVML unavailable), so replicas cannot be placed")
    cvd = env.get("CUDA_VISIBLE_DEVICES") or os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [x.strip() for x in cvd.split(",") if x.strip()] if cvd else [str(i) for i in range(have)]
    return [int(x) if x.isdigit() else i for i, x in enumerate(ids[:have])]


def gpu_facts(env: dict[str, str]) -> list[GpuFacts]:
    """Compute mode, MIG, compute capability and memory of each GPU a launch under env would see (NVML); [] where
    NVML sees none or cannot be read."""
    from ..telemetry.nvml import Nvml, NvmlUnavailable

    try:
        n = Nvml(cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES"))
    except NvmlUnavailable:
        return []
    try:
        return [GpuFacts(f["gpu"], f["compute_mode"], f["mig_enabled"], f["compute_capability"], f["mem_total_mib"],
                         f["mem_free_mib"]) for f in n.facts()]
    finally:
        n.close()


def core_blocks(n: int, spare: int = 2) -> list[tuple[int, ...]]:
    """This process's cores in n contiguous blocks, one per replica's host threads, keeping `spare` cores free for
    the load client and the samplers where there are enough (2n + spare or more); KnobError with fewer cores than
    replicas."""
    cores = sorted(os.sched_getaffinity(0))
    keep = spare if len(cores) >= 2 * n + spare else 0
    per = (len(cores) - keep) // n
    if per < 1:
        raise KnobError(f"{n} replicas are each pinned to cores of their own; {len(cores)} cores here")
    return [tuple(cores[r * per:(r + 1) * per]) for r in range(n)]


def core_words(cores: tuple[int, ...]) -> str:
    """'0-6' for a contiguous block, '0,2,5' otherwise."""
    if len(cores) > 2 and list(cores) == list(range(cores[0], cores[-1] + 1)):
        return f"{cores[0]}-{cores[-1]}"
    return ",".join(map(str, cores))
