/* SPDX-License-Identifier: Apache-2.0 */
/*
 * pack_bench: the pack and unpack kernels against a device-to-device copy of the same bytes,
 * on 256 MiB boxes with the strides refits have (scripts/gpu-check.sh). For each case: the box
 * out of a row-major shard (rows of a TP column slice), its GB/s packing and unpacking, and
 * the ratio to cuMemcpyDtoD; best of 10 runs each. Also, for the executor's choice between
 * them, the same box gathered by the copy engines (cuMemcpy2DAsync), not gated. Exit 0 when
 * every ratio is at least 0.8 and the packed bytes are right, 77 without a GPU, else 1.
 */
#include "base/error.h"
#include "cuda/cuda_lib.h"
#include "cuda/pack_desc.h"
#include "plugin/exec/region.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

struct bench_case {
    const char *name;
    int64_t rows, cols, box_cols; /* a bf16 shard rows x cols; the box: every row, box_cols */
};

static const struct bench_case cases[] = {
    {"bf16 32768x8192, half the columns (8 KiB rows)", 32768, 8192, 4096},
    {"bf16 65536x4096, 1024 columns (2 KiB rows)", 131072, 4096, 1024},
    {"bf16 16384x32768, a quarter (16 KiB rows)", 16384, 32768, 8192},
};

#define RUNS 10

int main(void)
{
    const struct cuda_fns *f = cuda_lib();
    if (!f) {
        printf("pack_bench: %s\n", rs_error_message());
        return 77;
    }
    cu_device dev;
    cu_ctx ctx;
    if (f->device_get(&dev, 0) || f->primary_ctx_retain(&ctx, dev) || f->ctx_set_current(ctx) ||
        cuda_kernels() != RESHARD_OK) {
        printf("pack_bench: %s\n", rs_error_message());
        return 1;
    }
    int ok = 1;
    printf("%-48s %10s %10s %10s %7s %7s %10s\n", "case (256 MiB box)", "pack GB/s", "unpack",
           "DtoD", "pack%", "unpack%", "2D CE");
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        const struct bench_case *bc = &cases[c];
        struct region r = {.esize = 2,
                           .ndim = 2,
                           .shape = {bc->rows, bc->cols},
                           .start = {0, bc->cols - bc->box_cols},
                           .len = {bc->rows, bc->box_cols}};
        size_t span = (size_t)(bc->rows * bc->cols * 2), bytes = region_bytes(&r);
        cu_deviceptr buf, packed, copy;
        if (f->mem_alloc(&buf, span) || f->mem_alloc(&packed, bytes) ||
            f->mem_alloc(&copy, bytes)) {
            printf("pack_bench: no device memory for %s\n", bc->name);
            return 1;
        }
        char *host = malloc(span), *want = malloc(bytes), *got = malloc(bytes);
        for (size_t i = 0; i < span; i++)
            host[i] = (char)(i * 2654435761u >> 13);
        f->memcpy_htod(buf, host, span);
        struct rs_pack_desc d;
        region_desc(&r, &d);
        double best[4] = {1e30, 1e30, 1e30, 1e30};
        uint64_t pitch = (uint64_t)bc->cols * 2, width = (uint64_t)bc->box_cols * 2;
        cu_memcpy2d m = {.src_type = CU_MEMORYTYPE_DEVICE,
                         .src_device = buf + (uint64_t)(bc->cols - bc->box_cols) * 2,
                         .src_pitch = pitch,
                         .dst_type = CU_MEMORYTYPE_DEVICE,
                         .dst_device = copy,
                         .dst_pitch = width,
                         .width_bytes = width,
                         .height = (size_t)bc->rows};
        for (int run = 0; run < RUNS; run++) {
            double t0 = now_ms();
            cuda_pack(&d, (void *)(uintptr_t)buf, (void *)(uintptr_t)packed, NULL);
            f->ctx_synchronize();
            double t1 = now_ms();
            cuda_unpack(&d, (void *)(uintptr_t)buf, (void *)(uintptr_t)packed, NULL);
            f->ctx_synchronize();
            double t2 = now_ms();
            f->memcpy_dtod(copy, packed, bytes);
            f->ctx_synchronize();
            double t3 = now_ms();
            f->memcpy_2d_async(&m, NULL);
            f->ctx_synchronize();
            double t4 = now_ms();
            best[3] = t4 - t3 < best[3] ? t4 - t3 : best[3];
            best[0] = t1 - t0 < best[0] ? t1 - t0 : best[0];
            best[1] = t2 - t1 < best[1] ? t2 - t1 : best[1];
            best[2] = t3 - t2 < best[2] ? t3 - t2 : best[2];
        }
        region_pack(&r, host, want);
        f->memcpy_dtoh(got, packed, bytes);
        int right = memcmp(got, want, bytes) == 0;
        double gb[4];
        for (int k = 0; k < 4; k++)
            gb[k] = (double)bytes / best[k] / 1e6;
        printf("%-48s %10.1f %10.1f %10.1f %6.0f%% %6.0f%% %10.1f%s\n", bc->name, gb[0], gb[1],
               gb[2], 100 * gb[0] / gb[2], 100 * gb[1] / gb[2], gb[3],
               right ? "" : "  WRONG BYTES");
        ok &= right && gb[0] >= 0.8 * gb[2] && gb[1] >= 0.8 * gb[2];
        f->mem_free(buf), f->mem_free(packed), f->mem_free(copy);
        free(host), free(want), free(got);
    }
    printf("pack_bench: %s\n", ok ? "every case at least 80% of DtoD, bytes right"
                                  : "below 80% of DtoD, or wrong bytes");
    return ok ? 0 : 1;
}
