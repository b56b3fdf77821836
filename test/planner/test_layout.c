/* SPDX-License-Identifier: Apache-2.0 */
/* Local ranges of every placement against examples computed by hand. */
#include "oracle.h"
#include "base/error.h"
#include "planner/layout.h"
#include "planner/spec.h"

#include <criterion/criterion.h>

/* Parses a spec that must be valid and builds its shard map. */
static void build(const char *spec, struct rs_layout *l, struct rs_shardmap *m)
{
    cr_assert_eq(spec_parse(spec, NULL, l), RESHARD_OK, "%s: %s", spec, rs_error_message());
    cr_assert_eq(shardmap_build(l, m, NULL), RESHARD_OK, "%s", rs_error_message());
}

static void release(struct rs_layout *l, struct rs_shardmap *m)
{
    shardmap_free(m);
    layout_free(l);
}

/* Expects the rank at pos to hold, along dim, exactly the segments {start, len} listed in
 * local order (n of them). */
static void expect_segments(const struct rs_shardmap *m, int pos, int dim, int n,
                            const int64_t (*want)[2])
{
    const struct rs_dimmap *d = &m->dim[dim];
    int g = shardmap_group(m, pos, dim);
    int have = d->first[g + 1] - d->first[g];
    cr_assert_eq(have, n, "pos %d dim %d: %d segments, want %d", pos, dim, have, n);
    int64_t local = 0;
    for (int i = 0; i < n; i++) {
        const struct rs_seg *s = &d->segs[d->first[g] + i];
        cr_assert_eq(s->start, want[i][0], "pos %d seg %d start", pos, i);
        cr_assert_eq(s->len, want[i][1], "pos %d seg %d len", pos, i);
        cr_assert_eq(s->pos, local, "pos %d seg %d local position", pos, i);
        local += s->len;
    }
}

Test(layout, uneven_chunks_follow_torch_chunk)
{
    struct rs_layout l;
    struct rs_shardmap m;
    build("shape=10 ranks=0-3 place=S(0)", &l, &m); /* chunk = ceil(10/4) = 3 */
    static const int64_t r0[][2] = {{0, 3}}, r1[][2] = {{3, 3}}, r2[][2] = {{6, 3}},
                         r3[][2] = {{9, 1}};
    expect_segments(&m, 0, 0, 1, r0);
    expect_segments(&m, 1, 0, 1, r1);
    expect_segments(&m, 2, 0, 1, r2);
    expect_segments(&m, 3, 0, 1, r3);
    release(&l, &m);
}

Test(layout, uneven_chunks_leave_last_shard_empty)
{
    struct rs_layout l;
    struct rs_shardmap m;
    build("shape=5x3 ranks=0-3 place=S(0)", &l, &m); /* chunk 2: [0,2) [2,4) [4,5) [] */
    static const int64_t r2[][2] = {{4, 1}};
    expect_segments(&m, 2, 0, 1, r2);
    expect_segments(&m, 3, 0, 0, NULL);
    cr_assert_eq(shardmap_local_numel(&m, 2), 3);
    cr_assert_eq(shardmap_local_numel(&m, 3), 0);
    release(&l, &m);
}

Test(layout, strided_shard_takes_a_chunk_of_every_piece)
{
    struct rs_layout l;
    struct rs_shardmap m;
    /* fused gate_up under TP2: pieces [0,4) and [4,8), each cut in two */
    build("shape=8x2 ranks=0-1 place=SS(0,2)", &l, &m);
    static const int64_t r0[][2] = {{0, 2}, {4, 2}}, r1[][2] = {{2, 2}, {6, 2}};
    expect_segments(&m, 0, 0, 2, r0);
    expect_segments(&m, 1, 0, 2, r1);
    release(&l, &m);
}

Test(layout, strided_shard_with_uneven_chunks)
{
    struct rs_layout l;
    struct rs_shardmap m;
    /* pieces of 5 over 3 ranks: chunk 2, so [0,2)+[5,7), [2,4)+[7,9), [4,5)+[9,10) */
    build("shape=10 ranks=0-2 place=SS(0,2)", &l, &m);
    static const int64_t r0[][2] = {{0, 2}, {5, 2}}, r1[][2] = {{2, 2}, {7, 2}},
                         r2[][2] = {{4, 1}, {9, 1}};
    expect_segments(&m, 0, 0, 2, r0);
    expect_segments(&m, 1, 0, 2, r1);
    expect_segments(&m, 2, 0, 2, r2);
    release(&l, &m);
}

Test(layout, strided_shard_over_one_rank_merges_into_one_segment)
{
    struct rs_layout l;
    struct rs_shardmap m;
    build("shape=6 ranks=0 place=SS(0,3)", &l, &m);
    static const int64_t r0[][2] = {{0, 6}};
    expect_segments(&m, 0, 0, 1, r0);
    release(&l, &m);
}

Test(layout, nested_shards_apply_left_to_right)
{
    struct rs_layout l;
    struct rs_shardmap m;
    /* S(0) over 2 gives [0,5) [5,10); S(0) again over 2 cuts each with chunk 3 */
    build("shape=10 ranks=0-3 mesh=2x2 place=S(0),S(0)", &l, &m);
    static const int64_t r0[][2] = {{0, 3}}, r1[][2] = {{3, 2}}, r2[][2] = {{5, 3}},
                         r3[][2] = {{8, 2}};
    expect_segments(&m, 0, 0, 1, r0);
    expect_segments(&m, 1, 0, 1, r1);
    expect_segments(&m, 2, 0, 1, r2);
    expect_segments(&m, 3, 0, 1, r3);
    release(&l, &m);
}

Test(layout, strided_then_plain_shard_is_fsdp_over_tp)
{
    struct rs_layout l;
    struct rs_shardmap m;
    /* DTensor (_StridedShard(0, sf=2), Shard(0)) on a dp x tp = 2x2 mesh: TP halves [0,4) and
     * [4,8), FSDP halves each: (dp,tp) (0,0)=[0,2) (0,1)=[4,6) (1,0)=[2,4) (1,1)=[6,8) */
    build("shape=8 ranks=0-3 mesh=2x2 place=SS(0,2),S(0)", &l, &m);
    static const int64_t r0[][2] = {{0, 2}}, r1[][2] = {{4, 2}}, r2[][2] = {{2, 2}},
                         r3[][2] = {{6, 2}};
    expect_segments(&m, 0, 0, 1, r0);
    expect_segments(&m, 1, 0, 1, r1);
    expect_segments(&m, 2, 0, 1, r2);
    expect_segments(&m, 3, 0, 1, r3);
    release(&l, &m);
}

Test(layout, strided_shard_with_uneven_pieces_follows_torch)
{
    struct rs_layout l;
    struct rs_shardmap m;
    /* torch.chunk(5, 2) gives pieces [0,3) and [3,5); each chunked over 2 ranks */
    build("shape=5 ranks=0-1 place=SS(0,2)", &l, &m);
    static const int64_t r0[][2] = {{0, 2}, {3, 1}}, r1[][2] = {{2, 1}, {4, 1}};
    expect_segments(&m, 0, 0, 2, r0);
    expect_segments(&m, 1, 0, 2, r1);
    release(&l, &m);
}

Test(layout, fsdp_over_tp_of_an_odd_dim_matches_torch)
{
    struct rs_layout l;
    struct rs_shardmap m;
    /* shape (5,), mesh 2x2, [_StridedShard(0, split_factor=2), Shard(0)]: torch and FSDP2 give
     * r0 [0,1], r1 [3], r2 [2], r3 [4] */
    build("shape=5 ranks=0-3 mesh=2x2 place=SS(0,2),S(0)", &l, &m);
    static const int64_t r0[][2] = {{0, 2}}, r1[][2] = {{3, 1}}, r2[][2] = {{2, 1}},
                         r3[][2] = {{4, 1}};
    expect_segments(&m, 0, 0, 1, r0);
    expect_segments(&m, 1, 0, 1, r1);
    expect_segments(&m, 2, 0, 1, r2);
    expect_segments(&m, 3, 0, 1, r3);
    release(&l, &m);
}

Test(layout, split_factor_larger_than_the_dim_leaves_empty_pieces)
{
    struct rs_layout l;
    struct rs_shardmap m;
    /* torch.chunk(2, 3) gives [0] and [1] and no third piece: rank 0 takes both, rank 1 none */
    build("shape=2 ranks=0-1 place=SS(0,3)", &l, &m);
    static const int64_t r0[][2] = {{0, 2}};
    expect_segments(&m, 0, 0, 1, r0);
    expect_segments(&m, 1, 0, 0, NULL);
    cr_assert_eq(shardmap_local_numel(&m, 1), 0);
    release(&l, &m);
}

Test(layout, strided_shard_of_what_an_uneven_shard_left)
{
    struct rs_layout l;
    struct rs_shardmap m;
    /* S(0) over 3 leaves 4, 4, 3; SS(0,2) over 1 cuts 3 into [8,10) and [10,11) */
    build("shape=11 ranks=0-2 mesh=3x1 place=S(0),SS(0,2)", &l, &m);
    static const int64_t r2[][2] = {{8, 3}};
    expect_segments(&m, 2, 0, 1, r2);
    release(&l, &m);
}

Test(layout, a_vocabulary_of_50257_rows_under_tp2_and_fsdp2)
{
    struct rs_layout l;
    struct rs_shardmap m;
    /* TP2 cuts 50257 into 25129 + 25128; FSDP2 cuts each half: every row held exactly once */
    build("shape=50257x8 ranks=0-3 mesh=2x2 place=SS(0,2),S(0)", &l, &m);
    static const int64_t r0[][2] = {{0, 12565}}, r1[][2] = {{25129, 12564}},
                         r2[][2] = {{12565, 12564}}, r3[][2] = {{37693, 12564}};
    expect_segments(&m, 0, 0, 1, r0);
    expect_segments(&m, 1, 0, 1, r1);
    expect_segments(&m, 2, 0, 1, r2);
    expect_segments(&m, 3, 0, 1, r3);
    int64_t total = 0;
    for (int p = 0; p < 4; p++)
        total += shardmap_local_numel(&m, p);
    cr_assert_eq(total, INT64_C(50257) * 8);
    release(&l, &m);
}

Test(layout, replicate_and_shard_on_a_2d_mesh)
{
    struct rs_layout l;
    struct rs_shardmap m;
    build("shape=4x6 ranks=10-15 mesh=2x3 place=R,S(1)", &l, &m);
    /* position 4 is mesh coordinate (1,1): all rows, columns [2,4) */
    static const int64_t rows[][2] = {{0, 4}}, cols[][2] = {{2, 2}};
    expect_segments(&m, 4, 0, 1, rows);
    expect_segments(&m, 4, 1, 1, cols);
    cr_assert_eq(m.ntuples, 3, "replicas share a tuple");
    cr_assert_eq(m.tuple[1], m.tuple[4], "positions 1 and 4 are replicas");
    cr_assert_neq(m.tuple[0], m.tuple[1]);
    cr_assert_eq(shardmap_position(&m, 14), 4);
    cr_assert_eq(shardmap_position(&m, 9), -1);
    release(&l, &m);
}

Test(layout, shards_on_two_tensor_dims)
{
    struct rs_layout l;
    struct rs_shardmap m;
    build("shape=6x8x2 ranks=0-5 mesh=3x2 place=S(1),S(0)", &l, &m);
    /* position 3 = (1,1): dim 1 chunk [3,6) of 8 (chunk 3), dim 0 [3,6) of 6 (chunk 3) */
    static const int64_t d0[][2] = {{3, 3}}, d1[][2] = {{3, 3}}, d2[][2] = {{0, 2}};
    expect_segments(&m, 3, 0, 1, d0);
    expect_segments(&m, 3, 1, 1, d1);
    expect_segments(&m, 3, 2, 1, d2);
    cr_assert_eq(shardmap_local_numel(&m, 3), 18);
    cr_assert_eq(m.ntuples, 6);
    release(&l, &m);
}

Test(layout, holds_is_false_across_a_segment_gap)
{
    struct rs_layout l;
    struct rs_shardmap m;
    build("shape=8x2 ranks=0-1 place=SS(0,2)", &l, &m); /* rank 0: rows [0,2) and [4,6) */
    int64_t s1[] = {4, 0}, l1[] = {2, 2};
    int64_t s2[] = {1, 0}, l2[] = {2, 2}; /* rows 1..2: row 2 belongs to rank 1 */
    int64_t s3[] = {0, 1}, l3[] = {1, 1};
    cr_assert(shardmap_holds(&m, 0, s1, l1));
    cr_assert_not(shardmap_holds(&m, 0, s2, l2));
    cr_assert(shardmap_holds(&m, 0, s3, l3));
    cr_assert_not(shardmap_holds(&m, 1, s3, l3));
    release(&l, &m);
}

Test(layout, view_must_hold_the_shard)
{
    struct rs_layout l;
    const char *spec = "shape=8x4 ranks=0-1 place=S(0) buffer=qkv offset=16 view=4x2x2";
    cr_assert_eq(spec_parse(spec, NULL, &l), RESHARD_OK, "%s", rs_error_message());
    cr_assert_eq(l.view.offset, 16);
    cr_assert_str_eq(l.view.buffer, "qkv");
    layout_free(&l);
    cr_assert_eq(spec_parse("shape=8x4 ranks=0-1 place=S(0) view=4x3", NULL, &l), RESHARD_ERR_VIEW);
    cr_assert_str_eq(rs_error_message(),
                     "view: 4x3 holds 12 elements but the shard of rank 0 holds 16 at column 37");
}

Test(layout, view_strides_may_not_alias)
{
    struct rs_layout l;
    /* interleaved: rows of 4 with stride 12 leave room for two other tensors: fine */
    cr_assert_eq(spec_parse("shape=8x4 ranks=0-1 place=S(0) strides=12x1", NULL, &l), RESHARD_OK,
                 "%s", rs_error_message());
    layout_free(&l);
    cr_assert_eq(spec_parse("shape=8x4 ranks=0-1 place=S(0) strides=2x1", NULL, &l),
                 RESHARD_ERR_VIEW);
    cr_assert_str_eq(rs_error_message(),
                     "strides: two elements of rank 0's view share a buffer element at column 40");
    cr_assert_eq(spec_parse("shape=8x4 ranks=0-1 place=S(0) strides=4", NULL, &l),
                 RESHARD_ERR_VIEW);
    cr_assert_str_eq(rs_error_message(), "strides: 1 strides for a 2-D view at column 40");
}

Test(layout, view_allows_empty_shards)
{
    struct rs_layout l;
    /* rank 3 holds nothing: its view does not have to match */
    cr_assert_eq(spec_parse("shape=5x3 ranks=0-3 place=S(0) view=2x3", NULL, &l), RESHARD_ERR_VIEW,
                 "rank 2 holds 3 elements, not 6");
    cr_assert_eq(spec_parse("shape=6x3 ranks=0-3 place=S(0) view=2x3", NULL, &l), RESHARD_OK,
                 "chunk 2 leaves rank 3 empty, which is fine; the others hold 6: %s",
                 rs_error_message());
    layout_free(&l);
    cr_assert_eq(spec_parse("shape=8x3 ranks=0-3 place=S(0) view=6", NULL, &l), RESHARD_OK, "%s",
                 rs_error_message());
    layout_free(&l);
}

Test(layout, check_rejects_inconsistent_structs)
{
    struct rs_layout l = {
        .ndim = 1, .shape = {4}, .dtype = RS_DTYPE_F32, .nranks = 2, .mesh_ndim = 1, .mesh = {2}};
    int ranks[] = {0, 1};
    l.ranks = ranks;
    struct rs_fault f;
    cr_assert_eq(layout_check(&l, &f), RESHARD_OK);
    l.place[0] = (struct rs_place){RS_PLACE_SS, 0, 0};
    cr_assert_eq(layout_check(&l, &f), RESHARD_ERR_SPEC_SYNTAX);
    cr_assert_eq(f.item, RS_ITEM_PLACE);
    l.place[0] = (struct rs_place){(enum rs_place_kind)7, 0, 1};
    cr_assert_eq(layout_check(&l, &f), RESHARD_ERR_SPEC_SYNTAX);
    l.place[0] = (struct rs_place){RS_PLACE_R, 0, 1};
    l.dtype = (enum rs_dtype)99;
    cr_assert_eq(layout_check(&l, &f), RESHARD_ERR_SPEC_SYNTAX);
    cr_assert_eq(f.item, RS_ITEM_DTYPE);
    l.dtype = RS_DTYPE_F32;
    l.shape[0] = INT64_C(1) << 61;
    cr_assert_eq(layout_check(&l, &f), RESHARD_ERR_TOO_LARGE);
    l.shape[0] = 4;
    l.view.offset = -1;
    cr_assert_eq(layout_check(&l, &f), RESHARD_ERR_VIEW);
    cr_assert_eq(f.item, RS_ITEM_OFFSET);
    l.view.offset = 0;
    ranks[1] = RS_MAX_RANK + 1;
    cr_assert_eq(layout_check(&l, &f), RESHARD_ERR_RANK_RANGE);
    ranks[1] = 1;
    l.nranks = 0;
    cr_assert_eq(layout_check(&l, &f), RESHARD_ERR_SPEC_SYNTAX);
}

Test(layout, too_many_pieces_is_an_error_not_a_hang)
{
    struct rs_layout l;
    /* 2^22 pieces over 2^10 ranks would be 2^32 segments */
    cr_assert_eq(spec_parse("shape=4194304 ranks=0-1023 place=SS(0,4194304)", NULL, &l),
                 RESHARD_ERR_TOO_LARGE);
    cr_assert_str_eq(rs_error_message(), "place: dim 0 is cut into too many pieces at column 34");
}

Test(layout, nested_strided_shards_scan_each_group_once, .timeout = 30)
{
    struct rs_layout l;
    struct rs_shardmap m;
    /* 2^17 pieces of 8: rank 0 holds [8q, 8q+4), 2^17 segments. Cutting its 2^19 elements
     * again into 2^18 pieces walks those segments 2^18 times: once each, not from the start. */
    build("shape=1048576 ranks=0-1 mesh=2x1 place=SS(0,131072),SS(0,262144)", &l, &m);
    const struct rs_dimmap *d = &m.dim[0];
    int g = shardmap_group(&m, 0, 0);
    cr_assert_eq(d->first[g + 1] - d->first[g], 131072, "pieces of 2 merge back into runs of 4");
    cr_assert_eq(d->segs[d->first[g] + 1].start, 8);
    cr_assert_eq(d->segs[d->first[g] + 1].len, 4);
    cr_assert_eq(shardmap_local_numel(&m, 0), 524288);
    release(&l, &m);
}

Test(layout, view_sizes_that_wrap_are_refused)
{
    struct rs_layout l;
    /* 3 x 6148914691236517206 wraps to 2 in 64 bits, which is the shard's size */
    cr_assert_eq(spec_parse("shape=4 ranks=0-1 place=S(0) view=3x6148914691236517206", NULL, &l),
                 RESHARD_ERR_VIEW);
    cr_assert_str_eq(rs_error_message(), "view: 3x6148914691236517206 holds more than 2^63 "
                                         "elements but the shard of rank 0 holds 2 at column 35");
    /* a stride whose reach wraps cannot address a buffer either */
    cr_assert_eq(spec_parse("shape=8x2 ranks=0 strides=4611686018427387904x1", NULL, &l),
                 RESHARD_ERR_TOO_LARGE);
    cr_assert_str_eq(rs_error_message(),
                     "strides: the view of rank 0 reaches past byte 2^63 of its buffer (offset 0, "
                     "16 elements of 2 bytes), which cannot be addressed at column 27");
}

/* Issue 27: (2^61 - 2 + 10) x 8 bytes is 2^64 + 64, which wrapped to 64: the executor wrote 16
 * bytes in front of a 64-byte buffer. A view is refused when its last byte lies past 2^63. */
Test(layout, a_view_offset_near_2_63_bytes_is_refused_naming_the_offset)
{
    struct rs_layout l;
    cr_assert_eq(
        spec_parse("shape=10 dtype=f64 ranks=0 buffer=b offset=2305843009213693950", NULL, &l),
        RESHARD_ERR_TOO_LARGE);
    cr_assert_str_eq(rs_error_message(),
                     "offset: the view of rank 0 reaches past byte 2^63 of its buffer (offset "
                     "2305843009213693950, 10 elements of 8 bytes), which cannot be addressed at "
                     "column 44");
    /* on a source or a destination alike, sharded or not: rank 1 holds the last 5 */
    cr_assert_eq(
        spec_parse("shape=10 dtype=f64 ranks=0-1 place=S(0) offset=2305843009213693950", NULL, &l),
        RESHARD_ERR_TOO_LARGE);
    /* the edge: (offset + 10) x 8 = 2^63 - 8 fits; one more element's worth does not */
    struct rs_shardmap m;
    build("shape=10 dtype=f64 ranks=0 buffer=b offset=1152921504606846965", &l, &m);
    int64_t shape[1] = {10}, bytes = 0;
    cr_assert_eq(layout_span_bytes(&l, shape, &bytes), RS_ITEM_NONE);
    cr_assert_eq(bytes, INT64_MAX - 7);
    release(&l, &m);
    cr_assert_eq(
        spec_parse("shape=10 dtype=f64 ranks=0 buffer=b offset=1152921504606846966", NULL, &l),
        RESHARD_ERR_TOO_LARGE);
    /* an offset alone past 2^63 bytes, without wrapping the element count */
    cr_assert_eq(spec_parse("shape=1 dtype=f64 ranks=0 offset=9223372036854775807", NULL, &l),
                 RESHARD_ERR_TOO_LARGE);
}

Test(layout, strides_whose_byte_reach_passes_2_63_are_refused_naming_the_strides)
{
    struct rs_layout l;
    /* 7 x 2^60 elements fits an int64_t; 8 bytes each does not */
    cr_assert_eq(spec_parse("shape=8 dtype=f64 ranks=0 strides=1152921504606846976", NULL, &l),
                 RESHARD_ERR_TOO_LARGE);
    cr_assert(strstr(rs_error_message(), "strides: the view of rank 0 reaches past byte 2^63"),
              "%s", rs_error_message());
    cr_assert(strstr(rs_error_message(), "at column 35"), "%s", rs_error_message());
    /* the sum of two dims' reaches wraps where neither does alone */
    cr_assert_eq(spec_parse("shape=2x2 dtype=u8 ranks=0 strides=6917529027641081856x"
                            "4611686018427387904",
                            NULL, &l),
                 RESHARD_ERR_TOO_LARGE);
    /* a view shape of the shard's elements, strided past the edge */
    cr_assert_eq(
        spec_parse("shape=4 dtype=f32 ranks=0 view=2x2 strides=1x3074457345618258602", NULL, &l),
        RESHARD_ERR_TOO_LARGE);
    cr_assert(strstr(rs_error_message(), "strides:"), "%s", rs_error_message());
}

Test(layout, check_rejects_bad_view_structs)
{
    int ranks[] = {0};
    struct rs_layout l = {
        .ndim = 2, .shape = {4, 2}, .nranks = 1, .ranks = ranks, .mesh_ndim = 1, .mesh = {1}};
    struct rs_fault f;
    l.view.ndim = 9;
    cr_assert_eq(layout_check(&l, &f), RESHARD_ERR_VIEW);
    cr_assert_str_eq(rs_error_message(), "view: expected 1 to 8 dims");
    l.view.ndim = 0;
    l.view.nstrides = 2;
    l.view.strides[1] = -1;
    cr_assert_eq(layout_check(&l, &f), RESHARD_ERR_VIEW);
    cr_assert_eq(f.item, RS_ITEM_STRIDES);
    cr_assert_eq(f.index, 1);
    cr_assert_str_eq(rs_error_message(), "strides: stride 1 is negative");
}

Test(layout, too_many_segments_is_an_error)
{
    struct rs_layout l;
    /* 2^22 pieces of 2 over 2 ranks: every rank gets 2^22 single elements, 2^23 in all */
    cr_assert_eq(spec_parse("shape=8388608 ranks=0-1 place=SS(0,4194304)", NULL, &l),
                 RESHARD_ERR_TOO_LARGE);
    cr_assert_str_eq(rs_error_message(),
                     "place: more than 4194304 segments in one tensor dim at column 31");
}

/* Every rank's index list of every dim, from the shard map, equals the oracle's literal
 * simulation of torch (chunk, then _StridedShard's pieces and chunks) on random layouts. */
Test(layout, shard_maps_equal_the_oracle_on_random_layouts)
{
    int64_t want[64], got[64];
    int checked_ss = 0;
    for (uint64_t seed = 1; seed <= 3000; seed++) {
        struct random_case c;
        random_case_make(seed, &c);
        struct rs_layout *sides[2] = {&c.src, &c.dst};
        for (int s = 0; s < 2; s++) {
            struct rs_shardmap m;
            cr_assert_eq(shardmap_build(sides[s], &m, NULL), RESHARD_OK, "seed %llu: %s",
                         (unsigned long long)seed, rs_error_message());
            for (int i = 0; i < sides[s]->mesh_ndim; i++)
                checked_ss += sides[s]->place[i].kind == RS_PLACE_SS;
            for (int pos = 0; pos < sides[s]->nranks; pos++)
                for (int j = 0; j < sides[s]->ndim; j++) {
                    int64_t n = oracle_indices(sides[s], pos, j, want), k = 0;
                    const struct rs_dimmap *d = &m.dim[j];
                    int g = shardmap_group(&m, pos, j);
                    for (int q = d->first[g]; q < d->first[g + 1]; q++)
                        for (int64_t e = 0; e < d->segs[q].len && k < 64; e++)
                            got[k++] = d->segs[q].start + e;
                    cr_assert_eq(k, n, "seed %llu side %d pos %d dim %d", (unsigned long long)seed,
                                 s, pos, j);
                    for (int64_t e = 0; e < n; e++)
                        cr_assert_eq(got[e], want[e], "seed %llu side %d pos %d dim %d elem %lld",
                                     (unsigned long long)seed, s, pos, j, (long long)e);
                }
            shardmap_free(&m);
        }
        random_case_free(&c);
    }
    cr_assert_gt(checked_ss, 1000, "the generator draws SS placements");
}
