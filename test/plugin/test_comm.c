/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Communicators and execution across real processes (fork): data lands where the layouts say,
 * and every bad input or fault ends with a clear error on every rank, never a hang.
 */
#include "ranks.h"
#include "side.h"
#include "base/error.h"
#include "plugin/reshard.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#define SRC "shape=48x40 dtype=i32 ranks=0-3 mesh=2x2 place=S(0),R"
#define DST "shape=48x40 dtype=i32 ranks=0-3 mesh=4 place=S(1)"

/* A reshard with a replicated source, on a communicator of 4 ranks in 2 domains. */
static reshard_status_t move_and_check(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    struct side x;
    reshard_status_t st = side_open(&x, comm, rank, SRC, DST);
    for (int it = 0; it < 3 && st == RESHARD_OK; it++) {
        memset(x.d, 0, x.b.dst_bytes);
        st = reshard_plan_execute(x.plan, &x.b);
        if (st == RESHARD_OK && count_wrong(x.dst, rank, x.d))
            st = RESHARD_ERR_INTERNAL;
    }
    side_close(&x);
    return st;
}

static void set_domains(void)
{
    setenv("RESHARD_DOMAIN_SIZE", "2", 1);
    setenv("RESHARD_TIMEOUT", "5", 1);
    setenv("UCX_LOG_LEVEL", "error", 1);
}

TestSuite(comm, .init = set_domains, .timeout = 60);

Test(comm, forked_ranks_reshard_every_element_to_its_place)
{
    all_ok(run_ranks(4, move_and_check), 4);
}

static reshard_status_t layouts_by_rank(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    struct side x;
    reshard_status_t st = side_open(
        &x, comm, rank, SRC, rank == 2 ? "shape=48x40 dtype=i32 ranks=0-3 mesh=4 place=S(0)" : DST);
    side_close(&x);
    return st;
}

Test(comm, ranks_passing_different_layouts_all_fail_naming_the_odd_one)
{
    struct outcome *o = run_ranks(4, layouts_by_rank);
    for (int r = 0; r < 4; r++) {
        cr_assert_eq(o[r].status, RESHARD_ERR_PLAN_MISMATCH, "rank %d: %s", r, o[r].msg);
        cr_assert(strstr(o[r].msg, r == 2 ? "ranks 0, 1, 3" : "ranks 2 "), "rank %d: %s", r,
                  o[r].msg);
    }
}

static reshard_status_t short_buffer_on_rank1(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    struct side x;
    reshard_status_t st = side_open(&x, comm, rank, SRC, DST);
    if (rank == 1)
        x.b.dst_bytes -= 4;
    if (st == RESHARD_OK)
        st = reshard_plan_execute(x.plan, &x.b);
    side_close(&x);
    return st;
}

Test(comm, a_short_destination_buffer_fails_every_rank_before_bytes_move)
{
    struct outcome *o = run_ranks(4, short_buffer_on_rank1);
    for (int r = 0; r < 4; r++) {
        cr_assert_eq(o[r].status, RESHARD_ERR_BUFFER, "rank %d: %s", r, o[r].msg);
        cr_assert(strstr(o[r].msg, "rank 1: destination buffer of tensor w holds 1916 bytes, "
                                   "its shard needs 1920"),
                  "rank %d: %s", r, o[r].msg);
    }
}

/* Rank 2 declares its buffers device memory on a host without a CUDA driver: every rank is
 * told before bytes move, and the communicator stays usable (the same plan then runs on host
 * memory). */
static reshard_status_t device_memory_on_rank2(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    struct side x;
    reshard_status_t st = side_open(&x, comm, rank, SRC, DST);
    if (st == RESHARD_OK && rank == 2)
        x.b.mem = RESHARD_MEM_CUDA;
    if (st == RESHARD_OK)
        st = reshard_plan_execute(x.plan, &x.b);
    char why[256];
    snprintf(why, sizeof(why), "%s", reshard_last_error());
    x.b.mem = RESHARD_MEM_HOST;
    if (st == RESHARD_ERR_UNAVAILABLE &&
        (reshard_plan_execute(x.plan, &x.b) != RESHARD_OK || count_wrong(x.dst, rank, x.d)))
        st = RESHARD_ERR_INTERNAL;
    /* This rank returns a failure, so run_ranks will not destroy the communicator (a barrier):
     * it would exit at once, while a sender may still wait for its acknowledgement and then
     * see a rank gone ("closed the connection (did it die?)"). Leave together instead. */
    if (st == RESHARD_ERR_UNAVAILABLE && reshard_comm_barrier(comm) != RESHARD_OK)
        st = RESHARD_ERR_INTERNAL;
    side_close(&x);
    return st == RESHARD_ERR_UNAVAILABLE ? rs_error(st, "%s", why) : st; /* the first message */
}

Test(comm, device_memory_without_a_driver_is_refused_on_every_rank_before_bytes_move)
{
    setenv("RESHARD_CUDA_LIB", "libcuda-not-here.so.1", 1);
    struct outcome *o = run_ranks(4, device_memory_on_rank2);
    for (int r = 0; r < 4; r++) {
        cr_assert_eq(o[r].status, RESHARD_ERR_UNAVAILABLE, "rank %d: %s", r, o[r].msg);
        cr_assert(strstr(o[r].msg, r == 2 ? "rank 2: device buffers need the CUDA driver to be "
                                            "staged: cuda: no driver"
                                          : "rank 2 has device buffers and no CUDA driver to "
                                            "stage them with"),
                  "rank %d: %s", r, o[r].msg);
    }
}

/* Every buffer declared device memory, on the stand-in driver (whose device memory is the
 * host's): the native executor stages them through host copies and the data lands. */
static reshard_status_t staged_refit(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    struct side x;
    reshard_status_t st = side_open(&x, comm, rank, SRC, DST);
    x.b.mem = RESHARD_MEM_CUDA;
    for (int it = 0; it < 2 && st == RESHARD_OK; it++) {
        memset(x.d, 0, x.b.dst_bytes);
        st = reshard_plan_execute(x.plan, &x.b);
        if (st == RESHARD_OK && count_wrong(x.dst, rank, x.d))
            st = RESHARD_ERR_INTERNAL;
    }
    side_close(&x);
    return st;
}

Test(comm, device_buffers_are_staged_through_host_memory)
{
    char cuda[512];
    const char *b = getenv("RESHARD_BUILD");
    snprintf(cuda, sizeof(cuda), "%s/test/fake/libcuda.so.1", b && *b ? b : "build");
    cr_assert_eq(access(cuda, R_OK), 0, "build %s first", cuda);
    setenv("RESHARD_CUDA_LIB", cuda, 1);
    all_ok(run_ranks(4, staged_refit), 4);
}

struct second_call {
    reshard_plan_t *plan;
    const reshard_buffers_t *b;
    reshard_status_t st;
    char msg[256]; /* messages are per thread */
};

static void *execute_thread(void *arg)
{
    struct second_call *c = arg;
    c->st = reshard_plan_execute(c->plan, c->b);
    snprintf(c->msg, sizeof(c->msg), "%s", reshard_last_error());
    return NULL;
}

/* Rank 0 starts an execute that waits for rank 1 (which arrives late) and meanwhile calls
 * execute again on the same plan from another thread. */
static reshard_status_t second_execute(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    struct side x;
    reshard_status_t st = side_open(&x, comm, rank, SRC, DST);
    if (st == RESHARD_OK && rank == 0) {
        struct second_call first = {x.plan, &x.b, RESHARD_OK, ""};
        pthread_t th;
        pthread_create(&th, NULL, execute_thread, &first);
        usleep(300 * 1000); /* the first call now waits for rank 1 */
        st = reshard_plan_execute(x.plan, &x.b);
        pthread_join(th, NULL);
        if (st == RESHARD_ERR_BUSY && first.st != RESHARD_OK) {
            fprintf(stderr, "rank 0: the first execute failed: %s\n", first.msg);
            st = first.st; /* the first call must still succeed */
        }
    } else if (st == RESHARD_OK) {
        if (rank == 1)
            usleep(1000 * 1000);
        st = reshard_plan_execute(x.plan, &x.b);
    }
    if (st == RESHARD_OK && count_wrong(x.dst, rank, x.d))
        st = RESHARD_ERR_INTERNAL;
    side_close(&x);
    return st;
}

Test(comm, a_second_execute_on_a_running_plan_is_refused_and_the_first_completes)
{
    setenv("RESHARD_TIMEOUT", "30", 1); /* rank 1 is late on purpose: not a fault */
    struct outcome *o = run_ranks(4, second_execute);
    cr_assert_eq(o[0].status, RESHARD_ERR_BUSY, "rank 0: %s", o[0].msg);
    cr_assert(strstr(o[0].msg, "already executing"), "%s", o[0].msg);
    for (int r = 1; r < 4; r++)
        cr_assert_eq(o[r].status, RESHARD_OK, "rank %d: %s", r, o[r].msg);
}

static reshard_status_t rank3_skips_execute(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    struct side x;
    reshard_status_t st = side_open(&x, comm, rank, SRC, DST);
    if (st == RESHARD_OK && rank != 3) {
        st = reshard_plan_execute(x.plan, &x.b);
    } else if (st == RESHARD_OK) {
        sleep(4); /* longer than the others' timeout (2 s) */
        st = RESHARD_ERR_INTERNAL;
    }
    side_close(&x);
    return st;
}

Test(comm, a_rank_that_never_executes_times_out_the_others_naming_it)
{
    setenv("RESHARD_TIMEOUT", "2", 1);
    struct outcome *o = run_ranks(4, rank3_skips_execute);
    for (int r = 0; r < 3; r++) {
        cr_assert(o[r].status == RESHARD_ERR_TIMEOUT || o[r].status == RESHARD_ERR_REMOTE,
                  "rank %d: %d %s", r, o[r].status, o[r].msg);
        cr_assert(strstr(o[r].msg, "rank 3") || strstr(o[r].msg, "3"), "rank %d: %s", r, o[r].msg);
    }
}

Test(comm, execute_refuses_a_plan_made_without_a_communicator)
{
    reshard_layout_t *src = parse(SRC), *dst = parse(DST);
    reshard_topo_t *topo;
    cr_assert_eq(reshard_topo_create(4, 2, NULL, &topo), RESHARD_OK);
    reshard_tensor_t t = {"w", src, dst};
    reshard_plan_t *plan;
    cr_assert_eq(reshard_plan_create(&t, 1, topo, NULL, &plan), RESHARD_OK);
    reshard_buffers_t b = {0};
    cr_assert_eq(reshard_plan_execute(plan, &b), RESHARD_ERR_INVALID_ARG);
    cr_assert(strstr(reshard_last_error(), "reshard_comm_plan_create"));
    reshard_plan_destroy(plan);
    reshard_topo_destroy(topo);
    reshard_layout_destroy(src);
    reshard_layout_destroy(dst);
}

static void stop_self(int sig)
{
    (void)sig;
    raise(SIGSTOP);
}

/* Rank 1 stops (as a hung process would) while sending a large transfer cut into small
 * chunks (so it takes a while). Killing it instead
 * would test UCX 1.13's TCP transport, which asserts on a peer that dies mid-stream. */
static reshard_status_t rank1_stalls_mid_transfer(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    int from = 1, to = 0;
    char s_spec[64], d_spec[64];
    snprintf(s_spec, sizeof(s_spec), "shape=16384x4096 dtype=i32 ranks=%d place=R", from);
    snprintf(d_spec, sizeof(d_spec), "shape=16384x4096 dtype=i32 ranks=%d place=R", to);
    reshard_layout_t *src = parse(s_spec), *dst = parse(d_spec);
    reshard_tensor_t t = {"w", src, dst};
    reshard_plan_t *plan = NULL;
    reshard_status_t st = reshard_comm_plan_create(comm, &t, 1, NULL, &plan);
    size_t bytes = (size_t)16384 * 4096 * 4; /* 256 MiB in 4 KiB chunks: 0.6 s */
    char *buf = calloc(1, bytes);
    reshard_buffers_t b = {rank == 1 ? buf : NULL, rank == 1 ? bytes : 0, rank == 0 ? buf : NULL,
                           rank == 0 ? bytes : 0, RESHARD_MEM_HOST};
    if (st == RESHARD_OK && rank == 1) {
        struct itimerval soon = {.it_value = {.tv_usec = 150 * 1000}};
        signal(SIGALRM, stop_self);
        setitimer(ITIMER_REAL, &soon, NULL);
    }
    if (st == RESHARD_OK)
        st = reshard_plan_execute(plan, &b);
    if (st != RESHARD_OK && rank == 0) {
        /* The communicator refuses further use, and destroys without waiting for rank 1. */
        reshard_status_t again = reshard_plan_execute(plan, &b);
        if (again == RESHARD_OK || !strstr(reshard_last_error(), "must be destroyed"))
            st = RESHARD_ERR_INTERNAL;
        reshard_plan_destroy(plan); /* the message above also names the first failure */
        reshard_comm_destroy(comm);
        plan = NULL;
    }
    reshard_plan_destroy(plan);
    free(buf);
    reshard_layout_destroy(src);
    reshard_layout_destroy(dst);
    return st;
}

Test(comm, a_sender_hanging_mid_transfer_times_out_its_receiver_who_then_destroys)
{
    setenv("RESHARD_CHUNK_BYTES", "4096", 1);
    setenv("RESHARD_TIMEOUT", "2", 1);
    struct outcome *o = run_ranks_stalling(2, rank1_stalls_mid_transfer, 1);
    cr_assert_eq(o[0].status, RESHARD_ERR_TIMEOUT, "rank 0: %d %s", o[0].status, o[0].msg);
    cr_assert(strstr(o[0].msg, "from rank 1"), "rank 0: %s", o[0].msg);
}

/* ---- abort ---- */

static void *abort_soon(void *comm)
{
    usleep(150 * 1000);
    reshard_comm_abort(comm);
    return NULL;
}

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* 128 MiB a rank from ranks 2-3 to ranks 0-1 in 4 KiB chunks (about a second here); rank 0
 * aborts from another thread 150 ms in. Every rank must return within 3 s (the abort, then up to
 * 1 s draining requests in flight; more under ASan on a loaded host), and then refuse
 * further use. */
static reshard_status_t rank0_aborts(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    reshard_layout_t *src = parse("shape=16384x4096 dtype=i32 ranks=2-3 mesh=2 place=S(0)");
    reshard_layout_t *dst = parse("shape=16384x4096 dtype=i32 ranks=0-1 mesh=2 place=S(1)");
    reshard_tensor_t t = {"w", src, dst};
    reshard_plan_t *plan = NULL;
    reshard_status_t st = reshard_comm_plan_create(comm, &t, 1, NULL, &plan);
    size_t bytes = (size_t)16384 * 4096 * 4 / 2;
    char *buf = calloc(1, bytes);
    reshard_buffers_t b = {rank >= 2 ? buf : NULL, rank >= 2 ? bytes : 0, rank < 2 ? buf : NULL,
                           rank < 2 ? bytes : 0, RESHARD_MEM_HOST};
    pthread_t th;
    if (st == RESHARD_OK && rank == 0)
        pthread_create(&th, NULL, abort_soon, comm);
    int64_t t0 = mono_ms();
    if (st == RESHARD_OK)
        st = reshard_plan_execute(plan, &b);
    int64_t took = mono_ms() - t0;
    char why[256];
    snprintf(why, sizeof(why), "%s", reshard_last_error());
    if (rank == 0)
        pthread_join(th, NULL);
    if (st != RESHARD_OK && took > 3000) {
        fprintf(stderr, "rank %d returned after %lld ms: %s\n", rank, (long long)took, why);
        st = RESHARD_ERR_INTERNAL;
    }
    if (st != RESHARD_OK && st != RESHARD_ERR_INTERNAL &&
        (reshard_plan_execute(plan, &b) == RESHARD_OK ||
         !strstr(reshard_last_error(), "must be destroyed"))) {
        fprintf(stderr, "rank %d: usable after the abort: %s\n", rank, reshard_last_error());
        st = RESHARD_ERR_INTERNAL;
    }
    reshard_plan_destroy(plan);
    free(buf);
    reshard_layout_destroy(src);
    reshard_layout_destroy(dst);
    fprintf(stderr, "rank %d: %s after %lld ms: %s\n", rank, reshard_strerror(st), (long long)took,
            why);
    return st;
}

Test(comm, an_abort_from_another_thread_stops_every_rank)
{
    setenv("RESHARD_CHUNK_BYTES", "4096", 1);
    struct outcome *o = run_ranks(4, rank0_aborts);
    cr_assert_eq(o[0].status, RESHARD_ERR_ABORTED, "rank 0: %d %s", o[0].status, o[0].msg);
    for (int r = 1; r < 4; r++) /* the echoes of the abort name its cause */
        cr_assert(o[r].status == RESHARD_ERR_REMOTE &&
                      strstr(o[r].msg, "rank 0 failed (RESHARD_ERR_ABORTED)"),
                  "rank %d: %d %s", r, o[r].status, o[r].msg);
}

/* Rank 0 enters an execution the others join only a second later, so it waits in the
 * plan-hash exchange; its abort 150 ms in ends that wait at once, and the latecomers hear of
 * it in their next collective. */
static reshard_status_t abort_in_exchange(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    reshard_layout_t *src = parse("shape=64x64 dtype=i32 ranks=1 place=R");
    reshard_layout_t *dst = parse("shape=64x64 dtype=i32 ranks=2 place=R");
    reshard_tensor_t t = {"w", src, dst};
    reshard_plan_t *plan = NULL;
    reshard_status_t st = reshard_comm_plan_create(comm, &t, 1, NULL, &plan);
    int32_t buf[64 * 64] = {0};
    reshard_buffers_t b = {rank == 1 ? buf : NULL, rank == 1 ? sizeof(buf) : 0,
                           rank == 2 ? buf : NULL, rank == 2 ? sizeof(buf) : 0, RESHARD_MEM_HOST};
    int64_t t0 = mono_ms();
    if (st == RESHARD_OK && rank == 0) {
        pthread_t th;
        pthread_create(&th, NULL, abort_soon, comm);
        st = reshard_plan_execute(plan, &b);
        pthread_join(th, NULL);
    } else if (st == RESHARD_OK) {
        usleep(1000 * 1000);
        st = reshard_plan_execute(plan, &b);
    }
    int64_t took = mono_ms() - t0;
    fprintf(stderr, "rank %d: %s after %lld ms: %s\n", rank, reshard_strerror(st), (long long)took,
            reshard_last_error());
    if (rank == 0 && took > 1000)
        st = RESHARD_ERR_INTERNAL;
    reshard_plan_destroy(plan);
    reshard_layout_destroy(src);
    reshard_layout_destroy(dst);
    return st;
}

Test(comm, an_abort_ends_a_wait_in_the_plan_hash_exchange)
{
    struct outcome *o = run_ranks(3, abort_in_exchange);
    cr_assert_eq(o[0].status, RESHARD_ERR_ABORTED, "rank 0: %d %s", o[0].status, o[0].msg);
    for (int r = 1; r < 3; r++)
        cr_assert(o[r].status == RESHARD_ERR_REMOTE && strstr(o[r].msg, "rank 0 failed"),
                  "rank %d: %d %s", r, o[r].status, o[r].msg);
}

/* Without an execution in flight, the abort breaks the communicator on every rank at once:
 * their next call fails instead of waiting for rank 0. */
static reshard_status_t abort_idle(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    if (rank == 0)
        return reshard_comm_abort(comm) == RESHARD_OK ? reshard_comm_barrier(comm)
                                                      : RESHARD_ERR_INTERNAL;
    return reshard_comm_barrier(comm);
}

Test(comm, an_idle_abort_fails_the_next_call_everywhere)
{
    struct outcome *o = run_ranks(3, abort_idle);
    cr_assert_eq(o[0].status, RESHARD_ERR_ABORTED, "rank 0: %d %s", o[0].status, o[0].msg);
    for (int r = 1; r < 3; r++)
        cr_assert(o[r].status == RESHARD_ERR_REMOTE && strstr(o[r].msg, "rank 0"), "rank %d: %d %s",
                  r, o[r].status, o[r].msg);
}

/* ---- the refit outcome ---- */

/* Three tensors: "big" (128 MiB from rank 1 to rank 3, in 4 KiB chunks: a second or more),
 * "small" (32x32 from rank 0 to rank 3, over the network: its bytes show in rank 3's buffer
 * only as rank 3's own receive completes) and "own" (rank 0 to itself). */
#define BIG_SRC   "shape=8192x4096 dtype=i32 ranks=1 place=R"
#define BIG_DST   "shape=8192x4096 dtype=i32 ranks=3 place=R"
#define SMALL_SRC "shape=32x32 dtype=i32 ranks=0 place=R"
#define SMALL_DST "shape=32x32 dtype=i32 ranks=3 place=R"
#define OWN       "shape=32x32 dtype=i32 ranks=0 place=R"

static int outcome_mode; /* 0: rank 1 aborts mid-transfer; 1: rank 3's "small" buffer is short */
/* Rank 3's destination of "small", shared with rank 1 (made before the fork): rank 1 aborts
 * 100 ms after it sees "small" land there, while "big" is still on its way. */
static int32_t *small_at_rank3;

static void *abort_after_small(void *comm)
{
    for (int i = 0; i < 5000 && small_at_rank3[32 * 32 - 1] != 32 * 32 - 1; i++)
        usleep(1000);
    usleep(100 * 1000);
    reshard_comm_abort(comm);
    return NULL;
}

static int expect_states(int rank, const reshard_plan_t *plan, const reshard_tensor_state_t *want)
{
    reshard_tensor_state_t got[3] = {-1, -1, -1};
    if (reshard_plan_outcome(plan, got) != RESHARD_OK) {
        fprintf(stderr, "rank %d: outcome: %s\n", rank, reshard_last_error());
        return 0;
    }
    for (int t = 0; t < 3; t++)
        if (got[t] != want[t]) {
            fprintf(stderr, "rank %d: tensor %d is in state %d, expected %d\n", rank, t, got[t],
                    want[t]);
            return 0;
        }
    return 1;
}

static reshard_status_t outcome_ranks(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    const char *specs[3][2] = {{BIG_SRC, BIG_DST}, {SMALL_SRC, SMALL_DST}, {OWN, OWN}};
    const char *names[3] = {"big", "small", "own"};
    reshard_layout_t *l[3][2];
    reshard_tensor_t t[3];
    reshard_buffers_t b[3];
    for (int i = 0; i < 3; i++) {
        l[i][0] = parse(specs[i][0]);
        l[i][1] = parse(specs[i][1]);
        t[i] = (reshard_tensor_t){names[i], l[i][0], l[i][1]};
        size_t sb = 0, db = 0;
        reshard_layout_shard_bytes(l[i][0], rank, &sb);
        reshard_layout_shard_bytes(l[i][1], rank, &db);
        void *dst = i == 1 && rank == 3 ? small_at_rank3 : db ? calloc(1, db) : NULL;
        b[i] = (reshard_buffers_t){sb ? malloc(sb) : NULL, sb, dst, db, RESHARD_MEM_HOST};
        if (i > 0 && sb) /* the 32x32 tensors carry their pattern; "big" is zeros */
            fill(l[i][0], rank, (int32_t *)b[i].src);
        else if (sb)
            memset((void *)b[i].src, 0, sb);
    }
    reshard_plan_t *plan = NULL;
    reshard_status_t st = reshard_comm_plan_create(comm, t, 3, NULL, &plan);
    int ok = st == RESHARD_OK;
    reshard_tensor_state_t none[3];
    if (ok && (reshard_plan_outcome(plan, none) != RESHARD_ERR_INVALID_ARG ||
               !strstr(reshard_last_error(), "not been executed"))) {
        fprintf(stderr, "rank %d: an outcome before any execution: %s\n", rank,
                reshard_last_error());
        ok = 0;
    }
    if (outcome_mode == 1 && rank == 3)
        b[1].dst_bytes -= 4;
    pthread_t th;
    if (ok && outcome_mode == 0 && rank == 1)
        pthread_create(&th, NULL, abort_after_small, comm);
    if (ok)
        st = reshard_plan_execute(plan, b);
    char why[256];
    snprintf(why, sizeof(why), "%s", reshard_last_error());
    if (ok && outcome_mode == 0 && rank == 1)
        pthread_join(th, NULL);
    const reshard_tensor_state_t N = RESHARD_TENSOR_NONE, C = RESHARD_TENSOR_COMPLETE,
                                 U = RESHARD_TENSOR_UNTOUCHED, T = RESHARD_TENSOR_TORN;
    if (ok && outcome_mode == 0) {
        /* rank 3 has "small" whole (rank 1 waited for it) and "big" torn; rank 0 copied
         * "own" before the abort reached it */
        reshard_tensor_state_t want[4][3] = {{N, N, C}, {N, N, N}, {N, N, N}, {T, C, N}};
        ok = expect_states(rank, plan, want[rank]);
        if (ok && rank == 3 && count_wrong(l[1][1], 3, b[1].dst)) {
            fprintf(stderr, "rank 3: \"small\" is complete but wrong\n");
            ok = 0;
        }
    } else if (ok) {
        /* nothing moved: every destination is as it was; then a full run completes all */
        reshard_tensor_state_t want[4][3] = {{N, N, U}, {N, N, N}, {N, N, N}, {U, U, N}};
        reshard_tensor_state_t done[4][3] = {{N, N, C}, {N, N, N}, {N, N, N}, {C, C, N}};
        ok = st == RESHARD_ERR_BUFFER && expect_states(rank, plan, want[rank]);
        if (rank == 3)
            b[1].dst_bytes += 4;
        st = ok ? reshard_plan_execute(plan, b) : st;
        ok = ok && st == RESHARD_OK && expect_states(rank, plan, done[rank]);
        if (ok && rank == 3 && count_wrong(l[1][1], 3, b[1].dst))
            ok = 0;
    }
    reshard_plan_destroy(plan);
    for (int i = 0; i < 3; i++) {
        free((void *)b[i].src);
        if (b[i].dst != small_at_rank3)
            free(b[i].dst);
        reshard_layout_destroy(l[i][0]);
        reshard_layout_destroy(l[i][1]);
    }
    fprintf(stderr, "rank %d: %s: %s\n", rank, reshard_strerror(st), why);
    return ok ? st : RESHARD_ERR_INTERNAL;
}

Test(comm, after_an_abort_the_receiver_knows_which_tensors_are_whole)
{
    setenv("RESHARD_CHUNK_BYTES", "4096", 1);
    outcome_mode = 0;
    small_at_rank3 =
        mmap(NULL, 32 * 32 * 4, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert(small_at_rank3 != MAP_FAILED);
    struct outcome *o = run_ranks(4, outcome_ranks);
    cr_assert_eq(o[1].status, RESHARD_ERR_ABORTED, "rank 1: %d %s", o[1].status, o[1].msg);
    cr_assert_eq(o[3].status, RESHARD_ERR_REMOTE, "rank 3: %d %s", o[3].status, o[3].msg);
    cr_assert_eq(o[0].status, RESHARD_ERR_REMOTE, "rank 0 waits for rank 3's acknowledgement: %s",
                 o[0].msg);
    /* rank 2 exchanges nothing with the others: it may finish before the abort */
    cr_assert(o[2].status == RESHARD_OK || o[2].status == RESHARD_ERR_REMOTE, "rank 2: %d %s",
              o[2].status, o[2].msg);
}

Test(comm, a_failure_before_bytes_move_leaves_every_destination_untouched)
{
    outcome_mode = 1;
    small_at_rank3 =
        mmap(NULL, 32 * 32 * 4, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert(small_at_rank3 != MAP_FAILED);
    struct outcome *o = run_ranks(4, outcome_ranks);
    for (int r = 0; r < 4; r++)
        cr_assert_eq(o[r].status, RESHARD_OK, "rank %d: %d %s", r, o[r].status, o[r].msg);
}

/* ---- shrinking ---- */

#define REP_SRC "shape=48x40 dtype=i32 ranks=0-3 mesh=4 place=R"
#define REP_DST "shape=48x40 dtype=i32 ranks=0-1 mesh=2 place=S(0)"
#define XSRC    "shape=48x40 dtype=i32 ranks=0-1 mesh=2 place=S(0)" /* domain 0 */
#define XDST    "shape=48x40 dtype=i32 ranks=2-3 mesh=2 place=S(1)" /* to domain 1 */

/* One refit of a replicated tensor on c, checked. */
static reshard_status_t refit_on(reshard_comm_t *c, int rank, const char *src, const char *dst)
{
    struct side x;
    reshard_status_t st = side_open(&x, c, rank, src, dst);
    if (st == RESHARD_OK)
        st = reshard_plan_execute(x.plan, &x.b);
    if (st == RESHARD_OK && count_wrong(x.dst, rank, x.d))
        st = RESHARD_ERR_INTERNAL;
    side_close(&x);
    return st;
}

/* Four healthy ranks: 0-2 shrink rank 3 away and refit, then 0-1 shrink rank 2 away (meeting
 * at the first shrink's spare listeners) and refit again. Every communicator is destroyed by
 * its members (a barrier), so rank 3 and then rank 2 wait there for the others. */
static reshard_status_t shrink_twice(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    if (rank == 3)
        return RESHARD_OK;
    reshard_comm_t *c1 = NULL, *c2 = NULL;
    int three = 3, two = 2;
    reshard_status_t st = reshard_comm_shrink(comm, &three, 1, &c1);
    if (st == RESHARD_OK)
        st = refit_on(c1, rank, REP_SRC, REP_DST);
    if (st == RESHARD_OK && reshard_comm_has_rank(c1, 3))
        st = RESHARD_ERR_INTERNAL;
    if (st == RESHARD_OK && rank < 2) {
        st = reshard_comm_shrink(c1, &two, 1, &c2);
        if (st == RESHARD_OK)
            st = refit_on(c2, rank, REP_SRC, REP_DST);
        if (st == RESHARD_OK && (reshard_comm_has_rank(c2, 2) || reshard_comm_size(c2) != 4))
            st = RESHARD_ERR_INTERNAL;
    }
    if (st == RESHARD_OK) {
        reshard_comm_destroy(c2);
        reshard_comm_destroy(c1);
    }
    return st;
}

Test(comm, healthy_ranks_shrink_twice_and_refit_each_time)
{
    all_ok(run_ranks(4, shrink_twice), 4);
}

/* A shrink that excludes nobody: a second communicator (and network context) in the same
 * processes, next to the first, both moving data across domains. */
static reshard_status_t shrink_nobody(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    reshard_comm_t *c1 = NULL;
    reshard_status_t st = refit_on(comm, rank, XSRC, XDST);
    if (st == RESHARD_OK)
        st = reshard_comm_shrink(comm, NULL, 0, &c1);
    if (st == RESHARD_OK)
        st = refit_on(c1, rank, XSRC, XDST);
    if (st == RESHARD_OK)
        st = refit_on(comm, rank, XSRC, XDST);
    if (st == RESHARD_OK)
        reshard_comm_destroy(c1);
    return st;
}

Test(comm, a_shrink_of_nobody_is_a_second_working_communicator)
{
    all_ok(run_ranks(4, shrink_nobody), 4);
}

static reshard_status_t shrink_bad_args(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    reshard_comm_t *nc = NULL;
    int self = rank, out = 7;
    if (reshard_comm_shrink(comm, &self, 1, &nc) != RESHARD_ERR_INVALID_ARG ||
        !strstr(reshard_last_error(), "excludes itself"))
        return RESHARD_ERR_INTERNAL;
    if (reshard_comm_shrink(comm, &out, 1, &nc) != RESHARD_ERR_INVALID_ARG ||
        !strstr(reshard_last_error(), "outside the communicator"))
        return RESHARD_ERR_INTERNAL;
    if (reshard_comm_shrink(comm, NULL, 1, &nc) != RESHARD_ERR_INVALID_ARG ||
        reshard_comm_shrink(comm, &out, -1, &nc) != RESHARD_ERR_INVALID_ARG ||
        reshard_comm_shrink(NULL, &out, 0, &nc) != RESHARD_ERR_INVALID_ARG || nc)
        return RESHARD_ERR_INTERNAL;
    return reshard_comm_barrier(comm); /* still usable */
}

Test(comm, shrink_refuses_bad_exclude_lists_at_once)
{
    struct outcome *o = run_ranks(2, shrink_bad_args);
    for (int r = 0; r < 2; r++)
        cr_assert_eq(o[r].status, RESHARD_OK, "rank %d: %d %s", r, o[r].status, o[r].msg);
}

/* Rank 0 thinks rank 2 left; ranks 1 and 2 think nobody did: they derive another secret, so
 * rank 0 refuses them and times out naming rank 1, instead of forming a wrong group. */
static reshard_status_t shrink_disagree(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    reshard_comm_t *nc = NULL;
    int two = 2;
    reshard_status_t st = reshard_comm_shrink(comm, &two, rank == 0, &nc);
    fprintf(stderr, "rank %d: %s: %s\n", rank, reshard_strerror(st), reshard_last_error());
    if (st == RESHARD_OK)
        reshard_comm_destroy(nc);
    return st;
}

Test(comm, ranks_that_disagree_on_who_left_do_not_form_a_group)
{
    setenv("RESHARD_TIMEOUT", "2", 1);
    struct outcome *o = run_ranks(3, shrink_disagree);
    cr_assert_eq(o[0].status, RESHARD_ERR_TIMEOUT, "rank 0: %d %s", o[0].status, o[0].msg);
    cr_assert(strstr(o[0].msg, "rank 1 of 2 did not arrive"), "rank 0: %s", o[0].msg);
    for (int r = 1; r < 3; r++)
        cr_assert(o[r].status == RESHARD_ERR_REFUSED || o[r].status == RESHARD_ERR_REMOTE ||
                      o[r].status == RESHARD_ERR_TIMEOUT,
                  "rank %d: %d %s", r, o[r].status, o[r].msg);
}

/* ---- coalescing: many small tensors travel as a few packed messages per peer ---- */

#define NSMALL 200

/* Moves NSMALL small tensors from ranks 0-1 (rows) to ranks 2-3 (columns), checks every one,
 * and reports the data messages this rank sent in the status: RESHARD_OK when they are at
 * most `limit`, else RESHARD_ERR_TOO_LARGE (a source rank has 2 peers and NSMALL x 2 chunks). */
static reshard_status_t small_tensors(int rank, uint64_t min_msgs, uint64_t max_msgs,
                                      reshard_comm_t *comm)
{
    reshard_layout_t *src = parse("shape=8x8 dtype=i32 ranks=0-1 mesh=2 place=S(0)");
    reshard_layout_t *dst = parse("shape=8x8 dtype=i32 ranks=2-3 mesh=2 place=S(1)");
    reshard_tensor_t t[NSMALL];
    reshard_buffers_t b[NSMALL];
    static int32_t s[NSMALL][64], d[NSMALL][64];
    for (int i = 0; i < NSMALL; i++) {
        t[i] = (reshard_tensor_t){NULL, src, dst};
        b[i] = (reshard_buffers_t){0};
        reshard_layout_shard_bytes(src, rank, &b[i].src_bytes);
        reshard_layout_shard_bytes(dst, rank, &b[i].dst_bytes);
        fill(src, rank, s[i]);
        memset(d[i], 0, sizeof(d[i]));
        b[i].src = b[i].src_bytes ? s[i] : NULL;
        b[i].dst = b[i].dst_bytes ? d[i] : NULL;
    }
    reshard_plan_t *plan = NULL;
    reshard_comm_counters_t before, after;
    reshard_status_t st = reshard_comm_plan_create(comm, t, NSMALL, NULL, &plan);
    if (st == RESHARD_OK)
        st = reshard_comm_counters(comm, &before);
    if (st == RESHARD_OK)
        st = reshard_plan_execute(plan, b);
    for (int i = 0; st == RESHARD_OK && i < NSMALL; i++)
        if (count_wrong(dst, rank, d[i]))
            st = RESHARD_ERR_INTERNAL;
    if (st == RESHARD_OK)
        st = reshard_comm_counters(comm, &after);
    uint64_t msgs = after.net_msgs - before.net_msgs;
    if (st == RESHARD_OK && rank < 2 && (msgs < min_msgs || msgs > max_msgs))
        st = RESHARD_ERR_TOO_LARGE;
    /* The plan's count is the executor's (MISMATCH otherwise). */
    reshard_plan_stats_t ps;
    reshard_rank_stats_t rs[4];
    if (st == RESHARD_OK && reshard_plan_stats(plan, &ps, rs) == RESHARD_OK &&
        rs[rank].net_msgs != msgs)
        st = RESHARD_ERR_MISMATCH;
    reshard_plan_destroy(plan);
    reshard_layout_destroy(src);
    reshard_layout_destroy(dst);
    return st;
}

static reshard_status_t small_coalesced(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    return small_tensors(rank, 1, 2, comm); /* one packed message per peer */
}

static reshard_status_t small_one_by_one(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    return small_tensors(rank, 2 * NSMALL, 2 * NSMALL, comm);
}

Test(comm, many_small_tensors_travel_as_one_packed_message_per_peer)
{
    struct outcome *o = run_ranks(4, small_coalesced);
    for (int r = 0; r < 4; r++)
        cr_assert_eq(o[r].status, RESHARD_OK, "rank %d: %s (TOO_LARGE: more than 2 messages)", r,
                     o[r].msg);
}

Test(comm, without_coalescing_every_chunk_is_a_message)
{
    setenv("RESHARD_COALESCE_BYTES", "0", 1);
    struct outcome *o = run_ranks(4, small_one_by_one);
    for (int r = 0; r < 4; r++)
        cr_assert_eq(o[r].status, RESHARD_OK, "rank %d: %s (TOO_LARGE: not %d messages)", r,
                     o[r].msg, 2 * NSMALL);
}

/* Small and larger tensors mixed, cut into chunks of 4 KiB with pieces up to 1 KiB packed: the
 * plan's message count for every rank is the one the transport counted (MISMATCH otherwise),
 * and every element lands. */
#define NMIXED 120

static reshard_status_t mixed_sizes(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    reshard_layout_t *l[4] = {parse("shape=8x8 dtype=i32 ranks=0-1 place=S(0)"),
                              parse("shape=8x8 dtype=i32 ranks=2-3 place=S(1)"),
                              parse("shape=60x52 dtype=i32 ranks=0-1 place=S(0)"),
                              parse("shape=60x52 dtype=i32 ranks=3,2 place=S(1)")};
    reshard_tensor_t t[NMIXED];
    reshard_buffers_t b[NMIXED];
    static int32_t s[NMIXED][60 * 52], d[NMIXED][60 * 52];
    for (int i = 0; i < NMIXED; i++) {
        int big = i % 6 == 0;
        t[i] = (reshard_tensor_t){NULL, l[2 * big], l[2 * big + 1]};
        b[i] = (reshard_buffers_t){0};
        reshard_layout_shard_bytes(t[i].src, rank, &b[i].src_bytes);
        reshard_layout_shard_bytes(t[i].dst, rank, &b[i].dst_bytes);
        fill(t[i].src, rank, s[i]);
        memset(d[i], 0, sizeof(d[i]));
        b[i].src = b[i].src_bytes ? s[i] : NULL;
        b[i].dst = b[i].dst_bytes ? d[i] : NULL;
    }
    reshard_plan_t *plan = NULL;
    reshard_comm_counters_t before, after;
    reshard_plan_stats_t ps;
    reshard_rank_stats_t rs[4];
    reshard_status_t st = reshard_comm_plan_create(comm, t, NMIXED, NULL, &plan);
    if (st == RESHARD_OK)
        st = reshard_comm_counters(comm, &before);
    if (st == RESHARD_OK)
        st = reshard_plan_execute(plan, b);
    for (int i = 0; st == RESHARD_OK && i < NMIXED; i++)
        if (count_wrong(t[i].dst, rank, d[i]))
            st = RESHARD_ERR_INTERNAL;
    if (st == RESHARD_OK)
        st = reshard_comm_counters(comm, &after);
    if (st == RESHARD_OK)
        st = reshard_plan_stats(plan, &ps, rs);
    if (st == RESHARD_OK && rs[rank].net_msgs != after.net_msgs - before.net_msgs)
        st = RESHARD_ERR_MISMATCH;
    if (st == RESHARD_OK && rank < 2 && rs[rank].net_msgs < 3) /* packed and single ones */
        st = RESHARD_ERR_TOO_LARGE;
    reshard_plan_destroy(plan);
    for (int i = 0; i < 4; i++)
        reshard_layout_destroy(l[i]);
    return st;
}

Test(comm, the_plans_message_count_is_the_executors_for_mixed_sizes)
{
    setenv("RESHARD_CHUNK_BYTES", "4096", 1);
    setenv("RESHARD_COALESCE_BYTES", "1024", 1);
    struct outcome *o = run_ranks(4, mixed_sizes);
    for (int r = 0; r < 4; r++)
        cr_assert_eq(o[r].status, RESHARD_OK, "rank %d: %s (MISMATCH: plan and transport differ)",
                     r, o[r].msg);
}
