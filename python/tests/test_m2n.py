# SPDX-License-Identifier: Apache-2.0
"""reshard.m2n, the `nccl.m2n` surface vLLM's m2n engine calls, on eight forked ranks over the
stand-in CUDA and NCCL (test/fake: "device" memory is host memory, NCCL a shared mapping), with
numpy tiles: every element checked, M2N's errors with their detail, install() making
`import nccl.m2n` resolve to it.

Run from the repository root after make (make test does), with build/test/fake built.
"""
import ctypes
import importlib.util
import mmap
import multiprocessing
import os
import subprocess
import sys
import traceback
import unittest
import unittest.mock

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))

from reshard import m2n  # noqa: E402

try:
    import numpy as np
except ImportError:
    np = None

WORLD = 8
BUILD = os.environ.get("RESHARD_BUILD", os.path.join(ROOT, "build"))
if not os.path.isabs(BUILD):
    BUILD = os.path.join(ROOT, BUILD)
FAKE_CUDA = os.path.join(BUILD, "test", "fake", "libcuda.so.1")
FAKE_NCCL = os.path.join(BUILD, "test", "fake", "libnccl.so.2")


# test/fake/fake_nccl.h, field for field
class _FakeMsg(ctypes.Structure):
    _fields_ = [("off", ctypes.c_size_t), ("len", ctypes.c_size_t)]


class _FakeShared(ctypes.Structure):
    _fields_ = [
        ("arrived", ctypes.c_int), ("sense", ctypes.c_int), ("size", ctypes.c_int),
        ("gather", ctypes.c_ubyte * (8 * 4096)),
        ("q", _FakeMsg * 4096 * 8 * 8),
        ("head", ctypes.c_int * 8 * 8), ("tail", ctypes.c_int * 8 * 8),
        ("used", ctypes.c_size_t),
        ("groups", ctypes.c_int * 8), ("ops", ctypes.c_int * 8),
        ("arena", ctypes.c_ubyte * (32 << 20)),
    ]


class _FakeComm(ctypes.Structure):
    _fields_ = [("rank", ctypes.c_int), ("size", ctypes.c_int), ("sh", ctypes.c_void_p)]


def _missing():
    if np is None:
        return "numpy is not installed (apt install python3-numpy)"
    for path in (FAKE_CUDA, FAKE_NCCL, os.path.join(BUILD, m2n.LIB_NAME)):
        if not os.path.exists(path):
            return "%s is not built (make all %s %s)" % (path, FAKE_CUDA, FAKE_NCCL)
    return None


def tile(shape, mesh, placements, rank, dtype):
    """rank's tile of a tensor whose elements are their global indices (None off the mesh):
    computed here, apart from the library, with M2N's even shards."""
    if rank not in mesh.ranks:
        return None
    full = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    coord = np.unravel_index(rank - mesh.start_rank, mesh.dims)
    index = [slice(None)] * len(shape)
    for axis, p in enumerate(placements):
        if isinstance(p, m2n.Shard):
            d = p.dim
            n = shape[d] // mesh.dims[axis]
            index[d] = slice(coord[axis] * n, (coord[axis] + 1) * n)
    return np.ascontiguousarray(full[tuple(index)]).astype(dtype)


def run_ranks(fn, *args):
    """fn(comm, rank, *args) on WORLD forked ranks over one stand-in NCCL; their results. The
    ranks' settings are the parent's environment only while they start: the tests that run
    after these in the same interpreter see it as it was."""
    env = {"RESHARD_CUDA_LIB": FAKE_CUDA, "RESHARD_NCCL_LIB": FAKE_NCCL,
           "RESHARD_DOMAIN_SIZE": "4", "RESHARD_TIMEOUT": "30",
           "NCCL_M2N_LIBRARY": os.path.join(BUILD, m2n.LIB_NAME)}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return _run_ranks(fn, *args)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _run_ranks(fn, *args):
    shared = mmap.mmap(-1, ctypes.sizeof(_FakeShared))
    sh = _FakeShared.from_buffer(shared)
    sh.size = WORLD
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()

    def child(rank):
        try:
            comm = _FakeComm(rank, WORLD, ctypes.addressof(sh))
            queue.put((rank, "ok", fn(ctypes.addressof(comm), rank, *args)))
        except BaseException as e:  # noqa: B902 (reported to the parent)
            queue.put((rank, "error", "%s: %s\n%s" % (type(e).__name__, e,
                                                       traceback.format_exc())))
        queue.close()
        queue.join_thread()  # what was put reaches the parent before the child ends
        os._exit(0)

    procs = [ctx.Process(target=child, args=(r,)) for r in range(WORLD)]
    for p in procs:
        p.start()
    results = dict((r, (kind, value)) for r, kind, value in (queue.get(timeout=240)
                                                             for _ in procs))
    for p in procs:
        p.join(60)
    del sh
    return [results[r] for r in range(WORLD)]


# ---- what the ranks run (module level: forked children call them) ----

LAYOUTS = [
    # (global shape, src mesh, src placements, dst mesh, dst placements): vLLM's shapes
    ((8, 12), m2n.Mesh((2, 2), 0), [m2n.Shard(0), m2n.Replicate()],
     m2n.Mesh((4, 1), start_rank=4), [m2n.Shard(1), m2n.Replicate()]),
    ((8, 12), m2n.Mesh((4, 1), 0), [m2n.Replicate(), m2n.Shard(0)],
     m2n.Mesh((2, 2), start_rank=4), [m2n.Replicate(), m2n.Shard(1)]),
    # vLLM's resolve_layout for a replicated tensor: (size, 1) with Shard(0) on the size-1 axis
    ((6, 4, 8), m2n.Mesh((1, 4), 0), [m2n.Replicate(), m2n.Shard(2)],
     m2n.Mesh((4, 1), start_rank=4), [m2n.Replicate(), m2n.Shard(0)]),
    # a flat mesh over all eight to the upper four
    ((16,), m2n.Mesh([8], 0), [m2n.Shard(0)], m2n.Mesh([4], 4), [m2n.Replicate()]),
]


def reshard_rank(comm, rank, layouts, dtype, grouped):
    handle = m2n.Handle.create(m2n.Config(max_cta=None))
    tiles = []
    for shape, smesh, sp, dmesh, dp in layouts:
        src = tile(shape, smesh, sp, rank, dtype)
        want = tile(shape, dmesh, dp, rank, dtype)
        dst = None if want is None else np.zeros_like(want)
        tiles.append((src, dst, want, smesh, sp, dmesh, dp))
    calls = [dict(src_mesh=smesh, src_placements=sp, dst_mesh=dmesh, dst_placements=dp,
                  handle=handle) for _, _, _, smesh, sp, dmesh, dp in tiles]
    if grouped:
        with m2n.group():
            for (src, dst, *_), kw in zip(tiles, calls):
                m2n.reshard(src, dst, comm, None, **kw)
    else:
        for (src, dst, *_), kw in zip(tiles, calls):
            m2n.reshard(src, dst, comm, None, **kw)
    wrong = checked = 0
    for src, dst, want, *_ in tiles:
        if dst is not None:
            wrong += int((dst != want).sum())
            checked += dst.size
    handle.destroy()
    return wrong, checked


def extension_rank(comm, rank):
    """Past M2N's limits: 4-D, two shard axes, uneven shards, through global_shape=."""
    shape = (4, 6, 5, 3)
    src_mesh, sp = m2n.Mesh((2, 2), 0), [m2n.Shard(0), m2n.Shard(3)]
    dst_mesh, dp = m2n.Mesh((2, 2, 2), 0), [m2n.Shard(1), m2n.Replicate(), m2n.Shard(2)]
    full = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)

    def piece(mesh, places):
        if rank not in mesh.ranks:
            return None
        coord = np.unravel_index(rank - mesh.start_rank, mesh.dims)
        index = [slice(None)] * len(shape)
        for axis, p in enumerate(places):  # torch.chunk, as the library's S(d)
            if isinstance(p, m2n.Shard):
                n = shape[p.dim]
                size = -(-n // mesh.dims[axis])
                lo = min(coord[axis] * size, n)
                index[p.dim] = slice(lo, min(lo + size, n))
        return np.ascontiguousarray(full[tuple(index)])

    src, want = piece(src_mesh, sp), piece(dst_mesh, dp)
    dst = None if want is None else np.zeros_like(want)
    if want is not None:
        assert m2n.local_shape(dst_mesh, dp, shape, rank) == want.shape
    m2n.reshard(src, dst, comm, None, src_mesh=src_mesh, src_placements=sp, dst_mesh=dst_mesh,
                dst_placements=dp, global_shape=shape)
    m2n.finalize()
    return (0, 0) if dst is None else (int((dst != want).sum()), dst.size)


def null_tile_rank(comm, rank):
    """Rank 2 holds a source tile but passes None (its shape and dtype given instead)."""
    smesh, sp = m2n.Mesh((2, 2), 0), [m2n.Shard(0), m2n.Replicate()]
    dmesh, dp = m2n.Mesh((2, 2), 4), [m2n.Replicate(), m2n.Shard(1)]
    src = None if rank == 2 else tile((8, 12), smesh, sp, rank, np.float32)
    want = tile((8, 12), dmesh, dp, rank, np.float32)
    dst = None if want is None else np.zeros_like(want)
    try:
        m2n.reshard(src, dst, comm, None, src_mesh=smesh, src_placements=sp, dst_mesh=dmesh,
                    dst_placements=dp, global_shape=(8, 12), dtype="float32")
    except m2n.NCCLReshardError as e:
        return e.status, e.detail
    return 0, ""


@unittest.skipIf(_missing(), _missing())
class ReshardOnFakeNccl(unittest.TestCase):
    def check_all(self, results):
        checked = 0
        for rank, (kind, value) in enumerate(results):
            self.assertEqual(kind, "ok", "rank %d: %s" % (rank, value))
            self.assertEqual(value[0], 0, "rank %d: %d elements wrong" % (rank, value[0]))
            checked += value[1]
        self.assertGreater(checked, 0)

    def test_vllms_layouts_reshard_exactly_across_eight_ranks(self):
        self.check_all(run_ranks(reshard_rank, LAYOUTS, np.int32, False))

    def test_a_group_issues_every_call_at_its_end(self):
        self.check_all(run_ranks(reshard_rank, LAYOUTS[:2], np.float16, True))

    def test_the_extension_takes_four_dims_and_uneven_shards(self):
        self.check_all(run_ranks(extension_rank))

    def test_a_null_tile_on_a_participating_rank_fails_every_rank_naming_it(self):
        for rank, (kind, value) in enumerate(run_ranks(null_tile_rank)):
            self.assertEqual(kind, "ok", "rank %d: %s" % (rank, value))
            status, detail = value
            self.assertEqual(status, 4, "rank %d: ncclInvalidArgument, not %d" % (rank, status))
            self.assertIn("rank 2: src.dataPtr is NULL, but this rank holds 192 bytes", detail)


class Surface(unittest.TestCase):
    def test_meshes_placements_and_configs_read_as_vllm_builds_them(self):
        mesh = m2n.Mesh((2, 4), start_rank=8)
        self.assertEqual((mesh.dims, mesh.start_rank, mesh.size, mesh.ndims), ((2, 4), 8, 8, 2))
        self.assertEqual(list(mesh.ranks), list(range(8, 16)))
        self.assertEqual(m2n.normalize_placements([m2n.Replicate(), m2n.Shard(1), -1, 0]),
                         (-1, 1, -1, 0))
        self.assertEqual(m2n.Config(max_cta=None).max_cta, None)
        with self.assertRaises(m2n.NcclInvalid):
            m2n.Config(max_cta=0)
        with self.assertRaises(m2n.NcclInvalid):
            m2n.Shard(-2)
        with self.assertRaises(ValueError):
            m2n.Mesh((0, 2))

    def test_tiles_are_read_through_the_shared_buffer_helpers(self):
        from reshard import _native

        a = np.arange(24, dtype=np.float32).reshape(4, 6)
        self.assertEqual(m2n._buffer(a, "src"), (a.ctypes.data, (4, 6), 7))
        self.assertEqual(m2n._buffer(a[1:2], "dst")[1], (1, 6))  # one row: contiguous
        for view in (a[:, ::2], a[:, 2:3]):  # every other column; one column of many rows
            with self.assertRaisesRegex(m2n.NcclInvalid, "src must be contiguous"):
                m2n._buffer(view, "src")
        self.assertIs(m2n._native.load, _native.load)  # one loader for both libraries

    def test_install_makes_import_nccl_m2n_resolve_to_reshard(self):
        saved = {k: sys.modules.get(k) for k in ("nccl", "nccl.m2n")}
        try:
            m2n.install()
            import nccl.m2n as shim

            self.assertIs(shim, m2n)
            self.assertIs(shim.reshard, m2n.reshard)
        finally:
            for k, v in saved.items():
                if v is None:
                    sys.modules.pop(k, None)
                else:
                    sys.modules[k] = v

    @unittest.skipIf(_missing(), _missing())
    @unittest.mock.patch.dict(os.environ, {"NCCL_M2N_LIBRARY": os.path.join(BUILD, m2n.LIB_NAME)})
    def test_a_bad_config_is_m2ns_invalid_argument_with_its_detail(self):
        cfg = m2n._Config(ctypes.sizeof(m2n._Config), 7, 2, 0)
        ptr = ctypes.c_void_p()
        status = m2n.lib().ncclM2nInit(ctypes.byref(ptr), ctypes.byref(cfg))
        with self.assertRaises(m2n.NCCLReshardError) as cm:
            m2n.check_status(status)
        self.assertEqual(cm.exception.status, 4)  # ncclInvalidArgument
        self.assertIn("config->magic is 0x7", cm.exception.detail)
        h = m2n.Handle.create()
        h.destroy()
        with self.assertRaises(m2n.NCCLReshardError) as cm:
            h._ptr = ptr.value or 1  # a handle that is not (or no longer) one
            h.destroy()
        self.assertIn("unknown or already finalized", cm.exception.detail)


def _no_frameworks():
    gone = [m for m in ("torch", "vllm") if importlib.util.find_spec(m) is None]
    return ("not installed here: %s (make test-frameworks installs them)" % ", ".join(gone)
            if gone else None)


class VllmM2nCommon(unittest.TestCase):
    @unittest.skipIf(_no_frameworks(), _no_frameworks())
    def test_vllms_m2n_conversions_drive_reshard_m2n_exactly_on_gloo(self):
        r = subprocess.run([sys.executable, os.path.join(HERE, "m2n_vllm_check.py")],
                           capture_output=True, text=True, timeout=900)
        if r.returncode == 77:
            self.skipTest(r.stdout.strip().splitlines()[-1])
        self.assertEqual(r.returncode, 0, r.stdout[-6000:] + r.stderr[-6000:])
        self.assertIn("m2n_vllm_check: 5 parameters on 8 ranks over gloo through vLLM's "
                      "m2n_common and reshard.m2n", r.stdout)
        self.assertIn(" elements checked, 0 wrong", r.stdout)


if __name__ == "__main__":
    unittest.main()
