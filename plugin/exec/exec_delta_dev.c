/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Delta refits of device buffers (exec_delta_dev.h, docs/delta.md).
 *
 * Sender: a device source's snapshot is one device allocation per tensor (the chunks at the
 * host path's snap_at offsets), made at its first delta refit and kept with the plan. Each
 * encoded chunk is compared and compacted on the GPU (a strided chunk packed first); only the
 * message comes back over PCIe, into the host path's encode arena, and goes out as the host
 * path's would. A chunk that travels dense (a run in full, or nearly everything changed) is
 * copied to the source's host shadow and sent from there; the source is never staged whole.
 * Receiver: an encoded transfer into a device destination lands on the device: a dense chunk
 * is copied in from the receive scratch, a delta (checked on the host first) is copied to
 * device scratch and applied there by a kernel (a strided chunk packed, applied, unpacked).
 * So the destination's shadow is not used, and the device holds the version the vote agreed on.
 * All of it runs on the legacy default stream and ends each chunk synchronized: the caller's
 * buffers are never read after the refit returns.
 */
#include "exec_delta_dev.h"

#include "delta.h"
#include "base/error.h"
#include "base/log.h"
#include "cuda/cuda_lib.h"
#include "cuda/delta_desc.h"
#include "cuda/pack_desc.h"

#include <stdlib.h>
#include <string.h>

_Static_assert(RS_DELTA_MAGIC == DELTA_MAGIC && RS_DELTA_NONE == DELTA_NONE &&
                   RS_DELTA_BITMAP == DELTA_BITMAP && RS_DELTA_RUNS == DELTA_RUNS &&
                   RS_DELTA_HDR == sizeof(struct delta_hdr),
               "the kernels write the host codec's header");

#define ALIGN256(n) (((n) + 255) & ~(uint64_t)255)

/* Scratch for one chunk of at most `chunk` bytes, in one device allocation. */
enum { W_PACK, W_MSG, W_WORDS, W_CNT, W_STARTS, W_INFO, W_N };

struct exec_delta_dev {
    int said; /* why this rank's device buffers are refit in full, said once */
    int told; /* where the snapshots are, said once */
    cu_deviceptr *snap;
    uint8_t *warned; /* [ntensors]: its snapshot could not be made, said once */
    uint64_t held;
    cu_deviceptr work;
    uint64_t chunk, at[W_N + 1];
};

/* Quantized tensors (FP8 codes made on the host, from the staged source) are never compared or
 * applied on the device: a device source of one is staged and compared on the host, and a device
 * destination of one is refit in full (exec_delta.c's holds_last). */
static int on_dev_src(const struct exec *x, const reshard_buffers_t *dev, uint32_t t)
{
    return dev && dev[t].mem == RESHARD_MEM_CUDA && dev[t].src && dev[t].src_bytes &&
           x->plan->tensors[t].quant == PLAN_QUANT_NONE;
}

static int on_dev_dst(const struct exec *x, const reshard_buffers_t *dev, uint32_t t)
{
    return dev && dev[t].mem == RESHARD_MEM_CUDA && dev[t].dst && dev[t].dst_bytes &&
           x->plan->tensors[t].quant == PLAN_QUANT_NONE;
}

static const void *dptr_void(cu_deviceptr p)
{
    return (const void *)(uintptr_t)p;
}

/* Frees a device allocation in the context that made it (not necessarily the current one). */
static void dev_free(cu_deviceptr p)
{
    struct rs_saved_error saved; /* freeing is not failing */
    rs_error_save(&saved);
    if (p && cuda_context_of(dptr_void(p)) == RESHARD_OK)
        cuda_lib()->mem_free(p);
    rs_error_restore(&saved);
}

static void drop_dev_snap(struct exec_delta *d, uint32_t t)
{
    struct exec_delta_dev *v = d->dev;
    dev_free(v->snap[t]);
    v->snap[t] = 0;
    v->held -= d->snap_bytes[t];
    d->snap_ver[t] = 0;
}

/* The largest encoded chunk this rank compares or applies on the device (0: none). */
static uint64_t dev_chunk(const struct exec *x, const reshard_buffers_t *dev)
{
    const struct exec_share *s = &x->share;
    uint64_t most = 0;
    for (size_t o = 0; o < s->nout; o++) {
        const struct xfer *xf = &x->xs.x[s->out[o]];
        for (size_t c = 0; x->delta.out_enc[o] && xf->src_buf == XBUF_SRC &&
                           on_dev_src(x, dev, xf->tensor) && c < s->out_off[o + 1] - s->out_off[o];
             c++) {
            uint64_t b = exec_chunk_bytes_of(&x->cut, xf, (uint32_t)c);
            most = b > most ? b : most;
        }
    }
    for (size_t k = 0; k < s->nin; k++) {
        const struct xfer *xf = &x->xs.x[s->in[k]];
        for (size_t c = 0; x->delta.in_enc[k] && xf->dst_buf == XBUF_DST &&
                           on_dev_dst(x, dev, xf->tensor) && c < s->in_off[k + 1] - s->in_off[k];
             c++) {
            uint64_t b = exec_chunk_bytes_of(&x->cut, xf, (uint32_t)c);
            most = b > most ? b : most;
        }
    }
    return most;
}

/* The kernels and the scratch for chunks of `chunk` bytes; 0 and why (said once) if not. */
static int dev_work(struct exec *x, uint64_t chunk)
{
    struct exec_delta_dev *v = x->delta.dev;
    if (v->work && v->chunk >= chunk)
        return 1;
    struct rs_saved_error saved;
    rs_error_save(&saved);
    reshard_status_t st = cuda_kernels();
    if (st != RESHARD_OK) {
        if (!v->said++)
            rs_log(RS_LOG_INFO, "rank %d: delta refits: device buffers are refit in full: %s",
                   x->comm->rank, rs_error_message());
        rs_error_restore(&saved);
        return 0;
    }
    uint64_t nw = (chunk + 63) / 64, ncnt = (nw > chunk / 8 ? nw : chunk / 8) + 1;
    uint64_t size[W_N] = {chunk,    chunk,        nw * 8,
                          ncnt * 4, (nw + 1) * 4, sizeof(struct rs_delta_info)};
    uint64_t at[W_N + 1] = {0};
    for (int i = 0; i < W_N; i++)
        at[i + 1] = at[i] + ALIGN256(size[i]);
    dev_free(v->work);
    v->work = 0;
    cu_result e = cuda_lib()->mem_alloc(&v->work, at[W_N]);
    if (e != CU_SUCCESS) {
        v->work = 0;
        if (!v->said++)
            rs_log(RS_LOG_WARN,
                   "rank %d: no device memory for delta refits' scratch (%llu bytes): refits "
                   "of device buffers run in full",
                   x->comm->rank, (unsigned long long)at[W_N]);
        return 0;
    }
    memcpy(v->at, at, sizeof(at));
    v->chunk = chunk;
    return 1;
}

int exec_delta_dev_prepare(struct exec *x, const reshard_buffers_t *dev)
{
    struct exec_delta *d = &x->delta;
    int nt = x->plan->ntensors;
    if (!dev && !d->dev)
        return 1;
    if (!d->dev) {
        struct exec_delta_dev *v = rs_calloc(1, sizeof(*v), "delta device state");
        if (v && (!(v->snap = rs_calloc((size_t)nt + 1, sizeof(*v->snap), "delta device state")) ||
                  !(v->warned = rs_calloc((size_t)nt + 1, 1, "delta device state")))) {
            free(v->snap);
            free(v);
            v = NULL;
        }
        if (!v) {
            rs_log(RS_LOG_WARN,
                   "rank %d: no memory for delta refits' device state: refits run "
                   "in full",
                   x->comm->rank);
            return 0;
        }
        d->dev = v;
    }
    struct exec_delta_dev *v = d->dev;
    for (int t = 0; t < nt; t++) /* a snapshot kept where its tensor no longer is */
        if (v->snap[t] && !on_dev_src(x, dev, (uint32_t)t))
            drop_dev_snap(d, (uint32_t)t);
    uint64_t chunk = dev ? dev_chunk(x, dev) : 0;
    if (!chunk)
        return 1;
    if (!dev_work(x, chunk))
        return 0;
    uint64_t made = 0;
    for (int t = 0; t < nt; t++) {
        if (!on_dev_src(x, dev, (uint32_t)t) || !d->snap_bytes[t] || v->snap[t])
            continue;
        if (d->snap[t]) { /* the host's snapshot of a source now on the device */
            free(d->snap[t]);
            d->snap[t] = NULL;
            d->held -= d->snap_bytes[t];
        }
        d->snap_ver[t] = 0; /* holds nothing yet */
        if (cuda_lib()->mem_alloc(&v->snap[t], d->snap_bytes[t]) != CU_SUCCESS) {
            v->snap[t] = 0;
            if (!v->warned[t]++)
                rs_log(RS_LOG_WARN,
                       "rank %d: no device memory for the delta snapshot of tensor '%s' (%llu "
                       "bytes): it is refit in full",
                       x->comm->rank, x->plan->tensors[t].name,
                       (unsigned long long)d->snap_bytes[t]);
            continue;
        }
        v->held += d->snap_bytes[t];
        made += d->snap_bytes[t];
    }
    if (made && !v->told++)
        rs_log(RS_LOG_INFO,
               "rank %d: delta refits of device buffers: snapshots in device memory (%llu bytes), "
               "chunks compared and compacted on the GPU",
               x->comm->rank, (unsigned long long)v->held);
    return 1;
}

int exec_delta_dev_sends(const struct exec_run *r, const struct xfer *xf)
{
    return xf->src_buf == XBUF_SRC && on_dev_src(r->x, r->dev, xf->tensor);
}

/* Every chunk of out[o] goes through exec_delta_dev_out: none is packed with others (those are
 * sent from the shadow). */
int exec_delta_dev_owns(const struct exec_run *r, size_t o, int after)
{
    const struct exec *x = r->x;
    const struct exec_delta *d = &x->delta;
    const struct exec_share *s = &x->share;
    const struct xfer *xf = &x->xs.x[s->out[o]];
    if (!d->ready || !d->dev || !d->out_enc[o] || !d->dev->snap[xf->tensor] ||
        !exec_delta_dev_sends(r, xf))
        return 0;
    for (size_t c = s->out_off[o]; c < s->out_off[o + 1]; c++)
        if (x->out_b.bundled[c])
            return 0;
    return after ? r->delta : r->delta_can;
}

int exec_delta_dev_snap(const struct exec *x, uint32_t t)
{
    return x->delta.dev && x->delta.dev->snap[t];
}

int exec_delta_dev_lands(const struct exec_run *r, const struct xfer *xf)
{
    return r->delta && xf->dst_buf == XBUF_DST && on_dev_dst(r->x, r->dev, xf->tensor);
}

static cu_deviceptr dptr(const void *p)
{
    return (cu_deviceptr)(uintptr_t)p;
}

static void *w_at(const struct exec_delta_dev *v, int i)
{
    return (void *)(uintptr_t)(v->work + v->at[i]);
}

static struct rs_delta_desc desc_of(const struct exec_delta_dev *v, uint64_t n, size_t es)
{
    return (struct rs_delta_desc){.n = (int64_t)n,
                                  .nwords = rs_delta_nwords((int64_t)n),
                                  .esize = (int32_t)es,
                                  .msg = w_at(v, W_MSG),
                                  .words = w_at(v, W_WORDS),
                                  .cnt = w_at(v, W_CNT),
                                  .starts = w_at(v, W_STARTS),
                                  .info = w_at(v, W_INFO)};
}

/* ---- the sender ---- */

/* The chunk (at cur on the device) into its place in the source's host shadow. */
static reshard_status_t to_shadow(struct exec_run *r, const struct xfer *xf,
                                  const struct region *rg, const char *cur)
{
    const struct cuda_fns *f = cuda_lib();
    char *shadow = exec_post_base(r, xf, 0), *pack = r->x->delta.mem[DELTA_MEM_PACK];
    uint64_t off, bytes = region_bytes(rg);
    cu_result e;
    if (region_contiguous(rg, &off)) {
        e = f->memcpy_dtoh(shadow + off, dptr(cur), bytes);
    } else if ((e = f->memcpy_dtoh(pack, dptr(cur), bytes)) == CU_SUCCESS) {
        region_unpack(rg, shadow, pack);
    }
    return e == CU_SUCCESS ? RESHARD_OK
                           : cuda_error("a dense delta chunk to its host shadow (cuMemcpyDtoH)", e);
}

static reshard_status_t dev_out(struct exec_run *r, uint32_t o, uint32_t chunk, int how,
                                const char **buf, size_t *len, int *sent)
{
    struct exec *x = r->x;
    struct exec_delta *d = &x->delta;
    struct exec_delta_dev *v = d->dev;
    const struct cuda_fns *f = cuda_lib();
    const struct xfer *xf = &x->xs.x[x->share.out[o]];
    size_t i = x->share.out_off[o] + chunk, es = xfer_esize(x->plan, xf);
    uint32_t t = xf->tensor;
    struct region rg;
    uint64_t off;
    exec_chunk_region(&x->cut, xf, chunk, 0, &rg);
    uint64_t bytes = region_bytes(&rg);
    const char *src = r->dev[t].src, *cur = src;
    if (region_contiguous(&rg, &off)) {
        cur += off;
    } else {
        struct rs_pack_desc pd;
        region_desc(&rg, &pd);
        RS_CHECK(cuda_pack(&pd, src, w_at(v, W_PACK), NULL));
        cur = w_at(v, W_PACK);
    }
    char *snap = (char *)(uintptr_t)(v->snap[t] + d->snap_at[i]);
    if (how == DELTA_DEV_SHADOW) /* dense again next run: no snapshot kept */
        return to_shadow(r, xf, &rg, cur);
    if (how == DELTA_DEV_SNAPSHOT) { /* dense: the snapshot is it */
        cu_result e = f->memcpy_dtod(dptr(snap), dptr(cur), bytes);
        if (e != CU_SUCCESS)
            return cuda_error("a chunk into its delta snapshot (cuMemcpyDtoD)", e);
        return to_shadow(r, xf, &rg, cur);
    }
    struct rs_delta_desc dd = desc_of(v, bytes / es, es);
    dd.cur = cur;
    dd.snap = snap;
    RS_CHECK(cuda_delta_encode(&dd, NULL)); /* snap holds cur now */
    struct rs_delta_info in;
    cu_result e = f->memcpy_dtoh(&in, dptr(dd.info), sizeof(in));
    if (e != CU_SUCCESS)
        return cuda_error("reading a delta chunk's size (cuMemcpyDtoH)", e);
    if (in.kind == RS_DELTA_DENSE || in.len >= bytes)
        return to_shadow(r, xf, &rg, cur);
    char *out = d->mem[DELTA_MEM_ENC] + d->enc_at[i];
    if ((e = f->memcpy_dtoh(out, dptr(dd.msg), in.len)) != CU_SUCCESS)
        return cuda_error("a delta chunk to host memory (cuMemcpyDtoH)", e);
    *buf = out;
    *len = (size_t)in.len;
    *sent = 1;
    return RESHARD_OK;
}

int exec_delta_dev_out(struct exec_run *r, uint32_t o, uint32_t chunk, int how, const char **buf,
                       size_t *len)
{
    int sent = 0;
    reshard_status_t st = dev_out(r, o, chunk, how, buf, len, &sent);
    if (st != RESHARD_OK)
        exec_run_fail(r, st); /* what goes out now is never applied: the run fails */
    return sent;
}

/* ---- the receiver ---- */

reshard_status_t exec_delta_dev_land(struct exec_run *r, const struct xfer *xf, uint32_t chunk,
                                     const char *msg, size_t bytes)
{
    struct exec *x = r->x;
    struct exec_delta_dev *v = x->delta.dev;
    const struct cuda_fns *f = cuda_lib();
    struct region rg;
    uint64_t off;
    exec_chunk_region(&x->cut, xf, chunk, 1, &rg);
    uint64_t want = region_bytes(&rg);
    size_t es = xfer_esize(x->plan, xf);
    struct delta_hdr h = {0};
    if (bytes != want)
        memcpy(&h, msg, sizeof(h));
    if (bytes != want && h.kind == DELTA_NONE)
        return RESHARD_OK;
    char *dst = (char *)r->dev[xf->tensor].dst, *at = dst;
    int contiguous = region_contiguous(&rg, &off);
    struct rs_pack_desc pd;
    if (contiguous) {
        at += off;
    } else {
        region_desc(&rg, &pd);
        at = w_at(v, W_PACK);
        if (bytes != want) /* what the delta applies to */
            RS_CHECK(cuda_pack(&pd, dst, at, NULL));
    }
    cu_result e;
    if (bytes == want) {
        if ((e = f->memcpy_htod(dptr(at), msg, bytes)) != CU_SUCCESS)
            return cuda_error("a dense delta chunk to the device (cuMemcpyHtoD)", e);
    } else {
        struct rs_delta_desc dd = desc_of(v, want / es, es);
        dd.snap = at;
        dd.nruns = h.nruns;
        if ((e = f->memcpy_htod(dptr(dd.msg), msg, bytes)) != CU_SUCCESS)
            return cuda_error("a delta chunk to the device (cuMemcpyHtoD)", e);
        RS_CHECK(cuda_delta_apply(&dd, h.kind, NULL));
    }
    if (!contiguous)
        RS_CHECK(cuda_unpack(&pd, dst, at, NULL));
    e = f->stream_synchronize(NULL);
    return e == CU_SUCCESS ? RESHARD_OK : cuda_error("cuStreamSynchronize after a delta chunk", e);
}

/* ---- the plan's ---- */

uint64_t exec_delta_dev_held(const struct exec *x)
{
    return x->delta.dev ? x->delta.dev->held : 0;
}

void exec_delta_dev_fini(struct exec_delta *d, int ntensors)
{
    struct exec_delta_dev *v = d->dev;
    if (!v)
        return;
    for (int t = 0; t < ntensors; t++)
        dev_free(v->snap[t]);
    dev_free(v->work);
    free(v->snap);
    free(v->warned);
    free(v);
    d->dev = NULL;
}
