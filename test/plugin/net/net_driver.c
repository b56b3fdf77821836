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

int version;
const void *table;
void *plugin_lib;
int failures;
char last_warn[1024];
int warns;
void *driver_ctx;
void (*log_hook)(const char *msg);

/* ---- reporting ---- */

void ok(const char *step)
{
    printf("ok %s\n", step);
    fflush(stdout);
}

void fail(const char *step, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("FAIL %s: ", step);
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
    failures++;
}

double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* NCCL's logger, as the plugin sees it: lines to stderr, the last WARN kept for checks. */
static void logger(ncclDebugLogLevel level, unsigned long flags, const char *file, int line,
                   const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (log_hook)
        log_hook(msg);
    if (level == NCCL_LOG_WARN) {
        snprintf(last_warn, sizeof(last_warn), "%s", msg);
        warns++;
    }
    fprintf(stderr, "[nccl-log %d %#lx %s:%d] %s\n", (int)level, flags, file, line, msg);
}

/* ---- one interface over every version ---- */

ncclResult_t d_init(void **ctx)
{
    ncclNetCommConfig_v12_t cfg = {.trafficClass = NCCL_NET_TRAFFIC_CLASS_UNDEF};
    *ctx = NULL;
    switch (version) {
    case 12:
        return T(12)->init(ctx, 0x5eed, &cfg, logger, NULL);
    case 11:
        return T(11)->init(ctx, 0x5eed, &cfg, logger, NULL);
    case 10:
        return T(10)->init(logger, NULL);
    case 9:
        return T(9)->init(logger);
    default:
        return T(8)->init(logger);
    }
}

ncclResult_t d_finalize(void *ctx)
{
    return version >= 11 ? T(11)->finalize(ctx) : ncclSuccess;
}

/* The v12 table has the v11 layout for every function but getProperties (checked apart), so
 * v11 and v12 share these wrappers, and v8 to v10 share their leading entries with v9. */
ncclResult_t d_devices(int *n)
{
    return version >= 11 ? T(11)->devices(n) : T(9)->devices(n);
}

ncclResult_t d_listen(void *ctx, int dev, void *handle, void **lc)
{
    return version >= 11 ? T(11)->listen(ctx, dev, handle, lc) : T(9)->listen(dev, handle, lc);
}

ncclResult_t d_connect(void *ctx, int dev, void *handle, void **sc)
{
    ncclNetDeviceHandle_t *dh = (void *)1;
    ncclNetCommConfig_v10_t cfg = {.trafficClass = NCCL_NET_TRAFFIC_CLASS_UNDEF};
    ncclResult_t r = version >= 11   ? T(11)->connect(ctx, dev, handle, sc, &dh)
                     : version == 10 ? T(10)->connect(dev, &cfg, handle, sc, &dh)
                                     : T(9)->connect(dev, handle, sc, &dh);
    if (r == ncclSuccess && *sc && dh) {
        fail("connect", "a HOST device handed back a device handle %p", (void *)dh);
        return ncclInternalError;
    }
    return r;
}

ncclResult_t d_accept(void *lc, void **rc)
{
    ncclNetDeviceHandle_t *dh = (void *)1;
    ncclResult_t r = version >= 11 ? T(11)->accept(lc, rc, &dh) : T(9)->accept(lc, rc, &dh);
    if (r == ncclSuccess && *rc && dh) {
        fail("accept", "a HOST device handed back a device handle %p", (void *)dh);
        return ncclInternalError;
    }
    return r;
}

ncclResult_t d_reg(void *comm, void *data, size_t size, int type, void **mh)
{
    return version >= 11 ? T(11)->regMr(comm, data, size, type, mh)
                         : T(9)->regMr(comm, data, size, type, mh);
}

ncclResult_t d_reg_dmabuf(void *comm, void *data, size_t size, int type, uint64_t offset, int fd,
                          void **mh)
{
    return version >= 11 ? T(11)->regMrDmaBuf(comm, data, size, type, offset, fd, mh)
                         : T(9)->regMrDmaBuf(comm, data, size, type, offset, fd, mh);
}

/* ---- device memory, from the CUDA driver tests point RESHARD_CUDA_LIB at ---- */

static int (*cu_mem_alloc)(uint64_t *p, size_t n);
static int (*cu_mem_free)(uint64_t p);
static int (*cu_dmabuf)(void *fd, uint64_t p, size_t n, int type, unsigned long long flags);

void *dev_alloc(size_t n)
{
    if (!cu_mem_alloc) {
        const char *path = getenv("RESHARD_CUDA_LIB");
        void *lib = dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        int (*init)(unsigned) = lib ? (int (*)(unsigned))dlsym(lib, "cuInit") : NULL;
        cu_mem_alloc = lib ? (int (*)(uint64_t *, size_t))dlsym(lib, "cuMemAlloc_v2") : NULL;
        cu_mem_free = lib ? (int (*)(uint64_t))dlsym(lib, "cuMemFree_v2") : NULL;
        cu_dmabuf = lib ? (int (*)(void *, uint64_t, size_t, int, unsigned long long))dlsym(
                              lib, "cuMemGetHandleForAddressRange")
                        : NULL;
        if (!init || !cu_mem_alloc || !cu_mem_free || !cu_dmabuf || init(0)) {
            fail("device memory", "no CUDA driver at %s: %s", path ? path : "libcuda.so.1",
                 lib ? "a call is missing or cuInit failed" : dlerror());
            cu_mem_alloc = NULL;
            return NULL;
        }
    }
    uint64_t p = 0;
    if (cu_mem_alloc(&p, n)) {
        fail("device memory", "cuMemAlloc of %zu bytes failed", n);
        return NULL;
    }
    return (void *)(uintptr_t)p;
}

void dev_free(void *p)
{
    if (p && cu_mem_free)
        cu_mem_free((uint64_t)(uintptr_t)p);
}

/* The dma-buf of [p, p + n), as NCCL gets one (cuMemGetHandleForAddressRange); -1 on failure. */
int dev_dmabuf(void *p, size_t n)
{
    int fd = -1;
    if (!cu_dmabuf || cu_dmabuf(&fd, (uint64_t)(uintptr_t)p, n, 1 /* DMA_BUF_FD */, 0)) {
        fail("dma-buf", "cuMemGetHandleForAddressRange of %zu bytes at %p failed", n, p);
        return -1;
    }
    return fd;
}

/* regMrDmaBuf as NCCL calls it: the fd of the whole range, closed once registered. */
ncclResult_t d_reg_device_dmabuf(void *comm, void *data, size_t size, void **mh)
{
    int fd = dev_dmabuf(data, size);
    if (fd < 0)
        return ncclSystemError;
    ncclResult_t r = d_reg_dmabuf(comm, data, size, NCCL_PTR_CUDA, 0, fd, mh);
    close(fd);
    return r;
}

/* Flushes the receive of n buffers that got got[i] bytes, as NCCL does before its kernel reads
 * device memory: iflush, and test until done when it gave a request. */
int flush_recv(void *rc, int n, void **data, const int *got, void **mhs, int *flushes)
{
    int sizes[MAX_RECVS_WANTED];
    void *req = (void *)0x1;
    for (int i = 0; i < n; i++)
        sizes[i] = got[i];
    NCCL_OK("iflush", d_iflush(rc, n, data, sizes, mhs, &req));
    CHECK("iflush", req != (void *)0x1, "iflush left the request unset");
    if (req)
        NCCL_OK("iflush", wait_req(req, NULL, 30));
    (*flushes)++;
    return 0;
}

ncclResult_t d_dereg(void *comm, void *mh)
{
    return version >= 11 ? T(11)->deregMr(comm, mh) : T(9)->deregMr(comm, mh);
}

ncclResult_t d_isend(void *sc, void *data, size_t size, int tag, void *mh, void **req)
{
    *req = (void *)0x1; /* NCCL may leave a hint here; the plugin must overwrite it */
    switch (version) {
    case 12:
    case 11:
        return T(11)->isend(sc, data, size, tag, mh, NULL, req);
    case 10:
        return T(10)->isend(sc, data, size, tag, mh, NULL, req);
    case 9:
        return T(9)->isend(sc, data, size, tag, mh, req);
    default:
        return T(8)->isend(sc, data, (int)size, tag, mh, req);
    }
}

ncclResult_t d_irecv(void *rc, int n, void **data, size_t *sizes, int *tags, void **mhs, void **req)
{
    void *ph[MAX_RECVS_WANTED] = {0};
    int isizes[MAX_RECVS_WANTED];
    *req = (void *)0x1;
    switch (version) {
    case 12:
    case 11:
        return T(11)->irecv(rc, n, data, sizes, tags, mhs, ph, req);
    case 10:
        return T(10)->irecv(rc, n, data, sizes, tags, mhs, ph, req);
    case 9:
        return T(9)->irecv(rc, n, data, sizes, tags, mhs, req);
    default:
        for (int i = 0; i < n && i < MAX_RECVS_WANTED; i++)
            isizes[i] = (int)sizes[i];
        return T(8)->irecv(rc, n, data, isizes, tags, mhs, req);
    }
}

ncclResult_t d_iflush(void *rc, int n, void **data, int *sizes, void **mhs, void **req)
{
    return version >= 11 ? T(11)->iflush(rc, n, data, sizes, mhs, req)
                         : T(9)->iflush(rc, n, data, sizes, mhs, req);
}

ncclResult_t d_test(void *req, int *done, int *sizes)
{
    return version >= 11 ? T(11)->test(req, done, sizes) : T(9)->test(req, done, sizes);
}

ncclResult_t d_close_send(void *c)
{
    return version >= 11 ? T(11)->closeSend(c) : T(9)->closeSend(c);
}

ncclResult_t d_close_recv(void *c)
{
    return version >= 11 ? T(11)->closeRecv(c) : T(9)->closeRecv(c);
}

ncclResult_t d_close_listen(void *c)
{
    return version >= 11 ? T(11)->closeListen(c) : T(9)->closeListen(c);
}

/* Tests until done or a deadline; returns the result of the last test. */
ncclResult_t wait_req(void *req, int *sizes, double timeout_s)
{
    double end = now_s() + timeout_s;
    int done = 0;
    while (!done) {
        ncclResult_t r = d_test(req, &done, sizes);
        if (r != ncclSuccess)
            return r;
        if (!done && now_s() > end)
            return ncclInProgress; /* the driver's own "hung" */
    }
    return ncclSuccess;
}

/* ---- loading ---- */

const char *plugin_path(void)
{
    const char *path = getenv("NCCL_NET_PLUGIN");
    return path && strchr(path, '/') ? path : "libnccl-net-reshard.so";
}

int load(const char *want, int quiet)
{
    const char *path = plugin_path();
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    CHECK("load", lib, "dlopen(%s): %s", path, dlerror());
    for (int v = 12; v >= 8; v--) {
        if (strcmp(want, "auto") && atoi(want) != v)
            continue;
        char sym[32];
        snprintf(sym, sizeof(sym), "ncclNetPlugin_v%d", v);
        if ((table = dlsym(lib, sym))) {
            version = v;
            plugin_lib = lib;
            if (!quiet)
                printf("ok load %s %s\n", path, sym);
            return 0;
        }
    }
    fail("load", "no ncclNetPlugin_v%s in %s", want, path);
    dlclose(lib);
    return -1;
}

/* ---- properties, each version at its own offsets ---- */

#define CANARY 0xa5

/* Fills a buffer bigger than the version's struct and checks that nothing past it changed. */
static int check_props(int dev, char *name, size_t name_len)
{
    unsigned char buf[512];
    size_t size = version == 12   ? sizeof(ncclNetProperties_v12_t)
                  : version == 11 ? sizeof(ncclNetProperties_v11_t)
                  : version >= 9  ? sizeof(ncclNetProperties_v9_t)
                                  : sizeof(ncclNetProperties_v8_t);
    memset(buf, CANARY, sizeof(buf));
    ncclResult_t r = version >= 11  ? T(11)->getProperties(dev, (void *)buf)
                     : version >= 9 ? T(9)->getProperties(dev, (void *)buf)
                                    : T(8)->getProperties(dev, (void *)buf);
    CHECK("getProperties", r == ncclSuccess, "device %d: %d", dev, (int)r);
    for (size_t i = size; i < sizeof(buf); i++)
        CHECK("getProperties", buf[i] == CANARY, "v%d wrote byte %zu, past its %zu-byte properties",
              version, i, size);
    /* Every version starts the same way up to ptrSupport and regIsGlobal. */
    const ncclNetProperties_v8_t *p8 = (const void *)buf;
    CHECK("getProperties", p8->name && *p8->name, "device %d has no name", dev);
    const char *want_ptr = getenv("NET_EXPECT_PTR"); /* the tests' expectation (default host) */
    int ptr = want_ptr ? atoi(want_ptr) : NCCL_PTR_HOST;
    CHECK("getProperties", p8->ptrSupport == ptr, "ptrSupport %#x, want %#x", p8->ptrSupport, ptr);
    snprintf(name, name_len, "%s", p8->name);
    int speed, max_recvs, type;
    size_t p2p = 1, coll = 1;
    if (version == 8) {
        speed = p8->speed, max_recvs = p8->maxRecvs, type = p8->netDeviceType;
    } else if (version <= 11) {
        const ncclNetProperties_v11_t *p = (const void *)buf;
        speed = p->speed, max_recvs = p->maxRecvs, type = p->netDeviceType;
        p2p = p->maxP2pBytes, coll = p->maxCollBytes;
        CHECK("getProperties", p->vProps.ndevs == 1 && p->vProps.devs[0] == dev, "vProps {%d, %d}",
              p->vProps.ndevs, p->vProps.devs[0]);
        if (version == 11)
            CHECK("getProperties", p->maxMultiRequestSize >= 1, "maxMultiRequestSize %d",
                  p->maxMultiRequestSize);
    } else {
        const ncclNetProperties_v12_t *p = (const void *)buf;
        speed = p->speed, max_recvs = p->maxRecvs, type = p->netDeviceType;
        p2p = p->maxP2pBytes, coll = p->maxCollBytes;
        CHECK("getProperties", p->vProps.ndevs == 1 && p->vProps.devs[0] == dev, "vProps {%d, %d}",
              p->vProps.ndevs, p->vProps.devs[0]);
        /* Rails and planes are known for RDMA ports and PCI interfaces, else undefined. */
        CHECK("getProperties",
              p->maxMultiRequestSize >= 1 && p->railId >= NCCL_NET_ID_UNDEF &&
                  p->planeId >= NCCL_NET_ID_UNDEF &&
                  (p->pciPath || p->port > 0 || p->railId == NCCL_NET_ID_UNDEF),
              "maxMultiRequestSize %d railId %d planeId %d", p->maxMultiRequestSize, p->railId,
              p->planeId);
    }
    CHECK("getProperties", speed > 0, "speed %d Mbps", speed);
    CHECK("getProperties", max_recvs >= MAX_RECVS_WANTED, "maxRecvs %d", max_recvs);
    CHECK("getProperties", type == NCCL_NET_DEVICE_HOST, "netDeviceType %d", type);
    CHECK("getProperties", p2p > 0 && p2p <= (size_t)1 << 40 && coll > 0 && coll <= (size_t)1 << 40,
          "maxP2pBytes %zu maxCollBytes %zu", p2p, coll);
    printf("ok getProperties v%d dev %d %s %d Mbps pciPath %s maxRecvs %d ptrSupport %#x\n",
           version, dev, p8->name, speed, p8->pciPath ? p8->pciPath : "(none)", max_recvs,
           p8->ptrSupport);
    return 0;
}

int start(void **ctx, int *ndev)
{
    NCCL_OK("init", d_init(ctx));
    CHECK("init", version < 11 || *ctx, "v%d init gave no context", version);
    ok("init");
    NCCL_OK("devices", d_devices(ndev));
    CHECK("devices", *ndev >= 1, "%d devices (tests set RESHARD_NET_ALLOW_LO=1)", *ndev);
    /* Every version has getDeviceMr and irecvConsumed at v8's offsets; NCCL calls them only
     * when they are set, and HOST devices have nothing for them to do. */
    CHECK("table", !T(8)->getDeviceMr && !T(8)->irecvConsumed,
          "getDeviceMr %p, irecvConsumed %p: entries that do nothing must be NULL",
          (void *)T(8)->getDeviceMr, (void *)T(8)->irecvConsumed);
    ok("getDeviceMr and irecvConsumed are NULL");
    char names[16][64];
    for (int d = 0; d < *ndev && d < 16; d++) {
        if (check_props(d, names[d], sizeof(names[d])))
            return -1;
        for (int e = 0; e < d; e++)
            CHECK("getProperties", strcmp(names[d], names[e]), "devices %d and %d are both %s", e,
                  d, names[d]);
    }
    return 0;
}

/* Listener and connector in the same process, for the single-process cases. */
int pair(void *ctx, void **lc, void **sc, void **rc, unsigned char *handle)
{
    memset(handle, 0, NCCL_NET_HANDLE_MAXSIZE);
    NCCL_OK("listen", d_listen(ctx, 0, handle, lc));
    *sc = *rc = NULL;
    double end = now_s() + 30;
    while (!*sc || !*rc) {
        if (!*sc)
            NCCL_OK("connect", d_connect(ctx, 0, handle, sc));
        if (!*rc)
            NCCL_OK("accept", d_accept(*lc, rc));
        CHECK("connect", now_s() < end, "no connection within 30 s");
    }
    return 0;
}

/* ---- the two-process life cycle ---- */

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

enum die { DIE_NONE, DIE_SEND, DIE_RECV };

struct run {
    const char *handle_file;
    enum die die;
    size_t stream_mib;
    int device; /* --mem device */
};

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
#define MSG        (4 * MIB)
#define WINDOW     8
#define MANY       (32 * MAX_RECVS_WANTED)
#define MANY_BYTES 4096

static int recv_side(void *ctx, const struct run *run)
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

static int send_side(void *ctx, const struct run *run)
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
