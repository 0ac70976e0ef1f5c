#!/usr/bin/env bash
# Which columnar exports the H200's Nsight Systems writes (parquetdir, arrowdir), what their tables and columns are,
# how long each export takes beside SQLite, and whether the kernel table read from each agrees. Run through the
# device tool from the repository root with .device/nsys-lib carried. Writes $OUT/columnar/ (small exports of the
# launch-bound workload as test fixtures) and $OUT/columnar.txt.
set -u
H=/opt/nvidia/nsight-compute/2025.3.1/host
export LD_LIBRARY_PATH=$PWD/.device/nsys-lib:${LD_LIBRARY_PATH:-}
export PATH=$H/target-linux-x64:$H/linux-desktop-glibc_2_11_3-x64:$PATH
export PYTHONPATH=$PWD/lib
W=/tmp/col; mkdir -p $W $OUT/columnar
exec > >(tee $OUT/columnar.txt) 2>&1
nsys --version
nsys export --help | sed -n '/--type/,/^ *-[a-z]/p' | head -30
for w in launch_bound many_kernels; do
  nsys profile -o $W/$w --force-overwrite=true --trace=cuda,nvtx --sample=none --cpuctxsw=none \
    --cuda-graph-trace=node python3 benchmarks/gpu/profile_workloads.py $w > $W/$w.profile.log 2>&1 \
    || { echo "nsys profile $w failed"; tail -20 $W/$w.profile.log; }
  for t in sqlite parquetdir arrowdir; do
    s=$(date +%s.%N)
    if [ $t = sqlite ]; then o=$W/$w.sqlite; else o=$W/${w}_$t; fi
    nsys export --type $t --output $o --force-overwrite=true $W/$w.nsys-rep > $W/$w.$t.log 2>&1 \
      && echo "export $w $t: $(python3 -c "import time; print(f'{time.time() - $s:.2f}')") s, $(du -sh $o | cut -f1)" \
      || { echo "export $w $t FAILED"; tail -5 $W/$w.$t.log; }
  done
done
python3 - <<'PY'
import pathlib, time
import pyarrow.parquet as pq
for d in sorted(pathlib.Path("/tmp/col").glob("launch_bound_*dir")):
    print("==", d.name, sorted(p.name for p in d.iterdir())[:80])
    for name in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "StringIds", "NVTX_EVENTS",
                 "ANALYSIS_DETAILS", "TARGET_INFO_SESSION_START_TIME"):
        hits = sorted(d.glob(name + ".*"))
        for h in hits:
            try:
                t = pq.read_table(h) if h.suffix == ".parquet" else None
                print(h.name, t.num_rows if t is not None else "", t.schema if t is not None else "")
            except Exception as e:
                print(h.name, "unreadable as parquet:", e)
from servescope.profile import nsys
for w in ("launch_bound", "many_kernels"):
    t0 = time.perf_counter(); a = nsys.read_kernels(pathlib.Path(f"/tmp/col/{w}.sqlite")); ta = time.perf_counter() - t0
    print(w, "sqlite", len(a), f"{ta:.2f} s", a["graph_node"].notna().sum(), "graph kernels")
    d = pathlib.Path(f"/tmp/col/{w}_parquetdir")
    if d.is_dir():
        t0 = time.perf_counter(); b = nsys.read_kernels(d); tb = time.perf_counter() - t0
        print(w, "parquetdir", len(b), f"{tb:.2f} s", b["graph_node"].notna().sum(), "graph kernels")
        same = a.reset_index(drop=True)[["start_ns", "end_ns", "device", "stream", "correlation"]].equals(
            b.reset_index(drop=True)[["start_ns", "end_ns", "device", "stream", "correlation"]])
        print(w, "same kernel table from both:", same, (a["name"].astype(str).values == b["name"].astype(str).values).all())
        ra, rb = nsys.read_runtime(pathlib.Path(f"/tmp/col/{w}.sqlite")), nsys.read_runtime(d)
        print(w, "runtime rows", len(ra), len(rb), "same:", ra[["start_ns", "end_ns", "correlation"]].reset_index(
            drop=True).equals(rb[["start_ns", "end_ns", "correlation"]].reset_index(drop=True)),
            (ra["name"].values == rb["name"].values).all())
        na, nb = nsys.read_nvtx(pathlib.Path(f"/tmp/col/{w}.sqlite")), nsys.read_nvtx(d)
        print(w, "nvtx", na.to_dict("records"), nb.to_dict("records"))
        print(w, "session start", nsys.session_start_unix_ns(pathlib.Path(f"/tmp/col/{w}.sqlite")),
              nsys.session_start_unix_ns(d), "window", nsys.read_window(pathlib.Path(f"/tmp/col/{w}.sqlite")),
              nsys.read_window(d))
        s0 = time.perf_counter(); nsys.export(nsys.locate_nsys(), pathlib.Path(f"/tmp/col/{w}.nsys-rep"))
        print(w, "nsys.export() wrote", "parquetdir" if pathlib.Path(f"/tmp/col/{w}_parquetdir").is_dir() else "?",
              f"in {time.perf_counter() - s0:.2f} s")
PY
# the tables the suite reads, as fixtures (the rest of the folder is enum and metadata tables)
mkdir -p $OUT/columnar/launch_bound_parquetdir
for t in CUPTI_ACTIVITY_KIND_KERNEL CUPTI_ACTIVITY_KIND_RUNTIME StringIds NVTX_EVENTS ANALYSIS_DETAILS \
    TARGET_INFO_SESSION_START_TIME TARGET_INFO_GPU; do
  cp $W/launch_bound_parquetdir/$t.parquet $OUT/columnar/launch_bound_parquetdir/ 2>/dev/null
done
cp $W/launch_bound.sqlite $OUT/columnar/ 2>/dev/null
ls -la $OUT/columnar
