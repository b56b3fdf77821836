/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What every step of the conformance driver (net_driver.h) goes through: the reporting, the
 * plugin loaded as NCCL loads it, one interface over every ncclNet_vN table, device memory of
 * the CUDA driver $RESHARD_CUDA_LIB names, the properties checked, and a connected pair.
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
