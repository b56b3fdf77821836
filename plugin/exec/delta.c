/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The delta encoding of a chunk (delta.h). The compare is written so that the compiler turns it
 * into vector code: a block of 64 elements is compared into 64 flag bytes, which a multiply
 * packs into the block's 64-bit mask 8 at a time; a block that did not change costs only its
 * compare. The changed elements are then gathered one set bit at a time, so what follows the
 * compare costs in proportion to what changed.
 */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif

#include "delta.h"

#include <stdio.h>
#include <string.h>

#define HDR sizeof(struct delta_hdr)

static size_t nwords(size_t n)
{
    return (n + 63) / 64;
}

size_t delta_encode_cap(size_t bytes)
{
    return bytes > HDR ? bytes - 1 : 0;
}

/* Eight flag bytes (each 0 or 1) to eight bits, the first byte the lowest bit. */
static uint64_t pack8(const uint8_t *f)
{
    uint64_t x;
    memcpy(&x, f, 8);
    return (x * 0x0102040810204080ULL) >> 56;
}

/* The change mask of the m (at most 64) elements at lo: a full block with a fixed trip count,
 * which the compiler unrolls into vector compares. */
#define MASK_OF(T)                                                                                 \
    static uint64_t mask_##T(const T *a, const T *b, size_t m)                                     \
    {                                                                                              \
        uint8_t f[64];                                                                             \
        T any = 0;                                                                                 \
        if (m == 64) {                                                                             \
            for (size_t i = 0; i < 64; i++)                                                        \
                any |= a[i] ^ b[i];                                                                \
            if (!any)                                                                              \
                return 0;                                                                          \
            for (size_t i = 0; i < 64; i++)                                                        \
                f[i] = a[i] != b[i];                                                               \
        } else {                                                                                   \
            memset(f, 0, sizeof(f));                                                               \
            for (size_t i = 0; i < m; i++)                                                         \
                f[i] = a[i] != b[i];                                                               \
        }                                                                                          \
        uint64_t bits = 0;                                                                         \
        for (int j = 0; j < 8; j++)                                                                \
            bits |= pack8(f + 8 * j) << (8 * j);                                                   \
        return bits;                                                                               \
    }

MASK_OF(uint8_t)
MASK_OF(uint16_t)
MASK_OF(uint32_t)
MASK_OF(uint64_t)

static uint64_t mask_at(const void *cur, const void *snap, size_t lo, size_t m, size_t es)
{
    switch (es) {
    case 1:
        return mask_uint8_t((const uint8_t *)cur + lo, (const uint8_t *)snap + lo, m);
    case 2:
        return mask_uint16_t((const uint16_t *)cur + lo, (const uint16_t *)snap + lo, m);
    case 4:
        return mask_uint32_t((const uint32_t *)cur + lo, (const uint32_t *)snap + lo, m);
    default:
        return mask_uint64_t((const uint64_t *)cur + lo, (const uint64_t *)snap + lo, m);
    }
}

/* The mask of every block of 64 elements; counts changed elements and runs of them. */
static void masks(const void *cur, const void *snap, size_t n, size_t es, uint64_t *w,
                  size_t *changed, size_t *runs)
{
    size_t nc = 0, nr = 0;
    uint64_t carry = 0;
    for (size_t k = 0, lo = 0; lo < n; k++, lo += 64) {
        size_t m = n - lo < 64 ? n - lo : 64;
        uint64_t bits = mask_at(cur, snap, lo, m, es);
        w[k] = bits;
        nc += (size_t)__builtin_popcountll(bits);
        nr += (size_t)__builtin_popcountll(bits & ~((bits << 1) | carry));
        carry = bits >> 63;
    }
    *changed = nc;
    *runs = nr;
}

/* Copies the changed elements of cur, in order, to out and into snap. */
static void gather(const char *cur, char *snap, const uint64_t *w, size_t n, size_t es, char *out)
{
    for (size_t k = 0; k < nwords(n); k++)
        for (uint64_t bits = w[k]; bits; bits &= bits - 1) {
            size_t i = 64 * k + (size_t)__builtin_ctzll(bits);
            switch (es) { /* fixed sizes: each memcpy is one move */
            case 1:
                out[0] = snap[i] = cur[i];
                break;
            case 2:
                memcpy(out, cur + 2 * i, 2);
                memcpy(snap + 2 * i, out, 2);
                break;
            case 4:
                memcpy(out, cur + 4 * i, 4);
                memcpy(snap + 4 * i, out, 4);
                break;
            default:
                memcpy(out, cur + 8 * i, 8);
                memcpy(snap + 8 * i, out, 8);
            }
            out += es;
        }
}

/* The (start, length) pairs of the set bits. */
static void write_runs(const uint64_t *w, size_t n, uint32_t *out)
{
    size_t r = 0;
    uint32_t start = 0, end = 0; /* the open run: [start, end) */
    int open = 0;
    for (size_t k = 0; k < nwords(n); k++)
        for (uint64_t bits = w[k]; bits; bits &= bits - 1) {
            uint32_t i = (uint32_t)(64 * k + (size_t)__builtin_ctzll(bits));
            if (open && i == end) {
                end++;
                continue;
            }
            if (open) {
                out[2 * r] = start;
                out[2 * r++ + 1] = end - start;
            }
            start = i;
            end = i + 1;
            open = 1;
        }
    if (open) {
        out[2 * r] = start;
        out[2 * r + 1] = end - start;
    }
}

/* A chunk nearly all of whose elements changed cannot be sent shorter than dense: 64 blocks
 * spread over it, every element changed in all but SAMPLE_SLACK of them, say so without the
 * whole compare. A guess only ever costs bytes, never correctness: dense is always right. */
#define SAMPLE_SLACK 16
static int nearly_all_changed(const void *cur, const void *snap, size_t n, size_t es)
{
    size_t blocks = n / 64, unchanged = 0;
    if (blocks < 64 * 16)
        return 0;
    size_t span = blocks / 64;
    for (size_t j = 0; j < 64; j++) { /* one block at a scrambled place in each 64th */
        size_t k = j * span + (size_t)((j * 0x9e3779b97f4a7c15ULL) >> 40) % span;
        uint64_t bits = mask_at(cur, snap, k * 64, 64, es);
        unchanged += (size_t)(64 - __builtin_popcountll(bits));
    }
    return unchanged <= SAMPLE_SLACK;
}

void delta_encode(const void *cur, void *snap, size_t n, size_t es, void *out, size_t *len,
                  uint64_t *words)
{
    size_t nc, nr, dense = n * es;
    if (nearly_all_changed(cur, snap, n, es)) {
        memcpy(snap, cur, dense);
        *len = 0;
        return;
    }
    masks(cur, snap, n, es, words, &nc, &nr);
    size_t bitmap = HDR + nwords(n) * 8 + nc * es, runs = HDR + nr * 8 + nc * es;
    size_t best = nc == 0 ? HDR : bitmap < runs ? bitmap : runs;
    if (best >= dense) {
        memcpy(snap, cur, dense);
        *len = 0;
        return;
    }
    struct delta_hdr h = {.magic = DELTA_MAGIC,
                          .kind = nc == 0        ? DELTA_NONE
                                  : best == runs ? DELTA_RUNS
                                                 : DELTA_BITMAP,
                          .esize = (uint8_t)es,
                          .nelem = (uint32_t)n,
                          .nchanged = (uint32_t)nc};
    h.nruns = h.kind == DELTA_RUNS ? (uint32_t)nr : 0;
    char *o = out;
    memcpy(o, &h, HDR);
    o += HDR;
    if (h.kind == DELTA_BITMAP) {
        memcpy(o, words, nwords(n) * 8);
        o += nwords(n) * 8;
    } else if (h.kind == DELTA_RUNS) {
        uint32_t *pairs = (uint32_t *)(void *)o; /* out is 8-aligned, and so is HDR */
        write_runs(words, n, pairs);
        o += nr * 8;
    }
    gather(cur, snap, words, n, es, o);
    *len = best;
}

static reshard_status_t refuse(char *why, size_t why_len, const char *what)
{
    snprintf(why, why_len, "%s", what);
    return RESHARD_ERR_INVALID_ARG;
}

reshard_status_t delta_check(const void *msg, size_t len, size_t n, size_t es, char *why,
                             size_t why_len)
{
    struct delta_hdr h;
    if (len < HDR)
        return refuse(why, why_len, "shorter than its header");
    memcpy(&h, msg, HDR);
    if (h.magic != DELTA_MAGIC || h.esize != es || h.nelem != n)
        return refuse(why, why_len, "a header for another chunk");
    if (h.nchanged > n)
        return refuse(why, why_len, "more changed elements than the chunk holds");
    const char *body = (const char *)msg + HDR;
    uint64_t nc = h.nchanged, elems = nc * es;
    if (h.kind == DELTA_NONE)
        return h.nchanged || h.nruns || len != HDR ? refuse(why, why_len, "'none' with a body")
                                                   : RESHARD_OK;
    if (h.kind == DELTA_BITMAP) {
        if (h.nruns || len != HDR + nwords(n) * 8 + elems)
            return refuse(why, why_len, "a bitmap whose length is not the message's");
        uint64_t set = 0, w;
        for (size_t k = 0; k < nwords(n); k++) {
            memcpy(&w, body + 8 * k, 8);
            set += (uint64_t)__builtin_popcountll(w);
        }
        if (n % 64) { /* no bit past the chunk's last element */
            memcpy(&w, body + 8 * (nwords(n) - 1), 8);
            if (w >> (n % 64))
                return refuse(why, why_len, "a bitmap with bits past the chunk");
        }
        return set == nc ? RESHARD_OK
                         : refuse(why, why_len, "a bitmap that does not count its elements");
    }
    if (h.kind != DELTA_RUNS)
        return refuse(why, why_len, "an unknown kind");
    if (h.nruns > h.nchanged || len != HDR + (uint64_t)h.nruns * 8 + elems)
        return refuse(why, why_len, "runs whose length is not the message's");
    uint64_t end = 0, total = 0;
    for (uint32_t r = 0; r < h.nruns; r++) {
        uint32_t p[2];
        memcpy(p, body + 8 * (size_t)r, 8);
        if (p[1] == 0 || p[0] < end || (uint64_t)p[0] + p[1] > n)
            return refuse(why, why_len, "runs out of order, empty or past the chunk");
        end = (uint64_t)p[0] + p[1];
        total += p[1];
    }
    return total == nc ? RESHARD_OK : refuse(why, why_len, "runs that do not count their elements");
}

/* Where the chunk's elements are: the region's contiguous pieces, in order. */
struct cursor {
    struct region_iter it;
    char *base;
    size_t es;
    uint64_t first, count; /* the current piece's first element and its length */
    char *at;              /* its address */
};

static void cursor_init(struct cursor *c, const struct region *rg, char *base)
{
    region_iter_init(&c->it, rg);
    c->base = base;
    c->es = rg->esize;
    c->first = c->count = 0;
    c->at = NULL;
}

/* The address of element i (ascending calls only). */
static char *cursor_at(struct cursor *c, uint64_t i)
{
    while (i >= c->first + c->count) {
        uint64_t off, len;
        c->first += c->count;
        if (!region_iter_next(&c->it, &off, &len))
            return NULL; /* delta_check made this impossible */
        c->count = len / c->es;
        c->at = c->base + off;
    }
    return c->at + (i - c->first) * c->es;
}

void delta_apply(const void *msg, const struct region *rg, char *base)
{
    struct delta_hdr h;
    memcpy(&h, msg, HDR);
    const char *body = (const char *)msg + HDR;
    size_t es = h.esize;
    struct cursor c;
    cursor_init(&c, rg, base);
    if (h.kind == DELTA_BITMAP) {
        const char *el = body + nwords(h.nelem) * 8;
        for (size_t k = 0; k < nwords(h.nelem); k++) {
            uint64_t bits;
            memcpy(&bits, body + 8 * k, 8);
            for (; bits; bits &= bits - 1) {
                char *d = cursor_at(&c, 64 * k + (uint64_t)__builtin_ctzll(bits));
                if (!d)
                    return;
                memcpy(d, el, es);
                el += es;
            }
        }
    } else if (h.kind == DELTA_RUNS) {
        const char *el = body + (size_t)h.nruns * 8;
        for (uint32_t r = 0; r < h.nruns; r++) {
            uint32_t p[2];
            memcpy(p, body + 8 * (size_t)r, 8);
            for (uint64_t i = p[0], left = p[1]; left;) { /* a run may cross pieces */
                char *d = cursor_at(&c, i);
                if (!d)
                    return;
                uint64_t here = c.first + c.count - i;
                uint64_t k = here < left ? here : left;
                memcpy(d, el, k * es);
                el += k * es;
                i += k;
                left -= k;
            }
        }
    }
}

void delta_each_changed(const void *msg, void (*fn)(void *arg, uint64_t first, uint64_t n),
                        void *arg)
{
    struct delta_hdr h;
    memcpy(&h, msg, HDR);
    const char *body = (const char *)msg + HDR;
    if (h.kind == DELTA_BITMAP) {
        for (size_t k = 0; k < nwords(h.nelem); k++) {
            uint64_t bits;
            memcpy(&bits, body + 8 * k, 8);
            while (bits) { /* each run of set bits at once */
                unsigned lo = (unsigned)__builtin_ctzll(bits);
                uint64_t from = bits >> lo;
                unsigned n = ~from ? (unsigned)__builtin_ctzll(~from) : 64 - lo;
                fn(arg, 64 * k + lo, n);
                bits = n + lo >= 64 ? 0 : bits & ~(((UINT64_C(1) << n) - 1) << lo);
            }
        }
    } else if (h.kind == DELTA_RUNS) {
        for (uint32_t r = 0; r < h.nruns; r++) {
            uint32_t p[2];
            memcpy(p, body + 8 * (size_t)r, 8);
            fn(arg, p[0], p[1]);
        }
    }
}
