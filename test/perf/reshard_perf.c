/* SPDX-License-Identifier: Apache-2.0 */
/*
 * reshard_perf: nccl-tests style bandwidth test of reshard_plan_execute (docs/figures.md),
 * written against the public API only.
 *
 * For each size of the sweep and each algo: plan on the communicator, run WARMUP untimed and
 * ITERS timed executes, report the median over iterations of the slowest rank's time, check
 * every destination element against a pattern of (tensor, global index, iteration), and
 * compare the bytes the transports counted with what the plan says each rank moves.
 *
 * The sweep and the model are made in perf_sweep.c, the command line read in perf_args.c.
 */
#include "reshard_perf.h"

#include <errno.h>
#include <stddef.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define POISON  0xA5 /* destination bytes before each checked execute */
#define MIB     (1024.0 * 1024.0)
#define GRACE_S 3.0 /* -np: how long the other ranks get to exit after one fails */

const char *const algo_names[] = {
    [RESHARD_ALGO_RESHARD] = "reshard",
    [RESHARD_ALGO_DIRECT] = "direct",
    [RESHARD_ALGO_BCAST] = "bcast",
};

/* ---- one execute ---- */

/* Allgathers one double per rank and returns the largest. */
static int gather_max(struct ctx *c, double v, double *max)
{
    c->gather[c->rank] = v;
    if (!ok(c, reshard_comm_allgather(c->comm, c->gather, sizeof(double)),
            "reshard_comm_allgather"))
        return 1;
    *max = c->gather[0];
    for (int r = 1; r < c->size; r++)
        if (c->gather[r] > *max)
            *max = c->gather[r];
    return 0;
}

static uint64_t ctrl_bytes(const reshard_comm_counters_t *n)
{
    return n->boot_out + n->boot_in + n->ctrl_bytes_out + n->ctrl_bytes_in;
}

/* Execute number `iter`; time_us, when not NULL, gets the slowest rank's time. */
static int iterate(struct ctx *c, reshard_plan_t *plan, const struct tensor_run *t, int nt,
                   reshard_buffers_t *bufs, int iter, double *time_us, uint64_t *wrong)
{
    for (int i = 0; i < nt; i++) {
        struct perf_quant *q = (struct perf_quant *)&t[i].q;
        bufs[i] = (reshard_buffers_t){t[i].sbuf, t[i].smap.bytes, t[i].dbuf, t[i].dmap.bytes,
                                      RESHARD_MEM_HOST};
        if (q->on) /* its scales: computed by the library, or the FP8 source's own */
            bufs[q->scales] = (reshard_buffers_t){q->ssbuf, q->ssbuf ? q->ssrc.bytes : 0, q->sdbuf,
                                                  q->sdst.bytes, RESHARD_MEM_HOST};
        int changes = c->o->change.pct >= 0 && iter > 0 && !q->on;
        if (changes && t[i].sbuf)
            shard_change(&t[i].smap, t[i].sbuf, pattern_key(i, iter), &c->o->change, iter);
        else if ((c->o->check || c->o->change.pct >= 0) && t[i].sbuf && q->on)
            pq_fill(q, &t[i].smap, t[i].sbuf, pattern_key(i, iter));
        else if ((c->o->check || c->o->change.pct >= 0) && t[i].sbuf)
            shard_fill(&t[i].smap, t[i].sbuf, pattern_key(i, iter));
        if (c->o->check && t[i].dbuf && changes)
            memcpy(t[i].dprev, t[i].dbuf, t[i].dmap.bytes);
        else if (c->o->check && t[i].dbuf && (!c->o->keep_dst || iter == 0))
            memset(t[i].dbuf, POISON, t[i].dmap.bytes);
        if (c->o->check && q->sdbuf)
            memset(q->sdbuf, POISON, q->sdst.bytes);
    }
    if (!ok(c, reshard_comm_barrier(c->comm), "reshard_comm_barrier"))
        return 1;
    reshard_comm_counters_t n0, n1;
    reshard_comm_counters(c->comm, &n0); /* local: no collective around the execute */
    double t0 = now_s();
    reshard_status_t st = reshard_plan_execute(plan, bufs);
    double t1 = now_s();
    if (!ok(c, st, "reshard_plan_execute"))
        return 1;
    reshard_comm_counters(c->comm, &n1);
    double *most = iter == 0 ? &c->ctrl.first : &c->ctrl.steady;
    double ctrl = (double)(ctrl_bytes(&n1) - ctrl_bytes(&n0));
    *most = ctrl > *most ? ctrl : *most;
    for (int i = 0; c->o->check && i < nt; i++)
        if (t[i].q.on) /* every FP8 element and every scale */
            *wrong +=
                pq_check((struct perf_quant *)&t[i].q, &t[i].dmap, t[i].dbuf, pattern_key(i, iter));
        else if (t[i].dbuf && c->o->change.pct >= 0 && iter > 0)
            *wrong += shard_check_changed(&t[i].dmap, t[i].dbuf, t[i].dprev, pattern_key(i, iter),
                                          &c->o->change, iter);
        else if (t[i].dbuf)
            *wrong += shard_check(&t[i].dmap, t[i].dbuf, pattern_key(i, iter));
    return time_us ? gather_max(c, (t1 - t0) * 1e6, time_us) : 0;
}

/* ---- one row of the table ---- */

struct row {
    size_t bytes;
    int64_t count;
    const char *type;
    reshard_algo_t algo;
    double time_us, net_mb, min_mb, nic_mb;
    uint64_t wrong;
    int differ;
};

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void delta4(const reshard_comm_counters_t *a, const reshard_comm_counters_t *b,
                   uint64_t d[4])
{
    d[0] = b->net_out - a->net_out;
    d[1] = b->net_in - a->net_in;
    d[2] = b->local_out - a->local_out;
    d[3] = b->local_in - a->local_in;
}

/* Busiest NIC per iteration: a domain's ranks share its NIC, full duplex. Each rank sums its
 * own domain, so every domain is summed once per member: quadratic, and cheap at these sizes. */
static double nic_bytes(const struct ctx *c)
{
    uint64_t best = 0, d[4];
    for (int r = 0; r < c->size; r++) {
        uint64_t out = 0, in = 0;
        for (int q = 0; q < c->size; q++) {
            if (c->ranks[q].domain != c->ranks[r].domain)
                continue;
            delta4(&c->before[q], &c->after[q], d);
            out += d[0];
            in += d[1];
        }
        best = out > best ? out : best;
        best = in > best ? in : best;
    }
    return (double)best / c->o->iters;
}

/* Counts ranks whose measured bytes per iteration differ from the plan's. */
static int compare_plan(struct ctx *c, const struct row *row)
{
    int differ = 0;
    for (int r = 0; r < c->size; r++) {
        const reshard_rank_stats_t *s = &c->ranks[r];
        uint64_t d[4], want[4] = {s->net_out, s->net_in, s->local_out, s->local_in};
        int same = 1;
        delta4(&c->before[r], &c->after[r], d);
        for (int k = 0; k < 4; k++)
            same &= d[k] == want[k] * (uint64_t)c->o->iters;
        if (same)
            continue;
        differ++;
        if (c->nnotes < MAX_NOTES)
            snprintf(c->notes[c->nnotes++], sizeof(c->notes[0]),
                     "%zu bytes %s rank %d: net_out/net_in/local_out/local_in per iteration: "
                     "measured %.0f %.0f %.0f %.0f, plan %" PRIu64 " %" PRIu64 " %" PRIu64
                     " %" PRIu64,
                     row->bytes, algo_names[row->algo], r, (double)d[0] / c->o->iters,
                     (double)d[1] / c->o->iters, (double)d[2] / c->o->iters,
                     (double)d[3] / c->o->iters, want[0], want[1], want[2], want[3]);
    }
    return differ;
}

static void row_finish(struct ctx *c, struct row *row, const reshard_plan_stats_t *ps)
{
    uint64_t net = 0, local = 0, d[4];
    for (int r = 0; r < c->size; r++) {
        delta4(&c->before[r], &c->after[r], d);
        net += d[0];
        local += d[2];
        row->wrong += c->wrong_all[r];
    }
    for (int r = 0; r < c->size; r++) {
        double msgs = (double)(c->after[r].net_msgs - c->before[r].net_msgs) / c->o->iters;
        if (msgs > c->max_msgs)
            c->max_msgs = msgs, c->max_msgs_rank = r;
    }
    row->time_us = median(c->times, c->o->iters);
    c->local_mb = (double)local / c->o->iters / MIB;
    row->net_mb = (double)net / c->o->iters / MIB;
    row->min_mb = (double)ps->min_net_bytes / MIB;
    row->nic_mb = nic_bytes(c) / MIB;
    if (row->algo != RESHARD_ALGO_BCAST && !c->o->keep_dst) /* a delta refit sends less */
        row->differ = compare_plan(c, row);
}

static void row_print(struct ctx *c, const struct row *row)
{
    double algbw = (double)row->bytes / row->time_us / 1e3;
    double busbw = row->nic_mb * MIB / row->time_us / 1e3;
    char wrong[24] = "N/A";
    c->wrong += row->wrong;
    c->differ += row->differ;
    c->busbw_sum += busbw;
    c->nrows++;
    if (c->rank != 0)
        return;
    if (c->o->check)
        snprintf(wrong, sizeof(wrong), "%" PRIu64, row->wrong);
    printf("%11zu%12" PRId64 "%10s%9s%10.1f%9.2f%9.2f%8s%10.2f%10.2f%10.2f\n", row->bytes,
           row->count, row->type, algo_names[row->algo], row->time_us, algbw, busbw, wrong,
           row->net_mb, row->min_mb, row->nic_mb);
    fflush(stdout);
}

/* Warmup, then the timed iterations between two snapshots of every rank's counters. */
static int measure(struct ctx *c, reshard_plan_t *plan, const struct tensor_run *t, int nt)
{
    const struct opts *o = c->o;
    uint64_t wrong = 0;
    /* the plan's tensors: the caller's, then the scales of the quantized ones */
    reshard_buffers_t *bufs =
        xcalloc((size_t)reshard_plan_ntensors(plan) + 1, sizeof(*bufs), c->rank);
    int rc = !bufs;
    for (int it = 0; it < o->warmup && !rc; it++)
        rc = iterate(c, plan, t, nt, bufs, it, NULL, &wrong);
    if (!rc &&
        !ok(c, reshard_comm_counters_all(c->comm, c->before, NULL), "reshard_comm_counters_all"))
        rc = 1;
    for (int i = 0; i < o->iters && !rc; i++)
        rc = iterate(c, plan, t, nt, bufs, o->warmup + i, &c->times[i], &wrong);
    free(bufs);
    if (rc)
        return rc;
    if (!ok(c, reshard_comm_counters_all(c->comm, c->after, NULL), "reshard_comm_counters_all"))
        return 1;
    c->wrong_all[c->rank] = wrong;
    if (!ok(c, reshard_comm_allgather(c->comm, c->wrong_all, sizeof(uint64_t)),
            "reshard_comm_allgather"))
        return 1;
    return 0;
}

/* The scales tensors the plan appended, one per quantized tensor in order: their shards and
 * buffers on this rank (an FP8 source's scales are filled with the reference's). */
static int scales_setup(struct ctx *c, reshard_plan_t *plan, struct tensor_run *t, int nt)
{
    int next = nt;
    for (int i = 0; i < nt; i++) {
        struct perf_quant *q = &t[i].q;
        if (!q->on)
            continue;
        q->scales = next++;
        reshard_layout_t *ls = NULL, *ld = NULL;
        int rc = !ok(c, reshard_plan_tensor_layout(plan, q->scales, 0, &ls),
                     "reshard_plan_tensor_layout") ||
                 !ok(c, reshard_plan_tensor_layout(plan, q->scales, 1, &ld),
                     "reshard_plan_tensor_layout");
        if (!rc)
            rc = map_build(&q->sdst, ld, c->rank, "scales") ||
                 (q->move && map_build(&q->ssrc, ls, c->rank, "scales"));
        reshard_layout_destroy(ls);
        reshard_layout_destroy(ld);
        if (rc)
            return rc;
        if (q->sdst.bytes && !(q->sdbuf = xcalloc(1, q->sdst.bytes, c->rank)))
            return 1;
        if (q->move && q->ssrc.bytes && !(q->ssbuf = xcalloc(1, q->ssrc.bytes, c->rank)))
            return 1;
        if (!c->o->check && q->ssbuf)
            pq_fill(q, &t[i].smap, t[i].sbuf, pattern_key(0, 0));
    }
    return next == reshard_plan_ntensors(plan)
               ? 0
               : lib_fail(c->rank, "reshard_plan_ntensors", RESHARD_ERR_INTERNAL);
}

/* One row: the nt tensors of t planned together with algo. */
static int run_algo(struct ctx *c, struct row row, const struct tensor_run *t, int nt,
                    reshard_algo_t algo)
{
    reshard_plan_config_t cfg = RESHARD_PLAN_CONFIG_INIT;
    reshard_tensor_t *tensors = xcalloc((size_t)nt, sizeof(*tensors), c->rank);
    reshard_plan_stats_t ps;
    reshard_plan_t *plan = NULL;
    if (!tensors)
        return 1;
    for (int i = 0; i < nt; i++)
        tensors[i] = (reshard_tensor_t){.src = t[i].src, .dst = t[i].dst};
    row.algo = algo;
    cfg.algo = algo;
    double t0 = now_s();
    int rc = !ok(c, reshard_comm_plan_create(c->comm, tensors, nt, &cfg, &plan),
                 "reshard_comm_plan_create");
    double ms = (now_s() - t0) * 1e3;
    c->ctrl.plan_ms = ms > c->ctrl.plan_ms ? ms : c->ctrl.plan_ms;
    free(tensors);
    if (!rc)
        rc = scales_setup(c, plan, (struct tensor_run *)t, nt);
    if (!rc) /* every rank's own row: a communicator plan holds only this rank's */
        rc = !ok(c, reshard_plan_stats(plan, &ps, c->ranks), "reshard_plan_stats") ||
             !ok(c, reshard_comm_allgather(c->comm, c->ranks, sizeof(*c->ranks)),
                 "reshard_comm_allgather");
    if (!rc)
        rc = measure(c, plan, t, nt);
    reshard_plan_destroy(plan);
    for (int i = 0; i < nt; i++)
        pq_free_buffers((struct perf_quant *)&t[i].q);
    if (rc)
        return rc;
    row_finish(c, &row, &ps);
    row_print(c, &row);
    return 0;
}

static void tensor_free(struct tensor_run *t)
{
    pq_free(&t->q);
    free(t->sbuf);
    free(t->dbuf);
    free(t->dprev);
    shard_map_free(&t->smap);
    shard_map_free(&t->dmap);
    reshard_layout_destroy(t->src);
    reshard_layout_destroy(t->dst);
}

/* Layouts from specs; buffers for this rank's shards. */
static int tensor_setup(struct ctx *c, const char *src, const char *dst, struct tensor_run *t)
{
    if (!ok(c, reshard_layout_parse(src, c->size, &t->src), "reshard_layout_parse") ||
        !ok(c, reshard_layout_parse(dst, c->size, &t->dst), "reshard_layout_parse"))
        return 1;
    if (map_build(&t->smap, t->src, c->rank, "source") ||
        map_build(&t->dmap, t->dst, c->rank, "destination"))
        return 1;
    char *sf = layout_string(t->src), *df = layout_string(t->dst), st[16] = "", dt[16] = "",
         quant[64];
    const char *why = NULL;
    reshard_layout_info_t info;
    int rc = !sf || !df || reshard_layout_info(t->dst, &info) != RESHARD_OK;
    if (!rc) {
        spec_item(sf, "dtype", st, sizeof(st));
        spec_item(df, "dtype", dt, sizeof(dt));
        int has = spec_item(df, "quant", quant, sizeof(quant));
        rc = pq_init(&t->q, st, dt, has ? quant : NULL, info.ndim, info.shape, &why);
    }
    free(sf);
    free(df);
    if (rc) {
        fprintf(stderr, "reshard_perf: rank %d: %s\n", c->rank, why ? why : "out of memory");
        return 1;
    }
    if (t->smap.bytes && !(t->sbuf = xcalloc(1, t->smap.bytes, c->rank)))
        return 1;
    if (t->dmap.bytes && !(t->dbuf = xcalloc(1, t->dmap.bytes, c->rank)))
        return 1;
    if (t->dmap.bytes && c->o->change.pct >= 0 && !(t->dprev = xcalloc(1, t->dmap.bytes, c->rank)))
        return 1;
    if (!c->o->check && t->sbuf && t->q.on) /* unchecked runs move the same data every time */
        pq_fill(&t->q, &t->smap, t->sbuf, pattern_key(0, 0));
    else if (!c->o->check && t->sbuf)
        shard_fill(&t->smap, t->sbuf, pattern_key(0, 0));
    if (t->dbuf)
        memset(t->dbuf, POISON, t->dmap.bytes);
    return 0;
}

static int run_size(struct ctx *c, int i)
{
    struct tensor_run t = {0};
    struct row row = {.bytes = c->sw->bytes[i], .count = c->sw->count[i], .type = c->sw->type[i]};
    int rc = tensor_setup(c, c->sw->src[i], c->sw->dst[i], &t);
    for (int a = 0; a < c->o->nalgos && !rc; a++)
        rc = run_algo(c, row, &t, 1, c->o->algos[a]);
    tensor_free(&t);
    return rc;
}

/* --manifest: the model's tensors, each with its own buffers, in one plan per algorithm. */
static int run_model(struct ctx *c)
{
    const struct model *m = c->model;
    const reshard_tensor_t *mt = reshard_manifest_tensors(m->man);
    struct tensor_run *t = xcalloc((size_t)m->n, sizeof(*t), c->rank);
    struct row row = {.bytes = m->bytes, .count = m->count, .type = m->type};
    int rc = !t;
    for (int i = 0; i < m->n && !rc; i++) {
        char *s = layout_string(mt[i].src), *d = layout_string(mt[i].dst);
        rc = !s || !d || tensor_setup(c, s, d, &t[i]);
        free(s);
        free(d);
    }
    for (int a = 0; a < c->o->nalgos && !rc; a++)
        rc = run_algo(c, row, t, m->n, c->o->algos[a]);
    for (int i = 0; t && i < m->n; i++)
        tensor_free(&t[i]);
    free(t);
    return rc;
}

/* ---- header and footer ---- */

struct host_rec {
    char host[64];
    int32_t pid, pad;
};

/* Each rank's domain and place in it, from a trivial plan on the communicator's topology. */
static int probe_domains(struct ctx *c)
{
    reshard_layout_t *l = NULL;
    reshard_plan_t *plan = NULL;
    reshard_plan_stats_t ps;
    int rc = !ok(c, reshard_layout_parse("shape=1 dtype=u8", c->size, &l), "reshard_layout_parse");
    if (!rc) {
        reshard_tensor_t t = {.name = "probe", .src = l, .dst = l};
        rc = !ok(c, reshard_plan_create(&t, 1, reshard_comm_topo(c->comm), NULL, &plan),
                 "reshard_plan_create");
    }
    if (!rc)
        rc = !ok(c, reshard_plan_stats(plan, &ps, c->ranks), "reshard_plan_stats");
    reshard_plan_destroy(plan);
    reshard_layout_destroy(l);
    return rc;
}

static int print_devices(struct ctx *c)
{
    struct host_rec *recs = xcalloc((size_t)c->size, sizeof(*recs), c->rank);
    if (!recs)
        return 1;
    gethostname(recs[c->rank].host, sizeof(recs[c->rank].host) - 1);
    recs[c->rank].pid = (int32_t)getpid();
    int rc = !ok(c, reshard_comm_allgather(c->comm, recs, sizeof(*recs)), "reshard_comm_allgather");
    if (!rc)
        rc = probe_domains(c);
    for (int r = 0; r < c->size && !rc && c->rank == 0; r++) {
        recs[r].host[sizeof(recs[r].host) - 1] = '\0';
        printf("#  Rank %2d Group  0 Pid %6d on %10s device %2d [host] domain %d\n", r,
               (int)recs[r].pid, recs[r].host, c->ranks[r].local_index, c->ranks[r].domain);
    }
    free(recs);
    return rc;
}

static int print_header(struct ctx *c)
{
    const struct opts *o = c->o;
    const struct sweep *sw = c->sw;
    if (c->rank == 0) {
        printf("# reshard_perf %d.%d.%d (libnccl-net-reshard)\n", RESHARD_VERSION_MAJOR,
               RESHARD_VERSION_MINOR, RESHARD_VERSION_PATCH);
        if (c->model)
            printf("#  manifest: %s (%d tensors, %zu bytes)\n", o->manifest, c->model->n,
                   c->model->bytes);
        else
            printf("#  src: %s\n#  dst: %s\n", o->src, o->dst);
        size_t lo = c->model ? c->model->bytes : sw->fixed ? sw->bytes[0] : o->min_bytes;
        size_t hi = c->model ? c->model->bytes : sw->fixed ? sw->bytes[0] : o->max_bytes;
        printf("#  minBytes %zu maxBytes %zu step: %ld(factor) warmup iters: %d iters: %d "
               "validation: %d algos: %s\n#\n# Using devices\n",
               lo, hi, o->factor, o->warmup, o->iters, o->check, o->algo_list);
        if (o->change.pct >= 0)
            printf("#  changed: %g%% of the source elements per iteration (%s), seed %llu; "
                   "delta refits %s\n",
                   o->change.pct, o->change.runs ? "in runs of 4096" : "uniformly",
                   (unsigned long long)o->change.seed, o->delta ? "on (RESHARD_DELTA)" : "off");
    }
    if (print_devices(c))
        return 1;
    if (c->rank == 0) {
        printf("#\n#%51s%9s%9s%8s%10s%10s%10s\n", "time", "algbw", "busbw", "#wrong", "netMB",
               "minMB", "nicMB");
        printf("#%10s%12s%10s%9s%10s%9s%9s\n", "size", "count", "type", "algo", "(us)", "(GB/s)",
               "(GB/s)");
        fflush(stdout);
    }
    return 0;
}

/* The largest of one figure over ranks first .. n-1, and the rank. */
static void most_of(const struct ctrl_figures *all, int first, int n, size_t field, double *v,
                    int *rank)
{
    *v = -1;
    *rank = first;
    for (int r = first; r < n; r++) {
        double x = *(const double *)((const char *)&all[r] + field);
        if (x > *v)
            *v = x, *rank = r;
    }
}

/* Every rank's control-plane figures, gathered (collective): the largest of each and its rank
 * into c->most, c->most_rank (steady, first, comm_ms, plan_ms). */
static int gather_control(struct ctx *c)
{
    struct ctrl_figures *all = xcalloc((size_t)c->size, sizeof(*all), c->rank);
    if (!all)
        return 1;
    all[c->rank] = c->ctrl;
    int rc = !ok(c, reshard_comm_allgather(c->comm, all, sizeof(*all)), "reshard_comm_allgather");
    static const size_t field[5] = {
        offsetof(struct ctrl_figures, steady), offsetof(struct ctrl_figures, first),
        offsetof(struct ctrl_figures, comm_ms), offsetof(struct ctrl_figures, plan_ms),
        offsetof(struct ctrl_figures, steady)};
    for (int k = 0; !rc && k < 5; k++) /* the last: rank 0, the bootstrap's root, aside */
        most_of(all, k == 4 && c->size > 1, c->size, field[k], &c->most[k], &c->most_rank[k]);
    free(all);
    return rc;
}

static int print_footer(const struct ctx *c)
{
    int bad = c->wrong > 0 || c->differ > 0;
    if (c->rank != 0)
        return bad;
    printf("# Out of bounds values : %" PRIu64 " %s\n", c->wrong, c->wrong ? "FAILED" : "OK");
    printf("# Byte counts vs plan : %d ranks differ %s\n", c->differ, c->differ ? "FAILED" : "OK");
    printf("# Data messages        : at most %.0f per rank per iteration (rank %d)\n", c->max_msgs,
           c->max_msgs_rank);
    printf("# Local bytes          : %.2f MB per iteration, all ranks (the last row)\n",
           c->local_mb);
    printf("# Control bytes        : at most %.0f per rank per iteration (rank %d)\n", c->most[0],
           c->most_rank[0]);
    printf("# Control bytes, first : at most %.0f per rank in a plan's first refit (rank %d)\n",
           c->most[1], c->most_rank[1]);
    printf("# Control bytes, others: at most %.0f per rank per iteration (rank %d; the "
           "bootstrap's root aside)\n",
           c->most[4], c->most_rank[4]);
    printf("# Communicator made in : %.1f ms (slowest: rank %d)\n", c->most[2], c->most_rank[2]);
    printf("# Plans made in        : %.1f ms at most (slowest: rank %d)\n", c->most[3],
           c->most_rank[3]);
    for (int i = 0; i < c->nnotes; i++)
        printf("#   %s\n", c->notes[i]);
    printf("# Avg bus bandwidth    : %.2f\n#\n", c->nrows ? c->busbw_sum / c->nrows : 0.0);
    fflush(stdout);
    return bad;
}

/* ---- one rank ---- */

static void ctx_free(struct ctx *c)
{
    free(c->before);
    free(c->after);
    free(c->ranks);
    free(c->gather);
    free(c->times);
    free(c->wrong_all);
}

static int ctx_alloc(struct ctx *c)
{
    size_t n = (size_t)c->size;
    c->before = xcalloc(n, sizeof(*c->before), c->rank);
    c->after = xcalloc(n, sizeof(*c->after), c->rank);
    c->ranks = xcalloc(n, sizeof(*c->ranks), c->rank);
    c->gather = xcalloc(n, sizeof(*c->gather), c->rank);
    c->times = xcalloc((size_t)c->o->iters, sizeof(*c->times), c->rank);
    c->wrong_all = xcalloc(n, sizeof(*c->wrong_all), c->rank);
    return !(c->before && c->after && c->ranks && c->gather && c->times && c->wrong_all);
}

/* The launcher's rank, for messages before the communicator exists. */
static int env_rank(void)
{
    const char *vars[] = {"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
        if (getenv(vars[i]))
            return atoi(getenv(vars[i]));
    return -1;
}

/* id NULL: rank and size from the environment. Returns the exit status. */
static int run_rank(const struct opts *o, struct sweep *sw, const reshard_unique_id_t *id, int rank,
                    int size)
{
    struct ctx c = {.o = o, .sw = sw, .rank = id ? rank : env_rank()};
    double t0 = now_s();
    reshard_status_t st =
        id ? reshard_comm_init_rank(id, rank, size, &c.comm) : reshard_comm_init_env(&c.comm);
    c.ctrl.comm_ms = (now_s() - t0) * 1e3;
    if (st != RESHARD_OK)
        return lib_fail(c.rank, id ? "reshard_comm_init_rank" : "reshard_comm_init_env", st);
    c.rank = reshard_comm_rank(c.comm);
    c.size = reshard_comm_size(c.comm);
    struct model model = {0};
    int rc = o->manifest ? model_load(&model, o->manifest, c.size, c.rank == 0)
                         : sweep_validate(sw, c.size, c.rank == 0); /* the same on every rank */
    c.model = o->manifest ? &model : NULL;
    int failed = !rc && (ctx_alloc(&c) || print_header(&c));
    if (o->manifest && !rc && !failed)
        failed = run_model(&c);
    for (int i = 0; i < sw->n && !rc && !failed; i++)
        failed = run_size(&c, i);
    if (!rc && !failed)
        failed = gather_control(&c);
    if (!rc && !failed)
        rc = print_footer(&c);
    ctx_free(&c);
    reshard_manifest_destroy(model.man);
    /* After a failure the peers may wait in a collective this rank never joins, and destroy
     * is collective (a barrier): leave without it, so that the peers see this rank go and -np
     * or the launcher stops them, rather than everyone waiting out RESHARD_TIMEOUT. */
    if (failed)
        return 1;
    reshard_comm_destroy(c.comm);
    return rc;
}

/* ---- -np: local ranks ---- */

static void signal_ranks(const pid_t *pids, int n, int sig)
{
    for (int i = 0; i < n; i++)
        if (pids[i] > 0)
            kill(pids[i], sig);
}

/* A rank's exit status; a rank killed by a signal we did not send is reported. */
static int rank_status(int rank, int status, int stopping)
{
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    if (!stopping)
        fprintf(stderr, "reshard_perf: rank %d killed by signal %d (%s)\n", rank, WTERMSIG(status),
                strsignal(WTERMSIG(status)));
    return 1;
}

/* Waits for every rank. After the first failure the others get GRACE_S seconds to exit, then
 * SIGTERM, then after as long again SIGKILL, so a rank stuck on a dead peer never hangs us. */
static int reap_ranks(pid_t *pids, int n)
{
    int left = n, rc = 0, phase = 0; /* 0 running, 1 grace, 2 terminated, 3 killed */
    double deadline = 0;
    while (left > 0) {
        int status;
        pid_t p = waitpid(-1, &status, phase == 1 || phase == 2 ? WNOHANG : 0);
        if (p < 0 && errno == EINTR)
            continue;
        if (p < 0)
            break;
        if (p == 0 && now_s() < deadline) {
            usleep(20000);
        } else if (p == 0) {
            if (phase == 1)
                fprintf(stderr, "reshard_perf: stopping %d ranks still running\n", left);
            signal_ranks(pids, n, phase == 1 ? SIGTERM : SIGKILL);
            phase++;
            deadline = now_s() + GRACE_S;
        }
        for (int r = 0; r < n && p > 0; r++) {
            if (pids[r] != p)
                continue;
            pids[r] = 0;
            left--;
            int code = rank_status(r, status, phase >= 2);
            if (code && !rc) {
                rc = code;
                phase = 1;
                deadline = now_s() + GRACE_S;
            }
        }
    }
    return rc;
}

static int launch_local(const struct opts *o, struct sweep *sw)
{
    reshard_unique_id_t id;
    int rc = sweep_validate(sw, o->np, 1);
    if (rc)
        return rc;
    reshard_status_t st = reshard_get_unique_id(&id);
    if (st != RESHARD_OK) {
        fprintf(stderr, "reshard_perf: reshard_get_unique_id: %s: %s\n", reshard_strerror(st),
                reshard_last_error());
        return 1;
    }
    pid_t *pids = calloc((size_t)o->np, sizeof(*pids));
    if (!pids)
        return 1;
    fflush(NULL); /* children must not print what the parent buffered */
    for (int i = 0; i < o->np; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            free(pids);
            rc = run_rank(o, sw, &id, i, o->np);
            sweep_free(sw);
            exit(rc);
        }
        if (pids[i] < 0) {
            fprintf(stderr, "reshard_perf: fork: %s\n", strerror(errno));
            pids[i] = 0;
            signal_ranks(pids, i, SIGKILL);
            reap_ranks(pids, i);
            free(pids);
            return 1;
        }
    }
    rc = reap_ranks(pids, o->np);
    free(pids);
    return rc;
}

int main(int argc, char **argv)
{
    struct opts o;
    struct sweep sw;
    reshard_log_set_failures(0); /* each failure is one line of ours (lib_fail), not two */
    int rc = parse_args(argc, argv, &o);
    if (rc || o.help) {
        if (!rc)
            usage();
        return rc;
    }
    if (o.dump_config) {
        reshard_config_print(stdout);
        return 0;
    }
    memset(&sw, 0, sizeof(sw));
    rc = o.manifest ? 0 : sweep_build(&sw, &o);
    if (!rc)
        rc = o.np ? launch_local(&o, &sw) : run_rank(&o, &sw, NULL, 0, 0);
    sweep_free(&sw);
    return rc;
}
