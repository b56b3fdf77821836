/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The listener's half of the handshake (docs/protocols.md section 2): accept works on up to
 * NET_PENDING_MAX connections at once, never blocking. A connection that has not shown its
 * handle's nonce within RESHARD_NET_HELLO_MS is dropped, and when the table is full the oldest
 * such goes to make room, so idle or trickling connections from anyone who reaches the port
 * delay a real connector by at most that long (and it connects again when dropped). Once the
 * nonce matched, the connector has RESHARD_TIMEOUT to send its address and acknowledge the
 * reply; only an acknowledged connection becomes a receive comm, so a connector that gave up
 * never leaves NCCL a comm with nobody at the other end.
 */
#include "net_listen.h"

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "base/param.h"

#include <errno.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ACCEPT_BURST 16 /* new connections taken per accept call */

void net_keepalive(int fd)
{
    static const int on = 1, idle = 10, intvl = 5, cnt = 3;
    if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on)) != 0 ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle)) != 0 ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl)) != 0 ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt)) != 0)
        rs_log(RS_LOG_INFO, "NET/Reshard: TCP keepalive not set: %m; a vanished host would go "
                            "unnoticed");
}

/* ---- one connection, without the transport ---- */

void net_pending_clear(struct net_pending *p)
{
    sock_close(&p->fd);
    free(p->caddr);
    free(p->reply);
    *p = (struct net_pending){.state = NET_PEND_FREE, .fd = -1};
}

/* Reads into buf until it holds want bytes: 1 when it does, 0 when the socket has no more for
 * now, -1 when the connection ended (*why says how). */
static int fill(struct net_pending *p, unsigned char *buf, size_t want, size_t *have,
                const char **why)
{
    while (*have < want) {
        ssize_t n = recv(p->fd, buf + *have, want - *have, MSG_DONTWAIT);
        if (n > 0) {
            *have += (size_t)n;
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return 0;
        *why = n == 0 ? "it closed the connection" : strerror(errno);
        return -1;
    }
    return 1;
}

/* A refusal: the 16-byte reply alone, best effort (the connection is dropped after it). */
static void refuse(struct net_pending *p, enum net_reply_status st)
{
    unsigned char w[NET_REPLY_BYTES];
    net_wire_reply(w, st, 0, 0);
    if (send(p->fd, w, sizeof(w), MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
        rs_log(RS_LOG_TRACE, "NET/Reshard: refusal to %s not sent: %m", p->peer);
}

/* The hello's header is in: the connection is authenticated, or refused. */
static enum net_pend_step hello_in(struct net_pending *p, uint64_t nonce, const char **why)
{
    size_t len = 0;
    switch (net_wire_hello_check(p->hello, sizeof(p->hello), nonce, &len)) {
    case NET_HELLO_OK:
        break;
    case NET_HELLO_FOREIGN:
        refuse(p, NET_REPLY_VERSION);
        *why = "it is not a Reshard connector of this version";
        return NET_PEND_DROP;
    case NET_HELLO_NONCE:
        refuse(p, NET_REPLY_UNKNOWN_NONCE);
        *why = "its handle was not issued by this listener (another job, or a stale handle)";
        return NET_PEND_DROP;
    case NET_HELLO_BAD_ADDRESS:
        *why = "its transport address is empty or too long";
        return NET_PEND_DROP;
    }
    if (!(p->caddr = rs_calloc(1, len, "NET/Reshard peer address"))) {
        *why = "no memory for its address";
        return NET_PEND_DROP;
    }
    p->caddr_len = len;
    p->got = 0;
    p->state = NET_PEND_ADDR;
    p->deadline_ms = rs_now_ms() + 1000 * rs_param_int(RS_PARAM_TIMEOUT);
    return NET_PEND_WAIT;
}

enum net_pend_step net_pending_step(struct net_pending *p, uint64_t nonce, const char **why)
{
    int r;
    unsigned char ack;
    size_t one = 0;
    switch (p->state) {
    case NET_PEND_FREE:
        *why = "no connection";
        return NET_PEND_DROP;
    case NET_PEND_HELLO:
        if ((r = fill(p, p->hello, sizeof(p->hello), &p->got, why)) <= 0)
            return r < 0 ? NET_PEND_DROP : NET_PEND_WAIT;
        if (hello_in(p, nonce, why) == NET_PEND_DROP)
            return NET_PEND_DROP;
        /* fall through */
    case NET_PEND_ADDR:
        if ((r = fill(p, p->caddr, p->caddr_len, &p->got, why)) <= 0)
            return r < 0 ? NET_PEND_DROP : NET_PEND_WAIT;
        return p->reply ? NET_PEND_WAIT : NET_PEND_ANSWER;
    case NET_PEND_REPLY:
        while (p->sent < p->reply_len) {
            ssize_t n = send(p->fd, p->reply + p->sent, p->reply_len - p->sent,
                             MSG_DONTWAIT | MSG_NOSIGNAL);
            if (n > 0) {
                p->sent += (size_t)n;
                continue;
            }
            if (n < 0 && (errno == EAGAIN || errno == EINTR))
                return NET_PEND_WAIT;
            *why = strerror(errno);
            return NET_PEND_DROP;
        }
        p->state = NET_PEND_ACK;
        /* fall through */
    case NET_PEND_ACK: /* exactly one byte: what follows it is the comm's (a goodbye) */
        if ((r = fill(p, &ack, 1, &one, why)) <= 0) {
            if (r < 0)
                *why = "it closed the connection before acknowledging the reply (it gave up)";
            return r < 0 ? NET_PEND_DROP : NET_PEND_WAIT;
        }
        if (ack != NET_ACK) {
            *why = "it sent something other than the acknowledgement";
            return NET_PEND_DROP;
        }
        p->state = NET_PEND_READY;
        /* fall through */
    case NET_PEND_READY:
        return NET_PEND_DONE;
    }
    *why = "a connection in an unknown state";
    return NET_PEND_DROP;
}

reshard_status_t net_pending_answer(struct net_pending *p, const unsigned char *reply, size_t len)
{
    if (!(p->reply = rs_calloc(1, len, "NET/Reshard handshake reply")))
        return RESHARD_ERR_NO_MEMORY;
    memcpy(p->reply, reply, len);
    p->reply_len = len;
    p->sent = 0;
    p->state = NET_PEND_REPLY;
    return RESHARD_OK;
}

/* ---- the listener's table ---- */

void net_listen_report_drops(struct net_listen *l, int force)
{
    int64_t now = rs_now_ms();
    if (!l->quiet_drops || (!force && now < l->quiet_next_ms))
        return;
    rs_log(RS_LOG_INFO,
           "NET/Reshard: listener %s dropped %lu connection(s) that did not show its handle "
           "(the last: %s)",
           l->name, l->quiet_drops, l->quiet_why);
    l->quiet_drops = 0;
    l->quiet_next_ms = now + 1000;
}

/* Drops connection p, saying why: the job's own at WARN; those that never showed the nonce
 * (anyone who reaches the port can make them) one by one at TRACE, counted at INFO. */
static void drop(struct net_listen *l, struct net_pending *p, const char *why)
{
    if (p->state == NET_PEND_HELLO) {
        l->quiet_drops++;
        snprintf(l->quiet_why, sizeof(l->quiet_why), "%s", why);
    }
    rs_log(p->state == NET_PEND_HELLO ? RS_LOG_TRACE : RS_LOG_WARN,
           "NET/Reshard: listener %s dropped the connection from %s: %s", l->name, p->peer, why);
    if (p->comm) {
        pthread_mutex_lock(&l->dev->lock);
        net_comm_retire(p->comm);
        pthread_mutex_unlock(&l->dev->lock);
        p->comm = NULL;
    }
    net_pending_clear(p);
}

/* A free slot, making one by dropping the oldest unauthenticated connection when the table is
 * full; NULL when every connection has shown the nonce (new ones then wait in the kernel). */
static struct net_pending *free_slot(struct net_listen *l)
{
    struct net_pending *oldest = NULL;
    for (int i = 0; i < NET_PENDING_MAX; i++) {
        struct net_pending *p = &l->pend[i];
        if (p->state == NET_PEND_FREE)
            return p;
        if (p->state == NET_PEND_HELLO && (!oldest || p->since_ms < oldest->since_ms))
            oldest = p;
    }
    if (oldest)
        drop(l, oldest, "the listener is full and it is the oldest that has not shown its handle");
    return oldest;
}

static int advance(struct net_listen *l, struct net_pending *p, reshard_status_t *failed);

/* Takes up to ACCEPT_BURST new connections off the listening socket, reading each at once: a
 * real connector's hello is usually there already, and once it has shown the nonce it is never
 * dropped to make room. */
static reshard_status_t take_new(struct net_listen *l, struct net_pending **ready,
                                 reshard_status_t *failed)
{
    for (int i = 0; i < ACCEPT_BURST; i++) {
        struct net_pending *p = free_slot(l);
        if (!p)
            return RESHARD_OK;
        union sock_addr peer;
        int fd;
        RS_CHECK(sock_accept(l->fd, &fd, &peer));
        if (fd < 0)
            return RESHARD_OK;
        p->fd = fd;
        p->state = NET_PEND_HELLO;
        p->since_ms = rs_now_ms();
        p->deadline_ms = p->since_ms + rs_param_int(RS_PARAM_NET_HELLO_MS);
        sock_addr_str(&peer, p->peer, sizeof(p->peer));
        if (advance(l, p, failed) && !*ready)
            *ready = p;
    }
    return RESHARD_OK;
}

/* The connector's address is in: a receive comm, a transport peer for the connector, and the
 * reply that names them. On failure the connector is refused (so it does not try again); *theirs
 * says whether the failure was its address's (the transport would not take it as a peer:
 * anyone who read the handle's nonce can send garbage), which costs only that connection, or
 * this side's (no transport, no memory), which accept reports. */
static reshard_status_t answer(struct net_listen *l, struct net_pending *p, int *theirs)
{
    struct net_dev *d = l->dev;
    unsigned char w[NET_REPLY_BYTES + NET_MAX_ADDR];
    size_t len = NET_MAX_ADDR;
    reshard_status_t st = RESHARD_OK;
    struct rs_saved_error why; /* retiring the comm may log and set messages of its own */
    pthread_mutex_lock(&d->lock);
    RS_CHECK_GOTO(net_dev_tp(d), st, err_unlock_dev);
    if (!(p->comm = net_comm_new(d, NET_KIND_RECV, -1, p->peer))) {
        st = RESHARD_ERR_NO_MEMORY;
        goto err_unlock_dev;
    }
    p->comm->id = ++d->next_id;
    d->users++;
    p->comm->peer = net_dev_peer_take(d);
    *theirs = 1; /* a set_peer or connect refused is the connector's address's fault */
    RS_CHECK_GOTO(net_dev_set_peer(d, p->comm->peer, p->caddr, p->caddr_len), st, err_retire_comm);
    *theirs = 0;
    RS_CHECK_GOTO(net_dev_address(d, p->comm->peer, w + NET_REPLY_BYTES, &len), st,
                  err_retire_comm);
    pthread_mutex_unlock(&d->lock);
    net_wire_reply(w, NET_REPLY_OK, p->comm->id, len);
    return net_pending_answer(p, w, NET_REPLY_BYTES + len);
err_retire_comm:
    rs_error_save(&why);
    net_comm_retire(p->comm);
    p->comm = NULL;
    rs_error_restore(&why);
err_unlock_dev:
    pthread_mutex_unlock(&d->lock);
    if (st == RESHARD_ERR_NO_MEMORY)
        *theirs = 0;
    /* A refusal as for a wrong nonce or version: the connector gives up (RESHARD_ERR_REFUSED). */
    refuse(p, *theirs ? NET_REPLY_VERSION : NET_REPLY_FAILED);
    return st;
}

/* Moves p on; returns 1 when it became a comm that is NCCL's to take. */
static int advance(struct net_listen *l, struct net_pending *p, reshard_status_t *failed)
{
    const char *why = NULL;
    enum net_pend_step step = net_pending_step(p, l->nonce, &why);
    if (step == NET_PEND_ANSWER) {
        int theirs = 0;
        reshard_status_t st = answer(l, p, &theirs);
        if (st != RESHARD_OK) {
            char msg[RS_ERROR_MAX + 64];
            snprintf(msg, sizeof(msg), "%s%s", theirs ? "its transport address was refused: " : "",
                     rs_error_message());
            if (!theirs)
                *failed = st;
            drop(l, p, msg);
            return 0;
        }
        step = net_pending_step(p, l->nonce, &why);
    }
    if (step == NET_PEND_DONE)
        return 1;
    if (step == NET_PEND_DROP)
        drop(l, p, why);
    else if (rs_now_ms() > p->deadline_ms)
        drop(l, p,
             p->state == NET_PEND_HELLO ? "it did not show its handle within RESHARD_NET_HELLO_MS"
                                        : "it did not finish the handshake within RESHARD_TIMEOUT");
    return 0;
}

reshard_status_t net_accept(void *listen_comm, void **recv_comm)
{
    int stale;
    struct net_listen *l = net_live_get(listen_comm, NET_KINDS(NET_KIND_LISTEN), &stale);
    if (!l)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "NET/Reshard: accept on %p, which is not an open listen comm%s",
                        listen_comm, stale ? " (it was closed already)" : "");
    if (!recv_comm)
        return rs_error(RESHARD_ERR_INVALID_ARG, "NET/Reshard: accept without a comm pointer");
    *recv_comm = NULL;
    struct net_pending *ready = NULL;
    reshard_status_t failed = RESHARD_OK;
    RS_CHECK(take_new(l, &ready, &failed));
    for (int i = 0; i < NET_PENDING_MAX; i++) {
        struct net_pending *p = &l->pend[i];
        if (p->state != NET_PEND_FREE && advance(l, p, &failed) &&
            (!ready || p->since_ms < ready->since_ms))
            ready = p;
    }
    net_listen_report_drops(l, 0);
    if (failed != RESHARD_OK)
        return failed; /* the transport failed: NCCL hears of it (the connector was refused) */
    if (!ready)
        return RESHARD_OK;
    struct net_comm *c = ready->comm;
    if (!(c->handle = net_live_add(c, NET_KIND_RECV))) {
        drop(l, ready, "no room for its handle");
        return RESHARD_ERR_NO_MEMORY;
    }
    c->ctx = l->ctx;
    c->fd = ready->fd;
    ready->fd = -1;
    ready->comm = NULL;
    net_keepalive(c->fd);
    net_pending_clear(ready);
    rs_log(RS_LOG_INFO, "NET/Reshard: accepted %s on %s as receive comm %u", c->peer_name, l->name,
           c->id);
    *recv_comm = c->handle;
    return RESHARD_OK;
}
