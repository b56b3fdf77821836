/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Fault injection across forked ranks (4 ranks, domains of 2, RESHARD_TIMEOUT=5): a source, a
 * destination and a fan-out forwarder are each killed (SIGKILL) before the plan-hash exchange
 * or mid-transfer, or frozen (SIGSTOP) mid-transfer. The kills mid-transfer run on the ib
 * transport only (scripts/rxe-test.sh): UCX 1.13's TCP transport asserts when a peer dies
 * mid-stream. Every survivor must return within RESHARD_TIMEOUT + 2 s plus four times what a
 * small plan took without a fault on ranks forked just before (the slowest rank's, measured in
 * the same run: under emulation, the soft-RoCE VM, or on a loaded host everything is slower,
 * the teardown after a fault too); a survivor that fails must name the victim; at least one
 * does. Each rank prints a "fault:" line (case, rank, status, time, bound,
 * message) for the table in the notes.
 */
#include "ranks.h"
#include "base/param.h"
#include "plugin/reshard.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define LIMIT_MS (5000 + 2000) /* RESHARD_TIMEOUT + 2 s, before the baseline's share */
#define BASE_X   4             /* times the slowest rank's baseline */

enum when { BEFORE_HASH, KILL_MID, STOP_MID };

/* 128 MiB to each destination rank in 4 KiB chunks: about a second here, so a timer 150 ms in
 * lands mid-transfer. Rank 0 is a bystander (and the bootstrap's root, which stays up). */
#define SRC_SPEC    "shape=16384x4096 dtype=i32 ranks=1 place=R"
#define DST_SHARDED "shape=16384x4096 dtype=i32 ranks=2-3 mesh=2 place=S(0)"
#define DST_FANOUT  "shape=16384x4096 dtype=i32 ranks=2-3 mesh=2 place=R"    /* 2 and 3 forward */
#define DST_ROOT    "shape=16384x4096 dtype=i32 ranks=0,2 mesh=2 place=S(0)" /* rank 0 busy too */

static struct {
    const char *name, *dst;
    int victim;
    enum when when;
    int64_t *baseline; /* [4], shared with the forked ranks: each one's fault-free run, ms */
} fault;

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void die(int sig)
{
    (void)sig;
    raise(fault.when == STOP_MID ? SIGSTOP : SIGKILL);
}

static reshard_status_t victim_or_survivor(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    reshard_layout_t *src = NULL, *dst = NULL;
    reshard_layout_parse(SRC_SPEC, 0, &src);
    reshard_layout_parse(fault.dst, 0, &dst);
    reshard_tensor_t t = {"w", src, dst};
    reshard_plan_t *plan = NULL;
    reshard_status_t st = reshard_comm_plan_create(comm, &t, 1, NULL, &plan);
    size_t sb = 0, db = 0;
    reshard_layout_shard_bytes(src, rank, &sb);
    reshard_layout_shard_bytes(dst, rank, &db);
    char *s = sb ? calloc(1, sb) : NULL, *d = db ? calloc(1, db) : NULL;
    reshard_buffers_t b = {s, sb, d, db, RESHARD_MEM_HOST};
    if (rank == fault.victim && fault.when == BEFORE_HASH)
        raise(SIGKILL);
    if (rank == fault.victim) {
        struct itimerval soon = {.it_value = {.tv_usec = 150 * 1000}};
        signal(SIGALRM, die);
        setitimer(ITIMER_REAL, &soon, NULL);
    }
    int64_t t0 = mono_ms();
    if (st == RESHARD_OK)
        st = reshard_plan_execute(plan, &b);
    int64_t took = mono_ms() - t0, base = -1;
    for (int r = 0; r < 4; r++)
        base = fault.baseline[r] > base ? fault.baseline[r] : base;
    int64_t limit = LIMIT_MS + (base > 0 ? BASE_X * base : 0);
    char why[512], victim[16];
    snprintf(why, sizeof(why), "%s", st == RESHARD_OK ? "" : reshard_last_error());
    snprintf(victim, sizeof(victim), "rank %d", fault.victim);
    fprintf(stderr,
            "fault: %s | rank %d | %s | %lld ms | bound %lld ms (slowest small fault-free run %lld "
            "ms) | %s\n",
            fault.name, rank, reshard_strerror(st), (long long)took, (long long)limit,
            (long long)base, why);
    if (took > limit)
        st = RESHARD_ERR_INTERNAL; /* too slow: the assertion below names it */
    else if (st != RESHARD_OK && !strstr(why, victim))
        st = RESHARD_ERR_PLAN_MISMATCH; /* failed without naming the victim */
    reshard_plan_destroy(plan);
    reshard_layout_destroy(src);
    reshard_layout_destroy(dst);
    free(s);
    free(d);
    return st;
}

static void reload_params(int rank)
{
    (void)rank;
    rs_param_reload(); /* the parent read the table already (reshard_get_unique_id) */
}

/* How slow this host is now: a small plan of the same shape (2 MiB from rank 1 to ranks 2
 * and 3) planned and run without a fault on ranks of their own, each one's time. What a
 * survivor does after a fault (noticing, telling the others, tearing down) is latency and
 * scheduling, not bandwidth: it scales with this, and the run stays short under emulation. */
#define BASE_SRC "shape=512x1024 dtype=i32 ranks=1 place=R"
#define BASE_DST "shape=512x1024 dtype=i32 ranks=2-3 mesh=2 place=S(0)"

static reshard_status_t fault_free(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    reshard_layout_t *src = NULL, *dst = NULL;
    int64_t t0 = mono_ms();
    reshard_layout_parse(BASE_SRC, 0, &src);
    reshard_layout_parse(BASE_DST, 0, &dst);
    reshard_tensor_t t = {"w", src, dst};
    reshard_plan_t *plan = NULL;
    reshard_status_t st = reshard_comm_plan_create(comm, &t, 1, NULL, &plan);
    size_t sb = 0, db = 0;
    reshard_layout_shard_bytes(src, rank, &sb);
    reshard_layout_shard_bytes(dst, rank, &db);
    char *s = sb ? calloc(1, sb) : NULL, *d = db ? calloc(1, db) : NULL;
    reshard_buffers_t b = {s, sb, d, db, RESHARD_MEM_HOST};
    if (st == RESHARD_OK)
        st = reshard_plan_execute(plan, &b);
    fault.baseline[rank] = mono_ms() - t0;
    reshard_plan_destroy(plan);
    reshard_layout_destroy(src);
    reshard_layout_destroy(dst);
    free(s);
    free(d);
    return st;
}

/* Domains of 2, RESHARD_TIMEOUT=5, UCX quiet and failing a dead peer's requests at once. */
static void fault_env(const char *chunk_bytes)
{
    setenv("RESHARD_DOMAIN_SIZE", "2", 1);
    setenv("RESHARD_TIMEOUT", "5", 1);
    setenv("RESHARD_CHUNK_BYTES", chunk_bytes, 1);
    setenv("UCX_LOG_LEVEL", "fatal", 1);
    setenv("RESHARD_NET_PEER_ERRORS", "1", 1);
}

static void inject(const char *name, const char *dst, int victim, enum when when)
{
    const char *tp = getenv("RESHARD_TRANSPORT");
    if (when == KILL_MID && !(tp && !strcmp(tp, "ib")))
        cr_skip_test("UCX 1.13's TCP transport aborts a survivor (tcp_iface.c:307 assertion) "
                     "now and then when a peer dies mid-stream; make test-rdma runs this on ib");
    fault.name = name;
    fault.dst = dst;
    fault.victim = victim;
    fault.when = when;
    fault.baseline =
        mmap(NULL, 4 * sizeof(int64_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(fault.baseline, MAP_FAILED);
    for (int r = 0; r < 4; r++)
        fault.baseline[r] = -1;
    fault_env("4096");
    setenv("RESHARD_TIMEOUT", "60", 1); /* the baseline must not fail on a loaded host */
    rank_setup = reload_params;
    all_ok(run_ranks(4, fault_free), 4);
    setenv("RESHARD_TIMEOUT", "5", 1);
    struct outcome *o = run_ranks_stalling(4, victim_or_survivor, victim);
    int named = 0;
    for (int r = 0; r < 4; r++) {
        if (r == victim)
            continue;
        cr_assert_neq(o[r].status, RESHARD_ERR_INTERNAL,
                      "%s: rank %d took longer than RESHARD_TIMEOUT + 2 s + 4 x the slowest "
                      "fault-free run (its \"fault:\" line has both)",
                      name, r);
        cr_assert_neq(o[r].status, RESHARD_ERR_PLAN_MISMATCH,
                      "%s: rank %d failed without naming rank %d: %s", name, r, victim, o[r].msg);
        named += o[r].status != RESHARD_OK;
    }
    cr_assert_gt(named, 0, "%s: no survivor noticed rank %d", name, victim);
}

TestSuite(faults, .timeout = 60);

Test(faults, source_killed_before_the_hash_exchange)
{
    inject("source killed before the hash exchange", DST_SHARDED, 1, BEFORE_HASH);
}

Test(faults, source_killed_mid_transfer)
{
    inject("source killed mid-transfer", DST_SHARDED, 1, KILL_MID);
}

Test(faults, source_frozen_mid_transfer)
{
    inject("source frozen mid-transfer", DST_SHARDED, 1, STOP_MID);
}

Test(faults, destination_killed_before_the_hash_exchange)
{
    inject("destination killed before the hash exchange", DST_SHARDED, 2, BEFORE_HASH);
}

Test(faults, destination_killed_mid_transfer)
{
    inject("destination killed mid-transfer", DST_SHARDED, 2, KILL_MID);
}

Test(faults, destination_frozen_mid_transfer)
{
    inject("destination frozen mid-transfer", DST_SHARDED, 2, STOP_MID);
}

Test(faults, forwarder_killed_before_the_hash_exchange)
{
    inject("forwarder killed before the hash exchange", DST_FANOUT, 2, BEFORE_HASH);
}

Test(faults, forwarder_killed_mid_fanout)
{
    inject("forwarder killed mid-fan-out", DST_FANOUT, 2, KILL_MID);
}

Test(faults, forwarder_frozen_mid_fanout)
{
    inject("forwarder frozen mid-fan-out", DST_FANOUT, 2, STOP_MID);
}

/* Rank 0, the bootstrap's root, is itself executing (not waiting in a collective): it sees the
 * dead rank's connection close while it executes, and tells the others. */
Test(faults, destination_killed_mid_transfer_while_the_root_executes)
{
    inject("destination killed mid-transfer, root executing", DST_ROOT, 2, KILL_MID);
}

/* ---- recovery: shrink the communicator and re-plan from the DP replicas ---- */

/* "w": 16 MiB held by ranks 0-3 as DP2 x TP2 (ranks 0 and 2 hold the first half of the rows,
 * 1 and 3 the second), wanted by ranks 4-5 as TP2 over columns. "solo" is held by the victim
 * alone. Domains of 2: {0,1} {2,3} {4,5}. */
#define W_SRC    "shape=4096x1024 dtype=i32 ranks=0-3 mesh=2x2 place=R,S(0)"
#define W_DST    "shape=4096x1024 dtype=i32 ranks=4-5 mesh=2 place=S(1)"
#define SOLO     "shape=64x64 dtype=i32 ranks=%d place=R"
#define SOLO_DST "shape=64x64 dtype=i32 ranks=4-5 mesh=2 place=S(0)"

static reshard_layout_t *layout(const char *spec)
{
    reshard_layout_t *l = NULL;
    if (reshard_layout_parse(spec, 0, &l) != RESHARD_OK) {
        fprintf(stderr, "%s: %s\n", spec, reshard_last_error());
        abort();
    }
    return l;
}

/* Writes (check 0) or counts the elements that differ from (check 1) each element's global
 * index, over a rank's 2-D int32 shard. */
static long pattern(const reshard_layout_t *l, int rank, int32_t *buf, int check)
{
    int64_t shape[8], numel = 0;
    reshard_layout_info_t info;
    reshard_layout_shard_shape(l, rank, shape, &numel);
    reshard_layout_info(l, &info);
    if (!numel)
        return 0;
    int64_t *rows = calloc((size_t)shape[0], sizeof(int64_t));
    int64_t *cols = calloc((size_t)shape[1], sizeof(int64_t));
    reshard_layout_shard_index(l, rank, 0, rows);
    reshard_layout_shard_index(l, rank, 1, cols);
    long wrong = 0;
    for (int64_t i = 0; i < shape[0]; i++)
        for (int64_t j = 0; j < shape[1]; j++) {
            int32_t v = (int32_t)(rows[i] * info.shape[1] + cols[j]);
            if (check)
                wrong += buf[i * shape[1] + j] != v;
            else
                buf[i * shape[1] + j] = v;
        }
    free(rows);
    free(cols);
    return wrong;
}

static int bad(int rank, const char *what)
{
    fprintf(stderr, "shrink: rank %d: %s: %s\n", rank, what, reshard_last_error());
    return 0;
}

/* After the victim died: shrink, re-plan, refit, check; then the plan that needs "solo" fails
 * naming it. Returns 1 when every check passed. */
static int recover(int rank, reshard_comm_t *comm, reshard_layout_t **w, reshard_buffers_t *b,
                   const reshard_rank_stats_t *before)
{
    int victim = fault.victim, ok = 1;
    reshard_comm_t *nc = NULL;
    reshard_plan_t *plan = NULL;
    /* The fault was judged under RESHARD_TIMEOUT=5; what follows has none, so it gets the
     * baseline's 60 s: on the soft-RoCE VM beside a second make test, the shrunk world's ib
     * connections once took longer than 5 s to form, and the recovery failed on a deadline. */
    setenv("RESHARD_TIMEOUT", "60", 1);
    rs_param_reload();
    if (reshard_comm_shrink(comm, &victim, 1, &nc) != RESHARD_OK)
        return bad(rank, "shrink");
    if (reshard_comm_size(nc) != 6 || reshard_comm_rank(nc) != rank ||
        reshard_comm_has_rank(nc, victim) || !reshard_comm_has_rank(nc, rank))
        ok = bad(rank, "the shrunk communicator's ranks");
    reshard_tensor_t t = {"w", w[0], w[1]};
    if (ok && reshard_comm_plan_create(nc, &t, 1, NULL, &plan) != RESHARD_OK)
        ok = bad(rank, "re-plan");
    /* the replica sends everything the two of them used to; the victim nothing */
    reshard_plan_stats_t ps;
    reshard_rank_stats_t after[6];
    int replica = victim ^ 2;
    /* a communicator plan gives this rank's own row: every rank's, gathered */
    if (ok && (reshard_plan_stats(plan, &ps, after) != RESHARD_OK ||
               reshard_comm_allgather(nc, after, sizeof(after[0])) != RESHARD_OK ||
               after[victim].net_out ||
               after[replica].net_out != before[victim].net_out + before[replica].net_out)) {
        fprintf(stderr, "rank %d: replica %d sends %llu, was %llu + %llu\n", rank, replica,
                (unsigned long long)after[replica].net_out,
                (unsigned long long)before[victim].net_out,
                (unsigned long long)before[replica].net_out);
        ok = bad(rank, "the re-plan's senders");
    }
    if (ok && reshard_plan_execute(plan, b) != RESHARD_OK)
        ok = bad(rank, "refit on the shrunk communicator");
    reshard_tensor_state_t state;
    if (ok && rank >= 4) {
        long wrong = pattern(w[1], rank, b->dst, 1);
        fprintf(stderr, "shrink: rank %d: #wrong %ld after the refit from the replicas\n", rank,
                wrong);
        if (wrong || reshard_plan_outcome(plan, &state) != RESHARD_OK ||
            state != RESHARD_TENSOR_COMPLETE)
            ok = bad(rank, "the refit's result");
    }
    reshard_plan_destroy(plan);
    plan = NULL;
    /* a tensor only the victim held cannot be refit: every rank is told which */
    char solo[128];
    snprintf(solo, sizeof(solo), SOLO, victim);
    reshard_layout_t *ss = layout(solo), *sd = layout(SOLO_DST);
    reshard_tensor_t two[2] = {t, {"solo", ss, sd}};
    char want[64];
    snprintf(want, sizeof(want), "'solo' (held by rank %d only)", victim);
    if (ok && (reshard_comm_plan_create(nc, two, 2, NULL, &plan) != RESHARD_ERR_DATA_LOST ||
               !strstr(reshard_last_error(), want)))
        ok = bad(rank, "a plan needing data only the victim held");
    reshard_plan_destroy(plan);
    reshard_layout_destroy(ss);
    reshard_layout_destroy(sd);
    reshard_comm_destroy(nc);
    return ok;
}

static reshard_status_t shrink_survivor(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    reshard_layout_t *w[2] = {layout(W_SRC), layout(W_DST)};
    reshard_tensor_t t = {"w", w[0], w[1]};
    reshard_plan_t *plan = NULL;
    reshard_status_t st = reshard_comm_plan_create(comm, &t, 1, NULL, &plan);
    reshard_rank_stats_t before[6];
    reshard_plan_stats_t ps;
    if (st == RESHARD_OK)
        st = reshard_plan_stats(plan, &ps, before);
    if (st == RESHARD_OK) /* every rank's own row */
        st = reshard_comm_allgather(comm, before, sizeof(before[0]));
    size_t sb = 0, db = 0;
    reshard_layout_shard_bytes(w[0], rank, &sb);
    reshard_layout_shard_bytes(w[1], rank, &db);
    reshard_buffers_t b = {sb ? malloc(sb) : NULL, sb, db ? calloc(1, db) : NULL, db,
                           RESHARD_MEM_HOST};
    pattern(w[0], rank, (int32_t *)b.src, 0);
    if (rank == fault.victim && fault.when == BEFORE_HASH)
        raise(SIGKILL);
    if (rank == fault.victim) {
        struct itimerval soon = {.it_value = {.tv_usec = 150 * 1000}};
        signal(SIGALRM, die);
        setitimer(ITIMER_REAL, &soon, NULL);
    }
    int64_t t0 = mono_ms();
    if (st == RESHARD_OK)
        st = reshard_plan_execute(plan, &b);
    char why[512], victim[16];
    snprintf(why, sizeof(why), "%s", st == RESHARD_OK ? "" : reshard_last_error());
    snprintf(victim, sizeof(victim), "rank %d", fault.victim);
    fprintf(stderr, "fault: %s | rank %d | %s | %lld ms | %s\n", fault.name, rank,
            reshard_strerror(st), (long long)(mono_ms() - t0), why);
    if (st == RESHARD_OK || !strstr(why, victim))
        st = RESHARD_ERR_PLAN_MISMATCH; /* the failure must name the victim */
    else
        st = recover(rank, comm, w, &b, before) ? RESHARD_OK : RESHARD_ERR_INTERNAL;
    reshard_plan_destroy(plan);
    reshard_layout_destroy(w[0]);
    reshard_layout_destroy(w[1]);
    free((void *)b.src);
    free(b.dst);
    return st;
}

static void shrink_after(const char *name, int victim, enum when when)
{
    const char *tp = getenv("RESHARD_TRANSPORT");
    if (when == KILL_MID && !(tp && !strcmp(tp, "ib")))
        cr_skip_test("UCX 1.13's TCP transport aborts a survivor (tcp_iface.c:307 assertion) "
                     "now and then when a peer dies mid-stream; make test-rdma runs this on ib");
    fault.name = name;
    fault.victim = victim;
    fault.when = when;
    /* 256 chunks: on ib each strided receive registers a bounce buffer of its own, and
     * thousands of them keep a TCG-emulated rank from answering within the timeout */
    fault_env("65536");
    struct outcome *o = run_ranks_stalling(6, shrink_survivor, victim);
    for (int r = 0; r < 6; r++) {
        if (r == victim)
            continue;
        cr_assert_neq(o[r].status, RESHARD_ERR_PLAN_MISMATCH,
                      "%s: rank %d did not fail naming rank %d first: %s", name, r, victim,
                      o[r].msg);
        cr_assert_eq(o[r].status, RESHARD_OK, "%s: rank %d: recovery failed: %s", name, r,
                     o[r].msg);
    }
}

/* Rank 0 is also the bootstrap's root: the survivors meet again at rank 1's spare listener. */
Test(faults, a_dead_source_with_a_replica_is_shrunk_away_and_the_refit_completes)
{
    shrink_after("source (and root) killed, then shrink", 0, BEFORE_HASH);
}

Test(faults, a_source_killed_mid_transfer_is_shrunk_away_and_the_refit_completes)
{
    shrink_after("source killed mid-transfer, then shrink", 1, KILL_MID);
}
