/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The network plugin's handshake (plugin/net/net_connect.c) inside one process, in the
 * library's own terms (net.h): the listener and the connector on one loopback device.
 *
 * net_handshake: every allocation the handshake makes may fail; each failure must end the
 *                attempt with a status, leave no comm counted on the device, and let the
 *                next connection through.
 */
#include "base/clock.h"
#include "base/error.h"
#include "base/param.h"
#include "plugin/net/net_int.h"

#include <criterion/criterion.h>
#include <stdlib.h>

/* Allocations swept: more than a handshake makes once the device's transport exists. */
#define SWEEP 64

static void loopback(void)
{
    setenv("RESHARD_NET_ALLOW_LO", "1", 1);
    setenv("RESHARD_NET_DEVICES", "lo", 1);
    setenv("RESHARD_TIMEOUT", "5", 1);
    setenv("UCX_LOG_LEVEL", "error", 1);
    rs_param_reload();
}

TestSuite(net_handshake, .init = loopback, .timeout = 120);

struct attempt {
    reshard_status_t connect, accept; /* the first failure of each side */
    void *send, *recv;
};

static void note(reshard_status_t *first, reshard_status_t st)
{
    if (*first == RESHARD_OK)
        *first = st;
}

/* Connect and accept on one handle until both comms exist or the connector gives up, then a
 * moment more for the listener to read the end of a connector that gave up. */
static struct attempt handshake(void *ctx, void *listen, void *handle)
{
    struct attempt a = {RESHARD_OK, RESHARD_OK, NULL, NULL};
    int64_t end = rs_now_ms() + 20000;
    while (a.connect == RESHARD_OK && !(a.send && a.recv)) {
        cr_assert_lt(rs_now_ms(), end, "the handshake neither finished nor failed in 20 s");
        if (!a.send)
            note(&a.connect, net_connect(ctx, 0, handle, &a.send));
        if (!a.recv)
            note(&a.accept, net_accept(listen, &a.recv));
    }
    for (int64_t drain = rs_now_ms() + 100; !a.recv && rs_now_ms() < drain;)
        note(&a.accept, net_accept(listen, &a.recv));
    return a;
}

static void close_pair(struct attempt *a)
{
    if (a->send)
        cr_assert_eq(net_close_send(a->send), RESHARD_OK);
    if (a->recv)
        cr_assert_eq(net_close_recv(a->recv), RESHARD_OK);
}

/* Out of memory here, the connection closed by the other side, or (the connector) refused by
 * a listener that ran out of memory making its comm. */
static int failed_by_memory_or_peer(reshard_status_t st)
{
    return st == RESHARD_OK || st == RESHARD_ERR_NO_MEMORY || st == RESHARD_ERR_NETWORK ||
           st == RESHARD_ERR_REFUSED;
}

Test(net_handshake, each_failed_allocation_ends_the_attempt_and_the_next_one_connects)
{
    void *ctx;
    cr_assert_eq(net_init(0, &ctx), RESHARD_OK, "%s", rs_error_message());
    unsigned char handle[NET_HANDLE_BYTES];
    void *listen;
    cr_assert_eq(net_listen(ctx, 0, handle, &listen), RESHARD_OK, "%s", rs_error_message());
    struct net_dev *d = net_dev_get(0);
    cr_assert_not_null(d);

    /* A first connection makes the device's transport, whose allocations are not the
     * handshake's. */
    struct attempt warm = handshake(ctx, listen, handle);
    cr_assert(warm.send && warm.recv, "connect: %s, accept: %s", rs_status_name(warm.connect),
              rs_status_name(warm.accept));
    close_pair(&warm);

    int failed = 0;
    for (int n = 1; n <= SWEEP; n++) {
        rs_test_fail_alloc(n);
        struct attempt a = handshake(ctx, listen, handle);
        rs_test_fail_alloc(0);
        cr_assert(failed_by_memory_or_peer(a.connect) && failed_by_memory_or_peer(a.accept),
                  "allocation %d: connect %s, accept %s: %s", n, rs_status_name(a.connect),
                  rs_status_name(a.accept), rs_error_message());
        int whole = a.send && a.recv;
        cr_assert(whole || a.connect != RESHARD_OK,
                  "allocation %d: the connector stopped without a comm or a failure", n);
        failed += !whole;
        close_pair(&a);
        cr_assert_eq(d->users, 1, "allocation %d: %d users left on the device, want the listener",
                     n, d->users);
    }
    /* stage, hello, address, reply, two comms with their request pools: each ends one */
    cr_assert_geq(failed, 8, "only %d of %d failed allocations ended a handshake", failed, SWEEP);

    struct attempt after = handshake(ctx, listen, handle);
    cr_assert(after.send && after.recv, "connect: %s, accept: %s after the sweep",
              rs_status_name(after.connect), rs_status_name(after.accept));
    cr_assert_eq(d->users, 3);
    close_pair(&after);
    cr_assert_eq(net_close_listen(listen), RESHARD_OK);
    cr_assert_eq(net_finalize(ctx), RESHARD_OK);
}
