/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Chunks (plugin/exec/exec_chunk.c): a transfer's box cut along its outermost dim whose inner
 * part fits a chunk. Worked by hand for f32 tensors held whole by rank 0 and wanted by rank 1.
 */
#include "base/param.h"
#include "plugin/exec/exec.h"
#include "plugin/exec/exec_chunk.h"
#include "test/planner/plan_util.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

struct cut_case {
    struct rs_plan *p;
    struct xfer_set xs;
    struct exec_cut cut;
};

/* The one transfer of a shape=`shape` f32 tensor from rank 0 to rank 1, cut in chunks of
 * chunk_bytes. */
static void open_case(struct cut_case *c, const char *shape, int64_t chunk_bytes)
{
    char src[128], dst[128];
    snprintf(src, sizeof(src), "shape=%s dtype=f32 ranks=0", shape);
    snprintf(dst, sizeof(dst), "shape=%s dtype=f32 ranks=1", shape);
    c->p = plan_one(src, dst, 2, 2);
    cr_assert_eq(xfer_build(c->p, RESHARD_ALGO_RESHARD, &c->xs), RESHARD_OK);
    cr_assert_eq(c->xs.n, 1);
    exec_cut_init(&c->cut, c->p, &c->xs);
    c->cut.chunk_bytes = chunk_bytes;
}

static void close_case(struct cut_case *c)
{
    xfer_free(&c->xs);
    plan_free(c->p);
}

/* 64 rows of 256 bytes in chunks of 4 KiB: 16 rows a chunk. */
Test(chunk, whole_rows_go_into_a_chunk_while_they_fit)
{
    struct cut_case c;
    open_case(&c, "64x64", 4096);
    const struct xfer *x = &c.xs.x[0];
    cr_assert_eq(exec_nchunks(&c.cut, x), 4);
    for (uint32_t k = 0; k < 4; k++) {
        struct region r;
        exec_chunk_region(&c.cut, x, k, 0, &r);
        cr_assert_eq(r.start[0], 16 * k);
        cr_assert_eq(r.len[0], 16);
        cr_assert_eq(r.start[1], 0);
        cr_assert_eq(r.len[1], 64);
        cr_assert_eq(exec_chunk_bytes_of(&c.cut, x, k), 4096);
    }
    close_case(&c);
}

/* 4 x 8 x 300: a 300-element row is 1200 bytes, 3 rows fit 4 KiB, 8 rows do not: dim 1 is cut
 * in steps of 3 (3 chunks: rows 0-2, 3-5, 6-7), once per index of dim 0: 12 chunks. */
Test(chunk, the_cut_dim_is_the_outermost_whose_inner_part_fits)
{
    struct cut_case c;
    open_case(&c, "4x8x300", 4096);
    const struct xfer *x = &c.xs.x[0];
    cr_assert_eq(exec_nchunks(&c.cut, x), 12);
    struct region r;
    exec_chunk_region(&c.cut, x, 4, 1, &r); /* dim 0 index 1, dim 1 rows 3-5 */
    cr_assert(r.start[0] == 1 && r.len[0] == 1);
    cr_assert(r.start[1] == 3 && r.len[1] == 3);
    cr_assert(r.start[2] == 0 && r.len[2] == 300);
    exec_chunk_region(&c.cut, x, 5, 1, &r); /* the short last step: rows 6-7 */
    cr_assert(r.start[1] == 6 && r.len[1] == 2);
    cr_assert_eq(exec_chunk_bytes_of(&c.cut, x, 5), 2 * 1200);
    exec_chunk_region(&c.cut, x, 11, 1, &r);
    cr_assert(r.start[0] == 3 && r.start[1] == 6);
    close_case(&c);
}

/* 2 rows of 3000 elements (12000 bytes each): a row is cut into 1024-element pieces. */
Test(chunk, a_row_wider_than_a_chunk_is_cut_within_itself)
{
    struct cut_case c;
    open_case(&c, "2x3000", 4096);
    const struct xfer *x = &c.xs.x[0];
    cr_assert_eq(exec_nchunks(&c.cut, x), 6);
    struct region r;
    exec_chunk_region(&c.cut, x, 2, 0, &r);
    cr_assert(r.start[0] == 0 && r.len[0] == 1);
    cr_assert(r.start[1] == 2048 && r.len[1] == 952);
    cr_assert_eq(exec_chunk_bytes_of(&c.cut, x, 2), 952 * 4);
    exec_chunk_region(&c.cut, x, 3, 0, &r);
    cr_assert(r.start[0] == 1 && r.start[1] == 0 && r.len[1] == 1024);
    close_case(&c);
}

Test(chunk, a_box_smaller_than_a_chunk_is_one_chunk)
{
    struct cut_case c;
    open_case(&c, "4x4", 4096);
    cr_assert_eq(exec_nchunks(&c.cut, &c.xs.x[0]), 1);
    cr_assert_eq(exec_chunk_bytes_of(&c.cut, &c.xs.x[0], 0), 64);
    close_case(&c);
}

/* Both sides of a transfer find the same chunks in their own layouts: rows of rank 0 to the
 * columns of rank 1, 4x8 f32 cut in 16-byte chunks (a row half each). */
Test(chunk, both_sides_cut_alike_in_their_own_layouts)
{
    struct rs_plan *p = plan_one("shape=4x8 dtype=f32 ranks=0",
                                 "shape=4x8 dtype=f32 ranks=1-2 "
                                 "mesh=2 place=S(1)",
                                 3, 3);
    struct xfer_set xs;
    cr_assert_eq(xfer_build(p, RESHARD_ALGO_RESHARD, &xs), RESHARD_OK);
    struct exec_cut cut;
    exec_cut_init(&cut, p, &xs);
    cut.chunk_bytes = 16;
    for (size_t i = 0; i < xs.n; i++) {
        const struct xfer *x = &xs.x[i];
        cr_assert_eq(exec_nchunks(&cut, x), 4, "4 rows of 4 columns");
        struct region a, b;
        exec_chunk_region(&cut, x, 1, 0, &a);
        exec_chunk_region(&cut, x, 1, 1, &b);
        cr_assert_eq(region_bytes(&a), 16);
        cr_assert_eq(region_bytes(&b), 16);
        cr_assert_eq(a.shape[1], 8, "the source holds whole rows");
        cr_assert_eq(b.shape[1], 4, "the destination holds half rows");
        cr_assert_eq(a.start[1], 4 * (x->dst - 1));
        cr_assert_eq(b.start[1], 0);
        cr_assert(a.start[0] == 1 && b.start[0] == 1);
    }
    xfer_free(&xs);
    plan_free(p);
}

Test(chunk, the_sizes_come_from_the_tunables_and_coalescing_stays_within_a_chunk)
{
    setenv("RESHARD_CHUNK_BYTES", "8192", 1);
    setenv("RESHARD_COALESCE_BYTES", "65536", 1);
    rs_param_reload();
    cr_assert_eq(exec_chunk_bytes(), 8192);
    cr_assert_eq(exec_coalesce_bytes(), 8192);
    setenv("RESHARD_CHUNK_BYTES", "4294967296", 1);
    setenv("RESHARD_COALESCE_BYTES", "1024", 1);
    rs_param_reload();
    cr_assert_eq(exec_chunk_bytes(), EXEC_MAX_CHUNK_BYTES);
    struct exec_cut cut;
    exec_cut_init(&cut, NULL, NULL);
    cr_assert_eq(cut.chunk_bytes, EXEC_MAX_CHUNK_BYTES);
    cr_assert_eq(cut.coalesce_bytes, 1024);
}
