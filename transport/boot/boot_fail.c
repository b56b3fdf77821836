/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Failures spread through the bootstrap's tree, so that every rank fails fast instead of
 * timing out: a rank that fails tells its neighbours (parent and children), and a rank that
 * hears of a failure passes it on to its other neighbours. Between collectives, boot_check
 * looks at this rank's few connections only: a neighbour's close (it died) or a failure report
 * waiting there.
 */
#include "boot_int.h"

#include "base/clock.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether neighbour i hears of a failure from this rank. */
static int boot_told(const struct boot *b, int i, int skip)
{
    return i != skip && b->nb[i].fd >= 0 && !b->nb[i].send_torn;
}

/* Tells every neighbour but `skip` (an nb index, or -1) that `origin` (by its label) failed.
 * Best effort, within BOOT_ABORT_MAX_MS; the thread's message is left alone. */
static void boot_tell(struct boot *b, int skip, int origin, reshard_status_t st, const char *text)
{
    unsigned char payload[8 + SOCK_FRAME_TEXT_MAX];
    struct sock_frame_hdr hdr = {.type = SOCK_FRAME_ERROR,
                                 .len = sock_frame_put_error(payload, origin, st, text)};
    int64_t deadline =
        rs_now_ms() + (b->timeout_ms < BOOT_ABORT_MAX_MS ? b->timeout_ms : BOOT_ABORT_MAX_MS);
    int n = 0, failed;
    struct rs_saved_error saved;
    if (!b->nb)
        return;
    rs_error_save(&saved); /* best-effort sends must not replace the error being reported */
    struct sock_xfer *x = rs_calloc((size_t)b->nchildren + 1, sizeof(*x), "failure reports");
    if (!x) {
        rs_error_restore(&saved);
        return;
    }
    for (int i = 0; i <= b->nchildren; i++) {
        if (!boot_told(b, i, skip))
            continue;
        /* What the neighbour sent may lie unread after a failure: do not take it for a reply. */
        sock_xfer_init(&x[n], b->nb[i].fd, b->nb[i].name, 1, hdr, payload);
        x[n++].listen = 0;
    }
    /* One neighbour failing to take it must not keep the others from hearing. */
    while (sock_xfer_run(x, n, deadline, BOOT_ABORT_MAX_MS, "abort", &failed, NULL) != RESHARD_OK &&
           failed >= 0 && rs_now_ms() < deadline)
        x[failed].finished = 1;
    for (int i = 0, k = 0; i <= b->nchildren; i++) {
        if (!boot_told(b, i, skip))
            continue;
        b->sent += x[k].hdr_done + x[k].done;
        if (sock_xfer_torn(&x[k++]))
            b->nb[i].send_torn = 1;
    }
    free(x);
    rs_error_restore(&saved);
}

void boot_heard(struct boot *b, const struct sock_frame_error *err)
{
    if (err && err->origin >= 0 && err->status == RESHARD_ERR_LEFT && b->left < 0)
        b->left = err->origin;
}

reshard_status_t boot_fail(struct boot *b, reshard_status_t st, const struct sock_frame_error *err,
                           int from)
{
    struct rs_saved_error msg;
    rs_error_save(&msg);
    if (st == RESHARD_ERR_REMOTE)
        boot_heard(b, err);
    if (st == RESHARD_ERR_REMOTE && err && err->origin >= 0)
        boot_tell(b, from, err->origin, err->status, err->text);
    else
        boot_tell(b, -1, b->label[b->rank], st, msg.msg);
    b->failed = st;
    snprintf(b->fail_msg, sizeof(b->fail_msg), "%s", msg.msg);
    return rs_error(st, "%s", msg.msg);
}

void boot_abort(struct boot *b, reshard_status_t st, const char *msg)
{
    if (!b || b->failed)
        return;
    if (!msg)
        msg = rs_status_string(st);
    boot_tell(b, -1, b->label[b->rank], st, msg);
    b->failed = st != RESHARD_OK ? st : RESHARD_ERR_INTERNAL;
    snprintf(b->fail_msg, sizeof(b->fail_msg), "aborted here: %s", msg);
}

void boot_leave(struct boot *b)
{
    char msg[RS_ERROR_MAX];
    if (!b || b->failed)
        return;
    snprintf(msg, sizeof(msg), "rank %d left the communicator (reshard_comm_leave)",
             b->label[b->rank]);
    boot_tell(b, -1, b->label[b->rank], RESHARD_ERR_LEFT, msg);
    b->failed = RESHARD_ERR_LEFT;
    snprintf(b->fail_msg, sizeof(b->fail_msg), "%s", msg);
}

int boot_left(const struct boot *b)
{
    return b ? b->left : -1;
}

/* What boot_check heard (the thread's message) ends this bootstrap. */
static reshard_status_t boot_check_failed(struct boot *b, reshard_status_t st,
                                          const struct rs_saved_error *why)
{
    b->failed = st;
    snprintf(b->fail_msg, sizeof(b->fail_msg), "%s", sock_msg_body(why->msg));
    return rs_error(st, "%s", why->msg);
}

/* Neighbour i: closed (it died), a failure report (read and passed on), or nothing to say. */
static reshard_status_t boot_check_one(struct boot *b, int i)
{
    struct boot_conn *c = &b->nb[i];
    unsigned char w[SOCK_FRAME_HDR_BYTES];
    struct sock_frame_hdr h;
    struct rs_saved_error why;
    int n = sock_peek(c->fd, w, sizeof(w));
    if (n == 0) { /* a rank leaves only through a barrier, or after a failure: it died */
        reshard_status_t st = rs_error(
            RESHARD_ERR_NETWORK, "bootstrap: %s closed the connection (did it die?)", c->name);
        rs_error_save(&why);
        boot_tell(b, i, b->label[c->rank], st, why.msg);
        return boot_check_failed(b, st, &why);
    }
    if (n != (int)sizeof(w) || sock_frame_get_hdr(w, &h) != 0 || h.type != SOCK_FRAME_ERROR)
        return RESHARD_OK;
    struct sock_xfer x;
    struct sock_frame_error err = {.origin = -1};
    int failed;
    sock_xfer_init(&x, c->fd, c->name, 0, (struct sock_frame_hdr){0}, NULL);
    reshard_status_t st = sock_xfer_run(&x, 1, rs_now_ms() + BOOT_ABORT_MAX_MS, BOOT_ABORT_MAX_MS,
                                        "failure report", &failed, &err);
    b->received += x.hdr_done + x.done;
    if (st == RESHARD_OK) /* (cannot be: an ERROR frame ends as a failure) */
        return RESHARD_OK;
    rs_error_save(&why);
    boot_heard(b, &err);
    if (err.origin >= 0)
        boot_tell(b, i, err.origin, err.status, err.text);
    return boot_check_failed(b, st, &why);
}

reshard_status_t boot_check(struct boot *b)
{
    if (!b)
        return RESHARD_OK;
    if (b->failed)
        return rs_error(b->failed, "bootstrap: %s", b->fail_msg);
    for (int i = 0; b->nb && i <= b->nchildren; i++)
        if (b->nb[i].fd >= 0)
            RS_CHECK(boot_check_one(b, i));
    return RESHARD_OK;
}
