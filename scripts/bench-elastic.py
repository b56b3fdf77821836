#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""One rank of scripts/bench-elastic.sh (run by scripts/cluster.sh, which sets RANK and the
torchrun variables), or, with `report`, the table of what the ranks wrote.

  bench-elastic.py replace   ranks 0-7 form the job (trainers 0-3, DP2 x TP2 inference 4-7);
                             rank 7 is killed after the refits before; the others shrink it
                             away and grow it back; rank 8 (a spare node) joins as rank 7,
                             catches up, and the refits after include it; rank 9 idles.
  bench-elastic.py grow      the same job; ranks 8-9 (a new node) join as a new TP2 replica.
  bench-elastic.py report DIR MODE

Each rank writes DIR/rank<R>.json (ELASTIC_DIR). The weights: a 4096x2048 int32 matrix (32 MiB)
with its rows sharded over the trainers and its columns over each inference replica, and a
2048x16 int32 norm replicated on every inference rank. Element (r, c) of version v is
r * cols + c + v * 1000003 (mod 2^32), so every element a rank holds is checked.
"""
import json
import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

import numpy as np  # noqa: E402

import reshard  # noqa: E402

W = "shape=4096x2048 dtype=i32"
NORM = "shape=2048x16 dtype=i32"
TRAIN = "ranks=0-3 mesh=4 place=S(0)"
REFITS = int(os.environ.get("ELASTIC_REFITS", "3"))


def tensors(infer_ranks, replicas):
    ranks = "%d-%d" % (infer_ranks[0], infer_ranks[-1])
    return [
        ("w", "%s %s" % (W, TRAIN), "%s ranks=%s mesh=%dx2 place=R,S(1)" % (W, ranks, replicas)),
        ("norm", "%s %s" % (NORM, TRAIN), "%s ranks=%s place=R" % (NORM, ranks)),
    ]


def pattern(layout, rank, version):
    shape = layout.shard_shape(rank)
    if not shape or 0 in shape:
        return None
    rows = np.array(layout.shard_index(rank, 0), dtype=np.int64)
    cols = np.array(layout.shard_index(rank, 1), dtype=np.int64)
    full = np.add.outer(rows * layout.shape[1], cols) + version * 1000003
    return (full % (1 << 32)).astype(np.uint32).view(np.int32)


class Rank:
    """This rank's buffers for a plan's tensors."""

    def __init__(self, plan, rank):
        self.plan, self.rank = plan, rank
        self.src = [pattern(s, rank, 0) for s, _ in plan._sides]
        self.dst = [None if pattern(d, rank, 0) is None else
                    np.full(d.shard_shape(rank), 0x5A5A5A5A, dtype=np.int32)
                    for _, d in plan._sides]

    def rebind(self, plan, old):
        """The same destination memory under another plan (a member's shard keeps its size)."""
        self.plan = plan
        self.src = [pattern(s, self.rank, 0) for s, _ in plan._sides]
        self.dst = [None if pattern(d, self.rank, 0) is None else
                    (old.dst[i] if old and old.dst[i] is not None else
                     np.full(d.shard_shape(self.rank), 0x5A5A5A5A, dtype=np.int32))
                    for i, (_, d) in enumerate(plan._sides)]

    def train(self, version):
        for i, (s, _) in enumerate(self.plan._sides):
            if self.src[i] is not None:
                self.src[i] = pattern(s, self.rank, version)

    def wrong(self, version):
        n = 0
        for i, (_, d) in enumerate(self.plan._sides):
            if self.dst[i] is not None:
                n += int(np.count_nonzero(self.dst[i] != pattern(d, self.rank, version)))
        return n

    def run(self, plan=None):
        (plan or self.plan).execute(self.src, self.dst)


def timed_refits(comm, plan, me, first_version, out, key):
    """REFITS refits, each after a barrier; this rank's seconds and wrong elements."""
    times = []
    for k in range(REFITS):
        v = first_version + k
        me.train(v)
        comm.barrier()
        t0 = time.monotonic()
        me.run(plan)
        times.append(time.monotonic() - t0)
        out.setdefault("wrong", 0)
        out["wrong"] += me.wrong(v)
    out[key] = times
    return first_version + REFITS


def moved(a, b):
    return {k: b[k] - a[k] for k in ("net_out", "net_in", "local_out", "local_in", "boot_out",
                                     "boot_in", "ctrl_bytes_out", "ctrl_bytes_in")}


def wait_for(path, timeout=120):
    t0 = time.monotonic()
    while not os.path.exists(path):
        if time.monotonic() - t0 > timeout:
            raise RuntimeError("no join id at %s" % path)
        time.sleep(0.01)
    time.sleep(0.05)
    with open(path, "rb") as f:
        return f.read()


def on_grown(grown, rank, joiners, infer, replicas, me_old, out, version):
    """The grown communicator: the refit plan, the joiners' catch-up while the trainers have
    moved on, then the refits after."""
    refit = reshard.Plan(grown, tensors(infer, replicas))
    me = Rank(refit, rank)
    me.rebind(refit, me_old)
    me.train(version + 1)  # the trainers keep training: newer than what the replicas hold
    grown.barrier()
    a = grown.counters()
    t0 = time.monotonic()
    catch_up = refit.catch_up(joiners)
    out["catch_up_plan_s"] = time.monotonic() - t0
    t0 = time.monotonic()
    catch_up.execute(me.src, me.dst)
    out["catch_up_s"] = time.monotonic() - t0
    out["catch_up_moved"] = moved(a, grown.counters())  # its plan vote and execution
    out["catch_up_stats"] = {k: v for k, v in catch_up.stats().items()
                             if k in ("net_bytes", "min_net_bytes", "local_bytes")}
    out["catch_up_wrong"] = me.wrong(version - 1)  # the version the replicas hold
    out["shard_bytes"] = sum(x.nbytes for x in me.dst if x is not None)
    catch_up.close()
    timed_refits(grown, refit, me, version + 1, out, "after_s")
    refit.close()


def member(mode, rank, out, d):
    os.environ["WORLD_SIZE"] = "8"
    comm = reshard.Comm.from_env()
    plan = reshard.Plan(comm, tensors(range(4, 8), 2))
    me = Rank(plan, rank)
    me.train(1)
    me.run()  # warm-up: connections
    version = timed_refits(comm, plan, me, 2, out, "before_s")
    plan.close()
    holding = version - 1  # what the inference ranks hold now
    if mode == "replace":
        if rank == 7:  # preempted: no goodbye
            os.kill(os.getpid(), signal.SIGKILL)
        t0 = time.monotonic()
        try:
            comm.barrier()
        except reshard.ReshardError as e:
            out["heard"] = e.message[:160]
        out["heard_s"] = time.monotonic() - t0
        t0 = time.monotonic()
        survivors = comm.shrink([7])
        out["shrink_s"] = time.monotonic() - t0
        comm.close()
        joiners, infer, replicas = [7], range(4, 8), 2
    else:
        survivors = comm
        joiners, infer, replicas = [8, 9], range(4, 10), 3
    if rank == 0:
        with open(os.path.join(d, "id.tmp"), "wb") as f:
            f.write(survivors.grow_id(joiners))
        os.rename(os.path.join(d, "id.tmp"), os.path.join(d, "id"))
    t0 = time.monotonic()
    grown = survivors.grow(joiners)
    out["grow_s"] = time.monotonic() - t0
    survivors.close()
    on_grown(grown, rank, joiners, infer, replicas, me, out, holding + 1)
    grown.close()


def joiner(mode, rank, out, d):
    joiners = [7] if mode == "replace" else [8, 9]
    number = 7 if mode == "replace" else rank
    jid = wait_for(os.path.join(d, "id"))
    t0 = time.monotonic()
    grown = reshard.Comm.join(jid, number, joiners)
    out["join_s"] = time.monotonic() - t0
    out["as"] = number
    infer, replicas = (range(4, 8), 2) if mode == "replace" else (range(4, 10), 3)
    on_grown(grown, number, joiners, infer, replicas, None, out, 1 + REFITS + 1)
    grown.close()


def rank_main(mode):
    rank, d = int(os.environ["RANK"]), os.environ["ELASTIC_DIR"]
    out = {"rank": rank}
    if mode == "replace" and rank == 9:
        return
    if rank == 7 and mode == "replace":  # the process the kill takes: a child, so that the
        pid = os.fork()                   # launcher sees this rank end well
        if pid:
            os.waitpid(pid, 0)
            return
    try:
        (member if rank < 8 else joiner)(mode, rank, out, d)
    except Exception as e:  # reported in the table, and a failed status for the launcher
        out["error"] = "%s: %s" % (type(e).__name__, e)
    with open(os.path.join(d, "rank%d.json" % rank), "w") as f:
        json.dump(out, f)
    if "error" in out:
        print("rank %d: %s" % (rank, out["error"]), file=sys.stderr)
        sys.exit(1)


def ms(x):
    return "%.1f" % (x * 1e3)


def report(d, mode):
    got = {}
    for name in os.listdir(d):
        if name.startswith("rank") and name.endswith(".json"):
            with open(os.path.join(d, name)) as f:
                r = json.load(f)
            got[r["rank"]] = r
    bad = [r for r in got.values() if "error" in r]
    for r in bad:
        print("   rank %d failed: %s" % (r["rank"], r["error"]))
    joiners = [r for r in got.values() if r["rank"] >= 8]
    if bad or not joiners:
        return 2
    status = 0

    def slowest(key):  # per refit, the slowest rank; then the median refit
        runs = list(zip(*[r[key] for r in got.values() if key in r]))
        per = sorted(max(x) for x in runs)
        return per[len(per) // 2] if per else float("nan")

    print("   join: %s ms at the joiner%s (Comm.join), grow %s ms at rank 0"
          % (", ".join(ms(j["join_s"]) for j in joiners), "s" if len(joiners) > 1 else "",
             ms(got[0]["grow_s"])))
    if mode == "replace":
        print("   rank 7 killed: rank 0 heard in %s ms (%s), shrink %s ms"
              % (ms(got[0]["heard_s"]), got[0].get("heard", "no error?"),
                 ms(got[0]["shrink_s"])))
    st = got[0]["catch_up_stats"]
    cu = max(r["catch_up_s"] for r in got.values())
    print("   catch-up: %s ms (slowest rank), plan %s ms at rank 0; net_bytes %d, "
          "min_net_bytes %d, local_bytes %d" % (ms(cu), ms(got[0]["catch_up_plan_s"]),
                                                st["net_bytes"], st["min_net_bytes"],
                                                st["local_bytes"]))
    print("   bytes during the catch-up (plan vote and execution), from each rank's transport "
          "counters;\n   control: the bootstrap's collectives and the executor's control "
          "messages, sent + received")
    print("   %-8s %-8s %10s %10s %10s %10s %10s %10s" % ("rank", "role", "net_out", "local_out",
                                                         "net_in", "local_in", "control",
                                                         "shard"))
    for k in sorted(got):
        r, m = got[k], got[k]["catch_up_moved"]
        role = "trainer" if k < 4 else ("joiner" if k >= 8 else "replica")
        ctrl = m["boot_out"] + m["boot_in"] + m["ctrl_bytes_out"] + m["ctrl_bytes_in"]
        print("   %-8s %-8s %10d %10d %10d %10d %10d %10s"
              % (k if k < 8 else "%d as %d" % (k, r["as"]), role, m["net_out"], m["local_out"],
                 m["net_in"], m["local_in"], ctrl, r["shard_bytes"] if k >= 8 else ""))
    trainers_sent = sum(got[k]["catch_up_moved"]["net_out"] + got[k]["catch_up_moved"]["local_out"]
                        for k in range(4))
    received = [j["catch_up_moved"]["net_in"] + j["catch_up_moved"]["local_in"]
                for j in joiners]
    shard = [j["shard_bytes"] for j in joiners]
    wrong = sum(r.get("wrong", 0) + r.get("catch_up_wrong", 0) for r in got.values())
    before, after = slowest("before_s"), slowest("after_s")
    print("   refit (median of %d, slowest rank): before %s ms on 8 ranks, after %s ms on %d "
          "ranks" % (REFITS, ms(before), ms(after), 8 if mode == "replace" else 10))
    print("   wrong elements (every refit and the catch-up, every rank): %d" % wrong)

    def target(ok, text):
        nonlocal status
        print("%s  %s" % ("PASS" if ok else "FAIL", text))
        status = status or (0 if ok else 1)

    target(trainers_sent == 0, "the trainers sent %d bytes for the joiners (target 0)"
           % trainers_sent)
    target(received == shard, "the joiners received %s bytes, their shards %s"
           % (received, shard))
    target(st["net_bytes"] == st["min_net_bytes"], "catch-up net_bytes == min_net_bytes")
    if mode == "grow":
        one_copy = 4096 * 2048 * 4 + 2048 * 16 * 4
        target(st["net_bytes"] <= one_copy, "the new domain received %d bytes over the network,"
               " one copy of the weights is %d" % (st["net_bytes"], one_copy))
    target(wrong == 0, "every element exact")
    return status


if __name__ == "__main__":
    if sys.argv[1] == "report":
        sys.exit(report(sys.argv[2], sys.argv[3]))
    rank_main(sys.argv[1])
