/* SPDX-License-Identifier: Apache-2.0 */
/*
 * reshard: move a distributed tensor (or a whole model) from one sharded layout to another,
 * sending only what each destination lacks and each element over the network at most once
 * per NVLink domain.
 *
 * This release parses layouts, plans, validates and reports plans, and moves host memory
 * across processes and hosts: communicators, communicator plans and their execution (UCX
 * between domains, cross-memory attach inside one). Conventions: functions return
 * reshard_status_t; output arguments come last and are written only on success; after a
 * failure reshard_last_error() holds a one-line message for the calling thread. Every function
 * is thread-safe on distinct objects; layouts and topologies are immutable once created and may
 * be read from several threads; a communicator runs one execution at a time (a concurrent one
 * fails with RESHARD_ERR_BUSY). Collective calls (marked so) must be made by every rank of the
 * communicator, in the same order.
 *
 * Lifetimes. A communicator plan holds its communicator: reshard_comm_destroy with plans still
 * alive stops the communicator at once (their executions, and every call on it, fail with
 * RESHARD_ERR_INVALID_ARG saying it was destroyed), and its connections close when the last of
 * those plans is destroyed (that reshard_plan_destroy then does the collective step of
 * reshard_comm_destroy), as MPI_Comm_free does. A destroy (of a plan or a communicator) from
 * another thread during an execution or collective on it returns at once and leaves the
 * object to that call, which finishes as it would have (it is not stopped:
 * reshard_comm_abort stops it) and frees what was destroyed as it returns. Plans and
 * communicators passed after their destroy are refused (RESHARD_ERR_INVALID_ARG, "not a live
 * plan"), by every call that returns a status, and a second destroy does nothing, as long as
 * no new plan or communicator took the address since; the calls that return no status
 * (reshard_plan_hash, _ntensors, _tensor_name, reshard_comm_rank, _size, _topo, _has_rank)
 * must not be made on a destroyed handle or race its destroy. Layouts, topologies and
 * manifests may be destroyed as soon as the plans are made: plans keep copies.
 */
#ifndef RESHARD_H
#define RESHARD_H

#include "base/reshard_status.h"

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
/* Whether a failed call also logs its message at WARN: 1 (the default) for callers that may not
 * show it, 0 for callers that print reshard_last_error() themselves, as the tools do, so that
 * each failure appears once (the library then logs it at INFO only). Process-wide. */
RESHARD_API void reshard_log_set_failures(int warn);

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

/* The shape of the shard that global rank `rank` holds (all zeros when it holds none) and the
 * number of its elements. */
RESHARD_API reshard_status_t reshard_layout_shard_shape(const reshard_layout_t *layout, int rank,
                                                        int64_t shape[8], int64_t *numel);
/* For tensor dim `dim`: global[i] = the global index of local index i of rank's shard, for i
 * in [0, shape[dim]) of reshard_layout_shard_shape. A rank's shard is the product over dims
 * of these index lists, stored row-major (or as the layout's view says). */
RESHARD_API reshard_status_t reshard_layout_shard_index(const reshard_layout_t *layout, int rank,
                                                        int dim, int64_t *global);
/* Bytes the local buffer of rank's shard must span, view included (0 when it holds none).
 * Never wrapped: a view that would span past 2^63 bytes is refused by the parser (_TOO_LARGE). */
RESHARD_API reshard_status_t reshard_layout_shard_bytes(const reshard_layout_t *layout, int rank,
                                                        size_t *bytes);

/* ---- topology ---- */

typedef struct reshard_topo reshard_topo_t;

/* The NVLink domain of each of world_size ranks: domain_of[r] (any non-negative ids) when
 * domain_of is not NULL, else consecutive blocks of domain_size ranks. */
RESHARD_API reshard_status_t reshard_topo_create(int world_size, int domain_size,
                                                 const int *domain_of, reshard_topo_t **topo);
/* Marks ranks as gone (each in [0, world_size)): they keep their numbers and domains, but plans
 * on the topology neither send from them nor write to them, taking what they held from a
 * replica; a piece held by no remaining rank fails the plan with RESHARD_ERR_DATA_LOST naming
 * the tensors. reshard_comm_shrink does this for a communicator. */
RESHARD_API reshard_status_t reshard_topo_exclude(reshard_topo_t *topo, const int *ranks, int n);
RESHARD_API void reshard_topo_destroy(reshard_topo_t *topo);

/* ---- plans ---- */

typedef struct reshard_plan reshard_plan_t;

typedef struct reshard_tensor {
    const char *name; /* NULL: "t<index>" */
    const reshard_layout_t *src;
    const reshard_layout_t *dst;
} reshard_tensor_t;

/* How a communicator plan moves bytes. RESHARD is the point of this library; the other two
 * exist to measure it against what users do today. */
typedef enum reshard_algo {
    RESHARD_ALGO_RESHARD = 0, /* overlaps only, each element once per domain, local fan-out */
    RESHARD_ALGO_DIRECT = 1,  /* every destination rank fetches its own overlaps: no dedupe */
    RESHARD_ALGO_BCAST = 2,   /* gather to the first source rank, then a ring broadcast */
} reshard_algo_t;

typedef struct reshard_plan_config {
    size_t size; /* sizeof(reshard_plan_config_t), for compatibility */
    /* A network slice held by several source replicas is split among them when each part
     * keeps at least this many bytes; <= 0 takes RESHARD_PLAN_SPLIT_MIN_BYTES. */
    int64_t split_min_bytes;
    /* A plan needing more transfers is refused up front with RESHARD_ERR_TOO_LARGE instead of
     * exhausting memory (20 bytes each); <= 0 takes RESHARD_PLAN_MAX_OPS. */
    int64_t max_ops;
    /* Communicator plans only (reshard_comm_plan_create). */
    reshard_algo_t algo;
    /* Communicator plans only: non-zero checks every execution that succeeded (as
     * RESHARD_VERIFY=1 does for every plan): see "refits that prove themselves" below. */
    int verify;
    /* Communicator plans only: non-zero refits in deltas (as RESHARD_DELTA=1 does for every
     * plan): each sender keeps a snapshot of what it last sent and each network chunk travels
     * as nothing, its changed elements or dense, whichever is smallest (docs/delta.md). */
    int delta;
} reshard_plan_config_t;

/* clang-format off */
#define RESHARD_PLAN_CONFIG_INIT {sizeof(reshard_plan_config_t), 0, 0, RESHARD_ALGO_RESHARD, 0, 0}
/* clang-format on */

/* Plans all tensors together (loads balance across them). Source and destination of a tensor
 * must agree in shape and dtype (RESHARD_ERR_MISMATCH) and use ranks below the topology's world
 * size (RESHARD_ERR_RANK_RANGE). The layouts and topology may be destroyed afterwards.
 * config may be NULL. */
RESHARD_API reshard_status_t reshard_plan_create(const reshard_tensor_t *tensors, int ntensors,
                                                 const reshard_topo_t *topo,
                                                 const reshard_plan_config_t *config,
                                                 reshard_plan_t **plan);
/* The same plan restricted to one rank: only the transfers `rank` sends, receives or forwards,
 * exactly as in the plan of every rank (the same rule decides every op, and the hash is the
 * same). It costs time and memory in the rank's own share and the tensors, not in the world's
 * size: what a communicator rank plans, and how to look at one rank of a large world offline.
 * reshard_plan_rank_stats reports it; reshard_plan_stats, reshard_plan_validate and
 * reshard_plan_predict need the plan of every rank. */
RESHARD_API reshard_status_t reshard_plan_create_rank(const reshard_tensor_t *tensors, int ntensors,
                                                      const reshard_topo_t *topo,
                                                      const reshard_plan_config_t *config, int rank,
                                                      reshard_plan_t **plan);
/* Proves the plan: every destination element written exactly once, from a rank that holds
 * it, crossing into each domain at most once. RESHARD_ERR_INVALID_PLAN otherwise. */
RESHARD_API reshard_status_t reshard_plan_validate(const reshard_plan_t *plan);
/* A hash of the plan; ranks compare it before moving data. */
RESHARD_API uint64_t reshard_plan_hash(const reshard_plan_t *plan);
/* Not collective, except as the last plan of a destroyed communicator (see Lifetimes above).
 * From another thread during an execution of the plan: returns at once, and the execution
 * frees the plan as it returns. */
RESHARD_API void reshard_plan_destroy(reshard_plan_t *plan);

/* A plan's tensors: the caller's, in order, then one scales tensor (float32) for each tensor
 * whose destination is quantized (quant=block(R,C), channel or tensor with an fp8 dtype), in
 * the order of their weights, named after them (a name ending ".weight" gets
 * ".weight_scale_inv", as vLLM names them, any other ".scale" appended). reshard_plan_execute
 * takes bufs[] with reshard_plan_ntensors entries and reshard_plan_outcome fills as many: the
 * scales' destination buffers, laid out as reshard_plan_tensor_layout says, receive the
 * dequantization multipliers. A weight quantized on the way (bf16, f16 or f32 source) has its
 * scales computed by the library: their source buffers are ignored (pass NULL); from an FP8
 * source with the same blocks, weights and scales are two plain tensors, both the caller's. */
RESHARD_API int reshard_plan_ntensors(const reshard_plan_t *plan);
/* Tensor t's name (valid until the plan is destroyed), or NULL when t is out of range. */
RESHARD_API const char *reshard_plan_tensor_name(const reshard_plan_t *plan, int t);
/* A copy of tensor t's source (side 0) or destination (side 1) layout, to size its buffers
 * (reshard_layout_shard_bytes): the caller destroys it. */
RESHARD_API reshard_status_t reshard_plan_tensor_layout(const reshard_plan_t *plan, int t, int side,
                                                        reshard_layout_t **layout);

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
    /* FP8 destinations quantized on the way (quant=, from bf16/f16/f32): the FP8 bytes written
     * into them, and the percentage of those their senders quantized (the network then carries
     * FP8); the rest crossed in the source dtype and was quantized where it landed. 0 and 0
     * without such tensors. */
    uint64_t quant_bytes;
    double quant_at_source_pct;
} reshard_plan_stats_t;

typedef struct reshard_rank_stats {
    int domain, local_index; /* local_index: the rank's place in its domain (its NIC rail) */
    uint64_t net_out, net_in, local_out, local_in, self;
    /* Network messages the rank sends per execution: chunks (RESHARD_CHUNK_BYTES) of its
     * transfers, small ones (RESHARD_COALESCE_BYTES) packed into one stream per peer. */
    uint64_t net_msgs;
    /* Delta refits (docs/delta.md): the bytes of the snapshot the rank keeps of what it sends
     * over the network from its sources (unquantized tensors), made at its first delta refit:
     * in host memory, or in device memory for sources that are device buffers. */
    uint64_t delta_snapshot;
    /* Of those, the bytes it holds in device memory now (a communicator plan's own rank, once a
     * delta refit ran on device sources; else 0). */
    uint64_t delta_snapshot_device;
} reshard_rank_stats_t;

/* Fills *stats and, when ranks is not NULL, ranks[0 .. world_size). For a communicator plan,
 * whose ranks each hold their own transfers: *stats is the world's, summed by the plan vote over
 * every rank's own figures (busiest NIC and its rank included; gather_bcast_bytes is 0: it
 * needs the whole world's layouts), and ranks[] holds this rank's entry only, at ranks[rank],
 * the others zero: gather them with reshard_comm_allgather when every rank's are wanted. */
RESHARD_API reshard_status_t reshard_plan_stats(const reshard_plan_t *plan,
                                                reshard_plan_stats_t *stats,
                                                reshard_rank_stats_t *ranks);

/* One rank's figures from a plan of every rank or of that rank alone; *nops counts the ops it
 * takes part in and *plan_ms is what making the plan took (either may be NULL). */
RESHARD_API reshard_status_t reshard_plan_rank_stats(const reshard_plan_t *plan, int rank,
                                                     reshard_rank_stats_t *stats, uint64_t *nops,
                                                     double *plan_ms);

/* A flow-level prediction of a plan's refit time on a cluster (plugin/predict.c): from the
 * transfer lists each algorithm would run, every rank's bytes over its own NIC and NVLink
 * (full duplex; the fan-out overlaps the network) and its messages, whose latency_s is paid
 * once per as many as the executor keeps in flight (16, at most 2 per peer).
 * A model for comparing algorithms and layouts, not a measurement. */
typedef struct reshard_cluster {
    double nic_bytes_per_s;    /* each rank's NIC, per direction */
    double nvlink_bytes_per_s; /* each rank's NVLink, per direction */
    double latency_s;          /* of a network message (several are in flight at a time) */
} reshard_cluster_t;

typedef struct reshard_prediction {
    /* indexed by reshard_algo_t: RESHARD, DIRECT, BCAST. For an FP8 destination quantized on
     * the way, BCAST is what users do today: broadcast the source dtype, quantize where it
     * lands */
    double seconds[3];
    uint64_t max_nic_bytes[3], max_nvlink_bytes[3], max_msgs[3];
} reshard_prediction_t;

RESHARD_API reshard_status_t reshard_plan_predict(const reshard_plan_t *plan,
                                                  const reshard_cluster_t *cluster,
                                                  reshard_prediction_t *out);

/* ---- manifests: a whole model ---- */

typedef struct reshard_manifest reshard_manifest_t;

/* Reads a manifest (DESIGN.md section 4): JSON with version 1, world_size, optional domains
 * ({"size": N} or {"of_rank": [...]}), optional buffers ({"name": size in elements}) and
 * tensors, each {name, shape, dtype, src, dst}, a side being a spec string without shape and
 * dtype or an object {ranks, mesh, place, buffer, offset, view, strides}. Every side is
 * checked as a layout spec, views sharing a buffer must not overlap on any rank and must fit
 * the buffer's size when it is given; an error names the tensor and the field's JSON path
 * (RESHARD_ERR_SPEC_SYNTAX, RESHARD_ERR_VIEW and the parser's statuses). */
RESHARD_API reshard_status_t reshard_manifest_load(const char *path, reshard_manifest_t **out);
RESHARD_API void reshard_manifest_destroy(reshard_manifest_t *manifest);
RESHARD_API int reshard_manifest_world_size(const reshard_manifest_t *manifest);
RESHARD_API int reshard_manifest_ntensors(const reshard_manifest_t *manifest);
/* The tensors, ready for reshard_plan_create / reshard_comm_plan_create; valid until destroy. */
RESHARD_API const reshard_tensor_t *reshard_manifest_tensors(const reshard_manifest_t *manifest);
/* The manifest's domains (consecutive blocks of 8 ranks when it names none). */
RESHARD_API reshard_status_t reshard_manifest_topo(const reshard_manifest_t *manifest,
                                                   reshard_topo_t **topo);

/* ---- communicators: moving the bytes ---- */

typedef struct reshard_comm reshard_comm_t;

/* Where to meet: rank 0's address and a random secret that proves a peer belongs to the job.
 * Like ncclUniqueId: made once (by the process that will be rank 0), passed to every rank out
 * of band. */
typedef struct reshard_unique_id {
    char internal[128];
} reshard_unique_id_t;

/* Makes an id and starts listening on this host (RESHARD_BOOT_ADDR picks the address, else
 * the first non-loopback IPv4 address; RESHARD_BOOT_PORT the port, else any). The process
 * that calls it must create rank 0. */
RESHARD_API reshard_status_t reshard_get_unique_id(reshard_unique_id_t *id);

/* Collective over `size` ranks: joins rank `rank` to the job of `id`. Waits at most
 * RESHARD_TIMEOUT seconds for every rank; errors name the peer that failed. A rank's NVLink
 * domain is its hostname unless RESHARD_DOMAIN_SIZE (consecutive blocks of ranks) or
 * RESHARD_DOMAIN (this rank's domain id) says otherwise. */
RESHARD_API reshard_status_t reshard_comm_init_rank(const reshard_unique_id_t *id, int rank,
                                                    int size, reshard_comm_t **comm);
/* The same, with rank, size and rendezvous from the launcher's environment: torchrun
 * (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE), else Open MPI
 * (OMPI_COMM_WORLD_*) or Slurm (SLURM_PROCID, SLURM_NTASKS, ...) with MASTER_ADDR and
 * MASTER_PORT.
 * The port rule: rank 0 listens on MASTER_PORT + 1 (torchrun's own store holds MASTER_PORT)
 * unless RESHARD_BOOT_PORT names another port, and that port must be free on rank 0's host.
 * If another program holds it, rank 0 fails at once (RESHARD_ERR_NETWORK, naming the port) and
 * the other ranks within about a second, saying that what listens there is not reshard's.
 * The secret: give every rank the same RESHARD_SECRET, or RESHARD_SECRET_FILE (a file only the
 * job's user can read). Without either it is derived from values anyone can read, so anyone
 * who can reach the port can join: one warning says so (docs/security.md). Ranks prove the
 * secret to rank 0, and rank 0 to them, without sending it (HMAC-SHA256 from libcrypto, loaded
 * at run time: RESHARD_CRYPTO_LIB). */
RESHARD_API reshard_status_t reshard_comm_init_env(reshard_comm_t **comm);
/* The same, on the ranks of an NCCL communicator (ncclComm_t, passed as a pointer: vLLM's
 * PyNcclCommunicator.comm, or PyTorch's): rank and size come from it, and rank 0's rendezvous
 * id, with a fresh random secret, reaches the others through one ncclAllGather, so nothing else
 * needs configuring. NCCL is
 * the one already in the process, else libnccl.so.2; the all-gather needs the CUDA driver and
 * a device (the calling thread's current context, else device 0's primary context). The NCCL
 * communicator stays the caller's and must outlive this one (until reshard_comm_destroy, and
 * any execution in flight then has returned, and its stream work ended). Collective over its
 * ranks. A
 * rank whose CUDA setup fails before the all-gather cannot take part in it, and the others then
 * wait in NCCL, as with any NCCL collective a rank misses. */
RESHARD_API reshard_status_t reshard_comm_init_nccl(void *nccl_comm, reshard_comm_t **comm);
RESHARD_API int reshard_comm_rank(const reshard_comm_t *comm);
RESHARD_API int reshard_comm_size(const reshard_comm_t *comm);
/* The communicator's topology (owned by the communicator). */
RESHARD_API const reshard_topo_t *reshard_comm_topo(const reshard_comm_t *comm);
/* Collective. Closes connections, now when no plan made on the communicator is alive (nor a
 * call on it in flight in another thread), else when the last of them is gone: see Lifetimes
 * at the top. Either way the communicator and its plans accept nothing new from here. */
RESHARD_API void reshard_comm_destroy(reshard_comm_t *comm);
/* Stops the communicator, from any thread: an execution (or any collective) in flight here
 * ends with RESHARD_ERR_ABORTED within milliseconds, even while it waits for the others in the
 * plan-hash exchange; executions in flight on the other ranks end with RESHARD_ERR_REMOTE
 * naming this rank, and every later call on the communicator fails, here and there: destroy
 * it once the execution returned, and make a new one. Returns at once; may be called again. */
RESHARD_API reshard_status_t reshard_comm_abort(reshard_comm_t *comm);

/* Collective over the ranks that stay (those of comm not in exclude[nexclude]; the excluded
 * ones do not call it): a new communicator of them, with no new unique id. Ranks keep their
 * numbers and size stays the same, so the layouts, manifests and buffers that named them
 * still do; the excluded ranks are absent (reshard_comm_has_rank): plans on the new
 * communicator take their source pieces from replicas (RESHARD_ERR_DATA_LOST names the tensors
 * none holds) and give them nothing. comm may have failed (the usual case, after an execute
 * named the dead peers) and is left as it is: destroy it after. The survivors meet at the
 * lowest remaining rank, which listened for this since comm was made; ranks that pass different
 * exclude lists do not join (the lowest one times out naming them). Bounded by
 * RESHARD_TIMEOUT. */
RESHARD_API reshard_status_t reshard_comm_shrink(reshard_comm_t *comm, const int *exclude,
                                                 int nexclude, reshard_comm_t **newcomm);
/* Growing a communicator (an elastic fleet): ranks that are not in comm join it. A joiner
 * takes the number of a rank that is absent (shrunk away or left: a replacement, so layouts,
 * manifests and buffers that named it stay valid) or a number past the size (growth: the size
 * becomes the largest joiner plus one; numbers skipped are absent). Any member makes the join
 * id (reshard_comm_grow_id; not collective, every member makes the same) and the application
 * hands it to the joiners, as it handed the unique id to the first ranks; it holds where the
 * lowest member listens and a secret derived from comm's for this growth, so a joiner is
 * admitted exactly as at creation (anyone without it is refused). The members call
 * reshard_comm_grow, the joiners reshard_comm_join, all with the same joiners[n]: they get a
 * new communicator of the next membership epoch (destroy comm after, on the members). Refused at
 * once on every member, with comm unchanged and usable: a joiner list naming a live member, a
 * number twice, or one member passing another list than the others (RESHARD_ERR_INVALID_ARG naming
 * the ranks). Refused at the joiner: a rank not in the list, or a list other than the members'
 * (RESHARD_ERR_INVALID_ARG there); the joiner tells the members, who then fail at once with
 * RESHARD_ERR_INVALID_ARG (the lowest member) or RESHARD_ERR_REMOTE saying why, comm unchanged and
 * usable. A joiner that never arrives (or a member that dies during the growth) fails the others
 * within RESHARD_TIMEOUT naming it. comm must be healthy (after a failure, shrink first). The
 * members keep comm's network connections and registrations in the new communicator (only the
 * joiners' are new); once the growth succeeded comm only refuses calls, saying it grew, and its
 * destroy, before or after the new one's, waits for nobody. */
RESHARD_API reshard_status_t reshard_comm_grow_id(reshard_comm_t *comm, const int *joiners, int n,
                                                  reshard_unique_id_t *id);
RESHARD_API reshard_status_t reshard_comm_grow(reshard_comm_t *comm, const int *joiners, int n,
                                               reshard_comm_t **newcomm);
RESHARD_API reshard_status_t reshard_comm_join(const reshard_unique_id_t *id, int rank,
                                               const int *joiners, int n, reshard_comm_t **comm);
/* Not collective: this rank leaves comm on purpose, and comm is gone here (as after
 * reshard_comm_destroy, without its barrier). The others learn it at once, not by a timeout:
 * the collective or execution each has in flight, or its next, fails with RESHARD_ERR_REMOTE
 * saying "rank R left the communicator", and reshard_comm_left names R; they then shrink it
 * away (reshard_comm_shrink), any rank may leave, the lowest included. This rank's sockets,
 * listener and registrations are released as it returns, unless plans made on comm are still
 * alive: then as the last of them is destroyed (Lifetimes, at the top). RESHARD_ERR_BUSY while
 * this rank executes on comm. Ranks leave one at a time (each followed by the others' shrink):
 * of ranks leaving at once, the others may each hear of another one. */
RESHARD_API reshard_status_t reshard_comm_leave(reshard_comm_t *comm);
/* Not collective, never waits: *rank is the rank this rank heard leave comm on purpose
 * (reshard_comm_leave), or -1 while none did. Looks at what has arrived when no collective is
 * in flight on comm, so an idle rank can poll it. */
RESHARD_API reshard_status_t reshard_comm_left(reshard_comm_t *comm, int *rank);
/* 1 when rank belongs to the communicator (0 after a shrink left it out, or out of range). */
RESHARD_API int reshard_comm_has_rank(const reshard_comm_t *comm, int rank);

/* Collective: every rank passes the same tensors. Each rank plans its own transfers on the
 * communicator's topology (in time and memory of its own share, not of the world), then one
 * small vote compares the plan hash across ranks before any byte moves
 * (RESHARD_ERR_PLAN_MISMATCH on every rank, naming the ranks that differ). A rank that could not
 * plan fails every rank with its message: with its status for RESHARD_ERR_DATA_LOST and
 * RESHARD_ERR_TOO_LARGE, RESHARD_ERR_REMOTE for the others. config may be NULL. */
RESHARD_API reshard_status_t reshard_comm_plan_create(reshard_comm_t *comm,
                                                      const reshard_tensor_t *tensors, int ntensors,
                                                      const reshard_plan_config_t *config,
                                                      reshard_plan_t **plan);

/* Catching up from peers (an elastic fleet, docs/elastic.md). Collective over the communicator
 * of refit, a plan made by reshard_comm_plan_create on it (after reshard_comm_grow /
 * reshard_comm_join; every rank passes the same joiners[n]); of a plan made by
 * reshard_plan_create or _create_rank, not collective: the same plan, to validate and report
 * (reshard-plan --catch-up), config ignored. It is the plan that brings the ranks
 * that joined, which hold no version of any weight, to the version the other destination ranks
 * hold since their last refit, moving nothing else. Each joiner's destination shard of a tensor
 * comes from the destination ranks that hold a replica of it: one in the joiner's NVLink domain
 * over the local path when there is one, else over the network, once per domain (the plan's
 * net_bytes is min_net_bytes). Only a tensor where some joiner's shard has no replica on a
 * rank that is no joiner is taken from refit's sources (the trainers), as the refit would. So
 * for a replacement or a new replica of an existing layout the trainers send nothing: their
 * part is the plan vote and the execution's start vote, a few small control messages and no
 * data, so they may make it between training steps while the joiners catch up.
 * Run it with reshard_plan_execute (or _stream) and the buffers the refit takes (bufs[t] with
 * reshard_plan_ntensors entries, the same on every rank): the destination ranks' bufs[t].dst
 * are read as the sources of the tensors they serve, and only the joiners' are written. Its
 * tensors are refit's, and reshard_plan_tensor_layout's side 0 says where each one comes from
 * (its destination layout when the replicas serve it). A catch-up moves full values whatever
 * config->delta or RESHARD_DELTA say (a joiner has nothing a delta could apply to) and is not
 * verified (config->verify and RESHARD_VERIFY are ignored, said at INFO); config->algo is
 * ignored. Refused (RESHARD_ERR_INVALID_ARG, or _RANK_RANGE): a joiner outside the
 * communicator, absent from it or listed twice, an empty list, or a catch-up plan as refit;
 * ranks that pass different lists fail the plan vote (RESHARD_ERR_PLAN_MISMATCH). The next
 * refit with refit runs as any other and includes the joiners (with delta refits, the first
 * refit of a plan made on the grown communicator is in full: a new plan holds no version). */
RESHARD_API reshard_status_t reshard_plan_catch_up(reshard_plan_t *refit, const int *joiners, int n,
                                                   const reshard_plan_config_t *config,
                                                   reshard_plan_t **plan);

/* Where a buffer lives. Device buffers (RESHARD_MEM_CUDA) need the CUDA driver. The native
 * executor has local peers write device destinations through CUDA IPC (RESHARD_CUDA_IPC),
 * moves contiguous network chunks straight from and into device memory where the transport
 * can (RESHARD_GPUDIRECT), and stages the rest through pinned host copies; the first execution
 * logs which at INFO. A device destination written through IPC stays mapped in its writers
 * between executions: free it (cudaFree) only after the next execution of the plan with other
 * buffers, or after reshard_plan_destroy on every rank. The NCCL executor hands device buffers
 * to NCCL. A buffer the driver knows as device memory but declared host is refused. */
typedef enum reshard_mem { RESHARD_MEM_HOST = 0, RESHARD_MEM_CUDA = 1 } reshard_mem_t;

/* This rank's memory for one tensor: its source shard (NULL when it holds none) and its
 * destination shard (NULL when it receives none), laid out as the layouts' views say. */
typedef struct reshard_buffers {
    const void *src;
    size_t src_bytes;
    void *dst;
    size_t dst_bytes;
    reshard_mem_t mem;
} reshard_buffers_t;

/* Collective over the plan's communicator: moves every tensor; bufs[t] for tensor t, with
 * reshard_plan_ntensors(plan) entries (the scales tensors of FP8 destinations after the
 * caller's; tensors quantized on the way are quantized by their senders where these hold whole
 * blocks, else where they land, on the host or, for device buffers, with the library's kernel:
 * docs/layouts.md). Returns
 * when this rank's destination shards are complete and the ranks it sent to have theirs, so its
 * source shards may be reused. A buffer smaller than its shard fails on every rank before any
 * byte moves (RESHARD_ERR_BUFFER; the communicator stays usable); a second call while one runs
 * on the communicator fails at once (RESHARD_ERR_BUSY); a peer silent for RESHARD_TIMEOUT
 * seconds fails with RESHARD_ERR_TIMEOUT naming it. A failure once bytes move leaves the
 * destination buffers partial and the communicator unusable: later calls say it must be
 * destroyed, and the buffers must outlive reshard_comm_destroy (it ends what is in flight).
 * With device buffers it first waits for the work on the default stream, as
 * reshard_plan_execute_stream does with NULL. */
RESHARD_API reshard_status_t reshard_plan_execute(reshard_plan_t *plan,
                                                  const reshard_buffers_t *bufs);
/* The same, ordered on a CUDA stream (cudaStream_t; NULL is the default stream). The native
 * executor waits for the work already on the stream before it reads or writes anything, and
 * returns when the refit is done, so later work on the stream sees it. With
 * RESHARD_EXECUTOR=nccl (a communicator from reshard_comm_init_nccl, device buffers) the refit
 * is enqueued on the stream as grouped ncclSend/ncclRecv, one group per round, and this returns
 * once it is enqueued, as NCCL calls do: the refit is complete when the stream reaches that
 * point. Buffer checks and the plan hash vote happen before anything is enqueued, as above;
 * reshard_plan_outcome does not apply (the stream owns completion). reshard_plan_execute with
 * RESHARD_EXECUTOR=nccl enqueues on the default stream and waits for it, keeping its promise. */
RESHARD_API reshard_status_t reshard_plan_execute_stream(reshard_plan_t *plan,
                                                         const reshard_buffers_t *bufs,
                                                         void *stream);

/* What an execution left in this rank's destination buffer of a tensor. */
typedef enum reshard_tensor_state {
    RESHARD_TENSOR_NONE = 0,      /* this rank receives nothing of the tensor */
    RESHARD_TENSOR_COMPLETE = 1,  /* every byte this rank receives of it arrived */
    RESHARD_TENSOR_UNTOUCHED = 2, /* the execution failed before any byte moved: as it was */
    RESHARD_TENSOR_TORN = 3       /* partly written, and a transfer still in flight may write
                                   * more until reshard_comm_destroy */
} reshard_tensor_state_t;

/* After reshard_plan_execute, failed or not: the state of each tensor's destination on this
 * rank (states[t] for tensor t, in the order the plan was made; with a manifest, its names;
 * reshard_plan_ntensors entries, the scales tensors included).
 * A tensor counts as complete once every receive and copy into it completed, so after a
 * failure the tensors that no failed peer contributed to are usually complete, and a complete
 * one holds the new values. Local: needs no other rank, and works on a communicator that
 * failed. RESHARD_ERR_INVALID_ARG before the plan's first execution. */
RESHARD_API reshard_status_t reshard_plan_outcome(const reshard_plan_t *plan,
                                                  reshard_tensor_state_t *states);

/* ---- refits that prove themselves (docs/manifest.md, "Checking the layouts") ----
 *
 * Every tensor has a fingerprint in global index space: the sum (mod 2^64) over its elements
 * of a 64-bit mix of (global index, element bits), so both sides of the same weights give the
 * same value whatever their layouts, and shards combine by addition. A check compares, per
 * tensor, every present destination shard (each replica counts, so a bad replica is caught)
 * with one replica of every source shard, in one small reduction of a fixed size per rank
 * (and a second, of 8 bytes per tensor, only when something differs, to name the tensors).
 * Host buffers are read in place; device buffers are copied to the host first (a kernel is to
 * come).
 *
 * With reshard_plan_config_t.verify (or RESHARD_VERIFY=1), reshard_plan_execute checks the
 * refit once it succeeded, on every rank: where a tensor differs, every rank returns
 * RESHARD_ERR_VERIFY with a message naming the first tensors and how many (the refit itself
 * completed: the buffers hold what arrived). A plan asking for it on a shrunk communicator
 * where some destination box was held only by ranks that left is refused at
 * reshard_comm_plan_create (RESHARD_ERR_DATA_LOST, naming the tensor): nobody receives that
 * box, so the check could not add up. A tensor quantized on the way (bf16, f16 or f32 into
 * FP8) and the scales its quantization computes are left out of both checks, said at INFO:
 * the two sides hold different values (an FP8 source moved with its scales is plain data, and
 * checked). */

/* Collective over the plan's communicator, moving no weights: compares the fingerprints of the
 * sources (bufs[t].src) with those of the destination buffers as they are (bufs[t].dst), when
 * both sides loaded the same checkpoint, as inference does before the first refit. Every
 * tensor whose two descriptions disagree (a fused buffer's views swapped, experts permuted,
 * another interleaving) fails the check: RESHARD_ERR_VERIFY on every rank, the message naming
 * the first ones with both layouts and how many in all (each one is logged at WARN with its
 * layouts). RESHARD_ERR_BUFFER names a rank's buffer that is missing or short. The first
 * thing to run when integrating a new model. */
RESHARD_API reshard_status_t reshard_plan_check_layouts(reshard_plan_t *plan,
                                                        const reshard_buffers_t *bufs);

/* What this rank's transports moved since the communicator was created, counted by the
 * transports themselves (payload bytes; control messages apart). */
typedef struct reshard_comm_counters {
    uint64_t net_out, net_in;     /* to and from other domains */
    uint64_t local_out, local_in; /* inside the domain (CMA, CUDA IPC) */
    uint64_t self;                /* copied inside this rank */
    uint64_t ctrl_msgs;           /* control messages sent */
    uint64_t net_msgs;            /* data messages sent to other domains (packed ones count once) */
    uint64_t ipc_out;             /* of local_out: written into peers' device memory (CUDA IPC) */
    uint64_t gdr_out, gdr_in;     /* of net_out / net_in: straight from / into device memory
                                   * (GPUDirect RDMA), not staged through host memory */
    /* The control plane, sent and received: the bootstrap's collectives (votes, barriers,
     * reshard_comm_allgather; frame headers included), and the payload of the executor's
     * control messages over the transport (where buffers are, told to the local peers that
     * write them, and only when they change; chunk notices and acknowledgements are empty). */
    uint64_t boot_out, boot_in;
    uint64_t ctrl_bytes_out, ctrl_bytes_in;
} reshard_comm_counters_t;

RESHARD_API reshard_status_t reshard_comm_counters(const reshard_comm_t *comm,
                                                   reshard_comm_counters_t *counters);

/* Collective: every rank's counters (all[size]) and the node (hostname) each rank runs on,
 * as dense ids in order of first appearance (node[size]; may be NULL). */
RESHARD_API reshard_status_t reshard_comm_counters_all(reshard_comm_t *comm,
                                                       reshard_comm_counters_t *all, int *node);

/* Collective helpers for tools and tests, over the communicator's bootstrap. Like executions,
 * collectives on one communicator run one at a time (RESHARD_ERR_BUSY while another thread
 * is in one), and reshard_comm_abort ends them. */
RESHARD_API reshard_status_t reshard_comm_barrier(reshard_comm_t *comm);
RESHARD_API reshard_status_t reshard_comm_allgather(reshard_comm_t *comm, void *buf,
                                                    size_t bytes_per_rank);

#ifdef __cplusplus
}
#endif
#endif
