#!/usr/bin/env bash
# Issue 22 on the H200: thread 04 with transformers serve (data/suites/transformers-gpu.yaml: its engine, model, load
# and thread 04's parameters) as library calls: 1 server against 2 and 3 replicas on the one GPU, time-sliced and
# through the suite's MPS daemon, each replica pinned to its cores and given its memory share, least-outstanding
# routing, repetitions until resolved within BUDGET_S of measuring. The store starts from data/reference/h200/store,
# or from the one an earlier call left (.device/i22store/store.tgz, carried); it comes back as $OUT/store.tgz with the
# run's output. Device call: REPS=2 MAX_REPS=2 bash benchmarks/gpu/run_issue22_h200.sh, carry .device/wheels (and
# .device/i22store), then the same with REPS=3 (MAX_REPS=4) to continue (KEEP=1 on a machine still warm).
set -u
source benchmarks/gpu/setup_h200.sh
echo "taskset: $(command -v taskset)  mps: $(command -v nvidia-cuda-mps-control)  cores: $(nproc)"
# a warm machine keeps the store of the call before (KEEP=1); else the carried one, else the reference
if [ "${KEEP:-0}" = 1 ] && [ -d /tmp/store ]; then echo "continuing /tmp/store";
else rm -rf /tmp/store
  if [ -f .device/i22store/store.tgz ]; then tar xzf .device/i22store/store.tgz -C /tmp; else cp -r data/reference/h200/store /tmp/store; fi
fi
PYTHONUNBUFFERED=1 timeout ${WALL_S:-560} python3 - <<'PY' 2>&1 | tee $OUT/run04.log | grep -v "^\s*$" | tail -70
import os, time, yaml
import pandas as pd
from servescope.context import context
from servescope.threads import parallelism as t04
pd.set_option("display.width", 250); pd.set_option("display.max_colwidth", 120); pd.set_option("display.max_columns", 20)
suite = yaml.safe_load(open("data/suites/transformers-gpu.yaml"))
p = next(n for n in suite["notebooks"] if n["id"].startswith("04"))["parameters"]
t0 = time.time()
reps = int(os.environ.get("REPS", p["repetitions"]))  # a call may take fewer repetitions; the next one continues
ctx = context(suite["engine"], suite["model"], {**suite["load"], **p["load"]}, repetitions=reps,
              max_repetitions=int(os.environ.get("MAX_REPS", p["max_repetitions"])),
              budget_s=float(os.environ.get("BUDGET_S", "420")),
              store_dir="/tmp/store", telemetry=suite.get("telemetry"), progress=False)
ps = t04.run(ctx, routes=p["routes"], shared=p["shared"])
print("stopped:", ps.study.results.stopped)
print(ps.overview().to_string())
print(ps.table().to_string())
print(ps.mps_check().to_string())
print(ps.replica_gpu_memory().to_string())
print(ps.gpu_activity().to_string())
h = ps.replica_host()
print(h.groupby(["config", "point", "replica"])[["server_cpu_pct_p50", "busiest_thread_cpu_pct_p50"]].median().to_string() if len(h) else "no host rows")
print(ps.study.results.errors[["config", "rep", "summary"]].to_string() if len(ps.study.results.errors) else "no errors")
for f in t04.findings(ps):
    print("FINDING", f.title, "|", f.confidence, "|", f.claim[:900], "|", f.recommended_flags, "|", f.recommendation)
print(f"wall_s={time.time() - t0:.0f}")
PY
echo "left: $(pgrep -af nvidia-cuda-mps || echo 'no MPS process')"; ls -d /tmp/servescope-*mps-* 2>/dev/null || echo "no MPS folder"
tar czf $OUT/store.tgz -C /tmp store
nvidia-smi --query-gpu=name,driver_version,power.limit,compute_mode --format=csv > $OUT/gpu.txt 2>&1
