#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A trainer group and an inference group refit every step.

The trainer ranks hold a toy model as DP2 x TP2 (each layer's rows split over TP, replicated
over DP); the inference ranks want it as TP over columns. Every step the trainers change their
shards, one plan moves the whole model, and each inference rank checks what it got.

    python3 python/examples/refit_loop.py                 # 8 local processes (fork)
    torchrun --nproc-per-node 8 python/examples/refit_loop.py
Needs numpy; RESHARD_LIB names the library when it is not in the source tree's build/.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402

import reshard  # noqa: E402

LAYERS = {"embed": (4096, 1024), "attn.qkv": (3072, 1024), "attn.out": (1024, 1024),
          "mlp.up": (4096, 1024), "mlp.down": (1024, 4096)}


def layouts(world, train):
    """{name: (src, dst)}: DP2 x TP(train/2) on the trainers, TP on the inference ranks."""
    tp = train // 2
    out = {}
    for name, (rows, cols) in LAYERS.items():
        shape = "shape=%dx%d dtype=f32" % (rows, cols)
        src = "%s ranks=0-%d mesh=2x%d place=R,S(0)" % (shape, train - 1, tp)
        dst = "%s ranks=%d-%d place=S(1)" % (shape, train, world - 1)
        out[name] = (reshard.Layout(src), reshard.Layout(dst))
    return out


def run(comm, steps, train):
    rank, world = comm.rank, comm.size
    model = layouts(world, train)
    full = {n: np.arange(r * c, dtype=np.float32).reshape(r, c) for n, (r, c) in LAYERS.items()}
    src = {n: s.shard_of(full[n], rank) for n, (s, d) in model.items() if rank < train}
    dst = {n: np.zeros(d.shard_shape(rank), np.float32) for n, (s, d) in model.items()
           if rank >= train}
    total = sum(r * c * 4 for r, c in LAYERS.values())
    with reshard.Plan(comm, model) as plan:
        for step in range(steps):
            for shard in src.values():  # the optimizer step
                shard += 1
            comm.barrier()
            t0 = time.perf_counter()
            plan.refit(src, dst)
            comm.barrier()
            took = time.perf_counter() - t0
            wrong = sum(int((dst[n] != model[n][1].shard_of(full[n], rank) + step + 1).sum())
                        for n in dst)
            if wrong:
                raise SystemExit("rank %d step %d: %d elements wrong" % (rank, step, wrong))
            if rank == 0:
                print("step %d: refit of %.1f MiB in %.2f ms (%.2f GB/s), all ranks checked"
                      % (step, total / 2**20, took * 1e3, total / took / 1e9), flush=True)
        if rank == 0:
            s = plan.stats()
            print("plan: %d tensors, %.1f MiB over the network (the minimum: %.1f MiB)"
                  % (s["ntensors"], s["net_bytes"] / 2**20, s["min_net_bytes"] / 2**20))


def local(uid, rank, world, steps, train):
    with reshard.Comm(uid, rank, world) as comm:
        run(comm, steps, train)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nproc", type=int, default=8, help="local processes (without torchrun)")
    ap.add_argument("--train", type=int, default=4, help="trainer ranks (even), the rest infer")
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args()
    if "RANK" in os.environ:  # torchrun, mpirun (with MASTER_ADDR/PORT), srun
        with reshard.Comm.from_env() as comm:
            run(comm, a.steps, a.train)
        return
    import multiprocessing

    # one host: pretend NVLink domains of train/2 ranks, so that the model crosses a "network"
    # (set before the library first loads: it reads its settings once)
    os.environ.setdefault("RESHARD_DOMAIN_SIZE", str(a.train // 2))
    ctx = multiprocessing.get_context("fork")
    uid = reshard.unique_id()
    procs = [ctx.Process(target=local, args=(uid, r, a.nproc, a.steps, a.train))
             for r in range(a.nproc)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    sys.exit(max(p.exitcode for p in procs))


if __name__ == "__main__":
    main()
