# SPDX-License-Identifier: Apache-2.0
"""vLLM 0.33's own m2n conversions driven against reshard.m2n (test_m2n.py runs it under
make test-frameworks): eight ranks on gloo, CPU tensors. reshard.m2n.install() makes `import
nccl.m2n` give reshard.m2n; vLLM's m2n_common.import_m2n() then imports it, resolve_layout
pairs each parameter's placements with its mesh (the (size, 1) form of a replicated one
included), validate_layout gives the tile shapes vLLM expects, to_mesh and to_placements build
the arguments, and m2n.reshard moves the trainer's tiles (ranks 0-3) into the workers' (ranks
4-7) over the gloo group. Every element is checked against a slice of the full tensor.
Exit 77 (skip) without torch or vLLM."""
import multiprocessing
import os
import sys
import tempfile
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))  # python/: the package of this tree

WORLD, TRAINERS = 8, 4

# (name, global shape, dtype, trainer placements over (2, 2), worker placements over (1, 4)):
# vLLM's codes, -1 replicate, d shard dim d; None: replicated
PARAMS = [
    ("qkv.weight", (48, 16), "bfloat16", (0, -1), (-1, 0)),   # FSDP rows -> TP column-parallel
    ("o.weight", (16, 48), "float32", (0, -1), (-1, 1)),      # FSDP rows -> TP row-parallel
    ("experts.w13", (4, 8, 12), "bfloat16", (-1, 0), (-1, 0)),  # EP on both sides
    ("norm.weight", (16,), "float32", (0, -1), None),         # replicated on the workers
    ("embed", (32, 8), "int8", None, (-1, 0)),                # replicated on the trainer
]


def expected(torch, full, mesh, placements, rank):
    """rank's tile of full under vLLM's resolved mesh and codes (even shards), or None."""
    if not mesh.start_rank <= rank < mesh.start_rank + mesh.dims[0] * mesh.dims[1]:
        return None
    local = rank - mesh.start_rank
    coord = (local // mesh.dims[1], local % mesh.dims[1])
    index = [slice(None)] * full.dim()
    for axis, code in enumerate(placements):
        if code >= 0:
            n = full.shape[code] // mesh.dims[axis]
            index[code] = slice(coord[axis] * n, (coord[axis] + 1) * n)
    return full[tuple(index)].contiguous()


def rank_main(rank, init_file, queue):
    try:
        import torch
        import torch.distributed as dist
        from vllm.distributed.weight_transfer import m2n_common as mc

        import reshard.m2n

        dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank,
                                world_size=WORLD)
        reshard.m2n.install()
        m2n = mc.import_m2n()  # vLLM's own import of nccl.m2n
        assert m2n is reshard.m2n, "import nccl.m2n did not resolve to reshard.m2n"
        handle = m2n.Handle.create(m2n.Config(max_cta=None))
        group = dist.group.WORLD
        trainer = mc.M2NMesh((2, 2), 0)
        workers = mc.M2NMesh((1, 4), TRAINERS)
        wrong = checked = 0
        for name, shape, dtype, tp, wp in PARAMS:
            dt = getattr(torch, dtype)
            full = (torch.arange(int(torch.tensor(shape).prod())) % 127).to(dt).reshape(shape)
            src_mesh, sp = mc.resolve_layout(trainer, tp)
            dst_mesh, dp = mc.resolve_layout(workers, wp)
            src = expected(torch, full, src_mesh, sp, rank)
            want = expected(torch, full, dst_mesh, dp, rank)
            for t, mesh, codes, side in ((src, src_mesh, sp, "src"), (want, dst_mesh, dp, "dst")):
                if t is not None:  # vLLM's own idea of the tile's shape
                    vshape = mc.validate_layout(mesh, codes, shape, name + " " + side)
                    assert tuple(t.shape) == tuple(vshape), (name, side, t.shape, vshape)
            dst = None if want is None else torch.zeros_like(want)
            m2n.reshard(src, dst, group, None,
                        src_mesh=mc.to_mesh(m2n, src_mesh),
                        src_placements=mc.to_placements(m2n, sp),
                        dst_mesh=mc.to_mesh(m2n, dst_mesh),
                        dst_placements=mc.to_placements(m2n, dp),
                        handle=handle)
            if dst is not None:
                wrong += int((dst != want).sum())
                checked += dst.numel()
        handle.destroy()
        m2n.release_groups()
        dist.destroy_process_group()
        queue.put((rank, None, (wrong, checked)))
    except BaseException as e:  # noqa: B902 (told to the parent)
        queue.put((rank, "%s: %s\n%s" % (type(e).__name__, e, traceback.format_exc()), None))
    queue.close()
    queue.join_thread()


def main():
    import importlib.util

    # found, not imported: the ranks import them (torch and vLLM take minutes here)
    gone = [m for m in ("torch", "vllm") if importlib.util.find_spec(m) is None]
    if gone:
        print("m2n_vllm_check: skipped: not installed: %s" % ", ".join(gone))
        return 77
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "store")
        procs = [ctx.Process(target=rank_main, args=(r, init_file, queue)) for r in range(WORLD)]
        for p in procs:
            p.start()
        results = [queue.get(timeout=600) for _ in procs]
        for p in procs:
            p.join(120)
    errors = [(r, e) for r, e, _ in results if e]
    if errors:
        for r, e in sorted(errors):
            print("rank %d: %s" % (r, e))
        return 1
    wrong = sum(v[0] for _, _, v in results)
    checked = sum(v[1] for _, _, v in results)
    print("m2n_vllm_check: %d parameters on %d ranks over gloo through vLLM's m2n_common and "
          "reshard.m2n, %d elements checked, %d wrong" % (len(PARAMS), WORLD, checked, wrong))
    return 0 if wrong == 0 and checked > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
