/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A rank's share of a transfer list (plugin/exec/exec_share.c): what it sends (in rotated peer
 * order) and receives, where each transfer's chunks start, which received transfers release
 * which sends, what waits for whole tensors, and the peers each way. Worked by hand from the
 * transfer lists test_xfer.c checks.
 */
#include "plugin/exec/exec_int.h"
#include "test/planner/plan_util.h"

#include <criterion/criterion.h>
#include <string.h>

#define WHOLE_ON_0 "shape=4x4 dtype=f32 ranks=0"
#define ON_2_AND_3 "shape=4x4 dtype=f32 ranks=2-3 place=R"

struct share_case {
    struct rs_plan *p;
    struct xfer_set xs;
    struct exec_cut cut;
    struct exec_share s;
};

static void open_case(struct share_case *c, struct rs_plan *p, reshard_algo_t algo, int rank,
                      int size)
{
    c->p = p;
    cr_assert_eq(xfer_build(p, algo, &c->xs), RESHARD_OK);
    exec_cut_init(&c->cut, p, &c->xs);
    cr_assert_eq(exec_share_init(&c->s, &c->cut, rank, size), RESHARD_OK, "%s", rs_error_message());
}

static void close_case(struct share_case *c)
{
    exec_share_fini(&c->s);
    xfer_free(&c->xs);
    plan_free(c->p);
}

static const struct xfer *out_xfer(const struct share_case *c, size_t o)
{
    return &c->xs.x[c->s.out[o]];
}

/* reshard, 0 -> {2, 3}: rank 0 sends a half to each rail and receives nothing. */
Test(share, a_pure_sender_sends_in_rotated_order_and_receives_nothing)
{
    struct share_case c;
    open_case(&c, plan_one(WHOLE_ON_0, ON_2_AND_3, 4, 2), RESHARD_ALGO_RESHARD, 0, 4);
    cr_assert_eq(c.s.nout, 2);
    cr_assert_eq(c.s.nin, 0);
    cr_assert_eq(out_xfer(&c, 0)->dst, 2); /* 2 is nearer after rank 0 than 3 */
    cr_assert_eq(out_xfer(&c, 1)->dst, 3);
    cr_assert(c.s.out_off[0] == 0 && c.s.out_off[1] == 1 && c.s.out_off[2] == 2);
    cr_assert_eq(c.s.nsend_peers, 2);
    cr_assert(c.s.send_peers[0] == 2 && c.s.send_peers[1] == 3);
    cr_assert_eq(c.s.nrecv_peers, 0);
    cr_assert_eq(c.s.dst_chunks[0], 0);
    cr_assert_eq(c.s.tmp_chunks[0], 0);
    close_case(&c);
}

/* Rank 2 receives its half from 0 and the other half from 3, and forwards its own half to 3
 * as it arrives: the forward is the child of the receive from 0. */
Test(share, a_forward_is_released_by_the_receive_it_forwards)
{
    struct share_case c;
    open_case(&c, plan_one(WHOLE_ON_0, ON_2_AND_3, 4, 2), RESHARD_ALGO_RESHARD, 2, 4);
    cr_assert_eq(c.s.nout, 1);
    cr_assert_eq(c.s.nin, 2);
    cr_assert(c.s.in[0] < c.s.in[1], "incoming transfers by index");
    const struct xfer *fwd = out_xfer(&c, 0);
    cr_assert(fwd->dst == 3 && fwd->path == XFER_LOCAL);
    long k = exec_share_in_pos(&c.s, fwd->parent);
    cr_assert_geq(k, 0);
    cr_assert_eq(c.xs.x[c.s.in[k]].src, 0, "released by the half from rank 0");
    cr_assert_eq(c.s.child_first[k + 1] - c.s.child_first[k], 1);
    cr_assert_eq(c.s.child[c.s.child_first[k]], 0);
    cr_assert_eq(c.s.child_first[2 - k] - c.s.child_first[1 - k], 0, "the other releases none");
    cr_assert_eq(c.s.dst_chunks[0], 2, "both halves land here");
    cr_assert_eq(c.s.nsend_peers, 1);
    cr_assert_eq(c.s.send_peers[0], 3);
    cr_assert_eq(c.s.nrecv_peers, 2);
    cr_assert_eq(exec_share_in_pos(&c.s, c.s.out[0]), -1, "not an incoming transfer");
    close_case(&c);
}

/* Each rank its own domain: rank 1 sends to 0, 2 and 3 starting with the one after itself. */
Test(share, sends_start_at_the_peer_after_this_rank)
{
    struct share_case c;
    open_case(
        &c,
        plan_one("shape=4x4 dtype=f32 ranks=1", "shape=4x4 dtype=f32 ranks=0,2,3 place=R", 4, 1),
        RESHARD_ALGO_RESHARD, 1, 4);
    cr_assert_eq(c.s.nout, 3);
    cr_assert_eq(out_xfer(&c, 0)->dst, 2);
    cr_assert_eq(out_xfer(&c, 1)->dst, 3);
    cr_assert_eq(out_xfer(&c, 2)->dst, 0);
    cr_assert(c.s.send_peers[0] == 2 && c.s.send_peers[1] == 3 && c.s.send_peers[2] == 0);
    close_case(&c);
}

/* 64x64 f32 in 4 KiB chunks: 4 each; the offsets add up per transfer. */
Test(share, chunk_offsets_add_up_each_transfers_chunks)
{
    struct share_case c;
    struct rs_plan *p =
        plan_one("shape=64x64 dtype=f32 ranks=0", "shape=64x64 dtype=f32 ranks=1-3 place=R", 4, 1);
    cr_assert_eq(xfer_build(p, RESHARD_ALGO_RESHARD, &c.xs), RESHARD_OK);
    c.p = p;
    exec_cut_init(&c.cut, p, &c.xs);
    c.cut.chunk_bytes = 4096;
    cr_assert_eq(exec_share_init(&c.s, &c.cut, 0, 4), RESHARD_OK);
    cr_assert_eq(c.s.nout, 3);
    for (size_t o = 0; o <= 3; o++)
        cr_assert_eq(c.s.out_off[o], 4 * o);
    close_case(&c);
}

/* bcast, rank 2 (xfer.c's list: 0 gather, 1 hop 0->2, 2 hop 2->3, 3 and 4 the extracts): the
 * hop to 3 waits for the hop from 0; its own extract waits for the whole tensor, which one
 * chunk fills. */
Test(share, bcast_waits_for_whole_tensors)
{
    struct share_case c;
    open_case(&c, plan_one(WHOLE_ON_0, ON_2_AND_3, 4, 2), RESHARD_ALGO_BCAST, 2, 4);
    cr_assert_eq(c.s.nout, 2);
    cr_assert_eq(c.s.out[0], 3, "the extract (to itself) first");
    cr_assert_eq(c.s.out[1], 2);
    cr_assert_eq(c.s.nin, 1);
    cr_assert_eq(c.s.in[0], 1);
    cr_assert_eq(c.s.child_first[1], 1);
    cr_assert_eq(c.s.child[0], 1, "the hop to 3 follows the hop from 0");
    cr_assert_eq(c.s.after_first[1], 1);
    cr_assert_eq(c.s.after[0], 0, "the extract waits for the whole tensor");
    cr_assert_eq(c.s.tmp_chunks[0], 1);
    cr_assert_eq(c.s.dst_chunks[0], 1);
    cr_assert_eq(c.s.nsend_peers, 1, "a copy to itself has no peer");
    cr_assert_eq(c.s.send_peers[0], 3);
    cr_assert_eq(c.s.nrecv_peers, 1);
    cr_assert_eq(c.s.recv_peers[0], 0);
    close_case(&c);
}

Test(share, the_gathering_root_counts_its_own_copy_into_the_whole_tensor)
{
    struct share_case c;
    open_case(&c, plan_one(WHOLE_ON_0, ON_2_AND_3, 4, 2), RESHARD_ALGO_BCAST, 0, 4);
    cr_assert_eq(c.s.nout, 2);
    cr_assert(c.s.out[0] == 0 && c.s.out[1] == 1);
    cr_assert_eq(c.s.tmp_chunks[0], 1);
    cr_assert_eq(c.s.after[0], 1, "the first hop waits for the gather");
    cr_assert_eq(c.s.dst_chunks[0], 0);
    close_case(&c);
}

/* 2^20 + 1 rows of 8 bytes, a row a chunk: over the tag's 20-bit chunk field. */
Test(share, a_transfer_of_more_than_2_20_chunks_is_refused)
{
    struct share_case c;
    struct rs_plan *p =
        plan_one("shape=1048577x2 dtype=f32 ranks=0", "shape=1048577x2 dtype=f32 ranks=1", 2, 2);
    cr_assert_eq(xfer_build(p, RESHARD_ALGO_RESHARD, &c.xs), RESHARD_OK);
    c.p = p;
    exec_cut_init(&c.cut, p, &c.xs);
    c.cut.chunk_bytes = 8;
    cr_assert_eq(exec_share_init(&c.s, &c.cut, 0, 2), RESHARD_ERR_TOO_LARGE);
    cr_assert(strstr(rs_error_message(), "is 1048577 chunks of RESHARD_CHUNK_BYTES=8, more than "
                                         "the 1048576 a message tag can number: raise "
                                         "RESHARD_CHUNK_BYTES"),
              "%s", rs_error_message());
    cr_assert_null(c.s.out, "a failed init leaves nothing");
    close_case(&c);
}

/* Every allocation of the init fails in turn: a clean error, nothing left behind (ASan). */
Test(share, each_failed_allocation_is_an_error_that_frees_the_rest)
{
    struct share_case c;
    struct rs_plan *p = plan_one(WHOLE_ON_0, ON_2_AND_3, 4, 2);
    cr_assert_eq(xfer_build(p, RESHARD_ALGO_BCAST, &c.xs), RESHARD_OK);
    c.p = p;
    exec_cut_init(&c.cut, p, &c.xs);
    int failed = 0;
    for (long n = 1; n < 100; n++) {
        rs_test_fail_alloc(n);
        reshard_status_t st = exec_share_init(&c.s, &c.cut, 2, 4);
        rs_test_fail_alloc(0);
        if (st == RESHARD_OK)
            break;
        cr_assert_eq(st, RESHARD_ERR_NO_MEMORY, "n = %ld", n);
        cr_assert_null(c.s.out, "n = %ld", n);
        failed++;
    }
    cr_assert_geq(failed, 10, "only %d allocations", failed);
    close_case(&c);
}
