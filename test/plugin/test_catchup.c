/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Catching up from peers (reshard_plan_catch_up) on forked ranks: 4 trainers (ranks 0-3) and
 * inference ranks in domains of 2. A replacement (a new process taking the number of an
 * inference rank that left) and a new TP2 replica (two new processes past the size) catch up
 * from the inference replicas while the trainers, who have moved on to the next version, send
 * nothing; every element is checked, the bytes come from the transports' own counters, and the
 * next refit includes the joiners. With delta refits a joiner that skipped the catch-up gets
 * full values, never a delta on top of nothing.
 */
#include "ranks.h"
#include "side.h"
#include "plugin/reshard.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define NT    2 /* a weight, sharded; a norm, replicated on every inference rank */
#define W_SRC "shape=64x48 dtype=i32 ranks=0-3 mesh=4 place=S(0)"
#define N_SRC "shape=8x16 dtype=i32 ranks=0-3 place=R"
/* DP2 x TP2: replicas 4-5 and 6-7 */
#define W_DST "shape=64x48 dtype=i32 ranks=4-7 mesh=2x2 place=R,S(1)"
#define N_DST "shape=8x16 dtype=i32 ranks=4-7 place=R"
/* one TP2 replica, before the growth */
#define W_DST1 "shape=64x48 dtype=i32 ranks=4-5 mesh=2 place=S(1)"
#define N_DST1 "shape=8x16 dtype=i32 ranks=4-5 place=R"
#define BIG    1000000

static void catchup_env(void)
{
    setenv("RESHARD_DOMAIN_SIZE", "2", 1);
    setenv("RESHARD_TIMEOUT", "40", 1);
    setenv("UCX_LOG_LEVEL", "error", 1);
}

TestSuite(catchup_comm, .init = catchup_env, .timeout = 180);

/* Where rank 0 leaves the join id for the joiners, and what the joiners report. */
struct mailbox {
    volatile int ready;
    reshard_unique_id_t id;
    struct outcome joined[2];
};
static struct mailbox *box;

static void open_mailbox(void)
{
    box = mmap(NULL, sizeof(*box), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(box, MAP_FAILED);
    memset(box, 0, sizeof(*box));
}

static reshard_status_t fail(reshard_status_t st, const char *what, int rank)
{
    fprintf(stderr, "catchup: rank %d: %s: %s\n", rank, what, reshard_last_error());
    return st != RESHARD_OK ? st : RESHARD_ERR_INTERNAL;
}

/* One rank's weights: its source and destination shards of both tensors. Element i of version
 * v is i, plus v * BIG where i % every == 0 (every 1: all change; 20: 5% change). */
struct model {
    reshard_layout_t *src[NT], *dst[NT];
    int32_t *s[NT], *d[NT];
    reshard_buffers_t b[NT];
    int every;
};

static void model_open(struct model *m, int rank, const char *w_dst, const char *n_dst, int every)
{
    const char *src[NT] = {W_SRC, N_SRC}, *dst[NT] = {w_dst, n_dst};
    memset(m, 0, sizeof(*m));
    m->every = every;
    for (int t = 0; t < NT; t++) {
        m->src[t] = parse(src[t]);
        m->dst[t] = parse(dst[t]);
        reshard_layout_shard_bytes(m->src[t], rank, &m->b[t].src_bytes);
        reshard_layout_shard_bytes(m->dst[t], rank, &m->b[t].dst_bytes);
        m->s[t] = calloc(1, m->b[t].src_bytes + 4);
        m->d[t] = malloc(m->b[t].dst_bytes + 4);
        memset(m->d[t], 0x5a, m->b[t].dst_bytes + 4); /* a new process holds nothing */
        m->b[t].src = m->b[t].src_bytes ? m->s[t] : NULL;
        m->b[t].dst = m->b[t].dst_bytes ? m->d[t] : NULL;
    }
}

/* The destination layouts change with a growth; the buffers they name stay. */
static int model_regrow(struct model *m, int rank, const char *w_dst, const char *n_dst)
{
    int same = 1;
    const char *dst[NT] = {w_dst, n_dst};
    for (int t = 0; t < NT; t++) {
        reshard_layout_destroy(m->dst[t]);
        m->dst[t] = parse(dst[t]);
        size_t bytes = 0;
        reshard_layout_shard_bytes(m->dst[t], rank, &bytes);
        same &= bytes == m->b[t].dst_bytes; /* a member's shard keeps its size */
    }
    return same;
}

static void model_close(struct model *m)
{
    for (int t = 0; t < NT; t++) {
        reshard_layout_destroy(m->src[t]);
        reshard_layout_destroy(m->dst[t]);
        free(m->s[t]);
        free(m->d[t]);
    }
}

static void versioned(const struct model *m, const reshard_layout_t *l, int rank, int version,
                      int32_t *buf)
{
    int64_t shape[8], n = 0;
    reshard_layout_shard_shape(l, rank, shape, &n);
    fill(l, rank, buf);
    for (int64_t i = 0; i < n; i++)
        buf[i] += buf[i] % m->every == 0 ? version * BIG : 0;
}

static void model_train(struct model *m, int rank, int version)
{
    for (int t = 0; t < NT; t++)
        versioned(m, m->src[t], rank, version, m->s[t]);
}

/* Elements of this rank's destination shards that are not those of `version`. */
static int model_wrong(const struct model *m, int rank, int version)
{
    int wrong = 0;
    for (int t = 0; t < NT; t++) {
        size_t n = m->b[t].dst_bytes / 4;
        if (!n)
            continue;
        int32_t *want = malloc(n * 4);
        versioned(m, m->dst[t], rank, version, want);
        for (size_t i = 0; i < n; i++)
            wrong += m->d[t][i] != want[i];
        free(want);
    }
    return wrong;
}

static uint64_t model_dst_bytes(const struct model *m)
{
    return m->b[0].dst_bytes + m->b[1].dst_bytes;
}

static reshard_status_t model_plan(struct model *m, reshard_comm_t *c, int delta,
                                   reshard_plan_t **plan)
{
    reshard_tensor_t t[NT] = {{"w", m->src[0], m->dst[0]}, {"norm", m->src[1], m->dst[1]}};
    reshard_plan_config_t cfg = RESHARD_PLAN_CONFIG_INIT;
    cfg.delta = delta;
    return reshard_comm_plan_create(c, t, NT, &cfg, plan);
}

/* A refit of `version` on every rank; the destinations checked. */
static reshard_status_t refit(struct model *m, reshard_plan_t *p, int rank, int version)
{
    if (rank < 4)
        model_train(m, rank, version);
    reshard_status_t st = reshard_plan_execute(p, m->b);
    if (st != RESHARD_OK)
        return fail(st, "refit", rank);
    int wrong = model_wrong(m, rank, version);
    if (wrong) {
        fprintf(stderr, "catchup: rank %d: %d elements are not version %d after a refit\n", rank,
                wrong, version);
        return RESHARD_ERR_INTERNAL;
    }
    return RESHARD_OK;
}

/* The part every rank of the grown communicator plays: plan the refit, then (catch_up) let
 * the joiners catch up while the trainers hold version 2 and the others version 1, checking
 * who moved what, then refit version 2 (and 3, in deltas). */
struct grown {
    const int *joiners;
    int njoiners;
    int catch_up, delta;
    uint64_t domain_net_in_max; /* what may enter a joiners' domain over the network */
};

static int is_joiner(const struct grown *g, int rank)
{
    for (int i = 0; i < g->njoiners; i++)
        if (g->joiners[i] == rank)
            return 1;
    return 0;
}

static reshard_status_t check_moved(const struct grown *g, int rank, const struct model *m,
                                    const reshard_comm_counters_t *a,
                                    const reshard_comm_counters_t *b,
                                    const reshard_plan_stats_t *ws)
{
    uint64_t net_out = b->net_out - a->net_out, net_in = b->net_in - a->net_in;
    uint64_t local_out = b->local_out - a->local_out, local_in = b->local_in - a->local_in;
    if (rank == 0)
        fprintf(stderr, "catchup: the catch-up moved %llu bytes over the network (min %llu)\n",
                (unsigned long long)ws->net_bytes, (unsigned long long)ws->min_net_bytes);
    if (ws->net_bytes != ws->min_net_bytes || ws->net_bytes > g->domain_net_in_max) {
        fprintf(stderr, "catchup: rank %d: net_bytes %llu, min %llu, at most %llu\n", rank,
                (unsigned long long)ws->net_bytes, (unsigned long long)ws->min_net_bytes,
                (unsigned long long)g->domain_net_in_max);
        return RESHARD_ERR_INTERNAL;
    }
    if (rank < 4 && (net_out || local_out)) {
        fprintf(stderr, "catchup: trainer %d sent %llu + %llu bytes for the joiners\n", rank,
                (unsigned long long)net_out, (unsigned long long)local_out);
        return RESHARD_ERR_INTERNAL;
    }
    if (is_joiner(g, rank)) {
        fprintf(stderr, "catchup: joiner %d received %llu bytes over the network, %llu locally\n",
                rank, (unsigned long long)net_in, (unsigned long long)local_in);
        if (net_in + local_in != model_dst_bytes(m) || net_out) {
            fprintf(stderr,
                    "catchup: joiner %d: received %llu of its %llu shard bytes, sent %llu\n", rank,
                    (unsigned long long)(net_in + local_in), (unsigned long long)model_dst_bytes(m),
                    (unsigned long long)net_out);
            return RESHARD_ERR_INTERNAL;
        }
    } else if (net_in || local_in) {
        fprintf(stderr, "catchup: rank %d, no joiner, received %llu bytes\n", rank,
                (unsigned long long)(net_in + local_in));
        return RESHARD_ERR_INTERNAL;
    }
    return RESHARD_OK;
}

static reshard_status_t on_the_grown_comm(const struct grown *g, int rank, reshard_comm_t *c,
                                          struct model *m)
{
    reshard_plan_t *p = NULL, *cu = NULL;
    reshard_status_t st = model_plan(m, c, g->delta, &p);
    if (st != RESHARD_OK)
        return fail(st, "refit plan on the grown comm", rank);
    if (g->catch_up) {
        if (rank < 4)
            model_train(m, rank, 2); /* the trainers moved on */
        reshard_comm_counters_t a, b;
        reshard_plan_stats_t ws;
        if ((st = reshard_plan_catch_up(p, g->joiners, g->njoiners, NULL, &cu)) != RESHARD_OK)
            return fail(st, "catch-up plan", rank);
        if ((st = reshard_comm_counters(c, &a)) == RESHARD_OK &&
            (st = reshard_plan_execute(cu, m->b)) == RESHARD_OK &&
            (st = reshard_comm_counters(c, &b)) == RESHARD_OK)
            st = reshard_plan_stats(cu, &ws, NULL);
        if (st != RESHARD_OK)
            return fail(st, "catch-up", rank);
        if ((st = check_moved(g, rank, m, &a, &b, &ws)) != RESHARD_OK)
            return st;
        int wrong = model_wrong(m, rank, 1);
        if (wrong) {
            fprintf(stderr, "catchup: rank %d: %d elements not of version 1 after the catch-up\n",
                    rank, wrong);
            return RESHARD_ERR_INTERNAL;
        }
        reshard_plan_destroy(cu);
    }
    st = refit(m, p, rank, 2); /* the next refit includes the joiners */
    if (st == RESHARD_OK && g->delta)
        st = refit(m, p, rank, 3);
    reshard_plan_destroy(p);
    return st;
}

/* ---- a replacement ---- */

static struct grown replace = {.joiners = (const int[]){7}, .njoiners = 1, .catch_up = 1};

/* Inference rank 7 leaves (as a preempted instance would); the others shrink it away and grow
 * it back, and a new process joins as rank 7. */
static reshard_status_t members_replace(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    struct model m;
    model_open(&m, rank, W_DST, N_DST, replace.delta ? 20 : 1);
    reshard_plan_t *p0 = NULL;
    reshard_status_t st = model_plan(&m, comm, replace.delta, &p0);
    if (st == RESHARD_OK)
        st = refit(&m, p0, rank, 1);
    if (st == RESHARD_OK && replace.delta) /* versions held: the next one is sent in deltas */
        st = refit(&m, p0, rank, 1);
    reshard_plan_destroy(p0);
    if (st == RESHARD_OK)
        st = reshard_comm_barrier(comm);
    if (st != RESHARD_OK)
        return fail(st, "refit before the leave", rank);
    if (rank == 7) {
        st = reshard_comm_leave(comm);
        model_close(&m);
        return st;
    }
    int seven = 7;
    reshard_comm_t *c1 = NULL, *c2 = NULL;
    (void)reshard_comm_barrier(comm); /* fails: rank 7 left */
    if ((st = reshard_comm_shrink(comm, &seven, 1, &c1)) != RESHARD_OK)
        return fail(st, "shrink", rank);
    if (rank == 0) {
        if ((st = reshard_comm_grow_id(c1, &seven, 1, &box->id)) != RESHARD_OK)
            return fail(st, "grow id", rank);
        __sync_synchronize();
        box->ready = 1;
    }
    if ((st = reshard_comm_grow(c1, &seven, 1, &c2)) != RESHARD_OK)
        return fail(st, "grow", rank);
    st = on_the_grown_comm(&replace, rank, c2, &m);
    if (st == RESHARD_OK) {
        reshard_comm_destroy(c2);
        reshard_comm_destroy(c1);
    }
    model_close(&m);
    return st;
}

/* A new process: joins as `rank` with the joiners' list, holding nothing. */
static void run_joiner(int i, int rank, const struct grown *g, const char *w_dst, const char *n_dst)
{
    while (!box->ready)
        usleep(10 * 1000);
    reshard_comm_t *c = NULL;
    struct model m;
    model_open(&m, rank, w_dst, n_dst, g->delta ? 20 : 1);
    reshard_status_t st = reshard_comm_join(&box->id, rank, g->joiners, g->njoiners, &c);
    if (st == RESHARD_OK)
        st = on_the_grown_comm(g, rank, c, &m);
    else
        fail(st, "join", rank);
    box->joined[i].status = st;
    snprintf(box->joined[i].msg, sizeof(box->joined[i].msg), "%s", reshard_last_error());
    if (st == RESHARD_OK)
        reshard_comm_destroy(c);
    model_close(&m);
}

static pid_t fork_joiner(int i, int rank, const struct grown *g, const char *w_dst,
                         const char *n_dst)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        run_joiner(i, rank, g, w_dst, n_dst);
        _exit(0);
    }
    return pid;
}

static void wait_joiner(pid_t pid, int i)
{
    int ws;
    cr_assert_eq(waitpid(pid, &ws, 0), pid);
    cr_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "joiner %d crashed", i);
    cr_assert_eq(box->joined[i].status, RESHARD_OK, "joiner %d: %s", i, box->joined[i].msg);
}

Test(catchup_comm, a_replacement_catches_up_from_its_replica_and_the_trainers_send_nothing)
{
    open_mailbox();
    replace.delta = 0;
    replace.domain_net_in_max = 64 * 24 * 4; /* its TP shard; the norm is beside it */
    pid_t j = fork_joiner(0, 7, &replace, W_DST, N_DST);
    all_ok(run_ranks(8, members_replace), 8);
    wait_joiner(j, 0);
}

/* With delta refits, a replacement that skips the catch-up gets its first refit in full (the
 * others hold versions sent as deltas before), and the next one in deltas, exactly. */
Test(catchup_comm, with_delta_refits_a_joiner_never_gets_a_delta_on_top_of_nothing)
{
    open_mailbox();
    replace.delta = 1;
    replace.catch_up = 0;
    pid_t j = fork_joiner(0, 7, &replace, W_DST, N_DST);
    all_ok(run_ranks(8, members_replace), 8);
    wait_joiner(j, 0);
    replace.catch_up = 1;
}

/* ---- growth: a new TP2 replica on a node of its own ---- */

static struct grown growth = {.joiners = (const int[]){6, 7}, .njoiners = 2, .catch_up = 1};

static reshard_status_t members_grow(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    struct model m;
    model_open(&m, rank, W_DST1, N_DST1, 1);
    reshard_plan_t *p0 = NULL;
    reshard_status_t st = model_plan(&m, comm, 0, &p0);
    if (st == RESHARD_OK)
        st = refit(&m, p0, rank, 1);
    reshard_plan_destroy(p0);
    if (st != RESHARD_OK)
        return fail(st, "refit before the growth", rank);
    if (rank == 0) {
        if ((st = reshard_comm_grow_id(comm, growth.joiners, 2, &box->id)) != RESHARD_OK)
            return fail(st, "grow id", rank);
        __sync_synchronize();
        box->ready = 1;
    }
    reshard_comm_t *c2 = NULL;
    if ((st = reshard_comm_grow(comm, growth.joiners, 2, &c2)) != RESHARD_OK)
        return fail(st, "grow", rank);
    if (!model_regrow(&m, rank, W_DST, N_DST))
        return fail(RESHARD_ERR_INTERNAL, "the grown layouts resize a member's shard", rank);
    st = on_the_grown_comm(&growth, rank, c2, &m);
    if (st == RESHARD_OK)
        reshard_comm_destroy(c2);
    model_close(&m);
    return st;
}

Test(catchup_comm, a_new_replica_takes_one_copy_into_its_domain_and_the_trainers_send_nothing)
{
    open_mailbox();
    growth.domain_net_in_max = 64 * 48 * 4 + 8 * 16 * 4; /* one copy of both tensors */
    pid_t j0 = fork_joiner(0, 6, &growth, W_DST, N_DST);
    pid_t j1 = fork_joiner(1, 7, &growth, W_DST, N_DST);
    all_ok(run_ranks(6, members_grow), 6);
    wait_joiner(j0, 0);
    wait_joiner(j1, 1);
}

/* ---- an FP8 destination: codes and scales come from a replica as they are ---- */

#define Q_SRC   "shape=256x128 dtype=bf16 ranks=0 place=R"
#define Q_BYTES (256 * 128 + 2 * 1 * 4) /* the codes, then the scales of 2 x 1 blocks */
#define Q_DST(ranks, n)                                                                            \
    "shape=256x128 dtype=fp8e4m3 ranks=" ranks " mesh=" n " place=R quant=block(128,128)"

struct fp8_box {
    volatile int ready;
    reshard_unique_id_t id;
    unsigned char replica[Q_BYTES]; /* rank 1's codes and scales after each step */
    struct outcome joined;
};
static struct fp8_box *qbox;

/* This rank's plan of the weight (and its scales), with buffers sized from the plan. */
struct fp8_side {
    reshard_layout_t *src, *dst;
    reshard_plan_t *plan;
    uint16_t *w;
    unsigned char out[Q_BYTES];
    reshard_buffers_t b[2];
};

static reshard_status_t fp8_open(struct fp8_side *x, reshard_comm_t *c, int rank, const char *dst)
{
    memset(x, 0, sizeof(*x));
    x->src = parse(Q_SRC);
    x->dst = parse(dst);
    reshard_tensor_t t = {"w.weight", x->src, x->dst};
    reshard_status_t st = reshard_comm_plan_create(c, &t, 1, NULL, &x->plan);
    if (st != RESHARD_OK)
        return st;
    reshard_layout_shard_bytes(x->src, rank, &x->b[0].src_bytes);
    reshard_layout_shard_bytes(x->dst, rank, &x->b[0].dst_bytes);
    reshard_layout_t *sl = NULL;
    if ((st = reshard_plan_tensor_layout(x->plan, 1, 1, &sl)) != RESHARD_OK)
        return st;
    reshard_layout_shard_bytes(sl, rank, &x->b[1].dst_bytes);
    reshard_layout_destroy(sl);
    if (x->b[0].dst_bytes && x->b[0].dst_bytes + x->b[1].dst_bytes != Q_BYTES)
        return RESHARD_ERR_INTERNAL;
    memset(x->out, 0x5a, sizeof(x->out)); /* a new process holds nothing */
    x->b[0].dst = x->b[0].dst_bytes ? x->out : NULL;
    x->b[1].dst = x->b[1].dst_bytes ? x->out + x->b[0].dst_bytes : NULL;
    x->w = calloc(1, x->b[0].src_bytes + 2);
    x->b[0].src = x->b[0].src_bytes ? x->w : NULL;
    return RESHARD_OK;
}

static void fp8_train(struct fp8_side *x, int version)
{
    for (size_t i = 0; i < x->b[0].src_bytes / 2; i++) /* finite bf16: 1.0 .. 2.0, signed */
        x->w[i] =
            (uint16_t)(0x3f80 + (i * 7 + (size_t)version * 13) % 128 + (i % 3 == 0 ? 0x8000 : 0));
}

static void fp8_close(struct fp8_side *x)
{
    reshard_plan_destroy(x->plan);
    reshard_layout_destroy(x->src);
    reshard_layout_destroy(x->dst);
    free(x->w);
}

/* On the grown communicator (ranks 0-3, the weight on 1-3): rank 3 catches up from the
 * replicas, the trainer (rank 0, a version ahead) sending nothing; its codes and scales are
 * then rank 1's byte for byte; after the next refit, too. */
static reshard_status_t fp8_grown(reshard_comm_t *c, int rank, struct fp8_side *x)
{
    reshard_plan_t *cu = NULL;
    int three = 3;
    reshard_comm_counters_t a, b;
    reshard_status_t st;
    if (rank == 0)
        fp8_train(x, 2);
    if ((st = reshard_plan_catch_up(x->plan, &three, 1, NULL, &cu)) != RESHARD_OK ||
        (st = reshard_comm_counters(c, &a)) != RESHARD_OK ||
        (st = reshard_plan_execute(cu, x->b)) != RESHARD_OK ||
        (st = reshard_comm_counters(c, &b)) != RESHARD_OK)
        return fail(st, "fp8 catch-up", rank);
    reshard_plan_destroy(cu);
    if (rank == 0 && b.net_out + b.local_out != a.net_out + a.local_out)
        return fail(RESHARD_ERR_INTERNAL, "the trainer sent bytes for the joiner", rank);
    for (int step = 0; step < 2; step++) {
        if (rank == 1)
            memcpy(qbox->replica, x->out, Q_BYTES);
        if ((st = reshard_comm_barrier(c)) != RESHARD_OK)
            return fail(st, "barrier", rank);
        if (rank == 3 && memcmp(qbox->replica, x->out, Q_BYTES))
            return fail(RESHARD_ERR_INTERNAL, "codes or scales differ from the replica's", rank);
        if ((st = reshard_comm_barrier(c)) != RESHARD_OK)
            return fail(st, "barrier", rank);
        if (step == 0 && (st = reshard_plan_execute(x->plan, x->b)) != RESHARD_OK)
            return fail(st, "refit after the catch-up", rank);
    }
    return RESHARD_OK;
}

static reshard_status_t fp8_members(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    struct fp8_side x0, x;
    int three = 3;
    reshard_status_t st = fp8_open(&x0, comm, rank, Q_DST("1-2", "2"));
    if (rank == 0)
        fp8_train(&x0, 1);
    if (st == RESHARD_OK)
        st = reshard_plan_execute(x0.plan, x0.b);
    if (st != RESHARD_OK)
        return fail(st, "fp8 refit before the growth", rank);
    if (rank == 0) {
        if ((st = reshard_comm_grow_id(comm, &three, 1, &qbox->id)) != RESHARD_OK)
            return fail(st, "grow id", rank);
        __sync_synchronize();
        qbox->ready = 1;
    }
    reshard_comm_t *c2 = NULL;
    if ((st = reshard_comm_grow(comm, &three, 1, &c2)) != RESHARD_OK)
        return fail(st, "grow", rank);
    if ((st = fp8_open(&x, c2, rank, Q_DST("1-3", "3"))) != RESHARD_OK)
        return fail(st, "fp8 plan on the grown comm", rank);
    memcpy(x.out, x0.out, Q_BYTES); /* what the replicas hold */
    if (rank == 0)
        memcpy(x.w, x0.w, x.b[0].src_bytes);
    st = fp8_grown(c2, rank, &x);
    fp8_close(&x);
    fp8_close(&x0);
    if (st == RESHARD_OK)
        reshard_comm_destroy(c2);
    return st;
}

Test(catchup_comm, an_fp8_joiner_gets_its_replicas_codes_and_scales_byte_for_byte)
{
    qbox = mmap(NULL, sizeof(*qbox), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(qbox, MAP_FAILED);
    memset(qbox, 0, sizeof(*qbox));
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        while (!qbox->ready)
            usleep(10 * 1000);
        reshard_comm_t *c = NULL;
        struct fp8_side x;
        int three = 3;
        reshard_status_t st = reshard_comm_join(&qbox->id, 3, &three, 1, &c);
        if (st == RESHARD_OK && (st = fp8_open(&x, c, 3, Q_DST("1-3", "3"))) == RESHARD_OK) {
            st = fp8_grown(c, 3, &x);
            fp8_close(&x);
        }
        qbox->joined.status = st;
        snprintf(qbox->joined.msg, sizeof(qbox->joined.msg), "%s", reshard_last_error());
        if (st == RESHARD_OK)
            reshard_comm_destroy(c);
        _exit(0);
    }
    all_ok(run_ranks(3, fp8_members), 3);
    int ws;
    cr_assert_eq(waitpid(pid, &ws, 0), pid);
    cr_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "the joiner crashed");
    cr_assert_eq(qbox->joined.status, RESHARD_OK, "joiner: %s", qbox->joined.msg);
}
