/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Lifetimes of communicators and their plans (reshard.h, "Lifetimes"): a plan keeps its
 * communicator alive, a destroyed communicator's plans refuse to run, and a destroy from
 * another thread during an execution never frees what the execution uses.
 */
#include "plugin/comm/comm.h"
#include "plugin/reshard.h"
#include "test/plugin/ranks.h"
#include "test/plugin/side.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Rank 1 sends its 64x64 int32 shard to rank 0. */
#define SRC "shape=64x64 dtype=i32 ranks=1 place=R"
#define DST "shape=64x64 dtype=i32 ranks=0 place=R"

static void quiet(void)
{
    setenv("RESHARD_TIMEOUT", "20", 1);
    setenv("UCX_LOG_LEVEL", "error", 1);
}

TestSuite(lifetime, .init = quiet, .timeout = 120);

/* What a rank that destroyed its communicator itself reports: the status of the execution it
 * tried after that (run_ranks destroys the communicator of a rank that returns RESHARD_OK, so
 * these ranks never do), with RESHARD_ERR_INTERNAL for anything else that went wrong. */
static reshard_status_t after_destroy(reshard_plan_t *plan, const reshard_buffers_t *b)
{
    reshard_status_t st = reshard_plan_execute(plan, b);
    char why[256];
    snprintf(why, sizeof(why), "%s", reshard_last_error());
    if (st == RESHARD_OK || !strstr(why, "destroyed")) {
        fprintf(stderr, "execute after reshard_comm_destroy: %s: %s\n", reshard_strerror(st), why);
        return RESHARD_ERR_INTERNAL;
    }
    return st;
}

/* Both ranks destroy the communicator before the plan (the order the header used to forbid):
 * the plan's execution then fails, and destroying the plan closes the connections. */
static reshard_status_t destroy_comm_then_execute(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    struct side x;
    reshard_status_t st = side_open(&x, comm, rank, SRC, DST);
    if (st != RESHARD_OK)
        return st;
    st = reshard_plan_execute(x.plan, &x.b);
    if (st == RESHARD_OK && count_wrong(x.dst, rank, x.d))
        st = RESHARD_ERR_INTERNAL;
    if (st != RESHARD_OK) {
        side_close(&x);
        return st;
    }
    reshard_comm_destroy(comm); /* the plan still holds it */
    st = after_destroy(x.plan, &x.b);
    if (st != RESHARD_ERR_INTERNAL && reshard_plan_check_layouts(x.plan, &x.b) == RESHARD_OK)
        st = RESHARD_ERR_INTERNAL;
    side_close(&x); /* the last reference: the communicator's connections close here */
    return st;
}

Test(lifetime, a_plan_executed_after_its_communicator_was_destroyed_fails_cleanly)
{
    struct outcome *o = run_ranks(2, destroy_comm_then_execute);
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(o[r].status, RESHARD_ERR_INVALID_ARG, "rank %d: %s %s", r,
                     reshard_strerror(o[r].status), o[r].msg);
        cr_assert(strstr(o[r].msg, "communicator was destroyed"), "rank %d: %s", r, o[r].msg);
    }
}

/* ---- a destroy from another thread during an execution ---- */

enum victim { DESTROY_PLAN, DESTROY_COMM, DESTROY_BOTH };
static enum victim victim;

struct destroyer {
    reshard_comm_t *comm;
    reshard_plan_t *plan;
};

/* Waits until the execution holds the communicator (the busy flag every execution takes:
 * from here it is inside exec_run), then destroys what the test names. */
static void *destroy_during(void *arg)
{
    struct destroyer *d = arg;
    while (!atomic_load(&d->comm->busy))
        usleep(1000);
    usleep(100 * 1000);
    if (victim != DESTROY_COMM)
        reshard_plan_destroy(d->plan);
    if (victim != DESTROY_PLAN)
        reshard_comm_destroy(d->comm);
    return NULL;
}

/* Rank 0 receives; rank 1 joins the execution a second late, so rank 0's waits for it (in the
 * plan-hash exchange) while another thread of rank 0 destroys the plan, the communicator or
 * both. The execution must still complete with every element in place. */
static reshard_status_t destroy_while_executing(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    struct side x;
    reshard_status_t st = side_open(&x, comm, rank, SRC, DST);
    if (st != RESHARD_OK)
        return st;
    if (rank == 1) {
        usleep(1000 * 1000);
        st = reshard_plan_execute(x.plan, &x.b);
        side_close(&x);
        return st; /* run_ranks destroys its communicator */
    }
    struct destroyer d = {comm, x.plan};
    pthread_t th;
    pthread_create(&th, NULL, destroy_during, &d);
    st = reshard_plan_execute(x.plan, &x.b);
    pthread_join(th, NULL);
    if (st == RESHARD_OK && count_wrong(x.dst, rank, x.d)) {
        fprintf(stderr, "rank 0: %d elements wrong\n", count_wrong(x.dst, rank, x.d));
        st = RESHARD_ERR_INTERNAL;
    }
    if (st != RESHARD_OK) {
        fprintf(stderr, "rank 0: %s: %s\n", reshard_strerror(st), reshard_last_error());
        return RESHARD_ERR_INTERNAL;
    }
    if (victim == DESTROY_COMM)
        st = after_destroy(x.plan, &x.b); /* the plan is alive, its communicator is not */
    x.plan = victim == DESTROY_COMM ? x.plan : NULL; /* destroyed by the other thread */
    side_close(&x);
    /* Only a rank whose communicator is still its own may return OK (run_ranks then destroys
     * it): one whose communicator went reports RESHARD_ERR_INVALID_ARG, the refusal it saw
     * (DESTROY_COMM) or stands for (DESTROY_BOTH: nothing is left to ask). */
    return victim == DESTROY_PLAN ? st : st == RESHARD_OK ? RESHARD_ERR_INVALID_ARG : st;
}

static void all_done(const struct outcome *o, reshard_status_t rank0)
{
    cr_assert_eq(o[0].status, rank0, "rank 0: %s %s", reshard_strerror(o[0].status), o[0].msg);
    cr_assert_eq(o[1].status, RESHARD_OK, "rank 1: %s %s", reshard_strerror(o[1].status), o[1].msg);
}

Test(lifetime, destroying_the_plan_from_another_thread_during_its_execution_lets_it_finish)
{
    victim = DESTROY_PLAN;
    all_done(run_ranks(2, destroy_while_executing), RESHARD_OK);
}

Test(lifetime, destroying_the_communicator_from_another_thread_during_an_execution_lets_it_finish)
{
    victim = DESTROY_COMM;
    struct outcome *o = run_ranks(2, destroy_while_executing);
    all_done(o, RESHARD_ERR_INVALID_ARG);
    cr_assert(strstr(o[0].msg, "communicator was destroyed"), "rank 0: %s", o[0].msg);
}

Test(lifetime, destroying_plan_and_communicator_during_an_execution_leaves_the_teardown_to_it)
{
    victim = DESTROY_BOTH;
    all_done(run_ranks(2, destroy_while_executing), RESHARD_ERR_INVALID_ARG);
}

/* ---- siblings ---- */

/* A manifest's plan owns copies of what it needs: the manifest may go first. */
static reshard_status_t manifest_goes_first(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    char path[] = "/tmp/reshard-lifetime-XXXXXX";
    int fd = mkstemp(path);
    const char *json = "{\"version\": 1, \"world_size\": 2, \"tensors\": [{\"name\": \"w\", "
                       "\"shape\": [64, 64], \"dtype\": \"i32\", \"src\": \"ranks=1 place=R\", "
                       "\"dst\": \"ranks=0 place=R\"}]}";
    if (fd < 0 || write(fd, json, strlen(json)) != (ssize_t)strlen(json))
        return RESHARD_ERR_INTERNAL;
    close(fd);
    reshard_manifest_t *m = NULL;
    reshard_status_t st = reshard_manifest_load(path, &m);
    unlink(path);
    if (st != RESHARD_OK)
        return st;
    reshard_plan_t *plan = NULL;
    st = reshard_comm_plan_create(comm, reshard_manifest_tensors(m), 1, NULL, &plan);
    reshard_manifest_destroy(m);
    if (st != RESHARD_OK)
        return st;
    reshard_layout_t *src = parse(SRC), *dst = parse(DST);
    int32_t *buf = calloc(64 * 64, sizeof(int32_t));
    if (rank == 1)
        fill(src, rank, buf);
    reshard_buffers_t b = {rank == 1 ? buf : NULL, rank == 1 ? 64 * 64 * 4 : 0,
                           rank == 0 ? buf : NULL, rank == 0 ? 64 * 64 * 4 : 0, RESHARD_MEM_HOST};
    st = reshard_plan_execute(plan, &b);
    if (st == RESHARD_OK && strcmp(reshard_plan_tensor_name(plan, 0), "w") != 0)
        st = RESHARD_ERR_INTERNAL;
    if (st == RESHARD_OK && rank == 0 && count_wrong(dst, rank, buf))
        st = RESHARD_ERR_INTERNAL;
    reshard_plan_destroy(plan);
    free(buf);
    reshard_layout_destroy(src);
    reshard_layout_destroy(dst);
    return st;
}

Test(lifetime, a_plan_outlives_the_manifest_it_was_made_from)
{
    all_ok(run_ranks(2, manifest_goes_first), 2);
}

/* Ranks 0 and 1 shrink rank 2 away, then destroy the old communicator while a plan made on it
 * lives: that plan refuses to run, the new communicator works, and the old one's connections
 * close (a barrier with rank 2, which destroys its own) when the plan goes. */
static reshard_status_t old_plan_after_shrink(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    struct side x;
    reshard_status_t st = side_open(&x, comm, rank, SRC, DST);
    if (st != RESHARD_OK)
        return st;
    if (rank == 2) {
        side_close(&x);
        return RESHARD_OK; /* run_ranks destroys its communicator: the old one's barrier */
    }
    int gone = 2;
    reshard_comm_t *small = NULL;
    if ((st = reshard_comm_shrink(comm, &gone, 1, &small)) != RESHARD_OK) {
        side_close(&x);
        return st == RESHARD_ERR_INVALID_ARG ? RESHARD_ERR_INTERNAL : st;
    }
    reshard_comm_destroy(comm);
    st = after_destroy(x.plan, &x.b);
    side_close(&x);
    if (reshard_comm_barrier(small) != RESHARD_OK)
        st = RESHARD_ERR_INTERNAL;
    reshard_comm_destroy(small);
    return st;
}

Test(lifetime, a_plan_on_a_communicator_destroyed_after_a_shrink_fails_cleanly)
{
    struct outcome *o = run_ranks(3, old_plan_after_shrink);
    for (int r = 0; r < 2; r++)
        cr_assert_eq(o[r].status, RESHARD_ERR_INVALID_ARG, "rank %d: %s %s", r,
                     reshard_strerror(o[r].status), o[r].msg);
    cr_assert_eq(o[2].status, RESHARD_OK, "rank 2: %s", o[2].msg);
}

/* ---- handles passed again after their destroy ---- */

/* The live handles are looked up by address before anything of them is read: a destroyed
 * plan passed again is refused, and a second destroy does nothing. In a forked rank, so that
 * a read of freed memory (ASan exits with status 1) shows as a crash. */
static reshard_status_t destroy_plan_then_use(int rank, int size, reshard_comm_t *comm)
{
    (void)rank;
    (void)size;
    (void)comm; /* a plan of every rank, made without it */
    reshard_layout_t *s = parse("shape=8x8 dtype=f32 ranks=0-1 place=S(0)");
    reshard_layout_t *d = parse("shape=8x8 dtype=f32 ranks=0-1 place=S(1)");
    reshard_topo_t *topo = NULL;
    reshard_tensor_t t = {"w", s, d};
    reshard_plan_t *plan = NULL;
    reshard_plan_stats_t stats;
    reshard_status_t st = reshard_topo_create(2, 1, NULL, &topo);
    if (st == RESHARD_OK)
        st = reshard_plan_create(&t, 1, topo, NULL, &plan);
    if (st == RESHARD_OK)
        st = reshard_plan_stats(plan, &stats, NULL);
    reshard_topo_destroy(topo);
    reshard_layout_destroy(s);
    reshard_layout_destroy(d);
    if (st != RESHARD_OK)
        return RESHARD_ERR_INTERNAL;
    reshard_plan_destroy(plan);
    reshard_buffers_t b = {0};
    if (reshard_plan_execute(plan, &b) != RESHARD_ERR_INVALID_ARG ||
        !strstr(reshard_last_error(), "not a live plan"))
        return RESHARD_ERR_INTERNAL;
    st = reshard_plan_stats(plan, &stats, NULL);
    reshard_plan_destroy(plan); /* again: nothing */
    return st;
}

Test(lifetime, a_destroyed_plan_passed_again_is_refused_not_read)
{
    struct outcome *o = run_ranks(1, destroy_plan_then_use);
    cr_assert_eq(o[0].status, RESHARD_ERR_INVALID_ARG, "%s %s", reshard_strerror(o[0].status),
                 o[0].msg);
    cr_assert(strstr(o[0].msg, "reshard_plan_stats: not a live plan"), "%s", o[0].msg);
}

static reshard_status_t destroy_then_use(int rank, int size, reshard_comm_t *comm)
{
    (void)rank;
    (void)size;
    reshard_comm_destroy(comm);
    reshard_status_t st = reshard_comm_barrier(comm);
    char why[256];
    snprintf(why, sizeof(why), "%s", reshard_last_error());
    reshard_comm_counters_t n;
    if (st != RESHARD_ERR_INVALID_ARG || !strstr(why, "not a live communicator") ||
        reshard_comm_counters(comm, &n) != RESHARD_ERR_INVALID_ARG ||
        reshard_comm_abort(comm) != RESHARD_ERR_INVALID_ARG) {
        fprintf(stderr, "after reshard_comm_destroy: %s: %s\n", reshard_strerror(st), why);
        return RESHARD_ERR_INTERNAL;
    }
    reshard_comm_destroy(comm); /* again: nothing */
    return st;
}

Test(lifetime, a_destroyed_communicator_passed_again_is_refused_not_read)
{
    struct outcome *o = run_ranks(2, destroy_then_use);
    for (int r = 0; r < 2; r++)
        cr_assert_eq(o[r].status, RESHARD_ERR_INVALID_ARG, "rank %d: %s %s", r,
                     reshard_strerror(o[r].status), o[r].msg);
}
