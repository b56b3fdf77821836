/* SPDX-License-Identifier: Apache-2.0 */
#include "stats.h"

#include "grid.h"
#include "base/error.h"

#include <stdlib.h>
#include <string.h>

static void op_stats(const struct rs_plan *p, struct plan_stats *s, struct plan_rank_stats *r)
{
    for (size_t i = 0; i < p->nops; i++) {
        const struct plan_op *op = &p->ops[i];
        int64_t bytes = plan_op_bytes(p, op);
        s->nops[op->kind]++;
        if (p->tensors[op->tensor].quant == PLAN_QUANT_CAST) {
            const struct plan_tensor *t = &p->tensors[op->tensor];
            int64_t q = (int64_t)dtype_size(t->dst.dtype);
            for (int d = 0; d < t->dst.ndim; d++)
                q *= plan_op_len(p, op)[d];
            s->quant_bytes += q;
            s->quant_at_src_bytes += op->at_src ? q : 0;
        }
        switch ((enum plan_op_kind)op->kind) {
        case PLAN_OP_SELF:
            s->self_bytes += bytes;
            r[op->dst].self += bytes;
            break;
        case PLAN_OP_NET:
            s->net_bytes += bytes;
            r[op->src].net_out += bytes;
            r[op->dst].net_in += bytes;
            if (p->tensors[op->tensor].quant == PLAN_QUANT_NONE) /* a delta refit's snapshot */
                r[op->src].snapshot += bytes;
            break;
        case PLAN_OP_LOCAL:
        case PLAN_OP_FWD:
            s->local_bytes += bytes;
            r[op->src].local_out += bytes;
            r[op->dst].local_in += bytes;
            break;
        }
    }
    s->max_nic_rank = -1;
    for (int k = 0; k < p->topo.nranks; k++) {
        int64_t nic = r[k].net_out > r[k].net_in ? r[k].net_out : r[k].net_in;
        if (nic > s->max_nic_bytes) {
            s->max_nic_bytes = nic;
            s->max_nic_rank = k;
        }
    }
}

/* Accumulators of the layout bounds over all tensors. */
struct bounds {
    int64_t *in;     /* [ndomains]: bytes that must enter each domain */
    int64_t *forced; /* [nranks]: bytes a sole holder must send to other domains */
    char *is_dst;    /* [nranks]: destination rank of some tensor */
    int *stamp;      /* [ndomains]: scratch for counting domains per tensor */
};

static int count_other_domains(const struct rs_topo *topo, const struct rs_layout *l, int except,
                               int *stamp, int mark)
{
    int n = 0;
    for (int i = 0; i < l->nranks; i++) {
        int d = topo->domain[l->ranks[i]];
        if (d != except && stamp[d] != mark) {
            stamp[d] = mark;
            n++;
        }
    }
    return n;
}

/* What a cell of tensor t costs crossing into one domain: its elements in the destination dtype,
 * or for a tensor quantized on the way, in FP8 plus its blocks' scales when its source holds the
 * blocks whole (the sender quantizes), else in the source dtype. */
int64_t plan_cell_bytes(const struct plan_tensor *pt, const struct rs_grid *g,
                        const struct grid_cursor *c)
{
    if (pt->quant != PLAN_QUANT_CAST)
        return c->volume * (int64_t)dtype_size(pt->dst.dtype);
    if (!quant_cell_at_src(&pt->src_map, &pt->dst, g, c))
        return c->volume * (int64_t)dtype_size(pt->src.dtype);
    int64_t start[RS_MAX_DIMS], len[RS_MAX_DIMS], ss[RS_MAX_DIMS], sl[RS_MAX_DIMS], scales = 0;
    grid_cell_box(g, c, start, len);
    if (quant_scale_box(&pt->dst, start, len, ss, sl)) {
        scales = (int64_t)dtype_size(RS_DTYPE_F32);
        for (int d = 0; d < pt->dst.ndim; d++)
            scales *= sl[d];
    }
    return c->volume * (int64_t)dtype_size(pt->dst.dtype) + scales;
}

/* A scales tensor that its weight's quantization computes: its bytes count with the weight's. */
static int computed_scales(const struct rs_plan *p, const struct plan_tensor *pt)
{
    return pt->scales_of >= 0 && p->tensors[pt->scales_of].quant == PLAN_QUANT_CAST;
}

static reshard_status_t tensor_bounds(const struct rs_plan *p, int t, struct bounds *bd,
                                      struct plan_stats *s)
{
    const struct plan_tensor *pt = &p->tensors[t];
    const struct rs_topo *topo = &p->topo;
    if (computed_scales(p, pt))
        return RESHARD_OK;
    /* the broadcast baseline moves what the source holds: for a quantized destination, the
     * unquantized values (the receivers quantize) */
    int64_t esize =
        (int64_t)dtype_size(pt->quant == PLAN_QUANT_CAST ? pt->src.dtype : pt->dst.dtype);
    struct overlap o;
    RS_CHECK(overlap_build(&pt->src_map, &pt->dst_map, topo, &o));
    if (pt->quant == PLAN_QUANT_CAST) {
        reshard_status_t cut = quant_cut_grid(&o.grid, &pt->dst);
        if (cut != RESHARD_OK) {
            overlap_free(&o);
            return cut;
        }
    }
    const struct rs_grid *g = &o.grid;
    const struct tuple_domains *src = &o.src_td, *dst = &o.dst_td;
    int root_domain = topo->domain[pt->src.ranks[0]];
    int64_t root_has = 0;
    struct grid_cursor c;
    grid_first(g, &c);
    do {
        int64_t bytes = plan_cell_bytes(pt, g, &c), vbytes = c.volume * esize;
        int rb = dst->run_first[c.dst_tuple], re = dst->run_first[c.dst_tuple + 1];
        int needed_elsewhere = 0;
        for (int r = rb; r < re; r++) {
            int d = dst->runs[r].domain;
            if (tdom_find(src, c.src_tuple, d) < 0) {
                s->min_net_bytes += bytes;
                bd->in[d] += bytes;
            }
        }
        int first = src->run_first[c.src_tuple], last = src->run_first[c.src_tuple + 1] - 1;
        int hb = first <= last ? src->runs[first].begin : 0; /* none: held by absent ranks */
        int he = first <= last ? src->runs[last].end : 0;
        if (he - hb == 1) { /* a sole holder must feed every other domain that needs it */
            int holder = src->rank[hb];
            for (int r = rb; r < re; r++)
                needed_elsewhere += dst->runs[r].domain != topo->domain[holder];
            bd->forced[holder] += bytes * needed_elsewhere;
        }
        if (tdom_find(src, c.src_tuple, root_domain) >= 0)
            root_has += vbytes;
    } while (grid_next(g, &c));

    int64_t total = layout_numel(&pt->dst) * esize;
    int other = count_other_domains(topo, &pt->dst, root_domain, bd->stamp, t + 1);
    s->gather_bcast_bytes += (total - root_has) + total * other;
    for (int i = 0; i < pt->dst.nranks; i++)
        bd->is_dst[pt->dst.ranks[i]] |= !topo_off(topo, pt->dst.ranks[i], TOPO_DST);
    overlap_free(&o);
    return RESHARD_OK;
}

static reshard_status_t layout_bounds(const struct rs_plan *p, struct plan_stats *s)
{
    const struct rs_topo *topo = &p->topo;
    struct bounds bd = {
        .in = rs_calloc((size_t)topo->ndomains, sizeof(int64_t), "plan bounds"),
        .forced = rs_calloc((size_t)topo->nranks, sizeof(int64_t), "plan bounds"),
        .is_dst = rs_calloc((size_t)topo->nranks, 1, "plan bounds"),
        .stamp = rs_calloc((size_t)topo->ndomains, sizeof(int), "plan bounds"),
    };
    reshard_status_t st = RESHARD_ERR_NO_MEMORY;
    if (!bd.in || !bd.forced || !bd.is_dst || !bd.stamp)
        goto free_bounds;
    for (int t = 0; t < p->ntensors; t++)
        RS_CHECK_GOTO(tensor_bounds(p, t, &bd, s), st, free_bounds);
    /* receivers of a domain: its destination ranks; senders: what only they hold */
    memset(bd.stamp, 0, (size_t)topo->ndomains * sizeof(int));
    for (int r = 0; r < topo->nranks; r++)
        bd.stamp[topo->domain[r]] += bd.is_dst[r];
    for (int d = 0; d < topo->ndomains; d++) {
        if (!bd.stamp[d])
            continue;
        int64_t share = (bd.in[d] + bd.stamp[d] - 1) / bd.stamp[d];
        if (share > s->lb_nic_bytes)
            s->lb_nic_bytes = share;
    }
    for (int r = 0; r < topo->nranks; r++)
        if (bd.forced[r] > s->lb_nic_bytes)
            s->lb_nic_bytes = bd.forced[r];
    st = RESHARD_OK;
free_bounds:
    free(bd.in);
    free(bd.forced);
    free(bd.is_dst);
    free(bd.stamp);
    return st;
}

reshard_status_t plan_stats_compute(const struct rs_plan *p, struct plan_stats *s,
                                    struct plan_rank_stats *per_rank)
{
    struct plan_rank_stats *r = rs_calloc((size_t)p->topo.nranks, sizeof(*r), "plan stats");
    if (!r)
        return RESHARD_ERR_NO_MEMORY;
    struct plan_stats out = {0};
    op_stats(p, &out, r);
    reshard_status_t st = layout_bounds(p, &out);
    if (st == RESHARD_OK) { /* outputs only on success */
        *s = out;
        if (per_rank)
            memcpy(per_rank, r, (size_t)p->topo.nranks * sizeof(*r));
    }
    free(r);
    return st;
}

/* Is the rank at this place the domain's lowest present rank? */
static int domain_leader(const struct rs_topo *t, int rank)
{
    for (int r = rank - 1; r >= 0; r--)
        if (t->domain[r] == t->domain[rank] && !topo_absent(t, r))
            return 0;
    return !topo_absent(t, rank);
}

/* Bytes of tensor t that must enter domain d: the cells of every destination tuple with ranks
 * in d that no source in d holds. */
static reshard_status_t tensor_in_domain(struct rs_plan *p, int t, int d, int64_t *in)
{
    const struct plan_tensor *pt = &p->tensors[t];
    if (computed_scales(p, pt))
        return RESHARD_OK;
    const struct tuple_domains *src, *dst;
    RS_CHECK(plan_tensor_tdoms(p, t, &src, &dst));
    struct rs_grid g;
    RS_CHECK(plan_tensor_grid(pt, &g));
    reshard_status_t st = RESHARD_OK;
    for (int u = 0; u < pt->dst_map.ntuples && st == RESHARD_OK; u++) {
        if (tdom_find(dst, u, d) < 0)
            continue;
        struct grid_sub sub;
        if ((st = grid_sub_build(&g, &pt->dst_map, GRID_DST, u, &sub)) != RESHARD_OK)
            break;
        for (int64_t k = 0; k < sub.ncells; k++) {
            struct grid_cursor c;
            grid_sub_cell(&g, &sub, k, &c);
            if (tdom_find(src, c.src_tuple, d) < 0)
                *in += plan_cell_bytes(pt, &g, &c);
        }
        grid_sub_free(&sub);
    }
    grid_free(&g);
    return st;
}

/* What rank holds alone of tensor t, times the other domains that need it. */
static reshard_status_t tensor_forced(struct rs_plan *p, int t, int rank, int64_t *forced)
{
    const struct plan_tensor *pt = &p->tensors[t];
    if (computed_scales(p, pt))
        return RESHARD_OK;
    int pos = shardmap_position(&pt->src_map, rank), n;
    if (pos < 0)
        return RESHARD_OK;
    const struct tuple_domains *src, *dst;
    RS_CHECK(plan_tensor_tdoms(p, t, &src, &dst));
    int tuple = pt->src_map.tuple[pos];
    tdom_ranks(src, tuple, &n);
    if (n != 1)
        return RESHARD_OK;
    struct rs_grid g;
    struct grid_sub sub;
    RS_CHECK(plan_tensor_grid(pt, &g));
    reshard_status_t st = grid_sub_build(&g, &pt->src_map, GRID_SRC, tuple, &sub);
    int mine = p->topo.domain[rank];
    for (int64_t k = 0; st == RESHARD_OK && k < sub.ncells; k++) {
        struct grid_cursor c;
        grid_sub_cell(&g, &sub, k, &c);
        int elsewhere = 0;
        for (int r = dst->run_first[c.dst_tuple]; r < dst->run_first[c.dst_tuple + 1]; r++)
            elsewhere += dst->runs[r].domain != mine;
        *forced += plan_cell_bytes(pt, &g, &c) * elsewhere;
    }
    grid_sub_free(&sub);
    grid_free(&g);
    return st;
}

reshard_status_t plan_rank_bounds(struct rs_plan *p, int rank, struct plan_rank_bounds *out)
{
    struct plan_rank_bounds b = {0};
    const struct rs_topo *topo = &p->topo;
    int leader = domain_leader(topo, rank), d = topo->domain[rank];
    for (int t = 0; t < p->ntensors; t++) {
        if (!topo_off(topo, rank, TOPO_SRC))
            RS_CHECK(tensor_forced(p, t, rank, &b.forced));
        if (leader)
            RS_CHECK(tensor_in_domain(p, t, d, &b.in_domain));
    }
    for (int r = 0; leader && r < topo->nranks; r++) { /* the domain's destination ranks */
        if (topo->domain[r] != d || topo_off(topo, r, TOPO_DST))
            continue;
        int is_dst = 0;
        for (int t = 0; t < p->ntensors && !is_dst; t++)
            is_dst = shardmap_position(&p->tensors[t].dst_map, r) >= 0;
        b.dst_ranks += is_dst;
    }
    *out = b;
    return RESHARD_OK;
}
