/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Bundles (plugin/exec/exec_bundle.c): which chunks travel packed, how many messages they fill,
 * and the count-only mode the cost model uses, against the real one. The plan: NSMALL 8x8 i32
 * tensors from row halves on ranks 0-1 to column halves on ranks 2-3 (two domains of 2), so each
 * source rank sends each destination rank a 4x4 block of 64 bytes per tensor, over the network.
 */
#include "plugin/exec/exec_int.h"
#include "test/planner/plan_util.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

#define NSMALL 200

static char replay[64]; /* the random case being run, for a failure's message */

struct bundle_case {
    struct rs_plan *p;
    struct xfer_set xs;
    struct exec_cut cut;
    struct exec_share s;
    struct exec_bundles b;
};

static struct rs_plan *small_tensors(void)
{
    static const char *src[NSMALL], *dst[NSMALL];
    for (int i = 0; i < NSMALL; i++) {
        src[i] = "shape=8x8 dtype=i32 ranks=0-1 mesh=2 place=S(0)";
        dst[i] = "shape=8x8 dtype=i32 ranks=2-3 mesh=2 place=S(1)";
    }
    return plan_specs(NSMALL, src, dst, 4, 2, NULL, 0);
}

/* Rank `rank`'s bundles one way (send: of its outgoing transfers) with these sizes. */
static void open_case(struct bundle_case *c, struct rs_plan *p, reshard_algo_t algo, int rank,
                      int send, int64_t chunk_bytes, int64_t coalesce_bytes)
{
    c->p = p;
    cr_assert_eq(xfer_build(p, algo, &c->xs), RESHARD_OK);
    exec_cut_init(&c->cut, p, &c->xs);
    c->cut.chunk_bytes = chunk_bytes;
    c->cut.coalesce_bytes = coalesce_bytes;
    cr_assert_eq(exec_share_init(&c->s, &c->cut, rank, 4), RESHARD_OK);
    const uint32_t *list = send ? c->s.out : c->s.in;
    size_t n = send ? c->s.nout : c->s.nin;
    const size_t *off = send ? c->s.out_off : c->s.in_off;
    cr_assert_eq(exec_bundles_build(&c->cut, list, n, off, send, &c->b), RESHARD_OK);
    /* count-only agrees with building, always */
    size_t nb = 99, np = 99, pieces = 0;
    cr_assert_eq(exec_bundles_count(&c->cut, list, n, send, &nb, &np), RESHARD_OK);
    for (size_t i = 0; i < c->b.n; i++)
        pieces += c->b.b[i].n;
    cr_assert_eq(nb, c->b.n, "%scounted %zu bundles, built %zu", replay, nb, c->b.n);
    cr_assert_eq(np, pieces, "%scounted %zu pieces, built %zu", replay, np, pieces);
}

static void close_case(struct bundle_case *c)
{
    exec_bundles_fini(&c->b);
    exec_share_fini(&c->s);
    xfer_free(&c->xs);
    plan_free(c->p);
}

static size_t bundled_chunks(const struct bundle_case *c, int send)
{
    size_t n = 0, total = send ? c->s.out_off[c->s.nout] : c->s.in_off[c->s.nin];
    for (size_t i = 0; i < total; i++)
        n += c->b.bundled[i];
    return n;
}

/* 200 pieces of 64 bytes to each of two peers fit one 4 MiB message each. */
Test(bundle, small_chunks_to_a_peer_fill_one_message)
{
    struct bundle_case c;
    open_case(&c, small_tensors(), RESHARD_ALGO_RESHARD, 0, 1, 4 << 20, 65536);
    cr_assert_eq(c.b.n, 2);
    for (int i = 0; i < 2; i++) {
        const struct exec_bundle *b = &c.b.b[i];
        cr_assert_eq(b->peer, 2 + i, "by peer");
        cr_assert_eq(b->id, 0);
        cr_assert_eq(b->n, NSMALL);
        cr_assert_eq(b->bytes, NSMALL * 64);
        cr_assert_eq(b->first, (uint32_t)(i * NSMALL));
    }
    cr_assert_eq(bundled_chunks(&c, 1), 2 * NSMALL);
    /* pieces by transfer index within a peer */
    for (uint32_t i = 1; i < NSMALL; i++)
        cr_assert_lt(c.s.out[c.b.p[i - 1].pos], c.s.out[c.b.p[i].pos]);
    close_case(&c);
}

/* 4 KiB messages hold 64 pieces: 200 to a peer make 64 + 64 + 64 + 8. */
Test(bundle, a_message_holds_at_most_a_chunk)
{
    struct bundle_case c;
    open_case(&c, small_tensors(), RESHARD_ALGO_RESHARD, 1, 1, 4096, 4096);
    cr_assert_eq(c.b.n, 8);
    for (int i = 0; i < 8; i++) {
        const struct exec_bundle *b = &c.b.b[i];
        cr_assert_eq(b->peer, i < 4 ? 2 : 3);
        cr_assert_eq(b->id, (uint32_t)(i % 4), "numbered per peer");
        cr_assert_eq(b->n, i % 4 < 3 ? 64 : 8);
        cr_assert_eq(b->bytes, (uint64_t)b->n * 64);
    }
    close_case(&c);
}

/* RESHARD_COALESCE_BYTES below a piece's size, or 0: nothing is packed. */
Test(bundle, chunks_above_the_coalescing_size_travel_alone)
{
    struct bundle_case c;
    open_case(&c, small_tensors(), RESHARD_ALGO_RESHARD, 0, 1, 4 << 20, 63);
    cr_assert_eq(c.b.n, 0);
    cr_assert_eq(bundled_chunks(&c, 1), 0);
    close_case(&c);
    open_case(&c, small_tensors(), RESHARD_ALGO_RESHARD, 0, 1, 4 << 20, 0);
    cr_assert_eq(c.b.n, 0);
    close_case(&c);
    open_case(&c, small_tensors(), RESHARD_ALGO_RESHARD, 0, 1, 4 << 20, 64);
    cr_assert_eq(c.b.n, 2, "exactly the coalescing size still packs");
    close_case(&c);
}

/* The receiver groups alike: rank 2's bundle from rank 0 is rank 0's bundle to rank 2. */
Test(bundle, sender_and_receiver_group_alike)
{
    struct bundle_case snd, rcv;
    open_case(&snd, small_tensors(), RESHARD_ALGO_RESHARD, 0, 1, 4096, 4096);
    open_case(&rcv, small_tensors(), RESHARD_ALGO_RESHARD, 2, 0, 4096, 4096);
    cr_assert_eq(rcv.b.n, 8, "4 from each of ranks 0 and 1");
    for (int i = 0; i < 4; i++) {
        const struct exec_bundle *s = &snd.b.b[i], *r = &rcv.b.b[i];
        cr_assert_eq(s->peer, 2);
        cr_assert_eq(r->peer, 0);
        cr_assert_eq(r->id, s->id);
        cr_assert_eq(r->n, s->n);
        cr_assert_eq(r->bytes, s->bytes);
        for (uint32_t k = 0; k < s->n; k++) /* the same transfers, piece by piece */
            cr_assert_eq(snd.s.out[snd.b.p[s->first + k].pos], rcv.s.in[rcv.b.p[r->first + k].pos]);
    }
    close_case(&snd);
    close_case(&rcv);
}

/* Only chunks ready at the start pack: a forward inside the domain (local) and the broadcast
 * ring's hops (out of a whole-tensor buffer, after the gather) never do. */
Test(bundle, forwards_and_ring_hops_are_not_packed)
{
    struct bundle_case c;
    open_case(
        &c, plan_one("shape=4x4 dtype=f32 ranks=0", "shape=4x4 dtype=f32 ranks=2-3 place=R", 4, 2),
        RESHARD_ALGO_BCAST, 0, 1, 4 << 20, 65536);
    cr_assert_eq(c.s.nout, 2, "the gather and the hop to rank 2");
    cr_assert_eq(c.b.n, 0);
    close_case(&c);
    open_case(
        &c, plan_one("shape=4x4 dtype=f32 ranks=0", "shape=4x4 dtype=f32 ranks=2-3 place=R", 4, 2),
        RESHARD_ALGO_RESHARD, 2, 1, 4 << 20, 65536);
    cr_assert_eq(c.s.nout, 1, "the forward to rank 3");
    cr_assert_eq(c.b.n, 0);
    close_case(&c);
}

/* A transfer of 4 chunks of 4 KiB with coalescing at 4 KiB: each chunk packs, alone. */
Test(bundle, pieces_as_large_as_a_chunk_are_a_bundle_each)
{
    struct bundle_case c;
    open_case(&c, plan_one("shape=64x64 dtype=f32 ranks=0", "shape=64x64 dtype=f32 ranks=2", 4, 2),
              RESHARD_ALGO_RESHARD, 0, 1, 4096, 4096);
    cr_assert_eq(c.b.n, 4);
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(c.b.b[i].n, 1);
        cr_assert_eq(c.b.p[i].chunk, (uint32_t)i);
    }
    close_case(&c);
    open_case(&c, plan_one("shape=64x64 dtype=f32 ranks=0", "shape=64x64 dtype=f32 ranks=2", 4, 2),
              RESHARD_ALGO_RESHARD, 0, 1, 4096, 4095);
    cr_assert_eq(c.b.n, 0);
    close_case(&c);
}

/* Count-only on a random mix of sizes agrees with building (open_case checks it), for every
 * rank and both ways; the seed is printed on failure. */
Test(bundle, counting_agrees_with_building_on_random_plans)
{
    unsigned seed = 20240611;
    size_t bundles = 0, unbundled = 0;
    for (int round = 0; round < 20; round++) {
        srand(seed + (unsigned)round);
        int n = 1 + rand() % 12;
        const char *src[12], *dst[12];
        static const char *sides[][2] = {
            {"shape=8x8 dtype=i32 ranks=0-1 mesh=2 place=S(0)",
             "shape=8x8 dtype=i32 ranks=2-3 mesh=2 place=S(1)"},
            {"shape=60x52 dtype=i32 ranks=0-1 place=S(0)",
             "shape=60x52 dtype=i32 ranks=3,2 place=S(1)"},
            {"shape=16x100 dtype=f32 ranks=1", "shape=16x100 dtype=f32 ranks=0,2-3 place=R"},
        };
        for (int i = 0; i < n; i++) {
            int k = rand() % 3;
            src[i] = sides[k][0];
            dst[i] = sides[k][1];
        }
        int64_t chunk = 4096 << (rand() % 3), coalesce = rand() % 2 ? 1024 : 4096;
        for (int rank = 0; rank < 4; rank++)
            for (int send = 0; send < 2; send++) {
                struct bundle_case c;
                snprintf(replay, sizeof(replay), "seed %u, rank %d, %s: ", seed + (unsigned)round,
                         rank, send ? "sends" : "receives");
                open_case(&c, plan_specs(n, src, dst, 4, 2, NULL, 0), RESHARD_ALGO_RESHARD, rank,
                          send, chunk, coalesce);
                size_t total = send ? c.s.out_off[c.s.nout] : c.s.in_off[c.s.nin];
                bundles += c.b.n;
                unbundled += total - bundled_chunks(&c, send);
                close_case(&c);
            }
    }
    cr_assert(bundles > 0 && unbundled > 0, "the mix has packed (%zu) and lone (%zu) chunks",
              bundles, unbundled);
}
