/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Ranks join a live communicator (reshard_comm_grow / reshard_comm_join) as a replacement or
 * past the size; the members keep their connections; bad joiner lists, outsiders, joiners
 * that refuse themselves and joiners of another version are refused on every member, and a
 * member dying during a growth fails the others naming it. (Leaving: test_elastic.c.)
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

/* Far below RESHARD_TIMEOUT: members must hear a refusal at once, not through it. */
#define HEARD_WITHIN_S 15.0

static void join_env(void)
{
    setenv("RESHARD_DOMAIN_SIZE", "2", 1);
    setenv("RESHARD_TIMEOUT", "40", 1);
    setenv("UCX_LOG_LEVEL", "error", 1);
}

TestSuite(elastic_join, .init = join_env, .timeout = 150);

static double now_s(void)
{
    return (double)rs_now_ms() / 1e3;
}

static reshard_status_t fail(reshard_status_t st, const char *what, int rank)
{
    fprintf(stderr, "elastic: rank %d: %s: %s\n", rank, what, reshard_last_error());
    return st != RESHARD_OK ? st : RESHARD_ERR_INTERNAL;
}

/* ---- joining ---- */

/* Where rank 0 leaves the join id for the joiner (shared by the forked ranks). */
struct mailbox {
    volatile int ready;
    reshard_unique_id_t id;
};
static struct mailbox *box;

static void open_mailbox(void)
{
    box = mmap(NULL, sizeof(*box), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(box, MAP_FAILED);
    memset(box, 0, sizeof(*box));
}

/* The joiner waits for the members' round n; 0 when they never get there (they failed): it
 * then gives up instead of outliving the test. */
static int wait_round(int n)
{
    for (int ms = 0; box->ready < n; ms += 10) {
        if (ms > 120 * 1000)
            return 0;
        usleep(10 * 1000);
    }
    return 1;
}

static int joiner_rank = 3; /* the number the fourth process joins as */
/* Replicated on ranks 0-2, wanted by all the ranks of the grown communicator. */
#define GROWN_SRC "shape=48x40 dtype=i32 ranks=0-2 mesh=3 place=R"

static reshard_status_t refit_grown(reshard_comm_t *c, int rank)
{
    char dst[128];
    snprintf(dst, sizeof(dst), "shape=48x40 dtype=i32 ranks=%s mesh=%d place=S(0)",
             joiner_rank == 3 ? "0-3" : "0-2,4", 4);
    struct side x;
    reshard_status_t st = side_open(&x, c, rank, GROWN_SRC, dst);
    if (st == RESHARD_OK)
        st = reshard_plan_execute(x.plan, &x.b);
    if (st == RESHARD_OK && count_wrong(x.dst, rank, x.d))
        st = RESHARD_ERR_INTERNAL;
    side_close(&x);
    return st;
}

/* Rank 3 leaves; 0-2 shrink it away, then grow by `joiner_rank`, which the fourth process
 * joins as (a replacement when it is 3, growth past the size when it is 4); everyone refits
 * on the grown communicator, the joiner receiving its shard. */
static reshard_status_t leave_then_rejoin(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    reshard_status_t st;
    int three = 3, joiners[1] = {joiner_rank};
    reshard_comm_t *c1 = NULL, *c2 = NULL;
    if (rank == 3) {
        if ((st = reshard_comm_leave(comm)) != RESHARD_OK)
            return fail(st, "leave", rank);
        while (!box->ready)
            usleep(10 * 1000);
        if ((st = reshard_comm_join(&box->id, joiner_rank, joiners, 1, &c2)) != RESHARD_OK)
            return fail(st, "join", rank);
        if (reshard_comm_rank(c2) != joiner_rank || reshard_comm_size(c2) != joiner_rank + 1)
            return fail(RESHARD_ERR_INTERNAL, "joined with the wrong number or size", rank);
        st = refit_grown(c2, joiner_rank);
        if (st == RESHARD_OK)
            reshard_comm_destroy(c2);
        return st != RESHARD_OK ? fail(st, "refit on the grown comm", rank) : st;
    }
    (void)reshard_comm_barrier(comm); /* fails: rank 3 left */
    if ((st = reshard_comm_shrink(comm, &three, 1, &c1)) != RESHARD_OK)
        return fail(st, "shrink", rank);
    if (rank == 0) {
        if ((st = reshard_comm_grow_id(c1, joiners, 1, &box->id)) != RESHARD_OK)
            return fail(st, "grow id", rank);
        __sync_synchronize();
        box->ready = 1;
    }
    double t0 = now_s();
    if ((st = reshard_comm_grow(c1, joiners, 1, &c2)) != RESHARD_OK)
        return fail(st, "grow", rank);
    if (rank == 0)
        fprintf(stderr, "elastic: rank 0: growth by rank %d took %.1f ms (the joiner was ready)\n",
                joiner_rank, (now_s() - t0) * 1e3);
    if (reshard_comm_size(c2) != joiner_rank + 1 || !reshard_comm_has_rank(c2, joiner_rank) ||
        (joiner_rank == 4 && reshard_comm_has_rank(c2, 3)))
        return fail(RESHARD_ERR_INTERNAL, "the grown comm has the wrong membership", rank);
    st = refit_grown(c2, rank);
    if (st != RESHARD_OK)
        return fail(st, "refit on the grown comm", rank);
    reshard_comm_destroy(c2);
    reshard_comm_destroy(c1);
    return RESHARD_OK;
}

Test(elastic_join, a_replacement_joins_with_the_number_of_the_rank_that_left_and_refits)
{
    open_mailbox();
    joiner_rank = 3;
    all_ok(run_ranks(4, leave_then_rejoin), 4);
}

Test(elastic_join, a_new_rank_joins_past_the_size_and_refits)
{
    open_mailbox();
    joiner_rank = 4;
    all_ok(run_ranks(4, leave_then_rejoin), 4);
}

/* Sharded over the three members one way, then the other: every member needs a piece of every
 * other's, so rank 2 (alone in its domain of two) and ranks 0-1 talk over the network. */
#define MEMBERS_SRC "shape=48x40 dtype=i32 ranks=0-2 mesh=3 place=S(0)"
#define MEMBERS_DST "shape=48x40 dtype=i32 ranks=0-2 mesh=3 place=S(1)"

static reshard_status_t refit_members(reshard_comm_t *c, int rank)
{
    struct side x;
    reshard_status_t st = side_open(&x, c, rank, MEMBERS_SRC, MEMBERS_DST);
    if (st == RESHARD_OK)
        st = reshard_plan_execute(x.plan, &x.b);
    if (st == RESHARD_OK && count_wrong(x.dst, rank, x.d))
        st = RESHARD_ERR_INTERNAL;
    side_close(&x);
    return st;
}

/* The members refit among themselves (their connections are up), grow by rank 3 and refit
 * among themselves again: the grown communicator runs on the same network context, which made
 * no connection for it. The old communicator refuses to run, is destroyed first, and the grown
 * one still works (then everyone refits with the joiner). */
static reshard_status_t grow_keeps_connections(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    reshard_status_t st;
    int three = 3, joiners[1] = {3};
    reshard_comm_t *c1 = NULL, *c2 = NULL;
    if (rank == 3) {
        if ((st = reshard_comm_leave(comm)) != RESHARD_OK)
            return fail(st, "leave", rank);
        while (!box->ready)
            usleep(10 * 1000);
        if ((st = reshard_comm_join(&box->id, 3, joiners, 1, &c2)) != RESHARD_OK)
            return fail(st, "join", rank);
        if ((st = refit_members(c2, 3)) == RESHARD_OK && (st = refit_grown(c2, 3)) == RESHARD_OK &&
            (st = reshard_comm_barrier(c2)) == RESHARD_OK)
            reshard_comm_destroy(c2);
        return st != RESHARD_OK ? fail(st, "refit on the grown comm", rank) : st;
    }
    (void)reshard_comm_barrier(comm); /* fails: rank 3 left */
    if ((st = reshard_comm_shrink(comm, &three, 1, &c1)) != RESHARD_OK)
        return fail(st, "shrink", rank);
    if ((st = refit_members(c1, rank)) != RESHARD_OK)
        return fail(st, "refit before the growth", rank);
    uint64_t before = c1->net->counters.connects;
    if (before == 0)
        return fail(RESHARD_ERR_INTERNAL, "the refit before the growth made no connection", rank);
    if (rank == 0) {
        if ((st = reshard_comm_grow_id(c1, joiners, 1, &box->id)) != RESHARD_OK)
            return fail(st, "grow id", rank);
        __sync_synchronize();
        box->ready = 1;
    }
    if ((st = reshard_comm_grow(c1, joiners, 1, &c2)) != RESHARD_OK)
        return fail(st, "grow", rank);
    if (c2->net != c1->net)
        return fail(RESHARD_ERR_INTERNAL, "the grown comm has a network context of its own", rank);
    if ((st = refit_members(c2, rank)) != RESHARD_OK)
        return fail(st, "refit among the members after the growth", rank);
    uint64_t after = c2->net->counters.connects;
    fprintf(stderr,
            "elastic: rank %d: connections %llu before the growth, %llu after a refit "
            "among the members on the grown comm\n",
            rank, (unsigned long long)before, (unsigned long long)after);
    if (after != before)
        return fail(RESHARD_ERR_INTERNAL, "the members connected to each other again", rank);
    if (reshard_comm_barrier(c1) != RESHARD_ERR_INVALID_ARG ||
        !strstr(reshard_last_error(), "grew into the one of epoch"))
        return fail(RESHARD_ERR_INTERNAL, "the old comm still ran after the growth", rank);
    reshard_comm_destroy(c1); /* first: the grown comm keeps the context */
    if ((st = refit_grown(c2, rank)) != RESHARD_OK)
        return fail(st, "refit with the joiner", rank);
    if ((st = reshard_comm_barrier(c2)) != RESHARD_OK)
        return fail(st, "barrier on the grown comm", rank);
    reshard_comm_destroy(c2);
    return RESHARD_OK;
}

Test(elastic_join, a_growth_keeps_the_members_connections_and_the_old_comm_may_go_first)
{
    open_mailbox();
    joiner_rank = 3;
    all_ok(run_ranks(4, grow_keeps_connections), 4);
}

/* A member's number, a number twice, or a list other than the others': refused on every
 * member at once, naming it, and the communicator stays usable. */
static reshard_status_t grow_bad_lists(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    reshard_comm_t *nc = NULL;
    int live[1] = {1}, twice[2] = {5, 5}, mine[1] = {rank == 2 ? 6 : 5};
    if (reshard_comm_grow(comm, live, 1, &nc) != RESHARD_ERR_INVALID_ARG ||
        !strstr(reshard_last_error(), "joiner rank 1 is a live member"))
        return fail(RESHARD_ERR_INTERNAL, "a live member's number was taken", rank);
    if (reshard_comm_grow(comm, twice, 2, &nc) != RESHARD_ERR_INVALID_ARG ||
        !strstr(reshard_last_error(), "two joiners claim rank 5"))
        return fail(RESHARD_ERR_INTERNAL, "a number claimed twice was taken", rank);
    if (reshard_comm_grow(comm, mine, 1, &nc) != RESHARD_ERR_INVALID_ARG ||
        !strstr(reshard_last_error(), "members passed different joiner lists") || nc)
        return fail(RESHARD_ERR_INTERNAL, "a member's other list was not refused", rank);
    if (reshard_comm_grow(comm, mine, 0, &nc) != RESHARD_ERR_INVALID_ARG ||
        reshard_comm_grow(NULL, mine, 1, &nc) != RESHARD_ERR_INVALID_ARG ||
        reshard_comm_grow(comm, NULL, 1, &nc) != RESHARD_ERR_INVALID_ARG || nc)
        return fail(RESHARD_ERR_INTERNAL, "bad arguments were taken", rank);
    return reshard_comm_barrier(comm); /* still usable */
}

Test(elastic_join, grow_refuses_bad_lists_on_every_member_and_the_comm_stays_usable)
{
    all_ok(run_ranks(3, grow_bad_lists), 3);
}

/* The join id as a bootstrap id (its tail zeroed, as the joiners' side does). */
static struct boot_id boot_of_join_id(const reshard_unique_id_t *jid)
{
    struct boot_id id;
    memcpy(id.bytes, jid->internal, BOOT_ID_BYTES);
    memset(id.bytes + 64, 0, BOOT_ID_BYTES - 64);
    return id;
}

/* Before joining for real, outsiders try: an id whose secret they do not hold (refused by the
 * lowest member), and a decline under that id, which would stop the members' growth if it were
 * believed. The members' growth completes with the real joiner. */
static reshard_status_t join_after_outsiders(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    reshard_status_t st;
    int three = 3, joiners[1] = {3};
    reshard_comm_t *c1 = NULL, *c2 = NULL;
    if (rank == 3) {
        if ((st = reshard_comm_leave(comm)) != RESHARD_OK)
            return fail(st, "leave", rank);
        while (!box->ready)
            usleep(10 * 1000);
        reshard_unique_id_t forged = box->id;
        forged.internal[40] ^= 0x5a; /* in the secret */
        if ((st = reshard_comm_join(&forged, 3, joiners, 1, &c2)) != RESHARD_ERR_REFUSED)
            return fail(RESHARD_ERR_INTERNAL, "an outsider was not refused", rank);
        struct boot_id bad = boot_of_join_id(&forged);
        if (boot_decline(&bad, 4, 3, BOOT_DECLINE_LIST, 20000) != RESHARD_ERR_REFUSED ||
            !strstr(reshard_last_error(), "wrong secret"))
            return fail(RESHARD_ERR_INTERNAL, "an outsider's decline was not refused", rank);
        if ((st = reshard_comm_join(&box->id, 3, joiners, 1, &c2)) != RESHARD_OK)
            return fail(st, "join", rank);
        st = reshard_comm_barrier(c2);
        reshard_comm_destroy(c2);
        return st;
    }
    (void)reshard_comm_barrier(comm); /* fails: rank 3 left */
    if ((st = reshard_comm_shrink(comm, &three, 1, &c1)) != RESHARD_OK)
        return fail(st, "shrink", rank);
    if (rank == 0) {
        if ((st = reshard_comm_grow_id(c1, joiners, 1, &box->id)) != RESHARD_OK)
            return fail(st, "grow id", rank);
        __sync_synchronize();
        box->ready = 1;
    }
    if ((st = reshard_comm_grow(c1, joiners, 1, &c2)) != RESHARD_OK)
        return fail(st, "grow", rank);
    st = reshard_comm_barrier(c2);
    reshard_comm_destroy(c2);
    reshard_comm_destroy(c1);
    return st;
}

Test(elastic_join, outsiders_are_refused_and_cannot_stop_the_growth)
{
    open_mailbox();
    all_ok(run_ranks(4, join_after_outsiders), 4);
}

/* A joiner refused at its own side, round by round: a live rank's number, another list of the
 * same length, a list of another length. Each time every member's growth fails at once (far
 * below RESHARD_TIMEOUT) with the reason in the lowest member's words, the communicator stays
 * usable, and in the end the real join completes. */
static const struct wrong_join {
    int rank, n, list[2];
    const char *heard; /* in every member's message */
} wrong_joins[] = {
    {1, 1, {3}, "claiming rank 1 (it holds the secret) declined: the number it claims is not"},
    {3, 1, {5}, "claiming rank 3 (it holds the secret) declined: its list of joiners differs"},
    {3, 2, {3, 4}, "declined: it was passed another number of joiners"},
};
#define NWRONG ((int)(sizeof(wrong_joins) / sizeof(wrong_joins[0])))

static reshard_status_t wrong_joiners_are_heard(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    reshard_status_t st;
    int three = 3, joiners[1] = {3};
    reshard_comm_t *c1 = NULL, *c2 = NULL;
    if (rank == 3) {
        if ((st = reshard_comm_leave(comm)) != RESHARD_OK)
            return fail(st, "leave", rank);
        for (int i = 0; i < NWRONG; i++) {
            const struct wrong_join *w = &wrong_joins[i];
            if (!wait_round(i + 1))
                return fail(RESHARD_ERR_TIMEOUT, "the members never grew again", rank);
            if (reshard_comm_join(&box->id, w->rank, w->list, w->n, &c2) !=
                    RESHARD_ERR_INVALID_ARG ||
                c2 || !strstr(reshard_last_error(), "join: "))
                return fail(RESHARD_ERR_INTERNAL, "a wrong join was not refused here", rank);
        }
        if (!wait_round(NWRONG + 1))
            return fail(RESHARD_ERR_TIMEOUT, "the members never grew again", rank);
        if ((st = reshard_comm_join(&box->id, 3, joiners, 1, &c2)) != RESHARD_OK)
            return fail(st, "join", rank);
        st = reshard_comm_barrier(c2);
        reshard_comm_destroy(c2);
        return st;
    }
    (void)reshard_comm_barrier(comm); /* fails: rank 3 left */
    if ((st = reshard_comm_shrink(comm, &three, 1, &c1)) != RESHARD_OK)
        return fail(st, "shrink", rank);
    for (int i = 0; i <= NWRONG; i++) {
        if (rank == 0) {
            if ((st = reshard_comm_grow_id(c1, joiners, 1, &box->id)) != RESHARD_OK)
                return fail(st, "grow id", rank);
            __sync_synchronize();
            box->ready = i + 1;
        }
        double t0 = now_s();
        st = reshard_comm_grow(c1, joiners, 1, &c2);
        double took = now_s() - t0;
        if (i == NWRONG)
            break;
        fprintf(stderr, "elastic: rank %d: round %d failed after %.2f s: %s\n", rank, i, took,
                reshard_last_error());
        if (st == RESHARD_OK || !strstr(reshard_last_error(), wrong_joins[i].heard))
            return fail(RESHARD_ERR_INTERNAL, "the members did not hear why", rank);
        if (took > HEARD_WITHIN_S)
            return fail(RESHARD_ERR_TIMEOUT, "the members heard why only late", rank);
        if ((st = reshard_comm_barrier(c1)) != RESHARD_OK) /* still usable */
            return fail(st, "barrier after a refused growth", rank);
    }
    if (st != RESHARD_OK)
        return fail(st, "grow", rank);
    st = reshard_comm_barrier(c2);
    reshard_comm_destroy(c2);
    reshard_comm_destroy(c1);
    return st;
}

Test(elastic_join, a_joiner_refused_at_its_side_fails_every_member_at_once_with_its_reason)
{
    open_mailbox();
    all_ok(run_ranks(4, wrong_joiners_are_heard), 4);
}

/* ---- a joiner of another library version ---- */

static int read_all(int fd, void *p, size_t n)
{
    for (size_t got = 0; got < n;) {
        ssize_t k = read(fd, (char *)p + got, n - got);
        if (k <= 0)
            return -1;
        got += (size_t)k;
    }
    return 0;
}

/* Speaks first as a bootstrap of version BOOT_VERSION + 1 would, at the listener of the join
 * id, and returns the refusal it hears ("" when none). */
static void join_as_another_version(const reshard_unique_id_t *jid, char *text, size_t cap)
{
    struct boot_id id = boot_of_join_id(jid);
    union sock_addr a;
    unsigned char w[SOCK_FRAME_HDR_BYTES + BOOT_OPEN_BYTES] = {0}, p[SOCK_FRAME_TEXT_MAX + 1];
    struct sock_frame_hdr h = {.type = SOCK_FRAME_OPEN, .len = BOOT_OPEN_BYTES};
    struct timeval tv = {.tv_sec = 20};
    int fd = -1;
    text[0] = '\0';
    if (boot_id_decode(&id, &a, NULL, NULL) != 0 ||
        sock_connect(&a, "rank 0", rs_now_ms() + 20000, 20000, &fd) != RESHARD_OK)
        return;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK); /* sock_connect's is not blocking */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    sock_frame_put_hdr(w, &h);
    sock_wire_put(w + SOCK_FRAME_HDR_BYTES, BOOT_VERSION + 1, 4);
    if (write(fd, w, sizeof(w)) == (ssize_t)sizeof(w) &&
        read_all(fd, w, SOCK_FRAME_HDR_BYTES) == 0 && sock_frame_get_hdr(w, &h) == 0 &&
        h.type == SOCK_FRAME_REFUSE && h.len <= SOCK_FRAME_TEXT_MAX &&
        read_all(fd, p, (size_t)h.len) == 0)
        snprintf(text, cap, "%.*s", (int)h.len, (char *)p);
    sock_close(&fd);
}

#define VERSION_TIMEOUT_S 4

/* The joiner first speaks as another version: the lowest member refuses it at once (its
 * hello cannot be checked, so nothing it says is relayed), and the members' growth ends at
 * RESHARD_TIMEOUT naming the missing joiner and what was refused. The communicator stays
 * usable and the real join completes. */
static reshard_status_t another_version_joins(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    reshard_status_t st;
    int three = 3, joiners[1] = {3};
    reshard_comm_t *c1 = NULL, *c2 = NULL;
    if (rank == 3) {
        char text[SOCK_FRAME_TEXT_MAX + 1];
        if ((st = reshard_comm_leave(comm)) != RESHARD_OK)
            return fail(st, "leave", rank);
        while (box->ready < 1)
            usleep(10 * 1000);
        join_as_another_version(&box->id, text, sizeof(text));
        if (!strstr(text, "bootstrap version"))
            return fail(RESHARD_ERR_INTERNAL, "another version was not refused", rank);
        if (!wait_round(2))
            return fail(RESHARD_ERR_TIMEOUT, "the members never grew again", rank);
        if ((st = reshard_comm_join(&box->id, 3, joiners, 1, &c2)) != RESHARD_OK)
            return fail(st, "join", rank);
        st = reshard_comm_barrier(c2);
        reshard_comm_destroy(c2);
        return st;
    }
    (void)reshard_comm_barrier(comm); /* fails: rank 3 left */
    if ((st = reshard_comm_shrink(comm, &three, 1, &c1)) != RESHARD_OK)
        return fail(st, "shrink", rank);
    for (int round = 1; round <= 2; round++) {
        if (rank == 0) {
            if ((st = reshard_comm_grow_id(c1, joiners, 1, &box->id)) != RESHARD_OK)
                return fail(st, "grow id", rank);
            __sync_synchronize();
            box->ready = round;
        }
        double t0 = now_s();
        st = reshard_comm_grow(c1, joiners, 1, &c2);
        if (round == 2)
            break;
        double took = now_s() - t0;
        fprintf(stderr, "elastic: rank %d: growth with another version failed after %.2f s: %s\n",
                rank, took, reshard_last_error());
        if (st == RESHARD_OK || !strstr(reshard_last_error(), "rank 3") ||
            !strstr(reshard_last_error(), "bootstrap version"))
            return fail(RESHARD_ERR_INTERNAL, "the growth did not name the joiner's version", rank);
        if (took > VERSION_TIMEOUT_S + 2 + 4) /* 4 s of slack for a loaded host */
            return fail(RESHARD_ERR_TIMEOUT, "the growth failed too late", rank);
        if ((st = reshard_comm_barrier(c1)) != RESHARD_OK)
            return fail(st, "barrier after a refused growth", rank);
    }
    if (st != RESHARD_OK)
        return fail(st, "grow", rank);
    st = reshard_comm_barrier(c2);
    reshard_comm_destroy(c2);
    reshard_comm_destroy(c1);
    return st;
}

static void reload_params(int rank);

Test(elastic_join, a_joiner_of_another_version_is_refused_and_every_member_names_it)
{
    open_mailbox();
    setenv("RESHARD_TIMEOUT", "4", 1);
    rank_setup = reload_params;
    struct outcome *o = run_ranks(4, another_version_joins);
    rank_setup = NULL;
    all_ok(o, 4);
}

/* ---- a growth racing a failure ---- */

#define RACE_TIMEOUT_S 4

static void reload_params(int rank)
{
    (void)rank;
    rs_param_reload(); /* the parent read the table already (reshard_get_unique_id) */
}

static void *grow_then_hang(void *arg)
{
    reshard_comm_t *c1 = arg, *c2 = NULL;
    int joiners[1] = {3};
    (void)reshard_comm_grow(c1, joiners, 1, &c2);
    return NULL;
}

/* Rank 3 leaves and 0-2 shrink it away; they grow it back, but rank 2 dies during the growth
 * (while the new bootstrap forms): 0 and 1 fail within RESHARD_TIMEOUT + 2 s naming it (the
 * joiner fails too), then shrink rank 2 away and grow rank 3 back for real. */
static reshard_status_t grow_races_a_death(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    reshard_status_t st;
    int three = 3, two = 2, joiners[1] = {3};
    reshard_comm_t *c1 = NULL, *c1b = NULL, *c2 = NULL;
    if (rank == 3) {
        if ((st = reshard_comm_leave(comm)) != RESHARD_OK)
            return fail(st, "leave", rank);
        while (box->ready < 1)
            usleep(10 * 1000);
        usleep(1000 * 1000); /* rank 2 dies meanwhile */
        if (reshard_comm_join(&box->id, 3, joiners, 1, &c2) == RESHARD_OK)
            return fail(RESHARD_ERR_INTERNAL, "joined a growth whose member died", rank);
        while (box->ready < 2)
            usleep(10 * 1000);
        if ((st = reshard_comm_join(&box->id, 3, joiners, 1, &c2)) != RESHARD_OK)
            return fail(st, "second join", rank);
        st = reshard_comm_barrier(c2);
        reshard_comm_destroy(c2);
        return st;
    }
    (void)reshard_comm_barrier(comm); /* fails: rank 3 left */
    if ((st = reshard_comm_shrink(comm, &three, 1, &c1)) != RESHARD_OK)
        return fail(st, "shrink", rank);
    if (rank == 2) { /* dies during the growth */
        pthread_t th;
        pthread_create(&th, NULL, grow_then_hang, c1);
        usleep(300 * 1000);
        _exit(0);
    }
    if (rank == 0) {
        if ((st = reshard_comm_grow_id(c1, joiners, 1, &box->id)) != RESHARD_OK)
            return fail(st, "grow id", rank);
        __sync_synchronize();
        box->ready = 1;
    }
    double t0 = now_s();
    st = reshard_comm_grow(c1, joiners, 1, &c2);
    double took = now_s() - t0;
    fprintf(stderr, "elastic: rank %d: the growth racing a death failed after %.2f s: %s\n", rank,
            took, reshard_last_error());
    if (st == RESHARD_OK || !strstr(reshard_last_error(), "rank 2"))
        return fail(RESHARD_ERR_INTERNAL, "the growth did not fail naming rank 2", rank);
    if (took > RACE_TIMEOUT_S + 2 + 4) /* 4 s of slack for a loaded host */
        return fail(RESHARD_ERR_TIMEOUT, "the growth failed too late", rank);
    if ((st = reshard_comm_shrink(c1, &two, 1, &c1b)) != RESHARD_OK)
        return fail(st, "second shrink", rank);
    if (rank == 0) {
        if ((st = reshard_comm_grow_id(c1b, joiners, 1, &box->id)) != RESHARD_OK)
            return fail(st, "second grow id", rank);
        __sync_synchronize();
        box->ready = 2;
    }
    if ((st = reshard_comm_grow(c1b, joiners, 1, &c2)) != RESHARD_OK)
        return fail(st, "second grow", rank);
    if (!reshard_comm_has_rank(c2, 3) || reshard_comm_has_rank(c2, 2))
        return fail(RESHARD_ERR_INTERNAL, "the second growth has the wrong membership", rank);
    st = reshard_comm_barrier(c2);
    reshard_comm_destroy(c2);
    reshard_comm_destroy(c1b);
    reshard_comm_destroy(c1);
    return st;
}

Test(elastic_join, a_member_dying_during_a_growth_fails_the_others_naming_it_and_they_grow_again)
{
    open_mailbox();
    setenv("RESHARD_TIMEOUT", "4", 1);
    rank_setup = reload_params;
    struct outcome *o = run_ranks(4, grow_races_a_death);
    rank_setup = NULL;
    all_ok(o, 4);
}
