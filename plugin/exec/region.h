/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A region: one box of one rank's buffer of one tensor, and the byte runs it covers in that
 * buffer, in the box's row-major order. Two regions of the same box (source and destination,
 * sender and receiver) therefore describe the same byte stream, whatever their layouts: packing,
 * unpacking, local copies and cross-memory writes all walk runs in that order.
 */
#ifndef RS_REGION_H
#define RS_REGION_H

#include "planner/layout.h"

#include <stddef.h>
#include <stdint.h>

struct region {
    size_t esize;
    int ndim;
    int64_t shape[RS_MAX_DIMS];                   /* the buffer's local shard shape */
    int64_t start[RS_MAX_DIMS], len[RS_MAX_DIMS]; /* the box, in local coordinates */
    const struct rs_view *view;                   /* NULL: row-major over shape, no offset */
};

/* The box [gstart, gstart+glen) of the global tensor inside the shard of the rank at position
 * pos of map (the box must lie inside it, within one segment per dim). */
void region_of_shard(const struct rs_shardmap *map, int pos, const int64_t *gstart,
                     const int64_t *glen, struct region *r);
/* The box inside a buffer holding the whole tensor, row-major. */
void region_of_full(const struct rs_layout *l, const int64_t *gstart, const int64_t *glen,
                    struct region *r);

/* The element offset, under view v (NULL or empty: row-major), of the element at row-major
 * index lin of a local shard of this shape. */
int64_t region_view_at(const struct rs_view *v, const int64_t *shape, int ndim, int64_t lin);

/* Bytes the buffer of a shard of this local shape must span under the view; UINT64_MAX when
 * that does not fit an int64_t (layout_span_bytes), so that no buffer passes a check of it. */
uint64_t region_span_bytes(const struct rs_layout *l, const int64_t *shape);

struct region_iter {
    const struct region *r;
    int outer;                    /* dims iterated one index at a time: 0 .. outer-1 */
    int64_t idx[RS_MAX_DIMS];     /* odometer over the outer dims */
    int64_t run;                  /* elements per local run */
    int64_t lin, left;            /* current local run: next linear index, elements left */
    int64_t vstride[RS_MAX_DIMS]; /* view strides in elements */
    int vdim;
    const int64_t *vshape;
    int done;
};

void region_iter_init(struct region_iter *it, const struct region *r);
/* The next run: byte offset in the buffer and length in bytes. 0 when there are no more. */
int region_iter_next(struct region_iter *it, uint64_t *off, uint64_t *len);
/* Does the region cover one contiguous run? Then *off is its byte offset. */
int region_contiguous(const struct region *r, uint64_t *off);
uint64_t region_bytes(const struct region *r);

/* Walks two regions of the same box together, in pieces contiguous in both. */
struct region_pair {
    struct region_iter a, b;
    uint64_t aoff, alen, boff, blen;
};

void region_pair_init(struct region_pair *p, const struct region *a, const struct region *b);
int region_pair_next(struct region_pair *p, uint64_t *aoff, uint64_t *boff, uint64_t *len);

/* The region as the pack kernels address it (pack_desc.h). */
struct rs_pack_desc;
void region_desc(const struct region *r, struct rs_pack_desc *d);

/* Copies between a region of a buffer and a packed (contiguous, box-ordered) buffer. */
void region_pack(const struct region *r, const char *base, char *packed);
void region_unpack(const struct region *r, char *base, const char *packed);
/* Copies region a of buffer abase into region b of buffer bbase (same box). */
void region_copy(const struct region *a, const char *abase, const struct region *b, char *bbase);

#endif
