"""The MoE ceiling probe: on the model's own expert shapes, time a per-expert loop of matrix products against one
grouped product, for each token count of the sweep. What the grouped path could gain over per-expert launches, and
how many launches each makes per MoE layer.

Runs as a script under the *engine's* interpreter (which has torch), on the device the engine uses:
    python moe_ceiling.py '{"experts": 16, "top_k": 4, "hidden": 256, "inter": 128, "tokens": [1, 4, 16],
                            "device": "cpu", "dtype": "float32", "reps": 20, "seed": 0}'
prints one JSON object: {"rows": [...], "grouped_method": ..., "torch": ...}. The grouped product is
torch._grouped_mm where this torch has it for the device and dtype, else a padded batched matmul (bmm) over the
experts that received tokens; the method is named in the output.
"""

from __future__ import annotations

import json
import sys
import time
from functools import partial
from typing import Any


def _sync(torch: Any, device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _time(torch: Any, device: str, fn: Any, reps: int) -> float:
    """Median milliseconds of fn over reps calls, after two warm-up calls."""
    for _ in range(2):
        fn()
    _sync(torch, device)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        _sync(torch, device)
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2]


def _loop(torch: Any, xs: Any, spans: list[tuple[int, int, int]], w1: Any, w2: Any, inter: int) -> None:
    """One expert at a time: gate/up product, SiLU-and-multiply, down product (four launches per expert)."""
    for i, a, b in spans:
        gu = xs[a:b] @ w1[i]
        y = torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]
        _ = y @ w2[i]


def _grouped_mm(torch: Any, grouped_mm: Any, xs: Any, w1: Any, w2: Any, offs: Any, inter: int) -> None:
    gu = grouped_mm(xs, w1, offs=offs)
    y = torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]
    _ = grouped_mm(y, w2, offs=offs)


def _padded_bmm(torch: Any, pad: Any, w1a: Any, w2a: Any, inter: int) -> None:
    gu = torch.bmm(pad, w1a)
    y = torch.nn.functional.silu(gu[..., :inter]) * gu[..., inter:]
    _ = torch.bmm(y, w2a)


def probe(spec: dict[str, Any]) -> dict[str, Any]:
    """Time loop vs grouped for each token count (see the module docstring)."""
    import torch

    dev, dtype = spec.get("device", "cpu"), getattr(torch, spec.get("dtype", "float32"))
    e, k, h, inter = int(spec["experts"]), int(spec["top_k"]), int(spec["hidden"]), int(spec["inter"])
    reps = int(spec.get("reps", 20))
    g = torch.Generator().manual_seed(int(spec.get("seed", 0)))
    w1 = (torch.randn(e, h, 2 * inter, generator=g) / h**0.5).to(dev, dtype)  # gate and up, fused
    w2 = (torch.randn(e, inter, h, generator=g) / inter**0.5).to(dev, dtype)
    grouped_mm = getattr(torch, "_grouped_mm", None)
    rows = []
    method = ""
    for t in spec["tokens"]:
        x = torch.randn(int(t), h, generator=g).to(dev, dtype)
        choice = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(int(t))])  # token -> its experts
        order = torch.argsort(choice.reshape(-1), stable=True)
        rows_by_expert = torch.arange(int(t)).repeat_interleave(k)[order]  # the token each routed row comes from
        counts = torch.bincount(choice.reshape(-1), minlength=e)
        xs = x[rows_by_expert.to(dev)]  # routed rows, grouped by expert
        active = [i for i in range(e) if int(counts[i]) > 0]
        bounds = torch.cumsum(counts, 0).tolist()
        starts = [0, *bounds[:-1]]

        loop = partial(_loop, torch, xs, [(i, starts[i], bounds[i]) for i in active], w1, w2, inter)
        if grouped_mm is not None and dev.startswith("cuda") and dtype == torch.bfloat16:
            offs = torch.tensor(bounds, device=dev, dtype=torch.int32)
            grouped = partial(_grouped_mm, torch, grouped_mm, xs, w1, w2, offs, inter)
            method = "torch._grouped_mm"
        else:
            m = max(int(counts.max()), 1)
            ids = torch.tensor(active, device=dev)
            pad = torch.zeros(len(active), m, h, device=dev, dtype=dtype)
            for j, i in enumerate(active):
                pad[j, : int(counts[i])] = xs[starts[i]:bounds[i]]
            grouped = partial(_padded_bmm, torch, pad, w1[ids], w2[ids], inter)
            method = "padded bmm over the active experts"
        loop_ms = _time(torch, dev, loop, reps)
        grouped_ms = _time(torch, dev, grouped, reps)
        rows.append({"tokens": int(t), "experts_active": len(active), "loop_ms": loop_ms, "grouped_ms": grouped_ms,
                     "speedup": loop_ms / grouped_ms if grouped_ms > 0 else float("nan"),
                     "launches_loop": 4 * len(active), "launches_grouped": 4})
    return {"rows": rows, "grouped_method": method, "torch": torch.__version__, "device": dev,
            "dtype": spec.get("dtype", "float32")}


if __name__ == "__main__":
    print(json.dumps(probe(json.loads(sys.argv[1]))))
