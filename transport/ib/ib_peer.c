/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A peer of the ibverbs transport, from its address to its teardown. set_peer makes it (state
 * P_ADDR); the first transfer or connect starts its handshake (ib_cm.c); a failure or an orderly
 * close takes it down, which stops its queue pairs and completes everything bound to it. A
 * closed peer waits in the grave until its queue pairs have flushed every work request, since
 * completions still name it; then it is freed.
 */
#include "ib_int.h"

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct ib_peer *get_peer(struct ib_ctx *x, int peer)
{
    return peer >= 0 && (size_t)peer < x->npeers ? x->peers[peer] : NULL;
}

reshard_status_t ib_set_peer(struct tp_ctx *c, int peer, const void *addr, size_t len)
{
    struct ib_ctx *x = to_ib(c);
    struct ib_wire_addr a;
    char why[96];
    if (peer < 0)
        return rs_error(RESHARD_ERR_INTERNAL, "ib: peer %d is not a peer", peer);
    if (ib_addr_check(addr, len, &a, why, sizeof(why)))
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "ib: rank %d: %s (%zu bytes expected: do all ranks use "
                        "RESHARD_TRANSPORT=ib?)",
                        peer, why, sizeof(a));
    if ((size_t)peer >= x->npeers) {
        size_t cap = x->npeers;
        struct ib_peer **p = rs_grow(x->peers, &cap, (size_t)peer + 1, sizeof(*p), "ib peers");
        if (!p)
            return RESHARD_ERR_NO_MEMORY;
        memset(p + x->npeers, 0, (cap - x->npeers) * sizeof(*p));
        x->peers = p;
        x->npeers = cap;
    }
    if (x->peers[peer])
        return rs_error(RESHARD_ERR_INTERNAL, "ib: rank %d set twice", peer);
    struct ib_peer *p = calloc(1, sizeof(*p));
    if (!p)
        return rs_error(RESHARD_ERR_NO_MEMORY, "ib: no memory for a peer");
    p->index = peer;
    p->state = P_ADDR;
    p->addr = a;
    p->fd = -1;
    p->nqp = x->nqp;
    p->preferred = x->nonce != a.nonce ? x->nonce < a.nonce : peer < ib_cm_remote_index(x, p);
    p->sends_tail = &p->sends;
    p->cts_tail = &p->cts;
    p->out_tail = &p->out;
    x->peers[peer] = p;
    if (x->stash)
        ib_cm_serve_stash(x); /* its HELLO may be waiting already */
    return RESHARD_OK;
}

reshard_status_t ib_peer_usable(struct ib_ctx *x, int peer, struct ib_peer **out)
{
    struct ib_peer *p = get_peer(x, peer);
    if (!p)
        return rs_error(RESHARD_ERR_INTERNAL, "ib: no address for rank %d", peer);
    if (p->state == P_DOWN)
        return rs_error(RESHARD_ERR_NETWORK, "ib: rank %d is gone: %s", peer,
                        x->super.failed_peer == peer ? x->super.failed_why : "closed");
    RS_CHECK(ib_cm_start(x, p));
    *out = p;
    return RESHARD_OK;
}

reshard_status_t ib_connect(struct tp_ctx *c, int peer)
{
    struct ib_peer *p;
    return ib_peer_usable(to_ib(c), peer, &p);
}

/* The peer is gone (or leaving): its QPs stop, everything bound to it completes with st. */
void ib_peer_down(struct ib_ctx *x, struct ib_peer *p, reshard_status_t st, const char *reason)
{
    if (p->state == P_DOWN || p->state == P_NONE)
        return;
    char why[RS_ERROR_MAX]; /* reason may be the thread's message, which rs_error rewrites */
    snprintf(why, sizeof(why), "%s", reason);
    int was = p->state;
    p->state = P_DOWN;
    if (was == P_CONNECTING)
        x->handshakes--;
    if (st != RESHARD_OK && x->super.failed_peer < 0) {
        x->super.failed_peer = p->index;
        snprintf(x->super.failed_why, sizeof(x->super.failed_why), "%.*s",
                 (int)sizeof(x->super.failed_why) - 1, why);
    }
    if (st != RESHARD_OK)
        rs_log(RS_LOG_WARN, "ib: rank %d: %s", p->index, why);
    ib_qp_break(x, p);
    /* So the peer says why, not "died", and an initiator does not take it for a dropped
     * connection to try again. */
    if (st != RESHARD_OK && (was == P_UP || was == P_CONNECTING) && p->fd >= 0 &&
        !p->connecting_tcp)
        ib_cm_goodbye(p, HS_FAIL);
    sock_close(&p->fd);
    reshard_status_t fail = st == RESHARD_OK ? RESHARD_ERR_NETWORK : st;
    if (st != RESHARD_OK) /* an orderly close leaves the caller's last message alone */
        rs_error(fail, "ib: rank %d: %s", p->index, why);
    while (p->sends) {
        struct ib_send *s = p->sends;
        p->sends = s->next;
        ib_send_fail(x, s, fail);
    }
    p->sends_tail = &p->sends;
    while (p->out) {
        struct ib_work *w = p->out;
        p->out = w->next;
        if (w->kind == W_WRITE)
            ib_send_fail(x, w->send, fail);
        free(w);
    }
    p->out_tail = &p->out;
    while (p->cts) {
        struct ib_cts *c = p->cts;
        p->cts = c->next;
        free(c);
    }
    p->cts_tail = &p->cts;
    p->ncts = 0;
    while (p->recvs) { /* its QPs are in error: nothing more lands, no key is left to take back */
        struct ib_recv *r = p->recvs;
        ib_key_abandon(x, r);
        if (!r->finishing) /* else its outcome (data that landed whole) stands */
            r->st = fail;
        ib_recv_complete(x, r);
    }
}

/* Orderly: says goodbye, then everything still bound to the peer completes. */
static void leave(struct ib_ctx *x, struct ib_peer *p)
{
    if (p->fd >= 0 && p->state == P_UP)
        ib_cm_goodbye(p, HS_BYE);
    ib_peer_down(x, p, RESHARD_OK, "closed by this rank");
}

void ib_close_peer(struct tp_ctx *c, int peer)
{
    struct ib_ctx *x = to_ib(c);
    struct ib_peer *p = get_peer(x, peer);
    if (!p)
        return;
    leave(x, p);
    x->peers[peer] = NULL; /* the index may serve another peer; the QPs wait for close */
    p->grave_next = x->grave;
    x->grave = p;
}

static void peer_free(struct ib_ctx *x, struct ib_peer *p)
{
    ib_key_free_peer(x, p);
    ib_qp_teardown(x, p);
    free(p);
}

/* Closed peers whose queue pairs have flushed every work request: nothing can refer to them
 * any more, so their QPs and buffers go, and the CQ room they held is free again. */
void ib_peer_reap_grave(struct ib_ctx *x)
{
    for (struct ib_peer **at = &x->grave; *at;) {
        struct ib_peer *p = *at;
        int busy = p->rq_posted;
        for (int i = 0; i < p->nqp; i++)
            busy += p->sq_used[i];
        if (busy) {
            at = &p->grave_next;
            continue;
        }
        *at = p->grave_next;
        peer_free(x, p);
    }
}

/* Work requests still posted to peers that are down (their flushes are on the way). */
static int in_flight(const struct ib_ctx *x)
{
    int n = 0;
    for (size_t i = 0; i < x->npeers; i++) {
        const struct ib_peer *p = x->peers[i];
        for (int q = 0; p && q < p->nqp; q++)
            n += p->sq_used[q];
        n += p ? p->rq_posted : 0;
    }
    for (const struct ib_peer *p = x->grave; p; p = p->grave_next) {
        for (int q = 0; q < p->nqp; q++)
            n += p->sq_used[q];
        n += p->rq_posted;
    }
    return n;
}

void ib_disconnect(struct tp_ctx *c)
{
    struct ib_ctx *x = to_ib(c);
    for (size_t i = 0; i < x->npeers; i++)
        if (x->peers[i])
            leave(x, x->peers[i]);
    int64_t end = rs_now_ms() + 1000; /* flushes complete sends already on the wire */
    while (in_flight(x) && rs_now_ms() < end)
        if (!ib_cq_poll(x))
            usleep(1000);
    ib_deliver(x);
}

void ib_peer_free_all(struct ib_ctx *x)
{
    for (size_t i = 0; i < x->npeers; i++)
        if (x->peers[i])
            peer_free(x, x->peers[i]);
    while (x->grave) {
        struct ib_peer *p = x->grave;
        x->grave = p->grave_next;
        peer_free(x, p);
    }
}

void tp_ib_break_peer(struct tp_ctx *c, int peer)
{
    struct ib_ctx *x = to_ib(c);
    struct ib_peer *p = get_peer(x, peer);
    if (p)
        ib_qp_break(x, p);
}
