/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Stage 1 of an execution (stage.h): what this rank prepares before the others hear from it.
 * A failure here is not returned at once: it is this rank's vote in stage 2.
 */
#include "stage.h"

#include "base/error.h"
#include "base/param.h"

/* Packed sends use at most EXEC_SEND_WINDOW slots at once: no more are made. */
static reshard_status_t staging_init(struct exec *x)
{
    int64_t cap = rs_param_int(RS_PARAM_STAGING_BYTES) / x->cut.chunk_bytes;
    int slots = (int)(cap < 1 ? 1 : cap > EXEC_SEND_WINDOW ? EXEC_SEND_WINDOW : cap);
    return comm_staging(x->comm, x->cut.chunk_bytes, slots);
}

/* Everything this rank prepares before the others hear from it. */
reshard_status_t stage_prepare(struct exec *x, const reshard_buffers_t *bufs,
                               const reshard_buffers_t *dev, uint32_t seq, struct exec_run **r)
{
    struct tp_ctx *net = x->comm->net;
    RS_CHECK(staging_init(x));
    for (int t = 0; t < x->plan->ntensors; t++) {
        RS_CHECK(exec_reg_one(net, &x->regs.host[2 * t], bufs[t].src, bufs[t].src_bytes,
                              TP_MEM_HOST, 0));
        RS_CHECK(exec_reg_one(net, &x->regs.host[2 * t + 1], bufs[t].dst, bufs[t].dst_bytes,
                              TP_MEM_HOST, 0));
    }
    RS_CHECK(exec_tmp_alloc(&x->tmp, x->plan, &x->xs, x->comm->rank));
    int gdr = dev && exec_dev_try_gdr(x, dev);
    RS_CHECK(exec_run_create(x, bufs, dev, seq, r));
    (*r)->gdr = gdr;
    exec_delta_vote(x, bufs, dev, *r);
    return dev ? exec_dev_stage_sources(*r, 0) : RESHARD_OK;
}
