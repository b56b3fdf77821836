#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
#
# usage: scripts/demo.sh     (what make demo runs; BUILD: the build folder, default build;
#                            -h, --help: this text)
#
# A real refit across 8 local processes in two emulated NVLink domains of 4
# (RESHARD_DOMAIN_SIZE=4; traffic between domains goes over UCX on loopback TCP, inside a
# domain over cross-memory attach). Runs reshard and the two baselines in one run, checks every
# destination element, then prints what reshard saves against gather-and-broadcast.
set -eu
case ${1:-} in
-h | --help) awk 'NR > 3 && !/^#/ { exit } NR > 3 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
'') ;;
*) echo "demo.sh: unexpected argument '$1' (it takes none; -h says more)" >&2; exit 2 ;;
esac
BUILD=${BUILD:-build}
PERF="$BUILD/bin/reshard_perf"

# A Llama-3-8B mlp.down_proj-sized weight (4096 x 14336 bf16, 112 MiB) in a colocated RL job:
# training shards it 8 ways by rows across both domains (FSDP/TP8); inference on the same 8
# ranks runs 4 replicas of TP2, two replicas per domain.
SRC='shape=4096x14336 dtype=bf16 ranks=0-7 place=S(0)'
DST='shape=4096x14336 dtype=bf16 ranks=0-7 mesh=4x2 place=R,S(1)'

echo "\$ RESHARD_DOMAIN_SIZE=4 $PERF -np 8 -n 5 -w 1 --algo reshard,direct,bcast \\"
echo "      --src '$SRC' --dst '$DST'"
out=$(RESHARD_DOMAIN_SIZE=4 "$PERF" -np 8 -n 5 -w 1 --algo reshard,direct,bcast \
    --src "$SRC" --dst "$DST")
echo "$out"
# netMB (column 9) and time (column 5) of each algorithm's row.
echo "$out" | awk '!/^#/ && NF >= 11 { net[$4] = $9; t[$4] = $5 }
    END {
        if (!("reshard" in net) || !("bcast" in net)) exit 1
        printf "\nreshard put %.1f MiB on the network, bcast %.1f MiB: %.1fx fewer bytes", \
               net["reshard"], net["bcast"], net["bcast"] / net["reshard"]
        printf ", %.2fx faster (%.0f us vs %.0f us)\n", t["bcast"] / t["reshard"], t["reshard"], \
               t["bcast"]
    }'
