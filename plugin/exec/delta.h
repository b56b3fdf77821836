/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The encoding of a chunk in a delta refit (docs/delta.md): a chunk of n elements of es bytes
 * (1, 2, 4 or 8), compared with the sender's snapshot of what it last sent, travels as the
 * smallest of
 *   - dense:  the n elements, raw (the message is exactly n * es bytes: no header);
 *   - none:   a header alone (nothing changed);
 *   - bitmap: a header, one bit per element (in 64-bit words), the changed elements in order;
 *   - runs:   a header, (start, length) pairs of 32 bits each, the changed elements in order.
 * An encoded message is always shorter than the dense one, so its length tells which it is.
 * Every count in a header is checked against the message's length and the chunk before any
 * element is written: a peer's message claiming more than the chunk holds is refused.
 * Host byte order: both ends of a communicator are the same kind of host.
 */
#ifndef RS_EXEC_DELTA_H
#define RS_EXEC_DELTA_H

#include "region.h"
#include "plugin/reshard.h"

#include <stddef.h>
#include <stdint.h>

enum delta_kind {
    DELTA_NONE = 1,
    DELTA_BITMAP = 2,
    DELTA_RUNS = 3,
};

struct delta_hdr {
    uint8_t magic; /* DELTA_MAGIC */
    uint8_t kind;  /* enum delta_kind */
    uint8_t esize;
    uint8_t pad;
    uint32_t nelem;    /* elements in the chunk */
    uint32_t nchanged; /* elements that follow */
    uint32_t nruns;    /* DELTA_RUNS: (start, length) pairs */
};

#define DELTA_MAGIC 0xd7

/* The most an encoded chunk of `bytes` takes (less than bytes, or 0: never encoded). Senders
 * size their buffers with it. */
size_t delta_encode_cap(size_t bytes);

/* Compares the chunk cur (n elements of es bytes, packed) with snap, the snapshot of what was
 * last sent, and writes the encoding into out (room for delta_encode_cap(n * es) bytes) when
 * it is shorter than the dense chunk: *len its length. *len == 0: send cur dense. snap then
 * holds cur. words: scratch of (n + 63) / 64 words. */
void delta_encode(const void *cur, void *snap, size_t n, size_t es, void *out, size_t *len,
                  uint64_t *words);

/* The message msg (len bytes) for a chunk of n elements of es bytes, checked whole before
 * anything is written: RESHARD_ERR_INVALID_ARG with what is wrong in why (why_len bytes) if
 * its counts do not fit the chunk or the message. */
reshard_status_t delta_check(const void *msg, size_t len, size_t n, size_t es, char *why,
                             size_t why_len);
/* Applies a checked encoded message (not dense) to the chunk at base over region rg (elements
 * in the region's order). */
void delta_apply(const void *msg, const struct region *rg, char *base);
/* The elements a checked encoded message (not dense) changes, in runs: fn(arg, first, n) for
 * elements [first, first + n) of the chunk, in the region's order, ascending. */
void delta_each_changed(const void *msg, void (*fn)(void *arg, uint64_t first, uint64_t n),
                        void *arg);

#endif
