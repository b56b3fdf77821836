/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A communicator: its bootstrap, its topology (domains by hostname unless told otherwise), the
 * network context between domains and what the local path needs of each peer (its pid).
 */
#ifndef RS_COMM_H
#define RS_COMM_H

#include "bootstrap.h"
#include "handles.h"
#include "tp.h"

#include <sys/types.h>

#define COMM_HOST_MAX 64

struct reshard_comm {
    int rank, size;
    struct boot *boot;
    struct reshard_topo topo;
    struct tp_ctx *net;
    pid_t *pid;   /* [size] */
    int *node;    /* [size]: hostname ids, dense in order of first appearance */
    uint32_t seq; /* executions so far: every rank counts the same */
    uint64_t local_out, local_in, self; /* the local path's counters */
};

reshard_status_t comm_create(const struct boot_id *id, int rank, int size, int local_rank,
                             struct reshard_comm **out);
void comm_destroy(struct reshard_comm *c);
int comm_timeout_ms(void);

#endif
