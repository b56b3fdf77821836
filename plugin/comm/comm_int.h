/* SPDX-License-Identifier: Apache-2.0 */
/* What the communicator's life (comm.c) lends its shrink (comm_shrink.c). */
#ifndef RS_COMM_INT_H
#define RS_COMM_INT_H

#include "comm.h"

/* A communicator of `size` ranks, every one a member until the caller says otherwise; NULL
 * when out of memory. */
struct reshard_comm *comm_alloc(int rank, int size, int local_rank);
/* With the bootstrap up: the network context, then the exchange that forms the communicator
 * (its topology from the hellos, or parent's when not NULL). */
reshard_status_t comm_join(struct reshard_comm *c, const struct rs_topo *parent);

#endif
