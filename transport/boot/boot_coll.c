/* SPDX-License-Identifier: Apache-2.0 */
/* The bootstrap object (struct boot) once its ranks have met: its collectives (allgather,
 * bcast, barrier) as a star through rank 0, and the spreading of a failure to the other ranks
 * (boot_fail, boot_abort, boot_check) so that they fail fast instead of timing out. */
#include "boot_int.h"

#include "base/clock.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* How long telling the others of a failure may take. */
#define BOOT_ABORT_MAX_MS 1000
/* The most a peer waits past its deadline for rank 0's verdict. */
#define BOOT_PEER_GRACE_MAX 5000

/* ---- the object ---- */

struct boot *boot_alloc(int rank, int size, const int *label, int timeout_ms)
{
    struct boot *b = rs_calloc(1, sizeof(*b), "bootstrap");
    if (!b)
        return NULL;
    b->conns = rs_calloc((size_t)size, sizeof(*b->conns), "bootstrap connections");
    b->label = rs_calloc((size_t)size, sizeof(*b->label), "bootstrap connections");
    if (!b->conns || !b->label) {
        free(b->conns);
        free(b->label);
        free(b);
        return NULL;
    }
    for (int r = 0; r < size; r++) {
        b->conns[r].fd = -1;
        b->label[r] = label ? label[r] : r;
    }
    b->rank = rank;
    b->size = size;
    b->timeout_ms = timeout_ms;
    return b;
}

void boot_set_cancel(struct boot *b, const atomic_int *flag)
{
    b->cancel = flag;
}

int boot_rank(const struct boot *b)
{
    return b ? b->rank : -1;
}

int boot_size(const struct boot *b)
{
    return b ? b->size : -1;
}

const char *boot_refusal(const struct boot *b)
{
    return b ? b->refusal : "";
}

void boot_close(struct boot *b)
{
    if (!b)
        return;
    for (int r = 0; r < b->size; r++)
        sock_close(&b->conns[r].fd);
    free(b->conns);
    free(b->label);
    free(b);
}

/* ---- moving frames ---- */

static int boot_min_int(int a, int b)
{
    return a < b ? a : b;
}

static int boot_peer_grace(const struct boot *b)
{
    return boot_min_int(b->timeout_ms / 4, BOOT_PEER_GRACE_MAX);
}

reshard_status_t boot_coll_transfer(struct boot_coll *c, int only, int skip, int send, uint64_t len,
                                    unsigned char *base, size_t stride)
{
    struct boot *b = c->b;
    int first = only >= 0 ? only : 1, last = only >= 0 ? only : b->size - 1, n = 0, failed;
    struct sock_xfer *x = rs_calloc((size_t)(last - first + 1), sizeof(*x), "bootstrap transfers");
    if (!x)
        return RESHARD_ERR_NO_MEMORY;
    struct sock_frame_hdr hdr = c->hdr;
    /* A peer waiting on rank 0 waits a little longer than rank 0 waits on anyone, so that it
     * hears which rank rank 0 gave up on, rather than timing out on its own. */
    int64_t deadline = c->deadline + (b->rank != 0 && !send ? boot_peer_grace(b) : 0);
    hdr.len = len;
    for (int r = first; r <= last; r++)
        if (r != skip)
            sock_xfer_init(&x[n++], b->conns[r].fd, b->conns[r].name, send, hdr,
                           base + (size_t)r * stride);
    reshard_status_t st =
        sock_xfer_run_cancel(x, n, deadline, b->timeout_ms, c->what, b->cancel, &failed, &c->err);
    for (int i = 0; i < n; i++)
        *(send ? &b->sent : &b->received) += x[i].hdr_done + x[i].done;
    /* The same walk as above, to find each transfer's connection again. */
    for (int r = first, i = 0; r <= last; r++)
        if (r != skip && sock_xfer_torn(&x[i++]) && send)
            b->conns[r].send_torn = 1;
    free(x);
    return st;
}

/* ---- failure spreading ---- */

/* Whether rank r hears of a failure of `origin` (a label) from this rank. */
static int boot_told(const struct boot *b, int r, int origin)
{
    return b->conns[r].fd >= 0 && !b->conns[r].send_torn && b->label[r] != origin && r != b->rank;
}

/* Tells the ranks this one talks to that `origin` (by its label) failed, so that they fail now
 * rather than at their timeout: rank 0 tells every peer but the origin, a peer tells rank 0 (which
 * forwards it). Best effort, within BOOT_ABORT_MAX_MS; the thread's message is left alone. */
static void boot_tell_others(struct boot *b, int origin, reshard_status_t st, const char *text)
{
    unsigned char payload[8 + SOCK_FRAME_TEXT_MAX];
    struct sock_frame_hdr hdr = {.type = SOCK_FRAME_ERROR,
                                 .len = sock_frame_put_error(payload, origin, st, text)};
    int64_t deadline = rs_now_ms() + boot_min_int(b->timeout_ms, BOOT_ABORT_MAX_MS);
    struct rs_saved_error saved;
    int n = 0, failed;
    rs_error_save(&saved); /* best-effort sends must not replace the error being reported */
    struct sock_xfer *x = rs_calloc((size_t)b->size, sizeof(*x), "bootstrap failure reports");
    if (!x) {
        rs_error_restore(&saved);
        return;
    }
    for (int r = 0; r < b->size; r++) {
        struct boot_conn *c = &b->conns[r];
        if (boot_told(b, r, origin)) {
            /* What the peer sent may lie unread after a failure: do not take it for a reply. */
            sock_xfer_init(&x[n], c->fd, c->name, 1, hdr, payload);
            x[n++].listen = 0;
        }
    }
    /* One peer failing to take it must not keep the others from hearing. */
    while (sock_xfer_run(x, n, deadline, BOOT_ABORT_MAX_MS, "abort", &failed, NULL) != RESHARD_OK &&
           failed >= 0 && rs_now_ms() < deadline)
        x[failed].finished = 1;
    for (int r = 0, i = 0; r < b->size; r++)
        if (boot_told(b, r, origin) && sock_xfer_torn(&x[i++]))
            b->conns[r].send_torn = 1;
    free(x);
    rs_error_restore(&saved);
}

/* An exchange failed on this rank: the bootstrap is unusable from now on, and the others are
 * told. A failure another rank reported (err->origin >= 0) is forwarded by rank 0 and kept
 * quiet by a peer, which heard it from rank 0. */
reshard_status_t boot_fail(struct boot *b, reshard_status_t st, const struct sock_frame_error *err)
{
    struct rs_saved_error msg;
    rs_error_save(&msg);
    if (st == RESHARD_ERR_REMOTE && err && err->origin >= 0) {
        if (b->rank == 0)
            boot_tell_others(b, err->origin, err->status, err->text);
    } else {
        boot_tell_others(b, b->label[b->rank], st, msg.msg);
    }
    b->failed = st;
    snprintf(b->fail_msg, sizeof(b->fail_msg), "%s", msg.msg);
    return rs_error(st, "%s", msg.msg);
}

/* ---- collectives ---- */

/* Checks the arguments (before the turn counts, so that a caller's mistake leaves the ranks in
 * step) and starts the turn's clock. `slots` buffers of `bytes` each must fit in memory. */
static reshard_status_t boot_coll_begin(struct boot *b, enum sock_frame_op op, const void *buf,
                                        size_t bytes, int slots, struct boot_coll *c)
{
    if (!b)
        return rs_error(RESHARD_ERR_INVALID_ARG, "bootstrap: %s on a NULL bootstrap",
                        sock_frame_op_name(op));
    if (b->failed)
        return rs_error(b->failed, "bootstrap: unusable after an earlier failure (%s)",
                        b->fail_msg);
    if (bytes && !buf)
        return rs_error(RESHARD_ERR_INVALID_ARG, "bootstrap: %s of %zu bytes from a NULL buffer",
                        sock_frame_op_name(op), bytes);
    if (bytes > SIZE_MAX / (size_t)slots)
        return rs_error(RESHARD_ERR_TOO_LARGE, "bootstrap: %s of %d x %zu bytes overflows",
                        sock_frame_op_name(op), slots, bytes);
    b->seq++;
    *c = (struct boot_coll){.b = b,
                            .hdr = {.type = SOCK_FRAME_DATA, .op = (uint16_t)op, .seq = b->seq},
                            .deadline = rs_now_ms() + b->timeout_ms,
                            .err = {.origin = -1}};
    snprintf(c->what, sizeof(c->what), "%s #%u on rank %d", sock_frame_op_name(op), b->seq,
             b->label[b->rank]);
    return RESHARD_OK;
}

/* Star through rank 0: it collects every slot, then sends the whole array to each peer. */
static reshard_status_t boot_gather_all(struct boot *b, void *buf, size_t bytes,
                                        enum sock_frame_op op)
{
    static unsigned char none;
    unsigned char *base = buf ? buf : &none;
    struct boot_coll c;
    reshard_status_t st;
    RS_CHECK(boot_coll_begin(b, op, buf, bytes, b ? b->size : 1, &c));
    size_t all = bytes * (size_t)b->size;
    if (b->rank == 0) {
        RS_CHECK_GOTO(boot_coll_transfer(&c, -1, -1, 0, bytes, base, bytes), st, err_tell_others);
        RS_CHECK_GOTO(boot_coll_transfer(&c, -1, -1, 1, all, base, 0), st, err_tell_others);
    } else {
        RS_CHECK_GOTO(boot_coll_transfer(&c, 0, -1, 1, bytes, base + (size_t)b->rank * bytes, 0),
                      st, err_tell_others);
        RS_CHECK_GOTO(boot_coll_transfer(&c, 0, -1, 0, all, base, 0), st, err_tell_others);
    }
    return RESHARD_OK;
err_tell_others:
    return boot_fail(b, st, &c.err);
}

reshard_status_t boot_allgather(struct boot *b, void *buf, size_t bytes)
{
    return boot_gather_all(b, buf, bytes, SOCK_OP_ALLGATHER);
}

reshard_status_t boot_allreduce(struct boot *b, void *buf, size_t bytes, boot_combine_fn combine,
                                void *arg)
{
    if (!bytes || !combine)
        return rs_error(RESHARD_ERR_INVALID_ARG, "bootstrap: allreduce of %zu bytes%s", bytes,
                        combine ? "" : " without a combine function");
    if (bytes > SIZE_MAX / (size_t)b->size)
        return rs_error(RESHARD_ERR_TOO_LARGE, "bootstrap: allreduce of %zu bytes", bytes);
    unsigned char *all = rs_calloc((size_t)b->size, bytes, "bootstrap allreduce");
    if (!all) {
        boot_abort(b, RESHARD_ERR_NO_MEMORY, "out of memory in an allreduce");
        return RESHARD_ERR_NO_MEMORY;
    }
    memcpy(all + (size_t)b->rank * bytes, buf, bytes);
    reshard_status_t st = boot_allgather(b, all, bytes);
    if (st == RESHARD_OK) {
        memcpy(buf, all, bytes);
        for (int r = 1; r < b->size; r++)
            combine(buf, all + (size_t)r * bytes, arg);
    }
    free(all);
    return st;
}

void boot_bytes(const struct boot *b, uint64_t *sent, uint64_t *received)
{
    *sent = b->sent;
    *received = b->received;
}

reshard_status_t boot_barrier(struct boot *b)
{
    return boot_gather_all(b, NULL, 0, SOCK_OP_BARRIER);
}

reshard_status_t boot_bcast(struct boot *b, void *buf, size_t bytes, int root)
{
    static unsigned char none;
    unsigned char *base = buf ? buf : &none;
    struct boot_coll c;
    reshard_status_t st;
    if (b && (root < 0 || root >= b->size))
        return rs_error(RESHARD_ERR_INVALID_ARG, "bootstrap: bcast root %d is not a rank of %d",
                        root, b->size);
    RS_CHECK(boot_coll_begin(b, SOCK_OP_BCAST, buf, bytes, 1, &c));
    if (b->rank == 0) {
        /* A root other than 0 hands its buffer to rank 0, which passes it on. */
        if (root != 0)
            RS_CHECK_GOTO(boot_coll_transfer(&c, root, -1, 0, bytes, base, 0), st, err_tell_others);
        RS_CHECK_GOTO(boot_coll_transfer(&c, -1, root, 1, bytes, base, 0), st, err_tell_others);
    } else {
        RS_CHECK_GOTO(boot_coll_transfer(&c, 0, -1, b->rank == root, bytes, base, 0), st,
                      err_tell_others);
    }
    return RESHARD_OK;
err_tell_others:
    return boot_fail(b, st, &c.err);
}

/* ---- failures seen between collectives ---- */

void boot_abort(struct boot *b, reshard_status_t st, const char *msg)
{
    if (!b || b->failed)
        return;
    if (!msg)
        msg = rs_status_string(st);
    boot_tell_others(b, b->label[b->rank], st, msg);
    b->failed = st != RESHARD_OK ? st : RESHARD_ERR_INTERNAL;
    snprintf(b->fail_msg, sizeof(b->fail_msg), "aborted here: %s", msg);
}

/* What boot_check heard (the thread's message) ends this bootstrap. */
static reshard_status_t boot_check_failed(struct boot *b, reshard_status_t st,
                                          const struct rs_saved_error *why)
{
    b->failed = st;
    snprintf(b->fail_msg, sizeof(b->fail_msg), "%s", sock_msg_body(why->msg));
    return rs_error(st, "%s", why->msg);
}

reshard_status_t boot_check(struct boot *b)
{
    if (!b)
        return RESHARD_OK;
    if (b->failed)
        return rs_error(b->failed, "bootstrap: %s", b->fail_msg);
    for (int r = 0; r < b->size; r++) {
        struct boot_conn *c = &b->conns[r];
        unsigned char w[SOCK_FRAME_HDR_BYTES];
        struct sock_frame_hdr h;
        struct rs_saved_error why;
        int n = sock_peek(c->fd, w, sizeof(w));
        if (n == 0) { /* a rank leaves only through a barrier, or after a failure: it died */
            reshard_status_t st = rs_error(
                RESHARD_ERR_NETWORK, "bootstrap: %s closed the connection (did it die?)", c->name);
            rs_error_save(&why);
            if (b->rank == 0)
                boot_tell_others(b, b->label[r], st, why.msg);
            return boot_check_failed(b, st, &why);
        }
        if (n != (int)sizeof(w) || sock_frame_get_hdr(w, &h) != 0 || h.type != SOCK_FRAME_ERROR)
            continue;
        struct sock_xfer x;
        struct sock_frame_error err = {.origin = -1};
        int failed;
        sock_xfer_init(&x, c->fd, c->name, 0, (struct sock_frame_hdr){0}, NULL);
        reshard_status_t st = sock_xfer_run(&x, 1, rs_now_ms() + BOOT_ABORT_MAX_MS,
                                            BOOT_ABORT_MAX_MS, "failure report", &failed, &err);
        if (st == RESHARD_OK) /* (cannot be: an ERROR frame ends as a failure) */
            continue;
        rs_error_save(&why);
        if (b->rank == 0 && err.origin >= 0)
            boot_tell_others(b, err.origin, err.status, err.text);
        return boot_check_failed(b, st, &why);
    }
    return RESHARD_OK;
}
