/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A program written against NCCL M2N's API (plugin/m2n/nccl_m2n.h, nothing of reshard.h):
 * eight forked ranks on the stand-in CUDA and NCCL (test/fake) reshard 2-D and 3-D tensors in
 * every placement M2N takes, through groups and the extension beyond M2N's limits, and get
 * M2N's error codes, with a ncclM2nGetLastError naming the field and the rank, for what is
 * wrong, on every rank, never a hang. Every element holds its global index and is checked.
 */
#include "plugin/m2n/nccl_m2n.h"
#include "test/fake/fake_nccl.h"
#include "test/tools/run_util.h"

#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define WORLD 8

struct out {
    int rc;         /* the first failing call's result, else ncclSuccess */
    long wrong;     /* elements wrong over every check */
    long checked;   /* elements checked */
    int calls;      /* reshard calls made */
    char msg[1024]; /* the first failing call's ncclM2nGetLastError */
};

static struct fake_shared *sh;
static struct out *outs;

static void env_setup(void)
{
    char cuda[512], nccl[512];
    snprintf(cuda, sizeof(cuda), "%s/test/fake/libcuda.so.1", build_dir());
    snprintf(nccl, sizeof(nccl), "%s/test/fake/libnccl.so.2", build_dir());
    cr_assert_eq(access(cuda, R_OK) | access(nccl, R_OK), 0, "build %s and %s first", cuda, nccl);
    setenv("RESHARD_CUDA_LIB", cuda, 1);
    setenv("RESHARD_NCCL_LIB", nccl, 1);
    setenv("RESHARD_DOMAIN_SIZE", "4", 1); /* two domains: the plans cross a network too */
    setenv("RESHARD_TIMEOUT", "30", 1);
    sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    outs = mmap(NULL, WORLD * sizeof(*outs), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1,
                0);
    cr_assert(sh != MAP_FAILED && outs != MAP_FAILED);
    sh->size = WORLD;
}

/* Runs fn on WORLD forked ranks, each with its stand-in ncclComm_t, and waits for them. */
static void run_ranks(void (*fn)(ncclComm_t comm, int rank, struct out *o))
{
    pid_t pid[WORLD];
    for (int r = 0; r < WORLD; r++)
        if ((pid[r] = fork()) == 0) {
            struct fake_nccl_comm fc = {r, WORLD, sh};
            fn((ncclComm_t)(void *)&fc, r, &outs[r]);
            _exit(0);
        }
    for (int r = 0; r < WORLD; r++) {
        int ws;
        waitpid(pid[r], &ws, 0);
        cr_assert(WIFEXITED(ws), "rank %d crashed", r);
    }
}

static void note(struct out *o, ncclResult_t rc)
{
    if (rc != ncclSuccess && o->rc == ncclSuccess) {
        o->rc = rc;
        snprintf(o->msg, sizeof(o->msg), "%s", ncclM2nGetLastError());
    }
}

/* ---- the oracle: which global index each local element holds ---- */

/* One side: global shape, mesh, placements; torch.chunk shards, nested in mesh-axis order as
 * DTensor nests them (M2N's even shards are the special case). */
struct side {
    int ndims;
    int64_t shape[8];
    int mesh_ndims, mesh[8], start, place[8];
};

static int64_t side_ranks(const struct side *s)
{
    int64_t n = 1;
    for (int a = 0; a < s->mesh_ndims; a++)
        n *= s->mesh[a];
    return n;
}

/* rank's box of the tensor: lo[d], len[d]; 0 when it is not in the mesh. */
static int side_box(const struct side *s, int rank, int64_t *lo, int64_t *len)
{
    if (rank < s->start || rank >= s->start + side_ranks(s))
        return 0;
    int coord[8], rest = rank - s->start;
    for (int a = s->mesh_ndims - 1; a >= 0; a--) {
        coord[a] = rest % s->mesh[a];
        rest /= s->mesh[a];
    }
    for (int d = 0; d < s->ndims; d++) {
        lo[d] = 0;
        len[d] = s->shape[d];
        for (int a = 0; a < s->mesh_ndims; a++)
            if (s->place[a] == d) {
                int64_t chunk = (len[d] + s->mesh[a] - 1) / s->mesh[a];
                int64_t from = chunk * coord[a], to = from + chunk;
                from = from < len[d] ? from : len[d];
                to = to < len[d] ? to : len[d];
                lo[d] += from;
                len[d] = to - from;
            }
    }
    return 1;
}

static int64_t box_numel(const struct side *s, const int64_t *len)
{
    int64_t n = 1;
    for (int d = 0; d < s->ndims; d++)
        n *= len[d];
    return n;
}

/* Fills (check 0) or counts the wrong elements of (check 1) rank's buffer of side s: element
 * value = its global row-major index, in esize bytes (low bytes of it, each xored with its
 * position, so a shifted byte is caught too). */
static long pattern(const struct side *s, int rank, unsigned char *buf, int esize, int check)
{
    int64_t lo[8], len[8], at[8] = {0};
    if (!side_box(s, rank, lo, len))
        return 0;
    int64_t n = box_numel(s, len);
    long wrong = 0;
    for (int64_t e = 0; e < n; e++) {
        int64_t g = 0;
        for (int d = 0; d < s->ndims; d++)
            g = g * s->shape[d] + lo[d] + at[d];
        for (int k = 0; k < esize; k++) {
            unsigned char want = (unsigned char)((g >> (8 * (k % 8))) ^ (k * 37));
            if (check)
                wrong += buf[e * esize + k] != want;
            else
                buf[e * esize + k] = want;
        }
        for (int d = s->ndims - 1; d >= 0 && ++at[d] == len[d]; d--)
            at[d] = 0;
    }
    return wrong;
}

static size_t side_bytes(const struct side *s, int rank, int esize)
{
    int64_t lo[8], len[8];
    return side_box(s, rank, lo, len) ? (size_t)box_numel(s, len) * (size_t)esize : 0;
}

static int dtype_size(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
        return 1;
    case ncclFloat16:
    case ncclBfloat16:
        return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
        return 4;
    default:
        return 8;
    }
}

/* ---- M2N descriptors of a side ---- */

struct m2n_side {
    ncclMesh_t mesh;
    ncclDistTensor_t t;
};

/* M2N's descriptor for s (a 2-D mesh, even shards): localShape is the shard's shape. */
static void to_m2n(const struct side *s, ncclDataType_t dtype, void *data, struct m2n_side *m)
{
    memset(m, 0, sizeof(*m));
    m->mesh.dims[0] = s->mesh[0];
    m->mesh.dims[1] = s->mesh[1];
    m->mesh.startRank = s->start;
    m->t.dataPtr = data;
    m->t.ndims = s->ndims;
    m->t.dtype = dtype;
    m->t.mesh = &m->mesh;
    for (int d = 0; d < s->ndims; d++) {
        size_t l = (size_t)s->shape[d];
        for (int a = 0; a < 2; a++)
            l /= s->place[a] == d ? (size_t)s->mesh[a] : 1;
        m->t.localShape[d] = l;
    }
    m->t.placements[0] = s->place[0];
    m->t.placements[1] = s->place[1];
}

static void to_ext(const struct side *s, ncclDataType_t dtype, void *data, reshard_m2n_tensor_t *t)
{
    memset(t, 0, sizeof(*t));
    t->size = sizeof(*t);
    t->dataPtr = data;
    t->ndims = s->ndims;
    t->dtype = dtype;
    t->meshNdims = s->mesh_ndims;
    t->startRank = s->start;
    for (int i = 0; i < 8; i++) {
        t->shape[i] = s->shape[i];
        t->meshDims[i] = s->mesh[i];
        t->placements[i] = s->place[i];
    }
}

/* One reshard of src into dst on this rank, checked; ext: through the extension. */
static void reshard_one(ncclComm_t comm, int rank, struct out *o, ncclM2nHandle_t h,
                        const struct side *src, const struct side *dst, ncclDataType_t dtype,
                        int ext)
{
    int es = dtype_size(dtype);
    size_t sb = side_bytes(src, rank, es), db = side_bytes(dst, rank, es);
    unsigned char *sbuf = sb ? malloc(sb) : NULL, *dbuf = db ? calloc(1, db) : NULL;
    if (sbuf)
        pattern(src, rank, sbuf, es, 0);
    ncclResult_t rc;
    if (ext) {
        reshard_m2n_tensor_t s, d;
        to_ext(src, dtype, sbuf, &s);
        to_ext(dst, dtype, dbuf, &d);
        rc = reshard_m2n_reshard(h, comm, &s, &d, NULL);
    } else {
        struct m2n_side s, d;
        to_m2n(src, dtype, sbuf, &s);
        to_m2n(dst, dtype, dbuf, &d);
        rc = ncclReshard(h, comm, &s.t, &d.t, NULL);
    }
    o->calls++;
    note(o, rc);
    if (dbuf) {
        o->wrong += pattern(dst, rank, dbuf, es, 1);
        o->checked += (long)(db / (size_t)es);
    }
    free(sbuf);
    free(dbuf);
}

static void assert_all_ok(int min_calls)
{
    long checked = 0;
    for (int r = 0; r < WORLD; r++) {
        cr_assert_eq(outs[r].rc, ncclSuccess, "rank %d: %d %s", r, outs[r].rc, outs[r].msg);
        cr_assert_eq(outs[r].wrong, 0, "rank %d: %ld bytes wrong", r, outs[r].wrong);
        cr_assert_geq(outs[r].calls, min_calls, "rank %d made %d calls", r, outs[r].calls);
        checked += outs[r].checked;
    }
    cr_assert_gt(checked, 0, "no destination element was checked");
}

/* ---- every placement M2N takes, 2-D and 3-D ---- */

/* The placements of a 2-D mesh over an ndims tensor that M2N takes: R,R, then S(d) on either
 * axis. */
static int placements(int ndims, int out[][2])
{
    int n = 0;
    out[n][0] = out[n][1] = NCCL_RESHARD_REPLICATE, n++;
    for (int d = 0; d < ndims; d++) {
        out[n][0] = NCCL_RESHARD_SHARD(d), out[n][1] = NCCL_RESHARD_REPLICATE, n++;
        out[n][0] = NCCL_RESHARD_REPLICATE, out[n][1] = NCCL_RESHARD_SHARD(d), n++;
    }
    return n;
}

static void every_placement(ncclComm_t comm, int rank, struct out *o, int ndims,
                            const int64_t *shape, const int *smesh, const int *dmesh,
                            ncclDataType_t dtype)
{
    int pl[8][2], n = placements(ndims, pl);
    ncclM2nHandle_t h = NULL;
    ncclM2nConfig_t cfg = NCCL_M2N_CONFIG_INITIALIZER;
    note(o, ncclM2nInit(&h, &cfg));
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            struct side s = {ndims, {0}, 2, {smesh[0], smesh[1]}, smesh[2], {pl[i][0], pl[i][1]}};
            struct side d = {ndims, {0}, 2, {dmesh[0], dmesh[1]}, dmesh[2], {pl[j][0], pl[j][1]}};
            memcpy(s.shape, shape, sizeof(int64_t) * (size_t)ndims);
            memcpy(d.shape, shape, sizeof(int64_t) * (size_t)ndims);
            reshard_one(comm, rank, o, (i + j) % 2 ? h : NULL, &s, &d, dtype, 0);
        }
    note(o, ncclM2nFinalize(h));
    note(o, ncclM2nFinalize(NULL));
}

static void two_d_rank(ncclComm_t comm, int rank, struct out *o)
{
    /* trainer ranks 0-3 (2x2) to generator ranks 4-7 (2x2): disjoint, as vLLM lays them out */
    const int64_t shape[] = {8, 12};
    const int smesh[] = {2, 2, 0}, dmesh[] = {2, 2, 4};
    every_placement(comm, rank, o, 2, shape, smesh, dmesh, ncclInt32);
}

Test(m2n, every_2d_placement_pair_reshards_exactly_across_eight_ranks, .init = env_setup,
     .timeout = 240)
{
    run_ranks(two_d_rank);
    assert_all_ok(25);
    cr_assert_gt(sh->groups[5], 0, "the bytes went through NCCL");
}

static void three_d_rank(ncclComm_t comm, int rank, struct out *o)
{
    /* a 2x2 mesh on ranks 4-7 to a 2x4 mesh over all eight: the meshes overlap */
    const int64_t shape[] = {4, 8, 12};
    const int smesh[] = {2, 2, 4}, dmesh[] = {2, 4, 0};
    every_placement(comm, rank, o, 3, shape, smesh, dmesh, ncclBfloat16);
}

Test(m2n, every_3d_placement_pair_reshards_exactly_across_overlapping_meshes, .init = env_setup,
     .timeout = 300)
{
    run_ranks(three_d_rank);
    assert_all_ok(49);
}

/* ---- groups ---- */

static void group_rank(ncclComm_t comm, int rank, struct out *o)
{
    static const ncclDataType_t dtypes[] = {ncclUint8, ncclFloat32, ncclUint64, ncclFloat8e4m3};
    struct side s = {2, {16, 8}, 2, {1, 4}, 0, {-1, 0}};
    struct side d = {2, {16, 8}, 2, {4, 2}, 0, {0, 1 - 2}};
    int es[4];
    unsigned char *sb[4], *db[4];
    struct m2n_side ms[4], md[4];
    note(o, ncclM2nGroupStart());
    note(o, ncclM2nGroupStart()); /* nested: flattened into the outer one */
    for (int i = 0; i < 4; i++) {
        es[i] = dtype_size(dtypes[i]);
        size_t sz = side_bytes(&s, rank, es[i]), dz = side_bytes(&d, rank, es[i]);
        sb[i] = sz ? malloc(sz) : NULL;
        db[i] = dz ? calloc(1, dz) : NULL;
        if (sb[i])
            pattern(&s, rank, sb[i], es[i], 0);
        to_m2n(&s, dtypes[i], sb[i], &ms[i]);
        to_m2n(&d, dtypes[i], db[i], &md[i]);
        note(o, ncclReshardWithWindow(NULL, comm, NULL, &ms[i].t, &md[i].t, NULL));
        if (db[i] && i == 0) /* recorded, not issued: nothing landed yet */
            o->wrong += pattern(&d, rank, db[i], es[i], 1) == 0;
    }
    note(o, ncclM2nGroupEnd());
    note(o, ncclM2nGroupEnd());
    for (int i = 0; i < 4; i++) {
        if (db[i]) {
            o->wrong += pattern(&d, rank, db[i], es[i], 1);
            o->checked += (long)(side_bytes(&d, rank, es[i]) / (size_t)es[i]);
        }
        free(sb[i]);
        free(db[i]);
    }
    o->calls = 4;
    /* an aborted group issues nothing; an end without a start is misuse */
    note(o, ncclM2nGroupStart());
    struct m2n_side bad;
    to_m2n(&s, (ncclDataType_t)99, NULL, &bad);
    note(o, ncclReshard(NULL, comm, &bad.t, &md[0].t, NULL));
    note(o, ncclM2nGroupAbort());
    note(o, ncclM2nGroupAbort());
    ncclResult_t rc = ncclM2nGroupEnd();
    if (rc != ncclInvalidUsage || !strstr(ncclM2nGetLastError(), "no group is active"))
        note(o, ncclInternalError);
    note(o, ncclM2nFinalize(NULL));
}

Test(m2n, a_group_issues_its_calls_at_the_outermost_end_and_an_abort_issues_none, .init = env_setup,
     .timeout = 120)
{
    run_ranks(group_rank);
    assert_all_ok(4);
}

static void group_error_rank(ncclComm_t comm, int rank, struct out *o)
{
    struct side s = {2, {8, 8}, 2, {2, 2}, 0, {0, -1}};
    struct side d = {2, {8, 8}, 2, {2, 2}, 4, {-1, 1}};
    size_t sz = side_bytes(&s, rank, 4), dz = side_bytes(&d, rank, 4);
    void *sb = sz ? calloc(1, sz) : NULL, *db = dz ? calloc(1, dz) : NULL;
    struct m2n_side ms, md, bad;
    to_m2n(&s, ncclInt32, sb, &ms);
    to_m2n(&d, ncclInt32, db, &md);
    bad = ms;
    bad.t.dtype = (ncclDataType_t)99;
    note(o, ncclM2nGroupStart());
    note(o, ncclReshard(NULL, comm, &ms.t, &md.t, NULL));
    note(o, ncclReshard(NULL, comm, &bad.t, &md.t, NULL));
    note(o, ncclM2nGroupEnd());
    free(sb);
    free(db);
}

Test(m2n, a_failing_group_entry_is_named_by_its_index_on_every_rank, .init = env_setup,
     .timeout = 120)
{
    run_ranks(group_error_rank);
    for (int r = 0; r < WORLD; r++) {
        cr_assert_eq(outs[r].rc, ncclInvalidArgument, "rank %d: %d", r, outs[r].rc);
        cr_assert(strstr(outs[r].msg, "ncclM2nGroupEnd: entry 1 of 2 failed: ncclReshard: rank 0: "
                                      "src.dtype is 99, a dtype NCCL M2N does not name"),
                  "rank %d: %s", r, outs[r].msg);
    }
}

/* ---- bad input: M2N's error, named, on every rank ---- */

enum bad {
    DISAGREE,
    MESH_PAST,
    DTYPE_ALL,
    DTYPE_ONE,
    NULL_DATA,
    FOUR_DIMS,
    TWO_SHARD_AXES,
    OTHER_CONTEXT
};
static enum bad bad_case;

/* A stream of a second CUDA context, made as a program would with the driver API; the primary
 * context is current again afterwards (the one the communicator runs in). NULL on failure. */
static cudaStream_t other_context_stream(void)
{
    void *cu = dlopen(getenv("RESHARD_CUDA_LIB"), RTLD_NOW | RTLD_LOCAL);
    if (!cu)
        return NULL;
    int (*retain)(void **, int) = (int (*)(void **, int))dlsym(cu, "cuDevicePrimaryCtxRetain");
    int (*create)(void **, unsigned, int) =
        (int (*)(void **, unsigned, int))dlsym(cu, "cuCtxCreate_v2");
    int (*set)(void *) = (int (*)(void *))dlsym(cu, "cuCtxSetCurrent");
    int (*stream)(void **, unsigned) = (int (*)(void **, unsigned))dlsym(cu, "cuStreamCreate");
    void *primary = NULL, *other = NULL, *st = NULL;
    if (!retain || !create || !set || !stream || retain(&primary, 0) || create(&other, 0, 0) ||
        stream(&st, 0) || set(primary))
        return NULL;
    return (cudaStream_t)st;
}

static void bad_rank(ncclComm_t comm, int rank, struct out *o)
{
    struct side s = {2, {8, 12}, 2, {2, 2}, 0, {0, -1}};
    struct side d = {2, {8, 12}, 2, {2, 2}, 4, {-1, 1}};
    size_t sz = side_bytes(&s, rank, 4), dz = side_bytes(&d, rank, 4);
    void *sb = sz ? calloc(1, sz) : NULL, *db = dz ? calloc(1, dz) : NULL;
    struct m2n_side ms, md;
    to_m2n(&s, ncclFloat32, sb, &ms);
    to_m2n(&d, ncclFloat32, db, &md);
    switch (bad_case) {
    case DISAGREE:
        md.t.localShape[1] += rank == 3;
        break;
    case MESH_PAST:
        ms.mesh.startRank = 6;
        break;
    case DTYPE_ALL:
        ms.t.dtype = md.t.dtype = (ncclDataType_t)12;
        break;
    case DTYPE_ONE:
        ms.t.dtype = rank == 5 ? (ncclDataType_t)42 : ms.t.dtype;
        break;
    case NULL_DATA:
        ms.t.dataPtr = rank == 2 ? NULL : ms.t.dataPtr;
        break;
    case FOUR_DIMS:
        ms.t.ndims = md.t.ndims = 4;
        break;
    case TWO_SHARD_AXES:
        ms.t.placements[1] = NCCL_RESHARD_SHARD(1);
        break;
    case OTHER_CONTEXT:
        break;
    }
    cudaStream_t stream = NULL;
    if (bad_case == OTHER_CONTEXT && rank == 5 && !(stream = other_context_stream()))
        note(o, ncclInternalError); /* the stand-in driver could not make one */
    note(o, ncclReshard(NULL, comm, &ms.t, &md.t, stream));
    o->calls++;
    /* the communicator is still good: the right call then works */
    struct side ok_s = s, ok_d = d;
    reshard_one(comm, rank, o, NULL, &ok_s, &ok_d, ncclFloat32, 0);
    free(sb);
    free(db);
}

static void expect_bad(enum bad which, const char *want)
{
    bad_case = which;
    run_ranks(bad_rank);
    for (int r = 0; r < WORLD; r++) {
        cr_assert_eq(outs[r].rc, ncclInvalidArgument, "rank %d: %d %s", r, outs[r].rc, outs[r].msg);
        cr_assert(strstr(outs[r].msg, want), "rank %d: '%s' lacks '%s'", r, outs[r].msg, want);
        cr_assert_eq(outs[r].wrong, 0, "rank %d: the good call after it landed wrong", r);
        cr_assert_eq(outs[r].calls, 2);
    }
}

Test(m2n, descriptors_that_disagree_across_ranks_fail_every_rank_naming_field_and_rank,
     .init = env_setup, .timeout = 120)
{
    expect_bad(DISAGREE, "ncclReshard: dst.localShape[1] differs across ranks: rank 3 passes 7, "
                         "rank 0 passes 6");
}

Test(m2n, a_mesh_past_the_communicator_is_refused, .init = env_setup, .timeout = 120)
{
    expect_bad(MESH_PAST, "rank 0: src.mesh->startRank is 6: the mesh's ranks [6, 10) pass the "
                          "communicator's 8 ranks");
}

Test(m2n, a_dtype_m2n_does_not_name_is_refused, .init = env_setup, .timeout = 120)
{
    expect_bad(DTYPE_ALL, "rank 0: src.dtype is 12, a dtype NCCL M2N does not name");
}

Test(m2n, one_rank_with_an_unnamed_dtype_fails_every_rank_naming_it, .init = env_setup,
     .timeout = 120)
{
    expect_bad(DTYPE_ONE, "src.dtype differs across ranks: rank 5 passes 42, rank 0 passes 7");
}

Test(m2n, a_null_data_pointer_on_a_participating_rank_fails_every_rank_naming_it, .init = env_setup,
     .timeout = 120)
{
    expect_bad(NULL_DATA, "rank 2: src.dataPtr is NULL, but this rank holds 192 bytes of the "
                          "source side");
}

Test(m2n, m2n_limits_are_refused_as_m2n_refuses_them_pointing_at_the_extension, .init = env_setup,
     .timeout = 120)
{
    expect_bad(FOUR_DIMS, "src.ndims is 4: NCCL M2N takes 1 to 3 dims (reshard_m2n_reshard "
                          "takes up to 8)");
}

Test(m2n, two_shard_axes_are_refused_as_m2n_refuses_them, .init = env_setup, .timeout = 120)
{
    expect_bad(TWO_SHARD_AXES, "src.placements shards 2 mesh axes: NCCL M2N shards at most one");
}

Test(m2n, a_stream_of_another_cuda_context_fails_every_rank_naming_the_stream_and_rank,
     .init = env_setup, .timeout = 120)
{
    expect_bad(OTHER_CONTEXT, "ncclReshard: rank 5: stream 0x");
    cr_assert(strstr(outs[0].msg, "not the communicator's"), "%s", outs[0].msg);
}

/* ---- past M2N's limits, through the extension ---- */

static void ext_rank(ncclComm_t comm, int rank, struct out *o)
{
    /* 4-D, two shard axes on the source, a 3-D mesh on the destination */
    struct side s4 = {4, {4, 6, 5, 10}, 2, {2, 2}, 0, {0, 3}};
    struct side d4 = {4, {4, 6, 5, 10}, 3, {2, 2, 2}, 0, {1, 1, -1}};
    reshard_one(comm, rank, o, NULL, &s4, &d4, ncclFloat16, 1);
    /* uneven torch.chunk shards: 7 rows over 4 ranks, 11 columns over 3 */
    struct side su = {2, {7, 11}, 1, {4}, 0, {0}};
    struct side du = {2, {7, 11}, 1, {3}, 5, {1}};
    reshard_one(comm, rank, o, NULL, &su, &du, ncclInt64, 1);
    /* the same tensor dim on both axes, nested, into a replicated 1-D mesh */
    struct side sn = {1, {10}, 2, {2, 2}, 2, {0, 0}};
    struct side dn = {1, {10}, 1, {8}, 0, {-1}};
    reshard_one(comm, rank, o, NULL, &sn, &dn, ncclUint8, 1);
    /* 16,384 x 1,024 bytes from one rank to all eight, by rows, then by columns: one NCCL
     * operation per 128-byte row piece, 16,384 per pair, which go in groups that NCCL (and the
     * stand-in, at NCCL_MAX_OPS per group) takes */
    struct side sb = {2, {16384, 1024}, 1, {1}, 3, {-1}};
    struct side db = {2, {16384, 1024}, 1, {8}, 0, {0}};
    reshard_one(comm, rank, o, NULL, &sb, &db, ncclInt8, 1);
    struct side dc = {2, {16384, 1024}, 1, {8}, 0, {1}};
    reshard_one(comm, rank, o, NULL, &sb, &dc, ncclInt8, 1);
    /* the shard helper agrees with the oracle on an uneven shard */
    reshard_m2n_tensor_t t;
    to_ext(&su, ncclInt64, NULL, &t);
    int64_t shape[8];
    size_t bytes;
    note(o, reshard_m2n_local_shape(&t, 3, shape, &bytes));
    if (shape[0] != 1 || shape[1] != 11 || bytes != 88)
        note(o, ncclInternalError);
    note(o, ncclM2nFinalize(NULL));
}

Test(m2n, the_extension_reshards_past_m2n_limits_exactly, .init = env_setup, .timeout = 240)
{
    run_ranks(ext_rank);
    assert_all_ok(5);
    /* the column split went as more groups than two rounds: rank 0 receives 16,384 pieces */
    cr_assert_geq(sh->ops[0], 16384, "rank 0 posted %d operations", sh->ops[0]);
    cr_assert_geq(sh->groups[0], 16384 / 128, "rank 0 ended %d groups", sh->groups[0]);
}

/* ---- handles, on one rank ---- */

Test(m2n, configs_and_handles_follow_m2n_rules)
{
    ncclM2nHandle_t h = (ncclM2nHandle_t)(void *)1;
    ncclM2nConfig_t cfg = NCCL_M2N_CONFIG_INITIALIZER;
    cr_assert_eq(cfg.magic, 0x4d324e32u);
    cr_assert_eq(cfg.version, 2u);
    cr_assert_eq(cfg.maxCta, INT_MIN);
    cfg.magic = 7;
    cr_assert_eq(ncclM2nInit(&h, &cfg), ncclInvalidArgument);
    cr_assert_null(h, "the output is NULL before any work");
    cr_assert(strstr(ncclM2nGetLastError(), "config->magic is 0x7, expected 0x4d324e32"), "%s",
              ncclM2nGetLastError());
    cfg = (ncclM2nConfig_t)NCCL_M2N_CONFIG_INITIALIZER;
    cfg.version = 3;
    cr_assert_eq(ncclM2nInit(&h, &cfg), ncclInvalidArgument);
    cr_assert(strstr(ncclM2nGetLastError(), "config->version is 3"));
    cr_assert_eq(ncclM2nInit(NULL, NULL), ncclInvalidArgument);
    cr_assert_eq(ncclM2nInit(&h, NULL), ncclSuccess);
    cr_assert_str_empty(ncclM2nGetLastError(), "a success clears the detail");
    cr_assert_eq(ncclM2nFinalize(h), ncclSuccess);
    cr_assert_eq(ncclM2nFinalize(h), ncclInvalidArgument);
    cr_assert(strstr(ncclM2nGetLastError(), "unknown or already finalized"));
    cr_assert_eq(ncclM2nFinalize(NULL), ncclSuccess);
    cr_assert_eq(ncclM2nFinalize(NULL), ncclSuccess, "NULL again and again is fine");
    cr_assert_eq(ncclM2nGroupStart(), ncclSuccess);
    cr_assert_eq(ncclM2nFinalize(NULL), ncclInvalidArgument, "not inside a group");
    cr_assert_eq(ncclM2nGroupAbort(), ncclSuccess);
    ncclDistTensor_t t = {0};
    cr_assert_eq(ncclReshard(NULL, NULL, &t, &t, NULL), ncclInvalidArgument);
    cr_assert(strstr(ncclM2nGetLastError(), "ncclReshard: comm is NULL"));
    cr_assert_eq(ncclReshard(NULL, (ncclComm_t)(void *)&t, NULL, &t, NULL), ncclInvalidArgument);
    cr_assert(strstr(ncclM2nGetLastError(), "src is NULL"));
}
