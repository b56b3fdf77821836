/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: the layout spec parser, then the shard geometry of what it accepts. */
#include "plugin/reshard.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 4096)
        return 0;
    char *spec = malloc(size + 1);
    if (!spec)
        return 0;
    memcpy(spec, data, size);
    spec[size] = '\0';
    reshard_layout_t *l = NULL;
    if (reshard_layout_parse(spec, 64, &l) == RESHARD_OK) {
        int64_t shape[8], numel = 0, index[64];
        size_t bytes = 0;
        for (int r = 0; r < 64; r++) {
            if (reshard_layout_shard_shape(l, r, shape, &numel) != RESHARD_OK)
                continue;
            (void)reshard_layout_shard_bytes(l, r, &bytes);
            if (shape[0] <= 64)
                (void)reshard_layout_shard_index(l, r, 0, index);
        }
        reshard_layout_destroy(l);
    }
    free(spec);
    return 0;
}
