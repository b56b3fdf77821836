/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target: the bytes a shard's view spans (issue 27), with extreme offsets, strides
 * and view shapes. The input is decoded into a layout (1 to 8 dims, a 1-D mesh of 1 to 4 ranks
 * sharding one dim or replicating, an offset, a view shape, strides), each number drawn near
 * a power of two, near INT64_MAX / k, small or raw. The oracle works in 128-bit arithmetic:
 * - a layout the checks accept has, on every rank, layout_span_bytes and region_span_bytes
 *   equal to the exact span (one past the farthest byte), which fits an int64_t, and the
 *   region walk of the whole shard reaches exactly that far and never past it;
 * - a layout refused with RESHARD_ERR_TOO_LARGE for its view (offset, strides or view) has a
 *   rank whose exact span does not fit an int64_t;
 * - its spec string (spec_format) parses to the same verdict.
 */
#include "planner/layout.h"
#include "planner/spec.h"
#include "plugin/exec/region.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned __int128 u128;

#define CAP      ((u128)1 << 100) /* far past 2^63: a saturated exact value */
#define MAX_WALK 4096             /* elements a shard may have for its region walk */

struct input {
    const uint8_t *p;
    size_t n;
};

static uint8_t byte(struct input *in)
{
    if (!in->n)
        return 0;
    in->n--;
    return *in->p++;
}

static uint64_t raw64(struct input *in)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | byte(in);
    return v;
}

/* A number near the places where 64-bit arithmetic breaks. */
static int64_t extreme(struct input *in)
{
    uint8_t mode = byte(in), k = byte(in);
    switch (mode % 8) {
    case 0:
    case 1:
        return k; /* small */
    case 2:
        return INT64_C(1) << (k % 63);
    case 3:
        return (INT64_C(1) << (k % 63)) - byte(in);
    case 4:
        return INT64_MAX / (k ? k : 1) - byte(in);
    case 5:
        return INT64_MAX - k;
    case 6:
        return (int64_t)raw64(in);
    default:
        return k % 2 ? -(int64_t)k : 1 + k % 16;
    }
}

static u128 sat_mul(u128 a, u128 b)
{
    if (a && b > CAP / a)
        return CAP;
    return a * b;
}

static u128 sat_add(u128 a, u128 b)
{
    return a + b > CAP ? CAP : a + b;
}

/* torch.chunk's piece c of n cut in m (in 128 bits: n may be a shape the checks refuse). */
static int64_t chunk_len(int64_t n, int64_t m, int64_t c)
{
    __int128 size = n / m + (n % m != 0), a = c * size, b = (c + 1) * size;
    a = a < n ? a : n;
    b = b < n ? b : n;
    return (int64_t)(b - a);
}

/* The exact span in bytes of the view over a local shard shape (CAP when far past 2^63);
 * 0 for an empty shard. Negative values are the checks' to refuse: the caller skips them. */
static u128 exact_span(const struct rs_layout *l, const int64_t *local)
{
    for (int j = 0; j < l->ndim; j++)
        if (!local[j])
            return 0;
    const struct rs_view *v = &l->view;
    const int64_t *shape = v->ndim ? v->shape : local;
    int ndim = v->ndim ? v->ndim : l->ndim;
    u128 reach = 0, rowmajor = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        u128 stride = v->nstrides ? (u128)(uint64_t)v->strides[d] : rowmajor;
        reach = sat_add(reach, sat_mul((u128)(uint64_t)(shape[d] - 1), stride));
        rowmajor = sat_mul(rowmajor, (u128)(uint64_t)shape[d]);
    }
    u128 last = sat_add(sat_add((u128)(uint64_t)v->offset, reach), 1);
    return sat_mul(last, dtype_size(l->dtype));
}

static int non_negative(const struct rs_layout *l)
{
    int ok = l->view.offset >= 0;
    for (int d = 0; d < l->ndim; d++)
        ok &= l->shape[d] >= 1;
    for (int d = 0; d < l->view.ndim; d++)
        ok &= l->view.shape[d] >= 1;
    for (int d = 0; d < l->view.nstrides; d++)
        ok &= l->view.strides[d] >= 0;
    return ok;
}

/* The shard at pos walked as the executor walks it: the farthest byte reached must be the
 * span, exactly. */
static void walk(const struct rs_shardmap *m, int pos, const int64_t *local, u128 span)
{
    const struct rs_layout *l = m->layout;
    int64_t numel = 1, gstart[RS_MAX_DIMS];
    for (int j = 0; j < l->ndim; j++)
        numel *= local[j]; /* an accepted tensor: at most 2^62 bytes */
    if (!numel || numel > MAX_WALK)
        return;
    for (int j = 0; j < l->ndim; j++) { /* one segment per group: S on a 1-D mesh */
        const struct rs_dimmap *d = &m->dim[j];
        gstart[j] = d->segs[d->first[shardmap_group(m, pos, j)]].start;
    }
    struct region r;
    struct region_iter it;
    region_of_shard(m, pos, gstart, local, &r);
    region_iter_init(&it, &r);
    uint64_t off, len;
    u128 far = 0, bytes = 0;
    while (region_iter_next(&it, &off, &len)) {
        if ((u128)off + len > span)
            abort(); /* a run past the span: a buffer of span bytes overflows */
        far = (u128)off + len > far ? (u128)off + len : far;
        bytes += len;
    }
    if (far != span || bytes != (u128)numel * dtype_size(l->dtype))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct input in = {data, size};
    static int ranks[4] = {0, 1, 2, 3};
    struct rs_layout l = {0};
    uint8_t shape_byte = byte(&in);
    l.ndim = 1 + shape_byte % RS_MAX_DIMS;
    l.dtype = (enum rs_dtype)(byte(&in) % RS_DTYPE_COUNT);
    for (int d = 0; d < l.ndim; d++)
        l.shape[d] = shape_byte & 0x80 ? extreme(&in) : 1 + byte(&in) % 8;
    l.nranks = l.mesh[0] = 1 + byte(&in) % 4;
    l.ranks = ranks;
    l.mesh_ndim = 1;
    uint8_t place = byte(&in);
    if (place % 2)
        l.place[0] = (struct rs_place){RS_PLACE_S, (place / 2) % l.ndim, 1};
    uint8_t view = byte(&in);
    l.view.offset = view & 1 ? extreme(&in) : 0;
    if (view & 2) { /* a view shape: the tensor's dims reversed (replicated), or drawn */
        l.view.ndim = 1 + byte(&in) % RS_MAX_DIMS;
        for (int d = 0; d < l.view.ndim; d++)
            l.view.shape[d] =
                view & 8 && l.view.ndim == l.ndim ? l.shape[l.ndim - 1 - d] : extreme(&in);
    }
    if (view & 4) {
        l.view.nstrides = l.view.ndim ? l.view.ndim : l.ndim;
        for (int d = 0; d < l.view.nstrides; d++)
            l.view.strides[d] = extreme(&in);
    }

    struct rs_shardmap m;
    struct rs_fault fault = {RS_ITEM_NONE, -1};
    reshard_status_t st = shardmap_build(&l, &m, &fault);
    int positive = non_negative(&l);
    int over = 0; /* some rank's exact span does not fit an int64_t */
    for (int pos = 0; pos < l.nranks && positive; pos++) {
        int64_t local[RS_MAX_DIMS];
        for (int j = 0; j < l.ndim; j++)
            local[j] = l.place[0].kind == RS_PLACE_S && l.place[0].dim == j
                           ? chunk_len(l.shape[j], l.nranks, pos)
                           : l.shape[j];
        u128 span = exact_span(&l, local);
        over |= span > (u128)INT64_MAX;
        if (st != RESHARD_OK)
            continue;
        int64_t got = -1;
        if (layout_span_bytes(&l, local, &got) != RS_ITEM_NONE || (u128)got != span ||
            region_span_bytes(&l, local) != (uint64_t)got)
            abort(); /* accepted, yet its span is not the exact one */
        walk(&m, pos, local, span);
    }
    if (st == RESHARD_OK) {
        shardmap_free(&m);
        if (over)
            abort(); /* accepted a view that cannot be addressed */
    } else if (st == RESHARD_ERR_TOO_LARGE && positive &&
               (fault.item == RS_ITEM_OFFSET || fault.item == RS_ITEM_STRIDES ||
                fault.item == RS_ITEM_VIEW) &&
               !over) {
        abort(); /* refused as too large, yet every span fits */
    }

    /* the spec string of the same layout: the parser's verdict is the checks' */
    if (positive) {
        char spec[1024];
        struct rs_layout back;
        if (spec_format(&l, spec, sizeof(spec)) < sizeof(spec)) {
            reshard_status_t pst = spec_parse(spec, NULL, &back);
            if (pst == RESHARD_OK)
                layout_free(&back);
            if ((pst == RESHARD_OK) != (st == RESHARD_OK) ||
                (st == RESHARD_ERR_TOO_LARGE && pst != st))
                abort();
        }
    }
    return 0;
}
