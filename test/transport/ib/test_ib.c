/* SPDX-License-Identifier: Apache-2.0 */
/* The ibverbs transport (transport/ib_*.c). Port selection syntax runs everywhere; the rest
 * needs an active RDMA port (scripts/rxe-test.sh runs it on soft-RoCE in a VM) and skips
 * without one. Two contexts of one process are ranks 0 and 1 of a pair. */
#include "base/error.h"
#include "base/param.h"
#include "test/plugin/ranks.h"
#include "transport/ib/ib_dev.h"
#include "transport/tp.h"

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

static struct tp_ctx *ctx[2];

static void pair_up(void)
{
    setenv("RESHARD_TRANSPORT", "ib", 1);
    const struct tp_ops *ops;
    if (tp_pick(&ops) != RESHARD_OK)
        cr_skip_test("no active RDMA port here (%s)", rs_error_message());
    for (int r = 0; r < 2; r++) {
        struct tp_config cfg = {.rank = r, .size = 2, .local_rank = -1};
        cr_assert_eq(ops->init(&cfg, &ctx[r]), RESHARD_OK, "%s", rs_error_message());
    }
    for (int r = 0; r < 2; r++) {
        char addr[256];
        size_t len = sizeof(addr);
        cr_assert_eq(ctx[1 - r]->ops->address(ctx[1 - r], -1, addr, &len), RESHARD_OK);
        cr_assert_eq(ctx[r]->ops->set_peer(ctx[r], 1 - r, addr, len), RESHARD_OK, "%s",
                     rs_error_message());
    }
}

static void tear_down(void)
{
    for (int r = 0; r < 2; r++)
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
        for (int r = 0; r < 2; r++)
            ctx[r]->ops->progress(ctx[r]);
    }
}

static void fill(unsigned char *b, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)(i * 131 + seed);
}

static void exchange(size_t len, int registered)
{
    unsigned char *src = malloc(len + 1), *dst = calloc(1, len + 1);
    fill(src, len, 7);
    void *smh = NULL, *rmh = NULL;
    if (registered) {
        cr_assert_eq(ctx[0]->ops->mem_reg(ctx[0], src, len + 1, TP_MEM_HOST, &smh), RESHARD_OK);
        cr_assert_eq(ctx[1]->ops->mem_reg(ctx[1], dst, len + 1, TP_MEM_HOST, &rmh), RESHARD_OK);
    }
    struct xfer s = {.req.done = on_done}, r = {.req.done = on_done};
    uint64_t out0 = ctx[0]->counters.bytes_out, in0 = ctx[1]->counters.bytes_in;
    cr_assert_eq(ctx[1]->ops->recv(ctx[1], 0, 42, dst, len + 1, rmh, &r.req), RESHARD_OK, "%s",
                 rs_error_message());
    cr_assert_eq(ctx[0]->ops->send(ctx[0], 1, 42, src, len, smh, 0, &s.req), RESHARD_OK, "%s",
                 rs_error_message());
    run_until((struct xfer *[]){&s, &r}, 2);
    cr_assert_eq(s.st, RESHARD_OK, "%s", rs_error_message());
    cr_assert_eq(r.st, RESHARD_OK, "%s", rs_error_message());
    cr_assert_eq(r.got, len, "a %zu-byte message reports %zu", len, r.got);
    cr_assert(!memcmp(src, dst, len), "%zu bytes differ", len);
    cr_assert_eq(dst[len], 0, "wrote past the message");
    cr_assert_eq(ctx[0]->counters.bytes_out - out0, len);
    cr_assert_eq(ctx[1]->counters.bytes_in - in0, len);
    ctx[0]->ops->mem_dereg(ctx[0], smh);
    ctx[1]->ops->mem_dereg(ctx[1], rmh);
    free(src);
    free(dst);
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
 * peer and the QP, within the retry budget, and nothing hangs. */
Test(ib, a_broken_queue_pair_fails_its_transfers, .init = pair_up, .fini = tear_down, .timeout = 60)
{
    size_t len = 64u << 20;
    unsigned char *src = malloc(len), *dst = malloc(len);
    struct xfer s = {.req.done = on_done}, r = {.req.done = on_done};
    cr_assert_eq(ctx[1]->ops->recv(ctx[1], 0, 1, dst, len, NULL, &r.req), RESHARD_OK);
    cr_assert_eq(ctx[0]->ops->send(ctx[0], 1, 1, src, len, NULL, 0, &s.req), RESHARD_OK);
    for (int i = 0; i < 2000 && !s.done && !r.done; i++) /* the writes are on the wire */
        for (int k = 0; k < 2; k++)
            ctx[k]->ops->progress(ctx[k]);
    int landed = r.done; /* a fast host may finish all 64 MiB first: nothing left to break */
    tp_ib_break_peer(ctx[1], 0);
    run_until((struct xfer *[]){&s, &r}, 2);
    if (landed)
        cr_log_warn("the receive completed before its QP broke: the case did not happen");
    else
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
