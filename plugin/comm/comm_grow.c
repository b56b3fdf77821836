/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Growing a communicator: its members and some joiners form a new one of a new membership
 * epoch. A joiner takes the number of a rank that is absent (a replacement) or one past the
 * size (growth). The members first check, over their own bootstrap, that they all name the same
 * joiners (the communicator is left usable when they do not); then everyone meets at the
 * listener the first member (member[0]: the lowest, unless a replacement took a lower number in
 * an earlier growth) has held since the communicator formed, under the communicator's secret
 * salted with the growth (boot_group_id), as a shrink does. A joiner learns where and
 * under which secret from a join id that any member computes (comm_grow_id) and the
 * application hands to it, as it hands the first unique id to the first ranks. The members keep
 * their network context: the grown communicator shares it (counted references), so their
 * connections to each other and their registrations outlive the growth, and only connections
 * to and from the joiners are new.
 */
#include "comm.h"
#include "comm_int.h"

#include "base/error.h"
#include "base/log.h"
#include "transport/sock/sock.h"

#include <stdlib.h>
#include <string.h>

/* The join id: the bootstrap id (its bytes up to JOIN_TAIL are the bootstrap's, zeros after),
 * then magic, epoch, new size, members before the growth, joiners, and a hash of the joiners
 * (BE 4-byte fields, the hash 8). */
#define JOIN_TAIL  64
#define JOIN_MAGIC 0x52534752u /* "RSGR" */

static uint32_t get_be32(const unsigned char *w)
{
    return (uint32_t)w[0] << 24 | (uint32_t)w[1] << 16 | (uint32_t)w[2] << 8 | w[3];
}

static void put_be32(unsigned char *w, uint32_t v)
{
    w[0] = (unsigned char)(v >> 24);
    w[1] = (unsigned char)(v >> 16);
    w[2] = (unsigned char)(v >> 8);
    w[3] = (unsigned char)v;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* FNV-1a over the sorted joiners: what every member and joiner must agree on. */
static uint64_t list_hash(const int *sorted, int n)
{
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < n; i++) {
        unsigned char w[4];
        put_be32(w, (uint32_t)sorted[i]);
        for (int k = 0; k < 4; k++)
            h = (h ^ w[k]) * 1099511628211ull;
    }
    return h;
}

/* The joiners, sorted into *out, each once and at most COMM_GROW_MAX past the size; a member's
 * number is refused naming it. *size_out: the size after the growth. */
static reshard_status_t check_joiners(const struct reshard_comm *c, const int *joiners, int n,
                                      int **out, int *size_out)
{
    if (n < 1)
        return rs_error(RESHARD_ERR_INVALID_ARG, "grow: no joiners (n is %d)", n);
    int *s = rs_calloc((size_t)n, sizeof(int), "joiners");
    if (!s)
        return RESHARD_ERR_NO_MEMORY;
    memcpy(s, joiners, (size_t)n * sizeof(int));
    qsort(s, (size_t)n, sizeof(int), cmp_int);
    reshard_status_t st = RESHARD_OK;
    for (int i = 0; i < n && st == RESHARD_OK; i++) {
        if (s[i] < 0 || s[i] >= c->size + COMM_GROW_MAX)
            st = rs_error(RESHARD_ERR_INVALID_ARG,
                          "grow: joiner rank %d is outside 0..%d (at most %d past the size)", s[i],
                          c->size + COMM_GROW_MAX - 1, COMM_GROW_MAX);
        else if (s[i] < c->size && comm_has(c, s[i]))
            st = rs_error(RESHARD_ERR_INVALID_ARG,
                          "grow: joiner rank %d is a live member of the communicator: a joiner "
                          "takes the number of a rank that left, or one past the size (%d)",
                          s[i], c->size);
        else if (i > 0 && s[i] == s[i - 1])
            st = rs_error(RESHARD_ERR_INVALID_ARG,
                          "grow: two joiners claim rank %d: each number is taken once", s[i]);
    }
    if (st != RESHARD_OK) {
        free(s);
        return st;
    }
    *size_out = s[n - 1] + 1 > c->size ? s[n - 1] + 1 : c->size;
    *out = s;
    return RESHARD_OK;
}

/* The salt of the growth's secret: epoch, new size, and the joiners. */
static reshard_status_t grow_group_id(struct reshard_comm *c, uint32_t epoch, int size,
                                      const int *sorted, int n, struct boot_id *id)
{
    unsigned char salt[4 + 4 + 4 + 8] = {'g', 'r', 'o', 'w'};
    put_be32(salt + 4, epoch);
    put_be32(salt + 8, (uint32_t)size);
    uint64_t h = list_hash(sorted, n);
    put_be32(salt + 12, (uint32_t)(h >> 32));
    put_be32(salt + 16, (uint32_t)h);
    return boot_group_id(c->boot, c->boot_of[c->member[0]], salt, sizeof(salt), id);
}

reshard_status_t comm_grow_id(struct reshard_comm *c, const int *joiners, int n,
                              struct boot_id *out)
{
    int *s = NULL, size = 0;
    RS_CHECK(check_joiners(c, joiners, n, &s, &size));
    struct boot_id id;
    reshard_status_t st = grow_group_id(c, c->shrinks + 1, size, s, n, &id);
    if (st == RESHARD_OK) {
        boot_id_release(&id); /* the members' comm_grow registers the listener itself */
        uint64_t h = list_hash(s, n);
        unsigned char *w = id.bytes + JOIN_TAIL;
        memset(w, 0, BOOT_ID_BYTES - JOIN_TAIL);
        put_be32(w, JOIN_MAGIC);
        put_be32(w + 4, c->shrinks + 1);
        put_be32(w + 8, (uint32_t)size);
        put_be32(w + 12, (uint32_t)c->nmembers);
        put_be32(w + 16, (uint32_t)n);
        put_be32(w + 20, (uint32_t)(h >> 32));
        put_be32(w + 24, (uint32_t)h);
        *out = id;
    }
    free(s);
    return st;
}

/* The members agree on the joiners (lowest and highest hash, with a rank holding each) before
 * anything new is made: a member with another list fails them all, naming it. */
struct list_vote {
    uint64_t lo, hi;
    int32_t lo_rank, hi_rank;
};

static void vote_combine(void *acc, const void *in, void *arg)
{
    (void)arg;
    struct list_vote a, b;
    memcpy(&a, acc, sizeof(a));
    memcpy(&b, in, sizeof(b));
    if (b.lo < a.lo || (b.lo == a.lo && b.lo_rank < a.lo_rank)) {
        a.lo = b.lo;
        a.lo_rank = b.lo_rank;
    }
    if (b.hi > a.hi || (b.hi == a.hi && b.hi_rank < a.hi_rank)) {
        a.hi = b.hi;
        a.hi_rank = b.hi_rank;
    }
    memcpy(acc, &a, sizeof(a));
}

static reshard_status_t agree_on_joiners(struct reshard_comm *c, uint64_t h)
{
    struct list_vote v = {h, h, c->rank, c->rank};
    RS_CHECK(comm_enter(c));
    RS_CHECK(comm_leave(c, boot_allreduce(c->boot, &v, sizeof(v), vote_combine, NULL)));
    if (v.lo != v.hi)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "grow: members passed different joiner lists (rank %d's differs from "
                        "rank %d's); the communicator is unchanged",
                        v.lo_rank, v.hi_rank);
    return RESHARD_OK;
}

/* ---- the exchange of a growth: O(joiners) at every member ---- */

/* What the members push to the joiners (boot_push_joiners): their count of executions (a
 * joiner counts on from it: message tags carry it, and the members' transports outlive the
 * growth) and their number, then each member's number in the new bootstrap's order and its
 * hello record, as the members keep them. What the joiners tell everyone (one allreduce, each
 * joiner ORing its own entry into zeros): per joiner its number, a mark, and its record. */
#define GROW_PUSH_HEAD 8
#define GROW_ENTRY     8

static void or_bytes(void *acc, const void *in, void *arg)
{
    size_t n = *(const size_t *)arg;
    for (size_t i = 0; i < n; i++)
        ((unsigned char *)acc)[i] |= ((const unsigned char *)in)[i];
}

/* A kept record (rec_from bytes: the hello and its address slot) into a record of rec bytes
 * (rec >= rec_from: the slot only grows). */
static void relay_record(unsigned char *to, size_t rec, const unsigned char *from, size_t rec_from)
{
    memcpy(to, from, rec_from);
    memset(to + rec_from, 0, rec - rec_from);
}

/* A joiner: the membership from the members' push, checked (each number in range, once, and no
 * joiner's), into c (member, boot_of, seq); the members' records into all. */
static reshard_status_t take_push(struct reshard_comm *c, const unsigned char *p, int m,
                                  const int *s, int n, unsigned char *all, size_t rec)
{
    uint32_t seq = (uint32_t)sock_wire_get(p, 4);
    if ((int)sock_wire_get(p + 4, 4) != m)
        return rs_error(RESHARD_ERR_INTERNAL, "join: the members sent %d members, %d expected",
                        (int)sock_wire_get(p + 4, 4), m);
    const unsigned char *num = p + GROW_PUSH_HEAD, *recs = num + (size_t)4 * m;
    for (int k = 0; k < m; k++) {
        int r = (int)(int32_t)(uint32_t)sock_wire_get(num + (size_t)4 * k, 4);
        int dup = r >= 0 && r < c->size && c->boot_of[r] >= 0;
        for (int i = 0; i < n && !dup; i++)
            dup = s[i] == r;
        if (r < 0 || r >= c->size || dup)
            return rs_error(RESHARD_ERR_INTERNAL,
                            "grow: the new bootstrap's rank %d goes by %d, not the number expected",
                            k, r);
        c->boot_of[r] = k;
        c->member[k] = r;
        memcpy(all + (size_t)r * rec, recs + (size_t)k * rec, rec);
    }
    c->seq = seq;
    return RESHARD_OK;
}

/* The members' push: built by a member from its kept table, taken by a joiner. */
static reshard_status_t push_members(struct reshard_comm *c, const struct reshard_comm *old, int m,
                                     const int *s, int n, unsigned char *all, size_t rec)
{
    size_t len = GROW_PUSH_HEAD + (size_t)m * (4 + rec);
    unsigned char *p = rs_calloc(1, len, "grow: the members' records");
    if (!p)
        return RESHARD_ERR_NO_MEMORY;
    if (old) {
        sock_wire_put(p, c->seq, 4);
        sock_wire_put(p + 4, (uint32_t)m, 4);
        for (int k = 0; k < m; k++) {
            sock_wire_put(p + GROW_PUSH_HEAD + (size_t)4 * k, (uint32_t)c->member[k], 4);
            memcpy(p + GROW_PUSH_HEAD + (size_t)4 * m + (size_t)k * rec,
                   all + (size_t)c->member[k] * rec, rec);
        }
    }
    reshard_status_t st = boot_push_joiners(c->boot, p, len);
    if (st == RESHARD_OK && !old)
        st = take_push(c, p, m, s, n, all, rec);
    free(p);
    return st;
}

/* The joiners' records reach everyone: one allreduce of n entries, each joiner filling its
 * own; every rank checks that entry i is joiner s[i]'s. */
static reshard_status_t gather_joiners(struct reshard_comm *c, int m, const int *s, int n,
                                       const unsigned char *mine, unsigned char *all, size_t rec)
{
    size_t ent = GROW_ENTRY + rec, len = (size_t)n * ent;
    unsigned char *e = rs_calloc(1, len, "grow: the joiners' records");
    if (!e)
        return RESHARD_ERR_NO_MEMORY;
    int me = c->boot_of[c->rank] - m;
    if (me >= 0) {
        sock_wire_put(e + (size_t)me * ent, (uint32_t)c->rank, 4);
        sock_wire_put(e + (size_t)me * ent + 4, 1, 4);
        memcpy(e + (size_t)me * ent + GROW_ENTRY, mine, rec);
    }
    reshard_status_t st = boot_allreduce(c->boot, e, len, or_bytes, &len);
    for (int i = 0; st == RESHARD_OK && i < n; i++) {
        const unsigned char *w = e + (size_t)i * ent;
        int r = (int)(int32_t)(uint32_t)sock_wire_get(w, 4);
        if (r != s[i] || sock_wire_get(w + 4, 4) != 1)
            st = rs_error(RESHARD_ERR_INTERNAL,
                          "grow: the new bootstrap's rank %d goes by %d, not the number expected "
                          "(%d)",
                          m + i, r, s[i]);
        else
            memcpy(all + (size_t)r * rec, w + GROW_ENTRY, rec);
    }
    free(e);
    return st;
}

/* The exchange that forms a grown communicator, O(joiners) at every member: the members send
 * the joiners their kept records (boot_push_joiners: nothing crosses between two members), the
 * joiners' records reach everyone in one allreduce, and the local peers verify only pairs with
 * a joiner (a member keeps what it concluded about the other members). old: a member's
 * communicator; NULL on a joiner. s[n]: the joiners, sorted; m: the members. */
static reshard_status_t grow_exchange(struct reshard_comm *c, const struct reshard_comm *old, int m,
                                      const int *s, int n)
{
    unsigned char addr[COMM_ADDR_MAX], *mine = NULL, *all = NULL;
    size_t len = sizeof(addr);
    struct comm_hello me;
    uint32_t slot = 0;
    reshard_status_t st;
    boot_set_cancel(c->boot, &c->abort_req);
    RS_CHECK_GOTO(comm_net_open(c, old), st, err_tell_others);
    RS_CHECK_GOTO(boot_listener_id(c->boot, c->boot_of[c->rank], &c->spare), st, err_tell_others);
    if (old) {
        if (!old->hellos || old->hello_rec < COMM_HELLO_BYTES) {
            st = rs_error(RESHARD_ERR_INTERNAL, "grow: rank %d keeps no hello records", c->rank);
            goto err_tell_others;
        }
        const unsigned char *own = old->hellos + (size_t)c->rank * old->hello_rec;
        slot = (uint32_t)(old->hello_rec - COMM_HELLO_BYTES);
        RS_CHECK_GOTO(comm_local_carry(c, old, (pid_t)(int32_t)sock_wire_get(own + 12, 4)), st,
                      err_tell_others);
    } else {
        RS_CHECK_GOTO(comm_my_hello(c, &me, addr, &len), st, err_tell_others);
        slot = (uint32_t)len;
    }
    /* The records' address slot: the members' kept one, or longer for a joiner's address. */
    RS_CHECK(boot_allreduce(c->boot, &slot, sizeof(slot), comm_max_u32, NULL));
    if (slot > COMM_ADDR_MAX) /* every rank sees the same: all fail alike */
        return rs_error(RESHARD_ERR_INTERNAL, "a rank announced a %u-byte address (at most %d)",
                        slot, COMM_ADDR_MAX);
    size_t rec = COMM_HELLO_REC(slot);
    if (!(all = rs_calloc((size_t)c->size, rec, "hellos")) ||
        !(mine = rs_calloc(1, rec, "hello"))) {
        st = RESHARD_ERR_NO_MEMORY;
        goto err_free_all;
    }
    if (old) {
        for (int k = 0; k < m; k++)
            relay_record(all + (size_t)c->member[k] * rec, rec,
                         old->hellos + (size_t)c->member[k] * old->hello_rec, old->hello_rec);
    } else {
        comm_hello_put(mine, &me);
        memcpy(mine + COMM_HELLO_BYTES, addr, len);
    }
    RS_CHECK_GOTO(push_members(c, old, m, s, n, all, rec), st, err_free_all);
    RS_CHECK_GOTO(gather_joiners(c, m, s, n, mine, all, rec), st, err_free_all);
    if (!old) { /* a joiner now knows everyone's number */
        for (int i = 0; i < n; i++)
            c->boot_of[s[i]] = m + i, c->member[m + i] = s[i];
        c->nmembers = m + n;
        boot_set_labels(c->boot, c->member);
    }
    RS_CHECK_GOTO(comm_spares(c), st, err_free_all);
    free(mine);
    return comm_form(c, NULL, old, all, rec);
err_free_all:
    free(mine);
    free(all);
err_tell_others:
    /* The others would wait for this rank until they time out: tell them now (a collective
     * that failed has told them itself, and this does nothing more). */
    boot_abort(c->boot, st, rs_error_message());
    return st;
}

reshard_status_t comm_grow(struct reshard_comm *old, const int *joiners, int n,
                           struct reshard_comm **out)
{
    int *s = NULL, size = 0;
    RS_CHECK(check_joiners(old, joiners, n, &s, &size));
    reshard_status_t st;
    RS_CHECK_GOTO(agree_on_joiners(old, list_hash(s, n)), st, err_free_list);
    struct reshard_comm *c = comm_alloc(old->rank, size, old->local_rank);
    st = RESHARD_ERR_NO_MEMORY;
    if (!c)
        goto err_free_list;
    c->shrinks = old->shrinks + 1;
    c->seq = old->seq;
    for (int r = 0; r < size; r++)
        c->boot_of[r] = -1;
    c->nmembers = 0;
    for (int k = 0; k < old->nmembers; k++)
        c->boot_of[old->member[k]] = k, c->member[c->nmembers++] = old->member[k];
    for (int i = 0; i < n; i++)
        c->boot_of[s[i]] = c->nmembers, c->member[c->nmembers++] = s[i];
    struct boot_id id;
    RS_CHECK_GOTO(grow_group_id(old, c->shrinks, size, s, n, &id), st, err_destroy_comm);
    st = boot_init_grow(&id, c->boot_of[c->rank], c->nmembers, c->member, old->nmembers, old->boot,
                        comm_timeout_ms(), &c->boot);
    boot_id_release(&id);
    RS_CHECK_GOTO(st, st, err_destroy_comm);
    /* The members' connections to each other and their registrations carry over: only the
     * joiners become new peers of the context. */
    RS_CHECK_GOTO(grow_exchange(c, old, old->nmembers, s, n), st, err_forget_joiners);
    rs_log(RS_LOG_INFO, "comm: rank %d of %d (%d present) after a growth by %d, %d domains",
           c->rank, c->size, c->nmembers, n, c->topo.t.ndomains);
    old->grown_into = c->shrinks;
    comm_local_adopt(c, old);
    free(s);
    *out = c;
    return RESHARD_OK;
err_forget_joiners:
    /* The old communicator stays as it was: no joiner remains its context's peer. */
    for (int i = 0; c->net && i < n; i++)
        c->net->ops->close_peer(c->net, s[i]);
err_destroy_comm:
    comm_destroy(c);
err_free_list:
    free(s);
    return st;
}

/* How long a joiner refused here waits for the lowest member to hear why: the members grow
 * about when the joiners join, and a joiner that tries a wrong claim after a growth completed
 * (nobody serves the listener then) must not hang for RESHARD_TIMEOUT. */
#define DECLINE_WAIT_MS 3000

/* A joiner refused here tells the members why (they would time out on it otherwise), then
 * fails with its own message. */
static reshard_status_t decline(const struct boot_id *join_id, int total, int rank,
                                enum boot_decline_reason why)
{
    struct rs_saved_error mine;
    rs_error_save(&mine);
    struct boot_id id = *join_id;
    memset(id.bytes + JOIN_TAIL, 0, BOOT_ID_BYTES - JOIN_TAIL);
    int ms = comm_timeout_ms() < DECLINE_WAIT_MS ? comm_timeout_ms() : DECLINE_WAIT_MS;
    if (boot_decline(&id, total, rank, why, ms) != RESHARD_OK)
        rs_log(RS_LOG_INFO, "join: the members did not hear why this rank does not join: %s",
               rs_error_message());
    rs_error_restore(&mine);
    return RESHARD_ERR_INVALID_ARG;
}

reshard_status_t comm_join_grown(const struct boot_id *join_id, int rank, const int *joiners, int n,
                                 struct reshard_comm **out)
{
    const unsigned char *w = join_id->bytes + JOIN_TAIL;
    if (get_be32(w) != JOIN_MAGIC)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "join: not a join id (reshard_comm_grow_id makes one on a member)");
    uint32_t epoch = get_be32(w + 4), size = get_be32(w + 8), m = get_be32(w + 12),
             nj = get_be32(w + 16);
    uint64_t h = (uint64_t)get_be32(w + 20) << 32 | get_be32(w + 24);
    if (size < 1 || size > INT32_MAX / 2 || m < 1 || m >= size + 1u || nj < 1 || m + nj > size)
        return rs_error(RESHARD_ERR_INVALID_ARG, "join: a malformed join id");
    if (n < 1 || (uint32_t)n != nj) {
        rs_error(RESHARD_ERR_INVALID_ARG,
                 "join: %d joiners passed, the members admit %u: pass the same list", n, nj);
        return decline(join_id, (int)(m + nj), rank, BOOT_DECLINE_COUNT);
    }
    int *s = rs_calloc((size_t)n, sizeof(int), "joiners");
    if (!s)
        return RESHARD_ERR_NO_MEMORY;
    memcpy(s, joiners, (size_t)n * sizeof(int));
    qsort(s, (size_t)n, sizeof(int), cmp_int);
    reshard_status_t st = RESHARD_OK;
    enum boot_decline_reason why = BOOT_DECLINE_LIST;
    int k = -1;
    for (int i = 0; i < n; i++)
        if (s[i] == rank)
            k = i;
    if (list_hash(s, n) != h)
        st = rs_error(RESHARD_ERR_INVALID_ARG,
                      "join: the joiner list differs from the one the members grow by");
    else if (k < 0 || rank < 0 || rank >= (int)size) {
        why = BOOT_DECLINE_NOT_LISTED;
        st = k < 0 ? rs_error(RESHARD_ERR_INVALID_ARG,
                              "join: rank %d is not among the joiners the members admit", rank)
                   : rs_error(RESHARD_ERR_INVALID_ARG, "join: rank %d is outside 0..%u", rank,
                              size - 1);
    }
    if (st != RESHARD_OK) {
        free(s);
        return decline(join_id, (int)(m + nj), rank, why);
    }
    struct reshard_comm *c = comm_alloc(rank, (int)size, -1);
    st = RESHARD_ERR_NO_MEMORY;
    if (!c)
        goto err_free_list;
    c->shrinks = epoch;
    for (int r = 0; r < c->size; r++)
        c->boot_of[r] = -1;
    int dense = (int)m + k, total = (int)(m + nj);
    c->boot_of[rank] = dense;
    struct boot_id id = *join_id;
    memset(id.bytes + JOIN_TAIL, 0, BOOT_ID_BYTES - JOIN_TAIL);
    RS_CHECK_GOTO(
        boot_init_grow(&id, dense, total, NULL, (int)m, NULL, comm_timeout_ms(), &c->boot), st,
        err_destroy_comm);
    RS_CHECK_GOTO(grow_exchange(c, NULL, (int)m, s, n), st, err_destroy_comm);
    rs_log(RS_LOG_INFO, "comm: rank %d of %d (%d present) joined, %d domains", c->rank, c->size,
           c->nmembers, c->topo.t.ndomains);
    free(s);
    *out = c;
    return RESHARD_OK;
err_destroy_comm:
    comm_destroy(c);
err_free_list:
    free(s);
    return st;
}
