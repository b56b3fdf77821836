/* SPDX-License-Identifier: Apache-2.0 */
/*
 * FP8 destinations in plans (issue 22). A tensor whose destination layout is quantized
 * (quant=block(R,C), channel or tensor, an fp8 dtype) has a second tensor in the plan, its
 * scales: float32, one per block, shaped ceil(n_d / extent_d) along each dim, sharded the way
 * the weight is, block for block (the weight's destination shards must start and end on block
 * boundaries). Two modes:
 *   MOVE  the source is the same FP8 format with the same blocks: values and scales are two
 *         plain tensors, planned as any other;
 *   CAST  the source is bf16, f16 or f32: each cell of the weight is quantized on the source
 *         rank when that rank holds every block the cell touches whole (the op is flagged
 *         at_src, its bytes are FP8, and the scales of the blocks starting in the cell travel
 *         with it as ops of the scales tensor), else it travels in the source dtype and the
 *         destination ranks quantize their blocks once they have landed (no scale ops).
 * cuda/quant.h defines the arithmetic.
 */
#ifndef RS_QUANT_PLAN_H
#define RS_QUANT_PLAN_H

#include "grid.h"
#include "layout.h"

enum plan_quant_mode { PLAN_QUANT_NONE, PLAN_QUANT_MOVE, PLAN_QUANT_CAST };

/* Elements of dim d one scale covers (the whole dim when the scale does not divide it). */
int64_t quant_extent(const struct rs_layout *l, int d);
/* The scales' layout of weight side w: w's ranks, mesh and placements on the blocked shape
 * (replicated: on w's ranks as a 1-D replicated mesh, for a CAST source whose scales are
 * computed where the blocks are held). ranks are w's (not copied). */
void quant_scales_layout(const struct rs_layout *w, int replicated, struct rs_layout *out);
/* Each shard of map starts and ends on the boundaries of q's blocks (or the tensor's end)
 * along every dim: else RESHARD_ERR_SPEC_SYNTAX naming the tensor, the side, a rank and the
 * boundary. */
reshard_status_t quant_check_aligned(const struct rs_shardmap *map, const struct rs_layout *q,
                                     const char *name, const char *side);
/* The scales' shard map follows the weight's block for block. */
reshard_status_t quant_check_follow(const struct rs_shardmap *weight,
                                    const struct rs_shardmap *scales, const char *name);
/* Cuts the grid's intervals at dst's block boundaries where an interval straddles one (at most
 * three pieces each: the partial blocks at its ends and the whole ones between), so that a cell
 * is either whole blocks or part of one block, and quant_cell_at_src can judge its blocks. */
reshard_status_t quant_cut_grid(struct rs_grid *g, const struct rs_layout *dst);
/* Whether the source tuple of cell c holds, along every dim, every block (of the quantized
 * destination layout dst) the cell touches whole: the cell can be quantized where it is. */
int quant_cell_at_src(const struct rs_shardmap *src, const struct rs_layout *dst,
                      const struct rs_grid *g, const struct grid_cursor *c);
/* Whether the rank at position pos of src holds, whole, every block of dst's quant that the
 * element box [start, start + len) touches (blocks: start and len in blocks, when in_blocks). */
int quant_holds_blocks(const struct rs_shardmap *src, int pos, const struct rs_layout *dst,
                       const int64_t *start, const int64_t *len, int in_blocks);
/* The scales of the blocks that start inside [start, start + len) of weight l: 0 when none
 * does. */
int quant_scale_box(const struct rs_layout *l, const int64_t *start, const int64_t *len,
                    int64_t *sstart, int64_t *slen);

#endif
