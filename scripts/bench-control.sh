#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Part b of scripts/bench-scale.sh: the control plane of a refit as the job grows. Qwen3-30B
# (scripts/gen-manifest.py --scale 64 --no-views: every weight, hidden sizes divided by 64) from
# expert-parallel training to tensor-parallel inference on 8, 16, 32 and 64 local ranks
# (reshard_perf -np N --manifest, domains of RESHARD_DOMAIN_SIZE ranks), one markdown row each:
# the most control bytes a rank sent and received in a steady refit (bootstrap and control
# messages both ways, reshard_perf's "Control bytes" line; and the most on any rank but the
# bootstrap's root) and in a plan's first refit, the
# slowest rank's communicator and plan creation, and the refit time.
#
# usage: scripts/bench-control.sh [-h] [NP ...]        (default: 8 16 32 64)
#   BUILD=build ITERS=5 RESHARD_DOMAIN_SIZE=4 scripts/bench-control.sh
set -eu

case "${1:-}" in -h | --help) sed -n '3,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
BUILD=${BUILD:-build}
ITERS=${ITERS:-5}
PERF=$BUILD/test/perf/reshard_perf
[ -x "$BUILD/bin/reshard_perf" ] && PERF=$BUILD/bin/reshard_perf
[ -x "$PERF" ] || { echo "bench-control: $PERF missing: run make first" >&2; exit 1; }
GEN=$(dirname "$0")/gen-manifest.py
: "${RESHARD_DOMAIN_SIZE:=4}"
export RESHARD_DOMAIN_SIZE
export UCX_LOG_LEVEL=${UCX_LOG_LEVEL:-error}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM

# ranks | training config | inference config (half the ranks each side)
config() {
    case $1 in
    8) echo "ep=4,dp=4|tp=4" ;;
    16) echo "ep=8,dp=8|tp=4,dp=2" ;;
    32) echo "ep=16,dp=16|tp=8,dp=2" ;;
    64) echo "ep=16,dp=16,pp=2|tp=8,dp=4" ;;
    *) echo "bench-control: no configuration for $1 ranks (8, 16, 32 or 64)" >&2; exit 2 ;;
    esac
}

echo "| ranks | Qwen3-30B/64, training -> inference | control bytes per steady refit (busiest rank) | first refit | communicator created | plan created | refit |"
echo "|---|---|---|---|---|---|---|"
for np in ${*:-8 16 32 64}; do
    c=$(config "$np")
    train=${c%|*}
    infer=${c#*|}
    m=$tmp/q30-$np.json
    "$GEN" --model qwen3-30b-a3b --scale 64 --no-views --train "$train" --infer "$infer" \
        -o "$m" 2>"$tmp/gen.err" || { cat "$tmp/gen.err" >&2; exit 1; }
    "$PERF" -np "$np" --manifest "$m" -n "$ITERS" -w 1 >"$tmp/out" 2>"$tmp/err" ||
        { tail -20 "$tmp/out" "$tmp/err" >&2; exit 1; }
    awk -v np="$np" -v label="$train -> $infer" '
        $1 ~ /^[0-9]+$/ && $4 == "reshard" { us = $5 }
        /^# Control bytes        :/ { steady = $7; srank = $NF }
        /^# Control bytes, first :/ { first = $8; frank = $NF }
        /^# Control bytes, others:/ { other = $7; orank = $(NF - 4) }
        /^# Communicator made in :/ { comm = $6; crank = $NF }
        /^# Plans made in        :/ { plan = $6; prank = $NF }
        END {
            gsub(/\)/, "", srank); gsub(/\)/, "", frank); gsub(/\)/, "", crank)
            gsub(/\)/, "", prank)
            gsub(/;/, "", orank)
            printf "| %d | %s | %d B (rank %s); others %d B (rank %s) | %d B (rank %s) | " \
                   "%s ms (rank %s) | %s ms (rank %s) | %.0f ms |\n", np, label, steady, srank,
                   other, orank, first, frank, comm, crank, plan, prank, us / 1000
        }' "$tmp/out"
done
