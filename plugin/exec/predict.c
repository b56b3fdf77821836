/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A flow-level prediction of a refit's time on a cluster, from the very transfer lists the
 * executor would run for each algorithm (xfer.c): per rank, the bytes over its NIC and over
 * its NVLink, and the messages it sends. Each rank has its own NIC (one rail per GPU) and its
 * own NVLink, full duplex; the fan-out is pipelined with the network, so a rank takes the
 * longer of its two paths; network messages add their latency, as many at a time as the
 * executor keeps in flight (EXEC_SEND_WINDOW), on top of the bytes. Messages are
 * counted as the executor sends them: one per chunk, the packable small chunks grouped into
 * bundles per peer, with the executor's own chunking. A model, not a measurement:
 * contention inside the fabric, stragglers and compute are not in it.
 */
#include "predict.h"

#include "exec.h"
#include "exec_bundle.h"
#include "base/error.h"

#include <stdlib.h>
#include <string.h>

struct rank_load {
    uint64_t net_out, net_in, local_out, local_in, msgs;
};

static uint64_t div_up(uint64_t a, uint64_t b)
{
    return b ? (a + b - 1) / b : 0;
}

/* The network transfers of xs grouped by sender: rank r's at list[first[r] .. first[r + 1]),
 * ascending. */
static reshard_status_t net_by_sender(const struct xfer_set *xs, int nranks, uint32_t **list,
                                      size_t **first)
{
    *list = rs_calloc(xs->n + 1, sizeof(**list), "prediction");
    *first = rs_calloc((size_t)nranks + 2, sizeof(**first), "prediction");
    if (!*list || !*first) {
        free(*list);
        free(*first);
        return RESHARD_ERR_NO_MEMORY;
    }
    size_t *at = *first + 1; /* counts, then where each sender's next one goes */
    for (size_t i = 0; i < xs->n; i++)
        if (xs->x[i].path == XFER_NET)
            at[xs->x[i].src + 1]++;
    for (int r = 0; r < nranks; r++)
        at[r + 1] += at[r];
    for (size_t i = 0; i < xs->n; i++)
        if (xs->x[i].path == XFER_NET)
            (*list)[at[xs->x[i].src]++] = (uint32_t)i;
    return RESHARD_OK;
}

/* Per rank: bytes over each path, and the messages the executor sends, with its own chunking
 * and its own bundling (exec_bundle.c, counting): a message per network chunk, except the
 * packed ones, which travel as that rank's bundles. */
static reshard_status_t loads_of(const struct rs_plan *plan, const struct xfer_set *xs, int nranks,
                                 struct rank_load *l)
{
    struct exec_cut cut;
    exec_cut_init(&cut, plan, xs);
    memset(l, 0, (size_t)nranks * sizeof(*l));
    for (size_t i = 0; i < xs->n; i++) {
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
        l[x->src].msgs += (uint64_t)exec_nchunks(&cut, x);
    }
    uint32_t *list;
    size_t *first;
    RS_CHECK(net_by_sender(xs, nranks, &list, &first));
    reshard_status_t st = RESHARD_OK;
    for (int r = 0; r < nranks && st == RESHARD_OK; r++) {
        size_t nb = 0, np = 0;
        st = exec_bundles_count(&cut, list + first[r], first[r + 1] - first[r], 1, &nb, &np);
        l[r].msgs = l[r].msgs - np + nb;
    }
    free(list);
    free(first);
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
        double t_net = (double)n / c->nic_bytes_per_s +
                       (double)div_up(l[r].msgs, EXEC_SEND_WINDOW) * c->latency_s;
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
    int quantized = 0; /* the broadcast baseline does not move quantized tensors */
    for (int t = 0; t < p->ntensors; t++)
        quantized |= p->tensors[t].quant != PLAN_QUANT_NONE;
    for (int a = RESHARD_ALGO_RESHARD; a <= RESHARD_ALGO_BCAST && st == RESHARD_OK; a++) {
        struct xfer_set xs;
        if (a == RESHARD_ALGO_BCAST && quantized) {
            res.seconds[a] = -1;
            continue;
        }
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
