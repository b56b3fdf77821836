/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: the manifest loader (JSON, layouts, views, buffers) from memory. */
#include "plugin/api/api.h"

#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 65536)
        return 0;
    reshard_manifest_t *m = NULL;
    if (manifest_load_buffer((const char *)data, size, "fuzz.json", &m) == RESHARD_OK)
        reshard_manifest_destroy(m);
    return 0;
}
