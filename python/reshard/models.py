# SPDX-License-Identifier: Apache-2.0
"""The layouts of a whole model's parameters, read from the model instead of written by hand.

- dtensor_layouts(module): FSDP2 / DTensor models; placements, mesh and shard order are read
  from each parameter (plain tensors are replicated over `ranks`).
- megatron_layouts(params, ...): Megatron-Core models; tensor, pipeline and expert parallel
  sizes and the rank order from its parallel state (RankGenerator), each parameter's
  partition_dim / partition_stride (fused QKV and gate_up are strided shards), expert
  parameters over the expert-parallel ranks, and layer numbers made global across stages.
- vllm_layouts(model, ranks): vLLM models by their parallel layers: ColumnParallelLinear S(0),
  RowParallelLinear S(1), QKVParallelLinear q/k/v as views of the fused buffer (GQA: kv heads
  replicated when tp exceeds them), MergedColumnParallelLinear gate/up as views,
  VocabParallelEmbedding with its padding, FusedMoE w13/w2 under expert parallelism,
  replicated layers R.
- rename(layouts, mapping) and pair(src, dst): names mapped between the sides (Megatron / HF /
  vLLM naming); a tensor present on one side only is an error naming it.

Each function returns {name: Layout} for the side it describes; pair() turns two of them into
the (name, src, dst) list that Plan takes.
"""
import re

from . import Layout, ReshardError, STATUS, dtype_name


def _fail(message):
    raise ReshardError(STATUS["ERR_INVALID_ARG"], message)


def _spec(shape, dtype, ranks, mesh, place, extra=""):
    spec = "shape=%s dtype=%s ranks=%s mesh=%s place=%s" % (
        "x".join(str(int(n)) for n in shape), dtype_name(dtype),
        ",".join(str(int(r)) for r in ranks), "x".join(str(int(n)) for n in mesh), place)
    return Layout(spec + (" " + extra if extra else ""))


# ---- FSDP2 / DTensor ----

def dtensor_layouts(module, ranks=None):
    """{name: Layout} of module.named_parameters(): a DTensor's from its mesh, placements and
    shard order; a plain tensor replicated over `ranks` (default: every rank of the default
    process group, or rank 0 without one)."""
    if ranks is None:
        try:
            import torch.distributed as dist

            ranks = range(dist.get_world_size()) if dist.is_initialized() else [0]
        except ImportError:
            ranks = [0]
    ranks = list(ranks)
    out = {}
    for name, p in module.named_parameters():
        if getattr(p, "device_mesh", None) is not None:
            out[name] = Layout.from_dtensor(p)
        else:
            out[name] = _spec(p.shape, p.dtype, ranks, (len(ranks),), "R")
    return out


# ---- Megatron-Core ----

class MegatronParallel:
    """Megatron-Core's parallel sizes and rank order: tp, cp, dp, pp, ep (expert data
    parallel edp = dp * cp * tp / (ep * etp)), etp, order ("tp-cp-ep-dp-pp" style), as its
    RankGenerator forms groups. ranks(kind) lists each group of that kind (e.g. "tp", "pp",
    "tp-pp"), computed here; megatron_groups() asks megatron-core itself."""

    def __init__(self, tp=1, pp=1, dp=1, cp=1, ep=1, etp=None, order="tp-cp-ep-dp-pp"):
        self.tp, self.pp, self.dp, self.cp, self.ep = tp, pp, dp, cp, ep
        self.etp = tp if etp is None else etp
        self.order = order
        self.world = tp * pp * dp * cp
        if (dp * cp * tp) % (self.ep * self.etp):
            _fail("megatron: ep %d x etp %d does not divide dp x cp x tp = %d"
                  % (ep, self.etp, dp * cp * tp))
        self.edp = dp * cp * tp // (self.ep * self.etp)
        if not order.endswith("pp") and pp > 1 and self.edp != dp:
            _fail("megatron: with pp not last in order %s, the expert data parallel size %d must "
                  "equal dp %d (as megatron-core asserts)" % (order, self.edp, dp))
        if sorted(self.groups("pp")) != sorted(self.groups("pp", expert=True)):
            _fail("megatron: order %s gives the expert ranks other pipeline groups than the "
                  "dense ones (megatron-core refuses it)" % order)

    @classmethod
    def from_parallel_state(cls, order="tp-cp-ep-dp-pp"):
        """From megatron.core.parallel_state, after initialize_model_parallel(order=order);
        this rank's tensor- and pipeline-parallel groups are checked against the order."""
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        par = cls(tp=ps.get_tensor_model_parallel_world_size(),
                  pp=ps.get_pipeline_model_parallel_world_size(),
                  dp=ps.get_data_parallel_world_size(),
                  cp=ps.get_context_parallel_world_size(),
                  ep=ps.get_expert_model_parallel_world_size(),
                  etp=ps.get_expert_tensor_parallel_world_size(), order=order)
        me = dist.get_rank()
        for kind, group in (("tp", ps.get_tensor_model_parallel_group()),
                            ("pp", ps.get_pipeline_model_parallel_group())):
            theirs = list(dist.get_process_group_ranks(group))
            ours = next(g for g in par.groups(kind) if me in g)
            if ours != theirs:
                _fail("megatron: rank %d's %s group is %s, order %s gives %s: pass the order "
                      "initialize_model_parallel was given" % (me, kind, theirs, order, ours))
        return par

    def _sizes(self, expert):
        if expert:
            return {"tp": self.etp, "ep": self.ep, "dp": self.edp, "pp": self.pp, "cp": 1}
        return {"tp": self.tp, "cp": self.cp, "dp": self.dp, "pp": self.pp, "ep": 1}

    def _order(self):
        order = self.order.split("-")
        return order + [d for d in ("tp", "cp", "ep", "dp", "pp") if d not in order]

    def groups(self, kind, expert=False):
        """The rank groups of `kind` (dims joined by "-", e.g. "tp-pp"), as lists of global
        ranks: the ranks that differ only along those dims, the first dim of the order
        fastest, as Megatron-Core's RankGenerator.get_ranks forms them."""
        sizes, order = self._sizes(expert), self._order()
        want = kind.split("-")
        masked = [d for d in order if d in want]
        rest = [d for d in order if d not in want]
        groups = []
        for r in range(_prod(sizes[d] for d in rest)):
            fixed = dict(zip(rest, _unravel(r, [sizes[d] for d in rest])))
            group = []
            for m in range(_prod(sizes[d] for d in masked)):
                c = dict(fixed, **dict(zip(masked, _unravel(m, [sizes[d] for d in masked]))))
                group.append(self.rank(c, expert))
            groups.append(group)
        return groups

    def rank(self, coords, expert=False):
        """The global rank at {dim: coordinate} (dims left out are 0)."""
        sizes, rank, stride = self._sizes(expert), 0, 1
        for d in self._order():
            rank += coords.get(d, 0) * stride
            stride *= sizes[d]
        return rank

    def coords(self, rank, expert=False):
        """{dim: coordinate} of a global rank."""
        sizes, out = self._sizes(expert), {}
        for d in self._order():
            out[d] = rank % sizes[d]
            rank //= sizes[d]
        return out


def _prod(it):
    n = 1
    for x in it:
        n *= x
    return n


def _unravel(i, sizes):
    out = []
    for n in sizes:
        out.append(i % n)
        i //= n
    return out


def megatron_groups(kind, par, expert=False):
    """The same groups as MegatronParallel.groups, from megatron-core's own RankGenerator."""
    from megatron.core.parallel_state import RankGenerator

    if expert:
        gen = RankGenerator(tp=par.etp, ep=par.ep, dp=par.edp, pp=par.pp, cp=1, order=par.order,
                            rank_offset=0)
    else:
        gen = RankGenerator(tp=par.tp, ep=1, dp=par.dp, pp=par.pp, cp=par.cp, order=par.order,
                            rank_offset=0)
    return gen.get_ranks(kind)


class ParamInfo:
    """What megatron_layouts reads of a parameter, without its data: picklable, so that every
    rank can learn every stage's parameters."""

    def __init__(self, p):
        self.shape = tuple(int(n) for n in p.shape)
        self.dtype = str(p.dtype)
        self.tensor_model_parallel = bool(getattr(p, "tensor_model_parallel", False))
        self.partition_dim = int(getattr(p, "partition_dim", -1))
        self.partition_stride = int(getattr(p, "partition_stride", 1))


def megatron_model_layouts(module, layers_per_stage=None, num_experts=None,
                           gated_linear_unit=False, order="tp-cp-ep-dp-pp"):
    """megatron_layouts of a Megatron-Core model on this rank, after initialize_model_parallel:
    sizes and rank order from its parallel state, every stage's parameters learned from the
    stage's first rank (an all_gather_object over the default group: collective)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    par = MegatronParallel.from_parallel_state(order)
    mine = None
    if ps.get_tensor_model_parallel_rank() == 0 and ps.get_data_parallel_rank() == 0 and \
            ps.get_context_parallel_rank() == 0:
        mine = (ps.get_pipeline_model_parallel_rank(),
                {n: ParamInfo(p) for n, p in module.named_parameters()})
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    stages = [None] * par.pp
    for item in every:
        if item is not None:
            stages[item[0]] = item[1]
    return megatron_layouts(stages, par, layers_per_stage, num_experts, gated_linear_unit)


_LAYER = re.compile(r"(^|\.)layers\.(\d+)\.")
_EXPERT = re.compile(r"(^|\.)local_experts\.(\d+)\.")


def megatron_layouts(stages, par, layers_per_stage=None, num_experts=None,
                     gated_linear_unit=False):
    """{global name: Layout} of a Megatron-Core model: stages[pp] is the named parameters
    (name -> tensor or meta tensor with Megatron's attributes) of pipeline stage pp, as its
    tensor-parallel rank 0 holds them (global shapes are local times tp along partition_dim).
    Layer numbers become global (stage * layers_per_stage + local); expert k of an
    expert-parallel rank e becomes expert e * local_experts + k. A parameter is held by the tp
    group (or the expert tp group) of every dp replica of its stage: mesh (dp, tp). With
    gated_linear_unit (SwiGLU), linear_fc1 holds [gate_r; up_r] on tp rank r: SS(0,2). The
    fused linear_qkv holds whole query groups per tp rank: S(0) of the interleaved tensor."""
    out = {}
    for pp, params in enumerate(stages):
        for name, p in params.items():
            gname, expert = _global_name(name, pp, layers_per_stage, par, num_experts)
            shape = list(p.shape)
            tp = par.etp if expert else par.tp
            tensor_parallel = bool(getattr(p, "tensor_model_parallel", False))
            dim = int(getattr(p, "partition_dim", -1))
            stride = int(getattr(p, "partition_stride", 1))
            if gated_linear_unit and name.endswith("linear_fc1.weight"):
                stride = 2
            if tensor_parallel and tp > 1:
                shape[dim] *= tp
                place = "S(%d)" % dim if stride == 1 else "SS(%d,%d)" % (dim, stride)
            else:
                place = "R"
            if expert:
                for e in range(par.ep):
                    name_e = _expert_name(gname, e, num_experts, par.ep)
                    ranks = _mesh_ranks(par, pp, expert=True, ep_rank=e)
                    out[name_e] = _spec(shape, p.dtype, ranks, (len(ranks) // tp, tp),
                                        "R," + place)
            else:
                ranks = _mesh_ranks(par, pp)
                out[gname] = _spec(shape, p.dtype, ranks, (len(ranks) // tp, tp), "R," + place)
    return out


def _global_name(name, pp, layers_per_stage, par, num_experts):
    if layers_per_stage is not None:
        name = _LAYER.sub(lambda m: "%slayers.%d." % (m.group(1), pp * layers_per_stage +
                                                       int(m.group(2))), name)
    return name, bool(_EXPERT.search(name))


def _expert_name(name, ep_rank, num_experts, ep):
    if not num_experts:
        _fail("megatron_layouts: expert parameter %s needs num_experts" % name)
    local = num_experts // ep
    return _EXPERT.sub(lambda m: "%slocal_experts.%d." % (m.group(1), ep_rank * local +
                                                           int(m.group(2))), name)


def _mesh_ranks(par, pp, expert=False, ep_rank=0):
    """Global ranks of stage pp in (dp, tp) mesh order: every dp (or expert dp) replica's tp
    group, for the given expert-parallel rank."""
    world = par.world
    rows = {}
    for r in range(world):
        c = par.coords(r, expert)
        if c["pp"] != pp or (expert and c["ep"] != ep_rank):
            continue
        rep = (c["dp"], c.get("cp", 0)) if not expert else (c["dp"],)
        rows.setdefault(rep, {})[c["tp"]] = r
    return [rows[k][t] for k in sorted(rows) for t in sorted(rows[k])]


# ---- vLLM ----

def _tp(module):
    return int(getattr(module, "tp_size", 1) or 1)


def vllm_layouts(model, ranks):
    """{name: Layout} of a vLLM model's parameters on the inference ranks `ranks` (the
    tensor-parallel group in tp-rank order, or tp groups of several replicas: len(ranks) a
    multiple of tp, replica-major). Checkpoint-side names: q_proj / k_proj / v_proj and
    gate_proj / up_proj are views of the fused qkv_proj / gate_up_proj buffers (.buffers maps
    each name to the tensor to pass: a view's fused parameter)."""
    ranks = list(ranks)
    out = ModelLayouts()
    for prefix, module in model.named_modules():
        kind = type(module).__name__
        direct = {n: p for n, p in module.named_parameters(recurse=False)}
        if not direct:
            continue
        base = prefix + "." if prefix else ""
        parent = prefix.rsplit(".", 1)[0] + "." if "." in prefix else ""
        tp = _tp(module)
        if len(ranks) % tp:
            _fail("vllm_layouts: %s has tp_size %d, which does not divide the %d ranks"
                  % (prefix, tp, len(ranks)))
        mesh = (len(ranks) // tp, tp)
        for pname, p in direct.items():
            name = base + pname
            if kind == "QKVParallelLinear" and pname in ("weight", "bias"):
                for view, lay in _qkv(module, parent, name, pname, p, ranks, mesh).items():
                    out[view], out.buffers[view] = lay, p
            elif kind == "MergedColumnParallelLinear" and pname in ("weight", "bias"):
                for view, lay in _merged(module, parent, name, pname, p, ranks, mesh).items():
                    out[view], out.buffers[view] = lay, p
            elif kind in ("VocabParallelEmbedding", "ParallelLMHead") and pname == "weight":
                out[name] = _vocab(module, name, p, ranks, mesh)
            elif kind == "FusedMoE" and pname in ("w13_weight", "w2_weight"):
                out[name] = _moe(module, name, pname, p, ranks)
            elif kind in ("ColumnParallelLinear", "QKVParallelLinear",
                          "MergedColumnParallelLinear") and tp > 1:
                shape = list(p.shape)
                shape[0] *= tp  # weight (out, in) and bias (out,) shard dim 0
                out[name] = _spec(shape, p.dtype, ranks, mesh, "R,S(0)")
            elif kind == "RowParallelLinear" and pname == "weight" and tp > 1:
                out[name] = _spec((p.shape[0], p.shape[1] * tp), p.dtype, ranks, mesh,
                                  "R,S(1)")
            else:  # replicated layers, norms, a row-parallel bias
                out[name] = _spec(p.shape, p.dtype, ranks, (len(ranks),), "R")
            if name in out:
                out.buffers.setdefault(name, p)
    return out


class ModelLayouts(dict):
    """{name: Layout}, and .buffers: {name: the tensor a refit reads or writes for it} (a
    view's fused parameter; the parameter itself otherwise)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.buffers = {}


def _qkv(m, parent, name, pname, p, ranks, mesh):
    """q, k and v of a QKVParallelLinear weight or bias: tp rank r's fused buffer holds its q
    heads, then its kv heads of k, then of v."""
    tp = mesh[1]
    hd = int(m.head_size)
    heads, kv = int(m.total_num_heads), int(m.total_num_kv_heads)
    if heads % tp or (kv >= tp and kv % tp) or (kv < tp and tp % kv):
        _fail("vllm_layouts: %s: %d heads and %d kv heads do not split over tp %d"
              % (name, heads, kv, tp))
    inner = tuple(int(n) for n in p.shape[1:])
    row = _prod(inner)
    q_local, kv_local = heads // tp * hd, max(kv // tp, 1) * hd
    out = {parent + "q_proj." + pname: _spec((heads * hd,) + inner, p.dtype, ranks, mesh,
                                             "R,S(0)", "buffer=%s offset=0" % name)}
    for i, part in enumerate(("k_proj", "v_proj")):
        view = "buffer=%s offset=%d" % (name, (q_local + i * kv_local) * row)
        shape = (kv * hd,) + inner
        if kv >= tp:
            out[parent + part + "." + pname] = _spec(shape, p.dtype, ranks, mesh, "R,S(0)", view)
        else:  # GQA: each kv head held by tp / kv consecutive tp ranks
            out[parent + part + "." + pname] = _spec(shape, p.dtype, ranks,
                                                     (mesh[0], kv, tp // kv), "R,S(0),R", view)
    return out


def _merged(m, parent, name, pname, p, ranks, mesh):
    """gate and up of a MergedColumnParallelLinear: tp rank r holds its rows of each."""
    tp = mesh[1]
    sizes = [int(s) for s in m.output_sizes]
    parts = ("gate_proj", "up_proj") if len(sizes) == 2 else ["part%d" % i for i in
                                                              range(len(sizes))]
    inner = tuple(int(n) for n in p.shape[1:])
    out, offset = {}, 0
    for part, size in zip(parts, sizes):
        if size % tp:
            _fail("vllm_layouts: %s: output size %d does not split over tp %d" % (name, size, tp))
        out[parent + part + "." + pname] = _spec(
            (size,) + inner, p.dtype, ranks, mesh, "R,S(0)",
            "buffer=%s offset=%d" % (name, offset * _prod(inner)))
        offset += size // tp
    return out


def _vocab(m, name, p, ranks, mesh):
    tp = mesh[1]
    org = int(getattr(m, "org_vocab_size", p.shape[0] * tp))
    per = int(p.shape[0])  # rows per rank, padding included
    hidden = int(p.shape[1])
    chunk = -(-org // tp)
    if per == chunk or (per >= chunk and all(
            min(org, (r + 1) * per) - min(org, r * per) == max(0, min(org, (r + 1) * chunk) -
                                                                min(org, r * chunk))
            for r in range(tp))):
        # each rank's real rows are torch.chunk's: a shard at the start of its padded buffer
        return _spec((org, hidden), p.dtype, ranks, mesh, "R,S(0)", "buffer=%s" % name)
    if per * tp >= org:  # the padded vocabulary: both sides must hold it padded
        return _spec((per * tp, hidden), p.dtype, ranks, mesh, "R,S(0)")
    _fail("vllm_layouts: %s: %d rows per rank cannot hold %d over tp %d" % (name, per, org, tp))


def _moe(m, name, pname, p, ranks):
    """w13 (experts, 2 * intermediate, hidden) and w2 (experts, hidden, intermediate): experts
    over the ep ranks, intermediate over tp (w13's gate and up halves each: SS(1,2))."""
    ep = int(getattr(m, "ep_size", 1) or 1)
    tp = int(getattr(m, "tp_size", 1) or 1)
    if ep > 1 and tp > 1:
        _fail("vllm_layouts: %s: expert and tensor parallelism together are not described yet"
              % name)
    experts = int(p.shape[0]) * ep
    if pname == "w13_weight":
        shape = (experts, p.shape[1] * tp, p.shape[2])
        place = "S(0)" if ep > 1 else ("SS(1,2)" if tp > 1 else "R")
    else:
        shape = (experts, p.shape[1], p.shape[2] * tp)
        place = "S(0)" if ep > 1 else ("S(2)" if tp > 1 else "R")
    n = max(ep, tp)
    if len(ranks) % n:
        _fail("vllm_layouts: %s: %d ranks for ep %d x tp %d" % (name, len(ranks), ep, tp))
    return _spec(shape, p.dtype, ranks, (len(ranks) // n, n), "R," + place)


# ---- names between the sides ----

def rename(layouts, mapping):
    """{new name: Layout}: mapping is a function of the old name, or a list of (regex,
    replacement) applied in order."""
    if not callable(mapping):
        rules = [(re.compile(a), b) for a, b in mapping]

        def mapping(name):
            for rx, rep in rules:
                name = rx.sub(rep, name)
            return name
    out = {}
    for name, lay in layouts.items():
        new = mapping(name)
        if new in out:
            _fail("rename: %s and another tensor both become %s" % (name, new))
        out[new] = lay
    return out


def pair(src, dst, ignore=()):
    """[(name, src layout, dst layout)] for Plan, by name; a tensor on one side only is an
    error naming it (unless it matches a regex of `ignore`)."""
    skip = [re.compile(x) for x in ignore]

    def kept(name):
        return not any(rx.search(name) for rx in skip)

    only_src = sorted(n for n in src if n not in dst and kept(n))
    only_dst = sorted(n for n in dst if n not in src and kept(n))
    if only_src or only_dst:
        parts = []
        if only_src:
            parts.append("only the source has %s" % ", ".join(only_src[:8]))
        if only_dst:
            parts.append("only the destination has %s" % ", ".join(only_dst[:8]))
        _fail("the two sides name different tensors: " + "; ".join(parts))
    return [(n, src[n], dst[n]) for n in src if n in dst]


# Megatron-Core -> HF names of a GPT model (Llama-style), for rename()
MEGATRON_TO_HF = [
    (r"^embedding\.word_embeddings\.weight$", "model.embed_tokens.weight"),
    (r"^decoder\.final_layernorm\.weight$", "model.norm.weight"),
    (r"^output_layer\.weight$", "lm_head.weight"),
    (r"^decoder\.layers\.(\d+)\.self_attention\.linear_proj\.weight$",
     r"model.layers.\1.self_attn.o_proj.weight"),
    (r"^decoder\.layers\.(\d+)\.self_attention\.linear_qkv\.layer_norm_weight$",
     r"model.layers.\1.input_layernorm.weight"),
    (r"^decoder\.layers\.(\d+)\.mlp\.linear_fc1\.layer_norm_weight$",
     r"model.layers.\1.post_attention_layernorm.weight"),
    (r"^decoder\.layers\.(\d+)\.mlp\.linear_fc2\.weight$", r"model.layers.\1.mlp.down_proj.weight"),
]

__all__ = ["dtensor_layouts", "MegatronParallel", "megatron_groups", "megatron_layouts",
           "megatron_model_layouts", "ParamInfo",
           "vllm_layouts", "rename", "pair", "MEGATRON_TO_HF"]
