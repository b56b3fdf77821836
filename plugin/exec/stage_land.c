/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Stage 5 of an execution (stage.h): what landed is made final, and what the execution left in
 * each destination is recorded for reshard_plan_outcome.
 */
#include "stage.h"

#include "base/log.h"
#include "base/param.h"
#include "cuda/cuda_lib.h"
#include "planner/dtype.h"

/* ---- outcomes ---- */

/* A chunk counts once its receive (or copy) completed; one still in flight may be partly
 * written, so its tensor is torn. */
void exec_run_record(struct exec *x, const struct exec_run *r)
{
    for (int t = 0; t < x->plan->ntensors; t++) {
        reshard_tensor_state_t s = RESHARD_TENSOR_UNTOUCHED;
        if (!x->share.dst_chunks[t])
            s = RESHARD_TENSOR_NONE;
        else if (r && !r->dst_left[t])
            s = RESHARD_TENSOR_COMPLETE;
        else if (r)
            s = RESHARD_TENSOR_TORN;
        x->last.state[t] = (uint8_t)s;
    }
    /* The scales of a weight quantized on the way are complete with it (some are computed
     * here once it landed, and none arrives before). */
    for (int t = 0; t < x->plan->ntensors; t++) {
        int w = x->plan->tensors[t].scales_of;
        if (w < 0 || x->plan->tensors[w].quant != PLAN_QUANT_CAST ||
            x->last.state[w] == RESHARD_TENSOR_NONE)
            continue;
        if (x->last.state[t] != RESHARD_TENSOR_TORN)
            x->last.state[t] = x->last.state[w];
    }
    x->last.executed = 1;
}

/* RESHARD_TEST_CORRUPT=N: rank N - 1 flips the lowest bit of the first element of its first
 * host destination shard once the refit landed, as a fault between the sender's buffer and
 * this one would (the verification's test: the check must name the tensor). */
static void test_corrupt(const struct exec *x, const reshard_buffers_t *bufs)
{
    if (rs_param_int(RS_PARAM_TEST_CORRUPT) != x->comm->rank + 1)
        return;
    for (int t = 0; t < x->plan->ntensors; t++) {
        const struct rs_layout *l = &x->plan->tensors[t].dst;
        size_t at = (size_t)l->view.offset * dtype_size(l->dtype);
        if (x->share.dst_chunks[t] && bufs[t].dst && bufs[t].mem == RESHARD_MEM_HOST &&
            at < bufs[t].dst_bytes) {
            ((unsigned char *)bufs[t].dst)[at] ^= 1;
            rs_log(RS_LOG_WARN, "rank %d: RESHARD_TEST_CORRUPT flipped a bit of tensor %s",
                   x->comm->rank, x->plan->tensors[t].name);
            return;
        }
    }
}

reshard_status_t stage_land(struct exec_run *r)
{
    struct exec *x = r->x;
    /* Weights quantized where they land (exec_quant.c): their staged blocks, now whole. */
    RS_CHECK(exec_quant_landed(x, r->bufs, r->dev, NULL, r->sparse));
    test_corrupt(x, r->bufs);
    if (r->gdr_landed) /* the caller's kernels see what the NIC wrote */
        RS_CHECK(cuda_flush_rdma_writes());
    return RESHARD_OK;
}
