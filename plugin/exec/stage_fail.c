/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Stage 6 of an execution (stage.h): a failure once bytes may be moving. The transports are
 * then in an unknown state: the communicator is broken, every rank hears so, and the run's
 * state stays until the requests still pointing into it complete.
 */
#include "stage.h"

#include "base/clock.h"
#include "base/error.h"
#include "cuda/cuda_lib.h"

#include <stdio.h>
#include <unistd.h>

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
        exec_run_free(r);
    else
        (void)comm_keep(c, exec_run_free_any, r);
}

reshard_status_t stage_fail(struct exec_run *r, reshard_status_t st)
{
    struct exec *x = r->x;
    struct reshard_comm *c = x->comm;
    exec_run_fail(r, st); /* the first failure's message, not its echoes */
    remote_cause(x, r);
    /* A weight quantized where it lands, every chunk of it here: quantized now, so that the
     * outcome's "complete" holds the new values as for any tensor. */
    (void)exec_quant_landed(x, r->bufs, r->dev, r->dst_left,
                            r->sparse); /* the run's failure is told */
    exec_run_record(x, r);
    exec_delta_done(x, r, r->bufs, 0); /* never a delta on what this run left */
    break_comm(x, r);
    return rs_error(c->broken, "%s", c->broken_why);
}
