/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The rendezvous that makes a bootstrap (boot_init): rank 0 admits the ranks that prove they
 * hold the job's secret and gives each, in order of arrival, its slot in the tree and its
 * parent; a rank whose parent is not rank 0 then attaches to that parent's listener (proving
 * itself there too) and closes its connection to rank 0, so that rank 0 never holds more than
 * its children and a bounded table of newcomers. Each rank admits its own children, and once
 * they all report their subtrees whole (READY, with the ranks in them), reports its own to its
 * parent; rank 0, with every subtree whole, sends WELCOME (every rank's listener) down the
 * tree. A failure anywhere is told along the tree.
 *
 * A growth (boot_init_grow with members) forms otherwise, so that rank 0's part is O(fan-out +
 * joiners), not O(size): every rank's slot is its rank. The members keep their listeners (each
 * listens on a dup of the one of the bootstrap they grow from, whose table of listeners they
 * hold already) and attach at their tree parents under the growth's secret without meeting rank
 * 0; only the joiners join at rank 0, which tells each its parent's listener (a joiner whose
 * parent is a joiner not yet in is dropped and tries again). A member child reports first that
 * the members of its subtree are in (a 4-byte READY, seq 1), then its whole subtree, so that
 * rank 0 acts on a joiner's decline only once every member can hear it. WELCOME carries only
 * the joiners' listeners to a member; a joiner gets the whole table.
 */
#include "boot_int.h"

#include "base/clock.h"
#include "base/log.h"
#include "base/param.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BOOT_MISSING_LISTED 32 /* ranks named in a timeout message, the rest counted */
/* How long a failed rank of a growth waits for the OPENs of the children it turns away. */
#define BOOT_TURN_AWAY_MS 200

/* One rank's state while the tree forms. */
struct boot_form {
    struct boot *b;
    struct boot_gate gate;
    int gate_open;
    int64_t deadline; /* this rank gives up then */
    /* a member of a growth gives up on its subtree's members then (before rank 0 does, which
     * waits longer than any member for the members, and shorter for the joiners) */
    int64_t mdeadline;
    /* rank 0 */
    int next_slot;
    int *slot_rank;         /* [size]: who took each slot */
    unsigned char *arrived; /* [size] */
    /* every rank */
    struct sock_xfer *rx; /* [1 + nchildren]: the WELCOME from the parent, each child's READY */
    unsigned char *ready; /* [nsub * 4]: the READY payloads, at each child's sub_off */
    unsigned char *seen;  /* [size]: ranks met in this subtree, to refuse a rank twice */
    int attached, readied, sent_ready, welcomed;
    /* a growth (slot = rank): the member children, how many reported their subtree's members
     * in, and whether this rank (a member) did; each member child's report, and whether in */
    int grown, mkids, mreadied, sent_mready;
    unsigned char *mrep;  /* [(1 + nchildren) * 4] */
    unsigned char *mdone; /* [1 + nchildren] */
    struct pollfd *pf;
    int *pf_nb; /* [poll entry]: the nb index it watches, or -1 (the door) */
    /* rank 0: a rank that proved it holds the secret declined (boot_decline): the number it
     * claimed and why (0: none did). */
    int declined, decline_rank;
};

/* Rank 0's words for a decline: the reason is a code, never text from the decliner. */
static const char *boot_decline_why(int code)
{
    static const char *const why[] = {
        [BOOT_DECLINE_LIST] = "its list of joiners differs from the one the members grow by",
        [BOOT_DECLINE_NOT_LISTED] = "the number it claims is not among the joiners the members "
                                    "admit",
        [BOOT_DECLINE_COUNT] = "it was passed another number of joiners than the members admit",
    };
    return code > 0 && code < (int)(sizeof(why) / sizeof(why[0])) && why[code]
               ? why[code]
               : "for a reason this version does not know";
}

/* ---- admission ---- */

static void boot_form_name(struct boot *b, int i, int rank, const char *addr)
{
    b->nb[i].rank = rank;
    snprintf(b->nb[i].name, sizeof(b->nb[i].name), "rank %d (%s)", b->label[rank], addr);
}

/* Child i's READY (its whole subtree) is awaited. */
static void boot_form_await_ready(struct boot_form *f, int i)
{
    struct boot_conn *c = &f->b->nb[i];
    sock_xfer_init(
        &f->rx[i], c->fd, c->name, 0,
        (struct sock_frame_hdr){.type = SOCK_FRAME_READY, .len = (uint64_t)c->sub_len * 4},
        f->ready + (size_t)c->sub_off * 4);
}

/* A child is connected: its READY is awaited (a member child's report of its members first). */
static void boot_form_child(struct boot_form *f, int i, int fd, int rank, const char *addr)
{
    struct boot *b = f->b;
    struct boot_conn *c = &b->nb[i];
    c->fd = fd;
    boot_form_name(b, i, rank, addr);
    if (f->grown && rank < b->members) /* a member: its subtree's members first */
        sock_xfer_init(&f->rx[i], fd, c->name, 0,
                       (struct sock_frame_hdr){.type = SOCK_FRAME_READY, .seq = 1, .len = 4},
                       f->mrep + (size_t)i * 4);
    else
        boot_form_await_ready(f, i);
    f->attached++;
}

/* Rank 0: a joiner that proved itself takes the next slot. */
static int boot_form_join(void *arg, int fd, const char *addr, const struct boot_hello *h,
                          const unsigned char *nonce_l, char *why, size_t n)
{
    struct boot_form *f = arg;
    struct boot *b = f->b;
    union sock_addr la;
    if (h->kind == BOOT_DECLINE) { /* its MAC is checked: it holds the secret */
        if (!f->declined) {
            f->declined = h->slot > 0 ? h->slot : -1;
            f->decline_rank = h->rank;
            snprintf(b->refusal, sizeof(b->refusal),
                     "bootstrap: a joiner at %s claiming rank %d declined: %s", addr, h->rank,
                     boot_decline_why(h->slot));
        }
        /* An admission (MACed) tells it rank 0 heard; it takes no slot. */
        struct boot_admit a = {.slot = 0, .fanout = b->fanout, .parent = 0};
        struct rs_saved_error saved;
        rs_error_save(&saved);
        (void)boot_admit_send(b, fd, addr, h, nonce_l, &a);
        rs_error_restore(&saved);
        sock_close(&fd);
        return 1;
    }
    if (h->kind != BOOT_JOIN) {
        snprintf(why, n, "rank 0 admits joins, not attaches to a tree parent");
        return 0;
    }
    if (h->size != b->size) {
        snprintf(why, n, "the job has %d ranks, not %d", b->size, h->size);
        return 0;
    }
    if (h->rank < 1 || h->rank >= b->size) {
        snprintf(why, n, "rank %d is out of range 1..%d", h->rank, b->size - 1);
        return 0;
    }
    if (f->grown && h->rank < b->members) {
        snprintf(why, n,
                 "rank %d is a member of the communicator that grows: members attach to their "
                 "tree parents, only joiners join at rank 0",
                 b->label[h->rank]);
        return 0;
    }
    if (f->arrived[h->rank]) {
        char there[SOCK_ADDR_STR];
        snprintf(why, n, "duplicate rank: rank %d (%s) has already arrived", b->label[h->rank],
                 boot_listener_addr(b, h->rank, there, sizeof(there)));
        return 0;
    }
    if (boot_addr_get(h->addr, &la) != 0) {
        snprintf(why, n, "its listener's address (family %u) is not one", h->addr[0]);
        return 0;
    }
    int slot = f->next_slot, parent = f->slot_rank[(slot - 1) / b->fanout];
    if (f->grown) { /* its slot is its rank; its parent may be a joiner */
        slot = h->rank;
        parent = (slot - 1) / b->fanout;
        if (!f->arrived[parent])
            return -1; /* a joiner not in yet: this one tries again */
    }
    struct boot_admit a = {.slot = slot, .fanout = b->fanout, .parent = parent};
    memcpy(a.parent_addr, b->addrs + (size_t)parent * BOOT_ADDR_BYTES, BOOT_ADDR_BYTES);
    if (boot_admit_send(b, fd, addr, h, nonce_l, &a) != RESHARD_OK)
        return -1; /* it will try again */
    f->next_slot++;
    f->slot_rank[slot] = h->rank;
    f->arrived[h->rank] = 1;
    memcpy(b->addrs + (size_t)h->rank * BOOT_ADDR_BYTES, h->addr, BOOT_ADDR_BYTES);
    if (parent == 0)
        boot_form_child(f, 1 + slot - b->first_child, fd, h->rank, addr);
    else
        sock_close(&fd); /* it attaches to its parent */
    return 1;
}

/* A rank other than 0 (or rank 0 of a growth): one of its children attaches. */
static int boot_form_attach(void *arg, int fd, const char *addr, const struct boot_hello *h,
                            const unsigned char *nonce_l, char *why, size_t n)
{
    struct boot_form *f = arg;
    struct boot *b = f->b;
    /* The slot is the peer's word: in 64 bits, so that no claim overflows the index. */
    int64_t i = 1 + (int64_t)h->slot - b->first_child;
    if (b->rank == 0 && h->kind != BOOT_ATTACH)
        return boot_form_join(arg, fd, addr, h, nonce_l, why, n);
    if (b->rank == 0 && (h->rank < 1 || h->rank >= b->members)) {
        snprintf(why, n, "rank %d is not a member: joiners join at rank 0, they do not attach",
                 h->rank);
        return 0;
    }
    if (h->kind != BOOT_ATTACH) {
        snprintf(why, n, "rank %d is a tree parent: it admits attaches, not joins",
                 b->label[b->rank]);
        return 0;
    }
    if (h->size != b->size) {
        snprintf(why, n, "the job has %d ranks, not %d", b->size, h->size);
        return 0;
    }
    if (h->rank < 1 || h->rank >= b->size || h->rank == b->rank) {
        snprintf(why, n, "rank %d cannot be a child of rank %d", h->rank, b->rank);
        return 0;
    }
    if (f->grown && h->slot != h->rank) {
        snprintf(why, n, "rank %d claims tree slot %d: in a growth a rank's slot is its rank",
                 h->rank, h->slot);
        return 0;
    }
    if (h->slot < b->first_child || i > b->nchildren || b->nb[i].fd >= 0) {
        snprintf(why, n, "tree slot %d is not a free child slot of rank %d", h->slot,
                 b->label[b->rank]);
        return 0;
    }
    struct boot_admit a = {.slot = h->slot, .fanout = b->fanout, .parent = b->rank};
    if (boot_admit_send(b, fd, addr, h, nonce_l, &a) != RESHARD_OK)
        return -1;
    boot_form_child(f, (int)i, fd, h->rank, addr);
    return 1;
}

/* ---- reports up and down the tree ---- */

/* Child i's subtree is in: its ranks into sub[], each met once in this subtree. */
static reshard_status_t boot_form_take_ready(struct boot_form *f, int i)
{
    struct boot *b = f->b;
    struct boot_conn *c = &b->nb[i];
    int at = boot_ready_decode(f->ready + (size_t)c->sub_off * 4, c->sub_len, c->rank, b->size,
                               f->seen, b->sub + c->sub_off);
    if (at >= 0)
        return rs_error(RESHARD_ERR_NETWORK,
                        "bootstrap: %s reported a malformed subtree (its entry %d of %d)", c->name,
                        at, c->sub_len);
    f->readied++;
    return RESHARD_OK;
}

static reshard_status_t boot_form_send(struct boot_form *f, int i, unsigned type, uint64_t len,
                                       void *data)
{
    struct boot *b = f->b;
    struct sock_xfer x;
    struct sock_frame_error err = {.origin = -1};
    int failed;
    sock_xfer_init(&x, b->nb[i].fd, b->nb[i].name, 1,
                   (struct sock_frame_hdr){.type = (uint16_t)type, .len = len}, data);
    reshard_status_t st =
        sock_xfer_run(&x, 1, f->deadline, b->timeout_ms, "rendezvous", &failed, &err);
    b->form_sent += x.hdr_done + x.done;
    return st == RESHARD_OK ? st : boot_fail(b, st, &err, i);
}

/* A member child's first report is in: the members of its subtree (so many of them) are. */
static reshard_status_t boot_form_take_members(struct boot_form *f, int i)
{
    struct boot *b = f->b;
    struct boot_conn *c = &b->nb[i];
    int64_t got = (int32_t)(uint32_t)sock_wire_get(f->mrep + (size_t)i * 4, 4);
    if (got != boot_tree_subtree(c->rank, b->members, b->fanout))
        return rs_error(RESHARD_ERR_NETWORK,
                        "bootstrap: %s reported %lld members in its subtree, not %d", c->name,
                        (long long)got, boot_tree_subtree(c->rank, b->members, b->fanout));
    f->mdone[i] = 1;
    f->mreadied++;
    boot_form_await_ready(f, i);
    return RESHARD_OK;
}

/* A member: the members of its subtree are in (it and its member children's). */
static reshard_status_t boot_form_send_members(struct boot_form *f)
{
    struct boot *b = f->b;
    f->sent_mready = 1;
    sock_wire_put(f->mrep, (uint32_t)boot_tree_subtree(b->rank, b->members, b->fanout), 4);
    struct sock_xfer x;
    struct sock_frame_error err = {.origin = -1};
    int failed;
    sock_xfer_init(&x, b->nb[0].fd, b->nb[0].name, 1,
                   (struct sock_frame_hdr){.type = SOCK_FRAME_READY, .seq = 1, .len = 4}, f->mrep);
    reshard_status_t st =
        sock_xfer_run(&x, 1, f->deadline, b->timeout_ms, "rendezvous", &failed, &err);
    b->form_sent += x.hdr_done + x.done;
    return st == RESHARD_OK ? st : boot_fail(b, st, &err, 0);
}

static reshard_status_t boot_form_send_ready(struct boot_form *f)
{
    struct boot *b = f->b;
    for (int k = 0; k < b->nsub; k++)
        sock_wire_put(f->ready + (size_t)k * 4, (uint32_t)b->sub[k], 4);
    f->sent_ready = 1;
    return boot_form_send(f, 0, SOCK_FRAME_READY, (uint64_t)b->nsub * 4, f->ready);
}

/* The tree is whole: every rank's listener, to every child (in a growth, to a member only the
 * joiners': it has the members' already). */
static reshard_status_t boot_form_welcome(struct boot_form *f)
{
    struct boot *b = f->b;
    for (int i = 1; i <= b->nchildren; i++) {
        int from = f->grown && b->nb[i].rank < b->members ? b->members : 0;
        RS_CHECK(boot_form_send(f, i, SOCK_FRAME_WELCOME,
                                (uint64_t)(b->size - from) * BOOT_ADDR_BYTES,
                                b->addrs + (size_t)from * BOOT_ADDR_BYTES));
    }
    return RESHARD_OK;
}

/* ---- waiting ---- */

/* "ranks 3, 5 of 6" (at most BOOT_MISSING_LISTED named, the rest counted) into list. */
static int boot_form_list(const struct boot *b, const unsigned char *have, int from, char *list,
                          size_t cap)
{
    size_t used = 0;
    int missing = 0;
    list[0] = '\0';
    for (int r = from; r < b->size; r++) {
        if (have[r] || missing++ >= BOOT_MISSING_LISTED)
            continue;
        int k = snprintf(list + used, cap - used, "%s%d", used ? ", " : "", b->label[r]);
        used += k > 0 && (size_t)k < cap - used ? (size_t)k : 0;
    }
    if (missing > BOOT_MISSING_LISTED)
        snprintf(list + used, cap - used, " and %d more", missing - BOOT_MISSING_LISTED);
    return missing;
}

/* A growth's: the tree children (slot = rank) below rank `below` that have not attached, or (a
 * member's children, reports) that have not reported their subtree's members in, by number. */
static int boot_form_unattached(const struct boot_form *f, int below, int reports, char *list,
                                size_t cap)
{
    const struct boot *b = f->b;
    size_t used = 0;
    int missing = 0;
    list[0] = '\0';
    for (int i = 1; i <= b->nchildren && b->first_child + i - 1 < below; i++) {
        if (reports ? f->mdone[i] : b->nb[i].fd >= 0)
            continue;
        int k = snprintf(list + used, cap - used, "%s%d", missing++ ? ", " : "",
                         b->label[b->first_child + i - 1]);
        used += k > 0 && (size_t)k < cap - used ? (size_t)k : 0;
    }
    return missing;
}

static reshard_status_t boot_form_timeout(struct boot_form *f)
{
    struct boot *b = f->b;
    char list[RS_ERROR_MAX], ms[32];
    int missing;
    sock_ms_str(b->timeout_ms, ms, sizeof(ms));
    if (b->slot != 0 && f->sent_ready)
        return rs_error(RESHARD_ERR_TIMEOUT,
                        "bootstrap: rendezvous on rank %d: its tree parent %s did not say the "
                        "tree was whole within %s",
                        b->label[b->rank], b->nb[0].name, ms);
    /* A member of a growth names its member children that did not come (rank 0 waits longer,
     * and names the joiners). */
    int below = b->rank < b->members && !f->sent_mready ? b->members : b->size;
    if (f->grown && b->slot != 0 &&
        (missing = boot_form_unattached(f, below, 0, list, sizeof(list))))
        return rs_error(RESHARD_ERR_TIMEOUT,
                        "bootstrap: rendezvous on rank %d: its tree %s %s did not attach within "
                        "%s%s%s",
                        b->label[b->rank], missing == 1 ? "child rank" : "children ranks", list, ms,
                        b->refusal[0] ? "; " : "", sock_msg_body(b->refusal));
    if (f->grown && b->slot != 0 && below == b->members &&
        (missing = boot_form_unattached(f, below, 1, list, sizeof(list))))
        return rs_error(RESHARD_ERR_TIMEOUT,
                        "bootstrap: rendezvous on rank %d: the members under its tree %s %s did "
                        "not all attach within %s",
                        b->label[b->rank], missing == 1 ? "child rank" : "children ranks", list,
                        ms);
    if (b->slot != 0)
        return rs_error(RESHARD_ERR_TIMEOUT,
                        "bootstrap: rendezvous on rank %d: %d of its %d tree children attached "
                        "and %d reported their subtrees whole within %s",
                        b->label[b->rank], f->attached, b->nchildren, f->readied, ms);
    missing = boot_form_list(b, f->arrived, 1, list, sizeof(list));
    if (missing)
        return rs_error(RESHARD_ERR_TIMEOUT, "bootstrap: %s %s of %d did not arrive within %s%s%s",
                        missing == 1 ? "rank" : "ranks", list, b->size, ms,
                        b->refusal[0] ? "; " : "", sock_msg_body(b->refusal));
    if (f->grown && (missing = boot_form_unattached(f, b->size, 0, list, sizeof(list))))
        return rs_error(RESHARD_ERR_TIMEOUT,
                        "bootstrap: rendezvous on rank %d: its tree %s %s did not attach within "
                        "%s%s%s",
                        b->label[b->rank], missing == 1 ? "child rank" : "children ranks", list, ms,
                        b->refusal[0] ? "; " : "", sock_msg_body(b->refusal));
    size_t used = 0;
    list[0] = '\0';
    for (int i = 1; i <= b->nchildren; i++) {
        if (f->rx[i].finished)
            continue;
        int k = snprintf(list + used, sizeof(list) - used, "%s%s", used ? ", " : "", b->nb[i].name);
        used += k > 0 && (size_t)k < sizeof(list) - used ? (size_t)k : 0;
    }
    return rs_error(RESHARD_ERR_TIMEOUT,
                    "bootstrap: every rank arrived, but the subtrees under %s did not finish "
                    "joining the tree within %s",
                    list, ms);
}

static reshard_status_t boot_form_declined(const struct boot_form *f)
{
    return rs_error(RESHARD_ERR_INVALID_ARG,
                    "bootstrap: a joiner claiming rank %d (it holds the secret) declined: %s; the "
                    "rendezvous stops",
                    f->decline_rank, boot_decline_why(f->declined));
}

/* Rank 0 acts on a decline once the members (ranks below b->members) are all in the tree, so
 * that each hears it instead of waiting for a parent that gave up: once each member child
 * reported its subtree's members in. */
static int boot_form_members_in(const struct boot_form *f)
{
    return f->mreadied == f->mkids;
}

/* Until when this rank waits now. */
static int64_t boot_form_due(const struct boot_form *f)
{
    const struct boot *b = f->b;
    return f->grown && b->slot != 0 && b->rank < b->members && !f->sent_mready ? f->mdeadline
                                                                               : f->deadline;
}

static int boot_form_done(const struct boot_form *f)
{
    const struct boot *b = f->b;
    if (b->slot == 0)
        return f->next_slot == b->size && f->readied == b->nchildren;
    return f->welcomed;
}

/* Polls the door (while it is open) and the neighbours' frames in flight. */
static int boot_form_poll_set(struct boot_form *f)
{
    struct boot *b = f->b;
    int n = 0;
    if (f->gate_open) {
        n = boot_gate_poll(&f->gate, f->pf);
        for (int k = 0; k < n; k++)
            f->pf_nb[k] = -1;
    }
    for (int i = 0; i <= b->nchildren; i++) {
        if (b->nb[i].fd < 0 || f->rx[i].finished)
            continue;
        f->pf[n] = (struct pollfd){.fd = b->nb[i].fd, .events = POLLIN};
        f->pf_nb[n++] = i;
    }
    return n;
}

/* Frame i (0: the WELCOME, else child i's READY) moved on. */
static reshard_status_t boot_form_step(struct boot_form *f, int i)
{
    struct boot *b = f->b;
    struct sock_frame_error err = {.origin = -1};
    struct sock_xfer *x = &f->rx[i];
    size_t before = x->hdr_done + x->done;
    reshard_status_t st = sock_xfer_step(x, &err);
    b->form_received += x->hdr_done + x->done - before;
    if (st == RESHARD_OK && x->finished && i > 0 && f->grown && b->nb[i].rank < b->members &&
        !f->mdone[i])
        st = boot_form_take_members(f, i);
    else if (st == RESHARD_OK && x->finished && i > 0)
        st = boot_form_take_ready(f, i);
    if (st == RESHARD_OK && x->finished && i == 0) {
        if (!f->sent_ready)
            st = rs_error(RESHARD_ERR_NETWORK,
                          "bootstrap: %s said the tree was whole before this rank's subtree was",
                          b->nb[0].name);
        f->welcomed = 1;
    }
    return st == RESHARD_OK ? st : boot_fail(b, st, &err, i);
}

static reshard_status_t boot_form_run(struct boot_form *f)
{
    struct boot *b = f->b;
    for (;;) {
        /* A member's subtree's members are in: it says so first, then (a subtree that is
         * whole) the whole; a leaf's at once. */
        if (f->grown && b->slot != 0 && b->rank < b->members && !f->sent_mready &&
            f->mreadied == f->mkids)
            RS_CHECK(boot_form_send_members(f));
        if (b->slot != 0 && !f->sent_ready && f->readied == b->nchildren)
            RS_CHECK(boot_form_send_ready(f));
        if (boot_form_done(f))
            return RESHARD_OK;
        int n = boot_form_poll_set(f), ready, gate_n = f->gate_open ? 1 + f->gate.np : 0;
        int64_t due = boot_form_due(f), until = due;
        if (f->gate_open && boot_gate_expiry(&f->gate) < until)
            until = boot_gate_expiry(&f->gate);
        reshard_status_t st = sock_poll(f->pf, n, until, &ready);
        if (st != RESHARD_OK)
            return boot_fail(b, st, NULL, -1);
        if (ready == 0 && rs_now_ms() >= due)
            return boot_fail(b, boot_form_timeout(f), NULL, -1);
        if (f->gate_open && (st = boot_gate_serve(&f->gate, f->pf, gate_n)) != RESHARD_OK)
            return boot_fail(b, st, NULL, -1);
        if (f->declined && boot_form_members_in(f))
            return boot_fail(b, boot_form_declined(f), NULL, -1);
        for (int k = gate_n; k < n; k++)
            if (f->pf[k].revents)
                RS_CHECK(boot_form_step(f, f->pf_nb[k]));
        /* Rank 0 admits until every rank has a slot (and, in a growth, its member children
         * attached); the others until their children came. */
        if (f->gate_open && (b->slot != 0 || f->next_slot == b->size) &&
            f->attached == b->nchildren) {
            boot_gate_close(&f->gate, b->slot == 0 ? "every rank has arrived"
                                                   : "every child of this rank has attached");
            f->gate_open = 0;
        }
    }
}

/* ---- the whole of it ---- */

/* A rank of a growth that failed: the children that dialled it while it waited on its parent
 * (waiting at its listener, which stays open for the bootstrap it grew from) are taken in and
 * refused with why, so that they fail naming the cause instead of timing out on this rank. */
static void boot_form_turn_away(struct boot_form *f)
{
    struct boot *b = f->b;
    char why[SOCK_FRAME_TEXT_MAX];
    struct rs_saved_error saved;
    snprintf(why, sizeof(why), "the rendezvous failed on rank %d: %s", b->label[b->rank],
             sock_msg_body(rs_error_message()));
    rs_error_save(&saved);
    f->gate.turn_away = why;
    /* What waits is taken in at once; each is refused once its OPEN is in (it speaks first). */
    for (int64_t until = rs_now_ms() + BOOT_TURN_AWAY_MS;;) {
        int n = boot_gate_poll(&f->gate, f->pf);
        int64_t left = until - rs_now_ms();
        if (poll(f->pf, (nfds_t)n, left > 0 ? (int)left : 0) < 0 ||
            boot_gate_serve(&f->gate, f->pf, n) != RESHARD_OK || f->gate.np == 0 || left <= 0)
            break;
    }
    boot_gate_close(&f->gate, why);
    f->gate_open = 0;
    rs_error_restore(&saved);
}

static void boot_form_free(struct boot_form *f, reshard_status_t st)
{
    if (f->gate_open && f->grown && st != RESHARD_OK)
        boot_form_turn_away(f);
    if (f->gate_open)
        boot_gate_close(&f->gate,
                        st == RESHARD_OK ? "every rank has arrived" : "the rendezvous failed");
    free(f->rx);
    free(f->ready);
    free(f->seen);
    free(f->pf);
    free(f->pf_nb);
    free(f->slot_rank);
    free(f->arrived);
    free(f->mrep);
    free(f->mdone);
}

/* Room for the wait, once this rank's place in the tree is known, and its door opened. */
static reshard_status_t boot_form_alloc(struct boot_form *f, boot_gate_fn admit)
{
    struct boot *b = f->b;
    int polls = 2 + BOOT_PENDING_MAX + b->nchildren;
    RS_CHECK(boot_alloc_tree(b));
    f->rx = rs_calloc((size_t)b->nchildren + 1, sizeof(*f->rx), "bootstrap rendezvous");
    f->ready = f->rx ? rs_calloc((size_t)b->nsub, 4, "bootstrap rendezvous") : NULL;
    f->seen = f->ready ? rs_calloc((size_t)b->size, 1, "bootstrap rendezvous") : NULL;
    f->pf = f->seen ? rs_calloc((size_t)polls, sizeof(*f->pf), "bootstrap poll set") : NULL;
    f->pf_nb = f->pf ? rs_calloc((size_t)polls, sizeof(*f->pf_nb), "bootstrap poll set") : NULL;
    f->mrep = f->pf_nb ? rs_calloc((size_t)b->nchildren + 1, 4, "bootstrap rendezvous") : NULL;
    f->mdone = f->mrep ? rs_calloc((size_t)b->nchildren + 1, 1, "bootstrap rendezvous") : NULL;
    if (!b->addrs && f->pf_nb)
        b->addrs = rs_calloc((size_t)b->size, BOOT_ADDR_BYTES, "bootstrap listeners");
    if (!f->mdone || !b->addrs)
        return RESHARD_ERR_NO_MEMORY;
    f->seen[b->rank] = 1;
    if (f->grown && b->rank < b->members && b->nchildren > 0) {
        int end = b->first_child + b->nchildren;
        f->mkids = (end < b->members ? end : b->members) - b->first_child;
        f->mkids = f->mkids > 0 ? f->mkids : 0;
    }
    if (b->nchildren == 0 && (b->slot != 0 || b->size == 1))
        return RESHARD_OK;
    RS_CHECK(boot_gate_open(&f->gate, b, b->lfd, admit, f));
    f->gate_open = 1;
    return RESHARD_OK;
}

reshard_status_t boot_listen_any(const union sock_addr *a, int prompt, int *fd)
{
    union sock_addr any;
    memset(&any, 0, sizeof(any));
    any.sa.sa_family = a->sa.sa_family;
    if (a->sa.sa_family == AF_INET6)
        any.in6.sin6_addr = in6addr_any;
    else
        any.in.sin_addr.s_addr = htonl(INADDR_ANY);
    sock_addr_set_port(&any, sock_addr_port(a));
    reshard_status_t st = sock_listen(&any, fd);
    if (st != RESHARD_OK && errno == EADDRINUSE) {
        char why[RS_ERROR_MAX];
        snprintf(why, sizeof(why), "%s", rs_error_message());
        return rs_error(st,
                        "%s: port %d is taken on rank 0's host (another program, or another "
                        "job's rank 0)%s; set RESHARD_BOOT_PORT to a free port (docs/security.md)",
                        why, sock_addr_port(a),
                        prompt ? ": rank 0 listens on MASTER_PORT+1 unless RESHARD_BOOT_PORT "
                                 "says otherwise, and the other ranks stop within a second"
                               : "");
    }
    return st;
}

static int boot_form_fanout(void)
{
    int64_t k = rs_param_int(RS_PARAM_BOOT_FANOUT);
    return k > BOOT_FANOUT_MAX ? BOOT_FANOUT_MAX : (int)k;
}

/* Rank 0. from: the bootstrap a growth grows from (NULL: none). */
static reshard_status_t boot_form_root(struct boot *b, const struct boot_id *id,
                                       const union sock_addr *a, unsigned flags, int64_t deadline,
                                       const struct boot *from)
{
    struct boot_form f = {
        .b = b, .deadline = deadline, .next_slot = from ? b->members : 1, .grown = !!from};
    reshard_status_t st;
    b->lfd = boot_registry_take(id);
    if (b->lfd < 0)
        RS_CHECK(boot_listen_any(a, flags & BOOT_ID_PROMPT, &b->lfd));
    boot_tree_place(b, 0, from ? from->fanout : boot_form_fanout());
    if (from) /* after every member gave up on its members (and named them) */
        f.deadline += (int64_t)b->height * BOOT_LEVEL_MS;
    f.slot_rank = rs_calloc((size_t)b->size, sizeof(int), "bootstrap rendezvous");
    f.arrived = f.slot_rank ? rs_calloc((size_t)b->size, 1, "bootstrap rendezvous") : NULL;
    if (!f.arrived) {
        st = RESHARD_ERR_NO_MEMORY;
        goto err_free_form;
    }
    RS_CHECK_GOTO(boot_form_alloc(&f, from ? boot_form_attach : boot_form_join), st, err_free_form);
    f.arrived[0] = 1;
    if (from) { /* the members are where they were; the joiners arrive */
        memcpy(b->addrs, from->addrs, (size_t)b->members * BOOT_ADDR_BYTES);
        memset(f.arrived, 1, (size_t)b->members);
    }
    boot_addr_put(b->addrs, a); /* where the others dial rank 0 */
    RS_CHECK_GOTO(boot_form_run(&f), st, err_free_form);
    RS_CHECK_GOTO(boot_form_welcome(&f), st, err_free_form);
    boot_form_free(&f, RESHARD_OK);
    return RESHARD_OK;
err_free_form:
    boot_form_free(&f, st);
    return st;
}

/* A rank other than 0: admitted by rank 0, placed, attached to its parent, then as rank 0. */
static reshard_status_t boot_form_peer(struct boot *b, const union sock_addr *a, unsigned flags,
                                       int64_t base)
{
    struct boot_form f = {.b = b, .grown = b->members > 0};
    struct boot_admit ad, again;
    union sock_addr pa;
    char who[32], addr[SOCK_ADDR_STR];
    reshard_status_t st;
    int fd = -1;
    snprintf(who, sizeof(who), "rank %d", b->label[0]);
    RS_CHECK(boot_dial(b, a, who, BOOT_JOIN, flags & BOOT_ID_PROMPT, base, &fd, &ad));
    if (boot_admit_valid(&ad, b->size, b->rank, &pa) != 0) {
        sock_close(&fd);
        return rs_error(RESHARD_ERR_NETWORK,
                        "bootstrap: rank 0 placed this rank at a slot that is not one (slot %d, "
                        "fan-out %d, parent %d)",
                        ad.slot, ad.fanout, ad.parent);
    }
    if (f.grown && (ad.slot != b->rank || ad.parent != (b->rank - 1) / ad.fanout)) {
        sock_close(&fd);
        return rs_error(RESHARD_ERR_NETWORK,
                        "bootstrap: rank 0 placed this joiner at slot %d under parent %d, not at "
                        "its own rank %d under %d",
                        ad.slot, ad.parent, b->rank, (b->rank - 1) / ad.fanout);
    }
    boot_tree_place(b, ad.slot, ad.fanout);
    f.deadline = boot_deadline_parent(b, base);
    if ((st = boot_form_alloc(&f, boot_form_attach)) != RESHARD_OK) {
        sock_close(&fd);
        goto err_free_form;
    }
    if (ad.parent == 0) {
        b->nb[0].fd = fd;
        boot_form_name(b, 0, 0, sock_addr_str(a, addr, sizeof(addr)));
    } else {
        sock_close(&fd);
        snprintf(who, sizeof(who), "rank %d", b->label[ad.parent]);
        RS_CHECK_GOTO(boot_dial(b, &pa, who, BOOT_ATTACH, 0, f.deadline, &b->nb[0].fd, &again), st,
                      err_free_form);
        boot_form_name(b, 0, ad.parent, sock_addr_str(&pa, addr, sizeof(addr)));
    }
    sock_xfer_init(&f.rx[0], b->nb[0].fd, b->nb[0].name, 0,
                   (struct sock_frame_hdr){.type = SOCK_FRAME_WELCOME,
                                           .len = (uint64_t)b->size * BOOT_ADDR_BYTES},
                   b->addrs);
    RS_CHECK_GOTO(boot_form_run(&f), st, err_free_form);
    RS_CHECK_GOTO(boot_form_welcome(&f), st, err_free_form);
    boot_form_free(&f, RESHARD_OK);
    return RESHARD_OK;
err_free_form:
    boot_form_free(&f, st);
    return st;
}

/* A member r > 0 of a growth: listens on a dup of its listener in `from`, attaches at its
 * tree parent (r - 1) / k without meeting rank 0, admits its children, and learns only the
 * joiners' listeners. */
static reshard_status_t boot_form_member(struct boot *b, const struct boot *from, int64_t base)
{
    struct boot_form f = {.b = b, .grown = 1};
    struct boot_admit again;
    union sock_addr pa;
    char who[32], addr[SOCK_ADDR_STR];
    reshard_status_t st;
    int parent = (b->rank - 1) / from->fanout;
    b->lfd = fcntl(from->lfd, F_DUPFD_CLOEXEC, 0);
    if (b->lfd < 0)
        return rs_error(RESHARD_ERR_NETWORK, "bootstrap: dup of rank %d's listener: %m",
                        b->label[b->rank]);
    boot_tree_place(b, b->rank, from->fanout);
    f.deadline = boot_deadline_parent(b, base);
    f.mdeadline = base + (int64_t)b->height * BOOT_LEVEL_MS;
    RS_CHECK_GOTO(boot_form_alloc(&f, boot_form_attach), st, err_free_form);
    memcpy(b->addrs, from->addrs, (size_t)b->members * BOOT_ADDR_BYTES);
    if (boot_addr_get(b->addrs + (size_t)parent * BOOT_ADDR_BYTES, &pa) != 0) {
        st = rs_error(RESHARD_ERR_INTERNAL, "bootstrap: no listener of rank %d, the tree parent",
                      b->label[parent]);
        goto err_free_form;
    }
    snprintf(who, sizeof(who), "rank %d", b->label[parent]);
    RS_CHECK_GOTO(boot_dial(b, &pa, who, BOOT_ATTACH, 0, f.deadline, &b->nb[0].fd, &again), st,
                  err_free_form);
    boot_form_name(b, 0, parent, sock_addr_str(&pa, addr, sizeof(addr)));
    sock_xfer_init(
        &f.rx[0], b->nb[0].fd, b->nb[0].name, 0,
        (struct sock_frame_hdr){.type = SOCK_FRAME_WELCOME,
                                .len = (uint64_t)(b->size - b->members) * BOOT_ADDR_BYTES},
        b->addrs + (size_t)b->members * BOOT_ADDR_BYTES);
    RS_CHECK_GOTO(boot_form_run(&f), st, err_free_form);
    RS_CHECK_GOTO(boot_form_welcome(&f), st, err_free_form);
    boot_form_free(&f, RESHARD_OK);
    return RESHARD_OK;
err_free_form:
    boot_form_free(&f, st);
    return st;
}

reshard_status_t boot_init(const struct boot_id *id, int rank, int size, int timeout_ms,
                           struct boot **out)
{
    return boot_init_labeled(id, rank, size, NULL, timeout_ms, out);
}

reshard_status_t boot_init_labeled(const struct boot_id *id, int rank, int size, const int *label,
                                   int timeout_ms, struct boot **out)
{
    return boot_init_grow(id, rank, size, label, 0, NULL, timeout_ms, out);
}

reshard_status_t boot_init_grow(const struct boot_id *id, int rank, int size, const int *label,
                                int members, const struct boot *from, int timeout_ms,
                                struct boot **out)
{
    union sock_addr a;
    unsigned flags = 0;
    struct boot *b;
    reshard_status_t st;
    if (!id || !out || size < 1 || rank < 0 || rank >= size || timeout_ms <= 0)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "bootstrap: init of rank %d of %d with a %d ms timeout: needs an id, "
                        "0 <= rank < size and a positive timeout",
                        rank, size, timeout_ms);
    if (members < 0 || members > size ||
        (rank < members && (!from || from->size != members || from->rank != rank || !from->addrs ||
                            from->lfd < 0 || from->fanout < 1)))
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "bootstrap: growth of %d members to %d ranks: rank %d, a member, needs "
                        "the members' bootstrap in which it is rank %d",
                        members, size, rank, rank);
    if (rank >= members)
        from = NULL; /* a joiner: it has none */
    if (!(b = boot_alloc(rank, size, label, timeout_ms)))
        return RESHARD_ERR_NO_MEMORY;
    b->members = members;
    if (boot_id_decode(id, &a, b->secret, &flags) != 0) {
        boot_close(b);
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "bootstrap: rank %d was given something that is "
                        "not a bootstrap id of this version",
                        rank);
    }
    if (from) { /* the members' key: from's secret, which no joiner holds, bound to this growth */
        const struct boot_mac_part part = {b->secret, BOOT_SECRET_BYTES};
        RS_CHECK_GOTO(boot_mac(from->secret, BOOT_SECRET_BYTES, "reshard growth member key", &part,
                               1, b->member_key),
                      st, err_close_boot);
        b->member_keyed = 1;
    }
    int64_t deadline = rs_now_ms() + timeout_ms;
    if (rank == 0)
        RS_CHECK_GOTO(boot_form_root(b, id, &a, flags, deadline, from), st, err_close_boot);
    else if (from)
        RS_CHECK_GOTO(boot_form_member(b, from, deadline), st, err_close_boot);
    else
        RS_CHECK_GOTO(boot_form_peer(b, &a, flags, deadline), st, err_close_boot);
    *out = b;
    return RESHARD_OK;
err_close_boot:
    boot_close(b);
    return st;
}
