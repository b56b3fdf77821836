/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The handshake of the network plugin: connect and accept, neither of which blocks.
 *
 * The handle carries the listener's address and a random nonce. The connector sends
 * hello {magic, version, nonce, length} and its transport address; the listener answers
 * {magic, status, receive comm id, length} and its own, or a refusal when the nonce is not one
 * of its own (a handle from another job, or a stale one). Each side makes the other a peer of
 * its device's transport context (receiver-driven transports such as verbs send to the sender),
 * and each address names the number its side gives the other, which pairs connections up. Where a
 * call must return before the exchange is over, the connector keeps its progress in the handle
 * itself (NCCL calls again with the same handle) and the listener in its listen comm.
 */
#include "net_listen.h"

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "base/param.h"

#include <errno.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>

#define NET_STAGE_MAGIC 0x52535447u /* RSTG */
#define NET_HELLO_MAGIC 0x52534c4fu /* RSLO */
#define NET_REPLY_MAGIC 0x52535250u /* RSRP */
#define NET_REPLY_BYTES 16
#define NET_MAX_ADDR    4096 /* a transport address longer than this is refused */

enum reply_status { REPLY_OK, REPLY_UNKNOWN_NONCE, REPLY_VERSION };

enum connect_phase { PHASE_CONNECT, PHASE_HELLO, PHASE_REPLY, PHASE_ADDR };

struct net_connecting {
    struct net_dev *dev;
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
    int64_t deadline_ms;
    char peer[SOCK_ADDR_STR];
    uint64_t gen;
    struct net_connecting *next; /* every connection in progress, to vet handles against */
};

/* The comm's socket carries nothing after the handshake, so without keepalive a host that
 * vanishes (no FIN, no RST) would go unnoticed: probes after 10 s idle, every 5 s, 3 tries. */
static void keepalive(int fd)
{
    static const int on = 1, idle = 10, intvl = 5, cnt = 3;
    if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on)) != 0 ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle)) != 0 ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl)) != 0 ||
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt)) != 0)
        rs_log(RS_LOG_INFO, "NET/Reshard: TCP keepalive not set: %m; a vanished host would go "
                            "unnoticed");
}

static pthread_mutex_t stages_lock = PTHREAD_MUTEX_INITIALIZER;
static struct net_connecting *stages;
static uint64_t stages_made;

static int64_t deadline(void)
{
    return rs_now_ms() + 1000 * rs_param_int(RS_PARAM_TIMEOUT);
}

/* ---- accept ---- */

/* Drops the connection being accepted, saying why once. */
static void accept_drop(struct net_listen *l, const char *why)
{
    rs_log(RS_LOG_WARN, "NET/Reshard: listener %s dropped the connection from %s: %s", l->name,
           l->apeer, why);
    if (l->comm) {
        pthread_mutex_lock(&l->dev->lock);
        net_comm_retire(l->comm);
        pthread_mutex_unlock(&l->dev->lock);
    }
    net_listen_reset_accept(l);
}

static void put_reply(unsigned char *w, enum reply_status st, uint32_t id, uint32_t len)
{
    sock_wire_put(w, NET_REPLY_MAGIC, 4);
    sock_wire_put(w + 4, st, 4);
    sock_wire_put(w + 8, id, 4);
    sock_wire_put(w + 12, len, 4);
}

/* The hello's header is in: a refusal (1: the connection is dropped), or room for the
 * connector's address. */
static int accept_refuse(struct net_listen *l)
{
    enum reply_status refuse = REPLY_OK;
    if (sock_wire_get(l->hello, 4) != NET_HELLO_MAGIC ||
        sock_wire_get(l->hello + 4, 4) != NET_WIRE_VERSION)
        refuse = REPLY_VERSION;
    else if (sock_wire_get(l->hello + 8, 8) != l->nonce)
        refuse = REPLY_UNKNOWN_NONCE;
    size_t len = sock_wire_get(l->hello + 16, 4);
    if (refuse == REPLY_OK && (!len || len > NET_MAX_ADDR)) {
        accept_drop(l, "its transport address is empty or too long");
        return 1;
    }
    if (refuse == REPLY_OK && !(l->caddr = rs_calloc(1, len, "NET/Reshard peer address"))) {
        accept_drop(l, "no memory for its address");
        return 1;
    }
    l->caddr_len = len;
    if (refuse != REPLY_OK) {
        unsigned char w[NET_REPLY_BYTES];
        put_reply(w, refuse, 0, 0);
        if (send(l->afd, w, sizeof(w), MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
            rs_log(RS_LOG_TRACE, "NET/Reshard: refusal not sent: %m");
        accept_drop(l, refuse == REPLY_VERSION
                           ? "it is not a Reshard connector of this version"
                           : "its handle was not issued by this listener (another job, or a "
                             "stale handle)");
        return 1;
    }
    return 0;
}

/* The hello and the connector's address are in: a receive comm, a transport peer for the
 * connector, and the reply that names them. */
static reshard_status_t accept_answer(struct net_listen *l)
{
    struct net_dev *d = l->dev;
    unsigned char addr[NET_MAX_ADDR];
    size_t len = sizeof(addr);
    reshard_status_t st = RESHARD_OK;
    struct rs_saved_error why; /* retiring the comm may log and set messages of its own */
    pthread_mutex_lock(&d->lock);
    RS_CHECK_GOTO(net_dev_tp(d), st, err_unlock_dev);
    if (!(l->comm = net_comm_new(d, NET_MAGIC_RECV, -1, l->apeer))) {
        st = RESHARD_ERR_NO_MEMORY;
        goto err_unlock_dev;
    }
    l->comm->id = ++d->next_id;
    d->users++;
    l->comm->peer = net_dev_peer_take(d);
    RS_CHECK_GOTO(d->tp->ops->set_peer(d->tp, l->comm->peer, l->caddr, l->caddr_len), st,
                  err_retire_comm);
    RS_CHECK_GOTO(d->tp->ops->connect(d->tp, l->comm->peer), st, err_retire_comm);
    RS_CHECK_GOTO(d->tp->ops->address(d->tp, l->comm->peer, addr, &len), st, err_retire_comm);
    if (!(l->reply = rs_calloc(1, NET_REPLY_BYTES + len, "NET/Reshard handshake"))) {
        st = RESHARD_ERR_NO_MEMORY;
        goto err_retire_comm;
    }
    put_reply(l->reply, REPLY_OK, l->comm->id, (uint32_t)len);
    memcpy(l->reply + NET_REPLY_BYTES, addr, len);
    l->reply_len = NET_REPLY_BYTES + len;
    pthread_mutex_unlock(&d->lock);
    return RESHARD_OK;
err_retire_comm:
    rs_error_save(&why);
    net_comm_retire(l->comm);
    l->comm = NULL;
    rs_error_restore(&why);
err_unlock_dev:
    pthread_mutex_unlock(&d->lock);
    net_listen_reset_accept(l); /* the connector sees the socket close and fails too */
    return st;
}

reshard_status_t net_accept(void *listen_comm, void **recv_comm)
{
    struct net_listen *l = listen_comm;
    if (!l || l->magic != NET_MAGIC_LISTEN)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "NET/Reshard: accept on %p, which is not an open listen comm", listen_comm);
    if (!recv_comm)
        return rs_error(RESHARD_ERR_INVALID_ARG, "NET/Reshard: accept without a comm pointer");
    *recv_comm = NULL;
    if (l->afd < 0) {
        union sock_addr peer;
        RS_CHECK(sock_accept(l->fd, &l->afd, &peer));
        if (l->afd < 0)
            return RESHARD_OK;
        sock_addr_str(&peer, l->apeer, sizeof(l->apeer));
        l->deadline_ms = deadline();
    }
    while (l->got < NET_HELLO_BYTES) {
        ssize_t n = recv(l->afd, l->hello + l->got, NET_HELLO_BYTES - l->got, MSG_DONTWAIT);
        if (n > 0) {
            l->got += (size_t)n;
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            break;
        accept_drop(l, n == 0 ? "it closed before saying hello" : strerror(errno));
        return RESHARD_OK;
    }
    if (l->got == NET_HELLO_BYTES && !l->caddr_len && accept_refuse(l))
        return RESHARD_OK;
    while (l->caddr && l->caddr_got < l->caddr_len) {
        ssize_t n =
            recv(l->afd, l->caddr + l->caddr_got, l->caddr_len - l->caddr_got, MSG_DONTWAIT);
        if (n > 0) {
            l->caddr_got += (size_t)n;
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            break;
        accept_drop(l, n == 0 ? "it closed during the handshake" : strerror(errno));
        return RESHARD_OK;
    }
    if (l->caddr && l->caddr_got == l->caddr_len && !l->reply) {
        RS_CHECK(accept_answer(l));
        if (l->afd < 0)
            return RESHARD_OK; /* failed */
    }
    while (l->reply && l->sent < l->reply_len) {
        ssize_t n =
            send(l->afd, l->reply + l->sent, l->reply_len - l->sent, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n > 0) {
            l->sent += (size_t)n;
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            break;
        accept_drop(l, strerror(errno));
        return RESHARD_OK;
    }
    if (!l->reply || l->sent < l->reply_len) {
        if (rs_now_ms() > l->deadline_ms)
            accept_drop(l, "it did not finish the handshake within RESHARD_TIMEOUT");
        return RESHARD_OK;
    }
    struct net_comm *c = l->comm;
    c->fd = l->afd;
    keepalive(c->fd);
    l->afd = -1;
    l->comm = NULL;
    net_listen_reset_accept(l);
    rs_log(RS_LOG_INFO, "NET/Reshard: accepted %s on %s as receive comm %u", c->peer_name, l->name,
           c->id);
    *recv_comm = c;
    return RESHARD_OK;
}

/* ---- connect ---- */

static void stage_free(struct net_handle *h)
{
    struct net_connecting *s = h->stage;
    pthread_mutex_lock(&stages_lock);
    for (struct net_connecting **p = &stages; *p; p = &(*p)->next)
        if (*p == s) {
            *p = s->next;
            break;
        }
    pthread_mutex_unlock(&stages_lock);
    sock_close(&s->fd);
    if (s->peer_index >= 0) { /* never made a comm */
        pthread_mutex_lock(&s->dev->lock);
        net_dev_peer_give(s->dev, s->peer_index);
        pthread_mutex_unlock(&s->dev->lock);
    }
    free(s->addr);
    free(s->hello);
    free(s);
    h->stage = NULL;
    h->stage_magic = 0;
    h->stage_gen = 0;
}

/* The handle's progress, if it has any and it is one of ours. */
static reshard_status_t stage_find(struct net_handle *h, int *found)
{
    *found = 0;
    if (h->stage_magic != NET_STAGE_MAGIC)
        return RESHARD_OK;
    pthread_mutex_lock(&stages_lock);
    for (struct net_connecting *s = stages; s; s = s->next)
        *found |= s == h->stage && s->gen == h->stage_gen;
    pthread_mutex_unlock(&stages_lock);
    if (!*found)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "NET/Reshard: connect with a handle whose progress is not ours (a copy "
                        "of a handle already used, or garbage)");
    return RESHARD_OK;
}

static reshard_status_t stage_new(struct net_dev *d, struct net_handle *h)
{
    struct net_connecting *s = rs_calloc(1, sizeof(*s), "NET/Reshard connection");
    if (!s)
        return RESHARD_ERR_NO_MEMORY;
    s->dev = d;
    s->fd = -1;
    s->deadline_ms = deadline();
    sock_addr_str(&h->addr, s->peer, sizeof(s->peer));
    s->peer_index = -1;
    unsigned char addr[NET_MAX_ADDR];
    size_t len = sizeof(addr);
    pthread_mutex_lock(&d->lock);
    reshard_status_t st = net_dev_tp(d);
    if (st == RESHARD_OK) {
        s->peer_index = net_dev_peer_take(d);
        st = d->tp->ops->address(d->tp, s->peer_index, addr, &len);
        if (st != RESHARD_OK) {
            net_dev_peer_give(d, s->peer_index);
            s->peer_index = -1;
        }
    }
    pthread_mutex_unlock(&d->lock);
    if (st == RESHARD_OK && !(s->hello = rs_calloc(1, NET_HELLO_BYTES + len, "NET/Reshard hello")))
        st = RESHARD_ERR_NO_MEMORY;
    if (st == RESHARD_OK)
        st = sock_connect_start(&h->addr, &s->fd);
    if (st != RESHARD_OK) {
        if (s->peer_index >= 0) {
            pthread_mutex_lock(&d->lock);
            net_dev_peer_give(d, s->peer_index);
            pthread_mutex_unlock(&d->lock);
        }
        free(s->hello);
        free(s);
        return st;
    }
    s->hello_len = NET_HELLO_BYTES + len;
    sock_wire_put(s->hello, NET_HELLO_MAGIC, 4);
    sock_wire_put(s->hello + 4, NET_WIRE_VERSION, 4);
    sock_wire_put(s->hello + 8, h->nonce, 8);
    sock_wire_put(s->hello + 16, len, 4);
    memcpy(s->hello + NET_HELLO_BYTES, addr, len);
    pthread_mutex_lock(&stages_lock);
    s->next = stages;
    stages = s;
    s->gen = ++stages_made;
    pthread_mutex_unlock(&stages_lock);
    h->stage = s;
    h->stage_gen = s->gen;
    h->stage_magic = NET_STAGE_MAGIC;
    return RESHARD_OK;
}

/* Moves bytes [done, want) of buf in or out; *more when the socket would block. */
static reshard_status_t move(struct net_connecting *s, unsigned char *buf, size_t want, int out,
                             int *more)
{
    *more = 0;
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
        if (n == 0)
            return rs_error(RESHARD_ERR_NETWORK,
                            "NET/Reshard: listener %s closed the connection during the handshake",
                            s->peer);
        return rs_error(RESHARD_ERR_NETWORK, "NET/Reshard: handshake with %s: %m", s->peer);
    }
    return RESHARD_OK;
}

static reshard_status_t check_reply(struct net_connecting *s)
{
    if (sock_wire_get(s->reply, 4) != NET_REPLY_MAGIC)
        return rs_error(RESHARD_ERR_NETWORK,
                        "NET/Reshard: %s answered with something that is not a Reshard reply",
                        s->peer);
    uint64_t status = sock_wire_get(s->reply + 4, 4);
    if (status == REPLY_UNKNOWN_NONCE)
        return rs_error(RESHARD_ERR_REFUSED,
                        "NET/Reshard: listener %s refused the handle: it did not issue it "
                        "(a handle from another job, or from a listen comm since closed)",
                        s->peer);
    if (status != REPLY_OK)
        return rs_error(RESHARD_ERR_REFUSED,
                        "NET/Reshard: listener %s refused the connection (version mismatch)",
                        s->peer);
    s->id = (uint32_t)sock_wire_get(s->reply + 8, 4);
    s->addr_len = sock_wire_get(s->reply + 12, 4);
    if (!s->addr_len || s->addr_len > NET_MAX_ADDR)
        return rs_error(RESHARD_ERR_NETWORK,
                        "NET/Reshard: %s sent a transport address of %zu bytes (1 to %d allowed)",
                        s->peer, s->addr_len, NET_MAX_ADDR);
    if (!(s->addr = rs_calloc(1, s->addr_len, "NET/Reshard peer address")))
        return RESHARD_ERR_NO_MEMORY;
    return RESHARD_OK;
}

static reshard_status_t connect_step(struct net_connecting *s, int *more)
{
    switch (s->phase) {
    case PHASE_CONNECT: {
        int up = 0;
        RS_CHECK(sock_connect_check(s->fd, s->peer, &up));
        *more = !up;
        if (!up)
            return RESHARD_OK;
        s->phase = PHASE_HELLO;
    } /* fall through */
    case PHASE_HELLO:
        RS_CHECK(move(s, s->hello, s->hello_len, 1, more));
        if (*more)
            return RESHARD_OK;
        s->phase = PHASE_REPLY;
        s->done = 0;
        /* fall through */
    case PHASE_REPLY:
        RS_CHECK(move(s, s->reply, sizeof(s->reply), 0, more));
        if (*more)
            return RESHARD_OK;
        RS_CHECK(check_reply(s));
        s->phase = PHASE_ADDR;
        s->done = 0;
        /* fall through */
    case PHASE_ADDR:
        return move(s, s->addr, s->addr_len, 0, more);
    }
    return RESHARD_OK;
}

/* The handshake is over: a transport endpoint to the receiver's address makes the comm. */
static reshard_status_t send_comm_make(struct net_connecting *s, struct net_comm **out)
{
    struct net_dev *d = s->dev;
    reshard_status_t st = RESHARD_OK;
    struct rs_saved_error why; /* retiring the comm may log and set messages of its own */
    pthread_mutex_lock(&d->lock);
    RS_CHECK_GOTO(net_dev_tp(d), st, err_unlock_dev);
    struct net_comm *c = net_comm_new(d, NET_MAGIC_SEND, s->fd, s->peer);
    if (!c) {
        st = RESHARD_ERR_NO_MEMORY;
        goto err_unlock_dev;
    }
    c->id = s->id;
    c->peer = s->peer_index;
    s->peer_index = -1; /* the comm's now */
    st = d->tp->ops->set_peer(d->tp, c->peer, s->addr, s->addr_len);
    if (st == RESHARD_OK)
        st = d->tp->ops->connect(d->tp, c->peer);
    if (st != RESHARD_OK)
        goto err_retire_comm;
    s->fd = -1;
    keepalive(c->fd);
    d->users++;
    *out = c;
    pthread_mutex_unlock(&d->lock);
    return RESHARD_OK;
err_retire_comm:
    rs_error_save(&why);
    c->fd = -1; /* still the stage's to close */
    d->users++;
    net_comm_retire(c);
    rs_error_restore(&why);
err_unlock_dev:
    pthread_mutex_unlock(&d->lock);
    return st;
}

reshard_status_t net_connect(struct net_ctx *ctx, int dev, void *handle, void **send_comm)
{
    RS_CHECK(net_check_ctx(ctx));
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
    int found;
    RS_CHECK(stage_find(h, &found));
    if (!found)
        RS_CHECK(stage_new(d, h));
    struct net_connecting *s = h->stage;
    int more = 0;
    struct net_comm *c = NULL;
    reshard_status_t st = connect_step(s, &more);
    if (st == RESHARD_OK && more && rs_now_ms() > s->deadline_ms)
        st = rs_error(RESHARD_ERR_TIMEOUT,
                      "NET/Reshard: no handshake with %s within RESHARD_TIMEOUT=%lld s", s->peer,
                      (long long)rs_param_int(RS_PARAM_TIMEOUT));
    if (st == RESHARD_OK && !more)
        st = send_comm_make(s, &c);
    if (st != RESHARD_OK || c) {
        stage_free(h);
        if (c)
            rs_log(RS_LOG_INFO, "NET/Reshard: connected to %s (receive comm %u) on %s",
                   c->peer_name, c->id, d->name);
    }
    RS_CHECK(st);
    *send_comm = c;
    return RESHARD_OK;
}
