/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The NCCL executor (RESHARD_EXECUTOR=nccl): the same transfer list as the native executor,
 * lowered to grouped ncclSend / ncclRecv on the user's communicator and stream, so that NCCL
 * carries every byte (self copies included, as sends to oneself).
 *
 * Transfers go in rounds: what leaves a source buffer in round 0, a fan-out transfer (out of
 * the forwarder's destination, which round 0 filled) in round 1. Each round is one NCCL group on
 * every rank (empty or not: two for reshard, one for direct), and both ends of a transfer put
 * it in the same round, order each pair's transfers alike (the canonical order of exec_tag.h,
 * from each rank's own list) and walk its box in the same pieces (the runs contiguous in both
 * buffers, region_pair), so each rank's k-th group holds exactly the operations its peers' k-th
 * groups match, in the same order per pair: NCCL can neither mismatch nor deadlock them, and
 * the stream orders each round after the one before.
 * Strided boxes become one operation per contiguous run until pack kernels land.
 */
#ifndef RS_EXEC_NCCL_H
#define RS_EXEC_NCCL_H

#include "xfer.h"
#include "planner/plan.h"
#include "plugin/comm/nccl_lib.h"
#include "plugin/reshard.h"

/* Enqueues rank `rank`'s share of xs (a list of every rank's transfers, or of the rank's own)
 * on comm and stream through f. bufs[t] for tensor t. The bcast baseline (whole-tensor buffers)
 * is refused. */
reshard_status_t nccl_lower(const struct rs_plan *plan, const struct xfer_set *xs, int rank,
                            const reshard_buffers_t *bufs, const struct nccl_fns *f, void *comm,
                            void *stream);
/* The number of groups nccl_lower issues for xs (the same on every rank). */
reshard_status_t nccl_rounds(const struct xfer_set *xs, uint32_t *rounds);

#endif
