/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A receive's keys and what the transport does with what a peer sends on its queue pairs
 * (transport/ib/ib_key.c, ib_post.c, ib_cq.c), on a context whose device is a stand-in: every
 * work request posted is recorded, and the test plays the device, completing them and
 * delivering the peer's control messages and writes. These run on every host; test_ib.c runs
 * the same attacks on a real device.
 */
#include "base/error.h"
#include "fake_verbs.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Alignas(4096) char mem[1 << 20];

struct xfer {
    struct tp_req req;
    int done;
    reshard_status_t st;
    size_t got;
};

static void on_done(struct tp_req *req, reshard_status_t st, size_t got)
{
    struct xfer *t = container_of(req, struct xfer, req);
    t->done++;
    t->st = st;
    t->got = got;
}

/* Requests outlive the test's body: the teardown completes what is left. */
static struct xfer xfers[8];
static int nxfers;

static struct xfer *new_xfer(void)
{
    cr_assert_lt(nxfers, 8);
    xfers[nxfers] = (struct xfer){.req.done = on_done};
    return &xfers[nxfers++];
}

static void up(void)
{
    nxfers = 0;
    memset(mem, 0, sizeof(mem));
    cr_assert(fake_up(), "%s", rs_error_message());
}

static void down(void)
{
    fake_down();
}

TestSuite(ib_key, .init = up, .fini = down);

static void *reg(char *buf, size_t len)
{
    void *mh = NULL;
    cr_assert_eq(ib_mem_reg(&fake.x.super, buf, len, TP_MEM_HOST, &mh), RESHARD_OK);
    return mh;
}

static uint32_t recv_id(const struct xfer *t)
{
    return ((const struct ib_recv *)t->req.handle)->id;
}

/* Posts a registered 256 KiB receive and binds its windows: returns the CTS's index. */
static int offered(struct xfer *t, void *mh)
{
    cr_assert_eq(ib_recv(&fake.x.super, 0, 7, mem + 4096, 256 << 10, mh, &t->req), RESHARD_OK, "%s",
                 rs_error_message());
    int b0 = fake_find(IBV_WR_BIND_MW, 0), b1 = fake_find(IBV_WR_BIND_MW, b0 + 1);
    cr_assert(b0 >= 0 && b1 >= 0, "a window per queue pair");
    fake_complete(b0, IBV_WC_SUCCESS);
    fake_complete(b1, IBV_WC_SUCCESS);
    fake_run();
    int cts = fake_find(IBV_WR_SEND, 0);
    cr_assert_geq(cts, 0);
    return cts;
}

Test(ib_key, a_receive_binds_a_window_per_queue_pair_over_exactly_its_bytes_before_its_cts)
{
    void *mh = reg(mem, sizeof(mem));
    struct xfer *t = new_xfer();
    cr_assert_eq(ib_recv(&fake.x.super, 0, 7, mem + 4096, 256 << 10, mh, &t->req), RESHARD_OK);
    cr_assert_eq(fake_count(IBV_WR_BIND_MW), 2);
    cr_assert_eq(fake_count(IBV_WR_SEND), 0, "no CTS before the windows are bound");
    for (int q = 0; q < 2; q++) {
        const struct fake_wr *b = &fake.wrs[fake_find(IBV_WR_BIND_MW, q)];
        cr_assert_eq(b->qp, q, "each window on the queue pair its stripe takes");
        cr_assert_eq(b->addr, (uintptr_t)(mem + 4096));
        cr_assert_eq(b->len, 256 << 10, "exactly the receive's bytes");
        cr_assert_eq(b->mw_access, IBV_ACCESS_REMOTE_WRITE);
        cr_assert_eq(b->mr, ((struct ib_reg *)mh)->mr);
    }
    fake_complete(0, IBV_WC_SUCCESS);
    fake_run();
    cr_assert_eq(fake_count(IBV_WR_SEND), 0, "one window still binding");
    fake_complete(1, IBV_WC_SUCCESS);
    fake_run();
    int cts = fake_find(IBV_WR_SEND, 0);
    cr_assert_geq(cts, 0);
    const struct ib_ctl *c = &fake.wrs[cts].ctl;
    char why[160] = "";
    cr_assert_eq(ib_ctl_check(c, sizeof(*c), 2, why, sizeof(why)), 0, "%s", why);
    cr_assert_eq(c->type, CTL_CTS);
    cr_assert_eq(c->tag, 7);
    cr_assert_eq(c->addr, (uintptr_t)(mem + 4096));
    cr_assert_eq(c->len, 256 << 10);
    cr_assert_eq(c->nkeys, 2);
    cr_assert_eq(c->rkey[0], fake.wrs[0].new_rkey);
    cr_assert_eq(c->rkey[1], fake.wrs[1].new_rkey);
    cr_assert_neq(c->rkey[0], c->rkey[1]);
    cr_assert_eq(t->done, 0);
    ib_mem_dereg(&fake.x.super, mh);
}

Test(ib_key, a_receive_completes_only_once_its_windows_are_invalidated)
{
    void *mh = reg(mem, sizeof(mem));
    struct xfer *t = new_xfer();
    const struct ib_ctl c = fake.wrs[offered(t, mh)].ctl;
    uint32_t id = recv_id(t);
    fake_peer_writes(id << 8 | 2, 128 << 10);
    fake_peer_writes(id << 8 | 2, 128 << 10);
    fake_run();
    cr_assert_eq(fake_count(IBV_WR_LOCAL_INV), 2);
    cr_assert_eq(t->done, 0, "a window is still valid");
    int i0 = fake_find(IBV_WR_LOCAL_INV, 0), i1 = fake_find(IBV_WR_LOCAL_INV, i0 + 1);
    cr_assert_eq(fake.wrs[i0].inv_rkey, c.rkey[fake.wrs[i0].qp]);
    cr_assert_eq(fake.wrs[i1].inv_rkey, c.rkey[fake.wrs[i1].qp]);
    fake_complete(i0, IBV_WC_SUCCESS);
    fake_run();
    cr_assert_eq(t->done, 0);
    fake_complete(i1, IBV_WC_SUCCESS);
    fake_run();
    cr_assert_eq(t->done, 1);
    cr_assert_eq(t->st, RESHARD_OK);
    cr_assert_eq(t->got, 256 << 10);
    /* the next receive takes the same windows back, with new keys */
    int before = fake.nwr;
    struct xfer *u = new_xfer();
    cr_assert_eq(ib_recv(&fake.x.super, 0, 8, mem, 4096, mh, &u->req), RESHARD_OK);
    int b = fake_find(IBV_WR_BIND_MW, before);
    cr_assert_geq(b, 0);
    cr_assert_eq(fake.nmws, 2, "no new window");
    cr_assert_neq(fake.wrs[b].new_rkey, c.rkey[0]);
    cr_assert_neq(fake.wrs[b].new_rkey, c.rkey[1]);
    ib_mem_dereg(&fake.x.super, mh);
}

/* The attack: a peer writes (or completes with a zero-byte write) a receive before it was
 * offered to it. */
Test(ib_key, an_immediate_for_a_receive_not_yet_offered_fails_the_peer)
{
    void *mh = reg(mem, sizeof(mem));
    struct xfer *t = new_xfer();
    cr_assert_eq(ib_recv(&fake.x.super, 0, 7, mem, 4096, mh, &t->req), RESHARD_OK);
    fake_peer_writes(recv_id(t) << 8 | 1, 0);
    fake_run();
    cr_assert_eq(fake.peer->state, P_DOWN);
    cr_assert_eq(fake.x.super.failed_peer, 0);
    cr_assert(strstr(fake.x.super.failed_why, "names no receive it was offered"), "%s",
              fake.x.super.failed_why);
    cr_assert_eq(t->done, 1);
    cr_assert_eq(t->st, RESHARD_ERR_NETWORK);
    ib_mem_dereg(&fake.x.super, mh);
}

Test(ib_key, an_immediate_for_another_receive_id_fails_the_peer)
{
    fake_peer_writes(4242u << 8 | 1, 0);
    fake_run();
    cr_assert_eq(fake.x.super.failed_peer, 0);
    cr_assert(strstr(fake.x.super.failed_why, "immediate 0x00109201"), "%s",
              fake.x.super.failed_why);
}

/* The attack: a write longer than the receive (a device enforces the window; this is the last
 * check, for one that does not). */
Test(ib_key, a_write_longer_than_its_receive_fails_the_peer)
{
    void *mh = reg(mem, sizeof(mem));
    struct xfer *t = new_xfer();
    offered(t, mh);
    fake_peer_writes(recv_id(t) << 8 | 1, (256 << 10) + 1);
    fake_run();
    cr_assert_eq(fake.x.super.failed_peer, 0);
    cr_assert_str_eq(fake.x.super.failed_why, "wrote more than its receive holds");
    cr_assert_eq(t->done, 1);
    cr_assert_neq(t->st, RESHARD_OK);
    ib_mem_dereg(&fake.x.super, mh);
}

Test(ib_key, stripes_that_disagree_on_their_count_fail_the_peer)
{
    void *mh = reg(mem, sizeof(mem));
    struct xfer *t = new_xfer();
    offered(t, mh);
    fake_peer_writes(recv_id(t) << 8 | 3, 1000);
    fake_peer_writes(recv_id(t) << 8 | 2, 1000);
    fake_run();
    cr_assert_str_eq(fake.x.super.failed_why, "announced two stripe counts for one message");
    ib_mem_dereg(&fake.x.super, mh);
}

/* The attack: malformed control messages. Each fails the fake.peer, naming what was wrong. */
Test(ib_key, a_malformed_control_message_fails_the_peer)
{
    struct {
        struct ib_ctl c;
        uint32_t got;
        const char *why;
    } cases[] = {
        {{.type = CTL_CTS, .id = 1, .len = 10, .nkeys = 1}, 40, "a 40-byte control message"},
        {{.type = 9, .id = 1}, sizeof(struct ib_ctl), "unknown type 9"},
        {{.type = CTL_CTS, .id = 0}, sizeof(struct ib_ctl), "receive id 0"},
        {{.type = CTL_CTS, .id = 1u << 24}, sizeof(struct ib_ctl), "receive id 16777216"},
        {{.type = CTL_CTS, .id = 1, .pad = 1}, sizeof(struct ib_ctl), "padding"},
        {{.type = CTL_CTS, .id = 1, .len = 1 << 20, .nkeys = 1},
         sizeof(struct ib_ctl),
         "with 1 keys (2 expected)"},
        {{.type = CTL_CTS, .id = 1, .len = 10, .nkeys = 1, .rkey = {1, 2}},
         sizeof(struct ib_ctl),
         "stray key 0x2"},
        {{.type = CTL_CTS, .id = 1, .addr = UINT64_MAX - 5, .len = 10, .nkeys = 1},
         sizeof(struct ib_ctl),
         "wraps the address space"},
        {{.type = CTL_CTS, .id = 1, .len = UINT64_C(1) << 40, .nkeys = 2},
         sizeof(struct ib_ctl),
         "more stripes than an immediate counts"},
        {{.type = CTL_CANCEL, .id = 1, .tag = 5}, sizeof(struct ib_ctl), "fields of a CTS"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        if (i) {
            down();
            up();
        }
        fake_peer_says(&cases[i].c, cases[i].got);
        fake_run();
        cr_assert_eq(fake.peer->state, P_DOWN, "case %zu", i);
        cr_assert(strstr(fake.x.super.failed_why, cases[i].why), "case %zu: %s", i,
                  fake.x.super.failed_why);
    }
}

/* The attack: a flood of CTS that no send will ever match. */
Test(ib_key, waiting_cts_are_bounded)
{
    fake.peer->ncts = IB_MAX_CTS - 1; /* as if that many waited */
    struct ib_ctl c = {.type = CTL_CTS, .id = 1, .tag = 1, .len = 64, .nkeys = 1, .rkey = {9}};
    fake_peer_says(&c, sizeof(c));
    fake_run();
    cr_assert_eq(fake.peer->state, P_UP);
    cr_assert_eq(fake.peer->ncts, IB_MAX_CTS);
    static char src[64];
    struct xfer *s = new_xfer();
    cr_assert_eq(ib_send(&fake.x.super, 0, 1, src, sizeof(src), NULL, 0, &s->req), RESHARD_OK);
    cr_assert_eq(fake.peer->ncts, IB_MAX_CTS - 1, "a matched CTS no longer counts");
    c.id = 2;
    fake_peer_says(&c, sizeof(c));
    c.id = 3;
    fake_peer_says(&c, sizeof(c));
    fake_run();
    cr_assert_eq(fake.peer->state, P_DOWN);
    cr_assert(strstr(fake.x.super.failed_why, "offered more than 1048576 receives"), "%s",
              fake.x.super.failed_why);
}

Test(ib_key, the_sender_writes_each_stripe_with_the_key_of_its_queue_pair)
{
    void *mh = reg(mem, sizeof(mem));
    struct xfer *s = new_xfer();
    cr_assert_eq(ib_send(&fake.x.super, 0, 9, mem, 256 << 10, mh, 0, &s->req), RESHARD_OK);
    struct ib_ctl c = {.type = CTL_CTS,
                       .id = 5,
                       .tag = 9,
                       .addr = 0x10000,
                       .len = 256 << 10,
                       .nkeys = 2,
                       .rkey = {0xaa, 0xbb}};
    fake_peer_says(&c, sizeof(c));
    fake_run();
    int w0 = fake_find(IBV_WR_RDMA_WRITE_WITH_IMM, 0),
        w1 = fake_find(IBV_WR_RDMA_WRITE_WITH_IMM, w0 + 1);
    cr_assert(w0 >= 0 && w1 >= 0);
    cr_assert_eq(fake.wrs[w0].qp, 0);
    cr_assert_eq(fake.wrs[w0].rkey, 0xaa);
    cr_assert_eq(fake.wrs[w0].raddr, 0x10000);
    cr_assert_eq(fake.wrs[w1].qp, 1);
    cr_assert_eq(fake.wrs[w1].rkey, 0xbb);
    cr_assert_eq(fake.wrs[w1].raddr, 0x10000 + (128 << 10));
    cr_assert_eq(fake.wrs[w0].imm, 5u << 8 | 2);
    ib_mem_dereg(&fake.x.super, mh);
}

Test(ib_key, without_windows_a_receive_registers_exactly_its_bytes_until_it_ends)
{
    fake.x.windows = 0;
    void *mh = reg(mem, sizeof(mem));
    int regs = fake.nmrs;
    struct xfer *t = new_xfer();
    cr_assert_eq(ib_recv(&fake.x.super, 0, 7, mem + 10, 1000, mh, &t->req), RESHARD_OK);
    cr_assert_eq(fake.nmrs, regs + 1);
    const struct ibv_mr *own = &fake.mrs[regs];
    cr_assert_eq(own->addr, (void *)(mem + 10));
    cr_assert_eq(own->length, 1000);
    cr_assert_eq(own->lkey, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    int cts = fake_find(IBV_WR_SEND, 0);
    cr_assert_geq(cts, 0, "the CTS goes at once");
    cr_assert_eq(fake.wrs[cts].ctl.nkeys, 1);
    cr_assert_eq(fake.wrs[cts].ctl.rkey[0], own->rkey);
    int deregs = fake.nderegs;
    fake_peer_writes(recv_id(t) << 8 | 1, 1000);
    fake_run();
    cr_assert_eq(fake.nderegs, deregs + 1, "its registration went with it");
    cr_assert_eq(t->done, 1);
    cr_assert_eq(t->got, 1000);
    ib_mem_dereg(&fake.x.super, mh);
}

Test(ib_key, a_transfer_outside_its_registration_is_refused_before_anything_is_posted)
{
    void *mh = reg(mem + 4096, 4096);
    struct xfer *t = new_xfer();
    rs_error_clear();
    cr_assert_eq(ib_recv(&fake.x.super, 0, 7, mem + 8000, 200, mh, &t->req),
                 RESHARD_ERR_INVALID_ARG);
    cr_assert(strstr(rs_error_message(), "200-byte receive"), "%s", rs_error_message());
    cr_assert(strstr(rs_error_message(), "lies outside its registration (4096 bytes"), "%s",
              rs_error_message());
    cr_assert_eq(ib_recv(&fake.x.super, 0, 7, mem + 4095, 2, mh, &t->req), RESHARD_ERR_INVALID_ARG);
    cr_assert_eq(ib_send(&fake.x.super, 0, 7, mem + 4097, 4096, mh, 0, &t->req),
                 RESHARD_ERR_INVALID_ARG);
    cr_assert(strstr(rs_error_message(), "4096-byte send"), "%s", rs_error_message());
    cr_assert_eq(fake.nwr, 0);
    cr_assert_eq(ib_recv(&fake.x.super, 0, 7, mem + 4096, 4096, mh, &t->req), RESHARD_OK,
                 "the whole registration fits");
    ib_mem_dereg(&fake.x.super, mh);
}

Test(ib_key, a_receive_larger_than_one_message_can_be_is_refused)
{
    struct xfer *t = new_xfer();
    cr_assert_eq(ib_recv(&fake.x.super, 0, 7, mem, (size_t)255 << 30, NULL, &t->req),
                 RESHARD_ERR_TOO_LARGE);
    cr_assert(strstr(rs_error_message(), "larger than one message can be"), "%s",
              rs_error_message());
    cr_assert_eq(fake.nwr, 0);
    cr_assert_eq(ib_stripes((size_t)254 << 30, 2), 254, "the largest that fits");
}

Test(ib_key, a_receive_cancelled_while_its_windows_bind_ends_without_a_cts)
{
    void *mh = reg(mem, sizeof(mem));
    struct xfer *t = new_xfer();
    cr_assert_eq(ib_recv(&fake.x.super, 0, 7, mem, 256 << 10, mh, &t->req), RESHARD_OK);
    ib_cancel(&fake.x.super, &t->req);
    fake_complete(0, IBV_WC_SUCCESS);
    fake_complete(1, IBV_WC_SUCCESS);
    fake_run();
    cr_assert_eq(fake_count(IBV_WR_SEND), 0, "nothing asked of the sender");
    cr_assert_eq(fake_count(IBV_WR_LOCAL_INV), 2);
    cr_assert_eq(t->done, 0);
    fake_complete(fake_find(IBV_WR_LOCAL_INV, 0), IBV_WC_SUCCESS);
    fake_complete(fake_find(IBV_WR_LOCAL_INV, fake_find(IBV_WR_LOCAL_INV, 0) + 1), IBV_WC_SUCCESS);
    fake_run();
    cr_assert_eq(t->done, 1);
    cr_assert_eq(t->st, RESHARD_ERR_NETWORK);
    cr_assert(strstr(rs_error_message(), "cancelled"), "%s", rs_error_message());
    ib_mem_dereg(&fake.x.super, mh);
}

Test(ib_key, a_peer_failing_while_the_windows_are_invalidated_keeps_the_data)
{
    void *mh = reg(mem, sizeof(mem));
    struct xfer *t = new_xfer();
    offered(t, mh);
    fake_peer_writes(recv_id(t) << 8 | 2, 100);
    fake_peer_writes(recv_id(t) << 8 | 2, 200);
    fake_run();
    cr_assert_eq(fake_count(IBV_WR_LOCAL_INV), 2);
    ib_peer_down(&fake.x, fake.peer, RESHARD_ERR_NETWORK, "gone");
    ib_deliver(&fake.x);
    cr_assert_eq(t->done, 1);
    cr_assert_eq(t->st, RESHARD_OK, "the data had landed whole; its QPs take no more");
    cr_assert_eq(t->got, 300);
    for (size_t i = 0; i < fake.peer->nwins; i++)
        cr_assert_eq(fake.peer->wins[i]->state, WIN_DEAD);
    /* deallocated at once: a registration under a bound window cannot be deregistered (soft-
     * RoCE refuses), and these can no longer be invalidated through their queue pairs */
    cr_assert_eq(fake.ndeallocs, 2);
    ib_mem_dereg(&fake.x.super, mh);
}

Test(ib_key, a_scatter_receive_lands_in_the_arena_not_next_to_its_list)
{
    static char a[1000], b[2000];
    struct iovec iov[2] = {{a, sizeof(a)}, {b, sizeof(b)}};
    struct xfer *t = new_xfer();
    cr_assert_eq(ib_recv_iov(&fake.x.super, 0, 3, iov, 2, &t->req), RESHARD_OK);
    const struct ib_recv *r = t->req.handle;
    cr_assert_not_null(r->bounce);
    int b0 = fake_find(IBV_WR_BIND_MW, 0);
    cr_assert_eq(fake.wrs[b0].addr, (uintptr_t)r->bounce->buf);
    cr_assert_eq(fake.wrs[b0].len, 3000);
    cr_assert_eq(fake.wrs[b0].mr, r->bounce->mr);
    cr_assert_eq(fake_count(IBV_WR_BIND_MW), 1, "3000 bytes take one stripe");
    fake_complete(b0, IBV_WC_SUCCESS);
    fake_run();
    const struct ib_ctl *c = &fake.wrs[fake_find(IBV_WR_SEND, 0)].ctl;
    cr_assert_eq(c->addr, (uintptr_t)r->bounce->buf);
    for (int i = 0; i < 3000; i++) /* the device writes */
        ((char *)(uintptr_t)c->addr)[i] = (char)(i % 251);
    fake_peer_writes(c->id << 8 | 1, 3000);
    fake_run();
    fake_complete(fake_find(IBV_WR_LOCAL_INV, 0), IBV_WC_SUCCESS);
    fake_run();
    cr_assert_eq(t->done, 1);
    cr_assert_eq(t->got, 3000);
    cr_assert_eq(a[999], (char)(999 % 251));
    cr_assert_eq(b[1999], (char)(2999 % 251));
    cr_assert_eq(fake.x.bounce_kept, 4096, "back in the arena");
}
