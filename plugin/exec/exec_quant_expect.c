/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What a verified refit compares the destinations with (exec_verify.c).
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
 * code or scale, differs from both.
 */
#include "exec_quant_geo.h"

#include "base/error.h"
#include "cuda/cuda_lib.h"
#include "planner/fingerprint.h"

#include <stdlib.h>
#include <string.h>

void whole_free(struct qwhole *q)
{
    for (int d = 0; d < q->nd; d++)
        free(q->whole[d]);
    free(q->grp);
    q->grp = NULL;
}

reshard_status_t whole_make(const struct plan_tensor *pw, struct qwhole *q)
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
        size_t es = dtype_size(pw->src.dtype);
        q->G = d == w->ndim - 1 && es < 8 ? (int64_t)(8 / es) : q->G;
        if (d == w->ndim - 1 && q->G > 1) {
            int64_t ng = n / q->G;
            if (!(q->grp = rs_calloc((size_t)ng + 1, 1, "verification"))) {
                free(owner);
                whole_free(q);
                return RESHARD_ERR_NO_MEMORY;
            }
            for (int64_t m = 0; m < ng; m++) {
                uint8_t one = 1;
                for (int64_t i = m * q->G + 1; i < (m + 1) * q->G && one; i++)
                    one = owner[i] == owner[m * q->G];
                q->grp[m] = one;
            }
        }
        free(owner);
    }
    return RESHARD_OK;
}

int whole_block(const struct qwhole *q, const int64_t *b)
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
int codes_grouped(const struct plan_tensor *pw)
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

/* The transit check's fingerprint of row `row` of g's shard, global columns [j0, j1) where the
 * shard holds them: each group of plain->G elements (8 bytes) that one source holds whole
 * (plain->grp) and that lies in [j0, j1), at the index of its first byte, the others one by
 * one; tmp gathers a run that is not contiguous in base. */
#define PLAIN_AHEAD 8

static uint64_t row_plain(const char *base, const struct qgeo *g, int64_t row, int64_t j0,
                          int64_t j1, uint64_t gfirst, size_t es, const struct qwhole *plain,
                          uint8_t *tmp, int src)
{
    const int64_t *loc = g->loc[g->ndim - 1];
    int64_t G = plain->G;
    int flat = !g->view && g->last_run; /* held columns are consecutive elements */
    uint64_t sum = 0;
    if (flat && src) {
        /* A source shard of one run along the last dim is one source group there: it holds
         * [a, e) of the row, and every group of G inside it whole; the elements of the groups
         * that straddle its ends, one by one, as the other side takes them. */
        int64_t a = j0 > g->run_lo ? j0 : g->run_lo, e = j1 < g->run_hi ? j1 : g->run_hi;
        if (a >= e)
            return 0;
        int64_t m0 = a, m1 = a;
        if (G > 1) {
            m0 = (a + G - 1) / G * G;
            m1 = e / G * G;
            if (m1 <= m0)
                m0 = m1 = e;
        }
        const uint8_t *p = (const uint8_t *)base + (row + loc[a] - a) * (int64_t)es;
        /* the same columns some rows on: a block walks its rows a shard row apart, too far for
         * the hardware to guess across pages (prefetches do not fault) */
        const char *ahead =
            (const char *)(p + a * (int64_t)es) + PLAIN_AHEAD * g->shape[g->ndim - 1] * (int64_t)es;
        for (int64_t off = 0; off < (e - a) * (int64_t)es + 63; off += 64)
            __builtin_prefetch(ahead + off);
        for (int64_t j = a; j < m0; j++) {
            uint64_t bits = 0;
            memcpy(&bits, p + j * (int64_t)es, es);
            sum += fp_mix(gfirst + (uint64_t)j, bits);
        }
        if (m1 > m0)
            sum += fingerprint_run8(p + m0 * (int64_t)es, (gfirst + (uint64_t)m0) * es,
                                    (m1 - m0) * (int64_t)es);
        for (int64_t j = m1 > m0 ? m1 : m0; j < e; j++) {
            uint64_t bits = 0;
            memcpy(&bits, p + j * (int64_t)es, es);
            sum += fp_mix(gfirst + (uint64_t)j, bits);
        }
        return sum;
    }
    for (int64_t j = j0; j < j1;) {
        if (loc[j] < 0) {
            j++;
            continue;
        }
        int64_t k = j;
        if (G > 1 && j % G == 0)
            while (k + G <= j1 && plain->grp[k / G] && loc[k] >= 0)
                k += G;
        if (k > j) { /* whole groups [j, k) */
            int64_t at;
            const uint8_t *p = tmp;
            if (flat)
                p = (const uint8_t *)base + (row + loc[j]) * (int64_t)es;
            else if (geo_run(g, row, j, k, &at))
                p = (const uint8_t *)base + at * (int64_t)es;
            else
                for (int64_t i = j; i < k; i++)
                    memcpy(tmp + (i - j) * (int64_t)es, base + geo_elem(g, row, i) * (int64_t)es,
                           es);
            sum += fingerprint_run8(p, (gfirst + (uint64_t)j) * es, (k - j) * (int64_t)es);
            j = k;
            continue;
        }
        uint64_t bits = 0;
        memcpy(&bits, base + geo_elem(g, row, j) * (int64_t)es, es);
        sum += fp_mix(gfirst + (uint64_t)j, bits);
        j++;
    }
    return sum;
}

/* The fingerprint of the elements of block b of weight w that g's shard holds (in base). */
uint64_t block_fp(const struct rs_layout *w, const int64_t *b, const char *base,
                  const struct qgeo *g, size_t esize, const struct qcast *cast, uint8_t *tmp,
                  int group, const struct qwhole *plain, int src)
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
        if (plain)
            sum += row_plain(base, g, geo_row(g, at), lo[nd - 1], hi[nd - 1], gfirst, esize, plain,
                             tmp, src);
        else
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
    const uint64_t *sent_fp =
        cast && x->quant.sent_ok && x->quant.sent_ok[w] ? x->quant.sent_fp[w] : NULL;
    enum rs_dtype dt = pw->src.dtype;
    size_t es = dtype_size(dt);
    int64_t idx[RS_MAX_DIMS], b[RS_MAX_DIMS];
    if (blocks_first(&held, idx, b))
        do {
            if (!whole_block(wh, b)) { /* it crosses in the source dtype: its part of it */
                fp->src_plain += block_fp(&pw->dst, b, base, g, es, NULL, tmp, 0, wh, 1);
                continue;
            }
            int64_t k = row_major(nd, ps->dst.shape, b);
            float scale;
            if (cast && cast[k] && sent_fp) { /* fingerprinted as cast (quantize_sends) */
                scale = sent[k];
                fp->src_codes += sent_fp[k];
            } else if (cast && cast[k]) {
                scale = sent[k];
                fp->src_codes += block_fp(&pw->dst, b, x->quant.qsrc[w], &flat, 1, NULL, tmp,
                                          fp->grouped, NULL, 0);
            } else {
                struct qcast c = {block_scale(&pw->dst, b, base, g, dt), dt, fp8_of(pw->dst.dtype)};
                scale = c.scale;
                fp->src_codes += block_fp(&pw->dst, b, base, g, es, &c, tmp, fp->grouped, NULL, 0);
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
    /* quantized on the host: fingerprinted as made, staged elements too (quantize_landed); on
     * the device, quantized again here from the staged copy */
    int made = x->quant.landed_ok && x->quant.landed_ok[w];
    if (made) {
        fp->dst_codes = x->quant.landed_fp[3 * w];
        fp->dst_scales = x->quant.landed_fp[3 * w + 1];
        fp->dst_plain = x->quant.landed_fp[3 * w + 2];
    }
    int64_t idx[RS_MAX_DIMS], b[RS_MAX_DIMS];
    if (st == RESHARD_OK && blocks_first(&held, idx, b))
        do {
            if (out)
                fp->dst_held += block_fp(&pw->dst, b, out, g, 1, NULL, tmp, 1, NULL, 0);
            if (whole_block(wh, b) || made)
                continue; /* quantized at its sender (the source side counts it), or made here */
            if (!stage) {
                st = rs_error(RESHARD_ERR_INTERNAL,
                              "a block quantized where it lands, and no staged copy of it");
                break;
            }
            fp->dst_plain +=
                block_fp(&pw->dst, b, stage, &flat, dtype_size(dt), NULL, tmp, 0, wh, 0);
            struct qcast c = {block_scale(&pw->dst, b, stage, &flat, dt), dt,
                              fp8_of(pw->dst.dtype)};
            fp->dst_codes +=
                block_fp(&pw->dst, b, stage, &flat, dtype_size(dt), &c, tmp, fp->grouped, NULL, 0);
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
    *fp = (struct exec_quant_fp){.grouped = codes_grouped(pw)};
    int src = src_counts && shard_elems(&pw->src_map, me);
    int dst = shard_elems(&pw->dst_map, me) != 0;
    if (!src && !dst)
        return RESHARD_OK;
    struct qwhole wh;
    RS_CHECK(whole_make(pw, &wh));
    uint8_t *tmp = rs_calloc((size_t)pw->dst.shape[pw->dst.ndim - 1] + 1, 8, "verification");
    reshard_status_t st = tmp ? RESHARD_OK : RESHARD_ERR_NO_MEMORY;
    if (st == RESHARD_OK && src)
        st = expect_src(x, bufs, w, &wh, tmp, fp);
    if (st == RESHARD_OK && dst)
        st = expect_dst(x, bufs, w, &wh, tmp, fp);
    free(tmp);
    whole_free(&wh);
    return st;
}
