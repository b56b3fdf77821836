/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A plan: the ops that move every tensor of a reshard from its source layout to its
 * destination layout on a topology (DESIGN.md section 5). Every rank builds the same plan from
 * the same inputs; the hash lets ranks prove it before any byte moves.
 *
 * Op kinds, all writing a box of one tensor into the destination shard of `dst`:
 *   SELF  src == dst holds the box in its source shard (a copy inside one process);
 *   LOCAL src holds it in its source shard and shares dst's domain (local path);
 *   NET   src holds it in its source shard, in another domain (the network);
 *   FWD   src received it by NET op `parent` and forwards it inside its domain (local path).
 */
#ifndef RS_PLAN_H
#define RS_PLAN_H

#include "dtype.h"
#include "layout.h"
#include "topo.h"

#include <stddef.h>
#include <stdint.h>

enum plan_op_kind { PLAN_OP_SELF, PLAN_OP_LOCAL, PLAN_OP_NET, PLAN_OP_FWD };

#define PLAN_NO_PARENT UINT32_MAX

/* 20 bytes: a plan of a large model holds millions, and writing them is most of the time it
 * takes to plan one; the byte count follows from the box (plan_op_bytes). */
struct plan_op {
    uint32_t box; /* plan->coords[box ..]: start[ndim], then len[ndim] */
    uint32_t tensor : 30;
    uint32_t kind : 2;
    uint32_t parent; /* FWD: index of the NET op that delivered the box */
    int32_t src, dst;
};

#define PLAN_MAX_TENSORS (1 << 30) /* the width of plan_op.tensor */

struct plan_tensor {
    char *name;                /* owned */
    struct rs_layout src, dst; /* owned copies */
    /* A map equal to an earlier tensor's is that tensor's (shared: not freed here), since
     * whole models repeat a few layouts over thousands of tensors. */
    struct rs_shardmap src_map, dst_map;
    uint8_t src_shared, dst_shared;
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
};

struct rs_plan {
    int ntensors;
    struct plan_tensor *tensors;
    struct rs_topo topo;
    struct plan_opts opts;
    struct plan_op *ops;
    size_t nops, ops_cap;
    int64_t *coords;
    size_t ncoords, coords_cap;
    uint64_t hash;
    double plan_ms; /* wall time of plan_build */
};

/* Checks the inputs (matching shape and dtype, ranks inside the topology) and plans. */
reshard_status_t plan_build(const struct plan_input *in, int ntensors, const struct rs_topo *topo,
                            const struct plan_opts *opts, struct rs_plan **out);
void plan_free(struct rs_plan *plan);

static inline const int64_t *plan_op_start(const struct rs_plan *p, const struct plan_op *op)
{
    return p->coords + op->box;
}

static inline const int64_t *plan_op_len(const struct rs_plan *p, const struct plan_op *op)
{
    return p->coords + op->box + p->tensors[op->tensor].dst.ndim;
}

/* The bytes an op moves, in the destination dtype. */
static inline int64_t plan_op_bytes(const struct rs_plan *p, const struct plan_op *op)
{
    const struct rs_layout *l = &p->tensors[op->tensor].dst;
    const int64_t *len = p->coords + op->box + l->ndim;
    int64_t v = (int64_t)dtype_size(l->dtype);
    for (int d = 0; d < l->ndim; d++)
        v *= len[d];
    return v;
}

const char *plan_op_kind_name(enum plan_op_kind k);

/* ---- used by the builder's parts (plan.c, plan_net.c) ---- */

/* Appends a box; *box is its index in coords. */
reshard_status_t plan_push_box(struct rs_plan *p, int ndim, const int64_t *start,
                               const int64_t *len, uint32_t *box);
reshard_status_t plan_push_op(struct rs_plan *p, enum plan_op_kind kind, uint32_t tensor, int src,
                              int dst, uint32_t box, uint32_t parent);

#endif
