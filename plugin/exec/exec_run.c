/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The life of one execution: its memory, and the native executor as the sequence of stages
 * stage.h lists (one file each), and the NCCL executor (the same vote, then the plan lowered
 * onto NCCL). A failure before any byte moved leaves the communicator usable; one after breaks
 * it (stage_fail.c).
 */
#include "stage.h"

#include "exec_nccl.h"
#include "base/error.h"
#include "cuda/cuda_lib.h"

#include <stdlib.h>
#include <string.h>

reshard_status_t exec_run_fail(struct exec_run *r, reshard_status_t st)
{
    if (r->st == RESHARD_OK) {
        r->st = st;
        snprintf(r->why, sizeof(r->why), "%s", rs_error_message());
    }
    return st;
}

/* ---- the run's memory ---- */

void exec_run_free(struct exec_run *r)
{
    if (!r)
        return;
    for (size_t i = 0; r->in_req && i < r->nin_req; i++)
        free(r->in_req[i].iov);
    free(r->ent_ipc);
    free(r->src_staged);
    free(r->in_req);
    free(r->out_req);
    free(r->in_arrived);
    free(r->tmp_left);
    free(r->dst_left);
    free(r->peer_inflight);
    free(r->ack_in);
    free(r->ack_out);
    free(r->net_q.q);
    free(r->local_q.q);
    free(r);
}

void exec_run_free_any(void *r)
{
    exec_run_free(r);
}

reshard_status_t exec_run_create(struct exec *x, const reshard_buffers_t *bufs,
                                 const reshard_buffers_t *dev, uint32_t seq, struct exec_run **out)
{
    const struct exec_share *s = &x->share;
    struct exec_run *r = rs_calloc(1, sizeof(*r), "execution");
    if (!r)
        return RESHARD_ERR_NO_MEMORY;
    r->x = x;
    r->comm = x->comm;
    r->bufs = bufs;
    r->seq = seq;
    if (dev) {
        r->dev = dev;
        r->ent_ipc =
            rs_calloc((size_t)x->links.to.first[x->links.to.n] + 1, sizeof(char *), "peer buffers");
        r->src_staged = rs_calloc((size_t)x->plan->ntensors, 1, "peer buffers");
    }
    r->nin_req = s->in_off[s->nin];
    r->in_req = rs_calloc(r->nin_req + 1, sizeof(*r->in_req), "receives");
    r->out_req = rs_calloc(s->out_off[s->nout] + 1, sizeof(*r->out_req), "sends");
    r->in_arrived = rs_calloc(s->nin + 1, sizeof(uint32_t), "arrivals");
    r->tmp_left = rs_calloc((size_t)x->plan->ntensors, sizeof(size_t), "arrivals");
    r->dst_left = rs_calloc((size_t)x->plan->ntensors, sizeof(size_t), "arrivals");
    r->peer_inflight = rs_calloc((size_t)x->comm->size, sizeof(int), "sends in flight");
    r->ack_in = rs_calloc((size_t)s->nsend_peers + 1, sizeof(*r->ack_in), "acknowledgements");
    r->ack_out = rs_calloc((size_t)s->nrecv_peers + 1, sizeof(*r->ack_out), "acknowledgements");
    if ((dev && (!r->ent_ipc || !r->src_staged)) || !r->in_req || !r->out_req || !r->in_arrived ||
        !r->tmp_left || !r->dst_left || !r->peer_inflight || !r->ack_in || !r->ack_out) {
        exec_run_free(r);
        return RESHARD_ERR_NO_MEMORY;
    }
    r->in_left = s->in_off[s->nin];
    r->out_left = s->out_off[s->nout];
    r->acks_in_left = s->nsend_peers;
    r->acks_out_left = s->nrecv_peers;
    memcpy(r->tmp_left, s->tmp_chunks, (size_t)x->plan->ntensors * sizeof(size_t));
    memcpy(r->dst_left, s->dst_chunks, (size_t)x->plan->ntensors * sizeof(size_t));
    *out = r;
    return RESHARD_OK;
}

/* Everything bound for this rank is known to have landed (a synchronized NCCL execution). */
static void record_completed(struct exec *x)
{
    for (int t = 0; t < x->plan->ntensors; t++)
        x->last.state[t] =
            (uint8_t)(x->share.dst_chunks[t] ? RESHARD_TENSOR_COMPLETE : RESHARD_TENSOR_NONE);
    x->last.executed = 1;
    x->last.on_nccl = 0;
}

/* ---- the executors ---- */

/* The native executor: the stages of stage.h, in order. */
reshard_status_t exec_run_all(struct exec *x, const reshard_buffers_t *bufs,
                              const reshard_buffers_t *dev, reshard_status_t pre)
{
    uint32_t seq = x->comm->seq++; /* every rank counts every execution, failed or not */
    struct exec_run *r = NULL;
    reshard_status_t local = pre != RESHARD_OK ? pre : stage_prepare(x, bufs, dev, seq, &r);
    reshard_status_t st = stage_vote(x, bufs, seq, local, r, 0);
    if (st != RESHARD_OK) { /* nothing moved: the communicator stays usable */
        exec_run_record(x, NULL);
        exec_run_free(r);
        return st;
    }
    if ((st = stage_source(r)) == RESHARD_OK && (st = stage_move(r)) == RESHARD_OK &&
        (st = stage_land(r)) == RESHARD_OK) {
        exec_run_record(x, r);
        exec_delta_done(x, r, bufs, 1);
        exec_run_free(r);
        return RESHARD_OK;
    }
    return stage_fail(r, st);
}

reshard_status_t exec_run_nccl(struct exec *x, const reshard_buffers_t *bufs, int on_stream,
                               void *stream)
{
    struct reshard_comm *c = x->comm;
    exec_run_record(x, NULL); /* until something is enqueued */
    if (!c->nccl)             /* the same on every rank: nobody waits */
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "RESHARD_EXECUTOR=nccl runs on a communicator made by "
                        "reshard_comm_init_nccl");
    uint32_t seq = c->seq++, rounds;
    const struct nccl_fns *f = nccl_lib();
    reshard_status_t local = f ? nccl_rounds(&x->xs, &rounds) : RESHARD_ERR_UNAVAILABLE;
    for (int t = 0; local == RESHARD_OK && t < x->plan->ntensors; t++)
        if (x->plan->tensors[t].quant == PLAN_QUANT_CAST)
            local = rs_error(RESHARD_ERR_INVALID_ARG,
                             "tensor '%s' is quantized on the way (%s -> %s), which "
                             "RESHARD_EXECUTOR=nccl does not do: use the native executor",
                             x->plan->tensors[t].name, dtype_name(x->plan->tensors[t].src.dtype),
                             dtype_name(x->plan->tensors[t].dst.dtype));
    reshard_status_t st = stage_vote(x, bufs, seq, local, NULL, 1);
    if (st != RESHARD_OK)
        return st;
    x->last.on_nccl = 1; /* no outcome: the stream owns completion */
    exec_delta_nccl(x);  /* what the destinations hold is NCCL's now */
    st = nccl_lower(x->plan, &x->xs, c->rank, bufs, f, c->nccl, stream);
    if (st == RESHARD_OK && !on_stream) { /* reshard_plan_execute returns when it is done */
        const struct cuda_fns *cu = cuda_lib();
        cu_result e = cu ? cu->stream_synchronize(NULL) : CU_SUCCESS;
        if (e != CU_SUCCESS)
            st = cuda_error("cuStreamSynchronize after the NCCL rounds", e);
        else
            record_completed(x);
    }
    if (st != RESHARD_OK) { /* what NCCL holds now is unknown: as after any failure in flight */
        c->broken = st;
        snprintf(c->broken_why, sizeof(c->broken_why), "%s", rs_error_message());
        boot_abort(c->boot, st, c->broken_why);
    }
    return st;
}
