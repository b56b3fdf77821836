/* SPDX-License-Identifier: Apache-2.0 */
/* The FP8 reference (cuda/quant.h) against brute force: every code decodes and encodes back,
 * random and boundary floats round to the nearest code with ties to even, saturation, NaN and
 * signed zeros, and the half-precision decoders against the compiler's own _Float16. */
#include "cuda/quant.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

static const enum rs_fp8 formats[] = {RS_FP8_E4M3, RS_FP8_E5M2};
static const char *const names[] = {"e4m3", "e5m2"};

static int is_nan_code(uint8_t q, enum rs_fp8 f)
{
    return isnan(rs_fp8_to_f32(q, f));
}

static int is_inf_code(uint8_t q, enum rs_fp8 f)
{
    return isinf(rs_fp8_to_f32(q, f));
}

/* The nearest finite code to x by exhaustive search, ties to the even code, saturating. */
static uint8_t brute(float x, enum rs_fp8 f)
{
    if (isnan(x))
        return (signbit(x) ? 0x80 : 0) | 0x7f;
    float max = f == RS_FP8_E4M3 ? RS_E4M3_MAX : RS_E5M2_MAX;
    if (fabsf(x) >= max)
        return (signbit(x) ? 0x80 : 0) | (f == RS_FP8_E4M3 ? 0x7e : 0x7b);
    int best = -1;
    double bd = 0;
    for (int c = 0; c < 128; c++) { /* magnitudes only: the sign is copied */
        uint8_t q = (uint8_t)c;
        if (is_nan_code(q, f) || is_inf_code(q, f))
            continue;
        double d = fabs((double)rs_fp8_to_f32(q, f) - fabs((double)x));
        if (best < 0 || d < bd || (d == bd && (c & 1) == 0)) {
            best = c;
            bd = d;
        }
    }
    return (uint8_t)((signbit(x) ? 0x80 : 0) | best);
}

Test(quant, every_code_decodes_and_encodes_back)
{
    for (int k = 0; k < 2; k++) {
        enum rs_fp8 f = formats[k];
        for (int c = 0; c < 256; c++) {
            uint8_t q = (uint8_t)c;
            if (is_nan_code(q, f) || is_inf_code(q, f))
                continue;
            float v = rs_fp8_to_f32(q, f);
            cr_assert_eq(rs_f32_to_fp8(v, f), q, "%s code 0x%02x = %g comes back as 0x%02x",
                         names[k], c, v, rs_f32_to_fp8(v, f));
        }
    }
    cr_assert_eq(rs_fp8_to_f32(0x7e, RS_FP8_E4M3), 448.0f);
    cr_assert_eq(rs_fp8_to_f32(0x01, RS_FP8_E4M3), 0x1p-9f, "the smallest e4m3 subnormal");
    cr_assert_eq(rs_fp8_to_f32(0x7b, RS_FP8_E5M2), 57344.0f);
    cr_assert_eq(rs_fp8_to_f32(0x01, RS_FP8_E5M2), 0x1p-16f, "the smallest e5m2 subnormal");
}

Test(quant, floats_round_to_the_nearest_code_ties_to_even)
{
    srand(12345);
    for (int k = 0; k < 2; k++) {
        enum rs_fp8 f = formats[k];
        /* every midpoint between neighbouring codes, and a step either side of it */
        for (int c = 0; c < 127; c++) {
            float a = rs_fp8_to_f32((uint8_t)c, f), b = rs_fp8_to_f32((uint8_t)(c + 1), f);
            if (isnan(b) || isinf(b))
                continue;
            float mid = (a + b) / 2;
            float probes[] = {mid, nextafterf(mid, 0), nextafterf(mid, INFINITY), -mid};
            for (int i = 0; i < 4; i++)
                cr_assert_eq(rs_f32_to_fp8(probes[i], f), brute(probes[i], f),
                             "%s: %a gives 0x%02x, nearest even is 0x%02x", names[k], probes[i],
                             rs_f32_to_fp8(probes[i], f), brute(probes[i], f));
        }
        for (int i = 0; i < 200000; i++) { /* random magnitudes across the whole range */
            float x = ldexpf((float)rand() / (float)RAND_MAX, rand() % 40 - 28);
            if (rand() & 1)
                x = -x;
            cr_assert_eq(rs_f32_to_fp8(x, f), brute(x, f), "%s: %a", names[k], x);
        }
    }
}

Test(quant, saturation_nan_and_signed_zero)
{
    cr_assert_eq(rs_f32_to_fp8(1e9f, RS_FP8_E4M3), 0x7e);
    cr_assert_eq(rs_f32_to_fp8(-INFINITY, RS_FP8_E4M3), 0xfe);
    cr_assert_eq(rs_f32_to_fp8(464.0f, RS_FP8_E4M3), 0x7e, "past 448 saturates, never NaN");
    cr_assert_eq(rs_f32_to_fp8(INFINITY, RS_FP8_E5M2), 0x7b);
    cr_assert(is_nan_code(rs_f32_to_fp8(NAN, RS_FP8_E4M3), RS_FP8_E4M3));
    cr_assert(is_nan_code(rs_f32_to_fp8(-NAN, RS_FP8_E5M2), RS_FP8_E5M2));
    cr_assert_eq(rs_f32_to_fp8(-0.0f, RS_FP8_E4M3), 0x80);
    cr_assert_eq(rs_f32_to_fp8(0x1p-11f, RS_FP8_E4M3), 0x00, "a quarter of the smallest step");
    cr_assert_eq(rs_f32_to_fp8(0x1.8p-10f, RS_FP8_E4M3), 0x01, "three quarters rounds up");
    cr_assert_eq(rs_f32_to_fp8(0x1p-149f, RS_FP8_E5M2), 0x00, "a float subnormal is zero");
}

Test(quant, block_scales)
{
    cr_assert_eq(rs_fp8_scale(0.0f, RS_FP8_E4M3), 1.0f, "a block of zeros takes scale 1");
    cr_assert_eq(rs_fp8_scale(NAN, RS_FP8_E4M3), 1.0f);
    cr_assert_eq(rs_fp8_scale(448.0f, RS_FP8_E4M3), 1.0f);
    cr_assert_eq(rs_fp8_scale(57344.0f * 2, RS_FP8_E5M2), 2.0f);
    float amax = 0;
    float xs[] = {1.5f, -7.25f, NAN, 3.0f};
    for (int i = 0; i < 4; i++)
        amax = rs_amax_step(amax, xs[i]);
    cr_assert_eq(amax, 7.25f, "NaNs are ignored, signs dropped");
}

Test(quant, half_precision_decoders)
{
    for (uint32_t h = 0; h < 65536; h++) {
        _Float16 ref;
        uint16_t bits = (uint16_t)h;
        memcpy(&ref, &bits, sizeof(ref));
        float want = (float)ref, got = rs_f16_to_f32(bits);
        if (isnan(want))
            cr_assert(isnan(got), "f16 0x%04x", h);
        else
            cr_assert_eq(rs_f32_bits(got), rs_f32_bits(want), "f16 0x%04x: %a, want %a", h, got,
                         want);
        float b = rs_bf16_to_f32(bits);
        cr_assert_eq(rs_f32_bits(b), h << 16, "bf16 0x%04x", h);
    }
}
