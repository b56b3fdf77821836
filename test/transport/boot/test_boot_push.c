/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The push of a growth's bootstrap (transport/boot/boot_push.c): what every member holds reaches
 * every joiner, no byte crosses an edge between two members (each member sends only to its
 * joiner children and receives nothing), and a failure during it is named at the joiners.
 */
#include "boot_ranks.h"
#include "base/param.h"
#include "transport/boot/boot_int.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PUSH_BYTES 1000
#define PUSH_MAX   16

static void fanout_2(void)
{
    clear_boot_params();
    setenv("RESHARD_BOOT_FANOUT", "2", 1); /* a deep tree: joiners under joiners and members */
    rs_param_reload();
}

TestSuite(boot_push, .init = fanout_2, .fini = clear_boot_params, .timeout = 60);

struct push_rank {
    struct boot_id id;
    int rank, size, members;
    int abort_instead; /* tells the others it failed instead of pushing */
    struct boot *from; /* a member's bootstrap before the growth (NULL: a joiner) */
    struct boot *b;
    reshard_status_t st;
    char msg[RS_ERROR_MAX];
    unsigned char buf[PUSH_BYTES];
    uint64_t sent, received; /* in the push alone */
    pthread_t thread;
};

static void *push_main(void *arg)
{
    struct push_rank *r = arg;
    rs_error_clear();
    r->st = boot_init_grow(&r->id, r->rank, r->size, NULL, r->members, r->from, 20000, &r->b);
    if (r->st == RESHARD_OK) {
        for (size_t i = 0; i < PUSH_BYTES; i++)
            r->buf[i] = r->rank < r->members ? pattern(0, i) : 0;
        uint64_t s0, r0;
        boot_bytes(r->b, &s0, &r0);
        if (r->abort_instead) {
            boot_abort(r->b, RESHARD_ERR_BUFFER, "it had nothing to push");
            r->st = RESHARD_ERR_BUFFER;
        } else {
            r->st = boot_push_joiners(r->b, r->buf, sizeof(r->buf));
        }
        boot_bytes(r->b, &r->sent, &r->received);
        r->sent -= s0;
        r->received -= r0;
    }
    snprintf(r->msg, sizeof(r->msg), "%s", rs_error_message());
    return NULL;
}

/* The members form their own bootstrap (left open in old), then grow by size - members
 * joiners, meeting at member 0's listener as a communicator's growth does. */
static void run_push(struct push_rank *r, struct rank_run *old, int size, int members, int aborting)
{
    struct boot_id id;
    listening_id(&id);
    for (int k = 0; k < members; k++)
        start(&old[k], &id, k, members, 20000, WORK_NONE);
    finish_all(old, members);
    assert_all_ok(old, members);
    cr_assert_eq(boot_group_id(old[0].b, 0, "push", 4, &id), RESHARD_OK, "%s", rs_error_message());
    for (int k = 0; k < size; k++) {
        r[k] = (struct push_rank){.id = id, .rank = k, .size = size, .members = members};
        r[k].from = k < members ? old[k].b : NULL;
        r[k].abort_instead = k == aborting;
        cr_assert_eq(pthread_create(&r[k].thread, NULL, push_main, &r[k]), 0);
    }
    for (int k = 0; k < size; k++)
        pthread_join(r[k].thread, NULL);
}

static void close_push(struct push_rank *r, struct rank_run *old, int size, int members)
{
    for (int k = 0; k < size; k++)
        boot_close(r[k].b);
    close_all(old, members);
}

/* How many of rank k's children are joiners. */
static int joiner_children(const struct push_rank *r)
{
    int n = 0;
    for (int i = 0; i < r->b->nchildren; i++)
        n += r->b->nb[1 + i].rank >= r->members;
    return n;
}

static void push_check(int size, int members)
{
    struct push_rank r[PUSH_MAX];
    struct rank_run old[PUSH_MAX];
    run_push(r, old, size, members, -1);
    const uint64_t frame = SOCK_FRAME_HDR_BYTES + PUSH_BYTES;
    uint64_t sent = 0;
    for (int k = 0; k < size; k++) {
        cr_assert_eq(r[k].st, RESHARD_OK, "rank %d: %s", k, r[k].msg);
        for (size_t i = 0; i < PUSH_BYTES; i++)
            cr_assert_eq(r[k].buf[i], pattern(0, i), "rank %d byte %zu", k, i);
        /* Each rank sends one frame to each joiner child; only joiners receive, one frame. */
        cr_assert_eq(r[k].sent, (uint64_t)joiner_children(&r[k]) * frame, "rank %d sent %llu", k,
                     (unsigned long long)r[k].sent);
        cr_assert_eq(r[k].received, k < members ? 0 : frame, "rank %d received %llu", k,
                     (unsigned long long)r[k].received);
        sent += r[k].sent;
    }
    cr_assert_eq(sent, (uint64_t)(size - members) * frame);
    close_push(r, old, size, members);
}

Test(boot_push, every_joiner_gets_the_members_bytes_and_no_member_sends_to_a_member)
{
    push_check(9, 5);
}

Test(boot_push, a_single_joiner_under_many_members_costs_one_frame)
{
    push_check(8, 7);
}

Test(boot_push, a_member_failing_instead_of_pushing_is_named_at_the_joiners)
{
    struct push_rank r[PUSH_MAX];
    struct rank_run old[PUSH_MAX];
    /* One member: every joiner hangs under it, directly or under a joiner that passes the
     * report on. */
    run_push(r, old, 5, 1, 0);
    for (int k = 1; k < 5; k++) {
        cr_assert_eq(r[k].st, RESHARD_ERR_REMOTE, "joiner %d: %s: %s", k, rs_status_name(r[k].st),
                     r[k].msg);
        cr_assert(strstr(r[k].msg, "rank 0") && strstr(r[k].msg, "nothing to push"),
                  "joiner %d: %s", k, r[k].msg);
    }
    close_push(r, old, 5, 1);
}

Test(boot_push, a_bootstrap_that_is_no_growth_refuses_it)
{
    struct boot_id id;
    struct boot *b = NULL;
    unsigned char buf[8] = {0};
    listening_id(&id);
    cr_assert_eq(boot_init(&id, 0, 1, 20000, &b), RESHARD_OK, "%s", rs_error_message());
    cr_assert_eq(boot_push_joiners(b, buf, sizeof(buf)), RESHARD_ERR_INVALID_ARG);
    cr_assert(strstr(rs_error_message(), "push"), "%s", rs_error_message());
    cr_assert_eq(boot_barrier(b), RESHARD_OK, "still usable: %s", rs_error_message());
    boot_close(b);
}
