/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Which cells of a tensor a pass visits, and what happens inside a domain.
 *
 * For every cell (a box held by one source tuple and needed by one destination tuple) and every
 * domain that needs it (a run of the destination tuple): a source rank in that domain serves it
 * over the local path (local first), else it crosses the network once (plan_net.c). The world's
 * plan visits every cell; a rank's plan visits the cells of its destination tuple (what it
 * receives and forwards) and of its source tuple (what it sends), so it never walks the world.
 *
 * Inside a domain each needer copies a cell from itself when it holds it already (SELF), else
 * from one of the domain's holders (LOCAL), taken in turn by the needer's place among the
 * domain's needers and the tensor's rotation: every rank of the domain can tell who serves whom.
 */
#include "plan_build.h"

#include "base/error.h"

static reshard_status_t serve_locally(struct build *b, struct plan_cell *cell,
                                      const struct tdom_run *need, const struct tdom_run *have)
{
    const struct rs_shardmap *src_map = &b->pt->src_map;
    int holders = have->end - have->begin;
    for (int i = need->begin; i < need->end; i++) {
        int n = b->dst_td->rank[i];
        int pos = shardmap_position(src_map, n);
        enum plan_op_kind kind = PLAN_OP_LOCAL;
        int from = n;
        if (pos < 0 || src_map->tuple[pos] != cell->c.src_tuple ||
            topo_off(&b->plan->topo, n, TOPO_SRC)) { /* it holds nothing to copy from */
            uint64_t turn = (uint64_t)(i - need->begin) + b->salt;
            from = b->src_td->rank[have->begin + (int)(turn % (uint64_t)holders)];
        } else {
            kind = PLAN_OP_SELF;
        }
        RS_CHECK(plan_emit_scales(b, cell, kind, from, n, PLAN_NO_PARENT, NULL));
        if (!plan_keeps(b, kind, from, n))
            continue;
        RS_CHECK(plan_cell_box(b, cell));
        RS_CHECK(plan_emit(b, kind, from, n, cell->box, PLAN_NO_PARENT, NULL));
    }
    return RESHARD_OK;
}

/* The cell is needed by destination run `run`: served inside its domain, over the network, or
 * lost when no present rank holds it. */
static reshard_status_t serve_run(struct build *b, struct plan_cell *cell, int run, int *lost)
{
    const struct tdom_run *need = &b->dst_td->runs[run];
    int t = cell->c.src_tuple;
    int h = tdom_find(b->src_td, t, need->domain);
    if (h >= 0)
        return serve_locally(b, cell, need, &b->src_td->runs[h]);
    if (b->src_td->run_first[t] == b->src_td->run_first[t + 1]) {
        *lost = t; /* its holders are all absent */
        return RESHARD_OK;
    }
    return plan_net_unit(b, cell, run);
}

static void cell_fill(struct build *b, const struct grid_cursor *c, struct plan_cell *cell)
{
    const struct plan_tensor *pt = b->pt;
    cell->c = *c;
    grid_cell_box(&b->grid, c, cell->start, cell->len);
    cell->box = cell->sbox = PLAN_NO_BOX;
    b->at_src =
        pt->quant == PLAN_QUANT_CAST && quant_cell_at_src(&pt->src_map, &pt->dst, &b->grid, c);
    cell->has_scales =
        b->at_src && quant_scale_box(&pt->dst, cell->start, cell->len, cell->sstart, cell->slen);
    cell->bytes = c->volume * b->esize;
}

reshard_status_t plan_emit_scales(struct build *b, struct plan_cell *cell, enum plan_op_kind kind,
                                  int src, int dst, uint32_t parent, int *kept)
{
    if (kept)
        *kept = 0;
    if (!cell->has_scales || !plan_keeps(b, kind, src, dst))
        return RESHARD_OK;
    if (cell->sbox == PLAN_NO_BOX)
        RS_CHECK(boxes_push(&b->plan->boxes, b->ndim, cell->sstart, cell->slen, &cell->sbox));
    return plan_emit_for(b, (uint32_t)b->pt->scales, 0, kind, src, dst, cell->sbox, parent, kept);
}

reshard_status_t plan_cells_all(struct build *b, int *lost)
{
    const struct tuple_domains *d = b->dst_td;
    struct grid_cursor c;
    grid_first(&b->grid, &c);
    do {
        struct plan_cell cell;
        cell_fill(b, &c, &cell);
        for (int r = d->run_first[c.dst_tuple]; r < d->run_first[c.dst_tuple + 1]; r++)
            RS_CHECK(serve_run(b, &cell, r, lost));
    } while (grid_next(&b->grid, &c));
    return RESHARD_OK;
}

reshard_status_t plan_cells_into(struct build *b, int dst_tuple, int *lost)
{
    int run = tdom_find(b->dst_td, dst_tuple, b->plan->topo.domain[b->me]);
    struct grid_sub sub;
    if (run < 0) /* the scope rank is present and in this tuple: its domain has a run */
        return rs_error(RESHARD_ERR_INVALID_PLAN, "plan: rank %d has no run in its domain", b->me);
    RS_CHECK(grid_sub_build(&b->grid, &b->pt->dst_map, GRID_DST, dst_tuple, &sub));
    reshard_status_t st = RESHARD_OK;
    for (int64_t k = 0; k < sub.ncells && st == RESHARD_OK; k++) {
        struct grid_cursor c;
        struct plan_cell cell;
        grid_sub_cell(&b->grid, &sub, k, &c);
        cell_fill(b, &c, &cell);
        st = serve_run(b, &cell, run, lost);
    }
    grid_sub_free(&sub);
    return st;
}

reshard_status_t plan_cells_out_of(struct build *b, int src_tuple)
{
    const struct tuple_domains *s = b->src_td, *d = b->dst_td;
    int mine = b->plan->topo.domain[b->me], lost = -1;
    struct grid_sub sub;
    RS_CHECK(grid_sub_build(&b->grid, &b->pt->src_map, GRID_SRC, src_tuple, &sub));
    reshard_status_t st = RESHARD_OK;
    for (int64_t k = 0; k < sub.ncells && st == RESHARD_OK; k++) {
        struct grid_cursor c;
        struct plan_cell cell;
        grid_sub_cell(&b->grid, &sub, k, &c);
        cell_fill(b, &c, &cell);
        for (int r = d->run_first[c.dst_tuple]; r < d->run_first[c.dst_tuple + 1]; r++) {
            int there = d->runs[r].domain;
            /* elsewhere, a holder there serves the domain: not this rank */
            if (there != mine && tdom_find(s, src_tuple, there) >= 0)
                continue;
            if ((st = serve_run(b, &cell, r, &lost)) != RESHARD_OK)
                break;
        }
    }
    grid_sub_free(&sub);
    return st;
}
