#!/usr/bin/env bash
# Thread 01 alone on the H200 with transformers serve (the transformers-gpu suite's engine, model and load), without
# papermill (WHEELS=.device/mw is enough): what the server logged about its CUDA-graph decision at --log-level info,
# what thread 01 concludes from it, and the point (with its logs) under $OUT/store. Run through the device tool from
# the repository root with .device/mw carried.
set -u
WHEELS=${WHEELS:-.device/mw} source benchmarks/gpu/setup_h200.sh
rm -rf /tmp/store && mkdir -p /tmp/store
PYTHONUNBUFFERED=1 timeout ${BUDGET_S:-420} python3 - <<'PY' 2>&1 | tee $OUT/run.log | grep -v "^\s*$" | tail -40
import time, yaml
from servescope.context import context
from servescope.threads import graph_disable as t01
suite = yaml.safe_load(open("data/suites/transformers-gpu.yaml"))
t0 = time.time()
ctx = context(suite["engine"], suite["model"], suite["load"], store_dir="/tmp/store", telemetry=suite.get("telemetry"),
              progress=False)
study = t01.run(ctx)
log, why_no_log = t01.server_log(study)
print("LOG LINES (graph):")
print(log[log["kind"].isin(["graph_disabled", "graph_capture"])].to_string() if len(log) else why_no_log)
st = t01.state_of(study)
print("RESOLVED", st.to_dict())
for f in t01.findings(study, t01.explain(study, t01.audit_for(ctx), log), log):
    print("FINDING", f.title, "|", f.confidence, "|", f.claim)
pt = study.results.point(t01.ARM)
if pt is not None:
    print("DECISION LINES:", [l for l in pt.log().splitlines() if "cuda graph" in l.lower() or "attn" in l.lower()][:20])
print(f"wall_s={time.time() - t0:.0f}")
PY
tar czf $OUT/store.tgz -C /tmp store
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $OUT/gpu.txt 2>&1
