/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the bootstrap's files share: the bootstrap object (struct boot), its tree and its
 * connections; one collective turn (struct boot_coll); the admission of joiners at a listener
 * (boot_admit.c) and the joining side (boot_join.c); the forming of the tree
 * (boot_rendezvous.c); the collectives (boot_coll.c) and failure spreading (boot_fail.c);
 * ids and their registry (boot_id.c) and the tree's shape (boot_tree.c).
 */
#ifndef RS_BOOT_INT_H
#define RS_BOOT_INT_H

#include "boot_crypto.h"
#include "bootstrap.h"

#include "base/error.h"
#include "transport/sock/sock.h"
#include "transport/sock/sock_frame.h"

#include <poll.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define BOOT_VERSION         2
#define BOOT_SECRET_BYTES    32
#define BOOT_NONCE_BYTES     32
#define BOOT_ADDR_BYTES      24 /* a listener's address on the wire (boot_addr_put) */
#define BOOT_PEER_NAME_BYTES (SOCK_ADDR_STR + 24)
#define BOOT_FANOUT_MAX      64
/* Connections a listener holds before they prove they belong to the job. */
#define BOOT_PENDING_MAX 64
/* How much longer a rank waits on its children than the level below it waits on theirs. */
#define BOOT_LEVEL_MS 150
/* The most a rank waits past its deadline for its parent's verdict. */
#define BOOT_GRACE_MAX_MS 2000
/* A listener of a prompt id (one that rank 0 opens only when it serves it: the launcher
 * environment) that stays silent this long after a connection is not reshard's rank 0. */
#define BOOT_PROMPT_MS 1000
/* How long telling the others of a failure may take. */
#define BOOT_ABORT_MAX_MS 1000

/* Id flags (byte 60). */
#define BOOT_ID_PROMPT 0x1u

/* ---- the bootstrap object ---- */

/* A tree neighbour: [0] the parent, [1..] the children. */
struct boot_conn {
    int fd;
    int rank;      /* its rank in this bootstrap (-1: not connected yet) */
    int send_torn; /* a frame went out cut short: nothing more may follow it */
    int sub_off;   /* a child: where its subtree's ranks start in the parent's sub[] */
    int sub_len;   /* a child: how many ranks its subtree has */
    char name[BOOT_PEER_NAME_BYTES]; /* "rank 3 (10.0.0.1:4242)" */
};

struct boot {
    int rank, size, timeout_ms;
    /* The tree: this rank's slot (its place in order of arrival at rank 0, which is slot 0; in
     * a growth, its rank),
     * the fan-out, its depth, the height of its subtree and of the whole tree, its children
     * (slots first_child ...), and how many ranks its subtree holds. */
    int slot, fanout, depth, height, tree_height, first_child, nchildren, nsub;
    int lfd; /* children attach here; a later bootstrap (a shrink) may meet here */
    unsigned char secret[BOOT_SECRET_BYTES];
    uint32_t seq;             /* collectives so far, to tell ranks out of step */
    struct boot_conn *nb;     /* [1 + nchildren] */
    int *sub;                 /* [nsub]: the subtree's ranks, this one first, then each child's */
    unsigned char *addrs;     /* [size * BOOT_ADDR_BYTES]: every rank's listener, once formed */
    int *label;               /* [size]: the number each rank goes by in messages and reports */
    const atomic_int *cancel; /* collectives end when it turns non-zero (NULL: never) */
    reshard_status_t failed;  /* RESHARD_OK while usable */
    int left;    /* the label of a rank heard to leave on purpose (boot_leave), or -1 */
    int members; /* a growth's: ranks below it are members, whom a decline waits for */
    /* A growth's member (rank 0 too): a key only the members can make (from the bootstrap they
     * grow from; the joiners hold the growth's secret, not that one), under which a member's
     * attach is MACed and checked, so that a joiner cannot attach in a member's place. */
    unsigned char member_key[BOOT_SECRET_BYTES];
    int member_keyed;
    char fail_msg[RS_ERROR_MAX];
    char refusal[RS_ERROR_MAX];
    uint64_t sent, received;           /* bytes of collectives, headers included */
    uint64_t form_sent, form_received; /* bytes of forming the tree */
};

/* One exchange in progress: the frame header its frames carry and when it must end. */
struct boot_coll {
    struct boot *b;
    struct sock_frame_hdr hdr;
    int64_t deadline;            /* the turn's: each step waits relative to it */
    char what[64];               /* "allgather #3 on rank 2", for messages */
    struct sock_frame_error err; /* what a failed rank reported (origin -1: nothing) */
    int from;                    /* the neighbour (nb index) a failure came from, or -1 */
};

/* One frame with one neighbour: nb index, and the payload sent from or received into. */
struct boot_leg {
    int nb;
    uint64_t len;
    void *data;
};

/* ---- the tree's shape (boot_tree.c) ---- */

/* How many children slot has (at most k), the first of them in *first. */
int boot_tree_children(int slot, int size, int k, int *first);
int boot_tree_subtree(int slot, int size, int k);
int boot_tree_height(int slot, int size, int k); /* 0 for a leaf */
int boot_tree_depth(int slot, int k);
/* A child's READY: its subtree's n ranks (BE), the first its own rank `first`, each in
 * 1..size-1 and met once in this rank's subtree (seen[size], updated), into out[n]. -1 when
 * all are, else the index of the first that is not. */
int boot_ready_decode(const unsigned char *w, int n, int first, int size, unsigned char *seen,
                      int *out);
/* Fills b's tree fields for slot under fan-out k. */
void boot_tree_place(struct boot *b, int slot, int fanout);
int boot_grace_ms(const struct boot *b);
/* Until when this rank waits on its children, and on its parent, in a turn that began at
 * base: the higher in the tree, the longer on children; the deeper, the longer on the parent. */
int64_t boot_deadline_children(const struct boot *b, int64_t base);
int64_t boot_deadline_parent(const struct boot *b, int64_t base);

/* ---- ids (boot_id.c) ---- */

/* Layout: magic 0-3, version 4, family 5 (4 or 6), port 6-7, address 8-23, IPv6 scope 24-27,
 * secret 28-59, flags 60, zeros after. */
void boot_id_encode(const union sock_addr *a, const unsigned char *secret, unsigned flags,
                    struct boot_id *id);
/* 0, or -1 when id is not one of ours. secret and flags may be NULL. */
int boot_id_decode(const struct boot_id *id, union sock_addr *a, unsigned char *secret,
                   unsigned *flags);
/* A string (or any bytes) to BOOT_SECRET_BYTES, through HMAC-SHA256. */
reshard_status_t boot_secret_derive(const void *material, size_t n, const char *label,
                                    unsigned char *out);
/* Removes the id's listener from this process's registry: its socket, or -1. */
int boot_registry_take(const struct boot_id *id);
/* RESHARD_BOOT_PORT, checked to be a port (0: any). */
reshard_status_t boot_param_port(int *port);
/* Rank 0 of an id that none of this process's listeners serves: a listener on the id's port,
 * on every address of its family. A port another program holds is said so, with what to do. */
reshard_status_t boot_listen_any(const union sock_addr *a, int prompt, int *fd);
/* A listener's address on the wire: family (1: 4 or 6), 0, port (2), scope (4), address (16). */
void boot_addr_put(unsigned char *w, const union sock_addr *a);
int boot_addr_get(const unsigned char *w, union sock_addr *a); /* -1: not an address */

/* ---- the bootstrap object, its collectives and failures (boot_coll.c, boot_fail.c) ---- */

/* A bootstrap with no connection yet (NULL when out of memory); label as for boot_init_labeled. */
struct boot *boot_alloc(int rank, int size, const int *label, int timeout_ms);
/* Once placed in the tree: room for the neighbours and the subtree (RESHARD_ERR_NO_MEMORY). */
reshard_status_t boot_alloc_tree(struct boot *b);
/* Checks a collective's arguments (before the turn counts, so that a caller's mistake leaves
 * the ranks in step) and starts the turn's clock. `slots` buffers of `bytes` each must fit in
 * memory. */
reshard_status_t boot_coll_begin(struct boot *b, enum sock_frame_op op, const void *buf,
                                 size_t bytes, int slots, struct boot_coll *c);
/* One frame with each of n neighbours, all at once, until deadline: sent from or received into
 * each leg's data. The turn's header with len per leg. On failure c->from names the leg. */
reshard_status_t boot_coll_legs(struct boot_coll *c, const struct boot_leg *legs, int n, int send,
                                int64_t deadline);
/* An exchange failed on this rank with st (its message is the thread's): makes the bootstrap
 * unusable and tells the neighbours. err: what another rank reported (origin >= 0), passed on
 * to every neighbour but `from`, where it came from; else this rank's own failure, told to all. */
reshard_status_t boot_fail(struct boot *b, reshard_status_t st, const struct sock_frame_error *err,
                           int from);

/* What a failure report says: a rank that left on purpose (RESHARD_ERR_LEFT) is remembered. */
void boot_heard(struct boot *b, const struct sock_frame_error *err);

/* ---- admission at a listener (boot_admit.c) ---- */

/* BOOT_DECLINE: a rank that holds the secret but will not join (boot_decline): its hello
 * carries the number it claims in rank and the reason (BOOT_DECLINE_*) in slot. */
enum boot_hello_kind { BOOT_JOIN = 1, BOOT_ATTACH = 2, BOOT_DECLINE = 3 };

#define BOOT_OPEN_BYTES      8
#define BOOT_CHALLENGE_BYTES (8 + BOOT_NONCE_BYTES)
#define BOOT_HELLO_BYTES     (24 + BOOT_NONCE_BYTES + BOOT_ADDR_BYTES + BOOT_MAC_BYTES)
#define BOOT_ADMIT_BYTES     (16 + BOOT_ADDR_BYTES + BOOT_MAC_BYTES)

/* What a joiner says: the version it speaks, whether it joins (at rank 0) or attaches (at its
 * tree parent), its rank, the size it expects, its slot (an attach), its nonce, its listener
 * (a join) and its MAC over the listener's nonce and all of that. */
struct boot_hello {
    unsigned version, kind;
    int rank, size, slot;
    unsigned char nonce[BOOT_NONCE_BYTES];
    unsigned char addr[BOOT_ADDR_BYTES];
    unsigned char mac[BOOT_MAC_BYTES];
};

/* What an admission says: the joiner's slot, the fan-out, its parent's rank and listener (a
 * join at rank 0), and the listener's MAC over both nonces and all of that. */
struct boot_admit {
    int slot, fanout, parent;
    unsigned char parent_addr[BOOT_ADDR_BYTES];
    unsigned char mac[BOOT_MAC_BYTES];
};

/* Codecs (BE, fixed sizes); _get never fails: checking the values is the caller's part. */
void boot_hello_put(unsigned char *w, const struct boot_hello *h);
void boot_hello_get(const unsigned char *w, struct boot_hello *h);
void boot_admit_put(unsigned char *w, const struct boot_admit *a);
void boot_admit_get(const unsigned char *w, struct boot_admit *a);
/* Whether a placement (its MAC checked) is one this rank of size can act on: 0, with the
 * parent's listener in *parent unless the parent is rank 0; -1 when not. */
int boot_admit_valid(const struct boot_admit *a, int size, int rank, union sock_addr *parent);
/* The MACs: of a hello (its bytes but the MAC, under the listener's nonce), and of an
 * admission (its bytes but the MAC, under the joiner's nonce then the listener's). */
reshard_status_t boot_hello_mac(const unsigned char *secret, const unsigned char *nonce_l,
                                const unsigned char *hello, unsigned char *mac);
reshard_status_t boot_admit_mac(const unsigned char *secret, const unsigned char *nonce_j,
                                const unsigned char *nonce_l, const unsigned char *admit,
                                unsigned char *mac);

/* The key a hello of this kind claiming this rank is MACed under at b's door: the members' key
 * (b->member_key) for a member's attach in a growth, else the secret. NULL: a member's attach
 * at a door that cannot check it (a joiner's, where no member attaches). */
const unsigned char *boot_hello_key(const struct boot *b, unsigned kind, int rank);

/* A joiner whose hello proved it holds the secret: the gate's owner admits it (returns 1 and
 * keeps fd, having sent the admission with boot_admit_send), refuses it (0, the reason in why),
 * or drops it (-1: the connection broke; fd is closed by the gate). */
typedef int (*boot_gate_fn)(void *arg, int fd, const char *addr, const struct boot_hello *h,
                            const unsigned char *nonce_l, char *why, size_t why_len);

/* A connection that has not proven itself yet: unspoken until its OPEN is in, then challenged
 * until its hello is. */
struct boot_pending {
    int fd, spoken;
    int64_t since; /* when it was accepted */
    char addr[SOCK_ADDR_STR];
    unsigned char open[BOOT_OPEN_BYTES];
    unsigned char nonce[BOOT_NONCE_BYTES]; /* the challenge it was sent */
    unsigned char hello[BOOT_HELLO_BYTES];
    struct sock_xfer x; /* receiving the OPEN, then the hello */
};

/* A listener's door. A joiner speaks first (OPEN, as soon as it connects), so a connection
 * that has said nothing when it is accepted is most likely not a rank: it may wait
 * RESHARD_BOOT_HELLO_MS / 8 and gives way to any newcomer that has spoken. One that has spoken
 * gets a challenge and has RESHARD_BOOT_HELLO_MS to answer it; when the table is full, it gives
 * way to a newcomer that has spoken once it has had an eighth of that. A newcomer that finds no
 * room is answered BUSY and tries again. At most BOOT_PENDING_MAX connections wait at once. */
struct boot_gate {
    struct boot *b;
    int lfd, hello_ms, np;
    boot_gate_fn admit;
    void *arg;
    unsigned refused, dropped, busy; /* for one summary line at the end */
    const char *turn_away;           /* set: a connection is refused with it once its OPEN is in */
    struct boot_pending *p;          /* [BOOT_PENDING_MAX] */
};

reshard_status_t boot_gate_open(struct boot_gate *g, struct boot *b, int lfd, boot_gate_fn admit,
                                void *arg);
/* Poll entries: the listener, then each pending connection; returns how many it wrote (at
 * most 1 + BOOT_PENDING_MAX). */
int boot_gate_poll(const struct boot_gate *g, struct pollfd *pf);
/* When the next pending connection runs out of time (INT64_MAX: none pending). */
int64_t boot_gate_expiry(const struct boot_gate *g);
/* Acts on what poll said of the n entries boot_gate_poll wrote. Fails only when the listener
 * itself fails. */
reshard_status_t boot_gate_serve(struct boot_gate *g, const struct pollfd *pf, int n);
/* Sends an admission answering h (its slot and the rest in a), MACed. */
reshard_status_t boot_admit_send(struct boot *b, int fd, const char *addr,
                                 const struct boot_hello *h, const unsigned char *nonce_l,
                                 struct boot_admit *a);
/* Refuses what is still pending, with why, and says what it turned away. */
void boot_gate_close(struct boot_gate *g, const char *why);

/* ---- joining (boot_join.c) ---- */

/* Connects to a listener and proves this rank there: a join at rank 0 (kind BOOT_JOIN; the
 * first connection opens this rank's listener on the address it reaches rank 0 from, into
 * b->lfd) or an attach at its tree parent (BOOT_ATTACH, slot b->slot). Retries while the
 * listener is busy or drops it, until deadline. prompt: a listener that accepts and then is
 * silent, speaks something else, or closes without a word is not reshard's (fail at once). */
reshard_status_t boot_dial(struct boot *b, const union sock_addr *a, const char *who, int kind,
                           int prompt, int64_t deadline, int *fd, struct boot_admit *out);

#endif
