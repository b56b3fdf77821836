#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# usage: scripts/gpu-check.sh [--bundle DIR] [--logs DIR] [--stand-in] [--budget SECONDS]
#                             [--steps LIST]              (-h, --help: this text)
#
# Everything that needs a GPU, in one command, in a few minutes on one GPU: the GPU unit
# tests (driver, pack/unpack kernels against the host, the FP8 quantization kernel's codes and
# scales bit for bit against the host reference, and 4 ranks refitting bf16 into FP8 device
# buffers, checked the same way), the pack kernels' bandwidth against cuMemcpyDtoD
# (pack_bench), the compare-and-compact kernels of delta refits on device buffers
# (delta-kernel: encode and apply GB/s per chunk size and changed fraction, every message the
# host codec's byte for byte; delta_dev_bench), 4 processes refitting device buffers with the
# fan-out through CUDA IPC (cuMemAlloc destinations), through cuMemCreate memory shared by
# POSIX descriptor, through host staging (RESHARD_CUDA_IPC=0), and as delta refits with 5 %
# changed between refits (refit-delta: device snapshots and the kernels inside the executor),
# a refit through real NCCL (RESHARD_EXECUTOR=nccl), real NCCL carrying its collectives over the plugin (net-plugin: two
# processes on the one GPU that NCCL_HOSTID makes two hosts, all_reduce, all_gather and
# sendrecv from 8 B to 256 MiB with every element checked, the plugin's busbw beside NCCL's own
# Socket network's, both on loopback; NCCL's log must say 'Using network Reshard'), the DTensor
# mapping check and the Python tests; then a table.
#
# It runs from a bundle (scripts/gpu-bundle.sh, default build/gpu-bundle) on a machine that
# builds nothing, else from a build folder (default build, made if missing). First it probes
# what the machine and its sandbox allow (scripts/gpu-probe.py: process_vm_writev,
# pidfd_getfd, CUDA IPC, cuMemCreate descriptors, torch, numpy; what it cannot tell, the
# steps run without knowing); each step then ends as
#   PASS     it ran and every check held (a refused call it could do without is named)
#   SKIP     what it needs is absent here (no GPU, no torch, no NCCL, no time left)
#   REFUSED  it failed at a call the probe found refused: the sandbox, not the code
#   FAIL     it failed otherwise: a defect (also when a refused call is not what it failed at)
# Exit status: 1 when a step FAILs, else 0; 2 for bad usage.
#
#   --bundle DIR   the bundle or build folder to run (default: build/gpu-bundle, else build)
#   --logs DIR     where each step's log and the table go (default: a new /tmp/gpu-check.*)
#   --stand-in     the stand-in libcuda and libnccl of test/fake instead of a GPU: proves the
#                  plumbing on any machine, on small sizes (the stand-in's device memory is
#                  host memory: the kernels' speed and the memory-kind test mean nothing there;
#                  the stand-in NCCL loads no network plugin and writes no log, so net-plugin
#                  checks every element but not the log, and says so)
#   --budget S     stop starting steps after S seconds (default 450: all done in 8 minutes)
#   --steps LIST   only these steps, comma separated (bundle and probe always run): device,
#                  gpu-unit, pack, delta-kernel, refit-ipc, refit-vmm, refit-staged, refit-delta,
#                  nccl, net-plugin, m2n, dtensor, python
# Environment: PYTHON (default: the first python3 that has numpy), NCCL_MIB, REFIT_MIB and
# NET_MIB (256, or 8, 4 and 1 with --stand-in), NCCL_NET_GDR_LEVEL (net-plugin's, default SYS:
# GPUDirect wherever the network offers it), NET_LOG_CHECK=1 (check NCCL's log on the stand-in
# too, where it must fail: for the tests), and the RESHARD_* settings; RESHARD_NCCL_LIB is
# found in pip's nvidia packages when unset.
set -uo pipefail
cd "$(dirname "$0")/.."

BUNDLE='' LOGS='' STAND_IN=0 BUDGET=450 STEPS=''
ALL_STEPS=device,gpu-unit,pack,delta-kernel,refit-ipc,refit-vmm,refit-staged,refit-delta,nccl,net-plugin,m2n,dtensor,python
die() { echo "gpu-check: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case $1 in
    -h | --help) awk 'NR > 3 && !/^#/ { exit } NR > 3 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    --bundle) [ $# -ge 2 ] || die "--bundle needs a folder"; BUNDLE=$2; shift 2 ;;
    --logs) [ $# -ge 2 ] || die "--logs needs a folder"; LOGS=$2; shift 2 ;;
    --stand-in) STAND_IN=1; shift ;;
    --steps)
        [ $# -ge 2 ] || die "--steps needs a list"
        for x in ${2//,/ }; do
            [[ ,$ALL_STEPS, == *,$x,* ]] || die "--steps: no step '$x' (steps: $ALL_STEPS)"
        done
        STEPS=$2
        shift 2
        ;;
    --budget)
        [[ ${2:-} =~ ^[0-9]+$ ]] || die "--budget needs a number of seconds"
        BUDGET=$2
        shift 2
        ;;
    *) die "unknown argument '$1' (-h says more)" ;;
    esac
done
NCCL_MIB=${NCCL_MIB:-$([ $STAND_IN = 1 ] && echo 8 || echo 256)}
REFIT_MIB=${REFIT_MIB:-$([ $STAND_IN = 1 ] && echo 4 || echo 256)}
NET_MIB=${NET_MIB:-$([ $STAND_IN = 1 ] && echo 1 || echo 256)}
STEPS=${STEPS:-$ALL_STEPS}
if [ -z "$BUNDLE" ]; then
    BUNDLE=build
    [ -e build/gpu-bundle/BUNDLE.txt ] && BUNDLE=build/gpu-bundle
fi
B=$(realpath -m "$BUNDLE")
if [ -n "$LOGS" ]; then
    mkdir -p "$LOGS" || die "cannot make $LOGS"
    LOG=$(realpath "$LOGS")
else
    LOG=$(mktemp -d /tmp/gpu-check.XXXX)
fi
if [ -n "${PYTHON:-}" ]; then
    PY=$PYTHON
else
    PY=python3
    for p in python3 /usr/bin/python3; do
        if "$p" -c 'import numpy' 2>/dev/null; then PY=$p; break; fi
    done
fi

# ---- what runs, and with which libraries (never LD_LIBRARY_PATH: torch shares the process)

export RESHARD_BUILD=$B RESHARD_LIB=$B/lib/libnccl-net-reshard.so
[ -e "$B/lib/libucp.so.0" ] && export RESHARD_UCX_LIB=$B/lib/libucp.so.0
[ -e "$B/lib/libjansson.so.4" ] && export RESHARD_JANSSON_LIB=$B/lib/libjansson.so.4
if [ $STAND_IN = 1 ]; then
    export RESHARD_CUDA_LIB=$B/test/fake/libcuda.so.1 RESHARD_NCCL_LIB=$B/test/fake/libnccl.so.2
elif [ -z "${RESHARD_NCCL_LIB:-}" ]; then  # pip's NCCL (nvidia-nccl-cu13), else the loader's
    nccl=$("$PY" -c 'import glob, site, sys
for d in site.getsitepackages() + [site.getusersitepackages()] + sys.path:
    for f in sorted(glob.glob(d + "/nvidia/**/libnccl.so.2", recursive=True)):
        print(f); sys.exit()' 2>/dev/null)
    [ -n "$nccl" ] && export RESHARD_NCCL_LIB=$nccl
fi

rows=() failed=0 refused=0
declare -A state=() detail=()
budget_end=$((SECONDS + BUDGET))

# The call a refused capability fails at, as the library's messages name it.
signature() {
    case $1 in
    cma) echo 'process_vm_writev' ;;
    pidfd) echo 'pidfd_getfd|pidfd_open' ;;
    cuda-ipc) echo 'cuIpcOpenMemHandle|cuIpcGetMemHandle' ;;
    vmm-fd) echo 'cuMemExportToShareableHandle|cuMemImportFromShareableHandle|cuMemCreate' ;;
    *) echo '^$' ;;
    esac
}

row() {  # row NAME STATUS SECONDS DETAIL
    rows+=("$(printf '%-13s %-7s %6ss  %s' "$1" "$2" "$3" "${4:0:150}")")
    echo "${rows[-1]}"
    echo "${rows[-1]}" >>"$LOG/summary.txt"
}

# step NAME "NEEDS" LIMIT CMD...: runs CMD (output in LOG/NAME.log), at most LIMIT seconds
# and never past the budget, and judges it as the header says. Exit 77 from CMD is a SKIP.
step() {
    local name=$1 needs=$2 limit=$3 need left t0 rc last why=''
    shift 3
    [[ $name == bundle || $name == probe || ,$STEPS, == *,$name,* ]] || return 0
    left=$((budget_end - SECONDS))
    if [ "$left" -le 5 ]; then
        row "$name" SKIP 0 "out of time: the check's budget of $BUDGET s is spent (--budget)"
        return
    fi
    for need in $needs; do
        if [ "${state[$need]:-ok}" = absent ]; then
            row "$name" SKIP 0 "needs $need: ${detail[$need]}"
            return
        fi
    done
    [ "$limit" -gt "$left" ] && limit=$left
    t0=$SECONDS
    timeout -k 10 "$limit" bash -c '"$@"' "$name" "$@" >"$LOG/$name.log" 2>&1
    rc=$?
    last=$(grep -v '^\s*$' "$LOG/$name.log" | tail -1)
    local refusals=() named=()
    for need in $needs; do
        [ "${state[$need]:-ok}" = refused ] || continue
        refusals+=("$need")
        grep -Eq "$(signature "$need")" "$LOG/$name.log" && named+=("$need")
    done
    if [ $rc = 0 ]; then
        [ ${#refusals[@]} = 0 ] || why=" (the sandbox refuses ${refusals[*]}: done without)"
        row "$name" PASS $((SECONDS - t0)) "$last$why"
    elif [ $rc = 77 ]; then
        row "$name" SKIP $((SECONDS - t0)) "$last"
    elif [ ${#named[@]} -gt 0 ]; then
        refused=$((refused + 1))
        row "$name" REFUSED $((SECONDS - t0)) \
            "the sandbox refuses ${named[0]} (${detail[${named[0]}]}): $(grep -Em1 "$(signature "${named[0]}")" "$LOG/$name.log")"
    else
        failed=1
        [ $rc = 124 ] && last="timed out after $limit s; $last"
        [ ${#refusals[@]} = 0 ] || last="$last [${refusals[*]} refused here, but the failure does not name it]"
        row "$name" FAIL $((SECONDS - t0)) "$last"
        echo "---- $name (tail of $LOG/$name.log)"
        tail -20 "$LOG/$name.log"
    fi
}

# ---- the steps

bundle() {
    if [ -e "$B/BUNDLE.txt" ]; then
        head -2 "$B/BUNDLE.txt"
    elif [ -e "$B/test/unit" ] && [ -e "$RESHARD_LIB" ]; then
        echo "build folder $BUNDLE"
    elif command -v cc >/dev/null && command -v make >/dev/null; then
        make -j"$(nproc)" BUILD="$BUNDLE" all "$BUNDLE/test/unit" "$BUNDLE/test/perf/nccl_check" \
            "$BUNDLE/test/perf/nccl_net_check" "$BUNDLE/test/perf/m2n_check" "$BUNDLE/test/perf/pack_bench" "$BUNDLE/test/perf/delta_dev_bench" "$BUNDLE/test/perf/device_refit" \
            "$BUNDLE/test/fake/libcuda.so.1" "$BUNDLE/test/fake/libnccl.so.2" && echo "built $BUNDLE"
    else
        echo "no bundle at $BUNDLE and no compiler here: run scripts/gpu-bundle.sh where you build"
        return 1
    fi
}

probe() {
    "$PY" scripts/gpu-probe.py >"$LOG/probe.txt" || return 1
    cat "$LOG/probe.txt"
    local n=()
    for st in ok refused absent unknown; do n+=("$(awk -v s=$st '$2 == s' "$LOG/probe.txt" | wc -l) $st"); done
    echo "${n[0]}, ${n[1]}, ${n[2]}, ${n[3]}: $(awk '$2 != "ok" { printf "%s%s %s", s, $1, $2; s = ", " }' "$LOG/probe.txt")"
}

device() {
    if [ $STAND_IN = 1 ]; then
        echo "the stand-in driver $RESHARD_CUDA_LIB"
    elif command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    fi
    echo "$CUDA_DETAIL"
}

# The GPU cases must run on a GPU, not skip. The stand-in answers the kernel checks only (pack
# and FP8 quantization, the FP8 refit; its device memory is host memory, which the memory-kind test rightly
# refuses as device memory).
gpu_unit() {
    local out rc
    # (BXFI_MAP: set when this runs under Criterion itself, which the inner run would obey)
    out=$(env -u BXFI_MAP "$B/test/unit" --verbose -j1 \
        --filter "gpu/$([ $STAND_IN = 1 ] && echo '@(pack|quant|delta)_*' || echo '*')" 2>&1)
    rc=$?
    echo "$out"
    if [ $STAND_IN = 0 ] && grep -q '^\[SKIP\] gpu::' <<<"$out"; then
        echo "a GPU test skipped on a GPU machine: $(grep -m1 '^\[SKIP\] gpu::' <<<"$out")"
        return 1
    fi
    grep 'Synthesis' <<<"$out"
    return $rc
}

pack() {
    if [ $STAND_IN = 1 ]; then
        echo "the stand-in runs kernels on the host: their speed against DtoD means nothing"
        return 77
    fi
    "$B/test/perf/pack_bench"
}

# The compare-and-compact kernels (delta refits of device buffers): encode (with the size read
# back, as the executor does per chunk) and apply, in GB/s of chunk bytes, beside DtoD, at 4
# and 64 MiB chunks; every message checked against the host codec. On the stand-in: the checks
# on a 1 MiB chunk (the kernels run emulated on the host: their speed means nothing).
delta_kernel() {
    local out rc
    out=$("$B/test/perf/delta_dev_bench" $([ $STAND_IN = 1 ] && echo 1 || echo 4 64) 2>&1)
    rc=$?
    echo "$out"
    if [ $rc != 0 ] && [ $STAND_IN = 1 ] && grep -q 'built without nvcc' <<<"$out"; then
        echo "the library was built without nvcc: no kernels to check (a GPU bundle needs them)"
        return 77
    fi
    [ $rc = 0 ] || return $rc
    if [ $STAND_IN = 1 ]; then
        echo "every message the host codec's, every chunk right (stand-in: kernels emulated, GB/s mean nothing)"
        return 0
    fi
    awk '$3 == "5%" || $3 == "100%" || ($3 == "0%") { k = $1 " " $3; e[k] = $4; a[k] = $5 }
         END { printf "encode GB/s at 64 MiB: 0%% %s, 5%% %s, 100%% %s; apply 5%% %s; at 4 MiB: 5%% %s; host codec bytes right\n",
               e["64.0 0%"], e["64.0 5%"], e["64.0 100%"], a["64.0 5%"], e["4.0 5%"] }' <<<"$out"
}

have_nccl() {
    if [ -z "${RESHARD_NCCL_LIB:-}" ] && ! ldconfig -p 2>/dev/null | grep libnccl.so.2 >/dev/null; then
        echo "no libnccl.so.2: not in pip's nvidia packages for $PY nor on the loader's path"
        return 1
    fi
}

nccl() {
    have_nccl || return 77
    "$B/test/perf/nccl_check" "$NCCL_MIB"
}

# Real NCCL's collectives over a network: nccl_net_check's two processes on the one GPU, two
# hosts to NCCL (NCCL_HOSTID; multi-node NVLink off, the only path between two hosts besides
# the network), first over the plugin (NCCL_NET_PLUGIN, its full path), then over NCCL's own
# Socket network; both on loopback (the plugin's UCX over TCP, or verbs where a port is active;
# NCCL's sockets), GPUDirect wherever the network offers it. NCCL's log (a file per process)
# must say that the plugin carried the run.
net_plugin() {
    local net rc logs gdr
    have_nccl || return 77
    for net in Reshard Socket; do
        rm -f "$LOG/net-plugin.$net".*
        env NCCL_NET=$net NCCL_NET_PLUGIN="$([ $net = Reshard ] && echo "$RESHARD_LIB" || echo none)" \
            NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,ENV \
            NCCL_DEBUG_FILE="$LOG/net-plugin.$net.nccl.%p.log" NCCL_SOCKET_IFNAME==lo \
            NCCL_IB_DISABLE=1 NCCL_MNNVL_ENABLE=0 NCCL_NET_GDR_LEVEL="${NCCL_NET_GDR_LEVEL:-SYS}" \
            RESHARD_NET_DEVICES==lo RESHARD_NET_ALLOW_LO=1 \
            "$B/test/perf/nccl_net_check" "$NET_MIB" >"$LOG/net-plugin.$net.txt" 2>&1
        rc=$?
        echo "---- NCCL_NET=$net"
        cat "$LOG/net-plugin.$net.txt"
        if [ $rc != 0 ]; then
            grep -h 'WARN' "$LOG/net-plugin.$net".nccl.*.log 2>/dev/null | head -5
            return $rc
        fi
    done
    echo "---- busbw (GB/s), the plugin's and NCCL's Socket network's"
    awk '$1 ~ /^(all_reduce|all_gather|sendrecv)$/ {
             k = $1 " " $2; if (FILENAME ~ /Reshard/) { r[k] = $7; order[++n] = k } else s[k] = $7 }
         END { printf "%-10s %12s %8s %8s %6s\n", "# op", "size(B)", "Reshard", "Socket", "ratio"
               for (i = 1; i <= n; i++) {
                   k = order[i]
                   split(k, f, " ")
                   ratio = s[k] > 0 ? sprintf("%.2f", r[k] / s[k]) : "-"
                   printf "%-10s %12s %8.3f %8.3f %6s\n", f[1], f[2], r[k], s[k], ratio } }' \
        "$LOG/net-plugin.Reshard.txt" "$LOG/net-plugin.Socket.txt"
    local at
    at=$(awk -v m="$NET_MIB" '$1 ~ /^(all_reduce|all_gather|sendrecv)$/ && $2 == m * 1048576 {
             k = $1; if (FILENAME ~ /Reshard/) r[k] = $7; else s[k] = $7 }
         END { printf "all_reduce %.3g/%.3g, all_gather %.3g/%.3g, sendrecv %.3g/%.3g",
               r["all_reduce"], s["all_reduce"], r["all_gather"], s["all_gather"], r["sendrecv"],
               s["sendrecv"] }' "$LOG/net-plugin.Reshard.txt" "$LOG/net-plugin.Socket.txt")
    if [ $STAND_IN = 1 ] && [ "${NET_LOG_CHECK:-0}" != 1 ]; then
        echo "NCCL's log is not checked: the stand-in NCCL loads no plugin and writes no log"
        echo "busbw GB/s Reshard/Socket at $NET_MIB MiB: $at; #wrong 0; stand-in: no log"
        return 0
    fi
    logs=("$LOG"/net-plugin.Reshard.nccl.*.log)
    [ -e "${logs[0]}" ] || { echo "NCCL wrote no log (NCCL_DEBUG_FILE=$LOG/net-plugin.Reshard.nccl.%p.log)"; return 1; }
    grep -h 'NET/Plugin\|NET/Reshard\|Using network\|GPU Direct RDMA\| via NET/' "${logs[@]}" | sort -u | head -20
    for net in Reshard Socket; do  # each rank's log: rank 0 alone could not connect over it
        if [ "$(grep -l "Using network $net" "$LOG/net-plugin.$net".nccl.*.log 2>/dev/null | wc -l)" -lt 2 ]; then
            echo "NCCL's log does not say 'Using network $net' for both ranks (NCCL_NET=$net): $(grep -h 'WARN\|Using network' "$LOG/net-plugin.$net".nccl.*.log 2>/dev/null | head -1)"
            return 1
        fi
        if ! grep -q " via NET/$net/" "$LOG/net-plugin.$net".nccl.*.log; then
            echo "NCCL's log shows no channel via NET/$net: it did not connect the ranks over the network"
            return 1
        fi
    done
    gdr="GDR off"
    grep -q " via NET/Reshard/[0-9]*/GDRDMA" "${logs[@]}" && gdr="GDR on"
    echo "busbw GB/s Reshard/Socket at $NET_MIB MiB: $at; #wrong 0; Using network Reshard, $gdr"
}

# NCCL M2N's C API (libreshard-m2n.so) on the GPU with real NCCL: one rank, every placement
m2n() {
    have_nccl || return 77
    "$B/test/perf/m2n_check" "$NCCL_MIB"
}

python_tests() {
    "$PY" -m unittest discover -s python/tests 2>&1
}

# Steps run under timeout in a child bash: it needs the functions and what they read.
export -f bundle probe device gpu_unit pack delta_kernel have_nccl nccl net_plugin m2n python_tests
export B BUNDLE STAND_IN PY NCCL_MIB NET_MIB LOG CUDA_DETAIL=''
echo "gpu-check: $BUNDLE, $([ $STAND_IN = 1 ] && echo "stand-in driver" || echo "the GPU"), python $PY, logs $LOG"
: >"$LOG/summary.txt"
step bundle "" 600 bundle
[ "${rows[-1]:14:4}" = PASS ] || { echo "gpu-check: nothing to run"; exit 1; }
step probe "" 90 probe
while read -r cap st rest; do
    state[$cap]=$st
    detail[$cap]=${rest:-$st}
done <"$LOG/probe.txt"
CUDA_DETAIL=${detail[cuda]:-}
step device "cuda" 30 device
step gpu-unit "cuda" 180 gpu_unit
step pack "cuda" 120 pack
step delta-kernel "cuda" 120 delta_kernel
step refit-ipc "cuda cuda-ipc" 120 "$B/test/perf/device_refit" "$REFIT_MIB"
step refit-vmm "cuda vmm-fd pidfd" 120 env DEVICE_REFIT_VMM=1 "$B/test/perf/device_refit" "$REFIT_MIB"
step refit-staged "cuda cma" 120 env RESHARD_CUDA_IPC=0 "$B/test/perf/device_refit" "$REFIT_MIB"
step refit-delta "cuda cuda-ipc" 120 env DEVICE_REFIT_CHANGED=5 "$B/test/perf/device_refit" "$REFIT_MIB"
step nccl "cuda" 120 nccl
step net-plugin "cuda" 150 net_plugin
step m2n "cuda" 120 m2n
step dtensor "torch" 180 "$PY" python/tests/dtensor_check.py
step python "numpy cma" 240 python_tests
echo
printf '%-13s %-7s %7s  %s\n' step result time detail
printf '%s\n' "${rows[@]}"
echo "$(grep -c ' PASS ' "$LOG/summary.txt") passed, $(grep -c ' FAIL ' "$LOG/summary.txt") failed, $(grep -c ' SKIP ' "$LOG/summary.txt") skipped, $refused refused by the sandbox, in $SECONDS s; logs: $LOG"
exit $failed
