# SPDX-License-Identifier: Apache-2.0
"""One rank of the Python NCCL-path test: a communicator from a (stand-in) NCCL communicator
whose state lives in a shared file, then a refit through RESHARD_EXECUTOR=nccl with buffers
handed over as __cuda_array_interface__ objects. Usage: nccl_rank.py SHARED_FILE RANK SIZE."""
import ctypes
import mmap
import sys

import numpy as np

import reshard

SRC = "shape=48x40 dtype=f32 ranks=0-1 mesh=2 place=S(0)"
DST = "shape=48x40 dtype=f32 ranks=2-3 mesh=2 place=R"


class Device:
    """Host memory presented as device memory (the stand-in libcuda's kind)."""

    def __init__(self, array):
        self.array = array
        self.__cuda_array_interface__ = {
            "shape": array.shape, "typestr": array.dtype.str, "data": (array.ctypes.data, False),
            "strides": None, "version": 3}


class FakeComm(ctypes.Structure):
    _fields_ = [("rank", ctypes.c_int), ("size", ctypes.c_int), ("sh", ctypes.c_void_p)]


path, rank, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with open(path, "r+b") as f:
    shared = mmap.mmap(f.fileno(), 0)
fc = FakeComm(rank, size, ctypes.addressof(ctypes.c_char.from_buffer(shared)))
with reshard.Comm.from_nccl(ctypes.addressof(fc)) as comm:
    src, dst = reshard.Layout(SRC), reshard.Layout(DST)
    full = np.arange(48 * 40, dtype=np.float32).reshape(48, 40) * 0.5
    mine = Device(src.shard_of(full, rank)) if rank < 2 else None
    got = Device(np.zeros(dst.shard_shape(rank), np.float32)) if rank >= 2 else None
    with reshard.Plan(comm, [("w", src, dst)]) as plan:
        plan.execute([mine], [got], stream=0)  # enqueued on the (pretend) default stream
        try:
            plan.outcome()
            outcome = "tracked"
        except reshard.ReshardError as e:
            outcome = e.name  # the stream owns completion
        plan.execute([mine], [got])  # without a stream: returns once done, outcome known
        outcome += " then " + plan.outcome()["w"]
    wrong = int((got.array != dst.shard_of(full, rank)).sum()) if got else 0
    print("rank %d: #wrong %d, rank %d of %d, outcome %s"
          % (rank, wrong, comm.rank, comm.size, outcome), flush=True)
