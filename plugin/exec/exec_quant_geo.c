/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The block geometry of FP8 destinations quantized on the way (exec_quant_geo.h): where a
 * rank's elements of a shard are, boxes and blocks of a weight, and a block's scale.
 */
#include "exec_quant_geo.h"

#include "base/error.h"

#include <stdlib.h>
#include <string.h>

/* Elements of rank's shard of map, 0 when it holds none: the executor's own copies are
 * row-major over the shard (no view), whatever buffer the caller's shard sits in. */
uint64_t shard_elems(const struct rs_shardmap *m, int rank)
{
    int pos = shardmap_position(m, rank);
    if (pos < 0)
        return 0;
    uint64_t n = 1;
    for (int j = 0; j < m->layout->ndim; j++)
        n *= (uint64_t)dimmap_group_len(&m->dim[j], shardmap_group(m, pos, j));
    return n;
}

void geo_free(struct qgeo *g)
{
    for (int d = 0; g && d < g->ndim; d++)
        free(g->loc[d]);
    free(g);
}

/* Rank's shard of m (it holds one). */
reshard_status_t geo_make(const struct rs_shardmap *m, int rank, struct qgeo **out)
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
        if (g->last_run) {
            g->run_lo = dm->segs[dm->first[grp]].start;
            g->run_hi = g->run_lo + dm->segs[dm->first[grp]].len;
        }
    }
    *out = g;
    return RESHARD_OK;
}

/* The element offset of global index gi. */
int64_t geo_at(const struct qgeo *g, const int64_t *gi)
{
    int64_t lin = 0;
    for (int d = 0; d < g->ndim; d++)
        lin = lin * g->shape[d] + g->loc[d][gi[d]];
    return region_view_at(g->view, g->shape, g->ndim, lin);
}

/* The same shard, row-major without the view: the executor's FP8 and staging copies. */
struct qgeo geo_flat(const struct qgeo *g)
{
    struct qgeo f = *g;
    f.view = NULL;
    return f;
}

enum rs_fp8 fp8_of(enum rs_dtype t)
{
    return t == RS_DTYPE_FP8E5M2 ? RS_FP8_E5M2 : RS_FP8_E4M3;
}

/* ---- boxes and blocks ---- */

/* An odometer over the box [lo, hi) of ndim dims; 0 when it is done (or empty). */
int box_next(int ndim, const int64_t *lo, const int64_t *hi, int64_t *at)
{
    for (int d = ndim - 1; d >= 0; d--) {
        if (++at[d] < hi[d])
            return 1;
        at[d] = lo[d];
    }
    return 0;
}

int box_empty(int ndim, const int64_t *lo, const int64_t *hi)
{
    for (int d = 0; d < ndim; d++)
        if (hi[d] <= lo[d])
            return 1;
    return 0;
}

/* The elements of block b of weight l, clipped to [clo, chi). */
void block_box(const struct rs_layout *l, const int64_t *b, const int64_t *clo, const int64_t *chi,
               int64_t *lo, int64_t *hi)
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
void blocks_of(const struct rs_layout *l, const int64_t *start, const int64_t *len, int64_t *lo,
               int64_t *hi)
{
    for (int d = 0; d < l->ndim; d++) {
        int64_t e = quant_extent(l, d);
        lo[d] = start[d] / e;
        hi[d] = len[d] ? (start[d] + len[d] - 1) / e + 1 : lo[d];
    }
}

int64_t row_major(int ndim, const int64_t *shape, const int64_t *at)
{
    int64_t lin = 0;
    for (int d = 0; d < ndim; d++)
        lin = lin * shape[d] + at[d];
    return lin;
}

/* The row-major local index of the first element of at's row (its last coordinate aside), and
 * an element of that row: whole rows are walked with one lookup per element. */
int64_t geo_row(const struct qgeo *g, const int64_t *at)
{
    int64_t lin = 0;
    for (int d = 0; d + 1 < g->ndim; d++)
        lin = lin * g->shape[d] + g->loc[d][at[d]];
    return lin * g->shape[g->ndim - 1];
}

/* Whether row [j0, j1) is one run of consecutive elements (no view, no gap): *first its first. */
int geo_run(const struct qgeo *g, int64_t row, int64_t j0, int64_t j1, int64_t *first)
{
    const int64_t *l = g->loc[g->ndim - 1];
    if (g->view || j1 <= j0)
        return 0;
    if (g->last_run) { /* what it holds of the row is one run: both ends held, all between */
        if (l[j0] < 0 || l[j1 - 1] < 0)
            return 0;
        *first = row + l[j0];
        return 1;
    }
    for (int64_t j = j0 + 1; j < j1; j++)
        if (l[j] != l[j0] + (j - j0))
            return 0;
    *first = row + l[j0];
    return 1;
}

/* The rows of the box [lo, hi): an odometer over every dim but the last. */
int row_next(int ndim, const int64_t *lo, const int64_t *hi, int64_t *at)
{
    return ndim > 1 && box_next(ndim - 1, lo, hi, at);
}

/* The largest |x| of row [j0, j1) of base. */
float row_amax(float amax, const char *base, const struct qgeo *g, int64_t row, int64_t j0,
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
float block_scale(const struct rs_layout *w, const int64_t *b, const char *base,
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
