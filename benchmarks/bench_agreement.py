"""make bench-agreement: do our client and vLLM's own benchmark client measure the same server alike?

The embedded vLLM serves one workload; our client and `vllm bench serve` take turns measuring it, in
alternating repetitions, and their medians are compared; each is also compared with what the server itself
counted over the same run (vLLM's Prometheus `vllm:generation_tokens_total` over the client's measured interval,
less the warm-up tokens, and the median of `vllm:time_to_first_token_seconds`' histogram), and each client's own CPU
seconds are shown. Last line:
  agreement: tok_s_diff_pct=N ttft_p50_diff_pct=N server_tok_s_diff_pct=N
(positive = ours measured higher; the last is ours against the server's own count)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import urllib.request

from common import ROOT, client_cpus, engine_python, run_vllm_bench, serve_embedded

from servescope.load import load_tokenizer, run_sweep
from servescope.spec import LoadSpec
from servescope.telemetry.prom import parse_metrics

GEN = "vllm:generation_tokens_total"
TTFT = "vllm:time_to_first_token_seconds_bucket"


def server_counts(base_url: str) -> tuple[float, dict[float, float]]:
    """The server's own generated-token counter and its TTFT histogram (upper bound s -> cumulative count)."""
    with urllib.request.urlopen(base_url + "/metrics", timeout=10) as r:
        rows = parse_metrics(r.read().decode(), ("vllm:",), keep_buckets=True)
    gen = sum(x["value"] for x in rows if x["metric"] == GEN)
    buckets: dict[float, float] = {}
    for x in rows:
        if x["metric"] == TTFT:
            le = json.loads(x["labels"]).get("le", "")
            le_s = float("inf") if le == "+Inf" else float(le)
            buckets[le_s] = buckets.get(le_s, 0.0) + x["value"]
    return gen, buckets


def histogram_median_ms(before: dict[float, float], after: dict[float, float]) -> float:
    """The median of the requests a histogram counted between two scrapes, interpolated within its bucket."""
    edges = sorted(after)
    cum = [after[e] - before.get(e, 0.0) for e in edges]
    total = cum[-1] if cum else 0.0
    if total <= 0:
        return float("nan")
    half, lo, prev = total / 2, 0.0, 0.0
    for e, c in zip(edges, cum, strict=True):
        if c >= half:
            if e == float("inf"):
                return lo * 1e3
            return (lo + (e - lo) * (half - prev) / max(c - prev, 1e-12)) * 1e3
        lo, prev = e, c
    return float("nan")


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
    counted: dict[str, list[tuple[float, float]]] = {"ours": [], "vllm": []}  # the server's count of each run
    cpu: dict[str, list[float]] = {"ours": [], "vllm": []}
    warm_tokens = a.concurrency * a.output_len  # each client's warm-up requests, exact lengths
    with server as target:
        print(f"server: {target.command}")
        cpus = client_cpus()
        os.sched_setaffinity(0, cpus)  # the server's processes were started before this, on every CPU
        print(f"both clients pinned to CPU {sorted(cpus)}")
        print(f"{'rep':>3} {'client':6} {'out tok/s':>10} {'TTFT p50 ms':>12} {'TPOT p50 ms':>12} {'failed':>6} "
              f"{'client CPU s':>12} {'server tok/s':>12} {'server TTFT p50':>15}")
        for rep in range(a.reps):
            for who in (["ours", "vllm"] if rep % 2 == 0 else ["vllm", "ours"]):
                g0, h0 = server_counts(target.base_url)
                if who == "ours":
                    c0 = os.times()
                    s = run_sweep(target.base_url, target.model, load, tok, progress=False).summary().iloc[0]
                    c1 = os.times()
                    tok_s, ttft, tpot, failed = s.output_tok_s, s.ttft_ms_p50, s.tpot_ms_p50, int(s.failed)
                    cpu_s = (c1.user - c0.user) + (c1.system - c0.system)
                    interval_s = float(s.duration_s)
                else:
                    out = run_vllm_bench(python, target.base_url, target.model, prep.model_path, a.prompts,
                                         a.concurrency, a.input_len, a.output_len, warmups=a.concurrency,
                                         extra=["--temperature", "0"])  # greedy, as ours asks
                    tok_s, ttft, tpot = out["output_throughput"], out["median_ttft_ms"], out["median_tpot_ms"]
                    failed = int(out.get("failed", 0))
                    cpu_s = out["_cpu_s"]
                    interval_s = float(out["duration"])
                g1, h1 = server_counts(target.base_url)
                srv_tok_s = (g1 - g0 - warm_tokens) / interval_s
                srv_ttft = histogram_median_ms(h0, h1)
                res[who].append((tok_s, ttft))
                counted[who].append((srv_tok_s, srv_ttft))
                cpu[who].append(cpu_s)
                print(f"{rep + 1:>3} {who:6} {tok_s:>10.0f} {ttft:>12.1f} {tpot:>12.2f} {failed:>6} {cpu_s:>12.1f} "
                      f"{srv_tok_s:>12.0f} {srv_ttft:>15.1f}", flush=True)
    med = {k: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)) for k, v in res.items()}
    for k, (t, f) in med.items():
        print(f"median {k:6} {t:>10.0f} {f:>12.1f}")
    tok_diff = (med["ours"][0] / med["vllm"][0] - 1) * 100
    ttft_diff = (med["ours"][1] / med["vllm"][1] - 1) * 100
    paired = [(o[0] / v[0] - 1) * 100 for o, v in zip(res["ours"], res["vllm"], strict=True)]
    print(f"paired tok/s differences per repetition (%): {', '.join(f'{x:+.1f}' for x in paired)}; "
          f"median {statistics.median(paired):+.1f}")
    vs_server = {}
    for k in res:
        d = [(c[0] / v[0] - 1) * 100 for c, v in zip(res[k], counted[k], strict=True)]
        vs_server[k] = statistics.median(d)
        print(f"{k:6} against the server's own count: tok/s {vs_server[k]:+.1f}% (median of per-run differences), "
              f"TTFT p50 {statistics.median(x[1] for x in res[k]):.1f} ms vs the server's histogram "
              f"{statistics.median(x[1] for x in counted[k]):.1f} ms; client CPU {statistics.median(cpu[k]):.1f} s per run")
    print(f"goal (ours within 2% of the server's own token count): {'met' if abs(vs_server['ours']) <= 2 else 'NOT met'}")
    print(f"agreement: tok_s_diff_pct={tok_diff:+.1f} ttft_p50_diff_pct={ttft_diff:+.1f} "
          f"server_tok_s_diff_pct={vs_server['ours']:+.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
