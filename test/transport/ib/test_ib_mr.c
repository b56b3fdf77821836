/* SPDX-License-Identifier: Apache-2.0 */
/* The ib transport's registrations (transport/ib/ib_mr.c), its bounce buffers' arena
 * (ib_bounce.c) and its completion queue's growth (ib_cq.c), on a context whose verbs are
 * stand-ins: these run on every host, where the rest of the ib suite needs an RDMA port. A
 * stand-in registration keeps the access it was asked for in its lkey. */
#include "base/error.h"
#include "transport/ib/ib_int.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_REGS 8
#define NO_REMOTE_ACCESS                                                                           \
    (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)

static struct ibv_mr regs[MAX_REGS];
static int nregs, nderegs, resized_to;
static struct ib_fns fns;
static struct ib_ctx ctx;
static _Alignas(4096) char mem[4 * 4096];

static struct ibv_mr *fake_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access)
{
    (void)pd;
    if (nregs == MAX_REGS)
        return NULL;
    struct ibv_mr *mr = &regs[nregs++];
    *mr = (struct ibv_mr){.addr = addr, .length = len, .lkey = (uint32_t)access};
    return mr;
}

static int fake_dereg_mr(struct ibv_mr *mr)
{
    (void)mr;
    nderegs++;
    return 0;
}

static int fake_resize_cq(struct ibv_cq *cq, int cqe)
{
    (void)cq;
    resized_to = cqe;
    return 0;
}

static void fake_context(void)
{
    nregs = nderegs = resized_to = 0;
    fns = (struct ib_fns){
        .reg_mr = fake_reg_mr, .dereg_mr = fake_dereg_mr, .resize_cq = fake_resize_cq};
    ctx = (struct ib_ctx){.f = &fns, .windows = 1};
    snprintf(ctx.port.name, sizeof(ctx.port.name), "fake0:1");
}

static void drop_registrations(void)
{
    ib_tmr_drop_all(&ctx);
    ib_bounce_drop_all(&ctx);
}

TestSuite(ib_mr, .init = fake_context, .fini = drop_registrations);

Test(ib_mr, a_send_is_registered_read_only_by_the_whole_pages_it_touches)
{
    struct ibv_mr *mr = ib_tmr_get(&ctx, mem + 100, 5000, 0);
    cr_assert_not_null(mr);
    cr_assert_eq(mr->addr, (void *)mem);
    cr_assert_eq(mr->length, 2 * 4096);
    cr_assert_eq(mr->lkey, 0, "a send's registration is read-only");
}

Test(ib_mr, a_range_inside_a_send_registration_shares_it_until_the_last_put)
{
    struct ibv_mr *a = ib_tmr_get(&ctx, mem + 100, 5000, 0);
    struct ibv_mr *b = ib_tmr_get(&ctx, mem + 4096, 100, 0);
    cr_assert_eq(a, b);
    cr_assert_eq(nregs, 1);
    ib_tmr_put(&ctx, a);
    cr_assert_eq(nderegs, 0, "one transfer still holds it");
    ib_tmr_put(&ctx, b);
    cr_assert_eq(nderegs, 1, "idle registrations are dropped, not cached");
    cr_assert_null(ctx.tmrs);
}

/* The attack: a key whose registration covers whole pages reaches the heap next to the
 * receive. A receive's transient registration is exactly its bytes, its own, and grants no
 * remote access (windows over it do, for the receive's life). */
Test(ib_mr, a_receive_registers_exactly_its_bytes_without_remote_access)
{
    struct ibv_mr *ro = ib_tmr_get(&ctx, mem, 100, 0);
    struct ibv_mr *rw = ib_tmr_get(&ctx, mem + 10, 50, 1);
    cr_assert_neq(ro, rw, "a receive does not reuse a send's registration");
    cr_assert_eq(rw->addr, (void *)(mem + 10));
    cr_assert_eq(rw->length, 50, "not the whole page");
    cr_assert_eq(rw->lkey, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
    cr_assert_neq(ib_tmr_get(&ctx, mem + 10, 50, 1), rw, "nor another receive's");
    cr_assert_eq(ib_tmr_get(&ctx, mem + 20, 10, 0), ro, "a send never uses a receive's either");
    cr_assert_eq(nregs, 3);
}

Test(ib_mr, without_windows_a_receive_registration_has_no_window_right)
{
    ctx.windows = 0;
    struct ibv_mr *rw = ib_tmr_get(&ctx, mem, 50, 1);
    cr_assert_eq(rw->lkey, IBV_ACCESS_LOCAL_WRITE);
}

Test(ib_mr, a_failed_registration_says_where)
{
    nregs = MAX_REGS;
    rs_error_clear();
    cr_assert_null(ib_tmr_get(&ctx, mem, 100, 1));
    cr_assert_not_null(strstr(rs_error_message(), "registering 100 bytes"), "%s",
                       rs_error_message());
    cr_assert_null(ctx.tmrs);
}

Test(ib_mr, closing_drops_every_registration_left)
{
    ib_tmr_get(&ctx, mem, 100, 0);
    ib_tmr_get(&ctx, mem + 3 * 4096, 100, 1);
    ib_tmr_drop_all(&ctx);
    cr_assert_eq(nderegs, 2);
    cr_assert_null(ctx.tmrs);
}

/* The attack: sources and staging registered with REMOTE_WRITE let any peer write them
 * whenever it likes. A registration grants no remote access, with windows or without. */
Test(ib_mr, a_registration_grants_no_remote_access)
{
    char buf[256];
    for (int windows = 1; windows >= 0; windows--) {
        ctx.windows = windows;
        void *mh = NULL;
        cr_assert_eq(ib_mem_reg(&ctx.super, buf, sizeof(buf), TP_MEM_HOST, &mh), RESHARD_OK);
        struct ib_reg *g = mh;
        cr_assert_eq(g->mr->lkey & NO_REMOTE_ACCESS, 0, "access 0x%x", g->mr->lkey);
        cr_assert_eq(g->mr->lkey, IBV_ACCESS_LOCAL_WRITE | (windows ? IBV_ACCESS_MW_BIND : 0));
        cr_assert_eq(g->bindable, windows, "windows bind over it only where receives use them");
        cr_assert_eq(g->base, buf);
        cr_assert_eq(g->len, sizeof(buf));
        ib_mem_dereg(&ctx.super, mh);
    }
    cr_assert_eq(nderegs, 2);
}

/* Without windows a receive registers its own bytes, and only that registration may be written
 * from the network. */
Test(ib_mr, a_registration_of_one_receive_is_exactly_its_bytes)
{
    struct ibv_mr *mr = ib_mr_exact(&ctx, NULL, mem + 7, 93);
    cr_assert_not_null(mr);
    cr_assert_eq(mr->addr, (void *)(mem + 7));
    cr_assert_eq(mr->length, 93);
    cr_assert_eq(mr->lkey, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
}

/* ---- the bounce buffers' arena ---- */

/* The attack: a bounce buffer from malloc, registered by whole pages, exposes the heap around
 * it. The arena's buffers are mappings of their own, registered once, without remote access. */
Test(ib_mr, a_bounce_buffer_is_a_mapping_of_its_own_registered_without_remote_access)
{
    struct ib_bounce *b = ib_bounce_get(&ctx, 5000);
    cr_assert_not_null(b);
    cr_assert_eq(b->cap, 8192, "its size class");
    cr_assert_eq((uintptr_t)b->buf % 4096, 0, "whole pages of its own");
    cr_assert_not_null(b->mr);
    cr_assert_eq(b->mr->addr, (void *)b->buf);
    cr_assert_eq(b->mr->length, b->cap, "its registration covers itself and nothing else");
    cr_assert_eq(b->mr->lkey, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
    memset(b->buf, 1, b->cap); /* writable */
    ib_bounce_put(&ctx, b);
}

Test(ib_mr, a_bounce_buffer_is_reused_by_its_size_class_without_registering_again)
{
    struct ib_bounce *a = ib_bounce_get(&ctx, 5000);
    char *buf = a->buf;
    ib_bounce_put(&ctx, a);
    cr_assert_eq(nderegs, 0, "kept for the next receive");
    cr_assert_eq(ctx.bounce_kept, 8192);
    struct ib_bounce *b = ib_bounce_get(&ctx, 8000);
    cr_assert_eq(b->buf, buf, "the same class: the same buffer");
    cr_assert_eq(nregs, 1);
    cr_assert_eq(ctx.bounce_kept, 0);
    struct ib_bounce *c = ib_bounce_get(&ctx, 8193);
    cr_assert_eq(c->cap, 16384, "the next class");
    cr_assert_eq(nregs, 2);
    ib_bounce_put(&ctx, b);
    ib_bounce_put(&ctx, c);
    ib_bounce_drop_all(&ctx);
    cr_assert_eq(nderegs, 2, "closing drops the kept ones");
    cr_assert_eq(ctx.bounce_kept, 0);
}

Test(ib_mr, a_bounce_buffer_past_the_largest_class_is_not_kept)
{
    struct ib_bounce *b = ib_bounce_get(&ctx, (64u << 20) + 1);
    cr_assert_not_null(b);
    cr_assert_eq(b->cls, -1);
    cr_assert_eq(b->cap, (64u << 20) + 4096);
    ib_bounce_put(&ctx, b);
    cr_assert_eq(nderegs, 1, "unmapped at once");
    cr_assert_eq(ctx.bounce_kept, 0);
}

Test(ib_mr, without_windows_bounce_buffers_are_not_registered)
{
    ctx.windows = 0; /* each receive registers its own bytes of it */
    struct ib_bounce *b = ib_bounce_get(&ctx, 100);
    cr_assert_not_null(b);
    cr_assert_null(b->mr);
    cr_assert_eq(nregs, 0);
    ib_bounce_put(&ctx, b);
}

Test(ib_mr, a_failed_bounce_registration_says_so_and_leaks_nothing)
{
    nregs = MAX_REGS;
    rs_error_clear();
    cr_assert_null(ib_bounce_get(&ctx, 100));
    cr_assert_not_null(strstr(rs_error_message(), "registering a 4096-byte bounce buffer"), "%s",
                       rs_error_message());
    cr_assert_eq(ctx.bounce_kept, 0);
}

Test(ib_mr, a_bounce_buffer_scatters_what_arrived_in_order)
{
    char a[3], b[4], c[5];
    memset(a, '.', sizeof(a));
    memset(b, '.', sizeof(b));
    memset(c, '.', sizeof(c));
    const struct iovec iov[] = {{a, sizeof(a)}, {b, sizeof(b)}, {c, sizeof(c)}};
    struct ib_bounce *buf = ib_bounce_get(&ctx, 12);
    cr_assert_not_null(buf);
    memcpy(buf->buf, "abcdefghijkl", 12);
    ib_bounce_scatter(iov, 3, buf->buf, 5);
    ib_bounce_put(&ctx, buf);
    cr_assert_eq(memcmp(a, "abc", 3), 0);
    cr_assert_eq(memcmp(b, "de..", 4), 0, "a short message fills the list from its start");
    cr_assert_eq(memcmp(c, ".....", 5), 0);
}

Test(ib_cq, the_queue_doubles_to_fit_a_peer_within_what_the_device_allows, .init = fake_context)
{
    struct ib_peer p = {.index = 3};
    ctx.cq_cap = 4096;
    ctx.max_cqe = 10000;
    cr_assert_eq(ib_cq_fit(&ctx, &p, 4000), RESHARD_OK);
    cr_assert_eq(resized_to, 0, "room enough: no resize");
    cr_assert_eq(ib_cq_fit(&ctx, &p, 5000), RESHARD_OK);
    cr_assert_eq(ctx.cq_cap, 8192);
    cr_assert_eq(ib_cq_fit(&ctx, &p, 9000), RESHARD_OK);
    cr_assert_eq(ctx.cq_cap, 10000, "capped at the device's limit");
    cr_assert_eq(resized_to, 10000);
}

Test(ib_cq, a_peer_the_device_cannot_fit_is_refused_with_the_knob_to_turn, .init = fake_context)
{
    struct ib_peer p = {.index = 3};
    ctx.cq_cap = 4096;
    ctx.max_cqe = 8000;
    cr_assert_eq(ib_cq_fit(&ctx, &p, 8001), RESHARD_ERR_TOO_LARGE);
    cr_assert_eq(resized_to, 0);
    cr_assert_eq(ctx.cq_cap, 4096);
    cr_assert_not_null(strstr(rs_error_message(), "RESHARD_IB_QPS_PER_PEER"), "%s",
                       rs_error_message());
}

/* The flush's loopback queue pair (ib_flush.c) on stand-in verbs whose modify_qp fails at the
 * given step (1 INIT, 2 RTR, 3 RTS). */
static struct ibv_qp flush_qp;
static int modify_calls, fail_modify_at, destroyed_qps;

static struct ibv_qp *fake_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *a)
{
    (void)pd, (void)a;
    return &flush_qp;
}

static int fake_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask)
{
    (void)qp, (void)a, (void)mask;
    return ++modify_calls == fail_modify_at ? EINVAL : 0;
}

static int fake_destroy_qp(struct ibv_qp *qp)
{
    (void)qp;
    destroyed_qps++;
    return 0;
}

/* The completion queue's reckoning (cq_need) counts the flush queue pair's entries once it is
 * made: a queue pair that could not reach RTS used to be taken off it all the same, so each
 * failed flush left the queue sized for 64 entries fewer than the peers' queue pairs use, and
 * a later peer could overrun it. */
Test(ib_cq, a_flush_queue_pair_that_cannot_be_made_leaves_the_queue_reckoning_as_it_was,
     .init = fake_context, .fini = drop_registrations)
{
    fns.create_qp = fake_create_qp;
    fns.modify_qp = fake_modify_qp;
    fns.destroy_qp = fake_destroy_qp;
    ctx.cq_cap = 4096;
    ctx.max_cqe = 10000;
    ctx.cq_need = 1000;
    struct ib_reg g = {.base = mem, .len = sizeof(mem), .fd = -1};
    for (int step = 1; step <= 3; step++) {
        struct tp_req req = {0};
        modify_calls = 0;
        fail_modify_at = step;
        cr_assert_eq(ib_flush(&ctx.super, &g, mem, 64, &req), RESHARD_ERR_NETWORK, "step %d", step);
        cr_assert(strstr(rs_error_message(), "flush queue pair"), "%s", rs_error_message());
        cr_assert_null(ctx.flush_qp, "step %d: the queue pair was kept", step);
        cr_assert_eq(destroyed_qps, step, "step %d: the queue pair was not destroyed", step);
        cr_assert_eq(ctx.cq_need, 1000, "step %d: the queue's reckoning went to %d", step,
                     ctx.cq_need);
    }
}
