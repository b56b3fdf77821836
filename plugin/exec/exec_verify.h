/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Refits that prove themselves (reshard.h): every rank fingerprints its shards
 * (planner/fingerprint.h) and one reduction of a fixed size per rank tells whether every
 * tensor's destination side adds up to its source side; only when it does not, a second one
 * of 8 bytes per tensor names the tensors.
 */
#ifndef RS_EXEC_VERIFY_H
#define RS_EXEC_VERIFY_H

#include "planner/plan.h"
#include "plugin/comm/comm.h"

struct exec;

enum exec_verify_mode {
    EXEC_VERIFY_REFIT,   /* after an execution: the destinations hold what arrived */
    EXEC_VERIFY_LAYOUTS, /* reshard_plan_check_layouts: both sides loaded the same weights */
};

/* Whether a plan can be checked on its topology: RESHARD_ERR_DATA_LOST naming the first tensor
 * where a shrink left a destination box with no present rank (nobody receives it, so that
 * tensor's destination side cannot add up to its source side). Local: every rank finds the
 * same. */
reshard_status_t exec_verify_possible(const struct rs_plan *p);

/* Collective over c's members (the caller holds c: comm_enter): every rank fingerprints its
 * source and destination shards in bufs; a weight quantized on the way (FP8 destinations of a
 * bf16, f16 or f32 source) and its scales against the fingerprints of the codes and scales
 * made where its blocks were quantized (x: the executor of the refit just run; the check of
 * layouts passes NULL and leaves them out) (host memory read in place, device memory copied to
 * the host) and every rank returns the same verdict: RESHARD_OK, RESHARD_ERR_VERIFY naming
 * the tensors that differ (with both layouts in EXEC_VERIFY_LAYOUTS), or the failure of the
 * lowest rank that could not fingerprint (its own status there, RESHARD_ERR_REMOTE or its
 * RESHARD_ERR_BUFFER elsewhere). */
reshard_status_t exec_verify(struct reshard_comm *c, const struct rs_plan *p, const struct exec *x,
                             const reshard_buffers_t *bufs, enum exec_verify_mode mode);

/* The control bytes one check adds per rank when everything agrees (the first reduction's
 * payload), for the documentation's figures. */
size_t exec_verify_fold_bytes(void);

#endif
