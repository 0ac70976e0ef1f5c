"""The one place that talks to NVML (nvidia-ml-py, imported as pynvml): device selection, reads, error mapping.

A read the GPU does not support (or that fails) is a missing value with its reason kept once per field; it never
stops a sweep. No NVML at all (no driver, no GPU) is NvmlUnavailable with the reason, raised at start.
"""

from __future__ import annotations

import logging
import math
import os
import time
from typing import Any

import pynvml

from ..errors import ServescopeError
from .base import Phase, Sampler

log = logging.getLogger(__name__)

# Clock event ("throttle") reason bits, as nvml.h names them.
REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
NAN = float("nan")
COMPUTE_MODES = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}

# GPM (GPU performance monitoring, Hopper and newer): each is a share of the interval between two GPM samples.
GPM_METRICS = {
    "sm_active_pct": pynvml.NVML_GPM_METRIC_SM_UTIL,  # SMs with at least one warp resident
    "sm_occupancy_pct": pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,  # resident warps / the SMs' maximum
    "dram_bw_util_pct": pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL,  # DRAM bandwidth used / the GPU's peak
    "tensor_active_pct": pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,  # any tensor pipe active
}


class NvmlUnavailable(ServescopeError):
    """No usable NVML here: no NVIDIA driver, no GPU, or the library failed to load."""


def decode_reasons(mask: int | float | None) -> list[str]:
    """Names of the clock event reasons set in a bit mask."""
    if mask is None or (isinstance(mask, float) and math.isnan(mask)):
        return []
    m = int(mask)
    return [name for bit, name in REASONS.items() if m & bit]


def visible_nvml_indices(count: int, uuids: list[str], env: str | None = None) -> list[int]:
    """NVML indices of the GPUs CUDA_VISIBLE_DEVICES selects (integers or GPU-UUIDs), in its order; all if unset.

    Integers are taken as NVML (PCI bus) order, which is what CUDA uses with CUDA_DEVICE_ORDER=PCI_BUS_ID."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES") if env is None else env
    if env is None or env.strip() == "":
        return list(range(count)) if env is None else []
    out: list[int] = []
    for tok in (t.strip() for t in env.split(",")):
        if not tok:
            continue
        if tok.isdigit():
            i = int(tok)
            if i >= count:
                break  # CUDA stops at the first invalid entry
            out.append(i)
        else:
            match = [i for i, u in enumerate(uuids) if u.startswith(tok) or u == f"GPU-{tok}"]
            if not match:
                break
            out.append(match[0])
    return out


class Nvml:
    """An initialised NVML session over the chosen GPUs (default: those CUDA_VISIBLE_DEVICES, or the value given
    for it, selects)."""

    def __init__(self, indices: list[int] | None = None, cuda_visible_devices: str | None = None) -> None:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise NvmlUnavailable(f"NVML could not initialise: {e}") from None
        except OSError as e:  # the shared library is missing
            raise NvmlUnavailable(f"NVML library not found: {e}") from None
        try:
            count = pynvml.nvmlDeviceGetCount()
            all_handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            uuids = [_str(pynvml.nvmlDeviceGetUUID(h)) for h in all_handles]
        except pynvml.NVMLError as e:
            pynvml.nvmlShutdown()
            raise NvmlUnavailable(f"NVML could not list GPUs: {e}") from None
        chosen = indices if indices is not None else visible_nvml_indices(count, uuids, cuda_visible_devices)
        bad = [i for i in chosen if not 0 <= i < count]
        if bad:
            pynvml.nvmlShutdown()
            raise NvmlUnavailable(f"GPU indices {bad} do not exist (NVML sees {count})")
        if not chosen:
            pynvml.nvmlShutdown()
            raise NvmlUnavailable("no NVIDIA GPU visible" + (f" (NVML sees {count}; CUDA_VISIBLE_DEVICES hides them)"
                                                             if count else ""))
        self.indices = chosen
        self.handles = [all_handles[i] for i in chosen]
        self.uuids = [uuids[i] for i in chosen]
        self.errors: dict[str, str] = {}  # field -> why it is missing (first reason seen)
        self._supported: dict[tuple[int, str], bool] = {}
        self._gpm: dict[int, list[Any] | None] = {}  # GPU -> [previous sample, spare sample] or None (no GPM)
        self._gpm_have_prev: dict[int, bool] = {}

    def gpm_supported(self, g: int) -> bool:
        """Whether GPU number g offers GPM metrics (allocates its two sample buffers the first time)."""
        if g not in self._gpm:
            self._gpm[g] = None
            support = self._q("gpm", g, pynvml.nvmlGpmQueryDeviceSupport, self.handles[g])
            if support is not None and not support.isSupportedDevice:
                self.errors.setdefault("gpm", "GPM not supported by this GPU (it needs Hopper or newer)")
            elif support is not None:
                a = self._q("gpm", g, pynvml.nvmlGpmSampleAlloc)
                b = self._q("gpm", g, pynvml.nvmlGpmSampleAlloc)
                if a is not None and b is not None:
                    self._gpm[g] = [a, b]
                    self._gpm_have_prev[g] = False
        return self._gpm[g] is not None

    def read_gpm(self, g: int) -> dict[str, float]:
        """SM activity, occupancy, DRAM bandwidth and tensor activity since the previous call (NaN on the first
        call, or where the GPU has no GPM)."""
        out = dict.fromkeys(GPM_METRICS, NAN)
        if not self.gpm_supported(g):
            return out
        bufs = self._gpm[g]
        assert bufs is not None
        prev, cur = bufs
        if self._q("gpm", g, pynvml.nvmlGpmSampleGet, self.handles[g], cur) is None:
            return out
        if self._gpm_have_prev[g]:
            mg = pynvml.c_nvmlGpmMetricsGet_t()
            mg.version = pynvml.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = len(GPM_METRICS)
            mg.sample1, mg.sample2 = prev, cur
            for i, mid in enumerate(GPM_METRICS.values()):
                mg.metrics[i].metricId = mid
            res = self._q("gpm", g, pynvml.nvmlGpmMetricsGet, mg)
            if res is not None:
                for i, name in enumerate(GPM_METRICS):
                    m = res.metrics[i]
                    if m.nvmlReturn == pynvml.NVML_SUCCESS:
                        out[name] = float(m.value)
                    else:
                        self.errors.setdefault(name, f"nvmlGpmMetricsGet returned {m.nvmlReturn}")
        bufs[0], bufs[1] = cur, prev
        self._gpm_have_prev[g] = True
        return out

    def close(self) -> None:
        """Free GPM buffers and shut NVML down."""
        for bufs in self._gpm.values():
            for b in bufs or []:
                try:
                    pynvml.nvmlGpmSampleFree(b)
                except pynvml.NVMLError:
                    pass
        self._gpm.clear()
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass

    def _q(self, field: str, gpu: int, fn: Any, *args: Any) -> Any:
        """One NVML call; its failure becomes a missing value (and, once, a reason)."""
        if self._supported.get((gpu, field)) is False:
            return None
        try:
            v = fn(*args)
            self._supported[(gpu, field)] = True
            return v
        except pynvml.NVMLError as e:
            reason = f"{type(e).__name__}: {e}"
            self.errors.setdefault(field, reason)
            if isinstance(e, (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound,
                              pynvml.NVMLError_NoPermission)):
                self._supported[(gpu, field)] = False  # never ask again: it will not start working
            return None

    def static(self) -> list[dict[str, Any]]:
        """What does not change during a run: name, UUID, limits and maxima, memory size."""
        out = []
        for g, (i, h) in enumerate(zip(self.indices, self.handles, strict=True)):
            mem = self._q("mem_total", g, pynvml.nvmlDeviceGetMemoryInfo, h)
            out.append({
                "gpu": i, "uuid": self.uuids[g], "name": _str(self._q("name", g, pynvml.nvmlDeviceGetName, h)),
                "driver": _str(self._q("driver", g, pynvml.nvmlSystemGetDriverVersion)),
                "power_limit_w": _mw(self._q("power_limit", g, pynvml.nvmlDeviceGetEnforcedPowerLimit, h)),
                "power_default_limit_w": _mw(self._q("power_default_limit", g,
                                                     pynvml.nvmlDeviceGetPowerManagementDefaultLimit, h)),
                "sm_clock_max_mhz": _num(self._q("sm_clock_max", g, pynvml.nvmlDeviceGetMaxClockInfo, h,
                                                 pynvml.NVML_CLOCK_SM)),
                "mem_clock_max_mhz": _num(self._q("mem_clock_max", g, pynvml.nvmlDeviceGetMaxClockInfo, h,
                                                  pynvml.NVML_CLOCK_MEM)),
                "mem_total_mib": mem.total / 2**20 if mem is not None else NAN,
            })
        return out

    def facts(self) -> list[dict[str, Any]]:
        """What decides whether replicas can share each GPU: compute mode, MIG, compute capability and memory
        (None where NVML does not say)."""
        out = []
        for g, (i, h) in enumerate(zip(self.indices, self.handles, strict=True)):
            mode = self._q("compute_mode", g, pynvml.nvmlDeviceGetComputeMode, h)
            mig = self._q("mig_mode", g, pynvml.nvmlDeviceGetMigMode, h)
            cc = self._q("compute_capability", g, pynvml.nvmlDeviceGetCudaComputeCapability, h)
            mem = self._q("memory", g, pynvml.nvmlDeviceGetMemoryInfo, h)
            out.append({"gpu": i, "compute_mode": COMPUTE_MODES.get(mode, str(mode)) if mode is not None else None,
                        "mig_enabled": bool(mig[0]) if mig is not None else None,
                        "compute_capability": tuple(cc) if cc is not None else None,
                        "mem_total_mib": mem.total / 2**20 if mem is not None else None,
                        "mem_free_mib": (mem.total - mem.used) / 2**20 if mem is not None else None})
        return out

    def processes(self, g: int) -> list[dict[str, Any]]:
        """The processes with a compute context on GPU number g and the GPU memory each holds (MPS clients listed
        as such; NaN where the driver does not say, as under MPS on some drivers)."""
        h = self.handles[g]
        out: list[dict[str, Any]] = []
        for kind, fn in (("compute", pynvml.nvmlDeviceGetComputeRunningProcesses),
                         ("mps", getattr(pynvml, "nvmlDeviceGetMPSComputeRunningProcesses", None))):
            if fn is None:
                continue
            for p in self._q(f"processes_{kind}", g, fn, h) or []:
                used = getattr(p, "usedGpuMemory", None)
                out.append({"gpu": self.indices[g], "pid": int(p.pid), "context": kind,
                            "used_gpu_mem_mib": used / 2**20 if isinstance(used, int) and used < 2**62 else NAN})
        return out

    def read(self, g: int, pcie: bool = False, energy: bool = True, gpm: bool = True) -> dict[str, Any]:
        """One reading of GPU number g (position in self.indices); the costly reads only when asked."""
        h = self.handles[g]
        row: dict[str, Any] = {"gpu": self.indices[g]}
        if gpm:
            row.update(self.read_gpm(g))
        fields = self._q("power_fields", g, pynvml.nvmlDeviceGetFieldValues, h,
                         [pynvml.NVML_FI_DEV_POWER_INSTANT, pynvml.NVML_FI_DEV_POWER_AVERAGE])
        inst = avg = NAN
        if fields is not None:
            inst, avg = (_field_mw(f) for f in fields)
        row["power_w"] = _mw(self._q("power", g, pynvml.nvmlDeviceGetPowerUsage, h))
        row["power_instant_w"] = inst
        row["power_avg_w"] = avg
        row["power_limit_w"] = _mw(self._q("power_limit", g, pynvml.nvmlDeviceGetEnforcedPowerLimit, h))
        mj = self._q("energy", g, pynvml.nvmlDeviceGetTotalEnergyConsumption, h) if energy else None
        row["energy_j"] = mj / 1e3 if mj is not None else NAN
        row["sm_clock_mhz"] = _num(self._q("sm_clock", g, pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM))
        row["mem_clock_mhz"] = _num(self._q("mem_clock", g, pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_MEM))
        util = self._q("utilization", g, pynvml.nvmlDeviceGetUtilizationRates, h)
        row["gpu_util_pct"] = float(util.gpu) if util is not None else NAN
        row["mem_util_pct"] = float(util.memory) if util is not None else NAN
        row["temp_c"] = _num(self._q("temperature", g, pynvml.nvmlDeviceGetTemperature, h,
                                     pynvml.NVML_TEMPERATURE_GPU))
        row["pstate"] = _num(self._q("pstate", g, pynvml.nvmlDeviceGetPerformanceState, h))
        getter = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) \
            or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
        row["clock_event_mask"] = _num(self._q("clock_events", g, getter, h))
        mem = self._q("memory", g, pynvml.nvmlDeviceGetMemoryInfo, h)
        row["mem_used_mib"] = mem.used / 2**20 if mem is not None else NAN
        row["mem_total_mib"] = mem.total / 2**20 if mem is not None else NAN
        if pcie:  # each PCIe read takes a 20 ms measurement window inside the driver, so it is read sparsely
            tx = self._q("pcie_tx", g, pynvml.nvmlDeviceGetPcieThroughput, h, pynvml.NVML_PCIE_UTIL_TX_BYTES)
            rx = self._q("pcie_rx", g, pynvml.nvmlDeviceGetPcieThroughput, h, pynvml.NVML_PCIE_UTIL_RX_BYTES)
            row["pcie_tx_mb_s"] = tx / 1e3 if tx is not None else NAN
            row["pcie_rx_mb_s"] = rx / 1e3 if rx is not None else NAN
        else:
            row["pcie_tx_mb_s"] = row["pcie_rx_mb_s"] = NAN
        return row


class NvmlSampler(Sampler):
    """Reads every chosen GPU at rate_hz (default 10, up to 100).

    Two reads are costly on a real H200 (measured with benchmarks/gpu/nvml_calls.py): the total-energy counter
    takes about 3 ms of CPU per call and PCIe throughput blocks for a 20 ms window; every other read takes a few
    microseconds. So the energy counter is read at energy_hz and on the first tick of every new phase (a phase's
    energy is the counter's difference between its boundaries), and PCIe at pcie_hz."""

    name = "nvml"
    closes_phases = True

    def __init__(self, rate_hz: float = 10.0, indices: list[int] | None = None, phase: Phase | None = None,
                 pcie_hz: float = 0.2, energy_hz: float = 0.1, gpm: bool = True, procs_hz: float = 1.0) -> None:
        if rate_hz > 100:
            raise ValueError("NVML sampling above 100 Hz measures NVML more than the GPU; use at most 100")
        super().__init__(rate_hz, phase)
        self.indices = indices
        self.pcie_hz = pcie_hz
        self.energy_hz = energy_hz
        self.gpm = gpm
        self.nvml: Nvml | None = None
        self.static: list[dict[str, Any]] = []
        self.procs_hz = procs_hz
        self.proc_rows: list[dict[str, Any]] = []  # GPU memory per process (gpu_procs), read at procs_hz
        self._next_pcie = 0.0
        self._next_energy = 0.0
        self._next_procs = 0.0
        self._last_phase: str | None = None

    def setup(self) -> None:
        """Open NVML on the sampler's thread (NVML handles are process-wide, so reading from here is fine)."""
        self.nvml = Nvml(self.indices)
        self.static = self.nvml.static()

    def teardown(self) -> None:
        """Close NVML, keeping its per-field reasons."""
        if self.nvml is not None:
            self.errors.update({f"nvml:{k}": v for k, v in self.nvml.errors.items()})
            self.nvml.close()

    def sample(self, now_unix: float, phase: str) -> list[dict[str, Any]]:
        """One row per GPU."""
        assert self.nvml is not None
        now = time.monotonic()
        pcie = self.pcie_hz > 0 and now >= self._next_pcie
        if pcie:
            self._next_pcie = now + 1.0 / self.pcie_hz
        energy = phase != self._last_phase or (self.energy_hz > 0 and now >= self._next_energy)
        if energy:
            self._next_energy = now + 1.0 / self.energy_hz if self.energy_hz > 0 else float("inf")
        self._last_phase = phase
        procs = self.procs_hz > 0 and now >= self._next_procs
        if procs:
            self._next_procs = now + 1.0 / self.procs_hz
        rows = []
        for g in range(len(self.nvml.handles)):
            r = self.nvml.read(g, pcie=pcie, energy=energy, gpm=self.gpm)
            r["time_unix"] = now_unix
            r["phase"] = phase
            rows.append(r)
            if procs:
                self.proc_rows += [p | {"time_unix": now_unix, "phase": phase} for p in self.nvml.processes(g)]
        return rows


def _str(v: Any) -> str:
    if v is None:
        return ""
    return v.decode() if isinstance(v, bytes) else str(v)


def _num(v: Any) -> float:
    return float(v) if v is not None else NAN


def _mw(v: Any) -> float:
    return float(v) / 1e3 if v is not None else NAN


def _field_mw(f: Any) -> float:
    if f.nvmlReturn != pynvml.NVML_SUCCESS:
        return NAN
    vt = f.valueType
    v = {pynvml.NVML_VALUE_TYPE_DOUBLE: f.value.dVal, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: f.value.uiVal,
         pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: f.value.ulVal,
         pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: f.value.ullVal}.get(vt)
    return float(v) / 1e3 if v is not None else NAN
