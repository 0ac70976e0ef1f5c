"""The all-reduce probe: time torch.distributed all_reduce over message sizes on every GPU of this machine (NCCL),
or on CPU processes (gloo) where a test wants the machinery without GPUs.

Runs as a script under the *engine's* interpreter (which has torch); it spawns one process per rank:
    python allreduce.py '{"world": 2, "backend": "nccl", "sizes": [4096, ...], "dtype": "bfloat16", "reps": 20}'
prints one JSON object: {"rows": [{"bytes", "ms_p50", "ms_min", "algbw_gbps", "busbw_gbps"}], "backend", "world",
"torch", "devices"}. Bus bandwidth follows nccl-tests' definition for all-reduce: algbw x 2(n-1)/n.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from typing import Any


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank(rank: int, spec: dict[str, Any], port: int, out: Any) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    nccl = spec["backend"] == "nccl"
    if nccl:
        torch.cuda.set_device(rank)
    dist.init_process_group(spec["backend"], rank=rank, world_size=spec["world"])
    dtype = getattr(torch, spec["dtype"])
    device = f"cuda:{rank}" if nccl else "cpu"
    elem = torch.tensor([], dtype=dtype).element_size()
    rows = []
    for size in spec["sizes"]:
        x = torch.ones(max(1, size // elem), dtype=dtype, device=device)
        for _ in range(3):  # warm-up: communicator setup and the first collective are not the steady state
            dist.all_reduce(x)
        if nccl:
            torch.cuda.synchronize()
        times = []
        for _ in range(spec["reps"]):
            dist.barrier()
            if nccl:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            if nccl:
                torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
        if rank == 0:
            times.sort()
            p50 = times[len(times) // 2]
            nbytes = x.numel() * elem
            algbw = nbytes / (p50 / 1e3) / 1e9
            n = spec["world"]
            rows.append({"bytes": nbytes, "ms_p50": p50, "ms_min": times[0], "algbw_gbps": algbw,
                         "busbw_gbps": algbw * 2 * (n - 1) / n})
    if rank == 0:
        devices = [torch.cuda.get_device_name(i) for i in range(spec["world"])] if nccl else ["cpu"] * spec["world"]
        out.put({"rows": rows, "backend": spec["backend"], "world": spec["world"], "torch": torch.__version__,
                 "dtype": spec["dtype"], "devices": devices})
    dist.destroy_process_group()


def main() -> None:
    import torch.multiprocessing as mp

    spec = json.loads(sys.argv[1])
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, spec, port, q)) for r in range(spec["world"])]
    for p in procs:
        p.start()
    result = q.get(timeout=spec.get("timeout_s", 300))
    for p in procs:
        p.join(60)
    bad = [p.exitcode for p in procs if p.exitcode]
    if bad:
        raise SystemExit(f"a rank exited with {bad}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
