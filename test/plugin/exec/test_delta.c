/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The delta encoding of a chunk (plugin/exec/delta.c): what a sender encodes, a receiver that
 * held the snapshot turns back into the chunk exactly, whatever changed; the smallest of dense,
 * none, bitmap and runs is picked; a message whose counts do not fit its chunk is refused
 * before anything is written. Random cases print their seed.
 */
#include "plugin/exec/delta.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

static uint64_t next(uint64_t *s)
{
    uint64_t x = (*s += 0x9e3779b97f4a7c15ULL);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* A contiguous region of n elements of es bytes. */
static struct region flat(size_t n, size_t es)
{
    return (struct region){.esize = es, .ndim = 1, .shape = {(int64_t)n}, .len = {(int64_t)n}};
}

struct enc {
    char *out;
    uint64_t *words;
    size_t len;
};

static void encode(const void *cur, void *snap, size_t n, size_t es, struct enc *e)
{
    e->out = aligned_alloc(16, (n * es + 31) / 16 * 16); /* a multiple of the alignment */
    e->words = calloc((n + 63) / 64 + 1, 8);
    cr_assert(e->out && e->words);
    delta_encode(cur, snap, n, es, e->out, &e->len, e->words);
}

static void enc_free(struct enc *e)
{
    free(e->out);
    free(e->words);
}

/* A receiver holding old: applies what the sender encoded. */
static void receive(const struct enc *e, const void *cur, char *dst, const struct region *rg,
                    size_t n, size_t es)
{
    if (!e->len) { /* dense: the chunk raw */
        region_unpack(rg, dst, cur);
        return;
    }
    char why[128];
    cr_assert_eq(delta_check(e->out, e->len, n, es, why, sizeof(why)), RESHARD_OK, "%s", why);
    delta_apply(e->out, rg, dst);
}

Test(delta, unchanged_chunk_travels_as_a_header)
{
    uint16_t cur[1000], snap[1000];
    for (int i = 0; i < 1000; i++)
        cur[i] = snap[i] = (uint16_t)(i * 7);
    struct enc e;
    encode(cur, snap, 1000, 2, &e);
    cr_assert_eq(e.len, sizeof(struct delta_hdr));
    cr_assert_eq(((struct delta_hdr *)(void *)e.out)->kind, DELTA_NONE);
    enc_free(&e);
}

Test(delta, every_element_changed_travels_dense_and_refreshes_the_snapshot)
{
    uint32_t cur[300], snap[300];
    for (int i = 0; i < 300; i++)
        cur[i] = (uint32_t)i, snap[i] = (uint32_t)i + 1;
    struct enc e;
    encode(cur, snap, 300, 4, &e);
    cr_assert_eq(e.len, 0);
    cr_assert_eq(memcmp(cur, snap, sizeof(cur)), 0);
    enc_free(&e);
}

Test(delta, one_long_run_travels_as_runs_and_scattered_changes_as_a_bitmap)
{
    enum { N = 4096 };
    static uint16_t cur[N], snap[N];
    for (int i = 0; i < N; i++)
        snap[i] = cur[i] = (uint16_t)i;
    for (int i = 100; i < 400; i++)
        cur[i] ^= 1;
    struct enc e;
    encode(cur, snap, N, 2, &e);
    cr_assert_eq(((struct delta_hdr *)(void *)e.out)->kind, DELTA_RUNS);
    cr_assert_eq(e.len, sizeof(struct delta_hdr) + 8 + 300 * 2);
    enc_free(&e);
    for (int i = 0; i < N; i += 16) /* one in 16: a bitmap (512 B) beats 256 runs (2 KiB) */
        cur[i] ^= 2;
    encode(cur, snap, N, 2, &e);
    cr_assert_eq(((struct delta_hdr *)(void *)e.out)->kind, DELTA_BITMAP);
    cr_assert_eq(e.len, sizeof(struct delta_hdr) + N / 8 + (N / 16) * 2);
    enc_free(&e);
}

/* Random chunks, densities, element sizes, and a strided destination region: after every
 * refit the destination equals the source exactly. */
Test(delta, random_changes_round_trip_exactly_over_strided_destinations)
{
    uint64_t seed = 0x5eed0001;
    for (int round = 0; round < 200; round++) {
        uint64_t s = seed + (uint64_t)round;
        size_t es = (size_t)1 << (next(&s) % 4), rows = 1 + next(&s) % 8, cols = 1 + next(&s) % 300;
        size_t n = rows * cols, pitch = cols + next(&s) % 5;
        char *cur = malloc(n * es), *snap = malloc(n * es), *dst = calloc(rows * pitch, es);
        cr_assert(cur && snap && dst);
        for (size_t i = 0; i < n * es; i++)
            cur[i] = (char)next(&s);
        struct region rg = {.esize = es,
                            .ndim = 2,
                            .shape = {(int64_t)rows, (int64_t)pitch},
                            .len = {(int64_t)rows, (int64_t)cols}};
        memcpy(snap, cur, n * es);
        region_unpack(&rg, dst, cur); /* the first refit, in full */
        for (int refit = 0; refit < 4; refit++) {
            unsigned pct = (unsigned)(next(&s) % 101);
            int in_runs = next(&s) & 1;
            for (size_t i = 0; i < n; i++)
                if (next(&s) % 100 < pct && (!in_runs || (i / 37) % 3 == 0))
                    cur[i * es + next(&s) % es] ^= (char)(1 + next(&s) % 255);
            struct enc e;
            encode(cur, snap, n, es, &e);
            cr_assert_eq(memcmp(cur, snap, n * es), 0, "seed %llu: the snapshot is the chunk",
                         (unsigned long long)s);
            cr_assert(e.len < n * es, "an encoding is shorter than the dense chunk");
            receive(&e, cur, dst, &rg, n, es);
            char *back = malloc(n * es);
            region_pack(&rg, dst, back);
            cr_assert_eq(memcmp(back, cur, n * es), 0, "round %d refit %d (seed %llu)", round,
                         refit, (unsigned long long)(seed + (uint64_t)round));
            free(back);
            enc_free(&e);
        }
        free(cur);
        free(snap);
        free(dst);
    }
}

/* A sparse message for a chunk of 64 x u16 with n_changed elements at 0..n_changed-1. */
static size_t forged(char *msg, uint8_t kind, uint32_t nelem, uint32_t nchanged, uint32_t nruns)
{
    struct delta_hdr h = {.magic = DELTA_MAGIC,
                          .kind = kind,
                          .esize = 2,
                          .nelem = nelem,
                          .nchanged = nchanged,
                          .nruns = nruns};
    memcpy(msg, &h, sizeof(h));
    return sizeof(h);
}

Test(delta, a_bitmap_claiming_more_elements_than_the_chunk_holds_is_refused)
{
    char msg[256] = {0}, why[128];
    size_t at = forged(msg, DELTA_BITMAP, 64, 65, 0);
    memset(msg + at, 0xff, 8);
    cr_assert_eq(delta_check(msg, at + 8 + 65 * 2, 64, 2, why, sizeof(why)),
                 RESHARD_ERR_INVALID_ARG);
    cr_assert(strstr(why, "more changed elements"), "%s", why);
    /* 64 bits set but 3 elements carried */
    at = forged(msg, DELTA_BITMAP, 64, 3, 0);
    cr_assert_eq(delta_check(msg, at + 8 + 3 * 2, 64, 2, why, sizeof(why)),
                 RESHARD_ERR_INVALID_ARG);
    /* a bit past a chunk of 10 elements */
    at = forged(msg, DELTA_BITMAP, 10, 1, 0);
    uint64_t w = 1ULL << 12;
    memcpy(msg + at, &w, 8);
    cr_assert_eq(delta_check(msg, at + 8 + 2, 10, 2, why, sizeof(why)), RESHARD_ERR_INVALID_ARG);
    cr_assert(strstr(why, "past the chunk"), "%s", why);
}

Test(delta, runs_past_the_chunk_or_overlapping_are_refused)
{
    char msg[256] = {0}, why[128];
    uint32_t p[4] = {60, 10, 0, 0};
    size_t at = forged(msg, DELTA_RUNS, 64, 10, 1);
    memcpy(msg + at, p, 8);
    cr_assert_eq(delta_check(msg, at + 8 + 20, 64, 2, why, sizeof(why)), RESHARD_ERR_INVALID_ARG);
    uint32_t q[4] = {0, 4, 2, 4}; /* the second starts inside the first */
    at = forged(msg, DELTA_RUNS, 64, 8, 2);
    memcpy(msg + at, q, 16);
    cr_assert_eq(delta_check(msg, at + 16 + 16, 64, 2, why, sizeof(why)), RESHARD_ERR_INVALID_ARG);
    uint32_t ok[4] = {0, 4, 10, 4};
    memcpy(msg + at, ok, 16);
    cr_assert_eq(delta_check(msg, at + 16 + 16, 64, 2, why, sizeof(why)), RESHARD_OK, "%s", why);
    /* a length that is not the message's */
    cr_assert_eq(delta_check(msg, at + 16 + 15, 64, 2, why, sizeof(why)), RESHARD_ERR_INVALID_ARG);
    (void)flat;
}

/* Large chunks: nearly all changed is sent dense on a sample; changes in runs that align with
 * powers of two (every other 4096 elements) are not mistaken for that. */
Test(delta, half_changed_in_aligned_runs_is_not_taken_for_all_changed)
{
    enum { N = 1 << 21 };
    uint16_t *cur = malloc(N * 2), *snap = malloc(N * 2);
    cr_assert(cur && snap);
    for (size_t i = 0; i < N; i++)
        snap[i] = cur[i] = (uint16_t)i;
    for (size_t i = 0; i < N; i++)
        cur[i] ^= (i / 4096) % 2 == 0;
    struct enc e;
    encode(cur, snap, N, 2, &e);
    cr_assert_eq(((struct delta_hdr *)(void *)e.out)->kind, DELTA_RUNS);
    cr_assert_eq(e.len, sizeof(struct delta_hdr) + (N / 8192) * 8 + (N / 2) * 2);
    enc_free(&e);
    for (size_t i = 0; i < N; i++)
        cur[i] ^= 4;
    encode(cur, snap, N, 2, &e);
    cr_assert_eq(e.len, 0, "every element changed: dense");
    cr_assert_eq(memcmp(cur, snap, N * 2), 0);
    enc_free(&e);
    free(cur);
    free(snap);
}
