/* SPDX-License-Identifier: Apache-2.0 */
/*
 * reshard_perf's FP8 destinations (--dst '... dtype=fp8e4m3 quant=block(128,128)'): the source
 * values of (global index, iteration), finite and of varied magnitudes, in the source dtype; and
 * the host reference (cuda/quant.h, the library's own definition) of every FP8 element and every
 * scale, computed from the whole tensor's blocks, against which each destination shard and its
 * scales are compared bit for bit. An FP8 source with the same blocks (a MOVE) is filled with
 * the reference's values and scales, and must arrive unchanged.
 */
#ifndef PERF_QUANT_H
#define PERF_QUANT_H

#include "perf_pattern.h"
#include "cuda/quant.h"

#include <math.h>
#include <stdio.h>

struct perf_quant {
    int on, move;
    enum rs_fp8 fmt;
    int src_kind; /* 0 bf16, 1 f16, 2 f32, 3 FP8 (a MOVE) */
    int ndim;
    int64_t shape[PERF_MAX_DIMS], ext[PERF_MAX_DIMS], nblk[PERF_MAX_DIMS];
    int scales; /* the plan's index of the scales tensor */
    struct shard_map ssrc, sdst;
    void *ssbuf, *sdbuf;
    /* The scales of the whole tensor for one key, computed as blocks are asked for. */
    float *cache;
    uint8_t *have;
    uint64_t key;
    int64_t nblocks;
};

/* From the canonical specs: is the destination quantized, and how. 0, or 2 for a pair the tool
 * cannot run (why set). */
static inline int pq_init(struct perf_quant *q, const char *src_dtype, const char *dst_dtype,
                          const char *quant, int ndim, const int64_t *shape, const char **why)
{
    memset(q, 0, sizeof(*q));
    *why = NULL;
    if (!quant)
        return 0;
    q->on = 1;
    q->fmt = !strcmp(dst_dtype, "fp8e5m2") ? RS_FP8_E5M2 : RS_FP8_E4M3;
    q->move = !strcmp(src_dtype, dst_dtype);
    q->src_kind = q->move                      ? 3
                  : !strcmp(src_dtype, "bf16") ? 0
                  : !strcmp(src_dtype, "f16")  ? 1
                  : !strcmp(src_dtype, "f32")  ? 2
                                               : -1;
    if (q->src_kind < 0) {
        *why = "a quantized --dst takes a bf16, f16 or f32 source, or the same FP8 quant";
        return 2;
    }
    q->ndim = ndim;
    long r = 0, c = 0;
    int block = sscanf(quant, "block(%ld,%ld)", &r, &c) == 2;
    q->nblocks = 1;
    for (int d = 0; d < ndim; d++) {
        q->shape[d] = shape[d];
        if (block)
            q->ext[d] = d == ndim - 2 ? r : d == ndim - 1 ? c : 1;
        else if (!strcmp(quant, "channel"))
            q->ext[d] = d == 0 ? 1 : shape[d];
        else
            q->ext[d] = shape[d];
        if (q->ext[d] < 1 || q->ext[d] > shape[d])
            q->ext[d] = shape[d] ? shape[d] : 1; /* a scale wider than the dim covers it */
        q->nblk[d] = (shape[d] + q->ext[d] - 1) / q->ext[d];
        q->nblocks *= q->nblk[d];
    }
    q->cache = calloc((size_t)q->nblocks + 1, sizeof(float));
    q->have = calloc((size_t)q->nblocks + 1, 1);
    if (!q->cache || !q->have) {
        *why = "out of memory";
        return 2;
    }
    return 0;
}

static inline void pq_free_buffers(struct perf_quant *q)
{
    free(q->ssbuf);
    free(q->sdbuf);
    q->ssbuf = q->sdbuf = NULL;
    shard_map_free(&q->ssrc);
    shard_map_free(&q->sdst);
}

static inline void pq_free(struct perf_quant *q)
{
    pq_free_buffers(q);
    free(q->cache);
    free(q->have);
}

/* float32 -> f16 bits, truncating (any rule does, as long as the fill and the reference
 * agree): NaN stays NaN, values below f16's normal range become zero, above it the largest
 * finite. Not _Float16: not every compiler has it on every target. */
static inline uint16_t f16_bits_of(float v)
{
    uint32_t u = rs_f32_bits(v), s = (u >> 16) & 0x8000;
    int e = (int)((u >> 23) & 0xff) - 127 + 15;
    if ((u & 0x7fffffff) > 0x7f800000)
        return (uint16_t)(s | 0x7e00);
    if (e <= 0)
        return (uint16_t)s;
    if (e >= 31)
        return (uint16_t)(s | 0x7bff);
    return (uint16_t)(s | (uint32_t)e << 10 | ((u >> 13) & 0x3ff));
}

/* The value at global index g, stored in the source dtype and read back as float32. Not
 * inlined: GCC 12 at -O2, inlining such a round trip into a loop, dropped the bf16 truncation. */
__attribute__((noinline)) static float pq_value(const struct perf_quant *q, uint64_t key, int64_t g,
                                                void *out)
{
    uint64_t u = pattern(key, g);
    float v =
        ldexpf((float)((int32_t)(u & 0xffffff) - 0x800000) * 0x1p-23f, (int)((u >> 24) % 16) - 8);
    int kind = q->src_kind == 3 ? 0 : q->src_kind; /* an FP8 source: quantized from bf16 */
    if (kind == 0) {
        uint16_t h = (uint16_t)(rs_f32_bits(v) >> 16);
        if (out)
            memcpy(out, &h, 2);
        return rs_bf16_to_f32(h);
    }
    if (kind == 1) {
        uint16_t bits = f16_bits_of(v);
        if (out)
            memcpy(out, &bits, 2);
        return rs_f16_to_f32(bits);
    }
    if (out)
        memcpy(out, &v, 4);
    return v;
}

static inline int64_t pq_linear(const struct perf_quant *q, const int64_t *at)
{
    int64_t g = 0;
    for (int d = 0; d < q->ndim; d++)
        g = g * q->shape[d] + at[d];
    return g;
}

/* The scale of block b (block coordinates), over the whole tensor. */
static inline float pq_scale(struct perf_quant *q, uint64_t key, const int64_t *b)
{
    if (q->key != key) {
        memset(q->have, 0, (size_t)q->nblocks);
        q->key = key;
    }
    int64_t k = 0;
    for (int d = 0; d < q->ndim; d++)
        k = k * q->nblk[d] + b[d];
    if (q->have[k])
        return q->cache[k];
    int64_t lo[PERF_MAX_DIMS], hi[PERF_MAX_DIMS], at[PERF_MAX_DIMS];
    for (int d = 0; d < q->ndim; d++) {
        lo[d] = at[d] = b[d] * q->ext[d];
        hi[d] = lo[d] + q->ext[d] < q->shape[d] ? lo[d] + q->ext[d] : q->shape[d];
    }
    float amax = 0;
    for (;;) {
        amax = rs_amax_step(amax, pq_value(q, key, pq_linear(q, at), NULL));
        int d = q->ndim - 1;
        while (d >= 0 && ++at[d] == hi[d])
            at[d] = lo[d], d--;
        if (d < 0)
            break;
    }
    q->cache[k] = rs_fp8_scale(amax, q->fmt);
    q->have[k] = 1;
    return q->cache[k];
}

/* The reference FP8 code of the element at global coordinates at. */
static inline uint8_t pq_code(struct perf_quant *q, uint64_t key, const int64_t *at)
{
    int64_t b[PERF_MAX_DIMS];
    for (int d = 0; d < q->ndim; d++)
        b[d] = at[d] / q->ext[d];
    float s = pq_scale(q, key, b);
    return rs_f32_to_fp8(pq_value(q, key, pq_linear(q, at), NULL) / s, q->fmt);
}

/* Walks a shard's elements in buffer order with their global coordinates. */
static inline int pq_next(const struct shard_map *m, int64_t *pos)
{
    for (int d = m->ndim - 1; d >= 0; d--) {
        if (++pos[d] < m->shape[d])
            return 1;
        pos[d] = 0;
    }
    return 0;
}

static inline void pq_global(const struct shard_map *m, const int64_t *pos, int64_t *at)
{
    for (int d = 0; d < m->ndim; d++)
        at[d] = m->index[d][pos[d]];
}

/* The weight's source shard (and, for a MOVE, the scales' source shard). */
static inline void pq_fill(struct perf_quant *q, const struct shard_map *m, void *buf, uint64_t key)
{
    int64_t pos[PERF_MAX_DIMS] = {0}, at[PERF_MAX_DIMS];
    char *p = buf;
    if (m->numel)
        do {
            pq_global(m, pos, at);
            if (q->move)
                *(uint8_t *)p = pq_code(q, key, at);
            else
                pq_value(q, key, pq_linear(q, at), p);
            p += m->elem_size;
        } while (pq_next(m, pos));
    if (!q->move || !q->ssbuf || !q->ssrc.numel)
        return;
    float *s = q->ssbuf;
    memset(pos, 0, sizeof(pos));
    do {
        pq_global(&q->ssrc, pos, at);
        *s++ = pq_scale(q, key, at);
    } while (pq_next(&q->ssrc, pos));
}

/* Elements and scales of this rank's destination shards that differ from the reference. */
static inline uint64_t pq_check(struct perf_quant *q, const struct shard_map *m, const void *buf,
                                uint64_t key)
{
    int64_t pos[PERF_MAX_DIMS] = {0}, at[PERF_MAX_DIMS];
    uint64_t bad = 0;
    const uint8_t *p = buf;
    if (m->numel)
        do {
            pq_global(m, pos, at);
            bad += *p++ != pq_code(q, key, at);
        } while (pq_next(m, pos));
    if (!q->sdbuf || !q->sdst.numel)
        return bad;
    const float *s = q->sdbuf;
    memset(pos, 0, sizeof(pos));
    do {
        pq_global(&q->sdst, pos, at);
        bad += rs_f32_bits(*s++) != rs_f32_bits(pq_scale(q, key, at));
    } while (pq_next(&q->sdst, pos));
    return bad;
}

#endif
