/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The connector's half of the handshake (docs/protocols.md section 2), never blocking.
 *
 * The handle carries the listener's address and a random nonce. The connector sends
 * hello {magic, version, nonce, length} and its transport address; the listener answers
 * {magic, status, receive comm id, length} and its own, or a refusal when the nonce is not one
 * of its own (a handle from another job, or a stale one). The connector then makes its send
 * comm and acknowledges with one byte, after which the listener hands its receive comm to
 * NCCL. Each side makes the other a peer of its device's transport context (receiver-driven
 * transports such as verbs send to the sender), and each address names the number its side
 * gives the other, which pairs connections up. NCCL calls connect again with the same handle
 * until a comm comes back, so the progress lives in the registry and the handle names it.
 *
 * A listener drops connections that are slow to show the nonce when strangers crowd it: a
 * connection closed before any reply is made again, with backoff, until RESHARD_TIMEOUT.
 */
#include "net_listen.h"

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "base/param.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define RETRY_FIRST_MS 10
#define RETRY_MAX_MS   500

enum connect_phase {
    PHASE_CONNECT,
    PHASE_HELLO,
    PHASE_REPLY,
    PHASE_ADDR,
    PHASE_ACK,
    PHASE_RETRY, /* the listener dropped the connection before answering: again, later */
};

struct net_connecting {
    void *handle;    /* its registry handle, which the NCCL handle carries */
    const void *ctx; /* the context it was made through: its finalize gives it up */
    struct net_dev *dev;
    union sock_addr to;
    int fd;
    enum connect_phase phase;
    unsigned char *hello; /* the header, then this side's transport address */
    size_t hello_len;
    int peer_index; /* this side's number for the listener (-1: none taken) */
    unsigned char reply[NET_REPLY_BYTES];
    size_t done; /* bytes of the current phase moved */
    unsigned char *addr;
    size_t addr_len;
    uint32_t id;
    struct net_comm *comm; /* made once the listener's address is in */
    int64_t deadline_ms, retry_ms;
    int retries;
    char peer[SOCK_ADDR_STR];
};

/* Releases s: its socket, its transport peer or comm, its hold on the device. */
static void stage_release(struct net_connecting *s)
{
    net_live_drop(s->handle);
    sock_close(&s->fd);
    pthread_mutex_lock(&s->dev->lock);
    if (s->comm) /* made, and never handed to NCCL */
        net_comm_retire(s->comm);
    else if (s->peer_index >= 0)
        net_dev_peer_give(s->dev, s->peer_index);
    s->dev->users--;
    pthread_mutex_unlock(&s->dev->lock);
    free(s->addr);
    free(s->hello);
    free(s);
}

static void stage_free(struct net_handle *h, struct net_connecting *s)
{
    stage_release(s);
    h->stage = 0;
    h->stage_magic = 0;
}

void net_stage_finalize(void *stage, const void *ctx)
{
    struct net_connecting *s = stage;
    if (s->ctx != ctx)
        return;
    rs_log(RS_LOG_INFO, "NET/Reshard: finalize gives up the connection to %s still in progress",
           s->peer);
    stage_release(s); /* NCCL's handle, which may be gone, names a stale one from now on */
}

void net_stage_forget(void *stage)
{
    struct net_connecting *s = stage;
    sock_close(&s->fd);
}

/* The handle's progress: *s NULL when it has none yet; an error when it names progress that is
 * not a live connection of this process. */
static reshard_status_t stage_find(const struct net_handle *h, struct net_connecting **s)
{
    *s = NULL;
    if (h->stage_magic != NET_STAGE_MAGIC)
        return RESHARD_OK;
    if (!(*s = net_live_get((void *)(uintptr_t)h->stage, NET_KINDS(NET_KIND_STAGE), NULL)))
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "NET/Reshard: connect with a handle whose progress is not ours (a copy "
                        "of a handle already used, or garbage)");
    return RESHARD_OK;
}

static reshard_status_t stage_new(const void *ctx, struct net_dev *d, struct net_handle *h,
                                  struct net_connecting **out)
{
    struct net_connecting *s = rs_calloc(1, sizeof(*s), "NET/Reshard connection");
    if (!s)
        return RESHARD_ERR_NO_MEMORY;
    s->ctx = ctx;
    s->dev = d;
    s->to = h->addr;
    s->fd = -1;
    s->deadline_ms = rs_now_ms() + 1000 * rs_param_int(RS_PARAM_TIMEOUT);
    sock_addr_str(&h->addr, s->peer, sizeof(s->peer));
    s->peer_index = -1;
    unsigned char addr[NET_MAX_ADDR];
    size_t len = sizeof(addr);
    pthread_mutex_lock(&d->lock);
    d->users++; /* the device and its transport stay while a connection is in progress */
    reshard_status_t st = net_dev_tp(d);
    if (st == RESHARD_OK) {
        s->peer_index = net_dev_peer_take(d);
        st = net_dev_address(d, s->peer_index, addr, &len);
    }
    pthread_mutex_unlock(&d->lock);
    if (st == RESHARD_OK && !(s->hello = rs_calloc(1, NET_HELLO_BYTES + len, "NET/Reshard hello")))
        st = RESHARD_ERR_NO_MEMORY;
    if (st == RESHARD_OK && !(s->handle = net_live_add(s, NET_KIND_STAGE)))
        st = RESHARD_ERR_NO_MEMORY;
    if (st == RESHARD_OK)
        st = sock_connect_start(&s->to, &s->fd);
    if (st != RESHARD_OK) {
        stage_free(h, s);
        return st;
    }
    s->hello_len = NET_HELLO_BYTES + len;
    net_wire_hello(s->hello, h->nonce, len);
    memcpy(s->hello + NET_HELLO_BYTES, addr, len);
    h->stage = (uint64_t)(uintptr_t)s->handle;
    h->stage_magic = NET_STAGE_MAGIC;
    *out = s;
    return RESHARD_OK;
}

/* Moves bytes [done, want) of buf in or out; *more when the socket would block, *dropped when
 * the listener closed or reset the connection. */
static reshard_status_t move(struct net_connecting *s, unsigned char *buf, size_t want, int out,
                             int *more, int *dropped)
{
    *more = *dropped = 0;
    while (s->done < want) {
        ssize_t n = out ? send(s->fd, buf + s->done, want - s->done, MSG_DONTWAIT | MSG_NOSIGNAL)
                        : recv(s->fd, buf + s->done, want - s->done, MSG_DONTWAIT);
        if (n > 0) {
            s->done += (size_t)n;
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
            *more = 1;
            return RESHARD_OK;
        }
        *dropped = n == 0 || errno == ECONNRESET || errno == EPIPE;
        if (n == 0)
            return rs_error(RESHARD_ERR_NETWORK,
                            "NET/Reshard: listener %s closed the connection during the handshake",
                            s->peer);
        return rs_error(RESHARD_ERR_NETWORK, "NET/Reshard: handshake with %s: %m", s->peer);
    }
    return RESHARD_OK;
}

/* The listener dropped the connection before answering: connect again after a backoff. */
static void retry_later(struct net_connecting *s)
{
    int wait = RETRY_FIRST_MS << (s->retries < 6 ? s->retries : 6);
    wait = wait < RETRY_MAX_MS ? wait : RETRY_MAX_MS;
    rs_log(RS_LOG_INFO,
           "NET/Reshard: listener %s closed the connection before answering (a listener drops "
           "connections slow to show their handle when strangers crowd it); connecting again "
           "in %d ms",
           s->peer, wait);
    sock_close(&s->fd);
    s->retries++;
    s->retry_ms = rs_now_ms() + wait;
    s->phase = PHASE_RETRY;
    s->done = 0;
}

/* The handshake is over: a transport endpoint to the receiver's address makes the comm. */
static reshard_status_t send_comm_make(struct net_connecting *s)
{
    struct net_dev *d = s->dev;
    reshard_status_t st = RESHARD_OK;
    struct rs_saved_error why; /* retiring the comm may log and set messages of its own */
    pthread_mutex_lock(&d->lock);
    RS_CHECK_GOTO(net_dev_tp(d), st, err_unlock_dev);
    struct net_comm *c = net_comm_new(d, NET_KIND_SEND, -1, s->peer);
    if (!c) {
        st = RESHARD_ERR_NO_MEMORY;
        goto err_unlock_dev;
    }
    c->id = s->id;
    c->peer = s->peer_index;
    s->peer_index = -1; /* the comm's now */
    d->users++;
    RS_CHECK_GOTO(net_dev_set_peer(d, c->peer, s->addr, s->addr_len), st, err_retire_comm);
    s->comm = c;
    pthread_mutex_unlock(&d->lock);
    return RESHARD_OK;
err_retire_comm:
    rs_error_save(&why);
    net_comm_retire(c);
    rs_error_restore(&why);
err_unlock_dev:
    pthread_mutex_unlock(&d->lock);
    return st;
}

static reshard_status_t connect_step(struct net_connecting *s, int *more)
{
    int dropped = 0;
    reshard_status_t st = RESHARD_OK;
    *more = 0;
    switch (s->phase) {
    case PHASE_RETRY:
        if (rs_now_ms() < s->retry_ms) {
            *more = 1;
            return RESHARD_OK;
        }
        RS_CHECK(sock_connect_start(&s->to, &s->fd));
        s->phase = PHASE_CONNECT;
        /* fall through */
    case PHASE_CONNECT: {
        int up = 0;
        RS_CHECK(sock_connect_check(s->fd, s->peer, &up));
        *more = !up;
        if (!up)
            return RESHARD_OK;
        s->phase = PHASE_HELLO;
        s->done = 0;
    } /* fall through */
    case PHASE_HELLO:
        if ((st = move(s, s->hello, s->hello_len, 1, more, &dropped)) != RESHARD_OK || *more)
            break;
        s->phase = PHASE_REPLY;
        s->done = 0;
        /* fall through */
    case PHASE_REPLY:
        if ((st = move(s, s->reply, sizeof(s->reply), 0, more, &dropped)) != RESHARD_OK || *more)
            break;
        RS_CHECK(net_wire_reply_check(s->reply, sizeof(s->reply), s->peer, &s->id, &s->addr_len));
        if (!(s->addr = rs_calloc(1, s->addr_len, "NET/Reshard peer address")))
            return RESHARD_ERR_NO_MEMORY;
        s->phase = PHASE_ADDR;
        s->done = 0;
        /* fall through */
    case PHASE_ADDR:
        RS_CHECK(move(s, s->addr, s->addr_len, 0, more, &dropped));
        if (*more)
            return RESHARD_OK;
        RS_CHECK(send_comm_make(s));
        s->phase = PHASE_ACK;
        s->done = 0;
        /* fall through */
    case PHASE_ACK: {
        static const unsigned char ack = NET_ACK;
        return move(s, (unsigned char *)&ack, 1, 1, more, &dropped);
    }
    }
    /* Dropped before any byte of the reply: the listener made room for another connection. */
    if (st != RESHARD_OK && dropped && (s->phase == PHASE_HELLO || !s->done) &&
        rs_now_ms() < s->deadline_ms) {
        retry_later(s);
        *more = 1;
        return RESHARD_OK;
    }
    return st;
}

reshard_status_t net_connect(void *ctx, int dev, void *handle, void **send_comm)
{
    RS_CHECK(net_ctx_check(ctx));
    struct net_handle *h = handle;
    if (!h || !send_comm)
        return rs_error(RESHARD_ERR_INVALID_ARG, "NET/Reshard: connect without a handle");
    *send_comm = NULL;
    if (h->magic != NET_HANDLE_MAGIC || h->version != NET_WIRE_VERSION ||
        (h->addr.sa.sa_family != AF_INET && h->addr.sa.sa_family != AF_INET6))
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "NET/Reshard: connect with a handle that listen did not fill (magic "
                        "%#x, version %u)",
                        h->magic, h->version);
    struct net_dev *d = net_dev_get(dev);
    if (!d)
        return RESHARD_ERR_INVALID_ARG;
    struct net_connecting *s;
    RS_CHECK(stage_find(h, &s));
    if (!s)
        RS_CHECK(stage_new(ctx, d, h, &s));
    int more = 0;
    reshard_status_t st = connect_step(s, &more);
    if (st == RESHARD_OK && more && rs_now_ms() > s->deadline_ms)
        st = rs_error(RESHARD_ERR_TIMEOUT,
                      "NET/Reshard: no handshake with %s within RESHARD_TIMEOUT=%lld s", s->peer,
                      (long long)rs_param_int(RS_PARAM_TIMEOUT));
    struct net_comm *c = NULL;
    if (st == RESHARD_OK && !more && !(s->comm->handle = net_live_add(s->comm, NET_KIND_SEND)))
        st = RESHARD_ERR_NO_MEMORY;
    if (st == RESHARD_OK && !more) {
        c = s->comm;
        c->ctx = s->ctx;
        c->fd = s->fd;
        s->fd = -1;
        s->comm = NULL;
        net_keepalive(c->fd);
        rs_log(RS_LOG_INFO, "NET/Reshard: connected to %s (receive comm %u) on %s", c->peer_name,
               c->id, d->name);
    }
    if (st != RESHARD_OK || c)
        stage_free(h, s);
    RS_CHECK(st);
    *send_comm = c ? c->handle : NULL;
    return RESHARD_OK;
}
