/* SPDX-License-Identifier: Apache-2.0 */
#include "side.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

reshard_layout_t *parse(const char *spec)
{
    reshard_layout_t *l = NULL;
    reshard_status_t st = reshard_layout_parse(spec, 0, &l);
    if (st != RESHARD_OK) {
        fprintf(stderr, "%s: %s\n", spec, reshard_last_error());
        abort();
    }
    return l;
}

/* Every element is its global index (int32); destinations are checked element by element. */
static int64_t shard_numel(const reshard_layout_t *l, int rank, int64_t *shape)
{
    int64_t numel = 0;
    reshard_layout_shard_shape(l, rank, shape, &numel);
    return numel;
}

void fill(const reshard_layout_t *l, int rank, int32_t *buf)
{
    int64_t shape[8], n = shard_numel(l, rank, shape);
    if (!n)
        return;
    int64_t *rows = calloc((size_t)shape[0], sizeof(int64_t));
    int64_t *cols = calloc((size_t)shape[1], sizeof(int64_t));
    reshard_layout_shard_index(l, rank, 0, rows);
    reshard_layout_shard_index(l, rank, 1, cols);
    reshard_layout_info_t info;
    reshard_layout_info(l, &info);
    for (int64_t i = 0; i < shape[0]; i++)
        for (int64_t j = 0; j < shape[1]; j++)
            buf[i * shape[1] + j] = (int32_t)(rows[i] * info.shape[1] + cols[j]);
    free(rows);
    free(cols);
}

int count_wrong(const reshard_layout_t *l, int rank, const int32_t *buf)
{
    int64_t shape[8], n = shard_numel(l, rank, shape);
    if (!n)
        return 0;
    int32_t *want = calloc((size_t)n, sizeof(int32_t));
    fill(l, rank, want);
    int wrong = 0;
    for (int64_t i = 0; i < n; i++)
        wrong += buf[i] != want[i];
    free(want);
    return wrong;
}

reshard_status_t side_open(struct side *x, reshard_comm_t *comm, int rank, const char *src,
                           const char *dst)
{
    memset(x, 0, sizeof(*x));
    x->src = parse(src);
    x->dst = parse(dst);
    reshard_tensor_t t = {"w", x->src, x->dst};
    reshard_layout_shard_bytes(x->src, rank, &x->b.src_bytes);
    reshard_layout_shard_bytes(x->dst, rank, &x->b.dst_bytes);
    x->s = calloc(1, x->b.src_bytes + 1);
    x->d = calloc(1, x->b.dst_bytes + 1);
    fill(x->src, rank, x->s);
    x->b.src = x->b.src_bytes ? x->s : NULL;
    x->b.dst = x->b.dst_bytes ? x->d : NULL;
    return reshard_comm_plan_create(comm, &t, 1, NULL, &x->plan);
}

void side_close(struct side *x)
{
    reshard_plan_destroy(x->plan);
    free(x->s);
    free(x->d);
    reshard_layout_destroy(x->src);
    reshard_layout_destroy(x->dst);
}

void shard_values(const reshard_layout_t *l, int rank, char *buf, int put,
                  uint64_t (*value)(int64_t global, const void *arg), const void *arg, int *wrong)
{
    reshard_layout_info_t info;
    int64_t shape[8], numel;
    reshard_layout_info(l, &info);
    reshard_layout_shard_shape(l, rank, shape, &numel);
    if (!numel)
        return;
    int64_t *index[8];
    for (int d = 0; d < info.ndim; d++) {
        index[d] = malloc((size_t)shape[d] * sizeof(int64_t));
        reshard_layout_shard_index(l, rank, d, index[d]);
    }
    int64_t at[8] = {0};
    for (int64_t i = 0; i < numel; i++) {
        int64_t global = 0;
        for (int d = 0; d < info.ndim; d++)
            global = global * info.shape[d] + index[d][at[d]];
        uint64_t v = value(global, arg), got = 0;
        char *p = buf + (size_t)i * info.elem_size;
        if (put) {
            memcpy(p, &v, info.elem_size); /* the low bytes on this little-endian machine */
        } else {
            memcpy(&got, p, info.elem_size);
            if (info.elem_size < 8)
                v &= (UINT64_C(1) << (8 * info.elem_size)) - 1;
            *wrong += got != v;
        }
        for (int d = info.ndim - 1; d >= 0 && ++at[d] == shape[d]; d--)
            at[d] = 0;
    }
    for (int d = 0; d < info.ndim; d++)
        free(index[d]);
}
