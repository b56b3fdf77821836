# SPDX-License-Identifier: Apache-2.0
"""A tiny Megatron-Core model refit through reshard.models, on CPU (gloo), 4 processes:
megatron-core's own layers (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding)
under tensor parallel 2 x pipeline parallel 2, a fused linear_qkv, a SwiGLU linear_fc1 that
holds [gate_r; up_r] on each tp rank, two layers (one per stage, numbered locally by each
stage). Each rank fills its parameters from a seeded checkpoint the way Megatron's checkpoint
converters cut it; megatron_model_layouts reads the layouts from the parallel state and the
parameters; names become HF names where HF has one (rename); one plan refits everything into
tp 4 over the same four ranks (S(0), norms replicated), and every element is compared.
Exit 0 when nothing differs, 1 when something does, 77 when megatron-core or torch is missing."""
import os
import socket
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    import megatron.core  # noqa: F401
except ImportError as e:
    print("megatron_check: skipped: torch and megatron-core are needed (%s)" % e)
    sys.exit(77)

H, FFN, VOCAB, GROUPS, QPG, HD = 16, 24, 48, 2, 2, 4  # 2 query groups of 2 heads, head dim 4
QKV = GROUPS * (QPG + 2) * HD


def checkpoint():
    """Megatron-named full tensors (global layer numbers)."""
    g = torch.Generator().manual_seed(11)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    ck = {"embedding.word_embeddings.weight": r(VOCAB, H)}
    for l in range(2):
        pre = "decoder.layers.%d." % l
        ck[pre + "self_attention.linear_qkv.weight"] = r(QKV, H)
        ck[pre + "self_attention.linear_qkv.bias"] = r(QKV)
        ck[pre + "self_attention.linear_proj.weight"] = r(H, GROUPS * QPG * HD)
        ck[pre + "mlp.linear_fc1.weight"] = r(2 * FFN, H)  # [gate; up]
        ck[pre + "mlp.linear_fc2.weight"] = r(H, FFN)
    ck["decoder.final_layernorm.weight"] = r(H)
    ck["output_layer.weight"] = r(VOCAB, H)
    return ck


def megatron_cut(name, full, tp, t, dim):
    """Megatron's tp rank t piece: torch.chunk along dim; SwiGLU fc1: gate and up each."""
    if name.endswith("linear_fc1.weight"):
        gate, up = full.chunk(2, dim=0)
        return torch.cat([gate.chunk(tp, 0)[t], up.chunk(tp, 0)[t]])
    return full.chunk(tp, dim=dim)[t]


def build_stage(pp_rank, cfg):
    from megatron.core.tensor_parallel import (ColumnParallelLinear, RowParallelLinear,
                                               VocabParallelEmbedding)

    zero = torch.nn.init.zeros_
    nn = torch.nn

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear_qkv = ColumnParallelLinear(H, QKV, config=cfg, init_method=zero,
                                                   bias=True, gather_output=False)
            self.linear_proj = RowParallelLinear(GROUPS * QPG * HD, H, config=cfg,
                                                 init_method=zero, bias=False,
                                                 input_is_parallel=True, skip_bias_add=False)

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear_fc1 = ColumnParallelLinear(H, 2 * FFN, config=cfg, init_method=zero,
                                                   bias=False, gather_output=False)
            self.linear_fc2 = RowParallelLinear(FFN, H, config=cfg, init_method=zero, bias=False,
                                                input_is_parallel=True, skip_bias_add=False)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attention, self.mlp = Attention(), Mlp()

    class Decoder(nn.Module):
        def __init__(self, last):
            super().__init__()
            self.layers = nn.ModuleList([Layer()])  # local number 0 on every stage
            if last:
                self.final_layernorm = nn.LayerNorm(H, elementwise_affine=True, bias=False)

    class Stage(nn.Module):
        def __init__(self):
            super().__init__()
            if pp_rank == 0:
                self.embedding = nn.Module()
                self.embedding.word_embeddings = VocabParallelEmbedding(VOCAB, H,
                                                                        init_method=zero,
                                                                        config=cfg)
            self.decoder = Decoder(pp_rank == 1)
            if pp_rank == 1:
                self.output_layer = ColumnParallelLinear(H, VOCAB, config=cfg, init_method=zero,
                                                         bias=False, gather_output=False)

    return Stage()


def run(rank, port, out):
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=4)
        from megatron.core import parallel_state as ps
        from megatron.core.model_parallel_config import ModelParallelConfig

        import reshard
        from reshard import models

        ps.initialize_model_parallel(tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
        cfg = ModelParallelConfig(tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
                                  use_cpu_initialization=True, params_dtype=torch.float32,
                                  pipeline_dtype=torch.float32)
        pp, tp_rank = ps.get_pipeline_model_parallel_rank(), ps.get_tensor_model_parallel_rank()
        stage = build_stage(pp, cfg)
        ck = checkpoint()
        with torch.no_grad():  # Megatron's way of cutting a checkpoint, on this rank
            for name, p in stage.named_parameters():
                gname = name.replace("layers.0.", "layers.%d." % pp)
                if getattr(p, "tensor_model_parallel", False):
                    p.copy_(megatron_cut(gname, ck[gname], 2, tp_rank, p.partition_dim))
                else:
                    p.copy_(ck[gname])
        src = models.megatron_model_layouts(stage, layers_per_stage=1, gated_linear_unit=True)
        src = models.rename(src, models.MEGATRON_TO_HF)
        names = sorted(src)
        full = models.rename({n: t for n, t in ck.items()}, models.MEGATRON_TO_HF)
        dst = {n: reshard.Layout.from_placements(
            t.shape, t.dtype, range(4), ["S(0)" if t.dim() == 2 else "R"]) for n, t in full.items()}
        mine = {}
        for name, p in stage.named_parameters():
            gname = name.replace("layers.0.", "layers.%d." % pp)
            mine[models.rename({gname: None}, models.MEGATRON_TO_HF).popitem()[0]] = p
        got = {n: torch.zeros(dst[n].shard_shape(rank)) for n in names}
        comm = reshard.Comm.from_process_group()
        with reshard.Plan(comm, models.pair(src, dst)) as plan:
            plan.execute({n: mine.get(n) for n in names}, got)
        wrong = sum(int((got[n] != dst[n].shard_of(full[n], rank)).sum()) for n in names)
        # a tensor on one side only is named
        try:
            models.pair(src, dict(dst, extra=dst[names[0]]))
            named = "no error"
        except reshard.ReshardError as e:
            named = e.message
        # the vLLM engine's trainer-side source over the same model says the same
        try:
            from reshard.vllm_engine import MegatronSource

            source = MegatronSource(stage, layers_per_stage=1, gated_linear_unit=True)
            lays = models.rename(source.reshard_layouts(), models.MEGATRON_TO_HF)
            local = models.rename(dict(source.iter_local()), models.MEGATRON_TO_HF)
            wrong += sum(lays[n].spec != src[n].spec for n in names)
            wrong += sum(local[n] is not mine[n] for n in mine)
        except ImportError:  # vLLM is not installed: its source is not checked
            pass
        comm.close()
        out.put((rank, len(names), wrong, named, sorted(src)[:3], None))
        dist.destroy_process_group()
    except Exception:
        out.put((rank, 0, -1, "", [], traceback.format_exc()))


def main():
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [ctx.Process(target=run, args=(r, port, q)) for r in range(4)]
    for p in procs:
        p.start()
    results = sorted(q.get(timeout=600) for _ in procs)
    for p in procs:
        p.join(60)
    bad = 0
    for rank, n, wrong, named, _, err in results:
        if err:
            print("rank %d:\n%s" % (rank, err))
            bad += 1
        bad += wrong != 0
        if "only the destination has extra" not in named:
            print("rank %d: pair() said %r" % (rank, named))
            bad += 1
    print("megatron_check: %d tensors (tp 2 x pp 2 -> tp 4), %d elements wrong; a tensor on one "
          "side only: %s" % (results[0][1], sum(r[2] for r in results), results[0][3]))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
