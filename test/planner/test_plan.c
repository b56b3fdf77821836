/* SPDX-License-Identifier: Apache-2.0 */
/* Planner behaviours: local first, once per domain, fan-out, replica splitting, rails. */
#include "plan_util.h"
#include "base/error.h"
#include "planner/spec.h"
#include "planner/validate.h"

#include <criterion/criterion.h>

static void expect_valid(const struct rs_plan *p)
{
    cr_assert_eq(plan_validate(p), RESHARD_OK, "%s", rs_error_message());
}

Test(plan, colocated_identical_layouts_copy_in_place)
{
    struct rs_plan *p =
        plan_one("shape=8x8 ranks=0-3 place=S(0)", "shape=8x8 ranks=0-3 place=S(0)", 4, 4);
    expect_valid(p);
    cr_assert_eq(p->nops, 4);
    cr_assert_eq(count_ops(p, PLAN_OP_SELF), 4);
    for (size_t i = 0; i < p->nops; i++)
        cr_assert_eq(p->ops[i].src, p->ops[i].dst);
    plan_free(p);
}

Test(plan, a_domain_that_holds_a_piece_copies_it_locally)
{
    /* all eight ranks in one domain: source and destination differ, nothing crosses */
    struct rs_plan *p =
        plan_one("shape=8x8 ranks=0-3 place=S(0)", "shape=8x8 ranks=4-7 place=S(1)", 8, 8);
    expect_valid(p);
    struct plan_stats s = stats_of(p, NULL);
    cr_assert_eq(s.net_bytes, 0);
    cr_assert_eq(count_ops(p, PLAN_OP_LOCAL), 16, "each 4x2 destination shard meets 4 sources");
    cr_assert_eq(s.local_bytes, 8 * 8 * 2);
    plan_free(p);
}

Test(plan, a_cell_crosses_once_and_the_replicas_swap_slices)
{
    /* 2 sources in domain 0; 4 replicas in domain 1 each need the whole 8x4 tensor */
    struct rs_plan *p =
        plan_one("shape=8x4 ranks=0-1 place=S(0)", "shape=8x4 ranks=4-7 place=R", 8, 4);
    expect_valid(p);
    struct plan_rank_stats r[8];
    struct plan_stats s = stats_of(p, r);
    cr_assert_eq(s.net_bytes, 8 * 4 * 2, "the tensor crosses exactly once");
    cr_assert_eq(count_ops(p, PLAN_OP_NET), 8, "2 cells x 4 slices");
    cr_assert_eq(count_ops(p, PLAN_OP_FWD), 24, "each slice forwarded to the 3 other replicas");
    for (int k = 4; k < 8; k++) {
        cr_assert_eq(r[k].net_in, 16, "rank %d receives one row of each cell", k);
        cr_assert_eq(r[k].local_in, 48, "rank %d gets the other 6 rows locally", k);
    }
    plan_free(p);
}

Test(plan, fewer_rows_than_needers_cuts_another_dim)
{
    /* one 2x3 cell, 4 needers: no dim reaches 4, so the longest (3 columns) is cut */
    struct rs_plan *p = plan_one("shape=2x3 ranks=0 place=R", "shape=2x3 ranks=4-7 place=R", 8, 4);
    expect_valid(p);
    cr_assert_eq(count_ops(p, PLAN_OP_NET), 3);
    for (size_t i = 0; i < p->nops; i++)
        if (p->ops[i].kind == PLAN_OP_NET)
            cr_assert_eq(plan_op_len(p, &p->ops[i])[1], 1, "slices are single columns");
    cr_assert_eq(stats_of(p, NULL).net_bytes, 12);
    plan_free(p);
}

Test(plan, uneven_slices_give_the_larger_to_the_least_loaded)
{
    /* 5 rows over 2 needers: 3 + 2; validation proves the cover */
    struct rs_plan *p = plan_one("shape=5x2 ranks=0 place=R", "shape=5x2 ranks=2-3 place=R", 4, 2);
    expect_valid(p);
    struct plan_rank_stats r[4];
    stats_of(p, r);
    cr_assert_eq(r[2].net_in + r[3].net_in, 20);
    cr_assert_eq(r[2].net_in, 12, "rank 2 (lower rank on a tie) takes the 3-row slice");
    plan_free(p);
}

Test(plan, replicas_split_a_large_slice)
{
    int dom[] = {0, 1, 2};
    const char *src = "shape=64x64 dtype=f32 ranks=0-1 place=R";
    const char *dst = "shape=64x64 dtype=f32 ranks=2 place=R";
    struct rs_plan *p = plan_specs(1, &src, &dst, 3, 0, dom, 1024);
    expect_valid(p);
    struct plan_rank_stats r[3];
    stats_of(p, r);
    cr_assert_eq(r[0].net_out, 8192, "each replica sends half");
    cr_assert_eq(r[1].net_out, 8192);
    plan_free(p);

    p = plan_specs(1, &src, &dst, 3, 0, dom, 0); /* default 1 MiB: 16 KiB stays whole */
    expect_valid(p);
    stats_of(p, r);
    cr_assert_eq(r[0].net_out + r[1].net_out, 16384);
    cr_assert_eq(count_ops(p, PLAN_OP_NET), 1);
    plan_free(p);
}

Test(plan, ties_go_to_the_sender_on_the_receivers_rail)
{
    /* domains of 2: ranks 0,1 hold replicas (rails 0,1); rank 3 sits on rail 1 */
    struct rs_plan *p = plan_one("shape=4 ranks=0-1 place=R", "shape=4 ranks=3 place=R", 4, 2);
    cr_assert_eq(p->nops, 1);
    cr_assert_eq(p->ops[0].src, 1);
    plan_free(p);
    p = plan_one("shape=4 ranks=0-1 place=R", "shape=4 ranks=2 place=R", 4, 2);
    cr_assert_eq(p->ops[0].src, 0);
    plan_free(p);
}

Test(plan, the_receivers_rail_sends_every_tensor)
{
    /* rank 3 is rail 1 of domain 1; of the holders 0 (rail 0) and 1 (rail 1), 1 sends both */
    const char *src[] = {"shape=4 ranks=0-1 place=R", "shape=4 ranks=0-1 place=R"};
    const char *dst[] = {"shape=4 ranks=3 place=R", "shape=4 ranks=3 place=R"};
    struct rs_plan *p = plan_specs(2, src, dst, 4, 2, NULL, 0);
    expect_valid(p);
    cr_assert_eq(p->nops, 2);
    cr_assert_eq(p->ops[0].src, 1);
    cr_assert_eq(p->ops[1].src, 1);
    plan_free(p);
}

Test(plan, replicas_take_the_domains_in_turn)
{
    /* two holders on rail 0 (domains 0 and 1) feed four domains: runs 0 and 2 from rank 0,
     * runs 1 and 3 from rank 2, the same for every tensor of the layout */
    const char *src[] = {"shape=8 ranks=0,2 place=R", "shape=6 ranks=0,2 place=R"};
    const char *dst[] = {"shape=8 ranks=4,6,8,10 place=R", "shape=6 ranks=4,6,8,10 place=R"};
    struct rs_plan *p = plan_specs(2, src, dst, 12, 2, NULL, 0);
    expect_valid(p);
    cr_assert_eq(p->nops, 8);
    for (size_t i = 0; i < p->nops; i++) {
        int want = (p->ops[i].dst - 4) / 2 % 2 ? 2 : 0;
        cr_assert_eq(p->ops[i].src, want, "rank %d got tensor %u from %d", p->ops[i].dst,
                     (unsigned)p->ops[i].tensor, p->ops[i].src);
    }
    plan_free(p);
}

Test(plan, a_large_slice_for_one_receiver_is_cut_among_its_replicas)
{
    /* 4 MiB for one receiver, four holders on its rail: four 1 MiB pieces, one from each */
    struct rs_plan *p =
        plan_specs(1, (const char *[]){"shape=1024x1024 dtype=f32 ranks=0,2,4,6"},
                   (const char *[]){"shape=1024x1024 dtype=f32 ranks=8"}, 10, 2, NULL, 0);
    expect_valid(p);
    cr_assert_eq(p->nops, 4);
    int seen = 0;
    for (size_t i = 0; i < p->nops; i++) {
        cr_assert_eq(plan_op_bytes(p, &p->ops[i]), 1 << 20);
        seen |= 1 << p->ops[i].src;
    }
    cr_assert_eq(seen, 1 << 0 | 1 << 2 | 1 << 4 | 1 << 6);
    plan_free(p);
}

Test(plan, ranks_on_neither_side_have_no_work)
{
    struct rs_plan *p =
        plan_one("shape=16x16 ranks=0-3 place=S(0)", "shape=16x16 ranks=8-11 place=S(1)", 16, 4);
    expect_valid(p);
    for (size_t i = 0; i < p->nops; i++) {
        cr_assert((p->ops[i].src < 4) || (p->ops[i].src >= 8 && p->ops[i].src < 12));
        cr_assert(p->ops[i].dst >= 8 && p->ops[i].dst < 12);
    }
    plan_free(p);
}

Test(plan, overlapping_rank_sets)
{
    struct rs_plan *p = plan_one("shape=12x6 ranks=0-3 place=S(0)",
                                 "shape=12x6 ranks=2-5 mesh=2x2 place=S(1),S(0)", 6, 2);
    expect_valid(p);
    struct plan_stats s = stats_of(p, NULL);
    cr_assert_eq(s.net_bytes, s.min_net_bytes);
    cr_assert_gt(count_ops(p, PLAN_OP_SELF), 0, "ranks 2 and 3 keep part of their rows");
    plan_free(p);
}

Test(plan, mismatched_pairs_are_refused)
{
    struct rs_plan *p;
    const char *s1 = "shape=4x4 ranks=0-1", *d1 = "shape=4x5 ranks=2-3";
    cr_assert_eq(try_plan_specs(1, &s1, &d1, 4, 2, NULL, &p), RESHARD_ERR_MISMATCH);
    cr_assert_str_eq(rs_error_message(),
                     "tensor 't0': source shape 4x4 differs from destination shape 4x5");
    const char *s2 = "shape=4x4 dtype=f32 ranks=0-1", *d2 = "shape=4x4 ranks=2-3";
    cr_assert_eq(try_plan_specs(1, &s2, &d2, 4, 2, NULL, &p), RESHARD_ERR_MISMATCH);
    cr_assert_str_eq(rs_error_message(),
                     "tensor 't0': source dtype f32 differs from destination dtype bf16");
    const char *s3 = "shape=4x4 ranks=0-1", *d3 = "shape=4x4 ranks=2-4";
    cr_assert_eq(try_plan_specs(1, &s3, &d3, 4, 2, NULL, &p), RESHARD_ERR_RANK_RANGE);
    cr_assert_str_eq(rs_error_message(),
                     "tensor 't0': destination rank 4 is outside the communicator of 4 ranks");
}

Test(plan, bad_layout_structs_name_tensor_and_side)
{
    int ranks[] = {0, 1};
    struct rs_layout ok = {
        .ndim = 1, .shape = {4}, .nranks = 2, .ranks = ranks, .mesh_ndim = 1, .mesh = {2}};
    struct rs_layout bad = ok;
    bad.mesh[0] = 3;
    struct rs_topo topo;
    cr_assert_eq(topo_create(2, 2, NULL, &topo), RESHARD_OK);
    struct plan_input in = {.name = "w", .src = &ok, .dst = &bad};
    struct rs_plan *p;
    cr_assert_eq(plan_build(&in, 1, &topo, NULL, PLAN_ALL_RANKS, &p), RESHARD_ERR_MESH_SIZE);
    cr_assert_str_eq(rs_error_message(),
                     "tensor 'w' destination: mesh: 3 holds 3 ranks but ranks lists 2");
    in.dst = NULL;
    cr_assert_eq(plan_build(&in, 1, &topo, NULL, PLAN_ALL_RANKS, &p), RESHARD_ERR_INVALID_ARG);
    cr_assert_str_eq(rs_error_message(), "tensor 'w': missing destination layout");
    cr_assert_eq(plan_build(&in, 0, &topo, NULL, PLAN_ALL_RANKS, &p), RESHARD_ERR_INVALID_ARG);
    cr_assert_eq(plan_build(&in, 1, NULL, NULL, PLAN_ALL_RANKS, &p), RESHARD_ERR_INVALID_ARG);
    /* refused before the list is read: an op names its tensor in 30 bits */
    cr_assert_eq(plan_build(&in, PLAN_MAX_TENSORS + 1, &topo, NULL, PLAN_ALL_RANKS, &p),
                 RESHARD_ERR_TOO_LARGE);
    cr_assert_str_eq(rs_error_message(),
                     "plan: 536870913 tensors, more than the 536870912 one plan holds");
    topo_free(&topo);
}

Test(plan, the_hash_is_deterministic_and_covers_the_topology)
{
    const char *s = "shape=64x32 ranks=0-7 mesh=2x4 place=S(1),S(0)";
    const char *d = "shape=64x32 ranks=8-15 mesh=4x2 place=R,SS(0,2)";
    struct rs_plan *a = plan_one(s, d, 16, 4), *b = plan_one(s, d, 16, 4);
    struct rs_plan *c = plan_one(s, d, 16, 8);
    cr_assert_eq(a->hash, b->hash);
    cr_assert_neq(a->hash, c->hash);
    cr_assert_eq(a->nops, b->nops);
    plan_free(a);
    plan_free(b);
    plan_free(c);
}

/* Finding 6 of issue 19: with RESHARD_PLAN_MAX_OPS=3000000, 16,384 row shards into a 16 x 1,024
 * mesh replicated over 1,024 used to build 16.8 M ops (and a world of 1 M ranks ran out of
 * memory): the pre-check counted overlap cells, not the ops forwarding adds. The limit now
 * counts ops as they are emitted and stops there. */
Test(plan, a_fan_out_past_the_op_limit_is_refused_as_its_ops_are_emitted, .timeout = 60)
{
    const char *s = "shape=16384x1024 ranks=0-16383 place=S(0)";
    const char *d = "shape=16384x1024 mesh=16x1024 place=S(0),R";
    struct rs_layout l[2];
    struct spec_opts o = {.world_size = 16384};
    cr_assert_eq(spec_parse(s, &o, &l[0]), RESHARD_OK, "%s", rs_error_message());
    cr_assert_eq(spec_parse(d, &o, &l[1]), RESHARD_OK, "%s", rs_error_message());
    struct rs_topo topo;
    cr_assert_eq(topo_create(16384, 8, NULL, &topo), RESHARD_OK);
    struct plan_input in = {.name = "w", .src = &l[0], .dst = &l[1]};
    struct plan_opts opts = {.max_ops = 3000000};
    struct rs_plan *p = NULL;
    cr_assert_eq(plan_build(&in, 1, &topo, &opts, PLAN_ALL_RANKS, &p), RESHARD_ERR_TOO_LARGE);
    cr_assert_null(p);
    cr_assert_str_eq(rs_error_message(), "plan: more than 3000000 transfers (RESHARD_PLAN_MAX_OPS, "
                                         "at tensor 'w'): coarsen the layouts or raise the limit");
    topo_free(&topo);
    layout_free(&l[0]);
    layout_free(&l[1]);
}

Test(plan, the_op_limit_refuses_before_building)
{
    const char *s = "shape=16x16 ranks=0-3 place=S(0)", *d = "shape=16x16 ranks=4-7 place=S(1)";
    struct rs_layout l[2];
    struct spec_opts o = {0};
    cr_assert_eq(spec_parse(s, &o, &l[0]), RESHARD_OK);
    cr_assert_eq(spec_parse(d, &o, &l[1]), RESHARD_OK);
    struct rs_topo topo;
    cr_assert_eq(topo_create(8, 4, NULL, &topo), RESHARD_OK);
    struct plan_input in = {.name = "w", .src = &l[0], .dst = &l[1]};
    struct plan_opts opts = {.max_ops = 15}; /* 4 x 4 cells, one destination domain: 16 */
    struct rs_plan *p;
    cr_assert_eq(plan_build(&in, 1, &topo, &opts, PLAN_ALL_RANKS, &p), RESHARD_ERR_TOO_LARGE);
    cr_assert_str_eq(rs_error_message(),
                     "plan: tensor 'w' needs at least 16 transfers, more than the 15 left of "
                     "RESHARD_PLAN_MAX_OPS; coarsen the layouts or raise the limit");
    opts.max_ops = 16;
    cr_assert_eq(plan_build(&in, 1, &topo, &opts, PLAN_ALL_RANKS, &p), RESHARD_OK, "%s",
                 rs_error_message());
    cr_assert_eq(p->nops, 16, "the estimate is exact here: one NET op per cell");
    plan_free(p);
    topo_free(&topo);
    layout_free(&l[0]);
    layout_free(&l[1]);
}

Test(plan, byte_counts_that_could_wrap_are_refused)
{
    /* 2^51 bytes to 8192 ranks: 2^64 bytes of destination copies */
    const char *s = "shape=1125899906842624 ranks=0", *d = "shape=1125899906842624 ranks=1-8192";
    struct rs_plan *p;
    cr_assert_eq(try_plan_specs(1, &s, &d, 8193, 1, NULL, &p), RESHARD_ERR_TOO_LARGE);
    cr_assert_str_eq(rs_error_message(), "plan: the tensors times their destination copies "
                                         "exceed 2^62 bytes (at tensor 't0')");
}

Test(plan, more_than_2_32_overlap_boxes_are_refused, .timeout = 60)
{
    /* 65537 single rows against 65537 single columns */
    const char *s = "shape=65537x65537 dtype=u8 ranks=0-65536 place=S(0)";
    const char *d = "shape=65537x65537 dtype=u8 ranks=0-65536 place=S(1)";
    struct rs_plan *p;
    cr_assert_eq(try_plan_specs(1, &s, &d, 65537, 8, NULL, &p), RESHARD_ERR_TOO_LARGE);
    cr_assert_str_eq(rs_error_message(), "plan: more than 2^32 overlap boxes in one tensor");
}

Test(plan, a_missing_source_is_named)
{
    int ranks[] = {0};
    struct rs_layout ok = {
        .ndim = 1, .shape = {4}, .nranks = 1, .ranks = ranks, .mesh_ndim = 1, .mesh = {1}};
    struct rs_topo topo;
    cr_assert_eq(topo_create(1, 1, NULL, &topo), RESHARD_OK);
    struct plan_input in = {.name = NULL, .src = NULL, .dst = &ok};
    struct rs_plan *p;
    cr_assert_eq(plan_build(&in, 1, &topo, NULL, PLAN_ALL_RANKS, &p), RESHARD_ERR_INVALID_ARG);
    cr_assert_str_eq(rs_error_message(), "tensor 't0': missing source layout");
    topo_free(&topo);
}

Test(plan, the_hash_covers_views_and_names)
{
    const char *s = "shape=8x4 ranks=0-1 place=S(0)";
    const char *d1 = "shape=8x4 ranks=2-3 place=S(1)";
    const char *d2 = "shape=8x4 ranks=2-3 place=S(1) buffer=qkv offset=4096";
    struct rs_plan *a = plan_one(s, d1, 4, 2), *b = plan_one(s, d2, 4, 2);
    cr_assert_eq(a->nops, b->nops, "the same ops");
    cr_assert_neq(a->hash, b->hash, "but the view differs");
    plan_free(a);
    plan_free(b);

    struct rs_layout l[2];
    cr_assert_eq(spec_parse(s, NULL, &l[0]), RESHARD_OK);
    cr_assert_eq(spec_parse(d1, NULL, &l[1]), RESHARD_OK);
    struct rs_topo topo;
    cr_assert_eq(topo_create(4, 2, NULL, &topo), RESHARD_OK);
    struct plan_input x = {.name = "x", .src = &l[0], .dst = &l[1]},
                      y = {.name = "y", .src = &l[0], .dst = &l[1]};
    cr_assert_eq(plan_build(&x, 1, &topo, NULL, PLAN_ALL_RANKS, &a), RESHARD_OK);
    cr_assert_eq(plan_build(&y, 1, &topo, NULL, PLAN_ALL_RANKS, &b), RESHARD_OK);
    cr_assert_neq(a->hash, b->hash, "tensor names are part of the agreement");
    plan_free(a);
    plan_free(b);
    topo_free(&topo);
    layout_free(&l[0]);
    layout_free(&l[1]);
}

Test(plan, the_largest_split_threshold_never_splits)
{
    int dom[] = {0, 1, 2};
    const char *src = "shape=64x64 dtype=f32 ranks=0-1 place=R";
    const char *dst = "shape=64x64 dtype=f32 ranks=2 place=R";
    struct rs_plan *p = plan_specs(1, &src, &dst, 3, 0, dom, INT64_MAX);
    cr_assert_eq(count_ops(p, PLAN_OP_NET), 1);
    plan_free(p);
}
