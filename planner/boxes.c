/* SPDX-License-Identifier: Apache-2.0 */
#include "boxes.h"

#include "base/error.h"

#include <stdlib.h>
#include <string.h>

reshard_status_t boxes_push(struct rs_boxes *b, int ndim, const int64_t *start, const int64_t *len,
                            uint32_t *box)
{
    size_t need = b->n + 2 * (size_t)ndim;
    if (need > UINT32_MAX)
        return rs_error(RESHARD_ERR_TOO_LARGE, "plan: more than 2^32 box coordinates");
    if (need > b->cap) {
        int64_t *c = rs_grow(b->coords, &b->cap, need, sizeof(int64_t), "boxes");
        if (!c)
            return RESHARD_ERR_NO_MEMORY;
        b->coords = c;
    }
    memcpy(b->coords + b->n, start, (size_t)ndim * sizeof(int64_t));
    memcpy(b->coords + b->n + ndim, len, (size_t)ndim * sizeof(int64_t));
    *box = (uint32_t)b->n;
    b->n = need;
    return RESHARD_OK;
}

void boxes_free(struct rs_boxes *b)
{
    free(b->coords);
    memset(b, 0, sizeof(*b));
}
