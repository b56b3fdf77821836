/* SPDX-License-Identifier: Apache-2.0 */
#include "plan_util.h"

#include "base/error.h"
#include "planner/spec.h"

#include <criterion/criterion.h>
#include <stdlib.h>

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
        in[i] = (struct plan_input){NULL, &l[2 * i], &l[2 * i + 1]};
    }
    struct rs_topo topo;
    cr_assert_eq(topo_create(world, domain_size, domain_of, &topo), RESHARD_OK);
    struct plan_opts opts = {.split_min_bytes = split_min};
    reshard_status_t st = plan_build(in, n, &topo, &opts, out);
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
