/* SPDX-License-Identifier: Apache-2.0 */
/* The ib transport's registration cache and bounce buffers (transport/ib/ib_mr.c) and its
 * completion queue's growth (ib_cq.c), on a context whose verbs are stand-ins: these run on
 * every host, where the rest of the ib suite needs an RDMA port. */
#include "base/error.h"
#include "transport/ib/ib_int.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_REGS 8

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
    ctx = (struct ib_ctx){.f = &fns};
    snprintf(ctx.port.name, sizeof(ctx.port.name), "fake0:1");
}

static void drop_registrations(void)
{
    ib_tmr_drop_all(&ctx);
}

TestSuite(ib_mr, .init = fake_context, .fini = drop_registrations);

Test(ib_mr, a_transfer_is_registered_by_the_whole_pages_it_touches)
{
    struct ibv_mr *mr = ib_tmr_get(&ctx, mem + 100, 5000, 0);
    cr_assert_not_null(mr);
    cr_assert_eq(mr->addr, (void *)mem);
    cr_assert_eq(mr->length, 2 * 4096);
    cr_assert_eq(mr->lkey, 0, "a send's registration is read-only");
}

Test(ib_mr, a_range_inside_a_registration_shares_it_until_the_last_put)
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

Test(ib_mr, a_receive_does_not_reuse_a_read_only_registration)
{
    struct ibv_mr *ro = ib_tmr_get(&ctx, mem, 100, 0);
    struct ibv_mr *rw = ib_tmr_get(&ctx, mem, 100, 1);
    cr_assert_neq(ro, rw);
    cr_assert_eq(rw->lkey, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    cr_assert_eq(ib_tmr_get(&ctx, mem + 10, 10, 0), rw, "a send may use a writable one");
    cr_assert_eq(nregs, 2);
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

Test(ib_mr, a_bounce_buffer_scatters_what_arrived_in_order)
{
    char a[3], b[4], c[5];
    memset(a, '.', sizeof(a));
    memset(b, '.', sizeof(b));
    memset(c, '.', sizeof(c));
    const struct iovec iov[] = {{a, sizeof(a)}, {b, sizeof(b)}, {c, sizeof(c)}};
    char *buf = ib_bounce_alloc(12);
    cr_assert_not_null(buf);
    memcpy(buf, "abcdefghijkl", 12);
    ib_bounce_scatter(iov, 3, buf, 5);
    free(buf);
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
