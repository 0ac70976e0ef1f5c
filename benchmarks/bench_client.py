"""make bench-client: how many streamed requests per second each client can drive.

Our client, vLLM's own benchmark client (`vllm bench serve`, run from the engine environment) and NVIDIA AIPerf
(0.13, in its own environment in the per-user cache; its default worker processes, pinned to the same CPU as
vLLM's client) hit the same zero-work streaming stub with the same workload, in rotating order. The stub answers at
once, so the figure is each client's own capacity. Last line:
  client_capacity: ours_req_s=N vllm_req_s=N aiperf_req_s=N ratio=R ratio_aiperf=R
"""

from __future__ import annotations

import argparse
import statistics
import sys

from common import ROOT, aiperf_python, engine_python, run_aiperf, run_vllm_bench, tiny_model

from servescope.load import load_tokenizer, random_prompts, run_level
from servescope.server import ManagedServer, ReadyCheck, free_port
from servescope.spec import LoadSpec


def ours(base_url: str, prompts, concurrency: int) -> tuple[float, float, int]:
    load = LoadSpec(concurrency=(concurrency,), num_requests=len(prompts), output_len=prompts[0].output_len,
                    warmup_requests=0)
    recs = run_level(base_url, "stub", load, concurrency, prompts, progress=False)
    ends = max(r.start_unix + r.e2e_ms / 1e3 for r in recs)
    duration = ends - min(r.start_unix for r in recs)  # first send to last completion, as vLLM's client measures
    ok = [r for r in recs if r.status == "ok"]
    return len(ok) / duration, sum(r.chunks for r in ok) / duration, len(recs) - len(ok)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=64, help="streamed chunks per response")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()

    python = engine_python()
    aiperf = aiperf_python()
    model = tiny_model(python)
    tok = load_tokenizer(model)
    prompts = random_prompts(tok, a.requests, 64, a.tokens, seed=0)
    port = free_port()
    stub = ManagedServer(command=[python, str(ROOT / "benchmarks" / "zero_stub.py"), "--port", str(port),
                                  "--tokens", str(a.tokens)],
                         port=port, log_dir=ROOT / "data" / "runs" / "_bench" / "zero_stub", model="stub",
                         ready=ReadyCheck(generate_path=None, poll_interval_s=0.1))
    print(f"workload: {a.requests} requests x {a.tokens} streamed chunks, closed loop at concurrency "
          f"{a.concurrency}, zero-work stub (uvloop) on 127.0.0.1:{port}; {a.reps} alternating repetitions")
    print(f"{'rep':>3} {'client':8} {'req/s':>9} {'chunks/s':>10} {'errors':>6}")
    res: dict[str, list[tuple[float, float]]] = {"ours": [], "vllm": [], "aiperf": []}
    clients = ["ours", "vllm", "aiperf"]
    with stub:
        for rep in range(a.reps):
            order = clients[rep % 3:] + clients[:rep % 3]  # each client first once in three repetitions
            for who in order:
                if who == "ours":
                    rq, ch, err = ours(stub.base_url, prompts, a.concurrency)
                elif who == "aiperf":
                    out = run_aiperf(aiperf, stub.base_url, "stub", model, a.requests, a.concurrency, 64, a.tokens)
                    rq, ch, err = out["request_throughput"], out["output_throughput"], int(out["failed"])
                else:
                    out = run_vllm_bench(python, stub.base_url, "stub", model, a.requests, a.concurrency, 64, a.tokens)
                    rq, ch, err = out["request_throughput"], out["output_throughput"], int(out.get("failed", 0))
                res[who].append((rq, ch))
                print(f"{rep + 1:>3} {who:8} {rq:>9.0f} {ch:>10.0f} {err:>6}", flush=True)
    med = {k: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)) for k, v in res.items()}
    for k, (rq, ch) in med.items():
        print(f"median {k:8} {rq:>9.0f} {ch:>10.0f}")
    ratio = med["ours"][0] / med["vllm"][0]
    ratio_ai = med["ours"][0] / med["aiperf"][0]
    ok = ratio >= 2.0 and ratio_ai >= 1.0
    print(f"goals (ratio >= 2.0 against vLLM's client, >= 1.0 against AIPerf): {'met' if ok else 'NOT met'}")
    print(f"client_capacity: ours_req_s={med['ours'][0]:.0f} vllm_req_s={med['vllm'][0]:.0f} "
          f"aiperf_req_s={med['aiperf'][0]:.0f} ratio={ratio:.2f} ratio_aiperf={ratio_ai:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
