/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The shape of the bootstrap's tree. Ranks take slots in the order rank 0 admits them (rank 0
 * is slot 0; in a growth every rank's slot is its rank); slot s > 0 hangs under slot
 * (s - 1) / k, k the fan-out, so a slot's parent has always arrived before it, and the slots in
 * use are always one tree. From a slot, the size
 * and the fan-out, every rank computes the same shape: its children, the size and height of
 * its subtree, its depth; and from them how long it waits at each step of a collective, so
 * that the rank nearest a failure gives up first and the others hear its verdict.
 */
#include "boot_int.h"

int boot_tree_children(int slot, int size, int k, int *first)
{
    int64_t lo = (int64_t)k * slot + 1;
    *first = lo < size ? (int)lo : size;
    int64_t n = size - lo;
    return n <= 0 ? 0 : n < k ? (int)n : k;
}

/* The slots of one level of a subtree are the range [lo, hi]; the next level below is
 * [k*lo + 1, k*hi + k]. */
static void boot_tree_walk(int slot, int size, int k, int *count, int *height)
{
    int64_t lo = slot, hi = slot;
    *count = 0;
    *height = -1;
    while (lo < size) {
        *count += (int)((hi < size ? hi : size - 1) - lo + 1);
        (*height)++;
        lo = (int64_t)k * lo + 1;
        hi = (int64_t)k * hi + k;
    }
}

int boot_tree_subtree(int slot, int size, int k)
{
    int count, height;
    boot_tree_walk(slot, size, k, &count, &height);
    return count;
}

int boot_tree_height(int slot, int size, int k)
{
    int count, height;
    boot_tree_walk(slot, size, k, &count, &height);
    return height;
}

int boot_tree_depth(int slot, int k)
{
    int d = 0;
    for (; slot > 0; slot = (slot - 1) / k)
        d++;
    return d;
}

void boot_tree_place(struct boot *b, int slot, int fanout)
{
    b->slot = slot;
    b->fanout = fanout;
    b->depth = boot_tree_depth(slot, fanout);
    b->height = boot_tree_height(slot, b->size, fanout);
    b->tree_height = boot_tree_height(0, b->size, fanout);
    b->nchildren = boot_tree_children(slot, b->size, fanout, &b->first_child);
    b->nsub = boot_tree_subtree(slot, b->size, fanout);
}

int boot_ready_decode(const unsigned char *w, int n, int first, int size, unsigned char *seen,
                      int *out)
{
    for (int k = 0; k < n; k++) {
        int64_t r = (int32_t)(uint32_t)sock_wire_get(w + (size_t)k * 4, 4);
        if (r < 1 || r >= size || seen[r] || (k == 0 && r != first))
            return k;
        seen[r] = 1;
        out[k] = (int)r;
    }
    return -1;
}

/* ---- deadlines ---- */

int boot_grace_ms(const struct boot *b)
{
    int g = b->timeout_ms / 4;
    return g < BOOT_GRACE_MAX_MS ? g : BOOT_GRACE_MAX_MS;
}

int64_t boot_deadline_children(const struct boot *b, int64_t base)
{
    return base + (int64_t)(b->height > 1 ? b->height - 1 : 0) * BOOT_LEVEL_MS;
}

int64_t boot_deadline_parent(const struct boot *b, int64_t base)
{
    int levels = (b->tree_height > 1 ? b->tree_height - 1 : 0) + b->depth;
    return base + (int64_t)levels * BOOT_LEVEL_MS + boot_grace_ms(b);
}
