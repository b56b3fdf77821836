/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Plan builder, second half: the network phase (DESIGN.md section 5, steps 3 and 4).
 *
 * A cell that must enter a domain is needed there by m ranks. It is cut into m slices, one per
 * needer, so it crosses the network once; each needer forwards its slice to the other m - 1
 * over the local path. (DESIGN.md cuts the maximal boxes needed by the same ranks; cutting the
 * overlap cells instead moves the same bytes and keeps every slice inside one source tuple, so
 * a network op always has one set of holders to choose its sender from. The finer cut makes more
 * ops, not more bytes; the executor is to coalesce the messages of one pair of ranks.)
 * A cell with fewer rows than needers, along every dim, gives some needers no slice: they get
 * the whole cell by forwarding. A slice held by several source replicas is split among them when
 * the parts stay large. Tensors come largest first and each tensor's units largest first; each
 * (sub-)slice goes to the least loaded sender, ties going to the sender on the receiver's rail,
 * then to the lower rank.
 */
#include "plan_build.h"
#include "base/error.h"

#include <stdlib.h>
#include <string.h>

struct load_rank {
    int64_t load;
    int rank;
};

struct scratch {
    struct load_rank *needers; /* receivers of one unit, least loaded first */
    char *used;                /* holders already sending part of the current slice */
    size_t cap_need, cap_have;
};

/* The dim to cut into `parts` pieces: the outermost one long enough (pieces then stay runs of
 * whole rows), else the longest. */
static int pick_dim(const int64_t *len, int ndim, int64_t parts)
{
    int best = 0;
    for (int d = 0; d < ndim; d++) {
        if (len[d] >= parts)
            return d;
        if (len[d] > len[best])
            best = d;
    }
    return best;
}

/* Piece i of `parts` balanced pieces of [0, n): [n*i/parts, n*(i+1)/parts). */
static int64_t piece_at(int64_t n, int64_t i, int64_t parts)
{
    return (int64_t)((__int128)n * i / parts);
}

static int64_t volume(const int64_t *len, int ndim)
{
    int64_t v = 1;
    for (int d = 0; d < ndim; d++)
        v *= len[d];
    return v;
}

static reshard_status_t scratch_fit(struct scratch *s, int need, int have)
{
    struct load_rank *n =
        rs_grow(s->needers, &s->cap_need, (size_t)need, sizeof(*n), "plan scratch");
    if (!n)
        return RESHARD_ERR_NO_MEMORY;
    s->needers = n;
    char *u = rs_grow(s->used, &s->cap_have, (size_t)have, 1, "plan scratch");
    if (!u)
        return RESHARD_ERR_NO_MEMORY;
    s->used = u;
    return RESHARD_OK;
}

static int cmp_load_rank(const void *a, const void *b)
{
    const struct load_rank *x = a, *y = b;
    if (x->load != y->load)
        return x->load < y->load ? -1 : 1;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

/* Needers by bytes received so far, then by rank. */
static void order_needers(const struct build *b, const int *ranks, int m, struct load_rank *out)
{
    for (int i = 0; i < m; i++)
        out[i] = (struct load_rank){b->net_in[ranks[i]], ranks[i]};
    qsort(out, (size_t)m, sizeof(*out), cmp_load_rank);
}

/* The holder (not yet used for this slice) that has sent least so far; ties go to the one on
 * the receiver's rail, then to the lower rank. Receivers are fixed by the slicing (each needer
 * takes one slice), so balancing the (sender, receiver) pair comes down to the sender. */
static int pick_sender(const struct build *b, const int *holders, int nh, const char *used,
                       int receiver)
{
    const int *rail = b->plan->topo.local_index;
    int best = -1;
    for (int i = 0; i < nh; i++) {
        int h = holders[i];
        if (used && used[i])
            continue;
        if (best < 0) {
            best = i;
            continue;
        }
        int bh = holders[best];
        int64_t load = b->net_out[h], bload = b->net_out[bh];
        int on_rail = rail[h] == rail[receiver], bon_rail = rail[bh] == rail[receiver];
        if (load < bload ||
            (load == bload && (on_rail > bon_rail || (on_rail == bon_rail && h < bh))))
            best = i;
    }
    return best;
}

/* All ranks holding a source tuple (they sit in other domains than the unit's). */
static const int *holders_of(const struct overlap *w, int tuple, int *n)
{
    const struct tdom_run *first = &w->src_td.runs[w->src_td.run_first[tuple]];
    const struct tdom_run *last = &w->src_td.runs[w->src_td.run_first[tuple + 1] - 1];
    *n = last->end - first->begin;
    return w->src_td.rank + first->begin;
}

/* Sends one slice to `receiver`, from one holder or split among several, and forwards each
 * part to the receiver's fellow needers. */
static reshard_status_t emit_slice(struct build *b, struct scratch *s, const struct net_unit *u,
                                   const int64_t *start, const int64_t *len, uint32_t box,
                                   int receiver, const struct tdom_run *need)
{
    struct rs_plan *p = b->plan;
    const struct overlap *w = &b->ov;
    int ndim = p->tensors[u->tensor].dst.ndim;
    int nh;
    const int *holders = holders_of(w, u->src_tuple, &nh);
    int64_t bytes = volume(len, ndim) * b->esize;

    int64_t k = 1;
    int dim = 0;
    if (nh > 1 && bytes / 2 >= p->opts.split_min_bytes) {
        k = bytes / p->opts.split_min_bytes;
        if (k > nh)
            k = nh;
        if (k > PLAN_MAX_SPLIT)
            k = PLAN_MAX_SPLIT;
        dim = pick_dim(len, ndim, k);
        if (k > len[dim])
            k = len[dim];
    }
    if (k > 1)
        memset(s->used, 0, (size_t)nh);
    for (int64_t q = 0; q < k; q++) {
        int64_t sub_start[RS_MAX_DIMS], sub_len[RS_MAX_DIMS];
        memcpy(sub_start, start, (size_t)ndim * sizeof(int64_t));
        memcpy(sub_len, len, (size_t)ndim * sizeof(int64_t));
        uint32_t sub_box = box;
        if (k > 1) {
            int64_t a = piece_at(len[dim], q, k), e = piece_at(len[dim], q + 1, k);
            sub_start[dim] = start[dim] + a;
            sub_len[dim] = e - a;
            RS_CHECK(plan_push_box(p, ndim, sub_start, sub_len, &sub_box));
        }
        int64_t sub_bytes = volume(sub_len, ndim) * b->esize;
        int i = pick_sender(b, holders, nh, k > 1 ? s->used : NULL, receiver);
        if (k > 1)
            s->used[i] = 1;
        int sender = holders[i];
        b->net_out[sender] += sub_bytes;
        b->net_in[receiver] += sub_bytes;
        RS_CHECK(
            plan_push_op(p, PLAN_OP_NET, u->tensor, sender, receiver, sub_box, PLAN_NO_PARENT));
        uint32_t parent = (uint32_t)(p->nops - 1);
        for (int r = need->begin; r < need->end; r++) {
            int peer = w->dst_td.rank[r];
            if (peer != receiver)
                RS_CHECK(plan_push_op(p, PLAN_OP_FWD, u->tensor, receiver, peer, sub_box, parent));
        }
    }
    return RESHARD_OK;
}

static reshard_status_t assign_unit(struct build *b, struct scratch *s, const struct net_unit *u)
{
    struct rs_plan *p = b->plan;
    const struct overlap *w = &b->ov;
    const struct tdom_run *need = &w->dst_td.runs[u->run];
    int ndim = p->tensors[u->tensor].dst.ndim;
    int m = need->end - need->begin, nh;
    holders_of(w, u->src_tuple, &nh);
    RS_CHECK(scratch_fit(s, m, nh));
    int64_t start[RS_MAX_DIMS], len[RS_MAX_DIMS]; /* copies: pushing boxes moves coords */
    memcpy(start, p->coords + u->box, (size_t)ndim * sizeof(int64_t));
    memcpy(len, p->coords + u->box + ndim, (size_t)ndim * sizeof(int64_t));
    if (m == 1)
        return emit_slice(b, s, u, start, len, u->box, w->dst_td.rank[need->begin], need);

    /* m slices; the larger ones (they differ by at most a row) go to the least loaded */
    int dim = pick_dim(len, ndim, m);
    order_needers(b, w->dst_td.rank + need->begin, m, s->needers);
    int64_t base = len[dim] / m, extra = len[dim] % m; /* slices 0..extra-1 get base + 1 */
    for (int i = 0; i < m; i++) {
        int64_t slice_start[RS_MAX_DIMS], slice_len[RS_MAX_DIMS];
        memcpy(slice_start, start, (size_t)ndim * sizeof(int64_t));
        memcpy(slice_len, len, (size_t)ndim * sizeof(int64_t));
        slice_start[dim] = start[dim] + i * base + (i < extra ? i : extra);
        slice_len[dim] = base + (i < extra);
        if (slice_len[dim] == 0)
            break; /* fewer rows than needers: the rest receive nothing and only forward-in */
        uint32_t box;
        RS_CHECK(plan_push_box(p, ndim, slice_start, slice_len, &box));
        RS_CHECK(emit_slice(b, s, u, slice_start, slice_len, box, s->needers[i].rank, need));
    }
    return RESHARD_OK;
}

/* Largest first, and among equals in the order the units were found (cell, then domain),
 * which every rank shares: a stable LSD radix sort on (max - bytes), 11 bits a pass, only as
 * many passes as the sizes need. */
static reshard_status_t sort_units(struct build *b)
{
    size_t n = b->nunits;
    int64_t max = 0;
    for (size_t i = 0; i < n; i++)
        if (b->units[i].bytes > max)
            max = b->units[i].bytes;
    if (n < 2 || max == 0)
        return RESHARD_OK;
    struct net_unit *tmp = rs_calloc(n, sizeof(*tmp), "network units");
    if (!tmp)
        return RESHARD_ERR_NO_MEMORY;
    struct net_unit *from = b->units, *to = tmp;
    for (int shift = 0; shift < 64 && ((uint64_t)max >> shift); shift += 11) {
        size_t count[2049] = {0};
        for (size_t i = 0; i < n; i++)
            count[(((uint64_t)(max - from[i].bytes)) >> shift & 2047) + 1]++;
        for (int d = 0; d < 2048; d++)
            count[d + 1] += count[d];
        for (size_t i = 0; i < n; i++)
            to[count[((uint64_t)(max - from[i].bytes)) >> shift & 2047]++] = from[i];
        struct net_unit *t = from;
        from = to;
        to = t;
    }
    if (from != b->units)
        memcpy(b->units, from, n * sizeof(*from));
    free(tmp);
    return RESHARD_OK;
}

reshard_status_t plan_assign_net(struct build *b)
{
    RS_CHECK(sort_units(b));
    struct scratch s = {0};
    reshard_status_t st = RESHARD_OK;
    for (size_t i = 0; i < b->nunits && st == RESHARD_OK; i++)
        st = assign_unit(b, &s, &b->units[i]);
    b->nunits = 0;
    free(s.needers);
    free(s.used);
    return st;
}
