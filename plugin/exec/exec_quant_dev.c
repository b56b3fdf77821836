/* SPDX-License-Identifier: Apache-2.0 */
/*
 * FP8 destinations quantized on the way, on device buffers: the kernels (cuda_quant) do what
 * exec_quant.c does on the host, with the same reference, so the bits are the same.
 *
 * A sender whose source shard is device memory quantizes every block it holds whole on the
 * device, into a device FP8 copy of the shard (row-major over it, as the host's) and the scales
 * tensor, and copies both into the executor's host buffers for them (qsrc: half the bytes of the
 * source for bf16), from which
 * the plan's boxes travel as on the host. A receiver whose destination is device memory stages
 * what lands unquantized on the host as before; once everything has landed the staged shard
 * goes to the device once, and each staged box's blocks are quantized there straight into the
 * destination and its scales (a block two boxes share is quantized twice, to the same bits).
 *
 * The device memory this needs is made at the first execution and kept with the plan.
 *
 * The kernels take a shard that is one row-major box of the tensor (at an offset in its buffer,
 * but no other view; one run of global indices per dim); other device shards are refused before
 * the run, naming the tensor.
 */
#include "exec_int.h"

#include "base/error.h"
#include "cuda/cuda_lib.h"
#include "cuda/pack_desc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A shard as a box of the global index space, row-major in its buffer from element off. */
struct qbox {
    int nd;
    int64_t start[RS_MAX_DIMS], len[RS_MAX_DIMS], off;
};

/* rank's shard of m as one box: 0 when it holds none; -1 (and *dim) when it is not one box. */
static int shard_box(const struct rs_shardmap *m, int rank, struct qbox *b, int *dim)
{
    const struct rs_layout *l = m->layout;
    int pos = shardmap_position(m, rank);
    *dim = -1;
    if (pos < 0)
        return 0;
    if (l->view.ndim || l->view.nstrides)
        return -1;
    b->nd = l->ndim;
    b->off = l->view.offset;
    for (int d = 0; d < l->ndim; d++) {
        const struct rs_dimmap *dm = &m->dim[d];
        int g = shardmap_group(m, pos, d), n = dm->first[g + 1] - dm->first[g];
        if (n == 0) {
            b->start[d] = b->len[d] = 0;
            continue;
        }
        const struct rs_seg *s = &dm->segs[dm->first[g]];
        if (n != 1 || s->pos != 0) {
            *dim = d;
            return -1;
        }
        b->start[d] = s->start;
        b->len[d] = s->len;
    }
    return 1;
}

static int64_t box_lin(const struct qbox *b, const int64_t *g)
{
    int64_t lin = 0;
    for (int d = 0; d < b->nd; d++)
        lin = lin * b->len[d] + (g[d] - b->start[d]);
    return b->off + lin;
}

/* The elements of the buffer the box spans. */
static int64_t box_span(const struct qbox *b)
{
    int64_t n = 1;
    for (int d = 0; d < b->nd; d++)
        n *= b->len[d];
    return b->off + n;
}

static enum rs_qsrc qsrc_of(enum rs_dtype t)
{
    return t == RS_DTYPE_F32 ? RS_QSRC_F32 : t == RS_DTYPE_BF16 ? RS_QSRC_BF16 : RS_QSRC_F16;
}

/* The dims of weight w's blocks the kernel walks: [0, a) one launch each index, [a, c) the
 * rows (at most one dim), [c, nd) the columns, merged (whole in the shard there). */
static void split_dims(const struct rs_layout *w, int *a, int *c)
{
    int nd = w->ndim;
    if (w->quant.kind == RS_QUANT_BLOCK) {
        *a = nd >= 2 ? nd - 2 : 0;
        *c = nd - 1;
    } else if (w->quant.kind == RS_QUANT_CHANNEL) {
        *a = 0;
        *c = nd >= 2 ? 1 : nd;
    } else { /* the tensor: one block */
        *a = *c = 0;
    }
}

/* Quantizes the blocks [lo, hi) of weight w (global element indices, block aligned or at the
 * tensor's end): elements from src (geometry eb, at element offset soff) into dst (the same, at
 * doff), scales into sc (sb). */
static reshard_status_t quant_box(const struct rs_layout *w, enum rs_dtype sdt, const int64_t *lo,
                                  const int64_t *hi, const struct qbox *eb, const char *src,
                                  int64_t soff, uint8_t *dst, int64_t doff, const struct qbox *sb,
                                  float *sc)
{
    int nd = w->ndim, a, c;
    split_dims(w, &a, &c);
    struct rs_quant_desc d = {.src_type = qsrc_of(sdt),
                              .fp8 = w->dtype == RS_DTYPE_FP8E5M2 ? RS_FP8_E5M2 : RS_FP8_E4M3,
                              .mode = RS_QUANT_SCALES | RS_QUANT_CAST,
                              .batch = 1,
                              .rows = a < c ? hi[a] - lo[a] : 1,
                              .cols = 1,
                              .brows = a < c ? quant_extent(w, a) : 1,
                              .bcols = 1,
                              .src_ld = 1,
                              .dst_ld = 1,
                              .sc_ld = 1};
    for (int k = c; k < nd; k++) {
        d.cols *= hi[k] - lo[k];
        d.bcols *= quant_extent(w, k);
        d.src_ld *= eb->len[k];
        d.sc_ld *= sb->len[k];
    }
    d.dst_ld = d.src_ld;
    for (int k = 0; k < nd; k++)
        if (hi[k] <= lo[k])
            return RESHARD_OK;
    size_t es = dtype_size(sdt);
    int64_t at[RS_MAX_DIMS], blk[RS_MAX_DIMS];
    memcpy(at, lo, (size_t)nd * sizeof(*at));
    for (;;) { /* an odometer over the dims [0, a) */
        for (int k = 0; k < nd; k++)
            blk[k] = at[k] / quant_extent(w, k);
        int64_t e = box_lin(eb, at) - eb->off;
        RS_CHECK(cuda_quant(&d, src + (soff + e) * (int64_t)es, dst + doff + e,
                            sc + box_lin(sb, blk), NULL));
        int k = a - 1;
        for (; k >= 0; k--) {
            if (++at[k] < hi[k])
                break;
            at[k] = lo[k];
        }
        if (k < 0)
            return RESHARD_OK;
    }
}

/* ---- device memory of a plan ---- */

#define DEV(p) ((void *)(uintptr_t)(p))

/* The plan's device buffer at *p, made at first use (its size is the plan's: fixed). */
static reshard_status_t dev_alloc(uint64_t *p, size_t bytes, const char *what)
{
    cu_deviceptr d;
    if (*p)
        return RESHARD_OK;
    cu_result r = cuda_lib()->mem_alloc(&d, bytes ? bytes : 1);
    if (r != CU_SUCCESS)
        return cuda_error(what, r);
    *p = (uint64_t)d;
    return RESHARD_OK;
}

void exec_quant_dev_fini(struct exec_quant *q, int ntensors)
{
    for (int i = 0; q->dev && i < 3 * ntensors; i++)
        if (q->dev[i] && cuda_context_of(DEV(q->dev[i])) == RESHARD_OK)
            cuda_lib()->mem_free((cu_deviceptr)q->dev[i]);
    free(q->dev);
}

static reshard_status_t dev_sync(void)
{
    cu_result r = cuda_lib()->ctx_synchronize();
    return r == CU_SUCCESS ? RESHARD_OK : cuda_error("quantizing on the device", r);
}

/* ---- the checks before a run ---- */

static reshard_status_t need_box(const struct exec *x, uint32_t t, const struct rs_shardmap *m,
                                 const char *side)
{
    struct qbox b;
    int dim;
    char why[64] = "is a strided view of its buffer";
    if (shard_box(m, x->comm->rank, &b, &dim) >= 0)
        return RESHARD_OK;
    if (dim >= 0)
        snprintf(why, sizeof(why), "holds several runs of dim %d", dim);
    return rs_error(RESHARD_ERR_INVALID_ARG,
                    "rank %d: tensor '%s' is quantized on the way on the device, which takes a "
                    "%s shard that is one row-major box: this one %s; pass it in host memory",
                    x->comm->rank, x->plan->tensors[t].name, side, why);
}

reshard_status_t exec_quant_dev_check(const struct exec *x, const reshard_buffers_t *bufs,
                                      uint32_t w)
{
    const struct rs_plan *p = x->plan;
    const struct plan_tensor *pw = &p->tensors[w];
    uint32_t st = (uint32_t)pw->scales;
    int wdev = bufs[w].mem == RESHARD_MEM_CUDA, sdev = bufs[st].mem == RESHARD_MEM_CUDA;
    if (bufs[w].dst && bufs[st].dst && wdev != sdev)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "rank %d: tensor '%s' is in %s memory and its scales '%s' in %s memory: "
                        "an FP8 destination and its scales are quantized together, pass both "
                        "in the same kind",
                        x->comm->rank, pw->name, wdev ? "device" : "host", p->tensors[st].name,
                        sdev ? "device" : "host");
    if (!(wdev && (bufs[w].src || bufs[w].dst)) && !(sdev && bufs[st].dst))
        return RESHARD_OK;
    if (wdev && bufs[w].src)
        RS_CHECK(need_box(x, w, &pw->src_map, "source"));
    if (wdev && bufs[w].dst)
        RS_CHECK(need_box(x, w, &pw->dst_map, "destination"));
    if (!cuda_lib())
        return RESHARD_ERR_UNAVAILABLE; /* cuda_lib said why */
    RS_CHECK(cuda_context_of(bufs[w].src ? bufs[w].src : bufs[w].dst ? bufs[w].dst : bufs[st].dst));
    return cuda_kernels();
}

/* A failure on the device, named: the rank, the tensor and where. */
static reshard_status_t named(const struct exec *x, uint32_t w, const char *where,
                              reshard_status_t st)
{
    if (st == RESHARD_OK)
        return st;
    struct rs_saved_error why;
    rs_error_save(&why);
    return rs_error(st, "rank %d: quantizing tensor '%s' on the device %s: %s", x->comm->rank,
                    x->plan->tensors[w].name, where, why.msg);
}

/* ---- the sender ---- */

int exec_quant_dev_src(const reshard_buffers_t *dev, uint32_t w)
{
    return dev && dev[w].mem == RESHARD_MEM_CUDA && dev[w].src;
}

/* The blocks [lo, hi) (elements, block aligned or at the tensor's end) as the ones this rank
 * cast this run, as the host's sender marks them: the verification fingerprints their codes
 * out of the host copy (exec_quant_expect). */
static void mark_cast(struct exec *x, uint32_t w, const int64_t *lo, const int64_t *hi)
{
    const struct plan_tensor *pw = &x->plan->tensors[w];
    const struct rs_layout *sl = &x->plan->tensors[pw->scales].dst;
    int64_t n = layout_numel(sl), blo[RS_MAX_DIMS], bhi[RS_MAX_DIMS], b[RS_MAX_DIMS];
    uint8_t *cast = x->quant.done[pw->scales] + 2 * n;
    int nd = sl->ndim;
    memset(cast, 0, (size_t)n);
    for (int d = 0; d < nd; d++) {
        int64_t e = quant_extent(&pw->dst, d);
        blo[d] = lo[d] / e;
        bhi[d] = (hi[d] + e - 1) / e;
        if (bhi[d] <= blo[d])
            return;
        b[d] = blo[d];
    }
    for (;;) {
        int64_t k = 0;
        for (int d = 0; d < nd; d++)
            k = k * sl->shape[d] + b[d];
        cast[k] = 1;
        int d = nd - 1;
        for (; d >= 0; d--) {
            if (++b[d] < bhi[d])
                break;
            b[d] = blo[d];
        }
        if (d < 0)
            return;
    }
}

static reshard_status_t at_src(struct exec *x, uint32_t w, const reshard_buffers_t *dev)
{
    const struct plan_tensor *pw = &x->plan->tensors[w];
    const struct plan_tensor *ps = &x->plan->tensors[pw->scales];
    struct qbox eb, sb = {.nd = ps->dst.ndim}; /* sb: the whole scales tensor, row-major */
    int dim;
    if (shard_box(&pw->src_map, x->comm->rank, &eb, &dim) <= 0)
        return RESHARD_OK; /* exec_quant_dev_check refused what is not a box */
    for (int d = 0; d < sb.nd; d++)
        sb.start[d] = 0, sb.len[d] = ps->dst.shape[d];
    /* the blocks whole in the shard: those the plan may send from here */
    int64_t lo[RS_MAX_DIMS], hi[RS_MAX_DIMS];
    for (int d = 0; d < eb.nd; d++) {
        int64_t e = quant_extent(&pw->dst, d), end = eb.start[d] + eb.len[d];
        lo[d] = (eb.start[d] + e - 1) / e * e;
        hi[d] = end == pw->dst.shape[d] ? end : end / e * e;
    }
    /* the FP8 copy is row-major over the shard, as the host's (exec_quant.c) */
    size_t fp8_bytes = (size_t)(box_span(&eb) - eb.off);
    size_t sc_bytes = (size_t)box_span(&sb) * sizeof(float);
    uint64_t *q = &x->quant.dev[3 * w], *s = &x->quant.dev[3 * w + 1];
    RS_CHECK(dev_alloc(q, fp8_bytes, "an FP8 copy of a device source (cuMemAlloc)"));
    RS_CHECK(dev_alloc(s, sc_bytes, "the scales of a device source (cuMemAlloc)"));
    RS_CHECK(quant_box(&pw->dst, pw->src.dtype, lo, hi, &eb, dev[w].src, eb.off, DEV(*q), 0, &sb,
                       DEV(*s)));
    RS_CHECK(dev_sync());
    cu_result r;
    if ((r = cuda_lib()->memcpy_dtoh(x->quant.qsrc[w], *q, fp8_bytes)) != CU_SUCCESS ||
        (r = cuda_lib()->memcpy_dtoh(x->quant.qsrc[pw->scales], *s, sc_bytes)) != CU_SUCCESS)
        return cuda_error("copying quantized blocks to the host (cuMemcpyDtoH)", r);
    mark_cast(x, w, lo, hi);
    return RESHARD_OK;
}

/* ---- the receiver ---- */

int exec_quant_dev_dst(const reshard_buffers_t *dev, uint32_t w)
{
    return dev && dev[w].mem == RESHARD_MEM_CUDA && dev[w].dst;
}

static reshard_status_t landed(struct exec *x, uint32_t w, const reshard_buffers_t *dev)
{
    const struct rs_plan *p = x->plan;
    const struct plan_tensor *pw = &p->tensors[w], *ps = &p->tensors[pw->scales];
    int me = x->comm->rank, dim, nd = pw->dst.ndim;
    struct qbox eb, sb;
    if (shard_box(&pw->dst_map, me, &eb, &dim) <= 0 || shard_box(&ps->dst_map, me, &sb, &dim) <= 0)
        return RESHARD_OK;
    if (!dev[pw->scales].dst)
        return rs_error(RESHARD_ERR_INVALID_ARG, "rank %d: tensor '%s' has no scales buffer '%s'",
                        me, pw->name, ps->name);
    /* the staged shard is row-major over the shard, as the host's (exec_quant.c) */
    size_t bytes = (size_t)(box_span(&eb) - eb.off) * dtype_size(pw->src.dtype);
    uint64_t *stage = &x->quant.dev[3 * w + 2];
    RS_CHECK(dev_alloc(stage, bytes, "staging a quantized destination (cuMemAlloc)"));
    cu_result r = cuda_lib()->memcpy_htod(*stage, x->quant.stage[w], bytes);
    reshard_status_t st =
        r == CU_SUCCESS ? RESHARD_OK : cuda_error("staging a quantized destination", r);
    for (size_t i = 0; st == RESHARD_OK && i < x->xs.n; i++) {
        const struct xfer *xf = &x->xs.x[i];
        if (xf->dst != me || xf->dst_buf != XBUF_STAGE || xf->tensor != w)
            continue;
        const int64_t *start = x->xs.coords + xf->box, *len = start + nd;
        int64_t lo[RS_MAX_DIMS], hi[RS_MAX_DIMS];
        for (int d = 0; d < nd; d++) { /* the blocks the box touches, whole in the shard */
            int64_t e = quant_extent(&pw->dst, d), end = start[d] + len[d];
            lo[d] = start[d] / e * e;
            hi[d] =
                (end + e - 1) / e * e < pw->dst.shape[d] ? (end + e - 1) / e * e : pw->dst.shape[d];
            if (!len[d])
                hi[d] = lo[d];
        }
        st = quant_box(&pw->dst, pw->src.dtype, lo, hi, &eb, DEV(*stage), 0, dev[w].dst, eb.off,
                       &sb, dev[pw->scales].dst);
    }
    return st == RESHARD_OK ? dev_sync() : st;
}

reshard_status_t exec_quant_dev_at_src(struct exec *x, uint32_t w, const reshard_buffers_t *dev)
{
    return named(x, w, "before sending", at_src(x, w, dev));
}

reshard_status_t exec_quant_dev_landed(struct exec *x, uint32_t w, const reshard_buffers_t *dev)
{
    return named(x, w, "where it landed", landed(x, w, dev));
}
