/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the ibverbs transport reads from peers, checked before any field is used: the address
 * a peer announces (through the bootstrap or the plugin's handshake), the handshake messages
 * of the TCP side channel, the control messages (CTS, CANCEL) and immediates on its queue
 * pairs. A peer is another process, possibly hostile or simply of another build: each check
 * says what was wrong, and the caller fails that peer with it. Pure functions, fuzzed by
 * test/fuzz/fuzz_ib_cm.c and fuzz_ib_ctl.c.
 */
#include "ib_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#define STRIPE_MIN (64 * 1024) /* a message is striped once each part keeps this much */
#define STRIPE_MAX (INT32_C(1) << 30)

int ib_stripes(size_t len, int nqp)
{
    size_t q = (size_t)nqp, k = len >= 2 * (size_t)STRIPE_MIN ? len / STRIPE_MIN : 1;
    if (k > q)
        k = q;
    size_t need = len / ((size_t)STRIPE_MAX + 1) + 1; /* one write moves at most 2^31 - 1 bytes */
    if (k < need) /* more stripes, a round of the queue pairs at a time */
        k += (need - k + q - 1) / q * q;
    return k > IB_MAX_STRIPES ? IB_MAX_STRIPES + 1 : (int)k;
}

int ib_keys_for(size_t cap, int nqp)
{
    if (!cap)
        return 0;
    int k = ib_stripes(cap, nqp);
    return k < nqp ? k : nqp;
}

__attribute__((format(printf, 3, 4))) static int bad(char *why, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, n, fmt, ap);
    va_end(ap);
    return -1;
}

int ib_addr_check(const void *buf, size_t len, struct ib_wire_addr *out, char *why, size_t n)
{
    struct ib_wire_addr a;
    if (len != sizeof(a))
        return bad(why, n, "its address is %zu bytes, not an ib address", len);
    memcpy(&a, buf, sizeof(a));
    if (a.magic != ADDR_MAGIC)
        return bad(why, n, "its address is not an ib address (magic 0x%x)", a.magic);
    if (a.index < -1)
        return bad(why, n, "its address names peer number %d", a.index);
    if (a.link_layer != IBV_LINK_LAYER_INFINIBAND && a.link_layer != IBV_LINK_LAYER_ETHERNET)
        return bad(why, n, "its address names link layer %u", a.link_layer);
    if (a.mtu < IBV_MTU_256 || a.mtu > IBV_MTU_4096)
        return bad(why, n, "its address names MTU code %u", a.mtu);
    if (a.nqp < 1 || a.nqp > IB_MAX_QPS)
        return bad(why, n, "its address names %u queue pairs a peer", a.nqp);
    int family = a.tcp.sa.sa_family;
    if ((family != AF_INET && family != AF_INET6) || sock_addr_port(&a.tcp) == 0)
        return bad(why, n, "its address names no TCP listener (family %d)", family);
    *out = a;
    return 0;
}

int ib_hs_check(const struct ib_hs *h, char *why, size_t n)
{
    if (h->magic != HS_MAGIC)
        return bad(why, n, "not a reshard handshake (magic 0x%x)", h->magic);
    if (h->kind < HS_HELLO || h->kind > HS_CROSSED)
        return bad(why, n, "a handshake of unknown kind %u", h->kind);
    if (h->from_index < 0 || h->to_index < 0)
        return bad(why, n, "a handshake naming peer number %d",
                   h->from_index < 0 ? h->from_index : h->to_index);
    int crossed = h->kind == HS_CROSSED; /* names no queue pairs */
    if (crossed ? h->nqp != 0 : h->nqp < 1 || h->nqp > IB_MAX_QPS)
        return bad(why, n, "a handshake with %u queue pairs", h->nqp);
    uint32_t used = h->nqp;
    if (h->psn >> 24 || (crossed && h->psn))
        return bad(why, n, "a handshake with packet sequence number 0x%x", h->psn);
    for (uint32_t i = 0; i < IB_MAX_QPS; i++)
        if (i < used ? h->qpn[i] >> 24 || !h->qpn[i] : h->qpn[i] != 0)
            return bad(why, n, "a handshake with queue pair number 0x%x", h->qpn[i]);
    return 0;
}

int ib_ctl_check(const struct ib_ctl *c, size_t got, int nqp, char *why, size_t n)
{
    if (got != sizeof(*c))
        return bad(why, n, "sent a %zu-byte control message", got);
    if (c->type != CTL_CTS && c->type != CTL_CANCEL)
        return bad(why, n, "sent a control message of unknown type %u", c->type);
    if (c->id == 0 || c->id > IB_MAX_RECV_ID)
        return bad(why, n, "sent a control message for receive id %u", c->id);
    if (c->pad)
        return bad(why, n, "sent a control message with padding 0x%x", c->pad);
    int keys = 0;
    if (c->type == CTL_CTS) {
        if (c->addr + c->len < c->addr)
            return bad(why, n, "offered a receive that wraps the address space (%llu bytes)",
                       (unsigned long long)c->len);
        if (ib_stripes(c->len, nqp) > IB_MAX_STRIPES)
            return bad(why, n,
                       "offered a %llu-byte receive (more stripes than an immediate "
                       "counts)",
                       (unsigned long long)c->len);
        keys = ib_keys_for(c->len, nqp);
        if (c->nkeys != (uint32_t)keys)
            return bad(why, n, "offered a receive of %llu bytes with %u keys (%d expected)",
                       (unsigned long long)c->len, c->nkeys, keys);
    } else if (c->tag || c->addr || c->len || c->nkeys) {
        return bad(why, n, "sent a CANCEL with the fields of a CTS (tag 0x%llx)",
                   (unsigned long long)c->tag);
    }
    for (int i = keys; i < IB_MAX_QPS; i++)
        if (c->rkey[i])
            return bad(why, n, "sent a control message with a stray key 0x%x", c->rkey[i]);
    return 0;
}

int ib_imm_check(uint32_t imm, uint32_t *id, uint32_t *code)
{
    *id = imm >> 8;
    *code = imm & 0xff;
    if (*id == 0 || (*code == 0 || (*code > IB_MAX_STRIPES && *code != CODE_REFUSED)))
        return -1;
    return 0;
}
