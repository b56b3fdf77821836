/* SPDX-License-Identifier: Apache-2.0 */
/*
 * How the pack and unpack kernels address a box of a shard: the same index arithmetic on the
 * host (region_desc, its tests) and on the device (pack.cu), so the host tests prove what the
 * kernels compute. Element e of the box, in row-major box order, sits at linear index
 * base + sum_j i_j * lstride[j] of the shard's local shape; a view then maps that linear index
 * to the buffer (unravelled over vshape, dotted with vstride, plus voffset).
 */
#ifndef RS_PACK_DESC_H
#define RS_PACK_DESC_H

#include "quant.h"

#include <stdint.h>

#ifdef __CUDACC__
#define RS_HD __host__ __device__
#else
#define RS_HD
#endif

#define RS_PACK_MAX_DIMS 8

struct rs_pack_desc {
    int32_t ndim;  /* box dims */
    int32_t vdim;  /* view dims; 0: the buffer is row-major over the local shape */
    int32_t esize; /* bytes per element */
    int32_t pad;
    int64_t numel;                     /* elements in the box */
    int64_t len[RS_PACK_MAX_DIMS];     /* the box */
    int64_t lstride[RS_PACK_MAX_DIMS]; /* row-major strides of the local shape (elements) */
    int64_t base;                      /* linear index of the box's first element */
    int64_t vshape[RS_PACK_MAX_DIMS];  /* the view */
    int64_t vstride[RS_PACK_MAX_DIMS]; /* its strides (elements) */
    int64_t voffset;                   /* its offset (elements) */
};

/* The buffer element holding element e of the box. */
static inline RS_HD int64_t rs_pack_offset(const struct rs_pack_desc *d, int64_t e)
{
    int64_t lin = d->base;
    for (int j = d->ndim - 1; j >= 0; j--) {
        lin += (e % d->len[j]) * d->lstride[j];
        e /= d->len[j];
    }
    if (!d->vdim)
        return lin;
    int64_t at = d->voffset;
    for (int k = d->vdim - 1; k >= 0; k--) {
        at += (lin % d->vshape[k]) * d->vstride[k];
        lin /= d->vshape[k];
    }
    return at;
}

/* ---- FP8 quantization of a region (cuda/quant.h) ----
 *
 * batch x rows x cols elements of a shard, cut into blocks of brows x bcols starting at the
 * region's first element (the last blocks of a dim may be partial: the tensor's edge). Element
 * (b, r, c) of the source is at b * src_bs + r * src_ld + c (elements of src_type), its FP8 code
 * at the same place under dst_bs, dst_ld, and block (b, i, j)'s scale at b * sc_bs + i * sc_ld + j
 * (floats). The kernel (pack.cu) and the stand-in (test/fake) both walk it with these helpers
 * and compute every value with quant.h: amax, scale, cast.
 */
enum rs_qsrc { RS_QSRC_F32, RS_QSRC_BF16, RS_QSRC_F16 };

#define RS_QUANT_SCALES  1   /* compute each block's scale from its elements and write it */
#define RS_QUANT_CAST    2   /* cast each block by its scale (computed, else read from scales) */
#define RS_QUANT_THREADS 256 /* threads per block of the kernel (its shared reduction) */

struct rs_quant_desc {
    int32_t src_type; /* enum rs_qsrc */
    int32_t fp8;      /* enum rs_fp8 */
    int32_t mode;     /* RS_QUANT_SCALES | RS_QUANT_CAST */
    int32_t pad;
    int64_t batch, rows, cols; /* the region */
    int64_t brows, bcols;      /* a block */
    int64_t src_ld, src_bs;    /* source strides (elements) */
    int64_t dst_ld, dst_bs;    /* FP8 strides (bytes) */
    int64_t sc_ld, sc_bs;      /* scales' strides (floats) */
};

/* One block of a region: its batch, first row and column, extent, and its scale's index. */
struct rs_quant_block {
    int64_t b, r0, c0, nr, nc, at;
};

static inline RS_HD int64_t rs_quant_nblocks(const struct rs_quant_desc *d)
{
    return d->batch * ((d->rows + d->brows - 1) / d->brows) * ((d->cols + d->bcols - 1) / d->bcols);
}

/* Block k of the region, in (batch, block row, block column) order. */
static inline RS_HD void rs_quant_block_of(const struct rs_quant_desc *d, int64_t k,
                                           struct rs_quant_block *q)
{
    int64_t nbr = (d->rows + d->brows - 1) / d->brows, nbc = (d->cols + d->bcols - 1) / d->bcols;
    int64_t j = k % nbc, i = (k / nbc) % nbr;
    q->b = k / nbc / nbr;
    q->r0 = i * d->brows;
    q->c0 = j * d->bcols;
    q->nr = d->rows - q->r0 < d->brows ? d->rows - q->r0 : d->brows;
    q->nc = d->cols - q->c0 < d->bcols ? d->cols - q->c0 : d->bcols;
    q->at = q->b * d->sc_bs + i * d->sc_ld + j;
}

/* Element (r, c) of block q, as float32. */
static inline RS_HD float rs_quant_load(const struct rs_quant_desc *d, const void *src,
                                        const struct rs_quant_block *q, int64_t r, int64_t c)
{
    int64_t at = q->b * d->src_bs + (q->r0 + r) * d->src_ld + q->c0 + c;
    if (d->src_type == RS_QSRC_F32)
        return ((const float *)src)[at];
    uint16_t h = ((const uint16_t *)src)[at];
    return d->src_type == RS_QSRC_BF16 ? rs_bf16_to_f32(h) : rs_f16_to_f32(h);
}

/* Where element (r, c) of block q's FP8 code goes. */
static inline RS_HD int64_t rs_quant_dst(const struct rs_quant_desc *d,
                                         const struct rs_quant_block *q, int64_t r, int64_t c)
{
    return q->b * d->dst_bs + (q->r0 + r) * d->dst_ld + q->c0 + c;
}

#endif
