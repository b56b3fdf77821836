/* SPDX-License-Identifier: Apache-2.0 */
/* The rendezvous that makes a bootstrap (boot_init): rank 0 admits the peers that show the
 * job's secret and refuses the rest; every other rank connects to it and says hello. */
#include "boot_int.h"

#include "base/clock.h"
#include "base/log.h"

#include <arpa/inet.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BOOT_HELLO_BYTES    (4 + BOOT_SECRET_BYTES + 4 + 4) /* version, secret, rank, size */
#define BOOT_MISSING_LISTED 32 /* ranks named in a timeout message, the rest counted */
#define BOOT_PENDING_EXTRA  64 /* connections that may wait to say hello, beyond the job's own */

/* ---- hellos ---- */

/* What a peer says first: the version it speaks, the job's secret, and its place in the job. */
struct boot_hello {
    unsigned version;
    unsigned char secret[BOOT_SECRET_BYTES];
    int rank, size;
};

/* Payload layout: version (4), secret, rank (4), size (4). */
static void boot_frame_put_hello(unsigned char *w, const struct boot_hello *h)
{
    sock_wire_put(w, h->version, 4);
    memcpy(w + 4, h->secret, BOOT_SECRET_BYTES);
    sock_wire_put(w + 4 + BOOT_SECRET_BYTES, (uint32_t)h->rank, 4);
    sock_wire_put(w + 8 + BOOT_SECRET_BYTES, (uint32_t)h->size, 4);
}

static void boot_frame_get_hello(const unsigned char *w, struct boot_hello *h)
{
    h->version = (unsigned)sock_wire_get(w, 4);
    memcpy(h->secret, w + 4, BOOT_SECRET_BYTES);
    h->rank = (int)(int32_t)sock_wire_get(w + 4 + BOOT_SECRET_BYTES, 4);
    h->size = (int)(int32_t)sock_wire_get(w + 8 + BOOT_SECRET_BYTES, 4);
}

static int boot_secret_equal(const unsigned char *a, const unsigned char *b)
{
    unsigned char d = 0;
    for (int i = 0; i < BOOT_SECRET_BYTES; i++)
        d |= a[i] ^ b[i];
    return d == 0;
}

/* ---- rank 0: the rendezvous ---- */

/* A connection that has not said hello yet. */
struct boot_pending {
    int fd;
    char addr[SOCK_ADDR_STR];
    unsigned char hello[BOOT_HELLO_BYTES];
    struct sock_xfer x;
};

/* Rank 0's state while the ranks arrive. */
struct boot_rv {
    struct boot *b;
    const unsigned char *secret;
    int64_t deadline;
    int lfd, arrived, np, cap;
    struct boot_pending *p;
    struct pollfd *pf;
};

/* Answers a refusal (best effort), closes, and says so: in b->refusal and as a warning. */
static void boot_rv_refuse(struct boot_rv *rv, int *fd, const char *addr, const char *claim,
                           const char *reason)
{
    struct boot *b = rv->b;
    char text[SOCK_FRAME_TEXT_MAX];
    struct rs_saved_error saved;
    struct sock_xfer x;
    int failed, n = snprintf(text, sizeof(text), "%s", reason);
    rs_error_save(&saved);
    sock_xfer_init(&x, *fd, addr, 1,
                   (struct sock_frame_hdr){.type = SOCK_FRAME_REFUSE, .len = (uint64_t)n}, text);
    x.listen = 0;
    sock_xfer_run(&x, 1, rs_now_ms() + 200, 200, "refusal", &failed, NULL);
    rs_error_restore(&saved);
    sock_close(fd);
    snprintf(b->refusal, sizeof(b->refusal), "bootstrap: rank 0 refused a peer at %s%s: %s", addr,
             claim, reason);
    rs_log(RS_LOG_WARN, "%s", b->refusal);
}

static void boot_rv_remove(struct boot_rv *rv, int i)
{
    struct boot_pending *p = &rv->p[i];
    *p = rv->p[--rv->np];
    p->x.data = p->hello; /* the moved transfer pointed into its old slot */
}

/* A whole hello is in: admit the peer as its rank, or refuse it. */
static void boot_rv_hello(struct boot_rv *rv, int i)
{
    struct boot *b = rv->b;
    struct boot_pending *p = &rv->p[i];
    struct boot_hello h;
    boot_frame_get_hello(p->hello, &h);
    int rank = h.rank, size = h.size;
    char claim[64], why[160] = "";
    snprintf(claim, sizeof(claim), " claiming rank %d of %d", rank, size);
    if (h.version != BOOT_VERSION)
        snprintf(why, sizeof(why), "bootstrap version %u, rank 0 speaks %u", h.version,
                 BOOT_VERSION);
    else if (!boot_secret_equal(h.secret, rv->secret))
        snprintf(why, sizeof(why), "wrong secret: not part of this job");
    else if (size != b->size)
        snprintf(why, sizeof(why), "the job has %d ranks, not %d", b->size, size);
    else if (rank < 1 || rank >= size)
        snprintf(why, sizeof(why), "rank %d is out of range 1..%d", rank, size - 1);
    else if (b->conns[rank].fd >= 0)
        snprintf(why, sizeof(why), "duplicate rank: %s has already arrived", b->conns[rank].name);
    if (why[0]) {
        boot_rv_refuse(rv, &p->fd, p->addr, claim, why);
    } else {
        b->conns[rank].fd = p->fd;
        snprintf(b->conns[rank].name, sizeof(b->conns[rank].name), "rank %d (%s)", b->label[rank],
                 p->addr);
        rv->arrived++;
    }
    boot_rv_remove(rv, i);
}

static void boot_rv_step(struct boot_rv *rv, int i)
{
    struct boot_pending *p = &rv->p[i];
    if (sock_xfer_step(&p->x, NULL) != RESHARD_OK) {
        char why[RS_ERROR_MAX];
        snprintf(why, sizeof(why), "no valid hello (%s)", sock_msg_body(rs_error_message()));
        boot_rv_refuse(rv, &p->fd, p->addr, "", why);
        boot_rv_remove(rv, i);
    } else if (p->x.finished) {
        boot_rv_hello(rv, i);
    }
}

static reshard_status_t boot_rv_accept(struct boot_rv *rv)
{
    for (;;) {
        union sock_addr a;
        char addr[SOCK_ADDR_STR];
        int fd;
        RS_CHECK(sock_accept(rv->lfd, &fd, &a));
        if (fd < 0)
            return RESHARD_OK;
        sock_addr_str(&a, addr, sizeof(addr));
        /* Stray connections may not crowd out the job's ranks, nor grow memory without end. */
        if (rv->np == rv->cap) {
            boot_rv_refuse(rv, &fd, addr, "", "too many connections are waiting to say hello");
            continue;
        }
        struct boot_pending *p = &rv->p[rv->np++];
        p->fd = fd;
        memcpy(p->addr, addr, sizeof(addr));
        sock_xfer_init(&p->x, fd, "the peer", 0,
                       (struct sock_frame_hdr){.type = SOCK_FRAME_HELLO, .len = BOOT_HELLO_BYTES},
                       p->hello);
    }
}

/* "bootstrap: ranks 3, 5 of 6 did not arrive within 2 s". */
static reshard_status_t boot_rv_timeout(struct boot_rv *rv)
{
    struct boot *b = rv->b;
    char list[RS_ERROR_MAX] = "", ms[32];
    size_t used = 0;
    int missing = 0;
    for (int r = 1; r < b->size; r++) {
        if (b->conns[r].fd >= 0 || missing++ >= BOOT_MISSING_LISTED)
            continue;
        int k = snprintf(list + used, sizeof(list) - used, "%s%d", used ? ", " : "", b->label[r]);
        used += k > 0 && (size_t)k < sizeof(list) - used ? (size_t)k : 0;
    }
    if (missing > BOOT_MISSING_LISTED)
        snprintf(list + used, sizeof(list) - used, " and %d more", missing - BOOT_MISSING_LISTED);
    return rs_error(RESHARD_ERR_TIMEOUT, "bootstrap: %s %s of %d did not arrive within %s%s%s",
                    missing == 1 ? "rank" : "ranks", list, b->size,
                    sock_ms_str(b->timeout_ms, ms, sizeof(ms)), b->refusal[0] ? "; " : "",
                    sock_msg_body(b->refusal));
}

static reshard_status_t boot_rv_run(struct boot_rv *rv)
{
    while (rv->arrived < rv->b->size - 1) {
        int n = 0, ready;
        rv->pf[n++] = (struct pollfd){.fd = rv->lfd, .events = POLLIN};
        for (int i = 0; i < rv->np; i++)
            rv->pf[n++] = (struct pollfd){.fd = rv->p[i].fd, .events = POLLIN};
        RS_CHECK(sock_poll(rv->pf, n, rv->deadline, &ready));
        if (ready == 0)
            return boot_rv_timeout(rv);
        /* Downwards, so that removing entry i moves one already seen into its place. */
        for (int i = rv->np - 1; i >= 0; i--)
            if (rv->pf[1 + i].revents)
                boot_rv_step(rv, i);
        if (rv->pf[0].revents)
            RS_CHECK(boot_rv_accept(rv));
    }
    return RESHARD_OK;
}

/* Rank 0 without a socket from boot_id_create here: the id's port, on every address. */
static reshard_status_t boot_rv_listen_any(const union sock_addr *a, int *fd)
{
    union sock_addr any;
    memset(&any, 0, sizeof(any));
    any.sa.sa_family = a->sa.sa_family;
    if (a->sa.sa_family == AF_INET6)
        any.in6.sin6_addr = in6addr_any;
    else
        any.in.sin_addr.s_addr = htonl(INADDR_ANY);
    sock_addr_set_port(&any, sock_addr_port(a));
    return sock_listen(&any, fd);
}

static reshard_status_t boot_rv_rank0(struct boot *b, const struct boot_id *id,
                                      const union sock_addr *a, const unsigned char *secret,
                                      int64_t deadline)
{
    struct boot_rv rv = {.b = b,
                         .secret = secret,
                         .deadline = deadline,
                         .lfd = boot_registry_take(id),
                         .cap = b->size - 1 + BOOT_PENDING_EXTRA};
    struct boot_coll c = {.b = b,
                          .hdr = {.type = SOCK_FRAME_WELCOME},
                          .deadline = deadline,
                          .what = "rendezvous on rank 0",
                          .err = {.origin = -1}};
    reshard_status_t st = RESHARD_OK;
    if (rv.lfd < 0)
        RS_CHECK(boot_rv_listen_any(a, &rv.lfd));
    rv.p = rs_calloc((size_t)rv.cap, sizeof(*rv.p), "bootstrap pending connections");
    rv.pf = rv.p ? rs_calloc((size_t)rv.cap + 1, sizeof(*rv.pf), "bootstrap poll set") : NULL;
    if (!rv.pf)
        st = RESHARD_ERR_NO_MEMORY;
    if (st == RESHARD_OK)
        st = boot_rv_run(&rv);
    if (st == RESHARD_OK)
        st = boot_coll_transfer(&c, -1, -1, 1, 0, (unsigned char *)"", 0);
    for (int i = rv.np - 1; i >= 0; i--) {
        boot_rv_refuse(&rv, &rv.p[i].fd, rv.p[i].addr, "",
                       st == RESHARD_OK ? "every rank has arrived" : "the rendezvous failed");
        boot_rv_remove(&rv, i);
    }
    free(rv.pf);
    free(rv.p);
    sock_close(&rv.lfd);
    return st == RESHARD_OK ? st : boot_fail(b, st, NULL);
}

/* ---- the other ranks: joining ---- */

static reshard_status_t boot_rv_join(struct boot *b, const union sock_addr *a,
                                     const unsigned char *secret, int64_t deadline)
{
    struct boot_conn *c0 = &b->conns[0];
    struct boot_hello h = {.version = BOOT_VERSION, .rank = b->rank, .size = b->size};
    unsigned char hello[BOOT_HELLO_BYTES];
    char addr[SOCK_ADDR_STR];
    struct boot_coll c = {
        .b = b, .hdr = {.type = SOCK_FRAME_HELLO}, .deadline = deadline, .err = {.origin = -1}};
    snprintf(c0->name, sizeof(c0->name), "rank %d (%s)", b->label[0],
             sock_addr_str(a, addr, sizeof(addr)));
    snprintf(c.what, sizeof(c.what), "rendezvous on rank %d", b->label[b->rank]);
    RS_CHECK(sock_connect(a, "rank 0", deadline, b->timeout_ms, &c0->fd));
    memcpy(h.secret, secret, BOOT_SECRET_BYTES);
    boot_frame_put_hello(hello, &h);
    RS_CHECK(boot_coll_transfer(&c, 0, -1, 1, BOOT_HELLO_BYTES, hello, 0));
    c.hdr.type = SOCK_FRAME_WELCOME;
    return boot_coll_transfer(&c, 0, -1, 0, 0, hello, 0);
}

/* ---- either ---- */

reshard_status_t boot_init(const struct boot_id *id, int rank, int size, int timeout_ms,
                           struct boot **out)
{
    return boot_init_labeled(id, rank, size, NULL, timeout_ms, out);
}

reshard_status_t boot_init_labeled(const struct boot_id *id, int rank, int size, const int *label,
                                   int timeout_ms, struct boot **out)
{
    union sock_addr a;
    unsigned char secret[BOOT_SECRET_BYTES];
    struct boot *b;
    reshard_status_t st;
    if (!id || !out || size < 1 || rank < 0 || rank >= size || timeout_ms <= 0)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "bootstrap: init of rank %d of %d with a %d ms timeout: needs an id, "
                        "0 <= rank < size and a positive timeout",
                        rank, size, timeout_ms);
    if (boot_id_decode(id, &a, secret) != 0)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "bootstrap: rank %d was given something that is "
                        "not a bootstrap id of this version",
                        rank);
    if (!(b = boot_alloc(rank, size, label, timeout_ms)))
        return RESHARD_ERR_NO_MEMORY;
    int64_t deadline = rs_now_ms() + timeout_ms;
    if (rank == 0)
        RS_CHECK_GOTO(boot_rv_rank0(b, id, &a, secret, deadline), st, err_close_boot);
    else
        RS_CHECK_GOTO(boot_rv_join(b, &a, secret, deadline), st, err_close_boot);
    *out = b;
    return RESHARD_OK;
err_close_boot:
    boot_close(b);
    return st;
}
