# SPDX-License-Identifier: Apache-2.0
"""Issue 27, finding 1, from Python: a view offset near 2^63 bytes. (2^61 - 2 + 10) x 8 bytes
wrapped to 64 in the library, so Plan.execute succeeded into an 8-element numpy array and
wrote 16 bytes in front of its data. The layout is refused now, naming the offset's column.
The layout case needs only the library; the execute case runs with Debian's numpy and skips
without it."""
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

SRC = "shape=10 dtype=f64 ranks=0"
WRAPS = SRC + " buffer=b offset=2305843009213693950"  # the value of the offset: column 44


def one_rank(fn, timeout=120):
    """fn(comm) on one forked rank of its own communicator; returns (result, error text)."""
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    uid = reshard.unique_id()

    def body():
        try:
            os.environ["RESHARD_TIMEOUT"] = "60"
            with reshard.Comm(uid, 0, 1) as comm:
                out.put((fn(comm), None))
        except Exception:
            out.put((None, traceback.format_exc()))

    p = ctx.Process(target=body)
    p.start()
    got = out.get(timeout=timeout)
    p.join(30)
    return got


def execute_into_guarded(comm):
    """Plans WRAPS and executes into 8 float64 between guards; what happened, and how many
    guard elements changed."""
    try:
        dst_layout = reshard.Layout(WRAPS)
    except reshard.ReshardError as e:
        return {"layout": (e.name, e.message)}
    got = {"layout": ("OK", "")}
    guarded = np.full(8 + 8 + 8, 7.0)
    dst = guarded[8:16]
    try:
        with reshard.Plan(comm, [("t", SRC, dst_layout)]) as plan:
            plan.execute([np.arange(10.0)], [dst])
        got["execute"] = ("OK", "")
    except reshard.ReshardError as e:
        got["execute"] = (e.name, e.message)
    got["guards changed"] = int((guarded[:8] != 7.0).sum() + (guarded[16:] != 7.0).sum())
    return got


class OffsetNear2To63(unittest.TestCase):
    def test_a_view_offset_whose_span_wraps_is_refused_naming_its_column(self):
        with self.assertRaises(reshard.ReshardError) as cm:
            reshard.Layout(WRAPS)
        self.assertEqual(cm.exception.name, "ERR_TOO_LARGE")
        self.assertIn("offset: the view of rank 0 reaches past byte 2^63", cm.exception.message)
        self.assertIn("at column 44", cm.exception.message)

    def test_the_largest_offset_that_fits_is_accepted_with_its_exact_size(self):
        # (1152921504606846965 + 10) x 8 = 2^63 - 8
        lay = reshard.Layout(SRC + " buffer=b offset=1152921504606846965")
        self.assertEqual(lay.shard_bytes(0), 2**63 - 8)
        with self.assertRaises(reshard.ReshardError):
            reshard.Layout(SRC + " buffer=b offset=1152921504606846966")

    @unittest.skipIf(np is None, "numpy is not installed (apt-get install python3-numpy)")
    def test_execute_into_an_8_element_array_never_writes_before_its_data(self):
        got, err = one_rank(execute_into_guarded)
        if err:
            raise AssertionError(err)
        self.assertEqual(got.get("guards changed", 0), 0, got)
        self.assertEqual(got["layout"][0], "ERR_TOO_LARGE", got)


if __name__ == "__main__":
    unittest.main()
