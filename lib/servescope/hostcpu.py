"""The host CPU as a CPU engine sees it: model, the instruction-set extensions that pick its kernels, a fingerprint."""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import platform
from functools import cache

# Extensions that decide which kernels a CPU build of an engine runs (vLLM CPU: _C_AVX2, _C_AVX512 or _C with AMX paths)
ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")
_ARCH_GET_XCOMP_SUPP = 0x1021
_XFEATURE_XTILEDATA = 18
_SYS_ARCH_PRCTL = 158  # x86-64


@cache
def _cpuinfo() -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if not line.strip():
                    break  # the first processor is enough
                k, _, v = line.partition(":")
                out[k.strip()] = v.strip()
    except OSError:
        pass
    return out


def cpu_model() -> str:
    """'AMD EPYC', 'Intel(R) Xeon(R) Processor', ... (platform.processor() where /proc/cpuinfo is missing)."""
    return _cpuinfo().get("model name") or platform.processor() or "unknown"


def isa() -> dict[str, bool]:
    """Which of ISA_FLAGS the CPU reports."""
    flags = set(_cpuinfo().get("flags", "").split())
    return {f: f in flags for f in ISA_FLAGS}


def isa_text() -> str:
    """'avx2 avx512f avx512_bf16' (the reported ones only), or 'none of ...'."""
    have = [f for f, ok in isa().items() if ok]
    return " ".join(have) if have else f"none of {' '.join(ISA_FLAGS)}"


def amx_tile_data_supported_by_kernel() -> bool | None:
    """Whether Linux offers AMX tile data to processes that ask (arch_prctl ARCH_GET_XCOMP_SUPP); None off x86-64 Linux."""
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    mask = ctypes.c_uint64(0)
    if libc.syscall(_SYS_ARCH_PRCTL, _ARCH_GET_XCOMP_SUPP, ctypes.byref(mask)) != 0:
        return None
    return bool(mask.value >> _XFEATURE_XTILEDATA & 1)


def amx_note() -> str:
    """What AMX means for a CPU engine here, in one sentence."""
    if not isa()["amx_tile"]:
        return "no AMX: CPU engines take their AVX-512/AVX2 paths; servescope asks for nothing"
    kernel = amx_tile_data_supported_by_kernel()
    if not kernel:
        return "AMX reported, but Linux does not offer tile data: CPU engines cannot use AMX here"
    return ("AMX reported and offered by Linux: a process must ask (arch_prctl ARCH_REQ_XCOMP_PERM) before its first "
            "tile instruction or it dies from SIGILL; vLLM CPU's bfloat16 kernels do not ask, so every Python process "
            "of a server servescope launches asks at start (engine_site/sitecustomize.py)")


def fingerprint() -> str:
    """Short hash of what makes kernels behave differently across CPUs: vendor, family/model/stepping, model name, ISA."""
    info = _cpuinfo()
    parts = [info.get(k, "") for k in ("vendor_id", "cpu family", "model", "stepping", "model name")]
    parts.append(isa_text())
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:12]
