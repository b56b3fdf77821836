/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Admission at a bootstrap listener (rank 0's, or a tree parent's): the challenge, the hello
 * and the admission, their codecs and MACs, and the door (struct boot_gate) that keeps
 * strangers from crowding out the job's ranks. Every connection is sent a fresh nonce as soon
 * as it is accepted; it must answer with a hello MACed under the job's secret within
 * RESHARD_BOOT_HELLO_MS. At most BOOT_PENDING_MAX connections wait at once; when the table is
 * full, a newcomer takes the place of the oldest once that one has had an eighth of its time,
 * and is answered BUSY (and tries again) before, so that idle or slow connections delay a real
 * rank by little, and never lock it out.
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
/* Connections the first look at a listener takes, so that a backlog left by strangers while
 * nobody served it is cleared at once (the newest kept: the job's ranks come last). */
#define BOOT_SWEEP_MAX 8192
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

int64_t boot_gate_expiry(const struct boot_gate *g)
{
    int64_t t = INT64_MAX;
    for (int i = 0; i < g->np; i++)
        if (g->p[i].since + g->hello_ms < t)
            t = g->p[i].since + g->hello_ms;
    return t;
}

static void boot_gate_remove(struct boot_gate *g, int i)
{
    struct boot_pending *p = &g->p[i];
    *p = g->p[--g->np];
    p->x.data = p->hello; /* the moved transfer pointed into its old slot */
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
    char claim[64] = "", why[256] = "";
    boot_hello_get(p->hello, &h);
    if (h.version != BOOT_VERSION) {
        snprintf(why, sizeof(why), "bootstrap version %u, this rank speaks %u", h.version,
                 BOOT_VERSION);
    } else if (boot_hello_mac(b->secret, p->nonce, p->hello, mac) != RESHARD_OK) {
        snprintf(why, sizeof(why), "this rank cannot check hellos: %s",
                 sock_msg_body(rs_error_message()));
    } else if (!boot_mac_equal(mac, h.mac)) {
        snprintf(why, sizeof(why), "wrong secret: not part of this job");
    } else {
        snprintf(claim, sizeof(claim), " claiming rank %d of %d", h.rank, h.size);
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
    if (!claim[0] && h.version == BOOT_VERSION)
        snprintf(claim, sizeof(claim), " claiming rank %d of %d", h.rank, h.size);
    boot_gate_refuse(g, &p->fd, p->addr, claim, why);
    boot_gate_remove(g, i);
}

static void boot_gate_step(struct boot_gate *g, int i)
{
    struct boot_pending *p = &g->p[i];
    size_t before = p->x.hdr_done + p->x.done;
    reshard_status_t st = sock_xfer_step(&p->x, NULL);
    g->b->form_received += p->x.hdr_done + p->x.done - before;
    if (st != RESHARD_OK && p->x.eof && p->x.hdr_done == 0) {
        boot_gate_drop(g, i); /* gone before a word: nothing to answer */
    } else if (st != RESHARD_OK) {
        char why[RS_ERROR_MAX];
        snprintf(why, sizeof(why), "no valid hello (%s)", sock_msg_body(rs_error_message()));
        boot_gate_refuse(g, &p->fd, p->addr, "", why);
        boot_gate_remove(g, i);
    } else if (p->x.finished) {
        boot_gate_hello(g, i);
    }
}

/* Sends a fresh connection its challenge and keeps it; closes it when that cannot be done. */
static void boot_gate_challenge(struct boot_gate *g, int fd, const char *addr)
{
    struct boot *b = g->b;
    struct boot_pending *p = &g->p[g->np];
    unsigned char w[BOOT_CHALLENGE_BYTES];
    struct rs_saved_error saved;
    rs_error_save(&saved);
    p->fd = fd;
    if (boot_random(p->nonce, sizeof(p->nonce)) != RESHARD_OK) {
        rs_error_restore(&saved);
        sock_close(&p->fd);
        g->dropped++;
        return;
    }
    sock_wire_put(w, BOOT_VERSION, 4);
    sock_wire_put(w + 4, 0, 4);
    memcpy(w + 8, p->nonce, BOOT_NONCE_BYTES);
    snprintf(p->addr, sizeof(p->addr), "%s", addr);
    if (boot_send_now(b, fd, addr, SOCK_FRAME_CHALLENGE, w, sizeof(w)) != RESHARD_OK) {
        rs_error_restore(&saved);
        sock_close(&p->fd);
        g->dropped++;
        return;
    }
    p->since = rs_now_ms();
    sock_xfer_init(&p->x, fd, "the peer", 0,
                   (struct sock_frame_hdr){.type = SOCK_FRAME_HELLO, .len = BOOT_HELLO_BYTES},
                   p->hello);
    g->np++;
}

/* A newcomer at a full table: the oldest gives way if it has had an eighth of its time; else
 * the newcomer is told to come back. Returns whether there is room now. */
static int boot_gate_make_room(struct boot_gate *g, int fd, const char *addr)
{
    if (g->np < BOOT_PENDING_MAX)
        return 1;
    int oldest = 0;
    for (int i = 1; i < g->np; i++)
        if (g->p[i].since < g->p[oldest].since)
            oldest = i;
    if (rs_now_ms() - g->p[oldest].since >= g->hello_ms / 8) {
        boot_gate_drop(g, oldest);
        return 1;
    }
    static const char text[] = "every place for connections that have not said hello yet is "
                               "taken; try again";
    struct rs_saved_error saved;
    rs_error_save(&saved);
    boot_send_now(g->b, fd, addr, SOCK_FRAME_BUSY, text, sizeof(text) - 1);
    rs_error_restore(&saved);
    g->busy++;
    return 0;
}

/* The first look: everything the backlog holds, the newest BOOT_PENDING_MAX kept. */
static reshard_status_t boot_gate_sweep(struct boot_gate *g)
{
    int fds[BOOT_PENDING_MAX], head = 0, n = 0;
    char addrs[BOOT_PENDING_MAX][SOCK_ADDR_STR];
    reshard_status_t st = RESHARD_OK;
    g->swept = 1;
    for (int taken = 0; taken < BOOT_SWEEP_MAX; taken++) {
        union sock_addr a;
        int fd;
        if ((st = sock_accept(g->lfd, &fd, &a)) != RESHARD_OK || fd < 0)
            break;
        int at = (head + n) % BOOT_PENDING_MAX;
        if (n == BOOT_PENDING_MAX) { /* the oldest goes */
            sock_close(&fds[head]);
            g->dropped++;
            head = (head + 1) % BOOT_PENDING_MAX;
            n--;
        }
        fds[at] = fd;
        sock_addr_str(&a, addrs[at], SOCK_ADDR_STR);
        n++;
    }
    for (int i = 0; i < n; i++) {
        int at = (head + i) % BOOT_PENDING_MAX;
        boot_gate_challenge(g, fds[at], addrs[at]);
    }
    return st;
}

static reshard_status_t boot_gate_accept(struct boot_gate *g)
{
    if (!g->swept)
        return boot_gate_sweep(g);
    for (int taken = 0; taken < BOOT_PENDING_MAX; taken++) {
        union sock_addr a;
        char addr[SOCK_ADDR_STR];
        int fd;
        RS_CHECK(sock_accept(g->lfd, &fd, &a));
        if (fd < 0)
            return RESHARD_OK;
        sock_addr_str(&a, addr, sizeof(addr));
        if (boot_gate_make_room(g, fd, addr))
            boot_gate_challenge(g, fd, addr);
        else
            sock_close(&fd);
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
        if (now >= g->p[i].since + g->hello_ms)
            boot_gate_drop(g, i);
    if (!g->swept || (n > 0 && pf[0].revents))
        RS_CHECK(boot_gate_accept(g));
    return RESHARD_OK;
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
