# SPDX-License-Identifier: Apache-2.0
"""DTensors mapped to reshard Layouts, checked element by element against the C planner's own
placement of the same tensor (scripts/gpu-check.sh; needs torch, runs on CPU with gloo).
Four processes form a 2x2 device mesh; for each placement pair each rank compares its
DTensor's local shard with Layout.from_dtensor(t).shard_of(full, rank)."""
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import reshard  # noqa: E402

try:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
except ImportError:  # torch < 2.4
    from torch.distributed._tensor import Replicate, Shard, distribute_tensor
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

PLACEMENTS = [(Shard(0), Shard(1)), (Replicate(), Shard(0)), (Shard(1), Replicate()),
              (Shard(0), Shard(0))]


def run(rank, world, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (2, 2))
    full = torch.arange(18 * 10, dtype=torch.float32).reshape(18, 10)  # uneven on purpose
    wrong = 0
    for placements in PLACEMENTS:
        dt = distribute_tensor(full, mesh, placements)
        layout = reshard.Layout.from_dtensor(dt)
        want = layout.shard_of(full.numpy(), rank)
        got = dt.to_local().numpy()
        wrong += int(got.shape != want.shape or not np.array_equal(got, want))
    out.put((rank, wrong))
    dist.destroy_process_group()


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = 29500 + os.getpid() % 1000
    procs = [ctx.Process(target=run, args=(r, 4, port, q)) for r in range(4)]
    for p in procs:
        p.start()
    results = sorted(q.get(timeout=300) for _ in procs)
    for p in procs:
        p.join()
    bad = sum(w for _, w in results)
    print("dtensor_check: %d placements x 4 ranks, %d shards differ from the planner's"
          % (len(PLACEMENTS), bad))
    sys.exit(1 if bad else 0)
