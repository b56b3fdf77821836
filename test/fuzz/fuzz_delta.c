/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target: the decoder of a delta refit's chunks (plugin/exec/delta.c), which reads what
 * a peer sent. The input picks a chunk (element size, rows, columns and a row pitch, so the
 * destination may be strided) and the rest is the peer's message. The oracle:
 * - delta_check never reads past the message, and a message it accepts is applied without a
 *   write outside the destination's region (the buffer is exactly its size, and the bytes
 *   between rows are checked untouched);
 * - the first bytes also drive an encode of two chunks made from the input: what it encodes
 *   is accepted by delta_check and applied gives back the new chunk exactly.
 */
#include "plugin/exec/delta.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define GUARD 0x5a

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 4)
        return 0;
    size_t es = (size_t)1 << (data[0] % 4), rows = 1 + data[1] % 8, cols = 1 + data[2] % 200;
    size_t pitch = cols + data[3] % 3, n = rows * cols;
    data += 4;
    size_t len = size - 4;
    struct region rg = {.esize = es,
                        .ndim = 2,
                        .shape = {(int64_t)rows, (int64_t)pitch},
                        .len = {(int64_t)rows, (int64_t)cols}};
    char *dst = malloc(rows * pitch * es), *msg = malloc(len ? len : 1);
    if (!dst || !msg)
        abort();
    memset(dst, GUARD, rows * pitch * es);
    memcpy(msg, data, len); /* a buffer of the message's size exactly: ASan sees any overread */
    char why[128];
    if (len < n * es && delta_check(msg, len, n, es, why, sizeof(why)) == RESHARD_OK) {
        delta_apply(msg, &rg, dst);
        for (size_t r = 0; r < rows; r++)
            for (size_t b = cols * es; b < pitch * es; b++)
                if ((unsigned char)dst[(r * pitch) * es + b] != GUARD)
                    abort(); /* a write between rows */
    }
    /* Round trip: old = the input's bytes, new = old with every third byte flipped where the
     * input's byte is odd. */
    char *old = calloc(n, es), *cur = calloc(n, es), *out = malloc(n * es + 16);
    uint64_t *words = calloc((n + 63) / 64, 8);
    if (!old || !cur || !out || !words)
        abort();
    for (size_t i = 0; i < n * es && i < len; i++)
        old[i] = (char)data[i];
    for (size_t i = 0; i < n * es; i++)
        cur[i] = (char)(old[i] ^ (i % 3 == 0 && i < len && (data[i] & 1) ? 0x21 : 0));
    memset(dst, GUARD, rows * pitch * es);
    region_unpack(&rg, dst, old);
    size_t elen;
    delta_encode(cur, old, n, es, out, &elen, words);
    if (memcmp(old, cur, n * es))
        abort(); /* the snapshot is what was sent */
    if (elen) {
        if (elen >= n * es || delta_check(out, elen, n, es, why, sizeof(why)) != RESHARD_OK)
            abort();
        delta_apply(out, &rg, dst);
    } else {
        region_unpack(&rg, dst, cur);
    }
    region_pack(&rg, dst, old);
    if (memcmp(old, cur, n * es))
        abort();
    free(old);
    free(cur);
    free(out);
    free(words);
    free(dst);
    free(msg);
    return 0;
}
