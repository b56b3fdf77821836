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

#endif
