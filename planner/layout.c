/* SPDX-License-Identifier: Apache-2.0 */
#include "layout.h"

#include "base/ckd.h"
#include "base/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static reshard_status_t fail(struct rs_fault *fault, enum rs_item item, int index,
                             reshard_status_t st)
{
    if (fault) {
        fault->item = item;
        fault->index = index;
    }
    return st;
}

static void format_dims(char *buf, size_t n, const int64_t *dims, int ndim)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int d = 0; d < ndim && used < n; d++)
        used += (size_t)snprintf(buf + used, n - used, "%s%lld", d ? "x" : "", (long long)dims[d]);
}

int64_t layout_numel(const struct rs_layout *l)
{
    int64_t n = 1;
    for (int d = 0; d < l->ndim; d++)
        n *= l->shape[d];
    return n;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static reshard_status_t check_ranks(const struct rs_layout *l, struct rs_fault *fault)
{
    if (l->nranks < 1 || !l->ranks)
        return fail(fault, RS_ITEM_RANKS, -1,
                    rs_error(RESHARD_ERR_SPEC_SYNTAX, "ranks: the list is empty"));
    for (int i = 0; i < l->nranks; i++)
        if (l->ranks[i] < 0 || l->ranks[i] > RS_MAX_RANK)
            return fail(fault, RS_ITEM_RANKS, i,
                        rs_error(RESHARD_ERR_RANK_RANGE, "ranks: rank %d is outside 0..%d",
                                 l->ranks[i], RS_MAX_RANK));
    int *sorted = rs_calloc((size_t)l->nranks, sizeof(int), "rank list");
    if (!sorted)
        return RESHARD_ERR_NO_MEMORY;
    memcpy(sorted, l->ranks, (size_t)l->nranks * sizeof(int));
    qsort(sorted, (size_t)l->nranks, sizeof(int), cmp_int);
    int dup = -1;
    for (int i = 1; i < l->nranks && dup < 0; i++)
        if (sorted[i] == sorted[i - 1])
            dup = sorted[i];
    free(sorted);
    if (dup < 0)
        return RESHARD_OK;
    int second = -1;
    for (int i = 0, seen = 0; i < l->nranks; i++)
        if (l->ranks[i] == dup && seen++ == 1)
            second = i;
    return fail(fault, RS_ITEM_RANKS, second,
                rs_error(RESHARD_ERR_SPEC_SYNTAX, "ranks: rank %d is listed twice", dup));
}

static reshard_status_t check_mesh(const struct rs_layout *l, struct rs_fault *fault)
{
    if (l->mesh_ndim < 1 || l->mesh_ndim > RS_MAX_MESH_DIMS)
        return fail(fault, RS_ITEM_MESH, -1,
                    rs_error(RESHARD_ERR_SPEC_SYNTAX, "mesh: expected 1 to %d dims, got %d",
                             RS_MAX_MESH_DIMS, l->mesh_ndim));
    int64_t size = 1;
    int64_t dims[RS_MAX_MESH_DIMS];
    for (int i = 0; i < l->mesh_ndim; i++) {
        if (l->mesh[i] < 1)
            return fail(
                fault, RS_ITEM_MESH, i,
                rs_error(RESHARD_ERR_SPEC_SYNTAX, "mesh: dim %d has size %d", i, l->mesh[i]));
        size *= l->mesh[i];
        dims[i] = l->mesh[i];
        if (size > RS_MAX_RANK + 1)
            return fail(
                fault, RS_ITEM_MESH, -1,
                rs_error(RESHARD_ERR_MESH_SIZE, "mesh: more than %d ranks", RS_MAX_RANK + 1));
    }
    if (size != l->nranks) {
        char buf[64];
        format_dims(buf, sizeof(buf), dims, l->mesh_ndim);
        return fail(fault, RS_ITEM_MESH, -1,
                    rs_error(RESHARD_ERR_MESH_SIZE, "mesh: %s holds %lld ranks but ranks lists %d",
                             buf, (long long)size, l->nranks));
    }
    return RESHARD_OK;
}

static reshard_status_t check_places(const struct rs_layout *l, struct rs_fault *fault)
{
    for (int i = 0; i < l->mesh_ndim; i++) {
        const struct rs_place *p = &l->place[i];
        if (p->kind == RS_PLACE_R)
            continue;
        if (p->kind != RS_PLACE_S && p->kind != RS_PLACE_SS)
            return fail(fault, RS_ITEM_PLACE, i,
                        rs_error(RESHARD_ERR_SPEC_SYNTAX, "place: unknown placement kind %d",
                                 (int)p->kind));
        if (p->dim < 0 || p->dim >= l->ndim) {
            char what[48];
            if (p->kind == RS_PLACE_S)
                snprintf(what, sizeof(what), "S(%d)", p->dim);
            else
                snprintf(what, sizeof(what), "SS(%d,%lld)", p->dim, (long long)p->k);
            return fail(fault, RS_ITEM_PLACE, i,
                        rs_error(RESHARD_ERR_SHARD_DIM,
                                 "place: %s shards dim %d but the tensor has %d dim%s", what,
                                 p->dim, l->ndim, l->ndim == 1 ? "" : "s"));
        }
        if (p->kind == RS_PLACE_SS && (p->k < 1 || p->k > RS_MAX_SEGMENTS))
            return fail(fault, RS_ITEM_PLACE, i,
                        rs_error(RESHARD_ERR_SPEC_SYNTAX, "place: SS(%d,%lld) needs 1 <= k <= %d",
                                 p->dim, (long long)p->k, RS_MAX_SEGMENTS));
    }
    return RESHARD_OK;
}

static reshard_status_t check_quant(const struct rs_layout *l, struct rs_fault *fault)
{
    const struct rs_quant *q = &l->quant;
    if (q->kind == RS_QUANT_NONE)
        return RESHARD_OK;
    if (l->dtype != RS_DTYPE_FP8E4M3 && l->dtype != RS_DTYPE_FP8E5M2)
        return fail(fault, RS_ITEM_QUANT, -1,
                    rs_error(RESHARD_ERR_SPEC_SYNTAX,
                             "quant: a quantized layout holds fp8e4m3 or fp8e5m2, not %s",
                             dtype_name(l->dtype)));
    if (q->kind == RS_QUANT_BLOCK && l->ndim < 2)
        return fail(fault, RS_ITEM_QUANT, -1,
                    rs_error(RESHARD_ERR_SPEC_SYNTAX,
                             "quant: block(%lld,%lld) scales 2-D blocks of the last two dims, and "
                             "the tensor has 1",
                             (long long)q->rows, (long long)q->cols));
    if (q->kind == RS_QUANT_BLOCK && (q->rows < 1 || q->cols < 1))
        return fail(fault, RS_ITEM_QUANT, -1,
                    rs_error(RESHARD_ERR_SPEC_SYNTAX, "quant: block sizes must be positive"));
    return RESHARD_OK;
}

static reshard_status_t check_view(const struct rs_layout *l, struct rs_fault *fault)
{
    const struct rs_view *v = &l->view;
    if (v->offset < 0)
        return fail(fault, RS_ITEM_OFFSET, -1,
                    rs_error(RESHARD_ERR_VIEW, "offset: %lld is negative", (long long)v->offset));
    if (v->ndim < 0 || v->ndim > RS_MAX_DIMS)
        return fail(fault, RS_ITEM_VIEW, -1,
                    rs_error(RESHARD_ERR_VIEW, "view: expected 1 to %d dims", RS_MAX_DIMS));
    for (int d = 0; d < v->ndim; d++)
        if (v->shape[d] < 1)
            return fail(fault, RS_ITEM_VIEW, d,
                        rs_error(RESHARD_ERR_VIEW, "view: dim %d has size %lld", d,
                                 (long long)v->shape[d]));
    int vdim = v->ndim ? v->ndim : l->ndim;
    if (v->nstrides && v->nstrides != vdim)
        return fail(
            fault, RS_ITEM_STRIDES, -1,
            rs_error(RESHARD_ERR_VIEW, "strides: %d strides for a %d-D view", v->nstrides, vdim));
    for (int d = 0; d < v->nstrides; d++)
        if (v->strides[d] < 0)
            return fail(fault, RS_ITEM_STRIDES, d,
                        rs_error(RESHARD_ERR_VIEW, "strides: stride %d is negative", d));
    return RESHARD_OK;
}

/* All checks, or all but the rank list's (a list already checked: its sort is the costly one). */
static reshard_status_t check_layout(const struct rs_layout *l, int ranks_checked,
                                     struct rs_fault *fault);

reshard_status_t layout_check(const struct rs_layout *l, struct rs_fault *fault)
{
    return check_layout(l, 0, fault);
}

static reshard_status_t check_layout(const struct rs_layout *l, int ranks_checked,
                                     struct rs_fault *fault)
{
    if (l->ndim < 1 || l->ndim > RS_MAX_DIMS)
        return fail(fault, RS_ITEM_SHAPE, -1,
                    rs_error(RESHARD_ERR_SPEC_SYNTAX, "shape: expected 1 to %d dims, got %d",
                             RS_MAX_DIMS, l->ndim));
    int64_t bytes = (int64_t)dtype_size(l->dtype);
    if (bytes == 0)
        return fail(fault, RS_ITEM_DTYPE, -1,
                    rs_error(RESHARD_ERR_SPEC_SYNTAX, "dtype: unknown dtype %d", (int)l->dtype));
    for (int d = 0; d < l->ndim; d++) {
        if (l->shape[d] < 1)
            return fail(fault, RS_ITEM_SHAPE, d,
                        rs_error(RESHARD_ERR_SPEC_SYNTAX, "shape: dim %d has size %lld", d,
                                 (long long)l->shape[d]));
        if (l->shape[d] > RS_MAX_BYTES / bytes)
            return fail(fault, RS_ITEM_SHAPE, d,
                        rs_error(RESHARD_ERR_TOO_LARGE, "shape: the tensor exceeds 2^62 bytes"));
        bytes *= l->shape[d];
    }
    if (!ranks_checked)
        RS_CHECK(check_ranks(l, fault));
    RS_CHECK(check_mesh(l, fault));
    RS_CHECK(check_places(l, fault));
    RS_CHECK(check_view(l, fault));
    RS_CHECK(check_quant(l, fault));
    return RESHARD_OK;
}

/* ---- shard maps ---- */

struct segbuf {
    struct rs_seg *v;
    size_t n, cap;
};

static reshard_status_t segbuf_push(struct segbuf *b, int64_t start, int64_t len, int64_t pos,
                                    int new_group)
{
    if (!new_group && b->n && b->v[b->n - 1].start + b->v[b->n - 1].len == start) {
        b->v[b->n - 1].len += len; /* contiguous in both global and local order */
        return RESHARD_OK;
    }
    if (b->n == RS_MAX_SEGMENTS)
        return rs_error(RESHARD_ERR_TOO_LARGE, "place: more than %d segments in one tensor dim",
                        RS_MAX_SEGMENTS);
    struct rs_seg *v = rs_grow(b->v, &b->cap, b->n + 1, sizeof(*v), "shard segments");
    if (!v)
        return RESHARD_ERR_NO_MEMORY;
    b->v = v;
    b->v[b->n++] = (struct rs_seg){start, len, pos};
    return RESHARD_OK;
}

/* Appends the part of a group (segs, in local order) whose local index lies in [a, b).
 * Successive calls for one new group ask for increasing ranges, so *cursor (the first segment
 * that can still meet them) only moves forward: a group is scanned once, not once per piece. */
static reshard_status_t take_local(const struct rs_seg *segs, int nsegs, int *cursor, int64_t a,
                                   int64_t b, int64_t *pos, int *new_group, struct segbuf *out)
{
    while (*cursor < nsegs && segs[*cursor].pos + segs[*cursor].len <= a)
        (*cursor)++;
    for (int s = *cursor; s < nsegs && a < b; s++) {
        int64_t lo = segs[s].pos, hi = segs[s].pos + segs[s].len;
        if (lo >= b)
            break;
        int64_t from = a > lo ? a : lo, to = b < hi ? b : hi;
        RS_CHECK(segbuf_push(out, segs[s].start + (from - lo), to - from, *pos, *new_group));
        *new_group = 0;
        *pos += to - from;
    }
    return RESHARD_OK;
}

static int64_t ceil_div(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

static int64_t min64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

/* torch.chunk's piece c of a run of n cut in m: pieces of ceil(n/m), the last ones short or
 * empty. Writes the piece as [*a, *b). */
static void chunk_bounds(int64_t n, int64_t m, int64_t c, int64_t *a, int64_t *b)
{
    int64_t size = ceil_div(n, m);
    *a = min64(c * size, n);
    *b = min64((c + 1) * size, n);
}

/* Splits every group of *d along one mesh dim of size m (placement p, at mesh index i).
 * S cuts a group as torch.chunk does. SS(d,k) is torch's _StridedShard(d, split_factor=k):
 * the group is chunked into k pieces, each piece is chunked over the m ranks, and a rank
 * holds its chunk of every piece in piece order; pieces and chunks may both be uneven. */
static reshard_status_t split_groups(struct rs_dimmap *d, const struct rs_place *p, int m, int i,
                                     struct rs_fault *fault)
{
    int64_t k = p->kind == RS_PLACE_SS ? p->k : 1;
    if ((int64_t)d->ngroups * m * k > 4 * (int64_t)RS_MAX_SEGMENTS)
        return fail(
            fault, RS_ITEM_PLACE, i,
            rs_error(RESHARD_ERR_TOO_LARGE, "place: dim %d is cut into too many pieces", p->dim));
    int ngroups = d->ngroups * m;
    int *first = rs_calloc((size_t)ngroups + 1, sizeof(int), "shard groups");
    if (!first)
        return RESHARD_ERR_NO_MEMORY;
    struct segbuf out = {0};
    reshard_status_t st = RESHARD_OK;
    for (int g = 0; g < d->ngroups && st == RESHARD_OK; g++) {
        const struct rs_seg *segs = d->segs + d->first[g];
        int nsegs = d->first[g + 1] - d->first[g];
        int64_t len = dimmap_group_len(d, g);
        for (int c = 0; c < m && st == RESHARD_OK; c++) {
            int64_t pos = 0;
            int new_group = 1, cursor = 0;
            first[g * m + c] = (int)out.n;
            for (int64_t q = 0; q < k && st == RESHARD_OK; q++) {
                int64_t lo, hi, a, b;
                chunk_bounds(len, k, q, &lo, &hi);
                if (lo == hi)
                    break; /* the trailing pieces are empty */
                chunk_bounds(hi - lo, m, c, &a, &b);
                if (a < b)
                    st = take_local(segs, nsegs, &cursor, lo + a, lo + b, &pos, &new_group, &out);
            }
        }
    }
    if (st != RESHARD_OK) {
        if (st == RESHARD_ERR_TOO_LARGE) /* too many segments: this placement's doing */
            fail(fault, RS_ITEM_PLACE, i, st);
        free(first);
        free(out.v);
        return st;
    }
    first[ngroups] = (int)out.n;
    free(d->first);
    free(d->segs);
    d->first = first;
    d->segs = out.v;
    d->ngroups = ngroups;
    d->mesh_dims[d->nmesh++] = i;
    return RESHARD_OK;
}

static reshard_status_t build_dim(const struct rs_layout *l, int j, struct rs_dimmap *d,
                                  struct rs_fault *fault)
{
    d->ngroups = 1;
    d->first = rs_calloc(2, sizeof(int), "shard groups");
    d->segs = rs_calloc(1, sizeof(struct rs_seg), "shard segments");
    if (!d->first || !d->segs)
        return RESHARD_ERR_NO_MEMORY;
    d->first[1] = 1;
    d->segs[0] = (struct rs_seg){0, l->shape[j], 0};
    for (int i = 0; i < l->mesh_ndim; i++) {
        const struct rs_place *p = &l->place[i];
        if (p->kind != RS_PLACE_R && p->dim == j)
            RS_CHECK(split_groups(d, p, l->mesh[i], i, fault));
    }
    return RESHARD_OK;
}

static int mesh_coord(const struct rs_layout *l, int pos, int i)
{
    int stride = 1;
    for (int k = l->mesh_ndim - 1; k > i; k--)
        stride *= l->mesh[k];
    return (pos / stride) % l->mesh[i];
}

int shardmap_group(const struct rs_shardmap *map, int pos, int dim)
{
    const struct rs_dimmap *d = &map->dim[dim];
    int g = 0;
    for (int k = 0; k < d->nmesh; k++) {
        int i = d->mesh_dims[k];
        g = g * map->layout->mesh[i] + mesh_coord(map->layout, pos, i);
    }
    return g;
}

int64_t dimmap_group_len(const struct rs_dimmap *d, int g)
{
    int last = d->first[g + 1] - 1;
    return last < d->first[g] ? 0 : d->segs[last].pos + d->segs[last].len;
}

int64_t shardmap_local_numel(const struct rs_shardmap *map, int pos)
{
    int64_t n = 1;
    for (int j = 0; j < map->layout->ndim; j++)
        n *= dimmap_group_len(&map->dim[j], shardmap_group(map, pos, j));
    return n;
}

struct rank_pos {
    int rank, pos;
};

static int cmp_rank_pos(const void *a, const void *b)
{
    const struct rank_pos *x = a, *y = b;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

static reshard_status_t index_by_rank(struct rs_shardmap *map)
{
    int n = map->layout->nranks;
    struct rank_pos *rp = rs_calloc((size_t)n, sizeof(*rp), "rank index");
    if (!rp)
        return RESHARD_ERR_NO_MEMORY;
    for (int p = 0; p < n; p++)
        rp[p] = (struct rank_pos){map->layout->ranks[p], p};
    qsort(rp, (size_t)n, sizeof(*rp), cmp_rank_pos);
    for (int p = 0; p < n; p++)
        map->by_rank[p] = rp[p].pos;
    free(rp);
    return RESHARD_OK;
}

static reshard_status_t build_tuples(struct rs_shardmap *map)
{
    const struct rs_layout *l = map->layout;
    int n = l->nranks;
    map->ntuples = 1;
    for (int j = 0; j < l->ndim; j++)
        map->ntuples *= map->dim[j].ngroups; /* <= nranks: distinct mesh dims per tensor dim */
    map->tuple = rs_calloc((size_t)n, sizeof(int), "rank tuples");
    map->tuple_first = rs_calloc((size_t)map->ntuples + 1, sizeof(int), "rank tuples");
    map->tuple_pos = rs_calloc((size_t)n, sizeof(int), "rank tuples");
    map->by_rank = rs_calloc((size_t)n, sizeof(int), "rank index");
    if (!map->tuple || !map->tuple_first || !map->tuple_pos || !map->by_rank)
        return RESHARD_ERR_NO_MEMORY;
    for (int p = 0; p < n; p++) {
        int t = 0;
        for (int j = 0; j < l->ndim; j++)
            t = t * map->dim[j].ngroups + shardmap_group(map, p, j);
        map->tuple[p] = t;
        map->tuple_first[t + 1]++;
    }
    for (int t = 0; t < map->ntuples; t++)
        map->tuple_first[t + 1] += map->tuple_first[t];
    int *fill = rs_calloc((size_t)map->ntuples, sizeof(int), "rank tuples");
    if (!fill)
        return RESHARD_ERR_NO_MEMORY;
    for (int p = 0; p < n; p++) {
        int t = map->tuple[p];
        map->tuple_pos[map->tuple_first[t] + fill[t]++] = p;
    }
    free(fill);
    return index_by_rank(map);
}

struct stride_dim {
    int64_t stride, extent;
};

static int cmp_stride(const void *a, const void *b)
{
    const struct stride_dim *x = a, *y = b;
    if (x->stride != y->stride)
        return (x->stride > y->stride) - (x->stride < y->stride);
    return (x->extent > y->extent) - (x->extent < y->extent);
}

/* A view may not map two shard elements to one buffer element. Sufficient test: sorted by
 * stride, each dim's stride exceeds the farthest reach of the dims before it. */
static int view_overlaps(const int64_t *shape, const int64_t *strides, int ndim)
{
    struct stride_dim s[RS_MAX_DIMS];
    int n = 0;
    for (int d = 0; d < ndim; d++)
        if (shape[d] > 1)
            s[n++] = (struct stride_dim){strides[d], shape[d]};
    qsort(s, (size_t)n, sizeof(s[0]), cmp_stride);
    int64_t reach = 0; /* largest offset the smaller-stride dims reach */
    for (int d = 0; d < n; d++) {
        int64_t step;
        if (s[d].stride <= reach || rs_mul_i64(s[d].stride, s[d].extent - 1, &step) ||
            rs_add_i64(reach, step, &reach))
            return 1; /* an offset past 2^63 cannot address a buffer either */
    }
    return 0;
}

enum rs_item layout_span_bytes(const struct rs_layout *l, const int64_t *local, int64_t *bytes)
{
    const struct rs_view *v = &l->view;
    int64_t numel = 1;
    for (int j = 0; j < l->ndim; j++)
        if (rs_mul_i64(numel, local[j], &numel))
            return RS_ITEM_SHAPE;
    if (numel == 0) {
        *bytes = 0;
        return RS_ITEM_NONE;
    }
    const int64_t *shape = v->ndim ? v->shape : local;
    int ndim = v->ndim ? v->ndim : l->ndim;
    enum rs_item by_reach = v->nstrides ? RS_ITEM_STRIDES : RS_ITEM_VIEW;
    int64_t esize = (int64_t)dtype_size(l->dtype), reach = 0, rowmajor = 1, step, end;
    for (int d = ndim - 1; d >= 0; d--) {
        int64_t stride = v->nstrides ? v->strides[d] : rowmajor;
        if (shape[d] < 1 || stride < 0 || rs_mul_i64(shape[d] - 1, stride, &step) ||
            rs_add_i64(reach, step, &reach) ||
            (!v->nstrides && rs_mul_i64(rowmajor, shape[d], &rowmajor)))
            return by_reach;
    }
    /* the view alone, then with the offset in front of it */
    if (rs_add_i64(reach, 1, &end) || rs_mul_i64(end, esize, &end))
        return by_reach;
    size_t fits;
    if (v->offset < 0 || rs_add_i64(v->offset, reach + 1, &end) || rs_mul_i64(end, esize, &end) ||
        rs_i64_to_size(end, &fits))
        return RS_ITEM_OFFSET;
    *bytes = end;
    return RS_ITEM_NONE;
}

static reshard_status_t check_view_fits(const struct rs_shardmap *map, struct rs_fault *fault)
{
    const struct rs_layout *l = map->layout;
    const struct rs_view *v = &l->view;
    for (int t = 0; t < map->ntuples; t++) {
        int pos = map->tuple_pos[map->tuple_first[t]];
        int64_t local[RS_MAX_DIMS], numel = 1;
        for (int j = 0; j < l->ndim; j++) {
            local[j] = dimmap_group_len(&map->dim[j], shardmap_group(map, pos, j));
            numel *= local[j];
        }
        if (numel == 0)
            continue; /* an empty shard has nothing to place */
        const int64_t *shape = v->ndim ? v->shape : local;
        int ndim = v->ndim ? v->ndim : l->ndim;
        int64_t vnumel = 1;
        int wraps = 0;
        for (int d = 0; d < ndim; d++)
            wraps |= rs_mul_i64(vnumel, shape[d], &vnumel);
        if (wraps || vnumel != numel) {
            char buf[160], held[32] = "more than 2^63";
            format_dims(buf, sizeof(buf), v->shape, v->ndim);
            if (!wraps)
                snprintf(held, sizeof(held), "%lld", (long long)vnumel);
            return fail(fault, RS_ITEM_VIEW, -1,
                        rs_error(RESHARD_ERR_VIEW,
                                 "view: %s holds %s elements but the shard of rank %d holds %lld",
                                 buf, held, l->ranks[pos], (long long)numel));
        }
        int64_t span;
        enum rs_item past = layout_span_bytes(l, local, &span);
        if (past != RS_ITEM_NONE)
            return fail(fault, past, -1,
                        rs_error(RESHARD_ERR_TOO_LARGE,
                                 "%s: the view of rank %d reaches past byte 2^63 of its buffer "
                                 "(offset %lld, %lld elements of %zu bytes), which cannot be "
                                 "addressed",
                                 past == RS_ITEM_OFFSET    ? "offset"
                                 : past == RS_ITEM_STRIDES ? "strides"
                                                           : "view",
                                 l->ranks[pos], (long long)v->offset, (long long)numel,
                                 dtype_size(l->dtype)));
        if (v->nstrides && view_overlaps(shape, v->strides, ndim))
            return fail(fault, RS_ITEM_STRIDES, -1,
                        rs_error(RESHARD_ERR_VIEW,
                                 "strides: two elements of rank %d's view share a buffer element",
                                 l->ranks[pos]));
    }
    return RESHARD_OK;
}

reshard_status_t shardmap_build(const struct rs_layout *l, struct rs_shardmap *map,
                                struct rs_fault *fault)
{
    memset(map, 0, sizeof(*map));
    map->layout = l;
    reshard_status_t st;
    RS_CHECK_GOTO(layout_check(l, fault), st, err_free);
    for (int j = 0; j < l->ndim; j++)
        RS_CHECK_GOTO(build_dim(l, j, &map->dim[j], fault), st, err_free);
    RS_CHECK_GOTO(build_tuples(map), st, err_free);
    RS_CHECK_GOTO(check_view_fits(map, fault), st, err_free);
    return RESHARD_OK;
err_free:
    shardmap_free(map);
    return st;
}

int shardmap_same_ranks(const struct rs_layout *a, const struct rs_layout *b)
{
    if (a->nranks != b->nranks || a->ndim != b->ndim || a->mesh_ndim != b->mesh_ndim ||
        (a->ranks != b->ranks && memcmp(a->ranks, b->ranks, (size_t)a->nranks * sizeof(int))))
        return 0;
    for (int i = 0; i < a->mesh_ndim; i++) {
        int da = a->place[i].kind == RS_PLACE_R ? -1 : a->place[i].dim;
        int db = b->place[i].kind == RS_PLACE_R ? -1 : b->place[i].dim;
        if (a->mesh[i] != b->mesh[i] || da != db)
            return 0;
    }
    return 1;
}

reshard_status_t shardmap_build_like(const struct rs_layout *l, const struct rs_shardmap *like,
                                     struct rs_shardmap *map, struct rs_fault *fault)
{
    if (!shardmap_same_ranks(l, like->layout))
        return rs_error(RESHARD_ERR_INTERNAL, "shard map: the donor map has other ranks");
    memset(map, 0, sizeof(*map));
    map->layout = l;
    reshard_status_t st;
    RS_CHECK_GOTO(check_layout(l, 1, fault), st, err_free);
    for (int j = 0; j < l->ndim; j++)
        RS_CHECK_GOTO(build_dim(l, j, &map->dim[j], fault), st, err_free);
    map->ntuples = like->ntuples;
    map->tuple = like->tuple;
    map->tuple_first = like->tuple_first;
    map->tuple_pos = like->tuple_pos;
    map->by_rank = like->by_rank;
    map->borrowed = 1;
    RS_CHECK_GOTO(check_view_fits(map, fault), st, err_free);
    return RESHARD_OK;
err_free:
    shardmap_free(map);
    return st;
}

void shardmap_free(struct rs_shardmap *map)
{
    for (int j = 0; j < RS_MAX_DIMS; j++) {
        free(map->dim[j].first);
        free(map->dim[j].segs);
    }
    if (!map->borrowed) {
        free(map->tuple);
        free(map->tuple_first);
        free(map->tuple_pos);
        free(map->by_rank);
    }
    memset(map, 0, sizeof(*map));
}

int shardmap_position(const struct rs_shardmap *map, int rank)
{
    int lo = 0, hi = map->layout->nranks - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int r = map->layout->ranks[map->by_rank[mid]];
        if (r == rank)
            return map->by_rank[mid];
        if (r < rank)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

int shardmap_holds(const struct rs_shardmap *map, int pos, const int64_t *start, const int64_t *len)
{
    for (int j = 0; j < map->layout->ndim; j++) {
        const struct rs_dimmap *d = &map->dim[j];
        int g = shardmap_group(map, pos, j);
        int lo = d->first[g], hi = d->first[g + 1] - 1, hit = -1;
        while (lo <= hi) { /* last segment starting at or before start[j] */
            int mid = lo + (hi - lo) / 2;
            if (d->segs[mid].start <= start[j]) {
                hit = mid;
                lo = mid + 1;
            } else {
                hi = mid - 1;
            }
        }
        if (hit < 0 || start[j] + len[j] > d->segs[hit].start + d->segs[hit].len)
            return 0;
    }
    return 1;
}

reshard_status_t layout_copy(const struct rs_layout *from, struct rs_layout *to)
{
    *to = *from;
    to->ranks = rs_calloc((size_t)from->nranks, sizeof(int), "rank list");
    if (!to->ranks)
        return RESHARD_ERR_NO_MEMORY;
    memcpy(to->ranks, from->ranks, (size_t)from->nranks * sizeof(int));
    return RESHARD_OK;
}

void layout_free(struct rs_layout *l)
{
    free(l->ranks);
    l->ranks = NULL;
    l->nranks = 0;
}
