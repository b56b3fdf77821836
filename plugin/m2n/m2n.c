/* SPDX-License-Identifier: Apache-2.0 */
/* NCCL M2N's entry points: handles, the last-error text, groups, and the reshard calls, which
 * m2n_run.c issues. */
#include "m2n_int.h"

#include "base/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char last_error[M2N_ERROR_MAX];

void m2n_clear_error(void)
{
    last_error[0] = '\0';
}

ncclResult_t m2n_fail(ncclResult_t r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof(last_error), fmt, ap);
    va_end(ap);
    rs_log(RS_LOG_WARN, "%s", last_error);
    return r;
}

ncclResult_t m2n_from_status(reshard_status_t st, const char *api)
{
    ncclResult_t r;
    switch (st) {
    case RESHARD_OK:
        return ncclSuccess;
    case RESHARD_ERR_INVALID_ARG:
    case RESHARD_ERR_SPEC_SYNTAX:
    case RESHARD_ERR_MESH_SIZE:
    case RESHARD_ERR_SHARD_DIM:
    case RESHARD_ERR_NOT_DIVISIBLE:
    case RESHARD_ERR_MISMATCH:
    case RESHARD_ERR_RANK_RANGE:
    case RESHARD_ERR_VIEW:
    case RESHARD_ERR_TOO_LARGE:
    case RESHARD_ERR_BUFFER:
    case RESHARD_ERR_PLAN_MISMATCH:
        r = ncclInvalidArgument;
        break;
    case RESHARD_ERR_BUSY:
        r = ncclInvalidUsage;
        break;
    case RESHARD_ERR_NO_MEMORY:
    case RESHARD_ERR_NETWORK:
    case RESHARD_ERR_UNAVAILABLE:
        r = ncclSystemError;
        break;
    case RESHARD_ERR_TIMEOUT:
    case RESHARD_ERR_REFUSED:
    case RESHARD_ERR_REMOTE:
    case RESHARD_ERR_ABORTED:
    case RESHARD_ERR_DATA_LOST:
        r = ncclRemoteError;
        break;
    default:
        r = ncclInternalError;
        break;
    }
    /* reshard logged it where it was first seen: only the text is kept here */
    snprintf(last_error, sizeof(last_error), "%s: %.900s", api, reshard_last_error());
    return r;
}

const char *ncclM2nGetLastError(void)
{
    return last_error;
}

/* ---- handles ---- */

#define HANDLE_MAGIC 0x6d326e68u /* 'm2nh' */

struct ncclM2nHandle {
    unsigned int magic;
    ncclM2nConfig_t config;
    struct ncclM2nHandle *next;
};

static pthread_mutex_t handles_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ncclM2nHandle *handles; /* the live explicit handles */
static struct ncclM2nHandle *default_handle;

static int live_count(void)
{
    int n = default_handle != NULL;
    for (struct ncclM2nHandle *h = handles; h; h = h->next)
        n++;
    return n;
}

static ncclResult_t config_check(const ncclM2nConfig_t *config)
{
    if (!config)
        return ncclSuccess;
    if (config->size != sizeof(ncclM2nConfig_t))
        return m2n_fail(ncclInvalidArgument,
                        "ncclM2nInit: config->size is %zu, expected %zu: initialize it with "
                        "NCCL_M2N_CONFIG_INITIALIZER",
                        config->size, sizeof(ncclM2nConfig_t));
    if (config->magic != NCCL_M2N_API_MAGIC)
        return m2n_fail(ncclInvalidArgument,
                        "ncclM2nInit: config->magic is 0x%x, expected 0x%x: initialize it with "
                        "NCCL_M2N_CONFIG_INITIALIZER",
                        config->magic, NCCL_M2N_API_MAGIC);
    if (config->version != NCCL_M2N_API_VERSION)
        return m2n_fail(ncclInvalidArgument,
                        "ncclM2nInit: config->version is %u; this library implements NCCL M2N "
                        "API version %u",
                        config->version, NCCL_M2N_API_VERSION);
    if (config->maxCta != NCCL_M2N_CONFIG_UNDEF_INT && config->maxCta <= 0)
        return m2n_fail(ncclInvalidArgument, "ncclM2nInit: config->maxCta is %d: must be positive",
                        config->maxCta);
    return ncclSuccess;
}

NCCL_M2N_API ncclResult_t ncclM2nInit(ncclM2nHandle_t *handle, const ncclM2nConfig_t *config)
{
    m2n_clear_error();
    if (!handle)
        return m2n_fail(ncclInvalidArgument, "ncclM2nInit: handle (the output) is NULL");
    *handle = NULL;
    ncclResult_t r = config_check(config);
    if (r != ncclSuccess)
        return r;
    struct ncclM2nHandle *h = calloc(1, sizeof(*h));
    if (!h)
        return m2n_fail(ncclSystemError, "ncclM2nInit: out of memory for a handle");
    h->magic = HANDLE_MAGIC;
    h->config = config ? *config : (ncclM2nConfig_t)NCCL_M2N_CONFIG_INITIALIZER;
    pthread_mutex_lock(&handles_lock);
    h->next = handles;
    handles = h;
    pthread_mutex_unlock(&handles_lock);
    *handle = h;
    return ncclSuccess;
}

NCCL_M2N_API ncclResult_t ncclM2nFinalize(ncclM2nHandle_t handle)
{
    m2n_clear_error();
    if (m2n_group_active())
        return m2n_fail(ncclInvalidArgument,
                        "ncclM2nFinalize: a group is active on this thread: end or abort it first");
    pthread_mutex_lock(&handles_lock);
    struct ncclM2nHandle *gone = NULL;
    if (!handle) {
        gone = default_handle;
        default_handle = NULL;
    } else {
        for (struct ncclM2nHandle **p = &handles; *p; p = &(*p)->next)
            if (*p == handle) {
                gone = *p;
                *p = gone->next;
                break;
            }
        if (!gone) {
            pthread_mutex_unlock(&handles_lock);
            return m2n_fail(ncclInvalidArgument,
                            "ncclM2nFinalize: handle %p is unknown or already finalized",
                            (void *)handle);
        }
    }
    int last = gone && live_count() == 0;
    pthread_mutex_unlock(&handles_lock);
    if (gone)
        gone->magic = 0;
    free(gone);
    if (last)
        m2n_cache_release();
    return ncclSuccess;
}

ncclM2nHandle_t m2n_handle_get(ncclM2nHandle_t handle, const char *api)
{
    pthread_mutex_lock(&handles_lock);
    struct ncclM2nHandle *h = NULL;
    if (!handle) {
        if (!default_handle && (default_handle = calloc(1, sizeof(*default_handle)))) {
            default_handle->magic = HANDLE_MAGIC;
            default_handle->config = (ncclM2nConfig_t)NCCL_M2N_CONFIG_INITIALIZER;
        }
        h = default_handle;
        if (!h)
            m2n_fail(ncclSystemError, "%s: out of memory for the default handle", api);
    } else {
        for (struct ncclM2nHandle *p = handles; p && !h; p = p->next)
            h = p == handle ? p : NULL;
        if (!h)
            m2n_fail(ncclInvalidArgument, "%s: handle %p is unknown or already finalized", api,
                     (void *)handle);
    }
    pthread_mutex_unlock(&handles_lock);
    return h;
}

/* ---- groups: per host thread ---- */

static _Thread_local struct {
    int depth;
    struct m2n_call *calls;
    size_t n, cap;
    ncclResult_t error; /* a recording failure, returned by the end */
} group;

static void group_clear(void)
{
    free(group.calls);
    memset(&group, 0, sizeof(group));
}

int m2n_group_active(void)
{
    return group.depth > 0;
}

ncclResult_t m2n_group_record(const struct m2n_call *call)
{
    if (group.n == group.cap) {
        size_t cap = group.cap ? 2 * group.cap : 16;
        struct m2n_call *c = realloc(group.calls, cap * sizeof(*c));
        if (!c) {
            group.error = ncclSystemError;
            return m2n_fail(ncclSystemError, "%s: out of memory recording group entry %zu",
                            call->api, group.n);
        }
        group.calls = c;
        group.cap = cap;
    }
    group.calls[group.n++] = *call;
    return ncclSuccess;
}

NCCL_M2N_API ncclResult_t ncclM2nGroupStart(void)
{
    m2n_clear_error();
    group.depth++;
    return ncclSuccess;
}

NCCL_M2N_API ncclResult_t ncclM2nGroupEnd(void)
{
    m2n_clear_error();
    if (group.depth == 0)
        return m2n_fail(ncclInvalidUsage, "ncclM2nGroupEnd: no group is active on this thread");
    if (--group.depth > 0)
        return ncclSuccess;
    if (group.error != ncclSuccess) {
        ncclResult_t r = group.error;
        group_clear();
        return m2n_fail(r, "ncclM2nGroupEnd: a call could not be recorded (out of memory)");
    }
    /* the calls leave the group before they run: each is issued as outside one */
    struct m2n_call *calls = group.calls;
    size_t n = group.n;
    memset(&group, 0, sizeof(group));
    ncclResult_t r = ncclSuccess;
    for (size_t i = 0; i < n && r == ncclSuccess; i++)
        if ((r = m2n_issue(&calls[i])) != ncclSuccess) {
            char detail[M2N_ERROR_MAX];
            snprintf(detail, sizeof(detail), "%s", last_error);
            snprintf(last_error, sizeof(last_error),
                     "ncclM2nGroupEnd: entry %zu of %zu failed: %.900s", i, n, detail);
        }
    free(calls);
    return r;
}

NCCL_M2N_API ncclResult_t ncclM2nGroupAbort(void)
{
    m2n_clear_error();
    group_clear();
    return ncclSuccess;
}

/* ---- the reshard calls ---- */

static ncclResult_t reshard_call(struct m2n_call *call)
{
    if (!m2n_handle_get(call->handle, call->api))
        return ncclInvalidArgument;
    if (!call->comm)
        return m2n_fail(ncclInvalidArgument, "%s: comm is NULL", call->api);
    if (m2n_group_active() && !call->ext)
        return m2n_group_record(call);
    return m2n_issue(call);
}

static ncclResult_t desc_call(const char *api, ncclM2nHandle_t handle, ncclComm_t comm,
                              const ncclDistTensor_t *src, const ncclDistTensor_t *dst,
                              cudaStream_t stream)
{
    m2n_clear_error();
    if (!src || !dst)
        return m2n_fail(ncclInvalidArgument, "%s: %s is NULL (required on every rank)", api,
                        src ? "dst" : "src");
    struct m2n_call call = {.ext = 0, .handle = handle, .comm = comm, .stream = stream, .api = api};
    m2n_side_from_desc(src, &call.side[0]);
    m2n_side_from_desc(dst, &call.side[1]);
    call.ptr[0] = src->dataPtr;
    call.ptr[1] = dst->dataPtr;
    return reshard_call(&call);
}

NCCL_M2N_API ncclResult_t ncclReshard(ncclM2nHandle_t handle, ncclComm_t comm,
                                      const ncclDistTensor_t *src, const ncclDistTensor_t *dst,
                                      cudaStream_t stream)
{
    return desc_call("ncclReshard", handle, comm, src, dst, stream);
}

NCCL_M2N_API ncclResult_t ncclReshardWithWindow(ncclM2nHandle_t handle, ncclComm_t comm,
                                                ncclWindow_t window, const ncclDistTensor_t *src,
                                                const ncclDistTensor_t *dst, cudaStream_t stream)
{
    (void)window; /* reshard stages through nothing of the caller's */
    return desc_call("ncclReshardWithWindow", handle, comm, src, dst, stream);
}

NCCL_M2N_API ncclResult_t reshard_m2n_reshard(ncclM2nHandle_t handle, ncclComm_t comm,
                                              const reshard_m2n_tensor_t *src,
                                              const reshard_m2n_tensor_t *dst, cudaStream_t stream)
{
    const char *api = "reshard_m2n_reshard";
    m2n_clear_error();
    if (!src || !dst)
        return m2n_fail(ncclInvalidArgument, "%s: %s is NULL (required on every rank)", api,
                        src ? "dst" : "src");
    for (int s = 0; s < 2; s++) {
        const reshard_m2n_tensor_t *t = s ? dst : src;
        if (t->size != sizeof(reshard_m2n_tensor_t))
            return m2n_fail(ncclInvalidArgument, "%s: %s->size is %zu, expected %zu", api,
                            s ? "dst" : "src", t->size, sizeof(reshard_m2n_tensor_t));
    }
    struct m2n_call call = {.ext = 1, .handle = handle, .comm = comm, .stream = stream, .api = api};
    m2n_side_from_ext(src, &call.side[0]);
    m2n_side_from_ext(dst, &call.side[1]);
    call.ptr[0] = src->dataPtr;
    call.ptr[1] = dst->dataPtr;
    return reshard_call(&call);
}

NCCL_M2N_API ncclResult_t reshard_m2n_local_shape(const reshard_m2n_tensor_t *t, int rank,
                                                  int64_t shape[RESHARD_M2N_MAX_DIMS],
                                                  size_t *bytes)
{
    const char *api = "reshard_m2n_local_shape";
    m2n_clear_error();
    if (!t || !shape || !bytes)
        return m2n_fail(ncclInvalidArgument, "%s: %s is NULL", api,
                        !t       ? "t"
                        : !shape ? "shape"
                                 : "bytes");
    if (t->size != sizeof(reshard_m2n_tensor_t))
        return m2n_fail(ncclInvalidArgument, "%s: t->size is %zu, expected %zu", api, t->size,
                        sizeof(reshard_m2n_tensor_t));
    struct m2n_side side;
    m2n_side_from_ext(t, &side);
    char spec[1024];
    if (m2n_side_spec(&side, 1, spec, sizeof(spec)) < 0)
        return m2n_fail(ncclInvalidArgument, "%s: %s", api, spec);
    reshard_layout_t *l = NULL;
    int64_t numel, s[8];
    size_t b;
    reshard_status_t st = reshard_layout_parse(spec, 0, &l);
    if (st == RESHARD_OK)
        st = reshard_layout_shard_shape(l, rank, s, &numel);
    if (st == RESHARD_OK)
        st = reshard_layout_shard_bytes(l, rank, &b);
    reshard_layout_destroy(l);
    if (st != RESHARD_OK)
        return m2n_from_status(st, api);
    memset(shape, 0, sizeof(int64_t) * RESHARD_M2N_MAX_DIMS);
    for (int d = 0; d < t->ndims && d < RESHARD_M2N_MAX_DIMS; d++)
        shape[d] = s[d];
    *bytes = b;
    return ncclSuccess;
}
