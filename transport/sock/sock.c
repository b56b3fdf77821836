/* SPDX-License-Identifier: Apache-2.0 */
#include "sock.h"

#include "base/clock.h"
#include "base/error.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <limits.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define FRAME_MAGIC 0x52534231u /* "RSB1" */

const char *sock_ms_str(int ms, char *buf, size_t n)
{
    if (ms < 1000)
        snprintf(buf, n, "%d ms", ms);
    else if (ms % 1000 == 0)
        snprintf(buf, n, "%d s", ms / 1000);
    else
        snprintf(buf, n, "%.1f s", ms / 1000.0);
    return buf;
}

const char *sock_msg_body(const char *msg)
{
    return strncmp(msg, "bootstrap: ", 11) ? msg : msg + 11;
}

/* ---- addresses ---- */

socklen_t sock_addr_len(const union sock_addr *a)
{
    return a->sa.sa_family == AF_INET6 ? sizeof(a->in6) : sizeof(a->in);
}

int sock_addr_port(const union sock_addr *a)
{
    return ntohs(a->sa.sa_family == AF_INET6 ? a->in6.sin6_port : a->in.sin_port);
}

void sock_addr_set_port(union sock_addr *a, int port)
{
    if (a->sa.sa_family == AF_INET6)
        a->in6.sin6_port = htons((uint16_t)port);
    else
        a->in.sin_port = htons((uint16_t)port);
}

const char *sock_addr_str(const union sock_addr *a, char *buf, size_t n)
{
    char host[INET6_ADDRSTRLEN] = "?";
    if (a->sa.sa_family == AF_INET6) {
        inet_ntop(AF_INET6, &a->in6.sin6_addr, host, sizeof(host));
        if (a->in6.sin6_scope_id)
            snprintf(buf, n, "[%s%%%u]:%d", host, a->in6.sin6_scope_id, sock_addr_port(a));
        else
            snprintf(buf, n, "[%s]:%d", host, sock_addr_port(a));
    } else {
        inet_ntop(AF_INET, &a->in.sin_addr, host, sizeof(host));
        snprintf(buf, n, "%s:%d", host, sock_addr_port(a));
    }
    return buf;
}

reshard_status_t sock_resolve(const char *host, int port, union sock_addr *out)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res, *pick = NULL;
    int rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc != 0) {
        /* A name that does not exist is the user's to fix; anything else may pass. */
        reshard_status_t st =
            rc == EAI_NONAME || rc == EAI_FAMILY ? RESHARD_ERR_INVALID_ARG : RESHARD_ERR_NETWORK;
        return rs_error(st, "bootstrap: getaddrinfo(%s): %s", host,
                        rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc));
    }
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        if (ai->ai_family == AF_INET && (!pick || pick->ai_family != AF_INET))
            pick = ai;
        else if (ai->ai_family == AF_INET6 && !pick)
            pick = ai;
    }
    if (!pick) {
        freeaddrinfo(res);
        return rs_error(RESHARD_ERR_INVALID_ARG, "bootstrap: %s has no IPv4 or IPv6 address", host);
    }
    memset(out, 0, sizeof(*out));
    memcpy(out, pick->ai_addr, pick->ai_addrlen);
    sock_addr_set_port(out, port);
    freeaddrinfo(res);
    return RESHARD_OK;
}

reshard_status_t sock_default_addr(union sock_addr *out)
{
    struct ifaddrs *list = NULL;
    memset(out, 0, sizeof(*out));
    out->in.sin_family = AF_INET;
    out->in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    /* Without the interface list, loopback still serves every rank on this host. */
    if (getifaddrs(&list) != 0)
        return RESHARD_OK;
    for (struct ifaddrs *i = list; i; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP) ||
            (i->ifa_flags & IFF_LOOPBACK))
            continue;
        memcpy(&out->in, i->ifa_addr, sizeof(out->in));
        break;
    }
    freeifaddrs(list);
    return RESHARD_OK;
}

/* ---- sockets ---- */

/* poll() until an event or the deadline; EINTR polls again for the time left. Returns poll's
 * count, 0 at the deadline, or -1 with errno. */
static int poll_until(struct pollfd *p, nfds_t n, int64_t deadline_ms)
{
    for (;;) {
        int64_t left = deadline_ms - rs_now_ms();
        int rc = poll(p, n, left <= 0 ? 0 : left > INT_MAX ? INT_MAX : (int)left);
        if (rc >= 0 || errno != EINTR)
            return rc;
    }
}

reshard_status_t sock_poll(struct pollfd *p, int n, int64_t deadline_ms, int *ready)
{
    int rc = poll_until(p, (nfds_t)n, deadline_ms);
    if (rc < 0)
        return rs_error(RESHARD_ERR_NETWORK, "bootstrap: poll: %m");
    *ready = rc;
    return RESHARD_OK;
}

static reshard_status_t sock_open(int family, int *fd)
{
    int s = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s < 0)
        return rs_error(RESHARD_ERR_NETWORK, "bootstrap: socket: %m");
    *fd = s;
    return RESHARD_OK;
}

static reshard_status_t sock_setopt(int fd, int level, int name, int value, const char *what)
{
    if (setsockopt(fd, level, name, &value, sizeof(value)) != 0)
        return rs_error(RESHARD_ERR_NETWORK, "bootstrap: setsockopt(%s): %m", what);
    return RESHARD_OK;
}

void sock_close(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

reshard_status_t sock_listen(union sock_addr *a, int *fd)
{
    char as[SOCK_ADDR_STR];
    socklen_t len = sizeof(*a);
    reshard_status_t st;
    int s = -1;
    RS_CHECK(sock_open(a->sa.sa_family, &s));
    RS_CHECK_GOTO(sock_setopt(s, SOL_SOCKET, SO_REUSEADDR, 1, "SO_REUSEADDR"), st, err_close);
    /* [::] then takes IPv4 peers too, whatever the host's default. */
    if (a->sa.sa_family == AF_INET6)
        RS_CHECK_GOTO(sock_setopt(s, IPPROTO_IPV6, IPV6_V6ONLY, 0, "IPV6_V6ONLY"), st, err_close);
    if (bind(s, &a->sa, sock_addr_len(a)) != 0) {
        st = rs_error(RESHARD_ERR_NETWORK, "bootstrap: bind to %s: %m",
                      sock_addr_str(a, as, sizeof(as)));
        goto err_close;
    }
    if (listen(s, SOMAXCONN) != 0) {
        st = rs_error(RESHARD_ERR_NETWORK, "bootstrap: listen on %s: %m",
                      sock_addr_str(a, as, sizeof(as)));
        goto err_close;
    }
    if (getsockname(s, &a->sa, &len) != 0) {
        st = rs_error(RESHARD_ERR_NETWORK, "bootstrap: getsockname: %m");
        goto err_close;
    }
    *fd = s;
    return RESHARD_OK;
err_close:
    close(s);
    return st;
}

reshard_status_t sock_accept(int lfd, int *fd, union sock_addr *peer)
{
    for (;;) {
        socklen_t len = sizeof(*peer);
        int s = accept4(lfd, &peer->sa, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (s >= 0) {
            reshard_status_t st = sock_setopt(s, IPPROTO_TCP, TCP_NODELAY, 1, "TCP_NODELAY");
            if (st != RESHARD_OK)
                close(s);
            *fd = st == RESHARD_OK ? s : -1;
            return st;
        }
        if (errno == EINTR)
            continue;
        /* A peer that gave up before we took it is no error of ours. */
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ECONNABORTED) {
            *fd = -1;
            return RESHARD_OK;
        }
        return rs_error(RESHARD_ERR_NETWORK, "bootstrap: accept: %m");
    }
}

/* One attempt: 0 when connected, else the errno (ETIMEDOUT at the deadline). */
static int connect_once(int s, const union sock_addr *a, int64_t deadline_ms)
{
    if (connect(s, &a->sa, sock_addr_len(a)) == 0)
        return 0;
    if (errno != EINPROGRESS && errno != EINTR)
        return errno;
    struct pollfd p = {.fd = s, .events = POLLOUT};
    int rc = poll_until(&p, 1, deadline_ms);
    if (rc <= 0)
        return rc == 0 ? ETIMEDOUT : errno;
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
        return errno;
    return err;
}

reshard_status_t sock_connect_start(const union sock_addr *a, int *fd)
{
    char as[SOCK_ADDR_STR];
    int s = -1;
    RS_CHECK(sock_open(a->sa.sa_family, &s));
    reshard_status_t st = sock_setopt(s, IPPROTO_TCP, TCP_NODELAY, 1, "TCP_NODELAY");
    if (st != RESHARD_OK) {
        close(s);
        return st;
    }
    if (connect(s, &a->sa, sock_addr_len(a)) != 0 && errno != EINPROGRESS && errno != EINTR) {
        st = rs_error(RESHARD_ERR_NETWORK, "connect to %s: %m", sock_addr_str(a, as, sizeof(as)));
        close(s);
        return st;
    }
    *fd = s;
    return RESHARD_OK;
}

reshard_status_t sock_connect_check(int fd, const char *who, int *done)
{
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    int rc = poll(&p, 1, 0);
    if (rc < 0 && errno != EINTR)
        return rs_error(RESHARD_ERR_NETWORK, "poll on the connection to %s: %m", who);
    if (rc <= 0) {
        *done = 0;
        return RESHARD_OK;
    }
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
        err = errno;
    if (err)
        return rs_error(RESHARD_ERR_NETWORK, "connect to %s: %s", who, strerror(err));
    *done = 1;
    return RESHARD_OK;
}

/* Errors that mean "not listening yet" or a passing network hiccup: worth another try. */
static int connect_retriable(int err)
{
    switch (err) {
    case ECONNREFUSED:
    case ETIMEDOUT:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case ENETDOWN:
    case EHOSTDOWN:
    case ECONNRESET:
    case ECONNABORTED:
    case EAGAIN:
    case EADDRNOTAVAIL:
        return 1;
    default:
        return 0;
    }
}

reshard_status_t sock_connect(const union sock_addr *a, const char *who, int64_t deadline_ms,
                              int timeout_ms, int *fd)
{
    char as[SOCK_ADDR_STR], ms[32];
    int backoff_ms = 10, err;
    sock_addr_str(a, as, sizeof(as));
    for (;;) {
        int s = -1;
        RS_CHECK(sock_open(a->sa.sa_family, &s));
        err = connect_once(s, a, deadline_ms);
        if (err == 0) {
            reshard_status_t st = sock_setopt(s, IPPROTO_TCP, TCP_NODELAY, 1, "TCP_NODELAY");
            if (st != RESHARD_OK) {
                close(s);
                return st;
            }
            *fd = s;
            return RESHARD_OK;
        }
        close(s);
        if (!connect_retriable(err))
            return rs_error(RESHARD_ERR_NETWORK, "bootstrap: connect to %s at %s: %s", who, as,
                            strerror(err));
        int64_t left = deadline_ms - rs_now_ms();
        if (left <= 0)
            break;
        poll(NULL, 0, (int)(left < backoff_ms ? left : backoff_ms));
        backoff_ms = backoff_ms >= 250 ? 500 : 2 * backoff_ms;
    }
    return rs_error(RESHARD_ERR_TIMEOUT,
                    "bootstrap: could not reach %s at %s within %s (last error: %s)", who, as,
                    sock_ms_str(timeout_ms, ms, sizeof(ms)), strerror(err));
}

/* ---- frames ---- */

void wire_put(unsigned char *w, uint64_t v, int bytes)
{
    for (int i = bytes - 1; i >= 0; i--, v >>= 8)
        w[i] = (unsigned char)v;
}

uint64_t wire_get(const unsigned char *w, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v = v << 8 | w[i];
    return v;
}

void frame_put_hdr(unsigned char *w, const struct frame_hdr *h)
{
    wire_put(w, FRAME_MAGIC, 4);
    wire_put(w + 4, h->type, 2);
    wire_put(w + 6, h->op, 2);
    wire_put(w + 8, h->seq, 4);
    wire_put(w + 12, 0, 4);
    wire_put(w + 16, h->len, 8);
}

int frame_get_hdr(const unsigned char *w, struct frame_hdr *h)
{
    if (wire_get(w, 4) != FRAME_MAGIC)
        return -1;
    h->type = (uint16_t)wire_get(w + 4, 2);
    h->op = (uint16_t)wire_get(w + 6, 2);
    h->seq = (uint32_t)wire_get(w + 8, 4);
    h->len = wire_get(w + 16, 8);
    return 0;
}

size_t frame_put_error(unsigned char *buf, int origin, reshard_status_t st, const char *text)
{
    size_t n = strnlen(text, FRAME_TEXT_MAX);
    wire_put(buf, (uint32_t)origin, 4);
    wire_put(buf + 4, (uint32_t)st, 4);
    memcpy(buf + 8, text, n);
    return 8 + n;
}

void xfer_init(struct xfer *x, int fd, const char *peer, int send, struct frame_hdr hdr, void *data)
{
    memset(x, 0, sizeof(*x));
    x->fd = fd;
    x->peer = peer;
    x->send = send;
    x->listen = send;
    x->hdr = hdr;
    /* A zero-byte payload may come as NULL; keep pointer arithmetic on a real object. */
    static unsigned char none;
    x->data = data ? data : &none;
    if (send)
        frame_put_hdr(x->wire, &hdr);
}

int xfer_torn(const struct xfer *x)
{
    return !x->finished && (x->hdr_done > 0 || x->done > 0);
}

const char *frame_op_name(unsigned op)
{
    static const char *const names[] = {[OP_NONE] = "rendezvous",
                                        [OP_ALLGATHER] = "allgather",
                                        [OP_BCAST] = "bcast",
                                        [OP_BARRIER] = "barrier"};
    return op < sizeof(names) / sizeof(names[0]) ? names[op] : "an unknown collective";
}

static const char *type_name(unsigned type)
{
    static const char *const names[] = {[FRAME_HELLO] = "hello",
                                        [FRAME_WELCOME] = "welcome",
                                        [FRAME_REFUSE] = "refusal",
                                        [FRAME_DATA] = "data",
                                        [FRAME_ERROR] = "error"};
    return type < sizeof(names) / sizeof(names[0]) && names[type] ? names[type] : "unknown";
}

static reshard_status_t step_send(struct xfer *x)
{
    while (!x->finished) {
        struct iovec iov[2] = {
            {x->wire + x->hdr_done, FRAME_HDR_BYTES - x->hdr_done},
            {(char *)x->data + x->done, x->hdr.len - x->done},
        };
        struct msghdr m = {.msg_iov = iov[0].iov_len ? iov : iov + 1,
                           .msg_iovlen = iov[0].iov_len ? 2 : 1};
        if (iov[0].iov_len + iov[1].iov_len == 0) {
            x->finished = 1;
            break;
        }
        /* MSG_NOSIGNAL: a peer that went away is an error to report, not a SIGPIPE. */
        ssize_t k = sendmsg(x->fd, &m, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return RESHARD_OK;
        if (k < 0)
            return rs_error(RESHARD_ERR_NETWORK, "bootstrap: send to %s: %m", x->peer);
        size_t h = (size_t)k < iov[0].iov_len ? (size_t)k : iov[0].iov_len;
        x->hdr_done += h;
        x->done += (size_t)k - h;
    }
    return RESHARD_OK;
}

/* The header is in: is it the frame we wait for, or a refusal or error instead? */
static reshard_status_t check_hdr(struct xfer *x)
{
    struct frame_hdr *g = &x->got;
    if (frame_get_hdr(x->wire, g) != 0)
        return rs_error(RESHARD_ERR_NETWORK,
                        "bootstrap: %s sent a malformed frame (bad magic): not a reshard "
                        "bootstrap peer, or a stream out of step",
                        x->peer);
    if (g->type == FRAME_ERROR || g->type == FRAME_REFUSE) {
        if (g->len > sizeof(x->text) || (g->type == FRAME_ERROR && g->len < 8))
            return rs_error(RESHARD_ERR_NETWORK, "bootstrap: %s sent a malformed %s frame", x->peer,
                            g->type == FRAME_ERROR ? "error" : "refusal");
        return RESHARD_OK;
    }
    if (g->type != x->hdr.type && !x->hdr.type)
        return rs_error(RESHARD_ERR_NETWORK, "bootstrap: %s sent a %s frame out of turn", x->peer,
                        type_name(g->type));
    if (g->type != x->hdr.type)
        return rs_error(RESHARD_ERR_NETWORK,
                        "bootstrap: %s sent a %s frame where a %s was expected", x->peer,
                        type_name(g->type), type_name(x->hdr.type));
    /* The rendezvous frames have one size per version. */
    if (g->len != x->hdr.len && x->hdr.op == OP_NONE)
        return rs_error(RESHARD_ERR_NETWORK,
                        "bootstrap: %s sent a %s of %llu bytes where %llu were expected: another "
                        "version of reshard?",
                        x->peer, type_name(g->type), (unsigned long long)g->len,
                        (unsigned long long)x->hdr.len);
    if (g->op != x->hdr.op || g->seq != x->hdr.seq)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "bootstrap: %s is in %s #%u while this rank is in %s #%u: every rank "
                        "must call the same collectives in the same order",
                        x->peer, frame_op_name(g->op), g->seq, frame_op_name(x->hdr.op),
                        x->hdr.seq);
    if (g->len != x->hdr.len)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "bootstrap: %s sent %llu bytes where %llu were expected: ranks passed "
                        "different sizes to %s",
                        x->peer, (unsigned long long)g->len, (unsigned long long)x->hdr.len,
                        frame_op_name(x->hdr.op));
    return RESHARD_OK;
}

/* A whole ERROR or REFUSE frame is in: the status it stands for, with its text. */
static reshard_status_t remote_failure(struct xfer *x, struct frame_error *err)
{
    if (x->got.type == FRAME_REFUSE) {
        x->text[x->got.len < sizeof(x->text) ? x->got.len : sizeof(x->text) - 1] = '\0';
        return rs_error(RESHARD_ERR_REFUSED, "bootstrap: %s refused this rank: %s", x->peer,
                        (char *)x->text);
    }
    struct frame_error e = {.origin = (int)wire_get(x->text, 4),
                            .status = (reshard_status_t)wire_get(x->text + 4, 4)};
    size_t n = x->got.len - 8 < FRAME_TEXT_MAX - 1 ? x->got.len - 8 : FRAME_TEXT_MAX - 1;
    memcpy(e.text, x->text + 8, n);
    e.text[n] = '\0';
    if (err)
        *err = e;
    return rs_error(RESHARD_ERR_REMOTE, "bootstrap: rank %d failed (%s): %s", e.origin,
                    rs_status_name(e.status), sock_msg_body(e.text));
}

static reshard_status_t step_recv(struct xfer *x, struct frame_error *err)
{
    while (!x->finished) {
        int hdr = x->hdr_done < FRAME_HDR_BYTES;
        int mine = !hdr && x->got.type == x->hdr.type;
        unsigned char *dst =
            hdr ? x->wire + x->hdr_done : (mine ? (unsigned char *)x->data : x->text) + x->done;
        size_t want = hdr ? FRAME_HDR_BYTES - x->hdr_done : x->got.len - x->done;
        if (!hdr && want == 0) {
            x->finished = 1;
            return mine ? RESHARD_OK : remote_failure(x, err);
        }
        ssize_t k = recv(x->fd, dst, want, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return RESHARD_OK;
        if (k < 0)
            return rs_error(RESHARD_ERR_NETWORK, "bootstrap: recv from %s: %m", x->peer);
        if (k == 0)
            return rs_error(RESHARD_ERR_NETWORK, "bootstrap: %s closed the connection", x->peer);
        if (!hdr) {
            x->done += (size_t)k;
            continue;
        }
        x->hdr_done += (size_t)k;
        if (x->hdr_done == FRAME_HDR_BYTES)
            RS_CHECK(check_hdr(x));
    }
    return RESHARD_OK;
}

reshard_status_t xfer_step(struct xfer *x, struct frame_error *err)
{
    return x->send ? step_send(x) : step_recv(x, err);
}

/* "rank 3 (10.0.0.1:4242), rank 5 (...) and 7 more": who has not finished, for a timeout
 * message. Names that would not fit whole are counted instead. */
static void list_unfinished(const struct xfer *x, int n, char *buf, size_t cap)
{
    size_t used = 0, room = cap - 24; /* for " and N more" */
    int more = 0;
    buf[0] = '\0';
    for (int i = 0; i < n; i++) {
        if (x[i].finished)
            continue;
        size_t k = strlen(x[i].peer) + (used ? 2 : 0);
        if (more || used + k >= room) {
            more++;
            continue;
        }
        used += (size_t)snprintf(buf + used, cap - used, "%s%s", used ? ", " : "", x[i].peer);
    }
    if (more)
        snprintf(buf + used, cap - used, " and %d more", more);
}

/* A peer we are sending to spoke out of turn. In this protocol that can only be a failure
 * report (or the end of its connection): better to hear it than wait for it to read. */
static reshard_status_t hear_out(const struct xfer *t, int64_t deadline_ms, int timeout_ms,
                                 const char *what, struct frame_error *err)
{
    struct xfer r;
    int failed;
    xfer_init(&r, t->fd, t->peer, 0, (struct frame_hdr){0}, NULL);
    RS_CHECK(xfer_run(&r, 1, deadline_ms, timeout_ms, what, &failed, err));
    return rs_error(RESHARD_ERR_NETWORK, "bootstrap: %s sent a frame out of turn", t->peer);
}

reshard_status_t xfer_run(struct xfer *x, int n, int64_t deadline_ms, int timeout_ms,
                          const char *what, int *failed, struct frame_error *err)
{
    return xfer_run_cancel(x, n, deadline_ms, timeout_ms, what, NULL, failed, err);
}

reshard_status_t xfer_run_cancel(struct xfer *x, int n, int64_t deadline_ms, int timeout_ms,
                                 const char *what, const atomic_int *cancel, int *failed,
                                 struct frame_error *err)
{
    struct pollfd *p = rs_calloc((size_t)n, sizeof(*p), "bootstrap poll set");
    int *idx = rs_calloc((size_t)n, sizeof(*idx), "bootstrap poll set");
    reshard_status_t st = RESHARD_OK;
    *failed = -1;
    if (!p || !idx) {
        st = RESHARD_ERR_NO_MEMORY;
        goto out_free;
    }
    for (;;) {
        int active = 0;
        for (int i = 0; i < n; i++) {
            if (x[i].finished)
                continue;
            p[active] = (struct pollfd){.fd = x[i].fd,
                                        .events = x[i].listen ? POLLOUT | POLLIN
                                                  : x[i].send ? POLLOUT
                                                              : POLLIN};
            idx[active++] = i;
        }
        if (active == 0)
            break;
        int rc = 0;
        int64_t until = deadline_ms; /* with a cancel flag, look at it every CANCEL_POLL_MS */
        if (cancel && until > rs_now_ms() + CANCEL_POLL_MS)
            until = rs_now_ms() + CANCEL_POLL_MS;
        if ((st = sock_poll(p, active, until, &rc)) != RESHARD_OK) {
            *failed = idx[0];
            break;
        }
        if (cancel && atomic_load(cancel)) {
            st = rs_error(RESHARD_ERR_ABORTED, "bootstrap: %s: aborted (reshard_comm_abort)", what);
            *failed = idx[0];
            break;
        }
        if (rc == 0 && until < deadline_ms)
            continue;
        if (rc == 0) {
            char who[RS_ERROR_MAX], ms[32];
            list_unfinished(x, n, who, sizeof(who));
            st = rs_error(RESHARD_ERR_TIMEOUT, "bootstrap: %s: %s did not answer within %s", what,
                          who, sock_ms_str(timeout_ms, ms, sizeof(ms)));
            *failed = idx[0];
            break;
        }
        for (int j = 0; j < active && st == RESHARD_OK; j++) {
            struct xfer *t = &x[idx[j]];
            if (t->listen && (p[j].revents & (POLLIN | POLLHUP)))
                st = hear_out(t, deadline_ms, timeout_ms, what, err);
            else if (p[j].revents)
                st = xfer_step(t, err);
            if (st != RESHARD_OK)
                *failed = idx[j];
        }
        if (st != RESHARD_OK)
            break;
    }
out_free:
    free(idx);
    free(p);
    return st;
}
