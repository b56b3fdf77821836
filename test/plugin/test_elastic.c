/* SPDX-License-Identifier: Apache-2.0 */
/*
 * An elastic fleet, leaving: a rank that leaves on purpose (reshard_comm_leave) is heard by the
 * others at once, never through a timeout, its sockets are released, and the others shrink it
 * away and refit. (Joining: test_elastic_join.c.)
 */
#include "ranks.h"
#include "side.h"
#include "base/clock.h"
#include "base/error.h"
#include "base/param.h"
#include "plugin/comm/comm.h"
#include "plugin/reshard.h"
#include "transport/boot/boot_int.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

/* Replicated on all four ranks; wanted by ranks 1-2, which survive either leaver below. */
#define REP_SRC "shape=48x40 dtype=i32 ranks=0-3 mesh=4 place=R"
#define REP_DST "shape=48x40 dtype=i32 ranks=1-2 mesh=2 place=S(0)"
/* Far below RESHARD_TIMEOUT: hearing of a leave must not wait for it. */
#define HEARD_WITHIN_S 15.0

static void elastic_env(void)
{
    setenv("RESHARD_DOMAIN_SIZE", "2", 1);
    setenv("RESHARD_TIMEOUT", "40", 1);
    setenv("UCX_LOG_LEVEL", "error", 1);
}

TestSuite(elastic, .init = elastic_env, .timeout = 150);

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Sockets this process holds (links in /proc/self/fd to "socket:[...]"). */
static int count_sockets(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    struct dirent *e;
    char path[300], target[64];
    while (d && (e = readdir(d))) {
        snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
        ssize_t k = readlink(path, target, sizeof(target) - 1);
        if (k > 0) {
            target[k] = 0;
            n += !strncmp(target, "socket:", 7);
        }
    }
    if (d)
        closedir(d);
    return n;
}

static int sockets_before; /* in each forked rank, before its communicator was made */
static int leaver = 3;

static void note_sockets(int rank)
{
    (void)rank;
    sockets_before = count_sockets();
}

static reshard_status_t fail(reshard_status_t st, const char *what, int rank)
{
    fprintf(stderr, "elastic: rank %d: %s: %s\n", rank, what, reshard_last_error());
    return st != RESHARD_OK ? st : RESHARD_ERR_INTERNAL;
}

/* The leaver: leaves with a plan still alive (the plan can no longer run), and once the plan
 * is destroyed it holds no more sockets than before its communicator was made. */
static reshard_status_t leave_with_a_plan(int rank, reshard_comm_t *comm, struct side *x)
{
    reshard_status_t st = reshard_comm_leave(comm);
    if (st != RESHARD_OK)
        return fail(st, "leave", rank);
    if (reshard_plan_execute(x->plan, &x->b) == RESHARD_OK)
        return fail(RESHARD_OK, "a plan of a communicator it left still ran", rank);
    side_close(x);
    int now = count_sockets();
    if (now > sockets_before) {
        fprintf(stderr, "elastic: the leaver holds %d sockets, %d before\n", now, sockets_before);
        return RESHARD_ERR_INTERNAL;
    }
    return RESHARD_OK;
}

/* The others: the barrier the leaver never joins fails at once saying who left; they shrink
 * it away and refit from the replicas that stay. */
static reshard_status_t hear_and_shrink(int rank, reshard_comm_t *comm, struct side *x)
{
    double t0 = now_s();
    reshard_status_t st = reshard_comm_barrier(comm);
    double took = now_s() - t0;
    char want[64];
    snprintf(want, sizeof(want), "rank %d left the communicator", leaver);
    if (st != RESHARD_ERR_REMOTE || !strstr(reshard_last_error(), want))
        return fail(RESHARD_ERR_INTERNAL, "the barrier did not say who left", rank);
    if (took > HEARD_WITHIN_S) {
        fprintf(stderr, "elastic: rank %d heard of the leave after %.1f s\n", rank, took);
        return RESHARD_ERR_TIMEOUT;
    }
    int left = -2;
    if ((st = reshard_comm_left(comm, &left)) != RESHARD_OK || left != leaver) {
        fprintf(stderr, "elastic: rank %d: reshard_comm_left says %d\n", rank, left);
        return RESHARD_ERR_INTERNAL;
    }
    side_close(x);
    reshard_comm_t *nc = NULL;
    if ((st = reshard_comm_shrink(comm, &leaver, 1, &nc)) != RESHARD_OK)
        return fail(st, "shrink", rank);
    st = side_open(x, nc, rank, REP_SRC, REP_DST);
    if (st == RESHARD_OK)
        st = reshard_plan_execute(x->plan, &x->b);
    if (st == RESHARD_OK && count_wrong(x->dst, rank, x->d))
        st = RESHARD_ERR_INTERNAL;
    if (st != RESHARD_OK)
        fail(st, "refit after the shrink", rank);
    side_close(x);
    if (st == RESHARD_OK && reshard_comm_has_rank(nc, leaver))
        st = RESHARD_ERR_INTERNAL;
    if (st == RESHARD_OK)
        reshard_comm_destroy(nc);
    return st;
}

static reshard_status_t leave_and_shrink(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    struct side x;
    reshard_status_t st = side_open(&x, comm, rank, REP_SRC, REP_DST);
    if (st == RESHARD_OK)
        st = reshard_plan_execute(x.plan, &x.b); /* the connections are up */
    if (st != RESHARD_OK) {
        side_close(&x);
        return fail(st, "first refit", rank);
    }
    return rank == leaver ? leave_with_a_plan(rank, comm, &x) : hear_and_shrink(rank, comm, &x);
}

Test(elastic, a_rank_that_leaves_is_heard_at_once_and_the_others_shrink_and_refit)
{
    leaver = 3;
    rank_setup = note_sockets;
    struct outcome *o = run_ranks(4, leave_and_shrink);
    rank_setup = NULL;
    all_ok(o, 4);
}

/* Rank 0 is the bootstrap's root and the lowest member: the others still hear, and meet for
 * the shrink at rank 1's listener. */
Test(elastic, the_lowest_rank_can_leave_and_the_others_meet_at_the_next)
{
    leaver = 0;
    rank_setup = note_sockets;
    struct outcome *o = run_ranks(4, leave_and_shrink);
    rank_setup = NULL;
    all_ok(o, 4);
}

/* Ranks that are not in a collective learn of the leave by polling reshard_comm_left (each
 * poll passes the news on to the rank's tree neighbours), then shrink. */
static reshard_status_t poll_for_the_leaver(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    reshard_status_t st = reshard_comm_barrier(comm);
    if (st != RESHARD_OK)
        return fail(st, "barrier", rank);
    if (rank == 1)
        return reshard_comm_leave(comm);
    int left = -1;
    double t0 = now_s();
    while ((st = reshard_comm_left(comm, &left)) == RESHARD_OK && left < 0 &&
           now_s() - t0 < HEARD_WITHIN_S)
        usleep(10 * 1000);
    if (st != RESHARD_OK || left != 1) {
        fprintf(stderr, "elastic: rank %d: heard %d leave after %.1f s\n", rank, left,
                now_s() - t0);
        return st != RESHARD_OK ? st : RESHARD_ERR_TIMEOUT;
    }
    reshard_comm_t *nc = NULL;
    int one = 1;
    if ((st = reshard_comm_shrink(comm, &one, 1, &nc)) != RESHARD_OK)
        return fail(st, "shrink", rank);
    st = reshard_comm_barrier(nc);
    reshard_comm_destroy(nc);
    return st;
}

Test(elastic, idle_ranks_learn_of_a_leave_by_polling_and_shrink)
{
    all_ok(run_ranks(4, poll_for_the_leaver), 4);
}

/* Two leaves one after the other: `leavers[0]` leaves the first communicator, the others
 * shrink it away and refit; then `leavers[1]` leaves the shrunk one, and the others shrink
 * again. Neither leave may reach a communicator made after it: every refit and barrier on the
 * last one succeeds. Source replicated on all six ranks, destination on the four that stay. */
#define TWICE_SRC     "shape=4096x2048 dtype=i32 ranks=0-5 mesh=3x2 place=S(0),R"
#define TWICE_REFITS  4
#define TWICE_REPEATS 6
static int leavers[2];
static char twice_dst[96];

/* On c, which `gone` (or nobody: -1) has left: the barrier fails naming it, and the leaver is
 * shrunk away into *nc. */
static reshard_status_t hear_leave_and_shrink(int rank, reshard_comm_t *c, int gone,
                                              reshard_comm_t **nc)
{
    char want[64];
    snprintf(want, sizeof(want), "rank %d left the communicator", gone);
    reshard_status_t st = reshard_comm_barrier(c);
    if (st != RESHARD_ERR_REMOTE || !strstr(reshard_last_error(), want)) {
        fprintf(stderr, "elastic: rank %d: the barrier after rank %d left: %s: %s\n", rank, gone,
                rs_status_name(st), reshard_last_error());
        return RESHARD_ERR_INTERNAL;
    }
    int left = -2;
    if ((st = reshard_comm_left(c, &left)) != RESHARD_OK || left != gone) {
        fprintf(stderr, "elastic: rank %d: reshard_comm_left says %d, not %d\n", rank, left, gone);
        return RESHARD_ERR_INTERNAL;
    }
    if ((st = reshard_comm_shrink(c, &gone, 1, nc)) != RESHARD_OK)
        return fail(st, "shrink", rank);
    return RESHARD_OK;
}

/* n refits of the plan on c, every destination element exact; a barrier after each when
 * `barriers` (else a leave may follow a refit at once, as other ranks still finish it). */
static reshard_status_t refits_on(reshard_comm_t *c, int rank, int n, int barriers,
                                  const char *when)
{
    struct side x;
    reshard_status_t st = side_open(&x, c, rank, TWICE_SRC, twice_dst);
    for (int i = 0; i < n && st == RESHARD_OK; i++) {
        memset(x.d, 0, x.b.dst_bytes);
        if ((st = reshard_plan_execute(x.plan, &x.b)) == RESHARD_OK &&
            count_wrong(x.dst, rank, x.d))
            st = RESHARD_ERR_INTERNAL;
        if (st == RESHARD_OK && barriers)
            st = reshard_comm_barrier(c);
        if (st != RESHARD_OK)
            fprintf(stderr, "elastic: rank %d: %s, refit %d: %s: %s\n", rank, when, i,
                    rs_status_name(st), reshard_last_error());
    }
    side_close(&x);
    return st;
}

static reshard_status_t leave_twice(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    reshard_comm_t *c2 = NULL, *c3 = NULL;
    reshard_status_t st = refits_on(comm, rank, 1, 0, "before the leaves");
    if (st != RESHARD_OK)
        return st;
    if (rank == leavers[0])
        return reshard_comm_leave(comm);
    if ((st = hear_leave_and_shrink(rank, comm, leavers[0], &c2)) != RESHARD_OK)
        return st;
    if ((st = refits_on(c2, rank, TWICE_REFITS, 0, "after the first shrink")) != RESHARD_OK)
        return st;
    if (rank == leavers[1])
        return reshard_comm_leave(c2);
    if ((st = hear_leave_and_shrink(rank, c2, leavers[1], &c3)) != RESHARD_OK)
        return st;
    reshard_comm_destroy(c2); /* as an application would: the new one replaces it */
    if ((st = refits_on(c3, rank, TWICE_REFITS, 1, "after the second shrink")) == RESHARD_OK)
        reshard_comm_destroy(c3);
    return st;
}

/* Each order of two leavers (the root, an inner rank or a leaf of the trees), several times:
 * a failure here showed once in about five runs. */
Test(elastic, a_second_leave_after_a_shrink_never_fails_the_communicator_after_it, .timeout = 900)
{
    static const int pairs[][2] = {{5, 1}, {5, 3}, {3, 1}, {1, 4}, {4, 2}, {2, 5}};
    const int npairs = (int)(sizeof(pairs) / sizeof(pairs[0]));
    const char *env = getenv("RESHARD_TEST_REPEAT");
    int repeats = env ? atoi(env) : TWICE_REPEATS, failed = 0;
    char first[400] = "";
    for (int k = 0; k < repeats; k++) {
        leavers[0] = pairs[k % npairs][0];
        leavers[1] = pairs[k % npairs][1];
        char stay[32] = "";
        for (int r = 0, n = 0; r < 6; r++)
            if (r != leavers[0] && r != leavers[1])
                n += snprintf(stay + n, sizeof(stay) - (size_t)n, "%s%d", n ? "," : "", r);
        snprintf(twice_dst, sizeof(twice_dst),
                 "shape=4096x2048 dtype=i32 ranks=%s mesh=4 place=S(1)", stay);
        struct outcome *o = run_ranks(6, leave_twice);
        for (int r = 0; r < 6; r++) {
            if (o[r].status == RESHARD_OK)
                continue;
            if (!failed++)
                snprintf(first, sizeof(first), "run %d (rank %d, then %d left), rank %d: %s", k,
                         leavers[0], leavers[1], r, o[r].msg);
            fprintf(stderr, "elastic: run %d (rank %d, then %d left): rank %d failed: %s\n", k,
                    leavers[0], leavers[1], r, o[r].msg);
            break;
        }
    }
    fprintf(stderr, "elastic: two leaves in a row: %d of %d runs failed\n", failed, repeats);
    cr_assert_eq(failed, 0, "%d of %d runs failed; the first: %s", failed, repeats, first);
}

/* Destroying a communicator whose bootstrap failed (its barrier fails at once) leaves the
 * caller's last error alone: it still says who left. */
static reshard_status_t destroy_keeps_the_last_error(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    if (rank == 1)
        return reshard_comm_leave(comm);
    if (reshard_comm_barrier(comm) == RESHARD_OK)
        return fail(RESHARD_ERR_INTERNAL, "a barrier without rank 1 succeeded", rank);
    char before[256];
    snprintf(before, sizeof(before), "%s", reshard_last_error());
    reshard_comm_destroy(comm);
    if (strcmp(before, reshard_last_error())) {
        fprintf(stderr, "elastic: the last error was '%s', after the destroy '%s'\n", before,
                reshard_last_error());
        return RESHARD_ERR_INTERNAL;
    }
    return RESHARD_OK;
}

Test(elastic, destroying_a_comm_after_a_leave_keeps_the_last_error_naming_the_leaver)
{
    all_ok(run_ranks(2, destroy_keeps_the_last_error), 2);
}

/* Nothing to leave, nowhere to write: refused at once; a healthy communicator names nobody
 * and stays usable. */
static reshard_status_t leave_bad_args(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    int left = 7;
    if (reshard_comm_leave(NULL) != RESHARD_ERR_INVALID_ARG ||
        reshard_comm_left(NULL, &left) != RESHARD_ERR_INVALID_ARG ||
        reshard_comm_left(comm, NULL) != RESHARD_ERR_INVALID_ARG)
        return fail(RESHARD_ERR_INTERNAL, "bad arguments were taken", rank);
    reshard_status_t st = reshard_comm_left(comm, &left);
    if (st != RESHARD_OK || left != -1)
        return fail(RESHARD_ERR_INTERNAL, "a healthy communicator named a leaver", rank);
    return reshard_comm_barrier(comm);
}

Test(elastic, leave_refuses_bad_arguments_and_nobody_has_left_a_healthy_comm)
{
    all_ok(run_ranks(2, leave_bad_args), 2);
}
