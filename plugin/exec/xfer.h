/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Transfers: what the executor runs. Every algorithm becomes one list, of the plan's scope: every
 * rank's transfers for a plan of every rank, one rank's own (those it sends or receives) for a
 * plan of one rank, as a communicator's ranks hold:
 *   reshard  the plan's ops (FWD ops become local transfers out of the forwarder's destination);
 *   direct   a plan on singleton domains (no dedupe), each op on the path its ranks' real
 *            domains give it;
 *   bcast    a gather plan onto the first source rank's whole-tensor buffer, a ring of
 *            whole-tensor hops over the destination ranks, and each destination's copy of its
 *            shard out of the whole tensor.
 * A transfer with a parent starts chunk by chunk as its parent's chunks arrive (the pipeline);
 * XFER_AFTER_INPUTS waits until everything bound for its source's whole-tensor buffer arrived.
 * A parent is known only to the transfer's sender: in a plan of one rank, what that rank
 * receives has none.
 *
 * At a rank's scope the reshard and direct lists cost the rank's own ops; the broadcast
 * baseline also walks each tensor's destination ranks to find the rank's place in the ring,
 * O(world) per tensor.
 */
#ifndef RS_XFER_H
#define RS_XFER_H

#include "planner/plan.h"
#include "plugin/reshard.h"

enum xfer_path { XFER_SELF, XFER_LOCAL, XFER_NET };
/* SRC, DST: the caller's buffers; TMP: a whole-tensor buffer (bcast). FP8 destinations quantized
 * on the way (planner/quant.h, CAST) add two of the executor's own (exec_quant.c):
 *   QSRC   what a sender quantized: the FP8 values of its source shard (row-major over the
 *          shard, without the source's view), or the whole scales tensor (float32) it computed;
 *   STAGE  a destination shard in the source dtype (row-major, without the destination's
 *          view), where boxes that cross unquantized land before the destination quantizes
 *          their blocks. */
enum xfer_buf { XBUF_SRC, XBUF_DST, XBUF_TMP, XBUF_QSRC, XBUF_STAGE };

#define XFER_NONE         UINT32_MAX
#define XFER_AFTER_INPUTS (UINT32_MAX - 1)

struct xfer {
    int64_t bytes;
    uint32_t box; /* coords[box ..]: start[ndim], then len[ndim] */
    uint32_t tensor;
    uint32_t parent;
    int32_t src, dst;
    uint8_t path, src_buf, dst_buf;
};

struct xfer_set {
    struct xfer *x;
    size_t n, cap;
    const int64_t *coords; /* the plan's boxes, or own's */
    struct rs_boxes own;
    struct rs_plan *aux; /* direct: the singleton-domain plan; bcast: the gather plan */
    int needs_tmp;       /* bcast: ranks holding a whole-tensor buffer */
    reshard_algo_t algo;
};

/* Bytes of one element of a transfer: the source dtype's for a box that lands staged. */
static inline size_t xfer_esize(const struct rs_plan *plan, const struct xfer *xf)
{
    const struct plan_tensor *pt = &plan->tensors[xf->tensor];
    return dtype_size(xf->dst_buf == XBUF_STAGE ? pt->src.dtype : pt->dst.dtype);
}

/* plan was made on the communicator's topology. */
reshard_status_t xfer_build(const struct rs_plan *plan, reshard_algo_t algo, struct xfer_set *out);
void xfer_free(struct xfer_set *s);

const char *xfer_path_name(enum xfer_path p);

#endif
