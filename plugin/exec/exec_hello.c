/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The start of an execution: every rank checks its buffers against its shards, then one vote
 * of a few bytes a rank (exec_vote.h: the plan and execution it runs, whether it can, whether
 * its buffers changed) gives every rank the same verdict before any byte moves. A rank that
 * cannot run then says why to all (one broadcast from it), and every rank repeats its reason.
 * When some rank's buffers changed, the local pairs tell each other again where to write
 * (exec_link.c); otherwise nothing more is exchanged.
 */
#include "exec_run.h"

#include "exec_vote.h"
#include "base/error.h"
#include "cuda/cuda_lib.h"

#include <stdio.h>
#include <string.h>

/* This rank's buffers against its shards: the first that does not fit, in r. */
static void check_buffers(const struct exec *x, const reshard_buffers_t *bufs, int on_nccl,
                          struct exec_start_report *r)
{
    int me = x->comm->rank;
    for (int t = 0; t < x->plan->ntensors; t++) {
        const struct plan_tensor *pt = &x->plan->tensors[t];
        for (int side = 0; side < 2; side++) {
            const struct rs_shardmap *m = side ? &pt->dst_map : &pt->src_map;
            int pos = shardmap_position(m, me);
            int computed = !side && pt->scales_of >= 0 &&
                           x->plan->tensors[pt->scales_of].quant == PLAN_QUANT_CAST;
            if (pos < 0 || computed) /* scales of a weight quantized on the way: ours */
                continue;
            int64_t shape[RS_MAX_DIMS];
            for (int j = 0; j < pt->dst.ndim; j++)
                shape[j] = dimmap_group_len(&m->dim[j], shardmap_group(m, pos, j));
            uint64_t need = region_span_bytes(m->layout, shape);
            const void *p = side ? bufs[t].dst : bufs[t].src;
            size_t have = side ? bufs[t].dst_bytes : bufs[t].src_bytes;
            struct exec_start_report bad = {.tensor = t, .side = side};
            if (need && (!p || have < need)) {
                bad.status = RESHARD_ERR_BUFFER;
                bad.need = need;
                bad.have = p ? have : 0;
            } else if (on_nccl && bufs[t].mem != RESHARD_MEM_CUDA) {
                bad.status = RESHARD_ERR_INVALID_ARG;
            } else if (!on_nccl &&
                       (bufs[t].mem != RESHARD_MEM_HOST || cuda_mem_kind(p) == CUDA_MEM_DEVICE)) {
                /* staged device buffers are host memory by now */
                bad.status = RESHARD_ERR_UNAVAILABLE;
                bad.need = bufs[t].mem != RESHARD_MEM_HOST; /* declared, or found by the driver */
            }
            if (bad.status != RESHARD_OK) {
                *r = bad;
                return;
            }
        }
    }
}

/* A failure once the bootstrap may be half-way through a collective: so is the communicator. */
static reshard_status_t break_comm(struct reshard_comm *c, reshard_status_t st)
{
    c->broken = st;
    snprintf(c->broken_why, sizeof(c->broken_why), "%s", rs_error_message());
    return st;
}

/* The rank the fold names as failing tells everyone why; every rank repeats it. */
static reshard_status_t hear_failure(struct exec *x, const struct exec_start_fold *f,
                                     struct exec_start_report *mine, reshard_status_t local)
{
    struct reshard_comm *c = x->comm;
    if (f->fail < 0 || f->fail >= c->size || !comm_has(c, f->fail))
        return break_comm(c, rs_error(RESHARD_ERR_REMOTE,
                                      "rank %d: the start vote names rank %d, which is not in "
                                      "the communicator",
                                      c->rank, f->fail));
    struct exec_start_report r = *mine;
    reshard_status_t st = boot_bcast(c->boot, &r, sizeof(r), c->boot_of[f->fail]);
    if (st != RESHARD_OK)
        return break_comm(c, st);
    if (local != RESHARD_OK)
        return local; /* our own failure: its message is already recorded */
    return exec_start_refuse(x->plan, f->fail, &r);
}

reshard_status_t exec_hello_exchange(struct exec *x, const reshard_buffers_t *bufs, uint32_t seq,
                                     reshard_status_t local, struct exec_run *r, int on_nccl)
{
    struct reshard_comm *c = x->comm;
    const reshard_buffers_t *dev = r ? r->dev : NULL;
    uint32_t nexp = 0;
    /* The exports first: a failure to make them is one more reason this rank cannot run. */
    if (local == RESHARD_OK && !on_nccl)
        local = exec_exports_make(x, dev, &nexp);
    if (local == RESHARD_OK && !on_nccl)
        local = exec_links_prepare(x);
    struct exec_start_report mine = {.status = local, .side = EXEC_SIDE_NONE};
    if (local == RESHARD_ERR_UNAVAILABLE) /* only staging fails so before the exchange */
        mine.side = EXEC_SIDE_STAGING;
    if (local != RESHARD_OK)
        snprintf(mine.why, sizeof(mine.why), "%s", rs_error_message());
    else
        check_buffers(x, bufs, on_nccl, &mine);
    int ok = mine.status == RESHARD_OK;
    int changed = ok && !on_nccl && exec_links_changed(x, bufs, dev);
    struct exec_start_fold f;
    exec_start_fold_init(&f, c->rank, x->plan->hash, seq, !ok, changed);
    if (r && ok && !on_nccl)
        exec_start_fold_delta(&f, c->rank, r->delta_can, r->delta_version, r->delta_stale);
    struct rs_saved_error why;
    rs_error_save(&why);
    reshard_status_t st = boot_allreduce(c->boot, &f, sizeof(f), exec_start_combine, NULL);
    if (st != RESHARD_OK) /* the bootstrap is unusable now */
        return break_comm(c, st);
    rs_error_restore(&why);
    if (f.fail != EXEC_VOTE_NONE)
        return hear_failure(x, &f, &mine, local);
    RS_CHECK(exec_start_mismatch(&f, x->plan->hash, seq));
    if (r)
        exec_delta_start(r, f.plain, f.ver_lo, f.ver_hi, f.stale);
    if (!f.changed || on_nccl)
        return RESHARD_OK;
    st = exec_links_announce(x, bufs, dev, seq);
    if (st != RESHARD_OK) { /* messages may be in flight: the others must hear of it */
        break_comm(c, st);
        boot_abort(c->boot, st, c->broken_why);
    }
    return st;
}
