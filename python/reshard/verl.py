# SPDX-License-Identifier: Apache-2.0
"""veRL's weight sync on reshard: the "reshard" backend of verl.checkpoint_engine's
CheckpointEngineRegistry (verl 0.9.1).

Importing this module registers it. `pip install` of this package declares it as a
"verl.plugins" entry point, which `import verl` loads in every process, so a user sets only

    actor_rollout_ref.rollout.checkpoint_engine.backend=reshard

(or also custom_backend_module=reshard.verl, veRL's own hook, where its entry points are
turned off by VERL_USE_EXTERNAL_PLUGINS=none).

What moves: every actor rank and every rollout rank join one reshard communicator (actor ranks
0..A-1 first, as their torch.distributed ranks, then the rollout ranks). Actor rank 0 sends
every rank the tensor list (name, source layout, destination layout) through reshard itself;
then one plan per bucket moves, from each actor rank, only the parts of its local shard that
the plan gives it: no rank gathers a full tensor and no rank broadcasts one. A rollout rank
receives what its consumer loads: by default the whole named tensor (the form veRL's server
adapters take, "named_tensors"); with engine_kwargs rollout_layout= a function giving a
destination layout spec, its own shard of that layout.

send_weights takes any of:
  - (name, tensor) pairs: a DTensor (FSDP2, TP) is sent from its local shard with
    Layout.from_dtensor; a Megatron-Core parameter (its tensor_model_parallel, partition_dim
    and partition_stride attributes, the sizes and rank order from megatron.core's parallel
    state: reshard.models.megatron_layouts) from its tensor-parallel shard, replicated over the
    data-parallel replicas; a plain tensor is taken as replicated over the actor ranks (the
    plan picks which rank sends which part);
  - a torch module, or a list of them (Megatron's model chunks): its named parameters, as
    above;
  - (name, local, spec) triples: spec a reshard.Layout (Megatron parameters with
    reshard.models.megatron_model_layouts), or veRL's ShardSpec with a DTensor mesh and
    placements (what its engines' get_per_tensor_param_shard yields);
  - a veRL training engine (anything with get_per_tensor_param_shard): its local shards.
"""
import asyncio
import json
import time

import torch
from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry

import reshard

_TORCH_DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32,
                 "f64": torch.float64, "i8": torch.int8, "u8": torch.uint8, "i32": torch.int32,
                 "i64": torch.int64}
for _name, _attr in (("fp8e4m3", "float8_e4m3fn"), ("fp8e5m2", "float8_e5m2")):
    if hasattr(torch, _attr):
        _TORCH_DTYPES[_name] = getattr(torch, _attr)


def _ranks(first, last):
    return "%d" % first if first == last else "%d-%d" % (first, last)


def _resolve(hook):
    """A rollout_layout hook: a callable, or "module:function" as a config string gives it."""
    if hook is None or callable(hook):
        return hook
    import importlib

    module, _, attr = str(hook).partition(":")
    return getattr(importlib.import_module(module), attr)


@CheckpointEngineRegistry.register("reshard")
class ReshardCheckpointEngine(CheckpointEngine):
    """veRL checkpoint engine over reshard (see the module's doc).

    Args:
        bucket_size: bytes of destination tensors per plan (one plan, one execute per bucket);
            a larger tensor is a bucket of its own.
        is_master: actor rank 0 (veRL passes it on the actor side).
        rollout_layout: optional hook (callable or "module:function") called on actor rank 0 as
            rollout_layout(name, shape, dtype, rollout_ranks) -> a layout spec string for the
            rollout side, or None for the default (the whole tensor on every rollout rank).
        megatron_gated_linear_unit: Megatron parameters: linear_fc1 holds [gate_r; up_r] on
            tp rank r (SwiGLU), as megatron_layouts' gated_linear_unit.
        megatron_order: Megatron parameters: the order initialize_model_parallel was given.
    """

    wire_format = "named_tensors"

    def __init__(self, bucket_size=2 << 30, is_master=False, rollout_layout=None,
                 megatron_gated_linear_unit=False, megatron_order="tp-cp-ep-dp-pp", **kwargs):
        self.bucket_size = int(bucket_size)
        self.is_master = bool(is_master)
        self.rollout_layout = _resolve(rollout_layout)
        self.megatron_gated_linear_unit = bool(megatron_gated_linear_unit)
        self.megatron_order = str(megatron_order)
        self._megatron_par = None
        self.comm = None
        self.rank = None
        self.world_size = None
        self.num_actor = None
        self._uid = None
        self.last_metrics = {}

    # ---- topology ----

    def prepare(self):
        """Actor rank 0 makes the rendezvous id of this sync's communicator."""
        if self.is_master:
            self._uid = reshard.unique_id()
            return {"uid": self._uid}
        return {}

    @classmethod
    def build_topology(cls, actor_wg_world_size, rollout_world_size, metadata):
        uid = metadata[0].get("uid") if metadata and metadata[0] else None
        if uid is None:
            raise ValueError("reshard checkpoint engine: actor rank 0 (is_master) made no "
                             "rendezvous id in prepare()")
        world = actor_wg_world_size + rollout_world_size
        common = {"world_size": world, "uid": uid, "num_actor": actor_wg_world_size}
        actor = {k: [v] * actor_wg_world_size for k, v in common.items()}
        actor["rank"] = list(range(actor_wg_world_size))
        rollout = {k: [v] * rollout_world_size for k, v in common.items()}
        rollout["rank"] = list(range(actor_wg_world_size, world))
        return actor, rollout

    def init_process_group(self, rank, world_size, uid, num_actor):
        """Collective over every actor and rollout rank: the reshard communicator."""
        self.rank, self.world_size, self.num_actor = int(rank), int(world_size), int(num_actor)
        self.comm = reshard.Comm(uid, self.rank, self.world_size)

    def finalize(self):
        """Collective: closes the communicator (and any plan left on it)."""
        if self.comm is not None:
            self.comm.close()
        self.comm = None
        self._uid = None

    # ---- what every rank learns from actor rank 0 ----

    def _exchange(self, header):
        """Actor rank 0's tensor list to every rank, through reshard (two small plans)."""
        w = self.world_size
        n = torch.zeros(1, dtype=torch.int64)
        if self.rank == 0:
            data = torch.frombuffer(bytearray(header.encode()), dtype=torch.uint8)
            n[0] = data.numel()
        with reshard.Plan(self.comm, [("reshard.verl.n", "shape=1 dtype=i64 ranks=0",
                                       "shape=1 dtype=i64 ranks=%s" % _ranks(1, w - 1))]) as p:
            p.execute([n if self.rank == 0 else None], [n if self.rank else None])
        if self.rank != 0:
            data = torch.empty(int(n[0]), dtype=torch.uint8)
        spec = "shape=%d dtype=u8 ranks=%%s" % int(n[0])
        with reshard.Plan(self.comm, [("reshard.verl.list", spec % "0",
                                       spec % _ranks(1, w - 1))]) as p:
            p.execute([data if self.rank == 0 else None], [data if self.rank else None])
        return json.loads(bytes(data.numpy()).decode())

    def _checked(self, header):
        if header.get("error"):
            raise ValueError("reshard checkpoint engine: %s (every rank was told)"
                             % header["error"])
        return header["tensors"]

    def _agree(self, error):
        """Collective: every actor rank says whether its tensors agree with rank 0's list
        (one i32 each, to every rank), so that a rank that cannot send fails every rank
        instead of leaving the others waiting in a plan."""
        a, w = self.num_actor, self.world_size
        flags = torch.zeros(a, dtype=torch.int32)
        mine = torch.tensor([1 if error else 0], dtype=torch.int32)
        src = "shape=%d dtype=i32 ranks=%s place=S(0)" % (a, _ranks(0, a - 1))
        dst = "shape=%d dtype=i32 ranks=%s" % (a, _ranks(0, w - 1))
        with reshard.Plan(self.comm, [("reshard.verl.agree", src, dst)]) as p:
            p.execute([mine if self.rank < a else None], [flags])
        bad = [r for r in range(a) if flags[r]]
        if error:
            raise ValueError("reshard checkpoint engine: %s (every rank was told)" % error)
        if bad:
            raise ValueError("reshard checkpoint engine: actor rank %d could not send its tensors "
                             "as rank 0 lists them (its own error says why)" % bad[0])

    def _dst_spec(self, name, shape, dtype):
        rollout = (self.num_actor, self.world_size - 1)
        if self.rollout_layout is not None:
            spec = self.rollout_layout(name, tuple(shape), dtype, rollout)
            if spec is not None:
                return spec
        return "shape=%s dtype=%s ranks=%s" % ("x".join(str(int(d)) for d in shape), dtype,
                                               _ranks(*rollout))

    def _buckets(self, tensors):
        out, cur, size = [], [], 0
        for name, src, dst in tensors:
            lay = reshard.Layout(dst)
            nbytes = max(lay.shard_bytes(r) for r in range(self.num_actor, self.world_size))
            lay.close()
            if cur and size + nbytes > self.bucket_size:
                out.append(cur)
                cur, size = [], 0
            cur.append((name, src, dst))
            size += nbytes
        if cur:
            out.append(cur)
        return out

    # ---- actor side ----

    def _source(self, name, t, spec):
        """(Layout, local buffer) of one actor tensor."""
        if isinstance(spec, reshard.Layout):
            return spec, t
        if spec is not None:  # veRL's ShardSpec
            mesh = getattr(spec, "mesh", None)
            if mesh is None:
                if getattr(spec, "place", None) is not None or \
                        getattr(spec, "gather_group", None) is not None:
                    raise ValueError(
                        "%s: a ShardSpec with place/gather_group (Megatron, veomni experts) is "
                        "no DTensor layout: pass (name, local, reshard.Layout) triples, e.g. "
                        "from reshard.models.megatron_model_layouts" % name)
                return self._replicated(tuple(spec.full_shape), t.dtype), t
            ranks = [int(r) for r in mesh.mesh.flatten().tolist()]
            return reshard.Layout.from_placements(tuple(spec.full_shape), t.dtype, ranks,
                                                  spec.placements, tuple(mesh.mesh.shape)), t
        if hasattr(t, "device_mesh") and hasattr(t, "placements"):
            return reshard.Layout.from_dtensor(t), t
        if getattr(t, "tensor_model_parallel", False):
            return self._megatron_layout(name, t), t
        return self._replicated(tuple(t.shape), t.dtype), t

    def _megatron_layout(self, name, p):
        """The layout of a Megatron-Core parameter on the actor ranks, from its attributes and
        megatron.core's parallel state (the actor ranks are its torch.distributed ranks)."""
        from reshard import models

        if self._megatron_par is None:
            par = models.MegatronParallel.from_parallel_state(self.megatron_order)
            if par.world != self.num_actor:
                raise ValueError("%s: Megatron's parallel state spans %d ranks, the actor ranks "
                                 "are %d" % (name, par.world, self.num_actor))
            if par.pp > 1:
                raise ValueError(
                    "%s: pipeline parallel %d: each stage holds other parameters under the same "
                    "local names; pass (name, local, Layout) triples from "
                    "reshard.models.megatron_model_layouts(module, layers_per_stage=...)"
                    % (name, par.pp))
            self._megatron_par = par
        if getattr(p, "allreduce", True) is False and self._megatron_par.ep > 1:
            raise ValueError("%s: an expert parameter under expert parallel %d: pass (name, local, "
                             "Layout) triples from reshard.models.megatron_model_layouts("
                             "num_experts=...)" % (name, self._megatron_par.ep))
        (lay,) = models.megatron_layouts(
            [{name: p}], self._megatron_par,
            gated_linear_unit=self.megatron_gated_linear_unit).values()
        return lay

    def _replicated(self, shape, dtype):
        return reshard.Layout("shape=%s dtype=%s ranks=%s" % (
            "x".join(str(int(d)) for d in shape), reshard.dtype_name(dtype),
            _ranks(0, self.num_actor - 1)))

    async def _items(self, weights):
        if hasattr(weights, "get_per_tensor_param_shard"):
            weights, _ = weights.get_per_tensor_param_shard()
        chunks = weights if isinstance(weights, (list, tuple)) else [weights]
        if chunks and all(isinstance(c, torch.nn.Module) for c in chunks):
            return [item for c in chunks for item in c.named_parameters()]
        if hasattr(weights, "__aiter__"):
            return [item async for item in weights]
        return list(weights)

    @torch.no_grad()
    async def send_weights(self, weights, global_steps=None):
        """Collective with receive_weights on the rollout ranks: this actor rank's shards."""
        if self.comm is None or self.rank >= self.num_actor:
            raise RuntimeError("reshard checkpoint engine: send_weights on a rank that is not "
                               "an actor rank of an initialized group")
        sources, error = {}, None
        try:
            for item in await self._items(weights):
                name, t = item[0], item[1]
                lay, buf = self._source(name, t, item[2] if len(item) > 2 else None)
                if lay.max_rank >= self.num_actor:
                    raise ValueError("%s: its layout names rank %d, past the %d actor ranks"
                                     % (name, lay.max_rank, self.num_actor))
                sources[name] = (lay, buf)
        except Exception as e:  # told to every rank below, then raised here
            error = "actor rank %d: %s: %s" % (self.rank, type(e).__name__, e)
        header = None
        if self.rank == 0:
            header = json.dumps({"step": global_steps, "error": error, "tensors": [] if error else [
                [name, lay.spec, self._dst_spec(name, lay.shape, lay.dtype)]
                for name, (lay, _) in sources.items()]})
        loop = asyncio.get_running_loop()
        tensors = self._checked(await loop.run_in_executor(None, self._exchange, header))
        if error is None:
            missing = [n for n, _, _ in tensors if n not in sources]
            differ = [(n, sources[n][0].spec, s) for n, s, _ in tensors
                      if n in sources and sources[n][0].spec != s]
            if missing:
                error = "actor rank %d has no %s, which rank 0 sends" % (self.rank, missing[:3])
            elif differ:
                error = "actor rank %d describes %s as '%s', rank 0 as '%s'" % (
                    (self.rank,) + differ[0])
        await loop.run_in_executor(None, self._agree, error)
        self.last_metrics = {}
        src = {n: sources[n][1] for n, _, _ in tensors}
        for bucket in self._buckets(tensors):
            await loop.run_in_executor(None, self._run, bucket, src, None)
        return dict(self.last_metrics)

    # ---- rollout side ----

    @torch.no_grad()
    async def receive_weights(self, global_steps=None):
        """Collective with send_weights: yields (name, tensor) per tensor, bucket by bucket:
        the whole tensor, or this rank's shard of rollout_layout's layout."""
        if self.comm is None or self.rank < self.num_actor:
            raise RuntimeError("reshard checkpoint engine: receive_weights on a rank that is "
                               "not a rollout rank of an initialized group")
        loop = asyncio.get_running_loop()
        tensors = self._checked(await loop.run_in_executor(None, self._exchange, None))
        await loop.run_in_executor(None, self._agree, None)
        self.last_metrics = {}
        for bucket in self._buckets(tensors):
            dst = {}
            for name, _, spec in bucket:
                lay = reshard.Layout(spec)
                dst[name] = torch.empty(lay.shard_shape(self.rank),
                                        dtype=_TORCH_DTYPES[lay.dtype])
                lay.close()
            await loop.run_in_executor(None, self._run, bucket, None, dst)
            for name, _, _ in bucket:
                yield name, dst[name]

    # ---- both ----

    def _run(self, bucket, src, dst):
        """One bucket: one plan, one execute; its figures are added to last_metrics."""
        before = self.comm.counters()
        start = time.monotonic()
        with reshard.Plan(self.comm, [tuple(t) for t in bucket]) as plan:
            plan_bytes = plan.stats()["net_bytes"]
            plan.execute(None if src is None else {n: src[n] for n, _, _ in bucket},
                         None if dst is None else {n: dst[n] for n, _, _ in bucket})
        after = self.comm.counters()
        for key, value in (("reshard/plan_net_bytes", plan_bytes),
                           ("reshard/net_out_bytes", after["net_out"] - before["net_out"]),
                           ("reshard/net_in_bytes", after["net_in"] - before["net_in"]),
                           ("reshard/plans", 1),
                           ("reshard/seconds", time.monotonic() - start)):
            self.last_metrics[key] = self.last_metrics.get(key, 0) + value
