/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Stage 4 of an execution (stage.h): in a delta refit (docs/delta.md), every chunk this rank
 * sends encoded is compared with its snapshot of what it last sent, before the first send, so
 * that stage_move sends each as nothing, its changed elements or dense. Receivers apply them
 * as they land (exec_delta_land, from the move's completions), before the local fan-out reads
 * them.
 */
#include "stage.h"

void stage_encode(struct exec_run *r)
{
    if (r->delta)
        exec_delta_encode(r);
}
