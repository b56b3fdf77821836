/* SPDX-License-Identifier: Apache-2.0 */
#include "dtype.h"

#include <string.h>

static const struct {
    const char *name;
    size_t size;
} dtypes[RS_DTYPE_COUNT] = {
#define RS_DTYPE_ROW_(e, n, s) [RS_DTYPE_##e] = {n, s},
    RS_DTYPE_MAP(RS_DTYPE_ROW_)
#undef RS_DTYPE_ROW_
};

size_t dtype_size(enum rs_dtype t)
{
    return (unsigned)t < RS_DTYPE_COUNT ? dtypes[t].size : 0;
}

const char *dtype_name(enum rs_dtype t)
{
    return (unsigned)t < RS_DTYPE_COUNT ? dtypes[t].name : "?";
}

int dtype_parse(const char *s, size_t len)
{
    for (int t = 0; t < RS_DTYPE_COUNT; t++)
        if (strlen(dtypes[t].name) == len && memcmp(dtypes[t].name, s, len) == 0)
            return t;
    return -1;
}

const char *dtype_list(void)
{
    /* " bf16 f16 ..." generated from the map; skip the leading space */
    static const char all[] =
#define RS_DTYPE_WORD_(e, n, s) " " n
        RS_DTYPE_MAP(RS_DTYPE_WORD_)
#undef RS_DTYPE_WORD_
        ;
    return all + 1;
}
