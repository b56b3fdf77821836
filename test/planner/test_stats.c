/* SPDX-License-Identifier: Apache-2.0 */
/* Plan statistics on small cases worked out by hand (docs/figures.md definitions). */
#include "plan_util.h"
#include "base/error.h"
#include "planner/validate.h"

#include <criterion/criterion.h>

/*
 * Case A: 8 bf16 elements. Domain 0 = {0,1} holds them split in two; domain 1 = {2,3} wants
 * two full replicas.
 *   min_net     = 8 elements must enter domain 1                         = 16 B
 *   gather      = root 0's domain holds all: 0; broadcast to 1 domain    = 16 B
 *   lb          = in(D1) / 2 receivers = 8; each source alone holds 4 elements that domain 1
 *                 needs: forced = 8                                       =  8 B
 *   plan        = each 4-element cell is cut into 2 slices, one per replica: every rank sends
 *                 or receives 8 B, and each replica forwards its 2 slices of 2 elements
 *                 (2 cells x 2 replicas x 4 B)                            local 16 B
 */
Test(stats, two_sources_to_two_replicas)
{
    struct rs_plan *p = plan_one("shape=8 ranks=0-1 place=S(0)", "shape=8 ranks=2-3 place=R", 4, 2);
    cr_assert_eq(plan_validate(p), RESHARD_OK, "%s", rs_error_message());
    struct plan_rank_stats r[4];
    struct plan_stats s = stats_of(p, r);
    cr_assert_eq(s.net_bytes, 16);
    cr_assert_eq(s.min_net_bytes, 16);
    cr_assert_eq(s.gather_bcast_bytes, 16);
    cr_assert_eq(s.lb_nic_bytes, 8);
    cr_assert_eq(s.max_nic_bytes, 8);
    cr_assert_eq(s.local_bytes, 16);
    cr_assert_eq(s.self_bytes, 0);
    for (int k = 0; k < 4; k++)
        cr_assert_eq(k < 2 ? r[k].net_out : r[k].net_in, 8, "rank %d", k);
    plan_free(p);
}

/*
 * Case B: 8 f32 elements on ranks 0-3 (2 each), domains {0,1} and {2,3}; destination ranks 0
 * and 1 want halves [0,4) and [4,8).
 *   rank 0: keeps [0,2) (self, 8 B), takes [2,4) from rank 1 (local, 8 B)
 *   rank 1: gets [4,6) from rank 2 and [6,8) from rank 3 over the network (16 B)
 *   min_net = the 4 elements domain 0 lacks                              = 16 B
 *   gather  = root domain holds [0,4): 32 - 16; no other destination domain = 16 B
 *   lb      = in(D0) / 2 receivers = 8; ranks 2 and 3 each alone hold 2 needed elements = 8
 *   max_nic = rank 1 receives 16: the bound assumes rank 0 could relay, which the plan does
 *             not do (only needers receive)
 */
Test(stats, partial_overlap_inside_and_across_domains)
{
    struct rs_plan *p = plan_one("shape=8 dtype=f32 ranks=0-3 place=S(0)",
                                 "shape=8 dtype=f32 ranks=0-1 place=S(0)", 4, 2);
    cr_assert_eq(plan_validate(p), RESHARD_OK, "%s", rs_error_message());
    struct plan_rank_stats r[4];
    struct plan_stats s = stats_of(p, r);
    cr_assert_eq(s.net_bytes, 16);
    cr_assert_eq(s.min_net_bytes, 16);
    cr_assert_eq(s.gather_bcast_bytes, 16);
    cr_assert_eq(s.lb_nic_bytes, 8);
    cr_assert_eq(s.max_nic_bytes, 16);
    cr_assert_eq(s.max_nic_rank, 1);
    cr_assert_eq(s.self_bytes, 8);
    cr_assert_eq(s.local_bytes, 8);
    cr_assert_eq(r[0].self, 8);
    cr_assert_eq(r[1].local_out, 8);
    cr_assert_eq(r[1].net_in, 16);
    cr_assert_eq(r[2].net_out, 8);
    cr_assert_eq(r[3].net_out, 8);
    plan_free(p);
}

/*
 * Case C: a 4x2 i8 tensor strided over 2 ranks of domain 0 (rank 0 rows 0 and 2, rank 1 rows
 * 1 and 3), to 2 replicas of a column split, one replica per domain (1 = {2,3}, 2 = {4,5}).
 *   min_net = 8 B into each of 2 domains                                 = 16 B
 *   gather  = root domain holds everything; broadcast to 2 domains       = 16 B
 *   lb      = in(D) / 2 receivers = 4; each source alone holds 4 elements two domains need: 8
 *   plan    = every source sends its 4 elements to each domain: max_nic 8; each destination
 *             rank receives its column: 4 B
 */
Test(stats, strided_source_to_replicated_column_split)
{
    struct rs_plan *p = plan_one("shape=4x2 dtype=i8 ranks=0-1 place=SS(0,2)",
                                 "shape=4x2 dtype=i8 ranks=2-5 mesh=2x2 place=R,S(1)", 6, 2);
    cr_assert_eq(plan_validate(p), RESHARD_OK, "%s", rs_error_message());
    struct plan_rank_stats r[6];
    struct plan_stats s = stats_of(p, r);
    cr_assert_eq(s.net_bytes, 16);
    cr_assert_eq(s.min_net_bytes, 16);
    cr_assert_eq(s.gather_bcast_bytes, 16);
    cr_assert_eq(s.lb_nic_bytes, 8);
    cr_assert_eq(s.max_nic_bytes, 8);
    cr_assert_eq(s.local_bytes, 0);
    cr_assert_eq(r[0].net_out, 8);
    cr_assert_eq(r[1].net_out, 8);
    for (int k = 2; k < 6; k++)
        cr_assert_eq(r[k].net_in, 4, "rank %d", k);
    cr_assert_eq(count_ops(p, PLAN_OP_NET), 16, "8 one-element cells into 2 domains");
    plan_free(p);
}

/* The three refits of make demo (scripts/demo.sh) meet the busiest-NIC target of 1.05 x the
 * bound and move exactly the minimum. */
Test(stats, demo_cases_meet_the_nic_bound)
{
    static const char *const cases[][2] = {
        {"shape=8192x28672 ranks=0-7 place=S(1)",
         "shape=8192x28672 ranks=8-15 mesh=2x4 place=R,S(1)"},
        {"shape=64x2048x7168 ranks=0-7 place=S(0)",
         "shape=64x2048x7168 ranks=8-23 mesh=2x8 place=R,S(1)"},
        {"shape=57344x8192 ranks=0-3 place=SS(0,2)",
         "shape=57344x8192 ranks=8-11 mesh=2x2 place=R,SS(0,2)"},
    };
    for (int i = 0; i < 3; i++) {
        struct rs_plan *p = plan_one(cases[i][0], cases[i][1], 24, 8);
        cr_assert_eq(plan_validate(p), RESHARD_OK, "%s", rs_error_message());
        struct plan_stats s = stats_of(p, NULL);
        cr_assert_eq(s.net_bytes, s.min_net_bytes, "case %d", i);
        cr_assert_leq((double)s.max_nic_bytes, 1.05 * (double)s.lb_nic_bytes,
                      "case %d: max_nic %lld lb %lld", i, (long long)s.max_nic_bytes,
                      (long long)s.lb_nic_bytes);
        plan_free(p);
    }
}
