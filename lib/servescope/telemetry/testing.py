"""A fake NVML for tests and for benchmarks on machines without a GPU: it replaces pynvml's functions and keeps
its real constants, error classes and structures. Never used for measurements.

    with fake_nvml([FakeGpu(power_w=120)]):
        ...  # code that imports pynvml sees one GPU
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml


@dataclass
class FakeGpu:
    """One fake GPU's state; change attributes while a sampler runs to script a scenario."""

    name: str = "NVIDIA H200"
    uuid: str = ""
    power_w: float = 100.0
    power_limit_w: float = 700.0
    sm_clock_mhz: float = 1980.0
    sm_clock_max_mhz: float = 1980.0
    mem_clock_mhz: float = 3201.0
    gpu_util_pct: float = 0.0
    mem_util_pct: float = 0.0
    temp_c: float = 40.0
    pstate: int = 0
    clock_event_mask: int = 0
    mem_used_mib: float = 1000.0
    mem_total_mib: float = 143771.0
    sm_active_pct: float = 0.0  # GPM metrics (reported where `gpm` is True, as Hopper does)
    sm_occupancy_pct: float = 0.0
    dram_bw_util_pct: float = 0.0
    tensor_active_pct: float = 0.0
    gpm: bool = True
    compute_mode: int = 0  # NVML_COMPUTEMODE_DEFAULT
    mig_enabled: bool = False
    compute_capability: tuple[int, int] = (9, 0)
    procs: dict[int, float] = field(default_factory=dict)  # pid -> GPU memory it holds (MiB)
    mps_procs: dict[int, float] = field(default_factory=dict)  # MPS clients: pid -> MiB
    unsupported: set[str] = field(default_factory=set)  # function names that raise NVMLError_NotSupported
    _energy_mj: float = 0.0
    _t: float = field(default_factory=time.monotonic)

    def energy_mj(self) -> int:
        now = time.monotonic()
        self._energy_mj += self.power_w * (now - self._t) * 1e3
        self._t = now
        return int(self._energy_mj)


def _fake_functions(gpus: list[FakeGpu]) -> dict[str, Any]:
    """pynvml's functions as the fake GPUs answer them, by name."""
    def dev(h: Any) -> FakeGpu:
        return gpus[h]

    def field_values(h: int, ids: list[int]) -> Any:
        arr = (pynvml.c_nvmlFieldValue_t * len(ids))()
        for i, fid in enumerate(ids):
            arr[i].fieldId = fid
            arr[i].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
            arr[i].nvmlReturn = pynvml.NVML_SUCCESS
            arr[i].value.uiVal = int(dev(h).power_w * 1e3)
        return arr

    last_gpm = [0]

    def gpm_get(h: int, sample: Any) -> Any:
        last_gpm[0] = h  # the fake reports the state of the GPU sampled last, as of the metrics call
        return sample

    def gpm_metrics(mg: Any) -> Any:
        g = dev(last_gpm[0])
        by_id = {pynvml.NVML_GPM_METRIC_SM_UTIL: g.sm_active_pct, pynvml.NVML_GPM_METRIC_SM_OCCUPANCY:
                 g.sm_occupancy_pct, pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: g.dram_bw_util_pct,
                 pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: g.tensor_active_pct}
        for i in range(mg.numMetrics):
            mg.metrics[i].nvmlReturn = pynvml.NVML_SUCCESS
            mg.metrics[i].value = by_id.get(mg.metrics[i].metricId, 0.0)
        return mg

    clock = {pynvml.NVML_CLOCK_SM: "sm_clock_mhz", pynvml.NVML_CLOCK_MEM: "mem_clock_mhz"}
    return {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": lambda: len(gpus),
        "nvmlDeviceGetHandleByIndex": lambda i: i,
        "nvmlDeviceGetUUID": lambda h: dev(h).uuid,
        "nvmlDeviceGetName": lambda h: dev(h).name,
        "nvmlSystemGetDriverVersion": lambda: "580.159.04 (fake)",
        "nvmlDeviceGetEnforcedPowerLimit": lambda h: int(dev(h).power_limit_w * 1e3),
        "nvmlDeviceGetPowerManagementDefaultLimit": lambda h: int(dev(h).power_limit_w * 1e3),
        "nvmlDeviceGetMaxClockInfo": lambda h, c: dev(h).sm_clock_max_mhz if c == pynvml.NVML_CLOCK_SM else 3201,
        "nvmlDeviceGetMemoryInfo": lambda h: SimpleNamespace(used=int(dev(h).mem_used_mib * 2**20),
                                                             total=int(dev(h).mem_total_mib * 2**20)),
        "nvmlDeviceGetFieldValues": field_values,
        "nvmlDeviceGetPowerUsage": lambda h: int(dev(h).power_w * 1e3),
        "nvmlDeviceGetTotalEnergyConsumption": lambda h: dev(h).energy_mj(),
        "nvmlDeviceGetClockInfo": lambda h, c: getattr(dev(h), clock[c]),
        "nvmlDeviceGetUtilizationRates": lambda h: SimpleNamespace(gpu=dev(h).gpu_util_pct, memory=dev(h).mem_util_pct),
        "nvmlDeviceGetTemperature": lambda h, s: dev(h).temp_c,
        "nvmlDeviceGetPerformanceState": lambda h: dev(h).pstate,
        "nvmlDeviceGetCurrentClocksEventReasons": lambda h: dev(h).clock_event_mask,
        "nvmlDeviceGetCurrentClocksThrottleReasons": lambda h: dev(h).clock_event_mask,
        "nvmlDeviceGetPcieThroughput": lambda h, c: 1000,
        "nvmlGpmQueryDeviceSupport": lambda h: SimpleNamespace(isSupportedDevice=int(dev(h).gpm)),
        "nvmlGpmSampleAlloc": lambda: pynvml.c_nvmlGpmSample_t(),
        "nvmlGpmSampleFree": lambda s: None,
        "nvmlGpmSampleGet": gpm_get,
        "nvmlGpmMetricsGet": gpm_metrics,
    } | _fake_sharing(dev)


def _fake_sharing(dev: Any) -> dict[str, Any]:
    """What decides GPU sharing, and who holds GPU memory, as the fake GPUs answer it."""
    def procs(table: dict[int, float]) -> list[Any]:
        return [SimpleNamespace(pid=p, usedGpuMemory=int(m * 2**20)) for p, m in table.items()]

    return {
        "nvmlDeviceGetComputeMode": lambda h: dev(h).compute_mode,
        "nvmlDeviceGetMigMode": lambda h: [int(dev(h).mig_enabled), int(dev(h).mig_enabled)],
        "nvmlDeviceGetCudaComputeCapability": lambda h: dev(h).compute_capability,
        "nvmlDeviceGetComputeRunningProcesses": lambda h: procs(dev(h).procs),
        "nvmlDeviceGetMPSComputeRunningProcesses": lambda h: procs(dev(h).mps_procs),
    }


@contextlib.contextmanager
def fake_nvml(gpus: list[FakeGpu], init_error: Exception | None = None) -> Iterator[list[FakeGpu]]:
    """Patch pynvml's functions for the duration of the block."""
    for i, g in enumerate(gpus):
        g.uuid = g.uuid or f"GPU-00000000-0000-0000-0000-{i:012d}"

    def guard(name: str, fn: Any) -> Any:
        def call(*args: Any) -> Any:
            if init_error is not None and name != "nvmlShutdown":
                raise init_error
            if args and isinstance(args[0], int) and name.startswith("nvmlDevice") and name != \
                    "nvmlDeviceGetHandleByIndex" and name in gpus[args[0]].unsupported:
                raise pynvml.NVMLError_NotSupported(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return fn(*args)
        return call

    fns = _fake_functions(gpus)
    saved = {k: getattr(pynvml, k) for k in fns}
    try:
        for k, fn in fns.items():
            setattr(pynvml, k, guard(k, fn))
        yield gpus
    finally:
        for k, fn in saved.items():
            setattr(pynvml, k, fn)
