# SPDX-License-Identifier: Apache-2.0
"""scripts/gen-manifest.py against the real libraries:

- its inventory of each of the five models equals transformers' model definition built on the
  meta device from the published config (names mapped, every shape and the total parameter
  count equal);
- its training rank orders (and reshard.models.MegatronParallel's) equal megatron-core's
  RankGenerator for 24 parallel configs (tp, cp, dp, pp, ep, etp, order).

Prints one table per check. Exit 0 when everything matches, 1 when not, 77 when transformers
or megatron-core is missing (the reason is printed). Usage: crosscheck.py [models|ranks]."""
import importlib.util
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))

# config.json of each published model (the values that decide shapes), as released
PUBLISHED = {
    "deepseek-v3": ("DeepseekV3Config", dict(
        hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
        num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128,
        n_shared_experts=1, n_routed_experts=256, first_k_dense_replace=3, moe_layer_freq=1,
        q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
        v_head_dim=128, vocab_size=129280, num_experts_per_tok=8, n_group=8, topk_group=4,
        tie_word_embeddings=False)),
    "kimi-k2": ("DeepseekV3Config", dict(
        hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
        num_hidden_layers=61, num_attention_heads=64, num_key_value_heads=64,
        n_shared_experts=1, n_routed_experts=384, first_k_dense_replace=1, moe_layer_freq=1,
        q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
        v_head_dim=128, vocab_size=163840, num_experts_per_tok=8, n_group=1, topk_group=1,
        tie_word_embeddings=False)),
    "qwen3-235b-a22b": ("Qwen3MoeConfig", dict(
        hidden_size=4096, intermediate_size=12288, moe_intermediate_size=1536,
        num_hidden_layers=94, num_attention_heads=64, num_key_value_heads=4, head_dim=128,
        num_experts=128, num_experts_per_tok=8, decoder_sparse_step=1, mlp_only_layers=[],
        vocab_size=151936, tie_word_embeddings=False)),
    "qwen3-30b-a3b": ("Qwen3MoeConfig", dict(
        hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
        num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
        num_experts=128, num_experts_per_tok=8, decoder_sparse_step=1, mlp_only_layers=[],
        vocab_size=151936, tie_word_embeddings=False)),
    "llama-3.1-70b": ("LlamaConfig", dict(
        hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
        num_attention_heads=64, num_key_value_heads=8, vocab_size=128256,
        tie_word_embeddings=False)),
}


def gen_manifest():
    spec = importlib.util.spec_from_file_location("gen_manifest",
                                                  os.path.join(ROOT, "scripts", "gen-manifest.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def manifest_inventory(gm, model):
    """{HF name: shape} of gen-manifest's tensors, fused tensors mapped to HF's: a dense
    gate_up_proj is HF's gate_proj and up_proj; experts.{e}.gate_up_proj / down_proj of every
    expert are HF's stacked experts.gate_up_proj [E, 2I, H] / experts.down_proj [E, H, I]."""
    m = dict(gm.MODELS[model])
    train = gm.Train({}, m["experts"])
    infer = gm.Infer({}, train.world, m["experts"])
    tensors, _ = gm.build(model, m, train, infer, "bf16")
    out, experts = {}, {}
    for t in tensors:
        name, shape = t["name"], tuple(t["shape"])
        e = re.match(r"(.*\.mlp\.experts)\.(\d+)\.(gate_up_proj|down_proj)\.weight$", name)
        if e:
            experts.setdefault((e.group(1), e.group(3)), []).append(shape)
            continue
        g = re.match(r"(.*)\.gate_up_proj\.weight$", name)
        if g:
            half = (shape[0] // 2,) + shape[1:]
            out[g.group(1) + ".gate_proj.weight"] = half
            out[g.group(1) + ".up_proj.weight"] = half
            continue
        out[name] = shape
    for (prefix, kind), shapes in experts.items():
        if len(set(shapes)) != 1:
            raise AssertionError("%s.%s: experts of different shapes" % (prefix, kind))
        out["%s.%s" % (prefix, kind)] = (len(shapes),) + shapes[0]
    return out


def hf_inventory(model):
    """{name: shape} of transformers' model on the meta device: its state dict (parameters and
    persistent buffers, such as DeepSeek's e_score_correction_bias)."""
    import torch
    import transformers

    cls, kwargs = PUBLISHED[model]
    cfg = getattr(transformers, cls)(**kwargs)
    with torch.device("meta"):
        net = transformers.AutoModelForCausalLM.from_config(cfg)
    return {n: tuple(t.shape) for n, t in net.state_dict().items()}


def numel(shape):
    n = 1
    for x in shape:
        n *= x
    return n


def check_models():
    try:
        import transformers
    except ImportError as e:
        print("crosscheck models: skipped: transformers is needed (%s)" % e)
        return None
    gm = gen_manifest()
    print("gen-manifest vs transformers %s (meta device)" % transformers.__version__)
    print("| model | tensors (gen-manifest / HF) | parameters (gen-manifest / HF) | match |")
    print("|---|---|---|---|")
    bad = 0
    for model in PUBLISHED:
        ours, theirs = manifest_inventory(gm, model), hf_inventory(model)
        same = ours == theirs
        bad += not same
        ntensors = len([t for t in gen_manifest_tensors(gm, model)])
        print("| %s | %d / %d | %s / %s | %s |" % (
            model, ntensors, len(theirs), "{:,}".format(sum(map(numel, ours.values()))),
            "{:,}".format(sum(map(numel, theirs.values()))), "yes" if same else "NO"))
        if not same:
            for n in sorted(set(ours) | set(theirs)):
                if ours.get(n) != theirs.get(n):
                    print("    %s: gen-manifest %s, transformers %s" % (n, ours.get(n),
                                                                       theirs.get(n)))
                    bad += 1
                    if bad > 20:
                        break
    return bad


def gen_manifest_tensors(gm, model):
    m = dict(gm.MODELS[model])
    train = gm.Train({}, m["experts"])
    return gm.build(model, m, train, gm.Infer({}, train.world, m["experts"]), "bf16")[0]


CONFIGS = [  # tp, cp, dp, pp, ep, etp, order
    (1, 1, 1, 1, 1, 1, "tp-cp-ep-dp-pp"), (2, 1, 2, 1, 1, 1, "tp-cp-ep-dp-pp"),
    (2, 1, 2, 2, 1, 2, "tp-cp-ep-dp-pp"), (4, 1, 2, 1, 2, 1, "tp-cp-ep-dp-pp"),
    (2, 2, 2, 1, 1, 2, "tp-cp-ep-dp-pp"), (2, 2, 2, 2, 2, 1, "tp-cp-ep-dp-pp"),
    (1, 1, 8, 2, 8, 1, "tp-cp-ep-dp-pp"), (2, 1, 4, 2, 4, 2, "tp-cp-ep-dp-pp"),
    (4, 2, 2, 2, 4, 2, "tp-cp-ep-dp-pp"), (8, 1, 2, 2, 16, 1, "tp-cp-ep-dp-pp"),
    (1, 1, 16, 4, 16, 1, "tp-cp-ep-dp-pp"), (2, 1, 8, 1, 4, 4, "tp-cp-ep-dp-pp"),
    (4, 1, 4, 2, 8, 2, "tp-cp-ep-dp-pp"), (1, 2, 4, 2, 4, 2, "tp-cp-ep-dp-pp"),
    (2, 4, 2, 2, 4, 4, "tp-cp-ep-dp-pp"), (2, 1, 2, 2, 1, 2, "tp-cp-ep-pp-dp"),
    (2, 2, 2, 2, 2, 2, "tp-cp-ep-pp-dp"), (4, 2, 1, 2, 8, 1, "tp-cp-ep-pp-dp"),
    (2, 2, 2, 2, 2, 2, "tp-dp-cp-ep-pp"), (4, 1, 2, 2, 4, 1, "tp-cp-ep-pp-dp"),
    (2, 1, 4, 2, 2, 1, "tp-pp-cp-ep-dp"), (8, 1, 1, 2, 4, 2, "tp-cp-ep-pp-dp"),
    # megatron-core refuses these (pp not last, expert dp != dp): so must gen-manifest
    (4, 1, 2, 2, 2, 1, "tp-cp-ep-pp-dp"), (1, 1, 8, 2, 8, 1, "tp-cp-ep-pp-dp"),
    (2, 1, 4, 3, 4, 2, "tp-cp-ep-pp-dp"), (2, 1, 2, 2, 2, 1, "tp-pp-cp-ep-dp"),
]


def megatron_accepts(tp, cp, dp, pp, ep, etp, order, dense, expert):
    """initialize_model_parallel's two checks on the orders, asked of megatron-core's own
    generators (initializing needs a process group per rank)."""
    edp = tp * cp * dp // (ep * etp)
    return ((order.endswith("pp") or pp == 1 or edp == dp)
            and dense.get_ranks("pp") == expert.get_ranks("pp"))


def check_ranks():
    try:
        from megatron.core.parallel_state import RankGenerator
        import megatron.core
    except ImportError as e:
        print("crosscheck ranks: skipped: megatron-core is needed (%s)" % e)
        return None
    import reshard
    from reshard.models import MegatronParallel

    gm = gen_manifest()
    print("rank orders vs megatron-core %s RankGenerator" % megatron.core.__version__)
    print("| tp | cp | dp | pp | ep | etp | order | megatron-core | gen-manifest | "
          "reshard.models |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    bad = accepted = 0
    for tp, cp, dp, pp, ep, etp, order in CONFIGS:
        edp = tp * cp * dp // (ep * etp)
        dense = RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order=order)
        expert = RankGenerator(tp=etp, ep=ep, dp=edp, pp=pp, cp=1, order=order)
        experts = 2 * ep
        cfg = dict(tp=tp, cp=cp, dp=dp, pp=pp, ep=ep, etp=etp, order=order)
        if not megatron_accepts(tp, cp, dp, pp, ep, etp, order, dense, expert):
            try:
                gm.Train(cfg, experts)
                ok_gm = "DIFFERENT (accepted)"
            except gm.Error:
                ok_gm = "refuses too"
            try:
                MegatronParallel(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp, order=order)
                ok_rm = "DIFFERENT (accepted)"
            except reshard.ReshardError:
                ok_rm = "refuses too"
            bad += ok_gm.startswith("DIFF") + ok_rm.startswith("DIFF")
            print("| %d | %d | %d | %d | %d | %d | %s | refuses | %s | %s |"
                  % (tp, cp, dp, pp, ep, etp, order, ok_gm, ok_rm))
            continue
        accepted += 1
        stage = {r: i for g in dense.get_ranks("pp") for i, r in enumerate(g)}
        ep_rank = {r: i for g in expert.get_ranks("ep") for i, r in enumerate(g)}
        train = gm.Train(cfg, experts)
        ok_gm = True
        for p in range(pp):
            ranks, mesh = train.dense(p)
            rows = {tuple(ranks[i:i + tp]) for i in range(0, len(ranks), tp)}
            want = {tuple(g) for g in dense.get_ranks("tp") if stage[g[0]] == p}
            ok_gm &= rows == want and len(ranks) == len(set(ranks))
            for e in range(experts):
                ranks, mesh = train.expert(p, e, experts)
                rows = {tuple(ranks[i:i + etp]) for i in range(0, len(ranks), etp)}
                er = e // (experts // ep)
                want = {tuple(g) for g in expert.get_ranks("tp")
                        if stage[g[0]] == p and ep_rank[g[0]] == er}
                ok_gm &= rows == want
        par = MegatronParallel(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp, order=order)
        ok_rm = all(par.groups(k) == dense.get_ranks(k)
                    for k in ("tp", "cp", "dp", "pp", "tp-pp", "dp-cp", "tp-dp-cp"))
        ok_rm &= all(par.groups(k, expert=True) == expert.get_ranks(k)
                     for k in ("tp", "ep", "dp", "tp-ep", "pp"))
        bad += (not ok_gm) + (not ok_rm)
        print("| %d | %d | %d | %d | %d | %d | %s | accepts | %s | %s |" % (
            tp, cp, dp, pp, ep, etp, order, "equal" if ok_gm else "DIFFERENT",
            "equal" if ok_rm else "DIFFERENT"))
    print("%d configs megatron-core accepts, %d it refuses" % (accepted, len(CONFIGS) - accepted))
    if accepted < 20:
        bad += 1
    return bad


def main():
    which = sys.argv[1:] or ["models", "ranks"]
    results = [check_models() if w == "models" else check_ranks() for w in which]
    if all(r is None for r in results):
        sys.exit(77)
    sys.exit(1 if any(r for r in results) else 0)


if __name__ == "__main__":
    main()
