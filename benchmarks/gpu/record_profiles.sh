#!/usr/bin/env bash
# Record Nsight Systems and PyTorch profiler fixtures on the H200 machine (run through the device tool from the
# repository root, with .device/nsys-lib and .device/wheels carried). Writes $OUT/profiles.tar.gz.
set -u
H=/opt/nvidia/nsight-compute/2025.3.1/host
export LD_LIBRARY_PATH=$PWD/.device/nsys-lib:${LD_LIBRARY_PATH:-}
export PATH=$H/target-linux-x64:$H/linux-desktop-glibc_2_11_3-x64:$PATH
W=/tmp/profiles; mkdir -p $W
nsys --version
for w in launch_bound compute_bound; do
  nsys profile -o $W/$w --force-overwrite=true --trace=cuda,nvtx --sample=none --cpuctxsw=none \
    --cuda-graph-trace=node --trace-fork-before-exec=true python3 benchmarks/gpu/profile_workloads.py $w \
    > $W/$w.profile.log 2>&1 || { echo "nsys profile $w failed"; tail -20 $W/$w.profile.log; }
  nsys stats --report cuda_gpu_kern_sum,cuda_api_sum,nvtx_sum,cuda_gpu_mem_time_sum --format csv \
    --output $W/${w}_stats --force-export=true $W/$w.nsys-rep > $W/$w.stats.log 2>&1 || tail -20 $W/$w.stats.log
  nsys export --type sqlite --output $W/$w.sqlite --force-overwrite=true $W/$w.nsys-rep > $W/$w.export.log 2>&1 \
    || tail -20 $W/$w.export.log
done
python3 - <<'PY'
import sqlite3
con = sqlite3.connect("/tmp/profiles/launch_bound.sqlite")
for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS", "StringIds",
          "CUPTI_ACTIVITY_KIND_MEMCPY", "TARGET_INFO_GPU", "ENUM_CUDA_KERNEL_LAUNCH_TYPE"):
    try:
        cols = [r[1] for r in con.execute(f"PRAGMA table_info({t})")]
        n = con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
        print(t, n, cols)
    except Exception as e:
        print(t, "ERR", e)
print([r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")])
PY
python3 benchmarks/gpu/profile_workloads.py moe_torch $W/moe_torch_trace.json > $W/moe_torch.log 2>&1 || tail -20 $W/moe_torch.log
gzip -f $W/moe_torch_trace.json
ls -la $W
tar czf $OUT/profiles.tar.gz -C /tmp profiles --exclude='*.qdstrm'
