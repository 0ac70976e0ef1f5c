"""Small measurements run in an engine's own environment (which has torch): scripts beside this module."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pandas as pd

from ..errors import ServescopeError


def moe_ceiling(python: str, experts: int, top_k: int, hidden: int, inter: int, tokens: list[int],
                device: str = "cpu", dtype: str = "float32", reps: int = 20, seed: int = 0,
                timeout_s: float = 600) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Per-expert loop against one grouped product on the model's expert shapes, per token count (see
    probes/moe_ceiling.py): a table (tokens, experts_active, loop_ms, grouped_ms, speedup, launches) and what ran."""
    spec = {"experts": experts, "top_k": top_k, "hidden": hidden, "inter": inter, "tokens": list(tokens),
            "device": device, "dtype": dtype, "reps": reps, "seed": seed}
    script = Path(__file__).with_name("moe_ceiling.py")
    res = subprocess.run([python, str(script), json.dumps(spec)], capture_output=True, text=True, timeout=timeout_s)
    if res.returncode != 0:
        tail = (res.stderr or res.stdout).strip().splitlines()[-3:]
        raise ServescopeError(f"MoE ceiling probe failed under {python}: {' | '.join(tail)}")
    out = json.loads(res.stdout.strip().splitlines()[-1])
    return pd.DataFrame(out.pop("rows")), out
