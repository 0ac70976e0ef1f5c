#!/usr/bin/env bash
# Issue 21 on the H200 with transformers serve (the transformers-gpu suite's engine, model and load), without
# papermill (WHEELS=.device/mw is enough), each part under its own budget (PARTS="a c b" by default). a: thread 01
# re-measured with the engine's defaults into a copy of the H200 reference store (its logger raised, so the log holds
# the decision) and the audit's choosing rule it names; c: thread 02's engine-free ceiling probe, kept in the store;
# b: a low-rate open-loop sweep of the engine's defaults (the under-loaded known answer) and its regimes. The store comes back as $OUT/store.tgz. Run through the device tool
# from the repository root with .device/mw carried.
set -u
WHEELS=${WHEELS:-.device/mw} source benchmarks/gpu/setup_h200.sh
if [ ! -d /tmp/store ]; then cp -r data/reference/h200/store /tmp/store; fi
for PART in ${PARTS:-a c b}; do
budget=${BUDGET_A_S:-300}; [ "$PART" = b ] && budget=${BUDGET_B_S:-150}; [ "$PART" = c ] && budget=${BUDGET_C_S:-400}
PART=$PART PYTHONUNBUFFERED=1 timeout $budget python3 - <<'PY' 2>&1 | tee $OUT/run_$PART.log | grep -v "^\s*$" | tail -40
import os, time, yaml
import pandas as pd
from servescope.context import context
suite = yaml.safe_load(open("data/suites/transformers-gpu.yaml"))
pd.set_option("display.width", 250); pd.set_option("display.max_colwidth", 220)
t0 = time.time()
if os.environ["PART"] == "a":
    from servescope.threads import graph_disable as t01
    ctx = context(suite["engine"], suite["model"], suite["load"], store_dir="/tmp/store",
                  telemetry=suite.get("telemetry"), progress=False, force=True)
    study = t01.run(ctx)
    log, why_no_log = t01.server_log(study)
    audit = t01.audit_for(ctx)
    print("AUDIT CHOOSING:", audit[audit["form"] == "chooses"][["file", "line", "effect", "resolves_to"]].to_string())
    why = t01.explain(study, audit, log)
    print("EXPLAIN:", why.to_string())
    for f in t01.findings(study, why, log):
        print("FINDING01", f.title, "|", f.confidence, "|", f.claim, "|", f.recommended_flags)
    print(f"thread01_s={time.time() - t0:.0f}")
elif os.environ["PART"] == "c":
    from servescope.threads import graph_modes as t02
    off = context(suite["engine"], suite["model"], suite["load"], store_dir="/tmp/store", offline=True, progress=False)
    gs = t02.run(off, ceiling=False)
    t1 = time.time()
    t02._ceiling(gs, context(suite["engine"], suite["model"], suite["load"], store_dir="/tmp/store", progress=False))
    print("CEILING INFO:", gs.ceiling_info, flush=True)
    print(gs.ceiling_table().to_string())
    print(f"ceiling_s={time.time() - t1:.0f}")
else:
    from servescope.experiment import Config, run_configs
    from servescope.spec import Knobs
    from servescope.study import Study
    load = {"mode": "open", "request_rate": [0.25, 2, float("inf")], "num_requests": 8, "input_len": 128,
            "output_len": 16}
    ctx = context(suite["engine"], suite["model"], load, repetitions=1, store_dir="/tmp/store",
                  telemetry=suite.get("telemetry"), progress=False)
    res = run_configs(ctx, [Config("engine defaults", Knobs())])
    st = Study("underloaded", ctx, [], res)
    print(res.summary[["config", "point", "completed", "output_tok_s", "ttft_ms_p50"]].to_string())
    print(st.regimes(per_rep=True)[["config", "point", "regime", "confidence", "because"]].to_string())
    print(st.host_points().to_string())
    print(st.gpu_points()[[c for c in st.gpu_points().columns if c.endswith("_p50") or c in ("phase",)]].to_string())
print(f"wall_s={time.time() - t0:.0f}")
PY
done
tar czf $OUT/store.tgz -C /tmp store
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $OUT/gpu.txt 2>&1
