/* SPDX-License-Identifier: Apache-2.0 */
#include "cuda_lib.h"
#include "delta_desc.h"
#include "pack_desc.h"
#include "base/error.h"

#include <pthread.h>
#include <stdio.h>

/* Generated from pack.cu by the build (build/obj/cuda/pack_fatbin.c); absent when nvcc was. */
extern const unsigned char rs_pack_fatbin[] __attribute__((weak));
extern const size_t rs_pack_fatbin_size __attribute__((weak));

#define BLOCK    256
#define MAX_GRID 4096

static cu_function pack_fn, unpack_fn, quant_fn;
static cu_function delta_mask_fn, delta_scan_fn, delta_compact_fn, delta_lengths_fn, delta_count_fn,
    delta_apply_fn;
static reshard_status_t load_status = RESHARD_ERR_UNAVAILABLE;
static char load_error[256];
static pthread_once_t load_once = PTHREAD_ONCE_INIT;

const unsigned char *cuda_fatbin(size_t *size)
{
    *size = &rs_pack_fatbin_size ? rs_pack_fatbin_size : 0;
    return *size ? rs_pack_fatbin : NULL;
}

static void load(void)
{
    size_t size;
    const unsigned char *image = cuda_fatbin(&size);
    const struct cuda_fns *f = cuda_lib();
    cu_module mod;
    cu_result r;
    if (!image) {
        snprintf(load_error, sizeof(load_error),
                 "cuda: this library was built without nvcc: no pack kernels");
    } else if (!f) {
        snprintf(load_error, sizeof(load_error), "%s", rs_error_message());
    } else if ((r = f->module_load_data(&mod, image)) != CU_SUCCESS ||
               (r = f->module_get_function(&pack_fn, mod, "rs_pack")) != CU_SUCCESS ||
               (r = f->module_get_function(&unpack_fn, mod, "rs_unpack")) != CU_SUCCESS ||
               (r = f->module_get_function(&quant_fn, mod, "rs_quant")) != CU_SUCCESS ||
               (r = f->module_get_function(&delta_mask_fn, mod, "rs_delta_mask")) != CU_SUCCESS ||
               (r = f->module_get_function(&delta_scan_fn, mod, "rs_delta_scan")) != CU_SUCCESS ||
               (r = f->module_get_function(&delta_compact_fn, mod, "rs_delta_compact")) !=
                   CU_SUCCESS ||
               (r = f->module_get_function(&delta_lengths_fn, mod, "rs_delta_lengths")) !=
                   CU_SUCCESS ||
               (r = f->module_get_function(&delta_count_fn, mod, "rs_delta_count")) != CU_SUCCESS ||
               (r = f->module_get_function(&delta_apply_fn, mod, "rs_delta_apply")) != CU_SUCCESS) {
        const char *s = NULL;
        f->get_error_string(r, &s);
        snprintf(load_error, sizeof(load_error), "cuda: loading the pack kernels: %s (%d)",
                 s ? s : "?", r);
    } else {
        load_status = RESHARD_OK;
    }
}

reshard_status_t cuda_kernels(void)
{
    pthread_once(&load_once, load);
    return load_status == RESHARD_OK ? RESHARD_OK : rs_error(load_status, "%s", load_error);
}

static reshard_status_t launch(cu_function fn, const struct rs_pack_desc *d, const void *a,
                               const void *b, cu_stream stream)
{
    RS_CHECK(cuda_kernels());
    if (d->numel == 0)
        return RESHARD_OK;
    int rows = d->vdim == 0; /* rows of a row-major buffer are contiguous: vector copies */
    int64_t units = rows ? d->numel / d->len[d->ndim - 1] : (d->numel + BLOCK - 1) / BLOCK;
    unsigned grid = (unsigned)(units < MAX_GRID ? (units > 0 ? units : 1) : MAX_GRID);
    struct rs_pack_desc desc = *d;
    void *params[] = {&desc, (void *)&a, (void *)&b, &rows};
    cu_result r = cuda_lib()->launch_kernel(fn, grid, 1, 1, BLOCK, 1, 1, 0, stream, params, NULL);
    return r == CU_SUCCESS ? RESHARD_OK : cuda_error("cuLaunchKernel", r);
}

reshard_status_t cuda_pack(const struct rs_pack_desc *d, const void *buf, void *packed,
                           cu_stream stream)
{
    return launch(pack_fn, d, buf, packed, stream);
}

reshard_status_t cuda_unpack(const struct rs_pack_desc *d, void *buf, const void *packed,
                             cu_stream stream)
{
    return launch(unpack_fn, d, buf, packed, stream);
}

static int quant_desc_ok(const struct rs_quant_desc *d)
{
    return d->src_type >= RS_QSRC_F32 && d->src_type <= RS_QSRC_F16 &&
           (d->fp8 == RS_FP8_E4M3 || d->fp8 == RS_FP8_E5M2) && d->mode > 0 &&
           d->mode <= (RS_QUANT_SCALES | RS_QUANT_CAST) && d->batch >= 0 && d->rows >= 0 &&
           d->cols >= 0 && d->brows > 0 && d->bcols > 0;
}

reshard_status_t cuda_quant(const struct rs_quant_desc *d, const void *src, void *dst,
                            float *scales, cu_stream stream)
{
    if (!quant_desc_ok(d))
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "cuda: FP8 quantization of a %lldx%lldx%lld region in %lldx%lld blocks "
                        "(source type %d, format %d, mode %d): not a valid request",
                        (long long)d->batch, (long long)d->rows, (long long)d->cols,
                        (long long)d->brows, (long long)d->bcols, d->src_type, d->fp8, d->mode);
    RS_CHECK(cuda_kernels());
    int64_t nblocks = rs_quant_nblocks(d);
    if (nblocks == 0)
        return RESHARD_OK;
    unsigned grid = (unsigned)(nblocks < MAX_GRID ? nblocks : MAX_GRID);
    struct rs_quant_desc desc = *d;
    void *params[] = {&desc, (void *)&src, &dst, &scales};
    cu_result r = cuda_lib()->launch_kernel(quant_fn, grid, 1, 1, RS_QUANT_THREADS, 1, 1, 0, stream,
                                            params, NULL);
    return r == CU_SUCCESS ? RESHARD_OK : cuda_error("cuLaunchKernel", r);
}

/* ---- compare-and-compact (delta_desc.h) ---- */

static unsigned grid_of(int64_t units, int per_block)
{
    int64_t g = (units + per_block - 1) / per_block;
    return (unsigned)(g < 1 ? 1 : g > MAX_GRID ? MAX_GRID : g);
}

/* One launch of a delta kernel whose only parameter is the descriptor. */
static reshard_status_t delta_launch(cu_function fn, unsigned grid, const struct rs_delta_desc *d,
                                     cu_stream stream)
{
    struct rs_delta_desc desc = *d;
    void *params[] = {&desc};
    cu_result r = cuda_lib()->launch_kernel(fn, grid, 1, 1, BLOCK, 1, 1, 0, stream, params, NULL);
    return r == CU_SUCCESS ? RESHARD_OK : cuda_error("cuLaunchKernel (delta)", r);
}

static reshard_status_t delta_scan(const struct rs_delta_desc *d, uint32_t *a, uint32_t *b,
                                   int64_t m, int choose, cu_stream stream)
{
    struct rs_delta_desc desc = *d;
    void *params[] = {&desc, &a, &b, &m, &choose};
    cu_result r = cuda_lib()->launch_kernel(delta_scan_fn, 1, 1, 1, RS_DELTA_SCAN_THREADS, 1, 1, 0,
                                            stream, params, NULL);
    return r == CU_SUCCESS ? RESHARD_OK : cuda_error("cuLaunchKernel (delta scan)", r);
}

static int delta_desc_ok(const struct rs_delta_desc *d)
{
    return (d->esize == 1 || d->esize == 2 || d->esize == 4 || d->esize == 8) && d->n > 0 &&
           d->n <= UINT32_MAX && d->nwords == rs_delta_nwords(d->n);
}

reshard_status_t cuda_delta_encode(const struct rs_delta_desc *d, cu_stream stream)
{
    if (!delta_desc_ok(d))
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "cuda: delta encoding of %lld elements of %d bytes: not a valid request",
                        (long long)d->n, d->esize);
    RS_CHECK(cuda_kernels());
    unsigned words = grid_of(d->nwords, BLOCK);
    RS_CHECK(delta_launch(delta_mask_fn, grid_of(d->nwords, BLOCK / 32), d, stream));
    RS_CHECK(delta_scan(d, d->cnt, d->starts, d->nwords, 1, stream));
    RS_CHECK(delta_launch(delta_compact_fn, words, d, stream));
    return delta_launch(delta_lengths_fn, words, d, stream);
}

reshard_status_t cuda_delta_apply(const struct rs_delta_desc *d, int kind, cu_stream stream)
{
    if (!delta_desc_ok(d) || (kind != RS_DELTA_BITMAP && kind != RS_DELTA_RUNS))
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "cuda: applying a delta of kind %d to %lld elements of %d bytes: not a "
                        "valid request",
                        kind, (long long)d->n, d->esize);
    RS_CHECK(cuda_kernels());
    int64_t m = kind == RS_DELTA_BITMAP ? d->nwords : (int64_t)d->nruns;
    if (m == 0)
        return RESHARD_OK;
    RS_CHECK(delta_launch(delta_count_fn, grid_of(m, BLOCK), d, stream));
    RS_CHECK(delta_scan(d, d->cnt, NULL, m, 0, stream));
    return delta_launch(delta_apply_fn,
                        kind == RS_DELTA_BITMAP ? grid_of(m, BLOCK) : grid_of(m, BLOCK / 32), d,
                        stream);
}
