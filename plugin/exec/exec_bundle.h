/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Bundles (RESHARD_COALESCE_BYTES): network chunks of at most coalesce_bytes that leave a source
 * buffer at the start travel to each peer packed into messages of at most chunk_bytes, which
 * sender and receiver group alike: per peer, by the transfers' canonical order (exec_tag.h: each
 * end sees it in its own list), then chunk, each message filled greedily. A bundle's pieces are
 * (position in the side's list of transfers, chunk).
 *
 * The same code counts without building (exec_bundles_count), for the cost model: what it
 * predicts is what the executor sends.
 */
#ifndef RS_EXEC_BUNDLE_H
#define RS_EXEC_BUNDLE_H

#include "exec_chunk.h"

#include <stddef.h>
#include <stdint.h>

struct exec_bundle {
    int32_t peer;
    uint32_t id, first, n; /* id among this pair's bundles; pieces[first .. first + n) */
    uint64_t bytes;
};

struct exec_piece {
    uint32_t pos, chunk;
};

/* One side's packed messages. */
struct exec_bundles {
    struct exec_bundle *b;
    size_t n;
    struct exec_piece *p; /* every bundle's pieces, in bundle order */
    uint8_t *bundled;     /* by chunk (off[pos] + chunk): travels in a bundle */
};

/* The bundles of one side: list[n] the transfers (their indices in cut->xs), off[n + 1] their
 * first chunks, the peer of each its dst (send) or its src (receive). */
reshard_status_t exec_bundles_build(const struct exec_cut *cut, const uint32_t *list, size_t n,
                                    const size_t *off, int send, struct exec_bundles *out);
/* Count-only: the bundles exec_bundles_build would make, and the chunks packed into them. */
reshard_status_t exec_bundles_count(const struct exec_cut *cut, const uint32_t *list, size_t n,
                                    int send, size_t *nbundles, size_t *npieces);
void exec_bundles_fini(struct exec_bundles *b);

#endif
