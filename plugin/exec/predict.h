/* SPDX-License-Identifier: Apache-2.0 */
/* What the prediction knows of a transfer list, for the plan statistics too. */
#ifndef RS_PREDICT_H
#define RS_PREDICT_H

#include "xfer.h"

/* Network messages each of nranks ranks sends to run xs (a transfer list of plan) once, as
 * the executor sends them: chunks of the transfers (RESHARD_CHUNK_BYTES), the small ones
 * (RESHARD_COALESCE_BYTES) packed per peer. */
reshard_status_t predict_msgs(const struct rs_plan *plan, const struct xfer_set *xs, int nranks,
                              uint64_t *msgs);

/* The refit time of every algorithm on plan, from the flow model of reshard.h's
 * reshard_plan_predict. */
reshard_status_t predict_plan(const struct rs_plan *plan, const reshard_cluster_t *cluster,
                              reshard_prediction_t *out);

#endif
