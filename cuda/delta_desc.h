/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Compare-and-compact on the device (docs/delta.md): the delta encoding of a chunk (the host
 * codec's format, plugin/exec/delta.h) made by kernels from the chunk and its snapshot in
 * device memory, and its application to a chunk in device memory. The per-element compare,
 * the per-word counts, the choice of encoding and the per-word and per-run moves are defined
 * here once, for the kernels (pack.cu) and the stand-in driver (test/fake), so that host tests
 * of the stand-in prove what the kernels compute.
 *
 * Encoding a chunk of n elements of es bytes (1, 2, 4 or 8), in 64-element words:
 *   mask     words[k] = the change mask of elements 64k .. 64k+63 (bit j: element 64k+j differs
 *            from the snapshot); cnt[k] = its set bits, starts[k] = the runs that start in it
 *   scan     cnt and starts become exclusive prefixes, their totals at [nwords]
 *   choose   nothing, bitmap, runs or dense, whichever is shortest (the host's rule: a tie
 *            between bitmap and runs goes to runs); the header is written, info says which
 *   compact  each word's changed elements to their place in the message (and into the
 *            snapshot), its bitmap word (bitmap), its runs' starts and ends (runs)
 *   lengths  each run's end becomes its length
 * Applying a checked message (bitmap or runs) to a packed chunk:
 *   count    cnt[k] = set bits of bitmap word k, or cnt[r] = length of run r
 *   scan     as above
 *   apply    bitmap: each word's elements to their places; runs: each run's elements
 */
#ifndef RS_DELTA_DESC_H
#define RS_DELTA_DESC_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define RS_DHD __host__ __device__ __forceinline__
#else
#define RS_DHD static inline
#endif

/* The host codec's header and kinds (plugin/exec/delta.h, which checks that they agree). */
#define RS_DELTA_MAGIC  0xd7
#define RS_DELTA_DENSE  0 /* not an encoding: the chunk travels raw */
#define RS_DELTA_NONE   1
#define RS_DELTA_BITMAP 2
#define RS_DELTA_RUNS   3
#define RS_DELTA_HDR    16

/* Threads of the scan kernel (one block). */
#define RS_DELTA_SCAN_THREADS 1024

struct rs_delta_info {
    uint64_t len;      /* the message's bytes (n * es when dense) */
    uint32_t kind;     /* RS_DELTA_* */
    uint32_t nchanged; /* changed elements */
    uint32_t nruns;    /* runs of changed elements */
    uint32_t pad;
};

struct rs_delta_desc {
    int64_t n;        /* elements in the chunk */
    int64_t nwords;   /* (n + 63) / 64 */
    int32_t esize;    /* 1, 2, 4 or 8 */
    uint32_t nruns;   /* apply: the message's runs */
    const char *cur;  /* encode: the chunk now (packed) */
    char *snap;       /* encode: its snapshot, updated; apply: the chunk written */
    char *msg;        /* encode: the message written; apply: the message read */
    uint64_t *words;  /* [nwords]: the change mask (encode) */
    uint32_t *cnt;    /* [max(nwords, nruns) + 1] */
    uint32_t *starts; /* [nwords + 1] (encode) */
    struct rs_delta_info *info;
};

RS_DHD int64_t rs_delta_nwords(int64_t n)
{
    return (n + 63) / 64;
}

RS_DHD int rs_delta_popc(uint64_t w)
{
#ifdef __CUDA_ARCH__
    return __popcll(w);
#else
    return __builtin_popcountll(w);
#endif
}

RS_DHD int rs_delta_ctz(uint64_t w)
{
#ifdef __CUDA_ARCH__
    return __ffsll((long long)w) - 1;
#else
    return __builtin_ctzll(w);
#endif
}

/* Moves element i of from to element j of to (es bytes, each a whole load and store). */
RS_DHD void rs_delta_move(char *to, int64_t j, const char *from, int64_t i, int es)
{
    switch (es) {
    case 1:
        to[j] = from[i];
        break;
    case 2:
        ((uint16_t *)to)[j] = ((const uint16_t *)from)[i];
        break;
    case 4:
        ((uint32_t *)to)[j] = ((const uint32_t *)from)[i];
        break;
    default:
        ((uint64_t *)to)[j] = ((const uint64_t *)from)[i];
    }
}

/* Does element i differ from its snapshot (bit for bit)? Elements past the chunk do not. */
RS_DHD int rs_delta_differs(const struct rs_delta_desc *d, int64_t i)
{
    if (i < 0 || i >= d->n)
        return 0;
    switch (d->esize) {
    case 1:
        return d->cur[i] != d->snap[i];
    case 2:
        return ((const uint16_t *)d->cur)[i] != ((const uint16_t *)d->snap)[i];
    case 4:
        return ((const uint32_t *)d->cur)[i] != ((const uint32_t *)d->snap)[i];
    default:
        return ((const uint64_t *)d->cur)[i] != ((const uint64_t *)d->snap)[i];
    }
}

/* Runs that start in a word w whose previous word ended with a changed element (carry). */
RS_DHD int rs_delta_starts(uint64_t w, uint64_t carry)
{
    return rs_delta_popc(w & ~((w << 1) | carry));
}

/* The mask step's result for word k, from its mask w (the kernel computes w with warp votes,
 * the stand-in bit by bit, both through rs_delta_differs). */
RS_DHD void rs_delta_mask_done(const struct rs_delta_desc *d, int64_t k, uint64_t w)
{
    d->words[k] = w;
    d->cnt[k] = (uint32_t)rs_delta_popc(w);
    d->starts[k] = (uint32_t)rs_delta_starts(w, (uint64_t)rs_delta_differs(d, 64 * k - 1));
}

/* The choice, as the host codec makes it (without its sampled shortcut to dense, which the
 * whole compare makes unnecessary), and the header. Run after the scan: cnt[nwords] and
 * starts[nwords] are the totals. */
RS_DHD void rs_delta_choose(const struct rs_delta_desc *d)
{
    uint64_t nc = d->cnt[d->nwords], nr = d->starts[d->nwords], es = (uint64_t)d->esize;
    uint64_t dense = (uint64_t)d->n * es;
    uint64_t bitmap = RS_DELTA_HDR + (uint64_t)d->nwords * 8 + nc * es;
    uint64_t runs = RS_DELTA_HDR + nr * 8 + nc * es;
    uint64_t best = nc == 0 ? RS_DELTA_HDR : bitmap < runs ? bitmap : runs;
    struct rs_delta_info in;
    in.kind = best >= dense  ? RS_DELTA_DENSE
              : nc == 0      ? RS_DELTA_NONE
              : best == runs ? RS_DELTA_RUNS
                             : RS_DELTA_BITMAP;
    in.len = in.kind == RS_DELTA_DENSE ? dense : best;
    in.nchanged = (uint32_t)nc;
    in.nruns = in.kind == RS_DELTA_RUNS ? (uint32_t)nr : 0;
    in.pad = 0;
    *d->info = in;
    if (in.kind == RS_DELTA_DENSE)
        return;
    uint8_t h[RS_DELTA_HDR] = {RS_DELTA_MAGIC, (uint8_t)in.kind, (uint8_t)es, 0};
    uint32_t v[3] = {(uint32_t)d->n, in.nchanged, in.nruns};
    memcpy(h + 4, v, sizeof(v));
    memcpy(d->msg, h, RS_DELTA_HDR);
}

/* Where the changed elements start in the message of kind `kind`. */
RS_DHD uint64_t rs_delta_elems_at(const struct rs_delta_desc *d, uint32_t kind, uint64_t nruns)
{
    return RS_DELTA_HDR + (kind == RS_DELTA_BITMAP ? (uint64_t)d->nwords * 8
                           : kind == RS_DELTA_RUNS ? nruns * 8
                                                   : 0);
}

/* The compact step for word k: its changed elements to the message (unless dense) and to the
 * snapshot; its bitmap word; its runs' starts and (end + 1)s. */
RS_DHD void rs_delta_compact_word(const struct rs_delta_desc *d, int64_t k)
{
    const struct rs_delta_info in = *d->info;
    uint64_t w = d->words[k];
    int es = d->esize;
    if (in.kind == RS_DELTA_BITMAP)
        memcpy(d->msg + RS_DELTA_HDR + 8 * k, &w, 8);
    if (!w)
        return;
    char *el = d->msg + rs_delta_elems_at(d, in.kind, in.nruns);
    uint64_t at = d->cnt[k];
    for (uint64_t b = w; b; b &= b - 1) {
        int64_t i = 64 * k + rs_delta_ctz(b);
        if (in.kind != RS_DELTA_DENSE)
            rs_delta_move(el, (int64_t)at++, d->cur, i, es);
        rs_delta_move(d->snap, i, d->cur, i, es);
    }
    if (in.kind != RS_DELTA_RUNS)
        return;
    uint64_t carry = k > 0 ? d->words[k - 1] >> 63 : 0;
    uint64_t next = k + 1 < d->nwords ? d->words[k + 1] & 1 : 0;
    uint64_t st = w & ~((w << 1) | carry), en = w & ~((w >> 1) | (next << 63));
    uint32_t *pairs = (uint32_t *)(void *)(d->msg + RS_DELTA_HDR);
    /* Runs that started before this word and end in it or later: one when a run crosses in. */
    uint64_t s_at = d->starts[k], e_at = d->starts[k] - (carry & w & 1);
    for (; st; st &= st - 1)
        pairs[2 * s_at++] = (uint32_t)(64 * k + rs_delta_ctz(st));
    for (; en; en &= en - 1)
        pairs[2 * e_at++ + 1] = (uint32_t)(64 * k + rs_delta_ctz(en) + 1);
}

/* The lengths step for run r: its end becomes its length. */
RS_DHD void rs_delta_run_length(const struct rs_delta_desc *d, int64_t r)
{
    uint32_t *pairs = (uint32_t *)(void *)(d->msg + RS_DELTA_HDR);
    pairs[2 * r + 1] -= pairs[2 * r];
}

/* ---- applying a message ---- */

/* The message's kind (from its header, which the host checked). */
RS_DHD uint32_t rs_delta_kind_of(const struct rs_delta_desc *d)
{
    return (uint8_t)d->msg[1];
}

/* The count step: set bits of bitmap word k, or the length of run k. */
RS_DHD void rs_delta_count_one(const struct rs_delta_desc *d, int64_t k)
{
    const char *body = d->msg + RS_DELTA_HDR;
    if (rs_delta_kind_of(d) == RS_DELTA_BITMAP) {
        uint64_t w;
        memcpy(&w, body + 8 * k, 8);
        d->cnt[k] = (uint32_t)rs_delta_popc(w);
    } else {
        d->cnt[k] = ((const uint32_t *)(const void *)body)[2 * k + 1];
    }
}

/* How many count steps: bitmap words or runs. */
RS_DHD int64_t rs_delta_count_n(const struct rs_delta_desc *d)
{
    return rs_delta_kind_of(d) == RS_DELTA_BITMAP ? d->nwords : (int64_t)d->nruns;
}

/* The apply step for bitmap word k: its elements to their places. */
RS_DHD void rs_delta_apply_word(const struct rs_delta_desc *d, int64_t k)
{
    const char *body = d->msg + RS_DELTA_HDR, *el = body + 8 * d->nwords;
    uint64_t w, at = d->cnt[k];
    memcpy(&w, body + 8 * k, 8);
    for (; w; w &= w - 1)
        rs_delta_move(d->snap, 64 * k + rs_delta_ctz(w), el, (int64_t)at++, d->esize);
}

/* Element e of run r (e < its length) to its place. */
RS_DHD void rs_delta_apply_run(const struct rs_delta_desc *d, int64_t r, int64_t e)
{
    const char *body = d->msg + RS_DELTA_HDR, *el = body + 8 * (uint64_t)d->nruns;
    uint32_t start = ((const uint32_t *)(const void *)body)[2 * r];
    rs_delta_move(d->snap, (int64_t)start + e, el, (int64_t)d->cnt[r] + e, d->esize);
}

/* The length of run r. */
RS_DHD int64_t rs_delta_run_len(const struct rs_delta_desc *d, int64_t r)
{
    return ((const uint32_t *)(const void *)(d->msg + RS_DELTA_HDR))[2 * r + 1];
}

#endif
