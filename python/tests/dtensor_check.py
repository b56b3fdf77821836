# SPDX-License-Identifier: Apache-2.0
"""DTensors on gloo, 4 processes: random placements (Shard, Replicate, _StridedShard, FSDP2
over TP, uneven sizes, 1-3-D meshes) checked element by element against Layout.from_dtensor,
a shard order checked against torch's own redistribute, an FSDP2-over-TP model's parameters
checked against the model helper, then one plan refits DTensor -> DTensor and every element
is compared. Usage: dtensor_check.py [CASES] (default 240). Exit 0 when nothing differs, 1
when something does, 77 when torch or its DTensor is missing (the reason is printed)."""
import os
import random
import socket
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.placement_types import _StridedShard
except ImportError as e:
    print("dtensor_check: skipped: torch with DTensor is needed (%s)" % e)
    sys.exit(77)

import reshard  # noqa: E402
import reshard.models  # noqa: E402

MESHES = [(4,), (2, 2), (1, 4), (4, 1), (2, 2, 1), (1, 2, 2), (2, 1, 2)]


def random_case(rng):
    mesh = rng.choice(MESHES)
    ndim = rng.randint(1, 3)
    shape = tuple(rng.randint(1, 13 if ndim < 3 else 6) for _ in range(ndim))
    places = []
    for _ in mesh:
        kind = rng.randint(0, 9)
        dim = rng.randint(0, ndim - 1)
        if kind < 3:
            places.append(("R",))
        elif kind < 7:
            places.append(("S", dim))
        else:
            places.append(("SS", dim, rng.randint(2, 4)))
    return shape, mesh, places


def fsdp_over_tp_cases(rng, n):
    """[_StridedShard(0, tp), Shard(0)] on dp x tp: what FSDP2 stores for a TP S(0) weight."""
    out = []
    for _ in range(n):
        rows = rng.randint(1, 23)
        out.append(((rows, rng.randint(1, 5)), (2, 2), [("SS", 0, 2), ("S", 0)]))
    return out


def torch_placements(places):
    made = []
    for p in places:
        if p[0] == "R":
            made.append(Replicate())
        elif p[0] == "S":
            made.append(Shard(p[1]))
        else:
            made.append(_StridedShard(p[1], split_factor=p[2]))
    return made


def run(rank, world, port, ncases, out):
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RESHARD_TIMEOUT="120")
        dist.init_process_group("gloo", rank=rank, world_size=world)
        rng = random.Random(20)
        cases = [random_case(rng) for _ in range(ncases)] + fsdp_over_tp_cases(rng, 24)
        meshes = {m: init_device_mesh("cpu", m) for m in MESHES}
        layout_wrong, strided, uneven = 0, 0, 0
        dts = []
        for shape, mesh, places in cases:
            full = torch.arange(float(torch.Size(shape).numel())).reshape(shape)
            dt = distribute_tensor(full, meshes[mesh], torch_placements(places),
                                   src_data_rank=None)
            lay = reshard.Layout.from_dtensor(dt)
            want = lay.shard_of(full, rank)
            local = dt.to_local()
            layout_wrong += int(tuple(local.shape) != tuple(want.shape)
                                or not torch.equal(local, want))
            strided += any(p[0] == "SS" for p in places)
            uneven += any(shape[p[1]] % mesh[i] for i, p in enumerate(places) if p[0] != "R")
            dts.append((full, dt, lay))
        order_wrong = shard_order_check(rank, meshes[(2, 2)])
        fsdp_wrong, fsdp_params = fsdp_model_check(rank, meshes[(2, 2)])
        refit_wrong = refit_check(rank, dts, meshes)
        out.put((rank, len(cases), strided, uneven, layout_wrong, order_wrong, fsdp_params,
                 fsdp_wrong, refit_wrong, None))
        dist.destroy_process_group()
    except Exception:
        out.put((rank, 0, 0, 0, -1, -1, 0, -1, -1, traceback.format_exc()))


def shard_order_check(rank, mesh):
    """A DTensor whose spec shards dim 0 over mesh dim 1 first, then mesh dim 0 (newer torch's
    shard_order): its local tensor is made by chunking in that order, torch's redistribute
    must rebuild the whole tensor from it, and from_dtensor must say the same shard."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, ShardOrderEntry, TensorMeta

    full = torch.arange(16.0).reshape(8, 2)
    coord = mesh.get_coordinate()
    local = full.chunk(2, dim=0)[coord[1]].chunk(2, dim=0)[coord[0]].contiguous()
    spec = DTensorSpec(mesh, (Shard(0), Shard(0)),
                       tensor_meta=TensorMeta(full.shape, full.stride(), full.dtype),
                       shard_order=(ShardOrderEntry(tensor_dim=0, mesh_dims=(1, 0)),))
    dt = DTensor(local, spec, requires_grad=False)
    whole = dt.redistribute(mesh, (Replicate(), Replicate())).to_local()
    lay = reshard.Layout.from_dtensor(dt)
    return int(not torch.equal(whole, full)) + int(not torch.equal(lay.shard_of(full, rank),
                                                                   local))


def fsdp_model_check(rank, mesh):
    """A tiny model under TP (colwise, rowwise) and FSDP2 on a 2x2 dp x tp mesh: the helper's
    layouts of every parameter equal the parameters' local shards."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    torch.manual_seed(0)
    dmesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    model = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.ReLU(), torch.nn.Linear(10, 6))
    full = {n: p.detach().clone() for n, p in model.named_parameters()}
    parallelize_module(model, dmesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=dmesh["dp"])
    layouts = reshard.models.dtensor_layouts(model)
    wrong = 0
    for name, p in model.named_parameters():
        want = layouts[name].shard_of(full[name], rank)
        wrong += int(not torch.equal(p.to_local(), want))
    return wrong, len(layouts)


def refit_check(rank, dts, meshes):
    """One plan: tensor i goes from case i's DTensor into a zero DTensor of case i+1's mesh
    and placements (same shape needed: the next case of equal shape), executed with DTensors
    as buffers."""
    comm = reshard.Comm.from_process_group()
    rng = random.Random(7)
    tensors, src, dst, wants = [], [], [], []
    for i, (full, dt, lay) in enumerate(dts):
        shape, mesh, places = tuple(full.shape), rng.choice(MESHES), None
        places = [("R",) if rng.random() < 0.3 else
                  ("S", rng.randint(0, len(shape) - 1)) if rng.random() < 0.6 else
                  ("SS", rng.randint(0, len(shape) - 1), rng.randint(2, 3)) for _ in mesh]
        target = distribute_tensor(torch.zeros(shape), meshes[mesh], torch_placements(places),
                                   src_data_rank=None)
        want = distribute_tensor(full, meshes[mesh], torch_placements(places),
                                 src_data_rank=None).to_local()
        tensors.append(("t%d" % i, lay, reshard.Layout.from_dtensor(target)))
        src.append(dt)
        dst.append(target)
        wants.append(want)
    with reshard.Plan(comm, tensors) as plan:
        plan.execute(src, dst)
    wrong = sum(int((d.to_local() != w).sum()) for d, w in zip(dst, wants))
    comm.close()
    return wrong


def main():
    ncases = int(sys.argv[1]) if len(sys.argv) > 1 else 240
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with socket.socket() as s:  # a free port for gloo's store: bound, read back, released
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [ctx.Process(target=run, args=(r, 4, port, ncases, q)) for r in range(4)]
    for p in procs:
        p.start()
    results = sorted(q.get(timeout=600) for _ in procs)
    for p in procs:
        p.join(60)
    bad = 0
    for (rank, n, strided, uneven, lw, ow, fp, fw, rw, err) in results:
        if err:
            print("rank %d:\n%s" % (rank, err))
            bad += 1
            continue
        bad += lw + ow + fw + rw
    r0 = results[0]
    print("dtensor_check: %d placements (%d with _StridedShard, %d uneven) x 4 ranks: %d local "
          "tensors differ from Layout.from_dtensor; shard order: %d wrong; FSDP2 over TP: %d "
          "parameters, %d wrong; refit DTensor -> DTensor of all %d: %d elements wrong"
          % (r0[1], r0[2], r0[3], sum(r[4] for r in results), sum(r[5] for r in results),
             r0[6], sum(r[7] for r in results), r0[1], sum(r[8] for r in results)))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
