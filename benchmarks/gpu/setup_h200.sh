# Sourced by the H200 scripts, from the repository root with .device carried: the wheels the machine lacks (WHEELS,
# default .device/wheels)
# (../shared/tools/gpu-wheels.sh .device/wheels scipy ijson), Nsight Systems and its missing library
# (../shared/tools/gpu-nsys-libs.sh .device/nsys-lib), nbconvert's templates, and a cache of its own.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site ${WHEELS:-.device/wheels}/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD/lib
export LD_LIBRARY_PATH=$PWD/.device/nsys-lib:${LD_LIBRARY_PATH:-}
H=/opt/nvidia/nsight-compute/2025.3.1/host
export PATH=$H/target-linux-x64:$H/linux-desktop-glibc_2_11_3-x64:$PATH
export SERVESCOPE_CACHE=/tmp/sscache
export JUPYTER_PATH=/tmp/site/share/jupyter  # nbconvert's templates, installed with --target
