# SPDX-License-Identifier: Apache-2.0
"""Lifetimes in the binding (docs/python.md, "Lifetimes"): Comm.close() closes the plans made on
it, a closed plan or communicator raises ReshardError instead of reaching freed memory, and a
close from another thread during an execute lets that execute finish.

Standard library only (bytearray buffers): runs with Debian's python3, numpy or not. Each rank
is a forked process, so a crash shows as its exit status instead of taking the test runner.
"""
import multiprocessing
import os
import queue
import struct
import sys
import threading
import time
import traceback
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.normpath(os.path.join(HERE, "..", "..")), "python"))

import reshard  # noqa: E402

# Rank 1 sends 4096 int32 to rank 0 (one rank alone: both sides are rank 0).
N = 4096
ONE = [("w", "shape=%d dtype=i32 ranks=0 place=R" % N, "shape=%d dtype=i32 ranks=0 place=R" % N)]
TWO = [("w", "shape=%d dtype=i32 ranks=1 place=R" % N, "shape=%d dtype=i32 ranks=0 place=R" % N)]


def pattern():
    return bytearray(struct.pack("<%di" % N, *range(7, 7 + N)))


def refusal(fn):
    """(status name, message) of the ReshardError fn raises, or what it did instead."""
    try:
        fn()
    except reshard.ReshardError as e:
        return (e.name, e.message)
    except Exception as e:  # the wrong kind of error is an answer too
        return ("not a ReshardError", repr(e))
    return ("no error", "")


def run_ranks(target, size, timeout=120):
    """Runs target(uid, rank, out) on `size` forked ranks; returns {rank: result} and each
    rank's exit status (a crash: a signal, or ASan's exit status 1)."""
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    uid = reshard.unique_id()
    procs = [ctx.Process(target=target, args=(uid, r, out)) for r in range(size)]
    for p in procs:
        p.start()
    got = {}
    deadline = time.monotonic() + timeout
    while len(got) < size and time.monotonic() < deadline:
        try:
            rank, result = out.get(timeout=1)
            got[rank] = result
        except queue.Empty:
            if all(p.exitcode is not None for p in procs) and out.empty():
                break  # a rank died without answering
    for p in procs:
        p.join(30)
        if p.exitcode is None:
            p.kill()
            p.join()
    return got, [p.exitcode for p in procs]


def close_comm_then_use_plan(uid, rank, out):
    try:
        comm = reshard.Comm(uid, rank, 1)
        plan = reshard.Plan(comm, ONE)
        src, dst = pattern(), bytearray(4 * N)
        plan.execute([src], [dst])
        first = dst == src
        comm.close()  # closes the plan first
        got = {
            "first refit": first,
            "plan closed": plan.closed,
            "execute": refusal(lambda: plan.execute([src], [dst])),
            "outcome": refusal(plan.outcome),
            "hash": refusal(lambda: plan.hash),
            "barrier": refusal(comm.barrier),
            "rank": refusal(lambda: comm.rank),
        }
        plan.close()  # closing again does nothing
        comm.close()
        out.put((rank, (None, got)))
    except Exception:
        out.put((rank, (traceback.format_exc(), None)))


def close_during_execute(what):
    """A rank function: rank 1 joins the execute 1.5 s late, so rank 0's waits for it while
    another thread of rank 0 closes `what` ("plan" or "comm")."""

    def rank_fn(uid, rank, out):
        try:
            comm = reshard.Comm(uid, rank, 2)
            plan = reshard.Plan(comm, TWO)
            if rank == 1:
                time.sleep(1.5)
                plan.execute([pattern()], None)
                plan.close()
                comm.close()
                out.put((rank, (None, "sent")))
                return
            dst = bytearray(4 * N)

            def closer():
                while getattr(plan, "_calls", 1) == 0:  # until the execute holds the plan
                    time.sleep(0.001)
                time.sleep(0.3)
                (plan if what == "plan" else comm).close()

            th = threading.Thread(target=closer)
            th.start()
            plan.execute(None, [dst])
            th.join()
            got = {
                "refit": dst == pattern(),
                "plan closed": plan.closed,
                "comm closed": comm.closed,
                "execute after": refusal(lambda: plan.execute(None, [dst])),
            }
            plan.close()
            comm.close()
            out.put((rank, (None, got)))
        except Exception:
            out.put((rank, (traceback.format_exc(), None)))

    return rank_fn


class Lifetimes(unittest.TestCase):
    def test_a_plan_used_after_its_communicator_closed_raises(self):
        got, codes = run_ranks(close_comm_then_use_plan, 1)
        self.assertEqual(codes, [0], "the rank crashed: %s" % (got,))
        err, seen = got[0]
        self.assertIsNone(err, err)
        self.assertTrue(seen["first refit"])
        self.assertTrue(seen["plan closed"])
        for call in ("execute", "outcome", "hash"):
            self.assertEqual(seen[call][0], "ERR_INVALID_ARG", "%s: %s" % (call, seen[call]))
            self.assertIn("the plan's communicator was closed", seen[call][1])
        for call in ("barrier", "rank"):
            self.assertEqual(seen[call], ("ERR_INVALID_ARG", "the communicator was closed"))

    def check_close_during_execute(self, what):
        got, codes = run_ranks(close_during_execute(what), 2)
        self.assertEqual(codes, [0, 0], "a rank crashed: %s" % (got,))
        self.assertEqual(got[1], (None, "sent"))
        err, seen = got[0]
        self.assertIsNone(err, err)
        self.assertTrue(seen["refit"], "the execute did not finish its refit")
        self.assertTrue(seen["plan closed"])
        self.assertEqual(seen["comm closed"], what == "comm")
        self.assertEqual(seen["execute after"][0], "ERR_INVALID_ARG", seen["execute after"])
        self.assertIn("communicator was closed" if what == "comm" else "the plan was closed",
                      seen["execute after"][1])

    def test_closing_the_plan_from_another_thread_during_execute_lets_it_finish(self):
        self.check_close_during_execute("plan")

    def test_closing_the_comm_from_another_thread_during_execute_lets_it_finish(self):
        self.check_close_during_execute("comm")


if __name__ == "__main__":
    unittest.main()
