/* SPDX-License-Identifier: Apache-2.0 */
/*
 * An open-addressing index over items the caller keeps in an array: a slot holds an item's
 * position + 1 (0: empty), found by the item's 64-bit hash and the caller's equality. At most
 * half full, so a lookup ends at the first empty slot. For the interning tables of the planner
 * and the manifest loader.
 */
#ifndef RS_HINDEX_H
#define RS_HINDEX_H

#include "reshard_status.h"

#include <stddef.h>
#include <stdint.h>

struct rs_hindex {
    uint32_t *slot;
    size_t cap;   /* a power of two, or 0 */
    size_t count; /* items indexed */
};

/* Position of the item with hash h for which eq(arg, position) holds, or -1; *at becomes the
 * slot to put it in when absent. Call rs_hindex_fit first: an index without slots has
 * nowhere to look. */
long rs_hindex_find(const struct rs_hindex *x, uint64_t h, int (*eq)(void *arg, size_t pos),
                    void *arg, size_t *at);
/* Room for one more item: doubles and re-indexes the count items when half full (hash_of
 * gives each one's hash). */
reshard_status_t rs_hindex_fit(struct rs_hindex *x, uint64_t (*hash_of)(void *arg, size_t pos),
                               void *arg);
/* Indexes item `pos` at the slot rs_hindex_find gave. */
void rs_hindex_put(struct rs_hindex *x, size_t at, size_t pos);
void rs_hindex_free(struct rs_hindex *x);

#endif
