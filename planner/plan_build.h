/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the parts of the plan builder share; not used elsewhere.
 *   plan.c        the plan object: inputs, checks, the hash, the driver, ops and their limit
 *   plan_cache.c  layouts, shard maps and tuple domains, each stored once per distinct value
 *   plan_cells.c  which cells of a tensor a scope visits, and serving them inside a domain
 *   plan_net.c    the rule for cells that cross the network: slices, senders, forwards
 */
#ifndef RS_PLAN_BUILD_H
#define RS_PLAN_BUILD_H

#include "grid.h"
#include "plan.h"

/* A side of a tensor: one distinct layout with its map and, once asked for, tuple domains. */
struct plan_side {
    struct rs_layout layout; /* ranks: an interned list */
    uint64_t key;
    struct rs_shardmap map;
    /* The side whose rank arrays and tuple domains this one shares (same ranks, mesh and
     * sharded dims: they do not depend on the shape), or NULL when they are its own. */
    struct plan_side *like;
    /* As a source (td[0]) and as a destination (td[1]): a topology may take one role from a
     * rank and not the other, and one layout may be both sides of a tensor. */
    struct tuple_domains td[2];
    int has_td[2];
};

/* The side for layout l, from the cache or built there; blames `name` and `what` on error. */
reshard_status_t plan_cache_side(struct rs_plan *p, const struct rs_layout *l, const char *name,
                                 const char *what, struct plan_side **out);
/* Its tuple domains on the plan's topology in a role (TOPO_SRC or TOPO_DST), built on first
 * use. */
reshard_status_t plan_side_tdoms(struct rs_plan *p, struct plan_side *s, unsigned role,
                                 const struct tuple_domains **out);
/* A hash of a layout's canonical form, rank list included (hashed once per list). */
uint64_t plan_side_hash(const struct plan_side *s);
void plan_cache_free(struct plan_cache *c);

/* Which ops a pass keeps (a plan of one rank makes two passes over a tensor). */
enum plan_keep {
    KEEP_ALL,   /* every op: the whole world's plan */
    KEEP_INTO,  /* ops into the scope rank, and the forwards out of it */
    KEEP_OUT_OF /* the scope rank's sends of what it holds (LOCAL and NET) to others */
};

/* The tensor being planned. */
struct build {
    struct rs_plan *plan;
    enum plan_keep keep;
    int me;          /* the scope rank (KEEP_INTO, KEEP_OUT_OF) */
    uint32_t tensor; /* ... and the tensor */
    const struct plan_tensor *pt;
    int ndim;
    int64_t esize;
    uint64_t salt; /* the tensor's rotation, from its index */
    int at_src;    /* a CAST tensor: the current cell is quantized by its sender */
    struct rs_grid grid;
    const struct tuple_domains *src_td, *dst_td;
    /* Tensors with a piece that a destination needs and only absent ranks held: the plan
     * goes on to find them all, then fails naming them. */
    int nlost;
    char lost[256];
};

/* One cell of the tensor and the run (ranks of its destination tuple in one domain) that needs
 * it. */
struct plan_cell {
    struct grid_cursor c;
    int64_t start[RS_MAX_DIMS], len[RS_MAX_DIMS];
    uint32_t box; /* PLAN_NO_BOX until an op needs it */
    int64_t bytes;
    /* a CAST tensor's cell quantized at its source: the scales of the blocks starting in it,
     * their box (PLAN_NO_BOX until needed), and whether there are any */
    int has_scales;
    int64_t sstart[RS_MAX_DIMS], slen[RS_MAX_DIMS];
    uint32_t sbox;
};

/* Appends one op of the cell's scales (the weight's scales tensor), if the pass keeps it. */
reshard_status_t plan_emit_scales(struct build *b, struct plan_cell *cell, enum plan_op_kind kind,
                                  int src, int dst, uint32_t parent, int *kept);

#define PLAN_NO_BOX UINT32_MAX

/* Pushes the cell's box once, for every op that moves the whole cell. */
reshard_status_t plan_cell_box(struct build *b, struct plan_cell *cell);
/* Appends an op if the pass keeps it (kept: 1 when it did, when asked). */
reshard_status_t plan_emit(struct build *b, enum plan_op_kind kind, int src, int dst, uint32_t box,
                           uint32_t parent, int *kept);
/* The same for another tensor of the plan (a weight's scales), with its own at_src flag. */
reshard_status_t plan_emit_for(struct build *b, uint32_t tensor, int at_src, enum plan_op_kind kind,
                               int src, int dst, uint32_t box, uint32_t parent, int *kept);
/* Is the op kept by this pass? */
int plan_keeps(const struct build *b, enum plan_op_kind kind, int src, int dst);
/* The passes over a tensor's cells: every cell (KEEP_ALL); the cells of the scope rank's
 * destination tuple (KEEP_INTO); the cells of its source tuple (KEEP_OUT_OF). *lost becomes a
 * source tuple that a destination needs and no present rank holds. */
reshard_status_t plan_cells_all(struct build *b, int *lost);
reshard_status_t plan_cells_into(struct build *b, int dst_tuple, int *lost);
reshard_status_t plan_cells_out_of(struct build *b, int src_tuple);
/* The cell enters the domain of destination run `run` over the network (no source there). */
reshard_status_t plan_net_unit(struct build *b, struct plan_cell *cell, int run);
/* A small rotation from a tensor and two more words, the same on every rank. */
uint64_t plan_rule_mix(uint64_t salt, uint64_t a, uint64_t b);

#endif
