/* SPDX-License-Identifier: Apache-2.0 */
#include "region.h"

#include "cuda/pack_desc.h"

#include <string.h>

/* Local index of global index g along dim j of the rank's group: the box lies in one segment. */
static int64_t local_index(const struct rs_dimmap *d, int group, int64_t g)
{
    for (int s = d->first[group]; s < d->first[group + 1]; s++) {
        const struct rs_seg *seg = &d->segs[s];
        if (g >= seg->start && g < seg->start + seg->len)
            return seg->pos + (g - seg->start);
    }
    return -1; /* not held: the plan guarantees it is */
}

void region_of_shard(const struct rs_shardmap *map, int pos, const int64_t *gstart,
                     const int64_t *glen, struct region *r)
{
    const struct rs_layout *l = map->layout;
    r->esize = dtype_size(l->dtype);
    r->ndim = l->ndim;
    for (int j = 0; j < l->ndim; j++) {
        int g = shardmap_group(map, pos, j);
        r->shape[j] = dimmap_group_len(&map->dim[j], g);
        r->start[j] = glen[j] ? local_index(&map->dim[j], g, gstart[j]) : 0;
        r->len[j] = glen[j];
    }
    r->view = l->view.ndim || l->view.nstrides || l->view.offset ? &l->view : NULL;
}

void region_of_full(const struct rs_layout *l, const int64_t *gstart, const int64_t *glen,
                    struct region *r)
{
    r->esize = dtype_size(l->dtype);
    r->ndim = l->ndim;
    for (int j = 0; j < l->ndim; j++) {
        r->shape[j] = l->shape[j];
        r->start[j] = gstart[j];
        r->len[j] = glen[j];
    }
    r->view = NULL;
}

static int view_dims(const struct rs_view *v, const int64_t *shape, int ndim,
                     const int64_t **vshape, int64_t *vstride)
{
    int vdim = v && v->ndim ? v->ndim : ndim;
    *vshape = v && v->ndim ? v->shape : shape;
    int64_t s = 1;
    for (int d = vdim - 1; d >= 0; d--) {
        vstride[d] = v && v->nstrides ? v->strides[d] : s;
        s *= (*vshape)[d];
    }
    return vdim;
}

int64_t region_view_at(const struct rs_view *v, const int64_t *shape, int ndim, int64_t lin)
{
    if (!v || (!v->ndim && !v->nstrides && !v->offset))
        return lin;
    const int64_t *vshape;
    int64_t vstride[RS_MAX_DIMS], at = v->offset;
    int vdim = view_dims(v, shape, ndim, &vshape, vstride);
    for (int d = vdim - 1; d >= 0; d--) {
        at += lin % vshape[d] * vstride[d];
        lin /= vshape[d];
    }
    return at;
}

uint64_t region_span_bytes(const struct rs_layout *l, const int64_t *shape)
{
    int64_t bytes;
    if (layout_span_bytes(l, shape, &bytes) != RS_ITEM_NONE)
        return UINT64_MAX; /* past 2^63: no buffer has room (the layout checks refuse it) */
    return (uint64_t)bytes;
}

uint64_t region_bytes(const struct region *r)
{
    uint64_t n = r->esize;
    for (int j = 0; j < r->ndim; j++)
        n *= (uint64_t)r->len[j];
    return n;
}

void region_iter_init(struct region_iter *it, const struct region *r)
{
    memset(it, 0, sizeof(*it));
    it->r = r;
    /* Merge trailing dims the box spans fully: one run covers them. */
    int d = r->ndim - 1;
    it->run = r->ndim ? r->len[d] : 1;
    while (d > 0 && r->len[d] == r->shape[d]) {
        d--;
        it->run *= r->len[d];
    }
    it->outer = d; /* dims 0 .. d-1 are walked, dim d's start begins each run */
    it->done = region_bytes(r) == 0;
    it->vdim = view_dims(r->view, r->shape, r->ndim, &it->vshape, it->vstride);
}

/* Linear (row-major, local shape) index of the current run's first element. */
static int64_t run_start(const struct region_iter *it)
{
    const struct region *r = it->r;
    int64_t lin = 0;
    for (int j = 0; j < r->ndim; j++) {
        int64_t i = r->start[j] + (j < it->outer ? it->idx[j] : 0);
        lin = lin * r->shape[j] + i;
    }
    return lin;
}

static void advance(struct region_iter *it)
{
    const struct region *r = it->r;
    for (int j = it->outer - 1; j >= 0; j--) {
        if (++it->idx[j] < r->len[j])
            return;
        it->idx[j] = 0;
    }
    it->done = 1;
}

int region_iter_next(struct region_iter *it, uint64_t *off, uint64_t *len)
{
    if (!it->left) {
        if (it->done)
            return 0;
        it->lin = run_start(it);
        it->left = it->run;
        advance(it);
    }
    const struct region *r = it->r;
    int64_t n = it->left, at;
    if (!r->view) {
        at = it->lin;
    } else {
        /* The view's own index of this element; the piece ends at its innermost dim. */
        int64_t rem = it->lin, idx[RS_MAX_DIMS];
        for (int d = it->vdim - 1; d >= 0; d--) {
            idx[d] = rem % it->vshape[d];
            rem /= it->vshape[d];
        }
        at = r->view->offset;
        for (int d = 0; d < it->vdim; d++)
            at += idx[d] * it->vstride[d];
        int last = it->vdim - 1;
        int64_t room = it->vstride[last] == 1 ? it->vshape[last] - idx[last] : 1;
        if (n > room)
            n = room;
    }
    *off = (uint64_t)at * r->esize;
    *len = (uint64_t)n * r->esize;
    it->lin += n;
    it->left -= n;
    return 1;
}

int region_contiguous(const struct region *r, uint64_t *off)
{
    struct region_iter it;
    uint64_t o, n;
    region_iter_init(&it, r);
    if (!region_iter_next(&it, &o, &n))
        return 0;
    if (n != region_bytes(r))
        return 0;
    *off = o;
    return 1;
}

void region_pair_init(struct region_pair *p, const struct region *a, const struct region *b)
{
    memset(p, 0, sizeof(*p));
    region_iter_init(&p->a, a);
    region_iter_init(&p->b, b);
}

int region_pair_next(struct region_pair *p, uint64_t *aoff, uint64_t *boff, uint64_t *len)
{
    if (!p->alen && !region_iter_next(&p->a, &p->aoff, &p->alen))
        return 0;
    if (!p->blen && !region_iter_next(&p->b, &p->boff, &p->blen))
        return 0;
    uint64_t n = p->alen < p->blen ? p->alen : p->blen;
    *aoff = p->aoff;
    *boff = p->boff;
    *len = n;
    p->aoff += n;
    p->alen -= n;
    p->boff += n;
    p->blen -= n;
    return 1;
}

void region_pack(const struct region *r, const char *base, char *packed)
{
    struct region_iter it;
    uint64_t off, n;
    region_iter_init(&it, r);
    while (region_iter_next(&it, &off, &n)) {
        memcpy(packed, base + off, n);
        packed += n;
    }
}

void region_unpack(const struct region *r, char *base, const char *packed)
{
    struct region_iter it;
    uint64_t off, n;
    region_iter_init(&it, r);
    while (region_iter_next(&it, &off, &n)) {
        memcpy(base + off, packed, n);
        packed += n;
    }
}

void region_copy(const struct region *a, const char *abase, const struct region *b, char *bbase)
{
    struct region_pair p;
    uint64_t ao, bo, n;
    region_pair_init(&p, a, b);
    while (region_pair_next(&p, &ao, &bo, &n))
        memmove(bbase + bo, abase + ao, n);
}

void region_desc(const struct region *r, struct rs_pack_desc *d)
{
    memset(d, 0, sizeof(*d));
    d->ndim = r->ndim;
    d->esize = (int32_t)r->esize;
    d->numel = 1;
    int64_t stride = 1;
    for (int j = r->ndim - 1; j >= 0; j--) {
        d->len[j] = r->len[j];
        d->lstride[j] = stride;
        d->base += r->start[j] * stride;
        d->numel *= r->len[j];
        stride *= r->shape[j];
    }
    if (r->view) {
        const int64_t *vshape;
        d->vdim = view_dims(r->view, r->shape, r->ndim, &vshape, d->vstride);
        for (int k = 0; k < d->vdim; k++)
            d->vshape[k] = vshape[k];
        d->voffset = r->view->offset;
    }
}
