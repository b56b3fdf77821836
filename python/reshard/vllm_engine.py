# SPDX-License-Identifier: Apache-2.0
"""The "reshard" weight-transfer engine for vLLM (vllm.distributed.weight_transfer), both sides.

One communicator spans the trainer ranks (0 .. T-1) and the inference workers (T .. T+I-1,
in vLLM's world order). At init the trainer side describes its layouts (checkpoint names),
the inference side describes its own from the model's parallel layers (reshard.models), and
every rank builds the same whole-model plan; each update is one execute of that plan: the
trainer reads its local shards in place (DTensor, Megatron or plain parameters), the workers
receive into the model's parameters in place (q/k/v and gate/up straight into the fused
buffers), and every byte crosses the network at most once per domain.

    # trainer, every rank
    engine = WeightTransferTrainerFactory.trainer_init(
        ReshardTrainerInitInfo(rank=rank, trainer_world_size=T, inference_world_size=I),
        client=client, source=DTensorSource(model))
    engine.send_weights()                       # each round

    # inference: vllm serve ... --weight-transfer-config '{"backend": "reshard"}'
"""
import json
import threading
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar

import torch
from vllm.distributed.weight_transfer.base import (ParamMeta, TrainerInitInfo,
                                                   TrainerWeightTransferEngine, WeightSource,
                                                   WeightTransferEngine, WeightTransferInitInfo,
                                                   WeightTransferUpdateInfo)

from . import Comm, Layout, Plan, ReshardError, STATUS, unique_id
from .models import dtensor_layouts, pair, rename, vllm_layouts


@dataclass
class ReshardInitInfo(WeightTransferInitInfo):
    """What the trainer's sender hands every worker: the communicator's id (hex), its size,
    how many trainer ranks come first, and the trainer's layouts ({name: spec})."""

    unique_id: str
    world_size: int
    trainer_world_size: int
    src_specs: dict = field(default_factory=dict)


@dataclass
class ReshardUpdateInfo(WeightTransferUpdateInfo):
    round: int = 0


@dataclass
class ReshardTrainerInitInfo(TrainerInitInfo):
    """Trainer side: trainer_world_size ranks (a torch process group among them when more than
    one: `group`, else the default one), inference_world_size vLLM workers; rename: (regex,
    replacement) pairs from the trainer's names to the checkpoint names vLLM's side uses."""

    backend: ClassVar[str] = "reshard"

    trainer_world_size: int = 1
    inference_world_size: int = 1
    rename: tuple = ()
    group: Any = None


def _fail(message):
    raise ReshardError(STATUS["ERR_INVALID_ARG"], message)


def share_text(comm, text, owner, world):
    """`text` (on rank `owner`) on every rank of comm, through two reshard plans: its length,
    then its bytes. Collective; returns the text."""
    size, got = bytearray(8), bytearray(8)
    if comm.rank == owner:
        size[:] = len(text.encode()).to_bytes(8, "little")
    spec = "shape=%d dtype=%s ranks=%d place=R", "shape=%d dtype=%s ranks=0-%d place=R"
    with Plan(comm, [("reshard.text.len", spec[0] % (1, "i64", owner),
                      spec[1] % (1, "i64", world - 1))]) as plan:
        plan.execute([size if comm.rank == owner else None], [got])
    n = int.from_bytes(bytes(got), "little")
    data, out = bytearray(text.encode() if comm.rank == owner else b""), bytearray(n)
    with Plan(comm, [("reshard.text", spec[0] % (n, "u8", owner),
                      spec[1] % (n, "u8", world - 1))]) as plan:
        plan.execute([data if comm.rank == owner else None], [out])
    return out.decode()


def _plan_tensors(src_specs, dst_specs):
    src = {n: Layout(s) for n, s in src_specs.items()}
    dst = {n: Layout(s) for n, s in dst_specs.items()}
    return pair(src, dst)


class ReshardWeightTransferEngine(WeightTransferEngine[ReshardInitInfo, ReshardUpdateInfo]):
    """Inference side: receives into the model's parameters in place from one plan."""

    init_info_cls = ReshardInitInfo
    update_info_cls = ReshardUpdateInfo

    def init_transfer_engine(self, init_info):
        from vllm.distributed import get_world_group

        if getattr(self.parallel_config, "pipeline_parallel_size", 1) > 1:
            _fail("the reshard engine does not describe pipeline-parallel inference yet")
        world = get_world_group()
        rank = init_info.trainer_world_size + world.rank_in_group
        self.comm = Comm(bytes.fromhex(init_info.unique_id), rank, init_info.world_size)
        dst = vllm_layouts(self.model, range(init_info.trainer_world_size,
                                             init_info.world_size))
        self.buffers = dst.buffers
        first = init_info.trainer_world_size
        mine = json.dumps({n: l.spec for n, l in dst.items()})
        text = share_text(self.comm, mine, first, init_info.world_size)
        if json.loads(text) != json.loads(mine):
            _fail("inference rank %d's layouts differ from rank %d's" % (rank, first))
        self.plan = Plan(self.comm, _plan_tensors(init_info.src_specs, json.loads(text)))

    def start_weight_update(self):
        pass

    def finish_weight_update(self):
        pass

    def update_weights(self, update_info):
        self.receive_weights(self.parse_update_info(update_info))
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def receive_weights(self, update_info):
        with torch.no_grad():
            self.plan.execute(None, {n: self.buffers[n] for n in self.plan.names})

    def shutdown(self):
        for obj in (getattr(self, "plan", None), getattr(self, "comm", None)):
            if obj is not None:
                obj.close()


class DTensorSource(WeightSource):
    """A WeightSource over a DTensor / FSDP2 model (or a {name: tensor or DTensor} dict) whose
    layouts reshard reads directly, strided shards included, and whose local shards it sends
    in place. Plain tensors are replicated over every trainer rank."""

    def __init__(self, module_or_dict):
        self._named = module_or_dict

    def _items(self):
        if hasattr(self._named, "named_parameters"):
            return list(self._named.named_parameters())
        return list(self._named.items())

    @cached_property
    def metadata(self):
        return [ParamMeta(n, p.dtype, tuple(p.shape)) for n, p in self._items()]

    def reshard_layouts(self):
        class Named(torch.nn.Module):  # dtensor_layouts reads named_parameters()
            def __init__(self, items):
                super().__init__()
                self.items = items

            def named_parameters(self):
                return iter(self.items)

        return dtensor_layouts(Named(self._items()))

    def iter_local(self):
        yield from self._items()


class MegatronSource(WeightSource):
    """A WeightSource over one rank's Megatron-Core model (after initialize_model_parallel):
    layouts from megatron_model_layouts (collective over the trainer ranks), local parameters
    under their global names (layer numbers across stages), sent in place."""

    def __init__(self, module, layers_per_stage=None, num_experts=None, gated_linear_unit=False,
                 order="tp-cp-ep-dp-pp"):
        self._module = module
        self._kw = dict(layers_per_stage=layers_per_stage, num_experts=num_experts,
                        gated_linear_unit=gated_linear_unit, order=order)

    @cached_property
    def metadata(self):
        return [ParamMeta(n, p.dtype, tuple(p.shape)) for n, p in self.iter_local()]

    def reshard_layouts(self):
        from .models import megatron_model_layouts

        return megatron_model_layouts(self._module, **self._kw)

    def iter_local(self):
        from megatron.core import parallel_state as ps

        from .models import MegatronParallel, _expert_name, _global_name

        par = MegatronParallel.from_parallel_state(self._kw["order"])
        pp = ps.get_pipeline_model_parallel_rank()
        for name, p in self._module.named_parameters():
            gname, expert = _global_name(name, pp, self._kw["layers_per_stage"], par,
                                         self._kw["num_experts"])
            if expert:
                gname = _expert_name(gname, ps.get_expert_model_parallel_rank(),
                                     self._kw["num_experts"], par.ep)
            yield gname, p


def _meta_layout(meta, trainer_world):
    """A layout from vLLM's ParamMeta (owners, mesh shape, Shard / Replicate placements)."""
    owners = meta.owners if meta.owners is not None else tuple(range(trainer_world))
    mesh = meta.mesh_shape or (len(owners),)
    places = meta.placements or tuple("R" for _ in mesh)
    places = [p if isinstance(p, str) else ("S(%d)" % p.dim if hasattr(p, "dim") else "R")
              for p in places]
    return Layout.from_placements(meta.shape, meta.dtype, owners, places, mesh)


class ReshardTrainerWeightTransferEngine(TrainerWeightTransferEngine[ReshardTrainerInitInfo]):
    """Trainer side: every trainer rank sends its local shards in place."""

    init_info_cls = ReshardTrainerInitInfo

    @classmethod
    def trainer_init(cls, init_info, *, client, source=None):
        if source is None:
            _fail("the reshard trainer engine needs a WeightSource (DTensorSource, or one "
                  "whose metadata and iter_local describe the shards)")
        engine = cls(client=client, source=source, is_sender=init_info.is_sender,
                     rank=init_info.rank)
        T, I = init_info.trainer_world_size, init_info.inference_world_size
        if hasattr(source, "reshard_layouts"):
            layouts = source.reshard_layouts()
        else:
            layouts = {m.name: _meta_layout(m, T) for m in source.metadata}
        engine._rename = list(init_info.rename)
        layouts = rename(layouts, engine._rename) if engine._rename else layouts
        uid = unique_id().hex() if init_info.rank == 0 else None
        if T > 1:
            import torch.distributed as dist

            box = [uid]
            group = init_info.group
            src = dist.get_global_rank(group, 0) if group is not None else 0
            dist.broadcast_object_list(box, src=src, group=group)
            uid = box[0]
        specs = {n: l.spec for n, l in layouts.items()}
        worker = None
        if engine.is_sender:  # the workers' init is collective with ours: run it beside
            payload = {"unique_id": uid, "world_size": T + I, "trainer_world_size": T,
                       "src_specs": specs}
            worker = _Call(client.init_weight_transfer_engine, payload)
        try:
            engine.comm = Comm(bytes.fromhex(uid), init_info.rank, T + I)
            dst = json.loads(share_text(engine.comm, None, T, T + I))
            engine.plan = Plan(engine.comm, _plan_tensors(specs, dst))
        finally:
            if worker is not None:
                worker.join()
        engine.round = 0
        return engine

    def _local(self):
        named = dict(self.source.iter_local())
        if self._rename:
            import re

            rules = [(re.compile(a), b) for a, b in self._rename]
            out = {}
            for name, t in named.items():
                for rx, rep in rules:
                    name = rx.sub(rep, name)
                out[name] = t
            named = out
        return named

    def send_weights(self):
        named = self._local()
        self.round += 1
        if self.is_sender:
            self.client.start_weight_update()
            worker = _Call(self.client.update_weights, {"round": self.round})
        try:
            with torch.no_grad():
                self.plan.execute({n: named.get(n) for n in self.plan.names}, None)
        finally:
            if self.is_sender:
                worker.join()
        if self.is_sender:
            self.client.finish_weight_update()

    def shutdown(self):
        for obj in (getattr(self, "plan", None), getattr(self, "comm", None)):
            if obj is not None:
                obj.close()


class _Call:
    """fn(arg) on a thread; join() returns when it did and raises what it raised."""

    def __init__(self, fn, arg):
        self._error = None

        def run():
            try:
                fn(arg)
            except BaseException as e:  # handed to join()
                self._error = e

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def join(self):
        self._thread.join()
        if self._error is not None:
            raise self._error
