/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A pool of boxes: each box is start[ndim] then len[ndim], appended to one array and named by
 * its offset there, so millions of ops can share a few boxes and stay 20 bytes each.
 */
#ifndef RS_BOXES_H
#define RS_BOXES_H

#include "base/reshard_status.h"

#include <stddef.h>
#include <stdint.h>

struct rs_boxes {
    int64_t *coords;
    size_t n, cap; /* coordinates used and allocated */
};

/* Appends a box; *box is its offset in coords (below 2^32). */
reshard_status_t boxes_push(struct rs_boxes *b, int ndim, const int64_t *start, const int64_t *len,
                            uint32_t *box);
void boxes_free(struct rs_boxes *b);

#endif
