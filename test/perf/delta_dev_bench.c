/* SPDX-License-Identifier: Apache-2.0 */
/*
 * delta_dev_bench [MiB ...]: the compare-and-compact kernels on the GPU (scripts/gpu-check.sh,
 * step delta-kernel). For a bf16 chunk of each size (default 4, the executor's chunk, and 64),
 * and 0, 1, 5 (uniform and in runs of 256), 30 and 100 % of its elements changed: the encode
 * as the executor runs it per chunk (cuda_delta_encode, then the message's size read back) and
 * the apply of its message (cuda_delta_apply), each in GB/s of chunk bytes (best of 10, the
 * snapshot or destination restored before each run, untimed), beside cuMemcpyDtoD of the chunk;
 * and the message's size against the chunk's. Every message is checked byte for byte against
 * the host codec (delta_encode), every applied chunk against the source. Exit 0 when all are
 * right (speed is reported, not gated), 77 without a driver, else 1. On the stand-in driver
 * (host memory, kernels emulated on the host) the figures mean nothing; the checks still hold.
 */
#include "base/error.h"
#include "cuda/cuda_lib.h"
#include "cuda/delta_desc.h"
#include "plugin/exec/delta.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define RUNS 10

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static uint64_t mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15u;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

struct pattern {
    const char *name;
    unsigned pct, run; /* run: changes come in runs of this many elements (1: uniform) */
};

static const struct pattern patterns[] = {
    {"0%", 0, 1}, {"1%", 1, 1}, {"5%", 5, 1}, {"5%-runs", 5, 256}, {"30%", 30, 1}, {"100%", 100, 1},
};

static void *dp(cu_deviceptr p)
{
    return (void *)(uintptr_t)p;
}

int main(int argc, char **argv)
{
    const struct cuda_fns *f = cuda_lib();
    if (!f) {
        printf("delta_dev_bench: %s\n", rs_error_message());
        return 77;
    }
    if (cuda_current_context() != RESHARD_OK || cuda_kernels() != RESHARD_OK) {
        printf("delta_dev_bench: %s\n", rs_error_message());
        return 1;
    }
    int ok = 1;
    printf("%-9s %-8s %11s %11s %11s %9s %10s\n", "chunk", "changed", "encode GB/s", "apply GB/s",
           "DtoD GB/s", "msg/chunk", "encode us");
    double sizes[16] = {4, 64};
    int nsizes = argc > 1 ? 0 : 2;
    for (int a = 1; a < argc && nsizes < 16; a++)
        sizes[nsizes++] = atof(argv[a]);
    for (int a = 0; a < nsizes; a++) {
        double mib = sizes[a];
        size_t bytes = (size_t)(mib * 1048576) & ~(size_t)1, n = bytes / 2;
        size_t nw = (size_t)rs_delta_nwords((int64_t)n), ncnt = (nw > bytes / 8 ? nw : bytes / 8);
        cu_deviceptr cur, snap, orig, msg, words, cnt, starts, info, copy;
        if (!n || f->mem_alloc(&cur, bytes) || f->mem_alloc(&snap, bytes) ||
            f->mem_alloc(&orig, bytes) || f->mem_alloc(&msg, bytes) ||
            f->mem_alloc(&words, nw * 8) || f->mem_alloc(&cnt, (ncnt + 1) * 4) ||
            f->mem_alloc(&starts, (nw + 1) * 4) || f->mem_alloc(&info, 64) ||
            f->mem_alloc(&copy, bytes)) {
            printf("delta_dev_bench: no device memory for a %.1f MiB chunk\n", mib);
            return 1;
        }
        uint16_t *h_old = malloc(bytes), *h_new = malloc(bytes), *h_snap = malloc(bytes);
        char *h_msg = malloc(bytes), *got = malloc(bytes);
        uint64_t *h_words = calloc(nw + 1, 8);
        for (size_t i = 0; i < n; i++)
            h_old[i] = (uint16_t)mix(i);
        f->memcpy_htod(orig, h_old, bytes);
        for (size_t p = 0; p < sizeof(patterns) / sizeof(patterns[0]); p++) {
            const struct pattern *pt = &patterns[p];
            for (size_t i = 0; i < n; i++)
                h_new[i] = h_old[i] ^ (mix(i / pt->run * 7 + p) % 100 < pt->pct ? 0x40 : 0);
            f->memcpy_htod(cur, h_new, bytes);
            struct rs_delta_desc d = {.n = (int64_t)n,
                                      .nwords = (int64_t)nw,
                                      .esize = 2,
                                      .cur = dp(cur),
                                      .snap = dp(snap),
                                      .msg = dp(msg),
                                      .words = dp(words),
                                      .cnt = dp(cnt),
                                      .starts = dp(starts),
                                      .info = dp(info)};
            double best[3] = {1e30, 1e30, 1e30};
            struct rs_delta_info in = {0};
            int right = 1;
            for (int run = 0; run < RUNS && right; run++) {
                f->memcpy_dtod(snap, orig, bytes);
                f->ctx_synchronize();
                double t0 = now_ms();
                right &= cuda_delta_encode(&d, NULL) == RESHARD_OK;
                right &= f->memcpy_dtoh(&in, info, sizeof(in)) == CU_SUCCESS;
                double t1 = now_ms();
                f->memcpy_dtod(copy, cur, bytes);
                f->ctx_synchronize();
                double t2 = now_ms();
                best[0] = t1 - t0 < best[0] ? t1 - t0 : best[0];
                best[2] = t2 - t1 < best[2] ? t2 - t1 : best[2];
                if (in.kind == RS_DELTA_DENSE || in.kind == RS_DELTA_NONE)
                    continue;
                struct rs_delta_desc ad = d; /* the message applied to the old chunk */
                ad.snap = dp(copy);
                ad.nruns = in.nruns;
                f->memcpy_dtod(copy, orig, bytes);
                f->ctx_synchronize();
                double t3 = now_ms();
                right &= cuda_delta_apply(&ad, (int)in.kind, NULL) == RESHARD_OK;
                right &= f->ctx_synchronize() == CU_SUCCESS;
                double t4 = now_ms();
                best[1] = t4 - t3 < best[1] ? t4 - t3 : best[1];
            }
            /* The host codec's message for the same chunk, and what the device made of it. */
            size_t hlen;
            memcpy(h_snap, h_old, bytes);
            delta_encode(h_new, h_snap, n, 2, h_msg, &hlen, h_words);
            if (right && hlen) {
                right &= in.len == hlen && f->memcpy_dtoh(got, msg, hlen) == CU_SUCCESS &&
                         !memcmp(got, h_msg, hlen);
                right &= f->memcpy_dtoh(got, copy, bytes) == CU_SUCCESS &&
                         (in.kind == RS_DELTA_NONE || !memcmp(got, h_new, bytes));
            } else if (right) { /* the host went dense (perhaps by its sample): so may we */
                right &= in.kind == RS_DELTA_DENSE || in.len * 100 >= bytes * 90;
            }
            right &= f->memcpy_dtoh(got, snap, bytes) == CU_SUCCESS && !memcmp(got, h_new, bytes);
            char apply[16];
            snprintf(apply, sizeof(apply), best[1] < 1e29 ? "%.1f" : "-",
                     (double)bytes / best[1] / 1e6);
            printf("%5.1f MiB %-8s %11.1f %11s %11.1f %8.3fx %10.0f%s\n", mib, pt->name,
                   (double)bytes / best[0] / 1e6, apply, (double)bytes / best[2] / 1e6,
                   in.kind == RS_DELTA_DENSE ? 1.0 : (double)in.len / (double)bytes, best[0] * 1e3,
                   right ? "" : "  WRONG");
            ok &= right;
        }
        f->mem_free(cur), f->mem_free(snap), f->mem_free(orig), f->mem_free(msg);
        f->mem_free(words), f->mem_free(cnt), f->mem_free(starts), f->mem_free(info);
        f->mem_free(copy);
        free(h_old), free(h_new), free(h_snap), free(h_msg), free(got), free(h_words);
    }
    printf("delta_dev_bench: %s\n", ok ? "every message the host codec's, every chunk right"
                                       : "WRONG bytes (see the rows marked)");
    return ok ? 0 : 1;
}
