/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Stage 2 of an execution (stage.h): the start vote (exec_hello.c), which every rank joins,
 * even one that already failed in stage 1, so that all reach the same verdict.
 */
#include "stage.h"

#include "base/error.h"

reshard_status_t stage_vote(struct exec *x, const reshard_buffers_t *bufs, uint32_t seq,
                            reshard_status_t local, struct exec_run *r, int on_nccl)
{
    struct rs_saved_error why;
    rs_error_save(&why);
    reshard_status_t st = exec_hello_exchange(x, bufs, seq, local, r, on_nccl);
    if (st == local && local != RESHARD_OK)
        rs_error_restore(&why); /* our own failure says more than the vote's echo of it */
    return st;
}
