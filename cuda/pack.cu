// SPDX-License-Identifier: Apache-2.0
// Pack (strided box -> contiguous, box order) and unpack (the reverse) on the device, compiled
// by nvcc into a fatbin for sm_80, sm_90 and sm_100 (plus PTX) that the library embeds and
// loads with cuModuleLoadData. Rows (the box's innermost dim) that are contiguous in the
// buffer move as 16-byte vectors when both ends are 16-byte aligned, else as bytes; a view
// that is not row-major falls back to one element at a time.
#include "delta_desc.h"
#include "pack_desc.h"

#include <stdint.h>

// One row of the box per block-row, grid-stride over rows; threads stride over the row.
template <bool PACK> __device__ void move_rows(const rs_pack_desc d, char *buf, char *packed)
{
    const int64_t row_elems = d.len[d.ndim - 1];
    const int64_t rows = d.numel / row_elems;
    const int64_t row_bytes = row_elems * d.esize;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        char *b = buf + rs_pack_offset(&d, r * row_elems) * d.esize;
        char *p = packed + r * row_bytes;
        char *from = PACK ? b : p, *to = PACK ? p : b;
        if (((uintptr_t)from | (uintptr_t)to | (uintptr_t)row_bytes) % 16 == 0) {
            const int64_t n = row_bytes / 16;
            for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
                reinterpret_cast<uint4 *>(to)[i] = reinterpret_cast<const uint4 *>(from)[i];
        } else {
            for (int64_t i = threadIdx.x; i < row_bytes; i += blockDim.x)
                to[i] = from[i];
        }
    }
}

// Any view: each element found on its own.
template <bool PACK> __device__ void move_elems(const rs_pack_desc d, char *buf, char *packed)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < d.numel; e += stride) {
        char *b = buf + rs_pack_offset(&d, e) * d.esize;
        char *p = packed + e * d.esize;
        for (int k = 0; k < d.esize; k++)
            (PACK ? p : b)[k] = (PACK ? b : p)[k];
    }
}

extern "C" __global__ void rs_pack(const rs_pack_desc d, const char *buf, char *packed, int rows)
{
    if (rows)
        move_rows<true>(d, const_cast<char *>(buf), packed);
    else
        move_elems<true>(d, const_cast<char *>(buf), packed);
}

extern "C" __global__ void rs_unpack(const rs_pack_desc d, char *buf, const char *packed, int rows)
{
    if (rows)
        move_rows<false>(d, buf, const_cast<char *>(packed));
    else
        move_elems<false>(d, buf, const_cast<char *>(packed));
}

// FP8 quantization of a region (pack_desc.h): one thread block per quantization block,
// grid-stride over blocks. The block's amax is folded per thread and then across the threads
// with the same step (a max: any order gives the same value), the scale and every code come
// from quant.h, so the bits are the host's. Launched with RS_QUANT_THREADS threads.

extern "C" __global__ void __launch_bounds__(RS_QUANT_THREADS)
    rs_quant(const rs_quant_desc d, const char *src, uint8_t *dst, float *scales)
{
    __shared__ float part[RS_QUANT_THREADS];
    __shared__ float scale;
    const enum rs_fp8 f = (enum rs_fp8)d.fp8;
    const int64_t nblocks = rs_quant_nblocks(&d);
    for (int64_t k = blockIdx.x; k < nblocks; k += gridDim.x) {
        rs_quant_block q;
        rs_quant_block_of(&d, k, &q);
        const int64_t n = q.nr * q.nc;
        if (d.mode & RS_QUANT_SCALES) {
            float a = 0;
            for (int64_t e = threadIdx.x; e < n; e += blockDim.x)
                a = rs_amax_step(a, rs_quant_load(&d, src, &q, e / q.nc, e % q.nc));
            part[threadIdx.x] = a;
            __syncthreads();
            for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
                if (threadIdx.x < s)
                    part[threadIdx.x] = rs_amax_step(part[threadIdx.x], part[threadIdx.x + s]);
                __syncthreads();
            }
            if (threadIdx.x == 0) {
                scale = rs_fp8_scale(part[0], f);
                scales[q.at] = scale;
            }
        } else if (threadIdx.x == 0) {
            scale = scales[q.at];
        }
        __syncthreads();
        const float s = scale;
        if (d.mode & RS_QUANT_CAST)
            for (int64_t e = threadIdx.x; e < n; e += blockDim.x) {
                const int64_t r = e / q.nc, c = e % q.nc;
                dst[rs_quant_dst(&d, &q, r, c)] =
                    rs_f32_to_fp8(rs_quant_load(&d, src, &q, r, c) / s, f);
            }
        __syncthreads(); // part and scale are the next block's
    }
}

// ---- compare-and-compact (delta_desc.h) ----
//
// The steps of delta_desc.h as kernels, launched in order on one stream. The mask step takes
// one warp per 64-element word, grid-stride: each lane compares two elements (coalesced
// loads), two warp votes make the word. The scan is one block. The rest: a thread per word (or
// run), grid-stride; applying runs takes a warp per run, its lanes over the run's elements.

extern "C" __global__ void rs_delta_mask(const rs_delta_desc d)
{
    const int lane = threadIdx.x % 32;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
    for (int64_t k = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; k < d.nwords;
         k += warps) {
        const unsigned lo = __ballot_sync(0xffffffffu, rs_delta_differs(&d, 64 * k + lane));
        const unsigned hi = __ballot_sync(0xffffffffu, rs_delta_differs(&d, 64 * k + 32 + lane));
        if (lane == 0)
            rs_delta_mask_done(&d, k, (uint64_t)hi << 32 | lo);
    }
}

// Exclusive prefix sums of a[0 .. m) and, when b is not NULL, b[0 .. m), in place, with the
// totals at [m]; then (choose) the encoding. One block of RS_DELTA_SCAN_THREADS threads, each
// summing a contiguous share, the shares' sums scanned in shared memory.
extern "C" __global__ void __launch_bounds__(RS_DELTA_SCAN_THREADS)
    rs_delta_scan(const rs_delta_desc d, uint32_t *a, uint32_t *b, int64_t m, int choose)
{
    __shared__ uint32_t sa[RS_DELTA_SCAN_THREADS], sb[RS_DELTA_SCAN_THREADS];
    const int t = threadIdx.x, nt = blockDim.x;
    const int64_t per = (m + nt - 1) / nt, lo = t * per < m ? t * per : m;
    const int64_t hi = lo + per < m ? lo + per : m;
    uint32_t ta = 0, tb = 0;
    for (int64_t i = lo; i < hi; i++) {
        ta += a[i];
        tb += b ? b[i] : 0;
    }
    sa[t] = ta;
    sb[t] = tb;
    __syncthreads();
    for (int s = 1; s < nt; s <<= 1) { // inclusive scan of the shares (Hillis-Steele)
        const uint32_t xa = t >= s ? sa[t - s] : 0, xb = t >= s ? sb[t - s] : 0;
        __syncthreads();
        sa[t] += xa;
        sb[t] += xb;
        __syncthreads();
    }
    uint32_t ra = sa[t] - ta, rb = sb[t] - tb;
    for (int64_t i = lo; i < hi; i++) {
        const uint32_t va = a[i];
        a[i] = ra;
        ra += va;
        if (b) {
            const uint32_t vb = b[i];
            b[i] = rb;
            rb += vb;
        }
    }
    if (t == nt - 1) {
        a[m] = sa[t];
        if (b)
            b[m] = sb[t];
    }
    if (choose) {
        __syncthreads();
        __threadfence_block();
        if (t == 0)
            rs_delta_choose(&d);
    }
}

extern "C" __global__ void rs_delta_compact(const rs_delta_desc d)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < d.nwords; k += stride)
        rs_delta_compact_word(&d, k);
}

extern "C" __global__ void rs_delta_lengths(const rs_delta_desc d)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x, nr = d.info->nruns;
    for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < nr; r += stride)
        rs_delta_run_length(&d, r);
}

extern "C" __global__ void rs_delta_count(const rs_delta_desc d)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x, n = rs_delta_count_n(&d);
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < n; k += stride)
        rs_delta_count_one(&d, k);
}

extern "C" __global__ void rs_delta_apply(const rs_delta_desc d)
{
    if (rs_delta_kind_of(&d) == RS_DELTA_BITMAP) {
        const int64_t stride = (int64_t)gridDim.x * blockDim.x;
        for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < d.nwords; k += stride)
            rs_delta_apply_word(&d, k);
        return;
    }
    const int lane = threadIdx.x % 32;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
    for (int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; r < d.nruns; r += warps)
        for (int64_t e = lane, len = rs_delta_run_len(&d, r); e < len; e += 32)
            rs_delta_apply_run(&d, r, e);
}
