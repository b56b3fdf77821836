/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Stage 3 of an execution (stage.h): what this rank sends is ready before the first send.
 */
#include "stage.h"

reshard_status_t stage_source(struct exec_run *r)
{
    /* Local peers that, as the vote told, read this rank's device sources on the host. */
    if (r->dev)
        RS_CHECK(exec_dev_stage_sources(r, 1));
    /* What this rank sends quantized (exec_quant.c), before it sends it. */
    return exec_quant_at_src(r->x, r->bufs, r->dev);
}
