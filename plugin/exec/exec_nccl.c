/* SPDX-License-Identifier: Apache-2.0 */
#include "exec_nccl.h"

#include "region.h"
#include "base/error.h"

#include <stdlib.h>

/* round[i] for every transfer; *n: rounds in all. Parents come before their children. */
static reshard_status_t assign_rounds(const struct xfer_set *xs, uint32_t *round, uint32_t *n)
{
    *n = xs->n ? 1 : 0;
    for (size_t i = 0; i < xs->n; i++) {
        uint32_t p = xs->x[i].parent;
        if (p == XFER_AFTER_INPUTS || xs->x[i].src_buf == XBUF_TMP || xs->x[i].dst_buf == XBUF_TMP)
            return rs_error(RESHARD_ERR_INVALID_ARG,
                            "the NCCL executor runs the reshard and direct algorithms; the bcast "
                            "baseline needs reshard's own executor");
        if (p != XFER_NONE && p >= i)
            return rs_error(RESHARD_ERR_INTERNAL, "transfer %zu depends on a later one (%u)", i, p);
        round[i] = p == XFER_NONE ? 0 : round[p] + 1;
        if (round[i] + 1 > *n)
            *n = round[i] + 1;
    }
    return RESHARD_OK;
}

reshard_status_t nccl_rounds(const struct xfer_set *xs, uint32_t *rounds)
{
    uint32_t *round = rs_calloc(xs->n + 1, sizeof(uint32_t), "rounds");
    if (!round)
        return RESHARD_ERR_NO_MEMORY;
    reshard_status_t st = assign_rounds(xs, round, rounds);
    free(round);
    return st;
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
    uint32_t *round = rs_calloc(xs->n + 1, sizeof(uint32_t), "rounds"), n = 0;
    if (!round)
        return RESHARD_ERR_NO_MEMORY;
    reshard_status_t st = assign_rounds(xs, round, &n);
    for (uint32_t k = 0; k < n && st == RESHARD_OK; k++) {
        nccl_result r = f->group_start();
        if (r) {
            st = nccl_error(f, r, "ncclGroupStart (round %u)", k);
            break;
        }
        for (size_t i = 0; i < xs->n && st == RESHARD_OK; i++) {
            const struct xfer *xf = &xs->x[i];
            if (round[i] == k && (xf->src == rank || xf->dst == rank))
                st = lower_xfer(plan, xs, xf, rank, bufs, f, comm, stream);
        }
        /* A group is always closed, so that NCCL is left usable after a failure. */
        if ((r = f->group_end()) && st == RESHARD_OK)
            st = nccl_error(f, r, "ncclGroupEnd (round %u)", k);
    }
    free(round);
    return st;
}
