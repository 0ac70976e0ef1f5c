"""Run at start by every Python process of a server servescope launches (this folder leads the server's PYTHONPATH).

Linux (5.16+) lets a process use AMX tile data only after it asks (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA);
one that has not asked dies from SIGILL at its first tile instruction. vLLM 0.32's CPU kernels (bfloat16 attention,
fused MoE) pick AMX paths whenever the CPU reports AMX but never ask, so an eager worker died on AMX Xeons
(lib/servescope/engines/vllm_cpu.md). The permission is per process and cleared on exec, so each interpreter of
the server tree (spawned workers included) asks here, before any engine code runs. Where the kernel offers no
AMX tile data, nothing is asked and nothing changes. SERVESCOPE_AMX_PERMISSION=0 turns this off.

It also raises the level of loggers an engine keeps below what it logs by default, where the engine offers no switch
for them: SERVESCOPE_LOGGER_LEVELS="name=LEVEL,..." (transformers 5.17's continuous batching logs its CUDA-graph
decision at INFO on its own 'ContinuousBatchingLogger', which `--log-level` does not reach).

This file runs inside the engine's interpreter, which does not have servescope installed: standard library only.
"""

import os
import sys

_ARCH_PRCTL = 158  # x86-64 syscall number
_GET_XCOMP_SUPP, _GET_XCOMP_PERM, _REQ_XCOMP_PERM = 0x1021, 0x1022, 0x1023
_XTILEDATA = 18


def _ask_for_amx() -> str:
    if os.environ.get("SERVESCOPE_AMX_PERMISSION", "1") == "0":
        return "off: SERVESCOPE_AMX_PERMISSION=0"
    if sys.platform != "linux" or os.uname().machine != "x86_64":
        return "not x86-64 Linux: nothing to ask"
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    mask = ctypes.c_uint64(0)
    if libc.syscall(ctypes.c_long(_ARCH_PRCTL), ctypes.c_long(_GET_XCOMP_SUPP), ctypes.byref(mask)) != 0:
        return f"not asked: the kernel does not list extended features (errno {ctypes.get_errno()})"
    if not (mask.value >> _XTILEDATA) & 1:
        return "not asked: no AMX tile data on this CPU"
    if libc.syscall(ctypes.c_long(_ARCH_PRCTL), ctypes.c_long(_REQ_XCOMP_PERM), ctypes.c_long(_XTILEDATA)) != 0:
        return f"refused: ARCH_REQ_XCOMP_PERM failed (errno {ctypes.get_errno()})"
    perm = ctypes.c_uint64(0)
    libc.syscall(ctypes.c_long(_ARCH_PRCTL), ctypes.c_long(_GET_XCOMP_PERM), ctypes.byref(perm))
    return "granted" if (perm.value >> _XTILEDATA) & 1 else "asked, but not granted"


try:
    AMX = _ask_for_amx()
except Exception as e:  # noqa: BLE001 - never stop the engine from starting
    AMX = f"not asked: {type(e).__name__}: {e}"
if AMX == "granted" or AMX.startswith(("refused", "asked")):
    # one line per process in the server's log: the evidence the doctor and the death reports read
    print(f"servescope: AMX tile permission {AMX} (pid {os.getpid()})", file=sys.stderr, flush=True)


def _raise_loggers(spec: str) -> list[str]:
    """Set each named logger's level ('name=LEVEL,...'); the names set."""
    import logging

    done = []
    for item in filter(None, (x.strip() for x in spec.split(","))):
        name, _, level = item.partition("=")
        if name and isinstance(logging.getLevelName(level.upper()), int):  # a known level name (any Python 3)
            logging.getLogger(name).setLevel(level.upper())
            done.append(name)
    return done


try:
    LOGGERS = _raise_loggers(os.environ.get("SERVESCOPE_LOGGER_LEVELS", ""))
except Exception:  # noqa: BLE001 - never stop the engine from starting
    LOGGERS = []


def _chain() -> None:
    """Run the sitecustomize this one shadows (the next on sys.path), as the interpreter would have."""
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == here:
            continue
        path = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(path):
            import importlib.util

            spec = importlib.util.spec_from_file_location("_servescope_next_sitecustomize", path)
            if spec is not None and spec.loader is not None:
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


_chain()
