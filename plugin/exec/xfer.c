/* SPDX-License-Identifier: Apache-2.0 */
#include "xfer.h"

#include "base/error.h"

#include <stdlib.h>
#include <string.h>

const char *xfer_path_name(enum xfer_path p)
{
    static const char *const names[] = {"self", "local", "net"};
    return p <= XFER_NET ? names[p] : "?";
}

static enum xfer_path path_between(const struct rs_topo *t, int src, int dst)
{
    if (src == dst)
        return XFER_SELF;
    return t->domain[src] == t->domain[dst] ? XFER_LOCAL : XFER_NET;
}

static reshard_status_t push(struct xfer_set *s, struct xfer x)
{
    if (s->n == s->cap) {
        struct xfer *n = rs_grow(s->x, &s->cap, s->n + 1, sizeof(*n), "transfers");
        if (!n)
            return RESHARD_ERR_NO_MEMORY;
        s->x = n;
    }
    s->x[s->n++] = x;
    return RESHARD_OK;
}

static reshard_status_t push_box(struct xfer_set *s, int ndim, const int64_t *start,
                                 const int64_t *len, uint32_t *box)
{
    RS_CHECK(boxes_push(&s->own, ndim, start, len, box));
    s->coords = s->own.coords;
    return RESHARD_OK;
}

/* The buffers an op reads and writes: a CAST weight's box quantized by its sender comes out of
 * the sender's FP8 values, one crossing unquantized lands staged; a CAST weight's scales come out
 * of what the sender computed; a forward reads what its parent wrote. */
static void op_bufs(const struct rs_plan *p, const struct plan_op *o, uint8_t *src, uint8_t *dst)
{
    const struct plan_tensor *t = &p->tensors[o->tensor];
    int fwd = o->kind == PLAN_OP_FWD;
    int cast_scales = t->scales_of >= 0 && p->tensors[t->scales_of].quant == PLAN_QUANT_CAST;
    if (t->quant == PLAN_QUANT_CAST && !o->at_src) {
        *src = fwd ? XBUF_STAGE : XBUF_SRC;
        *dst = XBUF_STAGE;
        return;
    }
    if (fwd)
        *src = XBUF_DST;
    else if (t->quant == PLAN_QUANT_CAST || cast_scales)
        *src = XBUF_QSRC;
    else
        *src = XBUF_SRC;
    *dst = XBUF_DST;
}

/* The plan's ops, each on the path the real topology gives its two ranks. */
static reshard_status_t from_ops(const struct rs_plan *ops, const struct rs_topo *real,
                                 struct xfer_set *s)
{
    s->coords = ops->boxes.coords;
    for (size_t i = 0; i < ops->nops; i++) {
        const struct plan_op *o = &ops->ops[i];
        int fwd = o->kind == PLAN_OP_FWD;
        struct xfer x = {.bytes = plan_op_bytes(ops, o),
                         .box = o->box,
                         .tensor = o->tensor,
                         .parent = fwd ? o->parent : XFER_NONE,
                         .src = o->src,
                         .dst = o->dst,
                         .path = (uint8_t)path_between(real, o->src, o->dst)};
        op_bufs(ops, o, &x.src_buf, &x.dst_buf);
        RS_CHECK(push(s, x));
    }
    return RESHARD_OK;
}

static reshard_status_t build_direct(const struct rs_plan *plan, struct xfer_set *s)
{
    struct rs_topo single;
    RS_CHECK(topo_create(plan->topo.nranks, 1, NULL, &single));
    struct plan_input *in = rs_calloc((size_t)plan->ntensors, sizeof(*in), "plan inputs");
    reshard_status_t st = RESHARD_ERR_NO_MEMORY;
    if (!in)
        goto free_inputs;
    plan_inputs_of(plan, in);
    RS_CHECK_GOTO(plan_build(in, plan->ninputs, &single, &plan->opts, plan->scope, &s->aux), st,
                  free_inputs);
    RS_CHECK_GOTO(from_ops(s->aux, &plan->topo, s), st, free_inputs);
free_inputs:
    free(in);
    topo_free(&single);
    return st;
}

/* The destination ranks of a layout, first appearance in mesh order, after `first`. seen has
 * room for every rank of the topology. */
static int ring_order(const struct rs_layout *dst, int first, int *chain, uint8_t *seen)
{
    int n = 0;
    chain[n++] = first;
    seen[first] = 1;
    for (int i = 0; i < dst->nranks; i++)
        if (!seen[dst->ranks[i]]) {
            seen[dst->ranks[i]] = 1;
            chain[n++] = dst->ranks[i];
        }
    for (int i = 0; i < n; i++)
        seen[chain[i]] = 0;
    return n;
}

/* What the broadcast baseline moves a tensor in: what users do today with an FP8 destination
 * is to broadcast the weights in their training dtype and quantize where they land, so a
 * weight quantized on the way travels in its source dtype (and its scales, computed there, not
 * at all); anything else in its own. */
static int bcast_dtype(const struct plan_tensor *pt)
{
    return pt->quant == PLAN_QUANT_CAST ? pt->src.dtype : pt->dst.dtype;
}

static int bcast_skips(const struct rs_plan *plan, const struct plan_tensor *pt)
{
    return pt->scales_of >= 0 && plan->tensors[pt->scales_of].quant == PLAN_QUANT_CAST;
}

/* Each box of rank's destination shard (a product of segments), copied out of the whole
 * tensor once it has all arrived. */
static reshard_status_t push_extracts(struct xfer_set *s, const struct plan_tensor *pt, uint32_t t,
                                      int rank)
{
    const struct rs_shardmap *m = &pt->dst_map;
    int pos = shardmap_position(m, rank), ndim = pt->dst.ndim;
    if (pos < 0)
        return RESHARD_OK;
    int seg[RS_MAX_DIMS], first[RS_MAX_DIMS], last[RS_MAX_DIMS];
    for (int j = 0; j < ndim; j++) {
        int g = shardmap_group(m, pos, j);
        first[j] = seg[j] = m->dim[j].first[g];
        last[j] = m->dim[j].first[g + 1];
        if (first[j] == last[j])
            return RESHARD_OK; /* an empty shard */
    }
    for (;;) {
        int64_t start[RS_MAX_DIMS], len[RS_MAX_DIMS], bytes = (int64_t)dtype_size(bcast_dtype(pt));
        for (int j = 0; j < ndim; j++) {
            start[j] = m->dim[j].segs[seg[j]].start;
            len[j] = m->dim[j].segs[seg[j]].len;
            bytes *= len[j];
        }
        uint32_t box;
        RS_CHECK(push_box(s, ndim, start, len, &box));
        RS_CHECK(push(s, (struct xfer){.bytes = bytes,
                                       .box = box,
                                       .tensor = t,
                                       .parent = XFER_AFTER_INPUTS,
                                       .src = rank,
                                       .dst = rank,
                                       .path = XFER_SELF,
                                       .src_buf = XBUF_TMP,
                                       .dst_buf = XBUF_DST}));
        int j = ndim - 1;
        while (j >= 0 && ++seg[j] == last[j])
            seg[j] = first[j], j--;
        if (j < 0)
            return RESHARD_OK;
    }
}

static int in_scope(const struct rs_plan *plan, int rank)
{
    return plan->scope == PLAN_ALL_RANKS || plan->scope == rank;
}

/* The ring of whole-tensor hops over a tensor's destination ranks, and each one's extracts:
 * at a rank's scope, only the hops into and out of it (the hop out waits for the hop in, or
 * for the gather at the first rank) and its own extracts. Finding its place in the ring
 * walks the tensor's destination ranks: O(ranks) per tensor, the one term of this baseline
 * that grows with the world. */
static reshard_status_t push_ring(struct xfer_set *s, const struct rs_plan *plan, uint32_t t,
                                  int *chain, uint8_t *seen)
{
    const struct plan_tensor *pt = &plan->tensors[t];
    int ndim = pt->dst.ndim, first = pt->src.ranks[0];
    int n = ring_order(&pt->dst, first, chain, seen);
    int64_t start[RS_MAX_DIMS] = {0};
    int64_t bytes = (int64_t)dtype_size(bcast_dtype(pt)) * layout_numel(&pt->dst);
    uint32_t box = 0, prev = XFER_AFTER_INPUTS;
    int boxed = 0;
    for (int i = 0; i + 1 < n; i++) {
        if (!in_scope(plan, chain[i]) && !in_scope(plan, chain[i + 1]))
            continue;
        if (!boxed++)
            RS_CHECK(push_box(s, ndim, start, pt->dst.shape, &box));
        struct xfer x = {.bytes = bytes,
                         .box = box,
                         .tensor = t,
                         .parent = i == 0 ? XFER_AFTER_INPUTS : prev,
                         .src = chain[i],
                         .dst = chain[i + 1],
                         .path = (uint8_t)path_between(&plan->topo, chain[i], chain[i + 1]),
                         .src_buf = XBUF_TMP,
                         .dst_buf = XBUF_TMP};
        if (!in_scope(plan, chain[i]))
            x.parent = XFER_NONE; /* the hop into this rank: its sender knows what it waits for */
        prev = (uint32_t)s->n;
        RS_CHECK(push(s, x));
    }
    for (int i = 0; i < n; i++)
        if (in_scope(plan, chain[i]))
            RS_CHECK(push_extracts(s, pt, t, chain[i]));
    return RESHARD_OK;
}

static reshard_status_t build_bcast(const struct rs_plan *plan, struct xfer_set *s)
{
    int nt = plan->ntensors;
    struct plan_input *in = rs_calloc((size_t)nt, sizeof(*in), "plan inputs");
    struct rs_layout *whole = rs_calloc((size_t)nt, sizeof(*whole), "gather layouts");
    struct rs_layout *plain = rs_calloc((size_t)nt, sizeof(*plain), "gather layouts");
    int *chain = NULL;
    uint8_t *seen = NULL;
    reshard_status_t st = RESHARD_ERR_NO_MEMORY;
    if (!in || !whole || !plain)
        goto free_inputs;
    for (int t = 0; t < nt; t++) {
        /* the source as plain bytes (an FP8 one with its blocks moves as it is); ranks and
         * views borrowed: plan_build copies them */
        const struct rs_layout *src = &plain[t];
        plain[t] = plan->tensors[t].src;
        plain[t].quant.kind = RS_QUANT_NONE;
        struct rs_layout *w = &whole[t];
        w->ndim = src->ndim;
        memcpy(w->shape, src->shape, sizeof(w->shape));
        w->dtype = src->dtype;
        w->nranks = 1;
        w->ranks = (int *)&src->ranks[0]; /* borrowed: plan_build copies it */
        w->mesh_ndim = 1;
        w->mesh[0] = 1;
        w->place[0].kind = RS_PLACE_R;
        in[t] = (struct plan_input){plan->tensors[t].name, src, w, NULL};
    }
    RS_CHECK_GOTO(plan_build(in, nt, &plan->topo, &plan->opts, plan->scope, &s->aux), st,
                  free_inputs);
    /* The gather: the ops into the first source rank's whole-tensor buffer. */
    for (size_t i = 0; i < s->aux->nops; i++) {
        const struct plan_op *o = &s->aux->ops[i];
        uint32_t box;
        int ndim = plan->tensors[o->tensor].dst.ndim;
        RS_CHECK_GOTO(push_box(s, ndim, plan_op_start(s->aux, o), plan_op_len(s->aux, o), &box), st,
                      free_inputs);
        struct xfer x = {.bytes = plan_op_bytes(s->aux, o),
                         .box = box,
                         .tensor = o->tensor,
                         .parent = XFER_NONE,
                         .src = o->src,
                         .dst = o->dst,
                         .path = (uint8_t)path_between(&plan->topo, o->src, o->dst),
                         .src_buf = XBUF_SRC,
                         .dst_buf = XBUF_TMP};
        RS_CHECK_GOTO(push(s, x), st, free_inputs);
    }
    chain = rs_calloc((size_t)plan->topo.nranks + 1, sizeof(int), "ring");
    seen = rs_calloc((size_t)plan->topo.nranks + 1, 1, "ring");
    if (!chain || !seen) {
        st = RESHARD_ERR_NO_MEMORY;
        goto free_inputs;
    }
    for (int t = 0; t < nt; t++)
        if (!bcast_skips(plan, &plan->tensors[t]))
            RS_CHECK_GOTO(push_ring(s, plan, (uint32_t)t, chain, seen), st, free_inputs);
    s->needs_tmp = 1;
free_inputs:
    free(seen);
    free(chain);
    free(plain);
    free(whole);
    free(in);
    return st;
}

reshard_status_t xfer_build(const struct rs_plan *plan, reshard_algo_t algo, struct xfer_set *out)
{
    struct xfer_set s = {0};
    reshard_status_t st;
    switch (algo) {
    case RESHARD_ALGO_RESHARD:
        st = from_ops(plan, &plan->topo, &s);
        break;
    case RESHARD_ALGO_DIRECT:
        st = build_direct(plan, &s);
        break;
    case RESHARD_ALGO_BCAST:
        st = build_bcast(plan, &s);
        break;
    default:
        st = rs_error(RESHARD_ERR_INVALID_ARG, "algo %d: expected reshard, direct or bcast",
                      (int)algo);
    }
    if (st != RESHARD_OK) {
        xfer_free(&s);
        return st;
    }
    s.algo = algo;
    *out = s;
    return RESHARD_OK;
}

void xfer_free(struct xfer_set *s)
{
    free(s->x);
    boxes_free(&s->own);
    plan_free(s->aux);
    memset(s, 0, sizeof(*s));
}
