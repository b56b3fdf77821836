/* SPDX-License-Identifier: Apache-2.0 */
/* The ibverbs transport (transport/ib_*.c). Port selection syntax runs everywhere; the rest
 * needs an active RDMA port (scripts/rxe-test.sh runs it on soft-RoCE in a VM) and skips
 * without one. Two contexts of one process are ranks 0 and 1 of a pair. */
#include "base/error.h"
#include "base/param.h"
#include "test/plugin/ranks.h"
#include "transport/ib/ib_dev.h"
#include "transport/ib/ib_int.h"
#include "transport/tp.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

Test(ib, hca_lists_select_like_nccl)
{
    cr_assert(ib_hca_selects("", "mlx5_0", 1));
    cr_assert(ib_hca_selects("mlx5", "mlx5_3", 1), "a prefix");
    cr_assert(!ib_hca_selects("mlx5_0:2", "mlx5_0", 1), "another port");
    cr_assert(ib_hca_selects("mlx5_0:2", "mlx5_0", 2));
    cr_assert(ib_hca_selects("rxe0,mlx5_1:1", "mlx5_1", 1), "second entry");
    cr_assert(!ib_hca_selects("=mlx5_1", "mlx5_10", 1), "= is an exact name");
    cr_assert(ib_hca_selects("=mlx5_1", "mlx5_1", 1));
    cr_assert(!ib_hca_selects("^mlx5_0", "mlx5_0", 1), "^ excludes");
    cr_assert(ib_hca_selects("^mlx5_0", "rxe0", 1));
    cr_assert(!ib_hca_selects("^=mlx5", "mlx5", 1));
    cr_assert(ib_hca_selects("^=mlx5", "mlx5_0", 1));
}

/* ---- on a port ---- */

struct xfer {
    struct tp_req req;
    int done;
    reshard_status_t st;
    size_t got;
};

static void on_done(struct tp_req *req, reshard_status_t st, size_t got)
{
    struct xfer *x = container_of(req, struct xfer, req);
    x->done++;
    x->st = st;
    x->got = got;
}

static struct tp_ctx *ctx[3];
static int nctx;

/* n contexts of one process, ranks 0 .. n-1, each knowing the others. */
static void ranks_up(int n)
{
    setenv("RESHARD_TRANSPORT", "ib", 1);
    const struct tp_ops *ops;
    if (tp_pick(&ops) != RESHARD_OK)
        cr_skip_test("no active RDMA port here (%s)", rs_error_message());
    nctx = n;
    for (int r = 0; r < n; r++) {
        struct tp_config cfg = {.rank = r, .size = n, .local_rank = -1};
        cr_assert_eq(ops->init(&cfg, &ctx[r]), RESHARD_OK, "%s", rs_error_message());
    }
    for (int r = 0; r < n; r++)
        for (int o = 0; o < n; o++) {
            if (o == r)
                continue;
            char addr[256];
            size_t len = sizeof(addr);
            cr_assert_eq(ctx[o]->ops->address(ctx[o], -1, addr, &len), RESHARD_OK);
            cr_assert_eq(ctx[r]->ops->set_peer(ctx[r], o, addr, len), RESHARD_OK, "%s",
                         rs_error_message());
        }
}

static void pair_up(void)
{
    ranks_up(2);
}

static void three_up(void)
{
    ranks_up(3);
}

static void tear_down(void)
{
    for (int r = 0; r < nctx; r++)
        if (ctx[r])
            ctx[r]->ops->close(ctx[r]);
}

/* Progresses both until every xfer listed is done, or fails the test after 20 s. */
static void run_until(struct xfer **x, int n)
{
    time_t end = time(NULL) + 20;
    for (;;) {
        int left = 0;
        for (int i = 0; i < n; i++)
            left += !x[i]->done;
        if (!left)
            return;
        cr_assert(time(NULL) < end, "%d transfer(s) still pending after 20 s", left);
        for (int r = 0; r < nctx; r++)
            if (ctx[r])
                ctx[r]->ops->progress(ctx[r]);
    }
}

static void fill(unsigned char *b, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)(i * 131 + seed);
}

/* from sends len bytes to to, registered or not; checks what arrived. */
static void exchange_on(int from, int to, size_t len, int registered)
{
    unsigned char *src = malloc(len + 1), *dst = calloc(1, len + 1);
    fill(src, len, 7);
    void *smh = NULL, *rmh = NULL;
    if (registered) {
        cr_assert_eq(ctx[from]->ops->mem_reg(ctx[from], src, len + 1, TP_MEM_HOST, &smh),
                     RESHARD_OK);
        cr_assert_eq(ctx[to]->ops->mem_reg(ctx[to], dst, len + 1, TP_MEM_HOST, &rmh), RESHARD_OK);
    }
    struct xfer s = {.req.done = on_done}, r = {.req.done = on_done};
    uint64_t out0 = ctx[from]->counters.bytes_out, in0 = ctx[to]->counters.bytes_in;
    cr_assert_eq(ctx[to]->ops->recv(ctx[to], from, 42, dst, len + 1, rmh, &r.req), RESHARD_OK, "%s",
                 rs_error_message());
    cr_assert_eq(ctx[from]->ops->send(ctx[from], to, 42, src, len, smh, 0, &s.req), RESHARD_OK,
                 "%s", rs_error_message());
    run_until((struct xfer *[]){&s, &r}, 2);
    cr_assert_eq(s.st, RESHARD_OK, "%s", rs_error_message());
    cr_assert_eq(r.st, RESHARD_OK, "%s", rs_error_message());
    cr_assert_eq(r.got, len, "a %zu-byte message reports %zu", len, r.got);
    cr_assert(!memcmp(src, dst, len), "%zu bytes differ", len);
    cr_assert_eq(dst[len], 0, "wrote past the message");
    cr_assert_eq(ctx[from]->counters.bytes_out - out0, len);
    cr_assert_eq(ctx[to]->counters.bytes_in - in0, len);
    ctx[from]->ops->mem_dereg(ctx[from], smh);
    ctx[to]->ops->mem_dereg(ctx[to], rmh);
    free(src);
    free(dst);
}

static void exchange(size_t len, int registered)
{
    exchange_on(0, 1, len, registered);
}

Test(ib, a_small_message_arrives, .init = pair_up, .fini = tear_down)
{
    exchange(5000, 1);
}

/* GPUDirect needs the provider to register dma-bufs (probed at init: soft-RoCE cannot) and
 * the CUDA driver to export them; either missing is said, and device memory then stages. */
Test(ib, device_memory_registration_says_what_it_lacks, .init = pair_up, .fini = tear_down)
{
    struct tp_ctx *c = ctx[0];
    cr_log_info("dma-buf probe: %s", c->device_mem ? "supported" : c->device_mem_why);
    if (!c->device_mem)
        cr_assert(strstr(c->device_mem_why, "cannot register dma-bufs") ||
                      strstr(c->device_mem_why, "no ibv_reg_dmabuf_mr"),
                  "%s", c->device_mem_why);
    setenv("RESHARD_CUDA_LIB", "libcuda-not-here.so.1", 1);
    rs_param_reload(); /* the loader reads the table, which pair_up read already */
    char buf[4096];
    void *mh = NULL;
    cr_assert_eq(c->ops->mem_reg(c, buf, sizeof(buf), TP_MEM_CUDA, &mh), RESHARD_ERR_UNAVAILABLE);
    cr_assert(strstr(rs_error_message(), "cuda: no driver"), "%s", rs_error_message());
    cr_assert_null(mh);
}

/* A flush (GPUDirect receives, ib_flush.c) reads the receive's last bytes back through a
 * queue pair connected to itself and completes from progress(); the flushed bytes are left
 * alone; one outside its registration is refused and posts nothing. */
Test(ib, a_flush_reads_back_through_the_loopback_queue_pair_and_completes, .init = pair_up,
     .fini = tear_down)
{
    struct tp_ctx *c = ctx[0];
    static unsigned char buf[65536];
    fill(buf, sizeof(buf), 3);
    void *mh = NULL;
    cr_assert_eq(c->ops->mem_reg(c, buf, sizeof(buf), TP_MEM_HOST, &mh), RESHARD_OK, "%s",
                 rs_error_message());
    struct xfer f[3];
    for (int i = 0; i < 3; i++) {
        f[i] = (struct xfer){.req.done = on_done};
        cr_assert_eq(c->ops->flush(c, mh, buf + 1000 * i, 1 + 500 * (size_t)i, &f[i].req),
                     RESHARD_OK, "%s", rs_error_message());
        cr_assert_eq(f[i].done, 0, "completed inside the call that posted it");
    }
    run_until((struct xfer *[]){&f[0], &f[1], &f[2]}, 3);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(f[i].st, RESHARD_OK, "flush %d: %s", i, rs_error_message());
    unsigned char want[sizeof(buf)];
    fill(want, sizeof(want), 3);
    cr_assert(!memcmp(buf, want, sizeof(buf)), "a flush changed the memory it read");
    struct xfer out = {.req.done = on_done};
    cr_assert_eq(c->ops->flush(c, mh, buf + sizeof(buf) - 8, 16, &out.req),
                 RESHARD_ERR_INVALID_ARG);
    cr_assert(strstr(rs_error_message(), "outside its registration"), "%s", rs_error_message());
    c->ops->mem_dereg(c, mh);
}

Test(ib, a_large_message_is_striped_and_arrives, .init = pair_up, .fini = tear_down)
{
    exchange((8u << 20) + 3, 1);
}

Test(ib, unregistered_buffers_and_empty_messages, .init = pair_up, .fini = tear_down)
{
    exchange(300000, 0);
    exchange(0, 0);
}

Test(ib, tags_match_whatever_the_order, .init = pair_up, .fini = tear_down)
{
    enum { N = 40 };
    static unsigned char src[N][1024], dst[N][1024];
    struct xfer s[N], r[N], *all[2 * N];
    for (int i = 0; i < N; i++) {
        fill(src[i], sizeof(src[i]), (unsigned)i);
        s[i] = r[i] = (struct xfer){.req.done = on_done};
        all[i] = &s[i];
        all[N + i] = &r[i];
        cr_assert_eq(
            ctx[1]->ops->recv(ctx[1], 0, (uint64_t)i, dst[i], sizeof(dst[i]), NULL, &r[i].req),
            RESHARD_OK);
    }
    for (int i = N - 1; i >= 0; i--) /* sent in reverse */
        cr_assert_eq(
            ctx[0]->ops->send(ctx[0], 1, (uint64_t)i, src[i], sizeof(src[i]), NULL, 0, &s[i].req),
            RESHARD_OK);
    run_until(all, 2 * N);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(r[i].st, RESHARD_OK);
        cr_assert(!memcmp(src[i], dst[i], sizeof(src[i])), "message %d landed elsewhere", i);
    }
}

Test(ib, a_scatter_list_receives_in_place, .init = pair_up, .fini = tear_down)
{
    unsigned char src[3000], a[1000], b[2000];
    fill(src, sizeof(src), 3);
    struct iovec iov[2] = {{a, sizeof(a)}, {b, sizeof(b)}};
    struct xfer s = {.req.done = on_done}, r = {.req.done = on_done};
    cr_assert_eq(ctx[1]->ops->recv_iov(ctx[1], 0, 9, iov, 2, &r.req), RESHARD_OK);
    cr_assert_eq(ctx[0]->ops->send(ctx[0], 1, 9, src, sizeof(src), NULL, 0, &s.req), RESHARD_OK);
    run_until((struct xfer *[]){&s, &r}, 2);
    cr_assert_eq(r.got, sizeof(src));
    cr_assert(!memcmp(src, a, sizeof(a)) && !memcmp(src + sizeof(a), b, sizeof(b)));
}

Test(ib, a_message_larger_than_its_receive_fails_both_sides, .init = pair_up, .fini = tear_down)
{
    static unsigned char src[8192], dst[4096];
    struct xfer s = {.req.done = on_done}, r = {.req.done = on_done};
    cr_assert_eq(ctx[1]->ops->recv(ctx[1], 0, 5, dst, sizeof(dst), NULL, &r.req), RESHARD_OK);
    cr_assert_eq(ctx[0]->ops->send(ctx[0], 1, 5, src, sizeof(src), NULL, 0, &s.req), RESHARD_OK);
    run_until((struct xfer *[]){&s, &r}, 2);
    cr_assert_eq(s.st, RESHARD_ERR_TOO_LARGE);
    cr_assert_eq(r.st, RESHARD_ERR_TOO_LARGE);
    cr_assert_eq(r.done, 1);
}

Test(ib, a_cancelled_receive_completes_once, .init = pair_up, .fini = tear_down)
{
    static unsigned char dst[64];
    struct xfer r = {.req.done = on_done};
    cr_assert_eq(ctx[1]->ops->recv(ctx[1], 0, 77, dst, sizeof(dst), NULL, &r.req), RESHARD_OK);
    for (int i = 0; i < 1000; i++) /* the CTS reaches rank 0 */
        for (int k = 0; k < 2; k++)
            ctx[k]->ops->progress(ctx[k]);
    ctx[1]->ops->cancel(ctx[1], &r.req);
    run_until((struct xfer *[]){&r}, 1);
    cr_assert_eq(r.st, RESHARD_ERR_NETWORK);
    for (int i = 0; i < 1000; i++)
        for (int k = 0; k < 2; k++)
            ctx[k]->ops->progress(ctx[k]);
    cr_assert_eq(r.done, 1);
}

/* A queue pair broken under a transfer in flight: both sides end with an error naming the
 * peer and the QP, within the retry budget, and nothing hangs. A fast host may land all 64 MiB
 * before the break: then the transfer is made again, with less progress before the break. */
Test(ib, a_broken_queue_pair_fails_its_transfers, .init = pair_up, .fini = tear_down, .timeout = 60)
{
    static const int progress[] = {2000, 400, 50, 5, 0};
    size_t len = 64u << 20;
    unsigned char *src = malloc(len), *dst = malloc(len);
    struct xfer s, r;
    int landed = 1;
    for (int t = 0; landed && t < (int)(sizeof(progress) / sizeof(progress[0])); t++) {
        s = (struct xfer){.req.done = on_done};
        r = (struct xfer){.req.done = on_done};
        cr_assert_eq(ctx[1]->ops->recv(ctx[1], 0, 1 + t, dst, len, NULL, &r.req), RESHARD_OK);
        cr_assert_eq(ctx[0]->ops->send(ctx[0], 1, 1 + t, src, len, NULL, 0, &s.req), RESHARD_OK);
        for (int i = 0; i < progress[t] && !s.done && !r.done; i++) /* the writes are on the wire */
            for (int k = 0; k < 2; k++)
                ctx[k]->ops->progress(ctx[k]);
        landed = r.done;
        if (landed) { /* nothing left to break: both ends finish, and it goes again */
            run_until((struct xfer *[]){&s, &r}, 2);
            cr_assert_eq(r.st, RESHARD_OK);
        }
    }
    if (landed) {
        cr_log_info("every receive completed before its QP could break: the case did not happen");
        free(src);
        free(dst);
        return;
    }
    tp_ib_break_peer(ctx[1], 0);
    run_until((struct xfer *[]){&s, &r}, 2);
    cr_assert_neq(r.st, RESHARD_OK, "the receive survived its broken QP");
    cr_assert_eq(ctx[1]->failed_peer, 0);
    cr_assert(strstr(ctx[1]->failed_why, "QP 0x"), "%s", ctx[1]->failed_why);
    if (s.st != RESHARD_OK) { /* unless every write landed before the break */
        cr_assert_eq(ctx[0]->failed_peer, 1);
        cr_log_info("sender: %s; receiver: %s", ctx[0]->failed_why, ctx[1]->failed_why);
    }
    free(src);
    free(dst);
}

Test(ib, a_peer_that_leaves_fails_what_waits_for_it, .init = pair_up, .fini = tear_down)
{
    static unsigned char dst[64];
    struct xfer r = {.req.done = on_done};
    exchange(64, 0); /* connected */
    cr_assert_eq(ctx[1]->ops->recv(ctx[1], 0, 3, dst, sizeof(dst), NULL, &r.req), RESHARD_OK);
    for (int i = 0; i < 1000; i++)
        for (int k = 0; k < 2; k++)
            ctx[k]->ops->progress(ctx[k]);
    ctx[0]->ops->close(ctx[0]);
    ctx[0] = NULL;
    time_t end = time(NULL) + 20;
    while (!r.done && time(NULL) < end)
        ctx[1]->ops->wait(ctx[1], 100), ctx[1]->ops->progress(ctx[1]);
    cr_assert_eq(r.done, 1);
    cr_assert_eq(r.st, RESHARD_ERR_NETWORK);
    cr_assert_eq(ctx[1]->failed_peer, -1, "an orderly close is not a failure: %s",
                 ctx[1]->failed_why);
}

/* A peer that never answers the handshake (frozen: its kernel accepts, it never reads) fails
 * the transfers waiting for it at RESHARD_TIMEOUT instead of holding them forever. */
Test(ib, a_peer_that_never_answers_times_out, .timeout = 30)
{
    setenv("RESHARD_TIMEOUT", "2", 1);
    pair_up();
    static unsigned char dst[64];
    struct xfer r = {.req.done = on_done};
    /* rank 0 is never progressed */
    cr_assert_eq(ctx[1]->ops->recv(ctx[1], 0, 3, dst, sizeof(dst), NULL, &r.req), RESHARD_OK);
    time_t start = time(NULL);
    while (!r.done && time(NULL) < start + 20)
        ctx[1]->ops->wait(ctx[1], 100), ctx[1]->ops->progress(ctx[1]);
    cr_assert_eq(r.done, 1);
    cr_assert_neq(r.st, RESHARD_OK);
    cr_assert(time(NULL) - start <= 4, "took %lld s", (long long)(time(NULL) - start));
    cr_assert_eq(ctx[1]->failed_peer, 0);
    cr_assert_str_eq(ctx[1]->failed_why, "no connection within RESHARD_TIMEOUT=2 s");
    tear_down();
}

/* ---- a hostile peer: writes it makes itself, outside the transport ---- */

static struct ib_ctx *ibx(int r)
{
    return container_of(ctx[r], struct ib_ctx, super);
}

static void progress_all(void)
{
    for (int r = 0; r < nctx; r++)
        if (ctx[r])
            ctx[r]->ops->progress(ctx[r]);
}

/* The first CTS rank `from` holds from `to` (a receive `to` offered it). */
static struct ib_cts wait_cts(int from, int to)
{
    time_t end = time(NULL) + 20;
    struct ib_peer *p = NULL;
    while (!((p = ibx(from)->peers[to]) && p->cts) && time(NULL) < end)
        progress_all();
    cr_assert(p && p->cts, "no CTS from rank %d reached rank %d", to, from);
    return *p->cts;
}

/* Rank `from` writes len bytes of src (registered as mh) to raddr with rkey on its first
 * queue pair to `to`, with an immediate when imm is not 0. */
static void rogue_write(int from, int to, void *mh, const void *src, size_t len, uint64_t raddr,
                        uint32_t rkey, uint32_t imm)
{
    struct ib_peer *p = ibx(from)->peers[to];
    cr_assert(p && p->state == P_UP, "rank %d is not connected to rank %d", from, to);
    struct ibv_sge sge = {
        .addr = (uintptr_t)src, .length = (uint32_t)len, .lkey = ((struct ib_reg *)mh)->mr->lkey};
    struct ibv_send_wr wr = {.wr_id = (uintptr_t)p | 1, /* completes as control traffic */
                             .sg_list = &sge,
                             .num_sge = len > 0,
                             .opcode = imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE,
                             .send_flags = IBV_SEND_SIGNALED,
                             .imm_data = htonl(imm),
                             .wr.rdma = {.remote_addr = raddr, .rkey = rkey}},
                       *bad;
    cr_assert_eq(ibv_post_send(p->qp[0], &wr, &bad), 0, "ibv_post_send: %m");
    p->sq_used[0]++;
}

/* Progresses everyone until rank r saw a peer fail; 20 s at most. */
static void until_failed(int r)
{
    time_t end = time(NULL) + 20;
    while (ctx[r]->failed_peer < 0 && time(NULL) < end)
        progress_all();
    cr_assert_geq(ctx[r]->failed_peer, 0, "rank %d saw no failure", r);
}

static int all_zero(const unsigned char *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (b[i])
            return 0;
    return 1;
}

static void *reg(int r, void *buf, size_t len)
{
    void *mh = NULL;
    cr_assert_eq(ctx[r]->ops->mem_reg(ctx[r], buf, len, TP_MEM_HOST, &mh), RESHARD_OK, "%s",
                 rs_error_message());
    return mh;
}

static unsigned char *page(unsigned char v, size_t n)
{
    unsigned char *b = aligned_alloc(4096, n);
    cr_assert_not_null(b);
    memset(b, v, n);
    return b;
}

/* The attack: any connected peer writes a source or staging buffer through its registration's
 * key (before, every host registration allowed remote writes). */
Test(ib, a_registration_refuses_remote_writes, .init = pair_up, .fini = tear_down)
{
    exchange(64, 0); /* connected */
    unsigned char *victim = page(0, 4096), *junk = page(0xee, 4096);
    void *vmh = reg(1, victim, 4096), *jmh = reg(0, junk, 4096);
    rogue_write(0, 1, jmh, junk, 64, (uintptr_t)victim, ((struct ib_reg *)vmh)->mr->rkey, 0);
    until_failed(0);
    cr_assert_eq(ctx[0]->failed_peer, 1);
    cr_assert(strstr(ctx[0]->failed_why, "remote access"), "%s", ctx[0]->failed_why);
    cr_assert(all_zero(victim, 4096), "the write landed");
    ctx[0]->ops->mem_dereg(ctx[0], jmh);
    ctx[1]->ops->mem_dereg(ctx[1], vmh);
    free(victim);
    free(junk);
}

/* The attack: a peer keeps the key of a receive it served and writes with it later (before,
 * the key was the destination registration's, valid for the communicator's life). */
Test(ib, a_receive_key_dies_once_its_receive_completes, .init = pair_up, .fini = tear_down)
{
    exchange(64, 0);
    unsigned char *dst = page(0, 4096), *src = page(0x5a, 4096), *junk = page(0xee, 4096);
    void *dmh = reg(1, dst, 4096), *smh = reg(0, src, 4096), *jmh = reg(0, junk, 4096);
    struct xfer s = {.req.done = on_done}, r = {.req.done = on_done};
    cr_assert_eq(ctx[1]->ops->recv(ctx[1], 0, 5, dst, 4096, dmh, &r.req), RESHARD_OK);
    struct ib_cts cts = wait_cts(0, 1);
    cr_assert_eq(cts.addr, (uintptr_t)dst);
    cr_assert_eq(cts.nkeys, 1);
    cr_assert_neq(cts.rkey[0], ((struct ib_reg *)dmh)->mr->rkey, "a key of its own");
    cr_assert_eq(ctx[0]->ops->send(ctx[0], 1, 5, src, 4096, smh, 0, &s.req), RESHARD_OK);
    run_until((struct xfer *[]){&s, &r}, 2);
    cr_assert_eq(r.st, RESHARD_OK, "%s", rs_error_message());
    cr_assert(!memcmp(dst, src, 4096));
    const struct ib_peer *p = ibx(1)->peers[0];
    for (size_t i = 0; i < p->nwins; i++)
        cr_assert_eq(p->wins[i]->state, WIN_FREE, "window %zu is still bound", i);
    cr_log_info("keys: %s", ibx(1)->windows ? "memory windows" : "a registration per receive");
    rogue_write(0, 1, jmh, junk, 64, cts.addr, cts.rkey[0], 0);
    until_failed(0);
    cr_assert(strstr(ctx[0]->failed_why, "remote access"), "%s", ctx[0]->failed_why);
    cr_assert(!memcmp(dst, src, 4096), "the late write landed");
    ctx[0]->ops->mem_dereg(ctx[0], smh);
    ctx[0]->ops->mem_dereg(ctx[0], jmh);
    ctx[1]->ops->mem_dereg(ctx[1], dmh);
    free(dst);
    free(src);
    free(junk);
}

/* The attack: a peer writes more than the receive it was offered, into what lies next to it
 * (before, a receive's key covered its whole registration, or whole pages). The device refuses
 * the write; soft-RoCE checks a window's registration rather than the window, so there the
 * receiver's own check (the write is longer than the receive) is what fails the peer. */
Test(ib, a_write_past_its_receive_is_refused, .init = pair_up, .fini = tear_down)
{
    exchange(64, 0);
    unsigned char *dst = page(0, 8192), *junk = page(0xee, 8192);
    void *dmh = reg(1, dst, 8192), *jmh = reg(0, junk, 8192);
    struct xfer r = {.req.done = on_done};
    cr_assert_eq(ctx[1]->ops->recv(ctx[1], 0, 5, dst, 4096, dmh, &r.req), RESHARD_OK);
    struct ib_cts cts = wait_cts(0, 1);
    rogue_write(0, 1, jmh, junk, 8192, cts.addr, cts.rkey[0], cts.id << 8 | 1);
    run_until((struct xfer *[]){&r}, 1);
    cr_assert_neq(r.st, RESHARD_OK, "the receive took an overrun");
    int rxe = !strncmp(ibx(1)->port.dev, "rxe", 3);
    if (ibx(1)->windows && rxe) {
        cr_assert_eq(ctx[1]->failed_peer, 0);
        cr_assert_str_eq(ctx[1]->failed_why, "wrote more than its receive holds");
        cr_log_info("soft-RoCE does not bound a memory window (rxe_resp.c checks its "
                    "registration): the bytes past the receive %s",
                    all_zero(dst + 4096, 4096) ? "held" : "were written");
    } else {
        until_failed(0);
        cr_assert(strstr(ctx[0]->failed_why, "remote access"), "%s", ctx[0]->failed_why);
        cr_assert(all_zero(dst + 4096, 4096), "the bytes next to the receive were written");
    }
    ctx[0]->ops->mem_dereg(ctx[0], jmh);
    ctx[1]->ops->mem_dereg(ctx[1], dmh);
    free(dst);
    free(junk);
}

/* The attack: a rank uses a key offered to another rank (before, any key worked on any of the
 * context's connections). A memory window answers only its own queue pair. */
Test(ib, a_key_offered_to_one_peer_is_refused_on_another_peers_connection, .init = three_up,
     .fini = tear_down)
{
    if (!ibx(1)->windows)
        cr_skip_test("no memory windows here: a receive's own registration is not bound to "
                     "its peer's queue pairs");
    exchange_on(0, 1, 64, 0);
    exchange_on(2, 1, 64, 0);
    unsigned char *dst = page(0, 4096), *src = page(0x5a, 4096), *junk = page(0xee, 4096);
    void *dmh = reg(1, dst, 4096), *smh = reg(0, src, 4096), *jmh = reg(2, junk, 4096);
    struct xfer s = {.req.done = on_done}, r = {.req.done = on_done};
    cr_assert_eq(ctx[1]->ops->recv(ctx[1], 0, 5, dst, 4096, dmh, &r.req), RESHARD_OK);
    struct ib_cts cts = wait_cts(0, 1);
    rogue_write(2, 1, jmh, junk, 64, cts.addr, cts.rkey[0], 0);
    until_failed(2);
    cr_assert_eq(ctx[2]->failed_peer, 1);
    cr_assert(strstr(ctx[2]->failed_why, "remote access"), "%s", ctx[2]->failed_why);
    cr_assert(all_zero(dst, 4096), "rank 2 wrote rank 0's receive");
    cr_assert_eq(ctx[0]->ops->send(ctx[0], 1, 5, src, 4096, smh, 0, &s.req), RESHARD_OK);
    run_until((struct xfer *[]){&s, &r}, 2);
    cr_assert_eq(r.st, RESHARD_OK, "the peer it was offered to still writes it: %s",
                 rs_error_message());
    cr_assert(!memcmp(dst, src, 4096));
    ctx[0]->ops->mem_dereg(ctx[0], smh);
    ctx[2]->ops->mem_dereg(ctx[2], jmh);
    ctx[1]->ops->mem_dereg(ctx[1], dmh);
    free(dst);
    free(src);
    free(junk);
}

/* The attack: a zero-byte write (no key needed) whose immediate names a receive it was never
 * offered. */
Test(ib, an_immediate_naming_no_offered_receive_fails_the_peer, .init = pair_up, .fini = tear_down)
{
    exchange(64, 0);
    unsigned char *junk = page(0xee, 4096);
    void *jmh = reg(0, junk, 4096);
    rogue_write(0, 1, jmh, junk, 0, 0, 0, 4242u << 8 | 1);
    until_failed(1);
    cr_assert_eq(ctx[1]->failed_peer, 0);
    cr_assert(strstr(ctx[1]->failed_why, "names no receive it was offered"), "%s",
              ctx[1]->failed_why);
    ctx[0]->ops->mem_dereg(ctx[0], jmh);
    free(junk);
}

static void ib_then_ucx(int rank)
{
    setenv("RESHARD_TRANSPORT", rank ? "ucx" : "ib", 1);
    setenv("RESHARD_NET_TLS", "tcp", 1);
    rs_param_reload(); /* the test process read them already (reshard_get_unique_id) */
}

static reshard_status_t nothing(int rank, int size, reshard_comm_t *comm)
{
    (void)rank, (void)size, (void)comm;
    return RESHARD_OK;
}

/* Ranks that picked different transports (auto with RDMA on some hosts only) refuse to make
 * the communicator, all with the same message, instead of misreading each other's addresses. */
Test(ib, ranks_on_different_transports_are_refused, .timeout = 60)
{
    /* (sysfs, not tp_pick: this process must not read the parameters its ranks will set) */
    glob_t g;
    int active = 0;
    if (glob("/sys/class/infiniband/*/ports/*/state", 0, NULL, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc && !active; i++) {
            char line[64] = "";
            FILE *f = fopen(g.gl_pathv[i], "r");
            active = f && fgets(line, sizeof(line), f) && strstr(line, "ACTIVE");
            if (f)
                fclose(f);
        }
        globfree(&g);
    }
    if (!active)
        cr_skip_test("no active RDMA port here");
    rank_setup = ib_then_ucx;
    struct outcome *o = run_ranks(2, nothing);
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(o[r].status, RESHARD_ERR_UNAVAILABLE, "rank %d: %s", r, o[r].msg);
        cr_assert(strstr(o[r].msg, "rank 1 runs the ucx transport, rank 0 ib"), "rank %d: %s", r,
                  o[r].msg);
    }
}
