/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Message tags of an execution, and the numbers in them that both ends of a message agree on
 * without the world's transfer list. Each rank runs a list of its own transfers only, so a
 * transfer is named by its place among the transfers between its two ranks, in one canonical
 * order (exec_xfer_cmp: by tensor, buffers and box) that each end computes from its own list;
 * a packed message by its place among the pair's bundles (exec_bundle.c sorts alike).
 *
 * A tag holds TP_TAG_BITS (44) bits, the transport's rest being its own (the sender's rank):
 *   kind (2) | execution (4) | index (18) | chunk (20)
 * A transfer needing more chunks, or a pair more numbered transfers or bundles than the fields
 * hold, is refused when the plan is made (exec_tags_number), naming what to raise.
 */
#ifndef RS_EXEC_TAG_H
#define RS_EXEC_TAG_H

#include "exec_bundle.h"
#include "transport/tp.h"

#include <stdint.h>

#define EXEC_TAG_KIND_BITS  2
#define EXEC_TAG_SEQ_BITS   4
#define EXEC_TAG_INDEX_BITS 18
#define EXEC_TAG_CHUNK_BITS 20
#define EXEC_MAX_PAIR_TAGS  (UINT32_C(1) << EXEC_TAG_INDEX_BITS)

_Static_assert(EXEC_TAG_KIND_BITS + EXEC_TAG_SEQ_BITS + EXEC_TAG_INDEX_BITS + EXEC_TAG_CHUNK_BITS ==
                   TP_TAG_BITS,
               "a tag fills the caller's bits of the transport's tags");
_Static_assert(EXEC_MAX_CHUNKS == INT64_C(1) << EXEC_TAG_CHUNK_BITS,
               "a transfer's chunks are numbered in the chunk field");

enum exec_tag_kind {
    EXEC_TAG_RUN = 0,  /* the run's own messages: index says which (enum exec_run_msg) */
    EXEC_TAG_DATA = 1, /* a network chunk: index is the transfer's number in its pair */
    EXEC_TAG_NOTE = 2, /* a local chunk is in the receiver's memory: the same numbering */
    EXEC_TAG_PACK = 3  /* a packed message: index is its bundle's id in its pair */
};

enum exec_run_msg {
    EXEC_RUN_ACK = 0,      /* everything from the sender arrived (to each sender, at the end) */
    EXEC_RUN_ANNOUNCE = 1, /* a receiver's buffers, to a local peer that writes them */
    EXEC_RUN_WRITER = 2    /* a writer's way of writing, to the local peer it writes */
};

static inline uint64_t exec_tag(enum exec_tag_kind kind, uint32_t seq, uint32_t index,
                                uint32_t chunk)
{
    const uint64_t seq_mask = (UINT64_C(1) << EXEC_TAG_SEQ_BITS) - 1;
    const uint64_t index_mask = (UINT64_C(1) << EXEC_TAG_INDEX_BITS) - 1;
    const uint64_t chunk_mask = (UINT64_C(1) << EXEC_TAG_CHUNK_BITS) - 1;
    uint64_t t = (uint64_t)kind;
    t = t << EXEC_TAG_SEQ_BITS | (seq & seq_mask);
    t = t << EXEC_TAG_INDEX_BITS | (index & index_mask);
    t = t << EXEC_TAG_CHUNK_BITS | (chunk & chunk_mask);
    return t;
}

/* The canonical order of transfers between one pair of ranks: by tensor, the two buffers, then
 * the box (start, then lengths). Both ends of a transfer see the same fields. */
int exec_xfer_cmp(const struct exec_cut *cut, const struct xfer *a, const struct xfer *b);

/* Numbers one side's transfers (list[n], their first chunks off[n + 1], bundles b) in their
 * pairs: num[i] for list[i], counting only transfers that carry a tag of their own (those not
 * copied inside the rank nor wholly packed into bundles), in canonical order per peer (the dst
 * when send, else the src). Refuses a pair with more numbered transfers or bundles than a tag
 * holds, naming what to raise. */
reshard_status_t exec_tags_number(const struct exec_cut *cut, const uint32_t *list, size_t n,
                                  const size_t *off, const struct exec_bundles *b, int send,
                                  uint32_t *num);

#endif
