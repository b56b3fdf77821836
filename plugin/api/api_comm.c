/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The public API of communicators (reshard.h): the unique id that gathers the ranks, the
 * three ways to form a communicator, shrinking and aborting it, its own collectives (barrier,
 * allgather) and its byte counters.
 */
#include "api.h"
#include "base/error.h"
#include "base/log.h"
#include "base/param.h"
#include "plugin/comm/comm.h"

#include <string.h>

_Static_assert(sizeof(reshard_unique_id_t) == sizeof(struct boot_id),
               "reshard_unique_id_t must hold a bootstrap id");

/* ---- communicators ---- */

reshard_status_t api_comm_hold(const char *fn, struct reshard_comm *c)
{
    if (api_live_take(&c->live))
        return RESHARD_OK;
    return rs_error(RESHARD_ERR_INVALID_ARG,
                    "%s: not a live communicator: the communicator was destroyed "
                    "(reshard_comm_destroy)",
                    fn);
}

/* A new communicator, handed to the caller: its first reference (comm_alloc's) is theirs. */
static reshard_status_t given(struct reshard_comm **comm, reshard_status_t st)
{
    if (st == RESHARD_OK)
        api_live_add(&(*comm)->live, &(*comm)->refs);
    return st;
}

reshard_status_t api_comm_drop(struct reshard_comm *c, reshard_status_t st)
{
    comm_release(c);
    return st;
}

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
    return api_leave(__func__, given(comm, comm_create(&b, rank, size, -1, comm)));
}

reshard_status_t reshard_comm_init_env(reshard_comm_t **comm)
{
    api_enter();
    if (!comm)
        return api_null_arg(__func__, "comm");
    struct boot_env env;
    reshard_status_t st = boot_env_read(&env);
    if (st == RESHARD_OK)
        st = given(comm, comm_create(&env.id, env.rank, env.size, env.local_rank, comm));
    return api_leave(__func__, st);
}

reshard_status_t reshard_comm_init_nccl(void *nccl_comm, reshard_comm_t **comm)
{
    api_enter();
    if (!nccl_comm || !comm)
        return api_null_arg(__func__, comm ? "nccl_comm" : "comm");
    return api_leave(__func__, given(comm, comm_create_nccl(nccl_comm, comm)));
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

/* Marks comm busy for call (shrink, leave), or refuses while this rank executes on it. */
static reshard_status_t claim_idle(const char *call, reshard_comm_t *comm)
{
    int idle = 0;
    if (atomic_compare_exchange_strong(&comm->busy, &idle, 1))
        return RESHARD_OK;
    return rs_error(RESHARD_ERR_BUSY,
                    "%s: the communicator is executing; abort it (reshard_comm_abort) and let the "
                    "execution return",
                    call);
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
    reshard_status_t st = api_comm_hold(__func__, comm);
    if (st != RESHARD_OK)
        return api_leave(__func__, st);
    if ((st = claim_idle(__func__, comm)) != RESHARD_OK) /* not while this rank executes */
        return api_leave(__func__, api_comm_drop(comm, st));
    st = given(newcomm, comm_shrink(comm, exclude, nexclude, newcomm));
    atomic_store(&comm->busy, 0);
    return api_leave(__func__, api_comm_drop(comm, st));
}

reshard_status_t reshard_comm_grow_id(reshard_comm_t *comm, const int *joiners, int n,
                                      reshard_unique_id_t *id)
{
    api_enter();
    if (!comm || !joiners || !id)
        return api_null_arg(__func__, !comm ? "comm" : !joiners ? "joiners" : "id");
    reshard_status_t st = api_comm_hold(__func__, comm);
    if (st != RESHARD_OK)
        return api_leave(__func__, st);
    struct boot_id b;
    if ((st = comm_grow_id(comm, joiners, n, &b)) == RESHARD_OK)
        memcpy(id, &b, sizeof(b));
    return api_leave(__func__, api_comm_drop(comm, st));
}

reshard_status_t reshard_comm_grow(reshard_comm_t *comm, const int *joiners, int n,
                                   reshard_comm_t **newcomm)
{
    api_enter();
    if (!comm || !joiners || !newcomm)
        return api_null_arg(__func__, !comm ? "comm" : !joiners ? "joiners" : "newcomm");
    reshard_status_t st = api_comm_hold(__func__, comm);
    if (st != RESHARD_OK)
        return api_leave(__func__, st);
    st = given(newcomm, comm_grow(comm, joiners, n, newcomm));
    return api_leave(__func__, api_comm_drop(comm, st));
}

reshard_status_t reshard_comm_join(const reshard_unique_id_t *id, int rank, const int *joiners,
                                   int n, reshard_comm_t **comm)
{
    api_enter();
    if (!id || !joiners || !comm)
        return api_null_arg(__func__, !id ? "id" : !joiners ? "joiners" : "comm");
    struct boot_id b;
    memcpy(&b, id, sizeof(b));
    return api_leave(__func__, given(comm, comm_join_grown(&b, rank, joiners, n, comm)));
}

reshard_status_t reshard_comm_leave(reshard_comm_t *comm)
{
    api_enter();
    if (!comm)
        return api_null_arg(__func__, "comm");
    reshard_status_t st = api_comm_hold(__func__, comm);
    if (st != RESHARD_OK)
        return api_leave(__func__, st);
    if ((st = claim_idle(__func__, comm)) != RESHARD_OK) /* not while this rank executes */
        return api_leave(__func__, api_comm_drop(comm, st));
    comm_depart(comm);
    atomic_store(&comm->busy, 0);
    rs_log(RS_LOG_INFO, "reshard_comm_leave: rank %d left; the others were told", comm->rank);
    if (api_live_remove(&comm->live)) /* else another thread destroyed it meanwhile */
        comm_close(comm);
    return api_leave(__func__, api_comm_drop(comm, RESHARD_OK));
}

reshard_status_t reshard_comm_left(reshard_comm_t *comm, int *rank)
{
    api_enter();
    if (!comm || !rank)
        return api_null_arg(__func__, comm ? "rank" : "comm");
    reshard_status_t st = api_comm_hold(__func__, comm);
    if (st != RESHARD_OK)
        return api_leave(__func__, st);
    int idle = 0, left; /* a collective in flight reads the news itself: only look when idle */
    if (atomic_compare_exchange_strong(&comm->busy, &idle, 1)) {
        left = comm_left(comm);
        atomic_store(&comm->busy, 0);
    } else {
        left = boot_left(comm->boot);
    }
    *rank = left;
    return api_leave(__func__, api_comm_drop(comm, RESHARD_OK));
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
    reshard_status_t st = api_comm_hold(__func__, comm);
    if (st != RESHARD_OK)
        return api_leave(__func__, st);
    atomic_store(&comm->abort_req, 1);
    int idle = 0;
    if (atomic_compare_exchange_strong(&comm->busy, &idle, 1)) { /* nothing in flight */
        comm_abort_now(comm);
        atomic_store(&comm->busy, 0);
    } /* else the execution in flight sees the request within a wait (milliseconds) */
    return api_comm_drop(comm, RESHARD_OK);
}

void reshard_comm_destroy(reshard_comm_t *comm)
{
    if (!comm)
        return;
    if (!api_live_remove(&comm->live)) {
        rs_log(RS_LOG_INFO, "reshard_comm_destroy: not a live communicator (destroyed already?)");
        return;
    }
    comm_close(comm);
}

reshard_status_t reshard_comm_barrier(reshard_comm_t *comm)
{
    api_enter();
    if (!comm)
        return api_null_arg(__func__, "comm");
    reshard_status_t st = api_comm_hold(__func__, comm);
    if (st != RESHARD_OK)
        return api_leave(__func__, st);
    if ((st = comm_enter(comm)) == RESHARD_OK)
        st = comm_leave(comm, boot_barrier(comm->boot));
    return api_leave(__func__, api_comm_drop(comm, st));
}

reshard_status_t reshard_comm_allgather(reshard_comm_t *comm, void *buf, size_t bytes_per_rank)
{
    api_enter();
    if (!comm || !buf)
        return api_null_arg(__func__, comm ? "buf" : "comm");
    reshard_status_t st = api_comm_hold(__func__, comm);
    if (st != RESHARD_OK)
        return api_leave(__func__, st);
    if ((st = comm_enter(comm)) == RESHARD_OK)
        st = comm_leave(comm, comm_allgather(comm, buf, bytes_per_rank));
    return api_leave(__func__, api_comm_drop(comm, st));
}

reshard_status_t reshard_comm_counters(const reshard_comm_t *comm,
                                       reshard_comm_counters_t *counters)
{
    api_enter();
    if (!comm || !counters)
        return api_null_arg(__func__, comm ? "counters" : "comm");
    struct reshard_comm *c = (struct reshard_comm *)comm; /* held, not changed */
    reshard_status_t st = api_comm_hold(__func__, c);
    if (st != RESHARD_OK)
        return api_leave(__func__, st);
    const struct tp_counters *n = &comm->net->counters;
    uint64_t boot_out = 0, boot_in = 0;
    boot_bytes(comm->boot, &boot_out, &boot_in);
    *counters = (reshard_comm_counters_t){.net_out = n->bytes_out,
                                          .net_in = n->bytes_in,
                                          .local_out = comm->local_out,
                                          .local_in = comm->local_in,
                                          .self = comm->self,
                                          .ctrl_msgs = n->ctrl_out,
                                          .net_msgs = n->msgs_out,
                                          .ipc_out = comm->ipc_out,
                                          .gdr_out = comm->gdr_out,
                                          .gdr_in = comm->gdr_in,
                                          .boot_out = boot_out,
                                          .boot_in = boot_in,
                                          .ctrl_bytes_out = comm->ctrl_bytes_out,
                                          .ctrl_bytes_in = comm->ctrl_bytes_in};
    return api_comm_drop(c, RESHARD_OK);
}

reshard_status_t reshard_comm_counters_all(reshard_comm_t *comm, reshard_comm_counters_t *all,
                                           int *node)
{
    api_enter();
    if (!comm || !all)
        return api_null_arg(__func__, comm ? "all" : "comm");
    reshard_status_t st = api_comm_hold(__func__, comm);
    if (st != RESHARD_OK)
        return api_leave(__func__, st);
    st = reshard_comm_counters(comm, &all[comm->rank]);
    if (st == RESHARD_OK && (st = comm_enter(comm)) == RESHARD_OK)
        st = comm_leave(comm, comm_allgather(comm, all, sizeof(*all)));
    if (st == RESHARD_OK && node)
        memcpy(node, comm->node, (size_t)comm->size * sizeof(int));
    return api_leave(__func__, api_comm_drop(comm, st));
}
