/* SPDX-License-Identifier: Apache-2.0 */
/*
 * delta_bench: the delta encoding's speed on one core (plugin/exec/delta.c), in GB/s of chunk
 * (the dense bytes compared or rebuilt per second), for bf16 chunks of 4 MiB with a given
 * percentage of their elements changed, spread uniformly or in runs of 4096 elements.
 *   delta_bench [PCT ...]
 */
#include "plugin/exec/delta.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define N    (2u << 20) /* bf16 elements: 4 MiB */
#define REPS 20

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static uint64_t rnd(uint64_t *s)
{
    uint64_t x = (*s += 0x9e3779b97f4a7c15ULL);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static void one(double pct, int runs)
{
    uint16_t *base = malloc(N * 2), *cur = malloc(N * 2), *snap = malloc(N * 2),
             *dst = malloc(N * 2);
    char *out = malloc(N * 2 + 16);
    uint64_t *words = malloc((N / 64 + 1) * 8);
    if (!base || !cur || !snap || !dst || !out || !words)
        exit(1);
    uint64_t s = 42;
    for (size_t i = 0; i < N; i++)
        base[i] = (uint16_t)rnd(&s);
    memcpy(cur, base, N * 2);
    uint64_t cut = pct >= 100 ? UINT64_MAX : (uint64_t)(pct / 100.0 * 18446744073709551616.0);
    for (size_t i = 0; i < N; i++)
        if (rnd(&s) <= cut && (!runs || (i / 4096) % 2 == 0))
            cur[i] ^= 1;
    struct region rg = {.esize = 2, .ndim = 1, .shape = {N}, .len = {N}};
    double enc = 0, dec = 0;
    size_t len = 0;
    for (int r = 0; r < REPS; r++) {
        memcpy(snap, base, N * 2);
        memcpy(dst, base, N * 2);
        double t0 = now();
        delta_encode(cur, snap, N, 2, out, &len, words);
        double t1 = now();
        if (len)
            delta_apply(out, &rg, (char *)dst);
        else
            memcpy(dst, cur, N * 2);
        double t2 = now();
        enc += t1 - t0;
        dec += t2 - t1;
    }
    if (memcmp(dst, cur, N * 2)) {
        fprintf(stderr, "delta_bench: the destination differs\n");
        exit(1);
    }
    const char *kind = !len ? "dense" : "sparse";
    if (len)
        kind = ((struct delta_hdr *)(void *)out)->kind == DELTA_RUNS     ? "runs"
               : ((struct delta_hdr *)(void *)out)->kind == DELTA_BITMAP ? "bitmap"
                                                                         : "none";
    printf("%7.1f%% %-7s %6s %10zu %9.2f %9.2f\n", pct, runs ? "runs" : "uniform", kind,
           len ? len : (size_t)N * 2, (double)N * 2 * REPS / enc / 1e9,
           (double)N * 2 * REPS / dec / 1e9);
    free(base), free(cur), free(snap), free(dst), free(out), free(words);
}

int main(int argc, char **argv)
{
    double def[] = {0, 0.1, 1, 5, 20, 50, 100};
    printf("# changed pattern  sent      bytes  enc GB/s  dec GB/s (one core, 4 MiB bf16 chunk)\n");
    int n = argc > 1 ? argc - 1 : (int)(sizeof(def) / sizeof(def[0]));
    for (int i = 0; i < n; i++)
        for (int runs = 0; runs < 2; runs++)
            one(argc > 1 ? atof(argv[i + 1]) : def[i], runs);
    return 0;
}
