/* SPDX-License-Identifier: Apache-2.0 */
/*
 * m2n_check: NCCL M2N's C API (plugin/m2n/nccl_m2n.h, libreshard-m2n.so) on a real GPU and a
 * real NCCL communicator (scripts/gpu-check.sh). One rank, as one GPU holds one NCCL rank:
 * both meshes are rank 0, so every transfer is NCCL's send to itself on the caller's stream.
 * It reshards 2-D and 3-D tensors in device memory (cuMemAlloc) in every placement M2N takes,
 * alone and in a group, through the extension, then checks M2N's refusal of an unnamed dtype
 * and of a stream of another CUDA context (made with cuCtxCreate on the same device);
 * every element is copied back and checked. Prints the count and exits 0 only when none is
 * wrong; 77 when there is no CUDA driver or NCCL here.
 *
 *   m2n_check [MiB]        (the 2-D tensor's size, default 64)
 * libcuda and libnccl are loaded at run time (RESHARD_CUDA_LIB / RESHARD_NCCL_LIB name others:
 * make test runs it on the stand-ins of test/fake).
 */
#include "plugin/m2n/nccl_m2n.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct unique_id {
    char internal[128];
};

static void *sym(void *h, const char *name)
{
    void *p = dlsym(h, name);
    if (!p) {
        fprintf(stderr, "m2n_check: %s is missing\n", name);
        exit(2);
    }
    return p;
}

static void *open_lib(const char *env, const char *dflt)
{
    const char *file = getenv(env) && *getenv(env) ? getenv(env) : dflt;
    void *h = dlopen(file, RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        fprintf(stderr, "m2n_check: %s\n", dlerror());
        exit(77);
    }
    return h;
}

#define CHECK(call, what)                                                                          \
    do {                                                                                           \
        int rc_ = (int)(call);                                                                     \
        if (rc_) {                                                                                 \
            fprintf(stderr, "m2n_check: %s failed (%d) %s\n", what, rc_, ncclM2nGetLastError());   \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static int (*cu_alloc)(uint64_t *, size_t);
static int (*cu_free)(uint64_t);
static int (*cu_htod)(uint64_t, const void *, size_t);
static int (*cu_dtoh)(void *, uint64_t, size_t);
static int (*cu_sync)(void *);

struct pair {
    ncclMesh_t mesh;
    ncclDistTensor_t src, dst;
    uint64_t s, d;
    size_t bytes;
};

/* A tensor of `shape` on rank 0 alone, src placements ps, dst pd (1x1 meshes: any placement
 * is the whole tensor), int32 elements = their index. */
static void pair_make(struct pair *p, int ndims, const size_t *shape, const int *ps, const int *pd,
                      uint32_t *host)
{
    memset(p, 0, sizeof(*p));
    p->mesh = (ncclMesh_t){{1, 1}, 0};
    size_t n = 1;
    for (int d = 0; d < ndims; d++)
        n *= shape[d];
    p->bytes = n * 4;
    for (size_t i = 0; i < n; i++)
        host[i] = (uint32_t)(i * 2654435761u);
    CHECK(cu_alloc(&p->s, p->bytes), "cuMemAlloc");
    CHECK(cu_alloc(&p->d, p->bytes), "cuMemAlloc");
    CHECK(cu_htod(p->s, host, p->bytes), "cuMemcpyHtoD");
    for (int side = 0; side < 2; side++) {
        ncclDistTensor_t *t = side ? &p->dst : &p->src;
        t->dataPtr = (void *)(uintptr_t)(side ? p->d : p->s);
        for (int d = 0; d < ndims; d++)
            t->localShape[d] = shape[d];
        t->ndims = ndims;
        t->dtype = ncclInt32;
        t->mesh = &p->mesh;
        t->placements[0] = (side ? pd : ps)[0];
        t->placements[1] = (side ? pd : ps)[1];
    }
}

static long pair_check(struct pair *p, uint32_t *host)
{
    CHECK(cu_dtoh(host, p->d, p->bytes), "cuMemcpyDtoH");
    long wrong = 0;
    for (size_t i = 0; i < p->bytes / 4; i++)
        wrong += host[i] != (uint32_t)(i * 2654435761u);
    cu_free(p->s);
    cu_free(p->d);
    return wrong;
}

int main(int argc, char **argv)
{
    long mib = argc > 1 ? atol(argv[1]) : 64;
    if (mib < 1 || mib > 16384) {
        fprintf(stderr, "usage: m2n_check [MiB, 1..16384]\n");
        return 2;
    }
    void *cu = open_lib("RESHARD_CUDA_LIB", "libcuda.so.1");
    void *nc = open_lib("RESHARD_NCCL_LIB", "libnccl.so.2");
    int (*cu_init)(unsigned) = sym(cu, "cuInit");
    int (*cu_device_get)(int *, int) = sym(cu, "cuDeviceGet");
    int (*cu_retain)(void **, int) = sym(cu, "cuDevicePrimaryCtxRetain");
    int (*cu_set)(void *) = sym(cu, "cuCtxSetCurrent");
    int (*cu_stream)(void **, unsigned) = sym(cu, "cuStreamCreate");
    int (*cu_stream_destroy)(void *) = sym(cu, "cuStreamDestroy_v2");
    int (*cu_ctx_create)(void **, unsigned, int) = sym(cu, "cuCtxCreate_v2");
    int (*cu_ctx_destroy)(void *) = sym(cu, "cuCtxDestroy_v2");
    cu_alloc = sym(cu, "cuMemAlloc_v2");
    cu_free = sym(cu, "cuMemFree_v2");
    cu_htod = sym(cu, "cuMemcpyHtoD_v2");
    cu_dtoh = sym(cu, "cuMemcpyDtoH_v2");
    cu_sync = sym(cu, "cuStreamSynchronize");
    int (*nccl_id)(void *) = sym(nc, "ncclGetUniqueId");
    int (*nccl_init)(void **, int, struct unique_id, int) = sym(nc, "ncclCommInitRank");
    int (*nccl_destroy)(void *) = sym(nc, "ncclCommDestroy");

    int dev;
    void *ctx, *ncomm, *stream;
    struct unique_id id;
    CHECK(cu_init(0), "cuInit");
    CHECK(cu_device_get(&dev, 0), "cuDeviceGet");
    CHECK(cu_retain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    CHECK(cu_set(ctx), "cuCtxSetCurrent");
    CHECK(cu_stream(&stream, 1 /* CU_STREAM_NON_BLOCKING */), "cuStreamCreate");
    CHECK(nccl_id(&id), "ncclGetUniqueId");
    CHECK(nccl_init(&ncomm, 1, id, 0), "ncclCommInitRank");
    ncclComm_t comm = (ncclComm_t)ncomm;
    cudaStream_t cs = (cudaStream_t)stream;

    ncclM2nHandle_t h;
    ncclM2nConfig_t cfg = NCCL_M2N_CONFIG_INITIALIZER;
    CHECK(ncclM2nInit(&h, &cfg), "ncclM2nInit");
    size_t rows = (size_t)mib * 256, big = (size_t)mib << 20;
    uint32_t *host = malloc(big > (1u << 20) ? big : (1u << 20));
    if (!host)
        return 1;
    static const int pl[][2] = {{-1, -1}, {0, -1}, {-1, 0}, {1, -1}, {-1, 1}, {2, -1}, {-1, 2}};
    long wrong = 0, calls = 0, elems = 0;
    struct pair p;
    /* the 2-D tensor (mib MiB) in each placement pair M2N takes, alone */
    const size_t shape2[] = {rows, 1024}, shape3[] = {16, 48, 64};
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 5; j++) {
            pair_make(&p, 2, shape2, pl[i], pl[j], host);
            CHECK(ncclReshard(h, comm, &p.src, &p.dst, cs), "ncclReshard");
            CHECK(cu_sync(cs), "cuStreamSynchronize");
            elems += (long)(p.bytes / 4), calls++;
            wrong += pair_check(&p, host);
        }
    /* the 3-D tensor in each pair, seven at a time in a group, on the default handle */
    struct pair g[7];
    for (int i = 0; i < 7; i++) {
        CHECK(ncclM2nGroupStart(), "ncclM2nGroupStart");
        for (int j = 0; j < 7; j++) {
            pair_make(&g[j], 3, shape3, pl[i], pl[j], host);
            CHECK(ncclReshardWithWindow(NULL, comm, NULL, &g[j].src, &g[j].dst, cs),
                  "ncclReshardWithWindow");
        }
        CHECK(ncclM2nGroupEnd(), "ncclM2nGroupEnd");
        CHECK(cu_sync(cs), "cuStreamSynchronize");
        for (int j = 0; j < 7; j++) {
            elems += (long)(g[j].bytes / 4), calls++;
            wrong += pair_check(&g[j], host);
        }
    }
    /* 4-D through the extension */
    reshard_m2n_tensor_t es = {.size = sizeof(es),
                               .ndims = 4,
                               .shape = {3, 5, 7, 11},
                               .dtype = ncclInt32,
                               .meshNdims = 3,
                               .meshDims = {1, 1, 1},
                               .placements = {0, 3, -1}};
    reshard_m2n_tensor_t ed = es;
    ed.placements[0] = 1, ed.placements[1] = 2;
    const size_t flat[] = {3 * 5 * 7 * 11};
    pair_make(&p, 1, flat, pl[0], pl[0], host);
    es.dataPtr = p.src.dataPtr, ed.dataPtr = p.dst.dataPtr;
    CHECK(reshard_m2n_reshard(h, comm, &es, &ed, cs), "reshard_m2n_reshard");
    CHECK(cu_sync(cs), "cuStreamSynchronize");
    elems += (long)(p.bytes / 4), calls++;
    wrong += pair_check(&p, host);
    /* what M2N refuses, refused the M2N way */
    pair_make(&p, 2, shape3, pl[0], pl[0], host);
    p.src.dtype = p.dst.dtype = (ncclDataType_t)12;
    int rc = ncclReshard(h, comm, &p.src, &p.dst, cs);
    int refused = rc == ncclInvalidArgument &&
                  strstr(ncclM2nGetLastError(), "src.dtype is 12, a dtype NCCL M2N does not name");
    pair_check(&p, host);
    /* a stream of another context on the same device: refused naming the stream, nothing runs */
    void *other, *ostream;
    CHECK(cu_ctx_create(&other, 0, dev), "cuCtxCreate");
    CHECK(cu_stream(&ostream, 1), "cuStreamCreate (the other context)");
    CHECK(cu_set(ctx), "cuCtxSetCurrent");
    pair_make(&p, 2, shape3, pl[0], pl[0], host);
    rc = ncclReshard(h, comm, &p.src, &p.dst, (cudaStream_t)ostream);
    int ctx_refused =
        rc == ncclInvalidArgument && strstr(ncclM2nGetLastError(), "not the communicator's");
    pair_check(&p, host);
    CHECK(cu_stream_destroy(ostream), "cuStreamDestroy");
    CHECK(cu_ctx_destroy(other), "cuCtxDestroy");
    CHECK(cu_set(ctx), "cuCtxSetCurrent");
    printf("m2n_check: %ld reshards through NCCL (2-D %ld MiB, 3-D, 4-D), %ld elements, "
           "#wrong %ld, unnamed dtype %s, stream of another context %s\n",
           calls, mib, elems, wrong, refused ? "refused" : "NOT refused",
           ctx_refused ? "refused" : "NOT refused");
    CHECK(ncclM2nFinalize(h), "ncclM2nFinalize");
    CHECK(ncclM2nFinalize(NULL), "ncclM2nFinalize");
    nccl_destroy(ncomm);
    free(host);
    return wrong || !refused || !ctx_refused ? 1 : 0;
}
