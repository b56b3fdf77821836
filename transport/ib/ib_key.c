/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A receive's keys: the only remote access the ibverbs transport ever grants, made for one
 * receive and taken back before it completes.
 *
 * With type 2 memory windows (the default where the device has them), a receive of cap bytes
 * gets one window per queue pair its message may be striped over, each bound over exactly
 * [buf, buf + cap) on that queue pair: a window of type 2 answers only writes that arrive on
 * the queue pair it was bound on, so no other peer's connection can use it, and each bind
 * gives it a new key. The CTS goes once every bind has completed; when the receive's outcome
 * is known its windows are invalidated, and the receive completes once they are: a late or
 * replayed write then finds no key, and the caller's memory is not writable from the network
 * between two transfers. Windows are allocated per peer as receives need them and reused.
 *
 * Without windows (RESHARD_IB_MEM_WINDOWS=0, or a device without them) a receive registers
 * exactly its bytes with remote write and deregisters them when it ends: the key is as short
 * lived and as narrow, but any of the context's queue pairs could use it meanwhile.
 */
#include "ib_int.h"

#include "base/error.h"
#include "base/log.h"
#include "base/param.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void ib_key_probe(struct ib_ctx *x, const struct ibv_device_attr *da)
{
    x->windows = 0;
    const char *why = NULL;
    struct ibv_mw *mw = NULL;
    if (!rs_param_int(RS_PARAM_IB_MEM_WINDOWS))
        why = "RESHARD_IB_MEM_WINDOWS=0";
    else if (!(da->device_cap_flags &
               (IBV_DEVICE_MEM_WINDOW_TYPE_2A | IBV_DEVICE_MEM_WINDOW_TYPE_2B)))
        why = "the device has no type 2 memory windows";
    else if (!(mw = ibv_alloc_mw(x->pd, IBV_MW_TYPE_2)))
        why = "ibv_alloc_mw(type 2) failed";
    if (mw)
        ibv_dealloc_mw(mw);
    x->windows = !why;
    if (why)
        rs_log(RS_LOG_INFO, "ib: %s: %s; each receive registers its own bytes instead",
               x->port.name, why);
}

/* A window of the peer's, free to bind. */
static struct ib_win *win_get(struct ib_ctx *x, struct ib_peer *p)
{
    struct ib_win *w = p->win_free;
    if (w) {
        p->win_free = w->next;
        w->next = NULL;
        return w;
    }
    struct ib_win **all = rs_grow(p->wins, &p->wins_cap, p->nwins + 1, sizeof(*all), "ib windows");
    if (!all)
        return NULL;
    p->wins = all;
    if (!(w = rs_calloc(1, sizeof(*w), "an ib memory window")))
        return NULL;
    if (!(w->mw = ibv_alloc_mw(x->pd, IBV_MW_TYPE_2))) {
        rs_error(RESHARD_ERR_NO_MEMORY,
                 "ib: no memory window for a receive from rank %d (%zu in use for it): %m",
                 p->index, p->nwins);
        free(w);
        return NULL;
    }
    w->peer = p;
    p->wins[p->nwins++] = w;
    return w;
}

static void win_put(struct ib_peer *p, struct ib_win *w)
{
    w->state = WIN_FREE;
    w->recv = NULL;
    w->next = p->win_free;
    p->win_free = w;
}

reshard_status_t ib_key_make(struct ib_ctx *x, struct ib_recv *r)
{
    struct ib_peer *p = r->peer;
    r->nkeys = ib_keys_for(r->cap, x->nqp);
    if (r->nkeys && !r->wmr) { /* a registration of its own bytes */
        if (!(r->xmr = ib_mr_exact(x, r->reg, r->buf, r->cap)))
            return RESHARD_ERR_NETWORK;
        for (int q = 0; q < r->nkeys; q++)
            r->rkey[q] = r->xmr->rkey;
    }
    if (!r->nkeys || r->xmr) {
        ib_recv_offer(x, r);
        return RESHARD_OK;
    }
    for (int q = 0; q < r->nkeys; q++)
        if (!(r->win[q] = win_get(x, p))) {
            while (q--)
                win_put(p, r->win[q]);
            memset(r->win, 0, sizeof(r->win));
            return RESHARD_ERR_NO_MEMORY;
        }
    for (int q = 0; q < r->nkeys; q++) {
        struct ib_win *w = r->win[q];
        w->recv = r;
        w->qp = q;
        w->state = WIN_BINDING;
        r->binds++;
    }
    for (int q = 0; q < r->nkeys; q++)
        if (ib_queue_work(x, p, &(struct ib_work){.kind = W_BIND, .win = r->win[q]}) !=
            RESHARD_OK) {
            ib_peer_down(x, p, RESHARD_ERR_NETWORK, rs_error_message()); /* completes r */
            break;
        }
    return RESHARD_OK;
}

reshard_status_t ib_key_post(struct ib_ctx *x, struct ib_peer *p, const struct ib_work *k)
{
    struct ib_win *w = k->win;
    struct ibv_send_wr wr = {.wr_id = (uintptr_t)w | 3, .send_flags = IBV_SEND_SIGNALED}, *bad;
    uint32_t rkey = 0;
    if (k->kind == W_BIND) {
        rkey = ibv_inc_rkey(w->mw->rkey); /* a new key for each binding */
        const struct ib_recv *r = w->recv;
        wr.opcode = IBV_WR_BIND_MW;
        wr.bind_mw.mw = w->mw;
        wr.bind_mw.rkey = rkey;
        wr.bind_mw.bind_info =
            (struct ibv_mw_bind_info){.mr = r->wmr,
                                      .addr = (uintptr_t)r->buf,
                                      .length = r->cap,
                                      .mw_access_flags = IBV_ACCESS_REMOTE_WRITE};
    } else {
        wr.opcode = IBV_WR_LOCAL_INV;
        wr.invalidate_rkey = w->rkey;
    }
    if (ibv_post_send(p->qp[w->qp], &wr, &bad))
        return ib_qp_fail(x, p,
                          k->kind == W_BIND ? "ibv_post_send (bind a memory window)"
                                            : "ibv_post_send (invalidate a memory window)");
    if (k->kind == W_BIND) /* the window's key as the device now knows it */
        w->rkey = w->mw->rkey = rkey;
    p->sq_used[w->qp]++;
    return RESHARD_OK;
}

/* Queues the invalidation of a bound window; 0 when the peer failed instead (r is gone). */
static int invalidate(struct ib_ctx *x, struct ib_win *w)
{
    struct ib_peer *p = w->peer;
    w->state = WIN_INVALIDATING;
    w->recv->invs++;
    if (ib_queue_work(x, p, &(struct ib_work){.kind = W_INV, .win = w}) == RESHARD_OK)
        return 1;
    ib_peer_down(x, p, RESHARD_ERR_NETWORK, rs_error_message());
    return 0;
}

void ib_key_done(struct ib_ctx *x, struct ib_win *w, int ok)
{
    struct ib_recv *r = w->recv;
    if (!ok || w->state == WIN_DEAD || !r) { /* the peer failed: the QP took the window */
        w->state = WIN_DEAD;
        w->recv = NULL;
        return;
    }
    if (w->state == WIN_BINDING) {
        w->state = WIN_BOUND;
        r->rkey[w->qp] = w->rkey;
        r->binds--;
        if (r->finishing) {
            if (invalidate(x, w) && !r->binds && !r->invs)
                ib_recv_complete(x, r);
        } else if (!r->binds) {
            ib_recv_offer(x, r);
        }
    } else if (w->state == WIN_INVALIDATING) {
        win_put(w->peer, w);
        if (!--r->invs && !r->binds)
            ib_recv_complete(x, r);
    }
}

int ib_key_retire(struct ib_ctx *x, struct ib_recv *r)
{
    if (r->xmr) { /* the key dies with its registration */
        x->f->dereg_mr(r->xmr);
        r->xmr = NULL;
    }
    for (int q = 0; q < r->nkeys; q++) /* binding: invalidated once bound (ib_key_done) */
        if (r->win[q] && r->win[q]->state == WIN_BOUND && !invalidate(x, r->win[q]))
            return 0;
    return !r->binds && !r->invs;
}

/* Deallocates a window's verbs object (ibv_dealloc_mw), which also unbinds it. */
static void mw_free(struct ib_ctx *x, struct ib_win *w)
{
    if (w->mw && ibv_dealloc_mw(w->mw))
        rs_log(RS_LOG_WARN, "ib: %s: ibv_dealloc_mw for rank %d: %s", x->port.name, w->peer->index,
               strerror(errno));
    w->mw = NULL;
}

/* A window that may still be bound (its QP is in error, so it can be neither used nor
 * invalidated) is deallocated now: a registration under a bound window cannot be
 * deregistered. Its struct stays, for the flushed completions that name it. */
void ib_key_abandon(struct ib_ctx *x, struct ib_recv *r)
{
    if (r->xmr) {
        x->f->dereg_mr(r->xmr);
        r->xmr = NULL;
    }
    for (int q = 0; q < r->nkeys; q++)
        if (r->win[q]) {
            mw_free(x, r->win[q]);
            r->win[q]->state = WIN_DEAD; /* its struct goes with the peer */
            r->win[q]->recv = NULL;
            r->win[q] = NULL;
        }
    r->binds = r->invs = 0;
}

void ib_key_free_peer(struct ib_ctx *x, struct ib_peer *p)
{
    for (size_t i = 0; i < p->nwins; i++) {
        mw_free(x, p->wins[i]);
        free(p->wins[i]);
    }
    free(p->wins);
    p->wins = NULL;
    p->nwins = p->wins_cap = 0;
    p->win_free = NULL;
}
