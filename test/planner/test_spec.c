/* SPDX-License-Identifier: Apache-2.0 */
/* The spec parser: defaults, canonical form, and one message per malformed item. */
#include "base/error.h"
#include "planner/spec.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

static struct rs_layout parse_ok(const char *spec, int world)
{
    struct rs_layout l;
    struct spec_opts o = {.world_size = world};
    cr_assert_eq(spec_parse(spec, &o, &l), RESHARD_OK, "%s: %s", spec, rs_error_message());
    return l;
}

/* The spec must fail with this status and exactly this message. */
static void expect_error(const char *spec, reshard_status_t st, const char *msg)
{
    struct rs_layout l;
    struct spec_opts o = {.world_size = 4};
    cr_assert_eq(spec_parse(spec, &o, &l), st, "'%s' gave %s: %s", spec,
                 rs_status_name(spec_parse(spec, &o, &l)), rs_error_message());
    cr_assert_str_eq(rs_error_message(), msg, "for '%s': got '%s'", spec, rs_error_message());
}

Test(spec, design_example_parses)
{
    struct rs_layout l =
        parse_ok("shape=7168x2048 dtype=bf16 ranks=0-7,16-23 mesh=2x8 place=R,S(1)", 0);
    cr_assert_eq(l.ndim, 2);
    cr_assert_eq(l.shape[0], 7168);
    cr_assert_eq(l.shape[1], 2048);
    cr_assert_eq(l.dtype, RS_DTYPE_BF16);
    cr_assert_eq(l.nranks, 16);
    cr_assert_eq(l.ranks[7], 7);
    cr_assert_eq(l.ranks[8], 16);
    cr_assert_eq(l.mesh_ndim, 2);
    cr_assert_eq(l.place[0].kind, RS_PLACE_R);
    cr_assert_eq(l.place[1].kind, RS_PLACE_S);
    cr_assert_eq(l.place[1].dim, 1);
    layout_free(&l);
}

Test(spec, defaults_fill_dtype_ranks_mesh_and_place)
{
    struct rs_layout l = parse_ok("shape=8x4", 3);
    cr_assert_eq(l.dtype, RS_DTYPE_BF16);
    cr_assert_eq(l.nranks, 3);
    cr_assert_eq(l.ranks[2], 2);
    cr_assert_eq(l.mesh_ndim, 1);
    cr_assert_eq(l.mesh[0], 3);
    cr_assert_eq(l.place[0].kind, RS_PLACE_R);
    layout_free(&l);
    l = parse_ok("shape=8 mesh=2x3 place=S(0),R", 0); /* ranks from the mesh */
    cr_assert_eq(l.nranks, 6);
    cr_assert_eq(l.ranks[5], 5);
    layout_free(&l);
}

Test(spec, canonical_form_round_trips)
{
    const char *canon = "shape=12x4 dtype=fp8e4m3 ranks=4-7,0,2 mesh=3x2 place=SS(0,2),S(1) "
                        "buffer=w.qkv offset=7 view=2x4 strides=20x1";
    struct rs_layout l = parse_ok("  place=SS(0,2),S(1)   mesh=3x2 ranks=4-6,7,0,2 dtype=fp8e4m3 "
                                  "shape=12x4 buffer=w.qkv offset=7 view=2x4 strides=20x1 ",
                                  0);
    char buf[256];
    size_t n = spec_format(&l, buf, sizeof(buf));
    cr_assert_str_eq(buf, canon);
    cr_assert_eq(n, strlen(canon));
    char small[10];
    cr_assert_eq(spec_format(&l, small, sizeof(small)), strlen(canon), "returns what it needs");
    cr_assert_str_eq(small, "shape=12x");
    layout_free(&l);
}

Test(spec, design_error_example)
{
    /* the docs/layouts.md example, at the column of the first character that is no placement */
    expect_error("shape=7168x2048 ranks=0-3 place=X", RESHARD_ERR_SPEC_SYNTAX,
                 "place: expected R, S(d) or SS(d,k) at column 33");
    expect_error("shape=7168x2048 dtype=f32 place=Q", RESHARD_ERR_SPEC_SYNTAX,
                 "place: expected R, S(d) or SS(d,k) at column 33");
}

Test(spec, each_malformed_item_names_itself)
{
    expect_error("", RESHARD_ERR_SPEC_SYNTAX, "shape: required item missing");
    expect_error("dtype=f32", RESHARD_ERR_SPEC_SYNTAX, "shape: required item missing");
    expect_error("shape=", RESHARD_ERR_SPEC_SYNTAX,
                 "shape: expected a positive integer at column 7");
    expect_error("shape=4x0", RESHARD_ERR_SPEC_SYNTAX,
                 "shape: expected a positive integer at column 9");
    expect_error("shape=4*4", RESHARD_ERR_SPEC_SYNTAX,
                 "shape: expected 'x' between dims at column 8");
    expect_error("shape=1x1x1x1x1x1x1x1x1", RESHARD_ERR_SPEC_SYNTAX,
                 "shape: more than 8 dims at column 23");
    expect_error("shape=99999999999999999999", RESHARD_ERR_SPEC_SYNTAX,
                 "shape: expected a positive integer at column 7");
    expect_error("shape=4 dtype=bf17", RESHARD_ERR_SPEC_SYNTAX,
                 "dtype: unknown dtype 'bf17' (one of bf16 f16 f32 f64 fp8e4m3 fp8e5m2 i8 u8 i32 "
                 "i64) at column 15");
    expect_error("shape=4 ranks=a", RESHARD_ERR_SPEC_SYNTAX,
                 "ranks: expected a rank (0..1048575) or a range a-b at column 15");
    expect_error("shape=4 ranks=3-1", RESHARD_ERR_SPEC_SYNTAX,
                 "ranks: range 3-1 is descending at column 15");
    expect_error("shape=4 ranks=0-", RESHARD_ERR_SPEC_SYNTAX,
                 "ranks: expected the end of the range (0..1048575) at column 17");
    expect_error("shape=4 ranks=0;1", RESHARD_ERR_SPEC_SYNTAX,
                 "ranks: expected ',' between ranks at column 16");
    expect_error("shape=4 ranks=0,2,5,2", RESHARD_ERR_SPEC_SYNTAX,
                 "ranks: rank 2 is listed twice at column 21");
    expect_error("shape=4 ranks=2000000", RESHARD_ERR_SPEC_SYNTAX,
                 "ranks: expected a rank (0..1048575) or a range a-b at column 15");
    expect_error("shape=4 mesh=2x0", RESHARD_ERR_SPEC_SYNTAX,
                 "mesh: expected a positive integer at column 16");
    expect_error("shape=4 mesh=1x1x1x1x1", RESHARD_ERR_SPEC_SYNTAX,
                 "mesh: more than 4 dims at column 22");
    expect_error("shape=4 place=S(0", RESHARD_ERR_SPEC_SYNTAX, "place: expected ')' at column 18");
    expect_error("shape=4 place=S(x)", RESHARD_ERR_SPEC_SYNTAX,
                 "place: expected a tensor dim in S( at column 17");
    expect_error("shape=4 place=SS(0)", RESHARD_ERR_SPEC_SYNTAX,
                 "place: expected ',k' in SS(d,k) at column 19");
    expect_error("shape=4 place=SS(0,)", RESHARD_ERR_SPEC_SYNTAX,
                 "place: expected a piece count k in SS(d,k) at column 20");
    expect_error("shape=4 place=R;R", RESHARD_ERR_SPEC_SYNTAX,
                 "place: expected ',' between placements at column 16");
    expect_error("shape=4 place=R,R,R,R,R", RESHARD_ERR_SPEC_SYNTAX,
                 "place: more than 4 placements at column 23");
    expect_error("shape=4 place=R,R", RESHARD_ERR_SPEC_SYNTAX,
                 "place: 2 placements for a 1-D mesh at column 15");
    expect_error("shape=4 place=SS(0,0)", RESHARD_ERR_SPEC_SYNTAX,
                 "place: SS(0,0) needs 1 <= k <= 4194304 at column 15");
    expect_error("shape=4 buffer=a+b", RESHARD_ERR_SPEC_SYNTAX,
                 "buffer: unexpected character '+' in a buffer name at column 17");
    expect_error("shape=4 offset=-1", RESHARD_ERR_SPEC_SYNTAX,
                 "offset: expected a non-negative integer at column 16");
    expect_error("shape=4 offset=12k", RESHARD_ERR_SPEC_SYNTAX,
                 "offset: expected a non-negative integer at column 18");
    expect_error("shape=4 view=0", RESHARD_ERR_SPEC_SYNTAX,
                 "view: expected a positive integer at column 14");
    expect_error("shape=4 strides=x", RESHARD_ERR_SPEC_SYNTAX,
                 "strides: expected an integer at column 17");
}

Test(spec, structure_errors)
{
    expect_error("shape=4 foo=1", RESHARD_ERR_SPEC_SYNTAX,
                 "foo: unknown item at column 9 (expected shape, dtype, ranks, mesh, place, "
                 "buffer, offset, view, strides or quant)");
    expect_error("shape=4 mesh", RESHARD_ERR_SPEC_SYNTAX, "mesh: expected key=value at column 9");
    expect_error("shape=4 =3", RESHARD_ERR_SPEC_SYNTAX, "=: expected key=value at column 9");
    expect_error("shape=4 mesh=2 mesh=2", RESHARD_ERR_SPEC_SYNTAX,
                 "mesh: given twice at column 16");
}

Test(spec, semantic_errors_have_their_own_status)
{
    expect_error("shape=4x4 ranks=0-3 mesh=2x3", RESHARD_ERR_MESH_SIZE,
                 "mesh: 2x3 holds 6 ranks but ranks lists 4 at column 26");
    expect_error("shape=4x4 ranks=0-3 place=S(2)", RESHARD_ERR_SHARD_DIM,
                 "place: S(2) shards dim 2 but the tensor has 2 dims at column 27");
    expect_error("shape=4 mesh=2x2 place=R,SS(1,2)", RESHARD_ERR_SHARD_DIM,
                 "place: SS(1,2) shards dim 1 but the tensor has 1 dim at column 26");
    expect_error("shape=4 mesh=1024x1024x2", RESHARD_ERR_MESH_SIZE,
                 "mesh: more than 1048576 ranks at column 14");
    /* four dims of 2^20 would wrap a 64-bit product */
    expect_error("shape=4 mesh=1048576x1048576x1048576x16", RESHARD_ERR_MESH_SIZE,
                 "mesh: more than 1048576 ranks at column 14");
}

Test(spec, ranks_need_a_count)
{
    struct rs_layout l;
    cr_assert_eq(spec_parse("shape=4", NULL, &l), RESHARD_ERR_SPEC_SYNTAX);
    cr_assert_str_eq(rs_error_message(),
                     "ranks: not given, and neither mesh nor a world size says how many");
    struct spec_opts huge = {.world_size = RS_MAX_RANK + 2};
    cr_assert_eq(spec_parse("shape=4", &huge, &l), RESHARD_ERR_RANK_RANGE);
    cr_assert_str_eq(rs_error_message(),
                     "ranks: not given, and the world size 1048577 exceeds 1048576 ranks");
}

Test(spec, long_buffer_names_are_refused)
{
    char spec[160];
    snprintf(spec, sizeof(spec), "shape=4 ranks=0 buffer=%064d", 0);
    struct rs_layout l;
    cr_assert_eq(spec_parse(spec, NULL, &l), RESHARD_ERR_SPEC_SYNTAX);
    cr_assert_str_eq(rs_error_message(),
                     "buffer: a buffer name has 1 to 63 characters at column 24");
}

Test(spec, context_supplies_the_tensor)
{
    int64_t shape[] = {6, 2};
    struct spec_opts o = {.world_size = 2, .ndim = 2, .shape = shape, .dtype = RS_DTYPE_F32};
    struct rs_layout l;
    cr_assert_eq(spec_parse("place=S(0)", &o, &l), RESHARD_OK, "%s", rs_error_message());
    cr_assert_eq(l.shape[0], 6);
    cr_assert_eq(l.dtype, RS_DTYPE_F32);
    layout_free(&l);
    cr_assert_eq(spec_parse("shape=6x2 place=S(0)", &o, &l), RESHARD_ERR_SPEC_SYNTAX);
    cr_assert_str_eq(rs_error_message(),
                     "shape: the tensor is given by its manifest entry at column 7");
}

Test(spec, null_spec_is_invalid)
{
    struct rs_layout l;
    cr_assert_eq(spec_parse(NULL, NULL, &l), RESHARD_ERR_INVALID_ARG);
}

Test(spec, quant_items_parse_format_and_refuse_what_cannot_be_scaled)
{
    struct rs_layout l =
        parse_ok("shape=256x384 dtype=fp8e4m3 ranks=0-1 place=S(0) quant=block(128,64)", 0);
    cr_assert_eq(l.quant.kind, RS_QUANT_BLOCK);
    cr_assert_eq(l.quant.rows, 128);
    cr_assert_eq(l.quant.cols, 64);
    char buf[256];
    spec_format(&l, buf, sizeof(buf));
    cr_assert_str_eq(buf, "shape=256x384 dtype=fp8e4m3 ranks=0-1 mesh=2 place=S(0) "
                          "quant=block(128,64)");
    layout_free(&l);
    l = parse_ok("shape=8 dtype=fp8e5m2 quant=channel", 2);
    cr_assert_eq(l.quant.kind, RS_QUANT_CHANNEL);
    layout_free(&l);
    l = parse_ok("shape=8 dtype=fp8e5m2 quant=tensor", 2);
    cr_assert_eq(l.quant.kind, RS_QUANT_TENSOR);
    layout_free(&l);
    expect_error("shape=8x8 dtype=fp8e4m3 quant=blok(1,2)", RESHARD_ERR_SPEC_SYNTAX,
                 "quant: expected block(R,C), channel or tensor at column 31");
    expect_error("shape=8x8 dtype=fp8e4m3 quant=block(0,2)", RESHARD_ERR_SPEC_SYNTAX,
                 "quant: block sizes must be positive at column 37");
    expect_error("shape=8x8 dtype=fp8e4m3 quant=block(4,2", RESHARD_ERR_SPEC_SYNTAX,
                 "quant: expected block(R,C): columns, then ')' at column 40");
    expect_error("shape=8x8 dtype=bf16 quant=tensor", RESHARD_ERR_SPEC_SYNTAX,
                 "quant: a quantized layout holds fp8e4m3 or fp8e5m2, not bf16 at column 28");
    expect_error("shape=64 dtype=fp8e4m3 quant=block(8,8)", RESHARD_ERR_SPEC_SYNTAX,
                 "quant: block(8,8) scales 2-D blocks of the last two dims, and the tensor has 1 "
                 "at column 30");
}
