#!/usr/bin/env bash
# A second, cold recording of threads 02 and 05 on the H200 (issue 20: does the headline hold?), measured through the
# thread functions (no notebooks: the Jupyter wheels would not fit the transfer beside scipy) with the suite's own
# engine, model, load and repetition parameters (data/suites/transformers-gpu.yaml), so that the offline render here
# reads every point. THREAD=02 starts from an empty store; THREAD=05 continues the store carried in .device/run2store
# (its eager side is 02's graphs-off server: read, not launched again). Also records the AMX check of engine_site
# (benchmarks/gpu/amx_site_check.py, .device/amx_tiles.so) on this machine's CPU. Writes $OUT/store.tgz, $OUT/*.txt.
# Device call: WHEELS=.device/mw THREAD=02 bash benchmarks/gpu/run_second_h200.sh, carry .device/mw,
# .device/amx_tiles.so (and .device/run2store for 05); the slim wheel set is .device/wheels less the Jupyter stack.
set -u
source benchmarks/gpu/setup_h200.sh
python3 -c "import scipy, pydantic, fastapi, servescope.study" || exit 1
echo "python3: $(command -v python3); suite python: $(ls /opt/torch/.venv/bin/python3 2>&1)"
[ -f .device/amx_tiles.so ] && python3 benchmarks/gpu/amx_site_check.py .device/amx_tiles.so > $OUT/amx_site_check.txt 2>&1
rm -rf /tmp/store && mkdir -p /tmp/store
[ "$THREAD" = 05 ] && tar xzf .device/run2store/store.tgz -C /tmp
PYTHONUNBUFFERED=1 timeout ${BUDGET_S:-540} python3 - "$THREAD" <<'PY' 2>&1 | tee $OUT/run.log | grep -v "^\s*$" | tail -40
import sys, time, yaml
from servescope.context import context
from servescope.threads import graph_modes as t02, torch_compile as t05
suite = yaml.safe_load(open("data/suites/transformers-gpu.yaml"))
nb = next(n for n in suite["notebooks"] if n["id"].startswith(sys.argv[1]))
p = nb.get("parameters", {})
kw = dict(repetitions=p["repetitions"], max_repetitions=p["max_repetitions"], store_dir="/tmp/store",
          telemetry=suite.get("telemetry"), progress=False)
t0 = time.time()
if sys.argv[1] == "02":
    gs = t02.run(context(suite["engine"], suite["model"], suite["load"], **kw))
    print("stopped:", gs.study.results.stopped)
    for f in t02.findings(gs):
        print("FINDING", f.title, "|", f.confidence, "|", f.effect.text() if f.effect else "")
else:
    st = t05.run(context(suite["engine"], suite["model"], suite["load"], **kw))
    print("stopped:", st.results.stopped)
    for f in t05.findings(st):
        print("FINDING", f.title, "|", f.confidence, "|", f.effect.text() if f.effect else "")
print(f"wall_s={time.time() - t0:.0f}")
PY
tar czf $OUT/store.tgz -C /tmp store
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $OUT/gpu.txt 2>&1
