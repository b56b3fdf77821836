/* SPDX-License-Identifier: Apache-2.0 */
/* Plans into FP8 destinations: each cell quantized where its source holds its blocks whole
 * (FP8 on the wire, its scales beside it), else moved in the source dtype; a scales tensor per
 * weight; misaligned destinations and impossible casts refused; both scopes agree. */
#include "plan_util.h"
#include "base/error.h"
#include "planner/spec.h"
#include "planner/validate.h"

#include <criterion/criterion.h>
#include <string.h>

static struct plan_stats check_valid(struct rs_plan *p, const char *why)
{
    cr_assert_eq(plan_validate(p), RESHARD_OK, "%s: %s", why, rs_error_message());
    struct plan_stats s = stats_of(p, NULL);
    cr_assert_eq(s.net_bytes, s.min_net_bytes, "%s: net %lld, min %lld", why,
                 (long long)s.net_bytes, (long long)s.min_net_bytes);
    check_rank_scopes(p, why);
    return s;
}

static size_t count_at_src(const struct rs_plan *p, uint32_t tensor, int at_src)
{
    size_t n = 0;
    for (size_t i = 0; i < p->nops; i++)
        n += p->ops[i].tensor == tensor && p->ops[i].kind == PLAN_OP_NET &&
             p->ops[i].at_src == (uint32_t)at_src;
    return n;
}

Test(quant_plan, aligned_sources_quantize_before_the_network_and_halve_the_bytes)
{
    const char *src = "shape=512x256 dtype=bf16 ranks=0-3 place=S(0)";
    const char *dst = "shape=512x256 dtype=fp8e4m3 ranks=4-7 mesh=2x2 place=R,S(1) "
                      "quant=block(128,128)";
    struct rs_plan *p = plan_one(src, dst, 8, 2);
    struct plan_stats s = check_valid(p, "aligned");
    cr_assert_eq(p->ntensors, 2, "the weight and its scales");
    cr_assert_eq(p->ninputs, 1);
    cr_assert_str_eq(p->tensors[1].name, "t0.scale");
    cr_assert_eq(p->tensors[1].dst.shape[0], 4);
    cr_assert_eq(p->tensors[1].dst.shape[1], 2);
    cr_assert_eq(p->tensors[1].dst.dtype, RS_DTYPE_F32);
    cr_assert_eq(count_at_src(p, 0, 0), 0, "every cell is quantized at its source");
    cr_assert_gt(count_at_src(p, 0, 1), 0);
    struct rs_plan *bf =
        plan_one(src, "shape=512x256 dtype=bf16 ranks=4-7 mesh=2x2 place=R,S(1)", 8, 2);
    struct plan_stats sb = stats_of(bf, NULL);
    cr_assert_leq(s.net_bytes * 100, sb.net_bytes * 51, "FP8 %lld bytes, bf16 %lld",
                  (long long)s.net_bytes, (long long)sb.net_bytes);
    /* two domains receive the whole tensor in FP8 and its 8 scales */
    cr_assert_eq(s.net_bytes, 2 * (512 * 256 + 8 * 4));
    cr_assert_eq(s.quant_bytes, 2 * 512 * 256, "both domains' replicas");
    cr_assert_eq(s.quant_at_src_bytes, s.quant_bytes, "all of it at the senders");
    plan_free(bf);
    plan_free(p);
}

Test(quant_plan, blocks_no_source_holds_whole_travel_in_the_source_dtype)
{
    /* 512 rows on 3 ranks: 171, 171, 170; blocks 1 and 2 straddle the shard boundaries */
    struct rs_plan *p = plan_one("shape=512x128 dtype=bf16 ranks=0-2 place=S(0)",
                                 "shape=512x128 dtype=fp8e5m2 ranks=4-5 place=S(0) "
                                 "quant=block(128,64)",
                                 6, 2);
    struct plan_stats s = check_valid(p, "unaligned source");
    cr_assert_gt(count_at_src(p, 0, 0), 0, "the straddling blocks move as bf16");
    cr_assert_gt(count_at_src(p, 0, 1), 0, "blocks 0 and 3 are held whole");
    int64_t fp8 = 0, bf16 = 0;
    for (size_t i = 0; i < p->nops; i++)
        if (p->ops[i].tensor == 0 && p->ops[i].kind == PLAN_OP_NET)
            *(p->ops[i].at_src ? &fp8 : &bf16) += plan_op_bytes(p, &p->ops[i]);
    /* rows 0-127 (rank 0) and 384-511 (rank 2) in FP8; rows 128-383 in bf16 */
    cr_assert_eq(fp8, 2 * 128 * 128);
    cr_assert_eq(bf16, 256 * 128 * 2);
    cr_assert_eq(s.net_bytes, fp8 + bf16 + 2 * 2 * 4, "and the scales of blocks 0 and 3");
    cr_assert_eq(s.quant_bytes, 512 * 128, "every destination element once, in FP8");
    cr_assert_eq(s.quant_at_src_bytes, 2 * 128 * 128, "rows 0-127 and 384-511");
    plan_free(p);
}

Test(quant_plan, fp8_sources_with_the_same_blocks_move_with_their_scales)
{
    struct rs_plan *p = plan_one("shape=256x256 dtype=fp8e4m3 ranks=0-1 place=S(0) "
                                 "quant=block(128,128)",
                                 "shape=256x256 dtype=fp8e4m3 ranks=2-5 mesh=2x2 place=S(1),R "
                                 "quant=block(128,128)",
                                 6, 2);
    check_valid(p, "fp8 to fp8");
    cr_assert_eq(p->tensors[0].quant, PLAN_QUANT_MOVE);
    cr_assert_eq(count_at_src(p, 0, 1), 0, "nothing to quantize");
    cr_assert_gt(count_ops(p, PLAN_OP_NET), 0);
    plan_free(p);
}

Test(quant_plan, per_channel_scales_of_rows_split_by_columns_are_made_where_they_land)
{
    struct rs_plan *p =
        plan_one("shape=64x32 dtype=f32 ranks=0-1 place=S(1)",
                 "shape=64x32 dtype=fp8e4m3 ranks=2-3 place=S(0) quant=channel", 4, 2);
    check_valid(p, "channel");
    cr_assert_eq(p->tensors[1].dst.shape[0], 64);
    cr_assert_eq(p->tensors[1].dst.shape[1], 1);
    cr_assert_eq(count_at_src(p, 0, 1), 0, "no source holds a whole row");
    size_t scale_ops = 0;
    for (size_t i = 0; i < p->nops; i++)
        scale_ops += p->ops[i].tensor == 1;
    cr_assert_eq(scale_ops, 0, "scales are computed at the destination");
    plan_free(p);
}

Test(quant_plan, scales_take_vllm_names_and_given_ones)
{
    struct rs_layout l[2];
    struct spec_opts o = {.world_size = 4};
    cr_assert_eq(spec_parse("shape=256x128 dtype=bf16 ranks=0-1 place=S(0)", &o, &l[0]),
                 RESHARD_OK);
    cr_assert_eq(spec_parse("shape=256x128 dtype=fp8e4m3 ranks=2-3 place=S(0) "
                            "quant=block(128,128)",
                            &o, &l[1]),
                 RESHARD_OK);
    struct rs_topo topo;
    cr_assert_eq(topo_create(4, 2, NULL, &topo), RESHARD_OK);
    struct plan_input in[2] = {{.name = "m.down_proj.weight", .src = &l[0], .dst = &l[1]},
                               {.name = "m.up", .src = &l[0], .dst = &l[1], .scales_name = "s"}};
    struct rs_plan *p = NULL;
    cr_assert_eq(plan_build(in, 2, &topo, NULL, PLAN_ALL_RANKS, &p), RESHARD_OK, "%s",
                 rs_error_message());
    cr_assert_eq(p->ntensors, 4);
    cr_assert_str_eq(p->tensors[2].name, "m.down_proj.weight_scale_inv");
    cr_assert_str_eq(p->tensors[3].name, "s");
    cr_assert_eq(p->tensors[0].scales, 2);
    cr_assert_eq(p->tensors[3].scales_of, 1);
    plan_free(p);
    topo_free(&topo);
    layout_free(&l[0]);
    layout_free(&l[1]);
}

Test(quant_plan, misaligned_destinations_and_impossible_casts_are_refused)
{
    struct rs_plan *p = NULL;
    const char *src[] = {"shape=500x256 dtype=bf16 ranks=0-2 place=S(0)"};
    const char *dst[] = {"shape=500x256 dtype=fp8e4m3 ranks=3-5 place=S(0) quant=block(128,128)"};
    cr_assert_eq(try_plan_specs(1, src, dst, 6, 3, NULL, &p), RESHARD_ERR_SPEC_SYNTAX);
    cr_assert(strstr(rs_error_message(), "tensor 't0' destination: the shard of rank 3 ends at "
                                         "index 167 of dim 0, not on a boundary of its "
                                         "128-wide blocks (quant=block(128,128))"),
              "%s", rs_error_message());
    const char *s2[] = {"shape=128x128 dtype=i32 ranks=0"};
    const char *d2[] = {"shape=128x128 dtype=fp8e4m3 ranks=1 quant=tensor"};
    cr_assert_eq(try_plan_specs(1, s2, d2, 2, 1, NULL, &p), RESHARD_ERR_MISMATCH);
    cr_assert(strstr(rs_error_message(), "takes a bf16, f16 or f32 source"), "%s",
              rs_error_message());
    const char *s3[] = {"shape=128x128 dtype=fp8e4m3 ranks=0 quant=tensor"};
    const char *d3[] = {"shape=128x128 dtype=fp8e4m3 ranks=1"};
    cr_assert_eq(try_plan_specs(1, s3, d3, 2, 1, NULL, &p), RESHARD_ERR_MISMATCH);
    cr_assert(strstr(rs_error_message(), "a quantized source needs a destination quantized alike"),
              "%s", rs_error_message());
}
