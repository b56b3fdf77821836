/* SPDX-License-Identifier: Apache-2.0 */
/* State shared by the parts of the plan builder (plan.c, plan_net.c); not used elsewhere. */
#ifndef RS_PLAN_BUILD_H
#define RS_PLAN_BUILD_H

#include "grid.h"
#include "plan.h"

struct tensor_work {
    struct rs_grid grid;
    struct tuple_domains src_td, dst_td;
    int64_t esize;
};

/* One cell that must cross the network into one domain: the destination run of its tuple
 * that lives there, and the source tuple whose ranks (all in other domains) hold it. */
struct net_unit {
    int64_t bytes;
    uint64_t box;
    uint32_t tensor;
    int32_t src_tuple;
    int32_t run;
};

struct build {
    struct rs_plan *plan;
    struct tensor_work *work;
    struct net_unit *units;
    size_t nunits, units_cap;
    int64_t *net_out, *net_in, *local_out; /* bytes per rank so far */
};

/* Cuts every unit into per-rank slices, picks senders, emits NET and FWD ops. */
reshard_status_t plan_assign_net(struct build *b);

#endif
