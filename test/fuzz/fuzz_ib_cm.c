/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target: the ib transport's side channel (transport/ib/ib_cm.c, ib_wire.c). The
 * input's first byte picks what the rest is: an address announced by a peer (ib_addr_check),
 * what an accepted connection says to the listener (the stash: ib_hs_check, then the HELLO's
 * match against a known peer, up, connecting or down), or the answer a connecting side reads
 * (REPLY, CROSSED, a goodbye byte). The bytes come through a real socket; the peer's queue
 * pairs are stand-ins. Nothing may read or write out of bounds, leak, or hang.
 */
#include "transport/ib/ib_int.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define NONCE      UINT64_C(0x1122334455667788) /* this context's */
#define PEER_NONCE UINT64_C(0x0102030405060708)
#define TOKEN      UINT64_C(0x5555aaaa5555aaaa)

static int modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask)
{
    (void)qp, (void)a, (void)mask;
    return 0;
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    setenv("RESHARD_DEBUG", "NONE", 1); /* a warning per bad input would drown the fuzzer */
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 4096)
        return 0;
    int mode = data[0] % 4;
    data++, size--;
    if (mode == 0) {
        struct ib_wire_addr a;
        char why[160];
        if (ib_addr_check(data, size, &a, why, sizeof(why)) == 0 && a.nqp > IB_MAX_QPS)
            abort(); /* what the check promises */
        return 0;
    }
    static struct ib_fns fns = {.modify_qp = modify_qp};
    static struct ibv_qp qps[IB_MAX_QPS];
    struct ib_ctx x = {.f = &fns, .lfd = -1, .nonce = NONCE, .rank = 0, .hello_ms = IB_HELLO_MS};
    x.super.failed_peer = -1;
    tp_deferred_init(&x.deferred);
    snprintf(x.port.name, sizeof(x.port.name), "fuzz0:1");
    uint64_t token = TOKEN;
    x.tokens = &token;
    x.tokens_cap = 1;
    struct ib_peer *p = calloc(1, sizeof(*p));
    struct ib_peer *peers[1] = {p};
    int sv[2] = {-1, -1};
    if (!p || socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) != 0)
        goto out;
    *p = (struct ib_peer){.index = 0, .fd = -1, .nqp = 1 + (size && (data[0] & 1))};
    for (int i = 0; i < IB_MAX_QPS; i++) {
        qps[i] = (struct ibv_qp){.qp_num = 0x10 + (uint32_t)i};
        p->qp[i] = &qps[i];
    }
    p->addr.nonce = PEER_NONCE;
    p->addr.index = -1;
    p->addr.mtu = IBV_MTU_1024;
    p->sends_tail = &p->sends;
    p->cts_tail = &p->cts;
    p->out_tail = &p->out;
    x.peers = peers;
    x.npeers = 1;
    if (size && write(sv[1], data, size) < 0) /* fits the socket buffer: no reader needed */
        goto out;
    shutdown(sv[1], SHUT_WR);
    if (mode == 1 || mode == 2) { /* an accepted connection, its peer up or connecting */
        p->state = mode == 1 ? P_UP : P_CONNECTING;
        p->initiator = mode == 2;
        x.handshakes = 1 + (mode == 2);
        struct ib_stash *s = calloc(1, sizeof(*s));
        if (!s)
            goto out;
        s->fd = sv[0];
        sv[0] = -1;
        x.stash = s;
        x.nstash = 1;
        for (int i = 0; i < 4 && x.stash; i++)
            ib_cm_serve_stash(&x);
    } else { /* this side connected and said HELLO: the peer's answer */
        p->state = P_CONNECTING;
        p->initiator = 1;
        p->fd = sv[0];
        sv[0] = -1;
        p->deadline_ms = INT64_MAX;
        x.handshakes = 1;
        for (int i = 0; i < 4 && p->state == P_CONNECTING && p->fd >= 0; i++)
            ib_cm_poll(&x);
    }
    ib_deliver(&x);
out:
    ib_cm_drop_stash(&x);
    if (p) {
        sock_close(&p->fd);
        while (p->out) {
            struct ib_work *w = p->out;
            p->out = w->next;
            free(w);
        }
    }
    free(p);
    sock_close(&sv[0]);
    sock_close(&sv[1]);
    return 0;
}
