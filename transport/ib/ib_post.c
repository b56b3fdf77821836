/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Requests of the ibverbs transport and the work they post. A receive takes an id (its
 * immediate data names it) and sends its buffer to the sender as a CTS; a send waits for the
 * CTS with its tag, then writes into the buffer, striped across the peer's QPs. Everything a
 * peer posts goes through its FIFO of work, posted in order while the send queues have room.
 * Requests end here too: finished, failed or freed.
 */
#include "ib_int.h"

#include "base/error.h"

#include <arpa/inet.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- receive ids ---- */

static reshard_status_t id_alloc(struct ib_ctx *x, struct ib_recv *r)
{
    uint32_t id;
    if (x->nfree_ids) {
        id = x->free_ids[--x->nfree_ids];
    } else {
        if (x->next_id >= IB_MAX_RECV_ID)
            return rs_error(RESHARD_ERR_TOO_LARGE, "ib: more than %u receives outstanding",
                            (unsigned)IB_MAX_RECV_ID);
        id = (uint32_t)++x->next_id;
        if (id >= x->ids_cap) {
            size_t cap = x->ids_cap;
            struct ib_recv **ids = rs_grow(x->ids, &cap, (size_t)id + 1, sizeof(*ids), "ib ids");
            uint32_t *fr = ids ? realloc(x->free_ids, cap * sizeof(*fr)) : NULL;
            if (!ids || !fr) {
                if (ids)
                    x->ids = ids;
                x->next_id--;
                return rs_error(RESHARD_ERR_NO_MEMORY, "ib: no memory for receive ids");
            }
            memset(ids + x->ids_cap, 0, (cap - x->ids_cap) * sizeof(*ids)); /* stray imms */
            x->ids = ids;
            x->free_ids = fr;
            x->ids_cap = cap;
        }
    }
    x->ids[id] = r;
    r->id = id;
    return RESHARD_OK;
}

static void id_free(struct ib_ctx *x, uint32_t id)
{
    x->ids[id] = NULL;
    x->free_ids[x->nfree_ids++] = id;
}

/* ---- posted receives, and the ends of requests ---- */

reshard_status_t ib_post_slot(struct ib_ctx *x, struct ib_peer *p, struct ib_slot *s)
{
    struct ibv_sge sge = {
        .addr = (uintptr_t)&s->ctl, .length = sizeof(s->ctl), .lkey = p->rx_mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = (uintptr_t)s | 2, .sg_list = &sge, .num_sge = 1}, *bad;
    if (ibv_post_recv(p->qp[s->qp], &wr, &bad))
        return ib_qp_fail(x, p, "ibv_post_recv");
    p->rq_posted++;
    return RESHARD_OK;
}

static void recv_unlink(struct ib_peer *p, struct ib_recv *r)
{
    if (r->prev)
        r->prev->next = r->next;
    else
        p->recvs = r->next;
    if (r->next)
        r->next->prev = r->prev;
}

void ib_send_free(struct ib_ctx *x, struct ib_send *s)
{
    if (s->transient)
        ib_tmr_put(x, s->mr);
    if (s->all_prev)
        s->all_prev->all_next = s->all_next;
    else
        x->all_sends = s->all_next;
    if (s->all_next)
        s->all_next->all_prev = s->all_prev;
    free(s);
}

void ib_recv_complete(struct ib_ctx *x, struct ib_recv *r)
{
    reshard_status_t st = r->st;
    size_t got = st == RESHARD_OK ? r->got : 0;
    if (st == RESHARD_OK && r->bounce)
        ib_bounce_scatter(r->iov, r->niov, r->buf, got);
    if (st == RESHARD_OK)
        x->super.counters.bytes_in += got;
    recv_unlink(r->peer, r);
    id_free(x, r->id);
    if (r->tmr)
        ib_tmr_put(x, r->tmr);
    if (r->xmr)
        x->f->dereg_mr(r->xmr);
    ib_bounce_put(x, r->bounce);
    ib_complete(x, r->req, st, got);
    free(r);
}

void ib_recv_finish(struct ib_ctx *x, struct ib_recv *r, reshard_status_t st)
{
    if (r->finishing) /* the first outcome stands */
        return;
    r->finishing = 1;
    r->st = st;
    if (ib_key_retire(x, r))
        ib_recv_complete(x, r);
}

void ib_recv_offer(struct ib_ctx *x, struct ib_recv *r)
{
    struct ib_peer *p = r->peer;
    if (r->cancelled) { /* before its CTS went: nothing to ask the sender */
        ib_recv_finish(
            x, r, rs_error(RESHARD_ERR_NETWORK, "ib: receive from rank %d cancelled", p->index));
        return;
    }
    struct ib_ctl ctl = {.type = CTL_CTS,
                         .id = r->id,
                         .tag = r->tag,
                         .addr = (uintptr_t)r->buf,
                         .len = r->cap,
                         .nkeys = (uint32_t)r->nkeys};
    memcpy(ctl.rkey, r->rkey, sizeof(uint32_t) * (size_t)r->nkeys);
    r->offered = 1;
    if (ib_queue_work(x, p, &(struct ib_work){.kind = W_CTL, .ctl = ctl}) != RESHARD_OK)
        ib_peer_down(x, p, RESHARD_ERR_NETWORK, rs_error_message()); /* completes r */
}

/* Fails the user's side of a send now; its stripes in flight still hold it until flushed. */
void ib_send_fail(struct ib_ctx *x, struct ib_send *s, reshard_status_t st)
{
    if (!s->user_done) {
        s->user_done = 1;
        ib_complete(x, s->req, st, 0);
    }
    if (!s->pending)
        ib_send_free(x, s);
}

/* The context closes: sends whose stripes never flushed fail (their QPs are gone), the caller
 * hears of it, and every send goes. */
void ib_send_close_all(struct ib_ctx *x)
{
    for (struct ib_send *s = x->all_sends; s; s = s->all_next)
        if (!s->user_done) { /* stripes never flushed: their QPs are gone */
            s->user_done = 1;
            ib_complete(x, s->req, rs_error(RESHARD_ERR_NETWORK, "ib: context closed"), 0);
        }
    ib_deliver(x);
    while (x->all_sends)
        ib_send_free(x, x->all_sends);
}

/* ---- the outgoing FIFO ---- */

static int room(const struct ib_peer *p, int qp, int n)
{
    return p->sq_used[qp] + n <= SQ_DEPTH;
}

static reshard_status_t post_ctl(struct ib_ctx *x, struct ib_peer *p, const struct ib_ctl *c)
{
    struct ib_ctl *slot = &p->tx[p->tx_next++ % SQ_DEPTH];
    *slot = *c;
    struct ibv_sge sge = {.addr = (uintptr_t)slot, .length = sizeof(*slot), .lkey = p->tx_mr->lkey};
    struct ibv_send_wr wr = {.wr_id = (uintptr_t)p | 1,
                             .sg_list = &sge,
                             .num_sge = 1,
                             .opcode = IBV_WR_SEND,
                             .send_flags = IBV_SEND_SIGNALED},
                       *bad;
    if (ibv_post_send(p->qp[0], &wr, &bad))
        return ib_qp_fail(x, p, "ibv_post_send");
    p->sq_used[0]++; /* transport control: not counted as the caller's messages */
    return RESHARD_OK;
}

static reshard_status_t post_refuse(struct ib_ctx *x, struct ib_peer *p, uint32_t id)
{
    struct ibv_send_wr wr = {.wr_id = (uintptr_t)p | 1,
                             .num_sge = 0,
                             .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
                             .send_flags = IBV_SEND_SIGNALED,
                             .imm_data = htonl(id << 8 | CODE_REFUSED)},
                       *bad;
    if (ibv_post_send(p->qp[0], &wr, &bad))
        return ib_qp_fail(x, p, "ibv_post_send");
    p->sq_used[0]++;
    return RESHARD_OK;
}

static reshard_status_t post_write(struct ib_ctx *x, struct ib_peer *p, struct ib_send *s,
                                   const struct ib_cts *c, int k)
{
    for (int i = 0; i < k; i++) {
        size_t off = (size_t)((unsigned __int128)s->len * (unsigned)i / (unsigned)k);
        size_t end = (size_t)((unsigned __int128)s->len * (unsigned)(i + 1) / (unsigned)k);
        struct ibv_sge sge = {.addr = (uintptr_t)(s->buf + off),
                              .length = (uint32_t)(end - off),
                              .lkey = s->mr ? s->mr->lkey : 0};
        int q = i % p->nqp;
        struct ibv_send_wr wr = {.wr_id = (uintptr_t)s,
                                 .sg_list = &sge,
                                 .num_sge = end > off,
                                 .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
                                 .send_flags = IBV_SEND_SIGNALED,
                                 .imm_data = htonl(c->id << 8 | (uint32_t)k),
                                 .wr.rdma = {.remote_addr = c->addr + s->offset + off,
                                             .rkey = c->rkey[q]}},
                           *bad;
        if (ibv_post_send(p->qp[q], &wr, &bad))
            return ib_qp_fail(x, p, "ibv_post_send (RDMA write)");
        p->sq_used[q]++;
        s->pending++;
    }
    return RESHARD_OK;
}

/* Posts queued work in order while the send queues have room. */
reshard_status_t ib_pump(struct ib_ctx *x, struct ib_peer *p)
{
    while (p->state == P_UP && p->out) {
        struct ib_work *w = p->out;
        if (w->kind == W_WRITE) {
            int k = ib_stripes(w->send->len, x->nqp), per_qp = (k + p->nqp - 1) / p->nqp;
            for (int q = 0; q < p->nqp && q < k; q++)
                if (!room(p, q, per_qp))
                    return RESHARD_OK;
            RS_CHECK(post_write(x, p, w->send, &w->cts, k));
        } else if (w->kind == W_BIND || w->kind == W_INV) {
            if (!room(p, w->win->qp, 1))
                return RESHARD_OK;
            RS_CHECK(ib_key_post(x, p, w));
        } else {
            if (!room(p, 0, 1))
                return RESHARD_OK;
            if (w->kind == W_CTL)
                RS_CHECK(post_ctl(x, p, &w->ctl));
            else
                RS_CHECK(post_refuse(x, p, w->cts.id));
        }
        if (!(p->out = w->next))
            p->out_tail = &p->out;
        free(w);
    }
    return RESHARD_OK;
}

reshard_status_t ib_queue_work(struct ib_ctx *x, struct ib_peer *p, const struct ib_work *w)
{
    struct ib_work *n = malloc(sizeof(*n));
    if (!n)
        return rs_error(RESHARD_ERR_NO_MEMORY, "ib: no memory for a work request");
    *n = *w;
    n->next = NULL;
    *p->out_tail = n;
    p->out_tail = &n->next;
    return ib_pump(x, p);
}

/* A send meets its CTS: write it, or refuse a receive too small for it. */
reshard_status_t ib_matched(struct ib_ctx *x, struct ib_peer *p, struct ib_send *s,
                            const struct ib_cts *c)
{
    if (s->len > c->len || s->offset > c->len - s->len) {
        reshard_status_t st = rs_error(
            RESHARD_ERR_TOO_LARGE,
            "ib: a %zu-byte message (at offset %zu) to rank %d for a %llu-byte "
            "receive (tag 0x%llx)",
            s->len, s->offset, p->index, (unsigned long long)c->len, (unsigned long long)c->tag);
        ib_send_fail(x, s, st);
        return ib_queue_work(x, p, &(struct ib_work){.kind = W_REFUSE, .cts = *c});
    }
    int need = s->len ? ib_stripes(s->len, x->nqp) : 0;
    if (need > p->nqp)
        need = p->nqp;
    if ((uint32_t)need > c->nkeys) { /* ib_ctl_check makes this impossible: a bug if seen */
        reshard_status_t st =
            rs_error(RESHARD_ERR_NETWORK, "ib: rank %d offered %u keys for a %zu-byte message",
                     p->index, c->nkeys, s->len);
        ib_send_fail(x, s, st);
        return st;
    }
    return ib_queue_work(x, p, &(struct ib_work){.kind = W_WRITE, .send = s, .cts = *c});
}

/* ---- the ops ---- */

/* A transfer given with a registration must lie inside it: checked before anything is posted,
 * so that a receive never offers bytes its registration does not hold. */
static reshard_status_t check_reg(const struct ib_reg *g, const void *buf, size_t len,
                                  const char *what)
{
    const char *b = buf;
    if (!g || !len || (b >= g->base && len <= g->len && (size_t)(b - g->base) <= g->len - len))
        return RESHARD_OK;
    return rs_error(RESHARD_ERR_INVALID_ARG,
                    "ib: a %zu-byte %s at %p lies outside its registration (%zu bytes at %p)", len,
                    what, buf, g->len, (void *)g->base);
}

static reshard_status_t send_at(struct tp_ctx *c, int peer, uint64_t tag, const void *buf,
                                size_t len, void *mh, int ctrl, size_t offset, struct tp_req *req)
{
    struct ib_ctx *x = to_ib(c);
    struct ib_reg *g = mh;
    RS_CHECK(check_reg(g, buf, len, "send"));
    struct ib_peer *p;
    RS_CHECK(ib_peer_usable(x, peer, &p));
    struct ib_send *s = calloc(1, sizeof(*s));
    if (!s)
        return rs_error(RESHARD_ERR_NO_MEMORY, "ib: no memory for a send");
    *s = (struct ib_send){.req = req,
                          .peer = p,
                          .tag = tag,
                          .buf = buf,
                          .len = len,
                          .offset = offset,
                          .mr = g ? g->mr : NULL};
    if (len && !g) {
        if (!(s->mr = ib_tmr_get(x, buf, len, 0))) {
            free(s);
            return RESHARD_ERR_NETWORK;
        }
        s->transient = 1;
    }
    tp_req_start(c, req, peer, len, ctrl, 0);
    req->handle = s;
    if ((s->all_next = x->all_sends))
        s->all_next->all_prev = s;
    x->all_sends = s;
    for (struct ib_cts **at = &p->cts; *at; at = &(*at)->next)
        if ((*at)->tag == tag) {
            struct ib_cts *n = *at;
            if (!(*at = n->next))
                p->cts_tail = at;
            p->ncts--;
            reshard_status_t st = ib_matched(x, p, s, n);
            free(n);
            if (st != RESHARD_OK)
                ib_peer_down(x, p, RESHARD_ERR_NETWORK, rs_error_message());
            return RESHARD_OK; /* a failure completes the request */
        }
    *p->sends_tail = s;
    p->sends_tail = &s->next;
    return RESHARD_OK;
}

reshard_status_t ib_send(struct tp_ctx *c, int peer, uint64_t tag, const void *buf, size_t len,
                         void *mh, int ctrl, struct tp_req *req)
{
    return send_at(c, peer, tag, buf, len, mh, ctrl, 0, req);
}

reshard_status_t ib_send_part(struct tp_ctx *c, int peer, uint64_t tag, const void *buf, size_t len,
                              void *mh, size_t offset, struct tp_req *req)
{
    return send_at(c, peer, tag, buf, len, mh, 0, offset, req);
}

/* The receive's length and registration are checked first; then it takes an id, and its keys
 * (ib_key.c) send the CTS once they are made. */
static reshard_status_t post_recv(struct ib_ctx *x, int peer, uint64_t tag, void *buf, size_t len,
                                  struct ib_reg *g, const struct iovec *iov, size_t niov,
                                  struct tp_req *req)
{
    RS_CHECK(check_reg(g, buf, len, "receive"));
    if (ib_stripes(len, x->nqp) > IB_MAX_STRIPES)
        return rs_error(RESHARD_ERR_TOO_LARGE,
                        "ib: a %zu-byte receive is larger than one message can be (%d stripes of "
                        "at most 1 GiB)",
                        len, IB_MAX_STRIPES);
    struct ib_peer *p;
    RS_CHECK(ib_peer_usable(x, peer, &p));
    struct ib_recv *r = calloc(1, sizeof(*r));
    if (!r)
        return rs_error(RESHARD_ERR_NO_MEMORY, "ib: no memory for a receive");
    *r = (struct ib_recv){.req = req,
                          .peer = p,
                          .tag = tag,
                          .buf = buf,
                          .cap = len,
                          .reg = g,
                          .iov = iov,
                          .niov = niov};
    reshard_status_t st = RESHARD_ERR_NO_MEMORY;
    if (iov && len) {
        if (!(r->bounce = ib_bounce_get(x, len)))
            goto err_free_recv;
        r->buf = r->bounce->buf;
        r->wmr = r->bounce->mr;
    } else if (g) {
        r->wmr = g->bindable ? g->mr : NULL; /* else its bytes are registered (ib_key.c) */
    } else if (len && x->windows) {
        st = RESHARD_ERR_NETWORK;
        if (!(r->tmr = r->wmr = ib_tmr_get(x, r->buf, len, 1)))
            goto err_free_recv;
    }
    RS_CHECK_GOTO(id_alloc(x, r), st, err_free_recv);
    tp_req_start(&x->super, req, peer, len, 0, 0);
    req->handle = r; /* until it completes, which may be inside ib_key_make (its peer failed) */
    if ((r->next = p->recvs))
        r->next->prev = r;
    p->recvs = r;
    if ((st = ib_key_make(x, r)) != RESHARD_OK) { /* nothing was queued: not posted */
        req->handle = NULL;
        recv_unlink(p, r);
        id_free(x, r->id);
        goto err_free_recv;
    }
    return RESHARD_OK;
err_free_recv: /* what it holds: a bounce buffer or a transient registration */
    if (r->tmr)
        ib_tmr_put(x, r->tmr);
    ib_bounce_put(x, r->bounce);
    free(r);
    return st;
}

reshard_status_t ib_recv(struct tp_ctx *c, int peer, uint64_t tag, void *buf, size_t len, void *mh,
                         struct tp_req *req)
{
    return post_recv(to_ib(c), peer, tag, buf, len, mh, NULL, 0, req);
}

reshard_status_t ib_recv_iov(struct tp_ctx *c, int peer, uint64_t tag, const struct iovec *iov,
                             size_t n, struct tp_req *req)
{
    size_t len = 0;
    for (size_t i = 0; i < n; i++)
        len += iov[i].iov_len;
    return post_recv(to_ib(c), peer, tag, NULL, len, NULL, iov, n, req);
}

/* A send still waiting for its CTS ends now; a receive asks its sender to refuse the CTS (if
 * the sender matched it already, the data completes the receive instead). */
void ib_cancel(struct tp_ctx *c, struct tp_req *req)
{
    struct ib_ctx *x = to_ib(c);
    if (!req->handle)
        return;
    for (size_t i = 0; i < x->npeers; i++) {
        struct ib_peer *p = x->peers[i];
        if (!p)
            continue;
        for (struct ib_send **at = &p->sends; *at; at = &(*at)->next)
            if (*at == req->handle) {
                struct ib_send *s = *at;
                if (!(*at = s->next))
                    p->sends_tail = at;
                ib_send_fail(
                    x, s, rs_error(RESHARD_ERR_NETWORK, "ib: send to rank %d cancelled", p->index));
                return;
            }
        for (struct ib_recv *r = p->recvs; r; r = r->next)
            if (r == req->handle && !r->cancelled && !r->finishing) {
                r->cancelled = 1;
                struct ib_ctl ctl = {.type = CTL_CANCEL, .id = r->id};
                if (!r->offered) /* its keys are being made: ib_recv_offer ends it */
                    return;
                if (p->state != P_UP && p->state != P_CONNECTING)
                    return;
                if (ib_queue_work(x, p, &(struct ib_work){.kind = W_CTL, .ctl = ctl}) != RESHARD_OK)
                    ib_peer_down(x, p, RESHARD_ERR_NETWORK, rs_error_message());
                return;
            }
    }
}
