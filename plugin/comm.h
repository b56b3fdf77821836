/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A communicator: its bootstrap, its topology (domains by hostname unless told otherwise), the
 * network context between domains and what the local path needs of each peer (its pid).
 */
#ifndef RS_COMM_H
#define RS_COMM_H

#include "bootstrap.h"
#include "error.h"
#include "handles.h"
#include "tp.h"

#include <stdatomic.h>
#include <sys/types.h>

#define COMM_HOST_MAX 64

struct reshard_comm {
    int rank, size;
    struct boot *boot;
    struct reshard_topo topo;
    struct tp_ctx *net;
    pid_t *pid;           /* [size] */
    int *node;            /* [size]: hostname ids, dense in order of first appearance */
    uint32_t seq;         /* executions so far: every rank counts the same */
    atomic_int busy;      /* one execution at a time: the network context is single-threaded */
    atomic_int abort_req; /* reshard_comm_abort was called: the execution in flight stops */
    /* A failure while bytes were moving leaves messages and connections in an unknown state:
     * the communicator refuses further collectives until destroyed. */
    reshard_status_t broken;
    char broken_why[RS_ERROR_MAX];
    /* Staging slots for packed sends, shared by the plans (they run one at a time). */
    char *staging;
    void *staging_mh;
    int nslots, nfree, *free_slots;
    int64_t slot_bytes;
    uint64_t local_out, local_in, self; /* the local path's counters */
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
void comm_destroy(struct reshard_comm *c);
int comm_timeout_ms(void);
/* RESHARD_OK, or why the communicator can no longer be used (message recorded). */
/* Breaks the communicator for reshard_comm_abort (busy held) and tells the other ranks. */
void comm_abort_now(struct reshard_comm *c);
reshard_status_t comm_usable(const struct reshard_comm *c);
/* Keeps p until the network context closes, then frees it with free_fn. Returns 0 when that
 * cannot be arranged (no memory): p is then the caller's. */
int comm_keep(struct reshard_comm *c, void (*free_fn)(void *), void *p);
/* The same for a registration of the network context. */
int comm_keep_mh(struct reshard_comm *c, void *mh);
/* Staging slots of slot_bytes each, made (and registered) once. */
reshard_status_t comm_staging(struct reshard_comm *c, int64_t slot_bytes, int nslots);

#endif
