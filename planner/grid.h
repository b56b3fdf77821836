/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The overlap grid of one tensor. For every tensor dim, one sorted sweep over the source and
 * destination segments cuts [0, n) into elementary intervals, each inside exactly one source
 * group and one destination group. A grid cell (one interval per dim) therefore lies inside one
 * source tuple and one destination tuple: it is a box that the same ranks hold before and need
 * after. The cells are exactly the non-empty overlaps, found in O(segments + overlaps) with no
 * pass over pairs of ranks.
 */
#ifndef RS_GRID_H
#define RS_GRID_H

#include "layout.h"
#include "topo.h"

#include <stdint.h>

#define RS_MAX_CELLS (INT64_C(1) << 32) /* per tensor */

struct grid_iv {
    int64_t start, len;
    int sg, dg; /* source and destination group along this dim */
};

struct rs_grid {
    int ndim;
    int n[RS_MAX_DIMS]; /* intervals per dim */
    struct grid_iv *iv[RS_MAX_DIMS];
    int64_t ncells;
    /* tuple = sum over dims of group * stride (mixed radix, dim 0 most significant) */
    int src_stride[RS_MAX_DIMS], dst_stride[RS_MAX_DIMS];
};

reshard_status_t grid_build(const struct rs_shardmap *src, const struct rs_shardmap *dst,
                            struct rs_grid *g);
void grid_free(struct rs_grid *g);

/* Visits every cell in row-major order of interval indices; idx holds the current cell. */
struct grid_cursor {
    int idx[RS_MAX_DIMS];
    int64_t cell; /* linear index */
    int src_tuple, dst_tuple;
    int64_t volume; /* elements */
};
void grid_first(const struct rs_grid *g, struct grid_cursor *c);
int grid_next(const struct rs_grid *g, struct grid_cursor *c); /* 0 when past the last cell */
void grid_cell_box(const struct rs_grid *g, const struct grid_cursor *c, int64_t *start,
                   int64_t *len);

/* The cells of one tuple of one side: per dim, the intervals inside that tuple's group. A
 * rank's own cells, visited without walking the whole grid. */
struct grid_sub {
    int ndim;
    int n[RS_MAX_DIMS];
    int *iv[RS_MAX_DIMS]; /* interval indices, ascending */
    int64_t ncells;
};
enum grid_side { GRID_SRC, GRID_DST };
reshard_status_t grid_sub_build(const struct rs_grid *g, const struct rs_shardmap *map,
                                enum grid_side side, int tuple, struct grid_sub *s);
void grid_sub_free(struct grid_sub *s);
/* k in [0, s->ncells): the k-th cell of the sub-grid, in row-major order of the grid. */
void grid_sub_cell(const struct rs_grid *g, const struct grid_sub *s, int64_t k,
                   struct grid_cursor *c);

/* The present ranks of each tuple grouped by domain: run r of tuple t covers
 * rank[begin .. end). Present: playing the side's role (TOPO_SRC for a source map, TOPO_DST for
 * a destination map). A tuple whose ranks are all absent in that role has no runs. */
struct tdom_run {
    int domain, begin, end;
};

struct tuple_domains {
    int ntuples;
    int *rank;      /* [nranks]: by tuple, then domain, then rank */
    int *run_first; /* [ntuples + 1] into runs */
    struct tdom_run *runs;
    /* The same ranks by tuple, then rail (local index), then rank: rail run r of tuple t
     * covers rail_rank[rail_runs[r].begin .. end), its domain field holding the rail. */
    int *rail_rank;
    int *rail_first; /* [ntuples + 1] into rail_runs */
    struct tdom_run *rail_runs;
};

reshard_status_t tdom_build(const struct rs_shardmap *map, const struct rs_topo *topo,
                            unsigned role, struct tuple_domains *td);
void tdom_free(struct tuple_domains *td);
/* Index of tuple t's run in domain d, or -1 when no rank of t lives in d. */
int tdom_find(const struct tuple_domains *td, int t, int d);
/* The present ranks of tuple t (*n of them), by domain then rank. */
const int *tdom_ranks(const struct tuple_domains *td, int t, int *n);
/* The present ranks of tuple t on rail `rail` (*n of them, by rank); NULL with *n = 0 when
 * none is. */
const int *tdom_rail(const struct tuple_domains *td, int t, int rail, int *n);

/* Everything the planner and the bounds need about one tensor on a topology. */
struct overlap {
    struct rs_grid grid;
    struct tuple_domains src_td, dst_td;
};

reshard_status_t overlap_build(const struct rs_shardmap *src, const struct rs_shardmap *dst,
                               const struct rs_topo *topo, struct overlap *o);
void overlap_free(struct overlap *o);
/* The (cell, destination domain needing it) pairs: a lower bound on the ops of a plan.
 * Counted per destination tuple, without visiting the cells; saturates at INT64_MAX. */
int64_t overlap_pairs(const struct overlap *o, const struct rs_shardmap *dst);

#endif
