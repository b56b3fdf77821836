/* SPDX-License-Identifier: Apache-2.0 */
/* The bootstrap's frames: their codec, and their transfer over non-blocking sockets
 * (sock_frame.h). */
#include "sock_frame.h"

#include "base/clock.h"
#include "base/error.h"
#include "sock.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#define SOCK_FRAME_MAGIC 0x52534231u /* "RSB1" */

/* ---- codec ---- */

void sock_frame_put_hdr(unsigned char *w, const struct sock_frame_hdr *h)
{
    sock_wire_put(w, SOCK_FRAME_MAGIC, 4);
    sock_wire_put(w + 4, h->type, 2);
    sock_wire_put(w + 6, h->op, 2);
    sock_wire_put(w + 8, h->seq, 4);
    sock_wire_put(w + 12, 0, 4);
    sock_wire_put(w + 16, h->len, 8);
}

int sock_frame_get_hdr(const unsigned char *w, struct sock_frame_hdr *h)
{
    if (sock_wire_get(w, 4) != SOCK_FRAME_MAGIC)
        return -1;
    h->type = (uint16_t)sock_wire_get(w + 4, 2);
    h->op = (uint16_t)sock_wire_get(w + 6, 2);
    h->seq = (uint32_t)sock_wire_get(w + 8, 4);
    h->len = sock_wire_get(w + 16, 8);
    return 0;
}

size_t sock_frame_put_error(unsigned char *buf, int origin, reshard_status_t st, const char *text)
{
    size_t n = strnlen(text, SOCK_FRAME_TEXT_MAX);
    sock_wire_put(buf, (uint32_t)origin, 4);
    sock_wire_put(buf + 4, (uint32_t)st, 4);
    memcpy(buf + 8, text, n);
    return 8 + n;
}

const char *sock_frame_op_name(unsigned op)
{
    static const char *const names[] = {
        [SOCK_OP_NONE] = "rendezvous", [SOCK_OP_ALLGATHER] = "allgather", [SOCK_OP_BCAST] = "bcast",
        [SOCK_OP_BARRIER] = "barrier", [SOCK_OP_ALLREDUCE] = "allreduce", [SOCK_OP_PUSH] = "push"};
    return op < sizeof(names) / sizeof(names[0]) ? names[op] : "an unknown collective";
}

static const char *sock_frame_type_name(unsigned type)
{
    static const char *const names[] = {
        [SOCK_FRAME_HELLO] = "hello",     [SOCK_FRAME_WELCOME] = "welcome",
        [SOCK_FRAME_REFUSE] = "refusal",  [SOCK_FRAME_DATA] = "data",
        [SOCK_FRAME_ERROR] = "error",     [SOCK_FRAME_CHALLENGE] = "challenge",
        [SOCK_FRAME_ADMIT] = "admission", [SOCK_FRAME_READY] = "ready",
        [SOCK_FRAME_BUSY] = "busy"};
    return type < sizeof(names) / sizeof(names[0]) && names[type] ? names[type] : "unknown";
}

/* ---- transfers ---- */

void sock_xfer_init(struct sock_xfer *x, int fd, const char *peer, int send,
                    struct sock_frame_hdr hdr, void *data)
{
    memset(x, 0, sizeof(*x));
    x->fd = fd;
    x->peer = peer;
    x->send = send;
    x->listen = send;
    x->hdr = hdr;
    /* A zero-byte payload may come as NULL; keep pointer arithmetic on a real object. */
    static unsigned char none;
    x->data = data ? data : &none;
    if (send)
        sock_frame_put_hdr(x->wire, &hdr);
}

int sock_xfer_torn(const struct sock_xfer *x)
{
    return !x->finished && (x->hdr_done > 0 || x->done > 0);
}

static reshard_status_t sock_xfer_step_send(struct sock_xfer *x)
{
    while (!x->finished) {
        struct iovec iov[2] = {
            {x->wire + x->hdr_done, SOCK_FRAME_HDR_BYTES - x->hdr_done},
            {(char *)x->data + x->done, x->hdr.len - x->done},
        };
        struct msghdr m = {.msg_iov = iov[0].iov_len ? iov : iov + 1,
                           .msg_iovlen = iov[0].iov_len ? 2 : 1};
        if (iov[0].iov_len + iov[1].iov_len == 0) {
            x->finished = 1;
            break;
        }
        /* MSG_NOSIGNAL: a peer that went away is an error to report, not a SIGPIPE. */
        ssize_t k = sendmsg(x->fd, &m, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return RESHARD_OK;
        if (k < 0)
            return rs_error(RESHARD_ERR_NETWORK, "bootstrap: send to %s: %m", x->peer);
        size_t h = (size_t)k < iov[0].iov_len ? (size_t)k : iov[0].iov_len;
        x->hdr_done += h;
        x->done += (size_t)k - h;
    }
    return RESHARD_OK;
}

/* A text frame (a failure report, a refusal, a busy answer) that takes the place of any. */
static int sock_frame_is_text(unsigned type)
{
    return type == SOCK_FRAME_ERROR || type == SOCK_FRAME_REFUSE || type == SOCK_FRAME_BUSY;
}

static reshard_status_t sock_xfer_bad_magic(struct sock_xfer *x)
{
    x->foreign = 1;
    return rs_error(RESHARD_ERR_NETWORK,
                    "bootstrap: %s sent a malformed frame (bad magic): not a reshard "
                    "bootstrap peer, or a stream out of step",
                    x->peer);
}

/* The first n bytes of a header are in: a stream that is not ours is told at its first wrong
 * byte, not after 24 bytes that may never come. */
static reshard_status_t sock_xfer_check_magic(struct sock_xfer *x, size_t n)
{
    unsigned char magic[4];
    sock_wire_put(magic, SOCK_FRAME_MAGIC, 4);
    return memcmp(x->wire, magic, n < 4 ? n : 4) ? sock_xfer_bad_magic(x) : RESHARD_OK;
}

/* The header is in: is it the frame we wait for, or a refusal or error instead? */
static reshard_status_t sock_xfer_check_hdr(struct sock_xfer *x)
{
    struct sock_frame_hdr *g = &x->got;
    if (sock_frame_get_hdr(x->wire, g) != 0)
        return sock_xfer_bad_magic(x);
    if (sock_frame_is_text(g->type)) {
        if (g->len > sizeof(x->text) || (g->type == SOCK_FRAME_ERROR && g->len < 8))
            return rs_error(RESHARD_ERR_NETWORK, "bootstrap: %s sent a malformed %s frame", x->peer,
                            sock_frame_type_name(g->type));
        return RESHARD_OK;
    }
    if (g->type != x->hdr.type && !x->hdr.type)
        return rs_error(RESHARD_ERR_NETWORK, "bootstrap: %s sent a %s frame out of turn", x->peer,
                        sock_frame_type_name(g->type));
    if (g->type != x->hdr.type)
        return rs_error(RESHARD_ERR_NETWORK,
                        "bootstrap: %s sent a %s frame where a %s was expected", x->peer,
                        sock_frame_type_name(g->type), sock_frame_type_name(x->hdr.type));
    /* The rendezvous frames have one size per version. */
    if (g->len != x->hdr.len && x->hdr.op == SOCK_OP_NONE)
        return rs_error(RESHARD_ERR_NETWORK,
                        "bootstrap: %s sent a %s of %llu bytes where %llu were expected: another "
                        "version of reshard?",
                        x->peer, sock_frame_type_name(g->type), (unsigned long long)g->len,
                        (unsigned long long)x->hdr.len);
    if (g->op != x->hdr.op || g->seq != x->hdr.seq)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "bootstrap: %s is in %s #%u while this rank is in %s #%u: every rank "
                        "must call the same collectives in the same order",
                        x->peer, sock_frame_op_name(g->op), g->seq, sock_frame_op_name(x->hdr.op),
                        x->hdr.seq);
    if (g->len != x->hdr.len)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "bootstrap: %s sent %llu bytes where %llu were expected: ranks passed "
                        "different sizes to %s",
                        x->peer, (unsigned long long)g->len, (unsigned long long)x->hdr.len,
                        sock_frame_op_name(x->hdr.op));
    return RESHARD_OK;
}

/* A whole ERROR or REFUSE frame is in: the status it stands for, with its text. */
static reshard_status_t sock_xfer_remote_failure(struct sock_xfer *x, struct sock_frame_error *err)
{
    if (x->got.type == SOCK_FRAME_REFUSE || x->got.type == SOCK_FRAME_BUSY) {
        x->text[x->got.len < sizeof(x->text) ? x->got.len : sizeof(x->text) - 1] = '\0';
        if (x->got.type == SOCK_FRAME_BUSY)
            return rs_error(RESHARD_ERR_BUSY, "bootstrap: %s is busy: %s", x->peer,
                            (char *)x->text);
        return rs_error(RESHARD_ERR_REFUSED, "bootstrap: %s refused this rank: %s", x->peer,
                        (char *)x->text);
    }
    struct sock_frame_error e = {.origin = (int)sock_wire_get(x->text, 4),
                                 .status = (reshard_status_t)sock_wire_get(x->text + 4, 4)};
    size_t n = x->got.len - 8 < SOCK_FRAME_TEXT_MAX - 1 ? x->got.len - 8 : SOCK_FRAME_TEXT_MAX - 1;
    memcpy(e.text, x->text + 8, n);
    e.text[n] = '\0';
    if (err)
        *err = e;
    if (e.status == RESHARD_ERR_LEFT)
        return rs_error(RESHARD_ERR_REMOTE, "bootstrap: %s", sock_msg_body(e.text));
    return rs_error(RESHARD_ERR_REMOTE, "bootstrap: rank %d failed (%s): %s", e.origin,
                    rs_status_name(e.status), sock_msg_body(e.text));
}

static reshard_status_t sock_xfer_step_recv(struct sock_xfer *x, struct sock_frame_error *err)
{
    while (!x->finished) {
        int hdr = x->hdr_done < SOCK_FRAME_HDR_BYTES;
        int mine = !hdr && x->got.type == x->hdr.type;
        unsigned char *dst =
            hdr ? x->wire + x->hdr_done : (mine ? (unsigned char *)x->data : x->text) + x->done;
        size_t want = hdr ? SOCK_FRAME_HDR_BYTES - x->hdr_done : x->got.len - x->done;
        if (!hdr && want == 0) {
            x->finished = 1;
            return mine ? RESHARD_OK : sock_xfer_remote_failure(x, err);
        }
        ssize_t k = recv(x->fd, dst, want, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return RESHARD_OK;
        if (k < 0) {
            x->eof = errno == ECONNRESET; /* a reset ends the stream as a close does */
            return rs_error(RESHARD_ERR_NETWORK, "bootstrap: recv from %s: %m", x->peer);
        }
        if (k == 0) {
            x->eof = 1;
            return rs_error(RESHARD_ERR_NETWORK, "bootstrap: %s closed the connection", x->peer);
        }
        if (!hdr) {
            x->done += (size_t)k;
            continue;
        }
        x->hdr_done += (size_t)k;
        if (x->hdr_done < SOCK_FRAME_HDR_BYTES)
            RS_CHECK(sock_xfer_check_magic(x, x->hdr_done));
        if (x->hdr_done == SOCK_FRAME_HDR_BYTES)
            RS_CHECK(sock_xfer_check_hdr(x));
    }
    return RESHARD_OK;
}

reshard_status_t sock_xfer_step(struct sock_xfer *x, struct sock_frame_error *err)
{
    return x->send ? sock_xfer_step_send(x) : sock_xfer_step_recv(x, err);
}

/* "rank 3 (10.0.0.1:4242), rank 5 (...) and 7 more": who has not finished, for a timeout
 * message. Names that would not fit whole are counted instead. */
static void sock_xfer_list_unfinished(const struct sock_xfer *x, int n, char *buf, size_t cap)
{
    size_t used = 0, room = cap - 24; /* for " and N more" */
    int more = 0;
    buf[0] = '\0';
    for (int i = 0; i < n; i++) {
        if (x[i].finished)
            continue;
        size_t k = strlen(x[i].peer) + (used ? 2 : 0);
        if (more || used + k >= room) {
            more++;
            continue;
        }
        used += (size_t)snprintf(buf + used, cap - used, "%s%s", used ? ", " : "", x[i].peer);
    }
    if (more)
        snprintf(buf + used, cap - used, " and %d more", more);
}

/* A peer we are sending to spoke out of turn. In this protocol that can only be a failure
 * report (or the end of its connection): better to hear it than wait for it to read. */
static reshard_status_t sock_xfer_hear_out(const struct sock_xfer *t, int64_t deadline_ms,
                                           int timeout_ms, const char *what,
                                           struct sock_frame_error *err)
{
    struct sock_xfer r;
    int failed;
    sock_xfer_init(&r, t->fd, t->peer, 0, (struct sock_frame_hdr){0}, NULL);
    RS_CHECK(sock_xfer_run(&r, 1, deadline_ms, timeout_ms, what, &failed, err));
    return rs_error(RESHARD_ERR_NETWORK, "bootstrap: %s sent a frame out of turn", t->peer);
}

reshard_status_t sock_xfer_run(struct sock_xfer *x, int n, int64_t deadline_ms, int timeout_ms,
                               const char *what, int *failed, struct sock_frame_error *err)
{
    return sock_xfer_run_cancel(x, n, deadline_ms, timeout_ms, what, NULL, failed, err);
}

reshard_status_t sock_xfer_run_cancel(struct sock_xfer *x, int n, int64_t deadline_ms,
                                      int timeout_ms, const char *what, const atomic_int *cancel,
                                      int *failed, struct sock_frame_error *err)
{
    struct pollfd *p = rs_calloc((size_t)n, sizeof(*p), "bootstrap poll set");
    int *idx = rs_calloc((size_t)n, sizeof(*idx), "bootstrap poll set");
    reshard_status_t st = RESHARD_OK;
    *failed = -1;
    if (!p || !idx) {
        st = RESHARD_ERR_NO_MEMORY;
        goto out_free_poll;
    }
    for (;;) {
        int active = 0;
        for (int i = 0; i < n; i++) {
            if (x[i].finished)
                continue;
            p[active] = (struct pollfd){.fd = x[i].fd,
                                        .events = x[i].listen ? POLLOUT | POLLIN
                                                  : x[i].send ? POLLOUT
                                                              : POLLIN};
            idx[active++] = i;
        }
        if (active == 0)
            break;
        int rc = 0;
        int64_t until = deadline_ms; /* with a cancel flag, look at it every SOCK_CANCEL_POLL_MS */
        if (cancel && until > rs_now_ms() + SOCK_CANCEL_POLL_MS)
            until = rs_now_ms() + SOCK_CANCEL_POLL_MS;
        if ((st = sock_poll(p, active, until, &rc)) != RESHARD_OK) {
            *failed = idx[0];
            break;
        }
        if (cancel && atomic_load(cancel)) {
            st = rs_error(RESHARD_ERR_ABORTED, "bootstrap: %s: aborted (reshard_comm_abort)", what);
            *failed = idx[0];
            break;
        }
        if (rc == 0 && until < deadline_ms)
            continue;
        if (rc == 0) {
            char who[RS_ERROR_MAX], ms[32];
            sock_xfer_list_unfinished(x, n, who, sizeof(who));
            st = rs_error(RESHARD_ERR_TIMEOUT, "bootstrap: %s: %s did not answer within %s", what,
                          who, sock_ms_str(timeout_ms, ms, sizeof(ms)));
            *failed = idx[0];
            break;
        }
        for (int j = 0; j < active && st == RESHARD_OK; j++) {
            struct sock_xfer *t = &x[idx[j]];
            if (t->listen && (p[j].revents & (POLLIN | POLLHUP)))
                st = sock_xfer_hear_out(t, deadline_ms, timeout_ms, what, err);
            else if (p[j].revents)
                st = sock_xfer_step(t, err);
            if (st != RESHARD_OK)
                *failed = idx[j];
        }
        if (st != RESHARD_OK)
            break;
    }
out_free_poll:
    free(idx);
    free(p);
    return st;
}
