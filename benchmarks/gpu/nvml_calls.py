"""Time each NVML call the sampler makes, on a real GPU: wall and CPU microseconds per call (median of N)."""

from __future__ import annotations

import statistics
import time

import pynvml as n

n.nvmlInit()
h = n.nvmlDeviceGetHandleByIndex(0)
getter = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", n.nvmlDeviceGetCurrentClocksThrottleReasons)
calls = {
    "GetPowerUsage": lambda: n.nvmlDeviceGetPowerUsage(h),
    "GetFieldValues(power instant+avg)": lambda: n.nvmlDeviceGetFieldValues(h, [n.NVML_FI_DEV_POWER_INSTANT,
                                                                                n.NVML_FI_DEV_POWER_AVERAGE]),
    "GetEnforcedPowerLimit": lambda: n.nvmlDeviceGetEnforcedPowerLimit(h),
    "GetTotalEnergyConsumption": lambda: n.nvmlDeviceGetTotalEnergyConsumption(h),
    "GetClockInfo(SM)": lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM),
    "GetClockInfo(MEM)": lambda: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM),
    "GetUtilizationRates": lambda: n.nvmlDeviceGetUtilizationRates(h),
    "GetTemperature": lambda: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU),
    "GetPerformanceState": lambda: n.nvmlDeviceGetPerformanceState(h),
    "GetCurrentClocksEventReasons": lambda: getter(h),
    "GetMemoryInfo": lambda: n.nvmlDeviceGetMemoryInfo(h),
    "GetPcieThroughput(TX)": lambda: n.nvmlDeviceGetPcieThroughput(h, n.NVML_PCIE_UTIL_TX_BYTES),
}
print(f"{'call':38} {'wall_us':>9} {'cpu_us':>9}")
for name, fn in calls.items():
    k = 10 if "Pcie" in name else 200
    walls, cpus = [], []
    for _ in range(k):
        w0, c0 = time.perf_counter(), time.thread_time()
        try:
            fn()
        except n.NVMLError as e:
            print(f"{name:38} error {e}")
            break
        walls.append((time.perf_counter() - w0) * 1e6)
        cpus.append((time.thread_time() - c0) * 1e6)
    if walls:
        print(f"{name:38} {statistics.median(walls):>9.0f} {statistics.median(cpus):>9.0f}")
n.nvmlShutdown()
