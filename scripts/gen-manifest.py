#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Write a reshard manifest for a whole model: every weight, its training placement (Megatron
style) and its inference placement (vLLM style).

  scripts/gen-manifest.py --model deepseek-v3 --train tp=1,pp=16,ep=16,dp=16 \\
      --infer tp=32,dp=8 [--domain-size 8] [--scale K] [-o FILE]

Models (published architectures, written below as data): deepseek-v3, kimi-k2,
qwen3-235b-a22b, qwen3-30b-a3b, llama-3.1-70b.

Parallel configs are comma-separated key=value:
  --train  tp, cp, dp, pp, ep, etp (default 1), order (default tp-cp-ep-dp-pp)
  --infer  tp, dp, pp, ep (ep must be tp*dp: vLLM's --enable-expert-parallel)
A key left out is 1; nothing is derived (the training dp is not derived from ep: give dp so
that tp*cp*dp is a multiple of etp*ep). Orders megatron-core refuses (pp not last with an
expert data parallel size other than dp, or expert pipelines other than the dense ones) are
refused here too.

Rank-order assumptions (what the placements below rest on):
  * Training ranks are 0 .. T-1 with T = tp*cp*dp*pp, numbered as Megatron-Core's
    RankGenerator does: `order` lists the dimensions fastest first, so with tp-cp-ep-dp-pp
    rank = tp_i + tp*(cp_i + cp*(dp_i + dp*pp_i)). Expert layers re-cut each pipeline stage's
    tp*cp*dp ranks as etp x ep x edp (edp = tp*cp*dp / (etp*ep)), in the same order with tp read
    as etp, cp dropped and dp read as edp: rank = etp_i + etp*(ep_i + ep*(edp_i + edp*pp_i)).
    Expert e lives on expert-parallel rank e // (experts / ep).
  * Inference ranks follow the training ranks: T .. T+I-1 with I = tp*dp*pp, each vLLM
    data-parallel engine a block of tp*pp ranks, tensor-parallel fastest:
    rank = T + tp_i + tp*(pp_i + pp*dp_i). With ep, expert e lives whole on rank
    (dp_i*tp + tp_i) = e // (experts / ep) of its stage.
  * Layers are cut into pipeline stages as evenly as possible, the first stages taking one
    more; embeddings sit on the first stage, the final norm and lm_head on the last.
  * Column-parallel weights are sharded on dim 0 (S(0)), row-parallel on dim 1 (S(1)),
    norms and routers replicated. gate and up are one tensor [2I, H] placed SS(0,2): every
    tensor-parallel rank holds its chunk of gate then its chunk of up, as both Megatron's
    linear_fc1 and vLLM's gate_up_proj do.
  * GQA attention: training keeps Megatron's interleaved linear_qkv (per query group: its q
    heads, then k, then v); inference keeps vLLM's qkv_proj (the rank's q rows, then k, then
    v). q, k and v are three tensors viewing into that buffer. When inference tp exceeds the
    kv heads, each kv head is replicated over tp/kv ranks, as vLLM does.
  * MLA (DeepSeek-V3, Kimi-K2): q_a_proj and kv_a_proj_with_mqa are replicated, and on the
    inference side views into vLLM's fused_qkv_a_proj buffer.
  * Vocabularies here divide evenly by every tp used, so a padded local buffer (Megatron pads
    to 128*tp) holds its shard at offset 0 and needs no view.
--infer-quant block128 writes the FP8 inference side the published FP8 checkpoints serve
(DeepSeek-V3, Kimi-K2, Qwen3 FP8): every linear weight of the decoder layers (the *_proj.weight
tensors: attention, dense and shared MLPs, experts) as fp8e4m3 with a float32 scale per 128x128
block (dst_dtype fp8e4m3, quant=block(128,128)), kv_a_proj_with_mqa included, quantized on the
way from the training dtype;
embeddings, lm_head, norms and routers stay as they are. Each such tensor's scales tensor is
added by the planner and named as those checkpoints name it (x.weight -> x.weight_scale_inv).
Inference shards must then hold whole blocks (vLLM requires the same): choose --infer so that
each rank's rows and columns of every quantized weight are multiples of 128 (for DeepSeek-V3
and Kimi-K2, tp=8 with ep).
--no-views drops the buffers and views: every tensor then lives alone and contiguous in its own
buffer (for tools that give each tensor its own memory, such as reshard_perf --manifest).
--scale K divides the hidden sizes (hidden, intermediate, expert intermediate, LoRA ranks,
head dims) and the vocabulary by K, keeping the structure (layers, heads, experts), so that
a whole model runs end to end on a small machine.
"""

import argparse
import json
import os
import re
import sys

MODELS = {
    # config.json of deepseek-ai/DeepSeek-V3 (MTP layer left out: it is not served)
    "deepseek-v3": dict(kind="mla", hidden=7168, layers=61, dense_layers=3, vocab=129280,
                        heads=128, q_lora=1536, kv_lora=512, nope=128, rope=64, v_head=128,
                        inter=18432, moe_inter=2048, experts=256, shared=1, router_bias=True),
    # config.json of moonshotai/Kimi-K2-Instruct: DeepSeek-V3's architecture, 384 experts
    "kimi-k2": dict(kind="mla", hidden=7168, layers=61, dense_layers=1, vocab=163840, heads=64,
                    q_lora=1536, kv_lora=512, nope=128, rope=64, v_head=128, inter=18432,
                    moe_inter=2048, experts=384, shared=1, router_bias=True),
    # config.json of Qwen/Qwen3-235B-A22B
    "qwen3-235b-a22b": dict(kind="gqa", hidden=4096, layers=94, dense_layers=0, vocab=151936,
                            heads=64, kv_heads=4, head_dim=128, inter=12288, moe_inter=1536,
                            experts=128, shared=0, qk_norm=True),
    # config.json of Qwen/Qwen3-30B-A3B
    "qwen3-30b-a3b": dict(kind="gqa", hidden=2048, layers=48, dense_layers=0, vocab=151936,
                          heads=32, kv_heads=4, head_dim=128, inter=6144, moe_inter=768,
                          experts=128, shared=0, qk_norm=True),
    # config.json of meta-llama/Llama-3.1-70B
    "llama-3.1-70b": dict(kind="gqa", hidden=8192, layers=80, dense_layers=80, vocab=128256,
                          heads=64, kv_heads=8, head_dim=128, inter=28672, moe_inter=0,
                          experts=0, shared=0, qk_norm=False),
}

SCALED = ("hidden", "inter", "moe_inter", "q_lora", "kv_lora", "nope", "rope", "v_head",
          "head_dim", "vocab")


class Error(Exception):
    pass


def parse_config(text, keys, what):
    cfg = {}
    for item in filter(None, text.split(",")):
        if "=" not in item:
            raise Error(f"{what}: '{item}' is not key=value")
        k, v = item.split("=", 1)
        if k not in keys:
            raise Error(f"{what}: unknown key '{k}' (known: {', '.join(keys)})")
        if k == "order":
            cfg[k] = v
            continue
        try:
            cfg[k] = int(v)
        except ValueError:
            raise Error(f"{what}: {k}={v} is not an integer") from None
        if cfg[k] < 1:
            raise Error(f"{what}: {k}={v} must be at least 1")
    return cfg


def ranges(ranks):
    """0,1,2,3,8 -> '0-3,8' (order kept)."""
    out, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ",".join(out)


def side(ranks, mesh, place, buffer=None, offset=0, view=None, strides=None):
    s = f"ranks={ranges(ranks)} mesh={'x'.join(map(str, mesh))} place={','.join(place)}"
    if buffer:
        s += f" buffer={buffer}"
        if offset:
            s += f" offset={offset}"
        if view:
            s += f" view={'x'.join(map(str, view))} strides={'x'.join(map(str, strides))}"
    return s


class Train:
    """Megatron-Core ranks."""

    def __init__(self, cfg, experts):
        self.tp, self.cp, self.pp = cfg.get("tp", 1), cfg.get("cp", 1), cfg.get("pp", 1)
        self.ep, self.etp = cfg.get("ep", 1), cfg.get("etp", 1)
        self.dp = cfg.get("dp", 1)
        order = cfg.get("order", "tp-cp-ep-dp-pp").split("-")
        if sorted(order) != sorted(["tp", "cp", "ep", "dp", "pp"]):
            raise Error(f"--train order={cfg.get('order')}: a permutation of tp-cp-ep-dp-pp")
        self.order = order
        stage = self.tp * self.cp * self.dp
        if experts and stage % (self.etp * self.ep):
            raise Error(f"--train: tp*cp*dp = {stage} is not a multiple of etp*ep = "
                        f"{self.etp * self.ep}")
        if experts and experts % self.ep:
            raise Error(f"--train: {experts} experts do not divide over ep={self.ep}")
        self.edp = stage // (self.etp * self.ep)
        if experts and order[-1] != "pp" and self.pp > 1 and self.edp != self.dp:
            # megatron-core's initialize_model_parallel asserts the same: its expert ranks
            # would put pipeline stages elsewhere than its dense ranks do
            raise Error(f"--train order={'-'.join(order)}: with pp not last, megatron-core needs "
                        f"the expert data parallel size tp*cp*dp/(etp*ep) = {self.edp} to equal "
                        f"dp = {self.dp}")
        self.world = stage * self.pp
        if experts and self._pp_groups(self._dense_sizes()) != self._pp_groups(
                self._expert_sizes()):
            raise Error(f"--train order={'-'.join(order)}: megatron-core's expert ranks would "
                        "form other pipeline groups than its dense ranks (it refuses this order "
                        "for these sizes)")

    def _dense_sizes(self):
        return dict(tp=self.tp, cp=self.cp, dp=self.dp, pp=self.pp)

    def _expert_sizes(self):
        return dict(tp=self.etp, ep=self.ep, dp=self.edp, pp=self.pp)

    def _pp_groups(self, sizes):
        """The ranks of each pipeline, as a set of tuples."""
        others = [d for d in self.order if d in sizes and d != "pp"]
        groups = set()
        n = 1
        for d in others:
            n *= sizes[d]
        for i in range(n):
            coords = {}
            for d in others:
                coords[d] = i % sizes[d]
                i //= sizes[d]
            groups.add(tuple(self._rank(sizes, dict(coords, pp=p)) for p in range(self.pp)))
        return groups

    def _rank(self, sizes, coords):
        r, stride = 0, 1
        for d in self.order:
            if d in sizes:
                r += coords[d] * stride
                stride *= sizes[d]
        return r

    def dense(self, p):
        """Ranks of stage p as a (cp*dp) x tp mesh."""
        sizes = dict(tp=self.tp, cp=self.cp, dp=self.dp, pp=self.pp)
        return [self._rank(sizes, dict(tp=t, cp=rep % self.cp, dp=rep // self.cp, pp=p))
                for rep in range(self.cp * self.dp) for t in range(self.tp)], \
            [self.cp * self.dp, self.tp]

    def expert(self, p, e, experts):
        """Ranks holding expert e of stage p as an edp x etp mesh."""
        sizes = dict(tp=self.etp, ep=self.ep, dp=self.edp, pp=self.pp)
        er = e // (experts // self.ep)
        return [self._rank(sizes, dict(tp=t, ep=er, dp=d, pp=p))
                for d in range(self.edp) for t in range(self.etp)], [self.edp, self.etp]


class Infer:
    """vLLM ranks, after the training ones."""

    def __init__(self, cfg, base, experts):
        self.tp, self.dp, self.pp = cfg.get("tp", 1), cfg.get("dp", 1), cfg.get("pp", 1)
        self.ep = cfg.get("ep", 0)
        if self.ep and self.ep != self.tp * self.dp:
            raise Error(f"--infer: ep={self.ep} must be tp*dp = {self.tp * self.dp} (vLLM's "
                        "expert parallelism spans the data-parallel engines)")
        if self.ep and experts % self.ep:
            raise Error(f"--infer: {experts} experts do not divide over ep={self.ep}")
        self.base = base
        self.world = self.tp * self.dp * self.pp

    def _rank(self, t, p, d):
        return self.base + t + self.tp * (p + self.pp * d)

    def dense(self, p):
        return [self._rank(t, p, d) for d in range(self.dp) for t in range(self.tp)], \
            [self.dp, self.tp]

    def expert_whole(self, p, e, experts):
        er = e // (experts // self.ep)
        return [self._rank(er % self.tp, p, er // self.tp)]


def stages(layers, pp):
    base, extra = divmod(layers, pp)
    out, first = [], 0
    for p in range(pp):
        n = base + (p < extra)
        out.append(range(first, first + n))
        first += n
    return out


class Writer:
    def __init__(self, m, train, infer, dtype, quant=None):
        self.m, self.train, self.infer, self.dtype = m, train, infer, dtype
        self.quant = quant
        self.tensors = []
        self.names = set()
        self.buffers = {}  # shared buffer -> elements on every rank that holds it

    def add(self, name, shape, src, dst):
        assert name not in self.names, name
        self.names.add(name)
        t = dict(name=name, shape=shape, dtype=self.dtype, src=src, dst=dst)
        # the decoder's linear weights; kv_a_proj_with_mqa too (its *_scale_inv is in the
        # DeepSeek-V3 and Kimi-K2 FP8 checkpoints)
        linear = name.endswith(("_proj.weight", "_proj_with_mqa.weight"))
        if self.quant and name.startswith("model.layers.") and linear:
            t["dst_dtype"] = "fp8e4m3"
            t["dst"] = f"{dst} quant={self.quant}"
        self.tensors.append(t)

    def both(self, name, shape, p_train, p_infer, src_place, dst_place):
        """A dense weight: tensor-parallel on both sides, replicated over data parallel."""
        tr, tm = self.train.dense(p_train)
        ir, im = self.infer.dense(p_infer)
        self.add(name, shape, side(tr, tm, ["R", src_place]), side(ir, im, ["R", dst_place]))

    def replicated(self, name, shape, p_train, p_infer):
        self.both(name, shape, p_train, p_infer, "R", "R")


def kv_mesh(infer_tp, kv_heads):
    """vLLM: with tp > kv heads each kv head is replicated over tp/kv ranks."""
    if infer_tp <= kv_heads:
        return ["S(0)"], None
    if infer_tp % kv_heads:
        raise Error(f"--infer tp={infer_tp} is neither a divisor nor a multiple of the "
                    f"{kv_heads} kv heads")
    return ["S(0)", "R"], infer_tp // kv_heads


def gqa_attention(w, pre, m, pt, pi):
    H, hd, nh, nkv = m["hidden"], m["head_dim"], m["heads"], m["kv_heads"]
    ttp, itp = w.train.tp, w.infer.tp
    if nkv % ttp:
        raise Error(f"--train tp={ttp} must divide the {nkv} kv heads (Megatron's query groups)")
    qpg = nh // nkv
    # Training: Megatron's linear_qkv, per query group q (qpg heads), k, v; a rank holds
    # nkv/tp groups.
    g_local = nkv // ttp
    tr, tm = w.train.dense(pt)
    row = (qpg + 2) * hd * H
    tbuf = f"{pre}.linear_qkv"
    w.buffers[tbuf] = g_local * row
    # Inference: vLLM's qkv_proj, the rank's q rows, then k, then v.
    ir, im = w.infer.dense(pi)
    q_rows = nh * hd // itp if nh % itp == 0 else None
    if q_rows is None:
        raise Error(f"--infer tp={itp} must divide the {nh} query heads")
    kv_place, kv_rep = kv_mesh(itp, nkv)
    kv_rows = hd * max(1, nkv // itp)
    ibuf = f"{pre}.qkv_proj"
    w.buffers[ibuf] = (q_rows + 2 * kv_rows) * H
    if kv_rep:  # mesh dp x groups x replicas over the same rank order
        kv_ranks, kv_mesh_dims = ir, [w.infer.dp, nkv, kv_rep]
    else:
        kv_ranks, kv_mesh_dims = ir, im
    for name, rows, toff, ioff in (("q_proj", nh * hd, 0, 0),
                                   ("k_proj", nkv * hd, qpg * hd * H, q_rows * H),
                                   ("v_proj", nkv * hd, (qpg + 1) * hd * H,
                                    (q_rows + kv_rows) * H)):
        per_group = qpg * hd if name == "q_proj" else hd
        src = side(tr, tm, ["R", "S(0)"], tbuf, toff, [g_local, per_group, H], [row, H, 1])
        if name == "q_proj" or not kv_rep:
            dst = side(ir, im, ["R", "S(0)"], ibuf, ioff)
        else:
            dst = side(kv_ranks, kv_mesh_dims, ["R"] + kv_place, ibuf, ioff)
        w.add(f"{pre}.self_attn.{name}.weight", [rows, H], src, dst)
    w.both(f"{pre}.self_attn.o_proj.weight", [H, nh * hd], pt, pi, "S(1)", "S(1)")
    if m.get("qk_norm"):
        w.replicated(f"{pre}.self_attn.q_norm.weight", [hd], pt, pi)
        w.replicated(f"{pre}.self_attn.k_norm.weight", [hd], pt, pi)


def mla_attention(w, pre, m, pt, pi):
    H, nh = m["hidden"], m["heads"]
    ql, kvl, nope, rope, vh = m["q_lora"], m["kv_lora"], m["nope"], m["rope"], m["v_head"]
    tr, tm = w.train.dense(pt)
    ir, im = w.infer.dense(pi)
    fused = f"{pre}.self_attn.fused_qkv_a_proj"
    w.buffers[fused] = (ql + kvl + rope) * H
    w.add(f"{pre}.self_attn.q_a_proj.weight", [ql, H], side(tr, tm, ["R", "R"]),
          side(ir, im, ["R", "R"], fused, 0))
    w.add(f"{pre}.self_attn.kv_a_proj_with_mqa.weight", [kvl + rope, H],
          side(tr, tm, ["R", "R"]), side(ir, im, ["R", "R"], fused, ql * H))
    w.replicated(f"{pre}.self_attn.q_a_layernorm.weight", [ql], pt, pi)
    w.replicated(f"{pre}.self_attn.kv_a_layernorm.weight", [kvl], pt, pi)
    w.both(f"{pre}.self_attn.q_b_proj.weight", [nh * (nope + rope), ql], pt, pi, "S(0)", "S(0)")
    w.both(f"{pre}.self_attn.kv_b_proj.weight", [nh * (nope + vh), kvl], pt, pi, "S(0)", "S(0)")
    w.both(f"{pre}.self_attn.o_proj.weight", [H, nh * vh], pt, pi, "S(1)", "S(1)")


def dense_mlp(w, pre, inter, H, pt, pi):
    w.both(f"{pre}.gate_up_proj.weight", [2 * inter, H], pt, pi, "SS(0,2)", "SS(0,2)")
    w.both(f"{pre}.down_proj.weight", [H, inter], pt, pi, "S(1)", "S(1)")


def moe(w, pre, m, pt, pi):
    H, E, I = m["hidden"], m["experts"], m["moe_inter"]
    w.replicated(f"{pre}.mlp.gate.weight", [E, H], pt, pi)
    if m.get("router_bias"):
        w.replicated(f"{pre}.mlp.gate.e_score_correction_bias", [E], pt, pi)
    if m.get("shared"):
        dense_mlp(w, f"{pre}.mlp.shared_experts", I * m["shared"], H, pt, pi)
    for e in range(E):
        tr, tm = w.train.expert(pt, e, E)
        if w.infer.ep:
            ir = w.infer.expert_whole(pi, e, E)
            gu_dst = side(ir, [1], ["R"])
            dn_dst = gu_dst
        else:
            ir, im = w.infer.dense(pi)
            gu_dst = side(ir, im, ["R", "SS(0,2)"])
            dn_dst = side(ir, im, ["R", "S(1)"])
        x = f"{pre}.mlp.experts.{e}"
        w.add(f"{x}.gate_up_proj.weight", [2 * I, H], side(tr, tm, ["R", "SS(0,2)"]), gu_dst)
        w.add(f"{x}.down_proj.weight", [H, I], side(tr, tm, ["R", "S(1)"]), dn_dst)


def build(model, m, train, infer, dtype, quant=None):
    """The tensors and the sizes of the buffers they share."""
    w = Writer(m, train, infer, dtype, quant)
    H, L = m["hidden"], m["layers"]
    tst, ist = stages(L, train.pp), stages(L, infer.pp)
    stage_of = lambda st, l: next(p for p, r in enumerate(st) if l in r)  # noqa: E731
    w.both("model.embed_tokens.weight", [m["vocab"], H], 0, 0, "S(0)", "S(0)")
    for l in range(L):
        pt, pi = stage_of(tst, l), stage_of(ist, l)
        pre = f"model.layers.{l}"
        w.replicated(f"{pre}.input_layernorm.weight", [H], pt, pi)
        (mla_attention if m["kind"] == "mla" else gqa_attention)(w, pre, m, pt, pi)
        w.replicated(f"{pre}.post_attention_layernorm.weight", [H], pt, pi)
        if l < m["dense_layers"] or not m["experts"]:
            dense_mlp(w, f"{pre}.mlp", m["inter"], H, pt, pi)
        else:
            moe(w, pre, m, pt, pi)
    w.replicated("model.norm.weight", [H], train.pp - 1, infer.pp - 1)
    w.both("lm_head.weight", [m["vocab"], H], train.pp - 1, infer.pp - 1, "S(0)", "S(0)")
    return w.tensors, w.buffers


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--model", required=True, choices=sorted(MODELS))
    ap.add_argument("--train", required=True, help="tp,cp,dp,pp,ep,etp,order")
    ap.add_argument("--infer", required=True, help="tp,dp,pp,ep")
    ap.add_argument("--domain-size", type=int, default=8, help="ranks per NVLink domain (8)")
    ap.add_argument("--scale", type=int, default=1, help="divide hidden sizes by K (1)")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--no-views", action="store_true", help="no shared buffers or views")
    ap.add_argument("--infer-quant", choices=("none", "block128"), default="none",
                    help="the FP8 inference side of the published FP8 checkpoints (none)")
    ap.add_argument("-o", "--output", default="-", help="file (default: stdout)")
    a = ap.parse_args(argv)
    try:
        m = dict(MODELS[a.model])
        if a.scale < 1:
            raise Error("--scale must be at least 1")
        for k in SCALED:
            if k in m and m[k]:
                if m[k] % a.scale:
                    raise Error(f"--scale {a.scale} does not divide {k}={m[k]}")
                m[k] //= a.scale
        tcfg = parse_config(a.train, ("tp", "cp", "dp", "pp", "ep", "etp", "order"), "--train")
        icfg = parse_config(a.infer, ("tp", "dp", "pp", "ep"), "--infer")
        train = Train(tcfg, m["experts"])
        infer = Infer(icfg, train.world, m["experts"])
        if a.domain_size < 1:
            raise Error("--domain-size must be at least 1")
        quant = {"none": None, "block128": "block(128,128)"}[a.infer_quant]
        tensors, buffers = build(a.model, m, train, infer, a.dtype, quant)
        if a.no_views:
            buffers = {}
            for t in tensors:
                for k in ("src", "dst"):
                    t[k] = re.sub(r" (buffer|offset|view|strides)=\S+", "", t[k])
    except Error as e:
        print(f"gen-manifest: {e}", file=sys.stderr)
        return 2
    doc = {
        "version": 1,
        "world_size": train.world + infer.world,
        "domains": {"size": a.domain_size},
        "buffers": buffers,
        "meta": {"model": a.model, "train": a.train, "infer": a.infer, "scale": a.scale,
                 "views": not a.no_views, "infer_quant": a.infer_quant,
                 "train_ranks": train.world, "infer_ranks": infer.world},
        "tensors": tensors,
    }
    text = json.dumps(doc, separators=(",", ":")) + "\n"
    if a.output == "-":
        # os.write until all of it is out: a reader that leaves early is a BrokenPipeError
        # here, for run() to handle (a buffered write can stop short without one)
        sys.stdout.flush()
        data = memoryview(text.encode())
        while data:
            data = data[os.write(sys.stdout.fileno(), data):]
        return 0
    try:
        with open(a.output, "w") as out:
            out.write(text)
    except OSError as e:
        print(f"gen-manifest: cannot write {a.output}: {e.strerror}", file=sys.stderr)
        return 2
    print(f"gen-manifest: {a.model}: {len(tensors)} tensors, {train.world} -> "
          f"{infer.world} ranks, {a.output}", file=sys.stderr)
    return 0


def run(argv):
    """main, with the reader of stdout gone (| head) and ^C as exits, not tracebacks."""
    try:
        return main(argv)
    except BrokenPipeError:
        # the reader left: say nothing more, and keep Python from failing to flush at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
