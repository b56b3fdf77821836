# SPDX-License-Identifier: Apache-2.0
"""One rank of the emulated-cluster test (scripts/cluster.sh run ... -- python3 this): rows
held on node 0 become columns on node 1, checked element by element."""
import socket

import numpy as np

import reshard

SRC = "shape=256x96 dtype=f32 ranks=0-1 mesh=2 place=S(0)"
DST = "shape=256x96 dtype=f32 ranks=2-3 mesh=2 place=S(1)"

with reshard.Comm.from_env() as comm:
    rank = comm.rank
    src, dst = reshard.Layout(SRC), reshard.Layout(DST)
    full = np.arange(256 * 96, dtype=np.float32).reshape(256, 96)
    mine = src.shard_of(full, rank) if rank < 2 else None
    got = np.zeros(dst.shard_shape(rank), np.float32) if rank >= 2 else None
    with reshard.Plan(comm, [("w", src, dst)]) as plan:
        plan.execute([mine], [got])
    wrong = int((got != dst.shard_of(full, rank)).sum()) if got is not None else 0
    print("rank %d on %s: #wrong %d, net_in %d"
          % (rank, socket.gethostname(), wrong, comm.counters()["net_in"]), flush=True)
