/* SPDX-License-Identifier: Apache-2.0 */
/*
 * FP8 destinations quantized on the way (planner/quant.h, CAST): the executor's side.
 *
 * A sender of a box the plan quantizes at the source (at_src) holds every block the box touches
 * whole: before its first send it computes those blocks' scales from its source shard (amax over
 * the whole block, cuda/quant.h) and casts the box into an FP8 copy of its source shard, from
 * which the box then travels like any other (packed, bundled, written to a local peer); the
 * scales of the blocks starting in a box travel as the plan's ops of the scales tensor, out of
 * the whole scales tensor this rank computed. A box that crosses unquantized lands in a staging
 * copy of the destination shard in the source dtype; once everything bound for the rank has
 * landed, each staged block (whole in the shard: the planner refuses shards that cut blocks) is
 * quantized into the destination and its scale written to the scales' destination buffer.
 * Both sides use one reference (cuda/quant.h), so the bits do not depend on where a block was
 * quantized. Device sources and destinations are quantized by the kernels (exec_quant_dev.c).
 */
#include "exec_quant_geo.h"

#include "delta.h"

#include "base/error.h"
#include "base/log.h"
#include "base/param.h"
#include "planner/fingerprint.h"

#include <stdio.h>

#include <stdlib.h>
#include <string.h>

/* ---- which tensors ---- */

static int is_cast(const struct rs_plan *p, uint32_t t)
{
    return p->tensors[t].quant == PLAN_QUANT_CAST;
}

static int is_cast_scales(const struct rs_plan *p, uint32_t t)
{
    int w = p->tensors[t].scales_of;
    return w >= 0 && p->tensors[w].quant == PLAN_QUANT_CAST;
}

/* Whether this rank quantizes for transfer xf: it sends it out of its FP8 values, or it lands
 * (or is forwarded from) staged. */
static int quant_role(const struct xfer *xf, int rank)
{
    return (xf->src == rank && (xf->src_buf == XBUF_QSRC || xf->src_buf == XBUF_STAGE)) ||
           (xf->dst == rank && xf->dst_buf == XBUF_STAGE);
}

static reshard_status_t alloc_buf(char **at, uint64_t bytes, uint64_t *total)
{
    if (*at)
        return RESHARD_OK;
    if (!(*at = rs_calloc(bytes ? bytes : 1, 1, "quantization buffer")))
        return RESHARD_ERR_NO_MEMORY;
    *total += bytes;
    return RESHARD_OK;
}

/* A row of codes for fingerprinting blocks as they are cast (landed_fp). */
static reshard_status_t tmp_grow(struct exec_quant *q, int64_t n)
{
    if (n <= q->landed_tmp_n)
        return RESHARD_OK;
    free(q->landed_tmp);
    if (!(q->landed_tmp = rs_calloc((size_t)n + 1, 8, "quantization fingerprints")))
        return RESHARD_ERR_NO_MEMORY;
    q->landed_tmp_n = n;
    return RESHARD_OK;
}

reshard_status_t exec_quant_init(struct exec_quant *q, const struct rs_plan *plan,
                                 const struct xfer_set *xs, int rank)
{
    *q = (struct exec_quant){0};
    int nt = plan->ntensors, any = 0;
    for (int t = 0; t < nt; t++)
        any |= is_cast(plan, (uint32_t)t);
    if (!any)
        return RESHARD_OK;
    q->qsrc = rs_calloc((size_t)nt + 1, sizeof(char *), "quantization buffers");
    q->stage = rs_calloc((size_t)nt + 1, sizeof(char *), "quantization buffers");
    q->done = rs_calloc((size_t)nt + 1, sizeof(uint8_t *), "quantization buffers");
    q->geo = rs_calloc(2 * (size_t)nt + 1, sizeof(struct qgeo *), "quantization buffers");
    q->first = rs_calloc((size_t)nt + 2, sizeof(size_t), "quantized transfers");
    q->xfer = rs_calloc(xs->n + 1, sizeof(size_t), "quantized transfers");
    q->dev = rs_calloc(3 * (size_t)nt + 1, sizeof(*q->dev), "quantization buffers");
    q->landed_fp = rs_calloc(3 * (size_t)nt + 1, sizeof(uint64_t), "quantization fingerprints");
    q->landed_ok = rs_calloc((size_t)nt + 1, 1, "quantization fingerprints");
    q->blk_fp = rs_calloc((size_t)nt + 1, sizeof(uint64_t *), "quantization fingerprints");
    q->dirty = rs_calloc((size_t)nt + 1, sizeof(uint8_t *), "quantized blocks");
    q->blk_ok = rs_calloc((size_t)nt + 1, 1, "quantization fingerprints");
    q->via_delta = rs_calloc(xs->n + 1, sizeof(uint32_t), "quantized transfers");
    q->sent_fp = rs_calloc((size_t)nt + 1, sizeof(uint64_t *), "quantization fingerprints");
    q->sent_ok = rs_calloc((size_t)nt + 1, 1, "quantization fingerprints");
    if (!q->qsrc || !q->stage || !q->done || !q->geo || !q->first || !q->xfer || !q->dev ||
        !q->landed_fp || !q->landed_ok || !q->blk_fp || !q->dirty || !q->blk_ok || !q->via_delta ||
        !q->sent_fp || !q->sent_ok)
        return RESHARD_ERR_NO_MEMORY;
    /* Each weight's list: counted into first[w + 2], summed so that first[w + 1] is where
     * w's list starts, then filled with first[w + 1] as the cursor, which leaves it where the
     * list ends: w's transfers are xfer[first[w] .. first[w + 1]). */
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < xs->n; i++) {
            const struct xfer *xf = &xs->x[i];
            if (!quant_role(xf, rank))
                continue;
            uint32_t w = is_cast_scales(plan, xf->tensor)
                             ? (uint32_t)plan->tensors[xf->tensor].scales_of
                             : xf->tensor;
            if (pass)
                q->xfer[q->first[w + 1]++] = i;
            else
                q->first[w + 2]++;
        }
        for (int t = 2; !pass && t <= nt + 1; t++)
            q->first[t] += q->first[t - 1];
    }
    for (size_t i = 0; i < xs->n; i++) {
        const struct xfer *xf = &xs->x[i];
        const struct plan_tensor *pt = &plan->tensors[xf->tensor];
        uint32_t w = is_cast_scales(plan, xf->tensor) ? (uint32_t)pt->scales_of : xf->tensor;
        const struct plan_tensor *pw = &plan->tensors[w];
        int qsrc = xf->src == rank && xf->src_buf == XBUF_QSRC;
        int stage = (xf->src == rank && xf->src_buf == XBUF_STAGE) ||
                    (xf->dst == rank && xf->dst_buf == XBUF_STAGE);
        if (!qsrc && !stage)
            continue;
        const struct plan_tensor *ps = &plan->tensors[pw->scales];
        uint64_t nscales = (uint64_t)layout_numel(&ps->dst);
        if (!q->done[pw->scales] &&
            !(q->done[pw->scales] = rs_calloc(3 * nscales + 1, 1, "quantized blocks")))
            return RESHARD_ERR_NO_MEMORY;
        if (qsrc) { /* the sender's FP8 values, and the scales it computes for them */
            RS_CHECK(alloc_buf(&q->qsrc[w], shard_elems(&pw->src_map, rank), &q->bytes));
            RS_CHECK(alloc_buf(&q->qsrc[pw->scales], nscales * sizeof(float), &q->bytes));
            if (!q->geo[2 * w])
                RS_CHECK(geo_make(&pw->src_map, rank, &q->geo[2 * w]));
            RS_CHECK(tmp_grow(q, pw->dst.shape[pw->dst.ndim - 1]));
            if (!q->sent_fp[w] &&
                !(q->sent_fp[w] = rs_calloc(nscales + 1, sizeof(uint64_t), "quantized blocks")))
                return RESHARD_ERR_NO_MEMORY;
        }
        if (stage) {
            RS_CHECK(alloc_buf(&q->stage[w],
                               shard_elems(&pw->dst_map, rank) * dtype_size(pw->src.dtype),
                               &q->bytes));
            if (!q->geo[2 * w + 1])
                RS_CHECK(geo_make(&pw->dst_map, rank, &q->geo[2 * w + 1]));
            if (!q->geo[2 * pw->scales + 1])
                RS_CHECK(geo_make(&ps->dst_map, rank, &q->geo[2 * pw->scales + 1]));
            RS_CHECK(tmp_grow(q, pw->dst.shape[pw->dst.ndim - 1]));
            if (!q->blk_fp[w] &&
                !(q->blk_fp[w] = rs_calloc(3 * nscales + 1, sizeof(uint64_t), "quantized blocks")))
                return RESHARD_ERR_NO_MEMORY;
            if (!q->dirty[w] && !(q->dirty[w] = rs_calloc(nscales + 1, 1, "quantized blocks")))
                return RESHARD_ERR_NO_MEMORY;
        }
    }
    if (q->bytes)
        rs_log(RS_LOG_INFO, "rank %d: %llu bytes for quantizing FP8 destinations", rank,
               (unsigned long long)q->bytes);
    return RESHARD_OK;
}

void exec_quant_fini(struct exec_quant *q, int ntensors, struct reshard_comm *c)
{
    exec_bufs_release(q->qsrc, ntensors, c);
    exec_bufs_release(q->stage, ntensors, c); /* local peers may still write into it */
    for (int t = 0; q->done && t < ntensors; t++)
        free(q->done[t]);
    for (int t = 0; q->geo && t < 2 * ntensors; t++)
        geo_free(q->geo[t]);
    for (int t = 0; q->blk_fp && q->dirty && q->sent_fp && t < ntensors; t++) {
        free(q->blk_fp[t]);
        free(q->dirty[t]);
        free(q->sent_fp[t]);
    }
    free(q->sent_fp);
    free(q->sent_ok);
    free(q->blk_fp);
    free(q->dirty);
    free(q->blk_ok);
    free(q->via_delta);
    free(q->done);
    free(q->geo);
    free(q->first);
    free(q->xfer);
    free(q->landed_fp);
    free(q->landed_ok);
    free(q->landed_tmp);
    exec_quant_dev_fini(q, ntensors);
    *q = (struct exec_quant){0};
}

reshard_status_t exec_quant_check(const struct exec *x, const reshard_buffers_t *bufs)
{
    const struct rs_plan *p = x->plan;
    for (int t = 0; t < p->ntensors; t++)
        if (is_cast(p, (uint32_t)t))
            RS_CHECK(exec_quant_dev_check(x, bufs, (uint32_t)t));
    return RESHARD_OK;
}

/* Casts the elements of [lo, hi) from base (geometry gs, dtype dt) into FP8 at out (go). */
static void cast_box(const struct rs_layout *w, const int64_t *lo, const int64_t *hi, float scale,
                     const char *base, const struct qgeo *gs, enum rs_dtype dt, uint8_t *out,
                     const struct qgeo *go)
{
    int64_t at[RS_MAX_DIMS];
    int nd = w->ndim;
    enum rs_fp8 f = fp8_of(w->dtype);
    memcpy(at, lo, (size_t)nd * sizeof(*at));
    if (box_empty(nd, lo, hi))
        return;
    do {
        int64_t rs = geo_row(gs, at), ro = geo_row(go, at), fs, fo, j0 = lo[nd - 1];
        if (geo_run(gs, rs, j0, hi[nd - 1], &fs) && geo_run(go, ro, j0, hi[nd - 1], &fo)) {
            for (int64_t j = 0; j < hi[nd - 1] - j0; j++)
                out[fo + j] = rs_f32_to_fp8(elem_f32(base, fs + j, dt) / scale, f);
            continue;
        }
        for (int64_t j = lo[nd - 1]; j < hi[nd - 1]; j++)
            out[geo_elem(go, ro, j)] =
                rs_f32_to_fp8(elem_f32(base, geo_elem(gs, rs, j), dt) / scale, f);
    } while (row_next(nd, lo, hi, at));
}

/* ---- the sender ---- */

/* Sender-side state of one CAST weight. */
struct qsend {
    const struct plan_tensor *pw, *ps;
    float *scales; /* the whole scales tensor, row-major */
    uint8_t *done;
    const struct qgeo *src;
    const char *base;
};

static float send_scale(struct qsend *s, const int64_t *b)
{
    int64_t k = row_major(s->ps->dst.ndim, s->ps->dst.shape, b);
    if (!s->done[k]) {
        s->scales[k] = block_scale(&s->pw->dst, b, s->base, s->src, s->pw->src.dtype);
        s->done[k] = 1;
    }
    return s->scales[k];
}

static void quantize_sends(struct exec *x, uint32_t w, const reshard_buffers_t *bufs)
{
    const struct rs_plan *p = x->plan;
    int me = x->comm->rank;
    struct qsend s = {.pw = &p->tensors[w], .ps = &p->tensors[p->tensors[w].scales]};
    uint32_t st = (uint32_t)s.pw->scales;
    s.scales = (float *)(void *)x->quant.qsrc[st];
    s.done = x->quant.done[st];
    s.base = bufs[w].src;
    s.src = x->quant.geo[2 * w];
    if (!s.scales || !x->quant.qsrc[w] || !s.base || !s.src)
        return; /* exec_quant_check refused such buffers */
    int64_t nscales = layout_numel(&s.ps->dst);
    uint8_t *cast = s.done + 2 * nscales; /* blocks cast, as a sender */
    memset(s.done, 0, (size_t)nscales);
    memset(cast, 0, (size_t)nscales);
    int nd = s.pw->dst.ndim;
    struct qgeo flat = geo_flat(s.src); /* the FP8 copy */
    uint64_t *sent = x->quant.verify ? x->quant.sent_fp[w] : NULL;
    for (size_t i = x->quant.first[w]; i < x->quant.first[w + 1]; i++) {
        const struct xfer *xf = &x->xs.x[x->quant.xfer[i]];
        if (xf->src != me || xf->src_buf != XBUF_QSRC || (xf->tensor != w && xf->tensor != st))
            continue;
        const int64_t *start = x->xs.coords + xf->box, *len = start + nd;
        int64_t blo[RS_MAX_DIMS], bhi[RS_MAX_DIMS], b[RS_MAX_DIMS];
        if (xf->tensor == st) { /* scales the plan sends from here */
            for (int d = 0; d < nd; d++)
                blo[d] = start[d], bhi[d] = start[d] + len[d];
        } else {
            blocks_of(&s.pw->dst, start, len, blo, bhi);
        }
        if (box_empty(nd, blo, bhi))
            continue;
        memcpy(b, blo, (size_t)nd * sizeof(*b));
        do {
            float scale = send_scale(&s, b);
            int64_t k = row_major(nd, s.ps->dst.shape, b);
            if (xf->tensor != w || cast[k])
                continue;
            /* the whole block, once: this rank holds it whole, and other boxes of it (slices
             * for other domains, local copies) read the same values */
            cast[k] = 1;
            int64_t lo[RS_MAX_DIMS], hi[RS_MAX_DIMS];
            block_box(&s.pw->dst, b, NULL, NULL, lo, hi);
            cast_box(&s.pw->dst, lo, hi, scale, s.base, s.src, s.pw->src.dtype,
                     (uint8_t *)x->quant.qsrc[w], &flat);
            if (sent) /* while the codes are in the cache (exec_quant_expect) */
                sent[k] = block_fp(&s.pw->dst, b, x->quant.qsrc[w], &flat, 1, NULL,
                                   x->quant.landed_tmp, codes_grouped(s.pw), NULL, 0);
        } while (box_next(nd, blo, bhi, b));
    }
    x->quant.sent_ok[w] = sent != NULL;
}

reshard_status_t exec_quant_at_src(struct exec *x, const reshard_buffers_t *bufs,
                                   const reshard_buffers_t *dev)
{
    for (int t = 0; x->quant.qsrc && t < x->plan->ntensors; t++) {
        if (!is_cast(x->plan, (uint32_t)t) || !x->quant.qsrc[t])
            continue;
        x->quant.sent_ok[t] = 0; /* until quantize_sends made them */
        if (exec_quant_dev_src(dev, (uint32_t)t))
            RS_CHECK(exec_quant_dev_at_src(x, (uint32_t)t, dev));
        else
            quantize_sends(x, (uint32_t)t, bufs);
    }
    return RESHARD_OK;
}

/* ---- the receiver ---- */
/* Block b (k its index), just cast into out (geometry g) from the staged copy (flat): the
 * fingerprints of its codes, its scale and its staged elements, into fp[3k] .. fp[3k + 2], while
 * the block is in the cache. The staged elements are checked against the sources' parts of the
 * block (the transit check), as they were when quantized. */
static void landed_fp(struct exec *x, uint32_t w, const int64_t *b, int64_t k, float scale,
                      const uint8_t *out, const struct qgeo *g, const char *stage,
                      const struct qgeo *flat, const struct qwhole *wh, uint64_t *fp)
{
    const struct plan_tensor *pw = &x->plan->tensors[w];
    fp[3 * k] = block_fp(&pw->dst, b, (const char *)out, g, 1, NULL, x->quant.landed_tmp,
                         codes_grouped(pw), NULL, 0);
    fp[3 * k + 1] = fp_mix((uint64_t)k, rs_f32_bits(scale));
    fp[3 * k + 2] = block_fp(&pw->dst, b, stage, flat, dtype_size(pw->src.dtype), NULL,
                             x->quant.landed_tmp, 0, wh, 0);
}

/* RESHARD_TEST_FLIP=RANK:TENSOR@staged:BYTE: rank RANK flips the lowest bit of byte BYTE of its
 * staged copy of TENSOR before quantizing it, as a fault on the way would (the transit check's
 * test: the codes are made from the flipped value and agree with it). */
static void test_flip_staged(const struct exec *x, uint32_t w, char *stage, uint64_t bytes)
{
    const char *spec = rs_param_str(RS_PARAM_TEST_FLIP);
    char name[256];
    int rank = -1;
    long long byte = 0;
    if (!*spec || sscanf(spec, "%d:%255[^:]:%lld", &rank, name, &byte) != 3 ||
        rank != x->comm->rank || byte < 0 || (uint64_t)byte >= bytes)
        return;
    size_t n = strlen(x->plan->tensors[w].name);
    if (strncmp(name, x->plan->tensors[w].name, n) || strcmp(name + n, "@staged"))
        return;
    stage[byte] ^= 1;
    rs_log(RS_LOG_WARN, "rank %d: RESHARD_TEST_FLIP flipped a bit of byte %lld of the staged %s",
           x->comm->rank, byte, x->plan->tensors[w].name);
}

/* The blocks of staged transfer xs index i to quantize again: in a delta run that applied all
 * its chunks (sparse), only those the deltas changed. */
static const uint8_t *only_changed(struct exec *x, uint32_t w, size_t i, int sparse)
{
    const struct xfer *xf = &x->xs.x[i];
    uint32_t n = x->quant.via_delta[i];
    x->quant.via_delta[i] = 0;
    return sparse && n == (uint64_t)exec_nchunks(&x->cut, xf) ? x->quant.dirty[w] : NULL;
}

/* Whether the codes and scales of the cut blocks were fingerprinted as made (landed_fp). */
static int quantize_landed(struct exec *x, uint32_t w, const reshard_buffers_t *bufs, int sparse)
{
    const struct rs_plan *p = x->plan;
    int me = x->comm->rank;
    const struct plan_tensor *pw = &p->tensors[w], *ps = &p->tensors[pw->scales];
    const char *stage = x->quant.stage[w];
    uint8_t *out = bufs[w].dst;
    char *sout = bufs[pw->scales].dst;
    const struct qgeo *gd = x->quant.geo[2 * w + 1], *gs = x->quant.geo[2 * pw->scales + 1];
    if (!stage || !out || !sout || !gd || !gs || shardmap_position(&pw->dst_map, me) < 0)
        return 0; /* exec_quant_check refused such buffers */
    int64_t nscales = layout_numel(&ps->dst);
    uint8_t *done = x->quant.done[pw->scales] + nscales;
    memset(done, 0, (size_t)nscales);
    uint64_t *fp = x->quant.verify ? x->quant.blk_fp[w] : NULL;
    struct qwhole wh; /* the blocks cut between sources, which the check takes from here */
    if (fp && whole_make(pw, &wh) != RESHARD_OK)
        fp = NULL;     /* the check quantizes them again */
    if (fp && !sparse) /* every block made again: those of other runs are gone */
        memset(fp, 0, 3 * (size_t)nscales * sizeof(*fp));
    test_flip_staged(x, w, x->quant.stage[w],
                     shard_elems(&pw->dst_map, me) * dtype_size(pw->src.dtype));
    int nd = pw->dst.ndim;
    struct qgeo flat = geo_flat(gd); /* the staging copy */
    int64_t made = 0;
    for (size_t i = x->quant.first[w]; i < x->quant.first[w + 1]; i++) {
        const struct xfer *xf = &x->xs.x[x->quant.xfer[i]];
        if (xf->dst != me || xf->dst_buf != XBUF_STAGE || xf->tensor != w)
            continue;
        const uint8_t *changed = only_changed(x, w, x->quant.xfer[i], sparse);
        const int64_t *start = x->xs.coords + xf->box, *len = start + nd;
        int64_t blo[RS_MAX_DIMS], bhi[RS_MAX_DIMS], b[RS_MAX_DIMS];
        blocks_of(&pw->dst, start, len, blo, bhi);
        if (box_empty(nd, blo, bhi))
            continue;
        memcpy(b, blo, (size_t)nd * sizeof(*b));
        do {
            int64_t k = row_major(nd, ps->dst.shape, b);
            if (done[k])
                continue;
            if (changed && !changed[k])
                continue; /* unchanged: its codes and scale are there */
            done[k] = 1;
            made++;
            float scale = block_scale(&pw->dst, b, stage, &flat, pw->src.dtype);
            memcpy(sout + geo_at(gs, b) * (int64_t)sizeof(float), &scale, sizeof(scale));
            int64_t lo[RS_MAX_DIMS], hi[RS_MAX_DIMS];
            block_box(&pw->dst, b, NULL, NULL, lo, hi);
            cast_box(&pw->dst, lo, hi, scale, stage, &flat, pw->src.dtype, out, gd);
            if (fp && !whole_block(&wh, b)) /* fingerprinted as made (exec_quant_expect) */
                landed_fp(x, w, b, k, scale, out, gd, stage, &flat, &wh, fp);
        } while (box_next(nd, blo, bhi, b));
    }
    memset(x->quant.dirty[w], 0, (size_t)nscales);
    if (sparse)
        rs_log(RS_LOG_INFO,
               "rank %d: delta refit: %lld staged block(s) of tensor '%s' changed and quantized "
               "again",
               me, (long long)made, pw->name);
    if (!fp)
        return x->quant.blk_ok[w] = 0;
    whole_free(&wh);
    /* blocks not made this run: as they were made in the last, whose result they still are */
    x->quant.blk_ok[w] = (uint8_t)(!sparse || x->quant.blk_ok[w]);
    uint64_t *sum = x->quant.landed_fp + 3 * w;
    sum[0] = sum[1] = sum[2] = 0;
    for (int64_t k = 0; k < nscales; k++)
        for (int i = 0; i < 3; i++)
            sum[i] += fp[3 * k + i];
    return x->quant.blk_ok[w];
}

/* ---- delta refits: which staged blocks changed ---- */

struct touch {
    const struct region *rg;
    const struct rs_layout *w;
    int64_t gstart[RS_MAX_DIMS]; /* the chunk's first element, global */
    uint8_t *dirty;
    const int64_t *sshape; /* the scales' shape: one per block */
};

/* Elements [first, first + n) of the chunk, in its row-major order, changed. */
static void touch_run(void *arg, uint64_t first, uint64_t n)
{
    struct touch *t = arg;
    int nd = t->rg->ndim;
    const int64_t *len = t->rg->len;
    int64_t e_last = quant_extent(t->w, nd - 1);
    while (n) {
        int64_t o[RS_MAX_DIMS] = {0}, rest = (int64_t)first, b[RS_MAX_DIMS] = {0};
        for (int d = nd - 1; d >= 0; d--) {
            o[d] = rest % len[d];
            rest /= len[d];
        }
        uint64_t k = (uint64_t)(len[nd - 1] - o[nd - 1]); /* to the end of the row */
        k = k < n ? k : n;
        for (int d = 0; d + 1 < nd; d++)
            b[d] = (t->gstart[d] + o[d]) / quant_extent(t->w, d);
        int64_t c0 = t->gstart[nd - 1] + o[nd - 1], c1 = c0 + (int64_t)k - 1;
        for (b[nd - 1] = c0 / e_last; b[nd - 1] <= c1 / e_last; b[nd - 1]++)
            t->dirty[row_major(nd, t->sshape, b)] = 1;
        first += k;
        n -= k;
    }
}

void exec_quant_touched(struct exec *x, size_t i, const struct region *rg, const void *msg)
{
    const struct xfer *xf = &x->xs.x[i];
    uint32_t w = xf->tensor;
    const struct plan_tensor *pw = &x->plan->tensors[w];
    const struct qgeo *g = x->quant.geo ? x->quant.geo[2 * w + 1] : NULL;
    if (!is_cast(x->plan, w) || !g || !x->quant.dirty[w])
        return;
    struct touch t = {.rg = rg,
                      .w = &pw->dst,
                      .dirty = x->quant.dirty[w],
                      .sshape = x->plan->tensors[pw->scales].dst.shape};
    /* the transfer's box lies in one segment per dim: its chunk's local start, offset from the
     * box's, is as far from the box's global start */
    const int64_t *start = x->xs.coords + xf->box;
    for (int d = 0; d < rg->ndim; d++)
        t.gstart[d] = start[d] + (rg->start[d] - g->loc[d][start[d]]);
    x->quant.via_delta[i]++;
    if (msg)
        delta_each_changed(msg, touch_run, &t);
    else
        touch_run(&t, 0, region_bytes(rg) / rg->esize);
}

reshard_status_t exec_quant_landed(struct exec *x, const reshard_buffers_t *bufs,
                                   const reshard_buffers_t *dev, const size_t *left, int sparse)
{
    for (int t = 0; x->quant.stage && t < x->plan->ntensors; t++) {
        if (!is_cast(x->plan, (uint32_t)t) || !x->quant.stage[t] || (left && left[t]))
            continue;
        if (x->quant.landed_ok)
            x->quant.landed_ok[t] = 0;
        if (exec_quant_dev_dst(dev, (uint32_t)t)) {
            RS_CHECK(exec_quant_dev_landed(x, (uint32_t)t, dev));
        } else {
            int made = quantize_landed(x, (uint32_t)t, bufs, sparse);
            if (x->quant.landed_ok)
                x->quant.landed_ok[t] = (uint8_t)made;
        }
    }
    return RESHARD_OK;
}
