/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The stages of one native execution, in the order exec_run_all (exec_run.c) calls them, one
 * file each. reshard_plan_execute (plugin/api/api_exec.c) calls exec_run (exec.c), which picks
 * the path: host buffers run the stages directly; device buffers run them on host shadows
 * (exec_dev_run first makes the shadows, exec_dev.c); RESHARD_EXECUTOR=nccl runs the vote and
 * then lowers the plan onto NCCL (exec_run_nccl). With verification on, the API checks the
 * destinations once the execution returned (exec_verify.h).
 *
 *   1. stage_prepare  (stage_prepare.c)  registrations, staging slots, the run's state, device
 *                                         sources this rank reads on the host
 *   2. stage_vote     (stage_vote.c)     every rank's verdict before any byte moves
 *   3. stage_source   (stage_source.c)   what is sent is ready: device sources local peers read
 *                                         after all, blocks quantized at the sender
 *   4. stage_move     (stage_move.c)     every receive posted, sends queued, the wait while the
 *                                         queues drain (network, local writes, device copies);
 *                                         in a delta refit each chunk is encoded as it is sent
 *                                         and applied as it lands (exec_delta.c), so encoding
 *                                         overlaps the network as packing does
 *   5. stage_land     (stage_land.c)     what landed made final: quantized where it lands, the
 *                                         caller's kernels see what the NIC wrote; then
 *                                         exec_run_all records the outcome and the version a
 *                                         delta refit leaves (exec_delta_done)
 *   6. stage_fail     (stage_fail.c)     after a failure once bytes may move: the cause, the
 *                                         outcome of each tensor, the communicator broken
 *
 * A failure in 1 is still carried into 2, so that every rank reaches the same verdict; a
 * failure in 2 leaves the communicator usable (nothing moved); one in 3 to 5 goes to 6.
 */
#ifndef RS_EXEC_STAGE_H
#define RS_EXEC_STAGE_H

#include "exec_run.h"

#define DRAIN_MS      1000 /* how long a failed run waits for its requests */
#define WAIT_CAP_MS   2    /* longest sleep: UCX over TCP may not re-signal a half-read socket */
#define SEND_SPINS    16   /* idle turns with sends in flight before sleeping on the transport */
#define SEND_WAIT_MS  1    /* ... and that sleep's cap */
#define BOOT_CHECK_MS 20   /* how often a run looks for failures the others report */
#define CAUSE_WAIT_MS 100  /* how long a failed run listens for another rank's report */

/* 1. Everything this rank prepares before the others hear from it: *r on success. dev: the
 * caller's device buffers behind the host shadows bufs, or NULL. */
reshard_status_t stage_prepare(struct exec *x, const reshard_buffers_t *bufs,
                               const reshard_buffers_t *dev, uint32_t seq, struct exec_run **r);

/* 2. The start vote (exec_hello.c) with this rank's local status: the same verdict on every
 * rank. When the verdict is this rank's own failure, its own message is the one left. r is
 * NULL on the NCCL executor. */
reshard_status_t stage_vote(struct exec *x, const reshard_buffers_t *bufs, uint32_t seq,
                            reshard_status_t local, struct exec_run *r, int on_nccl);

/* 3. Before the first send: device sources that local peers read on the host after all, and
 * the blocks this rank quantizes as a sender. */
reshard_status_t stage_source(struct exec_run *r);

/* 4. Posts every receive, queues the first sends and waits until every chunk arrived, every
 * send completed and every acknowledgement came. */
reshard_status_t stage_move(struct exec_run *r);

/* 5. Once everything bound for this rank landed: quantized destinations, RESHARD_TEST_CORRUPT,
 * the GPUDirect flush. */
reshard_status_t stage_land(struct exec_run *r);
/* What the execution left in each destination is recorded by exec_run_record (exec_run.h),
 * which lives in stage_land.c. */

/* 6. A failure (st) once bytes may be moving: the first failure's message, a remote cause if
 * one comes, destinations quantized where every chunk landed, the outcome recorded, and the
 * communicator broken. The run is freed, or kept while requests point into it. Returns the
 * status to report. */
reshard_status_t stage_fail(struct exec_run *r, reshard_status_t st);

/* The run's memory (exec_run.c). */
reshard_status_t exec_run_create(struct exec *x, const reshard_buffers_t *bufs,
                                 const reshard_buffers_t *dev, uint32_t seq, struct exec_run **out);
void exec_run_free(struct exec_run *r);
void exec_run_free_any(void *r);

#endif
