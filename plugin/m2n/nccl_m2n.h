/* SPDX-License-Identifier: Apache-2.0 */
/*
 * NCCL M2N's C API (API version 2, the v0.2 release: handles, last-error detail, group calls),
 * implemented by reshard. Our own declarations, written from the facts of NVIDIA's published
 * nccl_m2n.h (names, signatures, struct members in order, macro values, return codes), so that
 * a program built against nccl_m2n links and runs unchanged against libreshard-m2n.so.
 * docs/integrations.md says what differs.
 *
 * Every call maps the two descriptors to reshard layouts, makes (once per ncclComm_t) a reshard
 * communicator on the NCCL one and (once per pair of descriptors, by their canonical hash) a
 * plan, and enqueues the refit on the stream as grouped ncclSend/ncclRecv on the caller's
 * communicator. What reshard does beyond M2N's limits (up to 8 tensor dims, any number of mesh
 * axes, several of them sharding, uneven torch.chunk shards) is reached through the extension
 * at the end of this header, never by changing M2N's structs.
 *
 * Errors follow M2N: ncclInvalidArgument for a bad descriptor, ncclInvalidUsage for misuse
 * (a group end with no group), ncclSystemError / ncclRemoteError / ncclInternalError for what
 * failed underneath; ncclM2nGetLastError() names the field and the rank. Descriptors are
 * compared across the ranks before anything moves, so a rank that disagrees, or that fails
 * its own checks, fails every rank with the same message instead of leaving them waiting.
 */
#ifndef RESHARD_NCCL_M2N_H
#define RESHARD_NCCL_M2N_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

/* NCCL's and CUDA's types, as nccl.h and cuda_runtime.h declare them, for callers that build
 * without those headers (reshard never needs them at build time). */
#ifndef NCCL_H_
typedef struct ncclComm *ncclComm_t;
typedef struct ncclWindow_vidmem *ncclWindow_t;
typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
    ncclNumResults = 8
} ncclResult_t;
typedef enum {
    ncclInt8 = 0,
    ncclChar = 0,
    ncclUint8 = 1,
    ncclInt32 = 2,
    ncclInt = 2,
    ncclUint32 = 3,
    ncclInt64 = 4,
    ncclUint64 = 5,
    ncclFloat16 = 6,
    ncclHalf = 6,
    ncclFloat32 = 7,
    ncclFloat = 7,
    ncclFloat64 = 8,
    ncclDouble = 8,
    ncclBfloat16 = 9,
    ncclFloat8e4m3 = 10,
    ncclFloat8e5m2 = 11,
} ncclDataType_t;
#endif
#if !defined(__DRIVER_TYPES_H__) && !defined(RESHARD_CUDA_STREAM_T)
#define RESHARD_CUDA_STREAM_T
typedef struct CUstream_st *cudaStream_t;
#endif

#define NCCL_M2N_API __attribute__((visibility("default")))

#ifdef __cplusplus
extern "C" {
#endif

/* ---- descriptors (M2N's, API version 2) ---- */

#define NCCL_RESHARD_MESH_NDIMS 2

/* One side's ranks: [startRank, startRank + dims[0] * dims[1]), row-major over the mesh. */
typedef struct ncclMesh_v2 {
    int dims[NCCL_RESHARD_MESH_NDIMS];
    int startRank;
} ncclMesh_t;

#define NCCL_RESHARD_REPLICATE (-1)
#define NCCL_RESHARD_SHARD(td) (td)

#define NCCL_RESHARD_MAX_TENSOR_DIMS 3

/* This rank's tile of one side. dataPtr is NULL exactly on ranks outside mesh; every rank
 * passes the side's localShape, ndims, dtype, mesh and placements. Shards are even: the global
 * size of dim d is localShape[d] times the mesh dims that shard d. */
typedef struct ncclDistTensor_v2 {
    void *dataPtr;
    size_t localShape[NCCL_RESHARD_MAX_TENSOR_DIMS];
    int ndims; /* 1 to 3 */
    ncclDataType_t dtype;
    const ncclMesh_t *mesh;
    int placements[NCCL_RESHARD_MESH_NDIMS]; /* NCCL_RESHARD_REPLICATE or NCCL_RESHARD_SHARD(d) */
} ncclDistTensor_t;

/* ---- configuration and handles ---- */

#define NCCL_M2N_CONFIG_UNDEF_INT INT_MIN
#define NCCL_M2N_API_MAGIC        0x4d324e32u /* 'M2N2' */
#define NCCL_M2N_API_VERSION      2u

typedef struct ncclM2nConfig_v2 {
    size_t size;
    unsigned int magic;
    unsigned int version;
    int maxCta; /* accepted and kept; reshard launches no reshard kernel of its own */
} ncclM2nConfig_t;

/* clang-format off */
#define NCCL_M2N_CONFIG_INITIALIZER \
    {sizeof(ncclM2nConfig_t), NCCL_M2N_API_MAGIC, NCCL_M2N_API_VERSION, NCCL_M2N_CONFIG_UNDEF_INT}
/* clang-format on */

typedef struct ncclM2nHandle *ncclM2nHandle_t;

/* *handle is set to NULL first, then to a new handle. config NULL: the defaults. A config
 * whose size, magic or version is not this header's: ncclInvalidArgument. */
NCCL_M2N_API ncclResult_t ncclM2nInit(ncclM2nHandle_t *handle, const ncclM2nConfig_t *config);
/* NULL finalizes the default handle (again and again is fine); an unknown or finalized handle
 * is ncclInvalidArgument, as is finalizing inside a group. When the last handle goes, the
 * cached plans and communicators go too: each communicator's destruction is collective over
 * its ranks (they all finalize, as at shutdown). */
NCCL_M2N_API ncclResult_t ncclM2nFinalize(ncclM2nHandle_t handle);
/* The calling thread's detail for its last failed call ("" when none), valid until its next
 * M2N call. */
NCCL_M2N_API const char *ncclM2nGetLastError(void);

/* ---- groups ---- */

/* Records the reshard calls until the matching ncclM2nGroupEnd (descriptors and meshes are
 * copied; the tensors stay the caller's). Nested groups flatten into the outermost. */
NCCL_M2N_API ncclResult_t ncclM2nGroupStart(void);
/* At the outermost level, issues what was recorded, in order; the first failure stops the rest
 * and its detail names the entry ("ncclM2nGroupEnd: entry 2 of 5 failed: ..."). No group:
 * ncclInvalidUsage. An empty group succeeds. */
NCCL_M2N_API ncclResult_t ncclM2nGroupEnd(void);
/* Drops every level of the group without issuing it; succeeds when none is active. */
NCCL_M2N_API ncclResult_t ncclM2nGroupAbort(void);

/* ---- resharding ---- */

/* Collective over comm's ranks. handle NULL: the default handle. The window is not needed
 * (reshard stages nothing in it) and is ignored. */
NCCL_M2N_API ncclResult_t ncclReshardWithWindow(ncclM2nHandle_t handle, ncclComm_t comm,
                                                ncclWindow_t window, const ncclDistTensor_t *src,
                                                const ncclDistTensor_t *dst, cudaStream_t stream);
NCCL_M2N_API ncclResult_t ncclReshard(ncclM2nHandle_t handle, ncclComm_t comm,
                                      const ncclDistTensor_t *src, const ncclDistTensor_t *dst,
                                      cudaStream_t stream);

/* ---- reshard's extension: what M2N's descriptors cannot say ---- */

#define RESHARD_M2N_MAX_DIMS 8

/* One side, with the GLOBAL shape: shards follow torch.chunk (uneven ones are fine, trailing
 * ranks may hold nothing), any mesh axes may shard, the same tensor dim on several axes nests
 * them as DTensor does. dataPtr may be NULL on a rank that holds nothing of this side. */
typedef struct reshard_m2n_tensor {
    size_t size; /* sizeof(reshard_m2n_tensor_t) */
    void *dataPtr;
    int ndims; /* 1 to RESHARD_M2N_MAX_DIMS */
    int64_t shape[RESHARD_M2N_MAX_DIMS];
    ncclDataType_t dtype;
    int meshNdims; /* 1 to RESHARD_M2N_MAX_DIMS */
    int meshDims[RESHARD_M2N_MAX_DIMS];
    int startRank;
    int placements[RESHARD_M2N_MAX_DIMS]; /* NCCL_RESHARD_REPLICATE or NCCL_RESHARD_SHARD(d) */
} reshard_m2n_tensor_t;

/* The same contract as ncclReshard (handle, groups excepted: it is issued at once). */
NCCL_M2N_API ncclResult_t reshard_m2n_reshard(ncclM2nHandle_t handle, ncclComm_t comm,
                                              const reshard_m2n_tensor_t *src,
                                              const reshard_m2n_tensor_t *dst, cudaStream_t stream);
/* The shape of rank's shard of t (zeros when it holds none) and the bytes of its buffer. */
NCCL_M2N_API ncclResult_t reshard_m2n_local_shape(const reshard_m2n_tensor_t *t, int rank,
                                                  int64_t shape[RESHARD_M2N_MAX_DIMS],
                                                  size_t *bytes);

#ifdef __cplusplus
}
#endif
#endif
