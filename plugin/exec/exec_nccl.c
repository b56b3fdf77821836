/* SPDX-License-Identifier: Apache-2.0 */
#include "exec_nccl.h"

#include "exec_tag.h"
#include "region.h"
#include "base/error.h"

#include <stdlib.h>
#include <string.h>

/* A transfer's round: 0, or 1 for a forward, which reads the forwarder's destination that a
 * round-0 transfer filled. Both ends see the buffers, though only the forwarder knows the
 * parent: the rounds agree without the world's list. */
static reshard_status_t round_of(const struct xfer_set *xs, const struct xfer *xf, uint32_t *round)
{
    if (xs->algo == RESHARD_ALGO_BCAST || xf->parent == XFER_AFTER_INPUTS ||
        xf->src_buf == XBUF_TMP || xf->dst_buf == XBUF_TMP)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "the NCCL executor runs the reshard and direct algorithms; the bcast "
                        "baseline needs reshard's own executor");
    *round = xf->src_buf == XBUF_DST;
    if (*round && xf->parent != XFER_NONE &&
        (xf->parent >= xs->n || xs->x[xf->parent].src_buf != XBUF_SRC))
        return rs_error(RESHARD_ERR_INTERNAL, "transfer %zu forwards what no source sent (%u)",
                        (size_t)(xf - xs->x), xf->parent);
    return RESHARD_OK;
}

reshard_status_t nccl_rounds(const struct xfer_set *xs, uint32_t *rounds)
{
    uint32_t r;
    if (xs->algo == RESHARD_ALGO_BCAST) /* refused alike on a rank with nothing to do */
        return round_of(xs, &(struct xfer){.parent = XFER_NONE}, &r);
    for (size_t i = 0; i < xs->n; i++)
        RS_CHECK(round_of(xs, &xs->x[i], &r));
    *rounds = xs->algo == RESHARD_ALGO_DIRECT ? 1 : 2; /* direct forwards nothing */
    return RESHARD_OK;
}

static int cmp_canonical(const void *a, const void *b, void *arg)
{
    const struct exec_cut *cut = arg;
    return exec_xfer_cmp(cut, &cut->xs->x[*(const uint32_t *)a], &cut->xs->x[*(const uint32_t *)b]);
}

/* The transfer's box in the buffer `side` (0 source, 1 destination) of its rank there. */
static void box_region(const struct rs_plan *plan, const struct xfer_set *xs, const struct xfer *xf,
                       int side, struct region *r)
{
    const struct plan_tensor *pt = &plan->tensors[xf->tensor];
    int ndim = pt->dst.ndim, buf = side ? xf->dst_buf : xf->src_buf;
    const struct rs_shardmap *m = buf == XBUF_SRC ? &pt->src_map : &pt->dst_map;
    const int64_t *start = xs->coords + xf->box;
    region_of_shard(m, shardmap_position(m, side ? xf->dst : xf->src), start, start + ndim, r);
}

/* One send or receive, as lower_xfer found it; its batch is its index among this rank's
 * operations with the same peer in the same direction, over pair_ops. */
struct nccl_op {
    char *ptr;
    uint64_t len;
    int send, peer;
    uint32_t batch;
    int tensor; /* for the error message */
};

struct op_list {
    struct nccl_op *op;
    size_t n, cap;
    uint32_t *sends, *recvs; /* [nranks]: operations so far with each peer */
    uint32_t pair_ops, batches;
};

static reshard_status_t op_add(struct op_list *l, int send, int peer, char *ptr, uint64_t len,
                               int tensor, int nranks)
{
    if (peer < 0 || peer >= nranks)
        return rs_error(RESHARD_ERR_INTERNAL, "a transfer names rank %d of %d", peer, nranks);
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 256;
        struct nccl_op *op = realloc(l->op, cap * sizeof(*op));
        if (!op)
            return rs_error(RESHARD_ERR_NO_MEMORY, "out of memory for %zu NCCL operations", cap);
        l->op = op, l->cap = cap;
    }
    uint32_t *count = send ? &l->sends[peer] : &l->recvs[peer];
    uint32_t batch = (*count)++ / l->pair_ops;
    l->op[l->n++] = (struct nccl_op){ptr, len, send, peer, batch, tensor};
    if (batch + 1 > l->batches)
        l->batches = batch + 1;
    return RESHARD_OK;
}

/* This rank's operations for one transfer: a send per piece from its source buffer, a receive
 * per piece into its destination buffer (both, to itself, for a self copy). */
static reshard_status_t lower_xfer(const struct rs_plan *plan, const struct xfer_set *xs,
                                   const struct xfer *xf, int rank, const reshard_buffers_t *bufs,
                                   struct op_list *l)
{
    struct region a, b;
    box_region(plan, xs, xf, 0, &a);
    box_region(plan, xs, xf, 1, &b);
    const reshard_buffers_t *tb = &bufs[xf->tensor];
    char *src = (char *)(xf->src_buf == XBUF_SRC ? tb->src : tb->dst);
    char *dst = tb->dst;
    int nranks = plan->topo.nranks;
    struct region_pair p;
    uint64_t ao, bo, len;
    region_pair_init(&p, &a, &b);
    while (region_pair_next(&p, &ao, &bo, &len)) {
        if (xf->src == rank)
            RS_CHECK(op_add(l, 1, xf->dst, src + ao, len, (int)xf->tensor, nranks));
        if (xf->dst == rank)
            RS_CHECK(op_add(l, 0, xf->src, dst + bo, len, (int)xf->tensor, nranks));
    }
    return RESHARD_OK;
}

uint32_t nccl_pair_ops(int nranks)
{
    uint32_t n = NCCL_GROUP_OPS / (2u * (uint32_t)(nranks > 0 ? nranks : 1));
    return n ? n : 1;
}

/* One round's operations, in batches: batch b is one NCCL group. */
static reshard_status_t issue_round(const struct rs_plan *plan, const struct op_list *l, uint32_t k,
                                    const struct nccl_fns *f, void *comm, void *stream)
{
    reshard_status_t st = RESHARD_OK;
    for (uint32_t b = 0; b < (l->batches ? l->batches : 1) && st == RESHARD_OK; b++) {
        nccl_result r = f->group_start();
        if (r)
            return nccl_error(f, r, "ncclGroupStart (round %u, group %u)", k, b);
        for (size_t i = 0; i < l->n && st == RESHARD_OK; i++) {
            const struct nccl_op *o = &l->op[i];
            if (o->batch != b)
                continue;
            const char *name = plan->tensors[o->tensor].name;
            if (o->send && (r = f->send(o->ptr, o->len, NCCL_UINT8, o->peer, comm, stream)))
                st = nccl_error(f, r, "ncclSend of %llu bytes of tensor '%s' to rank %d",
                                (unsigned long long)o->len, name, o->peer);
            if (!o->send && (r = f->recv(o->ptr, o->len, NCCL_UINT8, o->peer, comm, stream)))
                st = nccl_error(f, r, "ncclRecv of %llu bytes of tensor '%s' from rank %d",
                                (unsigned long long)o->len, name, o->peer);
        }
        /* A group is always closed, so that NCCL is left usable after a failure. */
        if ((r = f->group_end()) && st == RESHARD_OK)
            st = nccl_error(f, r, "ncclGroupEnd (round %u, group %u)", k, b);
    }
    return st;
}

reshard_status_t nccl_lower(const struct rs_plan *plan, const struct xfer_set *xs, int rank,
                            const reshard_buffers_t *bufs, const struct nccl_fns *f, void *comm,
                            void *stream)
{
    uint32_t n = 0;
    RS_CHECK(nccl_rounds(xs, &n));
    int nranks = plan->topo.nranks;
    /* This rank's transfers in the canonical order: each pair's sends and receives then meet in
     * the same order on both ends, whatever else their lists hold. */
    uint32_t *order = rs_calloc(xs->n + 1, sizeof(uint32_t), "rounds"), mine = 0;
    uint8_t *round = rs_calloc(xs->n + 1, 1, "rounds");
    struct op_list l = {.sends = rs_calloc((size_t)nranks + 1, sizeof(uint32_t), "NCCL batches"),
                        .recvs = rs_calloc((size_t)nranks + 1, sizeof(uint32_t), "NCCL batches"),
                        .pair_ops = nccl_pair_ops(nranks)};
    reshard_status_t st = order && round && l.sends && l.recvs ? RESHARD_OK : RESHARD_ERR_NO_MEMORY;
    for (size_t i = 0; i < xs->n && st == RESHARD_OK; i++) {
        uint32_t r = 0;
        (void)round_of(xs, &xs->x[i], &r); /* checked by nccl_rounds */
        round[i] = (uint8_t)r;
        if (xs->x[i].src == rank || xs->x[i].dst == rank)
            order[mine++] = (uint32_t)i;
    }
    struct exec_cut cut = {.plan = plan, .xs = xs};
    if (st == RESHARD_OK)
        qsort_r(order, mine, sizeof(*order), cmp_canonical, &cut);
    for (uint32_t k = 0; k < n && st == RESHARD_OK; k++) {
        l.n = l.batches = 0;
        memset(l.sends, 0, (size_t)nranks * sizeof(uint32_t));
        memset(l.recvs, 0, (size_t)nranks * sizeof(uint32_t));
        for (uint32_t i = 0; i < mine && st == RESHARD_OK; i++)
            if (round[order[i]] == k)
                st = lower_xfer(plan, xs, &xs->x[order[i]], rank, bufs, &l);
        if (st == RESHARD_OK)
            st = issue_round(plan, &l, k, f, comm, stream);
    }
    free(l.op);
    free(l.sends);
    free(l.recvs);
    free(order);
    free(round);
    return st;
}
