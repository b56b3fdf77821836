/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The plan object: checks the inputs, hashes them, runs the passes of every tensor at the
 * plan's scope (plan_cells.c, plan_net.c) and holds the ops, within RESHARD_PLAN_MAX_OPS.
 */
#include "plan.h"

#include "plan_build.h"
#include "spec.h"
#include "base/ckd.h"
#include "base/clock.h"
#include "base/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Changes whenever the rule that decides the ops does: ranks running different libraries then
 * disagree on the hash instead of on the ops. */
#define PLAN_RULE_VERSION 2

const char *plan_op_kind_name(enum plan_op_kind k)
{
    switch (k) {
    case PLAN_OP_SELF:
        return "self";
    case PLAN_OP_LOCAL:
        return "local";
    case PLAN_OP_NET:
        return "net";
    case PLAN_OP_FWD:
        return "fwd";
    }
    return "?";
}

/* One 64-bit word into a hash (multiply-xorshift, a word at a time). */
static uint64_t mix(uint64_t h, uint64_t v)
{
    h = (h ^ v) * UINT64_C(0x9e3779b97f4a7c15);
    return h ^ (h >> 29);
}

uint64_t plan_rule_mix(uint64_t salt, uint64_t a, uint64_t b)
{
    uint64_t h = mix(mix(mix(UINT64_C(0x72756c65), salt), a), b);
    h ^= h >> 31;
    h *= UINT64_C(0xbf58476d1ce4e5b9);
    return h ^ (h >> 27);
}

int plan_keeps(const struct build *b, enum plan_op_kind kind, int src, int dst)
{
    switch (b->keep) {
    case KEEP_ALL:
        return 1;
    case KEEP_INTO:
        return dst == b->me || (kind == PLAN_OP_FWD && src == b->me);
    case KEEP_OUT_OF:
        return src == b->me && dst != b->me && kind != PLAN_OP_FWD;
    }
    return 0;
}

reshard_status_t plan_emit(struct build *b, enum plan_op_kind kind, int src, int dst, uint32_t box,
                           uint32_t parent, int *kept)
{
    return plan_emit_for(b, b->tensor, b->at_src, kind, src, dst, box, parent, kept);
}

reshard_status_t plan_emit_for(struct build *b, uint32_t tensor, int at_src, enum plan_op_kind kind,
                               int src, int dst, uint32_t box, uint32_t parent, int *kept)
{
    struct rs_plan *p = b->plan;
    if (kept)
        *kept = 0;
    if (!plan_keeps(b, kind, src, dst))
        return RESHARD_OK;
    if ((int64_t)p->nops >= p->opts.max_ops)
        return rs_error(RESHARD_ERR_TOO_LARGE,
                        "plan: more than %lld transfers%s (RESHARD_PLAN_MAX_OPS, at tensor '%s'): "
                        "coarsen the layouts or raise the limit",
                        (long long)p->opts.max_ops,
                        p->scope == PLAN_ALL_RANKS ? "" : " on this rank", b->pt->name);
    if (p->nops == p->ops_cap) {
        struct plan_op *o = rs_grow(p->ops, &p->ops_cap, p->nops + 1, sizeof(*o), "plan ops");
        if (!o)
            return RESHARD_ERR_NO_MEMORY;
        p->ops = o;
    }
    p->ops[p->nops++] = (struct plan_op){.box = box,
                                         .tensor = tensor,
                                         .at_src = (uint32_t)at_src,
                                         .parent = parent,
                                         .src = src,
                                         .dst = dst,
                                         .kind = (uint8_t)kind};
    if (kept)
        *kept = 1;
    return RESHARD_OK;
}

reshard_status_t plan_cell_box(struct build *b, struct plan_cell *cell)
{
    if (cell->box == PLAN_NO_BOX)
        return boxes_push(&b->plan->boxes, b->ndim, cell->start, cell->len, &cell->box);
    return RESHARD_OK;
}

static void format_shape(char *buf, size_t n, const struct rs_layout *l)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int d = 0; d < l->ndim && used < n; d++)
        used +=
            (size_t)snprintf(buf + used, n - used, "%s%lld", d ? "x" : "", (long long)l->shape[d]);
}

static int same_quant(const struct rs_quant *a, const struct rs_quant *b)
{
    return a->kind == b->kind && a->rows == b->rows && a->cols == b->cols;
}

/* Equal dtypes, or a quantized destination: of the same FP8 format and blocks (MOVE), or of a
 * bf16, f16 or f32 source (CAST). Sets t->quant. */
static reshard_status_t check_dtypes(struct plan_tensor *t)
{
    const struct rs_layout *s = &t->src, *d = &t->dst;
    t->quant = PLAN_QUANT_NONE;
    if (d->quant.kind != RS_QUANT_NONE) {
        if (s->dtype == d->dtype && same_quant(&s->quant, &d->quant)) {
            t->quant = PLAN_QUANT_MOVE;
            return RESHARD_OK;
        }
        if (s->quant.kind == RS_QUANT_NONE &&
            (s->dtype == RS_DTYPE_BF16 || s->dtype == RS_DTYPE_F16 || s->dtype == RS_DTYPE_F32)) {
            t->quant = PLAN_QUANT_CAST;
            return RESHARD_OK;
        }
        return rs_error(RESHARD_ERR_MISMATCH,
                        "tensor '%s': a quantized %s destination takes a bf16, f16 or f32 source, "
                        "or %s with the same quant, not %s%s",
                        t->name, dtype_name(d->dtype), dtype_name(d->dtype), dtype_name(s->dtype),
                        s->quant.kind != RS_QUANT_NONE ? " with other blocks" : "");
    }
    if (s->quant.kind != RS_QUANT_NONE)
        return rs_error(RESHARD_ERR_MISMATCH,
                        "tensor '%s': a quantized source needs a destination quantized alike "
                        "(its scales have nowhere to go)",
                        t->name);
    if (s->dtype != d->dtype)
        return rs_error(RESHARD_ERR_MISMATCH,
                        "tensor '%s': source dtype %s differs from destination dtype %s", t->name,
                        dtype_name(s->dtype), dtype_name(d->dtype));
    return RESHARD_OK;
}

static reshard_status_t check_pair(struct plan_tensor *t, const struct rs_topo *topo)
{
    const struct rs_layout *s = &t->src, *d = &t->dst;
    int same = s->ndim == d->ndim;
    for (int j = 0; same && j < s->ndim; j++)
        same = s->shape[j] == d->shape[j];
    if (!same) {
        char a[160], b[160];
        format_shape(a, sizeof(a), s);
        format_shape(b, sizeof(b), d);
        return rs_error(RESHARD_ERR_MISMATCH,
                        "tensor '%s': source shape %s differs from destination shape %s", t->name,
                        a, b);
    }
    RS_CHECK(check_dtypes(t));
    for (int side = 0; side < 2; side++) {
        const struct rs_layout *l = side ? d : s;
        const struct rs_shardmap *m = side ? &t->dst_map : &t->src_map;
        int highest = l->ranks[m->by_rank[l->nranks - 1]];
        if (highest >= topo->nranks)
            return rs_error(RESHARD_ERR_RANK_RANGE,
                            "tensor '%s': %s rank %d is outside the communicator of %d ranks",
                            t->name, side ? "destination" : "source", highest, topo->nranks);
    }
    return RESHARD_OK;
}

static reshard_status_t set_sides(struct rs_plan *p, struct plan_tensor *t,
                                  const struct rs_layout *src, const struct rs_layout *dst)
{
    RS_CHECK(plan_cache_side(p, src, t->name, "source", &t->src_side));
    RS_CHECK(plan_cache_side(p, dst, t->name, "destination", &t->dst_side));
    t->src = t->src_side->layout;
    t->dst = t->dst_side->layout;
    t->src_map = t->src_side->map;
    t->dst_map = t->dst_side->map;
    return RESHARD_OK;
}

static reshard_status_t add_tensor(struct rs_plan *p, int i, const struct plan_input *in)
{
    struct plan_tensor *t = &p->tensors[i];
    char fallback[32];
    snprintf(fallback, sizeof(fallback), "t%d", i);
    const char *name = in->name ? in->name : fallback;
    t->name = rs_calloc(strlen(name) + 1, 1, "tensor name");
    if (!t->name)
        return RESHARD_ERR_NO_MEMORY;
    memcpy(t->name, name, strlen(name) + 1);
    if (!in->src || !in->dst)
        return rs_error(RESHARD_ERR_INVALID_ARG, "tensor '%s': missing %s layout", t->name,
                        in->src ? "destination" : "source");
    t->scales = t->scales_of = -1;
    RS_CHECK(set_sides(p, t, in->src, in->dst));
    return check_pair(t, &p->topo);
}

/* The scales tensor of quantized weight w, at index i. */
static reshard_status_t add_scales(struct rs_plan *p, int w, int i, const char *given)
{
    struct plan_tensor *pw = &p->tensors[w], *t = &p->tensors[i];
    const char *name = pw->name, *suffix = ".weight";
    size_t n = strlen(name), sn = strlen(suffix);
    int weight = n >= sn && !strcmp(name + n - sn, suffix);
    size_t need = given ? strlen(given) + 1 : n + strlen(weight ? "_scale_inv" : ".scale") + 1;
    if (!(t->name = rs_calloc(need, 1, "tensor name")))
        return RESHARD_ERR_NO_MEMORY;
    snprintf(t->name, need, "%s%s", given ? given : name,
             given    ? ""
             : weight ? "_scale_inv"
                      : ".scale");
    t->scales = -1;
    t->scales_of = w;
    pw->scales = i;
    RS_CHECK(quant_check_aligned(&pw->dst_map, &pw->dst, pw->name, "destination"));
    if (pw->quant == PLAN_QUANT_MOVE)
        RS_CHECK(quant_check_aligned(&pw->src_map, &pw->src, pw->name, "source"));
    /* A CAST source has no blocks of its own: its scales are those of the destination's. */
    struct rs_layout src, dst, wsrc = pw->src;
    wsrc.quant = pw->dst.quant;
    quant_scales_layout(&wsrc, pw->quant == PLAN_QUANT_CAST, &src);
    quant_scales_layout(&pw->dst, 0, &dst);
    RS_CHECK(set_sides(p, t, &src, &dst));
    RS_CHECK(quant_check_follow(&pw->dst_map, &t->dst_map, pw->name));
    if (pw->quant == PLAN_QUANT_MOVE)
        RS_CHECK(quant_check_follow(&pw->src_map, &t->src_map, pw->name));
    return RESHARD_OK;
}

reshard_status_t plan_tensor_grid(const struct plan_tensor *pt, struct rs_grid *g)
{
    RS_CHECK(grid_build(&pt->src_map, &pt->dst_map, g));
    reshard_status_t st = pt->quant == PLAN_QUANT_CAST ? quant_cut_grid(g, &pt->dst) : RESHARD_OK;
    if (st != RESHARD_OK)
        grid_free(g);
    return st;
}

reshard_status_t plan_tensor_tdoms(struct rs_plan *p, int t, const struct tuple_domains **src,
                                   const struct tuple_domains **dst)
{
    RS_CHECK(plan_side_tdoms(p, p->tensors[t].src_side, TOPO_SRC, src));
    return plan_side_tdoms(p, p->tensors[t].dst_side, TOPO_DST, dst);
}

/* What every rank must agree on: the tensors, the topology, the options and the rule. The ops
 * follow from them, so a rank's plan of its own ops has the same hash as the whole world's. */
static uint64_t inputs_hash(const struct rs_plan *p)
{
    uint64_t h = mix(UINT64_C(0x7265736861726421), PLAN_RULE_VERSION);
    h = mix(mix(h, (uint64_t)p->ntensors), (uint64_t)p->opts.split_min_bytes);
    for (int r = 0; r < p->topo.nranks; r++) {
        h = mix(h, (uint64_t)p->topo.domain[r] << 1 | (uint64_t)topo_absent(&p->topo, r));
        unsigned off = p->topo.absent ? p->topo.absent[r] & TOPO_BOTH : 0;
        if (off && off != TOPO_BOTH) /* one role only: hashes without such ranks unchanged */
            h = mix(h, UINT64_C(0x726f6c65) << 8 | off);
    }
    for (int t = 0; t < p->ntensors; t++) {
        const struct plan_tensor *pt = &p->tensors[t];
        size_t n = strlen(pt->name);
        for (size_t i = 0; i < n; i += 8) {
            uint64_t w = 0;
            memcpy(&w, pt->name + i, n - i < 8 ? n - i : 8);
            h = mix(h, w);
        }
        h = mix(h, n);
        h = mix(mix(h, plan_side_hash(pt->src_side)), plan_side_hash(pt->dst_side));
    }
    return h;
}

/* Tensor t needs a piece that only the (absent) ranks of source tuple `tuple` held: named in
 * the error, the first one with its holders. */
static void note_lost(struct build *b, int tuple)
{
    const struct plan_tensor *pt = b->pt;
    size_t n = strlen(b->lost);
    if (b->nlost++ == 0) {
        const struct rs_shardmap *m = &pt->src_map;
        int many = m->tuple_first[tuple + 1] - m->tuple_first[tuple] > 1;
        n += (size_t)snprintf(b->lost + n, sizeof(b->lost) - n, "'%s' (held by rank%s", pt->name,
                              many ? "s" : "");
        for (int i = m->tuple_first[tuple]; i < m->tuple_first[tuple + 1] && n < sizeof(b->lost);
             i++)
            n += (size_t)snprintf(b->lost + n, sizeof(b->lost) - n, "%s %d",
                                  i > m->tuple_first[tuple] ? "," : "",
                                  pt->src.ranks[m->tuple_pos[i]]);
        if (n < sizeof(b->lost))
            snprintf(b->lost + n, sizeof(b->lost) - n, " only)");
    } else if (n < sizeof(b->lost)) {
        snprintf(b->lost + n, sizeof(b->lost) - n, ", '%s'", pt->name);
    }
}

/* The world's plan of tensor t would pass the op limit: refused before building it. */
static reshard_status_t check_op_bound(struct build *b)
{
    struct rs_plan *p = b->plan;
    struct overlap o = {.grid = b->grid, .src_td = *b->src_td, .dst_td = *b->dst_td};
    int64_t least = overlap_pairs(&o, &b->pt->dst_map), left = p->opts.max_ops - (int64_t)p->nops;
    if (least > left)
        return rs_error(
            RESHARD_ERR_TOO_LARGE,
            "plan: tensor '%s' needs at least %lld transfers, more than the %lld left of "
            "RESHARD_PLAN_MAX_OPS; coarsen the layouts or raise the limit",
            b->pt->name, (long long)least, (long long)left);
    return RESHARD_OK;
}

/* Plans tensor t at the plan's scope. A rank that neither holds nor needs any of it skips it
 * before building anything. */
static reshard_status_t plan_tensor(struct build *b, uint32_t t)
{
    struct rs_plan *p = b->plan;
    const struct plan_tensor *pt = &p->tensors[t];
    if (pt->scales_of >= 0 && p->tensors[pt->scales_of].quant == PLAN_QUANT_CAST)
        return RESHARD_OK; /* computed where its weight is quantized: planned with the weight */
    int src_pos = -1, dst_pos = -1;
    if (p->scope != PLAN_ALL_RANKS) {
        if (!topo_off(&p->topo, p->scope, TOPO_SRC))
            src_pos = shardmap_position(&pt->src_map, p->scope);
        if (!topo_off(&p->topo, p->scope, TOPO_DST))
            dst_pos = shardmap_position(&pt->dst_map, p->scope);
        if (src_pos < 0 && dst_pos < 0)
            return RESHARD_OK;
    }
    b->tensor = t;
    b->pt = pt;
    b->ndim = pt->dst.ndim;
    b->esize = (int64_t)dtype_size(pt->dst.dtype);
    b->salt = plan_rule_mix((uint64_t)t, 0, 0);
    b->at_src = 0;
    RS_CHECK(plan_tensor_tdoms(p, (int)t, &b->src_td, &b->dst_td));
    RS_CHECK(plan_tensor_grid(pt, &b->grid));
    int lost = -1;
    reshard_status_t st;
    if (p->scope == PLAN_ALL_RANKS) {
        b->keep = KEEP_ALL;
        RS_CHECK_GOTO(check_op_bound(b), st, out_free_grid);
        RS_CHECK_GOTO(plan_cells_all(b, &lost), st, out_free_grid);
    } else {
        b->me = p->scope;
        if (dst_pos >= 0) {
            b->keep = KEEP_INTO;
            RS_CHECK_GOTO(plan_cells_into(b, pt->dst_map.tuple[dst_pos], &lost), st, out_free_grid);
        }
        if (src_pos >= 0) {
            b->keep = KEEP_OUT_OF;
            RS_CHECK_GOTO(plan_cells_out_of(b, pt->src_map.tuple[src_pos]), st, out_free_grid);
        }
    }
    if (lost >= 0)
        note_lost(b, lost);
    st = RESHARD_OK;
out_free_grid:
    grid_free(&b->grid);
    return st;
}

static reshard_status_t plan_tensors(struct rs_plan *p)
{
    struct build b = {.plan = p};
    for (int t = 0; t < p->ntensors; t++)
        RS_CHECK(plan_tensor(&b, (uint32_t)t));
    if (b.nlost)
        return rs_error(RESHARD_ERR_DATA_LOST,
                        "plan: %d tensor%s cannot be refit: a piece that a destination needs was "
                        "held only by ranks that left, and no replica remains: %s",
                        b.nlost, b.nlost == 1 ? "" : "s", b.lost);
    return RESHARD_OK;
}

/* Counters hold sums over every destination copy of every tensor: keep them below 2^62. */
static reshard_status_t check_volume(const struct rs_plan *p)
{
    int64_t total = 0;
    for (int t = 0; t < p->ntensors; t++) {
        const struct rs_layout *l = &p->tensors[t].dst;
        int64_t bytes = layout_numel(l) * (int64_t)dtype_size(l->dtype), copies;
        if (rs_mul_i64(bytes, (int64_t)l->nranks + 1, &copies) ||
            rs_add_i64(total, copies, &total) || total > RS_MAX_BYTES)
            return rs_error(RESHARD_ERR_TOO_LARGE,
                            "plan: the tensors times their destination copies exceed 2^62 bytes "
                            "(at tensor '%s')",
                            p->tensors[t].name);
    }
    return RESHARD_OK;
}

static reshard_status_t plan_init(struct rs_plan *p, const struct plan_input *in, int ntensors,
                                  const struct rs_topo *topo, const struct plan_opts *opts)
{
    p->opts = (struct plan_opts){PLAN_SPLIT_MIN_DEFAULT, PLAN_MAX_OPS_DEFAULT};
    if (opts && opts->split_min_bytes > 0)
        p->opts.split_min_bytes = opts->split_min_bytes;
    if (opts && opts->max_ops > 0)
        p->opts.max_ops = opts->max_ops;
    RS_CHECK(topo_copy(topo, &p->topo));
    int nq = 0; /* scales tensors */
    for (int t = 0; t < ntensors; t++)
        nq += in[t].dst && in[t].dst->quant.kind != RS_QUANT_NONE;
    if (ntensors + nq > PLAN_MAX_TENSORS)
        return rs_error(RESHARD_ERR_TOO_LARGE,
                        "plan: %d tensors and %d scales, more than the %d one plan holds", ntensors,
                        nq, PLAN_MAX_TENSORS);
    p->tensors = rs_calloc((size_t)(ntensors + nq), sizeof(*p->tensors), "plan tensors");
    if (!p->tensors)
        return RESHARD_ERR_NO_MEMORY;
    p->ninputs = ntensors;
    for (int t = 0; t < ntensors; t++) {
        p->ntensors = t + 1; /* what plan_free frees */
        RS_CHECK(add_tensor(p, t, &in[t]));
    }
    for (int t = 0; t < ntensors; t++)
        if (p->tensors[t].quant != PLAN_QUANT_NONE) {
            p->ntensors++;
            RS_CHECK(add_scales(p, t, p->ntensors - 1, in[t].scales_name));
        }
    RS_CHECK(check_volume(p));
    p->hash = inputs_hash(p);
    return RESHARD_OK;
}

reshard_status_t plan_build(const struct plan_input *in, int ntensors, const struct rs_topo *topo,
                            const struct plan_opts *opts, int scope, struct rs_plan **out)
{
    if (!in || ntensors < 1 || !topo || !out)
        return rs_error(RESHARD_ERR_INVALID_ARG, "plan: needs at least one tensor and a topology");
    if (ntensors > PLAN_MAX_TENSORS)
        return rs_error(RESHARD_ERR_TOO_LARGE, "plan: %d tensors, more than the %d one plan holds",
                        ntensors, PLAN_MAX_TENSORS);
    if (scope != PLAN_ALL_RANKS && (scope < 0 || scope >= topo->nranks))
        return rs_error(RESHARD_ERR_RANK_RANGE, "plan: rank %d is outside the topology of %d ranks",
                        scope, topo->nranks);
    double t0 = rs_now_ms_f();
    struct rs_plan *p = rs_calloc(1, sizeof(*p), "plan");
    if (!p)
        return RESHARD_ERR_NO_MEMORY;
    p->scope = scope;
    reshard_status_t st;
    RS_CHECK_GOTO(plan_init(p, in, ntensors, topo, opts), st, err_free_plan);
    RS_CHECK_GOTO(plan_tensors(p), st, err_free_plan);
    p->plan_ms = rs_now_ms_f() - t0;
    *out = p;
    return RESHARD_OK;
err_free_plan:
    plan_free(p);
    return st;
}

void plan_inputs_of(const struct rs_plan *p, struct plan_input *in)
{
    for (int t = 0; t < p->ninputs; t++) {
        const struct plan_tensor *pt = &p->tensors[t];
        in[t] = (struct plan_input){pt->name, &pt->src, &pt->dst,
                                    pt->scales >= 0 ? p->tensors[pt->scales].name : NULL};
    }
}

void plan_free(struct rs_plan *p)
{
    if (!p)
        return;
    for (int t = 0; p->tensors && t < p->ntensors; t++)
        free(p->tensors[t].name);
    free(p->tensors);
    plan_cache_free(p->cache);
    topo_free(&p->topo);
    free(p->ops);
    boxes_free(&p->boxes);
    free(p);
}
