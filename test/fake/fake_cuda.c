/* SPDX-License-Identifier: Apache-2.0 */
/* libcuda.so.1's calls that reshard makes, for one pretend device whose memory is the host's
 * (pointer queries fail, so every pointer reads as host memory). Device allocations are shared
 * memory (memfd), so that an IPC handle, naming the allocating process and its descriptor, can
 * be opened by another process through /proc/PID/fd. Events complete on their second query, so
 * that callers meet "not ready". Contexts are the device's primary one and those cuCtxCreate
 * makes, one current per thread (none at first); a stream belongs to the context current when it
 * was made (cuStreamGetCtx). FAKE_CUDA_FAIL=symbol[:N] makes that call fail (with error 999)
 * from its Nth call on (default: the first). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cuda/delta_desc.h"
#include "cuda/pack_desc.h"

#define API __attribute__((visibility("default")))

#define FAKE_ERROR         999 /* CUDA_ERROR_UNKNOWN */
#define FAKE_NOT_READY     600
#define FAKE_INVALID_VALUE 1
#define FAKE_INVALID_CTX   201 /* CUDA_ERROR_INVALID_CONTEXT */

/* A context: the primary one, or one of cuCtxCreate's. */
struct fake_ctx {
    unsigned magic;
};
#define CTX_MAGIC    0x63747846u
#define STREAM_MAGIC 0x73747246u
static struct fake_ctx context = {CTX_MAGIC};
static __thread struct fake_ctx *current; /* the calling thread's current context */

static int fails(const char *symbol)
{
    const char *f = getenv("FAKE_CUDA_FAIL");
    size_t n = strlen(symbol);
    if (!f || strncmp(f, symbol, n) || (f[n] && f[n] != ':'))
        return 0;
    static int calls; /* one failing symbol per process */
    return ++calls >= (f[n] == ':' ? atoi(f + n + 1) : 1);
}

/* For tests: bytes copied between host and device (synchronous copies). */
static unsigned long long dtoh_bytes, htod_bytes;

/* Device allocations and mappings of other processes' ones. */
struct fake_alloc {
    char *base;
    size_t bytes;
    int fd;                    /* ours, -1 for a mapping of another process's, -2 for a cuMemMap */
    int in_use;                /* a slot may be reused once freed */
    unsigned long long handle; /* cuMemMap: the physical allocation mapped */
    unsigned long long id;     /* unique in the process (CU_POINTER_ATTRIBUTE_BUFFER_ID) */
};
static unsigned long long next_id = 1;
static struct fake_alloc allocs[4096];

static struct fake_alloc *find(uint64_t p)
{
    for (int i = 0; i < 4096; i++) {
        struct fake_alloc *a = &allocs[i];
        if (a->in_use && (uint64_t)(uintptr_t)a->base <= p &&
            p < (uint64_t)(uintptr_t)a->base + a->bytes)
            return a;
    }
    return NULL;
}

static struct fake_alloc *slot(void)
{
    for (int i = 0; i < 4096; i++)
        if (!allocs[i].in_use)
            return &allocs[i];
    return NULL;
}

/* For tests: mappings of other processes' allocations opened and closed so far. */
static int ipc_opens, ipc_closes;

API int fake_cuda_ipc_opens(void)
{
    return ipc_opens;
}

API int fake_cuda_ipc_closes(void)
{
    return ipc_closes;
}

struct fake_handle {
    char magic[8];
    int32_t pid, fd;
    uint64_t bytes;
    uint64_t id; /* the allocation's: descriptor numbers are reused, handles are not */
};

API int cuInit(unsigned flags)
{
    (void)flags;
    return 0;
}

API int cuGetErrorString(int err, const char **s)
{
    *s = err ? "fake error" : "no error";
    return 0;
}

API int cuDeviceGetCount(int *n)
{
    *n = 1;
    return 0;
}

API int cuDeviceGet(int *dev, int ordinal)
{
    *dev = ordinal;
    return ordinal == 0 ? 0 : 101;
}

API int cuDevicePrimaryCtxRetain(void **ctx, int dev)
{
    (void)dev;
    *ctx = &context;
    return 0;
}

API int cuCtxGetCurrent(void **ctx)
{
    *ctx = current; /* NULL until a thread sets one: reshard then retains and sets the primary */
    return 0;
}

API int cuCtxSetCurrent(void *ctx)
{
    struct fake_ctx *c = ctx;
    if (c && c->magic != CTX_MAGIC)
        return FAKE_INVALID_CTX;
    current = c;
    return 0;
}

/* Another context on the device, made current (as the driver does). */
API int cuCtxCreate_v2(void **ctx, unsigned flags, int dev)
{
    (void)flags;
    struct fake_ctx *c = dev == 0 ? malloc(sizeof(*c)) : NULL;
    if (!c)
        return dev == 0 ? 2 : 101;
    c->magic = CTX_MAGIC;
    *ctx = current = c;
    return 0;
}

API int cuCtxDestroy_v2(void *ctx)
{
    struct fake_ctx *c = ctx;
    if (!c || c == &context || c->magic != CTX_MAGIC)
        return FAKE_INVALID_CTX;
    if (current == c)
        current = NULL;
    c->magic = 0;
    free(c);
    return 0;
}

/* Only an allocation's id (CU_POINTER_ATTRIBUTE_BUFFER_ID) is known; other queries fail, so
 * that every pointer reads as host memory. FAKE_CUDA_MEMORY_TYPE=1 also answers the memory
 * type (CU_POINTER_ATTRIBUTE_MEMORY_TYPE: device) of allocations, for tests of callers that
 * tell device memory from host memory. */
API int cuPointerGetAttribute(void *data, int attr, uint64_t ptr)
{
    const char *typed = getenv("FAKE_CUDA_MEMORY_TYPE");
    int type_query = attr == 2 && typed && !strcmp(typed, "1");
    struct fake_alloc *a = attr == 7 || type_query ? find(ptr) : NULL;
    if (!a)
        return 1; /* CUDA_ERROR_INVALID_VALUE: not the driver's memory */
    if (type_query)
        *(unsigned *)data = 2; /* CU_MEMORYTYPE_DEVICE */
    else
        *(unsigned long long *)data = a->id;
    return 0;
}

/* The stand-in's dma-buf of a device range: a descriptor of the memfd behind the allocation,
 * whose offset 0 is the range's start as in a real dma-buf, so the range must start at the
 * allocation's start and lie inside it. */
API int cuMemGetHandleForAddressRange(void *handle, uint64_t ptr, size_t size, int type,
                                      unsigned long long flags)
{
    struct fake_alloc *a = find(ptr);
    if (fails("cuMemGetHandleForAddressRange") || type != 1 || flags)
        return FAKE_ERROR;
    if (!a || a->fd < 0 || ptr != (uint64_t)(uintptr_t)a->base || size > a->bytes)
        return FAKE_INVALID_VALUE;
    int fd = fcntl(a->fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0)
        return FAKE_ERROR;
    *(int *)handle = fd;
    return 0;
}

API int cuMemAlloc_v2(uint64_t *p, size_t n)
{
    if (fails("cuMemAlloc_v2"))
        return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
    struct fake_alloc *a = slot();
    int fd = a ? memfd_create("fake-cuda", MFD_CLOEXEC) : -1;
    if (fd < 0 || ftruncate(fd, (off_t)(n ? n : 1))) {
        if (fd >= 0)
            close(fd);
        return 2;
    }
    void *m = mmap(NULL, n ? n : 1, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        close(fd);
        return 2;
    }
    *a = (struct fake_alloc){m, n ? n : 1, fd, 1, 0, next_id++};
    *p = (uint64_t)(uintptr_t)m;
    return 0;
}

API int cuMemFree_v2(uint64_t p)
{
    struct fake_alloc *a = find(p);
    if (!a || a->fd < 0 || (uint64_t)(uintptr_t)a->base != p)
        return FAKE_INVALID_VALUE;
    munmap(a->base, a->bytes);
    close(a->fd);
    a->in_use = 0;
    return 0;
}

API int cuMemGetAddressRange_v2(uint64_t *base, size_t *bytes, uint64_t p)
{
    struct fake_alloc *a = find(p);
    if (!a || fails("cuMemGetAddressRange_v2"))
        return a ? FAKE_ERROR : FAKE_INVALID_VALUE;
    *base = (uint64_t)(uintptr_t)a->base;
    *bytes = a->bytes;
    return 0;
}

API int cuIpcGetMemHandle(struct fake_handle *h, uint64_t p)
{
    struct fake_alloc *a = find(p);
    if (!a || a->fd < 0 || (uint64_t)(uintptr_t)a->base != p)
        return FAKE_INVALID_VALUE; /* cuMemCreate memory included, as the driver does */
    if (fails("cuIpcGetMemHandle"))
        return 801; /* CUDA_ERROR_NOT_SUPPORTED, as for allocations that cannot be shared */
    memset(h, 0, 64);
    memcpy(h->magic, "fakeipc", 8);
    h->pid = (int32_t)getpid();
    h->fd = a->fd;
    h->bytes = a->bytes;
    h->id = a->id;
    return 0;
}

/* The handle by value, as the driver takes it. */
struct fake_handle_bytes {
    char b[64];
};

API int cuIpcOpenMemHandle_v2(uint64_t *p, struct fake_handle_bytes hb, unsigned flags)
{
    (void)flags;
    struct fake_handle h;
    memcpy(&h, hb.b, sizeof(h));
    if (memcmp(h.magic, "fakeipc", 8))
        return 400; /* CUDA_ERROR_INVALID_HANDLE */
    if (h.pid == getpid())
        return 201; /* CUDA_ERROR_INVALID_CONTEXT: a process cannot open its own */
    if (fails("cuIpcOpenMemHandle_v2"))
        return FAKE_ERROR;
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", h.pid, h.fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    struct fake_alloc *a = slot();
    void *m =
        fd >= 0 && a ? mmap(NULL, h.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    if (fd >= 0)
        close(fd);
    if (m == MAP_FAILED)
        return 205; /* CUDA_ERROR_MAP_FAILED */
    *a = (struct fake_alloc){m, h.bytes, -1, 1, 0, next_id++};
    *p = (uint64_t)(uintptr_t)m;
    ipc_opens++;
    return 0;
}

API int cuIpcCloseMemHandle(uint64_t p)
{
    struct fake_alloc *a = find(p);
    if (!a || a->fd >= 0 || (uint64_t)(uintptr_t)a->base != p)
        return FAKE_INVALID_VALUE;
    munmap(a->base, a->bytes);
    a->in_use = 0;
    ipc_closes++;
    return 0;
}

/* ---- the virtual memory management calls: physical allocations are memfds ---- */

struct fake_phys {
    int fd, types, refs;
    size_t bytes;
};
static struct fake_phys phys[1024]; /* handle h is phys[h - 1]; refs 0: free */
static int vmm_imports;

API int fake_cuda_vmm_imports(void)
{
    return vmm_imports;
}

struct fake_prop { /* CUmemAllocationProp */
    int type, types;
    int loc_type, loc_id;
    void *win32;
    unsigned char flags[8];
};

static unsigned long long new_phys(int fd, size_t bytes, int types)
{
    for (int i = 0; i < 1024; i++)
        if (!phys[i].refs) {
            phys[i] = (struct fake_phys){fd, types, 1, bytes};
            return (unsigned long long)i + 1;
        }
    return 0;
}

static struct fake_phys *get_phys(unsigned long long h)
{
    return h >= 1 && h <= 1024 && phys[h - 1].refs ? &phys[h - 1] : NULL;
}

API int cuMemCreate(unsigned long long *h, size_t bytes, const struct fake_prop *prop,
                    unsigned long long flags)
{
    (void)flags;
    int fd = memfd_create("fake-cuda-vmm", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)bytes) || !(*h = new_phys(fd, bytes, prop->types))) {
        if (fd >= 0)
            close(fd);
        return 2;
    }
    return 0;
}

API int cuMemRelease(unsigned long long h)
{
    struct fake_phys *ph = get_phys(h);
    if (!ph)
        return FAKE_INVALID_VALUE;
    if (--ph->refs == 0)
        close(ph->fd);
    return 0;
}

API int cuMemAddressReserve(uint64_t *p, size_t bytes, size_t align, uint64_t addr,
                            unsigned long long flags)
{
    (void)align, (void)addr, (void)flags;
    void *m = mmap(NULL, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    *p = (uint64_t)(uintptr_t)m;
    return m == MAP_FAILED ? 2 : 0;
}

API int cuMemAddressFree(uint64_t p, size_t bytes)
{
    return munmap((void *)(uintptr_t)p, bytes) ? FAKE_INVALID_VALUE : 0;
}

API int cuMemMap(uint64_t p, size_t bytes, size_t offset, unsigned long long h,
                 unsigned long long flags)
{
    (void)flags;
    struct fake_phys *ph = get_phys(h);
    struct fake_alloc *a = slot();
    if (!ph || !a || offset + bytes > ph->bytes)
        return FAKE_INVALID_VALUE;
    void *m = mmap((void *)(uintptr_t)p, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                   ph->fd, (off_t)offset);
    if (m == MAP_FAILED)
        return 205;
    ph->refs++;
    *a = (struct fake_alloc){m, bytes, -2, 1, h, next_id++};
    return 0;
}

API int cuMemUnmap(uint64_t p, size_t bytes)
{
    struct fake_alloc *a = find(p);
    if (!a || a->fd != -2 || (uint64_t)(uintptr_t)a->base != p || a->bytes != bytes)
        return FAKE_INVALID_VALUE;
    mmap(a->base, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    cuMemRelease(a->handle);
    a->in_use = 0;
    return 0;
}

API int cuMemSetAccess(uint64_t p, size_t bytes, const void *desc, size_t count)
{
    (void)desc, (void)count;
    struct fake_alloc *a = find(p);
    return a && a->fd == -2 && a->bytes >= bytes ? 0 : FAKE_INVALID_VALUE;
}

static int rdma_flushes;

API int fake_cuda_rdma_flushes(void)
{
    return rdma_flushes;
}

API int cuFlushGPUDirectRDMAWrites(int target, int scope)
{
    if (target != 0 || scope != 100)
        return FAKE_INVALID_VALUE;
    rdma_flushes++;
    return 0;
}

API int cuCtxGetDevice(int *dev)
{
    *dev = 0;
    return 0;
}

API int cuMemRetainAllocationHandle(unsigned long long *h, void *addr)
{
    struct fake_alloc *a = find((uint64_t)(uintptr_t)addr);
    if (!a || a->fd != -2)
        return FAKE_INVALID_VALUE;
    get_phys(a->handle)->refs++;
    *h = a->handle;
    return 0;
}

API int cuMemGetAllocationPropertiesFromHandle(struct fake_prop *prop, unsigned long long h)
{
    struct fake_phys *ph = get_phys(h);
    if (!ph)
        return FAKE_INVALID_VALUE;
    *prop = (struct fake_prop){.type = 1, .types = ph->types, .loc_type = 1};
    return 0;
}

/* A fake fabric handle names the exporting process and its descriptor, like the IPC one. */
API int cuMemExportToShareableHandle(void *out, unsigned long long h, int type,
                                     unsigned long long flags)
{
    (void)flags;
    struct fake_phys *ph = get_phys(h);
    if (!ph || !(ph->types & type))
        return FAKE_INVALID_VALUE;
    if (type == 1) {
        /* the lowest free number from 500 on: reused as soon as it is closed, as a busy
         * process's would be */
        *(int *)out = fcntl(ph->fd, F_DUPFD_CLOEXEC, 500);
        return *(int *)out < 0 ? FAKE_ERROR : 0;
    }
    struct fake_handle fh = {.pid = (int32_t)getpid(), .fd = ph->fd, .bytes = ph->bytes};
    memcpy(fh.magic, "fakefab", 8);
    memset(out, 0, 64);
    memcpy(out, &fh, sizeof(fh));
    return 0;
}

API int cuMemImportFromShareableHandle(unsigned long long *h, void *os, int type)
{
    int fd = -1;
    size_t bytes = 0;
    if (type == 1) {
        struct stat st;
        fd = fcntl((int)(uintptr_t)os, F_DUPFD_CLOEXEC, 0);
        if (fd >= 0 && !fstat(fd, &st))
            bytes = (size_t)st.st_size;
    } else if (type == 8) {
        struct fake_handle fh;
        memcpy(&fh, os, sizeof(fh));
        if (memcmp(fh.magic, "fakefab", 8))
            return 400;
        char path[64];
        snprintf(path, sizeof(path), "/proc/%d/fd/%d", fh.pid, fh.fd);
        fd = open(path, O_RDWR | O_CLOEXEC);
        bytes = fh.bytes;
    }
    if (fd < 0 || !bytes || !(*h = new_phys(fd, bytes, type))) {
        if (fd >= 0)
            close(fd);
        return FAKE_INVALID_VALUE;
    }
    vmm_imports++;
    return 0;
}

API int cuMemAllocHost_v2(void **p, size_t n)
{
    *p = malloc(n ? n : 1);
    return *p ? 0 : 2;
}

API int cuMemFreeHost(void *p)
{
    free(p);
    return 0;
}

static int async_copies;

API int fake_cuda_async_copies(void)
{
    return async_copies;
}

API int cuMemcpyAsync(uint64_t dst, uint64_t src, size_t n, void *stream)
{
    (void)stream;
    if (fails("cuMemcpyAsync"))
        return FAKE_ERROR;
    async_copies++;
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    return 0;
}

/* For tests: 2-D copies made so far. */
static int copies_2d;

API int fake_cuda_copies_2d(void)
{
    return copies_2d;
}

/* CUDA_MEMCPY2D, as the driver lays it out. */
struct fake_memcpy2d {
    size_t src_x, src_y;
    int src_type;
    const void *src_host;
    uint64_t src_device;
    void *src_array;
    size_t src_pitch;
    size_t dst_x, dst_y;
    int dst_type;
    void *dst_host;
    uint64_t dst_device;
    void *dst_array;
    size_t dst_pitch;
    size_t width, height;
};

API int cuMemcpy2DAsync_v2(const struct fake_memcpy2d *p, void *stream)
{
    (void)stream;
    if (p->width > p->src_pitch || p->width > p->dst_pitch || p->src_array || p->dst_array)
        return FAKE_INVALID_VALUE;
    if (fails("cuMemcpy2DAsync_v2"))
        return FAKE_ERROR;
    const char *s = p->src_type == 1 ? p->src_host : (const char *)(uintptr_t)p->src_device;
    char *d = p->dst_type == 1 ? p->dst_host : (char *)(uintptr_t)p->dst_device;
    for (size_t y = 0; y < p->height; y++)
        memmove(d + (p->dst_y + y) * p->dst_pitch + p->dst_x,
                s + (p->src_y + y) * p->src_pitch + p->src_x, p->width);
    copies_2d++;
    if (p->src_type == 1 || p->dst_type == 1)
        *(p->src_type == 1 ? &htod_bytes : &dtoh_bytes) += p->width * p->height;
    return 0;
}

API int cuMemcpy2D_v2(const struct fake_memcpy2d *p)
{
    return cuMemcpy2DAsync_v2(p, NULL);
}

struct fake_stream {
    unsigned magic;
    struct fake_ctx *ctx; /* current when it was made */
};

API int cuStreamCreate(void **stream, unsigned flags)
{
    (void)flags;
    struct fake_stream *s = malloc(sizeof(*s));
    if (!s)
        return 2;
    /* the driver refuses without a current context; callers here made one or use the primary */
    *s = (struct fake_stream){STREAM_MAGIC, current ? current : &context};
    *stream = s;
    return 0;
}

API int cuStreamDestroy_v2(void *stream)
{
    struct fake_stream *s = stream;
    if (!s || s->magic != STREAM_MAGIC)
        return FAKE_INVALID_VALUE;
    s->magic = 0;
    free(s);
    return 0;
}

/* The legacy default stream (NULL, CU_STREAM_LEGACY) and the per-thread one
 * (CU_STREAM_PER_THREAD) belong to the current context. */
API int cuStreamGetCtx(void *stream, void **ctx)
{
    struct fake_stream *s = stream;
    if (!s || s == (void *)0x1 || s == (void *)0x2) {
        *ctx = current;
        return current ? 0 : FAKE_INVALID_CTX;
    }
    if (s->magic != STREAM_MAGIC)
        return FAKE_INVALID_VALUE;
    *ctx = s->ctx;
    return 0;
}

struct fake_event {
    int queries; /* since the last record */
};

API int cuEventCreate(struct fake_event **ev, unsigned flags)
{
    (void)flags;
    *ev = calloc(1, sizeof(**ev));
    return *ev ? 0 : 2;
}

API int cuEventRecord(struct fake_event *ev, void *stream)
{
    (void)stream;
    ev->queries = 0;
    return 0;
}

API int cuEventQuery(struct fake_event *ev)
{
    if (fails("cuEventQuery"))
        return FAKE_ERROR;
    return ev->queries++ ? 0 : FAKE_NOT_READY;
}

API int cuEventDestroy_v2(struct fake_event *ev)
{
    free(ev);
    return 0;
}

API int cuMemcpyHtoD_v2(uint64_t dst, const void *src, size_t n)
{
    if (fails("cuMemcpyHtoD_v2"))
        return FAKE_ERROR;
    htod_bytes += n;
    memcpy((void *)(uintptr_t)dst, src, n);
    return 0;
}

API unsigned long long fake_cuda_dtoh_bytes(void)
{
    return dtoh_bytes;
}

API unsigned long long fake_cuda_htod_bytes(void)
{
    return htod_bytes;
}

API int cuMemcpyDtoH_v2(void *dst, uint64_t src, size_t n)
{
    if (fails("cuMemcpyDtoH_v2"))
        return FAKE_ERROR;
    dtoh_bytes += n;
    memcpy(dst, (const void *)(uintptr_t)src, n);
    return 0;
}

API int cuStreamSynchronize(void *stream)
{
    (void)stream;
    return 0;
}

API int cuCtxSynchronize(void)
{
    return 0;
}

API int cuMemcpyDtoD_v2(uint64_t dst, uint64_t src, size_t n)
{
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    return 0;
}

/* The pack kernels run on the host: any fatbin loads, and rs_pack / rs_unpack move element by
 * element through the index function the real kernels use (cuda/pack_desc.h), so the
 * executor's kernel path runs here; the kernels themselves are tested on a GPU. */
static int module, pack_fn, unpack_fn, quant_fn, launches, quant_launches;
static int delta_mask_fn, delta_scan_fn, delta_compact_fn, delta_lengths_fn, delta_count_fn,
    delta_apply_fn, delta_launches;

/* Launches of the delta kernels (counted in fake_cuda_launches too). */
API int fake_cuda_delta_launches(void)
{
    return delta_launches;
}

API int fake_cuda_launches(void)
{
    return launches;
}

/* Launches of rs_quant (counted in fake_cuda_launches too). */
API int fake_cuda_quant_launches(void)
{
    return quant_launches;
}

API int cuModuleLoadData(void **mod, const void *image)
{
    static const unsigned char magic[4] = {0x50, 0xed, 0x55, 0xba};
    if (!image || memcmp(image, magic, 4))
        return 200; /* CUDA_ERROR_INVALID_IMAGE */
    *mod = &module;
    return 0;
}

API int cuModuleGetFunction(void **f, void *mod, const char *name)
{
    if (mod != &module)
        return 400;
    *f = !strcmp(name, "rs_pack")            ? (void *)&pack_fn
         : !strcmp(name, "rs_unpack")        ? &unpack_fn
         : !strcmp(name, "rs_quant")         ? &quant_fn
         : !strcmp(name, "rs_delta_mask")    ? &delta_mask_fn
         : !strcmp(name, "rs_delta_scan")    ? &delta_scan_fn
         : !strcmp(name, "rs_delta_compact") ? &delta_compact_fn
         : !strcmp(name, "rs_delta_lengths") ? &delta_lengths_fn
         : !strcmp(name, "rs_delta_count")   ? &delta_count_fn
         : !strcmp(name, "rs_delta_apply")   ? &delta_apply_fn
                                             : NULL;
    return *f ? 0 : 500; /* CUDA_ERROR_NOT_FOUND */
}

/* rs_quant, one block after the other, through the kernel's helpers and quant.h. params: the
 * descriptor, the source, the FP8 codes, the scales. */
static void quant_run(void **params)
{
    const struct rs_quant_desc *d = params[0];
    const void *src = *(void **)params[1];
    uint8_t *dst = *(uint8_t **)params[2];
    float *scales = *(float **)params[3];
    enum rs_fp8 f = (enum rs_fp8)d->fp8;
    for (int64_t k = 0; k < rs_quant_nblocks(d); k++) {
        struct rs_quant_block q;
        rs_quant_block_of(d, k, &q);
        float scale;
        if (d->mode & RS_QUANT_SCALES) {
            float amax = 0;
            for (int64_t r = 0; r < q.nr; r++)
                for (int64_t c = 0; c < q.nc; c++)
                    amax = rs_amax_step(amax, rs_quant_load(d, src, &q, r, c));
            scales[q.at] = scale = rs_fp8_scale(amax, f);
        } else {
            scale = scales[q.at];
        }
        if (d->mode & RS_QUANT_CAST)
            for (int64_t r = 0; r < q.nr; r++)
                for (int64_t c = 0; c < q.nc; c++)
                    dst[rs_quant_dst(d, &q, r, c)] =
                        rs_f32_to_fp8(rs_quant_load(d, src, &q, r, c) / scale, f);
    }
    quant_launches++;
}

/* The delta kernels (cuda/delta_desc.h), one word, run or element after the other, through the
 * steps the kernels run; the mask step builds each word bit by bit from the same compare the
 * kernel's warp votes use. params: the descriptor (the scan's: the arrays, their length,
 * whether it then chooses). */
static int delta_run(void *f, void **params)
{
    const struct rs_delta_desc *d = params[0];
    if (f == &delta_mask_fn) {
        for (int64_t k = 0; k < d->nwords; k++) {
            uint64_t w = 0;
            for (int j = 0; j < 64; j++)
                w |= (uint64_t)rs_delta_differs(d, 64 * k + j) << j;
            rs_delta_mask_done(d, k, w);
        }
    } else if (f == &delta_scan_fn) {
        uint32_t *a = *(uint32_t **)params[1], *b = *(uint32_t **)params[2];
        int64_t m = *(int64_t *)params[3];
        uint32_t ra = 0, rb = 0;
        for (int64_t i = 0; i < m; i++) {
            uint32_t va = a[i];
            a[i] = ra;
            ra += va;
            if (b) {
                uint32_t vb = b[i];
                b[i] = rb;
                rb += vb;
            }
        }
        a[m] = ra;
        if (b)
            b[m] = rb;
        if (*(int *)params[4])
            rs_delta_choose(d);
    } else if (f == &delta_compact_fn) {
        for (int64_t k = 0; k < d->nwords; k++)
            rs_delta_compact_word(d, k);
    } else if (f == &delta_lengths_fn) {
        for (int64_t r = 0; r < (int64_t)d->info->nruns; r++)
            rs_delta_run_length(d, r);
    } else if (f == &delta_count_fn) {
        for (int64_t k = 0; k < rs_delta_count_n(d); k++)
            rs_delta_count_one(d, k);
    } else if (f == &delta_apply_fn) {
        if (rs_delta_kind_of(d) == RS_DELTA_BITMAP)
            for (int64_t k = 0; k < d->nwords; k++)
                rs_delta_apply_word(d, k);
        else
            for (int64_t r = 0; r < (int64_t)d->nruns; r++)
                for (int64_t e = 0; e < rs_delta_run_len(d, r); e++)
                    rs_delta_apply_run(d, r, e);
    } else {
        return 0;
    }
    delta_launches++;
    launches++;
    return 1;
}

/* params: the descriptor, the buffer, the packed bytes, whether rows are contiguous. */
API int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                       unsigned bz, unsigned shared, void *stream, void **params, void **extra)
{
    (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shared, (void)stream;
    (void)extra;
    if (f != &pack_fn && f != &unpack_fn && f != &quant_fn && f != &delta_mask_fn &&
        f != &delta_scan_fn && f != &delta_compact_fn && f != &delta_lengths_fn &&
        f != &delta_count_fn && f != &delta_apply_fn)
        return 400; /* CUDA_ERROR_INVALID_HANDLE */
    if (fails("cuLaunchKernel"))
        return FAKE_ERROR;
    if (delta_run(f, params))
        return 0;
    if (f == &quant_fn) {
        quant_run(params);
        launches++;
        return 0;
    }
    const struct rs_pack_desc *d = params[0];
    char *buf = *(char **)params[1], *packed = *(char **)params[2];
    size_t es = (size_t)d->esize;
    for (int64_t e = 0; e < d->numel; e++) {
        char *at = buf + (size_t)rs_pack_offset(d, e) * es, *p = packed + (size_t)e * es;
        if (f == &pack_fn)
            memcpy(p, at, es);
        else
            memcpy(at, p, es);
    }
    launches++;
    return 0;
}
