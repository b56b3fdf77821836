#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The README's whole-model table: writes each model's manifest with scripts/gen-manifest.py,
# plans it with reshard-plan on one core and prints one markdown row per case: tensors, busiest
# NIC over its bound, plan time, peak RSS of the whole reshard-plan run, and the refit times
# PREDICTED by the cluster model (default: an H100 node, 8 x 400 Gb/s NICs, 900 GB/s NVLink).
#
# usage: scripts/bench-models.sh [CASE ...]     CASE: dsv3 qwen235 dsv3-m2n qwen30 kimi llama
#   CLUSTER=nic=..,nvlink=..,latency=.. BUILD=build scripts/bench-models.sh
set -eu
CASES="dsv3 qwen235 dsv3-m2n qwen30 kimi llama"
for a in "$@"; do
    case $a in
    -h | --help) awk 'NR > 2 && !/^#/ { exit } NR > 2 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    esac
    case " $CASES " in *" $a "*) ;; *) echo "bench-models: unknown case '$a' ($CASES)" >&2; exit 2 ;; esac
done

BUILD=${BUILD:-build}
CLUSTER=${CLUSTER:-nic=50GB/s,nvlink=450GB/s,latency=5us}
PLAN=$BUILD/reshard-plan
GEN=$(dirname "$0")/gen-manifest.py
[ -x "$PLAN" ] || { echo "bench-models: $PLAN missing: run make first" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM

# case: label | model | training config | inference config
cases() {
    cat <<'EOF'
dsv3|DeepSeek-V3, PP16 x EP16 (DP16) -> TP32 x DP8|deepseek-v3|tp=1,pp=16,ep=16,dp=16|tp=32,dp=8
qwen235|Qwen3-235B, TP2 x CP2 x PP4 x DP4, EP16 -> TP8 x DP8|qwen3-235b-a22b|tp=2,cp=2,pp=4,dp=4,ep=16|tp=8,dp=8
dsv3-m2n|DeepSeek-V3, TP1 x EP16 x DP32 x PP4 -> TP8 x DP16|deepseek-v3|tp=1,ep=16,dp=32,pp=4|tp=8,dp=16
qwen30|Qwen3-30B, EP8 x PP2 (DP8) -> TP8 x DP2|qwen3-30b-a3b|ep=8,pp=2,dp=8|tp=8,dp=2
kimi|Kimi-K2, PP16 x EP16 (DP16) -> TP16 x DP8 with EP128|kimi-k2|pp=16,ep=16,dp=16|tp=16,dp=8,ep=128
llama|Llama-3.1-70B, TP8 x PP4 x DP2 -> TP4 x DP8|llama-3.1-70b|tp=8,pp=4,dp=2|tp=4,dp=8
EOF
}

want() { # is case $1 selected on the command line (all when none)?
    [ -z "$SELECTED" ] && return 0
    for w in $SELECTED; do [ "$w" = "$1" ] && return 0; done
    return 1
}
SELECTED="$*"

echo "| model, training -> inference | ranks | tensors | busiest NIC / bound | plan | peak RSS | predicted reshard / direct / bcast |"
echo "|---|---|---|---|---|---|---|"
cases | while IFS='|' read -r key label model train infer; do
    want "$key" || continue
    "$GEN" --model "$model" --train "$train" --infer "$infer" -o "$tmp/$key.json" 2>"$tmp/gen.err" ||
        { cat "$tmp/gen.err" >&2; exit 1; }
    ranks=$(sed -n 's/.*: [0-9]* tensors, \([0-9]* -> [0-9]*\) ranks.*/\1/p' "$tmp/gen.err")
    taskset -c 0 "$PLAN" --manifest "$tmp/$key.json" --cluster "$CLUSTER" >"$tmp/$key.out"
    awk -v label="$label" -v ranks="$ranks" '
        $1 == "tensors" { tensors = $2 }
        $1 == "peak_rss_mib" { rss = $2 }
        $1 == "max_nic_bytes" { nic = $2 }
        $1 == "lb_nic_bytes" { lb = $2 }
        $1 == "plan_ms" { ms = $2 }
        $1 == "valid" { valid = $2 }
        $1 == "net_bytes" { net = $2 }
        $1 == "min_net_bytes" { minnet = $2 }
        $1 == "predicted_reshard_s" { r = $2 }
        $1 == "predicted_direct_s" { d = $2 }
        $1 == "predicted_bcast_s" { b = $2 }
        END {
            if (valid != "yes" || net != minnet) {
                printf "bench-models: %s: valid %s, net_bytes %s vs min %s\n", label, valid, net, minnet > "/dev/stderr"
                exit 1
            }
            plan = ms >= 1000 ? sprintf("%.2f s", ms / 1000) : sprintf("%.0f ms", ms)
            mem = rss >= 1024 ? sprintf("%.2f GiB", rss / 1024) : sprintf("%.0f MiB", rss)
            printf "| %s | %s | %s | %.3f | %s | %s | %.2f s / %.2f s / %.1f s |\n", label, ranks,
                   tensors, lb ? nic / lb : 0, plan, mem, r, d, b
        }' "$tmp/$key.out"
done
