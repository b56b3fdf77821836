/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A flow-level prediction of a refit's time on a cluster, from the very transfer lists the
 * executor would run for each algorithm (xfer.c): per rank, the bytes over its NIC and over
 * its NVLink, and the messages it sends. Each rank has its own NIC (one rail per GPU) and its
 * own NVLink, full duplex; the fan-out is pipelined with the network, so a rank takes the
 * longer of its two paths; network messages add their latency, 16 at a time (the executor
 * keeps that many sends in flight), on top of the bytes.
 * Messages count chunks (RESHARD_CHUNK_BYTES) of the larger transfers and, for the small ones
 * that travel packed (RESHARD_COALESCE_BYTES), their bytes in chunks per peer. A model, not
 * a measurement: contention inside the fabric, stragglers and compute are not in it.
 */
#include "predict.h"

#include "error.h"
#include "handles.h"
#include "param.h"

#include <stdlib.h>
#include <string.h>

#define IN_FLIGHT 16 /* the executor's send window (exec.c SEND_WINDOW) */

struct rank_load {
    uint64_t net_out, net_in, local_out, local_in, msgs;
};

/* Small transfers to one peer, summed, for the packed-message count: a per-rank list of
 * (peer, bytes), merged by sorting once. */
struct small {
    int32_t src, dst;
    uint64_t bytes;
};

static int cmp_small(const void *a, const void *b)
{
    const struct small *p = a, *q = b;
    if (p->src != q->src)
        return p->src < q->src ? -1 : 1;
    return p->dst < q->dst ? -1 : p->dst > q->dst;
}

static uint64_t div_up(uint64_t a, uint64_t b)
{
    return b ? (a + b - 1) / b : 0;
}

static reshard_status_t loads_of(const struct xfer_set *xs, int nranks, struct rank_load *l)
{
    uint64_t chunk = (uint64_t)rs_param_int(RS_PARAM_CHUNK_BYTES);
    uint64_t small_max = (uint64_t)rs_param_int(RS_PARAM_COALESCE_BYTES);
    struct small *sm = NULL;
    size_t nsm = 0, cap = 0;
    memset(l, 0, (size_t)nranks * sizeof(*l));
    for (size_t i = 0; i < xs->n; i++) {
        const struct xfer *x = &xs->x[i];
        uint64_t b = (uint64_t)x->bytes;
        if (x->path == XFER_LOCAL) {
            l[x->src].local_out += b;
            l[x->dst].local_in += b;
        } else if (x->path == XFER_NET) {
            l[x->src].net_out += b;
            l[x->dst].net_in += b;
            if (b > small_max || x->parent != XFER_NONE) {
                l[x->src].msgs += div_up(b, chunk);
                continue;
            }
            struct small *g = rs_grow(sm, &cap, nsm + 1, sizeof(*g), "prediction");
            if (!g) {
                free(sm);
                return RESHARD_ERR_NO_MEMORY;
            }
            sm = g;
            sm[nsm++] = (struct small){x->src, x->dst, b};
        }
    }
    if (nsm)
        qsort(sm, nsm, sizeof(*sm), cmp_small);
    for (size_t i = 0; i < nsm;) {
        uint64_t sum = 0;
        size_t j = i;
        for (; j < nsm && sm[j].src == sm[i].src && sm[j].dst == sm[i].dst; j++)
            sum += sm[j].bytes;
        l[sm[i].src].msgs += div_up(sum, chunk) ? div_up(sum, chunk) : 1;
        i = j;
    }
    free(sm);
    return RESHARD_OK;
}

reshard_status_t predict_msgs(const struct xfer_set *xs, int nranks, uint64_t *msgs)
{
    struct rank_load *l = rs_calloc((size_t)nranks, sizeof(*l), "message counts");
    if (!l)
        return RESHARD_ERR_NO_MEMORY;
    reshard_status_t st = loads_of(xs, nranks, l);
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

reshard_status_t reshard_plan_predict(const reshard_plan_t *plan, const reshard_cluster_t *cluster,
                                      reshard_prediction_t *out)
{
    api_enter();
    if (!plan || !cluster || !out)
        return api_null_arg(__func__, !plan ? "plan" : !cluster ? "cluster" : "out");
    if (!(cluster->nic_bytes_per_s > 0) || !(cluster->nvlink_bytes_per_s > 0) ||
        !(cluster->latency_s >= 0))
        return api_leave(__func__, rs_error(RESHARD_ERR_INVALID_ARG,
                                            "cluster: NIC and NVLink bandwidths must be positive "
                                            "and the latency not negative"));
    const struct rs_plan *p = plan->p;
    int n = p->topo.nranks;
    struct rank_load *l = rs_calloc((size_t)n, sizeof(*l), "prediction");
    if (!l)
        return api_leave(__func__, RESHARD_ERR_NO_MEMORY);
    reshard_prediction_t res = {0};
    reshard_status_t st = RESHARD_OK;
    for (int a = RESHARD_ALGO_RESHARD; a <= RESHARD_ALGO_BCAST && st == RESHARD_OK; a++) {
        struct xfer_set xs;
        st = xfer_build(p, (reshard_algo_t)a, &xs);
        if (st == RESHARD_OK)
            st = loads_of(&xs, n, l);
        if (st == RESHARD_OK)
            predict_one(l, n, cluster, &res, (reshard_algo_t)a);
        xfer_free(&xs);
    }
    free(l);
    if (st != RESHARD_OK)
        return api_leave(__func__, st);
    *out = res;
    return RESHARD_OK;
}
