/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The life of one execution: what a rank prepares before the others hear from it, the start
 * (exec_hello.c), the wait for every chunk while the queues drain (exec_post.c), and what a
 * failure leaves: a failure before any byte moved leaves the communicator usable; one after
 * breaks it, and the run's state stays until the requests still pointing into it complete.
 */
#include "exec_run.h"

#include "exec_nccl.h"
#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "base/param.h"
#include "cuda/cuda_lib.h"
#include "planner/dtype.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DRAIN_MS      1000 /* how long a failed run waits for its requests */
#define WAIT_CAP_MS   2    /* longest sleep: UCX over TCP may not re-signal a half-read socket */
#define SEND_SPINS    16   /* idle turns with sends in flight before sleeping on the transport */
#define SEND_WAIT_MS  1    /* ... and that sleep's cap */
#define BOOT_CHECK_MS 20   /* how often a run looks for failures the others report */
#define CAUSE_WAIT_MS 100  /* how long a failed run listens for another rank's report */

reshard_status_t exec_run_fail(struct exec_run *r, reshard_status_t st)
{
    if (r->st == RESHARD_OK) {
        r->st = st;
        snprintf(r->why, sizeof(r->why), "%s", rs_error_message());
    }
    return st;
}

/* ---- the run's memory ---- */

static void run_free(struct exec_run *r)
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

static void run_free_any(void *r)
{
    run_free(r);
}

static reshard_status_t run_create(struct exec *x, const reshard_buffers_t *bufs,
                                   const reshard_buffers_t *dev, uint32_t seq,
                                   struct exec_run **out)
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
        run_free(r);
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

/* ---- before the start ---- */

/* Packed sends use at most EXEC_SEND_WINDOW slots at once: no more are made. */
static reshard_status_t staging_init(struct exec *x)
{
    int64_t cap = rs_param_int(RS_PARAM_STAGING_BYTES) / x->cut.chunk_bytes;
    int slots = (int)(cap < 1 ? 1 : cap > EXEC_SEND_WINDOW ? EXEC_SEND_WINDOW : cap);
    return comm_staging(x->comm, x->cut.chunk_bytes, slots);
}

/* Everything this rank prepares before the others hear from it. */
static reshard_status_t prepare(struct exec *x, const reshard_buffers_t *bufs,
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
    RS_CHECK(run_create(x, bufs, dev, seq, r));
    (*r)->gdr = gdr;
    return dev ? exec_dev_stage_sources(*r, 0) : RESHARD_OK;
}

/* ---- the wait ---- */

/* Who this rank still waits for, for the timeout message. */
static void describe_wait(const struct exec_run *r, char *buf, size_t n)
{
    const struct exec *x = r->x;
    const struct exec_share *s = &x->share;
    size_t used = 0;
    int shown = 0;
    buf[0] = 0;
    for (size_t k = 0; k < s->nin && shown < 4 && used < n; k++) {
        size_t want = s->in_off[k + 1] - s->in_off[k];
        if (r->in_arrived[k] == want)
            continue;
        int w = snprintf(buf + used, n - used, "%s%zu chunk(s) from rank %d", shown++ ? ", " : "",
                         want - r->in_arrived[k], x->xs.x[s->in[k]].src);
        used += w > 0 ? (size_t)w : 0;
    }
    for (size_t i = 0; i < s->out_off[s->nout] && shown < 4 && used < n; i++) {
        const struct exec_req *c = &r->out_req[i];
        if (!c->req.handle)
            continue;
        int w = snprintf(buf + used, n - used, "%sa send of chunk %u to rank %d",
                         shown++ ? ", " : "", c->chunk, c->req.peer);
        used += w > 0 ? (size_t)w : 0;
    }
    for (int i = 0; i < s->nsend_peers && shown < 4 && used < n; i++) {
        if (!r->ack_in[i].req.handle)
            continue;
        int w = snprintf(buf + used, n - used, "%sthe acknowledgement of rank %d",
                         shown++ ? ", " : "", s->send_peers[i]);
        used += w > 0 ? (size_t)w : 0;
    }
    if (!shown && r->ipc_tail > r->ipc_head)
        snprintf(buf, n, "%zu device copies to complete", r->ipc_tail - r->ipc_head);
    else if (!shown)
        snprintf(buf, n, "%zu send(s) to complete", r->out_left);
}

static int run_done(const struct exec_run *r)
{
    return !r->in_left && !r->out_left && r->acked && !r->acks_in_left && !r->acks_out_left;
}

/* A peer's failure seen while this run waits may come after everything it needed arrived:
 * a rank returns once its acknowledgements are sent, and may exit before they are read. Given
 * a moment, the run completes, and succeeds; the failure stays with the bootstrap, for the
 * next collective to report. */
static int done_anyway(struct exec_run *r)
{
    struct tp_ctx *net = r->x->comm->net;
    for (int64_t end = rs_now_ms() + CAUSE_WAIT_MS; r->st == RESHARD_OK && !run_done(r);) {
        exec_dev_poll(r);
        if (exec_post_drain(r) != RESHARD_OK || rs_now_ms() >= end)
            break;
        if (!net->ops->progress(net))
            (void)net->ops->wait(net, WAIT_CAP_MS);
    }
    return r->st == RESHARD_OK && run_done(r);
}

static reshard_status_t wait_done(struct exec_run *r)
{
    struct exec *x = r->x;
    struct tp_ctx *net = x->comm->net;
    int timeout = comm_timeout_ms();
    r->last_event_ms = rs_now_ms();
    int64_t next_check = r->last_event_ms + BOOT_CHECK_MS;
    int idle_spins = 0;
    while (r->st == RESHARD_OK && !run_done(r)) {
        if (atomic_load(&x->comm->abort_req))
            return exec_run_fail(r, rs_error(RESHARD_ERR_ABORTED,
                                             "rank %d: execution aborted (reshard_comm_abort)",
                                             x->comm->rank));
        if (rs_now_ms() >= next_check) { /* a rank that failed or aborted says so here */
            reshard_status_t st = boot_check(x->comm->boot);
            if (st != RESHARD_OK && st != RESHARD_ERR_NETWORK)
                return exec_run_fail(r, st);
            if (st != RESHARD_OK && !done_anyway(r)) /* a rank gone: perhaps after its part */
                return exec_run_fail(r, st);
            next_check = rs_now_ms() + BOOT_CHECK_MS;
        }
        exec_dev_poll(r);
        reshard_status_t st = exec_post_drain(r);
        if (st != RESHARD_OK)
            return st;
        if (net->ops->progress(net)) {
            idle_spins = 0;
            continue;
        }
        if (r->st != RESHARD_OK || run_done(r))
            break;
        if (net->failed_peer >= 0) { /* a rank's own report names the cause better */
            st = boot_check(x->comm->boot);
            if (st != RESHARD_OK)
                return exec_run_fail(r, st);
        }
        if (net->failed_peer >= 0)
            return exec_run_fail(r, rs_error(RESHARD_ERR_NETWORK,
                                             "rank %d: connection to rank %d failed: %s",
                                             x->comm->rank, net->failed_peer, net->failed_why));
        int64_t idle = rs_now_ms() - r->last_event_ms;
        if (idle >= timeout) {
            char what[192];
            describe_wait(r, what, sizeof(what));
            return exec_run_fail(r, rs_error(RESHARD_ERR_TIMEOUT,
                                             "rank %d: no progress for %d s, still waiting for %s",
                                             x->comm->rank, timeout / 1000, what));
        }
        if (r->ipc_tail > r->ipc_head || (r->inflight > 0 && ++idle_spins < SEND_SPINS)) {
            /* Copies on the GPU signal nothing, and our own sends need our progress to leave:
             * poll, letting other ranks on this core run. */
            sched_yield();
            continue;
        }
        /* Sends still in flight after SEND_SPINS idle turns: sleep on the transport, briefly
         * (UCX over TCP does not always signal a socket that drained), rather than spin a core
         * other ranks need. */
        idle_spins = 0;
        int64_t left = timeout - idle, cap = r->inflight > 0 ? SEND_WAIT_MS : WAIT_CAP_MS;
        st = net->ops->wait(net, left < cap ? (int)left : (int)cap);
        if (st != RESHARD_OK)
            return exec_run_fail(r, st);
    }
    return r->st;
}

/* ---- after a failure in flight ---- */

/* Cancel the receives and let the callbacks run, for a while. Sends to a failed peer fail by
 * themselves (endpoints are in peer error mode); force-closing endpoints here instead made UCX
 * 1.13's TCP transport assert on a peer that had just died. */
static void drain_failed(struct exec_run *r)
{
    struct exec *x = r->x;
    const struct exec_share *s = &x->share;
    struct tp_ctx *net = x->comm->net;
    r->draining = 1;
    for (size_t i = 0; i < s->in_off[s->nin]; i++)
        if (r->in_req[i].req.handle)
            net->ops->cancel(net, &r->in_req[i].req);
    for (int i = 0; i < s->nsend_peers; i++)
        if (r->ack_in[i].req.handle)
            net->ops->cancel(net, &r->ack_in[i].req);
    if (x->comm->ipc) { /* nothing keeps writing into a peer once we return */
        (void)cuda_lib()->stream_synchronize(x->comm->ipc->stream);
        r->ipc_head = r->ipc_tail;
    }
    int64_t until = rs_now_ms() + DRAIN_MS;
    while (r->posted > 0 && rs_now_ms() < until)
        if (!net->ops->progress(net))
            (void)net->ops->wait(net, WAIT_CAP_MS);
}

/* A network failure here may be the echo of another rank's (its connections closed as it
 * stopped): that rank's own report, if it comes within CAUSE_WAIT_MS, names the cause. */
static void remote_cause(struct exec *x, struct exec_run *r)
{
    if (r->st != RESHARD_ERR_NETWORK) /* a timeout names whom it waited for: more precise */
        return;
    for (int64_t end = rs_now_ms() + CAUSE_WAIT_MS;; usleep(5000)) {
        reshard_status_t st = boot_check(x->comm->boot);
        if (st != RESHARD_OK) {
            r->st = st;
            snprintf(r->why, sizeof(r->why), "%s", rs_error_message());
            return;
        }
        if (rs_now_ms() >= end)
            return;
    }
}

/* A failure once bytes may be moving: the transports are in an unknown state. */
static void break_comm(struct exec *x, struct exec_run *r)
{
    struct reshard_comm *c = x->comm;
    c->broken = r->st;
    snprintf(c->broken_why, sizeof(c->broken_why), "%s", r->why);
    /* Peers that finished may enter the next collective: it fails at once instead of at the
     * timeout. */
    boot_abort(c->boot, r->st, r->why);
    drain_failed(r);
    /* Requests still pointing into it complete when the communicator closes its context; if
     * even that bookkeeping fails, it is leaked rather than freed under them. */
    if (r->posted == 0)
        run_free(r);
    else
        (void)comm_keep(c, run_free_any, r);
}

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

reshard_status_t exec_run_all(struct exec *x, const reshard_buffers_t *bufs,
                              const reshard_buffers_t *dev, reshard_status_t pre)
{
    struct reshard_comm *c = x->comm;
    uint32_t seq = c->seq++; /* every rank counts every execution, failed or not */
    struct exec_run *r = NULL;
    reshard_status_t local = pre != RESHARD_OK ? pre : prepare(x, bufs, dev, seq, &r);
    struct rs_saved_error why;
    rs_error_save(&why);
    reshard_status_t st = exec_hello_exchange(x, bufs, seq, local, r, 0);
    if (st == local && local != RESHARD_OK)
        rs_error_restore(&why);
    if (st != RESHARD_OK) { /* nothing moved: the communicator stays usable */
        exec_run_record(x, NULL);
        run_free(r);
        return st;
    }
    st = dev ? exec_dev_stage_sources(r, 1) : RESHARD_OK; /* local peers that stage after all */
    if (st == RESHARD_OK) /* what this rank sends quantized, before it sends it */
        st = exec_quant_at_src(x, bufs, dev);
    if (st == RESHARD_OK)
        st = exec_post_start(r);
    if (st == RESHARD_OK)
        st = wait_done(r);
    if (st == RESHARD_OK)
        st = exec_quant_landed(x, bufs, dev, NULL);
    if (st == RESHARD_OK)
        test_corrupt(x, bufs);
    if (st == RESHARD_OK && r->gdr_landed) /* the caller's kernels see what the NIC wrote */
        st = cuda_flush_rdma_writes();
    if (st == RESHARD_OK) {
        exec_run_record(x, r);
        run_free(r);
        return RESHARD_OK;
    }
    exec_run_fail(r, st); /* the first failure's message, not its echoes */
    remote_cause(x, r);
    /* A weight quantized where it lands, every chunk of it here: quantized now, so that the
     * outcome's "complete" holds the new values as for any tensor. */
    (void)exec_quant_landed(x, bufs, dev, r->dst_left); /* the run's failure is the one told */
    exec_run_record(x, r);
    break_comm(x, r);
    return rs_error(c->broken, "%s", c->broken_why);
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
    struct rs_saved_error why;
    rs_error_save(&why);
    reshard_status_t st = exec_hello_exchange(x, bufs, seq, local, NULL, 1);
    if (st == local && local != RESHARD_OK)
        rs_error_restore(&why);
    if (st != RESHARD_OK)
        return st;
    x->last.on_nccl = 1; /* no outcome: the stream owns completion */
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
