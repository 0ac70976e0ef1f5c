#!/usr/bin/env bash
# Threads 0 and 1 for real on the H200 machine: `servescope run` with the transformers adapter (real server, real
# NVML, real resolved arguments and log), then the nsys session check (load phases on the timeline). Run through the
# device tool from the repository root with .device carried; writes under $OUT.
set -u
source benchmarks/gpu/setup_h200.sh
python3 -c "import papermill, nbconvert, servescope.report, servescope.threads.graph_disable" || exit 1
cat > /tmp/h200.yaml <<YAML
name: h200-transformers
engine: {name: transformers, python: $(command -v python3), startup_timeout_s: 600}
model:
  tiny: {hidden_size: 512, num_attention_heads: 8, num_key_value_heads: 4, head_dim: 64, intermediate_size: 1024,
         moe_intermediate_size: 256, num_experts: 64, top_k: 8}
load: {concurrency: [1, 8], num_requests: 16, input_len: 32, output_len: 32}
telemetry: {gpu_hz: 10}
notebooks:
  - id: 00_environment
  - id: 01_cuda_graph_disable_reason
YAML
timeout 420 python3 -m servescope.cli run /tmp/h200.yaml --reports-dir $OUT/reports --store-dir /tmp/store 2>&1 | tail -40
mkdir -p $OUT/store && for d in /tmp/store/*/ /tmp/store/_failed/*/; do [ -d "$d" ] || continue; k=$(basename $d)
  mkdir -p $OUT/store/$k; cp $d/*.json $d/*.txt $d/*.log $d/*.parquet $OUT/store/$k/ 2>/dev/null; done
[ "${NSYS_CHECK:-1}" = 1 ] && { timeout 170 python3 benchmarks/gpu/check_nsys_session.py /tmp/chk > $OUT/nsys_check.txt 2>&1
  tail -25 $OUT/nsys_check.txt; }
