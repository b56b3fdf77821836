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
 *
 * A round whose operations are many goes as several groups: the i-th operation a rank has with
 * one peer in one direction goes in the round's group i / nccl_pair_ops(nranks), on both ends
 * alike, so group g on one rank meets only groups g of its peers (each completes before the
 * next starts, as the stream orders them) and a group holds at most NCCL_GROUP_OPS operations on
 * any rank. NCCL 2.9 to 2.11 refuse more than NCCL_MAX_OPS (2048) work entries on one channel
 * in one launch ("Too many aggregated operations"); 2.19 and later wait for room in their work
 * FIFO instead. Plans whose pairs exchange few pieces keep one group per round.
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
/* The number of rounds nccl_lower issues for xs (the same on every rank); each is one group, or
 * more where a pair exchanges more than nccl_pair_ops pieces in it. */
reshard_status_t nccl_rounds(const struct xfer_set *xs, uint32_t *rounds);

/* The most operations of a group on one rank (NCCL 2.9-2.11's NCCL_MAX_OPS). */
#define NCCL_GROUP_OPS 2048u
/* Operations per peer and direction in one group on a communicator of nranks ranks, so that a
 * rank's group holds at most NCCL_GROUP_OPS: NCCL_GROUP_OPS / (2 nranks), at least 1. */
uint32_t nccl_pair_ops(int nranks);

#endif
