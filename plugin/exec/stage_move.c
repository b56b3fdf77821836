/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Stage 4 of an execution (stage.h): the bytes move. Every receive is posted and the first sends
 * queued (exec_post.c), then the run waits while the queues drain: network sends, local writes
 * and their notices, device copies (exec_dev.c), and the acknowledgements that end it. Waiting,
 * it watches for an abort, for failures other ranks report and for a run that stopped moving.
 */
#include "stage.h"

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"

#include <sched.h>
#include <stdio.h>

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
    int idle_spins = 0, gone = -1; /* a rank heard to leave after its part */
    while (r->st == RESHARD_OK && !run_done(r)) {
        if (atomic_load(&x->comm->abort_req))
            return exec_run_fail(r, rs_error(RESHARD_ERR_ABORTED,
                                             "rank %d: execution aborted (reshard_comm_abort)",
                                             x->comm->rank));
        if (gone < 0 && rs_now_ms() >= next_check) { /* a rank that failed or aborted says so */
            reshard_status_t st = boot_check(x->comm->boot);
            if (exec_heard_leave(x->comm, st)) {
                gone = boot_left(x->comm->boot);
                rs_log(RS_LOG_INFO, "rank %d: rank %d left after its part of this execution",
                       x->comm->rank, gone);
                continue;
            }
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
        if (net->failed_peer >= 0 && net->failed_peer != gone) {
            /* a rank's own report names the cause better; a leaver's connection may close */
            if (gone < 0 && (st = boot_check(x->comm->boot)) != RESHARD_OK) {
                if (!exec_heard_leave(x->comm, st))
                    return exec_run_fail(r, st);
                gone = boot_left(x->comm->boot);
            }
            if (net->failed_peer != gone)
                return exec_run_fail(r, rs_error(RESHARD_ERR_NETWORK,
                                                 "rank %d: connection to rank %d failed: %s",
                                                 x->comm->rank, net->failed_peer, net->failed_why));
        }
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

reshard_status_t stage_move(struct exec_run *r)
{
    RS_CHECK(exec_post_start(r));
    return wait_done(r);
}
