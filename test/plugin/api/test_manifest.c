/* SPDX-License-Identifier: Apache-2.0 */
/* Manifests: a good one loads into layouts that plan, and every kind of bad input is an error
 * naming the tensor and the field. */
#include "base/param.h"
#include "plugin/reshard.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char path[64];

static void write_manifest(const char *json)
{
    snprintf(path, sizeof(path), "/tmp/reshard-manifest-XXXXXX");
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    FILE *f = fdopen(fd, "w");
    cr_assert_not_null(f);
    fputs(json, f);
    fclose(f);
}

static void cleanup(void)
{
    if (*path)
        unlink(path);
}

/* Loads `json` and expects status `want` with every string of `says` in the message. */
static void expect_error(const char *json, reshard_status_t want, const char *says1,
                         const char *says2)
{
    write_manifest(json);
    reshard_manifest_t *m = (void *)1;
    reshard_status_t st = reshard_manifest_load(path, &m);
    cr_assert_eq(st, want, "status %s, want %s: %s", reshard_strerror(st), reshard_strerror(want),
                 reshard_last_error());
    cr_assert_eq(m, (void *)1, "a failed load wrote its output");
    cr_assert(strstr(reshard_last_error(), says1), "'%s' does not say '%s'", reshard_last_error(),
              says1);
    if (says2)
        cr_assert(strstr(reshard_last_error(), says2), "'%s' does not say '%s'",
                  reshard_last_error(), says2);
}

#define GOOD_TENSOR(name)                                                                          \
    "{\"name\": \"" name "\", \"shape\": [64, 32], \"dtype\": \"bf16\", "                          \
    "\"src\": \"ranks=0-3 mesh=4 place=S(0)\", \"dst\": \"ranks=4-5 mesh=2 place=S(1)\"}"

Test(manifest, loads_tensors_with_string_and_object_sides_and_plans_them, .fini = cleanup)
{
    write_manifest(
        "{\"version\": 1, \"world_size\": 8, \"domains\": {\"size\": 4},"
        " \"meta\": {\"model\": \"toy\"}, \"tensors\": [" GOOD_TENSOR(
            "a") ","
                 " {\"name\": \"b\", \"shape\": [16], \"dtype\": \"f32\","
                 "  \"src\": {\"ranks\": [0, 1], \"mesh\": [2], \"place\": [\"S(0)\"]},"
                 "  \"dst\": {\"ranks\": \"4-7\", \"mesh\": \"2x2\", \"place\": \"R,S(0)\"}}]}");
    reshard_manifest_t *m = NULL;
    cr_assert_eq(reshard_manifest_load(path, &m), RESHARD_OK, "%s", reshard_last_error());
    cr_assert_eq(reshard_manifest_world_size(m), 8);
    cr_assert_eq(reshard_manifest_ntensors(m), 2);
    const reshard_tensor_t *t = reshard_manifest_tensors(m);
    cr_assert_str_eq(t[1].name, "b");
    reshard_layout_info_t info;
    cr_assert_eq(reshard_layout_info(t[1].dst, &info), RESHARD_OK);
    cr_assert_eq(info.nranks, 4);
    cr_assert_eq(info.elem_size, 4);
    int64_t shape[8], numel;
    cr_assert_eq(reshard_layout_shard_shape(t[1].dst, 5, shape, &numel), RESHARD_OK);
    cr_assert_eq(numel, 8, "rank 5 holds half of 16 floats, got %lld", (long long)numel);
    reshard_topo_t *topo;
    cr_assert_eq(reshard_manifest_topo(m, &topo), RESHARD_OK);
    reshard_plan_t *plan;
    cr_assert_eq(reshard_plan_create(t, 2, topo, NULL, &plan), RESHARD_OK, "%s",
                 reshard_last_error());
    cr_assert_eq(reshard_plan_validate(plan), RESHARD_OK, "%s", reshard_last_error());
    reshard_plan_stats_t s;
    cr_assert_eq(reshard_plan_stats(plan, &s, NULL), RESHARD_OK);
    cr_assert_eq(s.ntensors, 2);
    cr_assert_eq(s.ndomains, 2, "domains of 4 over 8 ranks");
    cr_assert_eq(s.net_bytes, s.min_net_bytes);
    reshard_plan_destroy(plan);
    reshard_topo_destroy(topo);
    reshard_manifest_destroy(m);
}

static uint64_t net_of(const reshard_tensor_t *t, int n, const reshard_topo_t *topo);

/* An FP8 inference side: dst_dtype gives the destination its own dtype, the dst side its
 * quant; the plan quantizes where the sources hold whole blocks, so the bytes on the network
 * are the FP8 values and their float32 scales: half of the bf16 refit of the same layouts and a
 * little more. */
#define FP8_MANIFEST(dst_dtype, quant)                                                             \
    "{\"version\": 1, \"world_size\": 8, \"domains\": {\"size\": 4}, \"tensors\": ["               \
    "{\"name\": \"w.weight\", \"shape\": [512, 256], \"dtype\": \"bf16\"" dst_dtype ","            \
    " \"src\": \"ranks=0-3 mesh=4 place=S(0)\", \"dst\": \"ranks=4-7 mesh=2x2 place=R,S(0)" quant  \
    "\"}]}"

static uint64_t manifest_net_bytes(const char *json)
{
    write_manifest(json);
    reshard_manifest_t *m = NULL;
    cr_assert_eq(reshard_manifest_load(path, &m), RESHARD_OK, "%s", reshard_last_error());
    reshard_topo_t *topo;
    cr_assert_eq(reshard_manifest_topo(m, &topo), RESHARD_OK);
    uint64_t net = net_of(reshard_manifest_tensors(m), reshard_manifest_ntensors(m), topo);
    reshard_layout_info_t info;
    cr_assert_eq(reshard_layout_info(reshard_manifest_tensors(m)[0].src, &info), RESHARD_OK);
    cr_assert_eq(info.elem_size, 2, "the source keeps the tensor's dtype");
    reshard_topo_destroy(topo);
    reshard_manifest_destroy(m);
    unlink(path);
    return net;
}

Test(manifest, an_fp8_destination_takes_dst_dtype_and_quant, .fini = cleanup)
{
    uint64_t bf16 = manifest_net_bytes(FP8_MANIFEST("", ""));
    uint64_t fp8 =
        manifest_net_bytes(FP8_MANIFEST(", \"dst_dtype\": \"fp8e4m3\"", " quant=block(128,128)"));
    /* the inference domain (ranks 4-7) takes the whole tensor once: 512 x 256 values, and the
     * 4 x 2 scales of its blocks */
    cr_assert_eq(bf16, 512 * 256 * 2, "bf16 net bytes %llu", (unsigned long long)bf16);
    cr_assert_eq(fp8, 512 * 256 + 4 * 2 * 4, "fp8 net bytes %llu", (unsigned long long)fp8);
    expect_error(FP8_MANIFEST(", \"dst_dtype\": 8", " quant=block(128,128)"),
                 RESHARD_ERR_SPEC_SYNTAX, "tensors[0] (w.weight).dst_dtype: is an integer", NULL);
    expect_error(FP8_MANIFEST(", \"dst_dtype\": \"fp7\"", ""), RESHARD_ERR_SPEC_SYNTAX,
                 "tensors[0] (w.weight).dst", "fp7");
}

Test(manifest, malformed_json_names_the_line, .fini = cleanup)
{
    expect_error("{\"version\": 1,\n \"world_size\": }", RESHARD_ERR_SPEC_SYNTAX, ":2:", NULL);
}

Test(manifest, missing_top_level_fields_are_named, .fini = cleanup)
{
    expect_error("{\"version\": 1, \"tensors\": [" GOOD_TENSOR("a") "]}", RESHARD_ERR_SPEC_SYNTAX,
                 "world_size: missing", NULL);
    expect_error("{\"world_size\": 8, \"tensors\": [" GOOD_TENSOR("a") "]}",
                 RESHARD_ERR_SPEC_SYNTAX, "version: missing", NULL);
    expect_error("{\"version\": 1, \"world_size\": 8}", RESHARD_ERR_SPEC_SYNTAX, "tensors: missing",
                 NULL);
    expect_error("{\"version\": 2, \"world_size\": 8, \"tensors\": [" GOOD_TENSOR("a") "]}",
                 RESHARD_ERR_SPEC_SYNTAX, "version: must be 1", NULL);
    expect_error("{\"version\": 1, \"world_size\": 8, \"extra\": 1, \"tensors\": []}",
                 RESHARD_ERR_SPEC_SYNTAX, "extra: unknown key", NULL);
}

Test(manifest, a_tensor_missing_a_field_is_named_with_its_path, .fini = cleanup)
{
    expect_error(
        "{\"version\": 1, \"world_size\": 8, \"tensors\": [" GOOD_TENSOR(
            "a") ","
                 " {\"name\": \"w\", \"shape\": [4], \"dtype\": \"bf16\", \"src\": \"ranks=0\"}]}",
        RESHARD_ERR_SPEC_SYNTAX, "tensors[1] (w).dst: missing", NULL);
    expect_error(
        "{\"version\": 1, \"world_size\": 8, \"tensors\": ["
        " {\"shape\": [4], \"dtype\": \"bf16\", \"src\": \"ranks=0\", \"dst\": \"ranks=1\"}]}",
        RESHARD_ERR_SPEC_SYNTAX, "tensors[0].name: missing", NULL);
}

Test(manifest, a_wrong_type_is_named, .fini = cleanup)
{
    expect_error("{\"version\": 1, \"world_size\": 8, \"tensors\": ["
                 " {\"name\": \"w\", \"shape\": \"4x4\", \"dtype\": \"bf16\", \"src\": \"ranks=0\","
                 "  \"dst\": \"ranks=1\"}]}",
                 RESHARD_ERR_SPEC_SYNTAX, "tensors[0] (w).shape", "a string");
    expect_error("{\"version\": 1, \"world_size\": 8, \"tensors\": ["
                 " {\"name\": \"w\", \"shape\": [4], \"dtype\": \"bf16\", \"src\": 7,"
                 "  \"dst\": \"ranks=1\"}]}",
                 RESHARD_ERR_SPEC_SYNTAX, "tensors[0] (w).src", "an integer");
    expect_error("{\"version\": 1, \"world_size\": 8, \"tensors\": ["
                 " {\"name\": \"w\", \"shape\": [4], \"dtype\": \"bf16\", \"src\": \"ranks=0\","
                 "  \"dst\": {\"ranks\": [1, \"x\"]}}]}",
                 RESHARD_ERR_SPEC_SYNTAX, "tensors[0] (w).dst", "ranks[1] is a string");
}

Test(manifest, an_unknown_dtype_or_placement_is_the_parsers_error_with_the_path, .fini = cleanup)
{
    expect_error("{\"version\": 1, \"world_size\": 8, \"tensors\": ["
                 " {\"name\": \"w\", \"shape\": [4], \"dtype\": \"bf17\", \"src\": \"ranks=0\","
                 "  \"dst\": \"ranks=1\"}]}",
                 RESHARD_ERR_SPEC_SYNTAX, "tensors[0] (w).src", "bf17");
    expect_error("{\"version\": 1, \"world_size\": 8, \"tensors\": ["
                 " {\"name\": \"w\", \"shape\": [4], \"dtype\": \"bf16\", \"src\": \"ranks=0\","
                 "  \"dst\": \"ranks=1-2 place=X(0)\"}]}",
                 RESHARD_ERR_SPEC_SYNTAX, "tensors[0] (w).dst", "place");
    expect_error("{\"version\": 1, \"world_size\": 8, \"tensors\": ["
                 " {\"name\": \"w\", \"shape\": [4], \"dtype\": \"bf16\","
                 "  \"src\": \"shape=4 ranks=0\", \"dst\": \"ranks=1\"}]}",
                 RESHARD_ERR_SPEC_SYNTAX, "tensors[0] (w).src", "belong to the tensor");
}

Test(manifest, duplicate_names_and_ranks_outside_the_world_are_refused, .fini = cleanup)
{
    expect_error("{\"version\": 1, \"world_size\": 8, \"tensors\": [" GOOD_TENSOR(
                     "a") "," GOOD_TENSOR("b") "," GOOD_TENSOR("a") "]}",
                 RESHARD_ERR_SPEC_SYNTAX, "'a' appears twice", NULL);
    expect_error("{\"version\": 1, \"world_size\": 5, \"tensors\": [" GOOD_TENSOR("a") "]}",
                 RESHARD_ERR_RANK_RANGE, "tensors[0] (a).dst", "rank 5 is outside world_size 5");
}

Test(manifest, domains_must_cover_the_world, .fini = cleanup)
{
    expect_error("{\"version\": 1, \"world_size\": 8, \"domains\": {\"of_rank\": [0, 0, 1]},"
                 " \"tensors\": [" GOOD_TENSOR("a") "]}",
                 RESHARD_ERR_SPEC_SYNTAX, "domains.of_rank", "world_size (8)");
    expect_error("{\"version\": 1, \"world_size\": 8, \"domains\": {\"size\": 0},"
                 " \"tensors\": [" GOOD_TENSOR("a") "]}",
                 RESHARD_ERR_SPEC_SYNTAX, "domains.size", NULL);
}

Test(manifest, a_missing_file_is_an_error_naming_it)
{
    reshard_manifest_t *m = NULL;
    cr_assert_eq(reshard_manifest_load("/nonexistent/m.json", &m), RESHARD_ERR_SPEC_SYNTAX);
    cr_assert(strstr(reshard_last_error(), "/nonexistent/m.json"), "%s", reshard_last_error());
    cr_assert_null(m);
}

/* Views into one buffer: interleaved ones that share no element load; overlapping ones are an
 * error naming both tensors, the buffer and the rank. */
Test(manifest, views_of_one_buffer_may_interleave_but_not_overlap, .fini = cleanup)
{
    /* Each rank holds 4 rows of q and 4 of k, interleaved 2 by 2: q rows at 0-1 and 4-5, k
     * rows at 2-3 and 6-7 of the buffer (rows of 4 elements). */
    write_manifest("{\"version\": 1, \"world_size\": 4, \"tensors\": ["
                   " {\"name\": \"q\", \"shape\": [8, 4], \"dtype\": \"f32\","
                   "  \"src\": \"ranks=0-1 place=S(0) buffer=qkv view=2x2x4 strides=16x4x1\","
                   "  \"dst\": \"ranks=2-3 place=S(0)\"},"
                   " {\"name\": \"k\", \"shape\": [8, 4], \"dtype\": \"f32\","
                   "  \"src\": \"ranks=0-1 place=S(0) buffer=qkv offset=8 view=2x2x4 "
                   "strides=16x4x1\","
                   "  \"dst\": \"ranks=2-3 place=S(0)\"}]}");
    reshard_manifest_t *m = NULL;
    cr_assert_eq(reshard_manifest_load(path, &m), RESHARD_OK, "%s", reshard_last_error());
    size_t bytes;
    cr_assert_eq(reshard_layout_shard_bytes(reshard_manifest_tensors(m)[1].src, 1, &bytes),
                 RESHARD_OK);
    cr_assert_eq(bytes, 32 * 4, "k's view reaches element 31 of the buffer");
    reshard_manifest_destroy(m);
    cleanup();
    expect_error(
        "{\"version\": 1, \"world_size\": 4, \"tensors\": ["
        " {\"name\": \"q\", \"shape\": [8, 4], \"dtype\": \"f32\","
        "  \"src\": \"ranks=0-1 place=S(0) buffer=qkv\", \"dst\": \"ranks=2-3\"},"
        " {\"name\": \"k\", \"shape\": [8, 4], \"dtype\": \"f32\","
        "  \"src\": \"ranks=0-1 place=S(0) buffer=qkv offset=8\", \"dst\": \"ranks=2-3\"}]}",
        RESHARD_ERR_VIEW, "tensors[0] (q).src and tensors[1] (k).src overlap in buffer 'qkv'",
        "rank 0 (elements 8 to 15)");
}

/* "buffers" gives a shared buffer's size: a view reaching past it is an error; a malformed
 * size is named. */
Test(manifest, a_view_past_its_buffer_size_is_refused, .fini = cleanup)
{
#define QK_VIEWS                                                                                   \
    " {\"name\": \"q\", \"shape\": [8, 4], \"dtype\": \"f32\","                                    \
    "  \"src\": \"ranks=0-1 place=S(0) buffer=qkv\", \"dst\": \"ranks=2-3\"},"                     \
    " {\"name\": \"k\", \"shape\": [8, 4], \"dtype\": \"f32\","                                    \
    "  \"src\": \"ranks=0-1 place=S(0) buffer=qkv offset=16\", \"dst\": \"ranks=2-3\"}]}"
    write_manifest("{\"version\": 1, \"world_size\": 4, \"buffers\": {\"qkv\": 32},"
                   " \"tensors\": [" QK_VIEWS);
    reshard_manifest_t *m = NULL;
    cr_assert_eq(reshard_manifest_load(path, &m), RESHARD_OK, "%s", reshard_last_error());
    reshard_manifest_destroy(m);
    cleanup();
    expect_error("{\"version\": 1, \"world_size\": 4, \"buffers\": {\"qkv\": 31},"
                 " \"tensors\": [" QK_VIEWS,
                 RESHARD_ERR_VIEW,
                 "tensors[1] (k).src: its view reaches element 31 of buffer 'qkv'", "holds 31");
    expect_error("{\"version\": 1, \"world_size\": 4, \"buffers\": {\"qkv\": \"big\"},"
                 " \"tensors\": [" QK_VIEWS,
                 RESHARD_ERR_SPEC_SYNTAX, "buffers: 'qkv' must be a size", NULL);
#undef QK_VIEWS
}

/* Issue 27: an offset whose span wrapped to 64 bytes passed a buffer of 8 f64 elements. The
 * loader refuses it now, naming the tensor, the side and the column. */
Test(manifest, a_view_offset_near_2_63_bytes_is_refused_naming_the_tensor, .fini = cleanup)
{
    expect_error("{\"version\": 1, \"world_size\": 1, \"buffers\": {\"b\": 8},"
                 " \"tensors\": [{\"name\": \"w\", \"shape\": [10], \"dtype\": \"f64\","
                 " \"src\": \"ranks=0\","
                 " \"dst\": \"ranks=0 buffer=b offset=2305843009213693950\"}]}",
                 RESHARD_ERR_TOO_LARGE,
                 "tensors[0] (w).dst: offset: the view of rank 0 reaches "
                 "past byte 2^63",
                 "at column");
}

/* Tensors with equal layouts share one shard map in the planner: their plan together is the
 * sum of their plans alone, and valid. */
static uint64_t net_of(const reshard_tensor_t *t, int n, const reshard_topo_t *topo)
{
    reshard_plan_t *plan;
    reshard_plan_stats_t s;
    cr_assert_eq(reshard_plan_create(t, n, topo, NULL, &plan), RESHARD_OK, "%s",
                 reshard_last_error());
    cr_assert_eq(reshard_plan_validate(plan), RESHARD_OK, "%s", reshard_last_error());
    cr_assert_eq(reshard_plan_stats(plan, &s, NULL), RESHARD_OK);
    reshard_plan_destroy(plan);
    return s.net_bytes;
}

Test(manifest, equal_layouts_plan_as_the_sum_of_their_plans)
{
    reshard_layout_t *a_src, *a_dst, *a2_src, *b_src, *b_dst;
    cr_assert_eq(reshard_layout_parse("shape=64x48 dtype=f32 ranks=0-3 place=S(0)", 0, &a_src),
                 RESHARD_OK);
    cr_assert_eq(reshard_layout_parse("shape=64x48 dtype=f32 ranks=0-3 place=S(0)", 0, &a2_src),
                 RESHARD_OK); /* equal to a_src, another object */
    cr_assert_eq(
        reshard_layout_parse("shape=64x48 dtype=f32 ranks=4-7 mesh=2x2 place=R,S(1)", 0, &a_dst),
        RESHARD_OK);
    cr_assert_eq(reshard_layout_parse("shape=30x20 dtype=bf16 ranks=1,0 place=S(1)", 0, &b_src),
                 RESHARD_OK);
    cr_assert_eq(reshard_layout_parse("shape=30x20 dtype=bf16 ranks=6-7 place=R", 0, &b_dst),
                 RESHARD_OK);
    reshard_topo_t *topo;
    cr_assert_eq(reshard_topo_create(8, 2, NULL, &topo), RESHARD_OK);
    reshard_tensor_t a = {"a", a_src, a_dst}, a2 = {"a2", a2_src, a_dst}, b = {"b", b_src, b_dst};
    reshard_tensor_t all[] = {a, b, a2, a};
    uint64_t one_a = net_of(&a, 1, topo), one_b = net_of(&b, 1, topo);
    cr_assert_gt(one_a, 0);
    cr_assert_eq(net_of(all, 4, topo), 3 * one_a + one_b);
    reshard_topo_destroy(topo);
    reshard_layout_destroy(a_src);
    reshard_layout_destroy(a2_src);
    reshard_layout_destroy(a_dst);
    reshard_layout_destroy(b_src);
    reshard_layout_destroy(b_dst);
}

/* jansson is loaded on the first manifest: hidden, manifests fail saying what to install, and
 * everything else still works in the same process. */
Test(manifest, without_jansson_manifests_fail_saying_what_to_install, .fini = cleanup)
{
    setenv("RESHARD_JANSSON_LIB", "/nonexistent/libjansson.so.4", 1);
    rs_param_reload();
    write_manifest("{\"version\": 1, \"world_size\": 8, \"tensors\": [" GOOD_TENSOR("a") "]}");
    reshard_manifest_t *m = NULL;
    cr_assert_eq(reshard_manifest_load(path, &m), RESHARD_ERR_UNAVAILABLE);
    cr_assert_null(m);
    cr_assert(strstr(reshard_last_error(), "manifest: cannot read JSON") &&
                  strstr(reshard_last_error(), "install libjansson4"),
              "%s", reshard_last_error());
    reshard_layout_t *l;
    cr_assert_eq(reshard_layout_parse("shape=8 ranks=0-1 place=S(0)", 0, &l), RESHARD_OK);
    reshard_layout_destroy(l);
}

Test(manifest, a_dash_reads_standard_input, .fini = cleanup)
{
    write_manifest("{\"version\": 1, \"world_size\": 8, \"tensors\": [" GOOD_TENSOR("a") "]}");
    cr_assert_not_null(freopen(path, "r", stdin));
    reshard_manifest_t *m = NULL;
    cr_assert_eq(reshard_manifest_load("-", &m), RESHARD_OK, "%s", reshard_last_error());
    cr_assert_eq(reshard_manifest_ntensors(m), 1);
    reshard_manifest_destroy(m);
    cr_assert_not_null(freopen("/dev/null", "r", stdin));
    cr_assert_eq(reshard_manifest_load("-", &m), RESHARD_ERR_SPEC_SYNTAX);
    cr_assert(strstr(reshard_last_error(), "manifest <stdin>"), "%s", reshard_last_error());
}

/* A model repeats its placements: tensors with equal sides share one layout, and the manifest
 * holds each once. */
Test(manifest, equal_sides_share_one_layout, .fini = cleanup)
{
    write_manifest(
        "{\"version\": 1, \"world_size\": 8, \"tensors\": [" GOOD_TENSOR("a") "," GOOD_TENSOR(
            "b") ","
                 " {\"name\": \"c\", \"shape\": [64, 16], \"dtype\": \"bf16\", "
                 "\"src\": \"ranks=0-3 mesh=4 place=S(0)\", \"dst\": \"ranks=4-5 mesh=2 "
                 "place=S(1)\"}]}");
    reshard_manifest_t *m = NULL;
    cr_assert_eq(reshard_manifest_load(path, &m), RESHARD_OK, "%s", reshard_last_error());
    const reshard_tensor_t *t = reshard_manifest_tensors(m);
    cr_assert_eq(t[0].src, t[1].src, "same spec and shape: one layout");
    cr_assert_eq(t[0].dst, t[1].dst);
    cr_assert_neq(t[0].src, t[2].src, "another shape: another layout");
    reshard_manifest_destroy(m);
}

Test(manifest, an_fp8_destination_takes_its_own_dtype_and_plans_its_scales, .fini = cleanup)
{
    write_manifest("{\"version\": 1, \"world_size\": 4, \"domains\": {\"size\": 2}, \"tensors\": ["
                   "{\"name\": \"l.weight\", \"shape\": [256, 256], \"dtype\": \"bf16\", "
                   "\"dst_dtype\": \"fp8e4m3\", \"src\": \"ranks=0-1 place=S(0)\", "
                   "\"dst\": {\"ranks\": \"2-3\", \"place\": \"S(1)\", "
                   "\"quant\": \"block(128,128)\"}}]}");
    reshard_manifest_t *m = NULL;
    cr_assert_eq(reshard_manifest_load(path, &m), RESHARD_OK, "%s", reshard_last_error());
    const reshard_tensor_t *t = reshard_manifest_tensors(m);
    char spec[256];
    reshard_layout_format(t[0].dst, spec, sizeof(spec));
    cr_assert(strstr(spec, "dtype=fp8e4m3") && strstr(spec, "quant=block(128,128)"), "%s", spec);
    reshard_layout_format(t[0].src, spec, sizeof(spec));
    cr_assert(strstr(spec, "dtype=bf16"), "%s", spec);
    reshard_topo_t *topo = NULL;
    cr_assert_eq(reshard_manifest_topo(m, &topo), RESHARD_OK);
    reshard_plan_t *p = NULL;
    cr_assert_eq(reshard_plan_create(t, 1, topo, NULL, &p), RESHARD_OK, "%s", reshard_last_error());
    cr_assert_eq(reshard_plan_ntensors(p), 2);
    cr_assert_str_eq(reshard_plan_tensor_name(p, 1), "l.weight_scale_inv");
    reshard_plan_stats_t s;
    cr_assert_eq(reshard_plan_stats(p, &s, NULL), RESHARD_OK);
    cr_assert_eq(s.quant_at_source_pct, 100.0);
    cr_assert_eq(s.net_bytes, 256 * 256 + 4 * 4, "FP8 and the 4 scales cross once");
    reshard_plan_destroy(p);
    reshard_topo_destroy(topo);
    reshard_manifest_destroy(m);
    expect_error("{\"version\": 1, \"world_size\": 2, \"tensors\": [{\"name\": \"w\", \"shape\": "
                 "[8], \"dtype\": \"bf16\", \"dst_dtype\": 8, \"src\": \"ranks=0\", \"dst\": "
                 "\"ranks=1\"}]}",
                 RESHARD_ERR_SPEC_SYNTAX, "dst_dtype", "not a string");
}
