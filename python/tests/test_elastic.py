# SPDX-License-Identifier: Apache-2.0
"""An elastic fleet in the binding (docs/python.md, "Leaving"): comm.leave() is heard by the
others at once, comm.left() names the rank, and they shrink it away and refit; a replacement
joins and catches up from a replica (Plan.catch_up) while the trainer sends nothing.

Standard library only (bytearray buffers), each rank a forked process.
"""
import multiprocessing
import os
import struct
import sys
import time
import traceback
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.normpath(os.path.join(HERE, "..", "..")), "python"))

import reshard  # noqa: E402
from test_lifetime import refusal, run_ranks  # noqa: E402

N = 4096
# Held by ranks 0 and 2 (replicas), wanted by rank 1: either source may leave.
REP = [
    (
        "w",
        "shape=%d dtype=i32 ranks=0,2 mesh=2 place=R" % N,
        "shape=%d dtype=i32 ranks=1 place=R" % N,
    )
]
LEAVER = 2
GROWN = [
    (
        "w",
        "shape=%d dtype=i32 ranks=0 place=R" % N,
        "shape=%d dtype=i32 ranks=%d place=R" % (N, LEAVER),
    )
]


def pattern():
    return bytearray(struct.pack("<%di" % N, *range(7, 7 + N)))


def leave_then_shrink(uid, rank, out):
    try:
        os.environ["RESHARD_TIMEOUT"] = "40"
        comm = reshard.Comm(uid, rank, 3)
        comm.barrier()
        if rank == LEAVER:
            comm.leave()
            out.put((rank, (None, {"closed": comm.closed, "barrier": refusal(comm.barrier)})))
            return
        t0 = time.monotonic()
        barrier = refusal(comm.barrier)
        took = time.monotonic() - t0
        left = comm.left()
        survivors = comm.shrink([LEAVER])
        comm.close()
        plan = reshard.Plan(survivors, REP)
        src = pattern() if rank == 0 else None
        dst = bytearray(4 * N) if rank == 1 else None
        plan.execute([src] if src else None, [dst] if dst else None)
        got = {
            "barrier": barrier[0],
            "says who": ("rank %d left the communicator" % LEAVER) in barrier[1],
            "heard within 15 s": took < 15,
            "left": left,
            "refit": dst == pattern() if rank == 1 else True,
        }
        plan.close()
        survivors.close()
        out.put((rank, (None, got)))
    except Exception:
        out.put((rank, (traceback.format_exc(), None)))


def leave_then_rejoin(box, ready):
    """Rank 2 leaves; 0 and 1 shrink it away and grow it back; the same process joins with
    its number and receives the tensor from rank 0."""

    def rank_fn(uid, rank, out):
        try:
            os.environ["RESHARD_TIMEOUT"] = "40"
            comm = reshard.Comm(uid, rank, 3)
            comm.barrier()
            if rank == LEAVER:
                comm.leave()
                ready.wait(60)
                grown = reshard.Comm.join(bytes(box[:]), LEAVER, [LEAVER])
                wrong_rank = refusal(lambda: reshard.Comm.join(bytes(box[:]), 1, [LEAVER]))
            else:
                refusal(comm.barrier)
                survivors = comm.shrink([LEAVER])
                comm.close()
                bad_list = refusal(lambda: survivors.grow([1]))
                if rank == 0:
                    box[:] = survivors.grow_id([LEAVER])
                    ready.set()
                grown = survivors.grow([LEAVER])
                survivors.close()
            src = pattern() if rank == 0 else None
            dst = bytearray(4 * N) if rank == LEAVER else None
            plan = reshard.Plan(grown, GROWN)
            plan.execute([src] if src else None, [dst] if dst else None)
            got = {"size": grown.size, "rank": grown.rank}
            if rank == LEAVER:
                got["refit"] = dst == pattern()
                got["wrong rank"] = wrong_rank[0]
            else:
                got["bad list"] = bad_list[0]
            plan.close()
            grown.close()
            out.put((rank, (None, got)))
        except Exception:
            out.put((rank, (traceback.format_exc(), None)))

    return rank_fn


# Rank 0 trains; ranks 1 and 2 are inference replicas of the whole tensor.
REPLICAS = [
    (
        "w",
        "shape=%d dtype=i32 ranks=0 place=R" % N,
        "shape=%d dtype=i32 ranks=1-2 mesh=2 place=R" % N,
    )
]


def versioned(v):
    return bytearray(struct.pack("<%di" % N, *range(7 + v * 100000, 7 + v * 100000 + N)))


def replace_then_catch_up(box, ready):
    """Version 1 is refit; rank 2 leaves and a replacement joins with its number; the trainer
    moves on to version 2 while the replacement catches up from rank 1 (version 1), then the
    next refit brings everyone to version 2."""

    def rank_fn(uid, rank, out):
        try:
            os.environ["RESHARD_TIMEOUT"] = "40"
            comm = reshard.Comm(uid, rank, 3)
            src = versioned(1) if rank == 0 else None
            dst = bytearray(4 * N) if rank else None
            plan = reshard.Plan(comm, REPLICAS)
            plan.execute([src] if src else None, [dst] if dst else None)
            plan.close()
            comm.barrier()
            if rank == LEAVER:
                comm.leave()
                ready.wait(60)
                dst = bytearray(b"\x5a" * (4 * N))  # a new process holds nothing
                grown = reshard.Comm.join(bytes(box[:]), LEAVER, [LEAVER])
            else:
                refusal(comm.barrier)
                survivors = comm.shrink([LEAVER])
                comm.close()
                if rank == 0:
                    box[:] = survivors.grow_id([LEAVER])
                    ready.set()
                grown = survivors.grow([LEAVER])
                survivors.close()
            refit = reshard.Plan(grown, REPLICAS)
            if rank == 0:
                src = versioned(2)  # the trainer moved on
            catch_up = refit.catch_up([LEAVER])
            before = grown.counters()
            catch_up.execute([src] if src else None, [dst] if dst else None)
            after = grown.counters()
            stats = catch_up.stats()
            moved = {k: after[k] - before[k] for k in ("net_out", "local_out", "net_in",
                                                       "local_in")}
            got = {
                "sent": moved["net_out"] + moved["local_out"],
                "received": moved["net_in"] + moved["local_in"],
                "net is min": stats["net_bytes"] == stats["min_net_bytes"],
                "bad list": refusal(lambda: refit.catch_up([LEAVER, LEAVER]))[0],
            }
            if rank:
                got["caught up"] = dst == versioned(1)
            catch_up.close()
            refit.execute([src] if src else None, [dst] if dst else None)
            if rank:
                got["next refit"] = dst == versioned(2)
            refit.close()
            grown.close()
            out.put((rank, (None, got)))
        except Exception:
            out.put((rank, (traceback.format_exc(), None)))

    return rank_fn


class CatchingUp(unittest.TestCase):
    def test_a_replacement_catches_up_from_a_replica_and_the_trainer_sends_nothing(self):
        ctx = multiprocessing.get_context("fork")
        box, ready = ctx.Array("B", 128, lock=False), ctx.Event()
        got, codes = run_ranks(replace_then_catch_up(box, ready), 3)
        self.assertEqual(codes, [0, 0, 0], "a rank crashed: %s" % (got,))
        for rank in range(3):
            err, res = got.get(rank, ("no answer", None))
            self.assertIsNone(err, "rank %d: %s" % (rank, err))
            self.assertTrue(res["net is min"], "rank %d" % rank)
            self.assertEqual(res["bad list"], "ERR_INVALID_ARG", "rank %d" % rank)
        self.assertEqual(got[0][1]["sent"], 0, "the trainer sent for the joiner")
        self.assertEqual(got[0][1]["received"], 0)
        self.assertEqual(got[1][1]["sent"], 4 * N, "the replica serves the joiner")
        self.assertEqual(got[LEAVER][1]["received"], 4 * N)
        for rank in (1, LEAVER):
            self.assertTrue(got[rank][1]["caught up"], "rank %d" % rank)
            self.assertTrue(got[rank][1]["next refit"], "rank %d" % rank)


class Leaving(unittest.TestCase):
    def test_a_rank_that_leaves_is_heard_at_once_and_the_others_shrink_and_refit(self):
        got, codes = run_ranks(leave_then_shrink, 3)
        self.assertEqual(codes, [0, 0, 0], "a rank crashed: %s" % (got,))
        for rank in range(3):
            err, res = got.get(rank, ("no answer", None))
            self.assertIsNone(err, "rank %d: %s" % (rank, err))
        self.assertTrue(got[LEAVER][1]["closed"])
        self.assertEqual(got[LEAVER][1]["barrier"][0], "ERR_INVALID_ARG")
        for rank in (0, 1):
            res = got[rank][1]
            self.assertEqual(
                res,
                {
                    "barrier": "ERR_REMOTE",
                    "says who": True,
                    "heard within 15 s": True,
                    "left": LEAVER,
                    "refit": True,
                },
                "rank %d" % rank,
            )


class Joining(unittest.TestCase):
    def test_a_replacement_joins_with_the_number_of_the_rank_that_left_and_refits(self):
        ctx = multiprocessing.get_context("fork")
        box, ready = ctx.Array("B", 128, lock=False), ctx.Event()
        got, codes = run_ranks(leave_then_rejoin(box, ready), 3)
        self.assertEqual(codes, [0, 0, 0], "a rank crashed: %s" % (got,))
        for rank in range(3):
            err, res = got.get(rank, ("no answer", None))
            self.assertIsNone(err, "rank %d: %s" % (rank, err))
            self.assertEqual((res["size"], res["rank"]), (3, rank))
        self.assertEqual(got[LEAVER][1]["refit"], True)
        self.assertEqual(got[LEAVER][1]["wrong rank"], "ERR_INVALID_ARG")
        for rank in (0, 1):
            self.assertEqual(got[rank][1]["bad list"], "ERR_INVALID_ARG")


if __name__ == "__main__":
    unittest.main()
