/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Transfer lists (plugin/exec/xfer.c): what each algorithm lists for small plans worked by
 * hand. A 4x4 f32 tensor (64 bytes) held whole by rank 0; ranks {0,1} and {2,3} are domains.
 */
#include "plugin/exec/xfer.h"
#include "test/planner/plan_util.h"

#include <criterion/criterion.h>
#include <string.h>

#define WHOLE_ON_0 "shape=4x4 dtype=f32 ranks=0"

static struct xfer_set build(const struct rs_plan *p, reshard_algo_t algo)
{
    struct xfer_set xs;
    cr_assert_eq(xfer_build(p, algo, &xs), RESHARD_OK, "algo %d", (int)algo);
    return xs;
}

/* The box of a transfer: start[ndim], then len[ndim]. */
static const int64_t *box(const struct xfer_set *xs, const struct xfer *x)
{
    return xs->coords + x->box;
}

static void expect(const struct xfer *x, int src, int dst, enum xfer_path path, int src_buf,
                   int dst_buf, uint32_t parent)
{
    cr_assert_eq(x->src, src);
    cr_assert_eq(x->dst, dst);
    cr_assert_eq(x->path, path, "path %s", xfer_path_name((enum xfer_path)x->path));
    cr_assert_eq(x->src_buf, src_buf);
    cr_assert_eq(x->dst_buf, dst_buf);
    cr_assert_eq(x->parent, parent);
    cr_assert_eq(x->tensor, 0);
}

/* Rank 0 to rank 1 of its own domain: one local transfer of the whole box. */
Test(xfer, reshard_inside_a_domain_is_one_local_transfer)
{
    struct rs_plan *p = plan_one(WHOLE_ON_0, "shape=4x4 dtype=f32 ranks=1", 4, 2);
    struct xfer_set xs = build(p, RESHARD_ALGO_RESHARD);
    cr_assert_eq(xs.n, 1);
    expect(&xs.x[0], 0, 1, XFER_LOCAL, XBUF_SRC, XBUF_DST, XFER_NONE);
    cr_assert_eq(xs.x[0].bytes, 64);
    const int64_t *b = box(&xs, &xs.x[0]);
    cr_assert(b[0] == 0 && b[1] == 0 && b[2] == 4 && b[3] == 4);
    cr_assert_eq(xs.needs_tmp, 0);
    xfer_free(&xs);
    plan_free(p);
}

/* Wanted on both ranks of the other domain: reshard sends each half over the network once,
 * one to each rail of that domain, and each receiver forwards its half to the other rank of its
 * domain, out of its destination buffer, as it arrives. */
Test(xfer, reshard_crosses_to_a_domain_once_and_forwards_inside_it)
{
    struct rs_plan *p = plan_one(WHOLE_ON_0, "shape=4x4 dtype=f32 ranks=2-3 place=R", 4, 2);
    struct xfer_set xs = build(p, RESHARD_ALGO_RESHARD);
    cr_assert_eq(xs.n, 4);
    int nets = 0, fwds = 0;
    for (size_t i = 0; i < xs.n; i++) {
        const struct xfer *x = &xs.x[i];
        cr_assert_eq(x->bytes, 32, "transfer %zu: half the tensor", i);
        if (x->path == XFER_NET) {
            expect(x, 0, x->dst, XFER_NET, XBUF_SRC, XBUF_DST, XFER_NONE);
            nets |= 1 << x->dst;
            continue;
        }
        const struct xfer *par = &xs.x[x->parent];
        expect(x, par->dst, par->dst == 2 ? 3 : 2, XFER_LOCAL, XBUF_DST, XBUF_DST, x->parent);
        cr_assert_eq(par->path, XFER_NET);
        cr_assert_eq(memcmp(box(&xs, x), box(&xs, par), 4 * sizeof(int64_t)), 0,
                     "a forward moves its parent's box");
        fwds |= 1 << x->src;
    }
    cr_assert_eq(nets, 1 << 2 | 1 << 3, "a half to each rail");
    cr_assert_eq(fwds, 1 << 2 | 1 << 3, "each rail forwards its half");
    xfer_free(&xs);
    plan_free(p);
}

/* direct: no dedupe, every destination fetches its own copy over the network. */
Test(xfer, direct_sends_every_destination_its_own_copy)
{
    struct rs_plan *p = plan_one(WHOLE_ON_0, "shape=4x4 dtype=f32 ranks=2-3 place=R", 4, 2);
    struct xfer_set xs = build(p, RESHARD_ALGO_DIRECT);
    cr_assert_eq(xs.n, 2);
    cr_assert_neq(xs.x[0].dst, xs.x[1].dst);
    for (size_t i = 0; i < 2; i++) {
        cr_assert(xs.x[i].dst == 2 || xs.x[i].dst == 3);
        expect(&xs.x[i], 0, xs.x[i].dst, XFER_NET, XBUF_SRC, XBUF_DST, XFER_NONE);
        cr_assert_eq(xs.x[i].bytes, 64);
    }
    cr_assert_not_null(xs.aux, "direct keeps its singleton-domain plan");
    xfer_free(&xs);
    plan_free(p);
}

/* bcast: the gather into rank 0's whole-tensor buffer (a copy inside rank 0), a ring 0 -> 2 -> 3
 * of whole-tensor hops (the first after the gather, each after the one before), and each
 * destination's copy of its shard out of the whole tensor once it has arrived. */
Test(xfer, bcast_gathers_rings_and_extracts)
{
    struct rs_plan *p = plan_one(WHOLE_ON_0, "shape=4x4 dtype=f32 ranks=2-3 place=R", 4, 2);
    struct xfer_set xs = build(p, RESHARD_ALGO_BCAST);
    cr_assert_eq(xs.n, 5);
    cr_assert_eq(xs.needs_tmp, 1);
    expect(&xs.x[0], 0, 0, XFER_SELF, XBUF_SRC, XBUF_TMP, XFER_NONE);
    expect(&xs.x[1], 0, 2, XFER_NET, XBUF_TMP, XBUF_TMP, XFER_AFTER_INPUTS);
    expect(&xs.x[2], 2, 3, XFER_LOCAL, XBUF_TMP, XBUF_TMP, 1);
    expect(&xs.x[3], 2, 2, XFER_SELF, XBUF_TMP, XBUF_DST, XFER_AFTER_INPUTS);
    expect(&xs.x[4], 3, 3, XFER_SELF, XBUF_TMP, XBUF_DST, XFER_AFTER_INPUTS);
    for (size_t i = 0; i < xs.n; i++)
        cr_assert_eq(xs.x[i].bytes, 64, "transfer %zu", i);
    xfer_free(&xs);
    plan_free(p);
}

/* A row shard to a column shard on one rank each, in different domains: the overlap is a
 * quarter box, and it is the only transfer between that pair. */
Test(xfer, transfers_carry_the_overlap_box)
{
    struct rs_plan *p = plan_one("shape=4x4 dtype=f32 ranks=0-1 mesh=2 place=S(0)",
                                 "shape=4x4 dtype=f32 ranks=2-3 mesh=2 place=S(1)", 4, 2);
    struct xfer_set xs = build(p, RESHARD_ALGO_RESHARD);
    cr_assert_eq(xs.n, 4);
    int seen = 0;
    for (size_t i = 0; i < xs.n; i++) {
        const struct xfer *x = &xs.x[i];
        const int64_t *b = box(&xs, x);
        cr_assert_eq(x->path, XFER_NET);
        cr_assert_eq(x->bytes, 2 * 2 * 4);
        cr_assert_eq(b[0], 2 * x->src, "rows of rank %d", x->src); /* rows 0-1 or 2-3 */
        cr_assert_eq(b[1], 2 * (x->dst - 2), "columns of rank %d", x->dst);
        cr_assert(b[2] == 2 && b[3] == 2);
        seen |= 1 << (2 * x->src + (x->dst - 2));
    }
    cr_assert_eq(seen, 0xf, "every (source, destination) pair once");
    xfer_free(&xs);
    plan_free(p);
}

Test(xfer, an_unknown_algorithm_is_refused_and_leaves_nothing)
{
    struct rs_plan *p = plan_one(WHOLE_ON_0, "shape=4x4 dtype=f32 ranks=1", 4, 2);
    struct xfer_set xs = {.n = 7};
    cr_assert_eq(xfer_build(p, (reshard_algo_t)9, &xs), RESHARD_ERR_INVALID_ARG);
    cr_assert_eq(xs.n, 7, "a failed build wrote its output");
    cr_assert_str_eq(xfer_path_name(XFER_NET), "net");
    cr_assert_str_eq(xfer_path_name((enum xfer_path)7), "?");
    plan_free(p);
}
