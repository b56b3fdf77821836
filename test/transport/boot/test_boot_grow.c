/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A bootstrap that grows (boot_init_grow with the members' bootstrap): every rank's tree slot is
 * its rank, the members attach at their tree parents without meeting rank 0 and only the joiners
 * join there, so rank 0's forming bytes do not grow with the members; strangers and wrong
 * claims are refused at every door, a member that does not come is named by its tree parent,
 * and the members' bootstrap stays usable whatever happens to the growth.
 * (RESHARD_BOOT_FANOUT=2, so that members have members and joiners as children.)
 */
#include "boot_ranks.h"
#include "base/clock.h"
#include "base/param.h"
#include "transport/boot/boot_int.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void fanout_2(void)
{
    clear_boot_params();
    setenv("RESHARD_BOOT_FANOUT", "2", 1);
    rs_param_reload();
}

TestSuite(boot_grow, .init = fanout_2, .timeout = 90);

/* One rank of the grown bootstrap: a member (from: its bootstrap) or a joiner (from NULL). */
struct grower {
    struct rank_run r;
    struct boot *from;
    int members;
};

static void *grow_main(void *arg)
{
    struct grower *g = arg;
    int64_t t0 = now_ms();
    rs_error_clear();
    g->r.st = boot_init_grow(&g->r.id, g->r.rank, g->r.size, NULL, g->members, g->from,
                             g->r.timeout_ms, &g->r.b);
    g->r.ms = g->r.init_ms = now_ms() - t0;
    if (g->r.st == RESHARD_OK)
        do_work(&g->r);
    snprintf(g->r.msg, sizeof(g->r.msg), "%s", rs_error_message());
    return NULL;
}

static void grow_launch(struct grower *g, const struct boot_id *id, int rank, int size, int members,
                        struct boot *from, int timeout_ms)
{
    prep(&g->r, id, rank, size, timeout_ms, WORK_COLLECTIVES);
    g->from = from;
    g->members = members;
    cr_assert_eq(pthread_create(&g->r.thread, NULL, grow_main, g), 0);
}

/* m ranks form the members' bootstrap, left open in old. */
static void form_members(struct rank_run *old, int m)
{
    struct boot_id id;
    cr_assert_eq(boot_id_create(&id), RESHARD_OK, "%s", rs_error_message());
    for (int k = 0; k < m; k++)
        start(&old[k], &id, k, m, 20000, WORK_NONE);
    finish_all(old, m);
    assert_all_ok(old, m);
}

/* The growth's id, the same on every member; rank 0's registers its listener. */
static void growth_id(struct rank_run *old, int m, struct boot_id *id)
{
    for (int k = m - 1; k >= 0; k--) {
        struct boot_id mine;
        cr_assert_eq(boot_group_id(old[k].b, 0, "grow", 4, &mine), RESHARD_OK, "%s",
                     rs_error_message());
        if (k < m - 1)
            cr_assert_eq(memcmp(&mine, id, sizeof(mine)), 0, "one growth, one id");
        *id = mine;
    }
}

/* Where member k of old listens. */
static void member_listener(struct rank_run *old, int k, union sock_addr *a)
{
    cr_assert_eq(boot_addr_get(old[0].b->addrs + (size_t)k * BOOT_ADDR_BYTES, a), 0);
}

/* m members grow by n joiners (all of them coming): rank 0's forming bytes. */
/* The ranks from `first` on join the growth; every rank of it then forms, and all close. */
static void complete_growth(struct grower *g, struct rank_run *old, const struct boot_id *id,
                            int first, int n, int m)
{
    for (int r = first; r < n; r++)
        grow_launch(&g[r], id, r, n, m, r < m ? old[r].b : NULL, 20000);
    for (int r = 0; r < n; r++) {
        finish(&g[r].r);
        assert_all_ok(&g[r].r, 1);
        boot_close(g[r].r.b);
    }
    close_all(old, m);
}

static uint64_t grow_and_count(int m, int n)
{
    struct rank_run *old = calloc((size_t)m, sizeof(*old));
    struct grower *g = calloc((size_t)(m + n), sizeof(*g));
    struct boot_id id;
    struct boot_stats s;
    cr_assert(old && g);
    form_members(old, m);
    growth_id(old, m, &id);
    for (int r = 0; r < m + n; r++)
        grow_launch(&g[r], &id, r, m + n, m, r < m ? old[r].b : NULL, 20000);
    for (int r = 0; r < m + n; r++) {
        finish(&g[r].r);
        assert_all_ok(&g[r].r, 1);
    }
    boot_stats(g[0].r.b, &s);
    for (int r = 0; r < m + n; r++)
        boot_close(g[r].r.b);
    close_all(old, m);
    free(old);
    free(g);
    return s.form_sent + s.form_received;
}

Test(boot_grow, rank_0s_forming_bytes_of_a_growth_do_not_grow_with_the_members)
{
    uint64_t small = grow_and_count(4, 2), large = grow_and_count(16, 2);
    fprintf(stderr, "boot_grow: rank 0's forming bytes: 4 members + 2: %llu B, 16 + 2: %llu B\n",
            (unsigned long long)small, (unsigned long long)large);
    /* Under fan-out 2 rank 0 admits the same two member children and two joiners either way:
     * only the subtrees' reports (4 bytes a rank: 48 B) may differ. Before slots were ranks,
     * rank 0 admitted every member (about 330 B each) and sent its children every listener. */
    cr_assert_leq(large, small + 128, "%llu B with 16 members, %llu B with 4",
                  (unsigned long long)large, (unsigned long long)small);
}

Test(boot_grow, an_outsider_at_a_members_door_during_a_growth_is_refused_and_the_growth_completes)
{
    enum { M = 4, N = 6 };
    struct rank_run old[M];
    struct grower g[N];
    struct boot_id id, bad;
    union sock_addr a1;
    unsigned char wrong[BOOT_SECRET_BYTES];
    struct boot *stray = NULL;
    form_members(old, M);
    growth_id(old, M, &id);
    for (int r = 0; r < M; r++)
        grow_launch(&g[r], &id, r, N, M, old[r].b, 20000);
    /* Member 1's door is open until its children (member 3, joiner 4) attached: the joiners
     * wait, so the outsider finds it open. */
    member_listener(old, 1, &a1);
    memset(wrong, 0x5a, sizeof(wrong));
    boot_id_encode(&a1, wrong, 0, &bad);
    cr_assert_eq(boot_init(&bad, 4, N, 10000, &stray), RESHARD_ERR_REFUSED, "%s",
                 rs_error_message());
    char at[SOCK_ADDR_STR];
    sock_addr_str(&a1, at, sizeof(at));
    cr_assert(strstr(rs_error_message(), at) && strstr(rs_error_message(), "wrong secret"), "%s",
              rs_error_message());
    complete_growth(g, old, &id, M, N, M);
}

/* A rank that holds the growth's secret (MACs right) but claims what is not its own. */
static reshard_status_t claim(const struct boot_id *id, const union sock_addr *at, int kind,
                              int rank, int slot)
{
    union sock_addr ignored;
    struct boot_admit ad;
    int fd = -1;
    struct boot *b = boot_alloc(rank, 6, NULL, 10000);
    cr_assert_not_null(b);
    cr_assert_eq(boot_id_decode(id, &ignored, b->secret, NULL), 0);
    b->slot = slot;
    reshard_status_t st = boot_dial(b, at, "a member", kind, 0, rs_now_ms() + 10000, &fd, &ad);
    sock_close(&fd);
    boot_close(b);
    return st;
}

Test(boot_grow, a_slot_that_is_not_the_rank_and_a_members_number_joining_at_rank_0_are_refused)
{
    enum { M = 4, N = 6 };
    struct rank_run old[M];
    struct grower g[N];
    struct boot_id id;
    union sock_addr a0, a1;
    form_members(old, M);
    growth_id(old, M, &id);
    for (int r = 0; r < M - 1; r++) /* member 3 comes late: its slot under member 1 is free */
        grow_launch(&g[r], &id, r, N, M, old[r].b, 20000);
    member_listener(old, 0, &a0);
    member_listener(old, 1, &a1);
    /* joiner 4 claiming member 3's slot under member 1 */
    cr_assert_eq(claim(&id, &a1, BOOT_ATTACH, 4, 3), RESHARD_ERR_REFUSED, "%s", rs_error_message());
    cr_assert(strstr(rs_error_message(), "in a growth a rank's slot is its rank"), "%s",
              rs_error_message());
    /* member 1's number joining at rank 0 as if it were a joiner */
    cr_assert_eq(claim(&id, &a0, BOOT_JOIN, 1, 0), RESHARD_ERR_REFUSED, "%s", rs_error_message());
    cr_assert(strstr(rs_error_message(), "rank 1 is a member of the communicator that grows"), "%s",
              rs_error_message());
    /* a joiner attaching at rank 0 instead of joining there */
    cr_assert_eq(claim(&id, &a0, BOOT_ATTACH, 5, 5), RESHARD_ERR_REFUSED, "%s", rs_error_message());
    cr_assert(strstr(rs_error_message(), "joiners join at rank 0"), "%s", rs_error_message());
    complete_growth(g, old, &id, M - 1, N, M);
}

/* A joiner holds the growth's secret (its join id carries it), not the members' bootstrap's:
 * claiming a member's number and slot at a member's door, before that member attached, it
 * would take the member's place in the tree (and the member be refused as a duplicate). */
Test(boot_grow, a_joiner_claiming_a_members_number_at_a_members_door_is_refused)
{
    enum { M = 4, N = 6 };
    struct rank_run old[M];
    struct grower g[N];
    struct boot_id id;
    union sock_addr a1;
    form_members(old, M);
    growth_id(old, M, &id);
    for (int r = 0; r < M - 1; r++) /* member 3 comes late: its slot under member 1 is free */
        grow_launch(&g[r], &id, r, N, M, old[r].b, 20000);
    member_listener(old, 1, &a1);
    /* rank 3's number and slot, MACed under the growth's secret as a joiner can */
    cr_assert_eq(claim(&id, &a1, BOOT_ATTACH, 3, 3), RESHARD_ERR_REFUSED, "%s", rs_error_message());
    cr_assert(strstr(rs_error_message(), "does not prove the members' secret"), "%s",
              rs_error_message());
    complete_growth(g, old, &id, M - 1, N, M);
}

Test(boot_grow, a_member_that_never_comes_is_named_to_every_member_and_the_old_bootstrap_works)
{
    enum { M = 4, N = 6, TIMEOUT_MS = 1500 };
    struct rank_run old[M];
    struct grower g[N];
    struct boot_id id;
    form_members(old, M);
    growth_id(old, M, &id);
    for (int r = 0; r < N; r++)
        if (r != 3)
            grow_launch(&g[r], &id, r, N, M, r < M ? old[r].b : NULL, TIMEOUT_MS);
    for (int r = 0; r < N; r++) {
        if (r == 3)
            continue;
        finish(&g[r].r);
        cr_assert_neq(g[r].r.st, RESHARD_OK, "rank %d formed without member 3", r);
        if (r < M) /* its tree parent names it first; the others hear it from there */
            cr_assert(strstr(g[r].r.msg, "rank 3"), "rank %d: %s", r, g[r].r.msg);
        cr_assert_leq(g[r].r.ms, TIMEOUT_MS + 5000, "rank %d gave up after %lld ms", r,
                      (long long)g[r].r.ms);
    }
    cr_assert(strstr(g[1].r.msg, "its tree child rank 3 did not attach"), "%s", g[1].r.msg);
    /* The members' bootstrap is as it was. */
    work_all(old, M, WORK_COLLECTIVES);
    finish_all(old, M);
    assert_all_ok(old, M);
    close_all(old, M);
}

Test(boot_grow, a_member_missing_high_in_the_tree_is_named_by_every_member_below_it_too)
{
    /* 0; 1 2; 3-6; 7 8 (members), 9 (a joiner under member 4). Member 1 never comes: its
     * children 3 and 4 wait on it and name it; their children, waiting at their doors, are
     * told why instead of timing out on them. */
    enum { M = 9, N = 10, TIMEOUT_MS = 1500 };
    struct rank_run old[M];
    struct grower g[N];
    struct boot_id id;
    form_members(old, M);
    growth_id(old, M, &id);
    for (int r = 0; r < N; r++)
        if (r != 1)
            grow_launch(&g[r], &id, r, N, M, r < M ? old[r].b : NULL, TIMEOUT_MS);
    for (int r = 0; r < N; r++) {
        if (r == 1)
            continue;
        finish(&g[r].r);
        cr_assert_neq(g[r].r.st, RESHARD_OK, "rank %d formed without member 1", r);
        if (r < M)
            cr_assert(strstr(g[r].r.msg, "rank 1 "), "rank %d: %s", r, g[r].r.msg);
        cr_assert_leq(g[r].r.ms, TIMEOUT_MS + 5000, "rank %d gave up after %lld ms", r,
                      (long long)g[r].r.ms);
    }
    work_all(old, M, WORK_COLLECTIVES);
    finish_all(old, M);
    assert_all_ok(old, M);
    close_all(old, M);
}
