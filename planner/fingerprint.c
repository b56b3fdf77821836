/* SPDX-License-Identifier: Apache-2.0 */
#include "fingerprint.h"

#include "dtype.h"
#include "base/error.h"

#include <stdlib.h>
#include <string.h>

/* The element's bits, little-endian, as a number. */
static inline uint64_t element_bits(const unsigned char *p, size_t esize)
{
    uint64_t v = 0;
    memcpy(&v, p, esize);
    return v;
}

/* One contiguous row: elements n, global indices gbase + g[i], both multiplied by FP_INDEX_MUL
 * already. Cloned for AVX-512, where the 64-bit multiply of each element runs eight at a time. */
#define FP_ROW(T)                                                                                  \
    for (int64_t i = 0; i < n; i++) {                                                              \
        T x;                                                                                       \
        memcpy(&x, row + i * (int64_t)sizeof(T), sizeof(T));                                       \
        s += fp_mix_scaled(gbase + g[i], (uint64_t)x);                                             \
    }

#if defined(__GNUC__) && !defined(__clang__)
/* GCC vectorizes at -O2 only with a cheap cost model: ask for the loop; clang does it anyway.
 * Clones by feature level, not by CPU model: GCC picks an arch=skylake-avx512 clone only on
 * that model, so AMD's AVX-512 parts ran the scalar default. x86-64-v4 has AVX512DQ's 64-bit
 * multiply (vpmullq). */
#define FP_ROW_ATTRS                                                                               \
    __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"),                   \
                   optimize("tree-vectorize")))
#else
#define FP_ROW_ATTRS
#endif

FP_ROW_ATTRS static uint64_t row_sum(const unsigned char *row, size_t esize, uint64_t gbase,
                                     const uint64_t *g, int64_t n)
{
    uint64_t s = 0;
    switch (esize) {
    case 1:
        FP_ROW(uint8_t)
        break;
    case 2:
        FP_ROW(uint16_t)
        break;
    case 4:
        FP_ROW(uint32_t)
        break;
    default:
        FP_ROW(uint64_t)
        break;
    }
    return s;
}

/* The same for a row whose global indices are consecutive, gbase + i * FP_INDEX_MUL: no table to
 * read (the common case: a shard holds one run of each dim, and often of the whole tensor). */
#define FP_RUN(T)                                                                                  \
    for (int64_t i = 0; i < n; i++) {                                                              \
        T x;                                                                                       \
        memcpy(&x, row + i * (int64_t)sizeof(T), sizeof(T));                                       \
        s += fp_mix_scaled(gbase + (uint64_t)i * FP_INDEX_MUL, (uint64_t)x);                       \
    }

FP_ROW_ATTRS static uint64_t run_sum(const unsigned char *row, size_t esize, uint64_t gbase,
                                     int64_t n)
{
    uint64_t s = 0;
    switch (esize) {
    case 1:
        FP_RUN(uint8_t)
        break;
    case 2:
        FP_RUN(uint16_t)
        break;
    case 4:
        FP_RUN(uint32_t)
        break;
    default:
        FP_RUN(uint64_t)
        break;
    }
    return s;
}
#undef FP_ROW
#undef FP_RUN

uint64_t fingerprint_run(const void *row, size_t esize, uint64_t first, int64_t n)
{
    return run_sum(row, esize, first * FP_INDEX_MUL, n);
}

/* Static and wrapped: a cloned function outside its file is an ifunc, which the linker exports
 * whatever the visibility (test_exports). */
FP_ROW_ATTRS static uint64_t run8_sum(const uint8_t *row, uint64_t first, int64_t n)
{
    uint64_t s = 0, gbase = first * FP_INDEX_MUL;
    int64_t whole = n / 8 * 8;
    for (int64_t i = 0; i < whole; i += 8) {
        uint64_t x;
        memcpy(&x, row + i, sizeof(x));
        s += fp_mix_scaled(gbase + (uint64_t)i * FP_INDEX_MUL, x);
    }
    if (whole < n) { /* the row's end: the group zero-padded */
        uint64_t x = 0;
        memcpy(&x, row + whole, (size_t)(n - whole));
        s += fp_mix_scaled(gbase + (uint64_t)whole * FP_INDEX_MUL, x);
    }
    return s;
}

uint64_t fingerprint_run8(const uint8_t *row, uint64_t first, int64_t n)
{
    return run8_sum(row, first, n);
}

/* Whether dim j of the shard at pos is one run of global indices (its group one segment), and
 * the whole dim when full is asked. */
static int one_run(const struct rs_shardmap *map, int pos, int j, int full)
{
    const struct rs_dimmap *d = &map->dim[j];
    int g = shardmap_group(map, pos, j);
    if (d->first[g + 1] - d->first[g] != 1)
        return 0;
    const struct rs_seg *sg = &d->segs[d->first[g]];
    return !full || (sg->start == 0 && sg->len == map->layout->shape[j]);
}

int fingerprint_counts(const struct rs_shardmap *map, int pos, const struct rs_topo *topo)
{
    const struct rs_layout *l = map->layout;
    int t = map->tuple[pos], me = l->ranks[pos];
    if (topo && topo_off(topo, me, TOPO_SRC))
        return 0;
    for (int i = map->tuple_first[t]; i < map->tuple_first[t + 1]; i++) {
        int r = l->ranks[map->tuple_pos[i]];
        if (r < me && !(topo && topo_off(topo, r, TOPO_SRC)))
            return 0;
    }
    return 1;
}

/* Present ranks of tuple t. */
static int tuple_present(const struct rs_shardmap *map, int t, const struct rs_topo *topo)
{
    int n = 0;
    for (int i = map->tuple_first[t]; i < map->tuple_first[t + 1]; i++)
        n += !(topo && topo_off(topo, map->layout->ranks[map->tuple_pos[i]], TOPO_DST));
    return n;
}

int fingerprint_replicas(const struct rs_shardmap *map, int pos, const struct rs_topo *topo)
{
    if (topo && topo_off(topo, map->layout->ranks[pos], TOPO_DST))
        return 0;
    return tuple_present(map, map->tuple[pos], topo);
}

static uint64_t gcd_u64(uint64_t a, uint64_t b)
{
    while (b) {
        uint64_t r = a % b;
        a = b;
        b = r;
    }
    return a;
}

reshard_status_t fingerprint_lcm(const struct rs_shardmap *map, const struct rs_topo *topo,
                                 uint64_t *lcm)
{
    uint64_t m = 1;
    for (int t = 0; t < map->ntuples; t++) {
        uint64_t r = (uint64_t)tuple_present(map, t, topo);
        if (!r)
            continue;
        m = m / gcd_u64(m, r) * r;
        if (m > UINT32_MAX)
            return rs_error(RESHARD_ERR_TOO_LARGE,
                            "fingerprint: the replica counts of the layout's shards have no "
                            "common multiple below 2^32");
    }
    *lcm = m;
    return RESHARD_OK;
}

int fingerprint_lost(const struct rs_shardmap *map, const struct rs_topo *topo)
{
    if (!topo)
        return -1;
    for (int t = 0; t < map->ntuples; t++)
        if (!tuple_present(map, t, topo) &&
            shardmap_local_numel(map, map->tuple_pos[map->tuple_first[t]]))
            return map->tuple_pos[map->tuple_first[t]];
    return -1;
}

reshard_status_t fingerprint_shard(const struct rs_shardmap *map, int pos, const void *buf,
                                   size_t bytes, uint64_t *out)
{
    const struct rs_layout *l = map->layout;
    int nd = l->ndim;
    int64_t len[RS_MAX_DIMS], numel = 1, gstride[RS_MAX_DIMS];
    /* local index -> its part of the global index, times FP_INDEX_MUL, per dim */
    uint64_t *global[RS_MAX_DIMS];
    for (int j = nd - 1; j >= 0; j--)
        gstride[j] = j == nd - 1 ? 1 : gstride[j + 1] * l->shape[j + 1];
    reshard_status_t st = RESHARD_OK;
    int64_t entries = 0;
    for (int j = 0; j < nd; j++) {
        len[j] = dimmap_group_len(&map->dim[j], shardmap_group(map, pos, j));
        numel *= len[j];
        entries += len[j];
    }
    /* One table for every dim; on the stack for the small shards a whole model has many of. */
    uint64_t small[512], *table = small;
    if (entries > (int64_t)(sizeof(small) / sizeof(small[0])) &&
        !(table = rs_calloc((size_t)entries, sizeof(uint64_t), "fingerprint")))
        return RESHARD_ERR_NO_MEMORY;
    for (int j = 0; j < nd; j++) {
        const struct rs_dimmap *d = &map->dim[j];
        int g = shardmap_group(map, pos, j);
        global[j] = j ? global[j - 1] + len[j - 1] : table;
        for (int s = d->first[g]; s < d->first[g + 1]; s++)
            for (int64_t i = 0; i < d->segs[s].len; i++)
                global[j][d->segs[s].pos + i] =
                    (uint64_t)((d->segs[s].start + i) * gstride[j]) * FP_INDEX_MUL;
    }
    /* The view: local element e (row-major) sits at offset + sum(v_k * vstride[k]), v being e
     * unravelled over the view's shape. */
    const struct rs_view *v = &l->view;
    int vd = v->ndim ? v->ndim : nd;
    const int64_t *vshape = v->ndim ? v->shape : len;
    int64_t vstride[RS_MAX_DIMS], span = 0;
    for (int k = vd - 1; k >= 0; k--)
        vstride[k] = v->nstrides ? v->strides[k] : k == vd - 1 ? 1 : vstride[k + 1] * vshape[k + 1];
    size_t esize = dtype_size(l->dtype);
    if (numel && layout_span_bytes(l, len, &span) != RS_ITEM_NONE) { /* the checks refuse it */
        st = rs_error(RESHARD_ERR_BUFFER,
                      "fingerprint: the shard of rank %d reaches past byte 2^63 of a %zu-byte "
                      "buffer",
                      l->ranks[pos], bytes);
        goto free_tables;
    }
    if ((uint64_t)span > bytes) {
        st = rs_error(RESHARD_ERR_BUFFER,
                      "fingerprint: the shard of rank %d reaches byte %lld of a %zu-byte buffer",
                      l->ranks[pos], (long long)span, bytes);
        goto free_tables;
    }
    const unsigned char *base = buf;
    int64_t li[RS_MAX_DIMS] = {0}, vi[RS_MAX_DIMS] = {0}, off = v->offset;
    uint64_t gbase = 0;
    for (int j = 0; j < nd - 1; j++)
        gbase += numel ? global[j][0] : 0;
    uint64_t sum = 0;
    int64_t inner = len[nd - 1], innerv = vshape[vd - 1], vs = vstride[vd - 1];
    const uint64_t *gin = global[nd - 1];
    /* No view and every dim but the first whole: each segment of dim 0 (one, or a few for
     * SS and strided shards) is one run of the tensor, in the buffer and in index space. */
    int whole = !v->ndim && !v->nstrides && numel;
    for (int j = 1; j < nd && whole; j++)
        whole = one_run(map, pos, j, 1);
    if (whole) {
        const struct rs_dimmap *d0 = &map->dim[0];
        int g0 = shardmap_group(map, pos, 0);
        int64_t row = numel / len[0];
        for (int q = d0->first[g0]; q < d0->first[g0 + 1]; q++) {
            const struct rs_seg *sg = &d0->segs[q];
            sum += run_sum(base + (v->offset + sg->pos * row) * (int64_t)esize, esize,
                           (uint64_t)(sg->start * gstride[0]) * FP_INDEX_MUL, sg->len * row);
        }
        *out = sum;
        goto free_tables;
    }
    int inner_run = numel && one_run(map, pos, nd - 1, 0);
    /* Rows the view keeps contiguous (no view, or one whose innermost dim is the row) go
     * through a loop the compiler can keep tight; others element by element. */
    int rows_contiguous = vs == 1 && innerv == inner;
    for (int64_t e = 0; e < numel; e += inner) {
        if (rows_contiguous) {
            sum += inner_run ? run_sum(base + off * (int64_t)esize, esize, gbase + gin[0], inner)
                             : row_sum(base + off * (int64_t)esize, esize, gbase, gin, inner);
            vi[vd - 1] = innerv - 1; /* the row is done: carry below */
        } else {
            for (int64_t i = 0; i < inner; i++) {
                sum +=
                    fp_mix_scaled(gbase + gin[i], element_bits(base + off * (int64_t)esize, esize));
                if (++vi[vd - 1] < innerv) {
                    off += vs;
                    continue;
                }
                vi[vd - 1] = 0; /* carry into the view's outer dims */
                int k = vd - 2;
                while (k >= 0 && ++vi[k] == vshape[k])
                    vi[k--] = 0;
                off = v->offset;
                for (int q = 0; q < vd; q++)
                    off += vi[q] * vstride[q];
            }
        }
        if (rows_contiguous) { /* the next row of the view */
            vi[vd - 1] = 0;
            int k = vd - 2;
            while (k >= 0 && ++vi[k] == vshape[k])
                vi[k--] = 0;
            off = v->offset;
            for (int q = 0; q < vd; q++)
                off += vi[q] * vstride[q];
        }
        int j = nd - 2; /* the next row of the local shape */
        while (j >= 0 && ++li[j] == len[j])
            li[j--] = 0;
        gbase = 0;
        for (int q = 0; q < nd - 1; q++)
            gbase += global[q][li[q]];
    }
    *out = sum;
free_tables:
    if (table != small)
        free(table);
    return st;
}
