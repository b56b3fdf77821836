/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The transport ops table (docs/architecture.md, Transports): what the executor needs from a
 * network transport, filled by each implementation with designated initializers. A context serves
 * one communicator; its peers are the communicator's ranks. Requests complete through a callback
 * called from progress(), never from inside the call that posted them.
 *
 * Tagged two-sided messages are the data path: a receive completion is the signal that a
 * chunk arrived, which the pipelined fan-out needs. Contiguous runs go straight from the
 * source buffer into the destination buffer (UCX's rendezvous does the zero-copy where the
 * transport allows); strided ones are packed by the executor.
 */
#ifndef RS_TP_H
#define RS_TP_H

#include "base/reshard_status.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

enum tp_mem { TP_MEM_HOST, TP_MEM_CUDA };

struct tp_req;
/* st: RESHARD_OK or why it failed; bytes: what a receive got. A receive smaller than its
 * message fails with RESHARD_ERR_TOO_LARGE, bytes then the message's length where the
 * transport tells it (else 0); a failed request's why names the transport's status. */
typedef void (*tp_done_fn)(struct tp_req *req, reshard_status_t st, size_t bytes);

/* Embedded by the caller in its own per-transfer state; recovered with container_of. Every
 * request that was posted successfully completes exactly once, through done, called from
 * progress() and never from inside the call that posted it; cancel only
 * hastens that (with RESHARD_ERR_NETWORK), so the caller must keep the request alive until
 * then. The fields after done are the transport's. */
struct tp_req {
    tp_done_fn done;
    struct tp_ctx *ctx;
    void *handle; /* the transport's request; NULL once completed */
    int peer;     /* who it was for / from */
    size_t len;
    int ctrl;
    int state; /* transport's: posting, posted, or completed inside the posting call */
    reshard_status_t st;
    size_t got;
    const char *why;     /* a static string: the transport's status when the request failed */
    struct tp_req *next; /* completions waiting for the next progress() */
};

/* Payload bytes a context moved; control messages (flagged by the caller) apart. */
struct tp_counters {
    uint64_t bytes_out, bytes_in; /* completed data sends / receives */
    uint64_t ctrl_out;            /* control messages sent */
    uint64_t msgs_out;            /* data messages sent */
    uint64_t connects;            /* connections this context made or took (endpoints, QP sets) */
};

struct tp_config {
    int rank, size;      /* peers 0..size-1; set_peer may add more (point-to-point users) */
    const char *tls;     /* UCX_TLS syntax for the network context */
    const char *devices; /* network devices to use (UCX_NET_DEVICES syntax); NULL: all */
    int peer_errors;     /* fail a dead peer's requests at once, at a cost in bandwidth */
    int serialized;      /* calls come from several threads, one at a time (caller's lock) */
    int local_rank;      /* rank on this host (-1: unknown): picks the NIC of a multi-rail host */
};

struct tp_ctx {
    const struct tp_ops *ops;
    struct tp_counters counters;
    /* The first peer whose connection failed (-1: none) and the transport's reason, so that
     * waits on its messages end at once instead of at the timeout. */
    int failed_peer;
    char failed_why[96];
    /* Whether mem_reg takes device memory (TP_MEM_CUDA) for the network to read and write
     * directly (GPUDirect RDMA): set at init, with the reason when it does not. */
    int device_mem;
    char device_mem_why[160];
    /* Whether mem_reg_dmabuf takes a dma-buf of device memory (device_mem may also come
     * from peer memory, which registers device pointers but not dma-bufs). */
    int dmabuf;
};

/* The bits of a message tag that belong to the caller; the transport owns the others. */
#define TP_TAG_BITS 44
#define TP_TAG_MASK ((UINT64_C(1) << TP_TAG_BITS) - 1)

#define container_of(p, type, member) ((type *)((char *)(p)-offsetof(type, member)))

/* ---- for implementations ---- */

/* Fills the caller's fields of a request being posted; state is the transport's. */
static inline void tp_req_start(struct tp_ctx *c, struct tp_req *req, int peer, size_t len,
                                int ctrl, int state)
{
    req->ctx = c;
    req->peer = peer;
    req->len = len;
    req->ctrl = ctrl;
    req->handle = NULL;
    req->state = state;
}

/* Completions waiting for the next progress(): none reaches the caller from inside the call
 * that posted it. */
struct tp_deferred {
    struct tp_req *head, **tail;
};

static inline void tp_deferred_init(struct tp_deferred *d)
{
    d->head = NULL;
    d->tail = &d->head;
}

static inline void tp_defer(struct tp_deferred *d, struct tp_req *req, reshard_status_t st,
                            size_t got)
{
    req->handle = NULL;
    req->st = st;
    req->got = got;
    req->next = NULL;
    *d->tail = req;
    d->tail = &req->next;
}

/* Calls done for every deferred completion; returns how many. */
static inline int tp_deliver(struct tp_deferred *d)
{
    int n = 0;
    while (d->head) {
        struct tp_req *req = d->head;
        if (!(d->head = req->next))
            d->tail = &d->head;
        req->done(req, req->st, req->got);
        n++;
    }
    return n;
}

struct tp_ops {
    size_t size; /* sizeof(struct tp_ops) */
    const char *name;
    /* RESHARD_ERR_UNAVAILABLE when the library is missing on this host. */
    reshard_status_t (*init)(const struct tp_config *cfg, struct tp_ctx **out);
    /* This context's address for the peer this context numbers `peer`: *len is the capacity
     * of buf on entry, the length on return. peer -1: both sides number peers by rank (a
     * communicator), so one address serves everyone. Transports with a connection per pair
     * (RC queue pairs) pair the two ends up by these numbers; UCX ignores them. */
    reshard_status_t (*address)(struct tp_ctx *ctx, int peer, void *buf, size_t *len);
    /* Records peer's address; the connection itself may be made on first use. A peer at or
     * past the configured size grows the table (the NCCL plugin numbers its connections). */
    reshard_status_t (*set_peer)(struct tp_ctx *ctx, int peer, const void *addr, size_t len);
    /* Connects now, so that a receive-only rank also learns when this peer fails. */
    reshard_status_t (*connect)(struct tp_ctx *ctx, int peer);
    /* Registers memory once for many transfers; *mh goes with every transfer inside it. */
    reshard_status_t (*mem_reg)(struct tp_ctx *ctx, void *addr, size_t len, enum tp_mem mem,
                                void **mh);
    void (*mem_dereg)(struct tp_ctx *ctx, void *mh);
    /* Registers device memory that arrives as a dma-buf: the len bytes at offset of fd, which
     * the process sees at addr. The caller may close fd once this returns. NULL where the
     * transport takes no dma-bufs (ctx->dmabuf says whether this context does). */
    reshard_status_t (*mem_reg_dmabuf)(struct tp_ctx *ctx, void *addr, size_t len, int fd,
                                       uint64_t offset, void **mh);
    /* Makes the network's writes into registered memory (a completed receive of device
     * memory) visible to the device before req completes: a read of the receive's last bytes
     * [addr, addr + len) (len at least 1) through the registration mh, as GPUDirect RDMA needs
     * before a kernel reads the data. NULL where the transport needs no flush of its own. */
    reshard_status_t (*flush)(struct tp_ctx *ctx, void *mh, const void *addr, size_t len,
                              struct tp_req *req);
    /* ctrl: a control message (counted apart from payload). mh may be NULL. */
    reshard_status_t (*send)(struct tp_ctx *ctx, int peer, uint64_t tag, const void *buf,
                             size_t len, void *mh, int ctrl, struct tp_req *req);
    /* A part of a message striped over several contexts (the NCCL plugin's virtual NICs): the
     * len bytes land at [offset, offset + len) of the matching receive's buffer, which
     * completes with len bytes, so each context's receive may cover the whole buffer while
     * each sender writes its own part. A part that does not fit fails both ends as an
     * oversized message does. NULL where the transport cannot place bytes at an offset. */
    reshard_status_t (*send_part)(struct tp_ctx *ctx, int peer, uint64_t tag, const void *buf,
                                  size_t len, void *mh, size_t offset, struct tp_req *req);
    /* Matches the message from peer with exactly this tag: a message from another peer never
     * fills it, whatever its tag. Tags use the low TP_TAG_BITS bits; a transport may keep the
     * rest for the sender's rank. */
    reshard_status_t (*recv)(struct tp_ctx *ctx, int peer, uint64_t tag, void *buf, size_t len,
                             void *mh, struct tp_req *req);
    /* The same into a scatter list (iov stays valid until completion): strided destinations
     * receive in place, so receives never wait for staging memory. */
    reshard_status_t (*recv_iov)(struct tp_ctx *ctx, int peer, uint64_t tag,
                                 const struct iovec *iov, size_t n, struct tp_req *req);
    /* Asks an outstanding request to finish early (receives; a send may still complete). */
    void (*cancel)(struct tp_ctx *ctx, struct tp_req *req);
    /* Advances requests; returns non-zero when something happened. */
    int (*progress)(struct tp_ctx *ctx);
    /* Sleeps until the context has work or timeout_ms passes (0 when something is ready). */
    reshard_status_t (*wait)(struct tp_ctx *ctx, int timeout_ms);
    /* Closes every connection (waiting a bounded time for peers that may be gone), which
     * completes whatever is still bound to them; registrations stay valid until close. */
    void (*disconnect)(struct tp_ctx *ctx);
    /* Starts closing one peer's connection without waiting; progress() finishes it and close
     * releases what is left. Requests bound to the peer still complete exactly once, and the
     * index may be given to another peer by set_peer. */
    void (*close_peer)(struct tp_ctx *ctx, int peer);
    void (*close)(struct tp_ctx *ctx);
};

extern const struct tp_ops tp_ucx_ops;
extern const struct tp_ops tp_ib_ops;

/* Fault injection for tests: moves this side's queue pairs to peer into the error state,
 * as a broken link or a destroyed remote QP would, without touching the side channel. */
void tp_ib_break_peer(struct tp_ctx *ctx, int peer);

/* RESHARD_TRANSPORT: ib, ucx, or auto (ib when an RDMA port is active, else ucx). A named
 * transport that cannot run here is an error saying why, not a silent fallback. */
reshard_status_t tp_pick(const struct tp_ops **ops);

#endif
