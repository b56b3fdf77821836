/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The executor: runs a transfer list on one rank. Network transfers first, then the local
 * fan-out of each received chunk to the other replicas of the domain, so the fan-out of chunk i
 * overlaps the network transfer of chunk i+1; sends start at a rotated peer. The memory kind of
 * the buffers is a parameter here and in the transports, so device memory only adds an
 * implementation.
 */
#ifndef RS_EXEC_H
#define RS_EXEC_H

#include "xfer.h"
#include "planner/plan.h"
#include "plugin/comm/comm.h"

/* Network sends in flight: per rank, and per peer. More than 2 to one peer let UCX interleave
 * them, so that none ends early and the receiver's fan-out (or a ring's next hop) waits for
 * the last. The cost model counts latencies with the same window. */
#define EXEC_SEND_WINDOW 16
#define EXEC_PEER_WINDOW 2

struct exec;

/* Takes over xs. plan stays the caller's and must outlive the executor. */
reshard_status_t exec_create(struct reshard_comm *comm, const struct rs_plan *plan,
                             struct xfer_set *xs, struct exec **out);
/* One execution at a time per communicator (RESHARD_ERR_BUSY otherwise). A failure found
 * before any byte moves (buffers, plan mismatch) leaves the communicator usable; one after
 * breaks it (comm_usable). on_stream: ordered on stream (NULL: the default stream), as
 * reshard_plan_execute_stream. */
reshard_status_t exec_run(struct exec *x, const reshard_buffers_t *bufs, int on_stream,
                          void *stream);
/* The chunk size this process cuts transfers with (RESHARD_CHUNK_BYTES, capped). */
int64_t exec_chunk_bytes(void);
/* RESHARD_COALESCE_BYTES, at most the chunk size: what the executor packs. */
int64_t exec_coalesce_bytes(void);
void exec_destroy(struct exec *x);
/* The communicator the executor runs on. */
struct reshard_comm *exec_comm(const struct exec *x);
/* After an execution, before its destinations are read: one enqueued on NCCL's stream (on_stream)
 * is waited for, the others are done when exec_run returns. */
reshard_status_t exec_settle(const struct exec *x, int on_stream, void *stream);
/* What the last execution left in this rank's destination buffers, per tensor
 * (reshard_tensor_state_t); RESHARD_ERR_INVALID_ARG before the first execution. */
reshard_status_t exec_outcome(const struct exec *x, reshard_tensor_state_t *states);

/* What this rank's own transfers move (its row of reshard_plan_stats; net_msgs left 0). */
void exec_own_stats(const struct exec *x, reshard_rank_stats_t *mine);
/* Delta refits on (docs/delta.md): set once, before the first execution. */
void exec_delta_enable(struct exec *x, int on);
/* A verified refit found some destination wrong: this rank's destinations hold no known refit
 * now, so the next delta refit sends them in full. */
void exec_delta_forget_dst(struct exec *x);
/* The plan verifies its refits: blocks quantized where they land are fingerprinted as they are
 * made (exec_quant.c), for the check. Set once, before the first execution. */
void exec_verify_enable(struct exec *x, int on);
/* The local pairs and their paths as this rank sees them, for the plan vote (exec_link.c). */
uint64_t exec_local_fp(const struct exec *x);
/* The world's figures, as the plan vote summed them. */
void exec_set_world(struct exec *x, const reshard_plan_stats_t *world);
/* reshard_plan_stats of a communicator plan: the world's figures from the plan vote, and, when
 * ranks is not NULL, this rank's own row at ranks[rank] (the others zero): what its transfer
 * list moves, the algorithm's promise, which the transports' counters must match. */
reshard_status_t exec_stats(const struct exec *x, reshard_plan_stats_t *stats,
                            reshard_rank_stats_t *ranks);

#endif
