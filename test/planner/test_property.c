/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Property suite: 10,000 seeded random layout pairs (1-4-D tensors with sizes that need not
 * divide, 1-3-D meshes, R / S / SS, nested shards, disjoint / overlapping / equal rank sets,
 * 1-8 domains). Every plan must validate, move exactly min_net_bytes over the network, and
 * agree with the brute-force oracle on every element and on every bound; so must the plan of
 * each pair with one source rank absent, unless the oracle finds data that only that rank held
 * (then the plan fails with DATA_LOST). Every rank's own plan of each pair (and of the pair with
 * the rank absent) equals its slice of the whole plan op for op; so does the catch-up of one
 * or two destination ranks that joined. A failure prints the
 * seed and both specs; RESHARD_TEST_SEED=N replays one seed.
 */
#include "oracle.h"
#include "plan_util.h"
#include "base/error.h"
#include "planner/spec.h"
#include "planner/stats.h"
#include "planner/validate.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CASES_PER_TEST 1000

static void describe(const struct random_case *c, uint64_t seed, char *buf, size_t n)
{
    char s[512], d[512];
    spec_format(&c->src, s, sizeof(s));
    spec_format(&c->dst, d, sizeof(d));
    int used =
        snprintf(buf, n, "seed %llu world %d split_min %lld\n  src: %s\n  dst: %s\n  domains:",
                 (unsigned long long)seed, c->world, (long long)c->split_min_bytes, s, d);
    for (int r = 0; r < c->world && used > 0 && (size_t)used < n; r++)
        used += snprintf(buf + used, n - (size_t)used, " %d", c->domain_of[r]);
}

/* The same pair with one source rank gone, as after reshard_comm_shrink: the plan takes that
 * rank's pieces from replicas and still meets every bound, or fails with DATA_LOST naming the
 * tensor exactly when the oracle finds an element that only the absent rank held. */
static void run_absent(const struct random_case *c, uint64_t seed, const struct plan_input *in,
                       const struct rs_topo *topo, const char *why)
{
    int gone = c->src.ranks[(seed * 2654435761u >> 7) % (uint64_t)c->src.nranks];
    struct rs_topo t;
    cr_assert_eq(topo_copy(topo, &t), RESHARD_OK);
    cr_assert_eq(topo_set_absent(&t, &gone, 1), RESHARD_OK);
    int lost = oracle_data_lost(in->src, in->dst, &t);
    cr_assert_geq(lost, 0, "%s", why);
    struct plan_opts opts = {.split_min_bytes = c->split_min_bytes};
    struct rs_plan *p = NULL;
    reshard_status_t st = plan_build(in, 1, &t, &opts, PLAN_ALL_RANKS, &p);
    if (lost) {
        cr_assert_eq(st, RESHARD_ERR_DATA_LOST, "%s\nrank %d absent: expected DATA_LOST, got %s",
                     why, gone, rs_status_string(st));
        cr_assert(strstr(rs_error_message(), "'t' (held by rank"), "%s\n%s", why,
                  rs_error_message());
        topo_free(&t);
        return;
    }
    cr_assert_eq(st, RESHARD_OK, "%s\nrank %d absent: %s", why, gone, rs_error_message());
    cr_assert_eq(plan_validate(p), RESHARD_OK, "%s\nrank %d absent: %s", why, gone,
                 rs_error_message());
    struct plan_stats s;
    struct oracle_bounds ob;
    cr_assert_eq(plan_stats_compute(p, &s, NULL), RESHARD_OK, "%s", why);
    cr_assert_eq(oracle_bounds(p, &ob), 0, "%s", why);
    cr_assert_eq(s.net_bytes, s.min_net_bytes, "%s\nrank %d absent: net %lld, min %lld", why, gone,
                 (long long)s.net_bytes, (long long)s.min_net_bytes);
    cr_assert_eq(s.min_net_bytes, ob.min_net_bytes, "%s\nrank %d absent", why, gone);
    cr_assert_eq(s.lb_nic_bytes, ob.lb_nic_bytes, "%s\nrank %d absent", why, gone);
    char msg[256] = "";
    cr_assert_eq(oracle_check_plan(p, msg, sizeof(msg)), 0, "%s\nrank %d absent: %s", why, gone,
                 msg);
    check_rank_scopes(p, why);
    plan_free(p);
    topo_free(&t);
}

/* The catch-up of destination ranks that joined (one, or two on odd seeds): it validates,
 * writes the joiners alone, moves exactly min_net_bytes, agrees with the oracle, and every
 * rank's own plan is its slice; or it fails with DATA_LOST only when some joiner's shard has
 * no replica and the oracle finds an element only joiners held as sources. */
static void run_catch_up(const struct random_case *c, uint64_t seed, const struct rs_plan *refit,
                         const char *why)
{
    int joiners[2], n = 1;
    joiners[0] = c->dst.ranks[(seed * 40503u >> 3) % (uint64_t)c->dst.nranks];
    if (seed % 2 && c->dst.nranks > 1) {
        joiners[1] = c->dst.ranks[(seed * 2246822519u >> 5) % (uint64_t)c->dst.nranks];
        n += joiners[1] != joiners[0];
    }
    struct rs_plan *p = NULL;
    unsigned char *fd = NULL;
    reshard_status_t st = plan_catch_up(refit, joiners, n, PLAN_ALL_RANKS, &p, &fd);
    if (st == RESHARD_ERR_DATA_LOST) {
        struct rs_topo t;
        cr_assert_eq(topo_copy(&refit->topo, &t), RESHARD_OK);
        cr_assert_eq(topo_set_off(&t, joiners, n, TOPO_SRC), RESHARD_OK);
        cr_assert_eq(oracle_data_lost(&refit->tensors[0].src, &refit->tensors[0].dst, &t), 1,
                     "%s\ncatch-up of %d: DATA_LOST, but the sources hold everything", why,
                     joiners[0]);
        topo_free(&t);
        return;
    }
    cr_assert_eq(st, RESHARD_OK, "%s\ncatch-up of %d: %s", why, joiners[0], rs_error_message());
    cr_assert_eq(plan_validate(p), RESHARD_OK, "%s\ncatch-up of %d: %s", why, joiners[0],
                 rs_error_message());
    for (size_t i = 0; i < p->nops; i++)
        cr_assert(p->ops[i].dst == joiners[0] || p->ops[i].dst == joiners[n - 1],
                  "%s\ncatch-up of %d writes rank %d", why, joiners[0], p->ops[i].dst);
    struct plan_stats s;
    struct oracle_bounds ob;
    cr_assert_eq(plan_stats_compute(p, &s, NULL), RESHARD_OK, "%s", why);
    cr_assert_eq(oracle_bounds(p, &ob), 0, "%s", why);
    cr_assert_eq(s.net_bytes, s.min_net_bytes, "%s\ncatch-up of %d: net %lld, min %lld", why,
                 joiners[0], (long long)s.net_bytes, (long long)s.min_net_bytes);
    cr_assert_eq(s.min_net_bytes, ob.min_net_bytes, "%s\ncatch-up of %d", why, joiners[0]);
    cr_assert_eq(s.lb_nic_bytes, ob.lb_nic_bytes, "%s\ncatch-up of %d", why, joiners[0]);
    char msg[256] = "";
    cr_assert_eq(oracle_check_plan(p, msg, sizeof(msg)), 0, "%s\ncatch-up of %d: %s", why,
                 joiners[0], msg);
    check_rank_scopes(p, why);
    free(fd);
    plan_free(p);
}

/* Formats both specs, parses them back and plans the parsed copies, so the spec round trip
 * is part of every case. */
static void run_case(uint64_t seed)
{
    struct random_case c;
    random_case_make(seed, &c);
    char why[2048];
    describe(&c, seed, why, sizeof(why));

    char text[2][512];
    struct rs_layout parsed[2];
    const struct rs_layout *sides[2] = {&c.src, &c.dst};
    for (int s = 0; s < 2; s++) {
        spec_format(sides[s], text[s], sizeof(text[s]));
        reshard_status_t st = spec_parse(text[s], NULL, &parsed[s]);
        cr_assert_eq(st, RESHARD_OK, "%s\nspec does not parse back: %s", why, rs_error_message());
        char again[512];
        spec_format(&parsed[s], again, sizeof(again));
        cr_assert_str_eq(again, text[s], "%s\nround trip changed the spec", why);
    }

    struct rs_topo topo;
    cr_assert_eq(topo_create(c.world, 0, c.domain_of, &topo), RESHARD_OK, "%s", why);
    struct plan_input in = {.name = "t", .src = &parsed[0], .dst = &parsed[1]};
    struct plan_opts opts = {.split_min_bytes = c.split_min_bytes};
    struct rs_plan *p;
    reshard_status_t st = plan_build(&in, 1, &topo, &opts, PLAN_ALL_RANKS, &p);
    cr_assert_eq(st, RESHARD_OK, "%s\nplan_build: %s", why, rs_error_message());

    st = plan_validate(p);
    cr_assert_eq(st, RESHARD_OK, "%s\nvalidate: %s", why, rs_error_message());

    struct plan_stats s;
    cr_assert_eq(plan_stats_compute(p, &s, NULL), RESHARD_OK, "%s", why);
    cr_assert_eq(s.net_bytes, s.min_net_bytes, "%s\nnet_bytes %lld != min_net_bytes %lld", why,
                 (long long)s.net_bytes, (long long)s.min_net_bytes);

    struct oracle_bounds ob;
    cr_assert_eq(oracle_bounds(p, &ob), 0, "%s", why);
    cr_assert_eq(s.min_net_bytes, ob.min_net_bytes, "%s\nmin_net_bytes %lld, oracle %lld", why,
                 (long long)s.min_net_bytes, (long long)ob.min_net_bytes);
    cr_assert_eq(s.lb_nic_bytes, ob.lb_nic_bytes, "%s\nlb_nic_bytes %lld, oracle %lld", why,
                 (long long)s.lb_nic_bytes, (long long)ob.lb_nic_bytes);
    cr_assert_eq(s.gather_bcast_bytes, ob.gather_bcast_bytes,
                 "%s\ngather_bcast_bytes %lld, oracle %lld", why, (long long)s.gather_bcast_bytes,
                 (long long)ob.gather_bcast_bytes);
    cr_assert_geq(s.max_nic_bytes, s.lb_nic_bytes, "%s\nthe NIC bound is not a bound", why);

    char msg[256] = "";
    cr_assert_eq(oracle_check_plan(p, msg, sizeof(msg)), 0, "%s\noracle: %s", why, msg);
    check_rank_scopes(p, why);
    run_absent(&c, seed, &in, &topo, why);
    run_catch_up(&c, seed, p, why);

    plan_free(p);
    topo_free(&topo);
    layout_free(&parsed[0]);
    layout_free(&parsed[1]);
    random_case_free(&c);
}

static void run_block(int block)
{
    const char *one = getenv("RESHARD_TEST_SEED");
    if (one) {
        if (block == 0)
            run_case(strtoull(one, NULL, 0));
        return;
    }
    for (int i = 0; i < CASES_PER_TEST; i++)
        run_case((uint64_t)block * CASES_PER_TEST + (uint64_t)i + 1);
}

#define BLOCK(n)                                                                                   \
    Test(property, random_pairs_##n, .timeout = 600)                                               \
    {                                                                                              \
        run_block(n);                                                                              \
    }

BLOCK(0)
BLOCK(1)
BLOCK(2)
BLOCK(3)
BLOCK(4)
BLOCK(5)
BLOCK(6)
BLOCK(7)
BLOCK(8)
BLOCK(9)
