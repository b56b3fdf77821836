/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The NCCL executor's lowering, proven without NCCL: every rank's calls go to a recorder,
 * which then checks that every send has its receive in the same group with the same size and
 * order per pair (so NCCL could neither mismatch nor deadlock them), and plays the groups in
 * order on the ranks' host buffers, so each destination is checked element by element.
 */
#include "plugin/exec/exec_nccl.h"
#include "plugin/handles.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#define RANKS  8
#define OPS    100000
#define GROUPS 16

struct op {
    int rank, group, send, peer;
    char *ptr;
    size_t bytes;
    int matched;
};

static struct {
    struct op ops[OPS];
    int n;
    int rank;          /* the rank whose lowering runs now */
    int open;          /* inside a group */
    int groups[RANKS]; /* groups each rank closed */
    int bad_datatype, outside_group, nested;
} rec;

struct fake_comm {
    int rank;
};

static nccl_result fake_group_start(void)
{
    rec.nested += rec.open;
    rec.open = 1;
    return 0;
}

static nccl_result fake_group_end(void)
{
    rec.outside_group += !rec.open;
    rec.open = 0;
    rec.groups[rec.rank]++;
    return 0;
}

static nccl_result record(int send, const void *buf, size_t count, int dt, int peer, void *comm)
{
    cr_assert_lt(rec.n, OPS, "more operations than the recorder holds");
    rec.bad_datatype += dt != NCCL_UINT8;
    rec.outside_group += !rec.open;
    cr_assert_eq(((struct fake_comm *)comm)->rank, rec.rank, "the rank's own communicator");
    rec.ops[rec.n++] =
        (struct op){rec.rank, rec.groups[rec.rank], send, peer, (char *)buf, count, 0};
    return 0;
}

static nccl_result fake_send(const void *buf, size_t count, int dt, int peer, void *comm, void *s)
{
    (void)s;
    return record(1, buf, count, dt, peer, comm);
}

static nccl_result fake_recv(void *buf, size_t count, int dt, int peer, void *comm, void *s)
{
    (void)s;
    return record(0, buf, count, dt, peer, comm);
}

static const char *fake_error(nccl_result r)
{
    return r == 5 ? "invalid usage" : "?";
}

static const struct nccl_fns fake = {.group_start = fake_group_start,
                                     .group_end = fake_group_end,
                                     .send = fake_send,
                                     .recv = fake_recv,
                                     .get_error_string = fake_error};

/* ---- buffers: every element holds its global index (in the tensor's dtype) ---- */

static reshard_layout_t *parse(const char *spec)
{
    reshard_layout_t *l = NULL;
    cr_assert_eq(reshard_layout_parse(spec, 0, &l), RESHARD_OK, "%s: %s", spec,
                 reshard_last_error());
    return l;
}

/* Fills (check 0) or counts wrong elements of (check 1) rank's row-major shard of l. */
static long pattern(const reshard_layout_t *l, int rank, char *buf, int check)
{
    reshard_layout_info_t info;
    int64_t shape[8], numel;
    reshard_layout_info(l, &info);
    reshard_layout_shard_shape(l, rank, shape, &numel);
    int64_t *index[8];
    for (int d = 0; d < info.ndim; d++) {
        index[d] = calloc((size_t)shape[d] + 1, sizeof(int64_t));
        reshard_layout_shard_index(l, rank, d, index[d]);
    }
    long wrong = 0;
    int64_t at[8] = {0};
    for (int64_t e = 0; e < numel; e++) {
        int64_t g = 0;
        for (int d = 0; d < info.ndim; d++)
            g = g * info.shape[d] + index[d][at[d]];
        char want[8];
        for (size_t k = 0; k < info.elem_size; k++)
            want[k] = (char)(g >> (8 * k)) ^ (char)k;
        if (check)
            wrong += memcmp(buf + e * (int64_t)info.elem_size, want, info.elem_size) != 0;
        else
            memcpy(buf + e * (int64_t)info.elem_size, want, info.elem_size);
        for (int d = info.ndim - 1; d >= 0 && ++at[d] == shape[d]; d--)
            at[d] = 0;
    }
    for (int d = 0; d < info.ndim; d++)
        free(index[d]);
    return wrong;
}

/* ---- lowering every rank, then matching and playing the groups ---- */

struct pair {
    const char *src, *dst;
};

/* Plans the pairs on `world` ranks in domains of `dsize`, each rank alone (its own transfers,
 * as a communicator rank holds them), lowers every rank from its own plan into the recorder,
 * checks the matching, plays it, and returns the wrong elements over all destinations. */
static long lower_and_play(const struct pair *pairs, int n, int world, int dsize,
                           reshard_algo_t algo, uint32_t *rounds)
{
    memset(&rec, 0, sizeof(rec));
    reshard_layout_t *l[16][2];
    reshard_tensor_t t[16];
    for (int i = 0; i < n; i++) {
        l[i][0] = parse(pairs[i].src);
        l[i][1] = parse(pairs[i].dst);
        t[i] = (reshard_tensor_t){NULL, l[i][0], l[i][1]};
    }
    reshard_topo_t *topo;
    cr_assert_eq(reshard_topo_create(world, dsize, NULL, &topo), RESHARD_OK);
    reshard_buffers_t bufs[RANKS][16];
    for (int r = 0; r < world; r++) {
        reshard_plan_t *plan;
        cr_assert_eq(reshard_plan_create_rank(t, n, topo, NULL, r, &plan), RESHARD_OK, "%s",
                     reshard_last_error());
        struct xfer_set xs;
        uint32_t mine;
        cr_assert_eq(xfer_build(plan->p, algo, &xs), RESHARD_OK, "%s", reshard_last_error());
        cr_assert_eq(nccl_rounds(&xs, &mine), RESHARD_OK);
        if (r == 0)
            *rounds = mine;
        cr_assert_eq(mine, *rounds, "rank %d lowers in %u rounds, rank 0 in %u", r, mine, *rounds);
        for (size_t i = 0; i < xs.n; i++)
            cr_assert(xs.x[i].src == r || xs.x[i].dst == r, "rank %d's list holds only its own", r);
        for (int i = 0; i < n; i++) {
            size_t sb = 0, db = 0;
            reshard_layout_shard_bytes(l[i][0], r, &sb);
            reshard_layout_shard_bytes(l[i][1], r, &db);
            char *s = sb ? malloc(sb) : NULL, *d = db ? calloc(1, db) : NULL;
            if (s)
                pattern(l[i][0], r, s, 0);
            bufs[r][i] = (reshard_buffers_t){s, sb, d, db, RESHARD_MEM_CUDA};
        }
        struct fake_comm comm = {r};
        rec.rank = r;
        cr_assert_eq(nccl_lower(plan->p, &xs, r, bufs[r], &fake, &comm, NULL), RESHARD_OK, "%s",
                     reshard_last_error());
        xfer_free(&xs);
        reshard_plan_destroy(plan);
    }
    cr_assert_eq(rec.bad_datatype + rec.outside_group + rec.nested, 0,
                 "bytes only, inside groups, never nested");
    int groups = 0;
    for (int r = 0; r < world; r++) {
        cr_assert_geq(rec.groups[r], (int)*rounds, "rank %d closed %d groups, fewer than %u", r,
                      rec.groups[r], *rounds);
        groups = rec.groups[r] > groups ? rec.groups[r] : groups;
        int per[GROUPS] = {0}; /* operations per group: NCCL's limit per launch */
        for (int i = 0; i < rec.n; i++)
            if (rec.ops[i].rank == r && rec.ops[i].group < GROUPS)
                cr_assert_leq(++per[rec.ops[i].group], (int)NCCL_GROUP_OPS,
                              "rank %d's group %d holds more than %u operations", r,
                              rec.ops[i].group, NCCL_GROUP_OPS);
    }
    cr_assert_leq(groups, GROUPS, "%d groups: more than the recorder checks", groups);

    /* Group by group: the k-th send from s to d meets the k-th receive at d from s, in the
     * group of the same index on both ends. */
    for (uint32_t g = 0; g < (uint32_t)groups; g++) {
        for (int i = 0; i < rec.n; i++) {
            struct op *s = &rec.ops[i];
            if (!s->send || s->group != (int)g)
                continue;
            struct op *m = NULL;
            for (int j = 0; j < rec.n && !m; j++) {
                struct op *q = &rec.ops[j];
                if (!q->send && !q->matched && q->rank == s->peer && q->peer == s->rank)
                    m = q; /* the first one still open, in any group: its group must be g */
            }
            cr_assert_not_null(m, "send %d (rank %d -> %d, %zu bytes) has no receive", i, s->rank,
                               s->peer, s->bytes);
            cr_assert_eq(m->group, (int)g, "rank %d -> %d: send in group %u, receive in %d",
                         s->rank, s->peer, g, m->group);
            cr_assert_eq(m->bytes, s->bytes, "rank %d -> %d: %zu bytes sent, %zu received", s->rank,
                         s->peer, s->bytes, m->bytes);
            m->matched = s->matched = 1;
            memcpy(m->ptr, s->ptr, s->bytes);
        }
    }
    for (int i = 0; i < rec.n; i++)
        cr_assert(rec.ops[i].matched, "op %d (rank %d, %s %d) is unmatched", i, rec.ops[i].rank,
                  rec.ops[i].send ? "send to" : "receive from", rec.ops[i].peer);

    long wrong = 0;
    for (int r = 0; r < world; r++)
        for (int i = 0; i < n; i++) {
            if (bufs[r][i].dst)
                wrong += pattern(l[i][1], r, bufs[r][i].dst, 1);
            free((void *)bufs[r][i].src);
            free(bufs[r][i].dst);
        }
    reshard_topo_destroy(topo);
    for (int i = 0; i < n; i++) {
        reshard_layout_destroy(l[i][0]);
        reshard_layout_destroy(l[i][1]);
    }
    return wrong;
}

Test(nccl_exec, a_fanout_runs_in_two_matched_rounds_and_lands_whole)
{
    /* 2 sources in domain 0; replicas in domains 1 and 2: network slices, then forwards */
    struct pair p = {"shape=48x40 dtype=i32 ranks=0-1 mesh=2 place=S(0)",
                     "shape=48x40 dtype=i32 ranks=2-5 place=R"};
    uint32_t rounds;
    long wrong = lower_and_play(&p, 1, 6, 2, RESHARD_ALGO_RESHARD, &rounds);
    cr_assert_eq(rounds, 2, "network slices, then the fan-out");
    cr_assert_eq(wrong, 0);
    int fwd = 0;
    for (int i = 0; i < rec.n; i++)
        fwd += rec.ops[i].group == 1;
    cr_assert_gt(fwd, 0, "the second group carries the forwards");
}

Test(nccl_exec, strided_self_and_mixed_dtypes_land_whole)
{
    struct pair p[] = {
        /* columns to rows on overlapping ranks: strided runs and self copies */
        {"shape=12x10 dtype=i32 ranks=0-3 place=S(1)",
         "shape=12x10 dtype=i32 ranks=0-3 place=S(0)"},
        /* a 2-D mesh with a strided shard to a replicated 3-D tensor */
        {"shape=8x6x4 dtype=i64 ranks=0-3 mesh=2x2 place=SS(0,2),S(2)",
         "shape=8x6x4 dtype=i64 ranks=4-7 mesh=2x2 place=R,S(1)"},
        {"shape=33 dtype=i8 ranks=7 place=R", "shape=33 dtype=i8 ranks=0-7 place=S(0)"},
    };
    uint32_t rounds;
    cr_assert_eq(lower_and_play(p, 3, 8, 2, RESHARD_ALGO_RESHARD, &rounds), 0);
    int self = 0;
    for (int i = 0; i < rec.n; i++)
        self += rec.ops[i].send && rec.ops[i].peer == rec.ops[i].rank;
    cr_assert_gt(self, 0, "self copies go through NCCL too");
}

Test(nccl_exec, a_column_split_of_many_rows_goes_in_matched_groups_nccl_takes)
{
    /* 600 rows of 64 bytes from rank 0 to 8 ranks by columns: 600 pieces per pair, more than
     * nccl_pair_ops(8) = 128 per group, so each round is several groups on both ends */
    struct pair p = {"shape=600x64 dtype=i8 ranks=0 place=R",
                     "shape=600x64 dtype=i8 ranks=0-7 place=S(1)"};
    uint32_t rounds;
    cr_assert_eq(nccl_pair_ops(8), 128);
    cr_assert_eq(lower_and_play(&p, 1, 8, 8, RESHARD_ALGO_DIRECT, &rounds), 0);
    cr_assert_eq(rounds, 1);
    cr_assert_eq(rec.groups[0], 5, "rank 0: 600 sends per peer in groups of 128: 5 groups");
    cr_assert_eq(rec.groups[3], 5, "rank 3: 600 receives from rank 0: 5 groups");
}

Test(nccl_exec, the_direct_baseline_lowers_in_one_round)
{
    struct pair p = {"shape=48x40 dtype=i32 ranks=0-1 mesh=2 place=S(0)",
                     "shape=48x40 dtype=i32 ranks=2-5 place=R"};
    uint32_t rounds;
    cr_assert_eq(lower_and_play(&p, 1, 6, 2, RESHARD_ALGO_DIRECT, &rounds), 0);
    cr_assert_eq(rounds, 1);
}

static nccl_result refuse(const void *b, size_t c, int dt, int p, void *comm, void *st)
{
    (void)b, (void)c, (void)dt, (void)p, (void)comm, (void)st;
    return 5; /* ncclInvalidUsage */
}

Test(nccl_exec, the_bcast_baseline_and_nccl_failures_are_clear_errors)
{
    reshard_layout_t *s = parse("shape=8x8 dtype=i32 ranks=0-1 mesh=2 place=S(0)");
    reshard_layout_t *d = parse("shape=8x8 dtype=i32 ranks=2-3 mesh=2 place=R");
    reshard_tensor_t t = {"w", s, d};
    reshard_topo_t *topo;
    reshard_plan_t *plan;
    cr_assert_eq(reshard_topo_create(4, 2, NULL, &topo), RESHARD_OK);
    cr_assert_eq(reshard_plan_create(&t, 1, topo, NULL, &plan), RESHARD_OK);
    struct xfer_set xs;
    uint32_t rounds;
    cr_assert_eq(xfer_build(plan->p, RESHARD_ALGO_BCAST, &xs), RESHARD_OK);
    cr_assert_eq(nccl_rounds(&xs, &rounds), RESHARD_ERR_INVALID_ARG);
    cr_assert(strstr(reshard_last_error(), "bcast baseline needs reshard's own executor"));
    xfer_free(&xs);

    /* NCCL refusing a send: the status names the call, the tensor and the peer, and the
     * group is still closed */
    cr_assert_eq(xfer_build(plan->p, RESHARD_ALGO_RESHARD, &xs), RESHARD_OK);
    struct nccl_fns failing = fake;
    failing.send = refuse;
    memset(&rec, 0, sizeof(rec));
    int32_t src[32] = {0};
    reshard_buffers_t b = {src, sizeof(src), NULL, 0, RESHARD_MEM_CUDA};
    struct fake_comm comm = {0};
    cr_assert_eq(nccl_lower(plan->p, &xs, 0, &b, &failing, &comm, NULL), RESHARD_ERR_NETWORK);
    cr_assert(strstr(reshard_last_error(), "nccl: ncclSend of 64 bytes of tensor 'w' to rank 2: "
                                           "invalid usage (5)"),
              "%s", reshard_last_error());
    cr_assert_eq(rec.open, 0, "the group was closed");
    xfer_free(&xs);
    reshard_plan_destroy(plan);
    reshard_topo_destroy(topo);
    reshard_layout_destroy(s);
    reshard_layout_destroy(d);
}

/* ---- end to end, on stand-ins for libnccl and libcuda (test/fake/) ---- */

#include "test/fake/fake_nccl.h"

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define FAN_SRC "shape=48x40 dtype=i32 ranks=0-1 mesh=2 place=S(0)"
#define FAN_DST "shape=48x40 dtype=i32 ranks=2-3 mesh=2 place=R"

struct e2e {
    int status;
    long wrong;
    char msg[256];
};

static const char *build_dir(void)
{
    const char *b = getenv("RESHARD_BUILD");
    return b && *b ? b : "build";
}

/* The plans of e2e_rank verify every refit (reshard_plan_config_t.verify): what execute_stream
 * enqueued on NCCL is waited for, then checked. */
static int e2e_verify;

static void e2e_rank(int r, struct fake_shared *sh, struct e2e *out)
{
    struct fake_nccl_comm fc = {r, 4, sh};
    reshard_comm_t *comm = NULL;
    reshard_status_t st = reshard_comm_init_nccl(&fc, &comm);
    if (st == RESHARD_OK && (reshard_comm_rank(comm) != r || reshard_comm_size(comm) != 4))
        st = RESHARD_ERR_INTERNAL;
    reshard_layout_t *s = parse(FAN_SRC), *d = parse(FAN_DST);
    reshard_tensor_t t = {"w", s, d};
    reshard_plan_t *plan = NULL;
    reshard_plan_config_t cfg = RESHARD_PLAN_CONFIG_INIT;
    cfg.verify = e2e_verify;
    if (st == RESHARD_OK)
        st = reshard_comm_plan_create(comm, &t, 1, &cfg, &plan);
    size_t sb = 0, db = 0;
    reshard_layout_shard_bytes(s, r, &sb);
    reshard_layout_shard_bytes(d, r, &db);
    char *src = sb ? malloc(sb) : NULL, *dst = db ? calloc(1, db) : NULL;
    if (src)
        pattern(s, r, src, 0);
    reshard_buffers_t b = {src, sb, dst, db, RESHARD_MEM_CUDA};
    if (st == RESHARD_OK)
        st = reshard_plan_execute_stream(plan, &b, NULL);
    out->wrong = dst ? pattern(d, r, dst, 1) : 0;
    reshard_tensor_state_t state;
    if (st == RESHARD_OK && (reshard_plan_outcome(plan, &state) != RESHARD_ERR_INVALID_ARG ||
                             !strstr(reshard_last_error(), "enqueued on NCCL")))
        st = RESHARD_ERR_INTERNAL;
    /* without a stream, execute returns once done: the outcome is known */
    if (st == RESHARD_OK && (reshard_plan_execute(plan, &b) != RESHARD_OK ||
                             reshard_plan_outcome(plan, &state) != RESHARD_OK ||
                             state != (r >= 2 ? RESHARD_TENSOR_COMPLETE : RESHARD_TENSOR_NONE)))
        st = RESHARD_ERR_INTERNAL;
    /* rank 1 passes host memory: every rank is told before anything is enqueued */
    if (st == RESHARD_OK) {
        b.mem = r == 1 ? RESHARD_MEM_HOST : RESHARD_MEM_CUDA;
        st = reshard_plan_execute_stream(plan, &b, NULL);
        st = st == RESHARD_ERR_INVALID_ARG ? RESHARD_OK : RESHARD_ERR_INTERNAL;
    }
    char refused[256];
    snprintf(refused, sizeof(refused), "%s", reshard_last_error());
    if (st == RESHARD_OK && e2e_verify) { /* a wrong element on rank 3 is caught, every rank */
        b.mem = RESHARD_MEM_CUDA;
        if (r == 3)
            dst[5] ^= 1;
        st = reshard_plan_check_layouts(plan, &b);
        st = st == RESHARD_ERR_VERIFY && strstr(reshard_last_error(), "1 tensor whose")
                 ? RESHARD_OK
                 : RESHARD_ERR_INTERNAL;
        if (r == 3)
            dst[5] ^= 1;
    }
    out->status = st;
    snprintf(out->msg, sizeof(out->msg), "%s", st == RESHARD_OK ? refused : reshard_last_error());
    if (st == RESHARD_OK) { /* the communicator goes first: its plan enqueues nothing more */
        int posted = sh->ops[r];
        reshard_comm_destroy(comm);
        b.mem = RESHARD_MEM_CUDA;
        if (reshard_plan_execute_stream(plan, &b, NULL) != RESHARD_ERR_INVALID_ARG ||
            !strstr(reshard_last_error(), "communicator was destroyed") || sh->ops[r] != posted) {
            out->status = RESHARD_ERR_INTERNAL;
            snprintf(out->msg, sizeof(out->msg), "after reshard_comm_destroy: %s (%d ops more)",
                     reshard_last_error(), sh->ops[r] - posted);
        }
    }
    reshard_plan_destroy(plan); /* the communicator's last reference, if it was destroyed */
    reshard_layout_destroy(s);
    reshard_layout_destroy(d);
    free(src);
    free(dst);
}

static struct fake_shared *run_e2e(struct e2e **outs);

Test(nccl_exec, a_communicator_from_nccl_refits_through_nccl_across_forked_ranks, .timeout = 60)
{
    struct e2e *out;
    struct fake_shared *sh = run_e2e(&out);
    /* the data went through NCCL: the network slices, then the fan-out, in two groups */
    cr_assert_eq(sh->groups[0], 2, "rank 0 only sends, in round 0 (of two executions)");
    cr_assert_eq(sh->groups[2], 4, "rank 2 receives, then forwards (twice)");
    cr_assert_gt(sh->ops[2], 0);
}

Test(nccl_exec, a_verified_refit_on_nccl_waits_for_the_stream_and_checks_what_landed, .timeout = 60)
{
    e2e_verify = 1;
    struct e2e *out;
    run_e2e(&out);
}

/* Four forked ranks of e2e_rank on the recorder; asserts each one's outcome. */
static struct fake_shared *run_e2e(struct e2e **outs)
{
    char cuda[512], nccl[512];
    snprintf(cuda, sizeof(cuda), "%s/test/fake/libcuda.so.1", build_dir());
    snprintf(nccl, sizeof(nccl), "%s/test/fake/libnccl.so.2", build_dir());
    cr_assert_eq(access(cuda, R_OK) | access(nccl, R_OK), 0, "build %s and %s first", cuda, nccl);
    setenv("RESHARD_CUDA_LIB", cuda, 1);
    setenv("RESHARD_NCCL_LIB", nccl, 1);
    setenv("RESHARD_EXECUTOR", "nccl", 1);
    setenv("RESHARD_DOMAIN_SIZE", "2", 1);
    setenv("RESHARD_TIMEOUT", "20", 1);
    struct fake_shared *sh =
        mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    struct e2e *out =
        mmap(NULL, 4 * sizeof(*out), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert(sh != MAP_FAILED && out != MAP_FAILED);
    sh->size = 4;
    pid_t pid[4];
    for (int r = 0; r < 4; r++)
        if ((pid[r] = fork()) == 0) {
            e2e_rank(r, sh, &out[r]);
            _exit(0);
        }
    for (int r = 0; r < 4; r++) {
        int ws;
        waitpid(pid[r], &ws, 0);
        /* ASan ends a rank with status 1 after a report: that is a crash too */
        cr_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "rank %d crashed (status %#x)", r, ws);
    }
    for (int r = 0; r < 4; r++) {
        cr_assert_eq(out[r].status, RESHARD_OK, "rank %d: %d %s", r, out[r].status, out[r].msg);
        cr_assert_eq(out[r].wrong, 0, "rank %d: %ld elements wrong", r, out[r].wrong);
        cr_assert(strstr(out[r].msg, "rank 1: source buffer of tensor w is host memory: the NCCL "
                                     "executor moves device memory"),
                  "rank %d: %s", r, out[r].msg);
    }
    *outs = out;
    return sh;
}

Test(nccl_exec, missing_nccl_or_cuda_and_a_wrong_executor_are_clear_errors)
{
    char nccl[512];
    snprintf(nccl, sizeof(nccl), "%s/test/fake/libnccl.so.2", build_dir());
    struct fake_shared *sh = calloc(1, sizeof(*sh));
    sh->size = 1;
    struct fake_nccl_comm fc = {0, 1, sh};
    reshard_comm_t *comm = NULL;
    setenv("RESHARD_NCCL_LIB", "libnccl-not-here.so.2", 1);
    cr_assert_eq(reshard_comm_init_nccl(&fc, &comm), RESHARD_ERR_UNAVAILABLE);
    cr_assert(strstr(reshard_last_error(), "reshard_comm_init_nccl: nccl: libnccl-not-here.so.2: "
                                           "cannot open"),
              "%s", reshard_last_error());
    free(sh);
    cr_assert_null(comm);
    cr_assert_eq(reshard_comm_init_nccl(NULL, &comm), RESHARD_ERR_INVALID_ARG);
}

Test(nccl_exec, without_a_cuda_driver_init_nccl_says_why)
{
    char nccl[512];
    snprintf(nccl, sizeof(nccl), "%s/test/fake/libnccl.so.2", build_dir());
    setenv("RESHARD_NCCL_LIB", nccl, 1);
    setenv("RESHARD_CUDA_LIB", "libcuda-not-here.so.1", 1);
    struct fake_shared *sh = calloc(1, sizeof(*sh));
    sh->size = 1;
    struct fake_nccl_comm fc = {0, 1, sh};
    reshard_comm_t *comm = NULL;
    cr_assert_eq(reshard_comm_init_nccl(&fc, &comm), RESHARD_ERR_UNAVAILABLE);
    cr_assert(strstr(reshard_last_error(), "the all-gather needs a CUDA device: cuda: no driver"),
              "%s", reshard_last_error());
    free(sh);
}

static void one_rank_plan(reshard_comm_t **comm, reshard_plan_t **plan, reshard_layout_t **l)
{
    reshard_unique_id_t id;
    cr_assert_eq(reshard_get_unique_id(&id), RESHARD_OK);
    cr_assert_eq(reshard_comm_init_rank(&id, 0, 1, comm), RESHARD_OK, "%s", reshard_last_error());
    *l = parse("shape=4x4 dtype=i32 ranks=0 place=R");
    reshard_tensor_t t = {"w", *l, *l};
    cr_assert_eq(reshard_comm_plan_create(*comm, &t, 1, NULL, plan), RESHARD_OK);
}

Test(nccl_exec, the_nccl_executor_needs_a_communicator_from_nccl)
{
    setenv("RESHARD_EXECUTOR", "nccl", 1);
    reshard_comm_t *comm;
    reshard_plan_t *plan;
    reshard_layout_t *l;
    one_rank_plan(&comm, &plan, &l);
    int32_t a[16] = {0}, b[16];
    reshard_buffers_t bufs = {a, sizeof(a), b, sizeof(b), RESHARD_MEM_CUDA};
    cr_assert_eq(reshard_plan_execute(plan, &bufs), RESHARD_ERR_INVALID_ARG);
    cr_assert(strstr(reshard_last_error(), "RESHARD_EXECUTOR=nccl runs on a communicator made by "
                                           "reshard_comm_init_nccl"),
              "%s", reshard_last_error());
    reshard_plan_destroy(plan);
    reshard_comm_destroy(comm);
    reshard_layout_destroy(l);
}

Test(nccl_exec, an_unknown_executor_is_refused)
{
    setenv("RESHARD_EXECUTOR", "mpi", 1);
    reshard_comm_t *comm;
    reshard_plan_t *plan;
    reshard_layout_t *l;
    one_rank_plan(&comm, &plan, &l);
    int32_t a[16] = {0}, b[16];
    reshard_buffers_t bufs = {a, sizeof(a), b, sizeof(b), RESHARD_MEM_HOST};
    cr_assert_eq(reshard_plan_execute(plan, &bufs), RESHARD_ERR_INVALID_ARG);
    cr_assert(strstr(reshard_last_error(), "RESHARD_EXECUTOR=mpi: expected native or nccl"), "%s",
              reshard_last_error());
    reshard_plan_destroy(plan);
    reshard_comm_destroy(comm);
    reshard_layout_destroy(l);
}

/* The native executor on a stream waits for it first: with no driver a stream is an error,
 * with one (the stand-in) the refit runs. */
Test(nccl_exec, the_native_executor_orders_itself_after_a_stream)
{
    reshard_comm_t *comm;
    reshard_plan_t *plan;
    reshard_layout_t *l;
    setenv("RESHARD_CUDA_LIB", "libcuda-not-here.so.1", 1);
    one_rank_plan(&comm, &plan, &l);
    int32_t a[16], b[16] = {0};
    for (int i = 0; i < 16; i++)
        a[i] = i * 5;
    reshard_buffers_t bufs = {a, sizeof(a), b, sizeof(b), RESHARD_MEM_HOST};
    cr_assert_eq(reshard_plan_execute_stream(plan, &bufs, (void *)0x1), RESHARD_ERR_INVALID_ARG);
    cr_assert(strstr(reshard_last_error(), "a CUDA stream, but cuda: no driver"), "%s",
              reshard_last_error());
    cr_assert_eq(reshard_plan_execute_stream(plan, &bufs, NULL), RESHARD_OK,
                 "without a driver the default stream holds no work: %s", reshard_last_error());
    cr_assert_arr_eq(a, b, sizeof(a));
    reshard_plan_destroy(plan);
    reshard_comm_destroy(comm);
    reshard_layout_destroy(l);
}

Test(nccl_exec, with_a_driver_the_native_executor_waits_for_the_stream)
{
    char cuda[512];
    snprintf(cuda, sizeof(cuda), "%s/test/fake/libcuda.so.1", build_dir());
    setenv("RESHARD_CUDA_LIB", cuda, 1);
    reshard_comm_t *comm;
    reshard_plan_t *plan;
    reshard_layout_t *l;
    one_rank_plan(&comm, &plan, &l);
    int32_t a[16], b[16] = {0};
    for (int i = 0; i < 16; i++)
        a[i] = 100 - i;
    reshard_buffers_t bufs = {a, sizeof(a), b, sizeof(b), RESHARD_MEM_HOST};
    cr_assert_eq(reshard_plan_execute_stream(plan, &bufs, (void *)0x1), RESHARD_OK, "%s",
                 reshard_last_error());
    cr_assert_arr_eq(a, b, sizeof(a));
    reshard_plan_destroy(plan);
    reshard_comm_destroy(comm);
    reshard_layout_destroy(l);
}

Test(nccl_exec, a_tensor_quantized_on_the_way_is_refused_naming_it, .timeout = 60)
{
    char cuda[512], nccl[512];
    snprintf(cuda, sizeof(cuda), "%s/test/fake/libcuda.so.1", build_dir());
    snprintf(nccl, sizeof(nccl), "%s/test/fake/libnccl.so.2", build_dir());
    cr_assert_eq(access(cuda, R_OK) | access(nccl, R_OK), 0, "build %s and %s first", cuda, nccl);
    setenv("RESHARD_CUDA_LIB", cuda, 1);
    setenv("RESHARD_NCCL_LIB", nccl, 1);
    setenv("RESHARD_EXECUTOR", "nccl", 1);
    struct fake_shared *sh = calloc(1, sizeof(*sh));
    sh->size = 1;
    struct fake_nccl_comm fc = {0, 1, sh};
    reshard_comm_t *comm = NULL;
    cr_assert_eq(reshard_comm_init_nccl(&fc, &comm), RESHARD_OK, "%s", reshard_last_error());
    reshard_layout_t *s = parse("shape=128x128 dtype=bf16 ranks=0 place=R");
    reshard_layout_t *d = parse("shape=128x128 dtype=fp8e4m3 ranks=0 place=R quant=block(128,128)");
    reshard_tensor_t t = {"q.weight", s, d};
    reshard_plan_t *plan = NULL;
    cr_assert_eq(reshard_comm_plan_create(comm, &t, 1, NULL, &plan), RESHARD_OK, "%s",
                 reshard_last_error());
    cr_assert_eq(reshard_plan_ntensors(plan), 2);
    static uint16_t src[128 * 128];
    static uint8_t dst[128 * 128];
    float scale;
    reshard_buffers_t b[2] = {{src, sizeof(src), dst, sizeof(dst), RESHARD_MEM_CUDA},
                              {NULL, 0, &scale, sizeof(scale), RESHARD_MEM_CUDA}};
    cr_assert_eq(reshard_plan_execute(plan, b), RESHARD_ERR_INVALID_ARG);
    cr_assert(strstr(reshard_last_error(), "tensor 'q.weight' is quantized on the way (bf16 -> "
                                           "fp8e4m3), which RESHARD_EXECUTOR=nccl does not do"),
              "%s", reshard_last_error());
    reshard_plan_destroy(plan);
    reshard_comm_destroy(comm);
    reshard_layout_destroy(s);
    reshard_layout_destroy(d);
    free(sh);
}
