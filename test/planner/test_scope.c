/* SPDX-License-Identifier: Apache-2.0 */
/*
 * One rule, two scopes: on worlds up to 64 ranks, every rank's own plan (plan_build at its
 * scope) equals its slice of the whole world's plan op for op, and a rank with nothing of a
 * tensor plans nothing for it. The property suite checks the same on its 10,000 pairs.
 */
#include "plan_util.h"
#include "base/error.h"
#include "planner/validate.h"

#include <criterion/criterion.h>
#include <stdio.h>

static void check(int n, const char *const *src, const char *const *dst, int world, int dsize,
                  int64_t split_min)
{
    struct rs_plan *p = plan_specs(n, src, dst, world, dsize, NULL, split_min);
    cr_assert_eq(plan_validate(p), RESHARD_OK, "%s", rs_error_message());
    char why[128];
    snprintf(why, sizeof(why), "%d tensor(s) on %d ranks in domains of %d", n, world, dsize);
    check_rank_scopes(p, why);
    plan_free(p);
}

Test(scope, fan_out_from_dp_replicas_to_tp_groups)
{
    const char *src[] = {"shape=512x96 dtype=f32 ranks=0-31 mesh=4x8 place=R,S(0)"};
    const char *dst[] = {"shape=512x96 dtype=f32 ranks=32-63 mesh=2x16 place=R,S(1)"};
    check(1, src, dst, 64, 8, 0);
}

Test(scope, uneven_rows_and_sixteen_replicas)
{
    const char *src[] = {"shape=1000x17 ranks=0-15 place=R"};
    const char *dst[] = {"shape=1000x17 ranks=16-63 mesh=3x16 place=R,S(0)"};
    check(1, src, dst, 64, 8, 4096); /* small split_min: replicas share the large slices */
}

Test(scope, strided_shards_and_a_three_dim_tensor)
{
    const char *src[] = {"shape=8x12x40 dtype=i32 ranks=0-7 mesh=2x4 place=SS(0,2),S(1)"};
    const char *dst[] = {"shape=8x12x40 dtype=i32 ranks=8-63 mesh=7x8 place=R,S(2)"};
    check(1, src, dst, 64, 4, 0);
}

Test(scope, overlapping_sides_and_several_tensors)
{
    const char *src[] = {"shape=64x64 ranks=0-31 mesh=2x16 place=S(0),S(1)",
                         "shape=100 dtype=u8 ranks=0-63 place=S(0)", "shape=33x5 ranks=5 place=R"};
    const char *dst[] = {"shape=64x64 ranks=16-47 mesh=4x8 place=S(1),R",
                         "shape=100 dtype=u8 ranks=0-63 mesh=8x8 place=R,S(0)",
                         "shape=33x5 ranks=0-63 place=S(0)"};
    check(3, src, dst, 64, 8, 0);
}

Test(scope, absent_ranks_are_served_by_replicas_in_both_scopes)
{
    const char *src = "shape=256x8 ranks=0-15 mesh=4x4 place=R,S(0)";
    const char *dst = "shape=256x8 ranks=16-63 mesh=6x8 place=R,S(1)";
    struct rs_plan *whole = plan_one(src, dst, 64, 8);
    struct rs_topo t;
    cr_assert_eq(topo_copy(&whole->topo, &t), RESHARD_OK);
    int gone[] = {1, 6, 40};
    cr_assert_eq(topo_set_absent(&t, gone, 3), RESHARD_OK);
    struct plan_input in = {.name = whole->tensors[0].name,
                            .src = &whole->tensors[0].src,
                            .dst = &whole->tensors[0].dst};
    struct rs_plan *p = NULL;
    cr_assert_eq(plan_build(&in, 1, &t, NULL, PLAN_ALL_RANKS, &p), RESHARD_OK, "%s",
                 rs_error_message());
    cr_assert_eq(plan_validate(p), RESHARD_OK, "%s", rs_error_message());
    cr_assert_neq(p->hash, whole->hash, "the absent ranks are part of the inputs");
    check_rank_scopes(p, "three ranks absent");
    for (size_t i = 0; i < p->nops; i++)
        for (int g = 0; g < 3; g++)
            cr_assert(p->ops[i].src != gone[g] && p->ops[i].dst != gone[g]);
    plan_free(p);
    plan_free(whole);
    topo_free(&t);
}

Test(scope, a_rank_outside_every_tensor_plans_nothing)
{
    struct rs_plan *whole = plan_one("shape=64 ranks=0-3 place=S(0)", "shape=64 ranks=4-7", 12, 4);
    struct plan_input in = {.name = whole->tensors[0].name,
                            .src = &whole->tensors[0].src,
                            .dst = &whole->tensors[0].dst};
    struct rs_plan *p = NULL;
    cr_assert_eq(plan_build(&in, 1, &whole->topo, NULL, 10, &p), RESHARD_OK);
    cr_assert_eq(p->nops, 0);
    cr_assert_eq(p->hash, whole->hash);
    plan_free(p);
    cr_assert_eq(plan_build(&in, 1, &whole->topo, NULL, 12, &p), RESHARD_ERR_RANK_RANGE);
    plan_free(whole);
}
