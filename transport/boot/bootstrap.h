/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The bootstrap of a communicator: a TCP rendezvous at rank 0 that places every rank in a tree,
 * and the few small collectives (allgather, bcast, allreduce, barrier) that the communicator
 * needs before its transports are up, run over that tree. Rank 0 listens; every other rank
 * connects and proves it belongs to the job by a MAC under the id's secret over nonces of both
 * ends (and checks rank 0's in turn), then attaches to its tree parent. Once formed, a rank
 * holds a connection to its parent and to each of its children (RESHARD_BOOT_FANOUT, 8) and
 * its own listener. Every wait is bounded by the timeout given to boot_init, and every failure
 * names the rank it concerns. The tunables RESHARD_BOOT_ADDR, RESHARD_BOOT_PORT,
 * RESHARD_SECRET and RESHARD_SECRET_FILE (base/param.h) say where ids listen and what secret an
 * environment launch uses.
 */
#ifndef RS_BOOTSTRAP_H
#define RS_BOOTSTRAP_H

#include "base/reshard_status.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* ---- ids ---- */

#define BOOT_ID_BYTES 128
/* opaque: magic, IPv4/IPv6 sockaddr of rank 0, 32-byte secret, flags */
struct boot_id {
    unsigned char bytes[BOOT_ID_BYTES];
};

/* Makes an id: opens a listening TCP socket (address: RESHARD_BOOT_ADDR if set, else the first
 * non-loopback IPv4 of the host, else 127.0.0.1; port: RESHARD_BOOT_PORT, 0 = any) and keeps it in
 * a process-wide registry keyed by the id, so that boot_init(rank 0) in this process, or in a child
 * forked after this call, uses it. The secret comes from getrandom(). */
reshard_status_t boot_id_create(struct boot_id *id);
/* Forgets the listening socket of an id made here (closes this process's copy): for a parent
 * that forked its ranks. boot_init(rank 0) releases it by itself. No-op for other ids. */
void boot_id_release(const struct boot_id *id);
/* Builds an id from host:port and a secret string (through HMAC-SHA256 to 32 bytes). Does not
 * listen. */
reshard_status_t boot_id_from_addr(const char *host, int port, const char *secret,
                                   struct boot_id *id);
/* "10.0.0.1:29501": where rank 0 of this id listens, for messages and logs. */
const char *boot_id_addr(const struct boot_id *id, char *buf, size_t n);

/* ---- launcher environment ---- */

/* torchrun (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE), else Open
 * MPI (OMPI_COMM_WORLD_RANK/_SIZE/_LOCAL_RANK/_LOCAL_SIZE), else Slurm (SLURM_PROCID,
 * SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE or the first number of
 * SLURM_STEP_TASKS_PER_NODE). MASTER_ADDR and MASTER_PORT are needed in every case, except that
 * under Slurm they default to the first host of SLURM_STEP_NODELIST (or SLURM_JOB_NODELIST) and
 * 29500. Rank 0 listens on MASTER_PORT+1 unless RESHARD_BOOT_PORT is set: that port must be
 * free on rank 0's host (rank 0 fails at once otherwise, and the others within about a second).
 * The secret is RESHARD_SECRET, else the contents of RESHARD_SECRET_FILE, else one derived from
 * the job's identity, which anyone can compute (logged once as a warning). local_rank and
 * local_size are -1 when the launcher does not give them. */
struct boot_env {
    int rank, size, local_rank, local_size;
    struct boot_id id;
};
reshard_status_t boot_env_read(struct boot_env *env);

/* ---- the bootstrap itself ---- */

struct boot; /* opaque */

/* Collective over size ranks: rank 0 admits size-1 peers that prove they hold the id's secret,
 * refusing others (RESHARD_ERR_REFUSED at the refused peer); returns once every rank has
 * arrived and the tree is whole. On timeout rank 0 fails with RESHARD_ERR_TIMEOUT naming the
 * missing ranks and tells the others, which fail with RESHARD_ERR_REMOTE carrying its message.
 * A peer that cannot reach rank 0 fails with RESHARD_ERR_TIMEOUT naming its address; one that
 * finds another program at a launcher id's port fails within about a second saying so. A peer
 * waits for rank 0's verdict up to a quarter of timeout_ms (at most 2 s) longer than rank 0
 * waits for it, so that it hears why. Needs libcrypto (boot_crypto.h) when size > 1. */
reshard_status_t boot_init(const struct boot_id *id, int rank, int size, int timeout_ms,
                           struct boot **out);
/* buf holds size*bytes; this rank's slot (rank*bytes) is filled by the caller; on return all
 * slots are filled. Each collective is bounded by the timeout given to boot_init; a failure
 * names the peer (rank and address). After a failure the bootstrap is unusable: later calls
 * fail at once, and the other ranks are told (best effort) so they fail fast too. */
/* The same, with label[r] (copied) the number rank r goes by in messages, timeouts and failure
 * reports (NULL: r): for a bootstrap over a subset of another job's ranks. */
reshard_status_t boot_init_labeled(const struct boot_id *id, int rank, int size, const int *label,
                                   int timeout_ms, struct boot **out);
/* The same for a growth: ranks below `members` are the members (the rest join them), each rank
 * of `from` (the members' bootstrap, required on a member, ignored on a joiner) the same rank
 * here. Every rank's tree slot is its rank, under from's fan-out: a member keeps its listener
 * (a dup of from's) and attaches at its tree parent, only the joiners meet rank 0, so rank 0's
 * part grows with the joiners and its fan-out, not with the members. Rank 0 acts on a joiner's
 * decline (boot_decline) once every member is in the tree, so that each hears it;
 * boot_init_labeled acts on one at once. from is only read: on failure it is as it was. */
reshard_status_t boot_init_grow(const struct boot_id *id, int rank, int size, const int *label,
                                int members, const struct boot *from, int timeout_ms,
                                struct boot **out);
/* A rank that was handed an id but will not join, because what it was told differs from what the
 * id says, tells the id's rank 0 why (boot_decline), proving that it holds the id's secret: rank
 * 0's rendezvous then fails at once with RESHARD_ERR_INVALID_ARG, in words of its own naming the
 * number the rank claims and the reason, and tells the others (RESHARD_ERR_REMOTE), instead of
 * timing out on it. Nobody without the secret can stop a rendezvous this way, nor choose the
 * words: a reason is one of these codes. */
enum boot_decline_reason {
    BOOT_DECLINE_LIST = 1,       /* its list of joiners differs from the one the id was made for */
    BOOT_DECLINE_NOT_LISTED = 2, /* the number it claims is not among them */
    BOOT_DECLINE_COUNT = 3,      /* it was passed another number of joiners */
};
/* Returns RESHARD_OK once rank 0 answered that it heard it (an admission MACed under the secret;
 * waiting for rank 0 to serve its listener at most timeout_ms), else why not (a rank 0 that
 * does not hold the secret refuses it: RESHARD_ERR_REFUSED). size: the size the id's bootstrap
 * has; rank: the number claimed. */
reshard_status_t boot_decline(const struct boot_id *id, int size, int rank,
                              enum boot_decline_reason reason, int timeout_ms);
/* The numbers ranks go by from now on (label[size], copied): for a rank that learnt them only
 * once the bootstrap formed (a joiner). */
void boot_set_labels(struct boot *b, const int *label);
/* An id for a later bootstrap of some of b's ranks (a shrink) whose rank 0 is b's rank `root`,
 * at the listener root has held since it joined b. The secret is b's mixed with salt through
 * HMAC-SHA256, so that ranks with another view of the group (another salt) meet under another
 * secret and are refused. When root is this rank, its listener is registered for the new
 * bootstrap's rank 0, as boot_id_create does (boot_id_release forgets it). Needs no exchange:
 * b may have failed. */
reshard_status_t boot_group_id(const struct boot *b, int root, const void *salt, size_t n,
                               struct boot_id *out);
/* An id naming where rank `rank` of b listens, with no secret (zeros): a name for that
 * listener (the local path's sockets are named after it), never one to join with. */
reshard_status_t boot_listener_id(const struct boot *b, int rank, struct boot_id *out);
/* Random bytes from the kernel (getrandom). */
reshard_status_t boot_random(void *p, size_t n);
/* Collectives end with RESHARD_ERR_ABORTED (and tell the others) within milliseconds of *flag
 * turning non-zero, set from any thread: reshard_comm_abort during an exchange. */
void boot_set_cancel(struct boot *b, const atomic_int *flag);
reshard_status_t boot_allgather(struct boot *b, void *buf, size_t bytes);
reshard_status_t boot_bcast(struct boot *b, void *buf, size_t bytes, int root);
/* Folds every rank's buf (bytes each) into one value that every rank gets back in buf:
 * combine(acc, in, arg) merges in into acc, and must be associative and commutative (the
 * order of folding is the bootstrap's). For votes and sums of a few bytes per rank. */
typedef void (*boot_combine_fn)(void *acc, const void *in, void *arg);
reshard_status_t boot_allreduce(struct boot *b, void *buf, size_t bytes, boot_combine_fn combine,
                                void *arg);
reshard_status_t boot_barrier(struct boot *b);
/* A growth's bootstrap (boot_init_grow: ranks below `members` are members, the rest joiners):
 * bytes that every member holds in buf (the same on each) reach every joiner's buf. A joiner
 * takes them from its tree parent and every rank hands them to each child that is a joiner, so
 * no byte crosses an edge between two members: a member sends only to its joiner children (rank
 * 0 sends nothing when none of its children joins), and the cost at any member is O(joiners
 * among its children), not O(size). Every rank calls it (it counts as a collective); the
 * timeouts, failures and cancelling are the other collectives'. RESHARD_ERR_INVALID_ARG on a
 * bootstrap that is no growth's. */
reshard_status_t boot_push_joiners(struct boot *b, void *buf, size_t bytes);
/* After a local failure, tells the others (best effort) so they fail fast with
 * RESHARD_ERR_REMOTE instead of timing out: this rank tells its tree neighbours, and each rank
 * that hears passes it on to its other neighbours. Leaves this thread's error message as it
 * was. */
void boot_abort(struct boot *b, reshard_status_t st, const char *msg);
/* This rank leaves on purpose: tells the others (as boot_abort does, with RESHARD_ERR_LEFT), so
 * that their collectives, and boot_check, fail at once with RESHARD_ERR_REMOTE saying that it
 * left and remembering who (boot_left), never as a timeout. The bootstrap is unusable after. */
void boot_leave(struct boot *b);
/* The number (label) of the rank this rank heard leave on purpose, or -1: the first such, in a
 * report that ended a collective or that boot_check read. */
int boot_left(const struct boot *b);
/* Between collectives (while a plan executes): whether a rank reported a failure, or a tree
 * neighbour closed its connection (ranks leave through a barrier, or after a failure: it died).
 * Looks at what waits on this rank's few connections without taking anything but ERROR frames,
 * so frames of the next collective from ranks that are ahead stay for it. What it hears it
 * passes on to its other neighbours. RESHARD_ERR_REMOTE (the message names the rank and why)
 * once one did; never blocks longer than a frame takes to read. */
reshard_status_t boot_check(struct boot *b);
/* Bytes this rank sent and received in collectives so far (frame headers included): what the
 * control plane costs, for tools that report it. */
void boot_bytes(const struct boot *b, uint64_t *sent, uint64_t *received);
/* What a bootstrap holds and has cost, for measurement: its sockets (tree connections and its
 * listener), its place in the tree, and the bytes it moved forming the tree. */
struct boot_stats {
    int sockets, children, depth, tree_height;
    uint64_t form_sent, form_received;
};
void boot_stats(const struct boot *b, struct boot_stats *out);
/* "10.0.0.1:43127": where rank `rank` of b listens (for a later bootstrap), or "" if unknown. */
const char *boot_listener_addr(const struct boot *b, int rank, char *buf, size_t n);
int boot_rank(const struct boot *b);
int boot_size(const struct boot *b);
/* Rank 0: the last refusal during the rendezvous ("" when none), also logged as a warning. */
const char *boot_refusal(const struct boot *b);
void boot_close(struct boot *b);

#endif
