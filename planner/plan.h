/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A plan: the ops that move every tensor of a reshard from its source layout to its
 * destination layout on a topology (docs/architecture.md, "The planner").
 *
 * One rule decides every op from the layouts and the topology alone (no running loads), so a
 * plan can be built at two scopes that agree op for op: the whole world's (every op, what
 * reshard-plan reports and validates) and one rank's (only the ops that rank sends, receives
 * or forwards, what a communicator plan holds: its cost does not grow with the world). The
 * hash covers the plan's inputs and the rule's version, so ranks that agree on it plan alike.
 *
 * Op kinds, all writing a box of one tensor into the destination shard of `dst`:
 *   SELF  src == dst holds the box in its source shard (a copy inside one process);
 *   LOCAL src holds it in its source shard and shares dst's domain (local path);
 *   NET   src holds it in its source shard, in another domain (the network);
 *   FWD   src received it by NET op `parent` and forwards it inside its domain (local path).
 */
#ifndef RS_PLAN_H
#define RS_PLAN_H

#include "boxes.h"
#include "dtype.h"
#include "layout.h"
#include "quant.h"
#include "topo.h"

#include <stddef.h>
#include <stdint.h>

enum plan_op_kind { PLAN_OP_SELF, PLAN_OP_LOCAL, PLAN_OP_NET, PLAN_OP_FWD };

#define PLAN_NO_PARENT UINT32_MAX

/* 20 bytes: a plan of a large model holds millions, and writing them is most of the time it
 * takes to plan one; the byte count follows from the box (plan_op_bytes). */
struct plan_op {
    uint32_t box; /* plan->boxes.coords[box ..]: start[ndim], then len[ndim] */
    uint32_t tensor : 29;
    uint32_t at_src : 1; /* a CAST tensor's box, quantized by the sender: its bytes are FP8 */
    uint32_t kind : 2;
    /* FWD: index of the NET op that delivered the box to src; in a rank's plan, PLAN_NO_PARENT
     * when that op is not the rank's own (the rank receives the forward) */
    uint32_t parent;
    int32_t src, dst;
};

#define PLAN_MAX_TENSORS (1 << 29) /* the width of plan_op.tensor */

struct plan_side;

/* The layouts, maps and tuple domains of a tensor live in the plan's cache, shared by every
 * tensor of equal layout (a whole model repeats a few layouts over thousands of tensors), and
 * equal rank lists are stored once: a plan of a model on 8,192 ranks holds each list once, not
 * once per tensor. */
struct plan_tensor {
    char *name;                          /* owned */
    enum plan_quant_mode quant;          /* of a weight with a quantized destination */
    int scales, scales_of;               /* its scales tensor / a scales tensor's weight, or -1 */
    struct rs_layout src, dst;           /* copies whose rank lists are the cache's */
    struct rs_shardmap src_map, dst_map; /* copies of the cache's */
    struct plan_side *src_side, *dst_side;
};

struct plan_opts { /* a field <= 0 takes its default */
    /* A network slice held by several source replicas is split among them when each part
     * keeps at least this many bytes. */
    int64_t split_min_bytes;
    /* A plan needing more ops is refused up front (RESHARD_ERR_TOO_LARGE) rather than
     * exhausting memory: 20 bytes each, and a box. */
    int64_t max_ops;
};

#define PLAN_SPLIT_MIN_DEFAULT (INT64_C(1) << 20)
#define PLAN_MAX_SPLIT         64                 /* senders sharing one slice, at most */
#define PLAN_MAX_OPS_DEFAULT   (INT64_C(1) << 27) /* 2.5 GiB of ops */

struct plan_input {
    const char *name; /* may be NULL */
    const struct rs_layout *src, *dst;
    /* A quantized destination's scales tensor (NULL: the name with ".weight" made
     * ".weight_scale_inv", as vLLM names them, else with ".scale" appended). */
    const char *scales_name;
};

#define PLAN_ALL_RANKS (-1)

struct plan_cache;
struct tuple_domains;

struct rs_plan {
    /* tensors[0 .. ninputs) are the caller's, in order; the scales tensors of the quantized ones
     * follow, in the order of their weights. */
    int ntensors, ninputs;
    struct plan_tensor *tensors;
    struct rs_topo topo;
    struct plan_opts opts;
    int scope; /* PLAN_ALL_RANKS, or the rank whose ops alone the plan holds */
    struct plan_op *ops;
    size_t nops, ops_cap;
    struct rs_boxes boxes;
    struct plan_cache *cache;
    uint64_t hash;  /* of the inputs and the rule: equal on every rank that plans alike */
    double plan_ms; /* wall time of plan_build */
};

/* Checks the inputs (matching shape and dtype, ranks inside the topology) and plans every
 * rank's ops (scope PLAN_ALL_RANKS) or only rank `scope`'s: the ops it sends, receives or
 * forwards, in time and memory that depend on its own ops and the tensors, not on the world. */
reshard_status_t plan_build(const struct plan_input *in, int ntensors, const struct rs_topo *topo,
                            const struct plan_opts *opts, int scope, struct rs_plan **out);
void plan_free(struct rs_plan *plan);
/* The caller's inputs again (ninputs of them, scales names included), to plan the same tensors
 * on another topology or scope; in borrows the plan's layouts. */
void plan_inputs_of(const struct rs_plan *p, struct plan_input *in);
/* The catch-up plan of ranks that joined (joiners[n], present ranks of refit's topology, which
 * hold no version of any weight) at scope `scope`: the same tensors as refit, each joiner's
 * destination shards written from replicas that hold them (refit's other destination ranks,
 * those in its own domain first) when every joiner's shard of the tensor has one, else from
 * refit's sources. The joiners are off as sources, every other rank off as a destination
 * (plan_catchup.c). *from_dst[t] (refit->ntensors entries, the caller frees it) is 1 where
 * tensor t's sources are the destination replicas: their source buffers are the destination
 * buffers the refit writes. */
reshard_status_t plan_catch_up(const struct rs_plan *refit, const int *joiners, int n, int scope,
                               struct rs_plan **out, unsigned char **from_dst);
/* A tensor's overlap grid (for a tensor quantized on the way, cut at its blocks). */
reshard_status_t plan_tensor_grid(const struct plan_tensor *pt, struct rs_grid *g);
/* The tuple domains of a tensor's side (built once per distinct layout and kept). */
reshard_status_t plan_tensor_tdoms(struct rs_plan *p, int t, const struct tuple_domains **src,
                                   const struct tuple_domains **dst);

static inline const int64_t *plan_op_start(const struct rs_plan *p, const struct plan_op *op)
{
    return p->boxes.coords + op->box;
}

static inline const int64_t *plan_op_len(const struct rs_plan *p, const struct plan_op *op)
{
    return p->boxes.coords + op->box + p->tensors[op->tensor].dst.ndim;
}

/* The bytes an op moves: in the destination dtype, or the source's for a box of a tensor quantized
 * at its destination. */
static inline int64_t plan_op_bytes(const struct rs_plan *p, const struct plan_op *op)
{
    const struct plan_tensor *t = &p->tensors[op->tensor];
    const struct rs_layout *l = &t->dst;
    const int64_t *len = p->boxes.coords + op->box + l->ndim;
    /* a CAST tensor's box travels in the source dtype unless its sender quantizes it */
    int64_t v =
        (int64_t)dtype_size(t->quant == PLAN_QUANT_CAST && !op->at_src ? t->src.dtype : l->dtype);
    for (int d = 0; d < l->ndim; d++)
        v *= len[d];
    return v;
}

const char *plan_op_kind_name(enum plan_op_kind k);

#endif
