/* SPDX-License-Identifier: Apache-2.0 */
/* One rank's side of a 2-D int32 reshard in the communicator tests: every element is its
 * global index, so destinations are checked element by element. */
#ifndef RS_TEST_SIDE_H
#define RS_TEST_SIDE_H

#include "plugin/reshard.h"

#include <stdint.h>

/* The layout, or abort with the parser's message. */
reshard_layout_t *parse(const char *spec);
/* The rank's shard of the pattern (2-D tensors). */
void fill(const reshard_layout_t *l, int rank, int32_t *buf);
int count_wrong(const reshard_layout_t *l, int rank, const int32_t *buf);

/* Any layout: puts value(global linear index, arg) into every element of rank's shard of l in
 * buf (its low elem_size bytes; row-major over the shard's local shape), or, when !put, adds the
 * elements that differ from it to *wrong. */
void shard_values(const reshard_layout_t *l, int rank, char *buf, int put,
                  uint64_t (*value)(int64_t global, const void *arg), const void *arg, int *wrong);

/* One rank's side of a plan: layouts, the plan, buffers sized for its shards (the source
 * filled with the pattern). */
struct side {
    reshard_layout_t *src, *dst;
    reshard_plan_t *plan;
    int32_t *s, *d;
    reshard_buffers_t b;
};

reshard_status_t side_open(struct side *x, reshard_comm_t *comm, int rank, const char *src,
                           const char *dst);
void side_close(struct side *x);

#endif
