/* SPDX-License-Identifier: Apache-2.0 */
#include "oracle.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- shards by literal simulation ---- */

static int mesh_coord(const struct rs_layout *l, int pos, int i)
{
    int stride = 1;
    for (int k = l->mesh_ndim - 1; k > i; k--)
        stride *= l->mesh[k];
    return (pos / stride) % l->mesh[i];
}

/* torch.chunk(list, m)[c]: chunks of ceil(n/m) elements, trailing ones short or missing. */
static int64_t chunk(const int64_t *in, int64_t n, int m, int c, int64_t *out)
{
    int64_t size = (n + m - 1) / m, k = 0;
    for (int64_t i = (int64_t)c * size; i < (int64_t)(c + 1) * size && i < n; i++)
        out[k++] = in[i];
    return k;
}

int64_t oracle_indices(const struct rs_layout *l, int pos, int dim, int64_t *out)
{
    int64_t n = l->shape[dim];
    int64_t *cur = malloc((size_t)n * sizeof(int64_t)), *next = malloc((size_t)n * sizeof(int64_t));
    for (int64_t i = 0; i < n; i++)
        cur[i] = i;
    for (int i = 0; i < l->mesh_ndim; i++) {
        const struct rs_place *p = &l->place[i];
        if (p->kind == RS_PLACE_R || p->dim != dim)
            continue;
        int m = l->mesh[i], c = mesh_coord(l, pos, i);
        if (p->kind == RS_PLACE_S) {
            n = chunk(cur, n, m, c, next);
        } else { /* torch's _StridedShard: chunk into k pieces, chunk each piece over the
                  * m ranks, this rank's chunks concatenated in piece order */
            int64_t *piece = malloc((size_t)(n ? n : 1) * sizeof(int64_t)), k = 0;
            for (int64_t q = 0; q < p->k; q++) {
                int64_t len = chunk(cur, n, (int)p->k, (int)q, piece);
                k += chunk(piece, len, m, c, next + k);
            }
            free(piece);
            n = k;
        }
        int64_t *t = cur;
        cur = next;
        next = t;
    }
    memcpy(out, cur, (size_t)n * sizeof(int64_t));
    free(cur);
    free(next);
    return n;
}

int oracle_side_build(const struct rs_layout *l, struct oracle_side *s)
{
    for (int d = 0; d < l->ndim; d++)
        if (l->shape[d] > 64)
            return -1; /* the oracle is for small tensors */
    s->nranks = l->nranks;
    s->numel = layout_numel(l);
    s->holds = calloc((size_t)(l->nranks * s->numel), 1);
    if (!s->holds)
        return -1;
    int64_t idx[RS_MAX_DIMS][64];
    int64_t cnt[RS_MAX_DIMS];
    for (int pos = 0; pos < l->nranks; pos++) {
        for (int d = 0; d < l->ndim; d++)
            cnt[d] = oracle_indices(l, pos, d, idx[d]);
        /* every combination of held indices */
        int64_t at[RS_MAX_DIMS] = {0};
        int empty = 0;
        for (int d = 0; d < l->ndim; d++)
            empty |= cnt[d] == 0;
        while (!empty) {
            int64_t flat = 0;
            for (int d = 0; d < l->ndim; d++)
                flat = flat * l->shape[d] + idx[d][at[d]];
            s->holds[pos * s->numel + flat] = 1;
            int d = l->ndim - 1;
            while (d >= 0 && ++at[d] == cnt[d])
                at[d--] = 0;
            if (d < 0)
                break;
        }
    }
    return 0;
}

void oracle_side_free(struct oracle_side *s)
{
    free(s->holds);
    s->holds = NULL;
}

/* ---- bounds by definition ---- */

int oracle_bounds(const struct rs_plan *p, struct oracle_bounds *b)
{
    const struct rs_topo *topo = &p->topo;
    int nd = topo->ndomains;
    int64_t *in = calloc((size_t)nd, sizeof(int64_t));
    int64_t *forced = calloc((size_t)topo->nranks, sizeof(int64_t));
    int *ndst = calloc((size_t)nd, sizeof(int));
    char *is_dst = calloc((size_t)topo->nranks, 1);
    char *need = malloc((size_t)nd), *have = malloc((size_t)nd);
    memset(b, 0, sizeof(*b));
    for (int t = 0; t < p->ntensors; t++) {
        const struct plan_tensor *pt = &p->tensors[t];
        struct oracle_side s, d;
        if (oracle_side_build(&pt->src, &s) || oracle_side_build(&pt->dst, &d))
            return -1;
        int64_t es = (int64_t)dtype_size(pt->dst.dtype);
        int root_dom = topo->domain[pt->src.ranks[0]];
        char *dst_dom = calloc((size_t)nd, 1);
        for (int i = 0; i < pt->dst.nranks; i++) {
            is_dst[pt->dst.ranks[i]] |= !topo_off(topo, pt->dst.ranks[i], TOPO_DST);
            dst_dom[topo->domain[pt->dst.ranks[i]]] = 1; /* the bcast figure counts them all */
        }
        int others = 0;
        for (int dd = 0; dd < nd; dd++)
            others += dst_dom[dd] && dd != root_dom;
        b->gather_bcast_bytes += s.numel * es * others;
        for (int64_t e = 0; e < s.numel; e++) {
            memset(need, 0, (size_t)nd);
            memset(have, 0, (size_t)nd);
            int holders = 0, holder = -1;
            for (int i = 0; i < pt->dst.nranks; i++)
                if (d.holds[i * d.numel + e] && !topo_off(topo, pt->dst.ranks[i], TOPO_DST))
                    need[topo->domain[pt->dst.ranks[i]]] = 1;
            for (int i = 0; i < pt->src.nranks; i++)
                if (s.holds[i * s.numel + e] && !topo_off(topo, pt->src.ranks[i], TOPO_SRC)) {
                    have[topo->domain[pt->src.ranks[i]]] = 1;
                    holders++;
                    holder = pt->src.ranks[i];
                }
            for (int dd = 0; dd < nd; dd++)
                if (need[dd] && !have[dd]) {
                    b->min_net_bytes += es;
                    in[dd] += es;
                }
            if (holders == 1)
                for (int dd = 0; dd < nd; dd++)
                    forced[holder] += es * (need[dd] && dd != topo->domain[holder]);
            if (!have[root_dom])
                b->gather_bcast_bytes += es;
        }
        free(dst_dom);
        oracle_side_free(&s);
        oracle_side_free(&d);
    }
    for (int r = 0; r < topo->nranks; r++)
        ndst[topo->domain[r]] += is_dst[r];
    for (int dd = 0; dd < nd; dd++)
        if (ndst[dd] && (in[dd] + ndst[dd] - 1) / ndst[dd] > b->lb_nic_bytes)
            b->lb_nic_bytes = (in[dd] + ndst[dd] - 1) / ndst[dd];
    for (int r = 0; r < topo->nranks; r++)
        if (forced[r] > b->lb_nic_bytes)
            b->lb_nic_bytes = forced[r];
    free(in);
    free(forced);
    free(ndst);
    free(is_dst);
    free(need);
    free(have);
    return 0;
}

/* ---- replaying a plan ---- */

static int position(const struct rs_layout *l, int rank)
{
    for (int i = 0; i < l->nranks; i++)
        if (l->ranks[i] == rank)
            return i;
    return -1;
}

int oracle_check_plan(const struct rs_plan *p, char *msg, size_t n)
{
    int world = p->topo.nranks, rc = 0;
    for (int t = 0; t < p->ntensors && !rc; t++) {
        const struct plan_tensor *pt = &p->tensors[t];
        struct oracle_side s, d;
        if (oracle_side_build(&pt->src, &s) || oracle_side_build(&pt->dst, &d)) {
            snprintf(msg, n, "tensor %d is too large for the oracle", t);
            return -1;
        }
        int64_t numel = s.numel;
        int *writes = calloc((size_t)(world * numel), sizeof(int));
        /* received[op][element]: what each NET op delivered, for the FWD ops after it */
        for (size_t i = 0; i < p->nops && !rc; i++) {
            const struct plan_op *op = &p->ops[i];
            if (op->tensor != (uint32_t)t)
                continue;
            const int64_t *st = plan_op_start(p, op), *ln = plan_op_len(p, op);
            int sp = position(&pt->src, op->src), dp = position(&pt->dst, op->dst);
            int64_t at[RS_MAX_DIMS] = {0};
            for (;;) {
                int64_t flat = 0;
                for (int k = 0; k < pt->dst.ndim; k++)
                    flat = flat * pt->dst.shape[k] + st[k] + at[k];
                int src_ok;
                if (op->kind == PLAN_OP_FWD) { /* the sender must have it in its new shard */
                    src_ok = op->parent < i && writes[op->src * numel + flat] > 0 &&
                             p->ops[op->parent].kind == PLAN_OP_NET;
                } else {
                    src_ok = sp >= 0 && s.holds[sp * numel + flat];
                }
                src_ok = src_ok && !topo_off(&p->topo, op->src,
                                             op->kind == PLAN_OP_FWD ? TOPO_DST : TOPO_SRC);
                if (!src_ok) {
                    snprintf(msg, n, "op %zu: rank %d sends element %lld it lacks", i, op->src,
                             (long long)flat);
                    rc = -1;
                    break;
                }
                if (dp < 0 || !d.holds[dp * numel + flat] ||
                    topo_off(&p->topo, op->dst, TOPO_DST)) {
                    snprintf(msg, n, "op %zu: rank %d gets element %lld it does not need", i,
                             op->dst, (long long)flat);
                    rc = -1;
                    break;
                }
                writes[op->dst * numel + flat]++;
                int k = pt->dst.ndim - 1;
                while (k >= 0 && ++at[k] == ln[k])
                    at[k--] = 0;
                if (k < 0)
                    break;
            }
        }
        for (int i = 0; i < pt->dst.nranks && !rc; i++)
            for (int64_t e = 0; e < numel && !rc; e++) {
                int w = writes[pt->dst.ranks[i] * numel + e];
                if (w !=
                    (d.holds[i * numel + e] && !topo_off(&p->topo, pt->dst.ranks[i], TOPO_DST))) {
                    snprintf(msg, n, "tensor %d rank %d element %lld written %d times", t,
                             pt->dst.ranks[i], (long long)e, w);
                    rc = -1;
                }
            }
        free(writes);
        oracle_side_free(&s);
        oracle_side_free(&d);
    }
    return rc;
}

int oracle_data_lost(const struct rs_layout *src, const struct rs_layout *dst,
                     const struct rs_topo *topo)
{
    struct oracle_side s, d;
    if (oracle_side_build(src, &s) || oracle_side_build(dst, &d))
        return -1;
    int lost = 0;
    for (int64_t e = 0; e < s.numel && !lost; e++) {
        int needed = 0, held = 0;
        for (int i = 0; i < dst->nranks; i++)
            needed |= d.holds[i * d.numel + e] && !topo_off(topo, dst->ranks[i], TOPO_DST);
        for (int i = 0; i < src->nranks; i++)
            held |= s.holds[i * s.numel + e] && !topo_off(topo, src->ranks[i], TOPO_SRC);
        lost = needed && !held;
    }
    oracle_side_free(&s);
    oracle_side_free(&d);
    return lost;
}

/* ---- random cases ---- */

uint64_t rng_next(struct rng *r)
{
    uint64_t z = (r->s += UINT64_C(0x9e3779b97f4a7c15)); /* splitmix64 */
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

int rng_int(struct rng *r, int lo, int hi)
{
    return lo + (int)(rng_next(r) % (uint64_t)(hi - lo + 1));
}

static void shuffle(struct rng *r, int *v, int n)
{
    for (int i = n - 1; i > 0; i--) {
        int j = rng_int(r, 0, i), t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
}

/* A mesh of 1-3 dims whose size fits in `max` ranks. */
static void random_mesh(struct rng *r, struct rs_layout *l, int max)
{
    l->mesh_ndim = rng_int(r, 1, 3);
    int size = 1;
    for (int i = 0; i < l->mesh_ndim; i++) {
        int m = rng_int(r, 1, 4);
        while (size * m > max)
            m--;
        l->mesh[i] = m < 1 ? 1 : m;
        size *= l->mesh[i];
    }
    l->nranks = size;
}

/* Placements: R, S or SS on any dim; SS's split factor need not divide what it cuts (torch's
 * _StridedShard chunks unevenly), and may exceed it. */
static void random_places(struct rng *r, struct rs_layout *l)
{
    for (int i = 0; i < l->mesh_ndim; i++) {
        int kind = rng_int(r, 0, 9);
        l->place[i] = (struct rs_place){RS_PLACE_R, 0, 1};
        if (kind < 3)
            continue;
        l->place[i].dim = rng_int(r, 0, l->ndim - 1);
        l->place[i].kind = kind < 7 ? RS_PLACE_S : RS_PLACE_SS;
        if (l->place[i].kind == RS_PLACE_SS)
            l->place[i].k = rng_int(r, 1, 4);
    }
}

void random_case_make(uint64_t seed, struct random_case *c)
{
    struct rng r = {seed};
    memset(c, 0, sizeof(*c));
    int ndim = rng_int(&r, 1, 4);
    int64_t shape[RS_MAX_DIMS];
    for (int d = 0; d < ndim; d++)
        shape[d] = rng_int(&r, 1, ndim <= 2 ? 13 : 6);
    enum rs_dtype dtype = (enum rs_dtype)rng_int(&r, 0, RS_DTYPE_COUNT - 1);
    c->world = rng_int(&r, 1, 24);
    int ndom = rng_int(&r, 1, 8);
    c->domain_of = calloc((size_t)c->world, sizeof(int));
    int blocks = rng_int(&r, 0, 1);
    for (int k = 0; k < c->world; k++)
        c->domain_of[k] = blocks ? k * ndom / c->world : rng_int(&r, 0, ndom - 1);
    c->split_min_bytes = rng_int(&r, 0, 1) ? rng_int(&r, 1, 64) : (INT64_C(1) << 20);

    int *perm = calloc((size_t)c->world, sizeof(int));
    for (int k = 0; k < c->world; k++)
        perm[k] = k;
    struct rs_layout *sides[2] = {&c->src, &c->dst};
    int relation = rng_int(&r, 0, 2); /* 0 disjoint-ish, 1 overlapping, 2 equal */
    for (int s = 0; s < 2; s++) {
        struct rs_layout *l = sides[s];
        l->ndim = ndim;
        memcpy(l->shape, shape, sizeof(shape));
        l->dtype = dtype;
        if (s == 1 && relation == 2) { /* same rank set, another mesh of the same size */
            l->mesh_ndim = 1;
            l->mesh[0] = c->src.nranks;
            l->nranks = c->src.nranks;
            if (l->nranks % 2 == 0 && rng_int(&r, 0, 1)) {
                l->mesh_ndim = 2;
                l->mesh[0] = 2;
                l->mesh[1] = l->nranks / 2;
            }
        } else {
            random_mesh(&r, l, c->world);
        }
        l->ranks = calloc((size_t)l->nranks, sizeof(int));
        if (s == 1 && relation == 2) {
            memcpy(l->ranks, c->src.ranks, (size_t)l->nranks * sizeof(int));
            shuffle(&r, l->ranks, l->nranks);
        } else {
            shuffle(&r, perm, c->world);
            if (s == 1 && relation == 0) { /* prefer ranks the source does not use */
                int k = 0;
                for (int i = 0; i < c->world; i++) {
                    int used = 0;
                    for (int j = 0; j < c->src.nranks; j++)
                        used |= c->src.ranks[j] == perm[i];
                    if (!used)
                        perm[k++] = perm[i];
                }
                for (int i = 0; i < c->src.nranks && k < c->world; i++)
                    perm[k++] = c->src.ranks[i];
            }
            memcpy(l->ranks, perm, (size_t)l->nranks * sizeof(int));
        }
        random_places(&r, l);
    }
    free(perm);
}

void random_case_free(struct random_case *c)
{
    layout_free(&c->src);
    layout_free(&c->dst);
    free(c->domain_of);
}
