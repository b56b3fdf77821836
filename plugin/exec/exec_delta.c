/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Delta refits on the executor (docs/delta.md): which chunks are encoded, the senders'
 * snapshots, the buffers an encoded run uses, and the versions the start vote compares.
 *
 * A rank encodes what it sends when it can (the plan asked for deltas, its buffers made, and
 * for device buffers the kernels loaded and device scratch made: exec_delta_dev.c). Versions are
 * per (tensor, destination): a chunk carries changes only when the sender's snapshot of its tensor
 * and the destination both hold the plan's last refit, which every rank agrees on in the start
 * vote. Each rank adds the destinations that do not (new buffers, a run in full there, a refit
 * found wrong, a rank that cannot encode) to the vote's stale filter; their senders send them
 * dense, into the destination itself, and refresh the snapshots. A delta is never applied on an
 * unknown state: a destination that is not known to hold the last refit takes no scratch, so a
 * short message to it is refused by its length.
 */
#include "exec_run.h"

#include "delta.h"
#include "exec_delta_dev.h"
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
int exec_delta_encoded(const struct exec *x, const struct xfer *xf)
{
    (void)x;
    return xf->path == XFER_NET && xf->parent == XFER_NONE &&
           (xf->src_buf == XBUF_SRC || xf->src_buf == XBUF_QSRC) &&
           (xf->dst_buf == XBUF_DST || xf->dst_buf == XBUF_STAGE);
}

/* A local transfer out of a forwarder's destination into a peer's, unquantized: what the
 * receiving end knows of a forward (its parent is the forwarder's alone). Its chunks may come as
 * the encoding its forwarder got, in a message instead of a cross-memory write. */
static int forwarded(const struct exec *x, const struct xfer *xf)
{
    return xf->path == XFER_LOCAL && xf->src_buf == XBUF_DST && xf->dst_buf == XBUF_DST &&
           x->plan->tensors[xf->tensor].quant == PLAN_QUANT_NONE;
}

/* The forwarder's side: a forward of the very box (and chunks) its parent brought encoded, so
 * that its parent's encoding applies to the child's chunks element for element. -1: none. */
static long forward_of(const struct exec *x, const struct xfer *xf, size_t nchunks)
{
    if (!forwarded(x, xf) || xf->parent >= XFER_AFTER_INPUTS)
        return -1;
    const struct xfer *p = &x->xs.x[xf->parent];
    long k = exec_share_in_pos(&x->share, xf->parent);
    int nd = x->plan->tensors[xf->tensor].dst.ndim;
    if (k < 0 || !exec_delta_encoded(x, p) || p->bytes != xf->bytes ||
        x->share.in_off[k + 1] - x->share.in_off[k] != nchunks ||
        memcmp(x->xs.coords + p->box, x->xs.coords + xf->box, 2 * (size_t)nd * sizeof(int64_t)))
        return -1;
    return k;
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
    d->dst_ver = rs_calloc((size_t)nt + 1, sizeof(*d->dst_ver), "delta state");
    d->dst_why = rs_calloc((size_t)nt + 1, 1, "delta state");
    d->in_t = rs_calloc((size_t)nt + 1, 1, "delta state");
    d->snap_ver = rs_calloc((size_t)nt + 1, sizeof(*d->snap_ver), "delta state");
    d->out_enc = rs_calloc(s->nout + 1, 1, "delta state");
    d->in_enc = rs_calloc(s->nin + 1, 1, "delta state");
    d->snap = rs_calloc((size_t)nt + 1, sizeof(char *), "delta state");
    d->snap_at = rs_calloc(nout_c + 1, sizeof(uint64_t), "delta state");
    d->snap_bytes = rs_calloc((size_t)nt + 1, sizeof(uint64_t), "delta state");
    d->warned = rs_calloc((size_t)nt + 1, 1, "delta state");
    d->enc_at = rs_calloc(nout_c + 1, sizeof(uint64_t), "delta state");
    d->in_at = rs_calloc(nin_c + 1, sizeof(uint64_t), "delta state");
    d->in_len = rs_calloc(nin_c + 1, sizeof(uint32_t), "delta state");
    d->in_streak = rs_calloc(nin_c + 1, 1, "delta state");
    d->out_streak = rs_calloc(nout_c + 1, 1, "delta state");
    d->snap_ok = rs_calloc(nout_c + 1, 1, "delta state");
    d->in_dev = rs_calloc(nin_c + 1, 1, "delta state");
    d->fwd_of = rs_calloc(s->nout + 1, sizeof(long), "delta state");
    d->mem = rs_calloc(DELTA_MEM_N + 1, sizeof(char *), "delta state");
    if (!d->dst_seen || !d->dst_len || !d->dst_ver || !d->dst_why || !d->in_t || !d->snap_ver ||
        !d->out_enc || !d->in_enc || !d->snap || !d->snap_at || !d->snap_bytes || !d->warned ||
        !d->enc_at || !d->in_at || !d->in_len || !d->in_streak || !d->out_streak || !d->snap_ok ||
        !d->in_dev || !d->fwd_of || !d->mem)
        return RESHARD_ERR_NO_MEMORY;
    uint64_t at = 0;
    for (size_t o = 0; o < s->nout; o++) {
        const struct xfer *xf = &x->xs.x[s->out[o]];
        d->fwd_of[o] = forward_of(x, xf, s->out_off[o + 1] - s->out_off[o]);
        if (!(d->out_enc[o] = (uint8_t)exec_delta_encoded(x, xf)))
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
        d->in_enc[k] = exec_delta_encoded(x, xf) ? DELTA_IN_NET
                       : forwarded(x, xf)        ? DELTA_IN_FWD
                                                 : 0;
        if (!d->in_enc[k])
            continue;
        d->in_t[xf->tensor] = 1;
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

/* Each tensor's snapshot: one that cannot be made leaves that tensor dense, said once. A device
 * source's is on the device (exec_delta_dev.c). */
static void make_snapshots(struct exec *x, const reshard_buffers_t *dev)
{
    struct exec_delta *d = &x->delta;
    for (int t = 0; t < x->plan->ntensors; t++) {
        if (d->snap[t] || !d->snap_bytes[t] ||
            (dev && dev[t].mem == RESHARD_MEM_CUDA && dev[t].src && dev[t].src_bytes &&
             x->plan->tensors[t].quant == PLAN_QUANT_NONE))
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
        d->snap_ver[t] = 0; /* holds nothing yet */
        d->held += d->snap_bytes[t];
    }
}

/* ---- the stale filter ---- */

/* A destination (tensor t, rank) sets two of the filter's bits; DELTA_ALL in place of t: every
 * tensor of that rank. */
#define DELTA_ALL  UINT32_MAX
#define STALE_BITS (EXEC_STALE_WORDS * 64)
/* In place of t: this rank cannot encode this run (it sends nothing encoded, gets everything in
 * full, and may keep no count of its chunks). */
#define DELTA_PLAIN (UINT32_MAX - 1)
/* Past this many stale tensors, a rank says "all of mine" (keeps the filter sparse). */
#define STALE_MAX_NAMED 8

static uint64_t stale_hash(uint32_t t, int rank)
{
    uint64_t z = ((uint64_t)t << 32 | (uint32_t)rank) + 0x9e3779b97f4a7c15u;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

static void stale_add(uint64_t *f, uint32_t t, int rank)
{
    uint64_t h = stale_hash(t, rank);
    f[(h % STALE_BITS) / 64] |= UINT64_C(1) << (h % 64);
    h >>= 16;
    f[(h % STALE_BITS) / 64] |= UINT64_C(1) << (h % 64);
}

static int stale_one(const uint64_t *f, uint32_t t, int rank)
{
    uint64_t h = stale_hash(t, rank), g = h >> 16;
    return (f[(h % STALE_BITS) / 64] >> (h % 64) & 1) && (f[(g % STALE_BITS) / 64] >> (g % 64) & 1);
}

/* Does the world's filter say that rank's destination of tensor t does not hold the last refit
 * (or may not: a false positive sends it in full)? */
static int stale(const struct exec_run *r, uint32_t t, int rank)
{
    return stale_one(r->delta_stale, t, rank) || stale_one(r->delta_stale, DELTA_ALL, rank);
}

/* Do both ends of a chunk from src to dst count its streak (below) this run? Both read it alike
 * from the vote's filter; when not (one of them cannot encode, so may keep no count), both start
 * the count again. */
static int tracks(const struct exec_run *r, int src, int dst)
{
    return !stale_one(r->delta_stale, DELTA_PLAIN, src) &&
           !stale_one(r->delta_stale, DELTA_PLAIN, dst);
}

/* A chunk that travelled dense `streak` runs in a row (both ends count alike) travels dense
 * again, received in place and sent without a snapshot, except every DELTA_PROBE-th run, when
 * the encoder looks again (and the run before it, when the sender refreshes the snapshot). At
 * 100% changed that spares the compare, the snapshot and the receiver's copy 6 runs in 8; a
 * chunk whose changes drop to a few goes back to deltas within DELTA_PROBE runs. */
#define DELTA_PROBE 8
static int forced(uint8_t streak)
{
    return streak >= 2 && streak % DELTA_PROBE != 0;
}

static const char *const why_text[] = {
    [DELTA_WHY_FIRST] = "its first refit",
    [DELTA_WHY_BUFFERS] = "new destination buffers",
    [DELTA_WHY_FULL] = "the last refit went to it in full",
    [DELTA_WHY_VERIFY] = "a verified refit found a destination wrong",
    [DELTA_WHY_FP8_DEVICE] = "a quantized tensor's device destination",
};

/* The buffers of tensor t whose destination is compared: the caller's device buffer for a
 * device tensor (its host shadow is reused across buffers), else the host one. */
static const reshard_buffers_t *dst_of(const reshard_buffers_t *bufs, const reshard_buffers_t *dev,
                                       int t)
{
    return dev && dev[t].mem == RESHARD_MEM_CUDA ? &dev[t] : &bufs[t];
}

/* A quantized tensor's device destination: its FP8 codes land in the host shadow and are
 * copied whole to the device, so nothing on the device is known to hold a refit; it goes in
 * full every refit (exec_delta_dev.c never applies quantized chunks on the device). */
static int fp8_on_dev(const struct exec *x, const reshard_buffers_t *dev, int t)
{
    return dev && dev[t].mem == RESHARD_MEM_CUDA && x->plan->tensors[t].quant != PLAN_QUANT_NONE;
}

/* Does this rank's destination of tensor t (bufs, or dev for a device tensor) hold the last
 * refit? */
static int holds_last(const struct exec *x, const reshard_buffers_t *bufs,
                      const reshard_buffers_t *dev, int t)
{
    const struct exec_delta *d = &x->delta;
    const reshard_buffers_t *b = dst_of(bufs, dev, t);
    return !fp8_on_dev(x, dev, t) && d->last && d->dst_ver[t] == d->last &&
           b->dst == d->dst_seen[t] && b->dst_bytes == d->dst_len[t];
}

/* This rank's destinations that do not hold the last refit, into f. */
static void stale_mine(const struct exec *x, const reshard_buffers_t *bufs,
                       const reshard_buffers_t *dev, uint64_t *f)
{
    const struct exec_delta *d = &x->delta;
    int me = x->comm->rank, n = 0;
    for (int t = 0; t < x->plan->ntensors; t++)
        if (d->in_t[t] && !holds_last(x, bufs, dev, t) && ++n <= STALE_MAX_NAMED)
            stale_add(f, (uint32_t)t, me);
    if (n > STALE_MAX_NAMED)
        stale_add(f, DELTA_ALL, me);
}

void exec_delta_vote(struct exec *x, const reshard_buffers_t *bufs, const reshard_buffers_t *dev,
                     struct exec_run *r)
{
    struct exec_delta *d = &x->delta;
    r->delta_can = 0;
    r->delta_version = d->last;
    memset(r->delta_stale, 0, sizeof(r->delta_stale));
    if (!d->on)
        return;
    stale_add(r->delta_stale, DELTA_ALL, x->comm->rank); /* until it can encode */
    stale_add(r->delta_stale, DELTA_PLAIN, x->comm->rank);
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
    if (!exec_delta_dev_prepare(x, dev)) /* says why */
        return;
    make_snapshots(x, dev);
    r->delta_can = 1;
    memset(r->delta_stale, 0, sizeof(r->delta_stale));
    stale_mine(x, bufs, dev, r->delta_stale);
}

/* The tensors that come here in full in a run that carries changes, and why (INFO). */
static void say_stale(const struct exec_run *r)
{
    const struct exec *x = r->x;
    const struct exec_delta *d = &x->delta;
    int n = 0, first = -1;
    for (int t = 0; t < x->plan->ntensors; t++)
        if (d->in_t[t] && !holds_last(x, r->bufs, r->dev, t) && n++ == 0)
            first = t;
    if (!n)
        return;
    int moved = d->dst_ver[first] && !holds_last(x, r->bufs, r->dev, first);
    int why = fp8_on_dev(x, r->dev, first) ? DELTA_WHY_FP8_DEVICE
              : moved                      ? DELTA_WHY_BUFFERS
                                           : d->dst_why[first];
    rs_log(RS_LOG_INFO,
           "rank %d: delta refit %u: %d tensor(s) come here in full, '%s' the first (%s)",
           x->comm->rank, r->seq, n, x->plan->tensors[first].name, why_text[why]);
}

void exec_delta_start(struct exec_run *r, int plain_rank, uint32_t lo, uint32_t hi,
                      const uint64_t *stale_world)
{
    struct exec *x = r->x;
    r->delta = x->delta.on && r->delta_can;
    r->sparse = r->delta && lo == hi && lo != 0;
    memcpy(r->delta_stale, stale_world, sizeof(r->delta_stale));
    if (!x->delta.on)
        return;
    if (x->delta.ready) /* nothing applied on the device yet */
        memset(x->delta.in_dev, 0, x->share.in_off[x->share.nin]);
    if (r->sparse) {
        say_stale(r);
        if (plain_rank != INT32_MAX && plain_rank != x->comm->rank)
            rs_log(RS_LOG_INFO,
                   "rank %d: delta refit %u: rank %d cannot encode: what it sends and gets goes "
                   "in full",
                   x->comm->rank, r->seq, plain_rank);
    } else if (!r->delta) {
        rs_log(RS_LOG_INFO, "rank %d: delta refit %u in full here: this rank cannot encode",
               x->comm->rank, r->seq);
    } else if (hi == 0) {
        rs_log(RS_LOG_INFO, "rank %d: delta refit %u in full: no rank holds a previous refit",
               x->comm->rank, r->seq);
    } else {
        rs_log(RS_LOG_INFO,
               "rank %d: delta refit %u in full: the ranks hold different last refits (%u..%u)",
               x->comm->rank, r->seq, lo, hi);
    }
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
    if (!d->ready || !d->out_enc[o])
        return 0;
    const struct xfer *xf = &x->xs.x[x->share.out[o]];
    size_t i = x->share.out_off[o] + chunk, es = xfer_esize(x->plan, xf);
    uint32_t t = xf->tensor;
    int track = tracks(r, x->comm->rank, xf->dst);
    uint8_t streak = track ? d->out_streak[i] : 0, dense = (uint8_t)(streak + 1);
    int on_dev = exec_delta_dev_sends(r, xf); /* compared on the device (exec_delta_dev.c) */
    if (!r->delta || !(on_dev ? exec_delta_dev_snap(x, t) : d->snap[t] != NULL)) {
        d->out_streak[i] = track ? dense : 0; /* no snapshot: dense, as always */
        d->snap_ok[i] = 0;
        return 0;
    }
    int compare = track && r->sparse && !forced(streak) && !stale(r, t, xf->dst) &&
                  d->snap_ver[t] == d->last && d->snap_ok[i];
    if (on_dev) { /* the chunk ends in the source's shadow unless its encoding is shorter */
        int how = compare                                  ? DELTA_DEV_COMPARE
                  : track && forced((uint8_t)(streak + 1)) ? DELTA_DEV_SHADOW
                                                           : DELTA_DEV_SNAPSHOT;
        int n = exec_delta_dev_out(r, o, chunk, how, buf, len);
        d->out_streak[i] = n ? 0 : track ? dense : 0;
        d->snap_ok[i] = how != DELTA_DEV_SHADOW;
        if (n)
            forge(x, (char *)*buf);
        return n;
    }
    struct region rg;
    uint64_t off;
    exec_chunk_region(&x->cut, xf, chunk, 0, &rg);
    uint64_t bytes = region_bytes(&rg);
    const char *base = exec_post_base(r, xf, 0), *cur;
    char *snap = d->snap[t] + d->snap_at[i], *out = d->mem[DELTA_MEM_ENC] + d->enc_at[i];
    int contiguous = region_contiguous(&rg, &off);
    cur = base + (contiguous ? off : 0);
    if (compare) {
        if (!contiguous)
            region_pack(&rg, base, (char *)(cur = d->mem[DELTA_MEM_PACK]));
        size_t n;
        delta_encode(cur, snap, bytes / es, es, out, &n, d->words); /* snap holds cur now */
        d->out_streak[i] = n ? 0 : dense;
        if (n)
            forge(x, out);
        *buf = n ? out : snap; /* dense after all: from the snapshot, packed already */
        *len = n ? n : bytes;
        return 1;
    }
    d->out_streak[i] = track ? dense : 0;
    if (forced(d->out_streak[i])) { /* dense next time too: no snapshot, sent as always */
        d->snap_ok[i] = 0;
        return 0;
    }
    /* The next run may encode: the snapshot holds what is sent, and is what is sent. */
    if (contiguous)
        memcpy(snap, cur, bytes);
    else
        region_pack(&rg, base, snap);
    d->snap_ok[i] = 1;
    *buf = snap;
    *len = bytes;
    return 1;
}

/* ---- the receiver ---- */

/* Where chunk `chunk` of in[k] lands when it may come encoded (kind: DELTA_IN_*), or NULL: it
 * comes in full, straight into the destination. */
static char *scratch(const struct exec_run *r, size_t k, uint32_t chunk, int kind)
{
    const struct exec *x = r->x;
    struct exec_delta *d = &r->x->delta;
    if (!r->sparse || d->in_enc[k] != kind)
        return NULL;
    d->in_len[x->share.in_off[k] + chunk] = 0; /* until it lands encoded */
    /* Not known to hold the last refit (by this rank or by the filter, as its senders see it):
     * in full, straight into the destination. */
    const struct xfer *xf = &x->xs.x[x->share.in[k]];
    size_t i = x->share.in_off[k] + chunk;
    if (!holds_last(x, r->bufs, r->dev, (int)xf->tensor) || stale(r, xf->tensor, x->comm->rank) ||
        !tracks(r, xf->src, x->comm->rank))
        return NULL;
    if (kind == DELTA_IN_NET && forced(d->in_streak[i])) /* comes dense: the sender knows too */
        return NULL;
    return d->mem[DELTA_MEM_SCRATCH] + d->in_at[i];
}

char *exec_delta_in(const struct exec_run *r, size_t k, uint32_t chunk)
{
    return scratch(r, k, chunk, DELTA_IN_NET);
}

char *exec_delta_fwd_in(const struct exec_run *r, size_t k, uint32_t chunk)
{
    return scratch(r, k, chunk, DELTA_IN_FWD);
}

reshard_status_t exec_delta_land(struct exec_run *r, size_t k, uint32_t chunk, size_t bytes)
{
    struct exec *x = r->x;
    struct exec_delta *d = &x->delta;
    const struct xfer *xf = &x->xs.x[x->share.in[k]];
    size_t i = x->share.in_off[k] + chunk;
    const char *msg = d->mem[DELTA_MEM_SCRATCH] + d->in_at[i];
    struct region rg;
    exec_chunk_region(&x->cut, xf, chunk, 1, &rg);
    char *base = exec_post_base(r, xf, 1);
    uint64_t want = region_bytes(&rg);
    int on_dev = exec_delta_dev_lands(r, xf); /* a device destination: the chunk goes there */
    if (bytes == want) {                      /* dense */
        if (on_dev) {
            RS_CHECK(exec_delta_dev_land(r, xf, chunk, msg, bytes));
            d->in_dev[i] = 1;
            return RESHARD_OK;
        }
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
    if (on_dev) {
        RS_CHECK(exec_delta_dev_land(r, xf, chunk, msg, bytes));
        d->in_dev[i] = 1;
    } else {
        delta_apply(msg, &rg, base);
    }
    if (xf->dst_buf == XBUF_STAGE) /* the blocks it changed, quantized again */
        exec_quant_touched(x, x->share.in[k], &rg, msg);
    d->in_len[i] = (uint32_t)bytes; /* a forward of it may pass the encoding on */
    return RESHARD_OK;
}

int exec_delta_on_dev(const struct exec_run *r, size_t k, uint32_t chunk)
{
    const struct exec_delta *d = &r->x->delta;
    return d->ready && d->in_dev[r->x->share.in_off[k] + chunk];
}

void exec_delta_arrived(const struct exec_run *r, size_t k, uint32_t chunk, size_t bytes)
{
    const struct exec *x = r->x;
    struct exec_delta *d = &r->x->delta;
    if (!d->ready || d->in_enc[k] != DELTA_IN_NET)
        return;
    const struct xfer *xf = &x->xs.x[x->share.in[k]];
    size_t i = x->share.in_off[k] + chunk;
    int dense = bytes == exec_chunk_bytes_of(&x->cut, xf, chunk);
    d->in_streak[i] = !tracks(r, xf->src, x->comm->rank) || !dense
                          ? 0
                          : (uint8_t)(d->in_streak[i] + 1); /* as its sender counts */
}

int exec_delta_fwd_out(const struct exec_run *r, uint32_t o, uint32_t chunk, const char **buf,
                       size_t *len)
{
    const struct exec *x = r->x;
    const struct exec_delta *d = &x->delta;
    long k = r->sparse ? d->fwd_of[o] : -1;
    if (k < 0)
        return 0;
    size_t i = x->share.in_off[k] + chunk;
    const struct xfer *xf = &x->xs.x[x->share.out[o]];
    if (!d->in_len[i] || stale(r, xf->tensor, xf->dst)) /* it came dense, or the peer needs it */
        return 0;
    *buf = d->mem[DELTA_MEM_SCRATCH] + d->in_at[i];
    *len = d->in_len[i];
    return 1;
}

/* ---- after the run ---- */

void exec_delta_done(struct exec *x, const struct exec_run *r, const reshard_buffers_t *bufs,
                     int ok)
{
    struct exec_delta *d = &x->delta;
    uint32_t v = ok ? r->seq + 1 : 0; /* wraps to 0 once: a full refit */
    d->last = v;
    if (!d->ready)
        return;
    for (int t = 0; t < x->plan->ntensors; t++) {
        /* A snapshot holds this refit when every chunk of it went through exec_delta_out. */
        int snap = d->snap[t] || exec_delta_dev_snap(x, (uint32_t)t);
        d->snap_ver[t] = v && r->delta && snap ? v : 0;
        if (v && r->delta) { /* every chunk landed here: dense, or applied on the last refit */
            const reshard_buffers_t *b = dst_of(bufs, r->dev, t);
            d->dst_ver[t] = v;
            d->dst_seen[t] = b->dst;
            d->dst_len[t] = b->dst_bytes;
        } else {
            d->dst_ver[t] = 0;
            d->dst_why[t] = v ? DELTA_WHY_FULL : DELTA_WHY_FIRST;
        }
    }
}

/* What the destinations hold is not known (an execution on NCCL's stream, a verified refit that
 * found one wrong): each goes in full next. */
static void forget(struct exec *x, enum delta_why why)
{
    struct exec_delta *d = &x->delta;
    for (int t = 0; d->ready && t < x->plan->ntensors; t++) {
        d->dst_ver[t] = 0;
        d->dst_why[t] = (uint8_t)why;
    }
}

void exec_delta_forget_dst(struct exec *x)
{
    forget(x, DELTA_WHY_VERIFY);
}

void exec_delta_nccl(struct exec *x)
{
    struct exec_delta *d = &x->delta;
    forget(x, DELTA_WHY_FULL);
    for (int t = 0; d->ready && t < x->plan->ntensors; t++)
        d->snap_ver[t] = 0;
    d->last = 0;
}

uint64_t exec_delta_snapshot_bytes(const struct exec *x)
{
    uint64_t n = 0;
    for (size_t o = 0; o < x->share.nout; o++) {
        const struct xfer *xf = &x->xs.x[x->share.out[o]];
        n += exec_delta_encoded(x, xf) ? (uint64_t)xf->bytes : 0;
    }
    return n;
}

uint64_t exec_delta_held(const struct exec *x)
{
    return x->delta.held + exec_delta_dev_held(x);
}

void exec_delta_fini(struct exec_delta *d, int ntensors, struct reshard_comm *c)
{
    exec_delta_dev_fini(d, ntensors);
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
    free(d->dst_ver);
    free(d->dst_why);
    free(d->in_t);
    free(d->snap_ver);
    free(d->warned);
    free(d->enc_at);
    free(d->in_at);
    free(d->in_len);
    free(d->in_streak);
    free(d->out_streak);
    free(d->snap_ok);
    free(d->in_dev);
    free(d->fwd_of);
    free(d->words);
    *d = (struct exec_delta){0};
}
