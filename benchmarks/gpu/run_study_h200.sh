#!/usr/bin/env bash
# Threads 02 and/or 05 for real on the H200 machine: `servescope run` with the transformers adapter on a random-weight
# MoE large enough to keep the GPU busy for milliseconds per step. Run through the device tool from the repository
# root with .device carried (wheels from ../shared/tools/gpu-wheels.sh .device/wheels scipy ijson).
# Usage: NOTEBOOKS="02_piecewise_cuda_graphs" REPS=2 [PROFILE='{kind: nsys}'] bash benchmarks/gpu/run_study_h200.sh
# Writes $OUT/store.tgz (the result store), $OUT/reports.tgz (HTML, findings, executed notebooks), $OUT/run.log.
set -u
NOTEBOOKS=${NOTEBOOKS:-"02_piecewise_cuda_graphs 05_torch_compile"}
REPS=${REPS:-2}
source benchmarks/gpu/setup_h200.sh
python3 -c "import papermill, nbconvert, scipy, servescope.report, servescope.study" || exit 1
suite=$PWD/${SUITE:-data/suites/transformers-gpu.yaml}
entries=""
for nb in $NOTEBOOKS; do entries+="  - {id: $nb, parameters: {repetitions: $REPS}}"$'\n'; done
# the reference suite with the notebooks asked for (same engine, model and load, so the store keys match)
sed '/^notebooks:/Q' "$suite" > /tmp/h200.yaml
# PROFILE='{kind: nsys, concurrency: 8, num_requests: 16}' profiles one window after each point (other store keys)
[ -n "${PROFILE:-}" ] && echo "profile: $PROFILE" >> /tmp/h200.yaml
echo "notebooks:" >> /tmp/h200.yaml
printf '%s' "$entries" >> /tmp/h200.yaml
sed -i "s#^  python: .*#  python: $(command -v python3)#" /tmp/h200.yaml
cat /tmp/h200.yaml
mkdir -p /tmp/store && [ -f .device/store.tgz ] && tar xzf .device/store.tgz -C /tmp
timeout ${BUDGET_S:-540} python3 -m servescope.cli run /tmp/h200.yaml --reports-dir /tmp/reports --store-dir /tmp/store \
  --run-id "h200-$(date +%H%M%S)" 2>&1 | tee $OUT/run.log | grep -v "IPKernelApp" | tail -60
tar czf $OUT/store.tgz -C /tmp store
tar czf $OUT/reports.tgz -C /tmp reports
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $OUT/gpu.txt 2>&1
