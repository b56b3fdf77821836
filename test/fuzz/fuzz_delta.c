/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target: the decoder of a delta refit's chunks (plugin/exec/delta.c), which reads what
 * a peer sent. The input picks a chunk (element size, rows, columns and a row pitch, so the
 * destination may be strided) and the rest is the peer's message. The oracle:
 * - delta_check never reads past the message, and it accepts exactly the messages that a
 *   reference reading of the format (docs/protocols.md, written here apart from delta.c: one
 *   pass, flat, no cleverness) accepts: a header for this chunk; 'none' alone; a bitmap with no
 *   bit past the chunk whose bits count the elements; runs in order, not empty, not overlapping,
 *   inside the chunk, whose lengths count the elements; and a length that is exactly the
 *   header's, so no hostile count is taken on trust;
 * - a message it accepts, applied to a strided destination, writes exactly the elements the
 *   reference says, with the values it says, and nothing else (the bytes between rows and every
 *   element not named keep their guard);
 *   with bit 0x20 of the first byte the message's magic, element size and element count are
 *   set to the chunk's, so that the fuzzer spends its time on the counts and the runs; with bit
 *   0x10 a runs message is also built from the input (built_runs), so that runs overlapping,
 *   empty, out of order or miscounted are a byte away, and with bit 0x08 a bitmap message
 *   (built_bitmap: bits past the chunk, miscounted elements);
 * - the first bytes also drive an encode of two chunks made from the input (changes spread or in
 *   runs, as the input's bits say; with the FLAG bit a chunk of 64 Ki one-byte elements so that
 *   the sampled "nearly all changed" path runs): what it encodes is shorter than dense, accepted
 *   by delta_check and by the reference, and applied gives back the new chunk exactly.
 */
#include "plugin/exec/delta.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define GUARD 0x5a
#define HDR   sizeof(struct delta_hdr)

/* The reference reading: 1 when msg (len bytes) is a valid encoding of a chunk of n elements of
 * es bytes, and then which elements it writes (hit[i]) and with what (val, n * es bytes). */
static int reference(const uint8_t *msg, size_t len, size_t n, size_t es, uint8_t *hit,
                     uint8_t *val)
{
    struct delta_hdr h;
    if (len < HDR)
        return 0;
    memcpy(&h, msg, HDR);
    if (h.magic != DELTA_MAGIC || h.esize != es || h.nelem != n || h.nchanged > n)
        return 0;
    memset(hit, 0, n);
    size_t words = (n + 63) / 64, changed = h.nchanged;
    const uint8_t *el;
    size_t got = 0;
    if (h.kind == DELTA_NONE)
        return !h.nchanged && !h.nruns && len == HDR;
    if (h.kind == DELTA_BITMAP) {
        if (h.nruns || len != HDR + words * 8 + changed * es)
            return 0;
        el = msg + HDR + words * 8;
        for (size_t i = 0; i < words * 64; i++) {
            if (!(msg[HDR + i / 8] >> (i % 8) & 1)) /* little-endian words: bit i is byte i/8 */
                continue;
            if (i >= n || got == changed)
                return 0;
            hit[i] = 1;
            memcpy(val + i * es, el + got++ * es, es);
        }
        return got == changed;
    }
    if (h.kind != DELTA_RUNS || h.nruns > changed ||
        len != HDR + (size_t)h.nruns * 8 + changed * es)
        return 0;
    el = msg + HDR + (size_t)h.nruns * 8;
    for (size_t r = 0, end = 0; r < h.nruns; r++) {
        uint32_t start, length;
        memcpy(&start, msg + HDR + 8 * r, 4);
        memcpy(&length, msg + HDR + 8 * r + 4, 4);
        if (!length || start < end || start > n || length > n - start)
            return 0;
        for (size_t i = start; i < (size_t)start + length; i++) {
            if (got == changed)
                return 0;
            hit[i] = 1;
            memcpy(val + i * es, el + got++ * es, es);
        }
        end = (size_t)start + length;
    }
    return got == changed;
}

/* The chunk's element i in a destination of rows x pitch elements, cols of each row used. */
static char *at(char *dst, size_t i, size_t cols, size_t pitch, size_t es)
{
    return dst + ((i / cols) * pitch + i % cols) * es;
}

static void hostile(const uint8_t *data, size_t len, size_t es, size_t rows, size_t cols,
                    size_t pitch, const struct region *rg, int fix)
{
    size_t n = rows * cols;
    char *dst = malloc(rows * pitch * es), *msg = malloc(len ? len : 1), why[128];
    uint8_t *hit = malloc(n), *val = malloc(n * es);
    if (!dst || !msg || !hit || !val)
        abort();
    memset(dst, GUARD, rows * pitch * es);
    memcpy(msg, data, len);  /* a buffer of the message's size exactly: ASan sees any overread */
    if (fix && len >= HDR) { /* a header for this chunk, so the fuzzer works on the counts */
        struct delta_hdr h;
        memcpy(&h, msg, HDR);
        h.magic = DELTA_MAGIC;
        h.esize = (uint8_t)es;
        h.nelem = (uint32_t)n;
        memcpy(msg, &h, HDR);
        data = (const uint8_t *)msg;
    }
    int ok = delta_check(msg, len, n, es, why, sizeof(why)) == RESHARD_OK;
    if (len >= n * es) { /* dense or too long: exec_delta_land never asks delta_check */
        free(dst), free(msg), free(hit), free(val);
        return;
    }
    if (ok != reference(data, len, n, es, hit, val))
        abort(); /* accepted what the format refuses, or refused a valid message */
    if (ok) {
        delta_apply(msg, rg, dst);
        for (size_t i = 0; i < n; i++) {
            const char *d = at(dst, i, cols, pitch, es);
            for (size_t b = 0; b < es; b++)
                if (hit[i] ? d[b] != (char)val[i * es + b] : (unsigned char)d[b] != GUARD)
                    abort(); /* a wrong value, or an element written that was not named */
        }
        for (size_t r = 0; r < rows; r++)
            for (size_t b = cols * es; b < pitch * es; b++)
                if ((unsigned char)dst[(r * pitch) * es + b] != GUARD)
                    abort(); /* a write between rows */
    }
    free(dst), free(msg), free(hit), free(val);
}

/* old = the input's bytes; new = old with elements changed where the input's bits say: one bit
 * per element (spread), or each set bit a run of 1 + (next byte % 200) elements (runs);
 * inverted, every element but those the set bits name (nearly all changed). */
static void round_trip(const uint8_t *data, size_t len, size_t es, size_t n, size_t rows,
                       size_t pitch, const struct region *rg, int runs, int invert)
{
    char *old = calloc(n, es), *cur = calloc(n, es), *out = malloc(n * es + 16);
    char *dst = malloc(rows * pitch * es);
    uint64_t *words = calloc((n + 63) / 64, 8);
    uint8_t *hit = malloc(n), *val = malloc(n * es);
    if (!old || !cur || !out || !dst || !words || !hit || !val)
        abort();
    for (size_t i = 0; i < n * es && i < len; i++)
        old[i] = (char)data[i];
    memcpy(cur, old, n * es);
    for (size_t i = 0, k = 0; i < n && len; i++, k++) {
        uint8_t bits = data[(k / 8) % len];
        if ((bits >> (k % 8) & 1) == invert)
            continue;
        size_t span = runs ? 1 + data[(k + 1) % len] % 200 : 1;
        for (size_t j = i; j < n && j < i + span; j++)
            cur[j * es] ^= (char)0x21; /* the element's first byte: a real change */
        if (runs)
            i += span;
    }
    memset(dst, GUARD, rows * pitch * es);
    region_unpack(rg, dst, old);
    size_t elen;
    char why[128];
    delta_encode(cur, old, n, es, out, &elen, words);
    if (memcmp(old, cur, n * es))
        abort(); /* the snapshot is what was sent */
    if (elen) {
        if (elen >= n * es || delta_check(out, elen, n, es, why, sizeof(why)) != RESHARD_OK ||
            !reference((const uint8_t *)out, elen, n, es, hit, val))
            abort();
        delta_apply(out, rg, dst);
    } else {
        region_unpack(rg, dst, cur);
    }
    region_pack(rg, dst, old);
    if (memcmp(old, cur, n * es))
        abort();
    free(old), free(cur), free(out), free(dst), free(words), free(hit), free(val);
}

/* A runs message built from the input (bit 0x10 of the first byte): byte 0 picks how many runs,
 * byte 1 how far the count of elements is off their sum (-2 to 2), then each pair of bytes is a
 * run: its start as a signed step from the previous run's end (back: overlapping, or before 0)
 * and its length (0 to 15); the elements' bytes are the input's again. Overlapping, empty,
 * out-of-order and miscounted runs are then one byte away instead of a whole header away. */
static void built_runs(const uint8_t *data, size_t len, size_t es, size_t rows, size_t cols,
                       size_t pitch, const struct region *rg)
{
    if (len < 4)
        return;
    size_t nruns = 1 + data[0] % 16, pairs = (len - 2) / 2;
    nruns = nruns < pairs ? nruns : pairs;
    uint32_t *run = calloc(2 * nruns, sizeof(*run));
    if (!run)
        abort();
    int64_t end = 0, sum = 0;
    for (size_t r = 0; r < nruns; r++) {
        int64_t start = end + (int8_t)data[2 + 2 * r];
        run[2 * r] = (uint32_t)start;
        run[2 * r + 1] = data[3 + 2 * r] % 16;
        end = start + run[2 * r + 1];
        sum += run[2 * r + 1];
    }
    int64_t changed = sum + (int64_t)(data[1] % 5) - 2;
    if (changed < 0)
        changed = 0;
    size_t blen = HDR + nruns * 8 + (size_t)changed * es;
    uint8_t *msg = malloc(blen);
    if (!msg)
        abort();
    struct delta_hdr h = {.magic = DELTA_MAGIC,
                          .kind = DELTA_RUNS,
                          .esize = (uint8_t)es,
                          .nelem = (uint32_t)(rows * cols),
                          .nchanged = (uint32_t)changed,
                          .nruns = (uint32_t)nruns};
    memcpy(msg, &h, HDR);
    memcpy(msg + HDR, run, nruns * 8);
    for (size_t i = HDR + nruns * 8; i < blen; i++)
        msg[i] = data[i % len];
    hostile(msg, blen, es, rows, cols, pitch, rg, 0);
    free(msg);
    free(run);
}

/* A bitmap message built from the input (bit 0x08 of the first byte): the words are the input's
 * bytes (so bits past the chunk's last element are as likely as any), the count of elements
 * their population off by -2 to 2 (byte 0), the elements the input's bytes again. */
static void built_bitmap(const uint8_t *data, size_t len, size_t es, size_t rows, size_t cols,
                         size_t pitch, const struct region *rg)
{
    size_t n = rows * cols, words = (n + 63) / 64;
    if (len < 2)
        return;
    uint8_t *bits = malloc(words * 8);
    if (!bits)
        abort();
    int64_t set = 0;
    for (size_t i = 0; i < words * 8; i++) {
        bits[i] = data[1 + i % (len - 1)];
        set += __builtin_popcount(bits[i]);
    }
    int64_t changed = set + (int64_t)(data[0] % 5) - 2;
    if (changed < 0)
        changed = 0;
    size_t blen = HDR + words * 8 + (size_t)changed * es;
    uint8_t *msg = malloc(blen);
    if (!msg)
        abort();
    struct delta_hdr h = {.magic = DELTA_MAGIC,
                          .kind = DELTA_BITMAP,
                          .esize = (uint8_t)es,
                          .nelem = (uint32_t)n,
                          .nchanged = (uint32_t)changed};
    memcpy(msg, &h, HDR);
    memcpy(msg + HDR, bits, words * 8);
    for (size_t i = HDR + words * 8; i < blen; i++)
        msg[i] = data[i % len];
    hostile(msg, blen, es, rows, cols, pitch, rg, 0);
    free(msg);
    free(bits);
}

#define FLAG_BIG 0x80 /* data[1]: a chunk of 64 Ki one-byte elements (the sampled path) */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 4)
        return 0;
    size_t es = (size_t)1 << (data[0] % 4), rows = 1 + data[1] % 8, cols = 1 + data[2] % 200;
    size_t pitch = cols + data[3] % 3;
    int runs = data[0] >> 2 & 1, big = data[1] & FLAG_BIG && data[0] & 0x40, fix = data[0] & 0x20,
        build = data[0] & 0x10, build_bitmap = data[0] & 0x08;
    if (big)
        es = 1, rows = 1, cols = pitch = 65536;
    size_t n = rows * cols;
    data += 4;
    size_t len = size - 4;
    struct region rg = {.esize = es,
                        .ndim = 2,
                        .shape = {(int64_t)rows, (int64_t)pitch},
                        .len = {(int64_t)rows, (int64_t)cols}};
    hostile(data, len, es, rows, cols, pitch, &rg, fix);
    if (build)
        built_runs(data, len, es, rows, cols, pitch, &rg);
    if (build_bitmap)
        built_bitmap(data, len, es, rows, cols, pitch, &rg);
    round_trip(data, len, es, n, rows, pitch, &rg, runs && !big, big);
    return 0;
}
