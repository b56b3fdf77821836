#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# The bootstrap alone (no transport) on N local processes: what forming a communicator's
# control plane costs as the job grows (issue 18, 7(c)).
#
# usage: scripts/bench-boot.sh [N ...]      (default: 256 1024; RECORD=bytes a rank, default 304)
#
# Each N runs build/test/perf/boot_scale once: N forked ranks form the bootstrap's tree, then an
# allreduce and an allgather of RECORD bytes a rank (a communicator hello: 48 bytes and a
# transport address) and a barrier; then again with libcrypto loaded before the fork (each rank
# loading it itself is most of the time at 1,024 processes on 2 cores). Prints one row per N:
# creation time (first fork to last rank formed), the most bootstrap sockets any rank holds once
# formed (/proc/self/fd), and the
# bytes sent and received at rank 0 and at the busiest rank, forming and in the collectives.
# Targets: creation of 1,024 <= 15 s here, no rank above 64 sockets.
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
-h | --help)
    sed -n '4,16p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
esac

BUILD=${BUILD:-build}
RECORD=${RECORD:-304}
TOOL=$BUILD/test/perf/boot_scale
[ $# -gt 0 ] || set -- 256 1024
for n in "$@"; do
    case $n in
    '' | *[!0-9]*) echo "bench-boot: '$n' is not a number of ranks (-h says more)" >&2; exit 2 ;;
    esac
done
make -s "$TOOL" BUILD="$BUILD"

kib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1024 }'; }

echo "| ranks | creation (s) | the same, libcrypto loaded before fork (s) | most sockets at a rank | rank 0 sent / received (KiB) | busiest rank | its sent / received (KiB) |"
echo "|---|---|---|---|---|---|---|"
for n in "$@"; do
    out=$("$TOOL" "$n" --record "$RECORD") || { echo "$out" >&2; echo "bench-boot: $n ranks failed" >&2; exit 1; }
    created=$(awk '$1 == "creation_s" { print $2 }' <<<"$out")
    warm=$("$TOOL" "$n" --record "$RECORD" --preload | awk '$1 == "creation_s" { print $2 }')
    sockets=$(awk '$1 == "max_sockets_formed" { print $2 }' <<<"$out")
    read -r s0 r0 <<<"$(awk '$1 == "bytes_rank0" { print $2, $3 }' <<<"$out")"
    read -r rb sb rbb <<<"$(awk '$1 == "bytes_busiest" { print $2, $3, $4 }' <<<"$out")"
    echo "| $n | $created | $warm | $sockets | $(kib "$s0") / $(kib "$r0") | $rb | $(kib "$sb") / $(kib "$rbb") |"
done
