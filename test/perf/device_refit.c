/* SPDX-License-Identifier: Apache-2.0 */
/*
 * device_refit: 4 processes sharing one GPU refit device buffers with the native executor
 * (scripts/gpu-check.sh): a tensor sharded by rows over ranks 0-1 is wanted whole by all four,
 * in two NVLink domains of 2 (RESHARD_DOMAIN_SIZE=2), so the plan has network slices and a
 * fan-out. Each rank makes
 * its CUDA context after the fork, fills its source on the device, and checks its destination
 * back on the host. The fan-out inside a domain goes through CUDA IPC (RESHARD_CUDA_IPC=1, the
 * default), the network slices through host staging. Three refits: prints each rank's #wrong,
 * the last refit's time and the bytes each path moved; exit 0 when all are right, 77 without a
 * GPU stack. make test runs it on the stand-in driver of test/fake. DEVICE_REFIT_VMM=1 makes the
 * destinations cuMemCreate allocations shared by POSIX descriptor (as PyTorch's expandable
 * segments), so that IPC goes through the import path. DEVICE_REFIT_CHANGED=PCT makes it a delta
 * refit (RESHARD_DELTA=1): between refits PCT % of the source elements change and destinations
 * keep what the last refit left; each refit is checked against the values it must leave, and
 * the last one's network bytes and time are printed (the device snapshots and kernels at work).
 *
 *   device_refit [MiB]     (default 64; the tensor's size)
 */
#include "plugin/reshard.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define RANKS 4

#define ITERS 3

struct result {
    int status;
    long wrong;
    double ms;
    reshard_comm_counters_t n; /* per refit */
    uint64_t last_net;         /* the last refit's network bytes out */
    char msg[200];
};

static void *sym(void *h, const char *name)
{
    void *p = dlsym(h, name);
    if (!p) {
        fprintf(stderr, "device_refit: %s is missing\n", name);
        exit(2);
    }
    return p;
}

static int changed_pct; /* DEVICE_REFIT_CHANGED */

static uint64_t mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15u;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

/* Element i of the whole tensor (row-major) after refit `it`: changed at refit j > 0 when
 * DEVICE_REFIT_CHANGED says so, to a value of j's. */
static float value_at(int64_t i, int it)
{
    float v = (float)(i % 999983) * 0.5f;
    for (int j = 1; j <= it; j++)
        if (mix((uint64_t)i * 31 + (uint64_t)j) % 100 < (uint64_t)changed_pct)
            v = (float)(i % 999983) * 0.5f + (float)j;
    return v;
}

/* A cuMemCreate allocation of at least n bytes (2 MiB granules), mapped read-write on device
 * 0, shareable by POSIX descriptor. The structures as cuda.h lays them out. */
static int vmm_alloc(void *cu, uint64_t *p, size_t n)
{
    struct {
        int type, types, loc_type, loc_id;
        void *win32;
        unsigned char flags[8];
    } prop = {1, 1, 1, 0, NULL, {0}};
    struct {
        int loc_type, loc_id, flags;
    } rw = {1, 0, 3};
    unsigned long long h;
    size_t size = (n + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1);
    int (*create)(unsigned long long *, size_t, const void *, unsigned long long) =
        sym(cu, "cuMemCreate");
    int (*reserve)(uint64_t *, size_t, size_t, uint64_t, unsigned long long) =
        sym(cu, "cuMemAddressReserve");
    int (*map)(uint64_t, size_t, size_t, unsigned long long, unsigned long long) =
        sym(cu, "cuMemMap");
    int (*access)(uint64_t, size_t, const void *, size_t) = sym(cu, "cuMemSetAccess");
    int (*release)(unsigned long long) = sym(cu, "cuMemRelease");
    return create(&h, size, &prop, 0) || reserve(p, size, 0, 0, 0) || map(*p, size, 0, h, 0) ||
           access(*p, size, &rw, 1) || release(h);
}

static int run_rank(const reshard_unique_id_t *id, int rank, long rows, void *cu,
                    struct result *out)
{
    int (*cu_init)(unsigned) = sym(cu, "cuInit");
    int (*cu_dev)(int *, int) = sym(cu, "cuDeviceGet");
    int (*cu_retain)(void **, int) = sym(cu, "cuDevicePrimaryCtxRetain");
    int (*cu_set)(void *) = sym(cu, "cuCtxSetCurrent");
    int (*cu_alloc)(uint64_t *, size_t) = sym(cu, "cuMemAlloc_v2");
    int (*cu_htod)(uint64_t, const void *, size_t) = sym(cu, "cuMemcpyHtoD_v2");
    int (*cu_dtoh)(void *, uint64_t, size_t) = sym(cu, "cuMemcpyDtoH_v2");
    int dev;
    void *ctx;
    if (cu_init(0) || cu_dev(&dev, 0) || cu_retain(&ctx, dev) || cu_set(ctx)) {
        snprintf(out->msg, sizeof(out->msg), "no CUDA context");
        return 1;
    }
    char src_spec[160], dst_spec[160];
    snprintf(src_spec, sizeof(src_spec), "shape=%ldx1024 dtype=f32 ranks=0-1 mesh=2 place=S(0)",
             rows);
    snprintf(dst_spec, sizeof(dst_spec), "shape=%ldx1024 dtype=f32 ranks=0-3 place=R", rows);
    reshard_layout_t *s, *d;
    reshard_comm_t *comm;
    reshard_plan_t *plan;
    if (reshard_layout_parse(src_spec, 0, &s) || reshard_layout_parse(dst_spec, 0, &d) ||
        reshard_comm_init_rank(id, rank, RANKS, &comm)) {
        snprintf(out->msg, sizeof(out->msg), "%s", reshard_last_error());
        return 1;
    }
    reshard_tensor_t t = {"w", s, d};
    if (reshard_comm_plan_create(comm, &t, 1, NULL, &plan)) {
        snprintf(out->msg, sizeof(out->msg), "%s", reshard_last_error());
        return 1;
    }
    size_t sb = 0, db = 0;
    reshard_layout_shard_bytes(s, rank, &sb);
    reshard_layout_shard_bytes(d, rank, &db);
    uint64_t dsrc = 0, ddst = 0;
    float *host = malloc(db);
    int64_t first = (int64_t)rank * (rows / 2) * 1024; /* ranks 0-1: their row halves */
    for (size_t i = 0; i < sb / 4; i++)
        host[i] = value_at(first + (int64_t)i, 0);
    const char *vmm = getenv("DEVICE_REFIT_VMM");
    int dst_failed = vmm && *vmm == '1' ? vmm_alloc(cu, &ddst, db) : cu_alloc(&ddst, db);
    if ((sb && (cu_alloc(&dsrc, sb) || cu_htod(dsrc, host, sb))) || dst_failed) {
        snprintf(out->msg, sizeof(out->msg), "device memory");
        return 1;
    }
    reshard_buffers_t b = {sb ? (void *)(uintptr_t)dsrc : NULL, sb, (void *)(uintptr_t)ddst, db,
                           RESHARD_MEM_CUDA};
    if (!changed_pct)
        memset(host, 0, db);
    for (int it = 0; it < ITERS && !out->status && !out->wrong; it++) {
        struct timespec t0, t1;
        if (!changed_pct) {
            cu_htod(ddst, host, db); /* zeros: each refit must write everything again */
        } else if (it && sb) {       /* the source changes; the destination keeps the last refit */
            for (size_t i = 0; i < sb / 4; i++)
                host[i] = value_at(first + (int64_t)i, it);
            cu_htod(dsrc, host, sb);
        }
        reshard_comm_counters_t c0, c1;
        reshard_comm_counters(comm, &c0);
        clock_gettime(CLOCK_MONOTONIC, &t0);
        out->status = reshard_plan_execute(plan, &b);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        reshard_comm_counters(comm, &c1);
        out->last_net = c1.net_out - c0.net_out;
        out->ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
        snprintf(out->msg, sizeof(out->msg), "%s", out->status ? reshard_last_error() : "");
        float *got = malloc(db);
        cu_dtoh(got, ddst, db);
        for (size_t i = 0; i < db / 4; i++)
            out->wrong += got[i] != value_at((int64_t)i, it);
        free(got);
    }
    reshard_comm_counters(comm, &out->n);
    reshard_plan_destroy(plan);
    if (!out->status)
        reshard_comm_destroy(comm);
    free(host);
    return out->status != 0 || out->wrong != 0;
}

int main(int argc, char **argv)
{
    long mib = argc > 1 ? atol(argv[1]) : 64;
    if (mib < 1 || mib > 16384) {
        fprintf(stderr, "usage: device_refit [MiB, 1..16384]\n");
        return 2;
    }
    const char *file = getenv("RESHARD_CUDA_LIB");
    void *cu = dlopen(file && *file ? file : "libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!cu) {
        printf("device_refit: %s\n", dlerror());
        return 77;
    }
    setenv("RESHARD_DOMAIN_SIZE", "2", 0);
    const char *pct = getenv("DEVICE_REFIT_CHANGED");
    changed_pct = pct ? atoi(pct) : 0;
    if (changed_pct < 0 || changed_pct > 100) {
        fprintf(stderr, "device_refit: DEVICE_REFIT_CHANGED is a percentage, not '%s'\n", pct);
        return 2;
    }
    if (changed_pct)
        setenv("RESHARD_DELTA", "1", 1);
    long rows = mib * 256 / 2 * 2; /* even: two row halves */
    reshard_unique_id_t id;
    if (reshard_get_unique_id(&id)) {
        fprintf(stderr, "device_refit: %s\n", reshard_last_error());
        return 1;
    }
    struct result *res =
        mmap(NULL, RANKS * sizeof(*res), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    pid_t pid[RANKS];
    for (int r = 0; r < RANKS; r++)
        if ((pid[r] = fork()) == 0)
            _exit(run_rank(&id, r, rows, cu, &res[r]));
    int bad = 0;
    uint64_t ipc = 0, last_net = 0;
    double slowest = 0;
    for (int r = 0; r < RANKS; r++) {
        int ws;
        waitpid(pid[r], &ws, 0);
        bad |= !WIFEXITED(ws) || WEXITSTATUS(ws);
        const reshard_comm_counters_t *n = &res[r].n;
        printf("device_refit: rank %d: %s, #wrong %ld, %.2f ms, per refit: net_out %.2f MiB, "
               "local_out %.2f MiB of which CUDA IPC %.2f MiB%s%s\n",
               r, reshard_strerror(res[r].status), res[r].wrong, res[r].ms,
               (double)n->net_out / ITERS / 1048576.0, (double)n->local_out / ITERS / 1048576.0,
               (double)n->ipc_out / ITERS / 1048576.0, res[r].msg[0] ? ": " : "", res[r].msg);
        ipc += res[r].n.ipc_out / ITERS;
        last_net += res[r].last_net;
        slowest = res[r].ms > slowest ? res[r].ms : slowest;
    }
    printf("device_refit: %ld MiB, device to device across %d processes, %.2f MiB per refit "
           "through CUDA IPC: %s; slowest rank %.2f ms\n",
           mib, RANKS, (double)ipc / 1048576.0, bad ? "FAILED" : "#wrong 0 on every rank", slowest);
    if (changed_pct)
        printf("device_refit: delta refits, %d%% changed between refits: the last refit sent "
               "%.2f MiB over the network in all (%.3f of the tensor), slowest rank %.2f ms\n",
               changed_pct, (double)last_net / 1048576.0,
               (double)last_net / (double)(mib * 1048576), slowest);
    return bad;
}
