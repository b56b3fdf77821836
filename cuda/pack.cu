// SPDX-License-Identifier: Apache-2.0
// Pack (strided box -> contiguous, box order) and unpack (the reverse) on the device, compiled
// by nvcc into a fatbin for sm_80, sm_90 and sm_100 (plus PTX) that the library embeds and
// loads with cuModuleLoadData. Rows (the box's innermost dim) that are contiguous in the
// buffer move as 16-byte vectors when both ends are 16-byte aligned, else as bytes; a view
// that is not row-major falls back to one element at a time.
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
