/* SPDX-License-Identifier: Apache-2.0 */
#include "quant.h"

#include "base/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int64_t quant_extent(const struct rs_layout *l, int d)
{
    const struct rs_quant *q = &l->quant;
    switch (q->kind) {
    case RS_QUANT_BLOCK:
        return d == l->ndim - 2 ? q->rows : d == l->ndim - 1 ? q->cols : 1;
    case RS_QUANT_CHANNEL:
        return d == 0 ? 1 : l->shape[d];
    case RS_QUANT_TENSOR:
        return l->shape[d];
    case RS_QUANT_NONE:
        break;
    }
    return 1;
}

void quant_scales_layout(const struct rs_layout *w, int replicated, struct rs_layout *out)
{
    *out = *w;
    memset(&out->view, 0, sizeof(out->view));
    memset(&out->quant, 0, sizeof(out->quant));
    out->dtype = RS_DTYPE_F32;
    for (int d = 0; d < w->ndim; d++) {
        int64_t e = quant_extent(w, d);
        out->shape[d] = (w->shape[d] + e - 1) / e;
    }
    if (replicated) {
        out->mesh_ndim = 1;
        out->mesh[0] = w->nranks;
        memset(out->place, 0, sizeof(out->place));
        out->place[0].kind = RS_PLACE_R;
    }
}

/* A rank holding group g of dim d, for messages. */
static int rank_of_group(const struct rs_shardmap *map, int d, int g)
{
    for (int p = 0; p < map->layout->nranks; p++)
        if (shardmap_group(map, p, d) == g)
            return map->layout->ranks[p];
    return -1;
}

reshard_status_t quant_check_aligned(const struct rs_shardmap *map, const struct rs_layout *q,
                                     const char *name, const char *side)
{
    const struct rs_layout *l = q;
    for (int d = 0; d < l->ndim; d++) {
        int64_t e = quant_extent(l, d), n = l->shape[d];
        const struct rs_dimmap *dm = &map->dim[d];
        for (int g = 0; g < dm->ngroups; g++)
            for (int s = dm->first[g]; s < dm->first[g + 1]; s++) {
                int64_t a = dm->segs[s].start, b = a + dm->segs[s].len;
                int64_t bad = a % e ? a : (b % e && b != n) ? b : -1;
                if (bad < 0)
                    continue;
                char blocks[64];
                if (l->quant.kind == RS_QUANT_BLOCK)
                    snprintf(blocks, sizeof(blocks), "block(%lld,%lld)", (long long)l->quant.rows,
                             (long long)l->quant.cols);
                else
                    snprintf(blocks, sizeof(blocks), "%s",
                             l->quant.kind == RS_QUANT_CHANNEL ? "channel" : "tensor");
                return rs_error(RESHARD_ERR_SPEC_SYNTAX,
                                "tensor '%s' %s: the shard of rank %d %s at index %lld of dim %d, "
                                "not on a boundary of its %lld-wide blocks (quant=%s): each shard "
                                "must hold whole blocks, as the inference engines require",
                                name, side, rank_of_group(map, d, g), bad == a ? "starts" : "ends",
                                (long long)bad, d, (long long)e, blocks);
            }
    }
    return RESHARD_OK;
}

reshard_status_t quant_check_follow(const struct rs_shardmap *weight,
                                    const struct rs_shardmap *scales, const char *name)
{
    const struct rs_layout *l = weight->layout;
    for (int d = 0; d < l->ndim; d++) {
        int64_t e = quant_extent(l, d);
        const struct rs_dimmap *w = &weight->dim[d], *s = &scales->dim[d];
        int same = w->ngroups == s->ngroups;
        for (int g = 0; same && g < w->ngroups; g++) {
            same = w->first[g + 1] - w->first[g] == s->first[g + 1] - s->first[g];
            for (int k = 0; same && k < w->first[g + 1] - w->first[g]; k++) {
                const struct rs_seg *a = &w->segs[w->first[g] + k], *b = &s->segs[s->first[g] + k];
                same = b->start == a->start / e && b->len == (a->len + e - 1) / e &&
                       b->pos == a->pos / e;
            }
        }
        if (!same)
            return rs_error(RESHARD_ERR_SPEC_SYNTAX,
                            "tensor '%s': its scales cannot be sharded block for block along dim "
                            "%d (the placements cut the blocks unevenly)",
                            name, d);
    }
    return RESHARD_OK;
}

reshard_status_t quant_cut_grid(struct rs_grid *g, const struct rs_layout *dst)
{
    g->ncells = 1;
    for (int d = 0; d < g->ndim; d++) {
        int64_t e = quant_extent(dst, d);
        struct grid_iv *iv = g->iv[d];
        if (e > 1) {
            struct grid_iv *cut = rs_calloc(3 * (size_t)g->n[d], sizeof(*cut), "grid");
            if (!cut)
                return RESHARD_ERR_NO_MEMORY;
            int n = 0;
            for (int i = 0; i < g->n[d]; i++) {
                int64_t a = iv[i].start, b = a + iv[i].len;
                int64_t up = (a + e - 1) / e * e, down = b / e * e;
                int64_t at[4] = {a, up < b ? up : b, down > a && down > up ? down : b, b};
                for (int k = 0; k < 3; k++)
                    if (at[k + 1] > at[k])
                        cut[n++] = (struct grid_iv){at[k], at[k + 1] - at[k], iv[i].sg, iv[i].dg};
            }
            free(iv);
            g->iv[d] = cut;
            g->n[d] = n;
        }
        g->ncells *= g->n[d];
        if (g->ncells > RS_MAX_CELLS)
            return rs_error(RESHARD_ERR_TOO_LARGE,
                            "plan: more than 2^32 overlap boxes in one tensor");
    }
    return RESHARD_OK;
}

/* Is [lo, hi) inside the union of group g's segments of dim d? */
static int group_covers(const struct rs_dimmap *d, int g, int64_t lo, int64_t hi)
{
    int64_t at = lo;
    while (at < hi) {
        int found = 0;
        for (int s = d->first[g]; s < d->first[g + 1] && !found; s++) {
            const struct rs_seg *seg = &d->segs[s];
            if (seg->start <= at && at < seg->start + seg->len) {
                at = seg->start + seg->len;
                found = 1;
            }
        }
        if (!found)
            return 0;
    }
    return 1;
}

int quant_cell_at_src(const struct rs_shardmap *src, const struct rs_layout *dst,
                      const struct rs_grid *g, const struct grid_cursor *c)
{
    for (int d = 0; d < g->ndim; d++) {
        const struct grid_iv *iv = &g->iv[d][c->idx[d]];
        int64_t e = quant_extent(dst, d), n = dst->shape[d];
        int64_t lo = iv->start / e * e, hi = (iv->start + iv->len + e - 1) / e * e;
        if (hi > n)
            hi = n;
        if (!group_covers(&src->dim[d], iv->sg, lo, hi))
            return 0;
    }
    return 1;
}

int quant_holds_blocks(const struct rs_shardmap *src, int pos, const struct rs_layout *dst,
                       const int64_t *start, const int64_t *len, int in_blocks)
{
    for (int d = 0; d < dst->ndim; d++) {
        int64_t e = quant_extent(dst, d), n = dst->shape[d];
        int64_t a = in_blocks ? start[d] * e : start[d],
                b = in_blocks ? (start[d] + len[d]) * e : start[d] + len[d];
        int64_t lo = a / e * e, hi = (b + e - 1) / e * e;
        if (hi > n)
            hi = n;
        if (!group_covers(&src->dim[d], shardmap_group(src, pos, d), lo, hi))
            return 0;
    }
    return 1;
}

int quant_scale_box(const struct rs_layout *l, const int64_t *start, const int64_t *len,
                    int64_t *sstart, int64_t *slen)
{
    for (int d = 0; d < l->ndim; d++) {
        int64_t e = quant_extent(l, d);
        int64_t first = (start[d] + e - 1) / e, end = (start[d] + len[d] + e - 1) / e;
        if (end <= first)
            return 0;
        sstart[d] = first;
        slen[d] = end - first;
    }
    return 1;
}
