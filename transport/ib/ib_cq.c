/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Completions of the ibverbs transport: the one completion queue per context (grown as peers
 * connect), what each work completion means (a control message, the immediate data of a write,
 * a send's stripe, a flush), and progress() and wait(), the only places completions reach the
 * caller from. A work request's id is a pointer whose low bits say what it points to: 0 a
 * send, 1 a peer (control traffic), 2 a posted receive slot, 3 a memory window (its bind or
 * invalidation), 4 a flush's read (ib_flush.c).
 */
#include "ib_int.h"

#include "base/clock.h"
#include "base/error.h"

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SOCK_POLL_MS 10 /* sockets looked at this often while nothing is connecting */

void ib_complete(struct ib_ctx *x, struct tp_req *req, reshard_status_t st, size_t got)
{
    tp_defer(&x->deferred, req, st, got);
}

int ib_deliver(struct ib_ctx *x)
{
    return tp_deliver(&x->deferred);
}

reshard_status_t ib_cq_fit(struct ib_ctx *x, const struct ib_peer *p, int need)
{
    if (need > x->max_cqe)
        return rs_error(RESHARD_ERR_TOO_LARGE,
                        "ib: connecting rank %d needs a completion queue of %d entries; %s "
                        "allows %d (fewer peers at once, or a lower RESHARD_IB_QPS_PER_PEER)",
                        p->index, need, x->port.name, x->max_cqe);
    if (need > x->cq_cap) {
        int cap = need > 2 * x->cq_cap ? need : 2 * x->cq_cap;
        if (cap > x->max_cqe)
            cap = x->max_cqe;
        if (x->f->resize_cq(x->cq, cap))
            return rs_error(RESHARD_ERR_NETWORK, "ib: growing the completion queue to %d: %m", cap);
        x->cq_cap = cap;
    }
    return RESHARD_OK;
}

/* A control message from the peer, checked whole before any field is used. */
static void on_ctl(struct ib_ctx *x, struct ib_peer *p, const struct ib_ctl *c, size_t got)
{
    char why[160];
    if (ib_ctl_check(c, got, x->nqp, why, sizeof(why))) {
        ib_peer_down(x, p, RESHARD_ERR_NETWORK, why);
        return;
    }
    if (c->type == CTL_CTS) {
        struct ib_cts cts = {
            .id = c->id, .nkeys = c->nkeys, .tag = c->tag, .addr = c->addr, .len = c->len};
        memcpy(cts.rkey, c->rkey, sizeof(cts.rkey));
        for (struct ib_send **at = &p->sends; *at; at = &(*at)->next)
            if ((*at)->tag == c->tag) {
                struct ib_send *s = *at;
                if (!(*at = s->next))
                    p->sends_tail = at;
                if (ib_matched(x, p, s, &cts) != RESHARD_OK)
                    ib_peer_down(x, p, RESHARD_ERR_NETWORK, rs_error_message());
                return;
            }
        if (p->ncts >= IB_MAX_CTS) {
            snprintf(why, sizeof(why), "offered more than %d receives that no send matches",
                     IB_MAX_CTS);
            ib_peer_down(x, p, RESHARD_ERR_NETWORK, why);
            return;
        }
        struct ib_cts *n = malloc(sizeof(*n));
        if (!n) {
            ib_peer_down(x, p, RESHARD_ERR_NO_MEMORY, "no memory for a receive notice");
            return;
        }
        *n = cts;
        n->next = NULL;
        *p->cts_tail = n;
        p->cts_tail = &n->next;
        p->ncts++;
    } else if (c->type == CTL_CANCEL) {
        for (struct ib_cts **at = &p->cts; *at; at = &(*at)->next)
            if ((*at)->id == c->id) {
                struct ib_cts *n = *at;
                if (!(*at = n->next))
                    p->cts_tail = at;
                p->ncts--;
                reshard_status_t st =
                    ib_queue_work(x, p, &(struct ib_work){.kind = W_REFUSE, .cts = *n});
                free(n);
                if (st != RESHARD_OK)
                    ib_peer_down(x, p, RESHARD_ERR_NETWORK, rs_error_message());
                return;
            } /* else already matched: the data completes the receive */
    }
}

/* A write's immediate: it must name a receive this rank offered that peer and that is still
 * open, and the bytes must fit (windows make the device refuse more; this is the last check). */
static void on_imm(struct ib_ctx *x, struct ib_peer *p, uint32_t imm, uint32_t bytes)
{
    uint32_t id, code;
    struct ib_recv *r = NULL;
    if (ib_imm_check(imm, &id, &code) == 0)
        r = id < x->ids_cap ? x->ids[id] : NULL;
    if (!r || r->peer != p || !r->offered || r->finishing) {
        char why[96];
        snprintf(why, sizeof(why),
                 "wrote with immediate 0x%08x, which names no receive it was "
                 "offered",
                 imm);
        ib_peer_down(x, p, RESHARD_ERR_NETWORK, why);
        return;
    }
    if (code == CODE_REFUSED) {
        ib_recv_finish(x, r,
                       r->cancelled ? rs_error(RESHARD_ERR_NETWORK,
                                               "ib: receive from rank %d "
                                               "cancelled",
                                               p->index)
                                    : rs_error(RESHARD_ERR_TOO_LARGE,
                                               "ib: rank %d sent more than the %zu-byte receive "
                                               "holds",
                                               p->index, r->cap));
        return;
    }
    if (bytes > r->cap - r->got || (r->stripes && code != r->code)) {
        ib_peer_down(x, p, RESHARD_ERR_NETWORK,
                     bytes > r->cap - r->got ? "wrote more than its receive holds"
                                             : "announced two stripe counts for one message");
        return;
    }
    r->code = code;
    r->got += bytes;
    if (++r->stripes == (int)code)
        ib_recv_finish(x, r, RESHARD_OK);
}

static void on_send_done(struct ib_ctx *x, struct ib_send *s, const struct ibv_wc *wc)
{
    struct ib_peer *p = s->peer;
    for (int q = 0; q < p->nqp; q++)
        if (p->qp[q] && p->qp[q]->qp_num == wc->qp_num)
            p->sq_used[q]--;
    s->pending--;
    if (wc->status != IBV_WC_SUCCESS && s->st == RESHARD_OK)
        s->st = rs_error(RESHARD_ERR_NETWORK, "ib: RDMA write to rank %d failed", p->index);
    if (s->pending)
        return;
    if (!s->user_done) {
        s->user_done = 1;
        if (s->st == RESHARD_OK) {
            if (s->req->ctrl)
                x->super.counters.ctrl_out++;
            else
                x->super.counters.bytes_out += s->len, x->super.counters.msgs_out++;
        }
        ib_complete(x, s->req, s->st, s->len);
    }
    ib_send_free(x, s);
}

static void on_wc(struct ib_ctx *x, const struct ibv_wc *wc)
{
    uintptr_t tag = wc->wr_id & 7, ptr = wc->wr_id & ~(uintptr_t)7;
    if (tag == 4) {
        ib_flush_done(x, (struct tp_req *)ptr, wc);
        return;
    }
    struct ib_peer *p = tag == 1   ? (struct ib_peer *)ptr
                        : tag == 2 ? ((struct ib_slot *)ptr)->peer
                        : tag == 3 ? ((struct ib_win *)ptr)->peer
                                   : ((struct ib_send *)ptr)->peer;
    if (wc->status != IBV_WC_SUCCESS && p->state != P_DOWN) {
        char why[96];
        snprintf(why, sizeof(why), "QP 0x%x on %s: %s (%d)", wc->qp_num, x->port.name,
                 x->f->wc_status_str(wc->status), wc->status);
        ib_peer_down(x, p, RESHARD_ERR_NETWORK, why);
    }
    if (tag == 0) {
        on_send_done(x, (struct ib_send *)ptr, wc);
    } else if (tag == 1) {
        p->sq_used[0]--;
    } else if (tag == 3) {
        struct ib_win *w = (struct ib_win *)ptr;
        p->sq_used[w->qp]--;
        ib_key_done(x, w, wc->status == IBV_WC_SUCCESS && p->state != P_DOWN);
    } else {
        p->rq_posted--;
        struct ib_slot *s = (struct ib_slot *)ptr;
        if (wc->status == IBV_WC_SUCCESS && p->state != P_DOWN) {
            if (wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM)
                on_imm(x, p, ntohl(wc->imm_data), wc->byte_len);
            else
                on_ctl(x, p, &s->ctl, wc->byte_len);
            if (p->state != P_DOWN && ib_post_slot(x, p, s) != RESHARD_OK)
                ib_peer_down(x, p, RESHARD_ERR_NETWORK, rs_error_message());
        }
    }
    if (p->state == P_UP && ib_pump(x, p) != RESHARD_OK)
        ib_peer_down(x, p, RESHARD_ERR_NETWORK, rs_error_message());
}

int ib_cq_poll(struct ib_ctx *x)
{
    struct ibv_wc wc[32];
    int total = 0, n;
    while ((n = ibv_poll_cq(x->cq, 32, wc)) > 0) {
        for (int i = 0; i < n; i++)
            on_wc(x, &wc[i]);
        total += n;
    }
    return total;
}

int ib_progress(struct tp_ctx *c)
{
    struct ib_ctx *x = to_ib(c);
    int n = ib_cq_poll(x);
    if (x->grave)
        ib_peer_reap_grave(x);
    if (x->handshakes || rs_now_ms() - x->last_sock_poll >= SOCK_POLL_MS)
        ib_cm_poll(x);
    return n + ib_deliver(x);
}

reshard_status_t ib_wait(struct tp_ctx *c, int timeout_ms)
{
    struct ib_ctx *x = to_ib(c);
    if (x->deferred.head || ib_cq_poll(x) || x->deferred.head)
        return RESHARD_OK;
    if (ibv_req_notify_cq(x->cq, 0))
        return rs_error(RESHARD_ERR_NETWORK, "ib: ibv_req_notify_cq: %m");
    if (ib_cq_poll(x) || x->deferred.head) /* completions that came before the arm */
        return RESHARD_OK;
    struct pollfd fds[64];
    int n = 0;
    fds[n++] = (struct pollfd){.fd = x->chan->fd, .events = POLLIN};
    fds[n++] = (struct pollfd){.fd = x->lfd, .events = POLLIN};
    for (struct ib_stash *s = x->stash; s && n < 64; s = s->next)
        fds[n++] = (struct pollfd){.fd = s->fd, .events = POLLIN};
    for (size_t i = 0; i < x->npeers && n < 64; i++) {
        struct ib_peer *p = x->peers[i];
        if (p && p->fd >= 0)
            fds[n++] = (struct pollfd){.fd = p->fd,
                                       .events = (short)(p->connecting_tcp ? POLLOUT : POLLIN)};
    }
    /* More sockets than watched, or a handshake that may have to connect again: look soon. */
    if ((n == 64 || x->handshakes) && timeout_ms > SOCK_POLL_MS)
        timeout_ms = SOCK_POLL_MS;
    if (poll(fds, (nfds_t)n, timeout_ms) < 0 && errno != EINTR)
        return rs_error(RESHARD_ERR_NETWORK, "ib: poll: %m");
    if (fds[0].revents) {
        struct ibv_cq *cq;
        void *ctx;
        if (x->f->get_cq_event(x->chan, &cq, &ctx) == 0)
            x->f->ack_cq_events(cq, 1);
    }
    for (int i = 1; i < n; i++)
        if (fds[i].revents) {
            ib_cq_poll(x); /* completions first: a goodbye must not fail what already landed */
            ib_cm_poll(x);
            break;
        }
    return RESHARD_OK;
}
