/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nccl_check: a refit through real NCCL on one GPU (scripts/gpu-check.sh). One rank makes an
 * NCCL communicator, reshard_comm_init_nccl builds on it, and a plan moves device memory with
 * RESHARD_EXECUTOR=nccl (sends to itself: a single GPU holds one NCCL rank). Prints the time
 * and the number of wrong elements; exit 0 only when there are none.
 *
 *   nccl_check [MiB]        (default 256)
 * libcuda and libnccl are loaded at run time (RESHARD_CUDA_LIB / RESHARD_NCCL_LIB name others:
 * make test runs it on the stand-ins of test/fake).
 */
#include "plugin/reshard.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct unique_id {
    char internal[128]; /* ncclUniqueId: ncclCommInitRank takes it by value */
};

static void *sym(void *h, const char *name)
{
    void *p = dlsym(h, name);
    if (!p) {
        fprintf(stderr, "nccl_check: %s is missing\n", name);
        exit(2);
    }
    return p;
}

static void *open_lib(const char *env, const char *dflt)
{
    const char *file = getenv(env) && *getenv(env) ? getenv(env) : dflt;
    void *h = dlopen(file, RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        fprintf(stderr, "nccl_check: %s\n", dlerror());
        exit(77); /* no GPU stack here: skipped */
    }
    return h;
}

#define CHECK(call, what)                                                                          \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_) {                                                                                 \
            fprintf(stderr, "nccl_check: %s failed (%d)\n", what, rc_);                            \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

int main(int argc, char **argv)
{
    long mib = argc > 1 ? atol(argv[1]) : 256;
    if (mib < 1 || mib > 65536) {
        fprintf(stderr, "usage: nccl_check [MiB, 1..65536]\n");
        return 2;
    }
    setenv("RESHARD_EXECUTOR", "nccl", 1);
    void *cu = open_lib("RESHARD_CUDA_LIB", "libcuda.so.1");
    void *nc = open_lib("RESHARD_NCCL_LIB", "libnccl.so.2");
    int (*cu_init)(unsigned) = sym(cu, "cuInit");
    int (*cu_device_get)(int *, int) = sym(cu, "cuDeviceGet");
    int (*cu_retain)(void **, int) = sym(cu, "cuDevicePrimaryCtxRetain");
    int (*cu_set)(void *) = sym(cu, "cuCtxSetCurrent");
    int (*cu_alloc)(uint64_t *, size_t) = sym(cu, "cuMemAlloc_v2");
    int (*cu_free)(uint64_t) = sym(cu, "cuMemFree_v2");
    int (*cu_htod)(uint64_t, const void *, size_t) = sym(cu, "cuMemcpyHtoD_v2");
    int (*cu_dtoh)(void *, uint64_t, size_t) = sym(cu, "cuMemcpyDtoH_v2");
    int (*cu_sync)(void *) = sym(cu, "cuStreamSynchronize");
    int (*nccl_id)(void *) = sym(nc, "ncclGetUniqueId");
    int (*nccl_init)(void **, int, struct unique_id, int) = sym(nc, "ncclCommInitRank");
    int (*nccl_destroy)(void *) = sym(nc, "ncclCommDestroy");

    int dev;
    void *ctx, *ncomm;
    struct unique_id id;
    CHECK(cu_init(0), "cuInit");
    CHECK(cu_device_get(&dev, 0), "cuDeviceGet");
    CHECK(cu_retain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    CHECK(cu_set(ctx), "cuCtxSetCurrent");
    CHECK(nccl_id(&id), "ncclGetUniqueId");
    CHECK(nccl_init(&ncomm, 1, id, 0), "ncclCommInitRank");

    reshard_comm_t *comm;
    if (reshard_comm_init_nccl(ncomm, &comm) != RESHARD_OK) {
        fprintf(stderr, "nccl_check: %s\n", reshard_last_error());
        return 1;
    }
    long rows = mib * 256; /* x 1024 f32 = mib MiB */
    char spec[128];
    snprintf(spec, sizeof(spec), "shape=%ldx1024 dtype=f32 ranks=0 place=R", rows);
    reshard_layout_t *l;
    reshard_plan_t *plan;
    reshard_tensor_t t = {"w", NULL, NULL};
    if (reshard_layout_parse(spec, 0, &l) != RESHARD_OK) {
        fprintf(stderr, "nccl_check: %s\n", reshard_last_error());
        return 1;
    }
    t.src = t.dst = l;
    if (reshard_comm_plan_create(comm, &t, 1, NULL, &plan) != RESHARD_OK) {
        fprintf(stderr, "nccl_check: %s\n", reshard_last_error());
        return 1;
    }
    size_t bytes = (size_t)rows * 1024 * 4, n = bytes / 4;
    float *host = malloc(bytes);
    uint64_t src, dst;
    for (size_t i = 0; i < n; i++)
        host[i] = (float)(i % 1000003);
    CHECK(cu_alloc(&src, bytes), "cuMemAlloc");
    CHECK(cu_alloc(&dst, bytes), "cuMemAlloc");
    CHECK(cu_htod(src, host, bytes), "cuMemcpyHtoD");
    reshard_buffers_t b = {(void *)(uintptr_t)src, bytes, (void *)(uintptr_t)dst, bytes,
                           RESHARD_MEM_CUDA};
    double best = 1e30;
    for (int it = 0; it < 5; it++) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        if (reshard_plan_execute_stream(plan, &b, NULL) != RESHARD_OK) {
            fprintf(stderr, "nccl_check: %s\n", reshard_last_error());
            return 1;
        }
        CHECK(cu_sync(NULL), "cuStreamSynchronize");
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
        best = ms < best ? ms : best;
    }
    memset(host, 0, bytes);
    CHECK(cu_dtoh(host, dst, bytes), "cuMemcpyDtoH");
    long wrong = 0;
    for (size_t i = 0; i < n; i++)
        wrong += host[i] != (float)(i % 1000003);
    printf("nccl_check: %ld MiB through NCCL (RESHARD_EXECUTOR=nccl) in %.2f ms, %.1f GB/s, "
           "#wrong %ld\n",
           mib, best, (double)bytes / best / 1e6, wrong);
    reshard_plan_destroy(plan);
    reshard_layout_destroy(l);
    reshard_comm_destroy(comm);
    cu_free(src);
    cu_free(dst);
    nccl_destroy(ncomm);
    free(host);
    return wrong ? 1 : 0;
}
