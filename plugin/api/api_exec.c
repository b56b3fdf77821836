/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The public API of communicator plans (reshard.h): made on every rank, each holding its own
 * transfers, and voted on before anything moves (one small allreduce, exec_vote.h), executed
 * (on the host or ordered on a stream), and asked what the last execution left in the
 * destination buffers.
 */
#include "api.h"
#include "base/error.h"
#include "base/log.h"
#include "plugin/comm/comm.h"
#include "planner/stats.h"
#include "plugin/exec/exec.h"
#include "plugin/exec/exec_verify.h"
#include "plugin/exec/exec_vote.h"
#include "base/param.h"

#include <stdio.h>
#include <stdlib.h>

/* This rank's ballot: what it planned, and its own part of the world's figures. */
static reshard_status_t fill_ballot(struct reshard_comm *c, struct reshard_plan *h,
                                    struct exec_plan_ballot *b)
{
    struct rs_plan *p = h->p;
    reshard_rank_stats_t own;
    exec_own_stats(h->x, &own);
    b->hash = p->hash;
    b->local_fp = exec_local_fp(h->x);
    b->net_out = own.net_out;
    b->net_in = own.net_in;
    b->local_out = own.local_out;
    b->self = own.self;
    b->plan_ms = p->plan_ms;
    for (size_t i = 0; i < p->nops; i++) {
        const struct plan_op *op = &p->ops[i];
        b->ops[op->kind] += op->src == c->rank;
        const struct plan_tensor *t = &p->tensors[op->tensor];
        if (t->quant != PLAN_QUANT_CAST || op->dst != c->rank)
            continue; /* counted once, by the rank it lands on */
        uint64_t q = dtype_size(t->dst.dtype);
        for (int d = 0; d < t->dst.ndim; d++)
            q *= (uint64_t)plan_op_len(p, op)[d];
        b->quant += q;
        b->quant_at_src += op->at_src ? q : 0;
    }
    struct plan_rank_bounds rb;
    RS_CHECK(plan_rank_bounds(p, c->rank, &rb));
    b->in_domain = (uint64_t)rb.in_domain;
    uint64_t share = rb.dst_ranks ? ((uint64_t)rb.in_domain + (uint64_t)rb.dst_ranks - 1) /
                                        (uint64_t)rb.dst_ranks
                                  : 0;
    b->lb_part = share > (uint64_t)rb.forced ? share : (uint64_t)rb.forced;
    return RESHARD_OK;
}

/* The broadcast baseline measures what users do today with an FP8 destination (broadcast the
 * training dtype, quantize where it lands: reshard_plan_predict models that), but its
 * executor moves bytes and does not quantize. */
static reshard_status_t refuse_bcast_quantized(const char *fn, const struct rs_plan *p)
{
    for (int t = 0; t < p->ntensors; t++)
        if (p->tensors[t].quant != PLAN_QUANT_NONE)
            return rs_error(RESHARD_ERR_INVALID_ARG,
                            "%s: tensor '%s' has a quantized destination, which the broadcast "
                            "baseline does not run (RESHARD_ALGO_RESHARD and _DIRECT do)",
                            fn, p->tensors[t].name);
    return RESHARD_OK;
}

/* What a communicator plan is made of: the caller's tensors, or a catch-up of refit's joiners
 * (reshard_plan_catch_up). */
struct plan_source {
    const reshard_tensor_t *tensors;
    int ntensors;
    const struct rs_plan *refit;
    const int *joiners;
    int njoiners;
};

/* This rank's own plan, on the communicator's topology. */
static reshard_status_t build_own(const char *fn, struct reshard_comm *comm,
                                  const struct plan_source *from,
                                  const reshard_plan_config_t *config, struct reshard_plan *h)
{
    if (!from->refit)
        return api_plan_build(fn, from->tensors, from->ntensors, &comm->topo.t, config, comm->rank,
                              &h->p);
    RS_CHECK(
        plan_catch_up(from->refit, from->joiners, from->njoiners, comm->rank, &h->p, &h->from_dst));
    rs_log(RS_LOG_INFO, "rank %d: planned the catch-up of %d joiner(s): %zu ops in %.3f ms",
           comm->rank, from->njoiners, h->p->nops, h->p->plan_ms);
    return RESHARD_OK;
}

static reshard_status_t comm_plan_make(const char *fn, reshard_comm_t *comm,
                                       const struct plan_source *from,
                                       const reshard_plan_config_t *config, reshard_plan_t **plan)
{
    reshard_algo_t algo = RESHARD_ALGO_RESHARD;
    if (config && config->size >= offsetof(reshard_plan_config_t, algo) + sizeof(config->algo))
        algo = config->algo;
    int verify = rs_param_int(RS_PARAM_VERIFY) != 0, delta = rs_param_int(RS_PARAM_DELTA) != 0;
    if (config && config->size >= offsetof(reshard_plan_config_t, verify) + sizeof(config->verify))
        verify |= config->verify != 0;
    if (config && config->size >= offsetof(reshard_plan_config_t, delta) + sizeof(config->delta))
        delta |= config->delta != 0;
    if (from->refit) {
        /* A joiner holds nothing a delta could apply to, and the check compares whole tensors
         * (the catch-up writes the joiners' shards only): it moves full values, unchecked. */
        if (verify || delta)
            rs_log(RS_LOG_INFO, "%s: a catch-up moves full tensors and is not verified", fn);
        verify = delta = 0;
        algo = RESHARD_ALGO_RESHARD; /* the baselines have no roles */
    }
    /* Held from here: on success, the hold is the plan's reference to its communicator. */
    reshard_status_t st = api_comm_hold(fn, comm);
    if (st != RESHARD_OK)
        return api_leave(fn, st);
    if ((st = comm_usable(comm)) != RESHARD_OK)
        return api_leave(fn, api_comm_drop(comm, st));
    struct reshard_plan *h = rs_calloc(1, sizeof(*h), "plan");
    if (!h) {
        boot_abort(comm->boot, RESHARD_ERR_NO_MEMORY, "out of memory creating a plan");
        return api_leave(fn, api_comm_drop(comm, RESHARD_ERR_NO_MEMORY));
    }
    /* Build everything locally, then vote: a rank that failed still votes, so nobody waits
     * for it, and nobody runs a plan another rank could not build. Each rank plans its own
     * transfers only (the same rule as a plan of every rank, so the same hash). */
    struct exec_plan_ballot mine = {.algo = (int32_t)algo,
                                    .chunk_bytes = exec_chunk_bytes(),
                                    .coalesce_bytes = exec_coalesce_bytes()};
    mine.status = build_own(fn, comm, from, config, h);
    if (mine.status == RESHARD_OK && verify)
        mine.status = exec_verify_possible(h->p);
    if (mine.status == RESHARD_OK && algo != RESHARD_ALGO_RESHARD && comm->nmembers < comm->size)
        mine.status = rs_error(RESHARD_ERR_INVALID_ARG,
                               "%s: the direct and broadcast baselines need every rank; a shrunk "
                               "communicator runs RESHARD_ALGO_RESHARD",
                               fn);
    if (mine.status == RESHARD_OK && algo == RESHARD_ALGO_BCAST)
        mine.status = refuse_bcast_quantized(fn, h->p);
    /* The executor connects to its peers through the network context, which serves one
     * caller at a time: from here to the vote the communicator is held. */
    struct rs_saved_error why;
    reshard_plan_stats_t world;
    if ((st = comm_enter(comm)) == RESHARD_OK) {
        struct xfer_set xs;
        if (mine.status == RESHARD_OK && (mine.status = xfer_build(h->p, algo, &xs)) == RESHARD_OK)
            mine.status = exec_create(comm, h->p, &xs, &h->x);
        if (mine.status == RESHARD_OK)
            mine.status = fill_ballot(comm, h, &mine);
        rs_error_save(&why);
        mine.why = why.msg;
        st = comm_leave(comm, exec_vote_plan(comm, &mine, &world));
    } else {
        rs_error_save(&why);
    }
    if (mine.status != RESHARD_OK) { /* our own failure says more than the vote */
        rs_error_restore(&why);
        st = mine.status;
    }
    if (st != RESHARD_OK) {
        exec_destroy(h->x);
        plan_free(h->p);
        free(h->from_dst);
        free(h);
        return api_leave(fn, api_comm_drop(comm, st));
    }
    exec_set_world(h->x, &world);
    exec_delta_enable(h->x, delta);
    exec_verify_enable(h->x, verify);
    h->verify = verify;
    api_plan_given(h);
    *plan = h;
    return RESHARD_OK;
}

reshard_status_t reshard_comm_plan_create(reshard_comm_t *comm, const reshard_tensor_t *tensors,
                                          int ntensors, const reshard_plan_config_t *config,
                                          reshard_plan_t **plan)
{
    api_enter();
    if (!comm || !tensors || !plan)
        return api_null_arg(__func__, !comm ? "comm" : !tensors ? "tensors" : "plan");
    *plan = NULL; /* on failure too: nothing to destroy */
    struct plan_source from = {.tensors = tensors, .ntensors = ntensors};
    return comm_plan_make(__func__, comm, &from, config, plan);
}

/* Holds a communicator plan for the call (api_plan_hold: before anything of it is read); one
 * made by reshard_plan_create is refused, saying what it cannot do. */
static reshard_status_t hold_comm_plan(const char *fn, const reshard_plan_t *plan,
                                       const char *cannot)
{
    struct reshard_plan *h = (struct reshard_plan *)plan; /* held, not changed */
    RS_CHECK(api_plan_hold(fn, h));
    if (h->x)
        return RESHARD_OK;
    api_plan_release(h);
    return rs_error(RESHARD_ERR_INVALID_ARG, "%s: the plan was made by reshard_plan_create, %s", fn,
                    cannot);
}

reshard_status_t reshard_plan_outcome(const reshard_plan_t *plan, reshard_tensor_state_t *states)
{
    api_enter();
    if (!plan || !states)
        return api_null_arg(__func__, plan ? "states" : "plan");
    reshard_status_t st = hold_comm_plan(
        __func__, plan, "which never executes; ask a plan made by reshard_comm_plan_create");
    if (st == RESHARD_OK) {
        st = exec_outcome(plan->x, states);
        api_plan_release((struct reshard_plan *)plan);
    }
    return api_leave(__func__, st);
}

/* A check on the plan's communicator, held for it as any collective. */
static reshard_status_t check(reshard_plan_t *plan, const reshard_buffers_t *bufs,
                              enum exec_verify_mode mode)
{
    struct reshard_comm *c = exec_comm(plan->x);
    reshard_status_t st = comm_enter(c);
    if (st != RESHARD_OK)
        return st;
    return comm_leave(c, exec_verify(c, plan->p, plan->x, bufs, mode));
}

reshard_status_t reshard_plan_check_layouts(reshard_plan_t *plan, const reshard_buffers_t *bufs)
{
    api_enter();
    if (!plan || !bufs)
        return api_null_arg(__func__, plan ? "bufs" : "plan");
    reshard_status_t st = hold_comm_plan(
        __func__, plan, "which has no ranks to ask; check one made by reshard_comm_plan_create");
    if (st == RESHARD_OK) {
        st = check(plan, bufs, EXEC_VERIFY_LAYOUTS);
        api_plan_release(plan);
    }
    return api_leave(__func__, st);
}

/* A catch-up of a plan made by reshard_plan_create(_rank): every rank's, or the same rank's. */
static reshard_status_t offline_catch_up(const reshard_plan_t *refit, const int *joiners, int n,
                                         reshard_plan_t **plan)
{
    struct reshard_plan *h = rs_calloc(1, sizeof(*h), "plan");
    if (!h)
        return RESHARD_ERR_NO_MEMORY;
    reshard_status_t st = plan_catch_up(refit->p, joiners, n, refit->p->scope, &h->p, &h->from_dst);
    if (st != RESHARD_OK) {
        free(h);
        return st;
    }
    api_plan_given(h);
    *plan = h;
    return RESHARD_OK;
}

reshard_status_t reshard_plan_catch_up(reshard_plan_t *refit, const int *joiners, int n,
                                       const reshard_plan_config_t *config, reshard_plan_t **plan)
{
    api_enter();
    if (!refit || !joiners || !plan)
        return api_null_arg(__func__, !refit ? "refit" : !joiners ? "joiners" : "plan");
    *plan = NULL; /* on failure too: nothing to destroy */
    reshard_status_t st = api_plan_hold(__func__, refit);
    if (st != RESHARD_OK)
        return api_leave(__func__, st);
    if (refit->from_dst) {
        api_plan_release(refit);
        return api_leave(__func__,
                         rs_error(RESHARD_ERR_INVALID_ARG,
                                  "%s: the plan is a catch-up itself; pass the refit's", __func__));
    }
    if (!refit->x) { /* offline: the same plan at the refit's scope, to look at */
        st = offline_catch_up(refit, joiners, n, plan);
        api_plan_release(refit);
        return api_leave(__func__, st);
    }
    struct plan_source from = {.refit = refit->p, .joiners = joiners, .njoiners = n};
    st = comm_plan_make(__func__, exec_comm(refit->x), &from, config, plan);
    api_plan_release(refit);
    return st;
}

/* A catch-up plan's buffers: the caller's, each tensor served by the destination replicas
 * reading its source from the destination buffer (*out NULL for any other plan). */
static reshard_status_t catch_up_bufs(const reshard_plan_t *plan, const reshard_buffers_t *bufs,
                                      reshard_buffers_t **out)
{
    *out = NULL;
    if (!plan->from_dst)
        return RESHARD_OK;
    int n = plan->p->ntensors;
    reshard_buffers_t *b = rs_calloc((size_t)n, sizeof(*b), "catch-up buffers");
    if (!b)
        return RESHARD_ERR_NO_MEMORY;
    for (int t = 0; t < n; t++) {
        b[t] = bufs[t];
        if (plan->from_dst[t]) {
            b[t].src = bufs[t].dst;
            b[t].src_bytes = bufs[t].dst_bytes;
        }
    }
    *out = b;
    return RESHARD_OK;
}

/* Both execute entry points: fn names the one the user called. */
static reshard_status_t execute(const char *fn, reshard_plan_t *plan, const reshard_buffers_t *bufs,
                                int on_stream, void *stream)
{
    api_enter();
    if (!plan || !bufs)
        return api_null_arg(fn, plan ? "bufs" : "plan");
    /* Held until it returns: a destroy from another thread leaves the plan, and through it
     * the communicator, to this execution. */
    reshard_status_t st = hold_comm_plan(
        fn, plan, "which has no communicator; execute one made by reshard_comm_plan_create");
    if (st != RESHARD_OK)
        return api_leave(fn, st);
    reshard_buffers_t *mapped;
    if ((st = catch_up_bufs(plan, bufs, &mapped)) != RESHARD_OK) {
        api_plan_release(plan);
        return api_leave(fn, st);
    }
    st = exec_run(plan->x, mapped ? mapped : bufs, on_stream, stream);
    free(mapped);
    /* A refit enqueued on NCCL's stream is waited for first: verification reads what landed. */
    if (st == RESHARD_OK && plan->verify &&
        (st = exec_settle(plan->x, on_stream, stream)) == RESHARD_OK &&
        (st = check(plan, bufs, EXEC_VERIFY_REFIT)) != RESHARD_OK)
        exec_delta_forget_dst(plan->x); /* a delta on what it found is never applied */
    api_plan_release(plan);
    return api_leave(fn, st);
}

reshard_status_t reshard_plan_execute(reshard_plan_t *plan, const reshard_buffers_t *bufs)
{
    return execute(__func__, plan, bufs, 0, NULL);
}

reshard_status_t reshard_plan_execute_stream(reshard_plan_t *plan, const reshard_buffers_t *bufs,
                                             void *stream)
{
    return execute(__func__, plan, bufs, 1, stream);
}
