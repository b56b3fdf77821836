# SPDX-License-Identifier: Apache-2.0
"""Buffers checked against their layout before any byte moves (issue 20, defects 1-3 and 6):
dtype, shape, strides, DTensor-less errors, and the version counter. numpy cases run with
Debian's packages; torch cases skip without torch (make test-frameworks runs them)."""
import multiprocessing
import os
import sys
import traceback
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, ".."))

import reshard  # noqa: E402

try:
    import numpy as np
except ImportError:
    np = None
try:
    import torch
except ImportError:
    torch = None


def run_ranks(fn, size, timeout=120):
    """fn(comm, rank) on `size` forked ranks; returns [(rank, result or None, error text)]."""
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    uid = reshard.unique_id()

    def body(rank):
        try:
            os.environ["RESHARD_TIMEOUT"] = "60"
            with reshard.Comm(uid, rank, size) as comm:
                out.put((rank, fn(comm, rank), None))
        except Exception:
            out.put((rank, None, traceback.format_exc()))

    procs = [ctx.Process(target=body, args=(r,)) for r in range(size)]
    for p in procs:
        p.start()
    results = sorted(out.get(timeout=timeout) for _ in procs)
    for p in procs:
        p.join(30)
    return results


def attempt(plan, src, dst):
    """(status name, message) of one execute; ("OK", "") when it succeeds."""
    try:
        plan.execute(src, dst)
        return ("OK", "")
    except reshard.ReshardError as e:
        return (e.name, e.message)


SQUARE = "shape=6x8 dtype=%s ranks=0 place=R"


def numpy_cases(comm, rank):
    got = {}
    plan = reshard.Plan(comm, [("t", SQUARE % "f32", SQUARE % "f32")])
    src = np.arange(48, dtype=np.float32).reshape(6, 8)
    got["transposed shape"] = attempt(plan, [src], [np.zeros((8, 6), np.float32)])
    got["larger"] = attempt(plan, [src], [np.zeros((12, 8), np.float32)])
    flat = np.zeros(48, np.float32)
    got["flat"] = attempt(plan, [src], [flat]) + (int((flat.reshape(6, 8) != src).sum()),)
    got["flat short"] = attempt(plan, [src], [np.zeros(47, np.float32)])
    got["int32 for f32"] = attempt(plan, [src.astype(np.int32)], [np.zeros((6, 8), np.float32)])
    got["bool"] = attempt(plan, [src], [np.zeros((6, 8), bool)])
    # a column block of a wider buffer: refused without strides, written in place with them
    wide = np.zeros((6, 16), np.float32)
    got["strided dst"] = attempt(plan, [src], [wide[:, 4:12]])
    plan.close()
    lay = reshard.Layout(SQUARE % "f32").with_strides_of(wide[:, 4:12])
    got["strides spec"] = lay.spec
    with reshard.Plan(comm, [("t", SQUARE % "f32", lay)]) as p2:
        got["strided in place"] = attempt(p2, [src], [wide[:, 4:12]]) + (
            int((wide[:, 4:12] != src).sum()), int(wide[:, :4].any() or wide[:, 12:].any()))
        got["contiguous for strides"] = attempt(p2, [src], [np.zeros((6, 8), np.float32)])
    # a strided source is read through a copy
    with reshard.Plan(comm, [("t", SQUARE % "f32", SQUARE % "f32")]) as p3:
        big = np.zeros((6, 16), np.float32)
        big[:, ::2] = src
        dst = np.zeros((6, 8), np.float32)
        got["strided src"] = attempt(p3, [big[:, ::2]], [dst]) + (int((dst != src).sum()),)
    return got


@unittest.skipIf(np is None, "numpy is not installed (apt-get install python3-numpy)")
class NumpyBuffers(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        [(_, cls.got, err)] = run_ranks(numpy_cases, 1)
        if err:
            raise AssertionError(err)

    def test_a_transposed_or_larger_destination_is_refused(self):
        name, msg = self.got["transposed shape"]
        self.assertEqual(name, "ERR_BUFFER")
        self.assertIn("destination of 't' on rank 0 has shape (8, 6), its shard has shape (6, 8)",
                      msg)
        self.assertEqual(self.got["larger"][0], "ERR_BUFFER")
        self.assertIn("has shape (12, 8)", self.got["larger"][1])

    def test_a_flat_buffer_of_exactly_the_shard_works(self):
        self.assertEqual(self.got["flat"], ("OK", "", 0))
        self.assertIn("has shape (47,)", self.got["flat short"][1])

    def test_dtypes_must_equal_the_layouts(self):
        self.assertIn("source of 't' on rank 0 has dtype int32, the layout's is f32",
                      self.got["int32 for f32"][1])
        self.assertIn("has dtype bool, which reshard has no name for", self.got["bool"][1])

    def test_a_strided_destination_needs_its_strides_in_the_layout(self):
        name, msg = self.got["strided dst"]
        self.assertEqual(name, "ERR_BUFFER")
        self.assertIn("is not contiguous (strides (16, 1))", msg)
        self.assertIn("Layout.with_strides_of(tensor)", msg)
        self.assertIn("strides=16x1", self.got["strides spec"])
        self.assertEqual(self.got["strided in place"], ("OK", "", 0, 0))
        self.assertIn("has strides (8, 1), the layout strides=16x1",
                      self.got["contiguous for strides"][1])

    def test_a_strided_source_is_read_through_a_copy(self):
        self.assertEqual(self.got["strided src"], ("OK", "", 0))



HALF = "shape=2x4 dtype=f32 ranks=0-1 place=R"
ROWS = "shape=2x4 dtype=f32 ranks=0-1 place=S(0)"


def collective_case(comm, rank):
    """Rank 1 passes a destination of the wrong dtype: both ranks fail at once, before any
    byte moves, and rank 0's destination is untouched."""
    src = np.arange(8, dtype=np.float32).reshape(2, 4)
    dst = (np.zeros((1, 4), np.float64) if rank == 1 else np.full((1, 4), -1, np.float32))
    with reshard.Plan(comm, [("w", HALF, ROWS)]) as plan:
        got = attempt(plan, [src], [dst])
        outcome = plan.outcome()["w"]
    return got + (outcome, float(dst.sum()))


def empty_shard_case(comm, rank):
    """Rank 1's shard of one row over two ranks is empty, and it passes a row anyway: rank 0
    gets its refit, rank 1 is told what it passed."""
    src = np.arange(8, dtype=np.float32).reshape(1, 8)
    dst = np.zeros((1, 8), np.float32)
    with reshard.Plan(comm, [("w", "shape=1x8 dtype=f32 ranks=0 place=R",
                              "shape=1x8 dtype=f32 ranks=0-1 place=S(0)")]) as plan:
        got = attempt(plan, [src if rank == 0 else None], [dst])
    return got + (int((dst != src).sum()),)


@unittest.skipIf(np is None, "numpy is not installed (apt-get install python3-numpy)")
class CollectiveRefusal(unittest.TestCase):
    def test_a_buffer_for_an_empty_shard_is_refused_on_its_rank_alone(self):
        results = run_ranks(empty_shard_case, 2)
        self.assertEqual(results[0][1], ("OK", "", 0), results)
        self.assertEqual(results[1][1][0], "ERR_BUFFER", results)
        self.assertIn("destination of 'w' on rank 1 holds 8 elements but the rank's shard is "
                      "empty: pass None", results[1][1][1])

    def test_one_bad_buffer_fails_every_rank_before_any_byte_moves(self):
        results = run_ranks(collective_case, 2)
        for rank, got, err in results:
            self.assertIsNone(err, err)
            self.assertEqual(got[0], "ERR_BUFFER", got)
            self.assertIn("rank 1: destination buffer of tensor w", got[1])
            self.assertEqual(got[2], "untouched")
        self.assertIn("destination of 'w' on rank 1 has dtype float64, the layout's is f32",
                      results[1][1][1])
        self.assertEqual(results[0][1][3], -4.0, "rank 0's destination was not written")


def torch_cases(comm, rank):
    got = {}
    full = torch.arange(48.0).reshape(6, 8)
    for name, dtype, src_dt, dst_dt in (("half->bf16", "bf16", torch.half, torch.bfloat16),
                                        ("i32->f32", "f32", torch.int32, torch.float32),
                                        ("i16->bf16", "bf16", torch.int16, torch.bfloat16),
                                        ("bool->u8", "u8", torch.bool, torch.uint8)):
        with reshard.Plan(comm, [("t", SQUARE % dtype, SQUARE % dtype)]) as plan:
            got[name] = attempt(plan, [full.to(src_dt)], [torch.zeros(6, 8, dtype=dst_dt)])
    with reshard.Plan(comm, [("t", SQUARE % "f32", SQUARE % "f32")]) as plan:
        got["(8,6)"] = attempt(plan, [full], [torch.zeros(8, 6)])
        got["(12,8)"] = attempt(plan, [full], [torch.zeros(12, 8)])
        wide = torch.zeros(6, 16)
        got["column block"] = attempt(plan, [full], [wide[:, 8:]])
        dst = torch.zeros(6, 8)
        v0 = dst._version
        got["version"] = attempt(plan, [full], [dst]) + (dst._version > v0,
                                                          bool(torch.equal(dst, full)))
        leaf = torch.zeros(6, 8, requires_grad=True)
        got["non-leaf"] = attempt(plan, [full], [leaf * 1])
        got["sparse"] = attempt(plan, [full.to_sparse()], [torch.zeros(6, 8)])
        param = torch.nn.Parameter(torch.zeros(6, 8))
        got["parameter"] = attempt(plan, [full], [param]) + (bool(torch.equal(param.data,
                                                                               full)),)
    lay = reshard.Layout(SQUARE % "f32").with_strides_of(wide[:, 8:])
    with reshard.Plan(comm, [("t", SQUARE % "f32", lay)]) as plan:
        got["column block in place"] = attempt(plan, [full], [wide[:, 8:]]) + (
            bool(torch.equal(wide[:, 8:], full)), int(wide[:, :8].count_nonzero()))
    return got


def four_rank_whole_tensor(comm, rank):
    """A model not sharded yet: rank 2 passes the whole 3x4 tensor for its 1x4 shard."""
    src = "shape=3x4 dtype=f32 ranks=0 place=R"
    dst = "shape=3x4 dtype=f32 ranks=1-3 place=S(0)"
    full = torch.arange(12.0).reshape(3, 4)
    with reshard.Plan(comm, [("w", src, dst)]) as plan:
        mine = torch.zeros(3, 4) if rank == 2 else (torch.zeros(1, 4) if rank else None)
        return attempt(plan, [full if rank == 0 else None], [mine])


@unittest.skipIf(torch is None, "torch is not installed: make test-frameworks runs these")
class TorchBuffers(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        [(_, cls.got, err)] = run_ranks(torch_cases, 1)
        if err:
            raise AssertionError(err)

    def test_dtype_not_only_element_size_is_checked(self):
        for case, shown, want in (("half->bf16", "torch.float16", "bf16"),
                                  ("i32->f32", "torch.int32", "f32"),
                                  ("i16->bf16", "torch.int16", "bf16")):
            name, msg = self.got[case]
            self.assertEqual(name, "ERR_BUFFER", case)
            self.assertIn("source of 't' on rank 0 has dtype %s" % shown, msg)
        self.assertIn("torch.bool, which reshard has no name for", self.got["bool->u8"][1])

    def test_shapes_must_equal_the_shards(self):
        self.assertIn("has shape (8, 6), its shard has shape (6, 8)", self.got["(8,6)"][1])
        self.assertIn("has shape (12, 8)", self.got["(12,8)"][1])

    def test_a_column_block_is_written_in_place_through_its_strides(self):
        self.assertIn("Layout.with_strides_of(tensor)", self.got["column block"][1])
        self.assertEqual(self.got["column block in place"], ("OK", "", True, 0))

    def test_destinations_bump_the_version_counter(self):
        self.assertEqual(self.got["version"], ("OK", "", True, True))

    def test_a_non_leaf_destination_is_refused(self):
        self.assertIn("non-leaf tensor with a grad_fn (MulBackward0)", self.got["non-leaf"][1])

    def test_sparse_and_parameters(self):
        self.assertIn("is a sparse_coo tensor", self.got["sparse"][1])
        self.assertEqual(self.got["parameter"], ("OK", "", True))

    def test_layout_errors_are_reshard_errors(self):
        with self.assertRaises(reshard.ReshardError) as e:
            reshard.Layout.from_dtensor(torch.zeros(4))
        self.assertIn("from_dtensor takes a DTensor", e.exception.message)
        lay = reshard.Layout("shape=4x2 dtype=bf16 ranks=0-1 place=S(0)")
        full = torch.arange(8.0).reshape(4, 2).bfloat16()
        self.assertTrue(torch.equal(lay.shard_of(full, 1), full[2:]))
        param = torch.nn.Parameter(torch.arange(8.0).reshape(4, 2))
        self.assertTrue(torch.equal(lay.shard_of(param, 0), param.detach()[:2]))
        with self.assertRaises(reshard.ReshardError):
            lay.shard_of(torch.zeros(3, 2), 0)

    def test_the_whole_tensor_for_a_shard_fails_every_rank(self):
        results = run_ranks(four_rank_whole_tensor, 4)
        for rank, got, err in results:
            self.assertIsNone(err, err)
            self.assertEqual(got[0], "ERR_BUFFER", (rank, got))
            self.assertIn("rank 2: destination buffer of tensor w", got[1])
        self.assertIn("has shape (3, 4), its shard has shape (1, 4)", results[2][1][1])


class ShardOrder(unittest.TestCase):
    """A DTensor whose spec shards a tensor dim over its mesh dims in another order: a fake
    DTensor (numpy mesh), so that this runs without torch; the framework tests use torch's."""

    def fake(self, shape, placements, order):
        class Shard:
            def __init__(self, dim):
                self.dim = dim

        class Entry(tuple):
            tensor_dim = property(lambda s: s[0])
            mesh_dims = property(lambda s: s[1])

        class Spec:
            shard_order = tuple(Entry(e) for e in order)
            use_strided_shard_as_shard_order = False

        class Mesh:
            mesh = np.arange(4).reshape(2, 2)

        class DT:
            device_mesh = Mesh()
            dtype = "f32"
            _spec = Spec()

        DT.shape = shape
        DT.placements = tuple(Shard(d) if d is not None else type("Replicate", (), {})()
                              for d in placements)
        return DT()

    @unittest.skipIf(np is None, "numpy is not installed")
    def test_mesh_dims_in_shard_order_apply_in_that_order(self):
        # dim 0 over mesh dim 1 first, then mesh dim 0: rank (i, j) holds chunk j, then i
        lay = reshard.Layout.from_dtensor(self.fake((8,), (0, 0), [(0, (1, 0))]))
        got = [lay.shard_index(r, 0) for r in range(4)]
        self.assertEqual(got, [[0, 1], [4, 5], [2, 3], [6, 7]])
        default = reshard.Layout.from_dtensor(self.fake((8,), (0, 0), [(0, (0, 1))]))
        self.assertEqual([default.shard_index(r, 0) for r in range(4)],
                         [[0, 1], [2, 3], [4, 5], [6, 7]])

    @unittest.skipIf(np is None, "numpy is not installed")
    def test_a_shard_order_that_contradicts_the_placements_is_refused(self):
        with self.assertRaises(reshard.ReshardError) as e:
            reshard.Layout.from_dtensor(self.fake((8, 4), (0, 1), [(0, (1, 0))]))
        self.assertIn("names mesh dim 1 for tensor dim 0", e.exception.message)


if __name__ == "__main__":
    unittest.main()
