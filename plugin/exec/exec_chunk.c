/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Chunks of a transfer: its box cut along the outermost dim whose inner part fits a chunk, so
 * that every chunk is one box and both ends of a transfer find the same ones.
 */
#include "exec_chunk.h"

#include "exec.h"
#include "base/ckd.h"
#include "base/param.h"

void exec_cut_init(struct exec_cut *cut, const struct rs_plan *plan, const struct xfer_set *xs)
{
    *cut = (struct exec_cut){.plan = plan,
                             .xs = xs,
                             .chunk_bytes = exec_chunk_bytes(),
                             .coalesce_bytes = exec_coalesce_bytes()};
}

int64_t exec_chunk_bytes(void)
{
    int64_t b = rs_param_int(RS_PARAM_CHUNK_BYTES);
    return b > EXEC_MAX_CHUNK_BYTES ? EXEC_MAX_CHUNK_BYTES : b;
}

int64_t exec_coalesce_bytes(void)
{
    int64_t b = rs_param_int(RS_PARAM_COALESCE_BYTES), chunk = exec_chunk_bytes();
    return b > chunk ? chunk : b;
}

static const int64_t *xfer_start(const struct exec_cut *cut, const struct xfer *xf)
{
    return cut->xs->coords + xf->box;
}

static int xfer_ndim(const struct exec_cut *cut, const struct xfer *xf)
{
    return cut->plan->tensors[xf->tensor].dst.ndim;
}

/* Cuts a box along its outermost dim whose inner part fits a chunk: `step` indices of dim
 * `split` per chunk, every index of the dims before it one at a time. */
struct cut_shape {
    int split;
    int64_t step, per_outer, n;
};

static struct cut_shape cut_of(const struct exec_cut *cut, const struct xfer *xf)
{
    int ndim = xfer_ndim(cut, xf);
    const int64_t *len = xfer_start(cut, xf) + ndim;
    int64_t inner = (int64_t)xfer_esize(cut->plan, xf);
    int split = ndim - 1;
    int64_t wider;
    while (split > 0 && !rs_mul_i64(inner, len[split], &wider) && wider <= cut->chunk_bytes) {
        inner = wider;
        split--;
    }
    struct cut_shape c = {.split = split};
    c.step = cut->chunk_bytes / inner;
    if (c.step < 1)
        c.step = 1;
    if (c.step > len[split])
        c.step = len[split] ? len[split] : 1;
    c.per_outer = len[split] ? (len[split] + c.step - 1) / c.step : 0;
    c.n = c.per_outer;
    for (int j = 0; j < split; j++)
        c.n *= len[j];
    return c;
}

int64_t exec_nchunks(const struct exec_cut *cut, const struct xfer *xf)
{
    return cut_of(cut, xf).n;
}

static void chunk_box(const struct exec_cut *cut, const struct xfer *xf, uint32_t chunk, int64_t *s,
                      int64_t *l)
{
    int ndim = xfer_ndim(cut, xf);
    const int64_t *start = xfer_start(cut, xf), *len = start + ndim;
    struct cut_shape c = cut_of(cut, xf);
    int64_t outer = chunk / c.per_outer, piece = chunk % c.per_outer;
    for (int j = ndim - 1; j >= 0; j--) {
        if (j > c.split) {
            s[j] = start[j];
            l[j] = len[j];
        } else if (j == c.split) {
            s[j] = start[j] + piece * c.step;
            l[j] = len[j] - piece * c.step < c.step ? len[j] - piece * c.step : c.step;
        } else {
            s[j] = start[j] + outer % len[j];
            l[j] = 1;
            outer /= len[j];
        }
    }
}

void exec_chunk_region(const struct exec_cut *cut, const struct xfer *xf, uint32_t chunk, int side,
                       struct region *r)
{
    int64_t s[RS_MAX_DIMS], l[RS_MAX_DIMS];
    chunk_box(cut, xf, chunk, s, l);
    const struct plan_tensor *pt = &cut->plan->tensors[xf->tensor];
    int buf = side ? xf->dst_buf : xf->src_buf, rank = side ? xf->dst : xf->src;
    int cast_scales =
        pt->scales_of >= 0 && cut->plan->tensors[pt->scales_of].quant == PLAN_QUANT_CAST;
    if (buf == XBUF_TMP || (buf == XBUF_QSRC && cast_scales)) { /* a whole tensor, row-major */
        region_of_full(&pt->dst, s, l, r);
        return;
    }
    const struct rs_shardmap *m = buf == XBUF_SRC || buf == XBUF_QSRC ? &pt->src_map : &pt->dst_map;
    region_of_shard(m, shardmap_position(m, rank), s, l, r);
    if (buf != XBUF_QSRC && buf != XBUF_STAGE)
        return;
    /* the executor's own copies: row-major over the shard (no view, no offset), the source
     * shard in FP8 or the destination shard in the source dtype */
    r->esize = dtype_size(buf == XBUF_QSRC ? pt->dst.dtype : pt->src.dtype);
    r->view = NULL;
}

uint64_t exec_chunk_bytes_of(const struct exec_cut *cut, const struct xfer *xf, uint32_t chunk)
{
    struct region rg;
    exec_chunk_region(cut, xf, chunk, 1, &rg);
    return region_bytes(&rg);
}
