/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Delta refits of device buffers (exec_delta_dev.c, docs/delta.md): a device source's snapshot
 * is in device memory and its chunks are compared and compacted there (cuda_delta_encode), so
 * only the message crosses PCIe and the network; a device destination gets each encoded
 * transfer's chunk on the device (dense: copied in; a delta: applied by cuda_delta_apply).
 */
#ifndef RS_EXEC_DELTA_DEV_H
#define RS_EXEC_DELTA_DEV_H

#include "exec_run.h"

/* Before the start vote, with dev the caller's device buffers (NULL: none): whether this rank
 * can take part in a delta run (the kernels load, the scratch is made; why not is said once).
 * Makes the snapshot of each device source in device memory (one that cannot be made leaves its
 * tensor in full, with one WARN) and drops a snapshot kept where the tensor no longer is. */
int exec_delta_dev_prepare(struct exec *x, const reshard_buffers_t *dev);
/* Does xf leave from this rank's device source in this run (its snapshot, if any, on the
 * device)? */
int exec_delta_dev_sends(const struct exec_run *r, const struct xfer *xf);
/* Does the device path send every chunk of out[o] from the device in this run (its source needs
 * no staging)? after as for exec_dev_stage_sources: before the vote, whether it may. */
int exec_delta_dev_owns(const struct exec_run *r, size_t o, int after);
/* Is tensor t's snapshot in device memory (its source is)? */
int exec_delta_dev_snap(const struct exec *x, uint32_t t);
/* How exec_delta_dev_out treats a chunk (exec_delta_out decides, as for a host source). */
enum {
    DELTA_DEV_COMPARE,  /* compared with its snapshot, which then holds it */
    DELTA_DEV_SNAPSHOT, /* dense; the snapshot refreshed, so that the next run may compare */
    DELTA_DEV_SHADOW,   /* dense again next run (a dense streak): no snapshot kept */
};
/* exec_delta_out for a device source whose snapshot is on the device: 1 and the message, or 0
 * with the chunk in its shadow (sent dense from there). */
int exec_delta_dev_out(struct exec_run *r, uint32_t o, uint32_t chunk, int how, const char **buf,
                       size_t *len);
/* Does a chunk of xf that came to exec_delta_land (a delta run's scratch: an encoded network
 * transfer, or a forwarder's encoding in its notice) go to the device destination, not to the
 * destination's shadow? */
int exec_delta_dev_lands(const struct exec_run *r, const struct xfer *xf);
/* The chunk's message (bytes long, checked unless dense) onto the device destination. */
reshard_status_t exec_delta_dev_land(struct exec_run *r, const struct xfer *xf, uint32_t chunk,
                                     const char *msg, size_t bytes);
/* Bytes of snapshots this rank holds in device memory. */
uint64_t exec_delta_dev_held(const struct exec *x);
void exec_delta_dev_fini(struct exec_delta *d, int ntensors);

#endif
