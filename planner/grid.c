/* SPDX-License-Identifier: Apache-2.0 */
#include "grid.h"

#include "base/ckd.h"
#include "base/error.h"

#include <stdlib.h>
#include <string.h>

struct lseg {
    int64_t start, len;
    int group;
};

static int cmp_lseg(const void *a, const void *b)
{
    const struct lseg *x = a, *y = b;
    return (x->start > y->start) - (x->start < y->start);
}

/* All segments of a dim, labelled with their group and sorted by start. The groups partition
 * [0, n), so the result tiles it. */
static struct lseg *sorted_segments(const struct rs_dimmap *d, int *count)
{
    int n = d->first[d->ngroups];
    struct lseg *v = rs_calloc((size_t)n, sizeof(*v), "grid segments");
    if (!v)
        return NULL;
    for (int g = 0; g < d->ngroups; g++)
        for (int s = d->first[g]; s < d->first[g + 1]; s++)
            v[s] = (struct lseg){d->segs[s].start, d->segs[s].len, g};
    qsort(v, (size_t)n, sizeof(*v), cmp_lseg);
    *count = n;
    return v;
}

static reshard_status_t sweep_dim(const struct rs_dimmap *sd, const struct rs_dimmap *dd,
                                  struct grid_iv **out, int *nout)
{
    int ns, nd;
    struct lseg *s = sorted_segments(sd, &ns);
    struct lseg *d = s ? sorted_segments(dd, &nd) : NULL;
    struct grid_iv *iv = d ? rs_calloc((size_t)ns + (size_t)nd, sizeof(*iv), "grid") : NULL;
    if (!iv) {
        free(s);
        free(d);
        return RESHARD_ERR_NO_MEMORY;
    }
    int i = 0, j = 0, n = 0;
    int64_t at = 0;
    while (i < ns && j < nd) { /* both tile [0, n): advance whichever ends first */
        int64_t se = s[i].start + s[i].len, de = d[j].start + d[j].len;
        int64_t end = se < de ? se : de;
        iv[n++] = (struct grid_iv){at, end - at, s[i].group, d[j].group};
        at = end;
        i += se == end;
        j += de == end;
    }
    free(s);
    free(d);
    *out = iv;
    *nout = n;
    return RESHARD_OK;
}

reshard_status_t grid_build(const struct rs_shardmap *src, const struct rs_shardmap *dst,
                            struct rs_grid *g)
{
    memset(g, 0, sizeof(*g));
    g->ndim = src->layout->ndim;
    g->ncells = 1;
    for (int j = 0; j < g->ndim; j++) {
        reshard_status_t st = sweep_dim(&src->dim[j], &dst->dim[j], &g->iv[j], &g->n[j]);
        if (st != RESHARD_OK) {
            grid_free(g);
            return st;
        }
        g->ncells *= g->n[j];
        if (g->ncells > RS_MAX_CELLS) {
            grid_free(g);
            return rs_error(RESHARD_ERR_TOO_LARGE,
                            "plan: more than 2^32 overlap boxes in one tensor");
        }
    }
    int ss = 1, ds = 1;
    for (int j = g->ndim - 1; j >= 0; j--) {
        g->src_stride[j] = ss;
        g->dst_stride[j] = ds;
        ss *= src->dim[j].ngroups;
        ds *= dst->dim[j].ngroups;
    }
    return RESHARD_OK;
}

void grid_free(struct rs_grid *g)
{
    for (int j = 0; j < RS_MAX_DIMS; j++)
        free(g->iv[j]);
    memset(g, 0, sizeof(*g));
}

static void cursor_fill(const struct rs_grid *g, struct grid_cursor *c)
{
    c->src_tuple = c->dst_tuple = 0;
    c->volume = 1;
    for (int j = 0; j < g->ndim; j++) {
        const struct grid_iv *iv = &g->iv[j][c->idx[j]];
        c->src_tuple += iv->sg * g->src_stride[j];
        c->dst_tuple += iv->dg * g->dst_stride[j];
        c->volume *= iv->len;
    }
}

void grid_first(const struct rs_grid *g, struct grid_cursor *c)
{
    c->cell = 0;
    for (int j = 0; j < g->ndim; j++)
        c->idx[j] = 0;
    cursor_fill(g, c);
}

int grid_next(const struct rs_grid *g, struct grid_cursor *c)
{
    if (++c->cell >= g->ncells)
        return 0;
    for (int j = g->ndim - 1; j >= 0; j--) {
        if (++c->idx[j] < g->n[j])
            break;
        c->idx[j] = 0;
    }
    cursor_fill(g, c);
    return 1;
}

void grid_cell_box(const struct rs_grid *g, const struct grid_cursor *c, int64_t *start,
                   int64_t *len)
{
    for (int j = 0; j < g->ndim; j++) {
        start[j] = g->iv[j][c->idx[j]].start;
        len[j] = g->iv[j][c->idx[j]].len;
    }
}

reshard_status_t grid_sub_build(const struct rs_grid *g, const struct rs_shardmap *map,
                                enum grid_side side, int tuple, struct grid_sub *s)
{
    memset(s, 0, sizeof(*s));
    s->ndim = g->ndim;
    s->ncells = 1;
    const int *stride = side == GRID_SRC ? g->src_stride : g->dst_stride;
    for (int j = 0; j < g->ndim; j++) {
        int group = tuple / stride[j] % map->dim[j].ngroups, n = 0;
        for (int i = 0; i < g->n[j]; i++)
            n += (side == GRID_SRC ? g->iv[j][i].sg : g->iv[j][i].dg) == group;
        if (!(s->iv[j] = rs_calloc((size_t)n, sizeof(int), "grid cells"))) {
            grid_sub_free(s);
            return RESHARD_ERR_NO_MEMORY;
        }
        for (int i = 0; i < g->n[j]; i++)
            if ((side == GRID_SRC ? g->iv[j][i].sg : g->iv[j][i].dg) == group)
                s->iv[j][s->n[j]++] = i;
        s->ncells *= n;
    }
    return RESHARD_OK;
}

void grid_sub_free(struct grid_sub *s)
{
    for (int j = 0; j < RS_MAX_DIMS; j++)
        free(s->iv[j]);
    memset(s, 0, sizeof(*s));
}

void grid_sub_cell(const struct rs_grid *g, const struct grid_sub *s, int64_t k,
                   struct grid_cursor *c)
{
    c->cell = 0;
    for (int j = s->ndim - 1; j >= 0; j--) {
        c->idx[j] = s->iv[j][k % s->n[j]];
        k /= s->n[j];
    }
    for (int j = 0; j < g->ndim; j++)
        c->cell = c->cell * g->n[j] + c->idx[j];
    cursor_fill(g, c);
}

/* ---- tuples by domain ---- */

struct tdr {
    int tuple, domain, rank; /* domain: the rail, when sorting by rail */
};

static int cmp_tdr(const void *a, const void *b)
{
    const struct tdr *x = a, *y = b;
    if (x->tuple != y->tuple)
        return (x->tuple > y->tuple) - (x->tuple < y->tuple);
    if (x->domain != y->domain)
        return (x->domain > y->domain) - (x->domain < y->domain);
    return (x->rank > y->rank) - (x->rank < y->rank);
}

/* Sorted entries v[0 .. m) into ranks and runs of equal (tuple, key): run_first[t] .. run_first[t
 * + 1] index the runs of tuple t. */
static void group_runs(const struct tdr *v, int m, int ntuples, int *rank, int *run_first,
                       struct tdom_run *runs)
{
    int nruns = 0;
    for (int i = 0; i < m; i++) {
        rank[i] = v[i].rank;
        if (i == 0 || v[i].tuple != v[i - 1].tuple || v[i].domain != v[i - 1].domain) {
            runs[nruns++] = (struct tdom_run){v[i].domain, i, i + 1};
            run_first[v[i].tuple + 1] = nruns;
        } else {
            runs[nruns - 1].end = i + 1;
        }
    }
    for (int t = 0; t < ntuples; t++) /* a tuple whose ranks are all absent has no runs */
        if (run_first[t + 1] < run_first[t])
            run_first[t + 1] = run_first[t];
}

reshard_status_t tdom_build(const struct rs_shardmap *map, const struct rs_topo *topo,
                            unsigned role, struct tuple_domains *td)
{
    const struct rs_layout *l = map->layout;
    int n = l->nranks;
    size_t nt = (size_t)map->ntuples + 1;
    memset(td, 0, sizeof(*td));
    td->ntuples = map->ntuples;
    struct tdr *v = rs_calloc((size_t)n, sizeof(*v), "tuple domains");
    td->rank = rs_calloc((size_t)n, sizeof(int), "tuple domains");
    td->run_first = rs_calloc(nt, sizeof(int), "tuple domains");
    td->runs = rs_calloc((size_t)n, sizeof(*td->runs), "tuple domains");
    td->rail_rank = rs_calloc((size_t)n, sizeof(int), "tuple rails");
    td->rail_first = rs_calloc(nt, sizeof(int), "tuple rails");
    td->rail_runs = rs_calloc((size_t)n, sizeof(*td->rail_runs), "tuple rails");
    if (!v || !td->rank || !td->run_first || !td->runs || !td->rail_rank || !td->rail_first ||
        !td->rail_runs) {
        free(v);
        tdom_free(td);
        return RESHARD_ERR_NO_MEMORY;
    }
    int m = 0; /* ranks off in this role hold (or need) nothing */
    for (int p = 0; p < n; p++)
        if (!topo_off(topo, l->ranks[p], role))
            v[m++] = (struct tdr){map->tuple[p], topo->domain[l->ranks[p]], l->ranks[p]};
    qsort(v, (size_t)m, sizeof(*v), cmp_tdr);
    group_runs(v, m, td->ntuples, td->rank, td->run_first, td->runs);
    for (int i = 0; i < m; i++)
        v[i].domain = topo->local_index[v[i].rank];
    qsort(v, (size_t)m, sizeof(*v), cmp_tdr);
    group_runs(v, m, td->ntuples, td->rail_rank, td->rail_first, td->rail_runs);
    free(v);
    return RESHARD_OK;
}

void tdom_free(struct tuple_domains *td)
{
    free(td->rank);
    free(td->run_first);
    free(td->runs);
    free(td->rail_rank);
    free(td->rail_first);
    free(td->rail_runs);
    memset(td, 0, sizeof(*td));
}

/* Index of the run of tuple t whose key (domain or rail) is k, or -1. */
static int find_run(const int *first, const struct tdom_run *runs, int t, int k)
{
    int lo = first[t], hi = first[t + 1] - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        if (runs[mid].domain == k)
            return mid;
        if (runs[mid].domain < k)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

int tdom_find(const struct tuple_domains *td, int t, int d)
{
    return find_run(td->run_first, td->runs, t, d);
}

const int *tdom_ranks(const struct tuple_domains *td, int t, int *n)
{
    int a = td->run_first[t], b = td->run_first[t + 1];
    if (a == b) {
        *n = 0;
        return td->rank;
    }
    *n = td->runs[b - 1].end - td->runs[a].begin;
    return td->rank + td->runs[a].begin;
}

const int *tdom_rail(const struct tuple_domains *td, int t, int rail, int *n)
{
    int r = find_run(td->rail_first, td->rail_runs, t, rail);
    *n = r < 0 ? 0 : td->rail_runs[r].end - td->rail_runs[r].begin;
    return r < 0 ? NULL : td->rail_rank + td->rail_runs[r].begin;
}

/* ---- a tensor's overlap on a topology ---- */

reshard_status_t overlap_build(const struct rs_shardmap *src, const struct rs_shardmap *dst,
                               const struct rs_topo *topo, struct overlap *o)
{
    memset(o, 0, sizeof(*o));
    reshard_status_t st;
    RS_CHECK_GOTO(grid_build(src, dst, &o->grid), st, err_free);
    RS_CHECK_GOTO(tdom_build(src, topo, TOPO_SRC, &o->src_td), st, err_free);
    RS_CHECK_GOTO(tdom_build(dst, topo, TOPO_DST, &o->dst_td), st, err_free);
    return RESHARD_OK;
err_free:
    overlap_free(o);
    return st;
}

void overlap_free(struct overlap *o)
{
    grid_free(&o->grid);
    tdom_free(&o->src_td);
    tdom_free(&o->dst_td);
}

int64_t overlap_pairs(const struct overlap *o, const struct rs_shardmap *dst)
{
    const struct rs_grid *g = &o->grid;
    int *count[RS_MAX_DIMS] = {0}; /* intervals of each destination group, per dim */
    int64_t pairs = 0;
    for (int j = 0; j < g->ndim; j++) {
        count[j] = rs_calloc((size_t)dst->dim[j].ngroups, sizeof(int), "overlap count");
        if (!count[j]) {
            pairs = INT64_MAX; /* cannot count: let the caller refuse rather than guess low */
            goto free_counts;
        }
        for (int i = 0; i < g->n[j]; i++)
            count[j][g->iv[j][i].dg]++;
    }
    for (int t = 0; t < dst->ntuples && pairs < INT64_MAX; t++) {
        int64_t cells = 1;
        for (int j = 0; j < g->ndim && cells; j++) {
            int group = t / g->dst_stride[j] % dst->dim[j].ngroups;
            cells *= count[j][group]; /* <= the grid's cells, at most 2^32 */
        }
        int64_t runs = o->dst_td.run_first[t + 1] - o->dst_td.run_first[t], add;
        if (rs_mul_i64(cells, runs, &add) || rs_add_i64(pairs, add, &pairs))
            pairs = INT64_MAX;
    }
free_counts:
    for (int j = 0; j < g->ndim; j++)
        free(count[j]);
    return pairs;
}
