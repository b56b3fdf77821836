#!/bin/sh
# make demo: plans three realistic refits with reshard-plan and prints their tables.
# (The executor issue turns this into a real transfer across local processes.)
set -eu
BUILD=${BUILD:-build}
PLAN="$BUILD/reshard-plan"

run() {
    title=$1
    shift
    printf '\n=== %s\n$ reshard-plan' "$title"
    for a in "$@"; do
        case $a in *[!A-Za-z0-9._-]*) printf " '%s'" "$a" ;; *) printf ' %s' "$a" ;; esac
    done
    printf '\n\n'
    "$PLAN" "$@"
}

run "Llama-3.1-70B mlp.down_proj: training TP8 -> inference TP4 x DP2 (one 8-GPU domain each)" \
    --src "shape=8192x28672 dtype=bf16 ranks=0-7 place=S(1)" \
    --dst "shape=8192x28672 dtype=bf16 ranks=8-15 mesh=2x4 place=R,S(1)" --domain-size 8

run "64 experts' w1 of a MoE layer: training EP8 -> inference TP8 x 2 replicas (2 domains)" \
    --src "shape=64x2048x7168 dtype=bf16 ranks=0-7 place=S(0)" \
    --dst "shape=64x2048x7168 dtype=bf16 ranks=8-23 mesh=2x8 place=R,S(1)" --domain-size 8

run "fused gate_up_proj (gate and up halves): training TP4 -> inference TP2 x DP2" \
    --src "shape=57344x8192 dtype=bf16 ranks=0-3 place=SS(0,2)" \
    --dst "shape=57344x8192 dtype=bf16 ranks=8-11 mesh=2x2 place=R,SS(0,2)" --domain-size 8
