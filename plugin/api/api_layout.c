/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The public layout API (reshard.h): a tensor's placement parsed from its spec, printed back,
 * described, and asked which shard a rank holds (its shape, its global indices, its bytes),
 * so that callers can fill their buffers.
 */
#include "plugin/reshard.h"

#include "api.h"
#include "base/error.h"
#include "planner/spec.h"
#include "plugin/exec/region.h"

#include <stdlib.h>
#include <string.h>

_Static_assert(RS_MAX_DIMS == sizeof(((reshard_layout_info_t *)0)->shape) / sizeof(int64_t),
               "reshard_layout_info_t.shape must hold RS_MAX_DIMS dims");

reshard_status_t reshard_layout_parse(const char *spec, int world_size, reshard_layout_t **layout)
{
    api_enter();
    if (!spec || !layout)
        return api_null_arg(__func__, spec ? "layout" : "spec");
    struct reshard_layout *h = rs_calloc(1, sizeof(*h), "layout");
    if (!h)
        return api_leave(__func__, RESHARD_ERR_NO_MEMORY);
    struct spec_opts opts = {.world_size = world_size};
    reshard_status_t st = spec_parse(spec, &opts, &h->l);
    if (st != RESHARD_OK) {
        free(h);
        return api_leave(__func__, st);
    }
    *layout = h;
    return RESHARD_OK;
}

size_t reshard_layout_format(const reshard_layout_t *layout, char *buf, size_t size)
{
    if (!layout) {
        if (buf && size)
            buf[0] = '\0';
        return 0;
    }
    return spec_format(&layout->l, buf, size);
}

reshard_status_t reshard_layout_info(const reshard_layout_t *layout, reshard_layout_info_t *info)
{
    api_enter();
    if (!layout || !info)
        return api_null_arg(__func__, layout ? "info" : "layout");
    const struct rs_layout *l = &layout->l;
    reshard_layout_info_t out = {
        .ndim = l->ndim, .elem_size = dtype_size(l->dtype), .nranks = l->nranks, .max_rank = -1};
    memcpy(out.shape, l->shape, (size_t)l->ndim * sizeof(int64_t));
    for (int i = 0; i < l->nranks; i++)
        if (l->ranks[i] > out.max_rank)
            out.max_rank = l->ranks[i];
    *info = out;
    return RESHARD_OK;
}

void reshard_layout_destroy(reshard_layout_t *layout)
{
    if (!layout)
        return;
    layout_free(&layout->l);
    free(layout);
}

/* ---- shards ---- */

static reshard_status_t shard_of(const reshard_layout_t *layout, int rank, struct rs_shardmap *m,
                                 int *pos)
{
    RS_CHECK(shardmap_build(&layout->l, m, NULL));
    *pos = shardmap_position(m, rank);
    return RESHARD_OK;
}

reshard_status_t reshard_layout_shard_shape(const reshard_layout_t *layout, int rank,
                                            int64_t shape[8], int64_t *numel)
{
    api_enter();
    if (!layout || !shape)
        return api_null_arg(__func__, layout ? "shape" : "layout");
    struct rs_shardmap m;
    int pos;
    reshard_status_t st = shard_of(layout, rank, &m, &pos);
    if (st != RESHARD_OK)
        return api_leave(__func__, st);
    int64_t n = pos >= 0;
    for (int j = 0; j < 8; j++) {
        shape[j] = 0;
        if (j < layout->l.ndim && pos >= 0)
            shape[j] = dimmap_group_len(&m.dim[j], shardmap_group(&m, pos, j));
        n *= j < layout->l.ndim ? shape[j] : 1;
    }
    if (numel)
        *numel = n;
    shardmap_free(&m);
    return RESHARD_OK;
}

reshard_status_t reshard_layout_shard_index(const reshard_layout_t *layout, int rank, int dim,
                                            int64_t *global)
{
    api_enter();
    if (!layout || !global)
        return api_null_arg(__func__, layout ? "global" : "layout");
    if (dim < 0 || dim >= layout->l.ndim)
        return api_leave(__func__, rs_error(RESHARD_ERR_INVALID_ARG, "%s: dim %d of a %d-D tensor",
                                            __func__, dim, layout->l.ndim));
    struct rs_shardmap m;
    int pos;
    reshard_status_t st = shard_of(layout, rank, &m, &pos);
    if (st != RESHARD_OK)
        return api_leave(__func__, st);
    if (pos >= 0) {
        const struct rs_dimmap *d = &m.dim[dim];
        int g = shardmap_group(&m, pos, dim);
        for (int s = d->first[g]; s < d->first[g + 1]; s++)
            for (int64_t i = 0; i < d->segs[s].len; i++)
                global[d->segs[s].pos + i] = d->segs[s].start + i;
    }
    shardmap_free(&m);
    return RESHARD_OK;
}

reshard_status_t reshard_layout_shard_bytes(const reshard_layout_t *layout, int rank, size_t *bytes)
{
    int64_t shape[8], numel;
    reshard_status_t st = reshard_layout_shard_shape(layout, rank, shape, &numel);
    if (st != RESHARD_OK)
        return st;
    if (!bytes)
        return api_null_arg(__func__, "bytes");
    *bytes = numel ? (size_t)region_span_bytes(&layout->l, shape) : 0;
    return RESHARD_OK;
}
