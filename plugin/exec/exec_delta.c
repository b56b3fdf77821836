/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Delta refits on the executor (docs/delta.md): which chunks are encoded, the senders'
 * snapshots, the buffers an encoded run uses, and the versions the start vote compares.
 *
 * A run encodes only when every rank can (the plan asked for deltas, host buffers, its buffers
 * made): the start vote says so. It sends changed elements only when every rank also holds the
 * same version, the last delta run, with the destinations it wrote: otherwise every chunk
 * travels dense, and refreshes the snapshots. A delta is never applied on an unknown state.
 */
#include "exec_run.h"

#include "delta.h"
#include "base/error.h"
#include "base/log.h"
#include "base/param.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ALIGN8(n) (((n) + 7) & ~(uint64_t)7)

/* FP8 destinations quantized on the way (exec_quant.c): a box quantized at its sender travels
 * as the FP8 codes (and scales) of the sender's copy, a box quantized where it lands as the
 * source dtype into the staged copy, whose changed blocks alone are quantized again. */
static int encoded(const struct exec *x, const struct xfer *xf)
{
    (void)x;
    return xf->path == XFER_NET && xf->parent == XFER_NONE &&
           (xf->src_buf == XBUF_SRC || xf->src_buf == XBUF_QSRC) &&
           (xf->dst_buf == XBUF_DST || xf->dst_buf == XBUF_STAGE);
}

/* What stays the same for the plan: which transfers are encoded, where their snapshots and
 * their chunks go. */
static reshard_status_t layout(struct exec *x)
{
    struct exec_delta *d = &x->delta;
    const struct exec_share *s = &x->share;
    int nt = x->plan->ntensors;
    size_t nout_c = s->out_off[s->nout], nin_c = s->in_off[s->nin];
    d->dst_seen = rs_calloc((size_t)nt + 1, sizeof(*d->dst_seen), "delta state");
    d->dst_len = rs_calloc((size_t)nt + 1, sizeof(*d->dst_len), "delta state");
    d->out_enc = rs_calloc(s->nout + 1, 1, "delta state");
    d->in_enc = rs_calloc(s->nin + 1, 1, "delta state");
    d->snap = rs_calloc((size_t)nt + 1, sizeof(char *), "delta state");
    d->snap_at = rs_calloc(nout_c + 1, sizeof(uint64_t), "delta state");
    d->snap_bytes = rs_calloc((size_t)nt + 1, sizeof(uint64_t), "delta state");
    d->snap_state = rs_calloc((size_t)nt + 1, 1, "delta state");
    d->warned = rs_calloc((size_t)nt + 1, 1, "delta state");
    d->enc_at = rs_calloc(nout_c + 1, sizeof(uint64_t), "delta state");
    d->in_at = rs_calloc(nin_c + 1, sizeof(uint64_t), "delta state");
    d->mem = rs_calloc(DELTA_MEM_N + 1, sizeof(char *), "delta state");
    if (!d->dst_seen || !d->dst_len || !d->out_enc || !d->in_enc || !d->snap || !d->snap_at ||
        !d->snap_bytes || !d->snap_state || !d->warned || !d->enc_at || !d->in_at || !d->mem)
        return RESHARD_ERR_NO_MEMORY;
    uint64_t at = 0;
    for (size_t o = 0; o < s->nout; o++) {
        const struct xfer *xf = &x->xs.x[s->out[o]];
        if (!(d->out_enc[o] = (uint8_t)encoded(x, xf)))
            continue;
        uint64_t snap_at = d->snap_bytes[xf->tensor];
        d->snap_bytes[xf->tensor] += (uint64_t)xf->bytes;
        for (size_t c = 0; c < s->out_off[o + 1] - s->out_off[o]; c++) {
            uint64_t b = exec_chunk_bytes_of(&x->cut, xf, (uint32_t)c);
            d->snap_at[s->out_off[o] + c] = snap_at;
            snap_at += b;
            d->enc_at[s->out_off[o] + c] = at;
            at += ALIGN8(delta_encode_cap(b));
            d->max_chunk = b > d->max_chunk ? b : d->max_chunk;
        }
    }
    d->enc_bytes = at;
    at = 0;
    for (size_t k = 0; k < s->nin; k++) {
        const struct xfer *xf = &x->xs.x[s->in[k]];
        if (!(d->in_enc[k] = (uint8_t)encoded(x, xf)))
            continue;
        for (size_t c = 0; c < s->in_off[k + 1] - s->in_off[k]; c++) {
            d->in_at[s->in_off[k] + c] = at;
            at += ALIGN8(exec_chunk_bytes_of(&x->cut, xf, (uint32_t)c));
        }
    }
    d->scratch_bytes = at;
    d->ready = 1;
    return RESHARD_OK;
}

/* The run's buffers: scratch for what arrives, room for what is encoded, and a chunk to pack
 * strided sources into. */
static int make_buffers(struct exec_delta *d)
{
    uint64_t want[DELTA_MEM_N] = {d->scratch_bytes, d->enc_bytes, d->max_chunk};
    for (int i = 0; i < DELTA_MEM_N; i++)
        if (!d->mem[i] && want[i] && !(d->mem[i] = rs_calloc(want[i], 1, "delta buffers")))
            return 0; /* zero pages, touched only where chunks land */
    if (!d->words && d->max_chunk)
        d->words = rs_calloc(d->max_chunk / 64 + 1, 8, "the delta encoder");
    return !d->max_chunk || d->words;
}

/* Each tensor's snapshot: one that cannot be made leaves that tensor dense, said once. */
static void make_snapshots(struct exec *x)
{
    struct exec_delta *d = &x->delta;
    for (int t = 0; t < x->plan->ntensors; t++) {
        if (d->snap[t] || !d->snap_bytes[t])
            continue;
        if (!(d->snap[t] = rs_calloc(d->snap_bytes[t], 1, "a delta snapshot"))) {
            if (!d->warned[t]++)
                rs_log(RS_LOG_WARN,
                       "rank %d: no memory for the delta snapshot of tensor '%s' (%llu bytes): "
                       "it is refit in full",
                       x->comm->rank, x->plan->tensors[t].name,
                       (unsigned long long)d->snap_bytes[t]);
            continue;
        }
        d->snap_state[t] = DELTA_SNAP_MADE;
        d->held += d->snap_bytes[t];
    }
}

void exec_delta_vote(struct exec *x, const reshard_buffers_t *bufs, const reshard_buffers_t *dev,
                     int *can, uint32_t *version)
{
    struct exec_delta *d = &x->delta;
    *can = 0;
    *version = 0;
    if (!d->on)
        return;
    if (dev) {
        if (!d->said++)
            rs_log(RS_LOG_INFO,
                   "rank %d: delta refits: device buffers are refit in full (no device snapshot)",
                   x->comm->rank);
        return;
    }
    if (!d->ready && layout(x) != RESHARD_OK) {
        exec_delta_fini(d, x->plan->ntensors, x->comm);
        d->on = 1; /* tried again at the next refit */
        if (!d->said++)
            rs_log(RS_LOG_WARN, "rank %d: no memory for delta refits' state: refits run in full",
                   x->comm->rank);
        return;
    }
    if (!make_buffers(d)) {
        if (!d->said++)
            rs_log(RS_LOG_WARN, "rank %d: no memory for delta refits' buffers: refits run in full",
                   x->comm->rank);
        return;
    }
    make_snapshots(x);
    *can = 1;
    *version = d->version;
    for (int t = 0; t < x->plan->ntensors; t++)
        if (bufs[t].dst != d->dst_seen[t] || bufs[t].dst_bytes != d->dst_len[t])
            *version = 0; /* new destination buffers: what they hold is not known */
}

void exec_delta_start(struct exec_run *r, int plain_rank, uint32_t lo, uint32_t hi)
{
    struct exec *x = r->x;
    r->delta = x->delta.on && plain_rank == INT32_MAX;
    r->sparse = r->delta && lo == hi && lo != 0;
    if (!x->delta.on || r->sparse)
        return;
    if (!r->delta)
        rs_log(RS_LOG_INFO, "rank %d: delta refit %u in full: rank %d cannot encode", x->comm->rank,
               r->seq, plain_rank);
    else if (hi == 0)
        rs_log(RS_LOG_INFO, "rank %d: delta refit %u in full: no rank holds a previous refit",
               x->comm->rank, r->seq);
    else
        rs_log(RS_LOG_INFO,
               "rank %d: delta refit %u in full: some rank's destinations do not hold the last "
               "refit (a first refit, new buffers, or one that did not complete)",
               x->comm->rank, r->seq);
}

/* ---- the sender ---- */

/* RESHARD_TEST_DELTA_FORGE=N: rank N - 1 claims one changed element more than its first
 * encoded chunk carries (the receivers' check is the test). */
static void forge(struct exec *x, char *msg)
{
    if (rs_param_int(RS_PARAM_TEST_DELTA_FORGE) != x->comm->rank + 1 || x->delta.forged++)
        return;
    struct delta_hdr h;
    memcpy(&h, msg, sizeof(h));
    h.nchanged++;
    memcpy(msg, &h, sizeof(h));
    rs_log(RS_LOG_WARN, "rank %d: RESHARD_TEST_DELTA_FORGE forged a delta chunk", x->comm->rank);
}

int exec_delta_out(struct exec_run *r, uint32_t o, uint32_t chunk, const char **buf, size_t *len)
{
    struct exec *x = r->x;
    struct exec_delta *d = &x->delta;
    if (!r->delta || !d->out_enc[o])
        return 0;
    const struct xfer *xf = &x->xs.x[x->share.out[o]];
    size_t i = x->share.out_off[o] + chunk, es = xfer_esize(x->plan, xf);
    uint32_t t = xf->tensor;
    if (!d->snap[t]) /* no snapshot: dense, as always */
        return 0;
    struct region rg;
    uint64_t off;
    exec_chunk_region(&x->cut, xf, chunk, 0, &rg);
    uint64_t bytes = region_bytes(&rg);
    const char *base = exec_post_base(r, xf, 0), *cur = base;
    if (region_contiguous(&rg, &off))
        cur += off;
    else
        region_pack(&rg, base, (char *)(cur = d->mem[DELTA_MEM_PACK]));
    char *snap = d->snap[t] + d->snap_at[i], *out = d->mem[DELTA_MEM_ENC] + d->enc_at[i];
    if (!r->sparse || d->snap_state[t] != DELTA_SNAP_HELD) {
        memcpy(snap, cur, bytes); /* dense this time: the snapshot is what it sends */
        return 0;
    }
    size_t n;
    delta_encode(cur, snap, bytes / es, es, out, &n, d->words);
    if (!n)
        return 0; /* dense after all: len stays the chunk's */
    forge(x, out);
    *buf = out;
    *len = n;
    return 1;
}

/* ---- the receiver ---- */

char *exec_delta_in(const struct exec_run *r, size_t k, uint32_t chunk)
{
    const struct exec_delta *d = &r->x->delta;
    if (!r->delta || !d->in_enc[k])
        return NULL;
    return d->mem[DELTA_MEM_SCRATCH] + d->in_at[r->x->share.in_off[k] + chunk];
}

reshard_status_t exec_delta_land(struct exec_run *r, size_t k, uint32_t chunk, size_t bytes)
{
    struct exec *x = r->x;
    const struct xfer *xf = &x->xs.x[x->share.in[k]];
    const char *msg = exec_delta_in(r, k, chunk);
    struct region rg;
    exec_chunk_region(&x->cut, xf, chunk, 1, &rg);
    char *base = exec_post_base(r, xf, 1);
    uint64_t want = region_bytes(&rg);
    if (bytes == want) { /* dense */
        region_unpack(&rg, base, msg);
        if (xf->dst_buf == XBUF_STAGE && r->sparse) /* every block of it changed */
            exec_quant_touched(x, x->share.in[k], &rg, NULL);
        return RESHARD_OK;
    }
    char why[96];
    size_t es = xfer_esize(x->plan, xf);
    if (!r->sparse) /* a delta on a state the vote did not agree on: never applied */
        snprintf(why, sizeof(why), "a delta where the start vote said every chunk is dense");
    if (!r->sparse || delta_check(msg, bytes, want / es, es, why, sizeof(why)) != RESHARD_OK)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "rank %d: chunk %u of tensor '%s' from rank %d refused (%zu bytes): %s",
                        x->comm->rank, chunk, x->plan->tensors[xf->tensor].name, xf->src, bytes,
                        why);
    delta_apply(msg, &rg, base);
    if (xf->dst_buf == XBUF_STAGE) /* the blocks it changed, quantized again */
        exec_quant_touched(x, x->share.in[k], &rg, msg);
    return RESHARD_OK;
}

/* ---- after the run ---- */

void exec_delta_done(struct exec *x, const struct exec_run *r, const reshard_buffers_t *bufs,
                     int ok)
{
    struct exec_delta *d = &x->delta;
    if (!d->ready)
        return;
    d->version = ok && r && r->delta ? r->seq + 1 : 0; /* wraps to 0 once: a full refit */
    for (int t = 0; t < x->plan->ntensors; t++) {
        if (d->snap_state[t] != DELTA_SNAP_NONE) /* a plain run sent past the snapshot */
            d->snap_state[t] = d->version ? DELTA_SNAP_HELD : DELTA_SNAP_MADE;
        d->dst_seen[t] = d->version ? bufs[t].dst : NULL;
        d->dst_len[t] = d->version ? bufs[t].dst_bytes : 0;
    }
}

uint64_t exec_delta_snapshot_bytes(const struct exec *x)
{
    uint64_t n = 0;
    for (size_t o = 0; o < x->share.nout; o++) {
        const struct xfer *xf = &x->xs.x[x->share.out[o]];
        n += encoded(x, xf) ? (uint64_t)xf->bytes : 0;
    }
    return n;
}

uint64_t exec_delta_held(const struct exec *x)
{
    return x->delta.held;
}

void exec_delta_fini(struct exec_delta *d, int ntensors, struct reshard_comm *c)
{
    for (int t = 0; d->snap && t < ntensors; t++)
        free(d->snap[t]);
    exec_bufs_release(d->mem, DELTA_MEM_N, c); /* a failed run's requests may still use them */
    free(d->snap);
    free(d->dst_seen);
    free(d->dst_len);
    free(d->out_enc);
    free(d->in_enc);
    free(d->snap_at);
    free(d->snap_bytes);
    free(d->snap_state);
    free(d->warned);
    free(d->enc_at);
    free(d->in_at);
    free(d->words);
    *d = (struct exec_delta){0};
}
