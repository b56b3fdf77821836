/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The UCX transport (transport/ucx/ucx_ctx.c) through its ops table: two contexts of one
 * process are ranks 0 and 1, over UCX's TCP transport on this host. Tagged messages land,
 * completions wait for progress(), a receive can be cancelled, and a peer that closed fails
 * what is sent to it. Skips with the loader's reason where UCX is not installed.
 */
#include "base/error.h"
#include "base/param.h"
#include "transport/tp.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
static int nctx = 2;
static int peer_errors;

static void set_peers(void)
{
    for (int r = 0; r < nctx; r++)
        for (int o = 0; o < nctx; o++) {
            if (o == r)
                continue;
            char addr[4096];
            size_t len = sizeof(addr);
            cr_assert_eq(ctx[o]->ops->address(ctx[o], -1, addr, &len), RESHARD_OK, "%s",
                         rs_error_message());
            cr_assert_eq(ctx[r]->ops->set_peer(ctx[r], o, addr, len), RESHARD_OK, "%s",
                         rs_error_message());
        }
}

static void pair_up(void)
{
    setenv("UCX_LOG_LEVEL", "fatal", 1); /* the closed-peer case makes UCX complain */
    for (int r = 0; r < nctx; r++) {
        struct tp_config cfg = {
            .rank = r, .size = nctx, .tls = "tcp", .peer_errors = peer_errors, .local_rank = -1};
        reshard_status_t st = tp_ucx_ops.init(&cfg, &ctx[r]);
        if (st == RESHARD_ERR_UNAVAILABLE)
            cr_skip_test("UCX is not available here: %s", rs_error_message());
        cr_assert_eq(st, RESHARD_OK, "%s", rs_error_message());
    }
    set_peers();
}

static void pair_up_with_peer_errors(void)
{
    peer_errors = 1;
    pair_up();
}

static void three_up(void)
{
    nctx = 3;
    pair_up();
}

static void tear_down(void)
{
    for (int r = 0; r < nctx; r++)
        if (ctx[r])
            ctx[r]->ops->close(ctx[r]);
}

/* Progresses both (the live ones) until every xfer listed is done; fails after 20 s. */
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
        b[i] = (unsigned char)(i * 31 + seed);
}

static struct xfer new_xfer(void)
{
    return (struct xfer){.req = {.done = on_done}};
}

/* 0 sends len bytes to 1 with tag 7, registered or not; checks what arrived. */
static void send_and_check(size_t len, int registered)
{
    unsigned char *out = malloc(len + 1), *in = calloc(1, len + 1);
    cr_assert(out && in);
    fill(out, len, 5);
    void *mh_out = NULL, *mh_in = NULL;
    if (registered) {
        cr_assert_eq(ctx[0]->ops->mem_reg(ctx[0], out, len + 1, TP_MEM_HOST, &mh_out), RESHARD_OK,
                     "%s", rs_error_message());
        cr_assert_eq(ctx[1]->ops->mem_reg(ctx[1], in, len + 1, TP_MEM_HOST, &mh_in), RESHARD_OK,
                     "%s", rs_error_message());
    }
    struct xfer s = new_xfer(), r = new_xfer();
    cr_assert_eq(ctx[1]->ops->recv(ctx[1], 0, 7, in, len, mh_in, &r.req), RESHARD_OK, "%s",
                 rs_error_message());
    cr_assert_eq(ctx[0]->ops->send(ctx[0], 1, 7, out, len, mh_out, 0, &s.req), RESHARD_OK, "%s",
                 rs_error_message());
    cr_assert_eq(s.done + r.done, 0, "nothing completes inside the call that posted it");
    struct xfer *both[] = {&s, &r};
    run_until(both, 2);
    cr_assert_eq(s.done, 1);
    cr_assert_eq(r.done, 1);
    cr_assert_eq(s.st, RESHARD_OK, "%s", rs_error_message());
    cr_assert_eq(r.st, RESHARD_OK, "%s", rs_error_message());
    cr_assert_eq(r.got, len);
    cr_assert_arr_eq(in, out, len);
    cr_assert_eq(in[len], 0, "nothing past the message");
    if (registered) {
        ctx[0]->ops->mem_dereg(ctx[0], mh_out);
        ctx[1]->ops->mem_dereg(ctx[1], mh_in);
    }
    free(out);
    free(in);
}

Test(ucx_ctx, a_small_tagged_message_lands, .init = pair_up, .fini = tear_down, .timeout = 60)
{
    send_and_check(100, 0);
    cr_assert_eq(ctx[0]->counters.bytes_out, 100);
    cr_assert_eq(ctx[0]->counters.msgs_out, 1);
    cr_assert_eq(ctx[1]->counters.bytes_in, 100);
    cr_assert_eq(ctx[0]->failed_peer, -1);
}

Test(ucx_ctx, a_large_registered_message_lands, .init = pair_up, .fini = tear_down, .timeout = 60)
{
    send_and_check(4 << 20, 1); /* past the eager limit: UCX's rendezvous */
    cr_assert_eq(ctx[1]->counters.bytes_in, 4 << 20);
}

Test(ucx_ctx, tags_match_whatever_the_order, .init = pair_up, .fini = tear_down, .timeout = 60)
{
    int a = 1, b = 2, got_a = 0, got_b = 0;
    struct xfer sa = new_xfer(), sb = new_xfer(), ra = new_xfer(), rb = new_xfer();
    cr_assert_eq(ctx[1]->ops->recv(ctx[1], 0, 20, &got_b, sizeof(int), NULL, &rb.req), RESHARD_OK);
    cr_assert_eq(ctx[1]->ops->recv(ctx[1], 0, 10, &got_a, sizeof(int), NULL, &ra.req), RESHARD_OK);
    cr_assert_eq(ctx[0]->ops->send(ctx[0], 1, 10, &a, sizeof(int), NULL, 1, &sa.req), RESHARD_OK);
    cr_assert_eq(ctx[0]->ops->send(ctx[0], 1, 20, &b, sizeof(int), NULL, 1, &sb.req), RESHARD_OK);
    struct xfer *all[] = {&sa, &sb, &ra, &rb};
    run_until(all, 4);
    cr_assert_eq(got_a, 1);
    cr_assert_eq(got_b, 2);
    cr_assert_eq(ctx[0]->counters.ctrl_out, 2, "control messages are counted apart");
    cr_assert_eq(ctx[0]->counters.bytes_out, 0);
}

Test(ucx_ctx, a_scatter_list_receives_in_place, .init = pair_up, .fini = tear_down, .timeout = 60)
{
    unsigned char out[300], first[100] = {0}, second[200] = {0};
    fill(out, sizeof(out), 9);
    struct iovec iov[2] = {{first, sizeof(first)}, {second, sizeof(second)}};
    struct xfer s = new_xfer(), r = new_xfer();
    cr_assert_eq(ctx[1]->ops->recv_iov(ctx[1], 0, 3, iov, 2, &r.req), RESHARD_OK, "%s",
                 rs_error_message());
    cr_assert_eq(ctx[0]->ops->send(ctx[0], 1, 3, out, sizeof(out), NULL, 0, &s.req), RESHARD_OK);
    struct xfer *both[] = {&s, &r};
    run_until(both, 2);
    cr_assert_eq(r.st, RESHARD_OK, "%s", rs_error_message());
    cr_assert_eq(r.got, sizeof(out));
    cr_assert_arr_eq(first, out, sizeof(first));
    cr_assert_arr_eq(second, out + sizeof(first), sizeof(second));
}

Test(ucx_ctx, a_cancelled_receive_completes_once_as_a_network_failure, .init = pair_up,
     .fini = tear_down, .timeout = 60)
{
    char buf[64];
    struct xfer r = new_xfer();
    cr_assert_eq(ctx[1]->ops->recv(ctx[1], 0, 99, buf, sizeof(buf), NULL, &r.req), RESHARD_OK);
    ctx[1]->ops->cancel(ctx[1], &r.req);
    cr_assert_eq(r.done, 0, "the completion waits for progress()");
    struct xfer *one[] = {&r};
    run_until(one, 1);
    for (int i = 0; i < 10; i++)
        ctx[1]->ops->progress(ctx[1]);
    cr_assert_eq(r.done, 1);
    cr_assert_eq(r.st, RESHARD_ERR_NETWORK);
}

Test(ucx_ctx, an_address_larger_than_its_room_is_refused_with_its_size, .init = pair_up,
     .fini = tear_down, .timeout = 60)
{
    char small[4];
    size_t len = sizeof(small);
    cr_assert_eq(ctx[0]->ops->address(ctx[0], -1, small, &len), RESHARD_ERR_TOO_LARGE);
    cr_assert_gt(len, sizeof(small), "the length it needs");
    cr_assert(strstr(rs_error_message(), "UCX worker address is"), "%s", rs_error_message());
}

/* A peer closed on this side has no address until set_peer gives it one again; the index
 * then serves as before. */
Test(ucx_ctx, a_peer_closed_here_is_refused_until_given_again, .init = pair_up, .fini = tear_down,
     .timeout = 60)
{
    send_and_check(64, 0);
    ctx[0]->ops->close_peer(ctx[0], 1);
    int v = 5;
    struct xfer s = new_xfer();
    cr_assert_eq(ctx[0]->ops->send(ctx[0], 1, 1, &v, sizeof(v), NULL, 0, &s.req),
                 RESHARD_ERR_INTERNAL);
    cr_assert_str_eq(rs_error_message(), "UCX: no address for rank 1");
    cr_assert_eq(s.done, 0, "a refused post never completes");
    set_peers();
    send_and_check(64, 0);
}

/* Out of memory copying a new address: the peer keeps the one it had. */
Test(ucx_ctx, a_peer_address_that_cannot_be_copied_keeps_the_old_one, .init = pair_up,
     .fini = tear_down, .timeout = 60)
{
    char addr[4096];
    size_t len = sizeof(addr);
    cr_assert_eq(ctx[1]->ops->address(ctx[1], -1, addr, &len), RESHARD_OK);
    rs_test_fail_alloc(1);
    cr_assert_eq(ctx[0]->ops->set_peer(ctx[0], 1, addr, len), RESHARD_ERR_NO_MEMORY);
    cr_assert(strstr(rs_error_message(), "a UCX peer address"), "%s", rs_error_message());
    send_and_check(64, 0);
}

/* In peer error mode, the death of the other side fails what is sent to it, at once rather
 * than at the timeout, and the context names the peer. */
Test(ucx_ctx, a_closed_peer_fails_what_is_sent_to_it, .init = pair_up_with_peer_errors,
     .fini = tear_down, .timeout = 60)
{
    send_and_check(64, 0); /* connected */
    ctx[1]->ops->close(ctx[1]);
    ctx[1] = NULL;
    size_t len = 4 << 20;
    unsigned char *out = calloc(1, len);
    cr_assert_not_null(out);
    reshard_status_t st = RESHARD_OK;
    time_t end = time(NULL) + 20;
    while (st == RESHARD_OK && time(NULL) < end) {
        struct xfer s = new_xfer();
        st = ctx[0]->ops->send(ctx[0], 1, 8, out, len, NULL, 0, &s.req);
        if (st != RESHARD_OK)
            break; /* refused at posting: the endpoint failed already */
        struct xfer *one[] = {&s};
        run_until(one, 1);
        st = s.st;
    }
    cr_assert_eq(st, RESHARD_ERR_NETWORK, "%s", rs_error_message());
    cr_assert_eq(ctx[0]->failed_peer, 1);
    cr_assert(*ctx[0]->failed_why, "the transport's reason is kept");
    free(out);
}

/* The attack: a rank sends with the tag of a receive another peer is to fill (before, UCX
 * matched the tag alone, and the first message with it filled the receive). */
Test(ucx_ctx, a_rank_cannot_fill_another_peers_receive, .init = three_up, .fini = tear_down,
     .timeout = 60)
{
    int from0 = 0, from1 = 0, real = 100, impostor = 666;
    struct xfer r0 = new_xfer(), r1 = new_xfer(), s0 = new_xfer(), s1 = new_xfer();
    cr_assert_eq(ctx[2]->ops->recv(ctx[2], 0, 7, &from0, sizeof(int), NULL, &r0.req), RESHARD_OK);
    cr_assert_eq(ctx[1]->ops->send(ctx[1], 2, 7, &impostor, sizeof(int), NULL, 0, &s1.req),
                 RESHARD_OK);
    struct xfer *first[] = {&s1};
    run_until(first, 1); /* the impostor's message is there first */
    for (int i = 0; i < 200; i++)
        ctx[2]->ops->progress(ctx[2]);
    cr_assert_eq(r0.done, 0, "rank 1's message filled the receive from rank 0");
    cr_assert_eq(ctx[0]->ops->send(ctx[0], 2, 7, &real, sizeof(int), NULL, 0, &s0.req), RESHARD_OK);
    struct xfer *then[] = {&s0, &r0};
    run_until(then, 2);
    cr_assert_eq(r0.st, RESHARD_OK, "%s", rs_error_message());
    cr_assert_eq(from0, real);
    /* rank 1's message waits for a receive from rank 1 */
    cr_assert_eq(ctx[2]->ops->recv(ctx[2], 1, 7, &from1, sizeof(int), NULL, &r1.req), RESHARD_OK);
    struct xfer *last[] = {&r1};
    run_until(last, 1);
    cr_assert_eq(from1, impostor);
}

/* The plugin numbers its peers per connection: a receive from peer 5 matches what the side
 * that side numbers 9 sends to it, as the addresses each made for the other say. */
Test(ucx_ctx, numbered_peers_match_by_the_number_the_receiver_gave, .init = pair_up,
     .fini = tear_down, .timeout = 60)
{
    char a0[4096], a1[4096];
    size_t l0 = sizeof(a0), l1 = sizeof(a1);
    cr_assert_eq(ctx[0]->ops->address(ctx[0], 9, a0, &l0), RESHARD_OK);
    cr_assert_eq(ctx[1]->ops->address(ctx[1], 5, a1, &l1), RESHARD_OK);
    cr_assert_eq(ctx[0]->ops->set_peer(ctx[0], 9, a1, l1), RESHARD_OK, "%s", rs_error_message());
    cr_assert_eq(ctx[1]->ops->set_peer(ctx[1], 5, a0, l0), RESHARD_OK, "%s", rs_error_message());
    int v = 42, got = 0;
    struct xfer s = new_xfer(), r = new_xfer();
    cr_assert_eq(ctx[1]->ops->recv(ctx[1], 5, 3, &got, sizeof(int), NULL, &r.req), RESHARD_OK);
    cr_assert_eq(ctx[0]->ops->send(ctx[0], 9, 3, &v, sizeof(int), NULL, 0, &s.req), RESHARD_OK);
    struct xfer *both[] = {&s, &r};
    run_until(both, 2);
    cr_assert_eq(got, 42);
}

/* Until every caller keeps to TP_TAG_BITS, a wider tag still matches (whole, by tag alone),
 * and never a narrow one with the same low bits. */
Test(ucx_ctx, tags_wider_than_the_callers_bits_still_match, .init = pair_up, .fini = tear_down,
     .timeout = 60)
{
    uint64_t wide = UINT64_C(1) << 62 | 7;
    int a = 1, b = 2, got_wide = 0, got_narrow = 0;
    struct xfer sw = new_xfer(), sn = new_xfer(), rw = new_xfer(), rn = new_xfer();
    cr_assert_eq(ctx[1]->ops->recv(ctx[1], 0, 7, &got_narrow, sizeof(int), NULL, &rn.req),
                 RESHARD_OK);
    cr_assert_eq(ctx[1]->ops->recv(ctx[1], 0, wide, &got_wide, sizeof(int), NULL, &rw.req),
                 RESHARD_OK);
    cr_assert_eq(ctx[0]->ops->send(ctx[0], 1, wide, &a, sizeof(int), NULL, 0, &sw.req), RESHARD_OK);
    cr_assert_eq(ctx[0]->ops->send(ctx[0], 1, 7, &b, sizeof(int), NULL, 0, &sn.req), RESHARD_OK);
    struct xfer *all[] = {&sw, &sn, &rw, &rn};
    run_until(all, 4);
    cr_assert_eq(got_wide, 1);
    cr_assert_eq(got_narrow, 2);
}

/* An address without this transport's trailer (another build, or garbage) is refused. */
Test(ucx_ctx, an_address_without_its_peer_number_is_refused, .init = pair_up, .fini = tear_down,
     .timeout = 60)
{
    char addr[4096];
    size_t len = sizeof(addr);
    cr_assert_eq(ctx[1]->ops->address(ctx[1], -1, addr, &len), RESHARD_OK);
    cr_assert_eq(ctx[0]->ops->set_peer(ctx[0], 1, addr, len - 8), RESHARD_ERR_INVALID_ARG);
    cr_assert(strstr(rs_error_message(), "not a reshard UCX address"), "%s", rs_error_message());
    cr_assert_eq(ctx[0]->ops->set_peer(ctx[0], 1, addr, 8), RESHARD_ERR_INVALID_ARG);
    addr[len - 4] = (char)0xfe; /* peer number -2 */
    addr[len - 3] = addr[len - 2] = addr[len - 1] = (char)0xff;
    cr_assert_eq(ctx[0]->ops->set_peer(ctx[0], 1, addr, len), RESHARD_ERR_INVALID_ARG);
    cr_assert(strstr(rs_error_message(), "peer number -2"), "%s", rs_error_message());
    size_t big = sizeof(addr);
    cr_assert_eq(ctx[0]->ops->address(ctx[0], 1 << 20, addr, &big), RESHARD_ERR_TOO_LARGE);
    send_and_check(64, 0); /* the old address stands */
}

Test(ucx_ctx, without_ucx_init_says_which_library_is_missing)
{
    setenv("RESHARD_UCX_LIB", "libucp-not-here.so.0", 1);
    rs_param_reload();
    struct tp_config cfg = {.rank = 0, .size = 2, .local_rank = -1};
    struct tp_ctx *c = NULL;
    cr_assert_eq(tp_ucx_ops.init(&cfg, &c), RESHARD_ERR_UNAVAILABLE);
    cr_assert_null(c);
    const char *msg = rs_error_message();
    cr_assert(!strncmp(msg, "UCX: libucp-not-here.so.0: cannot open", 38), "%s", msg);
    cr_assert(strstr(msg, "(install libucx0)"), "%s", msg);
}
