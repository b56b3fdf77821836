/* SPDX-License-Identifier: Apache-2.0 */
/* One M2N call: the two sides checked on this rank, compared across every rank (so a rank that
 * disagrees or fails its own checks fails them all, with the same message, before anything
 * moves), mapped to reshard layouts, planned once per communicator and pair of layouts, and
 * enqueued on the caller's stream by the NCCL executor. */
#include "m2n_int.h"

#include "cuda/cuda_lib.h"
#include "plugin/comm/comm.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- descriptors ---- */

void m2n_side_from_desc(const ncclDistTensor_t *t, struct m2n_side *side)
{
    memset(side, 0, sizeof(*side));
    side->ndims = t->ndims;
    for (int d = 0; d < NCCL_RESHARD_MAX_TENSOR_DIMS; d++)
        side->dims[d] = (int64_t)t->localShape[d];
    side->dtype = (int)t->dtype;
    side->mesh_ndims = NCCL_RESHARD_MESH_NDIMS;
    side->has_mesh = t->mesh != NULL;
    if (t->mesh) {
        for (int a = 0; a < NCCL_RESHARD_MESH_NDIMS; a++)
            side->mesh[a] = t->mesh->dims[a];
        side->start = t->mesh->startRank;
    }
    for (int a = 0; a < NCCL_RESHARD_MESH_NDIMS; a++)
        side->place[a] = t->placements[a];
    side->has_data = t->dataPtr != NULL;
}

void m2n_side_from_ext(const reshard_m2n_tensor_t *t, struct m2n_side *side)
{
    memset(side, 0, sizeof(*side));
    side->ndims = t->ndims;
    side->dtype = (int)t->dtype;
    side->mesh_ndims = t->meshNdims;
    side->has_mesh = 1;
    side->start = t->startRank;
    for (int i = 0; i < RESHARD_M2N_MAX_DIMS; i++) {
        side->dims[i] = t->shape[i];
        side->mesh[i] = t->meshDims[i];
        side->place[i] = t->placements[i];
    }
    side->has_data = t->dataPtr != NULL;
}

const char *m2n_dtype_name(int dtype)
{
    /* reshard moves bits: the unsigned 32 and 64 bit types travel as their signed twins */
    static const char *const names[] = {"i8",  "u8",  "i32", "i32",  "i64",     "i64",
                                        "f16", "f32", "f64", "bf16", "fp8e4m3", "fp8e5m2"};
    return dtype >= 0 && dtype < (int)(sizeof(names) / sizeof(names[0])) ? names[dtype] : NULL;
}

/* Field names as the caller's struct spells them. */
struct names {
    const char *dims, *mesh_ndims, *mesh, *start;
};
static const struct names desc_names = {"localShape", "mesh_ndims", "mesh->dims",
                                        "mesh->startRank"};
static const struct names ext_names = {"shape", "meshNdims", "meshDims", "startRank"};

static int64_t mesh_size(const struct m2n_side *s)
{
    int64_t n = 1;
    for (int a = 0; a < s->mesh_ndims; a++)
        n *= s->mesh[a];
    return n;
}

/* This rank's checks of one side's own fields; 0, or -1 with why. */
static int side_check(const struct m2n_side *s, int ext, const char *side, int size, char *why,
                      size_t n)
{
    const struct names *f = ext ? &ext_names : &desc_names;
    int maxdims = ext ? RESHARD_M2N_MAX_DIMS : NCCL_RESHARD_MAX_TENSOR_DIMS;
    if (!s->has_mesh)
        return snprintf(why, n, "%s.mesh is NULL (required on every rank)", side), -1;
    if (s->ndims < 1 || s->ndims > maxdims)
        return snprintf(why, n, "%s.ndims is %d: %s takes 1 to %d dims%s", side, s->ndims,
                        ext ? "reshard" : "NCCL M2N", maxdims,
                        ext ? "" : " (reshard_m2n_reshard takes up to 8)"),
               -1;
    if (!m2n_dtype_name(s->dtype))
        return snprintf(why, n, "%s.dtype is %d, a dtype NCCL M2N does not name", side, s->dtype),
               -1;
    for (int d = 0; d < s->ndims; d++)
        if (s->dims[d] < 1 || s->dims[d] > (INT64_C(1) << 40))
            return snprintf(why, n, "%s.%s[%d] is %" PRId64 ": must be 1 to 2^40", side, f->dims, d,
                            s->dims[d]),
                   -1;
    if (ext && (s->mesh_ndims < 1 || s->mesh_ndims > RESHARD_M2N_MAX_DIMS))
        return snprintf(why, n, "%s.meshNdims is %d: must be 1 to %d", side, s->mesh_ndims,
                        RESHARD_M2N_MAX_DIMS),
               -1;
    for (int a = 0; a < s->mesh_ndims; a++)
        if (s->mesh[a] < 1 || s->mesh[a] > size)
            return snprintf(why, n, "%s.%s[%d] is %d: must be 1 to the communicator's %d ranks",
                            side, f->mesh, a, s->mesh[a], size),
                   -1;
    int64_t ranks = mesh_size(s);
    if (s->start < 0 || ranks > size || s->start > size - ranks)
        return snprintf(why, n,
                        "%s.%s is %d: the mesh's ranks [%d, %" PRId64
                        ") pass the communicator's %d ranks",
                        side, f->start, s->start, s->start, s->start + ranks, size),
               -1;
    int shards = 0;
    for (int a = 0; a < s->mesh_ndims; a++) {
        if (s->place[a] != NCCL_RESHARD_REPLICATE && (s->place[a] < 0 || s->place[a] >= s->ndims))
            return snprintf(why, n,
                            "%s.placements[%d] is %d: expected NCCL_RESHARD_REPLICATE (-1) or "
                            "NCCL_RESHARD_SHARD(d) with d below ndims %d",
                            side, a, s->place[a], s->ndims),
                   -1;
        shards += s->place[a] != NCCL_RESHARD_REPLICATE;
    }
    if (!ext && shards > 1)
        return snprintf(why, n,
                        "%s.placements shards %d mesh axes: NCCL M2N shards at most one "
                        "(reshard_m2n_reshard takes several)",
                        side, shards),
               -1;
    return 0;
}

int m2n_side_spec(const struct m2n_side *s, int ext, char *buf, size_t size)
{
    int64_t shape[RESHARD_M2N_MAX_DIMS];
    for (int d = 0; d < s->ndims && d < RESHARD_M2N_MAX_DIMS; d++) {
        shape[d] = s->dims[d];
        for (int a = 0; !ext && a < s->mesh_ndims; a++)
            shape[d] *= s->place[a] == d ? s->mesh[a] : 1; /* M2N: even shards of the whole */
    }
    const char *dtype = m2n_dtype_name(s->dtype);
    if (s->ndims < 1 || s->ndims > RESHARD_M2N_MAX_DIMS || !dtype || s->mesh_ndims < 1 ||
        s->mesh_ndims > RESHARD_M2N_MAX_DIMS)
        return snprintf(buf, size, "ndims, dtype or meshNdims out of range"), -1;
    size_t n = (size_t)snprintf(buf, size, "shape=");
    for (int d = 0; d < s->ndims && n < size; d++)
        n += (size_t)snprintf(buf + n, size - n, "%s%" PRId64, d ? "x" : "", shape[d]);
    int64_t ranks = mesh_size(s);
    if (n < size)
        n += (size_t)snprintf(buf + n, size - n, " dtype=%s ranks=%d", dtype, s->start);
    if (ranks > 1 && n < size)
        n += (size_t)snprintf(buf + n, size - n, "-%" PRId64, s->start + ranks - 1);
    if (n < size)
        n += (size_t)snprintf(buf + n, size - n, " mesh=");
    for (int a = 0; a < s->mesh_ndims && n < size; a++)
        n += (size_t)snprintf(buf + n, size - n, "%s%d", a ? "x" : "", s->mesh[a]);
    if (n < size)
        n += (size_t)snprintf(buf + n, size - n, " place=");
    for (int a = 0; a < s->mesh_ndims && n < size; a++) {
        if (s->place[a] == NCCL_RESHARD_REPLICATE)
            n += (size_t)snprintf(buf + n, size - n, "%sR", a ? "," : "");
        else
            n += (size_t)snprintf(buf + n, size - n, "%sS(%d)", a ? "," : "", s->place[a]);
    }
    return n < size ? 0 : -1;
}

/* ---- the cache: communicators by ncclComm_t, plans by their layouts' canonical hash ---- */

struct m2n_plan {
    uint64_t hash;
    char *key; /* "<src canonical spec>|<dst canonical spec>" */
    reshard_plan_t *plan;
    reshard_layout_t *layout[2];
    struct m2n_plan *next;
};

struct m2n_comm {
    ncclComm_t nccl;
    reshard_comm_t *comm;
    cu_ctx ctx; /* current when the communicator was first used: the one its streams belong to */
    struct m2n_plan *plans;
    struct m2n_comm *next;
};

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static struct m2n_comm *comms;

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

static struct m2n_comm *comm_find(ncclComm_t nccl)
{
    pthread_mutex_lock(&cache_lock);
    struct m2n_comm *c = comms;
    while (c && c->nccl != nccl)
        c = c->next;
    pthread_mutex_unlock(&cache_lock);
    return c;
}

/* Collective over the NCCL communicator's ranks on first use. */
static ncclResult_t comm_get(const struct m2n_call *call, struct m2n_comm **out)
{
    struct m2n_comm *c = comm_find(call->comm);
    if (c) {
        *out = c;
        return ncclSuccess;
    }
    if (!(c = calloc(1, sizeof(*c))))
        return m2n_fail(ncclSystemError, "%s: out of memory", call->api);
    reshard_status_t st = reshard_comm_init_nccl(call->comm, &c->comm);
    if (st != RESHARD_OK) {
        free(c);
        return m2n_from_status(st, call->api);
    }
    /* M2N's contract is NCCL's: enqueued on the caller's stream, on the caller's communicator */
    c->comm->nccl_executor = 1;
    /* reshard_comm_init_nccl made sure a context is current: the one NCCL enqueues in */
    const struct cuda_fns *cu = cuda_lib();
    if (cu)
        cu->ctx_get_current(&c->ctx);
    c->nccl = call->comm;
    pthread_mutex_lock(&cache_lock);
    c->next = comms;
    comms = c;
    pthread_mutex_unlock(&cache_lock);
    *out = c;
    return ncclSuccess;
}

void m2n_cache_release(void)
{
    pthread_mutex_lock(&cache_lock);
    struct m2n_comm *c = comms;
    comms = NULL;
    pthread_mutex_unlock(&cache_lock);
    while (c) {
        struct m2n_comm *next = c->next;
        for (struct m2n_plan *p = c->plans, *pn; p; p = pn) {
            pn = p->next;
            reshard_plan_destroy(p->plan);
            reshard_layout_destroy(p->layout[0]);
            reshard_layout_destroy(p->layout[1]);
            free(p->key);
            free(p);
        }
        reshard_comm_destroy(c->comm);
        free(c);
        c = next;
    }
}

/* ---- agreement across the ranks ---- */

struct m2n_record {
    struct m2n_side side[2];
    int32_t err; /* this rank's own checks failed: why */
    char why[480];
};

/* The first field in which b differs from a (has_data aside: it differs by design). */
static int side_diff(const struct m2n_side *a, const struct m2n_side *b, int ext, char *field,
                     size_t n, int64_t *va, int64_t *vb)
{
    const struct names *f = ext ? &ext_names : &desc_names;
#define DIFF(x, y, ...)                                                                            \
    do {                                                                                           \
        if ((x) != (y)) {                                                                          \
            snprintf(field, n, __VA_ARGS__);                                                       \
            *va = (x), *vb = (y);                                                                  \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)
    DIFF(a->has_mesh, b->has_mesh, "mesh (NULL on one)");
    DIFF(a->ndims, b->ndims, "ndims");
    for (int d = 0; d < a->ndims && d < RESHARD_M2N_MAX_DIMS; d++)
        DIFF(a->dims[d], b->dims[d], "%s[%d]", f->dims, d);
    DIFF(a->dtype, b->dtype, "dtype");
    DIFF(a->mesh_ndims, b->mesh_ndims, "%s", f->mesh_ndims);
    for (int m = 0; m < a->mesh_ndims && m < RESHARD_M2N_MAX_DIMS; m++)
        DIFF(a->mesh[m], b->mesh[m], "%s[%d]", f->mesh, m);
    DIFF(a->start, b->start, "%s", f->start);
    for (int m = 0; m < a->mesh_ndims && m < RESHARD_M2N_MAX_DIMS; m++)
        DIFF(a->place[m], b->place[m], "placements[%d]", m);
#undef DIFF
    return 0;
}

/* Every rank's record; a disagreement (named first: it explains the checks that fail after
 * it) or a rank's own failure becomes every rank's error. */
static ncclResult_t agree(const struct m2n_call *call, reshard_comm_t *comm,
                          const struct m2n_record *mine)
{
    int size = reshard_comm_size(comm);
    struct m2n_record *all = calloc((size_t)size, sizeof(*all));
    if (!all)
        return m2n_fail(ncclSystemError, "%s: out of memory", call->api);
    all[reshard_comm_rank(comm)] = *mine;
    reshard_status_t st = reshard_comm_allgather(comm, all, sizeof(*all));
    ncclResult_t r = ncclSuccess;
    if (st != RESHARD_OK)
        r = m2n_from_status(st, call->api);
    for (int i = 1; r == ncclSuccess && i < size; i++)
        for (int s = 0; s < 2 && r == ncclSuccess; s++) {
            char field[64];
            int64_t v0, vi;
            if (side_diff(&all[0].side[s], &all[i].side[s], call->ext, field, sizeof(field), &v0,
                          &vi))
                r = m2n_fail(ncclInvalidArgument,
                             "%s: %s.%s differs across ranks: rank %d passes %" PRId64
                             ", rank 0 passes %" PRId64 " (every rank passes both sides alike)",
                             call->api, s ? "dst" : "src", field, i, vi, v0);
        }
    /* descriptors that agree, then each rank's own checks */
    for (int i = 0; r == ncclSuccess && i < size; i++)
        if (all[i].err) {
            all[i].why[sizeof(all[i].why) - 1] = '\0';
            r = m2n_fail(ncclInvalidArgument, "%s: rank %d: %.480s", call->api, i, all[i].why);
        }
    free(all);
    return r;
}

/* ---- one call ---- */

struct local {
    char spec[2][1024];
    reshard_layout_t *layout[2];
    size_t bytes[2];
};

/* The stream must belong to the communicator's context: NCCL would enqueue work of one context
 * on another's stream (an error, or a hang where a rank's work never starts). 0, or -1 with why.
 * The default streams (NULL, legacy, per-thread) are the current context's. */
static int stream_check(cudaStream_t stream, cu_ctx comm_ctx, char *why, size_t n)
{
    const struct cuda_fns *cu = cuda_lib();
    if (!cu || !comm_ctx) /* no driver: the communicator could not have been made */
        return 0;
    cu_ctx ctx = NULL;
    cu_result r = cu->stream_get_ctx((cu_stream)stream, &ctx);
    if (r != CU_SUCCESS) {
        const char *s = NULL;
        if (!cu->get_error_string || cu->get_error_string(r, &s) != CU_SUCCESS || !s)
            s = "unknown";
        return snprintf(why, n, "stream %p: cuStreamGetCtx fails: %s (%d)", (void *)stream, s, r),
               -1;
    }
    if (ctx != comm_ctx)
        return snprintf(why, n,
                        "stream %p belongs to CUDA context %p, not the communicator's %p (the "
                        "context current when this ncclComm_t was first used): pass a stream of "
                        "the communicator's context",
                        (void *)stream, (void *)ctx, (void *)comm_ctx),
               -1;
    return 0;
}

/* This rank's checks, the layouts and this rank's bytes on each side; 0, or -1 with why. */
static int local_check(const struct m2n_call *call, int rank, int size, cu_ctx comm_ctx,
                       struct local *lc, char *why, size_t n)
{
    static const char *const side[2] = {"src", "dst"};
    if (stream_check(call->stream, comm_ctx, why, n) < 0)
        return -1;
    for (int s = 0; s < 2; s++)
        if (side_check(&call->side[s], call->ext, side[s], size, why, n) < 0)
            return -1;
    if (call->side[0].dtype != call->side[1].dtype && !call->ext)
        return snprintf(why, n,
                        "src.dtype is %d but dst.dtype is %d: M2N copies, it converts "
                        "nothing",
                        call->side[0].dtype, call->side[1].dtype),
               -1;
    if (call->side[0].ndims != call->side[1].ndims)
        return snprintf(why, n, "src.ndims is %d but dst.ndims is %d", call->side[0].ndims,
                        call->side[1].ndims),
               -1;
    for (int s = 0; s < 2; s++) {
        if (m2n_side_spec(&call->side[s], call->ext, lc->spec[s], sizeof(lc->spec[s])) < 0)
            return snprintf(why, n, "%s: the layout spec does not fit", side[s]), -1;
        if (reshard_layout_parse(lc->spec[s], size, &lc->layout[s]) != RESHARD_OK)
            return snprintf(why, n, "%s (%.200s): %.200s", side[s], lc->spec[s],
                            reshard_last_error()),
                   -1;
        if (reshard_layout_shard_bytes(lc->layout[s], rank, &lc->bytes[s]) != RESHARD_OK)
            return snprintf(why, n, "%s: %.300s", side[s], reshard_last_error()), -1;
    }
    reshard_layout_info_t a, b;
    reshard_layout_info(lc->layout[0], &a);
    reshard_layout_info(lc->layout[1], &b);
    if (memcmp(a.shape, b.shape, sizeof(int64_t) * (size_t)a.ndim))
        return snprintf(
                   why, n,
                   "the global shapes differ: src (%.200s) and dst (%.200s) describe different "
                   "tensors",
                   lc->spec[0], lc->spec[1]),
               -1;
    for (int s = 0; s < 2; s++)
        if (lc->bytes[s] && !call->side[s].has_data)
            return snprintf(why, n,
                            "%s.dataPtr is NULL, but this rank holds %zu bytes of the %s side "
                            "(%.300s)",
                            side[s], lc->bytes[s], s ? "destination" : "source", lc->spec[s]),
                   -1;
    return 0;
}

/* The cached plan for the two layouts, or a new one (collective: after agree(), every rank
 * either finds it or makes it). */
static ncclResult_t plan_get(const struct m2n_call *call, struct m2n_comm *c, struct local *lc,
                             struct m2n_plan **out)
{
    char key[2100];
    char canon[2][1024];
    for (int s = 0; s < 2; s++)
        reshard_layout_format(lc->layout[s], canon[s], sizeof(canon[s]));
    snprintf(key, sizeof(key), "%s|%s", canon[0], canon[1]);
    uint64_t h = fnv1a(key);
    pthread_mutex_lock(&cache_lock);
    struct m2n_plan *p = c->plans;
    while (p && (p->hash != h || strcmp(p->key, key)))
        p = p->next;
    pthread_mutex_unlock(&cache_lock);
    if (p) {
        *out = p;
        return ncclSuccess;
    }
    if (!(p = calloc(1, sizeof(*p))) || !(p->key = strdup(key))) {
        free(p);
        return m2n_fail(ncclSystemError, "%s: out of memory", call->api);
    }
    reshard_tensor_t t = {"m2n", lc->layout[0], lc->layout[1]};
    reshard_status_t st = reshard_comm_plan_create(c->comm, &t, 1, NULL, &p->plan);
    if (st != RESHARD_OK) {
        free(p->key);
        free(p);
        return m2n_from_status(st, call->api);
    }
    p->hash = h;
    p->layout[0] = lc->layout[0];
    p->layout[1] = lc->layout[1];
    lc->layout[0] = lc->layout[1] = NULL; /* the cache holds them now */
    pthread_mutex_lock(&cache_lock);
    p->next = c->plans;
    c->plans = p;
    pthread_mutex_unlock(&cache_lock);
    *out = p;
    return ncclSuccess;
}

ncclResult_t m2n_issue(const struct m2n_call *call)
{
    struct m2n_comm *c = NULL;
    ncclResult_t r = comm_get(call, &c);
    if (r != ncclSuccess)
        return r;
    int rank = reshard_comm_rank(c->comm), size = reshard_comm_size(c->comm);
    struct local lc = {0};
    struct m2n_record mine = {.side = {call->side[0], call->side[1]}};
    if (local_check(call, rank, size, c->ctx, &lc, mine.why, sizeof(mine.why)) < 0)
        mine.err = 1;
    r = agree(call, c->comm, &mine);
    struct m2n_plan *p = NULL;
    if (r == ncclSuccess)
        r = plan_get(call, c, &lc, &p);
    if (r == ncclSuccess) {
        reshard_buffers_t b = {.src = lc.bytes[0] ? call->ptr[0] : NULL,
                               .src_bytes = lc.bytes[0],
                               .dst = lc.bytes[1] ? call->ptr[1] : NULL,
                               .dst_bytes = lc.bytes[1],
                               .mem = RESHARD_MEM_CUDA};
        reshard_status_t st = reshard_plan_execute_stream(p->plan, &b, call->stream);
        if (st != RESHARD_OK)
            r = m2n_from_status(st, call->api);
    }
    reshard_layout_destroy(lc.layout[0]);
    reshard_layout_destroy(lc.layout[1]);
    return r;
}
