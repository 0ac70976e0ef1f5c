"""Telemetry sampled in the background while load runs: GPU (NVML), host (psutil), server and DCGM metrics."""

from .monitor import Telemetry
from .nvml import Nvml, NvmlUnavailable, decode_reasons

__all__ = ["Nvml", "NvmlUnavailable", "Telemetry", "decode_reasons"]
