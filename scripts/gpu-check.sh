#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# gpu-check.sh: everything that needs a GPU, in one command (a few minutes on one GPU):
# builds, runs the GPU unit tests (driver, pack/unpack kernels against the host), the kernels'
# bandwidth against cuMemcpyDtoD on 256 MiB boxes (pack_bench), 4 processes on the GPU
# refitting device buffers with the fan-out through CUDA IPC (cuMemAlloc destinations, then
# cuMemCreate ones shared by POSIX descriptor) and then through host staging
# (RESHARD_CUDA_IPC=0), a refit through real NCCL (RESHARD_EXECUTOR=nccl), the DTensor mapping
# check and the torch tests, and prints a table. Steps whose prerequisites are missing (no
# torch, no libnccl) say SKIP and why; any FAIL makes the exit status 1.
#
#   scripts/gpu-check.sh            BUILD=build, NCCL_MIB=256
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
NCCL_MIB=${NCCL_MIB:-256}
PY=${PYTHON:-/usr/bin/python3}
CUDA=${CUDA_HOME:-/usr/local/cuda}
export LD_LIBRARY_PATH=$CUDA/lib64:${LD_LIBRARY_PATH:-}
export RESHARD_LIB=$PWD/$BUILD/libnccl-net-reshard.so
LOG=$(mktemp -d /tmp/gpu-check.XXXX)
rows=()
failed=0

# step NAME CMD...: runs CMD (its output in $LOG/NAME.log); exit 77 means SKIP. The last line
# of the output is the row's detail.
step() {
    local name=$1 t0 rc detail status
    shift
    t0=$(date +%s.%N)
    "$@" >"$LOG/$name.log" 2>&1
    rc=$?
    detail=$(grep -v '^\s*$' "$LOG/$name.log" | tail -1 | cut -c1-110)
    case $rc in
    0) status=PASS ;;
    77) status=SKIP ;;
    *) status=FAIL; failed=1 ;;
    esac
    rows+=("$(printf '%-12s %-4s %6.1fs  %s' "$name" "$status" \
        "$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')" "$detail")")
    [ "$status" = FAIL ] && { echo "---- $name (tail of $LOG/$name.log)"; tail -20 "$LOG/$name.log"; }
    return 0
}

device() {
    command -v nvidia-smi >/dev/null || { echo "no nvidia-smi"; return 77; }
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
}

build() {
    make -j"$(nproc)" all "$BUILD/test/unit" "$BUILD/test/perf/nccl_check" \
        "$BUILD/test/perf/pack_bench" "$BUILD/test/perf/device_refit" \
        "$BUILD/test/fake/libcuda.so.1" "$BUILD/test/fake/libnccl.so.2" && echo "built $BUILD"
}

# The GPU cases must run here, not skip.
gpu_unit() {
    local out
    out=$("$BUILD/test/unit" --filter 'gpu/*' --verbose -j1 2>&1)
    local rc=$?
    echo "$out"
    if grep -q '^\[SKIP\] gpu::' <<<"$out"; then
        echo "a GPU test skipped on a GPU machine: $(grep -m1 '^\[SKIP\] gpu::' <<<"$out")"
        return 1
    fi
    grep 'Synthesis' <<<"$out"
    return $rc
}

pack() {
    "$BUILD/test/perf/pack_bench"
}

device_refit() {
    "$BUILD/test/perf/device_refit" 256
}

device_refit_vmm() {
    DEVICE_REFIT_VMM=1 "$BUILD/test/perf/device_refit" 256
}

device_refit_staged() {
    RESHARD_CUDA_IPC=0 "$BUILD/test/perf/device_refit" 256
}

nccl() {
    [ -e "$CUDA/lib64/libnccl.so.2" ] || ldconfig -p | grep -q libnccl.so.2 ||
        { echo "no libnccl.so.2"; return 77; }
    "$BUILD/test/perf/nccl_check" "$NCCL_MIB"
}

dtensor() {
    "$PY" -c 'import torch' 2>/dev/null || { echo "torch is not installed"; return 77; }
    "$PY" python/tests/dtensor_check.py
}

python_tests() {
    "$PY" -m unittest discover -s python/tests 2>&1 | tail -3
}

step device device
step build build
step gpu-unit gpu_unit
step pack pack
step refit-ipc device_refit
step refit-vmm device_refit_vmm
step refit-staged device_refit_staged
step nccl nccl
step dtensor dtensor
step python python_tests
echo
printf '%-12s %-4s %7s  %s\n' step res time detail
printf '%s\n' "${rows[@]}"
echo "logs: $LOG"
exit $failed
