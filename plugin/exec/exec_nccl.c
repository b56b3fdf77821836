/* SPDX-License-Identifier: Apache-2.0 */
#include "exec_nccl.h"

#include "exec_tag.h"
#include "region.h"
#include "base/error.h"

#include <stdlib.h>

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

/* This rank's operations for one transfer: a send per piece from its source buffer, a receive
 * per piece into its destination buffer (both, to itself, for a self copy). */
static reshard_status_t lower_xfer(const struct rs_plan *plan, const struct xfer_set *xs,
                                   const struct xfer *xf, int rank, const reshard_buffers_t *bufs,
                                   const struct nccl_fns *f, void *comm, void *stream)
{
    struct region a, b;
    box_region(plan, xs, xf, 0, &a);
    box_region(plan, xs, xf, 1, &b);
    const reshard_buffers_t *tb = &bufs[xf->tensor];
    const char *src = xf->src_buf == XBUF_SRC ? tb->src : tb->dst;
    char *dst = tb->dst;
    struct region_pair p;
    uint64_t ao, bo, len;
    region_pair_init(&p, &a, &b);
    while (region_pair_next(&p, &ao, &bo, &len)) {
        nccl_result r;
        if (xf->src == rank && (r = f->send(src + ao, len, NCCL_UINT8, xf->dst, comm, stream)))
            return nccl_error(f, r, "ncclSend of %llu bytes of tensor '%s' to rank %d",
                              (unsigned long long)len, plan->tensors[xf->tensor].name, xf->dst);
        if (xf->dst == rank && (r = f->recv(dst + bo, len, NCCL_UINT8, xf->src, comm, stream)))
            return nccl_error(f, r, "ncclRecv of %llu bytes of tensor '%s' from rank %d",
                              (unsigned long long)len, plan->tensors[xf->tensor].name, xf->src);
    }
    return RESHARD_OK;
}

reshard_status_t nccl_lower(const struct rs_plan *plan, const struct xfer_set *xs, int rank,
                            const reshard_buffers_t *bufs, const struct nccl_fns *f, void *comm,
                            void *stream)
{
    uint32_t n = 0;
    RS_CHECK(nccl_rounds(xs, &n));
    /* This rank's transfers in the canonical order: each pair's sends and receives then meet in
     * the same order on both ends, whatever else their lists hold. */
    uint32_t *order = rs_calloc(xs->n + 1, sizeof(uint32_t), "rounds"), mine = 0;
    uint8_t *round = rs_calloc(xs->n + 1, 1, "rounds");
    reshard_status_t st = order && round ? RESHARD_OK : RESHARD_ERR_NO_MEMORY;
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
        nccl_result r = f->group_start();
        if (r) {
            st = nccl_error(f, r, "ncclGroupStart (round %u)", k);
            break;
        }
        for (uint32_t i = 0; i < mine && st == RESHARD_OK; i++)
            if (round[order[i]] == k)
                st = lower_xfer(plan, xs, &xs->x[order[i]], rank, bufs, f, comm, stream);
        /* A group is always closed, so that NCCL is left usable after a failure. */
        if ((r = f->group_end()) && st == RESHARD_OK)
            st = nccl_error(f, r, "ncclGroupEnd (round %u)", k);
    }
    free(order);
    free(round);
    return st;
}
