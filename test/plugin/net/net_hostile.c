/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The conformance driver's hostile cases (net_driver.c runs them with --case): what a careless
 * caller does with handles (NULL data, closing twice, using a handle after its close), what
 * anyone who reaches a listener's port can do to it (idle connections, a flood of idle and
 * trickling ones, a connector that gives up), and what the plugin must do when it cannot run
 * (no transport) or is unloaded and loaded again. Each prints "ok <step>" lines, or FAIL.
 */
#include "net_driver.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* The listener's address, at offset 16 of the handle (docs/protocols.md section 2). */
union addr {
    struct sockaddr sa;
    struct sockaddr_in in;
    struct sockaddr_in6 in6;
};

static socklen_t handle_addr(const unsigned char *h, union addr *a)
{
    memcpy(a, h + 16, sizeof(a->in6));
    return a->sa.sa_family == AF_INET ? sizeof(a->in) : sizeof(a->in6);
}

/* A TCP connection to a, made without waiting (-1 when no socket). */
static int open_to(const union addr *a, socklen_t len)
{
    int fd = socket(a->sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, &a->sa, len) != 0 && errno != EINPROGRESS) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Connect and accept on handle h (a copy per connector) until both comms exist. */
static int connect_pair(void *ctx, void *lc, unsigned char *h, void **sc, void **rc,
                        double timeout_s)
{
    *sc = *rc = NULL;
    double end = now_s() + timeout_s;
    while (!*sc || !*rc) {
        if (!*sc)
            NCCL_OK("connect", d_connect(ctx, 0, h, sc));
        if (!*rc)
            NCCL_OK("accept", d_accept(lc, rc));
        CHECK("connect", now_s() < end, "no connection within %.0f s", timeout_s);
    }
    return 0;
}

/* One message of n bytes from sc to rc, checked. */
static int one_message(void *sc, void *rc, size_t n, int tag)
{
    unsigned char *s = malloc(n ? n : 1), *r = calloc(1, n ? n : 1);
    CHECK("message", s && r, "no memory");
    fill(s, n, (uint64_t)tag);
    void *sreq, *rreq, *data = r;
    int got[MAX_RECVS_WANTED] = {-1};
    int res = -1;
    if (d_irecv(rc, 1, &data, &n, &tag, NULL, &rreq) == ncclSuccess &&
        d_isend(sc, s, n, tag, NULL, &sreq) == ncclSuccess &&
        wait_req(sreq, NULL, 30) == ncclSuccess && wait_req(rreq, got, 30) == ncclSuccess &&
        got[0] == (int)n && !mismatch(r, n, (uint64_t)tag))
        res = 0;
    else
        fail("message", "%zu bytes did not arrive intact (last WARN: %s)", n, last_warn);
    free(s);
    free(r);
    return res;
}

/* ---- a careless caller ---- */

int case_null_data(void *ctx)
{
    unsigned char h[NCCL_NET_HANDLE_MAXSIZE];
    void *lc, *sc, *rc, *req, *data[1] = {NULL};
    size_t size = 10;
    int tag = 1;
    if (pair(ctx, &lc, &sc, &rc, h))
        return -1;
    if (expect("isend of 10 bytes at NULL", d_isend(sc, NULL, 10, 1, NULL, &req), ncclInternalError,
               "at NULL") ||
        expect("irecv of 10 bytes into NULL", d_irecv(rc, 1, data, &size, &tag, NULL, &req),
               ncclInternalError, "at NULL"))
        return -1;
    /* No bytes at NULL is an empty message, as NCCL sends them. */
    if (one_message(sc, rc, 0, 2))
        return -1;
    ok("an empty message at NULL still passes");
    NCCL_OK("closeSend", d_close_send(sc));
    NCCL_OK("closeRecv", d_close_recv(rc));
    NCCL_OK("closeListen", d_close_listen(lc));
    return 0;
}

int case_stale_handles(void *ctx)
{
    unsigned char h[NCCL_NET_HANDLE_MAXSIZE], buf[64] = {0};
    void *lc, *sc, *rc, *mh, *rreq, *req, *data[1] = {buf}, *again;
    size_t size = sizeof(buf);
    int tag = 5, done = 1, got[MAX_RECVS_WANTED];
    if (pair(ctx, &lc, &sc, &rc, h))
        return -1;
    NCCL_OK("regMr", d_reg(sc, buf, sizeof(buf), NCCL_PTR_HOST, &mh));
    NCCL_OK("irecv", d_irecv(rc, 1, data, &size, &tag, NULL, &rreq)); /* never matched */
    NCCL_OK("deregMr", d_dereg(sc, mh));
    if (expect("deregMr twice", d_dereg(sc, mh), ncclInternalError, "deregistered already"))
        return -1;
    NCCL_OK("closeSend", d_close_send(sc));
    if (expect("closeSend twice", d_close_send(sc), ncclInternalError, "closed already") ||
        expect("isend after closeSend", d_isend(sc, buf, 8, 1, NULL, &req), ncclInternalError,
               "closed already") ||
        expect("regMr after closeSend", d_reg(sc, buf, 8, NCCL_PTR_HOST, &mh), ncclInternalError,
               "closed already"))
        return -1;
    NCCL_OK("closeRecv", d_close_recv(rc));
    if (expect("closeRecv twice", d_close_recv(rc), ncclInternalError, "closed already") ||
        expect("irecv after closeRecv", d_irecv(rc, 1, data, &size, &tag, NULL, &req),
               ncclInternalError, "closed already") ||
        expect("test of a request whose comm was closed", d_test(rreq, &done, got),
               ncclInternalError, "comm was closed"))
        return -1;
    CHECK("test after close", !done, "a request of a closed comm reported done");
    NCCL_OK("closeListen", d_close_listen(lc));
    if (expect("closeListen twice", d_close_listen(lc), ncclInternalError, "closed already") ||
        expect("accept after closeListen", d_accept(lc, &again), ncclInternalError,
               "closed already"))
        return -1;
    /* New objects may take the memory of the closed ones; the old handles still miss them. */
    void *lc2, *sc2, *rc2;
    if (pair(ctx, &lc2, &sc2, &rc2, h))
        return -1;
    if (expect("closeSend of the closed send comm, with a new one open", d_close_send(sc),
               ncclInternalError, "closed already") ||
        expect("closeRecv of the closed receive comm, with a new one open", d_close_recv(rc),
               ncclInternalError, "closed already") ||
        expect("closeListen of the closed listen comm, with a new one open", d_close_listen(lc),
               ncclInternalError, "closed already") ||
        one_message(sc2, rc2, 4096, 6))
        return -1;
    ok("stale handles left the new comms working");
    NCCL_OK("closeSend", d_close_send(sc2));
    NCCL_OK("closeRecv", d_close_recv(rc2));
    NCCL_OK("closeListen", d_close_listen(lc2));
    if (version >= 11) {
        void *second;
        NCCL_OK("init", d_init(&second));
        NCCL_OK("finalize", d_finalize(second));
        if (expect("finalize twice", d_finalize(second), ncclInternalError, "finalized"))
            return -1;
    }
    return 0;
}

/* ---- strangers at the listener's port ---- */

/* One idle TCP connection made before the real connector (run with RESHARD_TIMEOUT=10): the
 * connector must still get through, long before its timeout. */
int case_idle_connection(void *ctx)
{
    unsigned char h[NCCL_NET_HANDLE_MAXSIZE];
    void *lc, *sc, *rc;
    union addr a;
    NCCL_OK("listen", d_listen(ctx, 0, h, &lc));
    socklen_t len = handle_addr(h, &a);
    int idle = open_to(&a, len);
    CHECK("idle connection", idle >= 0, "socket: %s", strerror(errno));
    usleep(100000); /* it is in the listener's queue first */
    double t0 = now_s();
    if (connect_pair(ctx, lc, h, &sc, &rc, 60))
        return -1;
    printf("ok connected past an idle connection in %.3f s\n", now_s() - t0);
    close(idle);
    NCCL_OK("closeSend", d_close_send(sc));
    NCCL_OK("closeRecv", d_close_recv(rc));
    NCCL_OK("closeListen", d_close_listen(lc));
    return 0;
}

/* A connector that gave up (run with RESHARD_TIMEOUT=1) before the listener got to it: its
 * hello and address are in the socket, but no receive comm may come back for it. */
int case_connector_gave_up(void *ctx)
{
    unsigned char h[NCCL_NET_HANDLE_MAXSIZE], copy[NCCL_NET_HANDLE_MAXSIZE];
    void *lc, *sc = NULL, *rc = NULL;
    NCCL_OK("listen", d_listen(ctx, 0, h, &lc));
    memcpy(copy, h, sizeof(copy));
    ncclResult_t r = ncclSuccess;
    for (double end = now_s() + 30; r == ncclSuccess && !sc && now_s() < end; usleep(1000))
        r = d_connect(ctx, 0, copy, &sc);
    CHECK("gave up", r == ncclSystemError && !sc, "connect returned %d (comm %p), want a timeout",
          (int)r, sc);
    printf("ok the connector gave up: %s\n", last_warn);
    for (double end = now_s() + 3; now_s() < end && !rc; usleep(1000))
        NCCL_OK("accept", d_accept(lc, &rc));
    CHECK("gave up", !rc, "the listener handed back a receive comm for a connector that gave up");
    ok("no receive comm for a connector that gave up");
    memcpy(copy, h, sizeof(copy));
    if (connect_pair(ctx, lc, copy, &sc, &rc, 30))
        return -1;
    ok("the next connector gets through");
    NCCL_OK("closeSend", d_close_send(sc));
    NCCL_OK("closeRecv", d_close_recv(rc));
    NCCL_OK("closeListen", d_close_listen(lc));
    return 0;
}

#define FLOOD_IDLE         100
#define FLOOD_SLOW         100 /* one byte a second each */
#define FLOOD_MIN_CONNECTS 10
#define FLOOD_MIN_SECONDS  5.0 /* more than twice RESHARD_NET_HELLO_MS's default */
#define STREAM_MSGS        256
#define STREAM_BYTES       (256 * 1024)

struct flood {
    union addr to;
    socklen_t len;
    int fds[FLOOD_IDLE + FLOOD_SLOW];
    atomic_int stop, up;
    long dropped; /* connections the listener closed, each opened again */
};

/* 200 connections kept open: whenever the listener drops one, another takes its place. */
static void *flood_main(void *arg)
{
    struct flood *f = arg;
    for (int i = 0; i < FLOOD_IDLE + FLOOD_SLOW; i++)
        f->fds[i] = open_to(&f->to, f->len);
    atomic_store(&f->up, 1);
    double next_byte = now_s() + 1;
    while (!atomic_load(&f->stop)) {
        usleep(20000);
        int byte_due = now_s() >= next_byte;
        next_byte += byte_due;
        for (int i = 0; i < FLOOD_IDLE + FLOOD_SLOW; i++) {
            char b[64];
            ssize_t n = f->fds[i] < 0 ? 0 : recv(f->fds[i], b, sizeof(b), MSG_DONTWAIT);
            int gone = n == 0 || (n < 0 && errno != EAGAIN && errno != ENOTCONN);
            if (!gone && i >= FLOOD_IDLE && byte_due &&
                send(f->fds[i], "x", 1, MSG_DONTWAIT | MSG_NOSIGNAL) < 0 && errno != EAGAIN &&
                errno != ENOTCONN)
                gone = 1;
            if (gone) {
                if (f->fds[i] >= 0)
                    close(f->fds[i]);
                f->fds[i] = open_to(&f->to, f->len);
                f->dropped++;
            }
        }
    }
    for (int i = 0; i < FLOOD_IDLE + FLOOD_SLOW; i++)
        if (f->fds[i] >= 0)
            close(f->fds[i]);
    return NULL;
}

struct stream {
    void *sc, *rc;
    int msgs;
    size_t bad;
    int failed;
};

/* Messages from sc to rc, each checked, while the main thread connects through the flood. */
static void *stream_main(void *arg)
{
    struct stream *s = arg;
    unsigned char *sbuf = malloc(STREAM_BYTES), *rbuf = malloc(STREAM_BYTES);
    for (; sbuf && rbuf && s->msgs < STREAM_MSGS && !s->bad; s->msgs++) {
        void *sreq, *rreq, *data = rbuf;
        size_t size = STREAM_BYTES;
        int tag = 7000 + s->msgs % 64, got[MAX_RECVS_WANTED] = {0};
        fill(sbuf, STREAM_BYTES, (uint64_t)s->msgs);
        if (d_irecv(s->rc, 1, &data, &size, &tag, NULL, &rreq) != ncclSuccess ||
            d_isend(s->sc, sbuf, STREAM_BYTES, tag, NULL, &sreq) != ncclSuccess ||
            wait_req(sreq, NULL, 60) != ncclSuccess || wait_req(rreq, got, 60) != ncclSuccess ||
            got[0] != STREAM_BYTES) {
            s->failed = 1;
            break;
        }
        s->bad = mismatch(rbuf, STREAM_BYTES, (uint64_t)s->msgs);
    }
    s->failed |= !sbuf || !rbuf;
    free(sbuf);
    free(rbuf);
    return NULL;
}

/* 100 idle and 100 byte-a-second connections held against a listener (run with
 * RESHARD_TIMEOUT=60) while real connectors come and go and a stream runs on a comm of it. */
int case_flood(void *ctx)
{
    unsigned char h[NCCL_NET_HANDLE_MAXSIZE], copy[NCCL_NET_HANDLE_MAXSIZE];
    void *lc, *sc, *rc;
    static struct flood f;
    NCCL_OK("listen", d_listen(ctx, 0, h, &lc));
    f.len = handle_addr(h, &f.to);
    pthread_t ft, st;
    CHECK("flood", pthread_create(&ft, NULL, flood_main, &f) == 0, "pthread_create");
    while (!atomic_load(&f.up))
        usleep(1000);
    usleep(200000); /* the strangers are queued first */
    double t0 = now_s(), worst = 0, sum = 0;
    memcpy(copy, h, sizeof(copy));
    if (connect_pair(ctx, lc, copy, &sc, &rc, 60))
        return -1;
    worst = sum = now_s() - t0;
    struct stream s = {.sc = sc, .rc = rc};
    CHECK("flood", pthread_create(&st, NULL, stream_main, &s) == 0, "pthread_create");
    int made = 1;
    while (made < FLOOD_MIN_CONNECTS || now_s() - t0 < FLOOD_MIN_SECONDS) {
        void *sc2, *rc2;
        double t = now_s();
        memcpy(copy, h, sizeof(copy));
        if (connect_pair(ctx, lc, copy, &sc2, &rc2, 60))
            return -1;
        t = now_s() - t;
        worst = t > worst ? t : worst;
        sum += t;
        made++;
        NCCL_OK("closeSend", d_close_send(sc2));
        NCCL_OK("closeRecv", d_close_recv(rc2));
        usleep(100000);
    }
    pthread_join(st, NULL);
    atomic_store(&f.stop, 1);
    pthread_join(ft, NULL);
    CHECK("flood", !s.failed && !s.bad && s.msgs == STREAM_MSGS,
          "the stream stopped after %d of %d messages (byte %zu differs; last WARN: %s)", s.msgs,
          STREAM_MSGS, s.bad ? s.bad - 1 : 0, last_warn);
    CHECK("flood", f.dropped > 0, "the listener never dropped a stranger's connection");
    printf("ok flood: %d connections made past %d idle and %d byte-a-second ones in %.1f s "
           "(slowest %.3f s, mean %.3f s), %d MiB streamed meanwhile, %ld strangers dropped\n",
           made, FLOOD_IDLE, FLOOD_SLOW, now_s() - t0, worst, sum / made,
           STREAM_MSGS * STREAM_BYTES / MIB, f.dropped);
    NCCL_OK("closeSend", d_close_send(sc));
    NCCL_OK("closeRecv", d_close_recv(rc));
    NCCL_OK("closeListen", d_close_listen(lc));
    return 0;
}

/* ---- when the plugin cannot run, and when it is unloaded ---- */

/* Run with the transport's library hidden: init succeeds and there is no device, so NCCL falls
 * back to another network, with one WARN saying why. */
int case_no_devices(void)
{
    void *ctx;
    int n = -1;
    NCCL_OK("init", d_init(&ctx));
    NCCL_OK("devices", d_devices(&n));
    CHECK("no devices", n == 0, "%d devices with the transport hidden", n);
    CHECK("no devices", strstr(last_warn, "offers no device"), "WARN '%s'", last_warn);
    printf("ok no device: WARN: %s\n", last_warn);
    NCCL_OK("finalize", d_finalize(ctx));
    return 0;
}

/* The devices start() found and printed: for the interface selection tests. */
int case_devices(void *ctx)
{
    (void)ctx;
    return 0;
}

static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        n += e->d_name[0] != '.';
    if (d)
        closedir(d);
    return n;
}

#define RELOADS 10

/* What NCCL does when its last communicator goes and a new one comes: everything closed (and,
 * v11+, finalized), dlclose, dlopen again, init again. The library must really unload, and
 * after the first rounds the process holds no more memory, descriptors or threads per round. */
int case_reload(void *ctx)
{
    char want[8];
    snprintf(want, sizeof(want), "%d", version);
    NCCL_OK("finalize", d_finalize(ctx));
    long heap[RELOADS];
    int fds[RELOADS], threads[RELOADS];
    for (int i = 0; i < RELOADS; i++) {
        CHECK("reload", dlclose(plugin_lib) == 0, "dlclose: %s", dlerror());
        void *still = dlopen(plugin_path(), RTLD_NOW | RTLD_NOLOAD);
        CHECK("reload", !still, "round %d: the plugin stayed loaded after dlclose", i);
        heap[i] = (long)mallinfo2().uordblks;
        fds[i] = count_entries("/proc/self/fd");
        threads[i] = count_entries("/proc/self/task");
        if (load(want, 1))
            return -1;
        void *c, *lc, *sc, *rc;
        unsigned char h[NCCL_NET_HANDLE_MAXSIZE];
        int n;
        NCCL_OK("init", d_init(&c));
        NCCL_OK("devices", d_devices(&n));
        if (pair(c, &lc, &sc, &rc, h) || one_message(sc, rc, 65536, 9))
            return -1;
        NCCL_OK("closeSend", d_close_send(sc));
        NCCL_OK("closeRecv", d_close_recv(rc));
        NCCL_OK("closeListen", d_close_listen(lc));
        NCCL_OK("finalize", d_finalize(c));
    }
    /* The first rounds load what stays (UCX's libraries, their caches): count from round 2.
     * UCX itself keeps a few hundred bytes to a few KiB across each of its own init and
     * cleanup (2.5-2.8 KiB a round here, with a connection); what main's plugin left behind
     * was 22 KiB a round (v12). Under ASan, LeakSanitizer sees any block an unloaded copy of
     * the plugin left behind, however small. */
    long grew = heap[RELOADS - 1] - heap[2], per_round = grew / (RELOADS - 3);
    printf("ok %d rounds of dlclose, dlopen, init, a connection, finalize: unloaded each time; "
           "from round 2 to %d: heap %+ld bytes (%+ld a round), descriptors %d -> %d, threads "
           "%d -> %d\n",
           RELOADS, RELOADS - 1, grew, per_round, fds[2], fds[RELOADS - 1], threads[2],
           threads[RELOADS - 1]);
    CHECK("reload", fds[RELOADS - 1] == fds[2], "descriptors leak across reloads");
    CHECK("reload", threads[RELOADS - 1] == threads[2], "threads leak across reloads");
#ifndef __SANITIZE_ADDRESS__ /* ASan's allocator reports no heap figures */
    CHECK("reload", per_round < 8192, "the heap grew by %ld bytes a round", per_round);
#endif
    void *c;
    NCCL_OK("init", d_init(&c)); /* main finalizes the context it holds: this one */
    driver_ctx = c;
    return 0;
}
