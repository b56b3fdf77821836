/* SPDX-License-Identifier: Apache-2.0 */
/* What the files of the M2N API share: one side of a reshard as every rank compares it, the
 * last-error text, handles, and the cache of communicators and plans. */
#ifndef RS_M2N_INT_H
#define RS_M2N_INT_H

#include "nccl_m2n.h"
#include "plugin/reshard.h"

#define M2N_ERROR_MAX 1024

/* One side, as the caller described it: M2N's fields (localShape) or the extension's (the
 * global shape). Every rank sends its two sides to every other one before anything moves. */
struct m2n_side {
    int ndims;
    int64_t dims[RESHARD_M2N_MAX_DIMS]; /* localShape (M2N) or shape (extension) */
    int dtype;                          /* the raw ncclDataType_t */
    int mesh_ndims;
    int mesh[RESHARD_M2N_MAX_DIMS];
    int start;
    int place[RESHARD_M2N_MAX_DIMS];
    int has_mesh; /* M2N: mesh was not NULL */
    int has_data; /* this rank's dataPtr is not NULL */
};

/* A call as recorded (groups) or issued: both sides, their pointers, where it goes. */
struct m2n_call {
    int ext; /* 1: the extension's fields and limits */
    struct m2n_side side[2];
    void *ptr[2];
    ncclM2nHandle_t handle;
    ncclComm_t comm;
    cudaStream_t stream;
    const char *api; /* "ncclReshard", "ncclReshardWithWindow", "reshard_m2n_reshard" */
};

/* The calling thread's detail; m2n_fail sets it and returns r. */
void m2n_clear_error(void);
ncclResult_t m2n_fail(ncclResult_t r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A reshard status as M2N's result, its detail "<api>: <reshard's message>". */
ncclResult_t m2n_from_status(reshard_status_t st, const char *api);

/* The handle to use (the default one for NULL, made on first use), or NULL with the error set
 * when it is unknown. */
ncclM2nHandle_t m2n_handle_get(ncclM2nHandle_t handle, const char *api);
/* Whether a group is recording on this thread; if so, records the call. */
int m2n_group_active(void);
ncclResult_t m2n_group_record(const struct m2n_call *call);

/* Issues one call: checks, agreement across the ranks, plan (cached), execution. */
ncclResult_t m2n_issue(const struct m2n_call *call);
/* Destroys every cached plan and communicator (the last handle went). */
void m2n_cache_release(void);

/* The side of an M2N descriptor (mesh copied in; a NULL mesh is flagged, checked later). */
void m2n_side_from_desc(const ncclDistTensor_t *t, struct m2n_side *side);
void m2n_side_from_ext(const reshard_m2n_tensor_t *t, struct m2n_side *side);
/* The layout spec of an extension side ("shape=... ranks=... mesh=... place=..."). */
int m2n_side_spec(const struct m2n_side *side, int ext, char *buf, size_t size);
/* reshard's name of an NCCL dtype, NULL when M2N names no such dtype. */
const char *m2n_dtype_name(int dtype);

#endif
