#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# usage: scripts/bench-net.sh [SIZE]   (SIZE in bytes, default 4194304; REPEAT=N runs, default 3)
#        scripts/bench-net.sh --verbs [SIZE...]   (default 1048576 67108864)
#        scripts/bench-net.sh -h | --help: this text
#
# The NCCL net plugin's data path against UCX's own best over the same TCP path.
#
# Two processes on two emulated nodes (scripts/cluster.sh, uncapped links) when this host can
# make them, else two processes over loopback. Each run, back to back on the same path:
#   reshard_net_perf -b SIZE -e SIZE -n 1000   isend/irecv through ncclNetPlugin_v12, 8 in flight
#   ucx_perftest -t tag_bw -s SIZE -n 1000      UCX_TLS=tcp, the better of poll and sleep modes
# then the full reshard_net_perf table (8 B - 64 MiB) once. Prints the medians and the ratio;
# target: the plugin reaches >= 80 % of ucx_perftest at 4 MiB.
#
# --verbs: the same data path on the verbs transport against the verbs limit, perftest's
# ib_write_bw, on soft-RoCE: scripts/rxe-test.sh's parts rxe-up and perf-ib-vs-verbs in its
# qemu VM (RXE_VERBS_SIZES=SIZE...; TIMEOUT, MEM, SMP, RXE_CACHE as rxe-test.sh -h says).
# Each size, in one run on rxe0: ib_write_bw with one QP writing SIZE and with the plugin's
# striping (K QPs x SIZE/K), then reshard_net_perf -b SIZE -e SIZE with RESHARD_TRANSPORT=ib,
# the same message count (~100 MiB, at least 5); prints size, reshard_net_perf GB/s, the
# better ib_write_bw GB/s and their ratio (target: >= 0.9 at 64 MiB). make test-rdma runs the
# same part. TCG figures measure the emulator, not a NIC: compare within one run only.
set -euo pipefail
cd "$(dirname "$0")/.."
case ${1:-} in -h | --help) awk 'NR > 3 && !/^#/ { exit } NR > 3 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;; esac
if [ "${1:-}" = --verbs ]; then
    shift
    for s in "$@"; do
        case $s in
        '' | *[!0-9]* | 0) echo "bench-net: SIZE '$s' is not a number of bytes (usage: $0 --verbs [SIZE...])" >&2; exit 2 ;;
        esac
    done
    BUILD=${BUILD:-build}
    make -s all "$BUILD/test/unit" "$BUILD/test/net_driver" BUILD="$BUILD"
    RXE_VERBS_SIZES=${*:-${RXE_VERBS_SIZES:-1048576 67108864}} RXE_PARTS="rxe-up perf-ib-vs-verbs" \
        BUILD=$BUILD exec scripts/rxe-test.sh
fi
case ${1:-4194304} in
'' | *[!0-9]*) echo "bench-net: SIZE '$1' is not a number of bytes (usage: $0 [SIZE])" >&2; exit 2 ;;
esac
[ $# -le 1 ] || { echo "bench-net: unexpected argument '$2' (usage: $0 [SIZE])" >&2; exit 2; }

SIZE=${1:-4194304}
REPEAT=${REPEAT:-3}
BUILD=${BUILD:-build}
CLUSTER=scripts/cluster.sh
PERF=$BUILD/bin/reshard_net_perf
LOG=$(mktemp -d /tmp/bench-net.XXXXXX)
trap 'rm -rf "$LOG"' EXIT

command -v ucx_perftest >/dev/null ||
    { echo "bench-net: ucx_perftest not found (apt-get install ucx-utils)" >&2; exit 2; }
make -s all BUILD="$BUILD"

if "$CLUSTER" check >/dev/null 2>&1; then
    mode="two emulated nodes (network namespaces, veth + bridge, uncapped)"
    # pair NAME CMD: CMD runs as rank 0 and rank 1, one per node; all output into LOG/NAME.
    pair() {
        local name=$1
        shift
        "$CLUSTER" run --nodes 2 --ranks-per-node 1 --rate none --timeout 300 -- \
            sh -c "$*" >"$LOG/$name" 2>&1
    }
    peer_addr='$MASTER_ADDR'
else
    mode="two processes over loopback (no network namespaces here)"
    export RESHARD_NET_ALLOW_LO=1 RESHARD_NET_DEVICES=lo UCX_NET_DEVICES=lo
    pair() {
        local name=$1
        shift
        { RANK=0 MASTER_ADDR=127.0.0.1 sh -c "$*" & RANK=1 MASTER_ADDR=127.0.0.1 sh -c "$*"
          wait; } >"$LOG/$name" 2>&1
    }
    peer_addr=127.0.0.1
fi

# One run of each; prints "reshard_GBps ucx_GBps".
run_once() {
    local i=$1 port=$((30000 + RANDOM % 10000)) ours ucx best=0 m
    pair "net$i" "exec $PERF -b $SIZE -e $SIZE -n 1000 -w 20 --role env --handle $LOG/h$i"
    ours=$(awk '!/^#/ && NF >= 7 && $1 == '"$SIZE"' { print $5; exit }' "$LOG/net$i")
    [ -n "$ours" ] || { echo "bench-net: reshard_net_perf failed:" >&2; cat "$LOG/net$i" >&2; exit 2; }
    for m in poll sleep; do
        # shellcheck disable=SC2016  # RANK and MASTER_ADDR expand in the ranks' shell
        pair "ucx$i$m" 'export UCX_TLS=tcp
            if [ "$RANK" = 0 ]; then exec ucx_perftest -p '"$port"'; fi
            sleep 1
            exec ucx_perftest '"$peer_addr"' -p '"$port"' -t tag_bw -s '"$SIZE"' -n 1000 \
                -w 50 -E '"$m"
        # Final: iters, latency (50%, avg, overall), bandwidth MB/s (avg, overall), ...
        ucx=$(sed -n 's/.*Final: *//p' "$LOG/ucx$i$m" | awk '{ printf "%.3f", $6 * 1048576 / 1e9 }')
        [ -n "$ucx" ] || { echo "bench-net: ucx_perftest failed:" >&2; cat "$LOG/ucx$i$m" >&2; exit 2; }
        best=$(awk -v a="$best" -v b="$ucx" 'BEGIN { print (b > a ? b : a) }')
        port=$((port + 1))
    done
    echo "$ours $best"
}

median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

echo "== reshard_net_perf vs ucx_perftest tag_bw, $SIZE-byte messages, $REPEAT runs"
echo "   path: $mode"
printf '   %-4s %16s %16s %7s\n' run "plugin GB/s" "ucx_perftest GB/s" ratio
: >"$LOG/runs"
for ((i = 1; i <= REPEAT; i++)); do
    read -r ours ucx < <(run_once "$i")
    echo "$ours $ucx" >>"$LOG/runs"
    printf '   %-4d %16.2f %16.2f %6.0f%%\n' "$i" "$ours" "$ucx" \
        "$(awk -v a="$ours" -v b="$ucx" 'BEGIN { print 100 * a / b }')"
done
ours=$(awk '{ print $1 }' "$LOG/runs" | median)
ucx=$(awk '{ print $2 }' "$LOG/runs" | median)
ratio=$(awk -v a="$ours" -v b="$ucx" 'BEGIN { printf "%.0f", 100 * a / b }')
printf '   %-4s %16.2f %16.2f %6s%%\n' median "$ours" "$ucx" "$ratio"
echo
echo "== reshard_net_perf, 8 B - 64 MiB, same path"
pair table "exec $PERF -b 8 -e 64M --role env --handle $LOG/ht"
grep -v '^\[rank' "$LOG/table" | grep -v 'reshard_net_perf: ' || true
echo
if [ "$ratio" -ge 80 ]; then
    echo "TARGET MET: plugin >= 80% of ucx_perftest at $SIZE bytes: $ratio%"
else
    echo "TARGET MISSED: plugin >= 80% of ucx_perftest at $SIZE bytes: $ratio%"
fi
