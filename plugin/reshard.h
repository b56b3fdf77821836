/* SPDX-License-Identifier: Apache-2.0 */
/*
 * reshard: move a distributed tensor (or a whole model) from one sharded layout to another,
 * sending only what each destination lacks and each element over the network at most once
 * per NVLink domain.
 *
 * This release plans: it parses layouts, builds a plan for a topology, validates it and reports
 * its statistics. Conventions: functions return reshard_status_t; output arguments come last
 * and are written only on success; after a failure reshard_last_error() holds a one-line
 * message for the calling thread. Every function is thread-safe on distinct objects; plans,
 * layouts and topologies are immutable once created and may be read from several threads.
 */
#ifndef RESHARD_H
#define RESHARD_H

#include "reshard_status.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RESHARD_API __attribute__((visibility("default")))

#define RESHARD_VERSION_MAJOR 0
#define RESHARD_VERSION_MINOR 1
#define RESHARD_VERSION_PATCH 0

/* ---- errors and configuration ---- */

/* The fixed message of a status ("malformed layout spec"). */
RESHARD_API const char *reshard_strerror(reshard_status_t status);
/* The calling thread's message for its last failed call ("place: expected R, S(d) or SS(d,k)
 * at column 31"); "" when none. Valid until the thread's next failing call. */
RESHARD_API const char *reshard_last_error(void);
/* Prints every tunable (RESHARD_* environment variables): name, value, where the value came
 * from (default or environment) and its meaning. */
RESHARD_API void reshard_config_print(FILE *out);

/* ---- layouts ---- */

typedef struct reshard_layout reshard_layout_t;

/* Parses a layout spec (DESIGN.md section 4), e.g.
 *   "shape=7168x2048 dtype=bf16 ranks=0-7,16-23 mesh=2x8 place=R,S(1)"
 * shape is required; dtype defaults to bf16; ranks to 0..world_size-1 (or 0..mesh size-1 when
 * mesh is given); mesh to 1-D over the ranks; place to R on every mesh dim. world_size may be
 * 0 when the spec names its ranks or mesh. Errors: RESHARD_ERR_SPEC_SYNTAX, _MESH_SIZE,
 * _SHARD_DIM, _NOT_DIVISIBLE, _RANK_RANGE, _VIEW, _TOO_LARGE; the message names the item and
 * the column. */
RESHARD_API reshard_status_t reshard_layout_parse(const char *spec, int world_size,
                                                  reshard_layout_t **layout);
/* Writes the canonical spec (snprintf semantics); returns the length it needs. */
RESHARD_API size_t reshard_layout_format(const reshard_layout_t *layout, char *buf, size_t size);
RESHARD_API void reshard_layout_destroy(reshard_layout_t *layout);

typedef struct reshard_layout_info {
    int ndim;
    int64_t shape[8];
    size_t elem_size; /* bytes of one element */
    int nranks;       /* ranks holding a shard (replicas included) */
    int max_rank;     /* the highest global rank of the layout */
} reshard_layout_info_t;

RESHARD_API reshard_status_t reshard_layout_info(const reshard_layout_t *layout,
                                                 reshard_layout_info_t *info);

/* ---- topology ---- */

typedef struct reshard_topo reshard_topo_t;

/* The NVLink domain of each of world_size ranks: domain_of[r] (any non-negative ids) when
 * domain_of is not NULL, else consecutive blocks of domain_size ranks. */
RESHARD_API reshard_status_t reshard_topo_create(int world_size, int domain_size,
                                                 const int *domain_of, reshard_topo_t **topo);
RESHARD_API void reshard_topo_destroy(reshard_topo_t *topo);

/* ---- plans ---- */

typedef struct reshard_plan reshard_plan_t;

typedef struct reshard_tensor {
    const char *name; /* NULL: "t<index>" */
    const reshard_layout_t *src;
    const reshard_layout_t *dst;
} reshard_tensor_t;

typedef struct reshard_plan_config {
    size_t size; /* sizeof(reshard_plan_config_t), for compatibility */
    /* A network slice held by several source replicas is split among them when each part
     * keeps at least this many bytes; <= 0 takes RESHARD_PLAN_SPLIT_MIN_BYTES. */
    int64_t split_min_bytes;
    /* A plan needing more transfers is refused up front with RESHARD_ERR_TOO_LARGE instead of
     * exhausting memory (32 bytes each); <= 0 takes RESHARD_PLAN_MAX_OPS. */
    int64_t max_ops;
} reshard_plan_config_t;

/* clang-format off */
#define RESHARD_PLAN_CONFIG_INIT {sizeof(reshard_plan_config_t), 0, 0}
/* clang-format on */

/* Plans all tensors together (loads balance across them). Source and destination of a tensor
 * must agree in shape and dtype (RESHARD_ERR_MISMATCH) and use ranks below the topology's world
 * size (RESHARD_ERR_RANK_RANGE). The layouts and topology may be destroyed afterwards.
 * config may be NULL. */
RESHARD_API reshard_status_t reshard_plan_create(const reshard_tensor_t *tensors, int ntensors,
                                                 const reshard_topo_t *topo,
                                                 const reshard_plan_config_t *config,
                                                 reshard_plan_t **plan);
/* Proves the plan: every destination element written exactly once, from a rank that holds
 * it, crossing into each domain at most once. RESHARD_ERR_INVALID_PLAN otherwise. */
RESHARD_API reshard_status_t reshard_plan_validate(const reshard_plan_t *plan);
/* A hash of the plan; ranks compare it before moving data. */
RESHARD_API uint64_t reshard_plan_hash(const reshard_plan_t *plan);
RESHARD_API void reshard_plan_destroy(reshard_plan_t *plan);

/* Byte counts are in the destination dtype. Definitions in DESIGN.md section 5. */
typedef struct reshard_plan_stats {
    uint64_t net_bytes;          /* over the network, all ranks */
    uint64_t min_net_bytes;      /* what must cross: from the layouts, not the plan */
    uint64_t gather_bcast_bytes; /* what gather-to-one then ring broadcast would send */
    uint64_t local_bytes;        /* over the local path (CUDA IPC / CMA) */
    uint64_t self_bytes;         /* copied inside one rank */
    uint64_t max_nic_bytes;      /* busiest NIC: max over ranks of max(sent, received) */
    uint64_t lb_nic_bytes;       /* lower bound on max_nic_bytes */
    int max_nic_rank;            /* -1 when nothing crosses the network */
    uint64_t net_ops, local_ops, fwd_ops, self_ops;
    double plan_ms; /* time reshard_plan_create spent planning */
    int ntensors, world_size, ndomains;
} reshard_plan_stats_t;

typedef struct reshard_rank_stats {
    int domain, local_index; /* local_index: the rank's place in its domain (its NIC rail) */
    uint64_t net_out, net_in, local_out, local_in, self;
} reshard_rank_stats_t;

/* Fills *stats and, when ranks is not NULL, ranks[0 .. world_size). */
RESHARD_API reshard_status_t reshard_plan_stats(const reshard_plan_t *plan,
                                                reshard_plan_stats_t *stats,
                                                reshard_rank_stats_t *ranks);

#ifdef __cplusplus
}
#endif
#endif
