/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Tags (plugin/exec/exec_tag.c): every field inside the caller's 44 bits, and the numbers both
 * ends of a message agree on although each holds only its own transfers: every rank plans alone
 * (reshard_plan_create_rank, as a communicator rank does; every other rank's list reversed), and
 * every transfer a sender numbers for a receiver is the one the receiver numbers alike, chunk
 * counts and bundles included.
 */
#include "plugin/exec/exec_int.h"
#include "plugin/exec/exec_tag.h"
#include "plugin/handles.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

Test(tag, every_field_fits_the_callers_44_bits)
{
    uint64_t top = exec_tag(EXEC_TAG_PACK, 15, EXEC_MAX_PAIR_TAGS - 1, (1u << 20) - 1);
    cr_assert_eq(top, TP_TAG_MASK, "the widest values fill the 44 bits exactly: %llx",
                 (unsigned long long)top);
    uint64_t kind = exec_tag(EXEC_TAG_DATA, 0, 0, 0), seq = exec_tag(EXEC_TAG_RUN, 1, 0, 0);
    uint64_t index = exec_tag(EXEC_TAG_RUN, 0, 1, 0), chunk = exec_tag(EXEC_TAG_RUN, 0, 0, 1);
    cr_assert(kind && seq && index && chunk, "each field shows");
    cr_assert_eq(kind & seq, 0);
    cr_assert_eq(seq & index, 0);
    cr_assert_eq(index & chunk, 0);
    cr_assert_eq(exec_tag(EXEC_TAG_NOTE, 17, 3, 4), exec_tag(EXEC_TAG_NOTE, 1, 3, 4),
                 "the execution number wraps at 16");
}

/* One rank's side of a transfer list, planned alone. */
struct own {
    reshard_plan_t *plan;
    struct xfer_set xs;
    struct exec_cut cut;
    struct exec_share s;
    struct exec_bundles out_b, in_b;
};

/* Reverses a list, parents renumbered: the numbers must not depend on a list's order. */
static void reverse(struct xfer_set *xs)
{
    size_t n = xs->n;
    for (size_t i = 0; i < n / 2; i++) {
        struct xfer tmp = xs->x[i];
        xs->x[i] = xs->x[n - 1 - i];
        xs->x[n - 1 - i] = tmp;
    }
    for (size_t i = 0; i < n; i++)
        if (xs->x[i].parent != XFER_NONE && xs->x[i].parent != XFER_AFTER_INPUTS)
            xs->x[i].parent = (uint32_t)(n - 1 - xs->x[i].parent);
}

static void own_open(struct own *o, const reshard_tensor_t *t, int n, const reshard_topo_t *topo,
                     int rank, reshard_algo_t algo)
{
    cr_assert_eq(reshard_plan_create_rank(t, n, topo, NULL, rank, &o->plan), RESHARD_OK, "%s",
                 reshard_last_error());
    cr_assert_eq(xfer_build(o->plan->p, algo, &o->xs), RESHARD_OK);
    if (rank % 2)
        reverse(&o->xs);
    exec_cut_init(&o->cut, o->plan->p, &o->xs);
    o->cut.chunk_bytes = 256;
    o->cut.coalesce_bytes = 64;
    struct exec_share *s = &o->s;
    cr_assert_eq(exec_share_init(s, &o->cut, rank, topo->t.nranks), RESHARD_OK);
    cr_assert_eq(exec_bundles_build(&o->cut, s->out, s->nout, s->out_off, 1, &o->out_b),
                 RESHARD_OK);
    cr_assert_eq(exec_bundles_build(&o->cut, s->in, s->nin, s->in_off, 0, &o->in_b), RESHARD_OK);
    cr_assert_eq(exec_tags_number(&o->cut, s->out, s->nout, s->out_off, &o->out_b, 1, s->out_tag),
                 RESHARD_OK, "%s", reshard_last_error());
    cr_assert_eq(exec_tags_number(&o->cut, s->in, s->nin, s->in_off, &o->in_b, 0, s->in_tag),
                 RESHARD_OK);
}

static void own_close(struct own *o)
{
    exec_bundles_fini(&o->out_b);
    exec_bundles_fini(&o->in_b);
    exec_share_fini(&o->s);
    xfer_free(&o->xs);
    reshard_plan_destroy(o->plan);
}

/* The receiver's position of sender's out[o]: the same tensor, buffers and box. */
static long matching_in(const struct own *snd, size_t o, const struct own *rcv)
{
    const struct xfer *a = &snd->xs.x[snd->s.out[o]];
    int ndim = snd->plan->p->tensors[a->tensor].dst.ndim;
    for (size_t k = 0; k < rcv->s.nin; k++) {
        const struct xfer *b = &rcv->xs.x[rcv->s.in[k]];
        if (b->src == a->src && b->tensor == a->tensor && b->src_buf == a->src_buf &&
            b->dst_buf == a->dst_buf &&
            !memcmp(snd->xs.coords + a->box, rcv->xs.coords + b->box,
                    2 * sizeof(int64_t) * (size_t)ndim))
            return (long)k;
    }
    return -1;
}

/* Every sender's numbered transfers and bundles, against each receiver's. Returns how many
 * numbered transfers and bundles crossed between ranks. */
static int check_pairs(struct own *own, int world)
{
    int checked = 0;
    for (int s = 0; s < world; s++) {
        const struct own *a = &own[s];
        for (size_t o = 0; o < a->s.nout; o++) {
            const struct xfer *xf = &a->xs.x[a->s.out[o]];
            if (xf->dst == s)
                continue;
            const struct own *b = &own[xf->dst];
            long k = matching_in(a, o, b);
            cr_assert_geq(k, 0, "rank %d's transfer %zu to rank %d is not in the receiver's list",
                          s, o, xf->dst);
            cr_assert_eq(a->s.out_tag[o], b->s.in_tag[k],
                         "rank %d -> %d: numbered %u by the sender, %u by the receiver", s, xf->dst,
                         a->s.out_tag[o], b->s.in_tag[k]);
            cr_assert_eq(a->s.out_off[o + 1] - a->s.out_off[o], b->s.in_off[k + 1] - b->s.in_off[k],
                         "the same chunks");
            checked += a->s.out_tag[o] != UINT32_MAX;
        }
        for (size_t i = 0; i < a->out_b.n; i++) { /* bundles: the receiver's in the same order */
            const struct exec_bundle *mine = &a->out_b.b[i];
            const struct own *b = &own[mine->peer];
            const struct exec_bundle *theirs = NULL;
            for (size_t j = 0; j < b->in_b.n && !theirs; j++)
                if (b->in_b.b[j].peer == s && b->in_b.b[j].id == mine->id)
                    theirs = &b->in_b.b[j];
            cr_assert_not_null(theirs, "rank %d's bundle %u to %d has no receive", s, mine->id,
                               mine->peer);
            cr_assert(theirs->n == mine->n && theirs->bytes == mine->bytes,
                      "bundle %u of %d -> %d: %u pieces, %llu bytes sent; %u, %llu expected",
                      mine->id, s, mine->peer, mine->n, (unsigned long long)mine->bytes, theirs->n,
                      (unsigned long long)theirs->bytes);
            for (uint32_t p = 0; p < mine->n; p++) { /* piece by piece, the same boxes */
                const struct exec_piece *x = &a->out_b.p[mine->first + p];
                const struct exec_piece *y = &b->in_b.p[theirs->first + p];
                cr_assert(x->chunk == y->chunk && matching_in(a, x->pos, b) == (long)y->pos,
                          "bundle %u of %d -> %d: piece %u differs", mine->id, s, mine->peer, p);
            }
            checked++;
        }
    }
    return checked;
}

static reshard_layout_t *parse(const char *spec)
{
    reshard_layout_t *l = NULL;
    cr_assert_eq(reshard_layout_parse(spec, 0, &l), RESHARD_OK, "%s: %s", spec,
                 reshard_last_error());
    return l;
}

/* Many small tensors (packed), larger ones cut into chunks, replicas fanned out, on 8 ranks in
 * domains of 2, for each algorithm. */
static void agree(reshard_algo_t algo)
{
    enum { WORLD = 8, NT = 24 };
    static const char *spec[3][2] = {
        {"shape=8x8 dtype=i32 ranks=0-3 mesh=4 place=S(0)",
         "shape=8x8 dtype=i32 ranks=4-7 mesh=4 place=S(1)"},
        {"shape=64x48 dtype=f32 ranks=0-1 mesh=2 place=S(0)",
         "shape=64x48 dtype=f32 ranks=2-7 place=R"},
        {"shape=40x30 dtype=bf16 ranks=0-7 mesh=2x4 place=R,S(1)",
         "shape=40x30 dtype=bf16 ranks=0-7 mesh=8 place=S(0)"},
    };
    reshard_layout_t *l[3][2];
    reshard_tensor_t t[NT];
    for (int k = 0; k < 3; k++)
        for (int side = 0; side < 2; side++)
            l[k][side] = parse(spec[k][side]);
    for (int i = 0; i < NT; i++) /* in an order that differs from any one rank's list */
        t[i] = (reshard_tensor_t){NULL, l[(i * 7) % 3][0], l[(i * 7) % 3][1]};
    reshard_topo_t *topo;
    cr_assert_eq(reshard_topo_create(WORLD, 2, NULL, &topo), RESHARD_OK);
    struct own own[WORLD];
    for (int r = 0; r < WORLD; r++)
        own_open(&own[r], t, NT, topo, r, algo);
    int checked = check_pairs(own, WORLD);
    cr_assert_gt(checked, 3 * NT, "every pair checked (%d)", checked);
    for (int r = 0; r < WORLD; r++)
        own_close(&own[r]);
    reshard_topo_destroy(topo);
    for (int k = 0; k < 3; k++)
        for (int side = 0; side < 2; side++)
            reshard_layout_destroy(l[k][side]);
}

Test(tag, both_ends_number_reshard_transfers_alike_from_their_own_lists)
{
    agree(RESHARD_ALGO_RESHARD);
}

Test(tag, both_ends_number_direct_transfers_alike_from_their_own_lists)
{
    agree(RESHARD_ALGO_DIRECT);
}

Test(tag, both_ends_number_bcast_transfers_alike_from_their_own_lists)
{
    agree(RESHARD_ALGO_BCAST);
}

/* A pair with more numbered transfers than the index field holds: refused, naming the knob. */
Test(tag, a_pair_with_more_transfers_than_a_tag_numbers_is_refused)
{
    reshard_layout_t *s = parse("shape=300000 dtype=u8 ranks=0"),
                     *d = parse("shape=300000 dtype=u8 "
                                "ranks=1");
    reshard_tensor_t t = {"w", s, d};
    reshard_topo_t *topo;
    reshard_plan_t *plan;
    cr_assert_eq(reshard_topo_create(2, 1, NULL, &topo), RESHARD_OK);
    cr_assert_eq(reshard_plan_create_rank(&t, 1, topo, NULL, 0, &plan), RESHARD_OK);
    /* a list of EXEC_MAX_PAIR_TAGS + 1 one-byte transfers from rank 0 to rank 1 */
    size_t n = EXEC_MAX_PAIR_TAGS + 1;
    struct xfer_set xs = {.n = n};
    xs.x = calloc(n, sizeof(*xs.x));
    int64_t *coords = calloc(2 * n, sizeof(int64_t));
    uint32_t *list = calloc(n, sizeof(uint32_t)), *num = calloc(n, sizeof(uint32_t));
    size_t *off = calloc(n + 1, sizeof(size_t));
    cr_assert(xs.x && coords && list && num && off);
    for (size_t i = 0; i < n; i++) {
        coords[2 * i] = (int64_t)i;
        coords[2 * i + 1] = 1;
        xs.x[i] = (struct xfer){.bytes = 1,
                                .box = (uint32_t)(2 * i),
                                .src = 0,
                                .dst = 1,
                                .path = XFER_NET,
                                .parent = XFER_NONE};
        list[i] = (uint32_t)i;
        off[i + 1] = i + 1;
    }
    xs.coords = coords;
    struct exec_cut cut = {.plan = plan->p, .xs = &xs, .chunk_bytes = 4096};
    cr_assert_eq(exec_tags_number(&cut, list, n - 1, off, NULL, 1, num), RESHARD_OK,
                 "2^18 transfers fit");
    cr_assert_eq(num[n - 2], EXEC_MAX_PAIR_TAGS - 1);
    cr_assert_eq(exec_tags_number(&cut, list, n, off, NULL, 1, num), RESHARD_ERR_TOO_LARGE);
    cr_assert(strstr(reshard_last_error(), "rank 0 sends rank 1 more than 262144 transfers with "
                                           "messages of their own") &&
                  strstr(reshard_last_error(), "raise RESHARD_COALESCE_BYTES"),
              "%s", reshard_last_error());
    /* wholly packed ones need no number: the same list with every chunk in a bundle fits */
    struct exec_bundles b = {.bundled = calloc(n, 1)};
    cr_assert_not_null(b.bundled);
    memset(b.bundled, 1, n);
    cr_assert_eq(exec_tags_number(&cut, list, n, off, &b, 1, num), RESHARD_OK);
    cr_assert_eq(num[0], UINT32_MAX, "a packed transfer has no number");
    /* a bundle id past the field, likewise */
    struct exec_bundle big = {.peer = 1, .id = EXEC_MAX_PAIR_TAGS};
    b.b = &big;
    b.n = 1;
    cr_assert_eq(exec_tags_number(&cut, list, n, off, &b, 1, num), RESHARD_ERR_TOO_LARGE);
    cr_assert(strstr(reshard_last_error(), "raise RESHARD_CHUNK_BYTES"), "%s",
              reshard_last_error());
    free(b.bundled);
    free(xs.x);
    free(coords);
    free(list);
    free(num);
    free(off);
    reshard_plan_destroy(plan);
    reshard_topo_destroy(topo);
    reshard_layout_destroy(s);
    reshard_layout_destroy(d);
}
