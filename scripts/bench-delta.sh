#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# usage: scripts/bench-delta.sh            (-h, --help: this text)
#
# bench-delta.sh: delta refits against full ones on an emulated cluster (scripts/cluster.sh;
# needs root). Not part of make test. Builds (make -s all), then runs bench-refit.sh (a)'s
# NIC-bound layout (6 nodes x 2 ranks, each node's NIC capped at 1gbit, a 4096x8192 bf16
# tensor by rows over ranks 0-3 to column shards replicated in pairs on ranks 4-11) with
# `reshard_perf --changed P`, RESHARD_DELTA=0 and =1 interleaved, RUNS times each, and prints
# each run's median time, the medians over the runs and their ratio, with a PASS or FAIL line
# per target (issue 28):
#   5% changed:   netMB <= 0.15 x full and time <= 0.30 x full
#   100% changed: netMB <= 1.02 x full and time <= 1.05 x full ("within noise")
# and #wrong 0 in every run. Exits 1 when a target is missed, 2 when a run fails.
#
#   Environment: BUILD (default build), RUNS (default 3), ITERS (timed iterations per run,
#   default 20: at 100% one refit in 8 compares again, so fewer iterations weigh it more).
set -euo pipefail
cd "$(dirname "$0")/.."

case ${1:-} in
    -h | --help) awk 'NR > 3 && !/^#/ { exit } NR > 3 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    '') ;;
    *) echo "bench-delta: it takes no arguments, not '$1' (-h: usage)" >&2; exit 2 ;;
esac

BUILD=${BUILD:-build}
RUNS=${RUNS:-3}
ITERS=${ITERS:-20}
PERF=$BUILD/bin/reshard_perf
make -s all >/dev/null
LOG=$(mktemp -d)
trap 'rm -rf "$LOG"' EXIT

# One run: prints "time_us netMB wrong" of reshard_perf's row.
run() {
    local pct=$1 delta=$2
    local out=$LOG/run.$pct.$delta.$3
    if ! scripts/cluster.sh run --nodes 6 --ranks-per-node 2 --rate 1gbit --timeout 600 -- \
        env RESHARD_DELTA="$delta" "$PERF" -n "$ITERS" -w 1 -c 1 --changed "$pct" \
        --src 'shape=4096x8192 dtype=bf16 ranks=0-3 mesh=4 place=S(0)' \
        --dst 'shape=4096x8192 dtype=bf16 ranks=4-11 mesh=4x2 place=S(1),R' \
        --algo reshard >"$out" 2>&1; then
        echo "bench-delta: the run failed (changed $pct%, RESHARD_DELTA=$delta):" >&2
        tail -20 "$out" >&2
        exit 2
    fi
    awk '$1 == 67108864 && $4 == "reshard" { print $5, $9, $8 }' "$out"
}

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

status=0
echo "# delta refits on the emulated cluster: $RUNS interleaved runs of $ITERS iterations each"
printf '%8s %6s %-40s %-40s %9s %7s\n' changed netMB "full: ms per run" "delta: ms per run" netMB_x time_x
for pct in 5 100; do
    : >"$LOG/full.$pct"
    : >"$LOG/delta.$pct"
    wrong=0
    for r in $(seq "$RUNS"); do
        for d in 0 1; do
            read -r t mb w < <(run "$pct" "$d" "$r")
            [ "$w" = 0 ] || wrong=1
            echo "$t $mb" >>"$LOG/$([ "$d" = 0 ] && echo full || echo delta).$pct"
        done
    done
    tf=$(awk '{ print $1 }' "$LOG/full.$pct" | median)
    td=$(awk '{ print $1 }' "$LOG/delta.$pct" | median)
    mf=$(awk '{ print $2 }' "$LOG/full.$pct" | median)
    md=$(awk '{ print $2 }' "$LOG/delta.$pct" | median)
    runs_f=$(awk '{ printf "%s%.1f", (NR > 1 ? " " : ""), $1 / 1000 }' "$LOG/full.$pct")
    runs_d=$(awk '{ printf "%s%.1f", (NR > 1 ? " " : ""), $1 / 1000 }' "$LOG/delta.$pct")
    rb=$(awk -v a="$md" -v b="$mf" 'BEGIN { printf "%.3f", a / b }')
    rt=$(awk -v a="$td" -v b="$tf" 'BEGIN { printf "%.3f", a / b }')
    printf '%7s%% %6s %-40s %-40s %9s %7s\n' "$pct" "$md" "$runs_f" "$runs_d" "$rb" "$rt"
    if [ "$pct" = 5 ]; then max_b=0.15 max_t=0.30; else max_b=1.02 max_t=1.05; fi
    for check in "netMB $rb $max_b" "time $rt $max_t"; do
        set -- $check
        if awk -v v="$2" -v m="$3" 'BEGIN { exit !(v <= m) }'; then
            echo "PASS  $pct% changed: $1 ratio $2 <= $3"
        else
            echo "FAIL  $pct% changed: $1 ratio $2 > $3"
            status=1
        fi
    done
    if [ "$wrong" = 0 ]; then echo "PASS  $pct% changed: #wrong 0 in every run"; else
        echo "FAIL  $pct% changed: a run had wrong elements"
        status=1
    fi
done
exit $status
