/* SPDX-License-Identifier: Apache-2.0 */
#include "hindex.h"

#include "error.h"

#include <stdlib.h>
#include <string.h>

long rs_hindex_find(const struct rs_hindex *x, uint64_t h, int (*eq)(void *arg, size_t pos),
                    void *arg, size_t *at)
{
    size_t mask = x->cap - 1, i = h & mask;
    for (; x->slot[i]; i = (i + 1) & mask)
        if (eq(arg, x->slot[i] - 1))
            return (long)(x->slot[i] - 1);
    *at = i;
    return -1;
}

reshard_status_t rs_hindex_fit(struct rs_hindex *x, uint64_t (*hash_of)(void *arg, size_t pos),
                               void *arg)
{
    if (2 * (x->count + 1) <= x->cap)
        return RESHARD_OK;
    if (x->count + 1 > UINT32_MAX / 2)
        return rs_error(RESHARD_ERR_TOO_LARGE, "an index of more than 2^31 items");
    size_t cap = x->cap ? 2 * x->cap : 64;
    uint32_t *slot = rs_calloc(cap, sizeof(*slot), "hash index");
    if (!slot)
        return RESHARD_ERR_NO_MEMORY;
    for (size_t p = 0; p < x->count; p++) {
        size_t i = hash_of(arg, p) & (cap - 1);
        while (slot[i])
            i = (i + 1) & (cap - 1);
        slot[i] = (uint32_t)p + 1;
    }
    free(x->slot);
    x->slot = slot;
    x->cap = cap;
    return RESHARD_OK;
}

void rs_hindex_put(struct rs_hindex *x, size_t at, size_t pos)
{
    x->slot[at] = (uint32_t)pos + 1;
    x->count++;
}

void rs_hindex_free(struct rs_hindex *x)
{
    free(x->slot);
    memset(x, 0, sizeof(*x));
}
