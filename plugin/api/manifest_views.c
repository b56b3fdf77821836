/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The checks of shared buffers in a manifest: views that name one buffer must not overlap on
 * any rank, and must fit the buffer's size when "buffers" gives it.
 *
 * What a rank's view covers depends only on which shard it holds in each layout of the group,
 * its tuple there: ranks holding the same tuples in every layout cover the same elements. So
 * each group is checked once per distinct combination of tuples (the replicas of a model on
 * 8,192 ranks add none), walking the ranks in order so the first failure named is the lowest
 * rank's, as a check of every rank would find.
 */
#include "manifest_int.h"

#include "base/error.h"
#include "base/hindex.h"
#include "base/log.h"
#include "plugin/exec/region.h"

#include <stdlib.h>
#include <string.h>

#define MAX_SPANS_PER_VIEW (1 << 20) /* beyond, the view goes unchecked */

static const struct rs_layout *side_layout(const struct reshard_manifest *m, int t, int side)
{
    return &m->layouts[2 * t + side]->l;
}

/* The shard maps of a group's layouts, each built once. */
struct group_maps {
    const struct rs_layout **layout;
    struct rs_shardmap *map;
    int n, cap;
};

static reshard_status_t map_of(struct group_maps *g, const struct rs_layout *l,
                               const struct rs_shardmap **out)
{
    for (int i = 0; i < g->n; i++)
        if (g->layout[i] == l) {
            *out = &g->map[i];
            return RESHARD_OK;
        }
    if (g->n == g->cap) {
        int cap = g->cap ? 2 * g->cap : 8;
        const struct rs_layout **a = realloc(g->layout, (size_t)cap * sizeof(*a));
        if (a)
            g->layout = a;
        struct rs_shardmap *b = a ? realloc(g->map, (size_t)cap * sizeof(*b)) : NULL;
        if (!b)
            return rs_error(RESHARD_ERR_NO_MEMORY, "out of memory checking manifest buffers");
        g->map = b;
        g->cap = cap;
    }
    RS_CHECK(shardmap_build(l, &g->map[g->n], NULL));
    g->layout[g->n] = l;
    *out = &g->map[g->n++];
    return RESHARD_OK;
}

static void maps_free(struct group_maps *g)
{
    for (int i = 0; i < g->n; i++)
        shardmap_free(&g->map[i]);
    free(g->layout);
    free(g->map);
    memset(g, 0, sizeof(*g));
}

/* The shape of the shard at position pos, and its elements. */
static int64_t shard_shape(const struct rs_shardmap *map, int pos, int64_t *shape)
{
    int64_t n = 1;
    for (int j = 0; j < map->layout->ndim; j++) {
        shape[j] = dimmap_group_len(&map->dim[j], shardmap_group(map, pos, j));
        n *= shape[j];
    }
    return n;
}

/* Elements [lo, hi) of a buffer that one tensor's view covers on one rank. */
struct span {
    int64_t lo, hi;
    int tensor;
};

struct spans {
    struct span *v;
    size_t n, cap;
    int skipped; /* a view of more than MAX_SPANS_PER_VIEW runs went unchecked */
};

/* Appends the runs of the view at position pos: contiguous inner dims merged, the outer ones
 * walked. */
static reshard_status_t view_spans(const struct rs_shardmap *map, int pos, int tensor,
                                   struct spans *s)
{
    const struct rs_layout *l = map->layout;
    int64_t shape[RS_MAX_DIMS];
    if (!shard_shape(map, pos, shape))
        return RESHARD_OK;
    const struct rs_view *v = &l->view;
    int nd = v->ndim ? v->ndim : l->ndim;
    const int64_t *vs = v->ndim ? v->shape : shape;
    int64_t st[RS_MAX_DIMS];
    for (int d = nd - 1; d >= 0; d--)
        st[d] = v->nstrides ? v->strides[d] : d == nd - 1 ? 1 : st[d + 1] * vs[d + 1];
    int k = nd; /* the dims from k on are one contiguous run */
    int64_t run = 1;
    while (k > 0 && st[k - 1] == run) {
        run *= vs[k - 1];
        k--;
    }
    int64_t outer = 1;
    for (int d = 0; d < k; d++)
        outer *= vs[d];
    if (outer > MAX_SPANS_PER_VIEW) {
        s->skipped = 1;
        return RESHARD_OK;
    }
    int64_t idx[RS_MAX_DIMS] = {0};
    for (int64_t i = 0; i < outer; i++) {
        int64_t at = v->offset;
        for (int d = 0; d < k; d++)
            at += idx[d] * st[d];
        struct span *g = rs_grow(s->v, &s->cap, s->n + 1, sizeof(*g), "manifest buffers");
        if (!g)
            return RESHARD_ERR_NO_MEMORY;
        s->v = g;
        s->v[s->n++] = (struct span){at, at + run, tensor};
        for (int d = k - 1; d >= 0 && ++idx[d] == vs[d]; d--)
            idx[d] = 0;
    }
    return RESHARD_OK;
}

static int cmp_span(const void *a, const void *b)
{
    const struct span *p = a, *q = b;
    return p->lo < q->lo ? -1 : p->lo > q->lo;
}

/* The spans of the group on one rank: no element in two views. */
static reshard_status_t check_rank(const struct reshard_manifest *m, const char *path, int side,
                                   const int *ids, const int *pos,
                                   const struct rs_shardmap *const *maps, int n, int rank,
                                   struct spans *s)
{
    s->n = 0;
    for (int i = 0; i < n; i++)
        if (pos[i] >= 0)
            RS_CHECK(view_spans(maps[i], pos[i], ids[i], s));
    if (s->n < 2)
        return RESHARD_OK;
    qsort(s->v, s->n, sizeof(*s->v), cmp_span);
    const struct span *reach = &s->v[0]; /* the span reaching furthest so far */
    for (size_t i = 1; i < s->n; i++) {
        const struct span *x = &s->v[i];
        if (x->lo < reach->hi && x->tensor != reach->tensor) {
            const char *which = side ? "dst" : "src";
            return rs_error(RESHARD_ERR_VIEW,
                            "manifest %s: tensors[%d] (%s).%s and tensors[%d] (%s).%s overlap in "
                            "buffer '%s' on rank %d (elements %lld to %lld)",
                            path, reach->tensor, m->names[reach->tensor], which, x->tensor,
                            m->names[x->tensor], which,
                            side_layout(m, x->tensor, side)->view.buffer, rank, (long long)x->lo,
                            (long long)(x->hi < reach->hi ? x->hi : reach->hi) - 1);
        }
        if (x->hi > reach->hi)
            reach = x;
    }
    return RESHARD_OK;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Combinations of tuples already checked, n ints each, in an open-addressing set. */
struct seen {
    int *keys;
    size_t cap; /* keys held */
    size_t width;
    struct rs_hindex index;
};

static uint64_t hash_key(const int *k, size_t n)
{
    uint64_t h = 0x9e3779b97f4a7c15u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint32_t)k[i]) * 0x100000001b3u;
    return h ^ (h >> 31);
}

static uint64_t seen_hash_of(void *arg, size_t i)
{
    const struct seen *s = arg;
    return hash_key(s->keys + i * s->width, s->width);
}

struct seen_probe {
    const struct seen *s;
    const int *key;
};

static int seen_eq(void *arg, size_t i)
{
    const struct seen_probe *q = arg;
    return !memcmp(q->s->keys + i * q->s->width, q->key, q->s->width * sizeof(int));
}

/* *was: 1 when key was there already, 0 when it was added. */
static reshard_status_t seen_add(struct seen *s, const int *key, int *was)
{
    size_t count = s->index.count;
    *was = 0;
    if (count == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 32;
        int *keys = realloc(s->keys, cap * s->width * sizeof(int));
        if (!keys)
            return rs_error(RESHARD_ERR_NO_MEMORY, "out of memory checking manifest buffers");
        s->keys = keys;
        s->cap = cap;
    }
    RS_CHECK(rs_hindex_fit(&s->index, seen_hash_of, s));
    struct seen_probe q = {s, key};
    size_t at;
    *was = rs_hindex_find(&s->index, hash_key(key, s->width), seen_eq, &q, &at) >= 0;
    if (!*was) {
        memcpy(s->keys + count * s->width, key, s->width * sizeof(int));
        rs_hindex_put(&s->index, at, count);
    }
    return RESHARD_OK;
}

/* Tensors ids[0 .. n) share one buffer on one side. */
static reshard_status_t check_group(const struct reshard_manifest *m, const char *path, int side,
                                    const int *ids, int n, struct spans *s)
{
    struct group_maps g = {0};
    const struct rs_shardmap **maps = rs_calloc((size_t)n, sizeof(*maps), "manifest buffers");
    int *pos = rs_calloc((size_t)n, sizeof(int), "manifest buffers");
    int *key = rs_calloc((size_t)n, sizeof(int), "manifest buffers");
    int *ranks = NULL;
    struct seen seen = {.width = (size_t)n};
    size_t nr = 0;
    reshard_status_t st = maps && pos && key ? RESHARD_OK : RESHARD_ERR_NO_MEMORY;
    for (int i = 0; i < n && st == RESHARD_OK; i++) {
        st = map_of(&g, side_layout(m, ids[i], side), &maps[i]);
        nr += st == RESHARD_OK ? (size_t)maps[i]->layout->nranks : 0;
    }
    if (st == RESHARD_OK && !(ranks = rs_calloc(nr, sizeof(int), "manifest buffers")))
        st = RESHARD_ERR_NO_MEMORY;
    nr = 0; /* the union of the group's ranks, each layout's list once */
    for (int i = 0; i < g.n && st == RESHARD_OK; i++) {
        memcpy(ranks + nr, g.layout[i]->ranks, (size_t)g.layout[i]->nranks * sizeof(int));
        nr += (size_t)g.layout[i]->nranks;
    }
    if (st == RESHARD_OK)
        qsort(ranks, nr, sizeof(int), cmp_int);
    for (size_t k = 0; k < nr && st == RESHARD_OK; k++) {
        if (k && ranks[k] == ranks[k - 1])
            continue;
        for (int i = 0; i < n; i++) {
            pos[i] = shardmap_position(maps[i], ranks[k]);
            key[i] = pos[i] < 0 ? -1 : maps[i]->tuple[pos[i]];
        }
        int was;
        if ((st = seen_add(&seen, key, &was)) == RESHARD_OK && !was)
            st = check_rank(m, path, side, ids, pos, maps, n, ranks[k], s);
    }
    free(seen.keys);
    rs_hindex_free(&seen.index);
    free(ranks);
    free(key);
    free(pos);
    free(maps);
    maps_free(&g);
    return st;
}

struct by_buffer {
    const struct reshard_manifest *m;
    int side;
};

static int cmp_buffer(const void *a, const void *b, void *arg)
{
    const struct by_buffer *c = arg;
    int x = *(const int *)a, y = *(const int *)b;
    int d = strcmp(side_layout(c->m, x, c->side)->view.buffer,
                   side_layout(c->m, y, c->side)->view.buffer);
    return d ? d : (x > y) - (x < y);
}

static reshard_status_t check_overlaps(const struct reshard_manifest *m, const char *path)
{
    int *ids = rs_calloc((size_t)m->ntensors, sizeof(int), "manifest buffers");
    struct spans s = {0};
    reshard_status_t st = ids ? RESHARD_OK : RESHARD_ERR_NO_MEMORY;
    for (int side = 0; side < 2 && st == RESHARD_OK; side++) {
        int n = 0;
        for (int t = 0; t < m->ntensors; t++)
            if (side_layout(m, t, side)->view.buffer[0])
                ids[n++] = t;
        struct by_buffer ctx = {m, side};
        qsort_r(ids, (size_t)n, sizeof(int), cmp_buffer, &ctx);
        for (int i = 0, j; i < n && st == RESHARD_OK; i = j) {
            const char *name = side_layout(m, ids[i], side)->view.buffer;
            for (j = i + 1; j < n && !strcmp(side_layout(m, ids[j], side)->view.buffer, name);)
                j++;
            if (j - i > 1)
                st = check_group(m, path, side, ids + i, j - i, &s);
        }
    }
    if (s.skipped && st == RESHARD_OK)
        rs_log(RS_LOG_INFO, "manifest %s: a view with over %d runs was not checked for overlaps",
               path, MAX_SPANS_PER_VIEW);
    free(s.v);
    free(ids);
    return st;
}

/* The lowest rank of the tuple at map position's tuple t. */
static int lowest_rank(const struct rs_shardmap *map, int t)
{
    int low = -1;
    for (int i = map->tuple_first[t]; i < map->tuple_first[t + 1]; i++) {
        int r = map->layout->ranks[map->tuple_pos[i]];
        if (low < 0 || r < low)
            low = r;
    }
    return low;
}

/* One side's view against the buffer's size, once per tuple; the error names the lowest rank
 * whose view reaches past it. */
static reshard_status_t check_size(const struct reshard_manifest *m, const char *path, int t,
                                   int side, int64_t have)
{
    const struct rs_layout *l = side_layout(m, t, side);
    struct rs_shardmap map;
    RS_CHECK(shardmap_build(l, &map, NULL));
    size_t es = dtype_size(l->dtype);
    int worst = -1;
    int64_t reach = 0;
    for (int u = 0; u < map.ntuples; u++) {
        int64_t shape[RS_MAX_DIMS];
        int pos = map.tuple_pos[map.tuple_first[u]];
        if (!shard_shape(&map, pos, shape))
            continue;
        int64_t elems = (int64_t)(region_span_bytes(l, shape) / es);
        int low = lowest_rank(&map, u);
        if (elems > have && (worst < 0 || low < worst)) {
            worst = low;
            reach = elems;
        }
    }
    shardmap_free(&map);
    if (worst < 0)
        return RESHARD_OK;
    return rs_error(RESHARD_ERR_VIEW,
                    "manifest %s: tensors[%d] (%s).%s: its view reaches element %lld of buffer "
                    "'%s', which holds %lld (rank %d)",
                    path, t, m->names[t], side ? "dst" : "src", (long long)reach - 1,
                    l->view.buffer, (long long)have, worst);
}

static reshard_status_t check_sizes(const struct reshard_manifest *m, const char *path,
                                    const struct json_fns *j, const json_t *buffers)
{
    struct where w = {.file = path, .index = -1};
    if (!buffers)
        return RESHARD_OK;
    if (!json_is_object(buffers))
        return manifest_bad(&w, "buffers", RESHARD_ERR_SPEC_SYNTAX,
                            "must be an object of buffer names and sizes in elements");
    for (void *it = j->object_iter((json_t *)buffers); it;
         it = j->object_iter_next((json_t *)buffers, it)) {
        const json_t *v = j->object_iter_value(it);
        if (!json_is_integer(v) || j->integer_value(v) < 0)
            return manifest_bad(&w, "buffers", RESHARD_ERR_SPEC_SYNTAX,
                                "'%s' must be a size in elements (a non-negative integer)",
                                j->object_iter_key(it));
    }
    for (int t = 0; t < m->ntensors; t++)
        for (int side = 0; side < 2; side++) {
            const struct rs_layout *l = side_layout(m, t, side);
            const json_t *size = l->view.buffer[0] ? j->object_get(buffers, l->view.buffer) : NULL;
            if (size)
                RS_CHECK(check_size(m, path, t, side, j->integer_value(size)));
        }
    return RESHARD_OK;
}

reshard_status_t manifest_check_buffers(const struct reshard_manifest *m, const char *path,
                                        const struct json_fns *j, const json_t *buffers)
{
    RS_CHECK(check_overlaps(m, path));
    return check_sizes(m, path, j, buffers);
}
