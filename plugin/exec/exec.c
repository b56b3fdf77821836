/* SPDX-License-Identifier: Apache-2.0 */
/*
 * An executor: one plan's transfer list as this rank runs it, made of the objects exec_int.h
 * lists, and the entry that picks how an execution runs (native on host buffers, native through
 * host shadows of device buffers, or lowered to NCCL).
 *
 * Every transfer is cut into chunks (exec_chunk.c), the same way on both sides, so a chunk is
 * named by (transfer, chunk) in message tags and the fan-out of a received chunk can start
 * before the rest of its transfer arrives. An execution on the native executor is a sequence of
 * stages, one file each, that stage.h lists in order and exec_run_all (exec_run.c) calls; how
 * a run posts chunks is in exec_post.c, its start in exec_hello.c, device buffers in exec_dev.c.
 */
#include "exec_run.h"

#include "exec_delta_dev.h"

#include "exec_tag.h"
#include "predict.h"
#include "base/error.h"
#include "base/param.h"
#include "cuda/cuda_lib.h"

#include <stdlib.h>
#include <string.h>

static reshard_status_t last_init(struct exec_last *l, int ntensors)
{
    *l = (struct exec_last){0};
    l->state = rs_calloc((size_t)ntensors, 1, "tensor outcomes");
    return l->state ? RESHARD_OK : RESHARD_ERR_NO_MEMORY;
}

static void last_fini(struct exec_last *l)
{
    free(l->state);
    *l = (struct exec_last){0};
}

reshard_status_t exec_create(struct reshard_comm *comm, const struct rs_plan *plan,
                             struct xfer_set *xs, struct exec **out)
{
    struct exec *x = rs_calloc(1, sizeof(*x), "executor");
    if (!x) {
        xfer_free(xs);
        return RESHARD_ERR_NO_MEMORY;
    }
    x->comm = comm;
    x->plan = plan;
    x->xs = *xs;
    memset(xs, 0, sizeof(*xs));
    exec_cut_init(&x->cut, plan, &x->xs);
    struct exec_share *s = &x->share;
    reshard_status_t st;
    RS_CHECK_GOTO(exec_links_build(x), st, err_destroy); /* first: it may reroute transfers */
    RS_CHECK_GOTO(exec_regs_init(&x->regs, plan->ntensors), st, err_destroy);
    RS_CHECK_GOTO(exec_share_init(s, &x->cut, comm->rank, comm->size), st, err_destroy);
    RS_CHECK_GOTO(last_init(&x->last, plan->ntensors), st, err_destroy);
    RS_CHECK_GOTO(exec_quant_init(&x->quant, plan, &x->xs, comm->rank), st, err_destroy);
    RS_CHECK_GOTO(exec_bundles_build(&x->cut, s->out, s->nout, s->out_off, 1, &x->out_b), st,
                  err_destroy);
    RS_CHECK_GOTO(exec_bundles_build(&x->cut, s->in, s->nin, s->in_off, 0, &x->in_b), st,
                  err_destroy);
    RS_CHECK_GOTO(exec_tags_number(&x->cut, s->out, s->nout, s->out_off, &x->out_b, 1, s->out_tag),
                  st, err_destroy);
    RS_CHECK_GOTO(exec_tags_number(&x->cut, s->in, s->nin, s->in_off, &x->in_b, 0, s->in_tag), st,
                  err_destroy);
    RS_CHECK_GOTO(exec_share_connect(s, &x->xs, comm->net), st, err_destroy);
    *out = x;
    return RESHARD_OK;
err_destroy: /* every fini takes what its init left, made or not */
    exec_destroy(x);
    return st;
}

void exec_destroy(struct exec *x)
{
    if (!x)
        return;
    int nt = x->plan->ntensors;
    exec_regs_fini(&x->regs, x->comm);
    exec_tmp_fini(&x->tmp, nt, x->comm);
    exec_quant_fini(&x->quant, nt, x->comm);
    exec_shadows_fini(&x->shadows, nt, x->comm);
    exec_exports_fini(&x->exp, nt);
    exec_links_fini(&x->links);
    exec_share_fini(&x->share);
    exec_bundles_fini(&x->out_b);
    exec_bundles_fini(&x->in_b);
    last_fini(&x->last);
    exec_delta_fini(&x->delta, nt, x->comm);
    xfer_free(&x->xs);
    free(x);
}

/* The native executor on a stream: what is queued there first finishes. Without a driver
 * the default stream (NULL) can hold no work; another stream is a mistake. */
static reshard_status_t wait_stream(int on_stream, void *stream)
{
    if (!on_stream)
        return RESHARD_OK;
    struct rs_saved_error caller;
    rs_error_save(&caller);
    const struct cuda_fns *f = cuda_lib();
    if (!f && !stream) {
        rs_error_restore(&caller); /* the caller's message, as it was */
        return RESHARD_OK;
    }
    if (!f) {
        struct rs_saved_error why;
        rs_error_save(&why);
        return rs_error(RESHARD_ERR_INVALID_ARG, "a CUDA stream, but %s", why.msg);
    }
    cu_result r = f->stream_synchronize(stream);
    return r == CU_SUCCESS ? RESHARD_OK : cuda_error("cuStreamSynchronize", r);
}

reshard_status_t exec_run(struct exec *x, const reshard_buffers_t *bufs, int on_stream,
                          void *stream)
{
    struct reshard_comm *c = x->comm;
    const char *executor = rs_param_str(RS_PARAM_EXECUTOR);
    int on_nccl = c->nccl_executor || !strcmp(executor, "nccl");
    if (!on_nccl && strcmp(executor, "native"))
        return rs_error(RESHARD_ERR_INVALID_ARG, "RESHARD_EXECUTOR=%s: expected native or nccl",
                        executor);
    int idle = 0;
    if (!atomic_compare_exchange_strong(&c->busy, &idle, 1))
        return rs_error(RESHARD_ERR_BUSY,
                        "the communicator is already executing (this plan or another, from "
                        "another thread)");
    if (atomic_load(&c->abort_req))
        comm_abort_now(c);
    x->last.on_nccl = 0;
    reshard_status_t st = comm_usable(c), quant = RESHARD_OK;
    if (st == RESHARD_OK && !on_nccl && (quant = exec_quant_check(x, bufs)) != RESHARD_OK)
        st = exec_run_all(x, bufs, NULL, quant); /* every rank hears why */
    else if (st == RESHARD_OK && on_nccl)
        st = exec_run_nccl(x, bufs, on_stream, stream);
    else if (st == RESHARD_OK && exec_dev_any(x, bufs) &&
             (st = wait_stream(1, on_stream ? stream : NULL)) == RESHARD_OK)
        st = exec_dev_run(x, bufs); /* copies run on a stream of ours: the caller's work first */
    else if (st == RESHARD_OK && (st = wait_stream(on_stream, stream)) == RESHARD_OK)
        st = exec_run_all(x, bufs, NULL, RESHARD_OK);
    else
        exec_run_record(x, NULL); /* nothing moved this time */
    atomic_store(&c->busy, 0);
    return st;
}

struct reshard_comm *exec_comm(const struct exec *x)
{
    return x->comm;
}

reshard_status_t exec_settle(const struct exec *x, int on_stream, void *stream)
{
    return x->last.on_nccl && on_stream ? wait_stream(1, stream) : RESHARD_OK;
}

reshard_status_t exec_outcome(const struct exec *x, reshard_tensor_state_t *states)
{
    if (x->last.on_nccl)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "the last execution was enqueued on NCCL: it completes on the stream, "
                        "which knows its outcome");
    if (!x->last.executed)
        return rs_error(RESHARD_ERR_INVALID_ARG, "the plan has not been executed yet");
    for (int t = 0; t < x->plan->ntensors; t++)
        states[t] = (reshard_tensor_state_t)x->last.state[t];
    return RESHARD_OK;
}

void exec_own_stats(const struct exec *x, reshard_rank_stats_t *mine)
{
    int me = x->comm->rank;
    reshard_rank_stats_t b = {.domain = x->plan->topo.domain[me],
                              .local_index = x->plan->topo.local_index[me]};
    for (size_t i = 0; i < x->xs.n; i++) {
        const struct xfer *xf = &x->xs.x[i];
        uint64_t bytes = (uint64_t)xf->bytes;
        if (xf->src != me && xf->dst != me)
            continue;
        if (xf->path == XFER_SELF)
            b.self += bytes;
        else if (xf->path == XFER_LOCAL)
            *(xf->src == me ? &b.local_out : &b.local_in) += bytes;
        else
            *(xf->src == me ? &b.net_out : &b.net_in) += bytes;
    }
    b.delta_snapshot = exec_delta_snapshot_bytes(x);
    b.delta_snapshot_device = exec_delta_dev_held(x);
    *mine = b;
}

void exec_delta_enable(struct exec *x, int on)
{
    x->delta.on = on != 0;
}

void exec_verify_enable(struct exec *x, int on)
{
    x->quant.verify = on != 0;
}

uint64_t exec_local_fp(const struct exec *x)
{
    return x->links.local_fp;
}

void exec_set_world(struct exec *x, const reshard_plan_stats_t *world)
{
    x->world = *world;
    x->world.ntensors = x->plan->ntensors;
    x->world.world_size = x->plan->topo.nranks;
    x->world.ndomains = x->plan->topo.ndomains;
}

reshard_status_t exec_stats(const struct exec *x, reshard_plan_stats_t *stats,
                            reshard_rank_stats_t *ranks)
{
    int n = x->comm->size, me = x->comm->rank;
    reshard_rank_stats_t mine;
    exec_own_stats(x, &mine);
    if (ranks) {
        uint64_t *msgs = rs_calloc((size_t)n, sizeof(*msgs), "message counts");
        if (!msgs)
            return RESHARD_ERR_NO_MEMORY;
        reshard_status_t st = predict_msgs(x->plan, &x->xs, n, msgs);
        mine.net_msgs = msgs[me];
        free(msgs);
        RS_CHECK(st);
        memset(ranks, 0, (size_t)n * sizeof(*ranks));
        ranks[me] = mine;
    }
    *stats = x->world;
    return RESHARD_OK;
}
