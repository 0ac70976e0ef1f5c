#!/usr/bin/env bash
# The whole H200 recipe (data/suites/transformers-gpu.yaml: threads 00-06 and the 99 summary) on the H200 machine,
# starting from the committed reference store (data/reference/h200/store), so points already measured there are read,
# not launched again. Run through the device tool from the repository root with .device carried (wheels from
# ../shared/tools/gpu-wheels.sh .device/wheels scipy ijson; Nsight Systems' library in .device/nsys-lib).
# Writes $OUT/store.tgz (the result store), $OUT/reports.tgz (HTML, findings, executed notebooks), $OUT/run.log.
set -u
source benchmarks/gpu/setup_h200.sh
python3 -c "import papermill, nbconvert, scipy, servescope.report, servescope.study" || exit 1
sed "s#^  python: .*#  python: $(command -v python3)#" ${SUITE:-data/suites/transformers-gpu.yaml} > /tmp/suite.yaml
rm -rf /tmp/store && cp -r data/reference/h200/store /tmp/store
timeout ${BUDGET_S:-540} python3 -m servescope.cli run /tmp/suite.yaml --reports-dir /tmp/reports --store-dir /tmp/store \
  --run-id "h200-$(date +%H%M%S)" ${ONLY:-} 2>&1 | tee $OUT/run.log | grep -v "IPKernelApp" | tail -60
tar czf $OUT/store.tgz -C /tmp store
tar czf $OUT/reports.tgz -C /tmp reports
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv > $OUT/gpu.txt 2>&1
