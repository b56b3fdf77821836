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
#include "exec_int.h"

#include "region.h"
#include "base/error.h"
#include "base/log.h"
#include "cuda/cuda_lib.h"
#include "cuda/quant.h"
#include "planner/fingerprint.h"

#include <stdlib.h>
#include <string.h>

struct qgeo;
static reshard_status_t geo_make(const struct rs_shardmap *m, int rank, struct qgeo **out);
static void geo_free(struct qgeo *g);

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

/* Elements of rank's shard of map, 0 when it holds none: the executor's own copies are
 * row-major over the shard (no view), whatever buffer the caller's shard sits in. */
static uint64_t shard_elems(const struct rs_shardmap *m, int rank)
{
    int pos = shardmap_position(m, rank);
    if (pos < 0)
        return 0;
    uint64_t n = 1;
    for (int j = 0; j < m->layout->ndim; j++)
        n *= (uint64_t)dimmap_group_len(&m->dim[j], shardmap_group(m, pos, j));
    return n;
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
    if (!(q->landed_tmp = rs_calloc((size_t)n + 1, 1, "quantization fingerprints")))
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
    q->landed_fp = rs_calloc(2 * (size_t)nt + 1, sizeof(uint64_t), "quantization fingerprints");
    q->landed_ok = rs_calloc((size_t)nt + 1, 1, "quantization fingerprints");
    if (!q->qsrc || !q->stage || !q->done || !q->geo || !q->first || !q->xfer || !q->dev ||
        !q->landed_fp || !q->landed_ok)
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

/* ---- element addresses ---- */

/* Where the elements of one rank's shard of a tensor are: global index -> local, per dim. */
struct qgeo {
    int ndim;
    int64_t *loc[RS_MAX_DIMS];
    int64_t shape[RS_MAX_DIMS];
    const struct rs_view *view;
    int last_run; /* the last dim is one run of global indices: any part of it held is a run */
};

static void geo_free(struct qgeo *g)
{
    for (int d = 0; g && d < g->ndim; d++)
        free(g->loc[d]);
    free(g);
}

/* Rank's shard of m (it holds one). */
static reshard_status_t geo_make(const struct rs_shardmap *m, int rank, struct qgeo **out)
{
    const struct rs_layout *l = m->layout;
    int pos = shardmap_position(m, rank);
    struct qgeo *g = rs_calloc(1, sizeof(*g), "index map");
    if (!g)
        return RESHARD_ERR_NO_MEMORY;
    g->ndim = l->ndim;
    g->view = l->view.ndim || l->view.nstrides || l->view.offset ? &l->view : NULL;
    for (int d = 0; d < l->ndim; d++) {
        if (!(g->loc[d] = rs_calloc((size_t)l->shape[d] + 1, sizeof(int64_t), "index map"))) {
            geo_free(g);
            return RESHARD_ERR_NO_MEMORY;
        }
        for (int64_t i = 0; i < l->shape[d]; i++)
            g->loc[d][i] = -1;
        if (pos < 0)
            continue;
        int grp = shardmap_group(m, pos, d);
        const struct rs_dimmap *dm = &m->dim[d];
        for (int s = dm->first[grp]; s < dm->first[grp + 1]; s++)
            for (int64_t i = 0; i < dm->segs[s].len; i++)
                g->loc[d][dm->segs[s].start + i] = dm->segs[s].pos + i;
        g->shape[d] = dimmap_group_len(dm, grp);
        g->last_run = dm->first[grp + 1] - dm->first[grp] == 1;
    }
    *out = g;
    return RESHARD_OK;
}

/* The element offset of global index gi. */
static int64_t geo_at(const struct qgeo *g, const int64_t *gi)
{
    int64_t lin = 0;
    for (int d = 0; d < g->ndim; d++)
        lin = lin * g->shape[d] + g->loc[d][gi[d]];
    return region_view_at(g->view, g->shape, g->ndim, lin);
}

/* The same shard, row-major without the view: the executor's FP8 and staging copies. */
static struct qgeo geo_flat(const struct qgeo *g)
{
    struct qgeo f = *g;
    f.view = NULL;
    return f;
}

static enum rs_fp8 fp8_of(enum rs_dtype t)
{
    return t == RS_DTYPE_FP8E5M2 ? RS_FP8_E5M2 : RS_FP8_E4M3;
}

/* ---- boxes and blocks ---- */

/* An odometer over the box [lo, hi) of ndim dims; 0 when it is done (or empty). */
static int box_next(int ndim, const int64_t *lo, const int64_t *hi, int64_t *at)
{
    for (int d = ndim - 1; d >= 0; d--) {
        if (++at[d] < hi[d])
            return 1;
        at[d] = lo[d];
    }
    return 0;
}

static int box_empty(int ndim, const int64_t *lo, const int64_t *hi)
{
    for (int d = 0; d < ndim; d++)
        if (hi[d] <= lo[d])
            return 1;
    return 0;
}

/* The elements of block b of weight l, clipped to [clo, chi). */
static void block_box(const struct rs_layout *l, const int64_t *b, const int64_t *clo,
                      const int64_t *chi, int64_t *lo, int64_t *hi)
{
    for (int d = 0; d < l->ndim; d++) {
        int64_t e = quant_extent(l, d);
        lo[d] = b[d] * e;
        hi[d] = lo[d] + e < l->shape[d] ? lo[d] + e : l->shape[d];
        if (clo && clo[d] > lo[d])
            lo[d] = clo[d];
        if (chi && chi[d] < hi[d])
            hi[d] = chi[d];
    }
}

/* The blocks a box of elements touches. */
static void blocks_of(const struct rs_layout *l, const int64_t *start, const int64_t *len,
                      int64_t *lo, int64_t *hi)
{
    for (int d = 0; d < l->ndim; d++) {
        int64_t e = quant_extent(l, d);
        lo[d] = start[d] / e;
        hi[d] = len[d] ? (start[d] + len[d] - 1) / e + 1 : lo[d];
    }
}

static int64_t row_major(int ndim, const int64_t *shape, const int64_t *at)
{
    int64_t lin = 0;
    for (int d = 0; d < ndim; d++)
        lin = lin * shape[d] + at[d];
    return lin;
}

/* The row-major local index of the first element of at's row (its last coordinate aside), and
 * an element of that row: whole rows are walked with one lookup per element. */
static int64_t geo_row(const struct qgeo *g, const int64_t *at)
{
    int64_t lin = 0;
    for (int d = 0; d + 1 < g->ndim; d++)
        lin = lin * g->shape[d] + g->loc[d][at[d]];
    return lin * g->shape[g->ndim - 1];
}

static inline int64_t geo_elem(const struct qgeo *g, int64_t row, int64_t j)
{
    int64_t lin = row + g->loc[g->ndim - 1][j];
    return g->view ? region_view_at(g->view, g->shape, g->ndim, lin) : lin;
}

/* Whether row [j0, j1) is one run of consecutive elements (no view, no gap): *first its first. */
static int geo_run(const struct qgeo *g, int64_t row, int64_t j0, int64_t j1, int64_t *first)
{
    const int64_t *l = g->loc[g->ndim - 1];
    if (g->view || j1 <= j0)
        return 0;
    for (int64_t j = j0 + 1; j < j1; j++)
        if (l[j] != l[j0] + (j - j0))
            return 0;
    *first = row + l[j0];
    return 1;
}

static float elem_f32(const char *base, int64_t at, enum rs_dtype dt)
{
    uint16_t h;
    float v;
    if (dt == RS_DTYPE_F32) {
        memcpy(&v, base + at * 4, sizeof(v));
        return v;
    }
    memcpy(&h, base + at * 2, sizeof(h));
    return dt == RS_DTYPE_BF16 ? rs_bf16_to_f32(h) : rs_f16_to_f32(h);
}

/* The rows of the box [lo, hi): an odometer over every dim but the last. */
static int row_next(int ndim, const int64_t *lo, const int64_t *hi, int64_t *at)
{
    return ndim > 1 && box_next(ndim - 1, lo, hi, at);
}

/* The largest |x| of row [j0, j1) of base. */
static float row_amax(float amax, const char *base, const struct qgeo *g, int64_t row, int64_t j0,
                      int64_t j1, enum rs_dtype dt)
{
    int64_t at;
    if (geo_run(g, row, j0, j1, &at)) { /* the usual case: a plain loop the compiler unrolls */
        if (dt == RS_DTYPE_BF16)
            for (int64_t j = 0; j < j1 - j0; j++)
                amax = rs_amax_step(amax, elem_f32(base, at + j, RS_DTYPE_BF16));
        else
            for (int64_t j = 0; j < j1 - j0; j++)
                amax = rs_amax_step(amax, elem_f32(base, at + j, dt));
        return amax;
    }
    for (int64_t j = j0; j < j1; j++)
        amax = rs_amax_step(amax, elem_f32(base, geo_elem(g, row, j), dt));
    return amax;
}

/* A block's scale from its elements in buffer base at geometry g. */
static float block_scale(const struct rs_layout *w, const int64_t *b, const char *base,
                         const struct qgeo *g, enum rs_dtype dt)
{
    int64_t lo[RS_MAX_DIMS], hi[RS_MAX_DIMS], at[RS_MAX_DIMS];
    int nd = w->ndim;
    block_box(w, b, NULL, NULL, lo, hi);
    float amax = 0;
    memcpy(at, lo, (size_t)nd * sizeof(*at));
    if (!box_empty(nd, lo, hi))
        do
            amax = row_amax(amax, base, g, geo_row(g, at), lo[nd - 1], hi[nd - 1], dt);
        while (row_next(nd, lo, hi, at));
    return rs_fp8_scale(amax, fp8_of(w->dtype));
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
        } while (box_next(nd, blo, bhi, b));
    }
}

reshard_status_t exec_quant_at_src(struct exec *x, const reshard_buffers_t *bufs,
                                   const reshard_buffers_t *dev)
{
    for (int t = 0; x->quant.qsrc && t < x->plan->ntensors; t++) {
        if (!is_cast(x->plan, (uint32_t)t) || !x->quant.qsrc[t])
            continue;
        if (exec_quant_dev_src(dev, (uint32_t)t))
            RS_CHECK(exec_quant_dev_at_src(x, (uint32_t)t, dev));
        else
            quantize_sends(x, (uint32_t)t, bufs);
    }
    return RESHARD_OK;
}

/* ---- the receiver ---- */

/* Per dim of weight w: whether each block index lies whole in one group of the source map,
 * so that the source shard holding a block's first element holds all of it (the planner's
 * at_src: such blocks are quantized at their senders, the others where they land). */
struct qwhole {
    int nd;
    uint8_t *whole[RS_MAX_DIMS];
};

static void whole_free(struct qwhole *q);
static reshard_status_t whole_make(const struct plan_tensor *pw, struct qwhole *q);
static int whole_block(const struct qwhole *q, const int64_t *b);
struct qcast;
static uint64_t block_fp(const struct rs_layout *w, const int64_t *b, const char *base,
                         const struct qgeo *g, size_t esize, const struct qcast *cast, uint8_t *tmp,
                         int group);
static int grouped(const struct plan_tensor *pw);

/* The codes of block b just cast into out (geometry g) and its scale, into fp[0], fp[1]. */
static void landed_fp(struct exec *x, uint32_t w, const int64_t *b, float scale, const uint8_t *out,
                      const struct qgeo *g, uint64_t *fp)
{
    const struct plan_tensor *pw = &x->plan->tensors[w];
    const struct rs_layout *sl = &x->plan->tensors[pw->scales].dst;
    fp[0] += block_fp(&pw->dst, b, (const char *)out, g, 1, NULL, x->quant.landed_tmp, grouped(pw));
    fp[1] += fp_mix((uint64_t)row_major(sl->ndim, sl->shape, b), rs_f32_bits(scale));
}

/* Whether the codes and scales of the cut blocks were fingerprinted as made (landed_fp). */
static int quantize_landed(struct exec *x, uint32_t w, const reshard_buffers_t *bufs)
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
    uint64_t *fp = x->quant.landed_fp ? x->quant.landed_fp + 2 * w : NULL;
    struct qwhole wh; /* the blocks cut between sources, which the check takes from here */
    if (fp && whole_make(pw, &wh) != RESHARD_OK)
        fp = NULL; /* the check quantizes them again */
    if (fp)
        fp[0] = fp[1] = 0;
    int nd = pw->dst.ndim;
    struct qgeo flat = geo_flat(gd); /* the staging copy */
    for (size_t i = x->quant.first[w]; i < x->quant.first[w + 1]; i++) {
        const struct xfer *xf = &x->xs.x[x->quant.xfer[i]];
        if (xf->dst != me || xf->dst_buf != XBUF_STAGE || xf->tensor != w)
            continue;
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
            done[k] = 1;
            float scale = block_scale(&pw->dst, b, stage, &flat, pw->src.dtype);
            memcpy(sout + geo_at(gs, b) * (int64_t)sizeof(float), &scale, sizeof(scale));
            int64_t lo[RS_MAX_DIMS], hi[RS_MAX_DIMS];
            block_box(&pw->dst, b, NULL, NULL, lo, hi);
            cast_box(&pw->dst, lo, hi, scale, stage, &flat, pw->src.dtype, out, gd);
            if (fp && !whole_block(&wh, b)) /* fingerprinted as made (exec_quant_expect) */
                landed_fp(x, w, b, scale, out, gd, fp);
        } while (box_next(nd, blo, bhi, b));
    }
    if (fp)
        whole_free(&wh);
    return fp != NULL;
}

reshard_status_t exec_quant_landed(struct exec *x, const reshard_buffers_t *bufs,
                                   const reshard_buffers_t *dev, const size_t *left)
{
    for (int t = 0; x->quant.stage && t < x->plan->ntensors; t++) {
        if (!is_cast(x->plan, (uint32_t)t) || !x->quant.stage[t] || (left && left[t]))
            continue;
        if (x->quant.landed_ok)
            x->quant.landed_ok[t] = 0;
        if (exec_quant_dev_dst(dev, (uint32_t)t)) {
            RS_CHECK(exec_quant_dev_landed(x, (uint32_t)t, dev));
        } else {
            int made = quantize_landed(x, (uint32_t)t, bufs);
            if (x->quant.landed_ok)
                x->quant.landed_ok[t] = (uint8_t)made;
        }
    }
    return RESHARD_OK;
}

/* ---- what a verified refit compares the destinations with (exec_verify.c) ----
 *
 * A CAST weight's destinations hold FP8 codes and scales, its sources the training dtype: the
 * check compares the destinations with fingerprints of the codes and scales made where they
 * were quantized. A block whole in a source shard (quantized by its sender) is counted by the
 * source replica that counts (fingerprint_counts): out of the FP8 copy it sent from this run,
 * or, for a block another replica of it sent, quantized again from its source. A block cut
 * between source shards crossed in the source dtype and each destination replica quantized it
 * from its staged copy: that replica quantizes it again from the staged copy for its expected
 * codes and scales, and the staged elements are checked against the sources' (so what crossed
 * the network is proven as for any tensor). A bit flipped in a destination after quantization,
 * code or scale, differs from both. */

static void whole_free(struct qwhole *q)
{
    for (int d = 0; d < q->nd; d++)
        free(q->whole[d]);
}

static reshard_status_t whole_make(const struct plan_tensor *pw, struct qwhole *q)
{
    const struct rs_layout *w = &pw->dst;
    *q = (struct qwhole){.nd = w->ndim};
    for (int d = 0; d < w->ndim; d++) {
        int64_t n = w->shape[d], e = quant_extent(w, d), nb = (n + e - 1) / e;
        int *owner = rs_calloc((size_t)n + 1, sizeof(int), "verification");
        q->whole[d] = rs_calloc((size_t)nb + 1, 1, "verification");
        if (!owner || !q->whole[d]) {
            free(owner);
            whole_free(q);
            return RESHARD_ERR_NO_MEMORY;
        }
        const struct rs_dimmap *dm = &pw->src_map.dim[d];
        for (int g = 0; g < dm->ngroups; g++)
            for (int k = dm->first[g]; k < dm->first[g + 1]; k++)
                for (int64_t i = 0; i < dm->segs[k].len; i++)
                    owner[dm->segs[k].start + i] = g;
        for (int64_t b = 0; b < nb; b++) {
            int64_t lo = b * e, hi = lo + e < n ? lo + e : n;
            uint8_t one = 1;
            for (int64_t i = lo + 1; i < hi && one; i++)
                one = owner[i] == owner[lo];
            q->whole[d][b] = one;
        }
        free(owner);
    }
    return RESHARD_OK;
}

static int whole_block(const struct qwhole *q, const int64_t *b)
{
    for (int d = 0; d < q->nd; d++)
        if (!q->whole[d][b[d]])
            return 0;
    return 1;
}

/* The FP8 cast of a source dtype, as cast_box does it. */
struct qcast {
    float scale;
    enum rs_dtype dt;
    enum rs_fp8 fmt;
};

/* Whether weight w's codes are fingerprinted eight at a time (fingerprint_run8): every block
 * starts on a multiple of 8 along the last dim, so every side cuts rows into the same groups. */
static int grouped(const struct plan_tensor *pw)
{
    int nd = pw->dst.ndim;
    int64_t e = quant_extent(&pw->dst, nd - 1);
    return e % 8 == 0 || e >= pw->dst.shape[nd - 1];
}

/* The fingerprint of row `row` of g's shard, global columns [j0, j1) where the shard holds
 * them, gfirst the global linear index of the row's column 0: raw elements of esize bytes in
 * base, or (cast) their FP8 codes; tmp holds a row of codes. group: FP8 codes of a block row
 * the shard holds whole, eight at a time. */
static uint64_t row_fp(const char *base, const struct qgeo *g, int64_t row, int64_t j0, int64_t j1,
                       uint64_t gfirst, size_t esize, const struct qcast *cast, uint8_t *tmp,
                       int group)
{
    const int64_t *loc = g->loc[g->ndim - 1];
    int64_t at;
    int run = loc[j0] >= 0 && loc[j1 - 1] >= 0 && !g->view && g->last_run;
    if (run) /* no lookup per element: the usual shard */
        at = row + loc[j0];
    else
        run = loc[j0] >= 0 && geo_run(g, row, j0, j1, &at);
    if (group) {
        const uint8_t *codes = tmp;
        if (run && !cast)
            codes = (const uint8_t *)base + at;
        else
            for (int64_t j = j0; j < j1; j++) {
                int64_t e = run ? at + (j - j0) : geo_elem(g, row, j);
                tmp[j - j0] =
                    cast ? rs_f32_to_fp8(elem_f32(base, e, cast->dt) / cast->scale, cast->fmt)
                         : (uint8_t)base[e];
            }
        return fingerprint_run8(codes, gfirst + (uint64_t)j0, j1 - j0);
    }
    if (run) {
        if (!cast)
            return fingerprint_run(base + at * (int64_t)esize, esize, gfirst + (uint64_t)j0,
                                   j1 - j0);
        for (int64_t j = 0; j < j1 - j0; j++)
            tmp[j] = rs_f32_to_fp8(elem_f32(base, at + j, cast->dt) / cast->scale, cast->fmt);
        return fingerprint_run(tmp, 1, gfirst + (uint64_t)j0, j1 - j0);
    }
    uint64_t sum = 0;
    for (int64_t j = j0; j < j1; j++) {
        if (loc[j] < 0)
            continue;
        int64_t k = j + 1; /* the run of held elements from j: the part of a cut block */
        while (!cast && !g->view && k < j1 && loc[k] == loc[j] + (k - j))
            k++;
        if (k > j + 1) {
            sum += fingerprint_run(base + (row + loc[j]) * (int64_t)esize, esize,
                                   gfirst + (uint64_t)j, k - j);
            j = k - 1;
            continue;
        }
        int64_t e = geo_elem(g, row, j);
        uint64_t bits = 0;
        if (cast)
            bits = rs_f32_to_fp8(elem_f32(base, e, cast->dt) / cast->scale, cast->fmt);
        else
            memcpy(&bits, base + e * (int64_t)esize, esize);
        sum += fp_mix(gfirst + (uint64_t)j, bits);
    }
    return sum;
}

/* The fingerprint of the elements of block b of weight w that g's shard holds (in base). */
static uint64_t block_fp(const struct rs_layout *w, const int64_t *b, const char *base,
                         const struct qgeo *g, size_t esize, const struct qcast *cast, uint8_t *tmp,
                         int group)
{
    int64_t lo[RS_MAX_DIMS], hi[RS_MAX_DIMS], at[RS_MAX_DIMS];
    int nd = w->ndim;
    block_box(w, b, NULL, NULL, lo, hi);
    if (box_empty(nd, lo, hi))
        return 0;
    memcpy(at, lo, (size_t)nd * sizeof(*at));
    uint64_t sum = 0;
    do {
        int held = 1;
        for (int d = 0; d + 1 < nd && held; d++)
            held = g->loc[d][at[d]] >= 0;
        if (!held)
            continue;
        int64_t col = at[nd - 1];
        at[nd - 1] = 0;
        uint64_t gfirst = (uint64_t)row_major(nd, w->shape, at);
        at[nd - 1] = col;
        sum += row_fp(base, g, geo_row(g, at), lo[nd - 1], hi[nd - 1], gfirst, esize, cast, tmp,
                      group);
    } while (row_next(nd, lo, hi, at));
    return sum;
}

/* Per dim, the block indices g's shard holds any element of: blocks[d][0 .. nb[d]). */
struct qblocks {
    int nd;
    int64_t *at[RS_MAX_DIMS], n[RS_MAX_DIMS];
};

static void blocks_free(struct qblocks *q)
{
    for (int d = 0; d < q->nd; d++)
        free(q->at[d]);
}

static reshard_status_t blocks_held(const struct rs_layout *w, const struct qgeo *g,
                                    struct qblocks *q)
{
    *q = (struct qblocks){.nd = w->ndim};
    for (int d = 0; d < w->ndim; d++) {
        int64_t n = w->shape[d], e = quant_extent(w, d), nb = (n + e - 1) / e;
        if (!(q->at[d] = rs_calloc((size_t)nb + 1, sizeof(int64_t), "verification"))) {
            blocks_free(q);
            return RESHARD_ERR_NO_MEMORY;
        }
        for (int64_t b = 0; b < nb; b++) {
            int any = 0;
            for (int64_t i = b * e; i < (b + 1) * e && i < n && !any; i++)
                any = g->loc[d][i] >= 0;
            if (any)
                q->at[d][q->n[d]++] = b;
        }
    }
    return RESHARD_OK;
}

/* An odometer over the blocks of q: idx the positions in its lists, b the blocks. */
static int blocks_next(const struct qblocks *q, int64_t *idx, int64_t *b)
{
    for (int d = q->nd - 1; d >= 0; d--) {
        if (++idx[d] < q->n[d]) {
            b[d] = q->at[d][idx[d]];
            return 1;
        }
        idx[d] = 0;
        b[d] = q->at[d][0];
    }
    return 0;
}

static int blocks_first(const struct qblocks *q, int64_t *idx, int64_t *b)
{
    for (int d = 0; d < q->nd; d++) {
        if (!q->n[d])
            return 0;
        idx[d] = 0;
        b[d] = q->at[d][0];
    }
    return 1;
}

/* buf's first `bytes` in host memory: buf itself, or a copy of device memory (*copy, which the
 * caller frees). */
static reshard_status_t host_bytes(const void *buf, size_t bytes, reshard_mem_t mem,
                                   const char **out, void **copy)
{
    *copy = NULL;
    *out = buf;
    if (mem != RESHARD_MEM_CUDA || cuda_mem_kind(buf) == CUDA_MEM_HOST)
        return RESHARD_OK;
    const struct cuda_fns *f = cuda_lib();
    if (!f)
        return RESHARD_ERR_UNAVAILABLE; /* cuda_lib said why */
    RS_CHECK(cuda_context_of(buf));
    if (!(*copy = rs_calloc(1, bytes ? bytes : 1, "a host copy to verify")))
        return RESHARD_ERR_NO_MEMORY;
    cu_result e = f->memcpy_dtoh(*copy, (cu_deviceptr)(uintptr_t)buf, bytes);
    if (e != CU_SUCCESS) {
        free(*copy);
        *copy = NULL;
        return cuda_error("verification: cuMemcpyDtoH", e);
    }
    *out = *copy;
    return RESHARD_OK;
}

/* The source side: the blocks of this rank's source shard (it counts for its replicas). */
static reshard_status_t expect_src(const struct exec *x, const reshard_buffers_t *bufs, uint32_t w,
                                   const struct qwhole *wh, uint8_t *tmp, struct exec_quant_fp *fp)
{
    const struct rs_plan *p = x->plan;
    const struct plan_tensor *pw = &p->tensors[w], *ps = &p->tensors[pw->scales];
    int nd = pw->dst.ndim;
    struct qgeo *g;
    RS_CHECK(geo_make(&pw->src_map, x->comm->rank, &g));
    struct qgeo flat = geo_flat(g);
    int64_t span_shape[RS_MAX_DIMS];
    for (int d = 0; d < nd; d++)
        span_shape[d] = g->shape[d];
    uint64_t span = region_span_bytes(&pw->src, span_shape);
    const char *base = NULL;
    void *copy = NULL;
    struct qblocks held;
    reshard_status_t st = RESHARD_OK;
    if (!bufs[w].src || bufs[w].src_bytes < span)
        st =
            rs_error(RESHARD_ERR_BUFFER, "%s, and its shard needs %llu bytes",
                     bufs[w].src ? "the buffer is shorter" : "no buffer", (unsigned long long)span);
    if (st == RESHARD_OK)
        st = host_bytes(bufs[w].src, span, bufs[w].mem, &base, &copy);
    if (st == RESHARD_OK)
        st = blocks_held(&pw->dst, g, &held);
    if (st != RESHARD_OK) {
        free(copy);
        geo_free(g);
        return st;
    }
    /* the blocks this rank cast and sent this run, with their scales */
    int64_t nscales = layout_numel(&ps->dst);
    const uint8_t *cast = x->quant.qsrc && x->quant.qsrc[w] && x->quant.done[pw->scales]
                              ? x->quant.done[pw->scales] + 2 * nscales
                              : NULL;
    const float *sent = cast ? (const float *)(const void *)x->quant.qsrc[pw->scales] : NULL;
    enum rs_dtype dt = pw->src.dtype;
    size_t es = dtype_size(dt);
    int64_t idx[RS_MAX_DIMS], b[RS_MAX_DIMS];
    if (blocks_first(&held, idx, b))
        do {
            if (!whole_block(wh, b)) { /* it crosses in the source dtype: its part of it */
                fp->src_plain += block_fp(&pw->dst, b, base, g, es, NULL, tmp, 0);
                continue;
            }
            int64_t k = row_major(nd, ps->dst.shape, b);
            float scale;
            if (cast && cast[k]) {
                scale = sent[k];
                fp->src_codes +=
                    block_fp(&pw->dst, b, x->quant.qsrc[w], &flat, 1, NULL, tmp, fp->grouped);
            } else {
                struct qcast c = {block_scale(&pw->dst, b, base, g, dt), dt, fp8_of(pw->dst.dtype)};
                scale = c.scale;
                fp->src_codes += block_fp(&pw->dst, b, base, g, es, &c, tmp, fp->grouped);
            }
            fp->src_scales += fp_mix((uint64_t)k, rs_f32_bits(scale));
        } while (blocks_next(&held, idx, b));
    blocks_free(&held);
    free(copy);
    geo_free(g);
    return RESHARD_OK;
}

/* The destination side: the blocks of this rank's destination shard quantized here, again
 * from the staged copy, and that copy's elements; when grouped, the codes the destination
 * buffer holds (every block: the shard is whole blocks). */
static reshard_status_t expect_dst(const struct exec *x, const reshard_buffers_t *bufs, uint32_t w,
                                   const struct qwhole *wh, uint8_t *tmp, struct exec_quant_fp *fp)
{
    const struct rs_plan *p = x->plan;
    const struct plan_tensor *pw = &p->tensors[w], *ps = &p->tensors[pw->scales];
    int nd = pw->dst.ndim;
    struct qgeo *g;
    struct qblocks held;
    RS_CHECK(geo_make(&pw->dst_map, x->comm->rank, &g));
    reshard_status_t st = blocks_held(&pw->dst, g, &held);
    if (st != RESHARD_OK) {
        geo_free(g);
        return st;
    }
    struct qgeo flat = geo_flat(g); /* the staging copy */
    const char *stage = x->quant.stage ? x->quant.stage[w] : NULL;
    enum rs_dtype dt = pw->src.dtype;
    const char *out = NULL;
    void *copy = NULL;
    if (fp->grouped) {
        uint64_t span = region_span_bytes(&pw->dst, g->shape);
        if (!bufs[w].dst || bufs[w].dst_bytes < span)
            st = rs_error(RESHARD_ERR_BUFFER, "%s, and its shard needs %llu bytes",
                          bufs[w].dst ? "the buffer is shorter" : "no buffer",
                          (unsigned long long)span);
        else
            st = host_bytes(bufs[w].dst, span, bufs[w].mem, &out, &copy);
    }
    /* quantized on the host this run: fingerprinted then (quantize_landed); on the device,
     * quantized again here from the staged copy */
    int made = x->quant.landed_ok && x->quant.landed_ok[w];
    if (made) {
        fp->dst_codes = x->quant.landed_fp[2 * w];
        fp->dst_scales = x->quant.landed_fp[2 * w + 1];
    }
    int64_t idx[RS_MAX_DIMS], b[RS_MAX_DIMS];
    if (st == RESHARD_OK && blocks_first(&held, idx, b))
        do {
            if (out)
                fp->dst_held += block_fp(&pw->dst, b, out, g, 1, NULL, tmp, 1);
            if (whole_block(wh, b))
                continue; /* quantized at its sender: the source side counts it */
            if (!stage) {
                st = rs_error(RESHARD_ERR_INTERNAL,
                              "a block quantized where it lands, and no staged copy of it");
                break;
            }
            fp->dst_plain += block_fp(&pw->dst, b, stage, &flat, dtype_size(dt), NULL, tmp, 0);
            if (made)
                continue; /* its codes and scale were fingerprinted as they were made */
            struct qcast c = {block_scale(&pw->dst, b, stage, &flat, dt), dt,
                              fp8_of(pw->dst.dtype)};
            fp->dst_codes +=
                block_fp(&pw->dst, b, stage, &flat, dtype_size(dt), &c, tmp, fp->grouped);
            fp->dst_scales +=
                fp_mix((uint64_t)row_major(nd, ps->dst.shape, b), rs_f32_bits(c.scale));
        } while (blocks_next(&held, idx, b));
    free(copy);
    blocks_free(&held);
    geo_free(g);
    return st;
}

reshard_status_t exec_quant_expect(const struct exec *x, const reshard_buffers_t *bufs, uint32_t w,
                                   int src_counts, struct exec_quant_fp *fp)
{
    const struct plan_tensor *pw = &x->plan->tensors[w];
    int me = x->comm->rank;
    *fp = (struct exec_quant_fp){.grouped = grouped(pw)};
    int src = src_counts && shard_elems(&pw->src_map, me);
    int dst = shard_elems(&pw->dst_map, me) != 0;
    if (!src && !dst)
        return RESHARD_OK;
    struct qwhole wh;
    RS_CHECK(whole_make(pw, &wh));
    uint8_t *tmp = rs_calloc((size_t)pw->dst.shape[pw->dst.ndim - 1] + 1, 1, "verification");
    reshard_status_t st = tmp ? RESHARD_OK : RESHARD_ERR_NO_MEMORY;
    if (st == RESHARD_OK && src)
        st = expect_src(x, bufs, w, &wh, tmp, fp);
    if (st == RESHARD_OK && dst)
        st = expect_dst(x, bufs, w, &wh, tmp, fp);
    free(tmp);
    whole_free(&wh);
    return st;
}
