/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A flow-level prediction of a refit's time on a cluster, from the very transfer lists the
 * executor would run for each algorithm (xfer.c): per rank, the bytes over its NIC and over
 * its NVLink, and the messages it sends. Each rank has its own NIC (one rail per GPU) and its
 * own NVLink, full duplex; the fan-out is pipelined with the network, so a rank takes the
 * longer of its two paths; network messages add their latency, as many at a time as the
 * executor keeps in flight (16, and at most 2 per peer), on top of the bytes. Messages are
 * counted as the executor sends them: one per chunk, the packable small chunks grouped into
 * bundles per peer, with the executor's own chunking. A model, not a measurement:
 * contention inside the fabric, stragglers and compute are not in it.
 */
#include "predict.h"

#include "exec_chunk.h"
#include "base/error.h"
#include "base/param.h"

#include <stdlib.h>
#include <string.h>

#define IN_FLIGHT      16 /* the executor's send window (exec.h EXEC_SEND_WINDOW) */
#define PEER_IN_FLIGHT 2  /* ... and per peer (exec.h EXEC_PEER_WINDOW) */

struct rank_load {
    uint64_t net_out, net_in, local_out, local_in, msgs, peers;
};

/* A packable chunk, or a (src, dst) pair of any network transfer (xfer, chunk unused). */
struct cand {
    int32_t src, dst;
    uint32_t xfer, chunk;
    uint64_t bytes;
};

static int cmp_cand(const void *a, const void *b)
{
    const struct cand *p = a, *q = b;
    if (p->src != q->src)
        return p->src < q->src ? -1 : 1;
    if (p->dst != q->dst)
        return p->dst < q->dst ? -1 : 1;
    if (p->xfer != q->xfer)
        return p->xfer < q->xfer ? -1 : 1;
    return p->chunk < q->chunk ? -1 : p->chunk > q->chunk;
}

static reshard_status_t push(struct cand **c, size_t *n, size_t *cap, struct cand v)
{
    struct cand *g = rs_grow(*c, cap, *n + 1, sizeof(**c), "prediction");
    if (!g)
        return RESHARD_ERR_NO_MEMORY;
    *c = g;
    (*c)[(*n)++] = v;
    return RESHARD_OK;
}

static uint64_t div_up(uint64_t a, uint64_t b)
{
    return b ? (a + b - 1) / b : 0;
}

/* Per rank: bytes over each path, and the messages the executor sends, counted with its own
 * chunking (exec_chunk.c): a chunk each, except the packable ones
 * (exec_coalesce_bytes), which fill bundles of at most a chunk per peer in transfer order. */
static reshard_status_t loads_of(const struct rs_plan *plan, const struct xfer_set *xs, int nranks,
                                 struct rank_load *l)
{
    struct exec_cut shell;
    exec_cut_init(&shell, plan, xs);
    struct cand *small = NULL, *pairs = NULL;
    size_t nsmall = 0, capsmall = 0, npairs = 0, cappairs = 0;
    reshard_status_t st = RESHARD_OK;
    memset(l, 0, (size_t)nranks * sizeof(*l));
    for (size_t i = 0; i < xs->n && st == RESHARD_OK; i++) {
        const struct xfer *x = &xs->x[i];
        uint64_t b = (uint64_t)x->bytes;
        if (x->path == XFER_LOCAL) {
            l[x->src].local_out += b;
            l[x->dst].local_in += b;
        }
        if (x->path != XFER_NET)
            continue;
        l[x->src].net_out += b;
        l[x->dst].net_in += b;
        st = push(&pairs, &npairs, &cappairs, (struct cand){x->src, x->dst, 0, 0, 0});
        int packable = shell.coalesce_bytes > 0 && x->parent == XFER_NONE && x->src_buf == XBUF_SRC;
        int64_t n = exec_nchunks(&shell, x);
        for (int64_t k = 0; k < n && st == RESHARD_OK; k++) {
            uint64_t cb = packable ? exec_chunk_bytes_of(&shell, x, (uint32_t)k) : 0;
            if (packable && cb <= (uint64_t)shell.coalesce_bytes)
                st = push(&small, &nsmall, &capsmall,
                          (struct cand){x->src, x->dst, (uint32_t)i, (uint32_t)k, cb});
            else
                l[x->src].msgs++;
        }
    }
    if (st == RESHARD_OK && nsmall) {
        qsort(small, nsmall, sizeof(*small), cmp_cand);
        uint64_t fill = 0;
        for (size_t i = 0; i < nsmall; i++) { /* bundle_side's greedy fill, per pair */
            int fresh = !i || small[i].src != small[i - 1].src || small[i].dst != small[i - 1].dst;
            if (fresh || fill + small[i].bytes > (uint64_t)shell.chunk_bytes) {
                l[small[i].src].msgs++;
                fill = 0;
            }
            fill += small[i].bytes;
        }
    }
    if (st == RESHARD_OK && npairs) {
        qsort(pairs, npairs, sizeof(*pairs), cmp_cand);
        for (size_t i = 0; i < npairs; i++)
            if (!i || pairs[i].src != pairs[i - 1].src || pairs[i].dst != pairs[i - 1].dst)
                l[pairs[i].src].peers++;
    }
    free(small);
    free(pairs);
    return st;
}

reshard_status_t predict_msgs(const struct rs_plan *plan, const struct xfer_set *xs, int nranks,
                              uint64_t *msgs)
{
    struct rank_load *l = rs_calloc((size_t)nranks, sizeof(*l), "message counts");
    if (!l)
        return RESHARD_ERR_NO_MEMORY;
    reshard_status_t st = loads_of(plan, xs, nranks, l);
    for (int r = 0; st == RESHARD_OK && r < nranks; r++)
        msgs[r] = l[r].msgs;
    free(l);
    return st;
}

static void predict_one(const struct rank_load *l, int nranks, const reshard_cluster_t *c,
                        reshard_prediction_t *out, reshard_algo_t a)
{
    double worst = 0;
    uint64_t nic = 0, nvl = 0, msgs = 0;
    for (int r = 0; r < nranks; r++) {
        uint64_t n = l[r].net_out > l[r].net_in ? l[r].net_out : l[r].net_in;
        uint64_t v = l[r].local_out > l[r].local_in ? l[r].local_out : l[r].local_in;
        double t_net =
            (double)n / c->nic_bytes_per_s + (double)div_up(l[r].msgs, IN_FLIGHT) * c->latency_s;
        double t_local = (double)v / c->nvlink_bytes_per_s;
        double t = t_net > t_local ? t_net : t_local;
        worst = t > worst ? t : worst;
        nic = n > nic ? n : nic;
        nvl = v > nvl ? v : nvl;
        msgs = l[r].msgs > msgs ? l[r].msgs : msgs;
    }
    out->seconds[a] = worst;
    out->max_nic_bytes[a] = nic;
    out->max_nvlink_bytes[a] = nvl;
    out->max_msgs[a] = msgs;
}

reshard_status_t predict_plan(const struct rs_plan *p, const reshard_cluster_t *cluster,
                              reshard_prediction_t *out)
{
    if (!(cluster->nic_bytes_per_s > 0) || !(cluster->nvlink_bytes_per_s > 0) ||
        !(cluster->latency_s >= 0))
        return rs_error(RESHARD_ERR_INVALID_ARG, "cluster: NIC and NVLink bandwidths must be "
                                                 "positive and the latency not negative");
    int n = p->topo.nranks;
    struct rank_load *l = rs_calloc((size_t)n, sizeof(*l), "prediction");
    if (!l)
        return RESHARD_ERR_NO_MEMORY;
    reshard_prediction_t res = {0};
    reshard_status_t st = RESHARD_OK;
    for (int a = RESHARD_ALGO_RESHARD; a <= RESHARD_ALGO_BCAST && st == RESHARD_OK; a++) {
        struct xfer_set xs;
        st = xfer_build(p, (reshard_algo_t)a, &xs);
        if (st == RESHARD_OK)
            st = loads_of(p, &xs, n, l);
        if (st == RESHARD_OK)
            predict_one(l, n, cluster, &res, (reshard_algo_t)a);
        xfer_free(&xs);
    }
    free(l);
    if (st == RESHARD_OK)
        *out = res;
    return st;
}
