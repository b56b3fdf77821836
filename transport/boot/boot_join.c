/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Joining a bootstrap listener (boot_dial in boot_int.h): connect, speak first (OPEN), take the
 * listener's challenge, answer with a hello MACed under the job's secret over both nonces, check
 * the admission's MAC in turn, so that neither end shows the secret and each knows the other holds
 * it. A listener that is busy, or drops the connection after its challenge, is tried again
 * (with a jittered backoff) until the deadline; a refusal is final.
 */
#include "boot_int.h"

#include "base/clock.h"

#include <poll.h>
#include <stdio.h>
#include <string.h>

#define BOOT_RETRY_MIN_MS 5
#define BOOT_RETRY_MAX_MS 200

/* What one attempt came to. */
enum boot_try { BOOT_TRY_DONE, BOOT_TRY_AGAIN, BOOT_TRY_FAIL };

struct boot_call {
    struct boot *b;
    const union sock_addr *a;
    const char *who;
    char name[BOOT_PEER_NAME_BYTES]; /* "rank 0 (10.0.0.1:29501)" */
    char addr[SOCK_ADDR_STR];
    int kind, prompt;
    int64_t deadline;
    reshard_status_t st; /* why an attempt failed for good (its message is the thread's) */
};

/* One frame from the listener into w (len bytes of type), until `until`. */
static reshard_status_t boot_call_recv(struct boot_call *c, int fd, unsigned type, void *w,
                                       size_t len, int64_t until, struct sock_xfer *x)
{
    int failed;
    sock_xfer_init(x, fd, c->name, 0, (struct sock_frame_hdr){.type = (uint16_t)type, .len = len},
                   w);
    reshard_status_t st = sock_xfer_run(x, 1, until, c->b->timeout_ms, "rendezvous", &failed, NULL);
    c->b->form_received += x->hdr_done + x->done;
    return st;
}

/* A prompt id's listener that did not answer as reshard's rank 0 would. */
static enum boot_try boot_call_foreign(struct boot_call *c, const char *what)
{
    c->st =
        rs_error(RESHARD_ERR_NETWORK,
                 "bootstrap: the program listening at %s is not reshard's rank 0: it accepted the "
                 "connection and %s. Rank 0 listens on MASTER_PORT+1 (or RESHARD_BOOT_PORT), which "
                 "must be free on its host: if another program holds it, rank 0 fails at once; set "
                 "RESHARD_BOOT_PORT to a free port (docs/security.md)",
                 c->addr, what);
    return BOOT_TRY_FAIL;
}

/* This rank speaks first, at once, so that the listener tells it from idle connections. */
static reshard_status_t boot_call_open(struct boot_call *c, int fd)
{
    unsigned char w[BOOT_OPEN_BYTES];
    struct sock_xfer x;
    int failed;
    sock_wire_put(w, BOOT_VERSION, 4);
    sock_wire_put(w + 4, 0, 4);
    sock_xfer_init(&x, fd, c->name, 1,
                   (struct sock_frame_hdr){.type = SOCK_FRAME_OPEN, .len = sizeof(w)}, w);
    x.listen = 0; /* whatever comes back is read as the answer */
    reshard_status_t st =
        sock_xfer_run(&x, 1, c->deadline, c->b->timeout_ms, "rendezvous", &failed, NULL);
    c->b->form_sent += x.hdr_done + x.done;
    return st;
}

/* The challenge: the listener's version and nonce, or why there is none. */
static enum boot_try boot_call_challenge(struct boot_call *c, int fd, unsigned char *nonce_l)
{
    unsigned char w[BOOT_CHALLENGE_BYTES];
    struct sock_xfer x;
    int64_t until = c->deadline;
    if (c->prompt && rs_now_ms() + BOOT_PROMPT_MS < until)
        until = rs_now_ms() + BOOT_PROMPT_MS;
    reshard_status_t opened = boot_call_open(c, fd);
    if (opened == RESHARD_ERR_NO_MEMORY) {
        c->st = opened;
        return BOOT_TRY_FAIL;
    }
    if (opened != RESHARD_OK) /* the stream broke: what comes back (or not) says how */
        rs_error_clear();
    reshard_status_t st = boot_call_recv(c, fd, SOCK_FRAME_CHALLENGE, w, sizeof(w), until, &x);
    if (st == RESHARD_OK) {
        unsigned v = (unsigned)sock_wire_get(w, 4);
        if (v != BOOT_VERSION) {
            c->st =
                rs_error(RESHARD_ERR_REFUSED,
                         "bootstrap: %s speaks bootstrap version %u, this rank %u: every rank must "
                         "run the same reshard",
                         c->name, v, BOOT_VERSION);
            return BOOT_TRY_FAIL;
        }
        memcpy(nonce_l, w + 8, BOOT_NONCE_BYTES);
        return BOOT_TRY_DONE;
    }
    if (st == RESHARD_ERR_BUSY)
        return BOOT_TRY_AGAIN;
    if (x.foreign)
        return boot_call_foreign(c, "sent bytes that are not a reshard bootstrap frame");
    if (x.eof && x.hdr_done == 0)
        return c->prompt ? boot_call_foreign(c, "closed it without a word") : BOOT_TRY_AGAIN;
    if (st == RESHARD_ERR_TIMEOUT && x.hdr_done == 0 && until < c->deadline)
        return boot_call_foreign(c, "said nothing for 1 s (rank 0 answers at once)");
    c->st = st;
    return st == RESHARD_ERR_NETWORK ? BOOT_TRY_AGAIN : BOOT_TRY_FAIL;
}

/* This rank's hello, and the admission it earns. */
static enum boot_try boot_call_hello(struct boot_call *c, int fd, const unsigned char *nonce_l,
                                     struct boot_admit *out)
{
    struct boot *b = c->b;
    struct boot_hello h = {.version = BOOT_VERSION,
                           .kind = (unsigned)c->kind,
                           .rank = b->rank,
                           .size = b->size,
                           .slot = c->kind == BOOT_JOIN ? 0 : b->slot};
    unsigned char w[BOOT_HELLO_BYTES], a[BOOT_ADMIT_BYTES], mac[BOOT_MAC_BYTES];
    union sock_addr mine;
    struct sock_xfer x;
    int failed;
    if ((c->st = boot_random(h.nonce, sizeof(h.nonce))) != RESHARD_OK)
        return BOOT_TRY_FAIL;
    if (c->kind == BOOT_JOIN && sock_local_addr(b->lfd, &mine) == 0)
        boot_addr_put(h.addr, &mine);
    boot_hello_put(w, &h);
    const unsigned char *key = boot_hello_key(b, h.kind, h.rank);
    if ((c->st = boot_hello_mac(key ? key : b->secret, nonce_l, w, h.mac)) != RESHARD_OK)
        return BOOT_TRY_FAIL;
    boot_hello_put(w, &h);
    sock_xfer_init(&x, fd, c->name, 1,
                   (struct sock_frame_hdr){.type = SOCK_FRAME_HELLO, .len = sizeof(w)}, w);
    reshard_status_t st =
        sock_xfer_run(&x, 1, c->deadline, b->timeout_ms, "rendezvous", &failed, NULL);
    b->form_sent += x.hdr_done + x.done;
    c->st = st;
    if (st == RESHARD_ERR_REFUSED || st == RESHARD_ERR_REMOTE || st == RESHARD_ERR_TIMEOUT ||
        st == RESHARD_ERR_NO_MEMORY)
        return BOOT_TRY_FAIL; /* heard while sending, or could not send */
    if (st != RESHARD_OK)
        return BOOT_TRY_AGAIN;
    c->st = st = boot_call_recv(c, fd, SOCK_FRAME_ADMIT, a, sizeof(a), c->deadline, &x);
    if (st == RESHARD_ERR_BUSY || (st == RESHARD_ERR_NETWORK && x.eof))
        return BOOT_TRY_AGAIN; /* made way for a newcomer, or gave up on us: try again */
    if (st != RESHARD_OK)
        return BOOT_TRY_FAIL;
    boot_admit_get(a, out);
    if ((c->st = boot_admit_mac(b->secret, h.nonce, nonce_l, a, mac)) != RESHARD_OK)
        return BOOT_TRY_FAIL;
    if (!boot_mac_equal(mac, out->mac)) {
        c->st =
            rs_error(RESHARD_ERR_REFUSED,
                     "bootstrap: %s could not prove that it holds the job's secret: it is another "
                     "job's, or an impostor; this rank does not join it",
                     c->name);
        return BOOT_TRY_FAIL;
    }
    return BOOT_TRY_DONE;
}

/* A join's first connection: this rank's own listener, on the address it reaches rank 0 from. */
static reshard_status_t boot_call_listen(struct boot_call *c, int fd)
{
    union sock_addr a;
    if (c->kind != BOOT_JOIN || c->b->lfd >= 0)
        return RESHARD_OK;
    if (sock_local_addr(fd, &a) != 0)
        return rs_error(RESHARD_ERR_NETWORK, "bootstrap: getsockname: %m");
    sock_addr_set_port(&a, 0);
    return sock_listen(&a, &c->b->lfd);
}

static void boot_call_backoff(int *ms, int64_t deadline)
{
    unsigned r = 0;
    boot_random(&r, sizeof(r));
    int64_t wait = *ms / 2 + (int64_t)(r % (unsigned)(*ms / 2 + 1)), left = deadline - rs_now_ms();
    if (left > 0)
        poll(NULL, 0, (int)(wait < left ? wait : left));
    *ms = *ms * 2 > BOOT_RETRY_MAX_MS ? BOOT_RETRY_MAX_MS : *ms * 2;
}

reshard_status_t boot_dial(struct boot *b, const union sock_addr *a, const char *who, int kind,
                           int prompt, int64_t deadline, int *fd, struct boot_admit *out)
{
    struct boot_call c = {
        .b = b, .a = a, .who = who, .kind = kind, .prompt = prompt, .deadline = deadline};
    char ms[32];
    int backoff = BOOT_RETRY_MIN_MS, tries = 0;
    sock_addr_str(a, c.addr, sizeof(c.addr));
    snprintf(c.name, sizeof(c.name), "%s (%s)", who, c.addr);
    for (;;) {
        int s = -1;
        unsigned char nonce_l[BOOT_NONCE_BYTES];
        RS_CHECK(sock_connect(a, who, deadline, b->timeout_ms, &s));
        reshard_status_t st = boot_call_listen(&c, s);
        if (st != RESHARD_OK) {
            sock_close(&s);
            return st;
        }
        tries++;
        enum boot_try t = boot_call_challenge(&c, s, nonce_l);
        if (t == BOOT_TRY_DONE)
            t = boot_call_hello(&c, s, nonce_l, out);
        if (t == BOOT_TRY_DONE) {
            *fd = s;
            return RESHARD_OK;
        }
        sock_close(&s);
        if (t == BOOT_TRY_FAIL)
            return c.st;
        if (rs_now_ms() >= deadline)
            return rs_error(RESHARD_ERR_TIMEOUT,
                            "bootstrap: %s did not admit this rank within %s (%d tries: busy, or "
                            "dropping connections)",
                            c.name, sock_ms_str(b->timeout_ms, ms, sizeof(ms)), tries);
        boot_call_backoff(&backoff, deadline);
    }
}

reshard_status_t boot_decline(const struct boot_id *id, int size, int rank,
                              enum boot_decline_reason reason, int timeout_ms)
{
    union sock_addr a;
    unsigned flags = 0;
    struct boot_admit ad;
    int fd = -1;
    struct boot *b = boot_alloc(0, 1, NULL, timeout_ms);
    if (!b)
        return RESHARD_ERR_NO_MEMORY;
    reshard_status_t st = RESHARD_ERR_INVALID_ARG;
    if (boot_id_decode(id, &a, b->secret, &flags) != 0) {
        rs_error(st, "bootstrap: not a bootstrap id of this version: nobody to tell");
        goto out_close;
    }
    b->rank = rank; /* what the hello carries: the number claimed, the reason in the slot */
    b->size = size;
    b->slot = (int)reason;
    st = boot_dial(b, &a, "rank 0", BOOT_DECLINE, flags & BOOT_ID_PROMPT, rs_now_ms() + timeout_ms,
                   &fd, &ad);
    sock_close(&fd); /* admitted (a MACed answer): rank 0 heard it */
out_close:
    b->rank = 0;
    b->size = 1;
    boot_close(b);
    return st;
}
