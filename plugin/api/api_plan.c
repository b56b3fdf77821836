/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The public planning API (reshard.h): the topology a plan is made on, plans made without a
 * communicator, and what any plan can be asked (validity, hash, predicted time, statistics).
 * The planner records what went wrong; the guard (api_guard.c) logs it once and leaves it to
 * reshard_last_error().
 */
#include "plugin/reshard.h"

#include "api.h"
#include "base/error.h"
#include "base/log.h"
#include "base/param.h"
#include "planner/plan.h"
#include "planner/stats.h"
#include "planner/validate.h"
#include "plugin/comm/comm.h"
#include "plugin/exec/exec.h"
#include "plugin/exec/predict.h"

#include <stdlib.h>

reshard_status_t reshard_topo_create(int world_size, int domain_size, const int *domain_of,
                                     reshard_topo_t **topo)
{
    api_enter();
    if (!topo)
        return api_null_arg(__func__, "topo");
    struct reshard_topo *h = rs_calloc(1, sizeof(*h), "topology");
    if (!h)
        return api_leave(__func__, RESHARD_ERR_NO_MEMORY);
    reshard_status_t st = topo_create(world_size, domain_size, domain_of, &h->t);
    if (st != RESHARD_OK) {
        free(h);
        return api_leave(__func__, st);
    }
    *topo = h;
    return RESHARD_OK;
}

reshard_status_t reshard_topo_exclude(reshard_topo_t *topo, const int *ranks, int n)
{
    api_enter();
    if (!topo || (!ranks && n > 0))
        return api_null_arg(__func__, topo ? "ranks" : "topo");
    if (n < 0)
        return api_leave(__func__, rs_error(RESHARD_ERR_INVALID_ARG, "%s: n is %d", __func__, n));
    return api_leave(__func__, topo_set_absent(&topo->t, ranks, n));
}

void reshard_topo_destroy(reshard_topo_t *topo)
{
    if (!topo)
        return;
    topo_free(&topo->t);
    free(topo);
}

reshard_status_t api_plan_build(const char *fn, const reshard_tensor_t *tensors, int ntensors,
                                const struct rs_topo *topo, const reshard_plan_config_t *config,
                                int scope, struct rs_plan **out)
{
    if (ntensors < 1)
        return rs_error(RESHARD_ERR_INVALID_ARG, "%s: ntensors is %d", fn, ntensors);
    if (config && config->size < offsetof(reshard_plan_config_t, split_min_bytes) +
                                     sizeof(config->split_min_bytes))
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "%s: config->size %zu is too small; use RESHARD_PLAN_CONFIG_INIT", fn,
                        config->size);
    struct plan_opts opts = {rs_param_int(RS_PARAM_PLAN_SPLIT_MIN_BYTES),
                             rs_param_int(RS_PARAM_PLAN_MAX_OPS)};
    if (config && config->split_min_bytes > 0)
        opts.split_min_bytes = config->split_min_bytes;
    /* fields past what the caller's struct has (an older header) keep their defaults */
    if (config && config->size >= offsetof(reshard_plan_config_t, max_ops) + sizeof(int64_t) &&
        config->max_ops > 0)
        opts.max_ops = config->max_ops;
    struct plan_input *in = rs_calloc((size_t)ntensors, sizeof(*in), "plan inputs");
    if (!in)
        return RESHARD_ERR_NO_MEMORY;
    for (int i = 0; i < ntensors; i++)
        in[i] = (struct plan_input){tensors[i].name, tensors[i].src ? &tensors[i].src->l : NULL,
                                    tensors[i].dst ? &tensors[i].dst->l : NULL, NULL};
    reshard_status_t st = plan_build(in, ntensors, topo, &opts, scope, out);
    free(in);
    if (st == RESHARD_OK && scope == PLAN_ALL_RANKS)
        rs_log(RS_LOG_INFO, "planned %d tensor(s) on %d ranks in %d domains: %zu ops in %.3f ms",
               ntensors, topo->nranks, topo->ndomains, (*out)->nops, (*out)->plan_ms);
    else if (st == RESHARD_OK)
        rs_log(RS_LOG_INFO,
               "planned rank %d's share of %d tensor(s) on %d ranks in %d domains: %zu ops in "
               "%.3f ms",
               scope, ntensors, topo->nranks, topo->ndomains, (*out)->nops, (*out)->plan_ms);
    return st;
}

reshard_status_t reshard_plan_create(const reshard_tensor_t *tensors, int ntensors,
                                     const reshard_topo_t *topo,
                                     const reshard_plan_config_t *config, reshard_plan_t **plan)
{
    api_enter();
    if (!tensors || !topo || !plan)
        return api_null_arg(__func__, !tensors ? "tensors" : !topo ? "topo" : "plan");
    struct reshard_plan *h = rs_calloc(1, sizeof(*h), "plan");
    if (!h)
        return api_leave(__func__, RESHARD_ERR_NO_MEMORY);
    reshard_status_t st =
        api_plan_build(__func__, tensors, ntensors, &topo->t, config, PLAN_ALL_RANKS, &h->p);
    if (st != RESHARD_OK) {
        free(h);
        return api_leave(__func__, st);
    }
    api_plan_given(h);
    *plan = h;
    return RESHARD_OK;
}

reshard_status_t reshard_plan_create_rank(const reshard_tensor_t *tensors, int ntensors,
                                          const reshard_topo_t *topo,
                                          const reshard_plan_config_t *config, int rank,
                                          reshard_plan_t **plan)
{
    api_enter();
    if (!tensors || !topo || !plan)
        return api_null_arg(__func__, !tensors ? "tensors" : !topo ? "topo" : "plan");
    if (rank < 0 || rank >= topo->t.nranks)
        return api_leave(__func__, rs_error(RESHARD_ERR_RANK_RANGE,
                                            "%s: rank %d is outside the topology of %d ranks",
                                            __func__, rank, topo->t.nranks));
    struct reshard_plan *h = rs_calloc(1, sizeof(*h), "plan");
    if (!h)
        return api_leave(__func__, RESHARD_ERR_NO_MEMORY);
    reshard_status_t st =
        api_plan_build(__func__, tensors, ntensors, &topo->t, config, rank, &h->p);
    if (st != RESHARD_OK) {
        free(h);
        return api_leave(__func__, st);
    }
    api_plan_given(h);
    *plan = h;
    return RESHARD_OK;
}

/* Whole-world questions of a plan that holds one rank's transfers. */
static reshard_status_t needs_every_rank(const char *fn, const reshard_plan_t *plan)
{
    const struct rs_plan *p = plan->p;
    if (p->scope == PLAN_ALL_RANKS)
        return RESHARD_OK;
    if (plan->x)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "%s: a communicator plan holds rank %d's own transfers only: ask "
                        "reshard_plan_stats (the world's totals) or reshard_plan_rank_stats, or "
                        "plan every rank with reshard_plan_create (the same inputs give the same "
                        "plan and hash)",
                        fn, p->scope);
    return rs_error(RESHARD_ERR_INVALID_ARG,
                    "%s: the plan holds rank %d's transfers only: ask reshard_plan_rank_stats, or "
                    "plan every rank with reshard_plan_create",
                    fn, p->scope);
}

/* Holds a plan for a call that only reads it (api_plan_hold); api_plan_release(held(plan))
 * ends it. */
static struct reshard_plan *held(const reshard_plan_t *plan)
{
    return (struct reshard_plan *)plan; /* the reference count changes, nothing else */
}

reshard_status_t reshard_plan_validate(const reshard_plan_t *plan)
{
    api_enter();
    if (!plan)
        return api_null_arg(__func__, "plan");
    reshard_status_t st = api_plan_hold(__func__, held(plan));
    if (st != RESHARD_OK)
        return api_leave(__func__, st);
    if ((st = needs_every_rank(__func__, plan)) == RESHARD_OK)
        st = plan_validate(plan->p);
    api_plan_release(held(plan));
    return api_leave(__func__, st);
}

uint64_t reshard_plan_hash(const reshard_plan_t *plan)
{
    return plan ? plan->p->hash : 0;
}

void api_plan_given(struct reshard_plan *h)
{
    atomic_init(&h->refs, 1);
    api_live_add(&h->live, &h->refs);
}

reshard_status_t api_plan_hold(const char *fn, struct reshard_plan *h)
{
    if (api_live_take(&h->live))
        return RESHARD_OK;
    return rs_error(RESHARD_ERR_INVALID_ARG,
                    "%s: not a live plan: the plan was destroyed (reshard_plan_destroy)", fn);
}

void api_plan_release(struct reshard_plan *h)
{
    if (atomic_fetch_sub(&h->refs, 1) != 1)
        return;
    struct reshard_comm *c = h->x ? exec_comm(h->x) : NULL;
    exec_destroy(h->x); /* its registrations go while the communicator's context is open */
    plan_free(h->p);
    free(h->from_dst);
    free(h);
    if (c)
        comm_release(c); /* the last plan of a destroyed communicator closes it */
}

void reshard_plan_destroy(reshard_plan_t *plan)
{
    if (!plan)
        return;
    if (!api_live_remove(&plan->live)) {
        rs_log(RS_LOG_INFO, "reshard_plan_destroy: not a live plan (destroyed already?)");
        return;
    }
    api_plan_release(plan); /* an execution from another thread may still hold it */
}

int reshard_plan_ntensors(const reshard_plan_t *plan)
{
    return plan ? plan->p->ntensors : 0;
}

const char *reshard_plan_tensor_name(const reshard_plan_t *plan, int t)
{
    if (!plan || t < 0 || t >= plan->p->ntensors)
        return NULL;
    return plan->p->tensors[t].name;
}

static reshard_status_t tensor_layout(const char *fn, const struct rs_plan *p, int t, int side,
                                      reshard_layout_t **layout)
{
    if (t < 0 || t >= p->ntensors || (side != 0 && side != 1))
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "%s: tensor %d side %d: the plan has %d tensors, sides 0 (source) and 1 "
                        "(destination)",
                        fn, t, side, p->ntensors);
    struct reshard_layout *h = rs_calloc(1, sizeof(*h), "layout");
    if (!h)
        return RESHARD_ERR_NO_MEMORY;
    reshard_status_t st = layout_copy(side ? &p->tensors[t].dst : &p->tensors[t].src, &h->l);
    if (st != RESHARD_OK) {
        free(h);
        return st;
    }
    *layout = h;
    return RESHARD_OK;
}

reshard_status_t reshard_plan_tensor_layout(const reshard_plan_t *plan, int t, int side,
                                            reshard_layout_t **layout)
{
    api_enter();
    if (!plan || !layout)
        return api_null_arg(__func__, plan ? "layout" : "plan");
    reshard_status_t st = api_plan_hold(__func__, held(plan));
    if (st != RESHARD_OK)
        return api_leave(__func__, st);
    st = tensor_layout(__func__, plan->p, t, side, layout);
    api_plan_release(held(plan));
    return api_leave(__func__, st);
}

/* Messages per rank of the reshard transfers a plan of every rank would run. */
static reshard_status_t rank_msgs(const reshard_plan_t *plan, reshard_rank_stats_t *ranks)
{
    int n = plan->p->topo.nranks;
    uint64_t *msgs = rs_calloc((size_t)n, sizeof(*msgs), "message counts");
    if (!msgs)
        return RESHARD_ERR_NO_MEMORY;
    struct xfer_set own = {0};
    reshard_status_t st = xfer_build(plan->p, RESHARD_ALGO_RESHARD, &own);
    if (st == RESHARD_OK)
        st = predict_msgs(plan->p, &own, n, msgs);
    for (int k = 0; st == RESHARD_OK && k < n; k++)
        ranks[k].net_msgs = msgs[k];
    xfer_free(&own);
    free(msgs);
    return st;
}

reshard_status_t reshard_plan_predict(const reshard_plan_t *plan, const reshard_cluster_t *cluster,
                                      reshard_prediction_t *out)
{
    api_enter();
    if (!plan || !cluster || !out)
        return api_null_arg(__func__, !plan ? "plan" : !cluster ? "cluster" : "out");
    reshard_status_t st = api_plan_hold(__func__, held(plan));
    if (st != RESHARD_OK)
        return api_leave(__func__, st);
    if ((st = needs_every_rank(__func__, plan)) == RESHARD_OK)
        st = predict_plan(plan->p, cluster, out);
    api_plan_release(held(plan));
    return api_leave(__func__, st);
}

static reshard_status_t rank_stats(const char *fn, const struct rs_plan *p, int rank,
                                   reshard_rank_stats_t *stats, uint64_t *nops, double *plan_ms)
{
    if (rank < 0 || rank >= p->topo.nranks || (p->scope != PLAN_ALL_RANKS && rank != p->scope))
        return rs_error(
            RESHARD_ERR_INVALID_ARG, "%s: rank %d: the plan holds %s transfers", fn, rank,
            p->scope == PLAN_ALL_RANKS ? "ranks 0 .. world_size-1's" : "another rank's");
    reshard_rank_stats_t s = {.domain = p->topo.domain[rank],
                              .local_index = p->topo.local_index[rank]};
    uint64_t n = 0;
    for (size_t i = 0; i < p->nops; i++) {
        const struct plan_op *o = &p->ops[i];
        uint64_t bytes = (uint64_t)plan_op_bytes(p, o);
        if (o->src != rank && o->dst != rank)
            continue;
        n++;
        if (o->kind == PLAN_OP_SELF)
            s.self += bytes;
        else if (o->kind == PLAN_OP_NET)
            *(o->src == rank ? &s.net_out : &s.net_in) += bytes;
        else
            *(o->src == rank ? &s.local_out : &s.local_in) += bytes;
        if (o->kind == PLAN_OP_NET && o->src == rank &&
            p->tensors[o->tensor].quant == PLAN_QUANT_NONE)
            s.delta_snapshot += bytes;
    }
    struct xfer_set xs;
    reshard_status_t st = xfer_build(p, RESHARD_ALGO_RESHARD, &xs);
    uint64_t *msgs =
        st == RESHARD_OK ? rs_calloc((size_t)p->topo.nranks, sizeof(*msgs), "messages") : NULL;
    if (st == RESHARD_OK && !msgs)
        st = RESHARD_ERR_NO_MEMORY;
    if (st == RESHARD_OK && (st = predict_msgs(p, &xs, p->topo.nranks, msgs)) == RESHARD_OK)
        s.net_msgs = msgs[rank];
    free(msgs);
    xfer_free(&xs);
    if (st != RESHARD_OK)
        return st;
    *stats = s;
    if (nops)
        *nops = n;
    if (plan_ms)
        *plan_ms = p->plan_ms;
    return RESHARD_OK;
}

reshard_status_t reshard_plan_rank_stats(const reshard_plan_t *plan, int rank,
                                         reshard_rank_stats_t *stats, uint64_t *nops,
                                         double *plan_ms)
{
    api_enter();
    if (!plan || !stats)
        return api_null_arg(__func__, plan ? "stats" : "plan");
    reshard_status_t st = api_plan_hold(__func__, held(plan));
    if (st != RESHARD_OK)
        return api_leave(__func__, st);
    st = rank_stats(__func__, plan->p, rank, stats, nops, plan_ms);
    api_plan_release(held(plan));
    return api_leave(__func__, st);
}

/* reshard_plan_stats of a plan of every rank (held by the caller). */
static reshard_status_t plan_stats(const reshard_plan_t *plan, reshard_plan_stats_t *stats,
                                   reshard_rank_stats_t *ranks)
{
    const struct rs_plan *p = plan->p;
    reshard_status_t st = needs_every_rank("reshard_plan_stats", plan);
    if (st != RESHARD_OK)
        return st;
    struct plan_stats s;
    struct plan_rank_stats *r = NULL;
    if (ranks && !(r = rs_calloc((size_t)p->topo.nranks, sizeof(*r), "rank stats")))
        return RESHARD_ERR_NO_MEMORY;
    st = plan_stats_compute(p, &s, r);
    if (st != RESHARD_OK) {
        free(r);
        return st;
    }
    *stats = (reshard_plan_stats_t){
        .net_bytes = (uint64_t)s.net_bytes,
        .min_net_bytes = (uint64_t)s.min_net_bytes,
        .gather_bcast_bytes = (uint64_t)s.gather_bcast_bytes,
        .local_bytes = (uint64_t)s.local_bytes,
        .self_bytes = (uint64_t)s.self_bytes,
        .max_nic_bytes = (uint64_t)s.max_nic_bytes,
        .lb_nic_bytes = (uint64_t)s.lb_nic_bytes,
        .max_nic_rank = s.max_nic_rank,
        .net_ops = s.nops[PLAN_OP_NET],
        .local_ops = s.nops[PLAN_OP_LOCAL],
        .fwd_ops = s.nops[PLAN_OP_FWD],
        .self_ops = s.nops[PLAN_OP_SELF],
        .plan_ms = p->plan_ms,
        .ntensors = p->ntensors,
        .world_size = p->topo.nranks,
        .ndomains = p->topo.ndomains,
        .quant_bytes = (uint64_t)s.quant_bytes,
        .quant_at_source_pct =
            s.quant_bytes ? 100.0 * (double)s.quant_at_src_bytes / (double)s.quant_bytes : 0.0,
    };
    for (int k = 0; r && k < p->topo.nranks; k++)
        ranks[k] = (reshard_rank_stats_t){
            .domain = p->topo.domain[k],
            .local_index = p->topo.local_index[k],
            .net_out = (uint64_t)r[k].net_out,
            .net_in = (uint64_t)r[k].net_in,
            .local_out = (uint64_t)r[k].local_out,
            .local_in = (uint64_t)r[k].local_in,
            .self = (uint64_t)r[k].self,
            .delta_snapshot = (uint64_t)r[k].snapshot,
        };
    free(r);
    return ranks ? rank_msgs(plan, ranks) : RESHARD_OK;
}

reshard_status_t reshard_plan_stats(const reshard_plan_t *plan, reshard_plan_stats_t *stats,
                                    reshard_rank_stats_t *ranks)
{
    api_enter();
    if (!plan || !stats)
        return api_null_arg(__func__, plan ? "stats" : "plan");
    reshard_status_t st = api_plan_hold(__func__, held(plan));
    if (st != RESHARD_OK)
        return api_leave(__func__, st);
    if (plan->x) /* the world's totals from the plan vote, this rank's own row */
        st = exec_stats(plan->x, stats, ranks);
    else
        st = plan_stats(plan, stats, ranks);
    api_plan_release(held(plan));
    return api_leave(__func__, st);
}
