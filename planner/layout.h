/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A layout: a tensor (shape, dtype) and how one side of a reshard places it on ranks
 * (docs/layouts.md).
 *
 * The shard map derived from it is the planner's working form. Every mesh dim touches at most
 * one tensor dim, so a rank's shard is a product over tensor dims of 1-D index sets. For tensor
 * dim j the ranks fall into groups (one per combination of coordinates along the mesh dims that
 * shard j, in mesh order); the groups of a dim partition [0, shape[j]) and each group is an
 * ordered list of segments, in the order the elements sit in the rank's local shard. The
 * combination of a rank's groups over all dims is its tuple: ranks with the same tuple hold the
 * same elements (replicas).
 */
#ifndef RS_LAYOUT_H
#define RS_LAYOUT_H

#include "dtype.h"
#include "base/reshard_status.h"

#include <stdint.h>

#define RS_MAX_DIMS      8
#define RS_MAX_MESH_DIMS 4
#define RS_MAX_RANK      ((1 << 20) - 1) /* global ranks are 0 .. RS_MAX_RANK */
#define RS_NAME_MAX      64
#define RS_MAX_SEGMENTS  (1 << 22)          /* per tensor dim, over all groups */
#define RS_MAX_BYTES     (INT64_C(1) << 62) /* a tensor; and byte sums over a whole plan */

enum rs_place_kind { RS_PLACE_R, RS_PLACE_S, RS_PLACE_SS };

struct rs_place {
    enum rs_place_kind kind;
    int dim;   /* S, SS: the tensor dim */
    int64_t k; /* SS: the split factor, pieces cut as torch.chunk cuts them */
};

/* Where a rank's shard lives inside a named local buffer: element i of the shard (row-major
 * over its local shape) is element i of the view (row-major over view shape), stored at
 * buffer[offset + sum(index[d] * strides[d])]. */
struct rs_view {
    char buffer[RS_NAME_MAX]; /* "" = a buffer of the tensor's own */
    int64_t offset;
    int ndim; /* 0: the view shape is each rank's local shard shape */
    int64_t shape[RS_MAX_DIMS];
    int nstrides; /* 0: row-major over the view shape */
    int64_t strides[RS_MAX_DIMS];
};

/* How a quantized layout's FP8 values are scaled (cuda/quant.h defines the arithmetic): one
 * float32 scale per block of rows x cols over the last two dims, per row of dim 0 (channel), or
 * for the whole tensor. Its scales form a tensor of their own (layout_scales). */
enum rs_quant_kind { RS_QUANT_NONE, RS_QUANT_BLOCK, RS_QUANT_CHANNEL, RS_QUANT_TENSOR };

struct rs_quant {
    enum rs_quant_kind kind;
    int64_t rows, cols; /* RS_QUANT_BLOCK */
};

struct rs_layout {
    int ndim;
    int64_t shape[RS_MAX_DIMS];
    enum rs_dtype dtype;
    int nranks;
    int *ranks; /* owned; global ranks in mesh order (row-major) */
    int mesh_ndim;
    int mesh[RS_MAX_MESH_DIMS];
    struct rs_place place[RS_MAX_MESH_DIMS];
    struct rs_view view;
    struct rs_quant quant;
};

/* Which item of a layout a check rejected, so that a spec parser can point at its column. */
enum rs_item {
    RS_ITEM_NONE,
    RS_ITEM_SHAPE,
    RS_ITEM_DTYPE,
    RS_ITEM_RANKS,
    RS_ITEM_MESH,
    RS_ITEM_PLACE,
    RS_ITEM_BUFFER,
    RS_ITEM_OFFSET,
    RS_ITEM_VIEW,
    RS_ITEM_STRIDES,
    RS_ITEM_QUANT,
};

struct rs_fault {
    enum rs_item item;
    int index; /* which element of the item (placement, rank, dim); -1 for the whole item */
};

struct rs_seg {
    int64_t start; /* global index */
    int64_t len;
    int64_t pos; /* local index of start inside the group */
};

struct rs_dimmap {
    int ngroups;
    int nmesh;                       /* mesh dims that shard this dim, in mesh order */
    int mesh_dims[RS_MAX_MESH_DIMS]; /* ... which ones */
    int *first;                      /* [ngroups + 1]: group g owns segs[first[g] .. first[g+1]) */
    struct rs_seg *segs;
};

struct rs_shardmap {
    const struct rs_layout *layout;
    struct rs_dimmap dim[RS_MAX_DIMS];
    int ntuples;
    int *tuple;       /* [nranks]: tuple of the rank at each position of layout->ranks */
    int *tuple_first; /* [ntuples + 1] */
    int *tuple_pos;   /* positions grouped by tuple, ascending within a tuple */
    int *by_rank;     /* [nranks]: positions sorted by global rank, for lookups */
    int borrowed;     /* the four arrays above belong to another map (shardmap_build_like) */
};

/* Structural checks that need no shard map: dims, shape, ranks, mesh, placements. */
reshard_status_t layout_check(const struct rs_layout *l, struct rs_fault *fault);
/* Builds the shard map; also checks the segment bounds and the local view. */
reshard_status_t shardmap_build(const struct rs_layout *l, struct rs_shardmap *map,
                                struct rs_fault *fault);
/* The same, taking the rank arrays (tuple .. by_rank, which depend only on the ranks, the mesh
 * and which mesh dims shard which tensor dims) from `like`, a map of a layout for which
 * shardmap_same_ranks holds; like must outlive map. What a whole model on thousands of ranks
 * repeats in every tensor is built once. */
reshard_status_t shardmap_build_like(const struct rs_layout *l, const struct rs_shardmap *like,
                                     struct rs_shardmap *map, struct rs_fault *fault);
int shardmap_same_ranks(const struct rs_layout *a, const struct rs_layout *b);
void shardmap_free(struct rs_shardmap *map);

reshard_status_t layout_copy(const struct rs_layout *from, struct rs_layout *to);
void layout_free(struct rs_layout *l);

int64_t layout_numel(const struct rs_layout *l);
/* Bytes the buffer of a shard of this local shape must span under l's view: one past the
 * farthest byte the view reaches (0 for an empty shard), computed without wrapping. Returns
 * RS_ITEM_NONE when that fits an int64_t and a size_t, else the item whose value carries it
 * past (RS_ITEM_STRIDES or RS_ITEM_VIEW: the view's own reach; RS_ITEM_OFFSET: the offset on
 * top of it), leaving *bytes alone. The layout checks refuse a layout of which this fails for
 * any rank. */
enum rs_item layout_span_bytes(const struct rs_layout *l, const int64_t *local, int64_t *bytes);
/* Position of a global rank in l->ranks, or -1. */
int shardmap_position(const struct rs_shardmap *map, int rank);
int shardmap_group(const struct rs_shardmap *map, int pos, int dim);
int64_t dimmap_group_len(const struct rs_dimmap *d, int g);
int64_t shardmap_local_numel(const struct rs_shardmap *map, int pos);
/* Is the box [start, start+len) inside the shard of the rank at pos? */
int shardmap_holds(const struct rs_shardmap *map, int pos, const int64_t *start,
                   const int64_t *len);

#endif
