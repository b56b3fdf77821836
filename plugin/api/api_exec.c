/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The public API of communicator plans (reshard.h): made on every rank and voted on before
 * anything moves, executed (on the host or ordered on a stream), and asked what the last
 * execution left in the destination buffers.
 */
#include "api.h"
#include "base/error.h"
#include "plugin/comm/comm.h"
#include "plugin/exec/exec.h"

#include <stdio.h>
#include <stdlib.h>

/* What each rank planned, compared before anything moves. */
struct plan_vote {
    int32_t status;
    int32_t algo;
    uint64_t hash;
    int64_t chunk_bytes;    /* both ends of a transfer must cut it alike */
    int64_t coalesce_bytes; /* ... and pack its small chunks alike */
};

static reshard_status_t compare_plans(struct reshard_comm *c, struct plan_vote *mine)
{
    struct plan_vote *v = rs_calloc((size_t)c->size, sizeof(*v), "plan votes");
    if (!v) { /* cannot vote: tell the others rather than let them time out */
        boot_abort(c->boot, RESHARD_ERR_NO_MEMORY, "out of memory voting on a plan");
        return RESHARD_ERR_NO_MEMORY;
    }
    v[c->rank] = *mine;
    reshard_status_t st = comm_allgather(c, v, sizeof(*v));
    for (int r = 0; st == RESHARD_OK && r < c->size; r++) {
        if (!comm_has(c, r))
            continue;
        if (v[r].status != RESHARD_OK && r != c->rank)
            st = rs_error(RESHARD_ERR_REMOTE, "rank %d could not plan: %s", r,
                          rs_status_string((reshard_status_t)v[r].status));
        else if (v[r].status == RESHARD_OK && mine->status == RESHARD_OK &&
                 v[r].chunk_bytes != mine->chunk_bytes)
            st = rs_error(RESHARD_ERR_PLAN_MISMATCH,
                          "rank %d: RESHARD_CHUNK_BYTES is %lld on rank %d and %lld here: set "
                          "it alike on every rank",
                          c->rank, (long long)v[r].chunk_bytes, r, (long long)mine->chunk_bytes);
        else if (v[r].status == RESHARD_OK && mine->status == RESHARD_OK &&
                 v[r].coalesce_bytes != mine->coalesce_bytes)
            st = rs_error(RESHARD_ERR_PLAN_MISMATCH,
                          "rank %d: RESHARD_COALESCE_BYTES is %lld on rank %d and %lld here: set "
                          "it alike on every rank",
                          c->rank, (long long)v[r].coalesce_bytes, r,
                          (long long)mine->coalesce_bytes);
        else if (v[r].status == RESHARD_OK && mine->status == RESHARD_OK &&
                 (v[r].hash != mine->hash || v[r].algo != mine->algo)) {
            char list[128];
            size_t used = 0;
            int shown = 0;
            for (int q = 0; q < c->size && shown < 8; q++)
                if (comm_has(c, q) && (v[q].hash != mine->hash || v[q].algo != mine->algo))
                    used +=
                        (size_t)snprintf(list + used, used < sizeof(list) ? sizeof(list) - used : 0,
                                         "%s%d", shown++ ? ", " : "", q);
            st = rs_error(RESHARD_ERR_PLAN_MISMATCH,
                          "rank %d: ranks %s passed other layouts or algorithm than this rank "
                          "(plan hash %016llx here)",
                          c->rank, list, (unsigned long long)mine->hash);
        }
    }
    free(v);
    return st;
}

reshard_status_t reshard_comm_plan_create(reshard_comm_t *comm, const reshard_tensor_t *tensors,
                                          int ntensors, const reshard_plan_config_t *config,
                                          reshard_plan_t **plan)
{
    api_enter();
    if (!comm || !tensors || !plan)
        return api_null_arg(__func__, !comm ? "comm" : !tensors ? "tensors" : "plan");
    *plan = NULL; /* on failure too: nothing to destroy */
    reshard_algo_t algo = RESHARD_ALGO_RESHARD;
    if (config && config->size >= offsetof(reshard_plan_config_t, algo) + sizeof(config->algo))
        algo = config->algo;
    reshard_status_t st = comm_usable(comm);
    if (st != RESHARD_OK)
        return api_leave(__func__, st);
    struct reshard_plan *h = rs_calloc(1, sizeof(*h), "plan");
    if (!h) {
        boot_abort(comm->boot, RESHARD_ERR_NO_MEMORY, "out of memory creating a plan");
        return api_leave(__func__, RESHARD_ERR_NO_MEMORY);
    }
    /* Build everything locally, then vote: a rank that failed still votes, so nobody waits
     * for it, and nobody runs a plan another rank could not build. */
    struct plan_vote mine = {.algo = (int32_t)algo,
                             .chunk_bytes = exec_chunk_bytes(),
                             .coalesce_bytes = exec_coalesce_bytes()};
    mine.status =
        api_plan_build(__func__, tensors, ntensors, &comm->topo.t, config, PLAN_ALL_RANKS, &h->p);
    if (mine.status == RESHARD_OK && algo != RESHARD_ALGO_RESHARD && comm->nmembers < comm->size)
        mine.status = rs_error(RESHARD_ERR_INVALID_ARG,
                               "%s: the direct and broadcast baselines need every rank; a shrunk "
                               "communicator runs RESHARD_ALGO_RESHARD",
                               __func__);
    /* The executor connects to its peers through the network context, which serves one
     * caller at a time: from here to the vote the communicator is held. */
    struct rs_saved_error why;
    if ((st = comm_enter(comm)) == RESHARD_OK) {
        struct xfer_set xs;
        if (mine.status == RESHARD_OK && (mine.status = xfer_build(h->p, algo, &xs)) == RESHARD_OK)
            mine.status = exec_create(comm, h->p, &xs, &h->x);
        rs_error_save(&why);
        if (mine.status == RESHARD_OK)
            mine.hash = h->p->hash;
        st = comm_leave(comm, compare_plans(comm, &mine));
    } else {
        rs_error_save(&why);
    }
    if (mine.status != RESHARD_OK) { /* our own failure says more than the vote */
        rs_error_restore(&why);
        st = (reshard_status_t)mine.status;
    }
    if (st != RESHARD_OK) {
        exec_destroy(h->x);
        plan_free(h->p);
        free(h);
        return api_leave(__func__, st);
    }
    *plan = h;
    return RESHARD_OK;
}

reshard_status_t reshard_plan_outcome(const reshard_plan_t *plan, reshard_tensor_state_t *states)
{
    api_enter();
    if (!plan || !states)
        return api_null_arg(__func__, plan ? "states" : "plan");
    if (!plan->x)
        return api_leave(__func__,
                         rs_error(RESHARD_ERR_INVALID_ARG,
                                  "%s: the plan was made by reshard_plan_create, which never "
                                  "executes; ask a plan made by reshard_comm_plan_create",
                                  __func__));
    return api_leave(__func__, exec_outcome(plan->x, states));
}

/* Both execute entry points: fn names the one the user called. */
static reshard_status_t execute(const char *fn, reshard_plan_t *plan, const reshard_buffers_t *bufs,
                                int on_stream, void *stream)
{
    api_enter();
    if (!plan || !bufs)
        return api_null_arg(fn, plan ? "bufs" : "plan");
    if (!plan->x)
        return api_leave(fn, rs_error(RESHARD_ERR_INVALID_ARG,
                                      "%s: the plan was made by reshard_plan_create; execute one "
                                      "made by reshard_comm_plan_create",
                                      fn));
    return api_leave(fn, exec_run(plan->x, bufs, on_stream, stream));
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
