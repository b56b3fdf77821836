/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Chunks: how the executor cuts every transfer of a list (RESHARD_CHUNK_BYTES), the same way on
 * both sides of it, so that a chunk is named by (transfer, chunk) and both ends agree on its
 * bytes. The cost model cuts with the same code to count what the executor would send.
 */
#ifndef RS_EXEC_CHUNK_H
#define RS_EXEC_CHUNK_H

#include "region.h"
#include "xfer.h"

#include <stdint.h>

#define EXEC_MAX_CHUNKS      (INT64_C(1) << 20) /* per transfer: the chunk field of a tag */
#define EXEC_MAX_CHUNK_BYTES (INT64_C(1) << 30)

/* What cutting needs: the plan (tensors, shard maps), the transfer list (boxes) and the sizes. */
struct exec_cut {
    const struct rs_plan *plan;
    const struct xfer_set *xs;
    int64_t chunk_bytes;    /* at most this many bytes a chunk */
    int64_t coalesce_bytes; /* chunks up to this size may travel packed (exec_bundle.h) */
};

/* The cut this process makes of xs (a transfer list of plan): exec_chunk_bytes() and
 * exec_coalesce_bytes(). Both stay the caller's. */
void exec_cut_init(struct exec_cut *cut, const struct rs_plan *plan, const struct xfer_set *xs);

/* Chunks of a transfer: as many on both sides, since both derive them alike. */
int64_t exec_nchunks(const struct exec_cut *cut, const struct xfer *xf);
/* The chunk inside the buffer `side` (0 source, 1 destination) of the transfer. */
void exec_chunk_region(const struct exec_cut *cut, const struct xfer *xf, uint32_t chunk, int side,
                       struct region *r);
/* Bytes of a chunk (alike on both sides). */
uint64_t exec_chunk_bytes_of(const struct exec_cut *cut, const struct xfer *xf, uint32_t chunk);

#endif
