/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Plan builder, first half: checks the inputs, finds the overlap cells of every tensor, serves
 * each destination domain from inside itself where a source there holds the cell (local first)
 * and queues the rest as network units for plan_net.c.
 */
#include "plan.h"

#include "plan_build.h"
#include "spec.h"
#include "base/clock.h"
#include "base/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *plan_op_kind_name(enum plan_op_kind k)
{
    switch (k) {
    case PLAN_OP_SELF:
        return "self";
    case PLAN_OP_LOCAL:
        return "local";
    case PLAN_OP_NET:
        return "net";
    case PLAN_OP_FWD:
        return "fwd";
    }
    return "?";
}

/* One 64-bit word into a hash (multiply-xorshift, a word at a time). */
static uint64_t mix(uint64_t h, uint64_t v)
{
    h = (h ^ v) * UINT64_C(0x9e3779b97f4a7c15);
    return h ^ (h >> 29);
}

reshard_status_t plan_push_box(struct rs_plan *p, int ndim, const int64_t *start,
                               const int64_t *len, uint32_t *box)
{
    size_t need = p->ncoords + 2 * (size_t)ndim;
    if (need > UINT32_MAX)
        return rs_error(RESHARD_ERR_TOO_LARGE, "plan: more than 2^32 box coordinates");
    if (need > p->coords_cap) {
        int64_t *c = rs_grow(p->coords, &p->coords_cap, need, sizeof(int64_t), "plan boxes");
        if (!c)
            return RESHARD_ERR_NO_MEMORY;
        p->coords = c;
    }
    memcpy(p->coords + p->ncoords, start, (size_t)ndim * sizeof(int64_t));
    memcpy(p->coords + p->ncoords + ndim, len, (size_t)ndim * sizeof(int64_t));
    *box = (uint32_t)p->ncoords;
    p->ncoords = need;
    return RESHARD_OK;
}

reshard_status_t plan_push_op(struct rs_plan *p, enum plan_op_kind kind, uint32_t tensor, int src,
                              int dst, uint32_t box, uint32_t parent)
{
    if (p->nops == UINT32_MAX) /* FWD ops name their parent by a 32-bit index */
        return rs_error(RESHARD_ERR_TOO_LARGE, "plan: more than 2^32 ops");
    if (p->nops == p->ops_cap) {
        struct plan_op *o = rs_grow(p->ops, &p->ops_cap, p->nops + 1, sizeof(*o), "plan ops");
        if (!o)
            return RESHARD_ERR_NO_MEMORY;
        p->ops = o;
    }
    uint64_t h = mix(p->hash, (uint64_t)kind << 32 | tensor);
    h = mix(h, (uint64_t)(uint32_t)src << 32 | (uint32_t)dst);
    h = mix(h, parent);
    for (int k = 0; k < 2 * p->tensors[tensor].dst.ndim; k++)
        h = mix(h, (uint64_t)p->coords[box + k]);
    p->hash = h;
    p->ops[p->nops++] = (struct plan_op){.box = box,
                                         .tensor = tensor,
                                         .parent = parent,
                                         .src = src,
                                         .dst = dst,
                                         .kind = (uint8_t)kind};
    return RESHARD_OK;
}

static void format_shape(char *buf, size_t n, const struct rs_layout *l)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int d = 0; d < l->ndim && used < n; d++)
        used +=
            (size_t)snprintf(buf + used, n - used, "%s%lld", d ? "x" : "", (long long)l->shape[d]);
}

static reshard_status_t check_pair(const struct plan_tensor *t, const struct rs_topo *topo)
{
    const struct rs_layout *s = &t->src, *d = &t->dst;
    int same = s->ndim == d->ndim;
    for (int j = 0; same && j < s->ndim; j++)
        same = s->shape[j] == d->shape[j];
    if (!same) {
        char a[160], b[160];
        format_shape(a, sizeof(a), s);
        format_shape(b, sizeof(b), d);
        return rs_error(RESHARD_ERR_MISMATCH,
                        "tensor '%s': source shape %s differs from destination shape %s", t->name,
                        a, b);
    }
    if (s->dtype != d->dtype)
        return rs_error(RESHARD_ERR_MISMATCH,
                        "tensor '%s': source dtype %s differs from destination dtype %s", t->name,
                        dtype_name(s->dtype), dtype_name(d->dtype));
    for (int side = 0; side < 2; side++) {
        const struct rs_layout *l = side ? d : s;
        for (int i = 0; i < l->nranks; i++)
            if (l->ranks[i] >= topo->nranks)
                return rs_error(RESHARD_ERR_RANK_RANGE,
                                "tensor '%s': %s rank %d is outside the communicator of %d ranks",
                                t->name, side ? "destination" : "source", l->ranks[i],
                                topo->nranks);
    }
    return RESHARD_OK;
}

/* Prefixes the message of a failed layout check with the tensor and side. */
static reshard_status_t blame(reshard_status_t st, const char *name, const char *side)
{
    char msg[RS_ERROR_MAX];
    snprintf(msg, sizeof(msg), "%s", rs_error_message());
    return rs_error(st, "tensor '%s' %s: %s", name, side, msg);
}

static int same_layout(const struct rs_layout *a, const struct rs_layout *b)
{
    if (a->ndim != b->ndim || a->dtype != b->dtype || a->nranks != b->nranks ||
        a->mesh_ndim != b->mesh_ndim ||
        memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof(a->shape[0])) ||
        memcmp(a->mesh, b->mesh, (size_t)a->mesh_ndim * sizeof(a->mesh[0])) ||
        memcmp(a->ranks, b->ranks, (size_t)a->nranks * sizeof(a->ranks[0])))
        return 0;
    for (int m = 0; m < a->mesh_ndim; m++)
        if (a->place[m].kind != b->place[m].kind || a->place[m].dim != b->place[m].dim ||
            a->place[m].k != b->place[m].k)
            return 0;
    const struct rs_view *u = &a->view, *v = &b->view;
    return !strcmp(u->buffer, v->buffer) && u->offset == v->offset && u->ndim == v->ndim &&
           u->nstrides == v->nstrides &&
           !memcmp(u->shape, v->shape, (size_t)u->ndim * sizeof(u->shape[0])) &&
           !memcmp(u->strides, v->strides, (size_t)u->nstrides * sizeof(u->strides[0]));
}

#define MAP_LOOKBACK 16 /* earlier tensors whose maps a new one may share */

/* Tensor i's map of one side (dst when dst): an earlier tensor's when their layouts are
 * equal, else built. */
static reshard_status_t side_map(struct rs_plan *p, int i, int dst)
{
    struct plan_tensor *t = &p->tensors[i];
    struct rs_layout *l = dst ? &t->dst : &t->src;
    for (int j = i - 1; j >= 0 && j >= i - MAP_LOOKBACK; j--) {
        const struct plan_tensor *u = &p->tensors[j];
        for (int side = 0; side < 2; side++) {
            const struct rs_shardmap *m = side ? &u->dst_map : &u->src_map;
            if (m->layout && same_layout(side ? &u->dst : &u->src, l)) {
                *(dst ? &t->dst_map : &t->src_map) = *m; /* its layout is equal to ours */
                *(dst ? &t->dst_shared : &t->src_shared) = 1;
                return RESHARD_OK;
            }
        }
    }
    reshard_status_t st = shardmap_build(l, dst ? &t->dst_map : &t->src_map, NULL);
    return st == RESHARD_OK ? st : blame(st, t->name, dst ? "destination" : "source");
}

static reshard_status_t add_tensor(struct rs_plan *p, int i, const struct plan_input *in)
{
    struct plan_tensor *t = &p->tensors[i];
    char fallback[32];
    snprintf(fallback, sizeof(fallback), "t%d", i);
    const char *name = in->name ? in->name : fallback;
    t->name = rs_calloc(strlen(name) + 1, 1, "tensor name");
    if (!t->name)
        return RESHARD_ERR_NO_MEMORY;
    memcpy(t->name, name, strlen(name) + 1);
    if (!in->src || !in->dst)
        return rs_error(RESHARD_ERR_INVALID_ARG, "tensor '%s': missing %s layout", t->name,
                        in->src ? "destination" : "source");
    RS_CHECK(layout_copy(in->src, &t->src));
    RS_CHECK(layout_copy(in->dst, &t->dst));
    RS_CHECK(side_map(p, i, 0));
    RS_CHECK(side_map(p, i, 1));
    return check_pair(t, &p->topo);
}

static reshard_status_t push_unit(struct build *b, const struct net_unit *u)
{
    struct net_unit *v =
        rs_grow(b->units, &b->units_cap, b->nunits + 1, sizeof(*v), "network units");
    if (!v)
        return RESHARD_ERR_NO_MEMORY;
    b->units = v;
    b->units[b->nunits++] = *u;
    return RESHARD_OK;
}

/* The cell is held inside the needers' domain: each needer copies it from itself when it
 * holds it already, else from the least busy holder there. */
static reshard_status_t serve_locally(struct build *b, uint32_t t, const struct grid_cursor *c,
                                      const struct tdom_run *need, const struct tdom_run *have,
                                      uint32_t box, int64_t bytes)
{
    const struct overlap *w = &b->ov;
    const struct rs_shardmap *src_map = &b->plan->tensors[t].src_map;
    for (int i = need->begin; i < need->end; i++) {
        int n = w->dst_td.rank[i];
        int pos = shardmap_position(src_map, n);
        if (pos >= 0 && src_map->tuple[pos] == c->src_tuple) {
            RS_CHECK(plan_push_op(b->plan, PLAN_OP_SELF, t, n, n, box, PLAN_NO_PARENT));
            continue;
        }
        int best = w->src_td.rank[have->begin];
        for (int k = have->begin + 1; k < have->end; k++) {
            int h = w->src_td.rank[k];
            if (b->local_out[h] < b->local_out[best])
                best = h;
        }
        b->local_out[best] += bytes;
        RS_CHECK(plan_push_op(b->plan, PLAN_OP_LOCAL, t, best, n, box, PLAN_NO_PARENT));
    }
    return RESHARD_OK;
}

/* Tensor t needs a piece that only the (absent) ranks of source tuple `tuple` held: named in
 * the error, the first one with its holders. */
static void note_lost(struct build *b, uint32_t t, int tuple)
{
    const struct plan_tensor *pt = &b->plan->tensors[t];
    size_t n = strlen(b->lost);
    if (b->nlost++ == 0) {
        const struct rs_shardmap *m = &pt->src_map;
        int many = m->tuple_first[tuple + 1] - m->tuple_first[tuple] > 1;
        n += (size_t)snprintf(b->lost + n, sizeof(b->lost) - n, "'%s' (held by rank%s", pt->name,
                              many ? "s" : "");
        for (int i = m->tuple_first[tuple]; i < m->tuple_first[tuple + 1] && n < sizeof(b->lost);
             i++)
            n += (size_t)snprintf(b->lost + n, sizeof(b->lost) - n, "%s %d",
                                  i > m->tuple_first[tuple] ? "," : "",
                                  pt->src.ranks[m->tuple_pos[i]]);
        if (n < sizeof(b->lost))
            snprintf(b->lost + n, sizeof(b->lost) - n, " only)");
    } else if (n < sizeof(b->lost)) {
        snprintf(b->lost + n, sizeof(b->lost) - n, ", '%s'", pt->name);
    }
}

/* Finds the cells of tensor t (its overlap already built): serves what is held locally,
 * queues the rest as units. */
static reshard_status_t plan_tensor_cells(struct build *b, uint32_t t)
{
    struct overlap *w = &b->ov;
    const struct plan_tensor *pt = &b->plan->tensors[t];
    int ndim = pt->dst.ndim;

    int lost_tuple = -1;
    struct grid_cursor c;
    grid_first(&w->grid, &c);
    do {
        int64_t start[RS_MAX_DIMS], len[RS_MAX_DIMS];
        int64_t bytes = c.volume * b->esize;
        uint32_t box = PLAN_NO_BOX; /* pushed once, shared by every op that moves the whole cell */
        for (int r = w->dst_td.run_first[c.dst_tuple]; r < w->dst_td.run_first[c.dst_tuple + 1];
             r++) {
            const struct tdom_run *need = &w->dst_td.runs[r];
            if (box == PLAN_NO_BOX) {
                grid_cell_box(&w->grid, &c, start, len);
                RS_CHECK(plan_push_box(b->plan, ndim, start, len, &box));
            }
            int h = tdom_find(&w->src_td, c.src_tuple, need->domain);
            if (h >= 0) {
                RS_CHECK(serve_locally(b, t, &c, need, &w->src_td.runs[h], box, bytes));
            } else if (w->src_td.run_first[c.src_tuple] == w->src_td.run_first[c.src_tuple + 1]) {
                lost_tuple = c.src_tuple; /* its holders are all absent */
            } else {
                struct net_unit u = {bytes, box, t, c.src_tuple, r};
                RS_CHECK(push_unit(b, &u));
            }
        }
    } while (grid_next(&w->grid, &c));
    if (lost_tuple >= 0)
        note_lost(b, t, lost_tuple);
    return RESHARD_OK;
}

static uint64_t mix_string(uint64_t h, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i += 8) {
        uint64_t w = 0;
        memcpy(&w, s + i, n - i < 8 ? n - i : 8);
        h = mix(h, w);
    }
    return mix(h, n);
}

/* The canonical spec covers all of a layout: ranks, mesh, placements and the local view
 * (an executor addresses buffers through it). */
static reshard_status_t mix_layout(uint64_t *h, const struct rs_layout *l)
{
    char small[512], *buf = small;
    size_t n = spec_format(l, small, sizeof(small));
    if (n >= sizeof(small)) {
        if (!(buf = rs_calloc(n + 1, 1, "plan hash")))
            return RESHARD_ERR_NO_MEMORY;
        spec_format(l, buf, n + 1);
    }
    *h = mix_string(*h, buf, n);
    if (buf != small)
        free(buf);
    return RESHARD_OK;
}

/* What every rank must agree on: the ops (hashed as they are pushed, while they are in
 * cache), the topology and the tensors. */
static reshard_status_t plan_hash(const struct rs_plan *p, uint64_t *out)
{
    uint64_t h = mix(p->hash, (uint64_t)p->ntensors);
    for (int r = 0; r < p->topo.nranks; r++)
        h = mix(h, (uint64_t)p->topo.domain[r] << 1 | (uint64_t)topo_absent(&p->topo, r));
    for (int t = 0; t < p->ntensors; t++) {
        const struct plan_tensor *pt = &p->tensors[t];
        h = mix_string(h, pt->name, strlen(pt->name));
        RS_CHECK(mix_layout(&h, &pt->src));
        RS_CHECK(mix_layout(&h, &pt->dst));
    }
    *out = h;
    return RESHARD_OK;
}

struct size_index {
    int64_t bytes;
    uint32_t index;
};

static int cmp_size_index(const void *a, const void *b)
{
    const struct size_index *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes < y->bytes ? 1 : -1;
    return (x->index > y->index) - (x->index < y->index);
}

/* Tensors largest first (ties in input order), so the greedy places big pieces first. */
static reshard_status_t largest_first(const struct rs_plan *p, uint32_t *order)
{
    struct size_index *v = rs_calloc((size_t)p->ntensors, sizeof(*v), "plan order");
    if (!v)
        return RESHARD_ERR_NO_MEMORY;
    for (int t = 0; t < p->ntensors; t++) {
        const struct rs_layout *l = &p->tensors[t].dst;
        v[t] = (struct size_index){layout_numel(l) * (int64_t)dtype_size(l->dtype), (uint32_t)t};
    }
    qsort(v, (size_t)p->ntensors, sizeof(*v), cmp_size_index);
    for (int t = 0; t < p->ntensors; t++)
        order[t] = v[t].index;
    free(v);
    return RESHARD_OK;
}

static void build_free(struct build *b)
{
    overlap_free(&b->ov);
    free(b->units);
    free(b->net_out);
    free(b->net_in);
    free(b->local_out);
}

/* Plans tensor t: its overlap, the local copies and the network units, then the network ops.
 * Refuses up front a tensor whose plan would pass the op limit. */
static reshard_status_t plan_tensor(struct build *b, uint32_t t)
{
    struct rs_plan *p = b->plan;
    const struct plan_tensor *pt = &p->tensors[t];
    RS_CHECK(overlap_build(&pt->src_map, &pt->dst_map, &p->topo, &b->ov));
    b->esize = (int64_t)dtype_size(pt->dst.dtype);
    int64_t least = overlap_pairs(&b->ov, &pt->dst_map);
    reshard_status_t st = RESHARD_OK;
    if (least > p->opts.max_ops - (int64_t)p->nops)
        st = rs_error(RESHARD_ERR_TOO_LARGE,
                      "plan: tensor '%s' needs at least %lld transfers, more than the %lld "
                      "left of RESHARD_PLAN_MAX_OPS; coarsen the layouts or raise the limit",
                      pt->name, (long long)least, (long long)(p->opts.max_ops - (int64_t)p->nops));
    if (st == RESHARD_OK)
        st = plan_tensor_cells(b, t);
    if (st == RESHARD_OK)
        st = plan_assign_net(b);
    overlap_free(&b->ov);
    return st;
}

static reshard_status_t plan_tensors(struct rs_plan *p)
{
    int n = p->topo.nranks;
    struct build b = {.plan = p};
    uint32_t *order = rs_calloc((size_t)p->ntensors, sizeof(uint32_t), "plan order");
    b.net_out = rs_calloc((size_t)n, sizeof(int64_t), "plan loads");
    b.net_in = rs_calloc((size_t)n, sizeof(int64_t), "plan loads");
    b.local_out = rs_calloc((size_t)n, sizeof(int64_t), "plan loads");
    reshard_status_t st = RESHARD_ERR_NO_MEMORY;
    if (!order || !b.net_out || !b.net_in || !b.local_out)
        goto free_build;
    RS_CHECK_GOTO(largest_first(p, order), st, free_build);
    for (int i = 0; i < p->ntensors; i++)
        RS_CHECK_GOTO(plan_tensor(&b, order[i]), st, free_build);
    if (b.nlost)
        st = rs_error(RESHARD_ERR_DATA_LOST,
                      "plan: %d tensor%s cannot be refit: a piece that a destination needs was "
                      "held only by ranks that left, and no replica remains: %s",
                      b.nlost, b.nlost == 1 ? "" : "s", b.lost);
free_build:
    free(order);
    build_free(&b);
    return st;
}

/* Counters hold sums over every destination copy of every tensor: keep them below 2^62. */
static reshard_status_t check_volume(const struct rs_plan *p)
{
    int64_t total = 0;
    for (int t = 0; t < p->ntensors; t++) {
        const struct rs_layout *l = &p->tensors[t].dst;
        int64_t bytes = layout_numel(l) * (int64_t)dtype_size(l->dtype), copies;
        if (__builtin_mul_overflow(bytes, (int64_t)l->nranks + 1, &copies) ||
            __builtin_add_overflow(total, copies, &total) || total > RS_MAX_BYTES)
            return rs_error(RESHARD_ERR_TOO_LARGE,
                            "plan: the tensors times their destination copies exceed 2^62 bytes "
                            "(at tensor '%s')",
                            p->tensors[t].name);
    }
    return RESHARD_OK;
}

static reshard_status_t plan_init(struct rs_plan *p, const struct plan_input *in, int ntensors,
                                  const struct rs_topo *topo, const struct plan_opts *opts)
{
    p->opts = (struct plan_opts){PLAN_SPLIT_MIN_DEFAULT, PLAN_MAX_OPS_DEFAULT};
    if (opts && opts->split_min_bytes > 0)
        p->opts.split_min_bytes = opts->split_min_bytes;
    if (opts && opts->max_ops > 0)
        p->opts.max_ops = opts->max_ops;
    p->hash = UINT64_C(0x7265736861726421); /* the running hash of the ops */
    RS_CHECK(topo_copy(topo, &p->topo));
    p->tensors = rs_calloc((size_t)ntensors, sizeof(*p->tensors), "plan tensors");
    if (!p->tensors)
        return RESHARD_ERR_NO_MEMORY;
    p->ntensors = ntensors;
    for (int t = 0; t < ntensors; t++)
        RS_CHECK(add_tensor(p, t, &in[t]));
    return check_volume(p);
}

reshard_status_t plan_build(const struct plan_input *in, int ntensors, const struct rs_topo *topo,
                            const struct plan_opts *opts, struct rs_plan **out)
{
    if (!in || ntensors < 1 || !topo || !out)
        return rs_error(RESHARD_ERR_INVALID_ARG, "plan: needs at least one tensor and a topology");
    if (ntensors > PLAN_MAX_TENSORS)
        return rs_error(RESHARD_ERR_TOO_LARGE, "plan: %d tensors, more than the %d one plan holds",
                        ntensors, PLAN_MAX_TENSORS);
    double t0 = rs_now_ms_f();
    struct rs_plan *p = rs_calloc(1, sizeof(*p), "plan");
    if (!p)
        return RESHARD_ERR_NO_MEMORY;
    reshard_status_t st;
    RS_CHECK_GOTO(plan_init(p, in, ntensors, topo, opts), st, err_free_plan);
    RS_CHECK_GOTO(plan_tensors(p), st, err_free_plan);
    RS_CHECK_GOTO(plan_hash(p, &p->hash), st, err_free_plan);
    p->plan_ms = rs_now_ms_f() - t0;
    *out = p;
    return RESHARD_OK;
err_free_plan:
    plan_free(p);
    return st;
}

void plan_free(struct rs_plan *p)
{
    if (!p)
        return;
    for (int t = 0; p->tensors && t < p->ntensors; t++) {
        struct plan_tensor *pt = &p->tensors[t];
        if (!pt->src_shared)
            shardmap_free(&pt->src_map);
        if (!pt->dst_shared)
            shardmap_free(&pt->dst_map);
        layout_free(&pt->src);
        layout_free(&pt->dst);
        free(pt->name);
    }
    free(p->tensors);
    topo_free(&p->topo);
    free(p->ops);
    free(p->coords);
    free(p);
}
