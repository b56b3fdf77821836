/* SPDX-License-Identifier: Apache-2.0 */
/*
 * FP8 quantization, defined bit for bit, one reference for the host (C) and the device (pack.cu
 * includes it): the element conversions bf16/f16/f32 -> f32 -> e4m3 or e5m2, and a block's scale.
 *
 *   amax  = the largest |x| of the block in float32 (NaNs ignored, as fmaxf does)
 *   scale = amax / 448 (e4m3) or amax / 57344 (e5m2); a block of zeros takes scale 1
 *   q     = x / scale in float32, rounded to nearest even in the FP8 format, saturating at
 *           +-448 (e4m3, OCP E4M3FN: no infinities) or +-57344 (e5m2); NaN stays NaN
 *
 * The scale is the dequantization multiplier (x ~= q * scale), as vLLM's weight_scale_inv
 * holds it.
 */
#ifndef RS_QUANT_H
#define RS_QUANT_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define RS_QHD __host__ __device__ __forceinline__
#else
#define RS_QHD static inline
#endif

enum rs_fp8 { RS_FP8_E4M3, RS_FP8_E5M2 };

#define RS_E4M3_MAX 448.0f
#define RS_E5M2_MAX 57344.0f

RS_QHD uint32_t rs_f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof(u));
    return u;
}

RS_QHD float rs_bits_f32(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof(x));
    return x;
}

RS_QHD float rs_bf16_to_f32(uint16_t h)
{
    return rs_bits_f32((uint32_t)h << 16);
}

RS_QHD float rs_f16_to_f32(uint16_t h)
{
    uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0x1f) /* inf, NaN */
        return rs_bits_f32(s | 0x7f800000 | m << 13);
    if (e == 0) { /* zero, subnormal: m * 2^-24, exact in float */
        float v = (float)m * 0x1p-24f;
        return rs_bits_f32(s | rs_f32_bits(v));
    }
    return rs_bits_f32(s | (e + 112) << 23 | m << 13);
}

/* |x| rounded to nearest even on a grid of `mbits` mantissa bits, exponent bias `bias`,
 * below the format's saturation; returns the code without the sign. */
RS_QHD uint32_t rs_fp8_round(uint32_t ua, int mbits, int bias)
{
    int e = (int)(ua >> 23) - 127 + bias; /* the FP8 biased exponent of a normal result */
    uint32_t mant = ua & 0x7fffff;
    if (e <= 0) {                       /* a subnormal result: the grid is 2^(1 - bias - mbits) */
        int shift = 23 - mbits + 1 - e; /* bits dropped from the 24-bit significand */
        uint32_t sig = mant | (ua >> 23 ? 1u << 23 : 0); /* the implicit bit, when normal in f32 */
        if (shift > 24)
            return 0;
        uint32_t keep = sig >> shift, rest = sig & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rest > half || (rest == half && (keep & 1)))
            keep++;
        return keep; /* keep == 1 << mbits is the smallest normal: the encoding carries over */
    }
    int drop = 23 - mbits;
    uint32_t keep = mant >> drop, rest = mant & ((1u << drop) - 1), half = 1u << (drop - 1);
    uint32_t code = (uint32_t)e << mbits | keep;
    if (rest > half || (rest == half && (keep & 1)))
        code++; /* a carry out of the mantissa moves to the next exponent, as it should */
    return code;
}

/* float32 -> FP8, round to nearest even, saturating; NaN stays NaN. */
RS_QHD uint8_t rs_f32_to_fp8(float x, enum rs_fp8 f)
{
    uint32_t u = rs_f32_bits(x), s = (u >> 24) & 0x80, ua = u & 0x7fffffff;
    if (f == RS_FP8_E4M3) {
        if (ua > 0x7f800000)
            return (uint8_t)(s | 0x7f);
        if (ua >= rs_f32_bits(RS_E4M3_MAX))
            return (uint8_t)(s | 0x7e);
        uint32_t c = rs_fp8_round(ua, 3, 7);
        return (uint8_t)(s | (c > 0x7e ? 0x7e : c));
    }
    if (ua > 0x7f800000)
        return (uint8_t)(s | 0x7f);
    if (ua >= rs_f32_bits(RS_E5M2_MAX))
        return (uint8_t)(s | 0x7b);
    uint32_t c = rs_fp8_round(ua, 2, 15);
    return (uint8_t)(s | (c > 0x7b ? 0x7b : c));
}

/* FP8 -> float32 (exact). */
RS_QHD float rs_fp8_to_f32(uint8_t q, enum rs_fp8 f)
{
    int mbits = f == RS_FP8_E4M3 ? 3 : 2, bias = f == RS_FP8_E4M3 ? 7 : 15;
    uint32_t s = (uint32_t)(q & 0x80) << 24, e = (q & 0x7f) >> mbits, m = q & ((1u << mbits) - 1);
    if (f == RS_FP8_E4M3 && (q & 0x7f) == 0x7f)
        return rs_bits_f32(s | 0x7fc00000);
    if (f == RS_FP8_E5M2 && e == 0x1f)
        return rs_bits_f32(s | 0x7f800000 | (m ? 0x400000 : 0));
    if (e == 0) {
        float v = (float)m * rs_bits_f32((uint32_t)(127 + 1 - bias - mbits) << 23);
        return rs_bits_f32(s | rs_f32_bits(v));
    }
    return rs_bits_f32(s | (e + 127 - (uint32_t)bias) << 23 | m << (23 - mbits));
}

/* The scale of a block whose largest |x| is amax. */
RS_QHD float rs_fp8_scale(float amax, enum rs_fp8 f)
{
    if (!(amax > 0)) /* zeros (and a block of NaNs, whose amax is NaN) */
        return 1.0f;
    return amax / (f == RS_FP8_E4M3 ? RS_E4M3_MAX : RS_E5M2_MAX);
}

/* amax of a block, folded one element at a time (fmaxf ignores NaN). */
RS_QHD float rs_amax_step(float amax, float x)
{
    float a = x < 0 ? -x : x;
    return a > amax ? a : amax; /* NaN compares false: ignored */
}

#endif
