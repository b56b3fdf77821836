/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A brute-force oracle for small tensors, written independently of the planner: shards come
 * from simulating torch.chunk on explicit index lists, and plans are checked element by
 * element. Also the seeded random layout generator of the property suite.
 */
#ifndef RS_TEST_ORACLE_H
#define RS_TEST_ORACLE_H

#include "planner/plan.h"
#include "planner/stats.h"

#include <stdint.h>

/* Indices of tensor dim `dim` held by the rank at position pos, in local order; returns the
 * count (out must have room for shape[dim]). */
int64_t oracle_indices(const struct rs_layout *l, int pos, int dim, int64_t *out);

/* Per rank membership: holds[pos][element] for every element of a small tensor. */
struct oracle_side {
    int nranks;
    int64_t numel;
    unsigned char *holds; /* [nranks * numel] */
};

int oracle_side_build(const struct rs_layout *l, struct oracle_side *s);
void oracle_side_free(struct oracle_side *s);

/* The bounds docs/figures.md defines, by their definitions, element by element. */
struct oracle_bounds {
    int64_t min_net_bytes, gather_bcast_bytes, lb_nic_bytes;
};

int oracle_bounds(const struct rs_plan *p, struct oracle_bounds *b);

/* Replays the ops of a plan on per-rank element flags. Returns 0 when every element of a
 * present destination rank is written exactly once by an op whose sender holds (or, for FWD, has
 * received) it; else -1 with a message in msg. */
int oracle_check_plan(const struct rs_plan *p, char *msg, size_t n);

/* 1 when an element that a present destination rank needs is held by no present source rank
 * (the plan must fail with RESHARD_ERR_DATA_LOST), 0 when none is, -1 when too large. */
int oracle_data_lost(const struct rs_layout *src, const struct rs_layout *dst,
                     const struct rs_topo *topo);

/* ---- random layouts ---- */

struct rng {
    uint64_t s;
};

uint64_t rng_next(struct rng *r);
int rng_int(struct rng *r, int lo, int hi); /* inclusive */

/* A random layout pair and topology. The layouts own their rank lists. */
struct random_case {
    struct rs_layout src, dst;
    int world;
    int *domain_of; /* [world] */
    int64_t split_min_bytes;
};

void random_case_make(uint64_t seed, struct random_case *c);
void random_case_free(struct random_case *c);

#endif
