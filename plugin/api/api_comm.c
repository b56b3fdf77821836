/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The public API that moves bytes (reshard.h): shard queries for callers filling buffers,
 * communicators, communicator plans and their execution, counters.
 */
#include "api.h"
#include "base/error.h"
#include "base/log.h"
#include "base/param.h"
#include "plugin/comm/comm.h"
#include "plugin/exec/exec.h"
#include "plugin/exec/region.h"

#include <stdlib.h>
#include <string.h>

_Static_assert(sizeof(reshard_unique_id_t) == sizeof(struct boot_id),
               "reshard_unique_id_t must hold a bootstrap id");

/* ---- shards ---- */

static reshard_status_t shard_of(const reshard_layout_t *layout, int rank, struct rs_shardmap *m,
                                 int *pos)
{
    RS_CHECK(shardmap_build(&layout->l, m, NULL));
    *pos = shardmap_position(m, rank);
    return RESHARD_OK;
}

reshard_status_t reshard_layout_shard_shape(const reshard_layout_t *layout, int rank,
                                            int64_t shape[8], int64_t *numel)
{
    api_enter();
    if (!layout || !shape)
        return api_null_arg(__func__, layout ? "shape" : "layout");
    struct rs_shardmap m;
    int pos;
    reshard_status_t st = shard_of(layout, rank, &m, &pos);
    if (st != RESHARD_OK)
        return api_leave(__func__, st);
    int64_t n = pos >= 0;
    for (int j = 0; j < 8; j++) {
        shape[j] = 0;
        if (j < layout->l.ndim && pos >= 0)
            shape[j] = dimmap_group_len(&m.dim[j], shardmap_group(&m, pos, j));
        n *= j < layout->l.ndim ? shape[j] : 1;
    }
    if (numel)
        *numel = n;
    shardmap_free(&m);
    return RESHARD_OK;
}

reshard_status_t reshard_layout_shard_index(const reshard_layout_t *layout, int rank, int dim,
                                            int64_t *global)
{
    api_enter();
    if (!layout || !global)
        return api_null_arg(__func__, layout ? "global" : "layout");
    if (dim < 0 || dim >= layout->l.ndim)
        return api_leave(__func__, rs_error(RESHARD_ERR_INVALID_ARG, "%s: dim %d of a %d-D tensor",
                                            __func__, dim, layout->l.ndim));
    struct rs_shardmap m;
    int pos;
    reshard_status_t st = shard_of(layout, rank, &m, &pos);
    if (st != RESHARD_OK)
        return api_leave(__func__, st);
    if (pos >= 0) {
        const struct rs_dimmap *d = &m.dim[dim];
        int g = shardmap_group(&m, pos, dim);
        for (int s = d->first[g]; s < d->first[g + 1]; s++)
            for (int64_t i = 0; i < d->segs[s].len; i++)
                global[d->segs[s].pos + i] = d->segs[s].start + i;
    }
    shardmap_free(&m);
    return RESHARD_OK;
}

reshard_status_t reshard_layout_shard_bytes(const reshard_layout_t *layout, int rank, size_t *bytes)
{
    int64_t shape[8], numel;
    reshard_status_t st = reshard_layout_shard_shape(layout, rank, shape, &numel);
    if (st != RESHARD_OK)
        return st;
    if (!bytes)
        return api_null_arg(__func__, "bytes");
    *bytes = numel ? (size_t)region_span_bytes(&layout->l, shape) : 0;
    return RESHARD_OK;
}

/* ---- communicators ---- */

reshard_status_t reshard_get_unique_id(reshard_unique_id_t *id)
{
    api_enter();
    if (!id)
        return api_null_arg(__func__, "id");
    struct boot_id b;
    reshard_status_t st = boot_id_create(&b);
    if (st == RESHARD_OK)
        memcpy(id, &b, sizeof(b));
    return api_leave(__func__, st);
}

reshard_status_t reshard_comm_init_rank(const reshard_unique_id_t *id, int rank, int size,
                                        reshard_comm_t **comm)
{
    api_enter();
    if (!id || !comm)
        return api_null_arg(__func__, id ? "comm" : "id");
    struct boot_id b;
    memcpy(&b, id, sizeof(b));
    return api_leave(__func__, comm_create(&b, rank, size, -1, comm));
}

reshard_status_t reshard_comm_init_env(reshard_comm_t **comm)
{
    api_enter();
    if (!comm)
        return api_null_arg(__func__, "comm");
    struct boot_env env;
    reshard_status_t st = boot_env_read(&env);
    if (st == RESHARD_OK)
        st = comm_create(&env.id, env.rank, env.size, env.local_rank, comm);
    return api_leave(__func__, st);
}

reshard_status_t reshard_comm_init_nccl(void *nccl_comm, reshard_comm_t **comm)
{
    api_enter();
    if (!nccl_comm || !comm)
        return api_null_arg(__func__, comm ? "nccl_comm" : "comm");
    return api_leave(__func__, comm_create_nccl(nccl_comm, comm));
}

int reshard_comm_rank(const reshard_comm_t *comm)
{
    return comm ? comm->rank : -1;
}

int reshard_comm_size(const reshard_comm_t *comm)
{
    return comm ? comm->size : -1;
}

int reshard_comm_has_rank(const reshard_comm_t *comm, int rank)
{
    return comm && rank >= 0 && rank < comm->size && comm_has(comm, rank);
}

reshard_status_t reshard_comm_shrink(reshard_comm_t *comm, const int *exclude, int nexclude,
                                     reshard_comm_t **newcomm)
{
    api_enter();
    if (!comm || !newcomm || (!exclude && nexclude > 0))
        return api_null_arg(__func__, !comm ? "comm" : !newcomm ? "newcomm" : "exclude");
    if (nexclude < 0)
        return api_leave(
            __func__, rs_error(RESHARD_ERR_INVALID_ARG, "%s: nexclude is %d", __func__, nexclude));
    int idle = 0; /* not while this rank executes on it */
    if (!atomic_compare_exchange_strong(&comm->busy, &idle, 1))
        return api_leave(__func__, rs_error(RESHARD_ERR_BUSY,
                                            "%s: the communicator is executing; abort it "
                                            "(reshard_comm_abort) and let the execution return",
                                            __func__));
    reshard_status_t st = comm_shrink(comm, exclude, nexclude, newcomm);
    atomic_store(&comm->busy, 0);
    return api_leave(__func__, st);
}

const reshard_topo_t *reshard_comm_topo(const reshard_comm_t *comm)
{
    return comm ? &comm->topo : NULL;
}

reshard_status_t reshard_comm_abort(reshard_comm_t *comm)
{
    api_enter();
    if (!comm)
        return api_null_arg(__func__, "comm");
    atomic_store(&comm->abort_req, 1);
    int idle = 0;
    if (atomic_compare_exchange_strong(&comm->busy, &idle, 1)) { /* nothing in flight */
        comm_abort_now(comm);
        atomic_store(&comm->busy, 0);
    } /* else the execution in flight sees the request within a wait (milliseconds) */
    return RESHARD_OK;
}

void reshard_comm_destroy(reshard_comm_t *comm)
{
    comm_destroy(comm);
}

reshard_status_t reshard_comm_barrier(reshard_comm_t *comm)
{
    api_enter();
    if (!comm)
        return api_null_arg(__func__, "comm");
    reshard_status_t st = comm_enter(comm);
    if (st == RESHARD_OK)
        st = comm_leave(comm, boot_barrier(comm->boot));
    return api_leave(__func__, st);
}

reshard_status_t reshard_comm_allgather(reshard_comm_t *comm, void *buf, size_t bytes_per_rank)
{
    api_enter();
    if (!comm || !buf)
        return api_null_arg(__func__, comm ? "buf" : "comm");
    reshard_status_t st = comm_enter(comm);
    if (st == RESHARD_OK)
        st = comm_leave(comm, comm_allgather(comm, buf, bytes_per_rank));
    return api_leave(__func__, st);
}

reshard_status_t reshard_comm_counters(const reshard_comm_t *comm,
                                       reshard_comm_counters_t *counters)
{
    api_enter();
    if (!comm || !counters)
        return api_null_arg(__func__, comm ? "counters" : "comm");
    const struct tp_counters *n = &comm->net->counters;
    *counters = (reshard_comm_counters_t){.net_out = n->bytes_out,
                                          .net_in = n->bytes_in,
                                          .local_out = comm->local_out,
                                          .local_in = comm->local_in,
                                          .self = comm->self,
                                          .ctrl_msgs = n->ctrl_out,
                                          .net_msgs = n->msgs_out,
                                          .ipc_out = comm->ipc_out,
                                          .gdr_out = comm->gdr_out,
                                          .gdr_in = comm->gdr_in};
    return RESHARD_OK;
}

reshard_status_t reshard_comm_counters_all(reshard_comm_t *comm, reshard_comm_counters_t *all,
                                           int *node)
{
    api_enter();
    if (!comm || !all)
        return api_null_arg(__func__, comm ? "all" : "comm");
    RS_CHECK(reshard_comm_counters(comm, &all[comm->rank]));
    reshard_status_t st = comm_enter(comm);
    if (st == RESHARD_OK)
        st = comm_leave(comm, comm_allgather(comm, all, sizeof(*all)));
    if (st == RESHARD_OK && node)
        memcpy(node, comm->node, (size_t)comm->size * sizeof(int));
    return api_leave(__func__, st);
}

/* ---- communicator plans ---- */

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
    mine.status = api_plan_build(__func__, tensors, ntensors, &comm->topo.t, config, &h->p);
    if (mine.status == RESHARD_OK && algo != RESHARD_ALGO_RESHARD && comm->nmembers < comm->size)
        mine.status = rs_error(RESHARD_ERR_INVALID_ARG,
                               "%s: the direct and broadcast baselines need every rank; a shrunk "
                               "communicator runs RESHARD_ALGO_RESHARD",
                               __func__);
    /* The executor connects to its peers through the network context, which serves one
     * caller at a time: from here to the vote the communicator is held. */
    char why[RS_ERROR_MAX];
    if ((st = comm_enter(comm)) == RESHARD_OK) {
        struct xfer_set xs;
        if (mine.status == RESHARD_OK && (mine.status = xfer_build(h->p, algo, &xs)) == RESHARD_OK)
            mine.status = exec_create(comm, h->p, &xs, &h->x);
        snprintf(why, sizeof(why), "%s", rs_error_message());
        if (mine.status == RESHARD_OK)
            mine.hash = h->p->hash;
        st = comm_leave(comm, compare_plans(comm, &mine));
    } else {
        snprintf(why, sizeof(why), "%s", rs_error_message());
    }
    if (mine.status != RESHARD_OK) /* our own failure says more than the vote */
        st = rs_error((reshard_status_t)mine.status, "%s", why);
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
