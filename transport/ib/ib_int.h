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
 * Data: receiver-driven rendezvous. A receive offers its buffer to the sender in a CTS control
 * message (RC SEND) carrying the tag and one remote key per queue pair the message may be
 * striped over; the sender matches it against its sends with that tag (first posted, first
 * matched) and writes the data straight into the buffer with RDMA WRITE WITH IMMEDIATE, a
 * large message striped across the peer's QPs. Every stripe carries imm = receive id << 8 |
 * number of stripes, so the receiver knows when all arrived and how many bytes (the sum of
 * their lengths). Code 255 instead refuses the receive: the message was larger than the
 * buffer, or the receiver cancelled a CTS the sender had not matched yet. No message is ever
 * buffered unexpectedly: the sender waits for its CTS.
 *
 * Least privilege. No registration grants remote access. A receive's keys are made for it
 * alone (ib_key.c): type 2 memory windows over exactly its bytes, each bound to the queue
 * pair whose stripe it takes (so no other peer's connection can use it), bound before the CTS
 * goes and invalidated before the receive completes; where the device has no such windows,
 * a registration of exactly its bytes, released when it completes. Between two transfers no
 * key to the caller's memory is valid.
 *
 * Every work request is signaled; a peer's queue pairs get work from one FIFO that waits while
 * a send queue is full. Control messages and immediate-data notifications consume posted
 * receives; RNR retry (7: forever) paces a sender that outruns them. One completion queue per
 * context, grown as peers connect; waiting arms it and sleeps on its channel with the sockets.
 * Completions reach the caller only from progress().
 *
 * This header holds what the ib files share: the wire formats, the request, peer and context
 * structs, and each file's entry points. ib_ctx.c is the context's life and its ops table;
 * ib_wire.c the wire formats' checks; ib_cm.c the TCP side channel; ib_qp.c the queue pairs;
 * ib_mr.c registrations; ib_bounce.c the bounce buffers' arena; ib_key.c a receive's keys;
 * ib_post.c the requests and what they post; ib_cq.c completions; ib_peer.c a peer's life and
 * teardown.
 */
#ifndef RS_IB_INT_H
#define RS_IB_INT_H

#include "ib_dev.h"
#include "ib_lib.h"
#include "transport/sock/sock.h"
#include "transport/tp.h"

#include "base/reshard_status.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define IB_MAX_QPS     8
#define SQ_DEPTH       128
#define RQ_DEPTH       128
#define CODE_REFUSED   255
#define IB_MAX_STRIPES 254 /* the immediate's stripe count: 8 bits, 255 being the refusal */
#define IB_MAX_RECV_ID ((UINT32_C(1) << 24) - 1) /* the immediate's other 24 bits */
#define ADDR_MAGIC     0x49425253u               /* "SRBI" */
#define HS_MAGIC       0x48534252u
#define IB_STASH_MAX   64        /* accepted connections that have not yet said a whole HELLO */
#define IB_HELLO_MS    10000     /* how long such a connection may take to say it */
#define IB_MAX_CTS     (1 << 20) /* CTS of one peer waiting for their sends */

enum ib_ctl_type { CTL_CTS = 1, CTL_CANCEL = 2 };

struct ib_ctl { /* a control message (RC SEND), 72 bytes */
    uint32_t type, id;
    uint64_t tag, addr, len;
    uint32_t nkeys, pad;       /* CTS: keys for the first nkeys QPs (ib_ctl_check says how many) */
    uint32_t rkey[IB_MAX_QPS]; /* the key stripe i uses on QP i % nqp */
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

enum ib_hs_kind { HS_HELLO = 1, HS_REPLY, HS_READY, HS_CROSSED /* your HELLO lost a crossing */ };

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

enum ib_peer_state { P_NONE, P_ADDR, P_CONNECTING, P_UP, P_DOWN };

/* What mem_reg hands out: the caller's memory, registered without remote access. */
struct ib_reg {
    struct ibv_mr *mr;
    char *base;
    size_t len;
    int bindable;     /* LOCAL_WRITE | MW_BIND: receives bind windows over it */
    int fd;           /* device memory: its dma-buf, for registrations of one receive; else -1 */
    uint64_t fd_base; /* the address at offset 0 of that dma-buf */
    /* What a flush reads through (ib_flush.c): mr itself for device memory, registered with
     * remote read; for host memory a second registration, made at its first flush. */
    struct ibv_mr *read_mr;
};

struct ib_send {
    struct tp_req *req;
    struct ib_peer *peer;
    uint64_t tag;
    const char *buf;
    size_t len;
    size_t offset; /* where in the receive's buffer the bytes go (send_part; else 0) */
    struct ibv_mr *mr;
    int transient; /* mr is from the registration cache */
    int pending;   /* stripes posted and not completed */
    int user_done; /* req already completed (failure) */
    reshard_status_t st;
    struct ib_send *next;                /* peer's sends waiting for a CTS */
    struct ib_send *all_prev, *all_next; /* every live send of the context */
};

enum ib_win_state { WIN_FREE, WIN_BINDING, WIN_BOUND, WIN_INVALIDATING, WIN_DEAD };

struct ib_win { /* a type 2 memory window of one peer, bound to one of its QPs at a time */
    struct ibv_mw *mw;
    struct ib_peer *peer;
    struct ib_recv *recv; /* the receive it serves, or NULL */
    uint32_t rkey;        /* while bound */
    int qp;
    enum ib_win_state state;
    struct ib_win *next; /* the peer's free windows */
};

struct ib_bounce { /* a bounce buffer of the arena: mapped and registered once, reused */
    char *buf;
    size_t cap;
    int cls;           /* size class, or -1: too large to keep */
    struct ibv_mr *mr; /* bindable; NULL where receives register their own bytes */
    struct ib_bounce *next;
};

struct ib_recv {
    struct tp_req *req;
    struct ib_peer *peer;
    uint32_t id;
    uint64_t tag;
    char *buf;
    size_t cap;
    struct ib_reg *reg;       /* the caller's registration, or NULL */
    struct ibv_mr *wmr;       /* windows: the registration they bind over */
    struct ibv_mr *tmr;       /* windows: a transient registration made for it (wmr) */
    struct ibv_mr *xmr;       /* no windows: a registration of exactly [buf, buf + cap) */
    struct ib_bounce *bounce; /* recv_iov: buf is a bounce buffer copied out at the end */
    const struct iovec *iov;
    size_t niov;
    int nkeys;
    uint32_t rkey[IB_MAX_QPS];
    struct ib_win *win[IB_MAX_QPS];
    int binds;     /* windows whose binding has not completed */
    int invs;      /* windows whose invalidation has not completed */
    int offered;   /* the CTS is queued: the peer may write */
    int finishing; /* the outcome is known (st); the keys are being taken back */
    reshard_status_t st;
    int cancelled;
    int stripes;   /* arrived */
    uint32_t code; /* the stripe count the first one announced */
    size_t got;
    struct ib_recv *prev, *next; /* peer's receives */
};

struct ib_cts {
    uint32_t id, nkeys;
    uint64_t tag, addr, len;
    uint32_t rkey[IB_MAX_QPS];
    struct ib_cts *next;
};

enum ib_work_kind { W_CTL, W_WRITE, W_REFUSE, W_BIND, W_INV };

struct ib_work {
    int kind;
    struct ib_ctl ctl;    /* W_CTL */
    struct ib_send *send; /* W_WRITE */
    struct ib_cts cts;    /* W_WRITE, W_REFUSE: the receive it answers */
    struct ib_win *win;   /* W_BIND, W_INV */
    struct ib_work *next;
};

struct ib_slot { /* a posted receive: control message or immediate-data notification */
    struct ib_peer *peer;
    int qp;
    struct ib_ctl ctl;
};

struct ib_peer {
    int index;
    enum ib_peer_state state;
    struct ib_wire_addr addr;
    int fd;
    int initiator;       /* this side sent the HELLO */
    int preferred;       /* this side's HELLO wins when both connect at once */
    int connecting_tcp;  /* initiator: TCP connect in flight */
    int64_t deadline_ms; /* connecting: when to give up */
    int64_t retry_ms;    /* initiator: connect again then (its connection was dropped unread) */
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
    int ncts;
    struct ib_work *out, **out_tail;
    struct ib_recv *recvs;
    struct ib_win **wins; /* every window made for it, freed with it */
    size_t nwins, wins_cap;
    struct ib_win *win_free;
    struct ib_peer *grave_next;
};

struct ib_stash { /* an accepted connection whose HELLO names no known peer yet */
    int fd;
    unsigned char buf[sizeof(struct ib_hs)];
    size_t got;
    int64_t since_ms;
    int verified; /* its HELLO is whole and names this context */
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

#define IB_BOUNCE_CLASSES 15 /* 4 KiB << 0 .. 14: up to 64 MiB */

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
    int windows; /* receives bind memory windows (else each registers its bytes) */
    int rank;    /* in a communicator; -1 for point-to-point users */
    uint64_t nonce;
    int lfd;
    union sock_addr laddr;
    struct ib_peer **peers;
    size_t npeers; /* slots in peers */
    struct ib_peer *grave;
    struct ib_stash *stash;
    int nstash, stash_warned;
    int hello_ms;     /* an accepted connection's time to say its HELLO (IB_HELLO_MS; tests less) */
    uint64_t *tokens; /* the token each numbered peer's address carries */
    size_t tokens_cap;
    struct ib_recv **ids;
    size_t ids_cap;
    uint32_t *free_ids;
    size_t nfree_ids, next_id;
    struct ib_send *all_sends;
    struct ib_tmr *tmrs;
    struct ib_bounce *bounce_free[IB_BOUNCE_CLASSES];
    size_t bounce_kept; /* bytes in bounce_free */
    struct tp_deferred deferred;
    int64_t last_sock_poll;
    int handshakes; /* peers connecting, stashed connections */
    int peermem;    /* device pointers register with ibv_reg_mr (nvidia-peermem is loaded) */
    /* Flushes (ib_flush.c): a queue pair connected to itself, made at the first flush, that
     * reads a receive's last bytes into flush_buf. */
    struct ibv_qp *flush_qp;
    struct ibv_mr *flush_mr;
    char *flush_buf;
    int flush_used; /* reads posted and not completed */
};

static inline struct ib_ctx *to_ib(struct tp_ctx *c)
{
    return container_of(c, struct ib_ctx, super);
}

/* ---- ib_cq.c: completions, progress and waiting ---- */

/* Completions reach the caller from progress() only: complete defers, deliver hands over. */
void ib_complete(struct ib_ctx *x, struct tp_req *req, reshard_status_t st, size_t got);
int ib_deliver(struct ib_ctx *x);
/* Grows the completion queue to need entries for p, within what the device allows. */
reshard_status_t ib_cq_fit(struct ib_ctx *x, const struct ib_peer *p, int need);
/* Handles every completion the CQ holds; returns how many. */
int ib_cq_poll(struct ib_ctx *x);
int ib_progress(struct tp_ctx *c);
reshard_status_t ib_wait(struct tp_ctx *c, int timeout_ms);

/* ---- ib_wire.c: what crosses the wire, checked before anything uses it ---- */

/* The stripes a message of len bytes is cut into over nqp queue pairs. */
int ib_stripes(size_t len, int nqp);
/* The keys a CTS for a receive of cap bytes carries: one per queue pair its stripes may use. */
int ib_keys_for(size_t cap, int nqp);
/* Each check returns 0 when the message is well formed, else -1 with why it is not in why[n]
 * (the caller fails the peer and says so). */
int ib_addr_check(const void *buf, size_t len, struct ib_wire_addr *out, char *why, size_t n);
int ib_hs_check(const struct ib_hs *h, char *why, size_t n);
int ib_ctl_check(const struct ib_ctl *c, size_t got, int nqp, char *why, size_t n);
/* An immediate: the receive id and stripe count (or CODE_REFUSED) it carries; -1 when the
 * code is neither. */
int ib_imm_check(uint32_t imm, uint32_t *id, uint32_t *code);

/* ---- ib_mr.c: registrations ---- */

/* The access a registration of memory that may receive asks for: no remote access; with
 * windows, the right to bind them. */
int ib_local_access(const struct ib_ctx *x);
/* A transient registration: a send's (read-only, by whole pages, shared while it lasts) or a
 * receive's (writable, exactly its bytes, its own). */
struct ibv_mr *ib_tmr_get(struct ib_ctx *x, const void *addr, size_t len, int writable);
void ib_tmr_put(struct ib_ctx *x, struct ibv_mr *mr);
/* Deregisters every transient registration left (the context closes). */
void ib_tmr_drop_all(struct ib_ctx *x);
/* A registration of exactly [addr, addr + len) that peers may write: for one receive, where
 * the device has no windows. */
struct ibv_mr *ib_mr_exact(struct ib_ctx *x, const struct ib_reg *reg, char *addr, size_t len);
/* Whether device memory registers here: as dma-bufs (ibv_reg_dmabuf_mr), or as device pointers
 * through peer memory; sets super.device_mem, super.dmabuf and device_mem_why. */
void ib_mr_probe_dmabuf(struct ib_ctx *x);
reshard_status_t ib_mem_reg(struct tp_ctx *c, void *addr, size_t len, enum tp_mem mem, void **mh);
reshard_status_t ib_mem_reg_dmabuf(struct tp_ctx *c, void *addr, size_t len, int fd,
                                   uint64_t offset, void **mh);
void ib_mem_dereg(struct tp_ctx *c, void *mh);

/* ---- ib_flush.c: flushes of device memory after a receive ---- */

/* A flush's read completed (its work request id names req, low bits 4). */
void ib_flush_done(struct ib_ctx *x, struct tp_req *req, const struct ibv_wc *wc);
reshard_status_t ib_flush(struct tp_ctx *c, void *mh, const void *addr, size_t len,
                          struct tp_req *req);
/* Destroys the flush queue pair and its buffer (the context closes). */
void ib_flush_close(struct ib_ctx *x);

/* ---- ib_bounce.c: the bounce buffers' arena ---- */

/* A receive into a scatter list lands in one bounce buffer, copied out when it completes. */
struct ib_bounce *ib_bounce_get(struct ib_ctx *x, size_t len);
void ib_bounce_put(struct ib_ctx *x, struct ib_bounce *b);
void ib_bounce_drop_all(struct ib_ctx *x);
void ib_bounce_scatter(const struct iovec *iov, size_t niov, const char *buf, size_t got);

/* ---- ib_key.c: a receive's keys ---- */

/* Whether receives bind memory windows: the device has type 2 windows and
 * RESHARD_IB_MEM_WINDOWS allows them. */
void ib_key_probe(struct ib_ctx *x, const struct ibv_device_attr *da);
/* Makes the receive's keys: windows (their binds queued; the CTS follows their completion)
 * or a registration of its bytes (the CTS queued now). */
reshard_status_t ib_key_make(struct ib_ctx *x, struct ib_recv *r);
/* Posts a window's bind or invalidation (from the peer's FIFO). */
reshard_status_t ib_key_post(struct ib_ctx *x, struct ib_peer *p, const struct ib_work *w);
/* A bind or invalidation completed. */
void ib_key_done(struct ib_ctx *x, struct ib_win *w, int ok);
/* The receive's outcome is known: starts taking its keys back; 1 when nothing is left to
 * wait for (the receive may complete now). */
int ib_key_retire(struct ib_ctx *x, struct ib_recv *r);
/* The peer is down: its windows can no longer be used (their QPs are in error). */
void ib_key_abandon(struct ib_ctx *x, struct ib_recv *r);
/* Frees every window of the peer (its QPs have flushed). */
void ib_key_free_peer(struct ib_ctx *x, struct ib_peer *p);

/* ---- ib_qp.c: queue pairs ---- */

reshard_status_t ib_qp_fail(struct ib_ctx *x, const struct ib_peer *p, const char *call);
reshard_status_t ib_qp_setup(struct ib_ctx *x, struct ib_peer *p);
reshard_status_t ib_qp_connect(struct ib_ctx *x, struct ib_peer *p, const struct ib_hs *h);
/* Moves the peer's QPs to the error state, which flushes what is posted. */
void ib_qp_break(struct ib_ctx *x, struct ib_peer *p);
/* Undoes ib_qp_setup: the QPs, the control buffers, the CQ room they held. */
void ib_qp_teardown(struct ib_ctx *x, struct ib_peer *p);

/* ---- ib_post.c: requests, and the work they post ---- */

reshard_status_t ib_post_slot(struct ib_ctx *x, struct ib_peer *p, struct ib_slot *s);
void ib_send_free(struct ib_ctx *x, struct ib_send *s);
void ib_send_fail(struct ib_ctx *x, struct ib_send *s, reshard_status_t st);
/* The receive's outcome is st: it completes once its keys are taken back. */
void ib_recv_finish(struct ib_ctx *x, struct ib_recv *r, reshard_status_t st);
/* Its windows are bound: the CTS goes (or, cancelled meanwhile, the receive ends). */
void ib_recv_offer(struct ib_ctx *x, struct ib_recv *r);
/* Its keys are back: it completes. */
void ib_recv_complete(struct ib_ctx *x, struct ib_recv *r);
void ib_send_close_all(struct ib_ctx *x);
reshard_status_t ib_pump(struct ib_ctx *x, struct ib_peer *p);
reshard_status_t ib_queue_work(struct ib_ctx *x, struct ib_peer *p, const struct ib_work *w);
reshard_status_t ib_matched(struct ib_ctx *x, struct ib_peer *p, struct ib_send *s,
                            const struct ib_cts *c);
reshard_status_t ib_send(struct tp_ctx *c, int peer, uint64_t tag, const void *buf, size_t len,
                         void *mh, int ctrl, struct tp_req *req);
reshard_status_t ib_send_part(struct tp_ctx *c, int peer, uint64_t tag, const void *buf, size_t len,
                              void *mh, size_t offset, struct tp_req *req);
reshard_status_t ib_recv(struct tp_ctx *c, int peer, uint64_t tag, void *buf, size_t len, void *mh,
                         struct tp_req *req);
reshard_status_t ib_recv_iov(struct tp_ctx *c, int peer, uint64_t tag, const struct iovec *iov,
                             size_t n, struct tp_req *req);
void ib_cancel(struct tp_ctx *c, struct tp_req *req);

/* ---- ib_cm.c: the TCP side channel ---- */

/* The side channel's listener, on the address the context's address names. */
reshard_status_t ib_cm_listen(struct ib_ctx *x);
reshard_status_t ib_address(struct tp_ctx *c, int peer, void *buf, size_t *len);
int ib_cm_remote_index(const struct ib_ctx *x, const struct ib_peer *p);
reshard_status_t ib_cm_start(struct ib_ctx *x, struct ib_peer *p);
void ib_cm_serve_stash(struct ib_ctx *x);
/* Accepts, reads and answers what the sockets have. */
void ib_cm_poll(struct ib_ctx *x);
/* Sends one byte (HS_BYE, HS_FAIL) on the peer's socket without waiting. */
void ib_cm_goodbye(struct ib_peer *p, unsigned char code);
/* Closes every accepted connection still waiting for its peer (the context closes). */
void ib_cm_drop_stash(struct ib_ctx *x);

/* ---- ib_peer.c: a peer's life ---- */

reshard_status_t ib_set_peer(struct tp_ctx *c, int peer, const void *addr, size_t len);
reshard_status_t ib_connect(struct tp_ctx *c, int peer);
/* The peer, connecting if it is not yet; an error when unknown or gone. */
reshard_status_t ib_peer_usable(struct ib_ctx *x, int peer, struct ib_peer **out);
void ib_peer_down(struct ib_ctx *x, struct ib_peer *p, reshard_status_t st, const char *reason);
void ib_peer_reap_grave(struct ib_ctx *x);
void ib_close_peer(struct tp_ctx *c, int peer);
void ib_disconnect(struct tp_ctx *c);
/* Frees every peer, live or in the grave (the context closes). */
void ib_peer_free_all(struct ib_ctx *x);

#endif
