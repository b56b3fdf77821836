/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Regions (plugin/exec/region.c): a box of one rank's buffer and the byte runs it covers, in the
 * box's row-major order. Every expected offset is worked by hand from the layout: i32 elements,
 * so a byte offset is 4 x the element's index in the buffer.
 */
#include "cuda/pack_desc.h"
#include "planner/spec.h"
#include "plugin/exec/region.h"

#include <criterion/criterion.h>
#include <string.h>

struct shard {
    struct rs_layout l;
    struct rs_shardmap m;
};

static void shard_open(struct shard *s, const char *spec)
{
    cr_assert_eq(spec_parse(spec, NULL, &s->l), RESHARD_OK, "%s", spec);
    cr_assert_eq(shardmap_build(&s->l, &s->m, NULL), RESHARD_OK, "%s", spec);
}

static void shard_close(struct shard *s)
{
    shardmap_free(&s->m);
    layout_free(&s->l);
}

/* The box [start, start + len) of a 2-D tensor in the shard of `rank`. */
static void box_of(const struct shard *s, int rank, int64_t r0, int64_t c0, int64_t nr, int64_t nc,
                   struct region *r)
{
    int64_t start[2] = {r0, c0}, len[2] = {nr, nc};
    region_of_shard(&s->m, shardmap_position(&s->m, rank), start, len, r);
}

/* Up to 8 runs of a region, as (offset, length) pairs; returns how many. */
static int runs_of(const struct region *r, uint64_t *off, uint64_t *len)
{
    struct region_iter it;
    int n = 0;
    region_iter_init(&it, r);
    while (n < 8 && region_iter_next(&it, &off[n], &len[n]))
        n++;
    return n;
}

Test(region, a_box_of_a_row_shard_is_in_local_coordinates)
{
    struct shard s;
    shard_open(&s, "shape=4x6 dtype=i32 ranks=0-1 mesh=2 place=S(0)");
    struct region r;
    box_of(&s, 1, 2, 1, 2, 3, &r); /* rank 1 holds rows 2-3: local rows 0-1 of 2x6 */
    cr_assert_eq(r.ndim, 2);
    cr_assert_eq(r.esize, 4);
    cr_assert_eq(r.shape[0], 2);
    cr_assert_eq(r.shape[1], 6);
    cr_assert_eq(r.start[0], 0);
    cr_assert_eq(r.start[1], 1);
    cr_assert_null(r.view);
    cr_assert_eq(region_bytes(&r), 2 * 3 * 4);
    uint64_t off[8], len[8];
    cr_assert_eq(runs_of(&r, off, len), 2);
    cr_assert_eq(off[0], 1 * 4); /* (0, 1) */
    cr_assert_eq(len[0], 3 * 4);
    cr_assert_eq(off[1], 7 * 4); /* (1, 1) */
    cr_assert_eq(len[1], 3 * 4);
    cr_assert_eq(region_contiguous(&r, &off[0]), 0);
    shard_close(&s);
}

Test(region, whole_rows_merge_into_one_run)
{
    struct shard s;
    shard_open(&s, "shape=4x6 dtype=i32 ranks=0-1 mesh=2 place=S(0)");
    struct region r;
    box_of(&s, 1, 2, 0, 2, 6, &r);
    uint64_t off[8], len[8], at = 99;
    cr_assert_eq(runs_of(&r, off, len), 1);
    cr_assert_eq(off[0], 0);
    cr_assert_eq(len[0], 2 * 6 * 4);
    cr_assert_eq(region_contiguous(&r, &at), 1);
    cr_assert_eq(at, 0);
    box_of(&s, 1, 3, 0, 1, 6, &r); /* the second local row alone */
    cr_assert_eq(region_contiguous(&r, &at), 1);
    cr_assert_eq(at, 6 * 4);
    shard_close(&s);
}

Test(region, an_empty_box_has_no_runs)
{
    struct shard s;
    shard_open(&s, "shape=4x6 dtype=i32 ranks=0");
    struct region r;
    box_of(&s, 0, 1, 1, 0, 3, &r);
    uint64_t off[8], len[8];
    cr_assert_eq(region_bytes(&r), 0);
    cr_assert_eq(runs_of(&r, off, len), 0);
    shard_close(&s);
}

Test(region, a_box_of_the_whole_tensor_buffer_is_row_major)
{
    struct shard s;
    shard_open(&s, "shape=4x6 dtype=i32 ranks=0");
    int64_t start[2] = {1, 2}, len2[2] = {2, 2};
    struct region r;
    region_of_full(&s.l, start, len2, &r);
    cr_assert_eq(r.shape[0], 4);
    cr_assert_eq(r.shape[1], 6);
    uint64_t off[8], len[8];
    cr_assert_eq(runs_of(&r, off, len), 2);
    cr_assert_eq(off[0], 8 * 4); /* (1, 2) */
    cr_assert_eq(len[0], 2 * 4);
    cr_assert_eq(off[1], 14 * 4); /* (2, 2) */
    cr_assert_eq(len[1], 2 * 4);
    shard_close(&s);
}

/* A shard stored at element 3 of its buffer with rows 10 elements apart. */
#define STRIDED "shape=4x6 dtype=i32 ranks=0 buffer=b offset=3 strides=10x1"

Test(region, a_view_places_each_row_at_its_stride)
{
    struct shard s;
    shard_open(&s, STRIDED);
    struct region r;
    box_of(&s, 0, 0, 0, 4, 6, &r);
    cr_assert_not_null(r.view);
    uint64_t off[8], len[8];
    cr_assert_eq(runs_of(&r, off, len), 4); /* the full shard, still a run per row */
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(off[i], (uint64_t)(3 + 10 * i) * 4, "row %d at %llu", i,
                     (unsigned long long)off[i]);
        cr_assert_eq(len[i], 6 * 4);
    }
    box_of(&s, 0, 1, 2, 2, 3, &r);
    cr_assert_eq(runs_of(&r, off, len), 2);
    cr_assert_eq(off[0], (3 + 10 + 2) * 4);
    cr_assert_eq(off[1], (3 + 20 + 2) * 4);
    cr_assert_eq(len[1], 3 * 4);
    shard_close(&s);
}

Test(region, span_bytes_reach_the_last_element_of_the_view)
{
    struct shard s, plain;
    shard_open(&s, STRIDED);
    shard_open(&plain, "shape=4x6 dtype=i32 ranks=0");
    int64_t shape[2] = {4, 6};
    cr_assert_eq(region_span_bytes(&s.l, shape), (3 + 3 * 10 + 5 + 1) * 4);
    cr_assert_eq(region_span_bytes(&plain.l, shape), 4 * 6 * 4);
    int64_t none[2] = {0, 6};
    cr_assert_eq(region_span_bytes(&s.l, none), 0);
    shard_close(&s);
    shard_close(&plain);
}

/* A layout the checks would refuse (issue 27): its span is not wrapped to a small number that
 * a buffer passes, but past any buffer. */
Test(region, span_bytes_past_2_63_do_not_wrap_to_a_small_size)
{
    struct shard s;
    shard_open(&s, "shape=10 dtype=f64 ranks=0 buffer=b");
    int64_t shape[1] = {10};
    s.l.view.offset = INT64_C(2305843009213693950); /* (offset + 10) x 8 = 2^64 + 64 */
    cr_assert_eq(region_span_bytes(&s.l, shape), UINT64_MAX);
    s.l.view.offset = 0;
    s.l.view.nstrides = 1;
    s.l.view.strides[0] = INT64_C(1) << 61; /* 9 x 2^61 elements wrap */
    cr_assert_eq(region_span_bytes(&s.l, shape), UINT64_MAX);
    s.l.view.strides[0] = 1;
    cr_assert_eq(region_span_bytes(&s.l, shape), 80);
    shard_close(&s);
}

static void count_up(int32_t *buf, int n)
{
    for (int i = 0; i < n; i++)
        buf[i] = i;
}

Test(region, pack_and_unpack_move_exactly_the_box)
{
    struct shard s;
    shard_open(&s, "shape=4x6 dtype=i32 ranks=0");
    struct region r;
    box_of(&s, 0, 1, 2, 2, 2, &r);
    int32_t buf[24], packed[4], back[24];
    count_up(buf, 24);
    region_pack(&r, (const char *)buf, (char *)packed);
    cr_assert_eq(packed[0], 8);
    cr_assert_eq(packed[1], 9);
    cr_assert_eq(packed[2], 14);
    cr_assert_eq(packed[3], 15);
    memset(back, 0xff, sizeof(back));
    region_unpack(&r, (char *)back, (const char *)packed);
    for (int i = 0; i < 24; i++) {
        int in_box = i == 8 || i == 9 || i == 14 || i == 15;
        cr_assert_eq(back[i], in_box ? i : -1, "element %d: %d", i, back[i]);
    }
    shard_close(&s);
}

/* The same box in a row-major tensor (two runs of 2 elements) and in the column shard that
 * holds it (one run of 4: the shard is 4x2, the box its rows 1-2). */
Test(region, a_pair_walks_two_layouts_in_pieces_contiguous_in_both)
{
    struct shard whole, cols;
    shard_open(&whole, "shape=4x6 dtype=i32 ranks=0");
    shard_open(&cols, "shape=4x6 dtype=i32 ranks=0-2 mesh=3 place=S(1)");
    struct region a, b;
    box_of(&whole, 0, 1, 2, 2, 2, &a);
    box_of(&cols, 1, 1, 2, 2, 2, &b);
    uint64_t off;
    cr_assert_eq(region_contiguous(&b, &off), 1);
    cr_assert_eq(off, 2 * 4);
    struct region_pair p;
    uint64_t ao, bo, n;
    region_pair_init(&p, &a, &b);
    cr_assert_eq(region_pair_next(&p, &ao, &bo, &n), 1);
    cr_assert_eq(ao, 8 * 4);
    cr_assert_eq(bo, 2 * 4);
    cr_assert_eq(n, 2 * 4);
    cr_assert_eq(region_pair_next(&p, &ao, &bo, &n), 1);
    cr_assert_eq(ao, 14 * 4);
    cr_assert_eq(bo, 4 * 4);
    cr_assert_eq(n, 2 * 4);
    cr_assert_eq(region_pair_next(&p, &ao, &bo, &n), 0);
    int32_t src[24], dst[8] = {0};
    count_up(src, 24);
    region_copy(&a, (const char *)src, &b, (char *)dst);
    int32_t want[8] = {0, 0, 8, 9, 14, 15, 0, 0};
    for (int i = 0; i < 8; i++)
        cr_assert_eq(dst[i], want[i], "element %d: %d", i, dst[i]);
    shard_close(&whole);
    shard_close(&cols);
}

Test(region, the_pack_descriptor_names_the_box_in_elements)
{
    struct shard s;
    shard_open(&s, "shape=4x6 dtype=i32 ranks=0");
    struct region r;
    box_of(&s, 0, 1, 2, 2, 3, &r);
    struct rs_pack_desc d;
    region_desc(&r, &d);
    cr_assert_eq(d.ndim, 2);
    cr_assert_eq(d.esize, 4);
    cr_assert_eq(d.numel, 6);
    cr_assert_eq(d.base, 1 * 6 + 2);
    cr_assert_eq(d.lstride[0], 6);
    cr_assert_eq(d.lstride[1], 1);
    cr_assert_eq(d.len[0], 2);
    cr_assert_eq(d.len[1], 3);
    cr_assert_eq(d.vdim, 0);
    shard_close(&s);
}
