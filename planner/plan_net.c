/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The rule for a cell that must enter a domain over the network (no source rank there).
 *
 * The cell is needed there by the m ranks of its destination tuple's run in that domain. It is
 * cut into m slices along one dim, so it crosses the network once, and each needer forwards
 * what it received to the other m - 1 over the local path (a cell with fewer rows than needers,
 * along every dim, leaves some needers without a slice: they get it all by forwarding). Slice i
 * goes to needer (i + j + rotation) mod m, j being the run's place among its tuple's runs.
 *
 * Senders come from the source tuple's present holders, those on the receiver's rail (its
 * local index, its NIC) when there are any, else all of them: the class. Slices are numbered
 * g = j * m + i across the tuple's runs and given to the class in turn, so a holder serves the
 * same runs of every tensor of one layout (few peers, whatever the world's size) and the
 * holders share the slices evenly. When the slices do not divide among the class (P slices, c
 * holders), each slice is cut into k = c / gcd(P, c) pieces on k consecutive holders (so the
 * pieces do), as long as pieces keep RESHARD_PLAN_SPLIT_MIN_BYTES; what still does not divide
 * starts at a rotation of the tensor's, so no holder is always the one with more.
 *
 * Nothing here reads what other tensors or ranks were given: the world's plan and every rank's
 * own plan take the same decisions, each rank computing only the slices it sends, receives or
 * forwards.
 */
#include "plan_build.h"

#include "base/error.h"

#include <string.h>

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

static int64_t gcd(int64_t a, int64_t b)
{
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* A slice of a unit: its box, receiver and number g among the tuple's P slices. */
struct slice {
    int64_t start[RS_MAX_DIMS], len[RS_MAX_DIMS];
    uint32_t box;           /* PLAN_NO_BOX until an op needs it */
    struct plan_cell *cell; /* the slice is the whole cell: its box is the cell's */
    int receiver;
    int64_t g, total;
};

/* How many pieces a slice is cut into among its class of c holders, and along which dim. */
static int64_t pieces_of(const struct build *b, const struct slice *s, int c, int *dim)
{
    int64_t bytes = volume(s->len, b->ndim) * b->esize, split_min = b->plan->opts.split_min_bytes;
    *dim = 0;
    if (c < 2 || bytes / 2 < split_min)
        return 1;
    int64_t k = c / gcd(s->total, c), cap = bytes / split_min;
    if (k > cap)
        k = cap;
    if (k > PLAN_MAX_SPLIT)
        k = PLAN_MAX_SPLIT;
    *dim = pick_dim(s->len, b->ndim, k);
    if (k > s->len[*dim])
        k = s->len[*dim];
    return k < 1 ? 1 : k;
}

/* Who sends a slice: its class of holders, its number of pieces (and the dim they cut), and
 * the rotation of the piece numbers. */
struct senders {
    const int *cls;
    int c, dim;
    int64_t k;
    uint64_t rot;
};

static void senders_of(const struct build *b, const struct slice *s, int src_tuple,
                       struct senders *out)
{
    const struct tuple_domains *td = b->src_td;
    out->cls = tdom_rail(td, src_tuple, b->plan->topo.local_index[s->receiver], &out->c);
    if (!out->c)
        out->cls = tdom_ranks(td, src_tuple, &out->c);
    out->k = pieces_of(b, s, out->c, &out->dim);
    out->rot = (uint64_t)(s->total * out->k % out->c) ? b->salt : 0;
}

static int sender_of(const struct slice *s, const struct senders *w, int64_t q)
{
    uint64_t c = (uint64_t)w->c;
    return w->cls[(uint64_t)(s->g * w->k + q + (int64_t)(w->rot % c)) % c];
}

/* Sends one slice to its receiver, from one holder or in pieces from several, and forwards
 * each piece to the receiver's fellow needers. */
static reshard_status_t emit_slice(struct build *b, struct slice *s, int src_tuple,
                                   const struct tdom_run *need)
{
    struct senders w;
    senders_of(b, s, src_tuple, &w);
    int dim = w.dim;
    int64_t k = w.k;
    for (int64_t q = 0; q < k; q++) {
        int sender = sender_of(s, &w, q);
        int net = plan_keeps(b, PLAN_OP_NET, sender, s->receiver);
        int fwd = b->keep != KEEP_OUT_OF && need->end - need->begin > 1;
        if (!net && !fwd)
            continue;
        uint32_t box = s->box;
        if (k > 1) {
            int64_t start[RS_MAX_DIMS], len[RS_MAX_DIMS];
            memcpy(start, s->start, sizeof(start));
            memcpy(len, s->len, sizeof(len));
            int64_t a = piece_at(s->len[dim], q, k), e = piece_at(s->len[dim], q + 1, k);
            start[dim] += a;
            len[dim] = e - a;
            RS_CHECK(boxes_push(&b->plan->boxes, b->ndim, start, len, &box));
        } else if (box == PLAN_NO_BOX && s->cell) {
            RS_CHECK(plan_cell_box(b, s->cell));
            box = s->box = s->cell->box;
        } else if (box == PLAN_NO_BOX) {
            RS_CHECK(boxes_push(&b->plan->boxes, b->ndim, s->start, s->len, &s->box));
            box = s->box;
        }
        int kept;
        RS_CHECK(plan_emit(b, PLAN_OP_NET, sender, s->receiver, box, PLAN_NO_PARENT, &kept));
        uint32_t parent = kept ? (uint32_t)(b->plan->nops - 1) : PLAN_NO_PARENT;
        for (int r = need->begin; fwd && r < need->end; r++) {
            int peer = b->dst_td->rank[r];
            if (peer != s->receiver)
                RS_CHECK(plan_emit(b, PLAN_OP_FWD, s->receiver, peer, box, parent, NULL));
        }
    }
    return RESHARD_OK;
}

/* The cell's scales: from the sender of slice 0's first piece to its receiver, and forwarded
 * from there to the domain's other needers, as the weight's slices are. */
static reshard_status_t emit_scales(struct build *b, struct plan_cell *cell,
                                    const struct tdom_run *need, int receiver, int64_t g,
                                    int64_t total, int dim, int64_t rows0)
{
    struct slice s = {.receiver = receiver, .g = g, .total = total};
    memcpy(s.start, cell->start, sizeof(s.start));
    memcpy(s.len, cell->len, sizeof(s.len));
    s.len[dim] = rows0; /* slice 0's extent: what decides its pieces */
    struct senders w;
    senders_of(b, &s, cell->c.src_tuple, &w);
    int kept;
    RS_CHECK(plan_emit_scales(b, cell, PLAN_OP_NET, sender_of(&s, &w, 0), receiver, PLAN_NO_PARENT,
                              &kept));
    uint32_t parent = kept ? (uint32_t)(b->plan->nops - 1) : PLAN_NO_PARENT;
    for (int r = need->begin; b->keep != KEEP_OUT_OF && r < need->end; r++) {
        int peer = b->dst_td->rank[r];
        if (peer != receiver)
            RS_CHECK(plan_emit_scales(b, cell, PLAN_OP_FWD, receiver, peer, parent, NULL));
    }
    return RESHARD_OK;
}

reshard_status_t plan_net_unit(struct build *b, struct plan_cell *cell, int run)
{
    const struct tuple_domains *d = b->dst_td;
    const struct tdom_run *need = &d->runs[run];
    int dst_tuple = cell->c.dst_tuple, m = need->end - need->begin;
    int j = run - d->run_first[dst_tuple],
        runs = d->run_first[dst_tuple + 1] - d->run_first[dst_tuple];
    int dim = pick_dim(cell->len, b->ndim, m);
    int64_t rows = cell->len[dim], slices = rows < m ? rows : m;
    int64_t base = rows / m, extra = rows % m; /* slices 0 .. extra-1 get base + 1 */
    uint64_t rot = ((uint64_t)j + b->salt) % (uint64_t)m;
    for (int64_t i = 0; i < slices; i++) {
        if (i == 0 && cell->has_scales) /* the scales go with slice 0's first piece */
            RS_CHECK(emit_scales(b, cell, need, d->rank[need->begin + (int)(rot % (uint64_t)m)],
                                 (int64_t)j * slices, (int64_t)runs * slices, dim,
                                 slices == 1 ? rows : base + (extra > 0)));
        struct slice s = {.box = PLAN_NO_BOX,
                          .receiver =
                              d->rank[need->begin + (int)(((uint64_t)i + rot) % (uint64_t)m)],
                          .g = (int64_t)j * slices + i,
                          .total = (int64_t)runs * slices};
        memcpy(s.start, cell->start, sizeof(s.start));
        memcpy(s.len, cell->len, sizeof(s.len));
        if (slices == 1) {
            s.cell = cell;
            s.box = cell->box;
        } else {
            s.start[dim] += i * base + (i < extra ? i : extra);
            s.len[dim] = base + (i < extra);
        }
        RS_CHECK(emit_slice(b, &s, cell->c.src_tuple, need));
    }
    return RESHARD_OK;
}
