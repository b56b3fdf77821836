/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Admission at a bootstrap listener (rank 0's, or a tree parent's): the opening, the challenge,
 * the hello and the admission, their codecs and MACs, and the door (struct boot_gate in
 * boot_int.h) that keeps strangers from crowding out the job's ranks. A joiner speaks first
 * (OPEN) as soon as it connects, so its words are usually in by the time the listener accepts
 * it: connections that say nothing make way for those that do. One that has spoken is sent a
 * fresh nonce and must answer with a hello MACed under the job's secret within
 * RESHARD_BOOT_HELLO_MS. Idle or slow connections thus delay a real rank by little, and never
 * lock it out.
 */
#include "boot_int.h"

#include "base/clock.h"
#include "base/log.h"
#include "base/param.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Refusals logged one by one at each door; the rest are counted in its closing line. */
#define BOOT_WARN_MAX 4
/* Connections one look at the listener takes: a backlog left by strangers while nobody served
 * it is cleared in a few looks. */
#define BOOT_ACCEPT_MAX 1024
/* How long sending one small frame on a fresh connection may take. */
#define BOOT_SEND_NOW_MS 100

/* ---- codecs ---- */

void boot_hello_put(unsigned char *w, const struct boot_hello *h)
{
    sock_wire_put(w, h->version, 4);
    sock_wire_put(w + 4, h->kind, 4);
    sock_wire_put(w + 8, (uint32_t)h->rank, 4);
    sock_wire_put(w + 12, (uint32_t)h->size, 4);
    sock_wire_put(w + 16, (uint32_t)h->slot, 4);
    sock_wire_put(w + 20, 0, 4);
    memcpy(w + 24, h->nonce, BOOT_NONCE_BYTES);
    memcpy(w + 24 + BOOT_NONCE_BYTES, h->addr, BOOT_ADDR_BYTES);
    memcpy(w + 24 + BOOT_NONCE_BYTES + BOOT_ADDR_BYTES, h->mac, BOOT_MAC_BYTES);
}

void boot_hello_get(const unsigned char *w, struct boot_hello *h)
{
    h->version = (unsigned)sock_wire_get(w, 4);
    h->kind = (unsigned)sock_wire_get(w + 4, 4);
    h->rank = (int)(int32_t)sock_wire_get(w + 8, 4);
    h->size = (int)(int32_t)sock_wire_get(w + 12, 4);
    h->slot = (int)(int32_t)sock_wire_get(w + 16, 4);
    memcpy(h->nonce, w + 24, BOOT_NONCE_BYTES);
    memcpy(h->addr, w + 24 + BOOT_NONCE_BYTES, BOOT_ADDR_BYTES);
    memcpy(h->mac, w + 24 + BOOT_NONCE_BYTES + BOOT_ADDR_BYTES, BOOT_MAC_BYTES);
}

void boot_admit_put(unsigned char *w, const struct boot_admit *a)
{
    sock_wire_put(w, (uint32_t)a->slot, 4);
    sock_wire_put(w + 4, (uint32_t)a->fanout, 4);
    sock_wire_put(w + 8, (uint32_t)a->parent, 4);
    sock_wire_put(w + 12, 0, 4);
    memcpy(w + 16, a->parent_addr, BOOT_ADDR_BYTES);
    memcpy(w + 16 + BOOT_ADDR_BYTES, a->mac, BOOT_MAC_BYTES);
}

void boot_admit_get(const unsigned char *w, struct boot_admit *a)
{
    a->slot = (int)(int32_t)sock_wire_get(w, 4);
    a->fanout = (int)(int32_t)sock_wire_get(w + 4, 4);
    a->parent = (int)(int32_t)sock_wire_get(w + 8, 4);
    memcpy(a->parent_addr, w + 16, BOOT_ADDR_BYTES);
    memcpy(a->mac, w + 16 + BOOT_ADDR_BYTES, BOOT_MAC_BYTES);
}

int boot_admit_valid(const struct boot_admit *a, int size, int rank, union sock_addr *parent)
{
    if (a->fanout < 1 || a->fanout > BOOT_FANOUT_MAX || a->slot < 1 || a->slot >= size ||
        a->parent < 0 || a->parent >= size || a->parent == rank)
        return -1;
    return a->parent == 0 ? 0 : boot_addr_get(a->parent_addr, parent);
}

const unsigned char *boot_hello_key(const struct boot *b, unsigned kind, int rank)
{
    if (b->members < 1 || kind != BOOT_ATTACH || rank < 0 || rank >= b->members)
        return b->secret;
    return b->member_keyed ? b->member_key : NULL;
}

reshard_status_t boot_hello_mac(const unsigned char *secret, const unsigned char *nonce_l,
                                const unsigned char *hello, unsigned char *mac)
{
    const struct boot_mac_part parts[] = {{nonce_l, BOOT_NONCE_BYTES},
                                          {hello, BOOT_HELLO_BYTES - BOOT_MAC_BYTES}};
    return boot_mac(secret, BOOT_SECRET_BYTES, "reshard bootstrap hello", parts, 2, mac);
}

reshard_status_t boot_admit_mac(const unsigned char *secret, const unsigned char *nonce_j,
                                const unsigned char *nonce_l, const unsigned char *admit,
                                unsigned char *mac)
{
    const struct boot_mac_part parts[] = {{nonce_j, BOOT_NONCE_BYTES},
                                          {nonce_l, BOOT_NONCE_BYTES},
                                          {admit, BOOT_ADMIT_BYTES - BOOT_MAC_BYTES}};
    return boot_mac(secret, BOOT_SECRET_BYTES, "reshard bootstrap admit", parts, 3, mac);
}

/* ---- small frames on fresh connections ---- */

/* One frame, sent now or never: whatever waits to be read is not taken for a reply. */
static reshard_status_t boot_send_now(struct boot *b, int fd, const char *peer, unsigned type,
                                      const void *payload, size_t n)
{
    struct sock_xfer x;
    int failed;
    sock_xfer_init(&x, fd, peer, 1, (struct sock_frame_hdr){.type = (uint16_t)type, .len = n},
                   (void *)payload);
    x.listen = 0;
    reshard_status_t st = sock_xfer_run(&x, 1, rs_now_ms() + BOOT_SEND_NOW_MS, BOOT_SEND_NOW_MS,
                                        "admission", &failed, NULL);
    b->form_sent += x.hdr_done + x.done;
    return st;
}

reshard_status_t boot_admit_send(struct boot *b, int fd, const char *addr,
                                 const struct boot_hello *h, const unsigned char *nonce_l,
                                 struct boot_admit *a)
{
    unsigned char w[BOOT_ADMIT_BYTES];
    memset(a->mac, 0, sizeof(a->mac));
    boot_admit_put(w, a);
    RS_CHECK(boot_admit_mac(b->secret, h->nonce, nonce_l, w, a->mac));
    boot_admit_put(w, a);
    return boot_send_now(b, fd, addr, SOCK_FRAME_ADMIT, w, sizeof(w));
}

/* ---- the door ---- */

reshard_status_t boot_gate_open(struct boot_gate *g, struct boot *b, int lfd, boot_gate_fn admit,
                                void *arg)
{
    *g = (struct boot_gate){.b = b,
                            .lfd = lfd,
                            .hello_ms = (int)rs_param_int(RS_PARAM_BOOT_HELLO_MS),
                            .admit = admit,
                            .arg = arg};
    g->p = rs_calloc(BOOT_PENDING_MAX, sizeof(*g->p), "bootstrap pending connections");
    return g->p ? RESHARD_OK : RESHARD_ERR_NO_MEMORY;
}

int boot_gate_poll(const struct boot_gate *g, struct pollfd *pf)
{
    pf[0] = (struct pollfd){.fd = g->lfd, .events = POLLIN};
    for (int i = 0; i < g->np; i++)
        pf[1 + i] = (struct pollfd){.fd = g->p[i].fd, .events = POLLIN};
    return 1 + g->np;
}

/* How long a connection may wait: to speak at all, then to answer its challenge. */
static int64_t boot_gate_until(const struct boot_gate *g, const struct boot_pending *p)
{
    return p->since + (p->spoken ? g->hello_ms : g->hello_ms / 8);
}

int64_t boot_gate_expiry(const struct boot_gate *g)
{
    int64_t t = INT64_MAX;
    for (int i = 0; i < g->np; i++)
        if (boot_gate_until(g, &g->p[i]) < t)
            t = boot_gate_until(g, &g->p[i]);
    return t;
}

/* The transfer of a pending entry points into the entry: after a move, again. */
static void boot_gate_rehome(struct boot_pending *p)
{
    p->x.data = p->spoken ? (void *)p->hello : (void *)p->open;
}

static void boot_gate_remove(struct boot_gate *g, int i)
{
    g->p[i] = g->p[--g->np];
    boot_gate_rehome(&g->p[i]);
}

/* Drops entry i without a word (it ran out of time, or made way for a newcomer). */
static void boot_gate_drop(struct boot_gate *g, int i)
{
    sock_close(&g->p[i].fd);
    g->dropped++;
    boot_gate_remove(g, i);
}

/* Answers a refusal (best effort), closes, and says so: in b->refusal, and as a warning for the
 * first few. */
static void boot_gate_refuse(struct boot_gate *g, int *fd, const char *addr, const char *claim,
                             const char *reason)
{
    struct boot *b = g->b;
    struct rs_saved_error saved;
    char text[SOCK_FRAME_TEXT_MAX];
    int n = snprintf(text, sizeof(text), "%s", reason);
    rs_error_save(&saved);
    boot_send_now(b, *fd, addr, SOCK_FRAME_REFUSE, text,
                  (size_t)(n < (int)sizeof(text) ? n : (int)sizeof(text) - 1));
    rs_error_restore(&saved);
    sock_close(fd);
    snprintf(b->refusal, sizeof(b->refusal), "bootstrap: rank %d refused a peer at %s%s: %s",
             b->label[b->rank], addr, claim, reason);
    if (g->refused++ < BOOT_WARN_MAX)
        rs_log(RS_LOG_WARN, "%s", b->refusal);
}

/* A whole hello is in: one that proves the secret goes to the owner, the rest are refused. */
static void boot_gate_hello(struct boot_gate *g, int i)
{
    struct boot *b = g->b;
    struct boot_pending *p = &g->p[i];
    struct boot_hello h;
    unsigned char mac[BOOT_MAC_BYTES];
    const unsigned char *key;
    char claim[64] = "", why[256] = "";
    boot_hello_get(p->hello, &h);
    if (h.version == BOOT_VERSION)
        snprintf(claim, sizeof(claim), " claiming rank %d of %d", h.rank, h.size);
    if (h.version != BOOT_VERSION) {
        snprintf(why, sizeof(why), "bootstrap version %u, this rank speaks %u", h.version,
                 BOOT_VERSION);
    } else if (!(key = boot_hello_key(b, h.kind, h.rank))) {
        snprintf(why, sizeof(why), "rank %d is a member: members attach at members' doors", h.rank);
    } else if (boot_hello_mac(key, p->nonce, p->hello, mac) != RESHARD_OK) {
        snprintf(why, sizeof(why), "this rank cannot check hellos: %s",
                 sock_msg_body(rs_error_message()));
    } else if (!boot_mac_equal(mac, h.mac) && key != b->secret) {
        snprintf(why, sizeof(why),
                 "it claims member rank %d but does not prove the members' secret (a joiner "
                 "holds only the growth's)",
                 h.rank);
    } else if (!boot_mac_equal(mac, h.mac)) {
        snprintf(why, sizeof(why), "wrong secret: not part of this job");
    } else {
        int fd = p->fd;
        p->fd = -1;
        int taken = g->admit(g->arg, fd, p->addr, &h, p->nonce, why, sizeof(why));
        if (taken > 0) {
            boot_gate_remove(g, i);
            return;
        }
        p->fd = fd;
        if (taken < 0) {
            boot_gate_drop(g, i);
            return;
        }
    }
    boot_gate_refuse(g, &p->fd, p->addr, claim, why);
    boot_gate_remove(g, i);
}

/* An OPEN is in: the joiner's version checked, then its challenge. 0, or -1 when refused or
 * dropped (p->fd is then closed). */
static int boot_gate_challenge(struct boot_gate *g, struct boot_pending *p)
{
    struct boot *b = g->b;
    unsigned char w[BOOT_CHALLENGE_BYTES];
    struct rs_saved_error saved;
    unsigned v = (unsigned)sock_wire_get(p->open, 4);
    if (g->turn_away) { /* everything it sent is read: the refusal reaches it whole */
        boot_gate_refuse(g, &p->fd, p->addr, "", g->turn_away);
        return -1;
    }
    if (v != BOOT_VERSION) {
        char why[96];
        snprintf(why, sizeof(why), "bootstrap version %u, this rank speaks %u", v, BOOT_VERSION);
        boot_gate_refuse(g, &p->fd, p->addr, "", why);
        return -1;
    }
    rs_error_save(&saved);
    sock_wire_put(w, BOOT_VERSION, 4);
    sock_wire_put(w + 4, 0, 4);
    if (boot_random(p->nonce, sizeof(p->nonce)) != RESHARD_OK ||
        (memcpy(w + 8, p->nonce, BOOT_NONCE_BYTES),
         boot_send_now(b, p->fd, p->addr, SOCK_FRAME_CHALLENGE, w, sizeof(w))) != RESHARD_OK) {
        rs_error_restore(&saved);
        sock_close(&p->fd);
        g->dropped++;
        return -1;
    }
    p->spoken = 1;
    sock_xfer_init(&p->x, p->fd, "the peer", 0,
                   (struct sock_frame_hdr){.type = SOCK_FRAME_HELLO, .len = BOOT_HELLO_BYTES},
                   p->hello);
    return 0;
}

/* Moves p's frame on as far as the socket allows. 0 while it waits (challenged, or not yet
 * spoken), 1 when its hello is in, -1 when it is gone (refused, or dropped: p->fd closed). */
static int boot_gate_step_one(struct boot_gate *g, struct boot_pending *p)
{
    size_t before = p->x.hdr_done + p->x.done;
    reshard_status_t st = sock_xfer_step(&p->x, NULL);
    g->b->form_received += p->x.hdr_done + p->x.done - before;
    if (st != RESHARD_OK && p->x.eof && p->x.hdr_done == 0) {
        sock_close(&p->fd); /* gone before a word: nothing to answer */
        g->dropped++;
        return -1;
    }
    if (st != RESHARD_OK) {
        char why[RS_ERROR_MAX];
        snprintf(why, sizeof(why), "no valid %s (%s)", p->spoken ? "hello" : "opening",
                 sock_msg_body(rs_error_message()));
        boot_gate_refuse(g, &p->fd, p->addr, "", why);
        return -1;
    }
    if (!p->x.finished)
        return 0;
    if (p->spoken)
        return 1;
    return boot_gate_challenge(g, p) == 0 ? boot_gate_step_one(g, p) : -1;
}

static void boot_gate_step(struct boot_gate *g, int i)
{
    int r = boot_gate_step_one(g, &g->p[i]);
    if (r < 0)
        boot_gate_remove(g, i);
    else if (r > 0)
        boot_gate_hello(g, i);
}

/* Room for a newcomer (spoken: it has sent its OPEN): one that never spoke makes way at once,
 * a challenged one once it has had an eighth of its time. Returns whether there is room. */
static int boot_gate_make_room(struct boot_gate *g, int spoken)
{
    if (g->np < BOOT_PENDING_MAX)
        return 1;
    if (!spoken)
        return 0;
    int unspoken = -1, oldest = -1;
    for (int i = 0; i < g->np; i++) {
        if (!g->p[i].spoken && (unspoken < 0 || g->p[i].since < g->p[unspoken].since))
            unspoken = i;
        if (g->p[i].spoken && (oldest < 0 || g->p[i].since < g->p[oldest].since))
            oldest = i;
    }
    int victim = unspoken >= 0                                                        ? unspoken
                 : oldest >= 0 && rs_now_ms() - g->p[oldest].since >= g->hello_ms / 8 ? oldest
                                                                                      : -1;
    if (victim < 0)
        return 0;
    boot_gate_drop(g, victim);
    return 1;
}

/* A fresh connection: what it has said already is read, then it is kept, or told to come back. */
static void boot_gate_take(struct boot_gate *g, int fd, const union sock_addr *a)
{
    struct boot_pending p = {.fd = fd, .since = rs_now_ms()};
    sock_addr_str(a, p.addr, sizeof(p.addr));
    sock_xfer_init(&p.x, fd, "the peer", 0,
                   (struct sock_frame_hdr){.type = SOCK_FRAME_OPEN, .len = BOOT_OPEN_BYTES},
                   p.open);
    int r = boot_gate_step_one(g, &p);
    if (r < 0)
        return;
    if (!boot_gate_make_room(g, p.spoken)) {
        static const char text[] = "every place for connections that have not proven "
                                   "themselves yet is taken; try again";
        struct rs_saved_error saved;
        rs_error_save(&saved);
        boot_send_now(g->b, fd, p.addr, SOCK_FRAME_BUSY, text, sizeof(text) - 1);
        rs_error_restore(&saved);
        sock_close(&p.fd);
        g->busy++;
        return;
    }
    g->p[g->np] = p;
    boot_gate_rehome(&g->p[g->np++]);
    if (r > 0)
        boot_gate_hello(g, g->np - 1);
}

static reshard_status_t boot_gate_accept(struct boot_gate *g)
{
    for (int taken = 0; taken < BOOT_ACCEPT_MAX; taken++) {
        union sock_addr a;
        int fd;
        RS_CHECK(sock_accept(g->lfd, &fd, &a));
        if (fd < 0)
            return RESHARD_OK;
        boot_gate_take(g, fd, &a);
    }
    return RESHARD_OK;
}

reshard_status_t boot_gate_serve(struct boot_gate *g, const struct pollfd *pf, int n)
{
    /* Downwards, so that removing entry i moves one already seen into its place. */
    for (int i = (n - 1 < g->np ? n - 1 : g->np) - 1; i >= 0; i--)
        if (pf[1 + i].revents)
            boot_gate_step(g, i);
    int64_t now = rs_now_ms();
    for (int i = g->np - 1; i >= 0; i--)
        if (now >= boot_gate_until(g, &g->p[i]))
            boot_gate_drop(g, i);
    /* The first look takes what waited before anyone served the listener. */
    return boot_gate_accept(g);
}

void boot_gate_close(struct boot_gate *g, const char *why)
{
    if (!g->p)
        return;
    for (int i = g->np - 1; i >= 0; i--) {
        boot_gate_refuse(g, &g->p[i].fd, g->p[i].addr, "", why);
        boot_gate_remove(g, i);
    }
    if (g->refused > BOOT_WARN_MAX || g->dropped || g->busy)
        rs_log(RS_LOG_INFO,
               "bootstrap: rank %d's listener turned away %u connections: %u refused, %u that "
               "did not prove themselves in time or made way, %u answered busy",
               g->b->label[g->b->rank], g->refused + g->dropped + g->busy, g->refused, g->dropped,
               g->busy);
    free(g->p);
    g->p = NULL;
}
