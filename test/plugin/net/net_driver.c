/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The conformance driver: loads the plugin the way NCCL does and drives one ncclNet_vN table.
 *
 *   net_driver --version N|auto --role recv|send|env --handle FILE [--stream-mib M]
 *              [--die send|recv] [--mem device]
 *   net_driver --version N|auto --case NAME
 *
 * The library is found as NCCL finds it: dlopen("libnccl-net-reshard.so") through
 * LD_LIBRARY_PATH (or $NCCL_NET_PLUGIN when it holds a path), then ncclNetPlugin_vN, or with
 * "auto" the newest symbol this driver knows, newest first.
 *
 * --role: one side of the whole life cycle between two processes; the receiver listens and
 * writes the handle to FILE (the out-of-band channel), the sender waits for FILE and connects.
 * "env" takes the role from $RANK (0 receives), for scripts/cluster.sh. --die SIDE makes that
 * side kill itself in the middle of the stream, and the other expect a prompt, clear error.
 * --mem device: the buffers are device memory of the CUDA driver $RESHARD_CUDA_LIB names (the
 * stand-in, whose device memory the test reads as host memory): the sender registers its with
 * regMr(NCCL_PTR_CUDA), the receiver its as a dma-buf (regMrDmaBuf) and flushes every receive
 * (iflush) before reading it, as NCCL does with GPUDirect RDMA.
 *
 * --case: one bad-input or fault case inside one process (listener and connector both here).
 *
 * Every step prints "ok <step>" or "FAIL <step>: why"; the exit status is 0 only if all passed.
 *
 * The shared steps are in net_table.c (loading, the table, reporting), the two-process life
 * cycle in net_stream.c, more cases in net_hostile.c and net_lifecycle.c.
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

/* ---- single-process cases ---- */

/* Expects call to fail with `want` and a WARN containing `says`. */
int expect(const char *step, ncclResult_t got, ncclResult_t want, const char *says)
{
    CHECK(step, got == want, "returned %d, want %d (last WARN: %s)", (int)got, (int)want,
          last_warn);
    CHECK(step, strstr(last_warn, says), "WARN '%s' does not say '%s'", last_warn, says);
    printf("ok %s: %d, WARN: %s\n", step, (int)got, last_warn);
    last_warn[0] = '\0'; /* the next case must log its own */
    return 0;
}

static int case_garbage_handle(void *ctx)
{
    unsigned char h[NCCL_NET_HANDLE_MAXSIZE];
    for (size_t i = 0; i < sizeof(h); i++)
        h[i] = (unsigned char)(i * 37 + 11);
    void *sc = (void *)1;
    if (expect("garbage handle", d_connect(ctx, 0, h, &sc), ncclInternalError,
               "handle that listen did not fill"))
        return -1;
    /* A copy of a handle taken while its connection was in progress, used after that
     * connection completed: the progress it points to is gone and must not be followed. */
    void *lc, *rc = NULL;
    unsigned char copy[NCCL_NET_HANDLE_MAXSIZE];
    NCCL_OK("listen", d_listen(ctx, 0, h, &lc));
    sc = NULL;
    NCCL_OK("connect", d_connect(ctx, 0, h, &sc));
    CHECK("connect", !sc, "connected before the listener accepted");
    memcpy(copy, h, sizeof(copy));
    for (double end = now_s() + 30; !sc || !rc;) {
        if (!sc)
            NCCL_OK("connect", d_connect(ctx, 0, h, &sc));
        if (!rc)
            NCCL_OK("accept", d_accept(lc, &rc));
        CHECK("connect", now_s() < end, "no connection within 30 s");
    }
    void *again = NULL;
    int r = expect("copy of a handle used after its connection", d_connect(ctx, 0, copy, &again),
                   ncclInternalError, "progress is not ours");
    CHECK("copy of a handle", !again, "a stale copy made a comm");
    NCCL_OK("closeSend", d_close_send(sc));
    NCCL_OK("closeRecv", d_close_recv(rc));
    NCCL_OK("closeListen", d_close_listen(lc));
    return r;
}

static int case_foreign_handle(void *ctx)
{
    unsigned char h[NCCL_NET_HANDLE_MAXSIZE];
    void *lc, *sc = NULL, *rc = NULL;
    NCCL_OK("listen", d_listen(ctx, 0, h, &lc));
    h[8] ^= 0x5a; /* the nonce of another job's listener at the same address */
    ncclResult_t r = ncclSuccess;
    double end = now_s() + 30;
    while (r == ncclSuccess && !sc && now_s() < end) {
        r = d_connect(ctx, 0, h, &sc);
        NCCL_OK("accept", d_accept(lc, &rc));
        CHECK("accept", !rc, "the listener accepted a foreign handle");
    }
    NCCL_OK("closeListen", d_close_listen(lc));
    return expect("handle from another job", r, ncclSystemError, "refused the handle");
}

static int case_test_after_done(void *ctx)
{
    unsigned char h[NCCL_NET_HANDLE_MAXSIZE], buf[64] = {0};
    void *lc, *sc, *rc, *sreq, *rreq, *data[1] = {buf};
    size_t size = sizeof(buf);
    int tag = 7, got[MAX_RECVS_WANTED];
    if (pair(ctx, &lc, &sc, &rc, h))
        return -1;
    NCCL_OK("irecv", d_irecv(rc, 1, data, &size, &tag, NULL, &rreq));
    NCCL_OK("isend", d_isend(sc, buf, 16, tag, NULL, &sreq));
    NCCL_OK("test", wait_req(sreq, got, 30));
    NCCL_OK("test", wait_req(rreq, got, 30));
    CHECK("test", got[0] == 16, "16 bytes sent, %d reported", got[0]);
    int done = 1; /* must come back 0 */
    if (expect("request tested after completion", d_test(rreq, &done, got), ncclInternalError,
               "already completed"))
        return -1;
    CHECK("test after completion", !done, "a completed request reported done again");
    NCCL_OK("closeSend", d_close_send(sc));
    NCCL_OK("closeRecv", d_close_recv(rc));
    NCCL_OK("closeListen", d_close_listen(lc));
    return 0;
}

static int case_too_many(void *ctx)
{
    unsigned char h[NCCL_NET_HANDLE_MAXSIZE], buf[64] = {0};
    void *lc, *sc, *rc, *req, *data[1] = {buf};
    size_t size = sizeof(buf);
    int tag = 9;
    if (pair(ctx, &lc, &sc, &rc, h))
        return -1;
    for (int i = 0; i < 32; i++)
        NCCL_OK("32 receives", d_irecv(rc, 1, data, &size, &tag, NULL, &req));
    if (expect("33rd outstanding receive", d_irecv(rc, 1, data, &size, &tag, NULL, &req),
               ncclInternalError, "requests outstanding"))
        return -1;
    for (int i = 0; i < MANY; i++)
        NCCL_OK("256 sends", d_isend(sc, buf, 0, 10 + i, NULL, &req));
    if (expect("257th outstanding send", d_isend(sc, buf, 0, 10, NULL, &req), ncclInternalError,
               "requests outstanding"))
        return -1;
    NCCL_OK("closeSend", d_close_send(sc));
    NCCL_OK("closeRecv", d_close_recv(rc));
    NCCL_OK("closeListen", d_close_listen(lc));
    return 0;
}

static int case_bad_mr(void *ctx)
{
    unsigned char h[NCCL_NET_HANDLE_MAXSIZE], buf[64];
    void *lc, *sc, *rc, *mh = NULL;
    if (pair(ctx, &lc, &sc, &rc, h))
        return -1;
    if (expect("regMr of CUDA memory", d_reg(sc, buf, sizeof(buf), NCCL_PTR_CUDA, &mh),
               ncclInternalError, "CUDA device") ||
        expect("regMr of an unknown kind", d_reg(rc, buf, sizeof(buf), 0x40, &mh),
               ncclInternalError, "cannot register") ||
        expect("regMrDmaBuf", d_reg_dmabuf(sc, buf, sizeof(buf), NCCL_PTR_DMABUF, 0, 3, &mh),
               ncclInternalError, "dma-buf") ||
        expect("deregMr of garbage", d_dereg(sc, buf), ncclInternalError, "not a registration"))
        return -1;
    CHECK("regMr", mh == NULL, "a failed regMr wrote a handle");
    NCCL_OK("regMr", d_reg(sc, buf, sizeof(buf), NCCL_PTR_HOST, &mh));
    void *req;
    if (expect("isend outside its registration", d_isend(sc, buf + 32, 64, 1, mh, &req),
               ncclInvalidArgument, "outside their registration"))
        return -1;
    NCCL_OK("deregMr", d_dereg(sc, mh));
    NCCL_OK("closeSend", d_close_send(sc));
    NCCL_OK("closeRecv", d_close_recv(rc));
    NCCL_OK("closeListen", d_close_listen(lc));
    return 0;
}

/* A refusal of bad input: ncclInvalidArgument, a WARN naming the call, the pointer and the
 * device, and no handle written. */
static int refused(const char *step, ncclResult_t got, const char *call, const void *p,
                   const char *dev, void *const *mh)
{
    char ptr[32];
    snprintf(ptr, sizeof(ptr), "%p", p);
    CHECK(step, got == ncclInvalidArgument, "returned %d, want ncclInvalidArgument (last WARN: %s)",
          (int)got, last_warn);
    CHECK(step, strstr(last_warn, call) && strstr(last_warn, ptr) && strstr(last_warn, dev),
          "WARN '%s' does not name %s, %s and %s", last_warn, call, ptr, dev);
    CHECK(step, !mh || !*mh, "a refused registration wrote a handle");
    printf("ok %s: %d, WARN: %s\n", step, (int)got, last_warn);
    last_warn[0] = '\0';
    return 0;
}

/* Descriptors of the stand-in's device memory (its dma-bufs are its memfds) open in this
 * process: a registration that kept one would show here. Counting every descriptor would not
 * do: UCX opens sockets of its own whenever its connections progress. */
static int open_dmabufs(void)
{
    int n = 0;
    for (int fd = 0; fd < 4096; fd++) {
        char path[64], link[256];
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
        ssize_t len = readlink(path, link, sizeof(link) - 1);
        if (len > 0) {
            link[len] = '\0';
            n += strstr(link, "memfd:fake-cuda") != NULL;
        }
    }
    return n;
}

/* GPUDirect's bad input, on the stand-in driver with RESHARD_TEST_DEVICE_AS_HOST=1: memory of
 * the wrong kind, a descriptor that is not a dma-buf, a range past a dma-buf's end, a transfer
 * past its registration, a flush of a host receive. Nothing is registered, no descriptor left. */
static int case_gdr_bad_input(void *ctx)
{
    unsigned char h[NCCL_NET_HANDLE_MAXSIZE], props[512];
    void *lc, *sc, *rc, *mh = NULL, *smh = NULL, *hmh = NULL, *req;
    NCCL_OK("getProperties", version >= 11 ? T(11)->getProperties(0, (void *)props)
                                           : T(9)->getProperties(0, (void *)props));
    char dev[64];
    snprintf(dev, sizeof(dev), "%s", ((const ncclNetProperties_v8_t *)props)->name);
    if (pair(ctx, &lc, &sc, &rc, h))
        return -1;
    size_t n = 1 << 20;
    unsigned char *d = dev_alloc(n), *host = malloc(n);
    CHECK("memory", d && host, "no memory");
    int fds = open_dmabufs(), pipefd[2];
    CHECK("pipe", pipe(pipefd) == 0, "pipe: %s", strerror(errno));
    int dmabuf = dev_dmabuf(d, n);
    if (dmabuf < 0)
        return -1;
    if (refused("device memory as NCCL_PTR_HOST", d_reg(rc, d, n, NCCL_PTR_HOST, &mh), "regMr", d,
                dev, &mh) ||
        refused("host memory as NCCL_PTR_CUDA", d_reg(rc, host, n, NCCL_PTR_CUDA, &mh), "regMr",
                host, dev, &mh) ||
        refused("host memory as a dma-buf",
                d_reg_dmabuf(rc, host, n, NCCL_PTR_CUDA, 0, dmabuf, &mh), "regMrDmaBuf", host, dev,
                &mh) ||
        refused("a pipe as a dma-buf", d_reg_dmabuf(rc, d, n, NCCL_PTR_CUDA, 0, pipefd[0], &mh),
                "regMrDmaBuf", d, dev, &mh) ||
        refused("descriptor -1 as a dma-buf", d_reg_dmabuf(rc, d, n, NCCL_PTR_CUDA, 0, -1, &mh),
                "regMrDmaBuf", d, dev, &mh) ||
        refused("a range past the dma-buf's end",
                d_reg_dmabuf(rc, d, n, NCCL_PTR_CUDA, 4096, dmabuf, &mh), "regMrDmaBuf", d, dev,
                &mh))
        return -1;
    close(pipefd[0]);
    close(pipefd[1]);
    close(dmabuf);
    NCCL_OK("regMr", d_reg(sc, d, n, NCCL_PTR_CUDA, &smh));
    NCCL_OK("regMr", d_reg(rc, host, n, NCCL_PTR_HOST, &hmh));
    void *data = host;
    int size = 64;
    if (refused("isend past its registration", d_isend(sc, d + n - 16, 64, 1, smh, &req), "isend",
                d + n - 16, dev, NULL) ||
        refused("iflush of a host receive", d_iflush(rc, 1, &data, &size, &hmh, &req), "iflush",
                host, dev, NULL))
        return -1;
    NCCL_OK("deregMr", d_dereg(sc, smh));
    NCCL_OK("deregMr", d_dereg(rc, hmh));
    CHECK("descriptors", open_dmabufs() == fds, "%d descriptors of device memory open, %d before",
          open_dmabufs(), fds);
    ok("no registration or descriptor left behind");
    NCCL_OK("closeSend", d_close_send(sc));
    NCCL_OK("closeRecv", d_close_recv(rc));
    NCCL_OK("closeListen", d_close_listen(lc));
    dev_free(d);
    free(host);
    return 0;
}

/* Packets an RDMA port has sent (hw_counters/sent_pkts: soft-RoCE has it); -1 when this
 * device has no such counter (an interface: UCX spreads a virtual NIC over its own lanes, and
 * traffic between local addresses never leaves by them anyway). */
static long long sent_packets(const char *name, int port)
{
    char path[512];
    snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/%d/hw_counters/sent_pkts", name,
             port > 0 ? port : 1);
    FILE *f = fopen(path, "r");
    long long n = -1;
    if (f && fscanf(f, "%lld", &n) != 1)
        n = -1;
    if (f)
        fclose(f);
    return n;
}

static int props_of(int dev, ncclNetProperties_v12_t *p12, ncclNetProperties_v9_t *p9)
{
    NCCL_OK("getProperties", version >= 12   ? T(12)->getProperties(dev, p12)
                             : version >= 11 ? T(11)->getProperties(dev, (void *)p9)
                                             : T(9)->getProperties(dev, p9));
    if (version >= 12)
        *p9 = (ncclNetProperties_v9_t){.name = p12->name,
                                       .speed = p12->speed,
                                       .port = p12->port,
                                       .ptrSupport = p12->ptrSupport,
                                       .vProps = {.ndevs = p12->vProps.ndevs}};
    if (version >= 12)
        for (int i = 0; i < p12->vProps.ndevs && i < NCCL_NET_MAX_DEVS_PER_NIC_V9; i++)
            p9->vProps.devs[i] = p12->vProps.devs[i];
    return 0;
}

static ncclResult_t d_make_vdevice(int *d, int n, const int *devs)
{
    ncclNetVDeviceProps_v12_t p12 = {.ndevs = n};
    ncclNetVDeviceProps_v9_t p9 = {.ndevs = n};
    for (int i = 0; i < n && i < NCCL_NET_MAX_DEVS_PER_NIC_V9; i++)
        p9.devs[i] = p12.devs[i] = devs[i];
    return version >= 12   ? T(12)->makeVDevice(d, &p12)
           : version >= 11 ? T(11)->makeVDevice(d, &p9)
           : version == 10 ? T(10)->makeVDevice(d, &p9)
                           : T(9)->makeVDevice(d, &p9);
}

/* A message over virtual NIC v (striped over its rails), exact at the other end. */
static int vnic_message(void *sc, void *rc, unsigned char *sbuf, unsigned char *rbuf, void *smh,
                        void *rmh, size_t size, int tag)
{
    void *sreq, *rreq, *data = rbuf;
    size_t cap = size + 64;
    int got[MAX_RECVS_WANTED];
    fill(sbuf, size, (uint64_t)tag);
    memset(rbuf, 0, cap);
    NCCL_OK("vNIC irecv", d_irecv(rc, 1, &data, &cap, &tag, &rmh, &rreq));
    NCCL_OK("vNIC isend", d_isend(sc, sbuf, size, tag, smh, &sreq));
    NCCL_OK("vNIC isend", wait_req(sreq, NULL, 60));
    NCCL_OK("vNIC irecv", wait_req(rreq, got, 60));
    CHECK("vNIC", got[0] == (int)size, "%zu bytes sent, %d reported", size, got[0]);
    size_t bad = mismatch(rbuf, size, (uint64_t)tag);
    CHECK("vNIC", !bad, "%zu-byte message: byte %zu differs", size, bad - 1);
    for (size_t i = size; i < cap; i++)
        CHECK("vNIC", rbuf[i] == 0, "%zu-byte message: byte %zu past it was written", size, i);
    return 0;
}

/* makeVDevice (v9 and later): a virtual NIC of devices 0 and 1, its properties (vProps, the
 * sum of the speeds), the same merge made again, bad merges refused; then messages over it,
 * exact, with both devices carrying packets. Needs two devices (soft-RoCE: rxe0 and rxe1). */
static int case_vnic(void *ctx)
{
    int ndev = 0;
    NCCL_OK("devices", d_devices(&ndev));
    if (version < 9 || ndev < 2) {
        printf("ok vNIC skipped: %s\n", version < 9 ? "v8 has no makeVDevice" : "one device");
        return 0;
    }
    CHECK("makeVDevice", version >= 12 ? (void *)T(12)->makeVDevice : (void *)T(9)->makeVDevice,
          "v%d's makeVDevice is NULL: NCCL cannot merge ports", version);
    ncclNetProperties_v12_t q12[3];
    ncclNetProperties_v9_t q[3];
    if (props_of(0, &q12[0], &q[0]) || props_of(1, &q12[1], &q[1]))
        return -1;
    int v = -1, again = -1, two[2] = {0, 1}, same[2] = {1, 1}, far[2] = {0, 99};
    NCCL_OK("makeVDevice", d_make_vdevice(&v, 2, two));
    NCCL_OK("makeVDevice", d_make_vdevice(&again, 2, two));
    CHECK("makeVDevice", v >= 2 && again == v, "made %d, then %d", v, again);
    if (props_of(v, &q12[2], &q[2]))
        return -1;
    CHECK("vNIC properties",
          q[2].vProps.ndevs == 2 && q[2].vProps.devs[0] == 0 && q[2].vProps.devs[1] == 1,
          "vProps {%d: %d %d}", q[2].vProps.ndevs, q[2].vProps.devs[0], q[2].vProps.devs[1]);
    CHECK("vNIC properties", q[2].speed == q[0].speed + q[1].speed, "speed %d, members %d + %d",
          q[2].speed, q[0].speed, q[1].speed);
    printf("ok makeVDevice: device %d %s, %d Mbps, vProps {0, 1}\n", v, q[2].name, q[2].speed);
    if (version >= 12)
        printf("ok railId/planeId: %d/%d %d/%d, vNIC %d/%d\n", q12[0].railId, q12[0].planeId,
               q12[1].railId, q12[1].planeId, q12[2].railId, q12[2].planeId);
    int bogus = -1;
    if (expect("makeVDevice of one device", d_make_vdevice(&bogus, 1, two), ncclInternalError,
               "makeVDevice of 1 devices") ||
        expect("makeVDevice of a device twice", d_make_vdevice(&bogus, 2, same), ncclInternalError,
               "listed twice") ||
        expect("makeVDevice of a device that is not there", d_make_vdevice(&bogus, 2, far),
               ncclInternalError, "not one of the"))
        return -1;

    unsigned char h[NCCL_NET_HANDLE_MAXSIZE] = {0};
    void *lc, *sc = NULL, *rc = NULL, *smh, *rmh;
    NCCL_OK("listen on the vNIC", d_listen(ctx, v, h, &lc));
    for (double end = now_s() + 30; !sc || !rc;) {
        if (!sc)
            NCCL_OK("connect on the vNIC", d_connect(ctx, v, h, &sc));
        if (!rc)
            NCCL_OK("accept on the vNIC", d_accept(lc, &rc));
        CHECK("vNIC", now_s() < end, "no connection within 30 s");
    }
    size_t big = (8u << 20) + 3;
    unsigned char *sbuf = malloc(big + 64), *rbuf = malloc(big + 64);
    CHECK("vNIC", sbuf && rbuf, "no memory");
    NCCL_OK("regMr on the vNIC", d_reg(sc, sbuf, big + 64, NCCL_PTR_HOST, &smh));
    NCCL_OK("regMr on the vNIC", d_reg(rc, rbuf, big + 64, NCCL_PTR_HOST, &rmh));
    long long before[2] = {sent_packets(q[0].name, q[0].port), sent_packets(q[1].name, q[1].port)};
    if (vnic_message(sc, rc, sbuf, rbuf, smh, rmh, big, 11) ||
        vnic_message(sc, rc, sbuf, rbuf, smh, rmh, 101, 12) ||
        vnic_message(sc, rc, sbuf, rbuf, smh, rmh, 1, 13) ||
        vnic_message(sc, rc, sbuf, rbuf, smh, rmh, 0, 14))
        return -1;
    long long after[2] = {sent_packets(q[0].name, q[0].port), sent_packets(q[1].name, q[1].port)};
    printf("ok vNIC messages of %zu, 101, 1 and 0 bytes exact\n", big);
    if (before[0] >= 0 && before[1] >= 0) {
        /* Each rail carried about half of 8 MiB: thousands of packets at any MTU. */
        CHECK("vNIC striping", after[0] - before[0] > 1000 && after[1] - before[1] > 1000,
              "%s sent %lld packets, %s %lld", q[0].name, after[0] - before[0], q[1].name,
              after[1] - before[1]);
        printf("ok vNIC striped: %s sent %lld packets, %s %lld\n", q[0].name, after[0] - before[0],
               q[1].name, after[1] - before[1]);
    } else {
        printf("ok vNIC striping not measured: no packet counters for %s and %s here\n", q[0].name,
               q[1].name);
    }
    NCCL_OK("deregMr", d_dereg(sc, smh));
    NCCL_OK("deregMr", d_dereg(rc, rmh));
    NCCL_OK("closeSend", d_close_send(sc));
    NCCL_OK("closeRecv", d_close_recv(rc));
    NCCL_OK("closeListen", d_close_listen(lc));
    free(sbuf);
    free(rbuf);
    return 0;
}

/* v11+: init runs once per communicator; finalize takes NULL; contexts are checked. */
static int case_contexts(void *ctx)
{
    if (version < 11) {
        void *again;
        NCCL_OK("second init", d_init(&again)); /* once per process: a repeat is harmless */
        ok("second init (process-wide context)");
        return 0;
    }
    void *second = NULL;
    NCCL_OK("second init", d_init(&second));
    CHECK("second init", second && second != ctx, "second context %p (first %p)", second, ctx);
    unsigned char h[NCCL_NET_HANDLE_MAXSIZE];
    void *lc, *sc, *rc;
    if (pair(second, &lc, &sc, &rc, h))
        return -1;
    NCCL_OK("closeSend", d_close_send(sc));
    NCCL_OK("closeRecv", d_close_recv(rc));
    NCCL_OK("closeListen", d_close_listen(lc));
    NCCL_OK("finalize second", d_finalize(second));
    ok("a second context works and finalizes apart");
    NCCL_OK("finalize(NULL)", d_finalize(NULL));
    ok("finalize(NULL)");
    void *lc2;
    return expect("listen on a garbage context", T(11)->listen(h, 0, h, &lc2), ncclInternalError,
                  "not a context");
}

/* Arguments out of range: each refused with ncclInternalError and a WARN saying which. */
static int case_bad_args(void *ctx)
{
    unsigned char h[NCCL_NET_HANDLE_MAXSIZE], props[512], buf[64] = {0};
    void *lc, *sc, *rc, *req, *data[MAX_RECVS_WANTED + 1];
    size_t sizes[MAX_RECVS_WANTED + 1];
    int tags[MAX_RECVS_WANTED + 1] = {0}, fsize = 64;
    for (int i = 0; i <= MAX_RECVS_WANTED; i++)
        data[i] = buf, sizes[i] = sizeof(buf);
    ncclResult_t r = version >= 11 ? T(11)->getProperties(99, (void *)props)
                                   : T(9)->getProperties(99, (void *)props);
    if (expect("getProperties of device 99", r, ncclInternalError, "does not exist"))
        return -1;
    if (pair(ctx, &lc, &sc, &rc, h))
        return -1;
    if (expect("irecv of 0 buffers", d_irecv(rc, 0, data, sizes, tags, NULL, &req),
               ncclInternalError, "irecv of 0 buffers") ||
        expect("irecv of maxRecvs + 1 buffers",
               d_irecv(rc, MAX_RECVS_WANTED + 1, data, sizes, tags, NULL, &req), ncclInternalError,
               "irecv of 9 buffers") ||
        expect("iflush of 0 buffers", d_iflush(rc, 0, data, &fsize, NULL, &req), ncclInternalError,
               "iflush of 0 buffers") ||
        expect("isend on a receive comm", d_isend(rc, buf, 8, 0, NULL, &req), ncclInternalError,
               "not an open send comm") ||
        expect("irecv on a send comm", d_irecv(sc, 1, data, sizes, tags, NULL, &req),
               ncclInternalError, "not an open receive comm"))
        return -1;
    if (version >= 9 && /* v8 sizes are int: 2 GiB cannot be said */
        expect("isend above maxP2pBytes", d_isend(sc, buf, (size_t)2 << 30, 0, NULL, &req),
               ncclInternalError, "exceeds maxP2pBytes"))
        return -1;
    /* (A comm closed twice is freed memory, as with free(): not something to test.) */
    if (expect("closeSend of something else", d_close_send(buf), ncclInternalError,
               "not an open send comm") ||
        expect("closeRecv of a send comm", d_close_recv(sc), ncclInternalError,
               "not an open receive comm"))
        return -1;
    NCCL_OK("closeSend", d_close_send(sc));
    NCCL_OK("closeRecv", d_close_recv(rc));
    NCCL_OK("closeListen", d_close_listen(lc));
    return 0;
}

/* A listener that never accepts (run with RESHARD_TIMEOUT=1): connect gives up, saying so. */
static int case_connect_timeout(void *ctx)
{
    unsigned char h[NCCL_NET_HANDLE_MAXSIZE];
    void *lc, *sc = NULL;
    NCCL_OK("listen", d_listen(ctx, 0, h, &lc));
    ncclResult_t r = ncclSuccess;
    double t0 = now_s();
    while (r == ncclSuccess && !sc && now_s() < t0 + 30)
        r = d_connect(ctx, 0, h, &sc);
    double dt = now_s() - t0;
    NCCL_OK("closeListen", d_close_listen(lc));
    CHECK("connect timeout", dt < 5, "gave up after %.1f s, RESHARD_TIMEOUT is 1 s", dt);
    return expect("listener that never accepts", r, ncclSystemError, "no handshake with");
}

/* The handle of a listen comm since closed: nobody listens at its address any more. */
static int case_listener_gone(void *ctx)
{
    unsigned char h[NCCL_NET_HANDLE_MAXSIZE];
    void *lc, *sc = NULL;
    NCCL_OK("listen", d_listen(ctx, 0, h, &lc));
    NCCL_OK("closeListen", d_close_listen(lc));
    ncclResult_t r = ncclSuccess;
    for (double end = now_s() + 30; r == ncclSuccess && !sc && now_s() < end;)
        r = d_connect(ctx, 0, h, &sc);
    return expect("handle of a closed listener", r, ncclSystemError, "connect to");
}

/* NCCL's service thread makes and closes connections while its progress thread moves data on
 * others, both on the same device: here a second thread churns through connections and
 * properties while this one streams. */
struct churn {
    void *ctx;
    int rounds, done;
    atomic_int finished;
};

static void *churn_main(void *arg)
{
    struct churn *c = arg;
    unsigned char h[NCCL_NET_HANDLE_MAXSIZE], props[512];
    for (; c->done < c->rounds; c->done++) {
        void *lc, *sc, *rc;
        if ((version >= 11 ? T(11)->getProperties(0, (void *)props)
                           : T(9)->getProperties(0, (void *)props)) != ncclSuccess ||
            pair(c->ctx, &lc, &sc, &rc, h) || d_close_send(sc) != ncclSuccess ||
            d_close_recv(rc) != ncclSuccess || d_close_listen(lc) != ncclSuccess)
            break;
    }
    atomic_store(&c->finished, 1);
    return NULL;
}

static int case_threads(void *ctx)
{
    enum { N = 2000, BYTES = 65536, W = 8 };
    unsigned char h[NCCL_NET_HANDLE_MAXSIZE];
    void *lc, *sc, *rc, *smh, *rmh, *sreq[W], *rreq[W];
    if (pair(ctx, &lc, &sc, &rc, h))
        return -1;
    unsigned char *sbuf = malloc((size_t)W * BYTES), *rbuf = malloc((size_t)W * BYTES);
    CHECK("threads", sbuf && rbuf, "no memory");
    NCCL_OK("regMr", d_reg(sc, sbuf, (size_t)W * BYTES, NCCL_PTR_HOST, &smh));
    NCCL_OK("regMr", d_reg(rc, rbuf, (size_t)W * BYTES, NCCL_PTR_HOST, &rmh));
    struct churn churn = {.ctx = ctx, .rounds = 30};
    pthread_t t;
    CHECK("threads", pthread_create(&t, NULL, churn_main, &churn) == 0, "pthread_create");
    size_t bad = 0;
    int end = -1; /* the first message not sent: at least N, and the churn must be over */
    for (int m = 0; (end < 0 || m < end + W) && !bad; m++) {
        int k = m % W, got[MAX_RECVS_WANTED];
        if (m >= W) { /* message m - W: both ends done, contents checked */
            NCCL_OK("threads", wait_req(sreq[k], got, 30));
            NCCL_OK("threads", wait_req(rreq[k], got, 30));
            CHECK("threads", got[0] == BYTES, "message %d: %d bytes", m - W, got[0]);
            bad = mismatch(rbuf + (size_t)k * BYTES, BYTES, (uint64_t)(m - W));
        }
        if (end < 0 && m >= N && atomic_load(&churn.finished))
            end = m;
        if (end >= 0)
            continue;
        void *data = rbuf + (size_t)k * BYTES;
        size_t size = BYTES;
        int tag = k;
        fill(sbuf + (size_t)k * BYTES, BYTES, (uint64_t)m);
        NCCL_OK("threads", d_irecv(rc, 1, &data, &size, &tag, &rmh, &rreq[k]));
        NCCL_OK("threads", d_isend(sc, sbuf + (size_t)k * BYTES, BYTES, tag, smh, &sreq[k]));
    }
    pthread_join(t, NULL);
    CHECK("threads", !bad, "byte %zu of a message differs", bad - 1);
    CHECK("threads", churn.done == churn.rounds, "the other thread stopped after %d of %d rounds",
          churn.done, churn.rounds);
    printf("ok %d messages streamed while another thread made and closed %d connections\n", end,
           churn.done);
    NCCL_OK("deregMr", d_dereg(sc, smh));
    NCCL_OK("deregMr", d_dereg(rc, rmh));
    NCCL_OK("closeSend", d_close_send(sc));
    NCCL_OK("closeRecv", d_close_recv(rc));
    NCCL_OK("closeListen", d_close_listen(lc));
    free(sbuf);
    free(rbuf);
    return 0;
}

static const struct {
    const char *name;
    int (*fn)(void *ctx);
} cases[] = {
    {"garbage-handle", case_garbage_handle},
    {"foreign-handle", case_foreign_handle},
    {"test-after-done", case_test_after_done},
    {"too-many-requests", case_too_many},
    {"bad-mr", case_bad_mr},
    {"gdr-bad-input", case_gdr_bad_input},
    {"vnic", case_vnic},
    {"threads", case_threads},
    {"bad-args", case_bad_args},
    {"connect-timeout", case_connect_timeout},
    {"listener-gone", case_listener_gone},
    {"contexts", case_contexts},
    {"null-data", case_null_data},
    {"stale-handles", case_stale_handles},
    {"idle-connection", case_idle_connection},
    {"connector-gave-up", case_connector_gave_up},
    {"flood", case_flood},
    {"devices", case_devices},
    {"reload", case_reload},
    {"fork-live", case_fork_live},
    {"fork-listener", case_fork_listener},
    {"finalize-in-flight", case_finalize_in_flight},
    {"garbage-address", case_garbage_address},
    {"truncated", case_truncated},
};

int main(int argc, char **argv)
{
    const char *want = "auto", *role = NULL, *cname = NULL;
    struct run run = {.stream_mib = 1024};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--version") && i + 1 < argc)
            want = argv[++i];
        else if (!strcmp(argv[i], "--role") && i + 1 < argc)
            role = argv[++i];
        else if (!strcmp(argv[i], "--handle") && i + 1 < argc)
            run.handle_file = argv[++i];
        else if (!strcmp(argv[i], "--stream-mib") && i + 1 < argc)
            run.stream_mib = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--die") && i + 1 < argc)
            run.die = !strcmp(argv[++i], "send") ? DIE_SEND : DIE_RECV;
        else if (!strcmp(argv[i], "--mem") && i + 1 < argc)
            run.device = !strcmp(argv[++i], "device");
        else if (!strcmp(argv[i], "--case") && i + 1 < argc)
            cname = argv[++i];
        else {
            fprintf(stderr,
                    "usage: net_driver --version N|auto (--role recv|send|env --handle "
                    "FILE [--stream-mib M] [--die send|recv] [--mem device] | --case NAME)\n");
            return 2;
        }
    }
    if (role && !strcmp(role, "env"))
        role = getenv("RANK") && atoi(getenv("RANK")) > 0 ? "send" : "recv";
    if ((!role && !cname) || (role && !run.handle_file) || run.stream_mib * MIB < MSG) {
        fprintf(stderr, "net_driver: give --role with --handle (stream >= 4 MiB), or --case\n");
        return 2;
    }
    if (load(want, 0))
        return 1;
    if (cname && !strcmp(cname, "no-devices")) /* before start, which wants a device */
        return case_no_devices() || failures;
    if (cname && !strcmp(cname, "fork-in-init")) /* init is what it tests */
        return case_fork_in_init() || failures;
    void *ctx;
    int ndev;
    if (start(&ctx, &ndev))
        return 1;
    driver_ctx = ctx;
    int rc = 0;
    if (cname) {
        size_t i = 0;
        while (i < sizeof(cases) / sizeof(cases[0]) && strcmp(cases[i].name, cname))
            i++;
        if (i == sizeof(cases) / sizeof(cases[0])) {
            fprintf(stderr, "net_driver: no case '%s'\n", cname);
            return 2;
        }
        rc = cases[i].fn(ctx);
    } else {
        rc = !strcmp(role, "recv") ? recv_side(ctx, &run) : send_side(ctx, &run);
    }
    if (rc || failures)
        return 1;
    NCCL_OK("finalize", d_finalize(driver_ctx));
    ok("finalize");
    return 0;
}
