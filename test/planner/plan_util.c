/* SPDX-License-Identifier: Apache-2.0 */
#include "plan_util.h"

#include "base/error.h"
#include "planner/spec.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

static reshard_status_t build(int n, const char *const *src, const char *const *dst, int world,
                              int domain_size, const int *domain_of, int64_t split_min,
                              struct rs_plan **out)
{
    struct rs_layout *l = calloc(2 * (size_t)n, sizeof(*l));
    struct plan_input *in = calloc((size_t)n, sizeof(*in));
    struct spec_opts o = {.world_size = world};
    for (int i = 0; i < n; i++) {
        cr_assert_eq(spec_parse(src[i], &o, &l[2 * i]), RESHARD_OK, "%s: %s", src[i],
                     rs_error_message());
        cr_assert_eq(spec_parse(dst[i], &o, &l[2 * i + 1]), RESHARD_OK, "%s: %s", dst[i],
                     rs_error_message());
        in[i] = (struct plan_input){NULL, &l[2 * i], &l[2 * i + 1], NULL};
    }
    struct rs_topo topo;
    cr_assert_eq(topo_create(world, domain_size, domain_of, &topo), RESHARD_OK);
    struct plan_opts opts = {.split_min_bytes = split_min};
    reshard_status_t st = plan_build(in, n, &topo, &opts, PLAN_ALL_RANKS, out);
    topo_free(&topo);
    for (int i = 0; i < 2 * n; i++)
        layout_free(&l[i]);
    free(l);
    free(in);
    return st;
}

reshard_status_t try_plan_specs(int n, const char *const *src, const char *const *dst, int world,
                                int domain_size, const int *domain_of, struct rs_plan **out)
{
    return build(n, src, dst, world, domain_size, domain_of, 0, out);
}

struct rs_plan *plan_specs(int n, const char *const *src, const char *const *dst, int world,
                           int domain_size, const int *domain_of, int64_t split_min)
{
    struct rs_plan *p = NULL;
    cr_assert_eq(build(n, src, dst, world, domain_size, domain_of, split_min, &p), RESHARD_OK, "%s",
                 rs_error_message());
    return p;
}

size_t count_ops(const struct rs_plan *p, enum plan_op_kind kind)
{
    size_t n = 0;
    for (size_t i = 0; i < p->nops; i++)
        n += p->ops[i].kind == kind;
    return n;
}

struct plan_stats stats_of(const struct rs_plan *p, struct plan_rank_stats *per_rank)
{
    struct plan_stats s;
    cr_assert_eq(plan_stats_compute(p, &s, per_rank), RESHARD_OK, "%s", rs_error_message());
    return s;
}

/* An op as both scopes can state it: kind, ranks, box, and for a forward the op that delivered
 * what it forwards, when that op belongs to the plan (the forwarder's). */
struct canon_op {
    int32_t tensor, kind, src, dst;
    int64_t box[2 * RS_MAX_DIMS];
    int32_t parent_src, parent_dst;
    int64_t parent_box[2 * RS_MAX_DIMS];
};

static int cmp_canon(const void *a, const void *b)
{
    return memcmp(a, b, sizeof(struct canon_op));
}

static void canon_box(const struct rs_plan *p, const struct plan_op *o, int64_t *out)
{
    int ndim = p->tensors[o->tensor].dst.ndim;
    memcpy(out, p->boxes.coords + o->box, 2 * (size_t)ndim * sizeof(int64_t));
}

/* The ops of p that involve rank r (every op of a plan of r alone), canonical and sorted. */
static struct canon_op *canon_ops(const struct rs_plan *p, int r, size_t *n)
{
    struct canon_op *v = calloc(p->nops + 1, sizeof(*v));
    cr_assert_not_null(v);
    size_t k = 0;
    for (size_t i = 0; i < p->nops; i++) {
        const struct plan_op *o = &p->ops[i];
        if (o->src != r && o->dst != r)
            continue;
        struct canon_op *c = &v[k++];
        c->tensor = (int32_t)o->tensor;
        c->kind = (int32_t)o->kind;
        c->src = o->src;
        c->dst = o->dst;
        canon_box(p, o, c->box);
        c->parent_src = c->parent_dst = -1;
        if (o->kind == PLAN_OP_FWD && o->src == r) {
            cr_assert_neq(o->parent, PLAN_NO_PARENT, "rank %d forwards without a parent", r);
            const struct plan_op *q = &p->ops[o->parent];
            c->parent_src = q->src;
            c->parent_dst = q->dst;
            canon_box(p, q, c->parent_box);
        }
    }
    qsort(v, k, sizeof(*v), cmp_canon);
    *n = k;
    return v;
}

void check_rank_scopes(const struct rs_plan *whole, const char *why)
{
    int nt = whole->ninputs;
    struct plan_input *in = calloc((size_t)nt, sizeof(*in));
    cr_assert_not_null(in);
    plan_inputs_of(whole, in);
    int64_t min_net = 0, lb = 0;
    for (int r = 0; r < whole->topo.nranks; r++) {
        struct rs_plan *mine = NULL;
        cr_assert_eq(plan_build(in, nt, &whole->topo, &whole->opts, r, &mine), RESHARD_OK,
                     "%s\nrank %d: %s", why, r, rs_error_message());
        cr_assert_eq(mine->hash, whole->hash, "%s\nrank %d: the hash depends on the scope", why, r);
        size_t na, nb;
        struct canon_op *a = canon_ops(whole, r, &na), *b = canon_ops(mine, r, &nb);
        cr_assert_eq(nb, mine->nops, "%s\nrank %d's plan holds an op of others", why, r);
        cr_assert_eq(na, nb, "%s\nrank %d: %zu ops in the whole plan, %zu in its own", why, r, na,
                     nb);
        for (size_t i = 0; i < na; i++)
            cr_assert(!memcmp(&a[i], &b[i], sizeof(a[i])),
                      "%s\nrank %d: op %zu differs (%s %d->%d in the whole plan, %s %d->%d in its "
                      "own)",
                      why, r, i, plan_op_kind_name((enum plan_op_kind)a[i].kind), a[i].src,
                      a[i].dst, plan_op_kind_name((enum plan_op_kind)b[i].kind), b[i].src,
                      b[i].dst);
        for (size_t i = 0; i < mine->nops; i++) /* a forward's parent is its own NET op */
            if (mine->ops[i].kind == PLAN_OP_FWD && mine->ops[i].src == r)
                cr_assert_eq(mine->ops[mine->ops[i].parent].dst, r, "%s\nrank %d", why, r);
        struct plan_rank_bounds rb;
        cr_assert_eq(plan_rank_bounds(mine, r, &rb), RESHARD_OK, "%s", rs_error_message());
        min_net += rb.in_domain;
        int64_t share = rb.dst_ranks ? (rb.in_domain + rb.dst_ranks - 1) / rb.dst_ranks : 0;
        lb = share > lb ? share : lb;
        lb = rb.forced > lb ? rb.forced : lb;
        free(a);
        free(b);
        plan_free(mine);
    }
    struct plan_stats s;
    cr_assert_eq(plan_stats_compute(whole, &s, NULL), RESHARD_OK);
    cr_assert_eq(min_net, s.min_net_bytes,
                 "%s\nthe ranks' shares of min_net_bytes sum to %lld, "
                 "not %lld",
                 why, (long long)min_net, (long long)s.min_net_bytes);
    cr_assert_eq(lb, s.lb_nic_bytes, "%s\nthe ranks' bounds give lb_nic_bytes %lld, not %lld", why,
                 (long long)lb, (long long)s.lb_nic_bytes);
    free(in);
}
