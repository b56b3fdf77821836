/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The conformance driver's two-process life cycle (net_driver --role recv|send): the receiver
 * listens and writes the handle to a file, the sender reads it and connects; then small,
 * grouped, many, zero-byte and tagged messages, and a stream whose words the receiver folds
 * into a checksum, on host or device memory, with either side killing itself on --die.
 */
#include "net_driver.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void fill(unsigned char *p, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(seed * 131 + i * 7 + (i >> 8));
}

size_t mismatch(const unsigned char *p, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != (unsigned char)(seed * 131 + i * 7 + (i >> 8)))
            return i + 1;
    return 0;
}

/* The stream's words: message m, word w. The receiver folds them into a checksum and compares
 * it with the one the pattern must give, so a lost, doubled or misplaced chunk shows. */
static uint64_t word(uint64_t m, uint64_t w)
{
    return (m + 1) * 0x9e3779b97f4a7c15ull ^ (w * 0xbf58476d1ce4e5b9ull);
}

static uint64_t mix(uint64_t sum, uint64_t x)
{
    sum = (sum ^ x) * 0x100000001b3ull;
    return sum ^ sum >> 29;
}

/* The survivor's check: the stream's request failed (r, from `call`: test, or irecv when the
 * plugin knew the peer gone before the receive was posted) because the peer died. Returns 1
 * when it did, as it must, 0 when the stream goes on, -1 on a wrong outcome. */
static int peer_died(const char *call, ncclResult_t r, size_t m, size_t nmsg)
{
    if (r == ncclSuccess && m + 1 < nmsg)
        return 0;
    if (r == ncclInProgress)
        fail("peer died", "test still pending after 60 s: the transfer hangs");
    else if (r == ncclSuccess)
        fail("peer died", "the whole stream completed although the peer died");
    else if (r != ncclSystemError || !strstr(last_warn, "NET/Reshard"))
        fail("peer died", "%s returned %d, WARN '%s'", call, (int)r, last_warn);
    else
        printf("ok peer died: %s returned ncclSystemError after %zu messages: %s\n", call, m,
               last_warn);
    return r == ncclSystemError ? 1 : -1;
}

static int write_handle(const char *file, const unsigned char *h)
{
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp", file);
    FILE *f = fopen(tmp, "wb");
    CHECK("handle", f && fwrite(h, 1, NCCL_NET_HANDLE_MAXSIZE, f) == NCCL_NET_HANDLE_MAXSIZE,
          "write %s: %s", tmp, strerror(errno));
    fclose(f);
    CHECK("handle", rename(tmp, file) == 0, "rename to %s: %s", file, strerror(errno));
    return 0;
}

/* The end of the life cycle, from the receiver to the sender, beside the handle: the sender
 * must not finalize and exit before the receiver has done with its comm (posted its last
 * receive and closed), since on receiver-driven transports (verbs) a receive posted to a peer
 * that is gone fails. */
static int write_done(const char *handle_file)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s.done", handle_file);
    FILE *f = fopen(path, "w");
    CHECK("done", f, "create %s: %s", path, strerror(errno));
    fclose(f);
    return 0;
}

static int wait_done(const char *handle_file, double timeout_s)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s.done", handle_file);
    for (double end = now_s() + timeout_s; access(path, F_OK) != 0; usleep(10000))
        CHECK("done", now_s() < end, "the receiver did not finish within %.0f s", timeout_s);
    return 0;
}

static int read_handle(const char *file, unsigned char *h)
{
    double end = now_s() + 60;
    for (;;) {
        FILE *f = fopen(file, "rb");
        if (f) {
            size_t n = fread(h, 1, NCCL_NET_HANDLE_MAXSIZE, f);
            fclose(f);
            CHECK("handle", n == NCCL_NET_HANDLE_MAXSIZE, "%s holds %zu bytes", file, n);
            return 0;
        }
        CHECK("handle", now_s() < end, "%s did not appear within 60 s", file);
        usleep(10000);
    }
}

#define SMALL_TAG  1
#define GROUP_TAG  100
#define MANY_TAG   1000
#define ZERO_TAG   3000
#define STREAM_TAG 4000
#define STRAY_TAG  5000
#define WINDOW     8
#define MANY_BYTES 4096

int recv_side(void *ctx, const struct run *run)
{
    unsigned char handle[NCCL_NET_HANDLE_MAXSIZE] = {0};
    void *lc = NULL, *rc = NULL, *mh = NULL;
    NCCL_OK("listen", d_listen(ctx, 0, handle, &lc));
    ok("listen");
    if (write_handle(run->handle_file, handle))
        return -1;
    double end = now_s() + 60;
    while (!rc) {
        NCCL_OK("accept", d_accept(lc, &rc));
        CHECK("accept", now_s() < end, "nobody connected within 60 s");
    }
    ok("accept");
    size_t bytes = (size_t)WINDOW * MSG;
    unsigned char *buf = run->device ? dev_alloc(bytes) : malloc(bytes);
    int flushes = 0;
    CHECK("regMr", buf, "no memory");
    if (run->device)
        NCCL_OK("regMr", d_reg_device_dmabuf(rc, buf, bytes, &mh));
    else
        NCCL_OK("regMr", d_reg(rc, buf, bytes, NCCL_PTR_HOST, &mh));
    ok(run->device ? "regMr (regMrDmaBuf of device memory)" : "regMr");

    /* 5000 bytes into a 5200-byte receive: test reports 5000. */
    void *req, *data[MAX_RECVS_WANTED];
    size_t sizes[MAX_RECVS_WANTED];
    int tags[MAX_RECVS_WANTED], got[MAX_RECVS_WANTED];
    void *mhs[MAX_RECVS_WANTED];
    data[0] = buf, sizes[0] = 5200, tags[0] = SMALL_TAG, mhs[0] = mh;
    NCCL_OK("irecv", d_irecv(rc, 1, data, sizes, tags, mhs, &req));
    CHECK("irecv", req && req != (void *)0x1, "irecv gave request %p", req);
    NCCL_OK("test", wait_req(req, got, 30));
    if (run->device && flush_recv(rc, 1, data, got, mhs, &flushes))
        return -1;
    CHECK("size", got[0] == 5000, "5000 bytes sent, test reports %d", got[0]);
    size_t bad = mismatch(buf, 5000, 1);
    CHECK("size", !bad, "byte %zu differs", bad - 1);
    ok("5000 bytes into 5200");

    /* A grouped receive of maxRecvs messages, matched by tag whatever the sending order. */
    for (int i = 0; i < MAX_RECVS_WANTED; i++) {
        data[i] = buf + (size_t)i * 8192, sizes[i] = 8192, tags[i] = GROUP_TAG + i, mhs[i] = mh;
    }
    NCCL_OK("grouped irecv", d_irecv(rc, MAX_RECVS_WANTED, data, sizes, tags, mhs, &req));
    NCCL_OK("grouped irecv", wait_req(req, got, 30));
    if (run->device && flush_recv(rc, MAX_RECVS_WANTED, data, got, mhs, &flushes))
        return -1;
    for (int i = 0; i < MAX_RECVS_WANTED; i++) {
        CHECK("grouped irecv", got[i] == 1000 + i, "buffer %d got %d bytes, want %d", i, got[i],
              1000 + i);
        bad = mismatch(data[i], (size_t)got[i], (uint64_t)(GROUP_TAG + i));
        CHECK("grouped irecv", !bad, "buffer %d byte %zu differs", i, bad - 1);
    }
    ok("grouped irecv of maxRecvs by tag");

    /* 32 grouped receives outstanding at once (the sender has 32 x maxRecvs sends). */
    void *reqs[32];
    for (int k = 0; k < 32; k++) {
        for (int i = 0; i < MAX_RECVS_WANTED; i++) {
            int m = k * MAX_RECVS_WANTED + i;
            data[i] = buf + (size_t)m * MANY_BYTES, sizes[i] = MANY_BYTES, tags[i] = MANY_TAG + m;
            mhs[i] = mh;
        }
        NCCL_OK("32 outstanding", d_irecv(rc, MAX_RECVS_WANTED, data, sizes, tags, mhs, &reqs[k]));
    }
    for (int k = 31; k >= 0; k--) {
        NCCL_OK("32 outstanding", wait_req(reqs[k], got, 30));
        for (int i = 0; i < MAX_RECVS_WANTED; i++)
            data[i] = buf + (size_t)(k * MAX_RECVS_WANTED + i) * MANY_BYTES;
        if (run->device && flush_recv(rc, MAX_RECVS_WANTED, data, got, mhs, &flushes))
            return -1;
        for (int i = 0; i < MAX_RECVS_WANTED; i++) {
            int m = k * MAX_RECVS_WANTED + i;
            CHECK("32 outstanding", got[i] == MANY_BYTES, "message %d: %d bytes", m, got[i]);
            bad = mismatch(buf + (size_t)m * MANY_BYTES, MANY_BYTES, (uint64_t)(MANY_TAG + m));
            CHECK("32 outstanding", !bad, "message %d byte %zu differs", m, bad - 1);
        }
    }
    ok("32 outstanding grouped receives");

    /* A zero-byte message. */
    data[0] = buf, sizes[0] = 64, tags[0] = ZERO_TAG, mhs[0] = mh;
    NCCL_OK("zero bytes", d_irecv(rc, 1, data, sizes, tags, mhs, &req));
    got[0] = -1;
    NCCL_OK("zero bytes", wait_req(req, got, 30));
    CHECK("zero bytes", got[0] == 0, "test reports %d bytes", got[0]);
    if (run->device) { /* nothing arrived: nothing to flush, and iflush says so */
        req = (void *)0x1;
        NCCL_OK("zero bytes", d_iflush(rc, 1, data, got, mhs, &req));
        CHECK("zero bytes", req == NULL, "iflush of 0 bytes gave request %p", req);
    }
    ok("zero-byte message");

    /* The stream, WINDOW receives in flight, every word folded into the checksum. */
    size_t nmsg = run->stream_mib * MIB / MSG;
    uint64_t sum = 0, want = 0;
    double t0 = now_s();
    void *win[WINDOW] = {0};
    size_t posted = 0;
    for (size_t m = 0; m < nmsg; m++) {
        ncclResult_t post = ncclSuccess;
        while (post == ncclSuccess && posted < nmsg && posted < m + WINDOW) {
            size_t slot = posted % WINDOW;
            data[0] = buf + slot * MSG, sizes[0] = MSG, tags[0] = STREAM_TAG, mhs[0] = mh;
            post = d_irecv(rc, 1, data, sizes, tags, mhs, &win[slot]);
            posted += post == ncclSuccess;
        }
        if (run->die != DIE_SEND)
            NCCL_OK("stream", post);
        if (run->die == DIE_RECV && m == nmsg / 2) {
            printf("ok dying after %zu messages\n", m);
            fflush(stdout);
            raise(SIGKILL);
        }
        ncclResult_t r = post != ncclSuccess ? post : wait_req(win[m % WINDOW], got, 60);
        if (run->die == DIE_SEND) {
            int died = peer_died(post != ncclSuccess ? "irecv" : "test", r, m, nmsg);
            if (died < 0)
                return -1;
            if (!died)
                continue;
            /* The failed comm closes cleanly, as NCCL's abort would close it. */
            NCCL_OK("deregMr after failure", d_dereg(rc, mh));
            NCCL_OK("closeRecv after failure", d_close_recv(rc));
            NCCL_OK("closeListen", d_close_listen(lc));
            ok("closed after failure");
            run->device ? dev_free(buf) : free(buf);
            return 0;
        }
        NCCL_OK("stream", r);
        CHECK("stream", got[0] == MSG, "message %zu: %d bytes", m, got[0]);
        data[0] = buf + (m % WINDOW) * MSG;
        if (run->device && flush_recv(rc, 1, data, got, mhs, &flushes))
            return -1;
        const uint64_t *w = (const void *)(buf + (m % WINDOW) * MSG);
        for (size_t i = 0; i < MSG / 8; i++) {
            sum = mix(sum, w[i]);
            want = mix(want, word(m, i));
        }
    }
    CHECK("stream", sum == want, "checksum %#llx, the pattern gives %#llx", (unsigned long long)sum,
          (unsigned long long)want);
    double dt = now_s() - t0;
    printf("ok stream %zu MiB in %zu messages of 4 MiB, checksum %#llx, %.2f s, %.2f GB/s\n",
           run->stream_mib, nmsg, (unsigned long long)sum, dt,
           (double)run->stream_mib * MIB / dt / 1e9);

    /* NCCL flushes receives into device memory only: a host receive's flush is a mistake. */
    int fsize = 64;
    data[0] = buf;
    if (run->device)
        printf("ok iflush: %d receives into device memory flushed\n", flushes);
    else if (expect("flush of a host receive", d_iflush(rc, 1, data, &fsize, &mh, &req),
                    ncclInvalidArgument, "needs no flush"))
        return -1;
    else
        ok("iflush (refused for a host receive)");

    /* Close with a receive in flight that no one will match. */
    data[0] = buf, sizes[0] = MANY_BYTES, tags[0] = STRAY_TAG, mhs[0] = mh;
    NCCL_OK("close in flight", d_irecv(rc, 1, data, sizes, tags, mhs, &req));
    NCCL_OK("deregMr", d_dereg(rc, mh));
    ok("deregMr");
    NCCL_OK("closeRecv", d_close_recv(rc));
    ok("closeRecv with a receive in flight");
    NCCL_OK("closeListen", d_close_listen(lc));
    ok("closeListen");
    run->device ? dev_free(buf) : free(buf);
    return write_done(run->handle_file);
}

int send_side(void *ctx, const struct run *run)
{
    unsigned char handle[NCCL_NET_HANDLE_MAXSIZE];
    if (read_handle(run->handle_file, handle))
        return -1;
    void *sc = NULL, *mh = NULL;
    double end = now_s() + 60;
    while (!sc) {
        NCCL_OK("connect", d_connect(ctx, 0, handle, &sc));
        CHECK("connect", now_s() < end, "no connection within 60 s");
    }
    ok("connect");
    size_t bytes = (size_t)WINDOW * MSG;
    unsigned char *buf = run->device ? dev_alloc(bytes) : malloc(bytes);
    CHECK("regMr", buf, "no memory");
    NCCL_OK("regMr", d_reg(sc, buf, bytes, run->device ? NCCL_PTR_CUDA : NCCL_PTR_HOST, &mh));
    ok(run->device ? "regMr (NCCL_PTR_CUDA)" : "regMr");

    void *req;
    int got[MAX_RECVS_WANTED];
    fill(buf, 5000, 1);
    NCCL_OK("isend", d_isend(sc, buf, 5000, SMALL_TAG, mh, &req));
    CHECK("isend", req && req != (void *)0x1, "isend gave request %p", req);
    NCCL_OK("isend", wait_req(req, got, 30));
    ok("isend 5000");

    void *reqs[MANY];
    for (int i = MAX_RECVS_WANTED - 1; i >= 0; i--) { /* reverse order: matching is by tag */
        unsigned char *p = buf + (size_t)i * 8192;
        fill(p, (size_t)(1000 + i), (uint64_t)(GROUP_TAG + i));
        NCCL_OK("grouped isend", d_isend(sc, p, (size_t)(1000 + i), GROUP_TAG + i, mh, &reqs[i]));
    }
    for (int i = 0; i < MAX_RECVS_WANTED; i++)
        NCCL_OK("grouped isend", wait_req(reqs[i], got, 30));
    ok("grouped isends");

    for (int m = 0; m < MANY; m++) {
        unsigned char *p = buf + (size_t)m * MANY_BYTES;
        fill(p, MANY_BYTES, (uint64_t)(MANY_TAG + m));
        NCCL_OK("32 x maxRecvs outstanding",
                d_isend(sc, p, MANY_BYTES, MANY_TAG + m, mh, &reqs[m]));
    }
    for (int m = 0; m < MANY; m++)
        NCCL_OK("32 x maxRecvs outstanding", wait_req(reqs[m], got, 30));
    ok("32 x maxRecvs outstanding sends");

    NCCL_OK("zero bytes", d_isend(sc, buf, 0, ZERO_TAG, mh, &req));
    NCCL_OK("zero bytes", wait_req(req, got, 30));
    ok("zero-byte send");

    size_t nmsg = run->stream_mib * MIB / MSG;
    void *win[WINDOW] = {0};
    ncclResult_t post = ncclSuccess; /* the last isend's: it may know the peer gone at once */
    for (size_t m = 0; m < nmsg; m++) {
        size_t slot = m % WINDOW;
        ncclResult_t r = post != ncclSuccess ? post
                         : m >= WINDOW       ? wait_req(win[slot], got, 60)
                                             : ncclSuccess;
        if (run->die == DIE_RECV) {
            int died = peer_died(post != ncclSuccess ? "isend" : "test", r, m, nmsg);
            if (died < 0)
                return -1;
            if (died) {
                NCCL_OK("deregMr after failure", d_dereg(sc, mh));
                NCCL_OK("closeSend after failure", d_close_send(sc));
                ok("closed after failure");
                run->device ? dev_free(buf) : free(buf);
                return 0;
            }
        }
        NCCL_OK("stream", r);
        if (run->die == DIE_SEND && m == nmsg / 2) {
            printf("ok dying after %zu messages\n", m);
            fflush(stdout);
            raise(SIGKILL);
        }
        uint64_t *w = (void *)(buf + slot * MSG);
        for (size_t i = 0; i < MSG / 8; i++)
            w[i] = word(m, i);
        post = d_isend(sc, w, MSG, STREAM_TAG, mh, &win[slot]);
        if (run->die != DIE_RECV)
            NCCL_OK("stream", post);
    }
    NCCL_OK("stream", post);
    for (size_t m = nmsg > WINDOW ? nmsg - WINDOW : 0; m < nmsg; m++)
        NCCL_OK("stream", wait_req(win[m % WINDOW], got, 60));
    ok("stream sent");

    /* Close with a send in flight that no one will match: 8 MiB, so that the transport holds
     * it (rendezvous) and the comm must outlive closeSend until the transport lets it go. */
    NCCL_OK("close in flight", d_isend(sc, buf, 2 * MSG, STRAY_TAG + 1, mh, &req));
    NCCL_OK("deregMr", d_dereg(sc, mh));
    if (wait_done(run->handle_file, 60))
        return -1;
    ok("the receiver is done");
    NCCL_OK("closeSend", d_close_send(sc));
    ok("closeSend with a send in flight");
    run->device ? dev_free(buf) : free(buf);
    return 0;
}
