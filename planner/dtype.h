/* SPDX-License-Identifier: Apache-2.0 */
#ifndef RS_DTYPE_H
#define RS_DTYPE_H

#include <stddef.h>

/* X(enum suffix, spec name, size in bytes) */
#define RS_DTYPE_MAP(X)                                                                            \
    X(BF16, "bf16", 2)                                                                             \
    X(F16, "f16", 2)                                                                               \
    X(F32, "f32", 4)                                                                               \
    X(F64, "f64", 8)                                                                               \
    X(FP8E4M3, "fp8e4m3", 1)                                                                       \
    X(FP8E5M2, "fp8e5m2", 1)                                                                       \
    X(I8, "i8", 1)                                                                                 \
    X(U8, "u8", 1)                                                                                 \
    X(I32, "i32", 4)                                                                               \
    X(I64, "i64", 8)

enum rs_dtype {
#define RS_DTYPE_ENUM_(e, name, size) RS_DTYPE_##e,
    RS_DTYPE_MAP(RS_DTYPE_ENUM_)
#undef RS_DTYPE_ENUM_
        RS_DTYPE_COUNT
};

size_t dtype_size(enum rs_dtype t);
const char *dtype_name(enum rs_dtype t);
/* Parses the first len characters of s; returns -1 when they name no dtype. */
int dtype_parse(const char *s, size_t len);
/* "bf16 f16 ..." for error messages. */
const char *dtype_list(void);

#endif
