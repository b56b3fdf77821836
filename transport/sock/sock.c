/* SPDX-License-Identifier: Apache-2.0 */
/* TCP sockets and addresses, every wait bounded by a deadline (sock.h). */
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
#include <sys/resource.h>
#include <unistd.h>

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

/* ---- deadlines ---- */

/* poll() until an event or the deadline; EINTR polls again for the time left. Returns poll's
 * count, 0 at the deadline, or -1 with errno. */
static int sock_poll_until(struct pollfd *p, nfds_t n, int64_t deadline_ms)
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
    int rc = sock_poll_until(p, (nfds_t)n, deadline_ms);
    if (rc < 0)
        return rs_error(RESHARD_ERR_NETWORK, "bootstrap: poll: %m");
    *ready = rc;
    return RESHARD_OK;
}

/* ---- sockets ---- */

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

int sock_local_addr(int fd, union sock_addr *a)
{
    socklen_t len = sizeof(*a);
    memset(a, 0, sizeof(*a));
    return getsockname(fd, &a->sa, &len);
}

int sock_peek(int fd, void *buf, size_t n)
{
    ssize_t k = fd < 0 ? -1 : recv(fd, buf, n, MSG_PEEK | MSG_DONTWAIT);
    return k < 0 ? -1 : (int)k;
}

reshard_status_t sock_listen(union sock_addr *a, int *fd)
{
    char as[SOCK_ADDR_STR];
    socklen_t len = sizeof(*a);
    reshard_status_t st;
    int s = -1;
    RS_CHECK(sock_open(a->sa.sa_family, &s));
    /* A port of our choosing may be bound again while old connections linger (TIME_WAIT).
     * One of the kernel's pick needs no such leave, and without it the pick never falls on a
     * port someone holds bound for a listener of their own to come (as tests do). */
    if (sock_addr_port(a) != 0)
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
        if (errno == EMFILE || errno == ENFILE) {
            struct rlimit rl = {0};
            getrlimit(RLIMIT_NOFILE, &rl);
            return rs_error(RESHARD_ERR_TOO_LARGE,
                            "bootstrap: accept: %m (RLIMIT_NOFILE is %llu: a listener needs "
                            "about 80 descriptors; raise it with ulimit -n)",
                            (unsigned long long)rl.rlim_cur);
        }
        return rs_error(RESHARD_ERR_NETWORK, "bootstrap: accept: %m");
    }
}

/* One attempt: 0 when connected, else the errno (ETIMEDOUT at the deadline). */
static int sock_connect_once(int s, const union sock_addr *a, int64_t deadline_ms)
{
    if (connect(s, &a->sa, sock_addr_len(a)) == 0)
        return 0;
    if (errno != EINPROGRESS && errno != EINTR)
        return errno;
    struct pollfd p = {.fd = s, .events = POLLOUT};
    int rc = sock_poll_until(&p, 1, deadline_ms);
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
static int sock_connect_retriable(int err)
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
        err = sock_connect_once(s, a, deadline_ms);
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
        if (!sock_connect_retriable(err))
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

/* ---- integers on the wire ---- */

void sock_wire_put(unsigned char *w, uint64_t v, int bytes)
{
    for (int i = bytes - 1; i >= 0; i--, v >>= 8)
        w[i] = (unsigned char)v;
}

uint64_t sock_wire_get(const unsigned char *w, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v = v << 8 | w[i];
    return v;
}
