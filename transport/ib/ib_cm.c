/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Connection management of the ibverbs transport: the TCP side channel. The context's address
 * names its port and its listener; a peer's connection is a handshake over TCP (HELLO, REPLY,
 * READY, or CROSSED to the loser of two at once) that trades queue pair numbers, then the socket
 * stays open as the peer's heartbeat: one goodbye byte, or EOF when the peer died. Accepted
 * connections wait in a stash until their HELLO names a peer this context knows.
 *
 * Anyone who reaches the listener can connect. The stash therefore holds at most IB_STASH_MAX
 * connections that have not yet said a whole HELLO for this context, each for at most
 * IB_HELLO_MS; when it is full, the oldest of them makes room for the newest. A HELLO names
 * this context's random nonce, which only its peers learn, so a connection that said one may
 * wait for its peer to be set (60 s). An initiator whose connection is closed before a byte
 * of answer came (dropped from a full stash) connects again until its deadline.
 */
#include "ib_int.h"

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "base/param.h"

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>

#define STASH_MAX_MS 60000 /* for a HELLO that names this context */
#define RETRY_MS     100   /* an initiator connects again this long after a dropped attempt */

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

reshard_status_t ib_cm_listen(struct ib_ctx *x)
{
    RS_CHECK(listen_addr(&x->port, &x->laddr));
    sock_addr_set_port(&x->laddr, 0);
    return sock_listen(&x->laddr, &x->lfd);
}

reshard_status_t ib_address(struct tp_ctx *c, int peer, void *buf, size_t *len)
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
int ib_cm_remote_index(const struct ib_ctx *x, const struct ib_peer *p)
{
    return p->addr.index >= 0 ? p->addr.index : x->rank;
}

static reshard_status_t hs_send(struct ib_ctx *x, struct ib_peer *p, enum ib_hs_kind kind)
{
    struct ib_hs h = {.magic = HS_MAGIC,
                      .kind = kind,
                      .from = x->nonce,
                      .to = p->addr.nonce,
                      .from_index = p->index,
                      .to_index = ib_cm_remote_index(x, p),
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
    x->super.counters.connects++;
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
        RS_CHECK(ib_qp_setup(x, p)); /* the caller fails the peer */
    }
    RS_CHECK(ib_qp_connect(x, p, h));
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
    if (!p || p->addr.nonce != h->from || ib_cm_remote_index(x, p) != h->from_index)
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
    x->nstash--;
}

/* Once per context: a connection that is not ours (later ones go to the trace level, so that a
 * flood does not flood the log too). */
static void stranger(struct ib_ctx *x, const char *why)
{
    rs_log(x->stash_warned ? RS_LOG_TRACE : RS_LOG_WARN,
           "ib: %s: dropped a connection to its side channel: %s", x->port.name, why);
    x->stash_warned = 1;
}

void ib_cm_drop_stash(struct ib_ctx *x)
{
    while (x->stash)
        stash_drop(x, &x->stash, 1);
}

/* Accepted connections: read their HELLO, hand them to their peer once it is known. */
void ib_cm_serve_stash(struct ib_ctx *x)
{
    int64_t now = rs_now_ms();
    for (struct ib_stash **at = &x->stash; *at;) {
        struct ib_stash *s = *at;
        int r = s->got < sizeof(s->buf) ? read_some(s->fd, s->buf, &s->got, sizeof(s->buf)) : 1;
        unsigned char b;
        if (r == 1 && recv(s->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0)
            r = -1; /* its sender gave up waiting */
        if (r < 0 || now - s->since_ms > (s->verified ? STASH_MAX_MS : x->hello_ms)) {
            if (!s->verified && r >= 0)
                stranger(x, "no HELLO within the deadline");
            stash_drop(x, at, 1);
            continue;
        }
        struct ib_hs h;
        memcpy(&h, s->buf, sizeof(h));
        char why[96];
        if (r == 1 && ib_hs_check(&h, why, sizeof(why))) {
            stranger(x, why);
            stash_drop(x, at, 1);
            continue;
        }
        int drop = 0;
        struct ib_peer *p = r == 1 ? hello_peer(x, &h, &drop) : NULL;
        if (drop == 2) { /* tell the loser, so that it waits rather than fails */
            struct ib_hs c = {.magic = HS_MAGIC,
                              .kind = HS_CROSSED,
                              .from = x->nonce,
                              .to = h.from,
                              .from_index = h.to_index,
                              .to_index = h.from_index};
            (void)!send(s->fd, &c, sizeof(c), MSG_NOSIGNAL | MSG_DONTWAIT);
        } else if (drop) { /* a whole HELLO that is not wanted: say so, so it is not retried */
            if (h.kind != HS_HELLO || h.to != x->nonce)
                stranger(x, "a handshake that is not a HELLO for this context");
            unsigned char fail = HS_FAIL;
            (void)!send(s->fd, &fail, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        }
        if (drop) {
            stash_drop(x, at, 1);
            continue;
        }
        if (r == 1)
            s->verified = 1; /* it knows this context's nonce: it may wait for its peer */
        if (!p) {
            at = &s->next;
            continue;
        }
        int fd = s->fd;
        stash_drop(x, at, 0);
        if (on_hello(x, p, fd, &h) != RESHARD_OK)
            ib_peer_down(x, p, RESHARD_ERR_NETWORK, rs_error_message());
    }
}

/* Makes room for one more connection: drops the oldest that has not said its HELLO; 0 when
 * every one has (they are this context's peers). */
static int stash_room(struct ib_ctx *x)
{
    if (x->nstash < IB_STASH_MAX)
        return 1;
    struct ib_stash **oldest = NULL;
    for (struct ib_stash **at = &x->stash; *at; at = &(*at)->next)
        if (!(*at)->verified)
            oldest = at; /* newest first: the last one found is the oldest */
    if (!oldest)
        return 0;
    stranger(x, "too many connections waiting for their HELLO (the oldest goes)");
    stash_drop(x, oldest, 1);
    return 1;
}

static void accept_new(struct ib_ctx *x)
{
    for (;;) {
        int fd = -1;
        union sock_addr from;
        if (sock_accept(x->lfd, &fd, &from) != RESHARD_OK || fd < 0)
            return;
        struct ib_stash *s = stash_room(x) ? calloc(1, sizeof(*s)) : NULL;
        if (!s) { /* a peer that finds no room is closed unanswered, and connects again */
            sock_close(&fd);
            return;
        }
        s->fd = fd;
        s->since_ms = rs_now_ms();
        s->next = x->stash;
        x->stash = s;
        x->handshakes++;
        x->nstash++;
    }
}

/* One peer's socket: the handshake's next step, or (once up) a goodbye or EOF. */

static void serve_peer(struct ib_ctx *x, struct ib_peer *p)
{
    if (p->fd < 0 || p->state == P_DOWN)
        return;
    reshard_status_t st = RESHARD_OK;
    if (p->state == P_UP) {
        unsigned char b;
        ssize_t n = recv(p->fd, &b, 1, 0);
        if (n >= 0 || (errno != EAGAIN && errno != EINTR))
            ib_cq_poll(x); /* what landed before the peer left still completes */
        if (p->state != P_UP)
            return;
        if (n == 1 && b == HS_BYE)
            ib_peer_down(x, p, RESHARD_OK, "closed its connection");
        else if (n == 1 && b == HS_FAIL)
            ib_peer_down(x, p, RESHARD_ERR_NETWORK, "failed the connection (an error on its side)");
        else if (n == 0)
            ib_peer_down(x, p, RESHARD_ERR_NETWORK, "connection lost (the process died?)");
        else if (n < 0 && errno != EAGAIN && errno != EINTR)
            ib_peer_down(x, p, RESHARD_ERR_NETWORK, "connection lost");
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
        char why[96];
        if (r < 0 && p->initiator && !p->hs_got && (errno == 0 || errno == ECONNRESET)) {
            sock_close(&p->fd); /* dropped unread (a full stash there): connect again */
            p->retry_ms = rs_now_ms() + RETRY_MS;
            rs_log(RS_LOG_TRACE, "ib: rank %d closed the side channel unanswered; again in %d ms",
                   p->index, RETRY_MS);
            return;
        } else if (r < 0) {
            st = rs_error(RESHARD_ERR_NETWORK, "handshake cut short");
        } else if (r == 1) {
            struct ib_hs h;
            memcpy(&h, p->hs_buf, sizeof(h));
            p->hs_got = 0;
            if (ib_hs_check(&h, why, sizeof(why)))
                st = rs_error(RESHARD_ERR_NETWORK, "handshake: %s", why);
            else if (h.from != p->addr.nonce || h.to != x->nonce ||
                     h.from_index != ib_cm_remote_index(x, p) || h.to_index != p->index)
                st = rs_error(RESHARD_ERR_NETWORK, "handshake from someone else");
            else if (p->initiator && h.kind == HS_REPLY &&
                     (st = ib_qp_connect(x, p, &h)) == RESHARD_OK &&
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
        ib_peer_down(x, p, RESHARD_ERR_NETWORK, rs_error_message());
    else if (p->state == P_UP && ib_pump(x, p) != RESHARD_OK)
        ib_peer_down(x, p, RESHARD_ERR_NETWORK, rs_error_message());
}

void ib_cm_poll(struct ib_ctx *x)
{
    x->last_sock_poll = rs_now_ms();
    accept_new(x);
    if (x->stash)
        ib_cm_serve_stash(x);
    for (size_t i = 0; i < x->npeers; i++) {
        struct ib_peer *p = x->peers[i];
        if (p && p->retry_ms && x->last_sock_poll >= p->retry_ms && p->state == P_CONNECTING) {
            p->retry_ms = 0;
            if (sock_connect_start(&p->addr.tcp, &p->fd) == RESHARD_OK)
                p->connecting_tcp = 1;
            else
                ib_peer_down(x, p, RESHARD_ERR_NETWORK, rs_error_message());
        }
        if (p)
            serve_peer(x, p);
        if (p && p->state == P_CONNECTING && x->last_sock_poll > p->deadline_ms) {
            char why[96];
            snprintf(why, sizeof(why), "no connection within RESHARD_TIMEOUT=%lld s",
                     (long long)rs_param_int(RS_PARAM_TIMEOUT));
            ib_peer_down(x, p, RESHARD_ERR_TIMEOUT, why);
        }
    }
}

/* Starts connecting (QPs, TCP) unless done or under way. */
reshard_status_t ib_cm_start(struct ib_ctx *x, struct ib_peer *p)
{
    if (p->state != P_ADDR)
        return RESHARD_OK;
    p->state = P_CONNECTING;
    p->deadline_ms = rs_now_ms() + 1000 * rs_param_int(RS_PARAM_TIMEOUT);
    x->handshakes++;
    p->initiator = 1;
    reshard_status_t st = ib_qp_setup(x, p);
    if (st == RESHARD_OK)
        st = sock_connect_start(&p->addr.tcp, &p->fd);
    if (st != RESHARD_OK) { /* half made: the peer is failed, and later calls say so at once */
        char why[RS_ERROR_MAX];
        snprintf(why, sizeof(why), "%s", rs_error_message());
        ib_peer_down(x, p, st, why);
        return rs_error(st, "%s", why);
    }
    p->connecting_tcp = 1;
    return RESHARD_OK;
}

void ib_cm_goodbye(struct ib_peer *p, unsigned char code)
{
    (void)!send(p->fd, &code, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
}
