/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The plan's cache: every distinct rank list, and every distinct layout with its shard map and
 * tuple domains, stored once. A model repeats a few layouts over thousands of tensors, and the
 * lists grow with the world (an inference side of 4,096 ranks names them all in every tensor):
 * kept per tensor, they would make a rank's plan grow with the world.
 */
#include "plan_build.h"

#include "spec.h"
#include "base/error.h"
#include "base/hindex.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct rank_list {
    int n;
    int *ranks; /* owned */
    uint64_t hash;
};

struct plan_cache {
    struct rank_list **lists;
    size_t nlists, lists_cap;
    struct rs_hindex list_index;
    struct plan_side **sides;
    size_t nsides, sides_cap;
    struct rs_hindex side_index;
    /* Input arrays already interned, by address: callers that share one array between
     * layouts (a manifest does) pay for hashing it once. */
    struct seen_array {
        const int *ranks;
        int n;
        struct rank_list *list;
    } * arrays;
    size_t narrays, arrays_cap; /* cap: a power of two, at most half full */
};

static uint64_t mix(uint64_t h, uint64_t v)
{
    h = (h ^ v) * UINT64_C(0x9e3779b97f4a7c15);
    return h ^ (h >> 29);
}

static uint64_t mix_string(uint64_t h, const char *s)
{
    size_t n = strlen(s);
    for (size_t i = 0; i < n; i += 8) {
        uint64_t w = 0;
        memcpy(&w, s + i, n - i < 8 ? n - i : 8);
        h = mix(h, w);
    }
    return mix(h, n);
}

static uint64_t list_hash_of(void *arg, size_t i)
{
    return ((struct plan_cache *)arg)->lists[i]->hash;
}

static uint64_t side_hash_of(void *arg, size_t i)
{
    return ((struct plan_cache *)arg)->sides[i]->key;
}

/* What intern_ranks looks for. */
struct list_probe {
    const struct plan_cache *c;
    const int *ranks;
    int n;
    uint64_t hash;
};

static int list_eq(void *arg, size_t i)
{
    const struct list_probe *q = arg;
    const struct rank_list *l = q->c->lists[i];
    return l->hash == q->hash && l->n == q->n &&
           !memcmp(l->ranks, q->ranks, (size_t)q->n * sizeof(int));
}

static uint64_t hash_ranks(const int *r, int n)
{
    uint64_t h = mix(UINT64_C(0x72616e6b73), (uint64_t)n);
    for (int i = 0; i < n; i++)
        h = mix(h, (uint64_t)(uint32_t)r[i]);
    return h;
}

static reshard_status_t cache_get(struct rs_plan *p, struct plan_cache **out)
{
    if (!p->cache && !(p->cache = rs_calloc(1, sizeof(*p->cache), "plan cache")))
        return RESHARD_ERR_NO_MEMORY;
    *out = p->cache;
    return RESHARD_OK;
}

static size_t array_slot(const struct plan_cache *c, const int *ranks)
{
    uint64_t h = mix(0, (uint64_t)(uintptr_t)ranks);
    size_t at = h & (c->arrays_cap - 1);
    while (c->arrays[at].ranks && c->arrays[at].ranks != ranks)
        at = (at + 1) & (c->arrays_cap - 1);
    return at;
}

/* Remembers that the array at ranks interned to list. */
static reshard_status_t remember_array(struct plan_cache *c, const int *ranks, int n,
                                       struct rank_list *list)
{
    if (2 * (c->narrays + 1) > c->arrays_cap) {
        struct plan_cache grown = {.arrays_cap = c->arrays_cap ? 2 * c->arrays_cap : 64};
        grown.arrays = rs_calloc(grown.arrays_cap, sizeof(*grown.arrays), "plan cache");
        if (!grown.arrays)
            return RESHARD_ERR_NO_MEMORY;
        for (size_t i = 0; i < c->arrays_cap; i++)
            if (c->arrays[i].ranks)
                grown.arrays[array_slot(&grown, c->arrays[i].ranks)] = c->arrays[i];
        free(c->arrays);
        c->arrays = grown.arrays;
        c->arrays_cap = grown.arrays_cap;
    }
    c->arrays[array_slot(c, ranks)] = (struct seen_array){ranks, n, list};
    c->narrays++;
    return RESHARD_OK;
}

/* The interned list equal to ranks[0 .. n). */
static reshard_status_t intern_ranks(struct plan_cache *c, const int *ranks, int n,
                                     struct rank_list **out)
{
    if (c->arrays_cap) {
        const struct seen_array *a = &c->arrays[array_slot(c, ranks)];
        if (a->ranks == ranks && a->n == n) {
            *out = a->list;
            return RESHARD_OK;
        }
    }
    uint64_t h = hash_ranks(ranks, n);
    RS_CHECK(rs_hindex_fit(&c->list_index, list_hash_of, c));
    struct list_probe q = {c, ranks, n, h};
    size_t at;
    long found = rs_hindex_find(&c->list_index, h, list_eq, &q, &at);
    if (found < 0) {
        struct rank_list **v =
            rs_grow(c->lists, &c->lists_cap, c->nlists + 1, sizeof(*v), "plan rank lists");
        if (!v)
            return RESHARD_ERR_NO_MEMORY;
        c->lists = v;
        struct rank_list *l = rs_calloc(1, sizeof(*l), "plan rank list");
        int *copy = l ? rs_calloc((size_t)n, sizeof(int), "plan rank list") : NULL;
        if (!copy) {
            free(l);
            return RESHARD_ERR_NO_MEMORY;
        }
        memcpy(copy, ranks, (size_t)n * sizeof(int));
        *l = (struct rank_list){n, copy, h};
        found = (long)c->nlists;
        c->lists[c->nlists++] = l;
        rs_hindex_put(&c->list_index, at, (size_t)found);
    }
    *out = c->lists[found];
    return remember_array(c, ranks, n, *out);
}

/* Layouts compare field by field; rank lists by their interned pointer. */
static int same_layout(const struct rs_layout *a, const struct rs_layout *b)
{
    if (a->ndim != b->ndim || a->dtype != b->dtype || a->nranks != b->nranks ||
        a->ranks != b->ranks || a->mesh_ndim != b->mesh_ndim ||
        memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof(a->shape[0])) ||
        memcmp(a->mesh, b->mesh, (size_t)a->mesh_ndim * sizeof(a->mesh[0])))
        return 0;
    for (int m = 0; m < a->mesh_ndim; m++)
        if (a->place[m].kind != b->place[m].kind || a->place[m].dim != b->place[m].dim ||
            a->place[m].k != b->place[m].k)
            return 0;
    if (a->quant.kind != b->quant.kind || a->quant.rows != b->quant.rows ||
        a->quant.cols != b->quant.cols)
        return 0;
    const struct rs_view *u = &a->view, *v = &b->view;
    return !strcmp(u->buffer, v->buffer) && u->offset == v->offset && u->ndim == v->ndim &&
           u->nstrides == v->nstrides &&
           !memcmp(u->shape, v->shape, (size_t)u->ndim * sizeof(u->shape[0])) &&
           !memcmp(u->strides, v->strides, (size_t)u->nstrides * sizeof(u->strides[0]));
}

/* What plan_side_get looks for. */
struct side_probe {
    const struct plan_cache *c;
    const struct rs_layout *layout;
    uint64_t key;
};

static int side_eq(void *arg, size_t i)
{
    const struct side_probe *q = arg;
    const struct plan_side *s = q->c->sides[i];
    return s->key == q->key && same_layout(&s->layout, q->layout);
}

/* Every field of the canonical form; the rank list by its hash. The same on every rank. */
static uint64_t layout_key(const struct rs_layout *l, uint64_t ranks_hash)
{
    uint64_t h = mix(UINT64_C(0x6c61796f7574), (uint64_t)l->ndim);
    for (int d = 0; d < l->ndim; d++)
        h = mix(h, (uint64_t)l->shape[d]);
    h = mix(mix(h, (uint64_t)l->dtype), ranks_hash);
    h = mix(h, (uint64_t)l->mesh_ndim);
    for (int m = 0; m < l->mesh_ndim; m++) {
        h = mix(h, (uint64_t)l->mesh[m]);
        h = mix(h, (uint64_t)l->place[m].kind << 32 | (uint32_t)l->place[m].dim);
        h = mix(h, (uint64_t)l->place[m].k);
    }
    const struct rs_view *v = &l->view;
    h = mix(mix_string(h, v->buffer), (uint64_t)v->offset);
    h = mix(h, (uint64_t)v->ndim << 32 | (uint32_t)v->nstrides);
    for (int d = 0; d < v->ndim; d++)
        h = mix(h, (uint64_t)v->shape[d]);
    for (int d = 0; d < v->nstrides; d++)
        h = mix(h, (uint64_t)v->strides[d]);
    h = mix(h, (uint64_t)l->quant.kind);
    return mix(mix(h, (uint64_t)l->quant.rows), (uint64_t)l->quant.cols);
}

/* Prefixes the message of a failed layout check with the tensor and side. */
static reshard_status_t blame(reshard_status_t st, const char *name, const char *what)
{
    struct rs_saved_error msg;
    rs_error_save(&msg);
    return rs_error(st, "tensor '%s' %s: %s", name, what, msg.msg);
}

reshard_status_t plan_cache_side(struct rs_plan *p, const struct rs_layout *l, const char *name,
                                 const char *what, struct plan_side **out)
{
    struct plan_cache *c;
    struct rank_list *list;
    RS_CHECK(cache_get(p, &c));
    if (l->nranks < 1 || !l->ranks) { /* the layout check says so, with its message */
        struct rs_shardmap none;
        return blame(shardmap_build(l, &none, NULL), name, what);
    }
    RS_CHECK(intern_ranks(c, l->ranks, l->nranks, &list));
    struct rs_layout probe = *l;
    probe.ranks = list->ranks;
    uint64_t key = layout_key(&probe, list->hash);
    RS_CHECK(rs_hindex_fit(&c->side_index, side_hash_of, c));
    struct side_probe q = {c, &probe, key};
    size_t at;
    long found = rs_hindex_find(&c->side_index, key, side_eq, &q, &at);
    if (found >= 0) {
        *out = c->sides[found];
        return RESHARD_OK;
    }
    struct plan_side **v =
        rs_grow(c->sides, &c->sides_cap, c->nsides + 1, sizeof(*v), "plan layouts");
    if (!v)
        return RESHARD_ERR_NO_MEMORY;
    c->sides = v;
    struct plan_side *s = rs_calloc(1, sizeof(*s), "plan layout");
    if (!s)
        return RESHARD_ERR_NO_MEMORY;
    s->layout = probe;
    s->key = key;
    for (size_t i = c->nsides; i-- > 0 && !s->like;) /* the newest first: models repeat nearby */
        if (!c->sides[i]->like && shardmap_same_ranks(&c->sides[i]->layout, &s->layout))
            s->like = c->sides[i];
    reshard_status_t st = s->like ? shardmap_build_like(&s->layout, &s->like->map, &s->map, NULL)
                                  : shardmap_build(&s->layout, &s->map, NULL);
    if (st != RESHARD_OK) {
        free(s);
        return blame(st, name, what);
    }
    rs_hindex_put(&c->side_index, at, c->nsides);
    c->sides[c->nsides++] = s;
    *out = s;
    return RESHARD_OK;
}

reshard_status_t plan_side_tdoms(struct rs_plan *p, struct plan_side *s, unsigned role,
                                 const struct tuple_domains **out)
{
    int k = role == TOPO_DST;
    if (s->like)
        s = s->like;
    if (!s->has_td[k]) {
        RS_CHECK(tdom_build(&s->map, &p->topo, role, &s->td[k]));
        s->has_td[k] = 1;
    }
    *out = &s->td[k];
    return RESHARD_OK;
}

uint64_t plan_side_hash(const struct plan_side *s)
{
    return s->key;
}

void plan_cache_free(struct plan_cache *c)
{
    if (!c)
        return;
    for (size_t i = c->nsides; i-- > 0;) { /* borrowers before the maps they borrow from */
        shardmap_free(&c->sides[i]->map);
        tdom_free(&c->sides[i]->td[0]);
        tdom_free(&c->sides[i]->td[1]);
        free(c->sides[i]);
    }
    for (size_t i = 0; i < c->nlists; i++) {
        free(c->lists[i]->ranks);
        free(c->lists[i]);
    }
    free(c->sides);
    free(c->lists);
    rs_hindex_free(&c->side_index);
    rs_hindex_free(&c->list_index);
    free(c->arrays);
    free(c);
}
