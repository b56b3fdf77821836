/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: the communicator hello decoder (comm_hello_decode), fed the records of an
 * allgather as a hostile member could make them. The first byte is the job's size (1-64), the
 * second the address slot (0-255, rounded to 8), the third which ranks are present; the rest
 * fills the records. It must refuse, or decode with every address inside its slot. */
#include "plugin/comm/comm_int.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3 || size > 65536)
        return 0;
    int n = 1 + data[0] % 64;
    size_t rec = COMM_HELLO_BYTES + (size_t)(data[1] / 8) * 8;
    unsigned char *all = calloc((size_t)n, rec), present[64];
    struct comm_hello *h = calloc((size_t)n, sizeof(*h));
    const unsigned char **addr = calloc((size_t)n, sizeof(*addr));
    if (!all || !h || !addr)
        abort();
    memcpy(all, data + 3, size - 3 < (size_t)n * rec ? size - 3 : (size_t)n * rec);
    for (int r = 0; r < n; r++)
        present[r] = (data[2] >> (r % 8) & 1) || r == 0;
    if (comm_hello_decode(all, rec, n, present, h, addr) == RESHARD_OK)
        for (int r = 0; r < n; r++)
            if (present[r] && (h[r].addr_len > rec - COMM_HELLO_BYTES || h[r].addr_len == 0 ||
                               addr[r] != all + (size_t)r * rec + COMM_HELLO_BYTES ||
                               !memchr(h[r].transport, 0, sizeof(h[r].transport))))
                abort();
    free(addr);
    free(h);
    free(all);
    return 0;
}
