#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The README's FP8 table: each model refit into the FP8 inference weights its published FP8
# checkpoint serves (gen-manifest.py --infer-quant block128: every linear weight e4m3 in
# 128 x 128 blocks, float32 scales beside it) against the bf16 refit of the same layouts.
# One markdown row per case: bytes over the network both ways and their ratio, the share of
# the FP8 weights' elements their senders quantized (quant_at_source_pct), and the refit times
# PREDICTED by the cluster model for reshard (bf16, FP8) and for today's practice (broadcast
# bf16, quantize where it lands).
#
# usage: scripts/bench-fp8.sh [CASE ...]     CASE: dsv3 kimi qwen235 (default: all three)
#   CLUSTER=nic=..,nvlink=..,latency=.. BUILD=build scripts/bench-fp8.sh
set -eu
CASES="dsv3 kimi qwen235"
for a in "$@"; do
    case $a in
    -h | --help) awk 'NR > 2 && !/^#/ { exit } NR > 2 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    esac
    case " $CASES " in *" $a "*) ;; *) echo "bench-fp8: unknown case '$a' ($CASES)" >&2; exit 2 ;; esac
done

BUILD=${BUILD:-build}
CLUSTER=${CLUSTER:-nic=50GB/s,nvlink=450GB/s,latency=5us}
PLAN=$BUILD/reshard-plan
GEN=$(dirname "$0")/gen-manifest.py
[ -x "$PLAN" ] || { echo "bench-fp8: $PLAN missing: run make first" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM

# case: label | model | training config | inference config (its tensor-parallel shards hold
# whole 128-row blocks, as vLLM's block-FP8 layers require)
cases() {
    cat <<'CASES'
dsv3|DeepSeek-V3, PP16 x EP16 (DP16) -> TP8 x DP32 with EP256|deepseek-v3|tp=1,pp=16,ep=16,dp=16|tp=8,dp=32,ep=256
kimi|Kimi-K2, PP16 x EP16 (DP16) -> TP8 x DP16 with EP128|kimi-k2|pp=16,ep=16,dp=16|tp=8,dp=16,ep=128
qwen235|Qwen3-235B, TP2 x CP2 x PP4 x DP4, EP16 -> TP8 x DP8 with EP64|qwen3-235b-a22b|tp=2,cp=2,pp=4,dp=4,ep=16|tp=8,dp=8,ep=64
CASES
}

want() {
    [ -z "$SELECTED" ] && return 0
    for w in $SELECTED; do [ "$w" = "$1" ] && return 0; done
    return 1
}
SELECTED="$*"

echo "| model, training -> inference | net bf16 | net FP8 | FP8 / bf16 | quantized at source | predicted reshard bf16 / FP8 | predicted bcast bf16 + quantize |"
echo "|---|---|---|---|---|---|---|"
cases | while IFS='|' read -r key label model train infer; do
    want "$key" || continue
    for q in none block128; do
        "$GEN" --model "$model" --train "$train" --infer "$infer" --infer-quant "$q" \
            -o "$tmp/$key-$q.json" 2>"$tmp/gen.err" || { cat "$tmp/gen.err" >&2; exit 1; }
        taskset -c 0 "$PLAN" --manifest "$tmp/$key-$q.json" --cluster "$CLUSTER" >"$tmp/$key-$q.out"
        rm -f "$tmp/$key-$q.json"
    done
    awk -v label="$label" '
        FNR == 1 { f++ }
        $1 == "net_bytes" { net[f] = $2 }
        $1 == "min_net_bytes" { minnet[f] = $2 }
        $1 == "valid" { valid[f] = $2 }
        $1 == "quant_at_source_pct" { pct = $2 }
        $1 == "predicted_reshard_s" { r[f] = $2 }
        $1 == "predicted_bcast_s" { b[f] = $2 }
        END {
            for (i = 1; i <= 2; i++)
                if (valid[i] != "yes" || net[i] != minnet[i]) {
                    printf "bench-fp8: %s: valid %s, net_bytes %s vs min %s\n", label, valid[i],
                           net[i], minnet[i] > "/dev/stderr"
                    exit 1
                }
            printf "| %s | %.2f TB | %.2f TB | %.3f | %s%% | %.2f s / %.2f s | %.2f s |\n", label,
                   net[1] / 1e12, net[2] / 1e12, net[2] / net[1], pct, r[1], r[2], b[2]
        }' "$tmp/$key-none.out" "$tmp/$key-block128.out"
done
