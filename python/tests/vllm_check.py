# SPDX-License-Identifier: Apache-2.0
"""The "reshard" vLLM weight-transfer engine end to end on CPU, 4 processes: two trainer
ranks hold a tiny Llama-style checkpoint as DTensors (Shard(0) over both, FSDP-like), two vLLM
workers hold a model made of vLLM's own parallel layers under tensor parallelism 2 (fused
QKV with GQA, fused gate_up, row-parallel, a padded vocabulary and LM head, a norm). The
engines come from vLLM's registries (WeightTransferEngineFactory /
WeightTransferTrainerFactory) after vLLM's plugin loader ran reshard's entry point; the
client is a pipe to the workers. Every worker parameter is then compared with a second copy
loaded by vLLM's own weight loaders from the same checkpoint. Exit 0 when all match, 1 when
not, 77 when vLLM or torch is missing (the reason is printed)."""
import os
import socket
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

# no GPU here: vLLM's CPU platform (set before vllm is imported, in every process)
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
try:
    import torch
    import torch.multiprocessing as mp
    import vllm  # noqa: F401
except ImportError as e:
    print("vllm_check: skipped: torch and vllm are needed (%s)" % e)
    sys.exit(77)

HIDDEN, HEAD, HEADS, KV, FFN, VOCAB, PADDED = 16, 4, 4, 1, 24, 50, 64


def checkpoint():
    """The HF-named checkpoint; embeddings and LM head padded to vLLM's 64 rows (the trainer
    holds the padded vocabulary, as Megatron does)."""
    g = torch.Generator().manual_seed(5)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    pre = "model.layers.0."
    ck = {"model.embed_tokens.weight": r(PADDED, HIDDEN),
          pre + "self_attn.q_proj.weight": r(HEADS * HEAD, HIDDEN),
          pre + "self_attn.k_proj.weight": r(KV * HEAD, HIDDEN),
          pre + "self_attn.v_proj.weight": r(KV * HEAD, HIDDEN),
          pre + "self_attn.q_proj.bias": r(HEADS * HEAD),
          pre + "self_attn.k_proj.bias": r(KV * HEAD),
          pre + "self_attn.v_proj.bias": r(KV * HEAD),
          pre + "self_attn.o_proj.weight": r(HIDDEN, HEADS * HEAD),
          pre + "mlp.gate_proj.weight": r(FFN, HIDDEN),
          pre + "mlp.up_proj.weight": r(FFN, HIDDEN),
          pre + "mlp.down_proj.weight": r(HIDDEN, FFN),
          "model.norm.weight": r(HIDDEN),
          "lm_head.weight": r(PADDED, HIDDEN)}
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        ck[name][VOCAB:] = 0  # padding rows
    return ck


def build_model():
    from vllm.model_executor.layers.layernorm import RMSNorm
    from vllm.model_executor.layers.linear import (MergedColumnParallelLinear,
                                                   QKVParallelLinear, RowParallelLinear)
    from vllm.model_executor.layers.vocab_parallel_embedding import (ParallelLMHead,
                                                                     VocabParallelEmbedding)

    f32 = dict(params_dtype=torch.float32)
    nn = torch.nn

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv_proj = QKVParallelLinear(HIDDEN, HEAD, HEADS, KV, bias=True, **f32)
            self.o_proj = RowParallelLinear(HEADS * HEAD, HIDDEN, bias=False, **f32)

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_up_proj = MergedColumnParallelLinear(HIDDEN, [FFN, FFN], bias=False, **f32)
            self.down_proj = RowParallelLinear(FFN, HIDDEN, bias=False, **f32)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn, self.mlp = Attn(), Mlp()

    class Inner(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = VocabParallelEmbedding(VOCAB, HIDDEN, **f32)
            self.layers = nn.ModuleList([Layer()])
            self.norm = RMSNorm(HIDDEN)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = Inner()
            self.lm_head = ParallelLMHead(VOCAB, HIDDEN, **f32)

    m = Model()
    with torch.no_grad():
        for p in m.parameters():
            p.zero_()
    return m


def load_reference(model, ck):
    """vLLM's own loaders: what load_weights would put in each parameter."""
    from vllm.model_executor.model_loader.weight_utils import default_weight_loader

    params = dict(model.named_parameters())
    fused = {"q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"),
             "v_proj": ("qkv_proj", "v"), "gate_proj": ("gate_up_proj", 0),
             "up_proj": ("gate_up_proj", 1)}
    with torch.no_grad():
        for name, full in ck.items():
            parts = name.split(".")
            if len(parts) > 2 and parts[-2] in fused:
                target, shard = fused[parts[-2]]
                p = params[".".join(parts[:-2] + [target, parts[-1]])]
                p.weight_loader(p, full, shard)
                continue
            p = params[name]
            if "embed_tokens" in name or "lm_head" in name:
                full = full[:VOCAB]  # vLLM's loader takes the checkpoint's real rows
            getattr(p, "weight_loader", default_weight_loader)(p, full)


def worker(w, port, cmds, replies):
    try:
        from vllm.config import VllmConfig, WeightTransferConfig, set_current_vllm_config
        from vllm.distributed import init_distributed_environment, initialize_model_parallel
        from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
        from vllm.plugins import load_general_plugins

        cfg = VllmConfig()
        with set_current_vllm_config(cfg):
            init_distributed_environment(world_size=2, rank=w, local_rank=w, backend="gloo",
                                         distributed_init_method="tcp://127.0.0.1:%d" % port)
            initialize_model_parallel(2)
            load_general_plugins()
            model, ref = build_model(), build_model()
            load_reference(ref, checkpoint())
            engine = WeightTransferEngineFactory.create_engine(
                WeightTransferConfig(backend="reshard"), cfg, torch.device("cpu"), model)
            replies.put((w, "ready", type(engine).__name__))
            while True:
                cmd, payload = cmds.get()
                if cmd == "init":
                    engine.init_transfer_engine(engine.parse_init_info(payload))
                elif cmd == "update":
                    engine.update_weights(payload)
                elif cmd == "check":
                    refs = dict(ref.named_parameters())
                    wrong = {n: int((p != refs[n]).sum()) for n, p in model.named_parameters()}
                    replies.put((w, "check", wrong))
                    continue
                elif cmd == "stop":
                    engine.shutdown()
                    replies.put((w, "stop", None))
                    return
                replies.put((w, cmd, None))
    except Exception:
        replies.put((w, "error", traceback.format_exc()))


class PipeClient:
    """VLLMWeightSyncClient over queues: every call goes to both workers, as vLLM's
    collective_rpc does, and returns when both did."""

    def __init__(self, cmds, replies):
        self.cmds, self.replies = cmds, replies

    def _call(self, cmd, payload=None):
        for q in self.cmds:
            q.put((cmd, payload))
        out = [self.replies.get(timeout=300) for _ in self.cmds]
        for w, what, detail in out:
            if what == "error":
                raise RuntimeError("worker %d:\n%s" % (w, detail))
        return out

    def init_weight_transfer_engine(self, init_info):
        self._call("init", init_info)

    def start_weight_update(self):
        pass

    def update_weights(self, update_info):
        self._call("update", update_info)

    def finish_weight_update(self, weight_version=None):
        pass


def trainer(rank, port, cmds, replies, out):
    try:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
        from vllm.plugins import load_general_plugins

        from reshard.vllm_engine import DTensorSource, ReshardTrainerInitInfo

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=2)
        load_general_plugins()
        mesh = init_device_mesh("cpu", (2,))
        named = {n: distribute_tensor(t, mesh, [Shard(0)] if t.dim() == 2 else [Replicate()])
                 for n, t in checkpoint().items()}
        client = PipeClient(cmds, replies) if rank == 0 else None
        if rank == 0:
            ready = [replies.get(timeout=300) for _ in cmds]
            for w, what, detail in ready:
                if what != "ready":
                    raise RuntimeError("worker %d: %s" % (w, detail))
        info = ReshardTrainerInitInfo(rank=rank, trainer_world_size=2, inference_world_size=2)
        engine = WeightTransferTrainerFactory.trainer_init(info, client=client,
                                                           source=DTensorSource(named))
        engine.send_weights()
        engine.send_weights()  # a second round on the same plan
        result = None
        if rank == 0:
            result = client._call("check")
            for q in cmds:  # closing the communicator is collective: both sides at once
                q.put(("stop", None))
        ntensors = len(engine.plan.names)
        engine.shutdown()
        if rank == 0:
            for _ in cmds:
                replies.get(timeout=300)
        dist.destroy_process_group()
        out.put((rank, ntensors, result, None))
    except Exception:
        out.put((rank, 0, None, traceback.format_exc()))


def free_port():
    with socket.socket() as s:  # bound and read back; released for the store to take
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ctx = mp.get_context("spawn")
    cmds = [ctx.Queue() for _ in range(2)]
    replies, out = ctx.Queue(), ctx.Queue()
    wport, tport = free_port(), free_port()
    procs = [ctx.Process(target=worker, args=(w, wport, cmds[w], replies)) for w in range(2)]
    procs += [ctx.Process(target=trainer, args=(r, tport, cmds, replies, out)) for r in range(2)]
    for p in procs:
        p.start()
    results = sorted(out.get(timeout=600) for _ in range(2))
    for p in procs:
        p.join(60)
    bad = 0
    for rank, ntensors, result, err in results:
        if err:
            print("trainer %d:\n%s" % (rank, err))
            bad += 1
    checks = results[0][2] or []
    params = wrong = 0
    for w, _, per_param in checks:
        for name, n in sorted(per_param.items()):
            params += 1
            wrong += n
            if n:
                print("worker %d: %s: %d elements differ from vLLM's own loading" % (w, name, n))
    print("vllm_check: %d checkpoint tensors, %d worker parameters (tp 2, 2 workers) after 2 "
          "rounds: %d elements differ from vLLM's weight loaders" % (results[0][1], params,
                                                                     wrong))
    sys.exit(1 if bad or wrong or not params else 0)


if __name__ == "__main__":
    main()
