/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The ib transport's side channel (transport/ib/ib_cm.c) against what anyone who reaches its
 * TCP listener can do: connect and say nothing, say garbage, or flood it. A context here has
 * a real listener on the loopback and no device (nothing it does reaches verbs), so these run
 * on every host.
 */
#include "base/clock.h"
#include "base/error.h"
#include "transport/ib/ib_int.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define FLOOD 200

static struct ib_ctx x;
static struct ib_fns fns;
static int clients[FLOOD + 8];
static int nclients;

static int fake_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask)
{
    (void)qp, (void)a, (void)mask;
    return 0;
}

static void listening(void)
{
    fns = (struct ib_fns){.modify_qp = fake_modify_qp};
    x = (struct ib_ctx){.f = &fns, .lfd = -1, .nonce = 0x1234, .rank = 0, .hello_ms = IB_HELLO_MS};
    x.super.failed_peer = -1;
    tp_deferred_init(&x.deferred);
    snprintf(x.port.name, sizeof(x.port.name), "fake0:1");
    x.laddr.in.sin_family = AF_INET;
    x.laddr.in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(sock_listen(&x.laddr, &x.lfd), RESHARD_OK, "%s", rs_error_message());
    nclients = 0;
}

static void closing(void)
{
    ib_cm_drop_stash(&x);
    sock_close(&x.lfd);
    for (int i = 0; i < nclients; i++)
        sock_close(&clients[i]);
    free(x.peers);
}

TestSuite(ib_cm, .init = listening, .fini = closing, .timeout = 60);

/* A blocking connection to the context's listener (the kernel completes it from its backlog). */
static int dial(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    cr_assert_eq(connect(fd, &x.laddr.sa, sock_addr_len(&x.laddr)), 0, "connect: %m");
    cr_assert_lt(nclients, FLOOD + 8);
    clients[nclients++] = fd;
    return fd;
}

/* What the other end did: 1 closed (EOF or reset), 0 still open and silent. */
static int closed(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 0) <= 0)
        return 0;
    char b;
    return recv(fd, &b, 1, MSG_DONTWAIT) <= 0;
}

static void serve(int times)
{
    for (int i = 0; i < times; i++)
        ib_cm_poll(&x);
}

static struct ib_hs hello_for(uint64_t to)
{
    return (struct ib_hs){.magic = HS_MAGIC,
                          .kind = HS_HELLO,
                          .from = 0x9999,
                          .to = to,
                          .from_index = 3,
                          .to_index = 0,
                          .qpn = {0x11, 0x12},
                          .psn = 7,
                          .nqp = 2};
}

/* The attack: many idle connections to the listener, so that a real peer finds no room. */
Test(ib_cm, an_idle_flood_is_bounded_and_the_oldest_make_room)
{
    for (int i = 0; i < FLOOD; i++)
        dial();
    serve(4);
    cr_assert_eq(x.nstash, IB_STASH_MAX, "%d connections kept", x.nstash);
    cr_assert_eq(x.handshakes, IB_STASH_MAX);
    usleep(50 * 1000); /* the closes travel */
    cr_assert(closed(clients[0]), "the oldest went");
    cr_assert(!closed(clients[FLOOD - 1]), "the newest stays");
    int gone = 0;
    for (int i = 0; i < FLOOD; i++)
        gone += closed(clients[i]);
    cr_assert_eq(gone, FLOOD - IB_STASH_MAX);
    cr_assert_eq(x.stash_warned, 1, "one warning, not one per connection");
}

/* A connection that said a HELLO for this context (it knows the context's random nonce: a
 * peer) keeps its place whatever the flood. */
Test(ib_cm, a_hello_for_this_context_keeps_its_place_in_a_flood)
{
    int peer = dial();
    struct ib_hs h = hello_for(x.nonce);
    cr_assert_eq(send(peer, &h, sizeof(h), 0), (ssize_t)sizeof(h));
    for (int k = 0; k < 100 && !(x.stash && x.stash->verified); k++) {
        serve(1);
        usleep(1000);
    }
    cr_assert(x.stash && x.stash->verified, "its HELLO was read");
    for (int i = 0; i < FLOOD; i++)
        dial();
    serve(4);
    usleep(50 * 1000);
    cr_assert(!closed(peer), "the peer's connection stays");
    cr_assert_eq(x.nstash, IB_STASH_MAX);
    int verified = 0;
    for (struct ib_stash *s = x.stash; s; s = s->next)
        verified += s->verified;
    cr_assert_eq(verified, 1);
}

/* The attack: a connection that never speaks. It holds its slot for the HELLO deadline only. */
Test(ib_cm, a_connection_silent_past_its_deadline_is_dropped)
{
    x.hello_ms = 50;
    int fd = dial();
    serve(1);
    cr_assert_eq(x.nstash, 1);
    usleep(120 * 1000);
    serve(1);
    cr_assert_eq(x.nstash, 0);
    usleep(20 * 1000);
    cr_assert(closed(fd));
    cr_assert_eq(x.handshakes, 0);
}

/* The attack: garbage, and a well-formed HELLO for another context. Both are dropped; the
 * HELLO gets a fail byte so that a confused peer fails at once instead of retrying. */
Test(ib_cm, garbage_and_hellos_for_others_are_dropped)
{
    int junk = dial(), other = dial();
    char g[sizeof(struct ib_hs)];
    memset(g, 0x5a, sizeof(g));
    cr_assert_eq(send(junk, g, sizeof(g), 0), (ssize_t)sizeof(g));
    struct ib_hs h = hello_for(x.nonce + 1);
    cr_assert_eq(send(other, &h, sizeof(h), 0), (ssize_t)sizeof(h));
    for (int k = 0; k < 100 && x.nstash + !x.stash_warned; k++) {
        serve(1);
        usleep(1000);
    }
    cr_assert_eq(x.nstash, 0);
    usleep(20 * 1000);
    cr_assert(closed(junk));
    unsigned char b = 0;
    cr_assert_eq(recv(other, &b, 1, 0), 1);
    cr_assert_eq(b, HS_FAIL);
}

/* A side that connects to a full stash is dropped unanswered; it must connect again, not fail:
 * an outsider's flood may delay a real peer, not lock it out. */
Test(ib_cm, an_initiator_dropped_unanswered_connects_again)
{
    union sock_addr la = {.in = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)}};
    int lfd = -1;
    cr_assert_eq(sock_listen(&la, &lfd), RESHARD_OK);
    static struct ibv_qp qp = {.qp_num = 0x77};
    struct ib_peer *p = calloc(1, sizeof(*p));
    x.peers = calloc(1, sizeof(*x.peers));
    cr_assert(p && x.peers);
    *p = (struct ib_peer){.index = 0, .state = P_CONNECTING, .fd = -1, .nqp = 1, .initiator = 1};
    p->qp[0] = &qp;
    p->addr.tcp = la;
    p->addr.nonce = 0x4321;
    p->deadline_ms = rs_now_ms() + 30000;
    x.peers[0] = p;
    x.npeers = 1;
    x.handshakes = 1;
    cr_assert_eq(sock_connect_start(&la, &p->fd), RESHARD_OK);
    p->connecting_tcp = 1;
    struct ib_hs got[2];
    for (int round = 0; round < 2; round++) {
        int c = -1;
        time_t end = time(NULL) + 20;
        while (c < 0 && time(NULL) < end) {
            serve(1);
            union sock_addr from;
            cr_assert_eq(sock_accept(lfd, &c, &from), RESHARD_OK);
            usleep(1000);
        }
        cr_assert_geq(c, 0, "round %d: no connection", round);
        size_t n = 0;
        while (n < sizeof(got[round]) && time(NULL) < end) {
            serve(1);
            ssize_t k = recv(c, (char *)&got[round] + n, sizeof(got[round]) - n, MSG_DONTWAIT);
            n += k > 0 ? (size_t)k : 0;
            usleep(1000);
        }
        cr_assert_eq(n, sizeof(got[round]), "round %d: the HELLO", round);
        sock_close(&c); /* as a full stash does: closed, nothing answered */
        if (!round)
            for (int k = 0; k < 50 && !p->retry_ms; k++) {
                serve(1);
                usleep(1000);
            }
        cr_assert_eq(p->state, P_CONNECTING, "round %d: %s", round, x.super.failed_why);
    }
    cr_assert_eq(got[0].kind, HS_HELLO);
    cr_assert_eq(memcmp(&got[0], &got[1], sizeof(got[0])), 0, "the same HELLO again");
    cr_assert_eq(got[1].qpn[0], 0x77);
    sock_close(&p->fd);
    sock_close(&lfd);
    free(p);
}

/* A peer that fails the handshake says so with a byte: the initiator fails at once, naming the
 * cut, rather than connecting again until its deadline. */
Test(ib_cm, an_initiator_refused_with_a_fail_byte_fails_at_once)
{
    union sock_addr la = {.in = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)}};
    int lfd = -1;
    cr_assert_eq(sock_listen(&la, &lfd), RESHARD_OK);
    static struct ibv_qp qp = {.qp_num = 0x77};
    struct ib_peer *p = calloc(1, sizeof(*p));
    x.peers = calloc(1, sizeof(*x.peers));
    cr_assert(p && x.peers);
    *p = (struct ib_peer){.index = 0, .state = P_CONNECTING, .fd = -1, .nqp = 1, .initiator = 1};
    p->qp[0] = &qp;
    p->addr.tcp = la;
    p->deadline_ms = rs_now_ms() + 30000;
    p->sends_tail = &p->sends;
    p->cts_tail = &p->cts;
    p->out_tail = &p->out;
    x.peers[0] = p;
    x.npeers = 1;
    x.handshakes = 1;
    cr_assert_eq(sock_connect_start(&la, &p->fd), RESHARD_OK);
    p->connecting_tcp = 1;
    int c = -1;
    time_t end = time(NULL) + 20;
    while (c < 0 && time(NULL) < end) {
        serve(1);
        union sock_addr from;
        cr_assert_eq(sock_accept(lfd, &c, &from), RESHARD_OK);
        usleep(1000);
    }
    cr_assert_geq(c, 0);
    unsigned char fail = HS_FAIL;
    cr_assert_eq(send(c, &fail, 1, 0), 1);
    sock_close(&c);
    while (p->state != P_DOWN && time(NULL) < end) {
        serve(1);
        usleep(1000);
    }
    cr_assert_eq(p->state, P_DOWN);
    cr_assert_eq(x.super.failed_peer, 0);
    cr_assert(strstr(x.super.failed_why, "handshake cut short"), "%s", x.super.failed_why);
    cr_assert_eq(p->retry_ms, 0);
    sock_close(&lfd);
    free(p);
}
