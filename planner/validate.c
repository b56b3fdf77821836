/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The plan validator. It trusts nothing the builder computed: it re-derives everything from the
 * layouts and the ops alone and proves that
 *   - each op reads from a rank that holds its box (a source shard, or for FWD a box the rank
 *     received from the network), and writes into a rank whose destination shard contains it;
 *   - ops cross the network exactly when sender and receiver sit in different domains;
 *   - the boxes written into each destination shard tile it exactly: no element twice, none
 *     missing (absent ranks neither send nor receive; a rank off as a source sends nothing, one
 *     off as a destination receives nothing);
 *   - the boxes entering each domain over the network are disjoint (each element crosses into
 *     a domain at most once).
 */
#include "validate.h"

#include "base/error.h"

#include <stdlib.h>
#include <string.h>

static reshard_status_t invalid(const struct rs_plan *p, size_t i, const char *what)
{
    const struct plan_op *op = &p->ops[i];
    const char *name = op->tensor < (uint32_t)p->ntensors ? p->tensors[op->tensor].name : "?";
    return rs_error(RESHARD_ERR_INVALID_PLAN, "plan: op %zu (%s %d -> %d, tensor '%s'): %s", i,
                    plan_op_kind_name((enum plan_op_kind)op->kind), op->src, op->dst, name, what);
}

static int box_inside(const int64_t *s, const int64_t *l, const int64_t *os, const int64_t *ol,
                      int ndim)
{
    for (int d = 0; d < ndim; d++)
        if (s[d] < os[d] || s[d] + l[d] > os[d] + ol[d])
            return 0;
    return 1;
}

static reshard_status_t check_op(const struct rs_plan *p, size_t i)
{
    const struct plan_op *op = &p->ops[i];
    const struct rs_topo *topo = &p->topo;
    if (op->tensor >= (uint32_t)p->ntensors)
        return invalid(p, i, "no such tensor");
    if (op->src < 0 || op->src >= topo->nranks || op->dst < 0 || op->dst >= topo->nranks)
        return invalid(p, i, "rank outside the communicator");
    /* a forward's sender is a destination passing on what it received */
    unsigned sender_role = op->kind == PLAN_OP_FWD ? TOPO_DST : TOPO_SRC;
    if (topo_off(topo, op->src, sender_role) || topo_off(topo, op->dst, TOPO_DST))
        return invalid(p, i, "an absent rank sends or receives");
    const struct plan_tensor *t = &p->tensors[op->tensor];
    int ndim = t->dst.ndim;
    if (op->box + 2 * (uint64_t)ndim > p->boxes.n)
        return invalid(p, i, "box outside the plan");
    const int64_t *s = plan_op_start(p, op), *l = plan_op_len(p, op);
    for (int d = 0; d < ndim; d++)
        if (s[d] < 0 || l[d] < 1 || s[d] + l[d] > t->dst.shape[d])
            return invalid(p, i, "box empty or outside the tensor");

    int same_domain = topo->domain[op->src] == topo->domain[op->dst];
    switch ((enum plan_op_kind)op->kind) {
    case PLAN_OP_SELF:
        if (op->src != op->dst)
            return invalid(p, i, "a self copy between two ranks");
        break;
    case PLAN_OP_LOCAL:
    case PLAN_OP_FWD:
        if (!same_domain || op->src == op->dst)
            return invalid(p, i, "a local-path op must join two ranks of one domain");
        break;
    case PLAN_OP_NET:
        if (same_domain)
            return invalid(p, i, "a network op inside one domain");
        break;
    } /* the 2-bit kind holds exactly the four kinds */
    if (op->kind == PLAN_OP_FWD) {
        if (op->parent >= i || p->ops[op->parent].kind != PLAN_OP_NET)
            return invalid(p, i, "forwards a box that no earlier network op delivered");
        const struct plan_op *par = &p->ops[op->parent];
        if (par->dst != op->src || par->tensor != op->tensor ||
            !box_inside(s, l, plan_op_start(p, par), plan_op_len(p, par), ndim))
            return invalid(p, i, "forwards a box its network op did not deliver to the sender");
    } else if (t->scales_of >= 0 && p->tensors[t->scales_of].quant == PLAN_QUANT_CAST) {
        const struct plan_tensor *w = &p->tensors[t->scales_of];
        int pos = shardmap_position(&w->src_map, op->src);
        if (pos < 0 || !quant_holds_blocks(&w->src_map, pos, &w->dst, s, l, 1))
            return invalid(p, i, "the sender does not hold whole the blocks it sends scales of");
    } else {
        int pos = shardmap_position(&t->src_map, op->src);
        if (pos < 0 || !shardmap_holds(&t->src_map, pos, s, l))
            return invalid(p, i, "the sender does not hold the box in its source shard");
        if (op->at_src && (t->quant != PLAN_QUANT_CAST ||
                           !quant_holds_blocks(&t->src_map, pos, &t->dst, s, l, 0)))
            return invalid(p, i, "quantized by a sender that does not hold its blocks whole");
    }
    int pos = shardmap_position(&t->dst_map, op->dst);
    if (pos < 0 || !shardmap_holds(&t->dst_map, pos, s, l))
        return invalid(p, i, "the box is not part of the receiver's destination shard");
    return RESHARD_OK;
}

/* ---- disjointness and exact cover ---- */

struct key {
    uint32_t tensor;
    int32_t group; /* receiving rank, or its domain */
    size_t op;
};

static int cmp_key(const void *a, const void *b)
{
    const struct key *x = a, *y = b;
    if (x->tensor != y->tensor)
        return x->tensor < y->tensor ? -1 : 1;
    if (x->group != y->group)
        return x->group < y->group ? -1 : 1;
    return (x->op > y->op) - (x->op < y->op);
}

struct span {
    int64_t start, end;
    size_t op;
};

static int cmp_span(const void *a, const void *b)
{
    const struct span *x = a, *y = b;
    if (x->start != y->start)
        return x->start < y->start ? -1 : 1;
    return (x->op > y->op) - (x->op < y->op);
}

static int boxes_meet(const struct rs_plan *p, size_t a, size_t b, int ndim)
{
    const int64_t *sa = plan_op_start(p, &p->ops[a]), *la = plan_op_len(p, &p->ops[a]);
    const int64_t *sb = plan_op_start(p, &p->ops[b]), *lb = plan_op_len(p, &p->ops[b]);
    for (int d = 0; d < ndim; d++)
        if (sa[d] + la[d] <= sb[d] || sb[d] + lb[d] <= sa[d])
            return 0;
    return 1;
}

/* Finds two intersecting boxes among ops keys[0..n). Sweeps along the dim where the boxes are
 * thinnest relative to the tensor, so only boxes that meet there are compared. */
static reshard_status_t check_disjoint(const struct rs_plan *p, const struct key *keys, size_t n,
                                       struct span *spans, const char *what)
{
    const struct plan_tensor *t = &p->tensors[keys[0].tensor];
    int ndim = t->dst.ndim, dim = 0;
    double best = 0;
    for (int d = 0; d < ndim; d++) {
        double cover = 0;
        for (size_t i = 0; i < n; i++)
            cover += (double)plan_op_len(p, &p->ops[keys[i].op])[d] / (double)t->dst.shape[d];
        if (d == 0 || cover < best) {
            best = cover;
            dim = d;
        }
    }
    for (size_t i = 0; i < n; i++) {
        const struct plan_op *op = &p->ops[keys[i].op];
        int64_t s = plan_op_start(p, op)[dim];
        spans[i] = (struct span){s, s + plan_op_len(p, op)[dim], keys[i].op};
    }
    qsort(spans, n, sizeof(*spans), cmp_span);
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n && spans[j].start < spans[i].end; j++)
            if (boxes_meet(p, spans[i].op, spans[j].op, ndim))
                return rs_error(RESHARD_ERR_INVALID_PLAN,
                                "plan: tensor '%s': ops %zu and %zu both %s", t->name,
                                spans[i].op < spans[j].op ? spans[i].op : spans[j].op,
                                spans[i].op < spans[j].op ? spans[j].op : spans[i].op, what);
    return RESHARD_OK;
}

static int64_t op_volume(const struct rs_plan *p, const struct plan_op *op)
{
    const int64_t *l = plan_op_len(p, op);
    int64_t v = 1;
    for (int d = 0; d < p->tensors[op->tensor].dst.ndim; d++)
        v *= l[d];
    return v;
}

/* Scales the ops of weight w into rank deliver quantized: one per block starting in their
 * boxes. keys[0 .. nkeys) are sorted by (tensor, receiver). */
static int64_t scales_due(const struct rs_plan *p, const struct key *keys, size_t nkeys, int w,
                          int rank)
{
    int64_t n = 0, ss[RS_MAX_DIMS], sl[RS_MAX_DIMS];
    size_t lo = 0, hi = nkeys; /* the first key of (w, rank) */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (keys[mid].tensor < (uint32_t)w ||
            (keys[mid].tensor == (uint32_t)w && keys[mid].group < rank))
            lo = mid + 1;
        else
            hi = mid;
    }
    for (size_t k = lo; k < nkeys && keys[k].tensor == (uint32_t)w && keys[k].group == rank; k++) {
        const struct plan_op *op = &p->ops[keys[k].op];
        if (!op->at_src ||
            !quant_scale_box(&p->tensors[w].dst, plan_op_start(p, op), plan_op_len(p, op), ss, sl))
            continue;
        int64_t v = 1;
        for (int d = 0; d < p->tensors[w].dst.ndim; d++)
            v *= sl[d];
        n += v;
    }
    return n;
}

/* Every destination shard is the disjoint union of the boxes written into it; the scales that
 * a quantization computes are written exactly for the blocks quantized at their source (the
 * others are computed where they land). */
static reshard_status_t check_cover(const struct rs_plan *p, struct key *keys, struct span *spans)
{
    size_t n = 0;
    for (size_t i = 0; i < p->nops; i++)
        keys[n++] = (struct key){p->ops[i].tensor, p->ops[i].dst, i};
    qsort(keys, n, sizeof(*keys), cmp_key);
    size_t k = 0;
    for (int t = 0; t < p->ntensors; t++) {
        const struct plan_tensor *pt = &p->tensors[t];
        int computed = pt->scales_of >= 0 && p->tensors[pt->scales_of].quant == PLAN_QUANT_CAST;
        /* ranks of the destination layout in ascending order, against the sorted keys */
        for (int q = 0; q < pt->dst.nranks; q++) {
            int pos = pt->dst_map.by_rank[q], rank = pt->dst.ranks[pos];
            size_t b = k;
            int64_t elems = 0;
            while (k < n && keys[k].tensor == (uint32_t)t && keys[k].group == rank)
                elems += op_volume(p, &p->ops[keys[k++].op]);
            if (k > b)
                RS_CHECK(check_disjoint(p, keys + b, k - b, spans, "write the same element"));
            int64_t want = topo_off(&p->topo, rank, TOPO_DST)
                               ? 0 /* and check_op proved that nothing is written there */
                           : computed ? scales_due(p, keys, n, pt->scales_of, rank)
                                      : shardmap_local_numel(&pt->dst_map, pos);
            if (elems != want)
                return rs_error(RESHARD_ERR_INVALID_PLAN,
                                "plan: tensor '%s': rank %d receives %lld of its %lld elements",
                                pt->name, rank, (long long)elems, (long long)want);
        }
        if (k < n && keys[k].tensor == (uint32_t)t)
            return rs_error(RESHARD_ERR_INVALID_PLAN,
                            "plan: tensor '%s': op %zu writes to rank %d, which is no destination",
                            pt->name, keys[k].op, keys[k].group);
    }
    return RESHARD_OK;
}

/* Network boxes entering one domain never repeat an element. */
static reshard_status_t check_once_per_domain(const struct rs_plan *p, struct key *keys,
                                              struct span *spans)
{
    size_t n = 0;
    for (size_t i = 0; i < p->nops; i++)
        if (p->ops[i].kind == PLAN_OP_NET)
            keys[n++] = (struct key){p->ops[i].tensor, p->topo.domain[p->ops[i].dst], i};
    qsort(keys, n, sizeof(*keys), cmp_key);
    for (size_t b = 0, e; b < n; b = e) {
        for (e = b + 1;
             e < n && keys[e].tensor == keys[b].tensor && keys[e].group == keys[b].group;)
            e++;
        RS_CHECK(check_disjoint(p, keys + b, e - b, spans, "carry the same element into a domain"));
    }
    return RESHARD_OK;
}

reshard_status_t plan_validate(const struct rs_plan *p)
{
    for (size_t i = 0; i < p->nops; i++)
        RS_CHECK(check_op(p, i));
    struct key *keys = rs_calloc(p->nops, sizeof(*keys), "plan validation");
    struct span *spans = rs_calloc(p->nops, sizeof(*spans), "plan validation");
    reshard_status_t st = RESHARD_ERR_NO_MEMORY;
    if (keys && spans) {
        st = check_cover(p, keys, spans);
        if (st == RESHARD_OK)
            st = check_once_per_domain(p, keys, spans);
    }
    free(keys);
    free(spans);
    return st;
}
