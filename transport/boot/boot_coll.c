/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The bootstrap object (struct boot) once its ranks have met, and its collectives over the
 * tree: each gathers or reduces up the tree to rank 0 and sends the result down it, so that a
 * rank talks only to its parent and its few children, and no rank relays every other's bytes to
 * every other (rank 0 sends fan-out times the result, not size times). A turn's steps wait on
 * the children longer the higher a rank stands, and on the parent longer the deeper it stands
 * (boot_tree.c), so that the rank next to a stalled one gives up first and names it.
 */
#include "boot_int.h"

#include "base/clock.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the object ---- */

struct boot *boot_alloc(int rank, int size, const int *label, int timeout_ms)
{
    struct boot *b = rs_calloc(1, sizeof(*b), "bootstrap");
    if (!b)
        return NULL;
    b->label = rs_calloc((size_t)size, sizeof(*b->label), "bootstrap labels");
    if (!b->label) {
        free(b);
        return NULL;
    }
    for (int r = 0; r < size; r++)
        b->label[r] = label ? label[r] : r;
    b->rank = rank;
    b->size = size;
    b->timeout_ms = timeout_ms;
    b->lfd = -1;
    b->left = -1;
    return b;
}

reshard_status_t boot_alloc_tree(struct boot *b)
{
    b->nb = rs_calloc((size_t)b->nchildren + 1, sizeof(*b->nb), "bootstrap connections");
    b->sub = b->nb ? rs_calloc((size_t)b->nsub, sizeof(*b->sub), "bootstrap subtree") : NULL;
    if (!b->sub) {
        free(b->nb);
        b->nb = NULL;
        return RESHARD_ERR_NO_MEMORY;
    }
    for (int i = 0; i <= b->nchildren; i++)
        b->nb[i] = (struct boot_conn){.fd = -1, .rank = -1};
    /* A child's subtree follows this rank's own place, children in slot order. */
    for (int i = 0, off = 1; i < b->nchildren; i++) {
        b->nb[1 + i].sub_off = off;
        b->nb[1 + i].sub_len = boot_tree_subtree(b->first_child + i, b->size, b->fanout);
        off += b->nb[1 + i].sub_len;
    }
    b->sub[0] = b->rank;
    return RESHARD_OK;
}

void boot_set_labels(struct boot *b, const int *label)
{
    for (int r = 0; r < b->size; r++)
        b->label[r] = label[r];
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

void boot_bytes(const struct boot *b, uint64_t *sent, uint64_t *received)
{
    *sent = b->sent;
    *received = b->received;
}

void boot_stats(const struct boot *b, struct boot_stats *out)
{
    *out = (struct boot_stats){.children = b->nchildren,
                               .depth = b->depth,
                               .tree_height = b->tree_height,
                               .form_sent = b->form_sent,
                               .form_received = b->form_received};
    out->sockets = b->lfd >= 0;
    for (int i = 0; b->nb && i <= b->nchildren; i++)
        out->sockets += b->nb[i].fd >= 0;
}

const char *boot_listener_addr(const struct boot *b, int rank, char *buf, size_t n)
{
    union sock_addr a;
    if (!b || !b->addrs || rank < 0 || rank >= b->size ||
        boot_addr_get(b->addrs + (size_t)rank * BOOT_ADDR_BYTES, &a) != 0) {
        snprintf(buf, n, "%s", "");
        return buf;
    }
    return sock_addr_str(&a, buf, n);
}

void boot_close(struct boot *b)
{
    if (!b)
        return;
    for (int i = 0; b->nb && i <= b->nchildren; i++)
        sock_close(&b->nb[i].fd);
    sock_close(&b->lfd);
    free(b->nb);
    free(b->sub);
    free(b->addrs);
    free(b->label);
    free(b);
}

/* ---- moving frames ---- */

reshard_status_t boot_coll_legs(struct boot_coll *c, const struct boot_leg *legs, int n, int send,
                                int64_t deadline)
{
    struct boot *b = c->b;
    int failed = -1;
    if (n == 0)
        return RESHARD_OK;
    struct sock_xfer *x = rs_calloc((size_t)n, sizeof(*x), "bootstrap transfers");
    if (!x)
        return RESHARD_ERR_NO_MEMORY;
    for (int i = 0; i < n; i++) {
        struct sock_frame_hdr hdr = c->hdr;
        struct boot_conn *nb = &b->nb[legs[i].nb];
        hdr.len = legs[i].len;
        sock_xfer_init(&x[i], nb->fd, nb->name, send, hdr, legs[i].data);
    }
    reshard_status_t st =
        sock_xfer_run_cancel(x, n, deadline, b->timeout_ms, c->what, b->cancel, &failed, &c->err);
    for (int i = 0; i < n; i++) {
        *(send ? &b->sent : &b->received) += x[i].hdr_done + x[i].done;
        if (send && sock_xfer_torn(&x[i]))
            b->nb[legs[i].nb].send_torn = 1;
    }
    if (st != RESHARD_OK && failed >= 0)
        c->from = legs[failed].nb;
    free(x);
    return st;
}

/* One frame with the parent. */
static reshard_status_t boot_coll_parent(struct boot_coll *c, int send, uint64_t len, void *data)
{
    struct boot_leg leg = {0, len, data};
    return boot_coll_legs(c, &leg, 1, send, boot_deadline_parent(c->b, c->deadline));
}

/* One frame with each child but `skip` (an nb index, or -1), each child's at data[i]
 * (children) or all the same (send_all). */
static reshard_status_t boot_coll_children(struct boot_coll *c, int send, uint64_t len,
                                           unsigned char *const *data, unsigned char *all, int skip)
{
    struct boot *b = c->b;
    struct boot_leg legs[BOOT_FANOUT_MAX];
    int n = 0;
    for (int i = 0; i < b->nchildren; i++)
        if (1 + i != skip)
            legs[n++] = (struct boot_leg){1 + i, data ? (uint64_t)b->nb[1 + i].sub_len * len : len,
                                          data ? data[i] : all};
    /* Receiving from the children is the step nearest a stall; sending to them waits as long
     * as they wait for this rank. */
    int64_t until = send ? boot_deadline_parent(b, c->deadline) + BOOT_LEVEL_MS
                         : boot_deadline_children(b, c->deadline);
    return boot_coll_legs(c, legs, n, send, until);
}

/* ---- collectives ---- */

reshard_status_t boot_coll_begin(struct boot *b, enum sock_frame_op op, const void *buf,
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
    if (bytes > SIZE_MAX / 2 / (size_t)slots)
        return rs_error(RESHARD_ERR_TOO_LARGE, "bootstrap: %s of %d x %zu bytes overflows",
                        sock_frame_op_name(op), slots, bytes);
    b->seq++;
    *c = (struct boot_coll){.b = b,
                            .hdr = {.type = SOCK_FRAME_DATA, .op = (uint16_t)op, .seq = b->seq},
                            .deadline = rs_now_ms() + b->timeout_ms,
                            .err = {.origin = -1},
                            .from = -1};
    snprintf(c->what, sizeof(c->what), "%s #%u on rank %d", sock_frame_op_name(op), b->seq,
             b->label[b->rank]);
    return RESHARD_OK;
}

/* Up the tree: this rank's subtree's slots, in its sub[] order, into up (nsub * bytes), its own
 * first. */
static reshard_status_t boot_gather_up(struct boot_coll *c, const unsigned char *mine,
                                       unsigned char *up, size_t bytes)
{
    struct boot *b = c->b;
    unsigned char *into[BOOT_FANOUT_MAX];
    memcpy(up, mine, bytes);
    for (int i = 0; i < b->nchildren; i++)
        into[i] = up + (size_t)b->nb[1 + i].sub_off * bytes;
    RS_CHECK(boot_coll_children(c, 0, bytes, into, NULL, -1));
    if (b->slot != 0)
        RS_CHECK(boot_coll_parent(c, 1, (uint64_t)b->nsub * bytes, up));
    return RESHARD_OK;
}

/* Rank 0 has every slot (all of them in sub[] order in up): into buf by rank. Every rank's
 * appears once in sub[], which the tree's forming checked. */
static void boot_scatter_all(const struct boot *b, const unsigned char *up, unsigned char *buf,
                             size_t bytes)
{
    for (int i = 0; i < b->nsub; i++)
        memcpy(buf + (size_t)b->sub[i] * bytes, up + (size_t)i * bytes, bytes);
}

/* Down the tree: buf (len bytes) from the parent, then to every child but skip. */
static reshard_status_t boot_down(struct boot_coll *c, unsigned char *buf, uint64_t len, int skip,
                                  int from_parent)
{
    if (from_parent)
        RS_CHECK(boot_coll_parent(c, 0, len, buf));
    return boot_coll_children(c, 1, len, NULL, buf, skip);
}

static reshard_status_t boot_gather_all(struct boot *b, void *buf, size_t bytes,
                                        enum sock_frame_op op)
{
    static unsigned char none;
    unsigned char *base = buf ? buf : &none, *up = NULL;
    struct boot_coll c;
    reshard_status_t st;
    RS_CHECK(boot_coll_begin(b, op, buf, bytes, b ? b->size : 1, &c));
    if (bytes && !(up = rs_calloc((size_t)b->nsub, bytes, "bootstrap allgather"))) {
        st = RESHARD_ERR_NO_MEMORY;
        goto err_tell_others;
    }
    RS_CHECK_GOTO(boot_gather_up(&c, base + (size_t)b->rank * bytes, up ? up : &none, bytes), st,
                  err_free_up);
    if (b->slot == 0 && bytes)
        boot_scatter_all(b, up, base, bytes);
    RS_CHECK_GOTO(boot_down(&c, base, (uint64_t)b->size * bytes, -1, b->slot != 0), st,
                  err_free_up);
    free(up);
    return RESHARD_OK;
err_free_up:
    free(up);
err_tell_others:
    return boot_fail(b, st, &c.err, c.from);
}

reshard_status_t boot_allgather(struct boot *b, void *buf, size_t bytes)
{
    return boot_gather_all(b, buf, bytes, SOCK_OP_ALLGATHER);
}

reshard_status_t boot_barrier(struct boot *b)
{
    return boot_gather_all(b, NULL, 0, SOCK_OP_BARRIER);
}

reshard_status_t boot_allreduce(struct boot *b, void *buf, size_t bytes, boot_combine_fn combine,
                                void *arg)
{
    struct boot_coll c;
    reshard_status_t st;
    if (b && (!bytes || !combine))
        return rs_error(RESHARD_ERR_INVALID_ARG, "bootstrap: allreduce of %zu bytes%s", bytes,
                        combine ? "" : " without a combine function");
    RS_CHECK(boot_coll_begin(b, SOCK_OP_ALLREDUCE, buf, bytes, BOOT_FANOUT_MAX + 1, &c));
    unsigned char *in = rs_calloc((size_t)b->nchildren + 1, bytes, "bootstrap allreduce");
    unsigned char *into[BOOT_FANOUT_MAX];
    if (!in) {
        st = RESHARD_ERR_NO_MEMORY;
        goto err_tell_others;
    }
    /* Each child sends its subtree's value: one slot of `bytes`, whatever its size. */
    struct boot_leg legs[BOOT_FANOUT_MAX];
    for (int i = 0; i < b->nchildren; i++) {
        into[i] = in + (size_t)(i + 1) * bytes;
        legs[i] = (struct boot_leg){1 + i, bytes, into[i]};
    }
    RS_CHECK_GOTO(boot_coll_legs(&c, legs, b->nchildren, 0, boot_deadline_children(b, c.deadline)),
                  st, err_free_in);
    /* in[0] is this subtree's value so far; buf is written only once the result is in. */
    memcpy(in, buf, bytes);
    for (int i = 0; i < b->nchildren; i++)
        combine(in, into[i], arg);
    if (b->slot != 0)
        RS_CHECK_GOTO(boot_coll_parent(&c, 1, bytes, in), st, err_free_in);
    RS_CHECK_GOTO(boot_down(&c, in, bytes, -1, b->slot != 0), st, err_free_in);
    memcpy(buf, in, bytes);
    free(in);
    return RESHARD_OK;
err_free_in:
    free(in);
err_tell_others:
    return boot_fail(b, st, &c.err, c.from);
}

/* The child (nb index) whose subtree holds rank r, 0 when r is this rank, -1 when neither. */
static int boot_child_toward(const struct boot *b, int r)
{
    for (int i = 0; i < b->nsub; i++) {
        if (b->sub[i] != r)
            continue;
        for (int k = 0; k < b->nchildren; k++)
            if (i >= b->nb[1 + k].sub_off && i < b->nb[1 + k].sub_off + b->nb[1 + k].sub_len)
                return 1 + k;
        return 0;
    }
    return -1;
}

/* The root's buffer climbs to rank 0 (each rank on the way takes it from the child toward the
 * root and hands it to its parent), then spreads down to everyone else. */
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
    int toward = boot_child_toward(b, root);
    if (toward > 0) {
        struct boot_leg leg = {toward, bytes, base};
        RS_CHECK_GOTO(boot_coll_legs(&c, &leg, 1, 0, boot_deadline_children(b, c.deadline)), st,
                      err_tell_others);
    }
    if (toward >= 0 && b->slot != 0)
        RS_CHECK_GOTO(boot_coll_parent(&c, 1, bytes, base), st, err_tell_others);
    RS_CHECK_GOTO(boot_down(&c, base, bytes, toward > 0 ? toward : -1, toward < 0), st,
                  err_tell_others);
    return RESHARD_OK;
err_tell_others:
    return boot_fail(b, st, &c.err, c.from);
}
