/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The data pattern of reshard_perf: element bits are the low bits of splitmix64 over (tensor,
 * global linear index, iteration), so any rank can fill or check any shard without talking to
 * the others. Bits are compared, never float values.
 */
#ifndef PERF_PATTERN_H
#define PERF_PATTERN_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PERF_MAX_DIMS 8

/* Where each element of one rank's shard sits in the global tensor. */
struct shard_map {
    int ndim;
    size_t elem_size, bytes;
    int64_t numel;
    int64_t shape[PERF_MAX_DIMS];  /* local */
    int64_t stride[PERF_MAX_DIMS]; /* global, row-major */
    int64_t *index[PERF_MAX_DIMS]; /* global index of each local index, per dim */
};

static inline uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static inline uint64_t pattern_key(int tensor, int iter)
{
    return mix64(((uint64_t)(uint32_t)tensor << 32) ^ (uint32_t)iter);
}

static inline uint64_t pattern(uint64_t key, int64_t global)
{
    return mix64(key ^ ((uint64_t)global * 0xd1342543de82ef95ULL));
}

/* One row (the last dim) of a shard: element i is global element base + idx[i]. */
static inline void row_fill(void *row, size_t es, const int64_t *idx, int64_t len, int64_t base,
                            uint64_t key)
{
    int64_t i;
    switch (es) {
    case 1:
        for (i = 0; i < len; i++)
            ((uint8_t *)row)[i] = (uint8_t)pattern(key, base + idx[i]);
        break;
    case 2:
        for (i = 0; i < len; i++)
            ((uint16_t *)row)[i] = (uint16_t)pattern(key, base + idx[i]);
        break;
    case 4:
        for (i = 0; i < len; i++)
            ((uint32_t *)row)[i] = (uint32_t)pattern(key, base + idx[i]);
        break;
    default:
        for (i = 0; i < len; i++)
            ((uint64_t *)row)[i] = pattern(key, base + idx[i]);
    }
}

static inline uint64_t row_check(const void *row, size_t es, const int64_t *idx, int64_t len,
                                 int64_t base, uint64_t key)
{
    uint64_t bad = 0;
    int64_t i;
    switch (es) {
    case 1:
        for (i = 0; i < len; i++)
            bad += ((const uint8_t *)row)[i] != (uint8_t)pattern(key, base + idx[i]);
        break;
    case 2:
        for (i = 0; i < len; i++)
            bad += ((const uint16_t *)row)[i] != (uint16_t)pattern(key, base + idx[i]);
        break;
    case 4:
        for (i = 0; i < len; i++)
            bad += ((const uint32_t *)row)[i] != (uint32_t)pattern(key, base + idx[i]);
        break;
    default:
        for (i = 0; i < len; i++)
            bad += ((const uint64_t *)row)[i] != pattern(key, base + idx[i]);
    }
    return bad;
}

static inline void shard_map_free(struct shard_map *m)
{
    for (int d = 0; d < PERF_MAX_DIMS; d++)
        free(m->index[d]);
    memset(m, 0, sizeof(*m));
}

/* Global linear index of the first element of the row at local position pos[0 .. ndim-1). */
static inline int64_t row_base(const struct shard_map *m, const int64_t *pos)
{
    int64_t g = 0;
    for (int d = 0; d + 1 < m->ndim; d++)
        g += m->index[d][pos[d]] * m->stride[d];
    return g;
}

/* Advances pos to the next row, row-major. */
static inline void next_row(const struct shard_map *m, int64_t *pos)
{
    for (int d = m->ndim - 2; d >= 0; d--) {
        if (++pos[d] < m->shape[d])
            return;
        pos[d] = 0;
    }
}

static inline void shard_fill(const struct shard_map *m, void *buf, uint64_t key)
{
    int64_t pos[PERF_MAX_DIMS] = {0}, len = m->shape[m->ndim - 1];
    char *row = buf;
    for (int64_t r = 0; r < m->numel / len; r++, next_row(m, pos)) {
        row_fill(row, m->elem_size, m->index[m->ndim - 1], len, row_base(m, pos), key);
        row += (size_t)len * m->elem_size;
    }
}

static inline uint64_t shard_check(const struct shard_map *m, const void *buf, uint64_t key)
{
    int64_t pos[PERF_MAX_DIMS] = {0}, len = m->shape[m->ndim - 1];
    const char *row = buf;
    uint64_t bad = 0;
    for (int64_t r = 0; r < m->numel / len; r++, next_row(m, pos)) {
        bad += row_check(row, m->elem_size, m->index[m->ndim - 1], len, row_base(m, pos), key);
        row += (size_t)len * m->elem_size;
    }
    return bad;
}

/* --changed PCT[,SEED] (--changed-runs): between two iterations, each element changes with
 * probability PCT percent (all of a run of PERF_RUN elements at once with runs), a decision of
 * (seed, global index, iteration) alone, so any rank can apply or check it. */
#define PERF_RUN 4096

struct perf_change {
    double pct; /* < 0: off */
    uint64_t seed;
    int runs;
};

static inline int elem_changed(const struct perf_change *c, int64_t g, int iter)
{
    if (c->pct >= 100)
        return 1;
    uint64_t h = mix64(c->seed ^ ((uint64_t)(c->runs ? g / PERF_RUN : g) * 0xd1342543de82ef95ULL) ^
                       ((uint64_t)(uint32_t)iter << 40));
    return (double)(h >> 11) < c->pct / 100.0 * 9007199254740992.0; /* 2^53 */
}

/* Rows of a shard, element by element: fn(element address, global index). */
#define SHARD_EACH(m, buf, body)                                                                   \
    do {                                                                                           \
        int64_t pos_[PERF_MAX_DIMS] = {0}, len_ = (m)->shape[(m)->ndim - 1];                       \
        size_t es_ = (m)->elem_size;                                                               \
        for (int64_t r_ = 0; r_ < (m)->numel / len_; r_++, next_row((m), pos_)) {                  \
            int64_t base_ = row_base((m), pos_);                                                   \
            for (int64_t i_ = 0; i_ < len_; i_++) {                                                \
                size_t at = (size_t)(r_ * len_ + i_) * es_;                                        \
                int64_t g = base_ + (m)->index[(m)->ndim - 1][i_];                                 \
                body;                                                                              \
            }                                                                                      \
        }                                                                                          \
    } while (0)

/* The changed elements of a shard take iteration iter's values (key). */
static inline void shard_change(const struct shard_map *m, void *buf, uint64_t key,
                                const struct perf_change *c, int iter)
{
    SHARD_EACH(m, buf, {
        if (elem_changed(c, g, iter)) {
            uint64_t v = pattern(key, g);
            memcpy((char *)buf + at, &v, es_); /* the low bytes: little-endian hosts */
        }
    });
}

/* Wrong elements of a destination shard after iteration iter: a changed element holds key's
 * value, any other what it held before (prev). */
static inline uint64_t shard_check_changed(const struct shard_map *m, const void *buf,
                                           const void *prev, uint64_t key,
                                           const struct perf_change *c, int iter)
{
    uint64_t bad = 0;
    SHARD_EACH(m, buf, {
        uint64_t v = pattern(key, g);
        const void *want = elem_changed(c, g, iter) ? (const void *)&v : (const char *)prev + at;
        bad += memcmp((const char *)buf + at, want, es_) != 0;
    });
    return bad;
}

#endif
