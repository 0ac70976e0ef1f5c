#!/usr/bin/env bash
# Issue 22 on the H200: thread 04 with transformers serve (data/suites/transformers-gpu.yaml: its engine, model, load
# and thread 04's parameters) as library calls: 1 server against 2 replicas on the one GPU, through the suite's MPS
# daemon and time-sliced, each replica pinned to its cores and given its memory share, least-outstanding routing.
# Device time is short, so the order is: 1 server and 2 replicas with MPS to their repetitions first (the question
# users ask), then the time-sliced layout from the same store, as far as the call's limit allows. The store starts as
# a copy of data/reference/h200/store (its stored repetitions are read, not launched again: on 2026-12-02 it holds two
# of 1 server and of MPS, none time-sliced) and is tarred into $OUT/store.tgz every 15 s, so a call cut at its limit
# keeps every finished point; copy its new point folders and _notes into data/reference/h200/store here, then
# `.venv/bin/python benchmarks/gpu/rerender_h200_report.py`. Device call, carry .device/wheels:
#   bash benchmarks/gpu/run_issue22_h200.sh
set -u
source benchmarks/gpu/setup_h200.sh
echo "taskset: $(command -v taskset)  mps: $(command -v nvidia-cuda-mps-control)  cores: $(nproc)"
rm -rf /tmp/store && cp -r data/reference/h200/store /tmp/store
(while sleep 15; do tar czf $OUT/store.tmp -C /tmp store 2>/dev/null && mv $OUT/store.tmp $OUT/store.tgz; done) &
saver=$!
PYTHONUNBUFFERED=1 timeout ${WALL_S:-590} python3 - <<'PY' 2>&1 | tee $OUT/run04.log | grep -v "^\s*$" | tail -60
import os, signal, time, yaml
import pandas as pd
from servescope.context import context
from servescope.threads import parallelism as t04

# a SIGTERM (timeout) unwinds like ^C: the suite's teardown stops the servers and the MPS daemon
signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
pd.set_option("display.width", 250); pd.set_option("display.max_colwidth", 120); pd.set_option("display.max_columns", 20)
suite = yaml.safe_load(open("data/suites/transformers-gpu.yaml"))
p = next(n for n in suite["notebooks"] if n["id"].startswith("04"))["parameters"]
t0 = time.time()


def ctx(max_reps=p["max_repetitions"]):
    return context(suite["engine"], suite["model"], {**suite["load"], **p["load"]}, repetitions=p["repetitions"],
                   max_repetitions=max_reps, store_dir="/tmp/store", telemetry=suite.get("telemetry"),
                   progress=False)


try:
    t04.run(ctx(p["repetitions"]), routes=p["routes"], shared=p["shared"], share_modes=["mps"], allreduce=False)
    print(f"MPS and 1 server done at {time.time() - t0:.0f} s", flush=True)
    ps = t04.run(ctx(), routes=p["routes"], shared=p["shared"], allreduce=False)
except KeyboardInterrupt:
    print(f"stopped at {time.time() - t0:.0f} s; what is stored:", flush=True)
    ps = t04.run(context(suite["engine"], suite["model"], {**suite["load"], **p["load"]}, store_dir="/tmp/store",
                         offline=True, progress=False), routes=p["routes"], shared=p["shared"], allreduce=False)
print("stopped:", ps.study.results.stopped)
print(ps.overview().to_string())
print(ps.table().to_string())
print(ps.mps_check().to_string())
print(ps.replica_gpu_memory().to_string())
print(ps.gpu_activity().to_string())
print(ps.study.results.errors[["config", "rep", "summary"]].to_string() if len(ps.study.results.errors) else "no errors")
for f in t04.findings(ps):
    print("FINDING", f.title, "|", f.confidence, "|", f.claim[:700], "|", f.recommendation)
print(f"wall_s={time.time() - t0:.0f}")
PY
kill $saver 2>/dev/null
tar czf $OUT/store.tgz -C /tmp store
sleep 5  # the reaper polls every 0.5 s, then quits the daemon and removes its folders
echo "left: $(pgrep -af nvidia-cuda-mps || echo 'no MPS process')"; ls -d /tmp/servescope-*mps-* 2>/dev/null || echo "no MPS folder"
nvidia-smi --query-gpu=name,driver_version,power.limit,compute_mode --format=csv > $OUT/gpu.txt 2>&1
