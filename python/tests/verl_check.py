# SPDX-License-Identifier: Apache-2.0
"""veRL's "reshard" checkpoint engine, found through verl.checkpoint_engine's
CheckpointEngineRegistry and driven through the base class's methods as veRL's
CheckpointEngineManager drives them: prepare on every rank, build_topology on the
metadata, init_process_group with each rank's arguments, send_weights on the actor ranks
(a model under FSDP2 on 4 gloo ranks) with receive_weights on 2 rollout ranks, finalize.
Four syncs: the model's DTensors; the (name, local shard, ShardSpec) triples of veRL's FSDP
engine's export, from an object with its get_per_tensor_param_shard (veRL's own ShardSpec);
the DTensors again into a sharded consumer (a rollout_layout hook: matrices by rows); the
gathered full tensors veRL's actor worker passes today (a source replicated over the actor
ranks). A fifth where actor rank 1 describes one tensor unlike rank 0 must fail every rank,
naming it, and leave the communicator to finalize. Then two through veRL's own actor worker
code, ActorRolloutRefWorker.update_weights: reshard.verl_workers' subclass (what the
reshard_* trainers run), which must send exactly what sync 1 sent from each actor rank (local
shards only), and the stock class, which gathers full tensors first. The last sends a model of
megatron-core's own parallel layers (tensor parallel 2 x data parallel 2 over the actor ranks)
as the module itself: layouts from the parameters' Megatron attributes. Every element
the rollout ranks yield is compared with the unsharded model; the bytes each rank's
transports moved are compared with the plan's. Exit 0 when all agree, 1 when not, 77 when
torch or verl is missing (the reason is printed)."""
import asyncio
import os
import socket
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    import verl.checkpoint_engine as ce
except ImportError as e:
    print("verl_check: skipped: torch and verl are needed (%s)" % e)
    sys.exit(77)



def verl_shard_spec():
    """veRL's ShardSpec (verl/workers/engine/spec.py), loaded from its file: the package
    verl.workers.engine imports every training engine's dependencies (peft, datasets, ...)."""
    import importlib.util

    path = os.path.join(os.path.dirname(ce.__file__), "..", "workers", "engine", "spec.py")
    spec = importlib.util.spec_from_file_location("verl_engine_spec", path)
    module = sys.modules["verl_engine_spec"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ShardSpec


def verl_workers():
    """veRL's ActorRolloutRefWorker and reshard.verl_workers' subclass of it, with the
    training-only packages veRL's worker and trainer modules import (and the frameworks venv,
    whose veRL is installed without dependencies, lacks) stood in by empty modules in this
    process (verl_standins)."""
    import importlib

    import verl_standins

    stood_in = verl_standins.install()
    from verl.workers.engine_workers import ActorRolloutRefWorker

    import reshard.verl_workers as workers

    if workers.TRAINERS_SKIPPED:  # imported by `import verl` before the stand-ins
        workers = importlib.reload(workers)
    for _ in range(20):  # then as long as another training-only package lacks
        if not workers.TRAINERS_SKIPPED:
            break
        lacking = workers.TRAINERS_SKIPPED.partition("No module named '")[2].split("'")[0]
        if not verl_standins.add(lacking.split(".")[0]):
            break
        workers = importlib.reload(workers)
    if workers.TRAINERS_SKIPPED:
        raise RuntimeError("reshard.verl_workers: " + workers.TRAINERS_SKIPPED)
    return ActorRolloutRefWorker, workers, list(verl_standins.STOOD_IN)


ShardSpec = verl_shard_spec()
StockWorker, WORKERS, STOOD_IN = verl_workers()
ACTORS, ROLLOUTS = 4, 2
SYNCS = ("dtensors", "shardspec", "rollout-rows", "full-tensors", "mismatch", "worker",
         "worker-stock", "megatron")


def megatron_checkpoint():
    """The full tensors of the Megatron sync's model (Megatron names)."""
    g = torch.Generator().manual_seed(5)
    return {"embedding.word_embeddings.weight": torch.randn(48, 16, generator=g),
            "mlp.linear_fc1.weight": torch.randn(2 * 24, 16, generator=g),  # [gate; up]
            "mlp.linear_fc2.weight": torch.randn(16, 24, generator=g),
            "mlp.linear_fc2.bias": torch.randn(16, generator=g),
            "norm.weight": torch.randn(16, generator=g)}


def megatron_model(rank):
    """megatron-core's own parallel layers under tensor parallel 2 x data parallel 2 on the 4
    actor ranks (pp 1), each rank's parameters cut from megatron_checkpoint as Megatron's
    converters cut them (SwiGLU linear_fc1: [gate_r; up_r] on tp rank r)."""
    from megatron.core import parallel_state as ps
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.tensor_parallel import (ColumnParallelLinear, RowParallelLinear,
                                               VocabParallelEmbedding)

    ps.initialize_model_parallel(tensor_model_parallel_size=2)
    cfg = ModelParallelConfig(tensor_model_parallel_size=2, use_cpu_initialization=True,
                              params_dtype=torch.float32)
    zero = torch.nn.init.zeros_
    m = torch.nn.Module()
    m.embedding = torch.nn.Module()
    m.embedding.word_embeddings = VocabParallelEmbedding(48, 16, init_method=zero, config=cfg)
    m.mlp = torch.nn.Module()
    m.mlp.linear_fc1 = ColumnParallelLinear(16, 2 * 24, config=cfg, init_method=zero,
                                            bias=False, gather_output=False)
    m.mlp.linear_fc2 = RowParallelLinear(24, 16, config=cfg, init_method=zero, bias=True,
                                         input_is_parallel=True, skip_bias_add=False)
    m.norm = torch.nn.LayerNorm(16, bias=False)
    tp, t = 2, ps.get_tensor_model_parallel_rank()
    ck = megatron_checkpoint()
    with torch.no_grad():
        for name, p in m.named_parameters():
            full = ck[name]
            if name == "mlp.linear_fc1.weight":
                gate, up = full.chunk(2, 0)
                full = torch.cat([gate.chunk(tp, 0)[t], up.chunk(tp, 0)[t]])
            elif getattr(p, "tensor_model_parallel", False):
                full = full.chunk(tp, p.partition_dim)[t]
            p.copy_(full)
    return m


def actor_worker(cls, training_engine, checkpoint_engine):
    """An actor worker as veRL's trainer makes it, with what update_weights reads: its config's
    checkpoint_engine.backend, its training engine, its checkpoint engine."""
    import types

    from omegaconf import OmegaConf

    w = object.__new__(cls)  # the Ray worker's own set-up (device mesh, model) is not needed
    w.config = OmegaConf.create({"rollout": {"checkpoint_engine": {"backend": "reshard"}}})
    w.actor = types.SimpleNamespace(engine=training_engine)
    w.checkpoint_engine = checkpoint_engine
    return w


class ShardExport:
    """What veRL's FSDPEngine.get_per_tensor_param_shard returns, its bf16 cast left out:
    (name, flat local shard, ShardSpec) per parameter, and no peft config."""

    def __init__(self, state_dict):
        self.state_dict = state_dict

    def get_per_tensor_param_shard(self, **kwargs):
        return ((n, p.to_local().reshape(-1), ShardSpec.from_param(p))
                for n, p in self.state_dict.items()), None

    def get_per_tensor_param(self, **kwargs):
        """As FSDPEngine.get_per_tensor_param: each DTensor gathered (full_tensor), lazily."""
        return ((n, p.full_tensor()) for n, p in self.state_dict.items()), None


def rows(name, shape, dtype, rollout):
    """A rollout_layout hook: matrices split by rows over the rollout ranks (a sharded
    consumer), vectors whole on each."""
    if len(shape) != 2:
        return None
    return "shape=%dx%d dtype=%s ranks=%d-%d place=S(0)" % (shape + (dtype,) + rollout)


def expected(full, sync, index):
    if sync == "rollout-rows" and full.dim() == 2:
        return full.chunk(ROLLOUTS, dim=0)[index]
    return full


def model():
    """The same weights in every process: an embedding of 51 rows (uneven over 4 ranks)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(51, 16), torch.nn.Linear(16, 24),
                               torch.nn.ReLU(), torch.nn.Linear(24, 16, bias=False))


def engine_class():
    """The backend as veRL finds it: by name, after its entry points (this package's
    "verl.plugins" one when pip-installed), else through custom_backend_module's import."""
    how = "entry point"
    if "reshard" not in ce.CheckpointEngineRegistry._registry:
        from verl.utils.import_utils import import_external_libs

        import_external_libs("reshard.verl")
        how = "custom_backend_module"
    return ce.CheckpointEngineRegistry.get("reshard"), how


def run(role, index, port, inbox, out):
    try:
        cls, _ = engine_class()
        # every rank a node of its own: each byte between two ranks crosses the network
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RESHARD_TIMEOUT=os.environ.get("VERL_CHECK_TIMEOUT", "300"),
                          RESHARD_DOMAIN=str(index if role == "actor" else ACTORS + index))
        full = {n: p.detach().clone() for n, p in model().state_dict().items()}
        if role == "actor":
            dist.init_process_group("gloo", rank=index, world_size=ACTORS)
            m = model()
            fully_shard(m, mesh=init_device_mesh("cpu", (ACTORS,)))
            engine = cls(bucket_size=2048, is_master=(index == 0))
        else:
            engine = cls(bucket_size=2048)
        results, base = [], engine
        for sync in SYNCS:
            engine = base
            if sync == "rollout-rows":
                engine = cls(bucket_size=2048, is_master=(role == "actor" and index == 0),
                             rollout_layout=rows)
            elif sync == "megatron":
                engine = cls(bucket_size=2048, is_master=(role == "actor" and index == 0),
                             megatron_gated_linear_unit=True)
            out.put(("prepare", role, index, engine.prepare()))
            engine.init_process_group(**inbox.get(timeout=600))
            if role == "actor":
                sd = m.state_dict()
                if sync in ("dtensors", "rollout-rows"):
                    weights = iter(sd.items())
                elif sync == "full-tensors":  # what veRL's actor worker passes (gathered)
                    weights = ((n, p.full_tensor()) for n, p in sd.items())
                elif sync == "megatron":  # the module: Megatron's parameters, as they are
                    weights = megatron_model(index)
                    sd = dict(weights.named_parameters())
                elif sync == "mismatch":  # rank 1 passes one shard as a plain tensor
                    weights = ((n, p.to_local() if index == 1 and n == "1.weight" else p)
                               for n, p in sd.items())
                else:  # a training engine: FSDPEngine.get_per_tensor_param_shard's export
                    weights = ShardExport(sd)
                local = sum((p.to_local() if hasattr(p, "to_local") else p).nbytes
                            for p in sd.values())
                try:
                    if sync.startswith("worker"):  # veRL's ActorRolloutRefWorker.update_weights
                        w = actor_worker(WORKERS.ReshardActorRolloutRefWorker if sync == "worker"
                                         else StockWorker, ShardExport(sd), engine)
                        metrics = asyncio.run(w.update_weights(global_steps=1))
                    else:
                        metrics = asyncio.run(engine.send_weights(weights, global_steps=1))
                except ValueError as e:
                    if sync != "mismatch":
                        raise
                    metrics = {"error": str(e)}
                results.append((sync, 0, 0, local, dict(metrics)))
            else:
                async def receive():
                    got = {}
                    async for name, t in engine.receive_weights(global_steps=1):
                        got[name] = t.clone()  # the buffer is the consumer's to copy
                    return got

                try:
                    got = asyncio.run(receive())
                except ValueError as e:
                    if sync != "mismatch":
                        raise
                    engine.finalize()
                    results.append((sync, 0, 0, 0, {"error": str(e)}))
                    continue
                want = {n: expected(t, sync, index) for n, t in
                        (megatron_checkpoint() if sync == "megatron" else full).items()}
                wrong = sum(int((got[n] != want[n]).sum()) if n in got and
                            got[n].shape == want[n].shape else want[n].numel() for n in want)
                elems = sum(t.numel() for t in got.values())
                results.append((sync, wrong, elems, 0, dict(engine.last_metrics)))
            engine.finalize()
        out.put(("done", role, index, results))
    except Exception:
        out.put(("done", role, index, traceback.format_exc()))


def main():
    cls, how = engine_class()
    ctx = mp.get_context("fork")  # the children find torch and verl imported already
    out = ctx.Queue()
    with socket.socket() as s:  # a free port for gloo's store: bound, read back, released
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ranks = [("actor", i) for i in range(ACTORS)] + [("rollout", i) for i in range(ROLLOUTS)]
    inboxes = {r: ctx.Queue() for r in ranks}
    procs = [ctx.Process(target=run, args=(role, i, port, inboxes[(role, i)], out))
             for role, i in ranks]
    for p in procs:
        p.start()
    done = {}
    failed = False
    for _ in SYNCS:  # CheckpointEngineManager.build_process_group, once per sync
        meta = {}
        while len(meta) < len(ranks) and not failed:
            kind, role, i, value = out.get(timeout=900)
            if kind == "done":
                done[(role, i)] = value
                failed = True
            else:
                meta[(role, i)] = value
        if failed:
            break
        actor_kw, rollout_kw = cls.build_topology(
            ACTORS, ROLLOUTS, [meta[("actor", i)] for i in range(ACTORS)] +
            [meta[("rollout", i)] for i in range(ROLLOUTS)])
        for (role, i), q in inboxes.items():
            kw = actor_kw if role == "actor" else rollout_kw
            q.put({k: v[i] for k, v in kw.items()})
    while len(done) < len(ranks):
        kind, role, i, value = out.get(timeout=900)
        if kind == "done":
            done[(role, i)] = value
    for p in procs:
        p.join(60)
    bad = 0
    for r, v in sorted(done.items()):
        if isinstance(v, str):
            print("%s %d:\n%s" % (r[0], r[1], v))
            bad += 1
    if bad:
        print("verl_check: %d ranks failed" % bad)
        sys.exit(1)
    print("verl_check: CheckpointEngineRegistry.get('reshard') is %s.%s (registered through its "
          "%s)" % (cls.__module__, cls.__name__, how))
    from verl.trainer.ppo.v1 import get_trainer_cls

    trainers = {m: get_trainer_cls("reshard_" + m) for m in ("sync", "colocate_async",
                                                            "separate_async")}
    print("verl_check: veRL's trainer registry: %s; stood in for the import: %s"
          % (", ".join("reshard_%s -> %s" % (m, c.__name__) for m, c in trainers.items()),
             ", ".join(STOOD_IN) or "nothing"))
    per_actor_of = {}
    for k, sync in enumerate(SYNCS):
        rows = [(r, done[r][k]) for r in sorted(done)]
        if sync == "mismatch":
            told = [r for r, v in rows if "actor rank 1" in v[4].get("error", "")]
            print("verl_check: sync %d (%s): %d of %d ranks failed naming actor rank 1; rank 1: "
                  "%s; rollout rank 0: %s" % (k + 1, sync, len(told), len(rows),
                                              rows[1][1][4].get("error"),
                                              rows[ACTORS][1][4].get("error")))
            bad += len(rows) - len(told)
            continue
        total = sum(p.nbytes for p in (megatron_checkpoint() if sync == "megatron" else
                                        model().state_dict()).values())
        wrong = sum(v[1] for _, v in rows)
        elems = sum(v[2] for _, v in rows)
        sent = sum(v[4]["reshard/net_out_bytes"] for _, v in rows)
        recv = sum(v[4]["reshard/net_in_bytes"] for _, v in rows)
        plan = rows[0][1][4]["reshard/plan_net_bytes"]
        # no actor rank sends more than its shard to each rollout rank: no rank sends a gathered
        # tensor, as a broadcast from actor rank 0 (total x rollouts from one rank) would
        over = [r for r, v in rows if r[0] == "actor" and
                sync not in ("full-tensors", "worker-stock") and
                v[4]["reshard/net_out_bytes"] > v[3] * ROLLOUTS]
        per_actor = ",".join(str(v[4]["reshard/net_out_bytes"]) for r, v in rows
                             if r[0] == "actor")
        per_actor_of[sync] = per_actor
        if sync == "worker" and per_actor != per_actor_of["dtensors"]:
            print("verl_check: through the reshard worker the actor ranks sent %s, not the "
                  "shards of sync 1 (%s)" % (per_actor, per_actor_of["dtensors"]))
            bad += 1
        print("verl_check: sync %d (%s): %d elements on %d rollout ranks, %d wrong; network "
              "bytes sent %d, received %d, plan %d; per actor rank %s (a broadcast from rank 0: "
              "%d); %d actor ranks past their shard x %d; %d plans"
              % (k + 1, sync, elems, ROLLOUTS, wrong, sent, recv, plan, per_actor,
                 total * ROLLOUTS, len(over), ROLLOUTS, rows[0][1][4]["reshard/plans"]))
        want = sum(expected(p, sync, i).numel() for p in
                   (megatron_checkpoint() if sync == "megatron" else model().state_dict()).values()
                   for i in range(ROLLOUTS))
        bad += wrong + len(over) + int(sent != plan) + int(recv != plan) + int(elems != want)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
