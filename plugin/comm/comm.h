/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A communicator: its bootstrap, its topology (domains by hostname unless told otherwise), the
 * network context between domains and what the local path needs of each peer (its pid).
 */
#ifndef RS_COMM_H
#define RS_COMM_H

#include "base/error.h"
#include "plugin/handles.h"
#include "transport/boot/bootstrap.h"
#include "transport/tp.h"

#include <stdatomic.h>
#include <sys/types.h>

#define COMM_HOST_MAX 256

struct reshard_comm {
    int rank, size; /* ranks keep their numbers when the communicator shrinks */
    /* Members: all ranks, unless a shrink left some out (absent, marked in the topology).
     * The bootstrap numbers the members densely: boot_of[rank] (-1: absent), member[k]. */
    int nmembers;
    int *member, *boot_of;
    int local_rank;
    uint32_t shrinks; /* generations since the first communicator: salts the next id */
    /* Where each rank's bootstrap listener is (an id with no secret, never joined: names the
     * local path's sockets, comm_local.h), filled from the bootstrap once it formed. */
    struct boot_id spare;
    struct boot_id *spares; /* [size] */
    struct boot *boot;
    void *nccl; /* the NCCL communicator it was made from (reshard_comm_init_nccl), or NULL */
    /* Every execution runs the NCCL executor whatever RESHARD_EXECUTOR says: set by the M2N
     * API (plugin/m2n), whose callers expect NCCL's stream semantics. */
    int nccl_executor;
    struct reshard_topo topo;
    struct tp_ctx *net;
    /* A growth's members keep their network context (connections, registrations) in the
     * communicator it makes: how many communicators hold net; the last one to go closes it. */
    atomic_int *net_refs;
    /* The epoch a successful growth made from this communicator (0: none). Its network context
     * now serves that one, so this one may only be destroyed, which neither waits for the
     * others nor closes what the grown one holds. */
    uint32_t grown_into;
    /* The process that made it: a child forked from that one may not use it (its transport
     * context, connections and bootstrap are the parent's), only destroy it, which leaves
     * them to the parent. */
    pid_t owner;
    pid_t *pid; /* [size]: verified pids of the peers this rank may write, else 0 */
    int *pidfd; /* [size]: a pidfd on each of those processes (cma_hold), else -1 */
    int *node;  /* [size]: hostname ids, dense in order of first appearance */
    /* Every member's hello record as the exchange left it (comm_int.h): size records of
     * hello_rec bytes each (an absent rank's zeros). A growth sends the joiners the members'
     * records from here, and only the joiners' records cross to the members. */
    unsigned char *hellos;
    size_t hello_rec;
    uint32_t seq;         /* executions so far: every rank counts the same */
    atomic_int busy;      /* one execution at a time: the network context is single-threaded */
    atomic_int abort_req; /* reshard_comm_abort was called: the execution in flight stops */
    /* References: the caller's handle, each plan made on the communicator, each public call
     * in flight on it. The last comm_release tears it down, so a communicator destroyed under
     * live plans (or during a call from another thread) closes its connections only when they
     * are gone. destroyed: reshard_comm_destroy was called; nothing new may start. */
    atomic_int refs;
    atomic_int destroyed;
    struct live_handle live; /* linked while the caller holds it (api_guard.c) */
    /* A failure while bytes were moving leaves messages and connections in an unknown state:
     * the communicator refuses further collectives until destroyed. */
    reshard_status_t broken;
    char broken_why[RS_ERROR_MAX];
    /* Staging slots for packed sends, shared by the plans (they run one at a time). */
    char *staging;
    void *staging_mh;
    int nslots, nfree, *free_slots;
    int64_t slot_bytes;
    uint64_t local_out, local_in, self;     /* the local path's counters */
    uint64_t ipc_out;                       /* of local_out: written through CUDA IPC */
    uint64_t gdr_out, gdr_in;               /* of the network's: from / into device memory */
    uint64_t ctrl_bytes_out, ctrl_bytes_in; /* payload of the executor's control messages */
    struct cuda_ipc *ipc;     /* peers' device buffers mapped here; made on first use */
    struct comm_local *local; /* the local peers' verification (comm_local.h) */
    /* State of failed executions that transport requests still point into: freed once the
     * network context is closed (which completes those requests). */
    struct comm_kept {
        void (*free)(void *p);
        void *p;
    } * kept;
    int nkept;
    void **kept_mh; /* their registrations, released once the connections are closed */
    int nkept_mh;
};

reshard_status_t comm_create(const struct boot_id *id, int rank, int size, int local_rank,
                             struct reshard_comm **out);
/* On the ranks of an NCCL communicator: rank 0's id through one ncclAllGather. */
reshard_status_t comm_create_nccl(void *nccl_comm, struct reshard_comm **out);
/* Collective over the ranks of c not in exclude[n]: a communicator of those ranks, with their
 * numbers, c's topology (the others absent) and a new bootstrap and network context, met at
 * the listener the lowest remaining rank has held since c formed. c may have failed; it stays
 * as it is. */
reshard_status_t comm_shrink(struct reshard_comm *c, const int *exclude, int n,
                             struct reshard_comm **out);
/* Growth: joiners take numbers of absent ranks, or numbers at most this far past the size. */
#define COMM_GROW_MAX 65536
/* Collective over c's members (c healthy): a communicator of c's members and the joiners
 * (joiners[n], each the number of an absent rank or one past c's size; the size grows to the
 * largest plus one), of the next membership epoch, with a new bootstrap. The members keep c's
 * network context (connections to each other and registrations stay; only the joiners are new
 * peers) and c becomes grown_into: it may only be destroyed, before or after the new one.
 * The members first agree on the list over c's bootstrap (RESHARD_ERR_INVALID_ARG on every
 * member naming two that differ, c unchanged); the joiners then meet them at the listener c's
 * lowest member holds, under c's secret salted with the growth. */
reshard_status_t comm_grow(struct reshard_comm *c, const int *joiners, int n,
                           struct reshard_comm **out);
/* Not collective, on any member: the id the joiners pass to comm_join_grown (where to meet,
 * the secret, the new size and epoch and a hash of the list). */
reshard_status_t comm_grow_id(struct reshard_comm *c, const int *joiners, int n,
                              struct boot_id *out);
/* A joiner (rank, one of joiners[n]): joins the communicator the members' comm_grow makes. */
reshard_status_t comm_join_grown(const struct boot_id *join_id, int rank, const int *joiners, int n,
                                 struct reshard_comm **out);
/* Whether this rank may write host memory of local peer `rank` (cross-memory attach): the
 * kernel named that process over a Unix socket, and it lets this rank write it
 * (comm_local.h). Where it may not, local transfers to it go over the network transport. */
static inline int comm_local_ok(const struct reshard_comm *c, int rank)
{
    return c->pid[rank] > 0;
}
static inline int comm_has(const struct reshard_comm *c, int rank)
{
    return c->boot_of[rank] >= 0;
}
/* boot_allgather over the members: buf holds size slots of `bytes`, this rank's filled; on
 * return every member's is, and an absent rank's is zeros. */
reshard_status_t comm_allgather(struct reshard_comm *c, void *buf, size_t bytes);
/* Tears c down now, whoever else holds it: for a communicator nobody was given yet (its own
 * failed construction) and for the last comm_release. */
void comm_destroy(struct reshard_comm *c);
/* Takes a reference (comm_alloc gives the first, the caller's); the last comm_release tears the
 * communicator down: collective then, as reshard_comm_destroy says. */
void comm_hold(struct reshard_comm *c);
void comm_release(struct reshard_comm *c);
/* reshard_comm_destroy: marks c destroyed and gives the caller's reference up. A second call
 * on a communicator still held (by a plan) is ignored, said at INFO. */
void comm_close(struct reshard_comm *c);
int comm_timeout_ms(void);
/* Breaks the communicator for reshard_comm_abort (busy held) and tells the other ranks. */
void comm_abort_now(struct reshard_comm *c);
/* reshard_comm_leave (busy held): breaks c here, without waiting for anyone, and tells the
 * others that this rank left on purpose. */
void comm_depart(struct reshard_comm *c);
/* The rank heard to leave c on purpose, or -1, having looked (without waiting) at what the
 * bootstrap's connections hold (busy held). */
int comm_left(struct reshard_comm *c);
/* RESHARD_OK, or why the communicator can no longer be used (message recorded): it was
 * destroyed (RESHARD_ERR_INVALID_ARG), or failed earlier (the failure's status). */
reshard_status_t comm_usable(const struct reshard_comm *c);
/* RESHARD_OK in the process that made c; in a child forked from it, an error saying so (what
 * comm_usable says first, and what shrink, which serves broken communicators, checks). */
reshard_status_t comm_owned(const struct reshard_comm *c);
/* Around every collective on the bootstrap: one at a time (RESHARD_ERR_BUSY otherwise), so that
 * an abort from another thread only raises the flag the collective watches; comm_leave then
 * marks the communicator aborted when that ended it. comm_enter fails when it is unusable. */
reshard_status_t comm_enter(struct reshard_comm *c);
reshard_status_t comm_leave(struct reshard_comm *c, reshard_status_t st);
/* Keeps p until the network context closes, then frees it with free_fn. Returns 0 when that
 * cannot be arranged (no memory): p is then the caller's. */
int comm_keep(struct reshard_comm *c, void (*free_fn)(void *), void *p);
/* The same for a registration of the network context. */
int comm_keep_mh(struct reshard_comm *c, void *mh);
/* Staging slots of slot_bytes each, made (and registered) once. */
reshard_status_t comm_staging(struct reshard_comm *c, int64_t slot_bytes, int nslots);

#endif
