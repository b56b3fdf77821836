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

#endif
