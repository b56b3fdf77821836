/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Plan statistics (docs/figures.md). The byte counts of the ops come from the plan; the bounds
 * (min_net_bytes, lb_nic_bytes) and the gather-and-broadcast baseline come from the layouts and
 * the topology alone, so the plan can be judged against them.
 */
#ifndef RS_STATS_H
#define RS_STATS_H

#include "grid.h"
#include "plan.h"

struct plan_rank_stats {
    int64_t net_out, net_in;     /* over the network */
    int64_t local_out, local_in; /* over the local path (LOCAL and FWD) */
    int64_t self;                /* copied inside the rank */
    int64_t snapshot;            /* sent over the network from its sources, unquantized */
};

struct plan_stats {
    int64_t net_bytes, local_bytes, self_bytes;
    int64_t max_nic_bytes;
    int max_nic_rank; /* -1 when nothing crosses the network */
    int64_t min_net_bytes, gather_bcast_bytes, lb_nic_bytes;
    size_t nops[4]; /* by enum plan_op_kind */
    /* FP8 bytes written into the destinations of tensors quantized on the way, and of them those
     * their senders quantized (the rest landed in the source dtype, quantized where they landed) */
    int64_t quant_bytes, quant_at_src_bytes;
};

/* per_rank may be NULL; else it has topo.nranks entries. */
reshard_status_t plan_stats_compute(const struct rs_plan *p, struct plan_stats *s,
                                    struct plan_rank_stats *per_rank);

/* What cell c of pt costs crossing into one domain (a quantized destination's cells cost FP8
 * plus their scales where the source quantizes them, else the source dtype). */
int64_t plan_cell_bytes(const struct plan_tensor *pt, const struct rs_grid *g,
                        const struct grid_cursor *c);

/* One rank's part of the layout bounds, in time and memory of its domain's share (for a
 * communicator, whose ranks hold their own plans and sum these):
 *   in_domain   when the rank is its domain's lowest present rank: the bytes that must enter
 *               the domain (its in(D)), and dst_ranks the domain's destination ranks; else 0
 *   forced      the bytes only this rank holds, times the other domains that need them
 * Summed over ranks, in_domain is min_net_bytes; lb_nic_bytes is the largest, over ranks, of
 * ceil(in_domain / dst_ranks) and of forced. */
struct plan_rank_bounds {
    int64_t in_domain, forced;
    int dst_ranks;
};
reshard_status_t plan_rank_bounds(struct rs_plan *p, int rank, struct plan_rank_bounds *out);

#endif
