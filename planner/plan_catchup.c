/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Catch-up plans: ranks that joined a communicator (joiners) hold no version of any weight; the
 * other destination ranks hold the current one since the last refit. A catch-up plan writes the
 * joiners' destination shards and nothing else:
 *   - a tensor whose every joiner has a replica of its shard on a present rank that is no
 *     joiner takes its sources from those replicas: its source layout is its destination
 *     layout, and the trainers (the refit's sources) take no part in it;
 *   - any other tensor (a joiner's shard that no replica holds) takes them from the refit's
 *     sources, as the refit does.
 * Roles do the rest (topo_set_off): the joiners are off as sources (they hold nothing) and every
 * other rank is off as a destination (it holds its shard already), so the one planning rule
 * serves each joiner from a holder in its own domain first, else over the network once per
 * domain, the layout minimum.
 */
#include "plan.h"

#include "base/error.h"

#include <stdlib.h>

/* Whether each joiner's shard of layout map has a replica on a present rank that is no joiner
 * (or is empty, and needs none). */
static int replicas_hold(const struct rs_shardmap *map, const struct rs_topo *topo,
                         const unsigned char *joins)
{
    const struct rs_layout *l = map->layout;
    for (int pos = 0; pos < l->nranks; pos++) {
        if (!joins[l->ranks[pos]] || !shardmap_local_numel(map, pos))
            continue;
        int t = map->tuple[pos], held = 0;
        for (int i = map->tuple_first[t]; i < map->tuple_first[t + 1] && !held; i++) {
            int r = l->ranks[map->tuple_pos[i]];
            held = !joins[r] && !topo_absent(topo, r);
        }
        if (!held)
            return 0;
    }
    return 1;
}

static reshard_status_t catch_up_topo(const struct rs_topo *from, const unsigned char *joins,
                                      struct rs_topo *to)
{
    RS_CHECK(topo_copy(from, to));
    reshard_status_t st = RESHARD_OK;
    for (int r = 0; r < to->nranks && st == RESHARD_OK; r++)
        st = topo_set_off(to, &r, 1, joins[r] ? TOPO_SRC : TOPO_DST);
    if (st != RESHARD_OK)
        topo_free(to);
    return st;
}

static reshard_status_t check_joiners(const struct rs_topo *topo, const int *joiners, int n,
                                      unsigned char *joins)
{
    if (n < 1 || !joiners)
        return rs_error(RESHARD_ERR_INVALID_ARG, "catch-up: no joiners given (%d)", n);
    for (int i = 0; i < n; i++) {
        int r = joiners[i];
        if (r < 0 || r >= topo->nranks)
            return rs_error(RESHARD_ERR_RANK_RANGE, "catch-up: joiner %d is outside 0..%d", r,
                            topo->nranks - 1);
        if (topo_absent(topo, r))
            return rs_error(RESHARD_ERR_INVALID_ARG,
                            "catch-up: joiner %d is absent from the communicator", r);
        if (joins[r])
            return rs_error(RESHARD_ERR_INVALID_ARG, "catch-up: joiner %d is listed twice", r);
        joins[r] = 1;
    }
    return RESHARD_OK;
}

reshard_status_t plan_catch_up(const struct rs_plan *refit, const int *joiners, int n, int scope,
                               struct rs_plan **out, unsigned char **from_dst)
{
    int nin = refit->ninputs;
    unsigned char *joins = rs_calloc((size_t)refit->topo.nranks, 1, "catch-up joiners");
    unsigned char *fd = rs_calloc((size_t)refit->ntensors, 1, "catch-up sources");
    struct plan_input *in = rs_calloc((size_t)nin, sizeof(*in), "catch-up inputs");
    struct rs_topo topo = {0};
    reshard_status_t st = RESHARD_ERR_NO_MEMORY;
    if (!joins || !fd || !in)
        goto out_free;
    RS_CHECK_GOTO(check_joiners(&refit->topo, joiners, n, joins), st, out_free);
    RS_CHECK_GOTO(catch_up_topo(&refit->topo, joins, &topo), st, out_free);
    plan_inputs_of(refit, in);
    for (int t = 0; t < nin; t++) {
        const struct plan_tensor *pt = &refit->tensors[t];
        fd[t] = (unsigned char)replicas_hold(&pt->dst_map, &refit->topo, joins);
        if (fd[t])
            in[t].src = in[t].dst;
        if (pt->scales >= 0) /* a scales tensor comes from where its weight does */
            fd[pt->scales] = fd[t];
    }
    struct plan_opts opts = refit->opts;
    RS_CHECK_GOTO(plan_build(in, nin, &topo, &opts, scope, out), st, out_free_topo);
    *from_dst = fd;
    fd = NULL;
    st = RESHARD_OK;
out_free_topo:
    topo_free(&topo);
out_free:
    free(in);
    free(fd);
    free(joins);
    return st;
}
