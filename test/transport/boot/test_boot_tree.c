/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The bootstrap's tree (transport/boot/boot_tree.c, boot_coll.c, boot_fail.c): its shape, the
 * collectives over a deep one (RESHARD_BOOT_FANOUT=2), the few sockets each rank holds, and
 * failures deep in the tree reaching every rank, naming the rank that failed.
 */
#include "boot_ranks.h"
#include "base/param.h"
#include "transport/boot/boot_int.h"

#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void fanout_2(void)
{
    clear_boot_params();
    setenv("RESHARD_BOOT_FANOUT", "2", 1);
    rs_param_reload();
}

TestSuite(boot_tree, .init = fanout_2, .timeout = 60);

Test(boot_tree, shape_of_a_heap_with_fanout_3)
{
    int first;
    /* 13 slots under fan-out 3: 0; 1-3; 4-12. */
    cr_assert_eq(boot_tree_children(0, 13, 3, &first), 3);
    cr_assert_eq(first, 1);
    cr_assert_eq(boot_tree_children(1, 13, 3, &first), 3);
    cr_assert_eq(first, 4);
    cr_assert_eq(boot_tree_children(3, 13, 3, &first), 3);
    cr_assert_eq(first, 10);
    cr_assert_eq(boot_tree_children(4, 13, 3, &first), 0);
    cr_assert_eq(boot_tree_children(3, 12, 3, &first), 2); /* slots 10, 11 */
    cr_assert_eq(boot_tree_subtree(0, 13, 3), 13);
    cr_assert_eq(boot_tree_subtree(2, 13, 3), 4);
    cr_assert_eq(boot_tree_subtree(3, 12, 3), 3);
    cr_assert_eq(boot_tree_height(0, 13, 3), 2);
    cr_assert_eq(boot_tree_height(0, 14, 3), 3);
    cr_assert_eq(boot_tree_height(5, 13, 3), 0);
    cr_assert_eq(boot_tree_depth(12, 3), 2);
    cr_assert_eq(boot_tree_depth(13, 3), 3);
    cr_assert_eq(boot_tree_depth(0, 3), 0);
    /* A chain (fan-out 1) and sizes whose next level would overflow an int. */
    cr_assert_eq(boot_tree_height(0, 5, 1), 4);
    cr_assert_eq(boot_tree_subtree(1, 1 << 30, 64), boot_tree_subtree(1, 1 << 30, 64));
    cr_assert_gt(boot_tree_subtree(1, 1 << 30, 64), 0);
}

/* n ranks joined (WORK_NONE), left open in r. */
static void join_all(const struct boot_id *id, struct rank_run *r, int n, int timeout_ms)
{
    for (int i = 0; i < n; i++)
        start(&r[i], id, i, n, timeout_ms, WORK_NONE);
    finish_all(r, n);
    assert_all_ok(r, n);
}

Test(boot_tree, twenty_ranks_under_fanout_2_agree_on_every_collective_holding_few_sockets)
{
    enum { N = 20 };
    struct boot_id id;
    struct rank_run r[N];
    cr_assert_eq(boot_id_create(&id), RESHARD_OK, "%s", rs_error_message());
    join_all(&id, r, N, 20000);
    int deepest = 0, leaves = 0;
    for (int i = 0; i < N; i++) {
        struct boot_stats s;
        boot_stats(r[i].b, &s);
        /* a parent, at most two children, its own listener */
        cr_assert_leq(s.sockets, 4, "rank %d holds %d sockets", i, s.sockets);
        cr_assert_leq(s.children, 2);
        cr_assert_eq(s.tree_height, 4, "20 slots under fan-out 2 make 5 levels");
        cr_assert_eq(s.sockets, s.children + (i != 0) + 1, "rank %d: %d sockets, %d children", i,
                     s.sockets, s.children);
        deepest = s.depth > deepest ? s.depth : deepest;
        leaves += s.children == 0;
    }
    cr_assert_eq(deepest, 4);
    cr_assert_eq(leaves, 10, "a heap of 20 has 10 leaves");
    work_all(r, N, WORK_COLLECTIVES);
    finish_all(r, N);
    assert_all_ok(r, N);
    close_all(r, N);
}

Test(boot_tree, sixty_four_kib_each_through_a_deep_tree)
{
    enum { N = 12 };
    struct boot_id id;
    struct rank_run r[N];
    cr_assert_eq(boot_id_create(&id), RESHARD_OK, "%s", rs_error_message());
    join_all(&id, r, N, 20000);
    for (int i = 0; i < N; i++)
        r[i].bytes = 64 * 1024;
    work_all(r, N, WORK_ALLGATHER);
    finish_all(r, N);
    assert_all_ok(r, N);
    /* rank 0 received each slot once and sent the whole array to each of its two children */
    uint64_t sent, received;
    boot_bytes(r[0].b, &sent, &received);
    cr_assert_geq(received, (uint64_t)(N - 1) * 64 * 1024);
    cr_assert_lt(received, (uint64_t)(N - 1) * 64 * 1024 + 4096);
    cr_assert_geq(sent, 2ull * N * 64 * 1024);
    cr_assert_lt(sent, 2ull * N * 64 * 1024 + 4096);
    close_all(r, N);
}

/* The first rank (not 0) found with `want` children at depth `depth`, or -1. */
static int find_rank(struct rank_run *r, int n, int depth, int interior)
{
    for (int i = 1; i < n; i++) {
        struct boot_stats s;
        boot_stats(r[i].b, &s);
        if (s.depth == depth && (s.children > 0) == interior)
            return i;
    }
    return -1;
}

/* Every rank but `odd` runs `rest`; `odd` runs `what`. */
static void all_but_one(struct rank_run *r, int n, int odd, enum work rest, enum work what)
{
    for (int i = 0; i < n; i++) {
        r[i].work = i == odd ? what : rest;
        r[i].bytes = 8;
    }
    for (int i = 0; i < n; i++)
        cr_assert_eq(pthread_create(&r[i].thread, NULL, work_main, &r[i]), 0);
    finish_all(r, n);
}

/* Every rank but `odd` failed, naming rank `odd`, within `ms`. */
static void assert_named(struct rank_run *r, int n, int odd, int64_t ms)
{
    char name[32], origin[32];
    snprintf(name, sizeof(name), "rank %d (", odd);
    snprintf(origin, sizeof(origin), "rank %d failed (", odd);
    for (int i = 0; i < n; i++) {
        if (i == odd)
            continue;
        cr_assert_neq(r[i].st, RESHARD_OK, "rank %d did not fail", i);
        cr_assert(strstr(r[i].msg, name) || strstr(r[i].msg, origin),
                  "rank %d does not name rank %d: %s", i, odd, r[i].msg);
        cr_assert_lt(r[i].ms, ms, "rank %d took %lld ms: %s", i, (long long)r[i].ms, r[i].msg);
    }
}

Test(boot_tree, a_leaf_that_stalls_deep_in_the_tree_is_named_to_every_rank)
{
    enum { N = 7 }; /* slots 0; 1-2; 3-6 */
    struct boot_id id;
    struct rank_run r[N];
    cr_assert_eq(boot_id_create(&id), RESHARD_OK, "%s", rs_error_message());
    join_all(&id, r, N, 1000);
    int leaf = find_rank(r, N, 2, 0);
    cr_assert_geq(leaf, 1);
    all_but_one(r, N, leaf, WORK_ALLGATHER, WORK_NONE); /* it never calls the allgather */
    /* Its parent gives up after the 1 s timeout and names it; the rest hear that. */
    assert_named(r, N, leaf, 1000 + 3 * BOOT_LEVEL_MS + BOOT_GRACE_MAX_MS + 2000);
    int timeouts = 0;
    for (int i = 0; i < N; i++)
        timeouts += r[i].st == RESHARD_ERR_TIMEOUT;
    cr_assert_eq(timeouts, 1, "only the stalled rank's parent times out");
    close_all(r, N);
}

Test(boot_tree, an_interior_rank_that_leaves_is_named_on_both_sides_of_it)
{
    enum { N = 7 };
    struct boot_id id;
    struct rank_run r[N];
    cr_assert_eq(boot_id_create(&id), RESHARD_OK, "%s", rs_error_message());
    join_all(&id, r, N, 10000);
    int mid = find_rank(r, N, 1, 1);
    cr_assert_geq(mid, 1);
    all_but_one(r, N, mid, WORK_ALLGATHER, WORK_LEAVE);
    assert_named(r, N, mid, 5000);
    close_all(r, N);
}

Test(boot_tree, an_abort_at_a_leaf_reaches_every_rank_fast)
{
    enum { N = 15 }; /* four levels */
    struct boot_id id;
    struct rank_run r[N];
    cr_assert_eq(boot_id_create(&id), RESHARD_OK, "%s", rs_error_message());
    join_all(&id, r, N, 20000);
    int leaf = find_rank(r, N, 3, 0);
    cr_assert_geq(leaf, 1);
    all_but_one(r, N, leaf, WORK_ALLGATHER, WORK_ABORT);
    assert_named(r, N, leaf, 5000);
    for (int i = 0; i < N; i++)
        if (i != leaf)
            cr_assert(strstr(r[i].msg, "failed (RESHARD_ERR_BUFFER): buffer too small"), "%s",
                      r[i].msg);
    close_all(r, N);
}

/* Between collectives: every rank looks at its connections until it hears. */
static void *check_until_failed(void *arg)
{
    struct rank_run *r = arg;
    int64_t t0 = now_ms();
    while ((r->st = boot_check(r->b)) == RESHARD_OK && now_ms() - t0 < 10000)
        usleep(10 * 1000);
    snprintf(r->msg, sizeof(r->msg), "%s", rs_error_message());
    r->ms = now_ms() - t0;
    return NULL;
}

Test(boot_tree, a_rank_that_dies_between_collectives_is_heard_of_by_every_rank_checking)
{
    enum { N = 15 };
    struct boot_id id;
    struct rank_run r[N];
    cr_assert_eq(boot_id_create(&id), RESHARD_OK, "%s", rs_error_message());
    join_all(&id, r, N, 20000);
    int mid = find_rank(r, N, 2, 1);
    cr_assert_geq(mid, 1);
    boot_close(r[mid].b);
    r[mid].b = NULL;
    for (int i = 0; i < N; i++)
        if (i != mid)
            cr_assert_eq(pthread_create(&r[i].thread, NULL, check_until_failed, &r[i]), 0);
    for (int i = 0; i < N; i++)
        if (i != mid)
            finish(&r[i]);
    assert_named(r, N, mid, 5000);
    close_all(r, N);
}

Test(boot_tree, a_group_of_some_ranks_meets_at_one_of_their_listeners)
{
    enum { N = 6, M = 4 };
    struct boot_id id, group[N], other;
    struct rank_run r[N], g[M];
    static const int member[M] = {2, 3, 4, 5}; /* old ranks; 2 is the new rank 0 */
    cr_assert_eq(boot_id_create(&id), RESHARD_OK, "%s", rs_error_message());
    join_all(&id, r, N, 20000);
    char addr[80];
    cr_assert_neq(boot_listener_addr(r[0].b, 2, addr, sizeof(addr))[0], '\0');
    for (int k = 0; k < M; k++)
        cr_assert_eq(boot_group_id(r[member[k]].b, 2, "salt", 4, &group[member[k]]), RESHARD_OK,
                     "%s", rs_error_message());
    for (int k = 1; k < M; k++)
        cr_assert_eq(memcmp(&group[member[k]], &group[2], sizeof(id)), 0, "one group, one id");
    /* A rank with another view of the group has another secret: refused by name. */
    cr_assert_eq(boot_group_id(r[1].b, 2, "tlas", 4, &other), RESHARD_OK);
    struct boot *stray = NULL;
    prep(&g[0], &group[member[0]], 0, M, 10000, WORK_COLLECTIVES);
    launch(&g[0]); /* the group cannot form before the others come */
    cr_assert_eq(boot_init(&other, 1, M, 10000, &stray), RESHARD_ERR_REFUSED, "%s",
                 rs_error_message());
    cr_assert(strstr(rs_error_message(), "wrong secret"), "%s", rs_error_message());
    for (int k = 1; k < M; k++) {
        prep(&g[k], &group[member[k]], k, M, 10000, WORK_COLLECTIVES);
        launch(&g[k]);
    }
    finish_all(g, M);
    assert_all_ok(g, M);
    close_all(g, M);
    close_all(r, N);
}

static void put_ranks(unsigned char *w, const int *r, int n)
{
    for (int k = 0; k < n; k++)
        sock_wire_put(w + 4 * k, (uint32_t)r[k], 4);
}

Test(boot_tree, a_malformed_subtree_report_is_refused_at_its_first_bad_entry)
{
    unsigned char w[16], seen[8] = {0};
    int out[4];
    static const int good[] = {3, 5, 6}, dup[] = {4, 7, 4}, wrong_head[] = {2, 1},
                     out_of_range[] = {1, 8}, rank0[] = {1, 0}, negative[] = {1, -3};
    put_ranks(w, good, 3);
    cr_assert_eq(boot_ready_decode(w, 3, 3, 8, seen, out), -1);
    cr_assert(out[0] == 3 && out[1] == 5 && out[2] == 6 && seen[5] && !seen[4]);
    /* a rank met already in this subtree, here or in a sibling's report */
    put_ranks(w, dup, 3);
    cr_assert_eq(boot_ready_decode(w, 3, 4, 8, seen, out), 2);
    cr_assert_eq(boot_ready_decode(w, 1, 5, 8, seen, out), 0, "rank 5 was reported already");
    put_ranks(w, wrong_head, 2);
    cr_assert_eq(boot_ready_decode(w, 2, 1, 8, seen, out), 0, "a report starts with its sender");
    memset(seen, 0, sizeof(seen));
    put_ranks(w, out_of_range, 2);
    cr_assert_eq(boot_ready_decode(w, 2, 1, 8, seen, out), 1);
    memset(seen, 0, sizeof(seen));
    put_ranks(w, rank0, 2);
    cr_assert_eq(boot_ready_decode(w, 2, 1, 8, seen, out), 1, "rank 0 is nobody's child");
    memset(seen, 0, sizeof(seen));
    put_ranks(w, negative, 2);
    cr_assert_eq(boot_ready_decode(w, 2, 1, 8, seen, out), 1);
}

Test(boot_tree, a_placement_that_is_not_one_is_refused)
{
    union sock_addr pa, listener = {.in = {.sin_family = AF_INET, .sin_port = htons(4242)}};
    struct boot_admit a = {.slot = 9, .fanout = 8, .parent = 2};
    boot_addr_put(a.parent_addr, &listener);
    cr_assert_eq(boot_admit_valid(&a, 16, 5, &pa), 0);
    cr_assert_eq(sock_addr_port(&pa), 4242);
    struct boot_admit bad[] = {
        {.slot = 0, .fanout = 8, .parent = 0},  /* slot 0 is rank 0's */
        {.slot = 16, .fanout = 8, .parent = 0}, /* past the job */
        {.slot = 3, .fanout = 0, .parent = 0},
        {.slot = 3, .fanout = BOOT_FANOUT_MAX + 1, .parent = 0},
        {.slot = 3, .fanout = 8, .parent = 5},  /* itself */
        {.slot = 3, .fanout = 8, .parent = 16}, /* not a rank */
        {.slot = 3, .fanout = 8, .parent = -1},
        {.slot = 3, .fanout = 8, .parent = 2}, /* a parent without an address */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        cr_assert_eq(boot_admit_valid(&bad[i], 16, 5, &pa), -1, "placement %zu", i);
    a.parent = 0; /* rank 0's connection is the parent's: no address needed */
    memset(a.parent_addr, 0, sizeof(a.parent_addr));
    cr_assert_eq(boot_admit_valid(&a, 16, 5, &pa), 0);
}
