/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Checked size arithmetic, for every size, offset, stride or count that came from a spec, a
 * manifest, a wire frame or a caller. Each helper writes a op b to *r and returns 1 when the
 * exact result does not fit the type (then *r holds the wrapped value, which must not be used),
 * 0 when it does: `if (rs_mul_size(n, es, &bytes)) return rs_error(RESHARD_ERR_TOO_LARGE, ...)`.
 * They are C23's ckd_add/ckd_mul, with the output last as the house style wants.
 */
#ifndef RS_CKD_H
#define RS_CKD_H

#include <stddef.h>
#include <stdint.h>

static inline int rs_add_size(size_t a, size_t b, size_t *r)
{
    return __builtin_add_overflow(a, b, r);
}

static inline int rs_mul_size(size_t a, size_t b, size_t *r)
{
    return __builtin_mul_overflow(a, b, r);
}

static inline int rs_add_u64(uint64_t a, uint64_t b, uint64_t *r)
{
    return __builtin_add_overflow(a, b, r);
}

static inline int rs_mul_u64(uint64_t a, uint64_t b, uint64_t *r)
{
    return __builtin_mul_overflow(a, b, r);
}

static inline int rs_add_i64(int64_t a, int64_t b, int64_t *r)
{
    return __builtin_add_overflow(a, b, r);
}

static inline int rs_mul_i64(int64_t a, int64_t b, int64_t *r)
{
    return __builtin_mul_overflow(a, b, r);
}

/* A count or offset held as int64_t, as a size: 1 when it is negative or too large. */
static inline int rs_i64_to_size(int64_t v, size_t *r)
{
    return __builtin_add_overflow(v, 0, r);
}

#endif
