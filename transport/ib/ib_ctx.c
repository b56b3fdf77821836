/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The ibverbs transport: RC queue pairs over one RDMA port, several per peer.
 *
 * Connections. A context's address names its port (GID, LID, MTU), a random nonce and a TCP
 * listener. The side that first needs the peer connects over TCP and sends its queue pair
 * numbers (HELLO); the other brings its QPs to RTS and answers with its own (REPLY); the first
 * then does the same and says READY, after which both may send. When both connect at once, the
 * HELLO of the smaller nonce (a context meeting itself: the smaller peer number) wins; the
 * other is answered CROSSED, and its sender waits for the winner's. Each HELLO names the peer
 * numbers on both sides, which pairs up several connections between the same two contexts. The
 * socket stays open: EOF without the goodbye byte an orderly close sends means the peer died, and
 * its requests fail at once.
 *
 * Data: receiver-driven rendezvous. A receive sends its buffer's address and key with the tag
 * to the sender (a CTS control message, RC SEND); the sender matches it against its sends with
 * that tag (first posted, first matched) and writes the data straight into the buffer with
 * RDMA WRITE WITH IMMEDIATE, a large message striped across the peer's QPs. Every stripe
 * carries imm = receive id << 8 | number of stripes, so the receiver knows when all arrived and
 * how many bytes (the sum of their lengths). Code 255 instead refuses the receive: the message
 * was larger than the buffer, or the receiver cancelled a CTS the sender had not matched yet.
 * No message is ever buffered unexpectedly: the sender waits for its CTS.
 *
 * Every work request is signaled; a peer's queue pairs get work from one FIFO that waits while
 * a send queue is full. Control messages and immediate-data notifications consume posted
 * receives; RNR retry (7: forever) paces a sender that outruns them. One completion queue per
 * context, grown as peers connect; waiting arms it and sleeps on its channel with the sockets.
 * Completions reach the caller only from progress().
 */
#include "ib_dev.h"
#include "ib_lib.h"
#include "transport/sock/sock.h"
#include "transport/tp.h"

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "base/param.h"
#include "cuda/cuda_lib.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#define IB_MAX_QPS   8
#define SQ_DEPTH     128
#define RQ_DEPTH     128
#define CQ_INITIAL   4096
#define STRIPE_MIN   (64 * 1024) /* a message is striped once each part keeps this much */
#define STRIPE_MAX   (INT32_C(1) << 30)
#define CODE_REFUSED 255
#define MAX_RECV_ID  ((1u << 24) - 1)
#define ADDR_MAGIC   0x49425253u /* "SRBI" */
#define HS_MAGIC     0x48534252u
#define SOCK_POLL_MS 10 /* sockets looked at this often while nothing is connecting */
#define STASH_MAX_MS 60000

enum ctl_type { CTL_CTS = 1, CTL_CANCEL = 2 };

struct ib_ctl { /* a control message (RC SEND) */
    uint32_t type, id;
    uint64_t tag, addr, len;
    uint32_t rkey, pad;
};

struct ib_wire_addr { /* what address() returns; both ends run the same build */
    uint32_t magic;
    int32_t index;  /* the number its context gives the peer it is for (-1: ranks) */
    uint64_t token; /* fresh for each address of a numbered peer: a stale HELLO never matches */
    uint16_t link_layer, lid;
    uint8_t gid[16];
    uint64_t nonce;
    uint32_t mtu, nqp;
    union sock_addr tcp;
};

enum hs_kind { HS_HELLO = 1, HS_REPLY, HS_READY, HS_CROSSED /* your HELLO lost a crossing */ };

struct ib_hs { /* a handshake message (TCP) */
    uint32_t magic, kind;
    uint64_t from, to;            /* nonces */
    int32_t from_index, to_index; /* the peer's number on each side */
    uint64_t to_token;            /* the token of the address the HELLO answers */
    uint32_t qpn[IB_MAX_QPS];
    uint32_t psn, nqp;
};

#define HS_BYE  0x42 /* one byte: an orderly close */
#define HS_FAIL 0x58 /* one byte: this side failed the connection (an error completion) */

enum peer_state { P_NONE, P_ADDR, P_CONNECTING, P_UP, P_DOWN };

struct ib_send {
    struct tp_req *req;
    struct ib_peer *peer;
    uint64_t tag;
    const char *buf;
    size_t len;
    struct ibv_mr *mr;
    int transient; /* mr is from the registration cache */
    int pending;   /* stripes posted and not completed */
    int user_done; /* req already completed (failure) */
    reshard_status_t st;
    struct ib_send *next;                /* peer's sends waiting for a CTS */
    struct ib_send *all_prev, *all_next; /* every live send of the context */
};

struct ib_recv {
    struct tp_req *req;
    struct ib_peer *peer;
    uint32_t id;
    char *buf;
    size_t cap;
    struct ibv_mr *mr;
    int transient;
    const struct iovec *iov; /* recv_iov: buf is a bounce buffer copied out at the end */
    size_t niov;
    int cancelled;
    int stripes;
    size_t got;
    struct ib_recv *prev, *next; /* peer's receives */
};

struct ib_cts {
    uint32_t id, rkey;
    uint64_t tag, addr, len;
    struct ib_cts *next;
};

enum work_kind { W_CTL, W_WRITE, W_REFUSE };

struct ib_work {
    int kind;
    struct ib_ctl ctl;    /* W_CTL */
    struct ib_send *send; /* W_WRITE */
    struct ib_cts cts;    /* W_WRITE, W_REFUSE: the receive it answers */
    struct ib_work *next;
};

struct ib_slot { /* a posted receive: control message or immediate-data notification */
    struct ib_peer *peer;
    int qp;
    struct ib_ctl ctl;
};

struct ib_peer {
    int index;
    enum peer_state state;
    struct ib_wire_addr addr;
    int fd;
    int initiator;       /* this side sent the HELLO */
    int preferred;       /* this side's HELLO wins when both connect at once */
    int connecting_tcp;  /* initiator: TCP connect in flight */
    int64_t deadline_ms; /* connecting: when to give up */
    unsigned char hs_buf[sizeof(struct ib_hs)];
    size_t hs_got;
    struct ibv_qp *qp[IB_MAX_QPS];
    int nqp;
    uint32_t psn;
    int sq_used[IB_MAX_QPS];
    int rq_posted; /* receives posted and not completed (flushed ones included) */
    int cq_share;  /* CQ entries counted for it once set up */
    struct ib_slot *rx;
    struct ibv_mr *rx_mr;
    struct ib_ctl *tx;
    struct ibv_mr *tx_mr;
    unsigned tx_next;
    struct ib_send *sends, **sends_tail;
    struct ib_cts *cts, **cts_tail;
    struct ib_work *out, **out_tail;
    struct ib_recv *recvs;
    struct ib_peer *grave_next;
};

struct ib_stash { /* an accepted connection whose HELLO names no known peer yet */
    int fd;
    unsigned char buf[sizeof(struct ib_hs)];
    size_t got;
    int64_t since_ms;
    struct ib_stash *next;
};

struct ib_tmr { /* a registration made for a transfer that came without one */
    char *base;
    size_t len;
    struct ibv_mr *mr;
    int refs;
    int writable;
    struct ib_tmr *next;
};

struct ib_ctx;
static void probe_dmabuf(struct ib_ctx *x);

struct ib_ctx {
    struct tp_ctx super;
    const struct ib_fns *f;
    struct ib_port port;
    struct ibv_context *dev;
    struct ibv_pd *pd;
    struct ibv_comp_channel *chan;
    struct ibv_cq *cq;
    int cq_cap, cq_need, max_cqe;
    int nqp;
    int rank; /* in a communicator; -1 for point-to-point users */
    uint64_t nonce;
    int lfd;
    union sock_addr laddr;
    struct ib_peer **peers;
    size_t npeers; /* slots in peers */
    struct ib_peer *grave;
    struct ib_stash *stash;
    uint64_t *tokens; /* the token each numbered peer's address carries */
    size_t tokens_cap;
    struct ib_recv **ids;
    size_t ids_cap;
    uint32_t *free_ids;
    size_t nfree_ids, next_id;
    struct ib_send *all_sends;
    struct ib_tmr *tmrs;
    struct tp_deferred deferred;
    int64_t last_sock_poll;
    int handshakes; /* peers connecting, stashed connections */
};

static struct ib_ctx *to_ib(struct tp_ctx *c)
{
    return container_of(c, struct ib_ctx, super);
}

/* ---- completions reach the caller from progress() only ---- */

static void complete(struct ib_ctx *x, struct tp_req *req, reshard_status_t st, size_t got)
{
    tp_defer(&x->deferred, req, st, got);
}

static int deliver(struct ib_ctx *x)
{
    return tp_deliver(&x->deferred);
}

/* ---- registrations for transfers that came without one ---- */

/* writable: the range receives (RDMA writes land in it); sends register it read-only, so that
 * read-only mappings can be sent from. */
static struct ibv_mr *tmr_get(struct ib_ctx *x, const void *addr, size_t len, int writable)
{
    const char *a = addr;
    for (struct ib_tmr *t = x->tmrs; t; t = t->next)
        if (a >= t->base && a + len <= t->base + t->len && t->writable >= writable) {
            t->refs++;
            return t->mr;
        }
    struct ib_tmr *t = calloc(1, sizeof(*t));
    if (!t)
        return NULL;
    uintptr_t page = 4096, b = (uintptr_t)a & ~(page - 1),
              e = ((uintptr_t)a + len + page - 1) & ~(page - 1);
    t->mr = x->f->reg_mr(x->pd, (void *)b, e - b,
                         writable ? IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE : 0);
    t->writable = writable;
    if (!t->mr) {
        rs_error(RESHARD_ERR_NETWORK, "ib: registering %zu bytes at %p: %m", len, addr);
        free(t);
        return NULL;
    }
    t->base = (char *)b;
    t->len = e - b;
    t->refs = 1;
    t->next = x->tmrs;
    x->tmrs = t;
    return t->mr;
}

/* Idle registrations are dropped, not cached: without memory hooks a freed and reused
 * address would be sent from the old, still pinned pages. */
static void tmr_put(struct ib_ctx *x, struct ibv_mr *mr)
{
    for (struct ib_tmr **p = &x->tmrs; *p; p = &(*p)->next)
        if ((*p)->mr == mr) {
            struct ib_tmr *t = *p;
            if (--t->refs == 0) {
                *p = t->next;
                x->f->dereg_mr(t->mr);
                free(t);
            }
            return;
        }
}

/* ---- receive ids ---- */

static reshard_status_t id_alloc(struct ib_ctx *x, struct ib_recv *r)
{
    uint32_t id;
    if (x->nfree_ids) {
        id = x->free_ids[--x->nfree_ids];
    } else {
        if (x->next_id >= MAX_RECV_ID)
            return rs_error(RESHARD_ERR_TOO_LARGE, "ib: more than %u receives outstanding",
                            MAX_RECV_ID);
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

/* ---- queue pairs ---- */

static reshard_status_t qp_fail(struct ib_ctx *x, const struct ib_peer *p, const char *call)
{
    return rs_error(RESHARD_ERR_NETWORK, "ib: %s for rank %d on %s: %m", call, p->index,
                    x->port.name);
}

static reshard_status_t qp_init(struct ib_ctx *x, struct ib_peer *p, int i)
{
    struct ibv_qp_init_attr ia = {
        .send_cq = x->cq,
        .recv_cq = x->cq,
        .cap = {.max_send_wr = SQ_DEPTH,
                .max_recv_wr = RQ_DEPTH,
                .max_send_sge = 1,
                .max_recv_sge = 1},
        .qp_type = IBV_QPT_RC,
    };
    if (!(p->qp[i] = x->f->create_qp(x->pd, &ia)))
        return qp_fail(x, p, "ibv_create_qp");
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_INIT,
        .pkey_index = 0,
        .port_num = (uint8_t)x->port.port,
        .qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
    };
    if (x->f->modify_qp(p->qp[i], &a,
                        IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        return qp_fail(x, p, "ibv_modify_qp(INIT)");
    return RESHARD_OK;
}

static reshard_status_t post_slot(struct ib_ctx *x, struct ib_peer *p, struct ib_slot *s)
{
    struct ibv_sge sge = {
        .addr = (uintptr_t)&s->ctl, .length = sizeof(s->ctl), .lkey = p->rx_mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = (uintptr_t)s | 2, .sg_list = &sge, .num_sge = 1}, *bad;
    if (ibv_post_recv(p->qp[s->qp], &wr, &bad))
        return qp_fail(x, p, "ibv_post_recv");
    p->rq_posted++;
    return RESHARD_OK;
}

/* The peer's QPs (in INIT, receives posted) and control buffers; the CQ grows to match. */
static reshard_status_t peer_setup(struct ib_ctx *x, struct ib_peer *p)
{
    int need = x->cq_need + p->nqp * (SQ_DEPTH + RQ_DEPTH);
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
    size_t nslots = (size_t)p->nqp * RQ_DEPTH;
    p->rx = calloc(nslots, sizeof(*p->rx));
    p->tx = calloc(SQ_DEPTH, sizeof(*p->tx));
    if (!p->rx || !p->tx)
        return rs_error(RESHARD_ERR_NO_MEMORY, "ib: no memory for rank %d's buffers", p->index);
    p->rx_mr = x->f->reg_mr(x->pd, p->rx, nslots * sizeof(*p->rx), IBV_ACCESS_LOCAL_WRITE);
    p->tx_mr = x->f->reg_mr(x->pd, p->tx, SQ_DEPTH * sizeof(*p->tx), 0);
    if (!p->rx_mr || !p->tx_mr)
        return qp_fail(x, p, "ibv_reg_mr (control buffers)");
    p->psn = (uint32_t)(x->nonce ^ (uint64_t)p->index * 0x9e3779b97f4a7c15u) & 0xffffff;
    for (int i = 0; i < p->nqp; i++)
        RS_CHECK(qp_init(x, p, i));
    for (size_t k = 0; k < nslots; k++) {
        p->rx[k] = (struct ib_slot){.peer = p, .qp = (int)(k / RQ_DEPTH)};
        RS_CHECK(post_slot(x, p, &p->rx[k]));
    }
    x->cq_need = need;
    p->cq_share = p->nqp * (SQ_DEPTH + RQ_DEPTH);
    return RESHARD_OK;
}

static reshard_status_t qp_connect(struct ib_ctx *x, struct ib_peer *p, const struct ib_hs *h)
{
    if (h->nqp != (uint32_t)p->nqp)
        return rs_error(RESHARD_ERR_MISMATCH,
                        "ib: rank %d uses %u queue pairs a peer, this rank %d "
                        "(RESHARD_IB_QPS_PER_PEER must agree)",
                        p->index, h->nqp, p->nqp);
    const struct ib_wire_addr *r = &p->addr;
    int mtu = (int)r->mtu < x->port.mtu ? (int)r->mtu : x->port.mtu;
    for (int i = 0; i < p->nqp; i++) {
        struct ibv_qp_attr a = {
            .qp_state = IBV_QPS_RTR,
            .path_mtu = (enum ibv_mtu)mtu,
            .dest_qp_num = h->qpn[i],
            .rq_psn = h->psn,
            .max_dest_rd_atomic = 1,
            .min_rnr_timer = 12, /* 0.64 ms */
            .ah_attr = {.dlid = r->lid, .port_num = (uint8_t)x->port.port},
        };
        if (x->port.link_layer == IBV_LINK_LAYER_ETHERNET ||
            r->link_layer != IBV_LINK_LAYER_INFINIBAND) {
            a.ah_attr.is_global = 1;
            memcpy(a.ah_attr.grh.dgid.raw, r->gid, 16);
            a.ah_attr.grh.sgid_index = (uint8_t)x->port.gid_index;
            a.ah_attr.grh.hop_limit = 64;
        }
        if (x->f->modify_qp(p->qp[i], &a,
                            IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
            return qp_fail(x, p, "ibv_modify_qp(RTR)");
        struct ibv_qp_attr s = {
            .qp_state = IBV_QPS_RTS,
            .timeout = 14, /* 67 ms; with 7 retries a dead peer shows within ~0.5 s */
            .retry_cnt = 7,
            .rnr_retry = 7, /* forever: receives are reposted as they are consumed */
            .sq_psn = p->psn,
            .max_rd_atomic = 1,
        };
        if (x->f->modify_qp(p->qp[i], &s,
                            IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
            return qp_fail(x, p, "ibv_modify_qp(RTS)");
    }
    return RESHARD_OK;
}

/* ---- failures ---- */

static void recv_unlink(struct ib_peer *p, struct ib_recv *r)
{
    if (r->prev)
        r->prev->next = r->next;
    else
        p->recvs = r->next;
    if (r->next)
        r->next->prev = r->prev;
}

static void send_free(struct ib_ctx *x, struct ib_send *s)
{
    if (s->transient)
        tmr_put(x, s->mr);
    if (s->all_prev)
        s->all_prev->all_next = s->all_next;
    else
        x->all_sends = s->all_next;
    if (s->all_next)
        s->all_next->all_prev = s->all_prev;
    free(s);
}

static void recv_finish(struct ib_ctx *x, struct ib_recv *r, reshard_status_t st)
{
    size_t got = st == RESHARD_OK ? r->got : 0;
    if (st == RESHARD_OK && r->iov) {
        size_t off = 0;
        for (size_t i = 0; i < r->niov && off < got; i++) {
            size_t n = got - off < r->iov[i].iov_len ? got - off : r->iov[i].iov_len;
            memcpy(r->iov[i].iov_base, r->buf + off, n);
            off += n;
        }
    }
    if (st == RESHARD_OK)
        x->super.counters.bytes_in += got;
    recv_unlink(r->peer, r);
    id_free(x, r->id);
    if (r->transient)
        tmr_put(x, r->mr);
    if (r->iov)
        free(r->buf);
    complete(x, r->req, st, got);
    free(r);
}

/* Fails the user's side of a send now; its stripes in flight still hold it until flushed. */
static void send_fail(struct ib_ctx *x, struct ib_send *s, reshard_status_t st)
{
    if (!s->user_done) {
        s->user_done = 1;
        complete(x, s->req, st, 0);
    }
    if (!s->pending)
        send_free(x, s);
}

/* The peer is gone (or leaving): its QPs stop, everything bound to it completes with st. */
static void peer_down(struct ib_ctx *x, struct ib_peer *p, reshard_status_t st, const char *reason)
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
    for (int i = 0; i < p->nqp; i++) {
        struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
        if (p->qp[i])
            x->f->modify_qp(p->qp[i], &a, IBV_QP_STATE); /* flushes what is posted */
    }
    if (st != RESHARD_OK && was == P_UP && p->fd >= 0) { /* so the peer says why, not "died" */
        unsigned char b = HS_FAIL;
        (void)!send(p->fd, &b, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    sock_close(&p->fd);
    reshard_status_t fail = st == RESHARD_OK ? RESHARD_ERR_NETWORK : st;
    if (st != RESHARD_OK) /* an orderly close leaves the caller's last message alone */
        rs_error(fail, "ib: rank %d: %s", p->index, why);
    while (p->sends) {
        struct ib_send *s = p->sends;
        p->sends = s->next;
        send_fail(x, s, fail);
    }
    p->sends_tail = &p->sends;
    while (p->out) {
        struct ib_work *w = p->out;
        p->out = w->next;
        if (w->kind == W_WRITE)
            send_fail(x, w->send, fail);
        free(w);
    }
    p->out_tail = &p->out;
    while (p->cts) {
        struct ib_cts *c = p->cts;
        p->cts = c->next;
        free(c);
    }
    p->cts_tail = &p->cts;
    while (p->recvs)
        recv_finish(x, p->recvs, fail);
}

/* ---- the outgoing FIFO ---- */

static int room(const struct ib_peer *p, int qp, int n)
{
    return p->sq_used[qp] + n <= SQ_DEPTH;
}

static int stripes_of(const struct ib_ctx *x, size_t len)
{
    size_t k = len >= 2 * (size_t)STRIPE_MIN ? len / STRIPE_MIN : 1;
    if (k > (size_t)x->nqp)
        k = (size_t)x->nqp;
    while (len / k > (size_t)STRIPE_MAX) /* one write moves at most 2^31 - 1 bytes */
        k += (size_t)x->nqp;
    return (int)k;
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
        return qp_fail(x, p, "ibv_post_send");
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
        return qp_fail(x, p, "ibv_post_send");
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
        struct ibv_send_wr wr = {.wr_id = (uintptr_t)s,
                                 .sg_list = &sge,
                                 .num_sge = end > off,
                                 .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
                                 .send_flags = IBV_SEND_SIGNALED,
                                 .imm_data = htonl(c->id << 8 | (uint32_t)k),
                                 .wr.rdma = {.remote_addr = c->addr + off, .rkey = c->rkey}},
                           *bad;
        int q = i % p->nqp;
        if (ibv_post_send(p->qp[q], &wr, &bad))
            return qp_fail(x, p, "ibv_post_send (RDMA write)");
        p->sq_used[q]++;
        s->pending++;
    }
    return RESHARD_OK;
}

/* Posts queued work in order while the send queues have room. */
static reshard_status_t pump(struct ib_ctx *x, struct ib_peer *p)
{
    while (p->state == P_UP && p->out) {
        struct ib_work *w = p->out;
        if (w->kind == W_WRITE) {
            int k = stripes_of(x, w->send->len), per_qp = (k + p->nqp - 1) / p->nqp;
            for (int q = 0; q < p->nqp && q < k; q++)
                if (!room(p, q, per_qp))
                    return RESHARD_OK;
            RS_CHECK(post_write(x, p, w->send, &w->cts, k));
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

static reshard_status_t queue_work(struct ib_ctx *x, struct ib_peer *p, const struct ib_work *w)
{
    struct ib_work *n = malloc(sizeof(*n));
    if (!n)
        return rs_error(RESHARD_ERR_NO_MEMORY, "ib: no memory for a work request");
    *n = *w;
    n->next = NULL;
    *p->out_tail = n;
    p->out_tail = &n->next;
    return pump(x, p);
}

/* A send meets its CTS: write it, or refuse a receive too small for it. */
static reshard_status_t matched(struct ib_ctx *x, struct ib_peer *p, struct ib_send *s,
                                const struct ib_cts *c)
{
    if (s->len > c->len) {
        reshard_status_t st =
            rs_error(RESHARD_ERR_TOO_LARGE,
                     "ib: a %zu-byte message to rank %d for a %llu-byte "
                     "receive (tag 0x%llx)",
                     s->len, p->index, (unsigned long long)c->len, (unsigned long long)c->tag);
        send_fail(x, s, st);
        return queue_work(x, p, &(struct ib_work){.kind = W_REFUSE, .cts = *c});
    }
    return queue_work(x, p, &(struct ib_work){.kind = W_WRITE, .send = s, .cts = *c});
}

/* ---- connections ---- */

static reshard_status_t hs_write(struct ib_peer *p, const void *buf, size_t n)
{
    const char *b = buf;
    int64_t deadline = rs_now_ms() + 5000;
    while (n) {
        ssize_t w = send(p->fd, b, n, MSG_NOSIGNAL);
        if (w > 0) {
            b += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno != EAGAIN && errno != EINTR)
            return rs_error(RESHARD_ERR_NETWORK, "ib: handshake with rank %d: %m", p->index);
        struct pollfd pf = {.fd = p->fd, .events = POLLOUT};
        int ready;
        RS_CHECK(sock_poll(&pf, 1, deadline, &ready));
        if (!ready)
            return rs_error(RESHARD_ERR_TIMEOUT, "ib: handshake with rank %d stalled", p->index);
    }
    return RESHARD_OK;
}

/* The number the other side gives this one: from its address, else our rank. */
static int remote_index(const struct ib_ctx *x, const struct ib_peer *p)
{
    return p->addr.index >= 0 ? p->addr.index : x->rank;
}

static reshard_status_t hs_send(struct ib_ctx *x, struct ib_peer *p, enum hs_kind kind)
{
    struct ib_hs h = {.magic = HS_MAGIC,
                      .kind = kind,
                      .from = x->nonce,
                      .to = p->addr.nonce,
                      .from_index = p->index,
                      .to_index = remote_index(x, p),
                      .to_token = p->addr.token,
                      .psn = p->psn,
                      .nqp = (uint32_t)p->nqp};
    for (int i = 0; i < p->nqp; i++)
        h.qpn[i] = p->qp[i]->qp_num;
    return hs_write(p, &h, sizeof(h));
}

static void peer_up(struct ib_ctx *x, struct ib_peer *p)
{
    p->state = P_UP;
    x->handshakes--;
    rs_log(RS_LOG_TRACE, "ib: rank %d connected over %d QPs on %s", p->index, p->nqp, x->port.name);
}

/* Reads what the socket has into buf (*got bytes so far, want in all): 1 when complete, 0
 * when more is to come, -1 on EOF or error (errno 0 for EOF). */
static int read_some(int fd, unsigned char *buf, size_t *got, size_t want)
{
    while (*got < want) {
        ssize_t n = recv(fd, buf + *got, want - *got, 0);
        if (n > 0) {
            *got += (size_t)n;
            continue;
        }
        if (n == 0) {
            errno = 0;
            return -1;
        }
        if (errno == EAGAIN || errno == EINTR)
            return 0;
        return -1;
    }
    return 1;
}

static reshard_status_t on_hello(struct ib_ctx *x, struct ib_peer *p, int fd, const struct ib_hs *h)
{
    p->fd = fd;
    if (p->state == P_ADDR) {
        p->state = P_CONNECTING;
        p->deadline_ms = rs_now_ms() + 1000 * rs_param_int(RS_PARAM_TIMEOUT);
        x->handshakes++;
        RS_CHECK(peer_setup(x, p)); /* the caller fails the peer */
    }
    RS_CHECK(qp_connect(x, p, h));
    p->hs_got = 0;
    return hs_send(x, p, HS_REPLY);
}

/* The peer a HELLO is for, or NULL: *drop when the connection is not wanted (1: not a HELLO
 * for this context, or a peer connected already; 2: a crossing this side's HELLO wins), else
 * it waits for set_peer. A peer that loses a crossing abandons its own attempt here. */
static struct ib_peer *hello_peer(struct ib_ctx *x, const struct ib_hs *h, int *drop)
{
    *drop = h->magic != HS_MAGIC || h->kind != HS_HELLO || h->to != x->nonce;
    if (*drop)
        return NULL;
    struct ib_peer *p =
        h->to_index >= 0 && (size_t)h->to_index < x->npeers ? x->peers[h->to_index] : NULL;
    uint64_t token = (size_t)h->to_index < x->tokens_cap ? x->tokens[h->to_index] : 0;
    if (h->to_token != token) {
        *drop = 1; /* answers an address this context no longer has (a closed peer's) */
        return NULL;
    }
    if (!p || p->addr.nonce != h->from || remote_index(x, p) != h->from_index)
        return NULL; /* not known yet (or its number serves another peer for now) */
    if (p->state == P_ADDR || (p->state == P_CONNECTING && !p->initiator && p->fd < 0))
        return p;
    if (p->state == P_CONNECTING && p->initiator && !p->preferred) {
        sock_close(&p->fd); /* crossed: the other side's HELLO wins */
        p->initiator = p->connecting_tcp = 0;
        p->hs_got = 0;
        return p;
    }
    *drop = p->state == P_CONNECTING && p->initiator ? 2 : 1;
    return NULL;
}

static void stash_drop(struct ib_ctx *x, struct ib_stash **at, int close_fd)
{
    struct ib_stash *s = *at;
    *at = s->next;
    if (close_fd)
        sock_close(&s->fd);
    free(s);
    x->handshakes--;
}

/* Accepted connections: read their HELLO, hand them to their peer once it is known. */
static void serve_stash(struct ib_ctx *x)
{
    int64_t now = rs_now_ms();
    for (struct ib_stash **at = &x->stash; *at;) {
        struct ib_stash *s = *at;
        int r = s->got < sizeof(s->buf) ? read_some(s->fd, s->buf, &s->got, sizeof(s->buf)) : 1;
        unsigned char b;
        if (r == 1 && recv(s->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0)
            r = -1; /* its sender gave up waiting */
        if (r < 0 || now - s->since_ms > STASH_MAX_MS) {
            stash_drop(x, at, 1);
            continue;
        }
        struct ib_hs h;
        memcpy(&h, s->buf, sizeof(h));
        int drop = 0;
        struct ib_peer *p = r == 1 ? hello_peer(x, &h, &drop) : NULL;
        if (r == 1 && h.magic != HS_MAGIC)
            rs_log(RS_LOG_WARN, "ib: dropped a connection that is not a reshard handshake");
        if (drop == 2) { /* tell the loser, so that it waits rather than fails */
            struct ib_hs c = {.magic = HS_MAGIC,
                              .kind = HS_CROSSED,
                              .from = x->nonce,
                              .to = h.from,
                              .from_index = h.to_index,
                              .to_index = h.from_index};
            (void)!send(s->fd, &c, sizeof(c), MSG_NOSIGNAL | MSG_DONTWAIT);
        }
        if (drop) {
            stash_drop(x, at, 1);
            continue;
        }
        if (!p) {
            at = &s->next;
            continue;
        }
        int fd = s->fd;
        stash_drop(x, at, 0);
        if (on_hello(x, p, fd, &h) != RESHARD_OK)
            peer_down(x, p, RESHARD_ERR_NETWORK, rs_error_message());
    }
}

static void accept_new(struct ib_ctx *x)
{
    for (;;) {
        int fd = -1;
        union sock_addr from;
        if (sock_accept(x->lfd, &fd, &from) != RESHARD_OK || fd < 0)
            return;
        struct ib_stash *s = calloc(1, sizeof(*s));
        if (!s) {
            sock_close(&fd);
            return;
        }
        s->fd = fd;
        s->since_ms = rs_now_ms();
        s->next = x->stash;
        x->stash = s;
        x->handshakes++;
    }
}

/* One peer's socket: the handshake's next step, or (once up) a goodbye or EOF. */
static int poll_cq(struct ib_ctx *x);

static void serve_peer(struct ib_ctx *x, struct ib_peer *p)
{
    if (p->fd < 0 || p->state == P_DOWN)
        return;
    reshard_status_t st = RESHARD_OK;
    if (p->state == P_UP) {
        unsigned char b;
        ssize_t n = recv(p->fd, &b, 1, 0);
        if (n >= 0 || (errno != EAGAIN && errno != EINTR))
            poll_cq(x); /* what landed before the peer left still completes */
        if (p->state != P_UP)
            return;
        if (n == 1 && b == HS_BYE)
            peer_down(x, p, RESHARD_OK, "closed its connection");
        else if (n == 1 && b == HS_FAIL)
            peer_down(x, p, RESHARD_ERR_NETWORK, "failed the connection (an error on its side)");
        else if (n == 0)
            peer_down(x, p, RESHARD_ERR_NETWORK, "connection lost (the process died?)");
        else if (n < 0 && errno != EAGAIN && errno != EINTR)
            peer_down(x, p, RESHARD_ERR_NETWORK, "connection lost");
        return;
    }
    if (p->connecting_tcp) {
        int done = 0;
        char who[32];
        snprintf(who, sizeof(who), "rank %d", p->index);
        st = sock_connect_check(p->fd, who, &done);
        if (st == RESHARD_OK && done) {
            p->connecting_tcp = 0;
            st = hs_send(x, p, HS_HELLO);
        }
    } else {
        int r = read_some(p->fd, p->hs_buf, &p->hs_got, sizeof(p->hs_buf));
        if (r < 0) {
            st = rs_error(RESHARD_ERR_NETWORK, "handshake cut short");
        } else if (r == 1) {
            struct ib_hs h;
            memcpy(&h, p->hs_buf, sizeof(h));
            p->hs_got = 0;
            if (h.magic != HS_MAGIC || h.from != p->addr.nonce || h.to != x->nonce ||
                h.from_index != remote_index(x, p) || h.to_index != p->index)
                st = rs_error(RESHARD_ERR_NETWORK, "handshake from someone else");
            else if (p->initiator && h.kind == HS_REPLY &&
                     (st = qp_connect(x, p, &h)) == RESHARD_OK &&
                     (st = hs_send(x, p, HS_READY)) == RESHARD_OK)
                peer_up(x, p);
            else if (!p->initiator && h.kind == HS_READY)
                peer_up(x, p);
            else if (p->initiator && h.kind == HS_CROSSED) {
                sock_close(&p->fd); /* the other side's HELLO is on its way */
                p->initiator = 0;
            }
        }
    }
    if (st != RESHARD_OK)
        peer_down(x, p, RESHARD_ERR_NETWORK, rs_error_message());
    else if (p->state == P_UP && pump(x, p) != RESHARD_OK)
        peer_down(x, p, RESHARD_ERR_NETWORK, rs_error_message());
}

static void poll_sockets(struct ib_ctx *x)
{
    x->last_sock_poll = rs_now_ms();
    accept_new(x);
    if (x->stash)
        serve_stash(x);
    for (size_t i = 0; i < x->npeers; i++) {
        struct ib_peer *p = x->peers[i];
        if (p)
            serve_peer(x, p);
        if (p && p->state == P_CONNECTING && x->last_sock_poll > p->deadline_ms) {
            char why[96];
            snprintf(why, sizeof(why), "no connection within RESHARD_TIMEOUT=%lld s",
                     (long long)rs_param_int(RS_PARAM_TIMEOUT));
            peer_down(x, p, RESHARD_ERR_TIMEOUT, why);
        }
    }
}

static struct ib_peer *get_peer(struct ib_ctx *x, int peer)
{
    return peer >= 0 && (size_t)peer < x->npeers ? x->peers[peer] : NULL;
}

/* Starts connecting (QPs, TCP) unless done or under way. */
static reshard_status_t ensure(struct ib_ctx *x, struct ib_peer *p)
{
    if (p->state != P_ADDR)
        return RESHARD_OK;
    p->state = P_CONNECTING;
    p->deadline_ms = rs_now_ms() + 1000 * rs_param_int(RS_PARAM_TIMEOUT);
    x->handshakes++;
    p->initiator = 1;
    reshard_status_t st = peer_setup(x, p);
    if (st == RESHARD_OK)
        st = sock_connect_start(&p->addr.tcp, &p->fd);
    if (st != RESHARD_OK) { /* half made: the peer is failed, and later calls say so at once */
        char why[RS_ERROR_MAX];
        snprintf(why, sizeof(why), "%s", rs_error_message());
        peer_down(x, p, st, why);
        return rs_error(st, "%s", why);
    }
    p->connecting_tcp = 1;
    return RESHARD_OK;
}

/* ---- completions ---- */

static void on_ctl(struct ib_ctx *x, struct ib_peer *p, const struct ib_ctl *c)
{
    if (c->type == CTL_CTS) {
        struct ib_cts cts = {
            .id = c->id, .rkey = c->rkey, .tag = c->tag, .addr = c->addr, .len = c->len};
        for (struct ib_send **at = &p->sends; *at; at = &(*at)->next)
            if ((*at)->tag == c->tag) {
                struct ib_send *s = *at;
                if (!(*at = s->next))
                    p->sends_tail = at;
                if (matched(x, p, s, &cts) != RESHARD_OK)
                    peer_down(x, p, RESHARD_ERR_NETWORK, rs_error_message());
                return;
            }
        struct ib_cts *n = malloc(sizeof(*n));
        if (!n) {
            peer_down(x, p, RESHARD_ERR_NO_MEMORY, "no memory for a receive notice");
            return;
        }
        *n = cts;
        n->next = NULL;
        *p->cts_tail = n;
        p->cts_tail = &n->next;
    } else if (c->type == CTL_CANCEL) {
        for (struct ib_cts **at = &p->cts; *at; at = &(*at)->next)
            if ((*at)->id == c->id) {
                struct ib_cts *n = *at;
                if (!(*at = n->next))
                    p->cts_tail = at;
                reshard_status_t st =
                    queue_work(x, p, &(struct ib_work){.kind = W_REFUSE, .cts = *n});
                free(n);
                if (st != RESHARD_OK)
                    peer_down(x, p, RESHARD_ERR_NETWORK, rs_error_message());
                return;
            } /* else already matched: the data completes the receive */
    }
}

static void on_imm(struct ib_ctx *x, struct ib_peer *p, uint32_t imm, uint32_t bytes)
{
    uint32_t id = imm >> 8, code = imm & 0xff;
    struct ib_recv *r = id < x->ids_cap ? x->ids[id] : NULL;
    if (!r || r->peer != p) {
        peer_down(x, p, RESHARD_ERR_NETWORK, "wrote to a receive this rank does not have");
        return;
    }
    if (code == CODE_REFUSED) {
        recv_finish(x, r,
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
    if (bytes > r->cap - r->got) { /* the key covers whole pages: a bad peer could overrun */
        peer_down(x, p, RESHARD_ERR_NETWORK, "wrote more than its receive holds");
        return;
    }
    r->got += bytes;
    if (++r->stripes == (int)code)
        recv_finish(x, r, RESHARD_OK);
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
        complete(x, s->req, s->st, s->len);
    }
    send_free(x, s);
}

static void on_wc(struct ib_ctx *x, const struct ibv_wc *wc)
{
    uintptr_t tag = wc->wr_id & 7, ptr = wc->wr_id & ~(uintptr_t)7;
    struct ib_peer *p = tag == 1   ? (struct ib_peer *)ptr
                        : tag == 2 ? ((struct ib_slot *)ptr)->peer
                                   : ((struct ib_send *)ptr)->peer;
    if (wc->status != IBV_WC_SUCCESS && p->state != P_DOWN) {
        char why[96];
        snprintf(why, sizeof(why), "QP 0x%x on %s: %s (%d)", wc->qp_num, x->port.name,
                 x->f->wc_status_str(wc->status), wc->status);
        peer_down(x, p, RESHARD_ERR_NETWORK, why);
    }
    if (tag == 0) {
        on_send_done(x, (struct ib_send *)ptr, wc);
    } else if (tag == 1) {
        p->sq_used[0]--;
    } else {
        p->rq_posted--;
        struct ib_slot *s = (struct ib_slot *)ptr;
        if (wc->status == IBV_WC_SUCCESS && p->state != P_DOWN) {
            if (wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM)
                on_imm(x, p, ntohl(wc->imm_data), wc->byte_len);
            else
                on_ctl(x, p, &s->ctl);
            if (p->state != P_DOWN && post_slot(x, p, s) != RESHARD_OK)
                peer_down(x, p, RESHARD_ERR_NETWORK, rs_error_message());
        }
    }
    if (p->state == P_UP && pump(x, p) != RESHARD_OK)
        peer_down(x, p, RESHARD_ERR_NETWORK, rs_error_message());
}

static int poll_cq(struct ib_ctx *x)
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

/* ---- the ops ---- */

static void ib_close(struct tp_ctx *c);

static reshard_status_t pick_port(const struct tp_config *cfg, struct ib_port *out)
{
    const struct ib_port *ports;
    int n;
    RS_CHECK(ib_ports(&ports, &n));
    const struct ib_port *match[64];
    int m = 0;
    for (int i = 0; i < n && m < 64; i++)
        if (!cfg->devices || !*cfg->devices ||
            ib_hca_selects(cfg->devices, ports[i].dev, ports[i].port))
            match[m++] = &ports[i];
    const struct ib_port *chosen = m ? match[cfg->local_rank > 0 ? cfg->local_rank % m : 0] : NULL;
    if (!chosen)
        return rs_error(RESHARD_ERR_UNAVAILABLE, "ib: no active RDMA port%s%s%s",
                        cfg->devices ? " matches '" : "", cfg->devices ? cfg->devices : "",
                        cfg->devices ? "'" : " (RESHARD_IB_HCA, ibv_devinfo)");
    *out = *chosen;
    return RESHARD_OK;
}

/* The address the TCP side channel listens on: the port's IPv4 for RoCE, else the host's. */
static reshard_status_t listen_addr(const struct ib_port *port, union sock_addr *a)
{
    memset(a, 0, sizeof(*a));
    if (ib_port_ipv4(port, &a->in.sin_addr)) {
        a->in.sin_family = AF_INET;
        return RESHARD_OK;
    }
    return sock_default_addr(a);
}

static reshard_status_t ib_init(const struct tp_config *cfg, struct tp_ctx **out)
{
    const struct ib_fns *f = ib_lib();
    if (!f)
        return RESHARD_ERR_UNAVAILABLE;
    struct ib_ctx *x = rs_calloc(1, sizeof(*x), "ib context");
    if (!x)
        return RESHARD_ERR_NO_MEMORY;
    x->super.ops = &tp_ib_ops;
    x->super.failed_peer = -1;
    tp_deferred_init(&x->deferred);
    x->f = f;
    x->lfd = -1;
    x->rank = cfg->size > 0 ? cfg->rank : -1;
    reshard_status_t st;
    int64_t q = rs_param_int(RS_PARAM_IB_QPS_PER_PEER);
    x->nqp = q > IB_MAX_QPS ? IB_MAX_QPS : (int)q;
    RS_CHECK_GOTO(pick_port(cfg, &x->port), st, err);
    struct ibv_device **list = f->get_device_list(NULL);
    for (int i = 0; list && list[i] && !x->dev; i++)
        if (!strcmp(f->get_device_name(list[i]), x->port.dev))
            x->dev = f->open_device(list[i]);
    if (list)
        f->free_device_list(list);
    st = RESHARD_ERR_NETWORK;
    if (!x->dev) {
        rs_error(st, "ib: cannot open %s: %m", x->port.dev);
        goto err;
    }
    if (!(x->pd = f->alloc_pd(x->dev)) || !(x->chan = f->create_comp_channel(x->dev))) {
        rs_error(st, "ib: %s: protection domain or completion channel: %m", x->port.name);
        goto err;
    }
    fcntl(x->chan->fd, F_SETFL, fcntl(x->chan->fd, F_GETFL) | O_NONBLOCK);
    probe_dmabuf(x);
    struct ibv_device_attr da;
    if (f->query_device(x->dev, &da)) {
        rs_error(st, "ib: %s: ibv_query_device: %m", x->port.name);
        goto err;
    }
    x->max_cqe = da.max_cqe;
    x->cq_cap = CQ_INITIAL < da.max_cqe ? CQ_INITIAL : da.max_cqe;
    if (!(x->cq = f->create_cq(x->dev, x->cq_cap, NULL, x->chan, 0))) {
        rs_error(st, "ib: %s: ibv_create_cq: %m", x->port.name);
        goto err;
    }
    if (getrandom(&x->nonce, sizeof(x->nonce), 0) != sizeof(x->nonce)) {
        rs_error(st, "ib: no random nonce: %m");
        goto err;
    }
    RS_CHECK_GOTO(listen_addr(&x->port, &x->laddr), st, err);
    sock_addr_set_port(&x->laddr, 0);
    RS_CHECK_GOTO(sock_listen(&x->laddr, &x->lfd), st, err);
    x->peers = rs_calloc(cfg->size > 0 ? (size_t)cfg->size : 1, sizeof(*x->peers), "ib peers");
    if (!x->peers) {
        st = RESHARD_ERR_NO_MEMORY;
        goto err;
    }
    x->npeers = cfg->size > 0 ? (size_t)cfg->size : 1;
    *out = &x->super;
    return RESHARD_OK;
err:
    ib_close(&x->super);
    return st;
}

static reshard_status_t ib_address(struct tp_ctx *c, int peer, void *buf, size_t *len)
{
    struct ib_ctx *x = to_ib(c);
    uint64_t token = 0;
    if (peer >= 0) {
        if ((size_t)peer >= x->tokens_cap) {
            size_t cap = x->tokens_cap;
            uint64_t *t = rs_grow(x->tokens, &cap, (size_t)peer + 1, sizeof(*t), "ib tokens");
            if (!t)
                return RESHARD_ERR_NO_MEMORY;
            memset(t + x->tokens_cap, 0, (cap - x->tokens_cap) * sizeof(*t));
            x->tokens = t;
            x->tokens_cap = cap;
        }
        if (getrandom(&token, sizeof(token), 0) != sizeof(token))
            token = x->nonce ^ (uint64_t)rs_now_ms() << 20 ^ (uint64_t)peer;
        x->tokens[peer] = token;
    }
    struct ib_wire_addr a = {
        .magic = ADDR_MAGIC,
        .index = peer < 0 ? -1 : peer,
        .token = token,
        .link_layer = (uint16_t)x->port.link_layer,
        .lid = x->port.lid,
        .nonce = x->nonce,
        .mtu = (uint32_t)x->port.mtu,
        .nqp = (uint32_t)x->nqp,
        .tcp = x->laddr,
    };
    memcpy(a.gid, x->port.gid, 16);
    size_t room = *len;
    *len = sizeof(a);
    if (room < sizeof(a))
        return rs_error(RESHARD_ERR_TOO_LARGE, "ib address is %zu bytes, room for %zu", sizeof(a),
                        room);
    memcpy(buf, &a, sizeof(a));
    return RESHARD_OK;
}

static reshard_status_t ib_set_peer(struct tp_ctx *c, int peer, const void *addr, size_t len)
{
    struct ib_ctx *x = to_ib(c);
    struct ib_wire_addr a;
    if (peer < 0)
        return rs_error(RESHARD_ERR_INTERNAL, "ib: peer %d is not a peer", peer);
    if (len != sizeof(a))
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "ib: rank %d's address is %zu bytes, not an ib address (%zu): do all "
                        "ranks use RESHARD_TRANSPORT=ib?",
                        peer, len, sizeof(a));
    memcpy(&a, addr, sizeof(a));
    if (a.magic != ADDR_MAGIC)
        return rs_error(RESHARD_ERR_INVALID_ARG, "ib: rank %d's address is not an ib address",
                        peer);
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
    p->preferred = x->nonce != a.nonce ? x->nonce < a.nonce : peer < remote_index(x, p);
    p->sends_tail = &p->sends;
    p->cts_tail = &p->cts;
    p->out_tail = &p->out;
    x->peers[peer] = p;
    if (x->stash)
        serve_stash(x); /* its HELLO may be waiting already */
    return RESHARD_OK;
}

static reshard_status_t usable(struct ib_ctx *x, int peer, struct ib_peer **out)
{
    struct ib_peer *p = get_peer(x, peer);
    if (!p)
        return rs_error(RESHARD_ERR_INTERNAL, "ib: no address for rank %d", peer);
    if (p->state == P_DOWN)
        return rs_error(RESHARD_ERR_NETWORK, "ib: rank %d is gone: %s", peer,
                        x->super.failed_peer == peer ? x->super.failed_why : "closed");
    RS_CHECK(ensure(x, p));
    *out = p;
    return RESHARD_OK;
}

static reshard_status_t ib_connect(struct tp_ctx *c, int peer)
{
    struct ib_peer *p;
    return usable(to_ib(c), peer, &p);
}

/* Device memory: a dma-buf of the pages holding it (cuMemGetHandleForAddressRange), registered
 * at its own address (iova) so that peers write to it as to host memory. */
static reshard_status_t reg_device(struct ib_ctx *x, void *addr, size_t len, void **mh)
{
    const struct cuda_fns *cu = cuda_lib();
    if (!cu)
        return RESHARD_ERR_UNAVAILABLE;
    if (!cu->get_handle_for_address_range)
        return rs_error(RESHARD_ERR_UNAVAILABLE,
                        "ib: the CUDA driver has no cuMemGetHandleForAddressRange (CUDA 11.7 or "
                        "later exports dma-bufs)");
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), a = (uint64_t)(uintptr_t)addr;
    uint64_t base = a & ~(page - 1), end = (a + len + page - 1) & ~(page - 1);
    int fd = -1;
    cu_result r = cu->get_handle_for_address_range(&fd, base, end - base,
                                                   CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    if (r != CU_SUCCESS)
        return cuda_error("cuMemGetHandleForAddressRange (dma-buf) for ib", r);
    struct ibv_mr *mr = x->f->reg_dmabuf_mr(x->pd, a - base, len, a, fd,
                                            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    int e = errno;
    close(fd);
    errno = e;
    if (!mr)
        return rs_error(RESHARD_ERR_NETWORK,
                        "ib: ibv_reg_dmabuf_mr of %zu device bytes at %p on %s: %m", len, addr,
                        x->port.name);
    *mh = mr;
    return RESHARD_OK;
}

/* Can this device register dma-bufs? A registration of fd -1 tells: EBADF when the kernel
 * and the provider could (NCCL probes the same way), EOPNOTSUPP when not. */
static void probe_dmabuf(struct ib_ctx *x)
{
    struct tp_ctx *c = &x->super;
    if (!x->f->reg_dmabuf_mr) {
        snprintf(c->device_mem_why, sizeof(c->device_mem_why),
                 "ib: rdma-core has no ibv_reg_dmabuf_mr (it came in rdma-core 34)");
        return;
    }
    errno = 0;
    struct ibv_mr *mr = x->f->reg_dmabuf_mr(x->pd, 0, 0, 0, -1, IBV_ACCESS_LOCAL_WRITE);
    if (mr)
        x->f->dereg_mr(mr);
    if (!mr && (errno == EOPNOTSUPP || errno == EPROTONOSUPPORT || errno == ENOSYS))
        snprintf(c->device_mem_why, sizeof(c->device_mem_why),
                 "ib: %s cannot register dma-bufs (%s)", x->port.dev, strerror(errno));
    else
        c->device_mem = 1;
}

static reshard_status_t ib_mem_reg(struct tp_ctx *c, void *addr, size_t len, enum tp_mem mem,
                                   void **mh)
{
    struct ib_ctx *x = to_ib(c);
    if (mem == TP_MEM_CUDA)
        return reg_device(x, addr, len, mh);
    struct ibv_mr *mr =
        x->f->reg_mr(x->pd, addr, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!mr && (errno == EFAULT || errno == EACCES || errno == EPERM))
        mr = x->f->reg_mr(x->pd, addr, len, 0); /* read-only memory: a source to send from */
    if (!mr)
        return rs_error(RESHARD_ERR_NETWORK, "ib: ibv_reg_mr of %zu bytes at %p on %s: %m", len,
                        addr, x->port.name);
    *mh = mr;
    return RESHARD_OK;
}

static void ib_mem_dereg(struct tp_ctx *c, void *mh)
{
    if (mh)
        to_ib(c)->f->dereg_mr(mh);
}

static reshard_status_t ib_send(struct tp_ctx *c, int peer, uint64_t tag, const void *buf,
                                size_t len, void *mh, int ctrl, struct tp_req *req)
{
    struct ib_ctx *x = to_ib(c);
    struct ib_peer *p;
    RS_CHECK(usable(x, peer, &p));
    struct ib_send *s = calloc(1, sizeof(*s));
    if (!s)
        return rs_error(RESHARD_ERR_NO_MEMORY, "ib: no memory for a send");
    *s = (struct ib_send){.req = req, .peer = p, .tag = tag, .buf = buf, .len = len, .mr = mh};
    if (len && !mh) {
        if (!(s->mr = tmr_get(x, buf, len, 0))) {
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
            reshard_status_t st = matched(x, p, s, n);
            free(n);
            if (st != RESHARD_OK)
                peer_down(x, p, RESHARD_ERR_NETWORK, rs_error_message());
            return RESHARD_OK; /* a failure completes the request */
        }
    *p->sends_tail = s;
    p->sends_tail = &s->next;
    return RESHARD_OK;
}

static reshard_status_t post_recv(struct ib_ctx *x, int peer, uint64_t tag, void *buf, size_t len,
                                  void *mh, const struct iovec *iov, size_t niov,
                                  struct tp_req *req)
{
    struct ib_peer *p;
    RS_CHECK(usable(x, peer, &p));
    struct ib_recv *r = calloc(1, sizeof(*r));
    if (!r)
        return rs_error(RESHARD_ERR_NO_MEMORY, "ib: no memory for a receive");
    *r = (struct ib_recv){
        .req = req, .peer = p, .buf = buf, .cap = len, .mr = mh, .iov = iov, .niov = niov};
    if (iov && len && !(r->buf = malloc(len))) {
        free(r);
        return rs_error(RESHARD_ERR_NO_MEMORY, "ib: no memory for a %zu-byte bounce buffer", len);
    }
    reshard_status_t st = RESHARD_OK;
    if (len && !mh) {
        if (!(r->mr = tmr_get(x, r->buf, len, 1)))
            st = RESHARD_ERR_NETWORK;
        r->transient = 1;
    }
    if (st == RESHARD_OK)
        st = id_alloc(x, r);
    if (st != RESHARD_OK) {
        if (r->transient && r->mr)
            tmr_put(x, r->mr);
        if (iov)
            free(r->buf);
        free(r);
        return st;
    }
    tp_req_start(&x->super, req, peer, len, 0, 0);
    req->handle = r;
    if ((r->next = p->recvs))
        r->next->prev = r;
    p->recvs = r;
    struct ib_ctl ctl = {.type = CTL_CTS,
                         .id = r->id,
                         .tag = tag,
                         .addr = (uintptr_t)r->buf,
                         .len = len,
                         .rkey = r->mr ? r->mr->rkey : 0};
    if (queue_work(x, p, &(struct ib_work){.kind = W_CTL, .ctl = ctl}) != RESHARD_OK)
        peer_down(x, p, RESHARD_ERR_NETWORK, rs_error_message()); /* completes r */
    return RESHARD_OK;
}

static reshard_status_t ib_recv(struct tp_ctx *c, int peer, uint64_t tag, void *buf, size_t len,
                                void *mh, struct tp_req *req)
{
    return post_recv(to_ib(c), peer, tag, buf, len, mh, NULL, 0, req);
}

static reshard_status_t ib_recv_iov(struct tp_ctx *c, int peer, uint64_t tag,
                                    const struct iovec *iov, size_t n, struct tp_req *req)
{
    size_t len = 0;
    for (size_t i = 0; i < n; i++)
        len += iov[i].iov_len;
    return post_recv(to_ib(c), peer, tag, NULL, len, NULL, iov, n, req);
}

/* A send still waiting for its CTS ends now; a receive asks its sender to refuse the CTS (if
 * the sender matched it already, the data completes the receive instead). */
static void ib_cancel(struct tp_ctx *c, struct tp_req *req)
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
                send_fail(x, s,
                          rs_error(RESHARD_ERR_NETWORK, "ib: send to rank %d cancelled", p->index));
                return;
            }
        for (struct ib_recv *r = p->recvs; r; r = r->next)
            if (r == req->handle && !r->cancelled) {
                r->cancelled = 1;
                struct ib_ctl ctl = {.type = CTL_CANCEL, .id = r->id};
                if (p->state != P_UP && p->state != P_CONNECTING)
                    return;
                if (queue_work(x, p, &(struct ib_work){.kind = W_CTL, .ctl = ctl}) != RESHARD_OK)
                    peer_down(x, p, RESHARD_ERR_NETWORK, rs_error_message());
                return;
            }
    }
}

static void peer_free(struct ib_ctx *x, struct ib_peer *p);

/* Closed peers whose queue pairs have flushed every work request: nothing can refer to them
 * any more, so their QPs and buffers go, and the CQ room they held is free again. */
static void reap_grave(struct ib_ctx *x)
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

static int ib_progress(struct tp_ctx *c)
{
    struct ib_ctx *x = to_ib(c);
    int n = poll_cq(x);
    if (x->grave)
        reap_grave(x);
    if (x->handshakes || rs_now_ms() - x->last_sock_poll >= SOCK_POLL_MS)
        poll_sockets(x);
    return n + deliver(x);
}

static reshard_status_t ib_wait(struct tp_ctx *c, int timeout_ms)
{
    struct ib_ctx *x = to_ib(c);
    if (x->deferred.head || poll_cq(x) || x->deferred.head)
        return RESHARD_OK;
    if (ibv_req_notify_cq(x->cq, 0))
        return rs_error(RESHARD_ERR_NETWORK, "ib: ibv_req_notify_cq: %m");
    if (poll_cq(x) || x->deferred.head) /* completions that came before the arm */
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
    if (n == 64 && timeout_ms > SOCK_POLL_MS) /* more sockets than watched: look again soon */
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
            poll_cq(x); /* completions first: a goodbye must not fail what already landed */
            poll_sockets(x);
            break;
        }
    return RESHARD_OK;
}

/* Orderly: says goodbye, then everything still bound to the peer completes. */
static void leave(struct ib_ctx *x, struct ib_peer *p)
{
    if (p->fd >= 0 && p->state == P_UP) {
        unsigned char b = HS_BYE;
        (void)!send(p->fd, &b, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    peer_down(x, p, RESHARD_OK, "closed by this rank");
}

static void ib_close_peer(struct tp_ctx *c, int peer)
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

static void ib_disconnect(struct tp_ctx *c)
{
    struct ib_ctx *x = to_ib(c);
    for (size_t i = 0; i < x->npeers; i++)
        if (x->peers[i])
            leave(x, x->peers[i]);
    int64_t end = rs_now_ms() + 1000; /* flushes complete sends already on the wire */
    while (in_flight(x) && rs_now_ms() < end)
        if (!poll_cq(x))
            usleep(1000);
    deliver(x);
}

static void peer_free(struct ib_ctx *x, struct ib_peer *p)
{
    x->cq_need -= p->cq_share;
    for (int i = 0; i < p->nqp; i++)
        if (p->qp[i])
            x->f->destroy_qp(p->qp[i]);
    if (p->rx_mr)
        x->f->dereg_mr(p->rx_mr);
    if (p->tx_mr)
        x->f->dereg_mr(p->tx_mr);
    free(p->rx);
    free(p->tx);
    free(p);
}

static void ib_close(struct tp_ctx *c)
{
    if (!c)
        return;
    struct ib_ctx *x = to_ib(c);
    if (x->peers)
        ib_disconnect(c);
    for (size_t i = 0; i < x->npeers; i++)
        if (x->peers[i])
            peer_free(x, x->peers[i]);
    while (x->grave) {
        struct ib_peer *p = x->grave;
        x->grave = p->grave_next;
        peer_free(x, p);
    }
    while (x->stash)
        stash_drop(x, &x->stash, 1);
    for (struct ib_send *s = x->all_sends; s; s = s->all_next)
        if (!s->user_done) { /* stripes never flushed: their QPs are gone */
            s->user_done = 1;
            complete(x, s->req, rs_error(RESHARD_ERR_NETWORK, "ib: context closed"), 0);
        }
    deliver(x);
    while (x->all_sends)
        send_free(x, x->all_sends);
    while (x->tmrs) {
        struct ib_tmr *t = x->tmrs;
        x->tmrs = t->next;
        x->f->dereg_mr(t->mr);
        free(t);
    }
    if (x->cq)
        x->f->destroy_cq(x->cq);
    if (x->chan)
        x->f->destroy_comp_channel(x->chan);
    if (x->pd)
        x->f->dealloc_pd(x->pd);
    if (x->dev)
        x->f->close_device(x->dev);
    sock_close(&x->lfd);
    free(x->peers);
    free(x->tokens);
    free(x->ids);
    free(x->free_ids);
    free(x);
}

void tp_ib_break_peer(struct tp_ctx *c, int peer)
{
    struct ib_ctx *x = to_ib(c);
    struct ib_peer *p = get_peer(x, peer);
    for (int i = 0; p && i < p->nqp; i++) {
        struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
        if (p->qp[i])
            x->f->modify_qp(p->qp[i], &a, IBV_QP_STATE);
    }
}

const struct tp_ops tp_ib_ops = {
    .size = sizeof(struct tp_ops),
    .name = "ib",
    .init = ib_init,
    .address = ib_address,
    .set_peer = ib_set_peer,
    .connect = ib_connect,
    .mem_reg = ib_mem_reg,
    .mem_dereg = ib_mem_dereg,
    .send = ib_send,
    .recv = ib_recv,
    .recv_iov = ib_recv_iov,
    .cancel = ib_cancel,
    .progress = ib_progress,
    .wait = ib_wait,
    .disconnect = ib_disconnect,
    .close_peer = ib_close_peer,
    .close = ib_close,
};
