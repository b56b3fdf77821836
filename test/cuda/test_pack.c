/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The pack kernels' addressing, proven on the host: for every box of several plans (row-major
 * shards, padded views, a transposed view), the descriptor the kernels get (region_desc) puts
 * every element exactly where the host's region walk does. rs_pack_offset is the very code
 * the kernels run. With a GPU the kernels themselves are checked against region_pack; the
 * fatbin's presence is checked wherever nvcc built it.
 */
#include "base/error.h"
#include "cuda/cuda_lib.h"
#include "cuda/pack_desc.h"
#include "plugin/exec/region.h"
#include "plugin/handles.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

/* Every element of a region, in box order: its buffer element offset from the host walk. */
static int64_t *walk(const struct region *r, int64_t *n)
{
    struct region_iter it;
    uint64_t off, len;
    int64_t cap = 1;
    for (int j = 0; j < r->ndim; j++)
        cap *= r->len[j];
    int64_t *out = calloc((size_t)cap + 1, sizeof(int64_t));
    *n = 0;
    region_iter_init(&it, r);
    while (region_iter_next(&it, &off, &len))
        for (uint64_t k = 0; k < len / r->esize; k++)
            out[(*n)++] = (int64_t)(off / r->esize + k);
    return out;
}

/* Checks every op box of the plan of src -> dst, on both sides. Returns the boxes checked. */
static int check_plan(const char *src, const char *dst, int world, int *views)
{
    reshard_layout_t *s, *d;
    cr_assert_eq(reshard_layout_parse(src, 0, &s), RESHARD_OK, "%s", reshard_last_error());
    cr_assert_eq(reshard_layout_parse(dst, 0, &d), RESHARD_OK, "%s", reshard_last_error());
    reshard_tensor_t t = {"t", s, d};
    reshard_topo_t *topo;
    reshard_plan_t *plan;
    cr_assert_eq(reshard_topo_create(world, 2, NULL, &topo), RESHARD_OK);
    cr_assert_eq(reshard_plan_create(&t, 1, topo, NULL, &plan), RESHARD_OK, "%s",
                 reshard_last_error());
    const struct rs_plan *p = plan->p;
    int boxes = 0;
    for (size_t i = 0; i < p->nops; i++) {
        const struct plan_op *op = &p->ops[i];
        const struct plan_tensor *pt = &p->tensors[op->tensor];
        for (int side = 0; side < 2; side++) {
            if (side == 0 && op->kind == PLAN_OP_FWD)
                continue; /* its source is the forwarder's destination: checked there */
            const struct rs_shardmap *m = side ? &pt->dst_map : &pt->src_map;
            int rank = side ? op->dst : op->src;
            struct region r;
            region_of_shard(m, shardmap_position(m, rank), plan_op_start(p, op), plan_op_len(p, op),
                            &r);
            struct rs_pack_desc desc;
            region_desc(&r, &desc);
            int64_t n, *want = walk(&r, &n);
            cr_assert_eq(desc.numel, n, "op %zu side %d: %lld elements, the walk %lld", i, side,
                         (long long)desc.numel, (long long)n);
            for (int64_t e = 0; e < n; e++)
                cr_assert_eq(rs_pack_offset(&desc, e), want[e],
                             "op %zu side %d element %lld: kernel offset %lld, host %lld", i, side,
                             (long long)e, (long long)rs_pack_offset(&desc, e), (long long)want[e]);
            *views += desc.vdim > 0;
            boxes++;
            free(want);
        }
    }
    reshard_plan_destroy(plan);
    reshard_topo_destroy(topo);
    reshard_layout_destroy(s);
    reshard_layout_destroy(d);
    return boxes;
}

Test(pack, the_kernels_address_every_element_where_the_host_walk_does)
{
    int views = 0, boxes = 0;
    boxes += check_plan("shape=48x40 dtype=i32 ranks=0-1 mesh=2 place=S(0)",
                        "shape=48x40 dtype=i32 ranks=2-5 place=S(1)", 6, &views);
    boxes += check_plan("shape=8x6x10 dtype=bf16 ranks=0-3 mesh=2x2 place=SS(0,2),S(2)",
                        "shape=8x6x10 dtype=bf16 ranks=4-7 mesh=2x2 place=S(1),R", 8, &views);
    /* padded rows (a view with strides) and a transposed view */
    boxes += check_plan("shape=12x8 dtype=i32 ranks=0-1 mesh=2 place=S(0) buffer=b offset=5 "
                        "view=6x8 strides=16x1",
                        "shape=12x8 dtype=i32 ranks=2-3 mesh=2 place=S(1) buffer=c view=12x4 "
                        "strides=1x12",
                        4, &views);
    cr_assert_gt(boxes, 40, "%d boxes", boxes);
    cr_assert_gt(views, 4, "boxes under views: %d", views);
}

Test(pack, the_fatbin_is_embedded_where_nvcc_built_it)
{
    size_t size;
    const unsigned char *fb = cuda_fatbin(&size);
    if (!fb)
        cr_skip_test("this build had no nvcc: no kernels to embed");
    static const unsigned char magic[4] = {0x50, 0xed, 0x55, 0xba}; /* 0xBA55ED50 */
    cr_assert_gt(size, 1024);
    cr_assert_arr_eq(fb, magic, 4, "a fatbin starts with its magic");
}

Test(pack, without_a_device_the_kernels_say_why)
{
    setenv("RESHARD_CUDA_LIB", "libcuda-not-here.so.1", 1);
    struct rs_pack_desc d = {.ndim = 1, .esize = 4, .numel = 4, .len = {4}, .lstride = {1}};
    cr_assert_eq(cuda_pack(&d, NULL, NULL, NULL), RESHARD_ERR_UNAVAILABLE);
    size_t size;
    cr_assert(
        strstr(rs_error_message(), cuda_fatbin(&size) ? "cuda: no driver" : "built without nvcc"),
        "%s", rs_error_message());
}

/* ---- with a GPU: the kernels against region_pack ---- */

Test(gpu, pack_and_unpack_kernels_match_the_host)
{
    const struct cuda_fns *f = cuda_lib();
    if (!f)
        cr_skip_test("no CUDA device (%s)", rs_error_message());
    cr_assert_eq(cuda_current_context(), RESHARD_OK, "%s", rs_error_message());
    size_t fatbin = 0;
    if (!cuda_fatbin(&fatbin))
        cr_skip_test("this build had no nvcc: no pack kernels");
    cr_assert_eq(cuda_kernels(), RESHARD_OK, "%s", rs_error_message());
    /* a 64x48 i32 shard, box rows 3..50, cols 5..36; and the same under a padded view */
    struct rs_view padded = {
        .offset = 3, .ndim = 2, .shape = {64, 48}, .nstrides = 2, .strides = {50, 1}};
    const struct rs_view *views[2] = {NULL, &padded};
    for (int v = 0; v < 2; v++) {
        struct region r = {.esize = 4,
                           .ndim = 2,
                           .shape = {64, 48},
                           .start = {3, 5},
                           .len = {48, 32},
                           .view = views[v]};
        size_t span = 4 * (3 + 64 * 50), packed_bytes = region_bytes(&r);
        char *host = malloc(span), *want = malloc(packed_bytes), *got = malloc(packed_bytes);
        for (size_t i = 0; i < span; i++)
            host[i] = (char)(i * 131 + v);
        region_pack(&r, host, want);
        cu_deviceptr buf, packed;
        cr_assert_eq(f->mem_alloc(&buf, span), CU_SUCCESS);
        cr_assert_eq(f->mem_alloc(&packed, packed_bytes), CU_SUCCESS);
        cr_assert_eq(f->memcpy_htod(buf, host, span), CU_SUCCESS);
        struct rs_pack_desc d;
        region_desc(&r, &d);
        cr_assert_eq(cuda_pack(&d, (void *)(uintptr_t)buf, (void *)(uintptr_t)packed, NULL),
                     RESHARD_OK, "%s", rs_error_message());
        cr_assert_eq(f->ctx_synchronize(), CU_SUCCESS);
        cr_assert_eq(f->memcpy_dtoh(got, packed, packed_bytes), CU_SUCCESS);
        cr_assert_arr_eq(got, want, packed_bytes, "pack, view %d", v);
        /* unpack into a cleared buffer: exactly the box comes back, the rest stays zero */
        memset(host, 0, span);
        cr_assert_eq(f->memcpy_htod(buf, host, span), CU_SUCCESS);
        cr_assert_eq(cuda_unpack(&d, (void *)(uintptr_t)buf, (void *)(uintptr_t)packed, NULL),
                     RESHARD_OK);
        cr_assert_eq(f->ctx_synchronize(), CU_SUCCESS);
        char *back = malloc(span), *expect = calloc(1, span);
        cr_assert_eq(f->memcpy_dtoh(back, buf, span), CU_SUCCESS);
        region_unpack(&r, expect, want);
        cr_assert_arr_eq(back, expect, span, "unpack, view %d", v);
        f->mem_free(buf);
        f->mem_free(packed);
        free(host), free(want), free(got), free(back), free(expect);
    }
}
