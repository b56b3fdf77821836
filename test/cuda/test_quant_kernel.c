/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The FP8 quantization kernel (cuda_quant, pack.cu) against the host reference: every code and
 * every scale bit for bit, for bf16/f16/f32 sources into e4m3 and e5m2, over a batched region
 * with strided rows whose last blocks are partial, with a NaN, a block of (signed) zeros, an
 * infinity and codes that saturate. The reference here walks the whole matrix by global index
 * with cuda/quant.h; the kernel walks blocks through pack_desc.h. On the stand-in libcuda the
 * kernel's emulation runs (the launch counter says it did); with a GPU the kernel itself.
 */
#include "base/error.h"
#include "cuda/cuda_lib.h"
#include "cuda/pack_desc.h"
#include "cuda/quant.h"

#include <criterion/criterion.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A batch x rows x cols source, rows ld elements apart, in blocks of R x C. */
#define B   2
#define H   300 /* 2 blocks of 128 and a partial one of 44 */
#define W   200 /* 1 block of 128 and a partial one of 72 */
#define LD  211
#define R   128
#define C   128
#define NBR ((H + R - 1) / R)
#define NBC ((W + C - 1) / C)
/* The FP8 codes' and the scales' own strides, wider than needed: what lies between stays. */
#define DLD (W + 5)
#define SLD (NBC + 1)

static const char *const type_names[] = {"f32", "bf16", "f16"};
static const char *const fp8_names[] = {"e4m3", "e5m2"};

static void fake_driver(void)
{
    char path[512];
    const char *b = getenv("RESHARD_BUILD");
    snprintf(path, sizeof(path), "%s/test/fake/libcuda.so.1", b && *b ? b : "build");
    setenv("RESHARD_CUDA_LIB", path, 1);
}

static int fake_quant_launches(void)
{
    void *h = dlopen(getenv("RESHARD_CUDA_LIB"), RTLD_NOW | RTLD_NOLOAD);
    int (*f)(void) = h ? (int (*)(void))dlsym(h, "fake_cuda_quant_launches") : NULL;
    return f ? f() : -1;
}

static uint16_t f32_to_bf16(float x) /* truncation: any bf16 will do as an input */
{
    return (uint16_t)(rs_f32_bits(x) >> 16);
}

static uint16_t f32_to_f16(float x)
{
    _Float16 h = (_Float16)x;
    uint16_t u;
    memcpy(&u, &h, sizeof(u));
    return u;
}

/* The source, as float (what the reference reads) and in its type (what the kernel reads). */
static float *make_source(enum rs_qsrc t, void **typed, size_t *bytes)
{
    size_t n = (size_t)B * H * LD, es = t == RS_QSRC_F32 ? 4 : 2;
    float *x = calloc(n, sizeof(float));
    char *out = calloc(n, es);
    unsigned s = 12345;
    for (size_t i = 0; i < n; i++) {
        s = s * 1103515245u + 12345u;
        float m = (float)((s >> 8) & 0xffff) / 65536.0f - 0.5f;
        x[i] = ldexpf(m, (int)((s >> 4) % 13) - 6); /* magnitudes over 2^-7 .. 2^6 */
    }
    /* batch 0: block (0, 1) all zeros, half of them negative; a NaN in block (1, 0); batch 1:
     * an infinity in block (2, 1), the partial corner */
    for (int r = 0; r < R; r++)
        for (int c = C; c < W; c++)
            x[(size_t)r * LD + c] = (r + c) % 2 ? -0.0f : 0.0f;
    x[(size_t)(R + 5) * LD + 7] = NAN;
    x[(size_t)H * LD + (size_t)(2 * R + 3) * LD + C + 1] = INFINITY;
    for (size_t i = 0; i < n; i++) {
        uint16_t h = t == RS_QSRC_BF16 ? f32_to_bf16(x[i]) : f32_to_f16(x[i]);
        if (t == RS_QSRC_F32)
            memcpy(out + i * 4, &x[i], 4);
        else
            memcpy(out + i * 2, &h, 2);
        if (t != RS_QSRC_F32) /* the reference reads what the kernel reads */
            x[i] = t == RS_QSRC_BF16 ? rs_bf16_to_f32(h) : rs_f16_to_f32(h);
    }
    *typed = out;
    *bytes = n * es;
    return x;
}

/* The reference: each block's scale (from its elements, unless given) and each code. */
static void reference(const float *x, enum rs_fp8 f, const float *given, float *scales,
                      uint8_t *codes)
{
    float amax[B][NBR][NBC] = {{{0}}};
    for (int b = 0; b < B; b++)
        for (int r = 0; r < H; r++)
            for (int c = 0; c < W; c++)
                amax[b][r / R][c / C] =
                    rs_amax_step(amax[b][r / R][c / C], x[((size_t)b * H + r) * LD + c]);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < NBR; i++)
            for (int j = 0; j < NBC; j++) {
                size_t k = ((size_t)b * NBR + i) * SLD + j;
                scales[k] = given ? given[k] : rs_fp8_scale(amax[b][i][j], f);
            }
    for (int b = 0; b < B; b++)
        for (int r = 0; r < H; r++)
            for (int c = 0; c < W; c++)
                codes[((size_t)b * H + r) * DLD + c] =
                    rs_f32_to_fp8(x[((size_t)b * H + r) * LD + c] /
                                      scales[((size_t)b * NBR + r / R) * SLD + c / C],
                                  f);
}

static struct rs_quant_desc desc_of(enum rs_qsrc t, enum rs_fp8 f, int mode)
{
    return (struct rs_quant_desc){.src_type = t,
                                  .fp8 = f,
                                  .mode = mode,
                                  .batch = B,
                                  .rows = H,
                                  .cols = W,
                                  .brows = R,
                                  .bcols = C,
                                  .src_ld = LD,
                                  .src_bs = (int64_t)H * LD,
                                  .dst_ld = DLD,
                                  .dst_bs = (int64_t)H * DLD,
                                  .sc_ld = SLD,
                                  .sc_bs = (int64_t)NBR * SLD};
}

#define NCODES  ((size_t)B * H * DLD)
#define NSCALES ((size_t)B * NBR * SLD)

/* One case on the driver: returns how many codes saturated (so a caller can insist on some). */
static int check_case(const struct cuda_fns *fn, enum rs_qsrc t, enum rs_fp8 f, int cast_only)
{
    void *typed;
    size_t bytes;
    float *x = make_source(t, &typed, &bytes);
    float *given = NULL, *want_s = calloc(NSCALES, sizeof(float));
    float *got_s = malloc(NSCALES * sizeof(float));
    uint8_t *want_q = malloc(NCODES), *got_q = malloc(NCODES);
    memset(want_q, 0xa5, NCODES); /* the gaps between rows: untouched by both */
    for (size_t i = 0; i < NSCALES; i++)
        want_s[i] = -2.0f; /* the gaps between scale rows */
    if (cast_only) {       /* scales a 16th of what the blocks need: codes saturate */
        reference(x, f, NULL, want_s, want_q);
        given = malloc(NSCALES * sizeof(float));
        for (size_t i = 0; i < NSCALES; i++)
            given[i] = (i % SLD) < NBC ? want_s[i] / 16 : -2.0f;
        memcpy(want_s, given, NSCALES * sizeof(float));
    }
    reference(x, f, given, want_s, want_q);
    cu_deviceptr src, dst, sc;
    cr_assert_eq(fn->mem_alloc(&src, bytes), CU_SUCCESS);
    cr_assert_eq(fn->mem_alloc(&dst, NCODES), CU_SUCCESS);
    cr_assert_eq(fn->mem_alloc(&sc, NSCALES * sizeof(float)), CU_SUCCESS);
    cr_assert_eq(fn->memcpy_htod(src, typed, bytes), CU_SUCCESS);
    memset(got_q, 0xa5, NCODES);
    cr_assert_eq(fn->memcpy_htod(dst, got_q, NCODES), CU_SUCCESS);
    for (size_t i = 0; i < NSCALES; i++)
        got_s[i] = given ? given[i] : -2.0f;
    cr_assert_eq(fn->memcpy_htod(sc, got_s, NSCALES * sizeof(float)), CU_SUCCESS);
    struct rs_quant_desc d =
        desc_of(t, f, cast_only ? RS_QUANT_CAST : RS_QUANT_SCALES | RS_QUANT_CAST);
    cr_assert_eq(cuda_quant(&d, (void *)(uintptr_t)src, (void *)(uintptr_t)dst,
                            (float *)(uintptr_t)sc, NULL),
                 RESHARD_OK, "%s", rs_error_message());
    cr_assert_eq(fn->ctx_synchronize(), CU_SUCCESS);
    cr_assert_eq(fn->memcpy_dtoh(got_q, dst, NCODES), CU_SUCCESS);
    cr_assert_eq(fn->memcpy_dtoh(got_s, sc, NSCALES * sizeof(float)), CU_SUCCESS);
    for (size_t i = 0; i < NSCALES; i++)
        cr_assert_eq(rs_f32_bits(got_s[i]), rs_f32_bits(want_s[i]),
                     "%s -> %s%s: scale %zu is %a, the reference %a", type_names[t], fp8_names[f],
                     cast_only ? " (cast only)" : "", i, got_s[i], want_s[i]);
    int saturated = 0;
    uint8_t top = f == RS_FP8_E4M3 ? 0x7e : 0x7b;
    for (size_t i = 0; i < NCODES; i++) {
        cr_assert_eq(got_q[i], want_q[i],
                     "%s -> %s%s: code at batch %zu row %zu col %zu is 0x%02x, the reference "
                     "0x%02x",
                     type_names[t], fp8_names[f], cast_only ? " (cast only)" : "",
                     i / ((size_t)H * DLD), i / DLD % H, i % DLD, got_q[i], want_q[i]);
        saturated += (i % DLD) < W && (got_q[i] & 0x7f) == top;
    }
    fn->mem_free(src), fn->mem_free(dst), fn->mem_free(sc);
    free(x), free(typed), free(given), free(want_s), free(got_s), free(want_q), free(got_q);
    return saturated;
}

static void check_all(const struct cuda_fns *fn)
{
    for (int t = RS_QSRC_F32; t <= RS_QSRC_F16; t++)
        for (int f = RS_FP8_E4M3; f <= RS_FP8_E5M2; f++) {
            check_case(fn, (enum rs_qsrc)t, (enum rs_fp8)f, 0);
            int sat = check_case(fn, (enum rs_qsrc)t, (enum rs_fp8)f, 1);
            cr_assert_gt(sat, 1000, "%s -> %s with small scales: only %d codes saturated",
                         type_names[t], fp8_names[f], sat);
        }
}

/* The reference's special blocks are what the test says they are. */
Test(quant_kernel, the_reference_blocks_hold_zeros_nan_and_infinity)
{
    void *typed;
    size_t bytes;
    float *x = make_source(RS_QSRC_BF16, &typed, &bytes);
    float *s = calloc(NSCALES, sizeof(float));
    uint8_t *q = malloc(NCODES);
    reference(x, RS_FP8_E4M3, NULL, s, q);
    cr_assert_eq(s[1], 1.0f, "the zero block's scale is %a", s[1]);
    cr_assert_eq(q[7 + (size_t)(R + 5) * DLD], 0x7f, "the NaN's code");
    cr_assert(isinf(s[(size_t)(NBR + 2) * SLD + 1]), "the infinity's block scale");
    cr_assert(s[SLD] > 0 && isfinite(s[SLD]), "block (1, 0) keeps a finite scale: %a", s[SLD]);
    free(x), free(typed), free(s), free(q);
}

Test(quant_kernel, the_stand_in_gives_the_host_reference_bit_for_bit)
{
    fake_driver();
    const struct cuda_fns *fn = cuda_lib();
    cr_assert_not_null(fn, "%s", rs_error_message());
    cr_assert_eq(cuda_current_context(), RESHARD_OK, "%s", rs_error_message());
    if (cuda_kernels() != RESHARD_OK)
        cr_skip_test("%s", rs_error_message()); /* a build without nvcc */
    check_all(fn);
    cr_assert_eq(fake_quant_launches(), 12, "the kernel ran %d times", fake_quant_launches());
}

Test(quant_kernel, a_descriptor_no_kernel_can_run_is_refused)
{
    fake_driver();
    struct rs_quant_desc d = desc_of(RS_QSRC_BF16, RS_FP8_E4M3, RS_QUANT_CAST);
    d.bcols = 0;
    cr_assert_eq(cuda_quant(&d, NULL, NULL, NULL, NULL), RESHARD_ERR_INVALID_ARG);
    cr_assert(strstr(rs_error_message(), "FP8 quantization of a 2x300x200 region in 128x0 blocks"),
              "%s", rs_error_message());
    d = desc_of(RS_QSRC_BF16, 7, RS_QUANT_CAST);
    cr_assert_eq(cuda_quant(&d, NULL, NULL, NULL, NULL), RESHARD_ERR_INVALID_ARG);
    cr_assert(strstr(rs_error_message(), "format 7"), "%s", rs_error_message());
    cr_assert_eq(fake_quant_launches(), -1, "nothing was loaded, nothing launched");
}

Test(gpu, quant_kernel_gives_the_host_reference_bit_for_bit)
{
    const struct cuda_fns *fn = cuda_lib();
    if (!fn)
        cr_skip_test("no CUDA device (%s)", rs_error_message());
    cr_assert_eq(cuda_current_context(), RESHARD_OK, "%s", rs_error_message());
    size_t fatbin = 0;
    if (!cuda_fatbin(&fatbin))
        cr_skip_test("this build had no nvcc: no quantization kernels");
    cr_assert_eq(cuda_kernels(), RESHARD_OK, "%s", rs_error_message());
    check_all(fn);
}
