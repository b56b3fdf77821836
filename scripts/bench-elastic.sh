#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# usage: scripts/bench-elastic.sh [a|b]     (default: both; -h, --help: this text)
#
# bench-elastic.sh: an elastic fleet on an emulated cluster (scripts/cluster.sh; needs root and
# /usr/bin/python3 with numpy). Not part of make test. Builds the library (make -s), runs each
# part on 5 nodes x 2 ranks with every node's NIC capped at RATE, prints a table and a PASS or
# FAIL line per target; exits 1 when a target is missed, 2 when a run fails.
#
#   The job: trainers on ranks 0-3 (nodes 0-1) and inference as DP2 x TP2 on ranks 4-7 (nodes
#   2-3, one replica per node), refitting a 4096x2048 int32 weight (32 MiB; rows sharded over
#   the trainers, columns over each replica's 2 ranks) and a 128 KiB norm replicated on every
#   inference rank. Node 4 is the spare.
#   (a) replacement: after the refits before, inference rank 7 is killed (SIGKILL, no goodbye);
#       the others hear it, shrink it away and grow it back; a new process on the spare node
#       joins as rank 7 and catches up (reshard_plan_catch_up) while the trainers, who have
#       moved on to a newer version, take part only in the votes; the refits after include it.
#   (b) growth: a new TP2 replica, 2 processes on the spare node, joins as ranks 8-9 and
#       catches up the same way.
#   Printed: join time (Comm.join at the joiner, comm.grow at rank 0), the catch-up's time and
#   bytes (each rank's transport counters around it), and the refit times before and after (the
#   median of REFITS refits, each the slowest rank's time). Targets: the trainers send 0 bytes
#   for the joiners, each joiner receives exactly its shard's bytes, the catch-up's net_bytes
#   is its min_net_bytes (for (b): at most one copy of the weights into the new node), and
#   every element of every refit and of the catch-up is exact.
#
#   Environment: BUILD (default build), RATE (default 1gbit), REFITS (default 3), BENCH_LOGS (a
#   folder to keep each run's files in; default: a temporary one, removed at the end).
set -euo pipefail
cd "$(dirname "$0")/.."

case ${1:-} in -h | --help) awk 'NR > 3 && !/^#/ { exit } NR > 3 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;; esac

BUILD=${BUILD:-build}
RATE=${RATE:-1gbit}
PY=/usr/bin/python3
CLUSTER=scripts/cluster.sh
export ELASTIC_REFITS=${REFITS:-3}
export RESHARD_LIB=$PWD/$BUILD/libnccl-net-reshard.so
export RESHARD_TIMEOUT=${RESHARD_TIMEOUT:-60}
export UCX_LOG_LEVEL=${UCX_LOG_LEVEL:-error}
if [ -n "${BENCH_LOGS:-}" ]; then
    LOG=$BENCH_LOGS
    mkdir -p "$LOG"
else
    LOG=$(mktemp -d "${TMPDIR:-/tmp}/bench-elastic.XXXXXX")
    trap 'rm -rf "$LOG"' EXIT
fi
"$PY" -c 'import numpy' 2>/dev/null || { echo "bench-elastic: $PY has no numpy" >&2; exit 2; }
make -s BUILD="$BUILD" "$BUILD/libnccl-net-reshard.so" >/dev/null

status=0
part() {  # part NAME MODE TITLE
    local name=$1 mode=$2 rc=0
    echo "== ($name) $3, 5 nodes x 2 ranks, every NIC capped at $RATE"
    rm -rf "${LOG:?}/$name"
    mkdir -p "$LOG/$name"
    ELASTIC_DIR=$LOG/$name "$CLUSTER" run --nodes 5 --ranks-per-node 2 --rate "$RATE" \
        --timeout 600 --logs "$LOG/$name/logs" -- "$PY" scripts/bench-elastic.py "$mode" \
        >"$LOG/$name/out" 2>&1 || rc=$?
    if [ "$rc" != 0 ]; then
        echo "bench-elastic: ($name) failed with status $rc:" >&2
        tail -40 "$LOG/$name/out" >&2
        status=2
        return
    fi
    rc=0
    "$PY" scripts/bench-elastic.py report "$LOG/$name" "$mode" || rc=$?
    [ "$rc" = 0 ] || { [ "$status" = 2 ] || status=$rc; }
    echo
}

case ${1:-ab} in
    a) part a replace "replacement of inference rank 7" ;;
    b) part b grow "growth by a TP2 replica (ranks 8-9)" ;;
    ab)
        part a replace "replacement of inference rank 7"
        part b grow "growth by a TP2 replica (ranks 8-9)"
        ;;
    *) echo "bench-elastic: unknown part '$1' (a or b)" >&2; exit 2 ;;
esac
exit "$status"
