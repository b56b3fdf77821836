/* SPDX-License-Identifier: Apache-2.0 */
/* State shared by the parts of the plan builder (plan.c, plan_net.c); not used elsewhere. */
#ifndef RS_PLAN_BUILD_H
#define RS_PLAN_BUILD_H

#include "grid.h"
#include "plan.h"

/* One cell that must cross the network into one domain: the destination run of its tuple
 * that lives there, and the source tuple whose ranks (all in other domains) hold it. */
struct net_unit {
    int64_t bytes;
    uint32_t box;
    uint32_t tensor;
    int32_t src_tuple;
    int32_t run;
};

#define PLAN_NO_BOX UINT32_MAX

/* Tensors are planned one at a time (largest first), so the grid and the units of only one
 * tensor are alive; the loads carry over from tensor to tensor. */
struct build {
    struct rs_plan *plan;
    struct overlap ov;      /* of the tensor being planned */
    int64_t esize;          /* ... and the size of its elements */
    struct net_unit *units; /* ... and its network units */
    size_t nunits, units_cap;
    int64_t *net_out, *net_in, *local_out; /* bytes per rank so far */
    /* Tensors with a piece that a destination needs and only absent ranks held: the plan
     * goes on to find them all, then fails naming them. */
    int nlost;
    char lost[256];
};

/* Cuts the current tensor's units into per-rank slices, largest first, picks senders and
 * emits NET and FWD ops. */
reshard_status_t plan_assign_net(struct build *b);

#endif
