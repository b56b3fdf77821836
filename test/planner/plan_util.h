/* SPDX-License-Identifier: Apache-2.0 */
/* Helpers for planner tests: plans from spec strings, op counting. */
#ifndef RS_TEST_PLAN_UTIL_H
#define RS_TEST_PLAN_UTIL_H

#include "planner/plan.h"
#include "planner/stats.h"

/* Plans tensors given as (src, dst) spec pairs; domain_of may be NULL (then domain_size). The
 * test fails on any error. */
struct rs_plan *plan_specs(int n, const char *const *src, const char *const *dst, int world,
                           int domain_size, const int *domain_of, int64_t split_min);

/* The same, returning the status instead of failing (for error tests). */
reshard_status_t try_plan_specs(int n, const char *const *src, const char *const *dst, int world,
                                int domain_size, const int *domain_of, struct rs_plan **out);

static inline struct rs_plan *plan_one(const char *src, const char *dst, int world, int domain_size)
{
    return plan_specs(1, &src, &dst, world, domain_size, NULL, 0);
}

size_t count_ops(const struct rs_plan *p, enum plan_op_kind kind);
/* Every rank's own plan (plan_build at its scope, from the same inputs) equals its slice of the
 * whole plan op for op, forwards' parents included, and has the same hash; and the ranks' parts
 * of the layout bounds (plan_rank_bounds) add up to the whole plan's. */
void check_rank_scopes(const struct rs_plan *whole, const char *why);

struct plan_stats stats_of(const struct rs_plan *p, struct plan_rank_stats *per_rank);

#endif
