"""make bench-agreement: do our client and vLLM's own benchmark client measure the same server alike?

The embedded vLLM serves one workload; our client and `vllm bench serve` take turns measuring it, in
alternating repetitions, and their medians are compared. Last line:
  agreement: tok_s_diff_pct=N ttft_p50_diff_pct=N
(positive = ours measured higher)."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from common import ROOT, client_cpus, engine_python, run_vllm_bench, serve_embedded

from servescope.load import load_tokenizer, run_sweep
from servescope.spec import LoadSpec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=400)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--compiled", action="store_true",
                    help="measure vLLM's default (compiled) configuration instead of --enforce-eager; on this CPU build "
                         "a compiled server stalls for seconds when a run brings a batch shape it has not seen, which "
                         "is the server's variance, not the clients'")
    a = ap.parse_args()
    python = engine_python()
    log_dir = ROOT / "data" / "runs" / "_bench" / f"agreement-{time.strftime('%Y%m%d-%H%M%S')}"
    prep, server = serve_embedded(log_dir, eager=not a.compiled)
    tok = load_tokenizer(prep.model_path)
    load = LoadSpec(concurrency=(a.concurrency,), num_requests=a.prompts, input_len=a.input_len,
                    output_len=a.output_len, warmup_requests=a.concurrency)
    print(f"workload: random {a.input_len} in / {a.output_len} out tokens, {a.prompts} prompts, closed loop at "
          f"concurrency {a.concurrency}, {a.concurrency} warmup requests; {a.reps} alternating repetitions")
    res: dict[str, list[tuple[float, float]]] = {"ours": [], "vllm": []}
    with server as target:
        print(f"server: {target.command}")
        cpus = client_cpus()
        os.sched_setaffinity(0, cpus)  # the server's processes were started before this, on every CPU
        print(f"both clients pinned to CPU {sorted(cpus)}")
        print(f"{'rep':>3} {'client':6} {'out tok/s':>10} {'TTFT p50 ms':>12} {'TPOT p50 ms':>12} {'failed':>6} "
              f"{'client CPU s':>12}")
        for rep in range(a.reps):
            for who in (["ours", "vllm"] if rep % 2 == 0 else ["vllm", "ours"]):
                if who == "ours":
                    c0 = os.times()
                    s = run_sweep(target.base_url, target.model, load, tok, progress=False).summary().iloc[0]
                    c1 = os.times()
                    tok_s, ttft, tpot, failed = s.output_tok_s, s.ttft_ms_p50, s.tpot_ms_p50, int(s.failed)
                    cpu_s = (c1.user - c0.user) + (c1.system - c0.system)
                else:
                    out = run_vllm_bench(python, target.base_url, target.model, prep.model_path, a.prompts,
                                         a.concurrency, a.input_len, a.output_len, warmups=a.concurrency,
                                         extra=["--temperature", "0"])  # greedy, as ours asks
                    tok_s, ttft, tpot = out["output_throughput"], out["median_ttft_ms"], out["median_tpot_ms"]
                    failed = int(out.get("failed", 0))
                    cpu_s = out["_cpu_s"]
                res[who].append((tok_s, ttft))
                print(f"{rep + 1:>3} {who:6} {tok_s:>10.0f} {ttft:>12.1f} {tpot:>12.2f} {failed:>6} {cpu_s:>12.1f}",
                      flush=True)
    med = {k: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)) for k, v in res.items()}
    for k, (t, f) in med.items():
        print(f"median {k:6} {t:>10.0f} {f:>12.1f}")
    tok_diff = (med["ours"][0] / med["vllm"][0] - 1) * 100
    ttft_diff = (med["ours"][1] / med["vllm"][1] - 1) * 100
    paired = [(o[0] / v[0] - 1) * 100 for o, v in zip(res["ours"], res["vllm"], strict=True)]
    print(f"paired tok/s differences per repetition (%): {', '.join(f'{x:+.1f}' for x in paired)}; "
          f"median {statistics.median(paired):+.1f}")
    print(f"agreement: tok_s_diff_pct={tok_diff:+.1f} ttft_p50_diff_pct={ttft_diff:+.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
