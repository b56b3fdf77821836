/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What a growth costs and keeps (plugin/comm/comm_grow.c): rank 0's bytes in the grown
 * bootstrap's collectives do not grow with the members, the members keep what they concluded
 * about each other's local path (verdicts, pids, their tokens, their admissions) and verify
 * only the joiners, and the joiners verify everyone of their domain. Members and joiners are
 * processes forked here, past the size (numbers W..W+J-1).
 */
#include "plugin/comm/comm.h"
#include "plugin/comm/comm_int.h"
#include "plugin/comm/comm_local.h"
#include "plugin/reshard.h"
#include "base/param.h"
#include "transport/boot/boot_int.h"
#include "transport/cma.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define GROW_MAX  20
#define CALLS_MAX 16

struct rank_out {
    int status, done;
    char msg[256];
    uint64_t coll, push; /* rank 0: collectives of the grown bootstrap; of them, its push */
    int joiner_children;
    unsigned char old_verdict[GROW_MAX], new_verdict[GROW_MAX];
    pid_t old_pid[GROW_MAX], new_pid[GROW_MAX];
    int held[GROW_MAX]; /* the grown comm holds a handle on q's process */
    unsigned char token[GROW_MAX][COMM_LOCAL_TOKEN]; /* q's token in the grown comm's table */
    unsigned char own_old[COMM_LOCAL_TOKEN];         /* this member's token before the growth */
    int ncalls, calls_at_old_destroy;                /* PR_SET_PTRACER calls (fake Yama) */
    pid_t calls[CALLS_MAX];
};

struct shared {
    volatile int ready;
    reshard_unique_id_t jid;
    int fake_yama;
    struct rank_out r[GROW_MAX];
};

static struct shared *sh;
static int me;

static void grow_env(void)
{
    setenv("RESHARD_TIMEOUT", "40", 1);
    setenv("RESHARD_BOOT_FANOUT", "2", 1);
    setenv("RESHARD_DOMAIN_SIZE", "4", 1);
    setenv("UCX_LOG_LEVEL", "error", 1);
    rs_param_reload();
}

TestSuite(elastic_grow, .init = grow_env, .timeout = 240);

static int record_ptracer(pid_t pid)
{
    struct rank_out *o = &sh->r[me];
    if (o->ncalls < CALLS_MAX)
        o->calls[o->ncalls] = pid;
    o->ncalls++;
    return 0;
}

static void failed(const char *what)
{
    struct rank_out *o = &sh->r[me];
    o->status = 1;
    snprintf(o->msg, sizeof(o->msg), "%s: %s", what, reshard_last_error());
}

static uint64_t boot_total(const struct boot *b)
{
    uint64_t out = 0, in = 0;
    boot_bytes(b, &out, &in);
    return out + in;
}

/* What the grown comm g says about everyone, from rank me's side. */
static void record_grown(const struct reshard_comm *g)
{
    struct rank_out *o = &sh->r[me];
    for (int q = 0; q < g->size && q < GROW_MAX; q++) {
        o->new_verdict[q] = (unsigned char)comm_local_verdict(g, q);
        o->new_pid[q] = g->pid[q];
        o->held[q] = g->pidfd[q] >= 0;
        if (comm_has(g, q))
            memcpy(o->token[q], g->hellos + (size_t)q * g->hello_rec + 28, COMM_LOCAL_TOKEN);
    }
}

static void member(const reshard_unique_id_t *id, int w, const int *joiners, int j)
{
    struct rank_out *o = &sh->r[me];
    reshard_comm_t *c = NULL, *g = NULL;
    if (reshard_comm_init_rank(id, me, w, &c) != RESHARD_OK)
        return failed("init");
    for (int q = 0; q < w && q < GROW_MAX; q++) {
        o->old_verdict[q] = (unsigned char)comm_local_verdict(c, q);
        o->old_pid[q] = c->pid[q];
    }
    memcpy(o->own_old, c->hellos + (size_t)me * c->hello_rec + 28, COMM_LOCAL_TOKEN);
    if (me == 0) {
        if (reshard_comm_grow_id(c, joiners, j, &sh->jid) != RESHARD_OK)
            return failed("grow id");
        __sync_synchronize();
        sh->ready = 1;
    }
    if (reshard_comm_barrier(c) != RESHARD_OK)
        return failed("barrier before the growth");
    if (reshard_comm_grow(c, joiners, j, &g) != RESHARD_OK)
        return failed("grow");
    if (me == 0) {
        const struct boot *b = g->boot;
        o->coll = boot_total(b);
        for (int i = 0; i < b->nchildren; i++)
            o->joiner_children += b->nb[1 + i].rank >= b->members;
        /* Its push to each joiner child: the members' count and numbers and records. */
        o->push = (uint64_t)o->joiner_children *
                  (SOCK_FRAME_HDR_BYTES + 8 + (uint64_t)w * (4 + g->hello_rec));
    }
    record_grown(g);
    reshard_comm_destroy(c); /* first: the grown comm keeps what it took over */
    o->calls_at_old_destroy = o->ncalls;
    if (reshard_comm_barrier(g) != RESHARD_OK)
        return failed("barrier on the grown comm");
    reshard_comm_destroy(g);
}

static void joiner(int w, const int *joiners, int j)
{
    reshard_comm_t *g = NULL;
    while (!sh->ready)
        usleep(1000);
    usleep(300 * 1000); /* the members meet first, as a fleet's joiners usually come last */
    (void)w;
    if (reshard_comm_join(&sh->jid, me, joiners, j, &g) != RESHARD_OK)
        return failed("join");
    record_grown(g);
    if (reshard_comm_barrier(g) != RESHARD_OK)
        return failed("barrier on the grown comm");
    reshard_comm_destroy(g);
}

/* W members grow by J joiners (W..W+J-1); every rank's outcome in sh. */
static void run_growth(int w, int j, int fake_yama)
{
    sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(sh, MAP_FAILED);
    memset(sh, 0, sizeof(*sh));
    sh->fake_yama = fake_yama;
    int joiners[GROW_MAX];
    for (int i = 0; i < j; i++)
        joiners[i] = w + i;
    reshard_unique_id_t id;
    cr_assert_eq(reshard_get_unique_id(&id), RESHARD_OK, "%s", reshard_last_error());
    pid_t pid[GROW_MAX];
    for (int r = 0; r < w + j; r++) {
        if ((pid[r] = fork()) == 0) {
            me = r;
            if (fake_yama)
                cma_test_yama(1, record_ptracer);
            if (r < w)
                member(&id, w, joiners, j);
            else
                joiner(w, joiners, j);
            sh->r[r].done = 1;
            _exit(0);
        }
        cr_assert_gt(pid[r], 0);
    }
    for (int r = 0; r < w + j; r++) {
        int ws;
        waitpid(pid[r], &ws, 0);
        cr_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0 && sh->r[r].done, "rank %d crashed", r);
    }
    for (int r = 0; r < w + j; r++)
        cr_assert_eq(sh->r[r].status, 0, "rank %d: %s", r, sh->r[r].msg);
}

Test(elastic_grow, rank_0s_collective_bytes_in_a_growth_do_not_grow_with_the_members)
{
    /* Under fan-out 2 rank 0 has two children either way; what it pushes to a joiner among
     * them is the members' table (O(members) only while the members are at most the fan-out,
     * once the joiners take the slots after the members'), counted apart. */
    run_growth(4, 2, 0);
    uint64_t small = sh->r[0].coll - sh->r[0].push;
    int jc_small = sh->r[0].joiner_children;
    munmap(sh, sizeof(*sh));
    run_growth(16, 2, 0);
    uint64_t large = sh->r[0].coll - sh->r[0].push;
    fprintf(stderr,
            "elastic_grow: rank 0's collective bytes in a growth by 2: %llu at 4 members, %llu "
            "at 16 (without its push to %d and %d joiner children)\n",
            (unsigned long long)small, (unsigned long long)large, jc_small,
            sh->r[0].joiner_children);
    cr_assert_leq(large, small + 64, "%llu B at 16 members, %llu B at 4", (unsigned long long)large,
                  (unsigned long long)small);
    munmap(sh, sizeof(*sh));
}

Test(elastic_grow, members_keep_their_local_verdicts_and_tokens_and_verify_only_the_joiner)
{
    run_growth(3, 1, 0); /* one domain of four: ranks 0-2 and the joiner 3 */
    for (int r = 0; r < 4; r++)
        for (int q = 0; q < 4; q++) {
            if (q == r)
                continue;
            struct rank_out *o = &sh->r[r];
            cr_assert_eq(o->new_verdict[q], COMM_LOCAL_WRITABLE, "rank %d on rank %d: %s", r, q,
                         comm_local_verdict_name(o->new_verdict[q]));
            cr_assert_gt(o->new_pid[q], 0, "rank %d on rank %d", r, q);
            cr_assert(o->held[q], "rank %d holds no handle on rank %d's process", r, q);
            if (r < 3 && q < 3) /* a member about a member: what it concluded before */
                cr_assert_eq(o->new_pid[q], o->old_pid[q], "rank %d on rank %d", r, q);
            /* Everyone's table carries each member's token from before the growth, which
             * the member still proves (the joiner verified it). */
            if (q < 3)
                cr_assert_eq(memcmp(o->token[q], sh->r[q].own_old, COMM_LOCAL_TOKEN), 0,
                             "rank %d's table: rank %d's token changed", r, q);
        }
    for (int q = 0; q < 3; q++) /* the joiner wrote down the pids the members verified */
        cr_assert_eq(sh->r[3].new_pid[q], sh->r[q].old_pid[q], "the joiner on rank %d", q);
    munmap(sh, sizeof(*sh));
}

Test(elastic_grow, the_grown_comm_keeps_the_members_admissions_when_the_old_one_goes_first)
{
    /* Ranks 0-3 share a domain, the joiners 4-5 another: a member admits no joiner, so only
     * what it took over from the old comm keeps its members let in (Yama faked at 1). */
    run_growth(4, 2, 1);
    for (int r = 0; r < 4; r++) {
        struct rank_out *o = &sh->r[r];
        for (int i = 0; i < o->calls_at_old_destroy && i < CALLS_MAX; i++)
            cr_assert_neq(o->calls[i], 0,
                          "rank %d reset PR_SET_PTRACER (call %d) while the grown comm still "
                          "had its members writing it",
                          r, i);
        cr_assert_gt(o->ncalls, o->calls_at_old_destroy, "rank %d never reset it", r);
        cr_assert_eq(o->calls[o->ncalls - 1], 0, "rank %d's last call", r);
    }
    munmap(sh, sizeof(*sh));
}
