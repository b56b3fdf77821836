/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The device path: a run on device buffers (RESHARD_MEM_CUDA) on the native executor.
 *
 * Network chunks and copies inside the rank go through host shadows of the buffers (exec_mem.c),
 * each chunk copied to the device as it lands, except where GPUDirect lets contiguous network
 * chunks move between the wire and the device directly. Local peers write device destinations
 * directly through CUDA IPC, on a stream, and tell the receiver once the chunk's event has
 * completed; copies between two device buffers of the rank run on that stream too.
 */
#include "exec_run.h"

#include "exec_delta_dev.h"

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "base/param.h"
#include "cuda/cuda_lib.h"
#include "cuda/pack_desc.h"

#include <stdlib.h>

/* Rows at least this wide copy well on the copy engines, which leave the SMs to the caller's
 * kernels; narrower ones go through the pack kernels (see pack_bench). */
#define CE_MIN_ROW_BYTES 512
#define CE_MAX_PITCH     (UINT64_C(1) << 31) /* cuMemcpy2D's pitches stay below the device's */

/* ---- where a chunk's bytes are ---- */

/* This rank's device buffer behind a transfer's side, or NULL when that buffer is host memory
 * (whole-tensor buffers always are). */
static char *dev_base(const struct exec_run *r, const struct xfer *xf, int side)
{
    int buf = side ? xf->dst_buf : xf->src_buf;
    const reshard_buffers_t *b = r->dev ? &r->dev[xf->tensor] : NULL;
    if (!b || (buf != XBUF_SRC && buf != XBUF_DST) || b->mem != RESHARD_MEM_CUDA)
        return NULL;
    return buf == XBUF_SRC ? (char *)b->src : (char *)b->dst;
}

/* Both sides answer alike, from what the pair last told each other: the destination exported
 * its buffer and the source writes through CUDA IPC (it has device buffers, so a driver and a
 * context). */
int exec_dev_via_ipc(const struct exec_run *r, const struct xfer *xf)
{
    const struct exec_links *l = &r->x->links;
    size_t i = (size_t)(xf - r->x->xs.x);
    if (xf->path != XFER_LOCAL || xf->dst_buf != XBUF_DST)
        return 0;
    if (xf->src == r->comm->rank)
        return l->ent_of[i] >= 0 && l->has_exp[l->ent_of[i]] && l->told_cuda;
    return l->writer_of[i] >= 0 && l->cuda[l->writer_of[i]] && l->exported[xf->tensor];
}

void *exec_dev_mh(const struct exec_run *r, const struct xfer *xf, int side)
{
    int buf = side ? xf->dst_buf : xf->src_buf;
    return r->x->regs.dev[2 * xf->tensor + (buf == XBUF_DST)].mh;
}

/* When the run registered its device buffers and the chunk is contiguous there, and it is not
 * encoded in a delta run (compared against a snapshot, it travels through host memory). Both
 * ends of a message decide on their own. */
char *exec_dev_gdr_at(const struct exec_run *r, const struct xfer *xf, int side,
                      const struct region *rg)
{
    uint64_t off;
    char *d = r->gdr && !(r->delta && exec_delta_encoded(r->x, xf)) ? dev_base(r, xf, side) : NULL;
    return d && region_contiguous(rg, &off) ? d + off : NULL;
}

int exec_dev_self(const struct exec_run *r, const struct xfer *xf)
{
    return xf->path == XFER_SELF && dev_base(r, xf, 0) && dev_base(r, xf, 1);
}

/* Are the region's runs rows: *n of *w bytes, *pitch apart from *first? */
static int region_rows(const struct region *rg, uint64_t *first, uint64_t *w, uint64_t *pitch,
                       uint64_t *n)
{
    struct region_iter it;
    uint64_t off, len, k = 0;
    region_iter_init(&it, rg);
    *first = *w = *pitch = 0;
    while (region_iter_next(&it, &off, &len)) {
        if (k == 0) {
            *first = off, *w = len;
        } else if (k == 1) {
            if (len != *w || off < *first + *w)
                return 0;
            *pitch = off - *first;
        } else if (len != *w || off != *first + k * *pitch) {
            return 0;
        }
        k++;
    }
    *n = k;
    return k >= 2 && *pitch < CE_MAX_PITCH;
}

/* ---- landing ---- */

/* In its host shadow (from the network, a copy inside the rank, or a peer's cross-memory
 * write), which the device then gets; or in the device buffer itself (a peer's IPC write, or
 * GPUDirect), which the shadow then gets only if the chunk is forwarded from there. */
reshard_status_t exec_dev_land(struct exec_run *r, long k, uint32_t chunk, const struct xfer *xf)
{
    char *dev = dev_base(r, xf, 1);
    if (!dev || exec_dev_self(r, xf)) /* copied on the device; nothing forwards from it */
        return RESHARD_OK;
    const struct exec *x = r->x;
    const struct exec_share *s = &x->share;
    struct region rg;
    exec_chunk_region(&x->cut, xf, chunk, 1, &rg);
    int delta = k >= 0 && exec_delta_on_dev(r, (size_t)k, chunk); /* by exec_delta_dev_land */
    int to_host = delta || exec_dev_via_ipc(r, xf) ||
                  (xf->path == XFER_NET && k >= 0 && !x->in_b.bundled[s->in_off[k] + chunk] &&
                   exec_dev_gdr_at(r, xf, 1, &rg));
    if (to_host && (k < 0 || s->child_first[k] == s->child_first[k + 1]))
        return RESHARD_OK;
    if (to_host && !delta && !exec_dev_via_ipc(r, xf)) /* the NIC's writes, visible first */
        RS_CHECK(cuda_flush_rdma_writes());
    char *host = (char *)r->bufs[xf->tensor].dst;
    const struct cuda_fns *f = cuda_lib();
    struct region_iter it;
    uint64_t off, len, first, w, pitch, rows;
    int done = region_rows(&rg, &first, &w, &pitch, &rows);
    if (done) { /* a column block: one 2-D copy */
        cu_memcpy2d m = {.src_pitch = pitch, .dst_pitch = pitch, .width_bytes = w, .height = rows};
        if (to_host) {
            m.src_type = CU_MEMORYTYPE_DEVICE,
            m.src_device = (cu_deviceptr)(uintptr_t)(dev + first);
            m.dst_type = CU_MEMORYTYPE_HOST, m.dst_host = host + first;
        } else {
            m.src_type = CU_MEMORYTYPE_HOST, m.src_host = host + first;
            m.dst_type = CU_MEMORYTYPE_DEVICE,
            m.dst_device = (cu_deviceptr)(uintptr_t)(dev + first);
        }
        cu_result e = f->memcpy_2d(&m);
        if (e != CU_SUCCESS)
            return cuda_error(to_host ? "copying a chunk to its host shadow (cuMemcpy2D)"
                                      : "copying a landed chunk to the device (cuMemcpy2D)",
                              e);
    }
    region_iter_init(&it, &rg);
    while (!done && region_iter_next(&it, &off, &len)) {
        cu_deviceptr d = (cu_deviceptr)(uintptr_t)(dev + off);
        cu_result e =
            to_host ? f->memcpy_dtoh(host + off, d, len) : f->memcpy_htod(d, host + off, len);
        if (e != CU_SUCCESS)
            return cuda_error(to_host ? "copying a chunk to its host shadow (cuMemcpyDtoH)"
                                      : "copying a landed chunk to the device (cuMemcpyHtoD)",
                              e);
    }
    /* From pageable memory the copy may return before its DMA is done: wait for it, so that
     * what reads the device next (a forward on the IPC stream, the caller) sees the chunk. */
    cu_result e = to_host || cuda_host_pinned(host) ? CU_SUCCESS : f->stream_synchronize(NULL);
    return e == CU_SUCCESS ? RESHARD_OK : cuda_error("cuStreamSynchronize after a landing", e);
}

/* ---- copies on the IPC stream ---- */

/* Is the chunk rows of one width at constant pitches on both sides (a 2-D box of row-major
 * shards), wide enough for the copy engines? Then m is the copy, from src into dst. */
static int rows_2d(const struct region *a, const struct region *b, const char *src, char *dst,
                   cu_memcpy2d *m)
{
    struct region_pair p;
    uint64_t ao, bo, len, a0 = 0, b0 = 0, w = 0, sp = 0, dp = 0, n = 0;
    region_pair_init(&p, a, b);
    while (region_pair_next(&p, &ao, &bo, &len)) {
        if (n == 0) {
            a0 = ao, b0 = bo, w = len;
        } else if (n == 1) {
            if (len != w || ao < a0 + w || bo < b0 + w)
                return 0;
            sp = ao - a0, dp = bo - b0;
        } else if (len != w || ao != a0 + n * sp || bo != b0 + n * dp) {
            return 0;
        }
        n++;
    }
    if (n < 2 || w < CE_MIN_ROW_BYTES || sp >= CE_MAX_PITCH || dp >= CE_MAX_PITCH)
        return 0;
    *m = (cu_memcpy2d){.src_type = CU_MEMORYTYPE_DEVICE,
                       .src_device = (cu_deviceptr)(uintptr_t)(src + a0),
                       .src_pitch = sp,
                       .dst_type = CU_MEMORYTYPE_DEVICE,
                       .dst_device = (cu_deviceptr)(uintptr_t)(dst + b0),
                       .dst_pitch = dp,
                       .width_bytes = w,
                       .height = n};
    return 1;
}

/* Does a chunk go through the pack kernels? When it is strided on either side, its source is
 * on this GPU, and the kernels load (not on the stand-in driver, nor without nvcc at build). */
static int ipc_kernels(const struct exec_run *r, const struct xfer *xf, const struct region *a,
                       const struct region *b)
{
    static int usable = -1;
    uint64_t off;
    if (!dev_base(r, xf, 0) || (region_contiguous(a, &off) && region_contiguous(b, &off)))
        return 0;
    if (usable < 0) {
        struct rs_saved_error saved;
        rs_error_save(&saved);
        usable = cuda_kernels() == RESHARD_OK;
        if (!usable)
            rs_log(RS_LOG_INFO, "strided CUDA IPC chunks copy run by run: %s", rs_error_message());
        rs_error_restore(&saved);
    }
    return usable;
}

/* Copies on the IPC stream and an event after them, which exec_dev_poll waits for before it
 * tells the peer (or counts the chunk arrived). */
int exec_dev_copy(struct exec_run *r, uint32_t o, uint32_t chunk)
{
    struct exec *x = r->x;
    struct reshard_comm *comm = x->comm;
    if (r->ipc_tail - r->ipc_head == CUDA_IPC_EVENTS)
        return 0;
    const struct xfer *xf = &x->xs.x[x->share.out[o]];
    int self = xf->path == XFER_SELF, ent = self ? -1 : x->links.ent_of[xf - x->xs.x];
    reshard_status_t st = cuda_ipc_get(&comm->ipc);
    if (st == RESHARD_OK && !self && !r->ent_ipc[ent])
        st = cuda_ipc_open(&x->exp.maps, xf->dst, comm->pid[xf->dst], comm->pidfd[xf->dst],
                           &x->links.exp[ent], &r->ent_ipc[ent]);
    if (st != RESHARD_OK) {
        exec_run_fail(r, st);
        return 1;
    }
    const struct cuda_fns *f = cuda_lib();
    struct cuda_ipc *ipc = comm->ipc;
    const char *src = dev_base(r, xf, 0);
    if (!src) /* a host buffer: the driver copies from it as well */
        src = exec_post_base(r, xf, 0);
    char *dst = self ? dev_base(r, xf, 1) : r->ent_ipc[ent];
    struct region a, b;
    exec_chunk_region(&x->cut, xf, chunk, 0, &a);
    exec_chunk_region(&x->cut, xf, chunk, 1, &b);
    int ring = (int)(r->ipc_tail % CUDA_IPC_EVENTS);
    cu_result e = CU_SUCCESS;
    cu_memcpy2d m;
    const char *call = "cuMemcpyAsync";
    if (dev_base(r, xf, 0) && rows_2d(&a, &b, src, dst, &m)) { /* one call, copy engines */
        e = f->memcpy_2d_async(&m, ipc->stream);
        call = "cuMemcpy2DAsync";
    } else if (ipc_kernels(r, xf, &a, &b)) { /* two launches instead of a copy per run */
        struct rs_pack_desc da, db;
        cu_deviceptr scratch = 0;
        region_desc(&a, &da);
        region_desc(&b, &db);
        st = cuda_ipc_scratch(ipc, ring, (uint64_t)x->cut.chunk_bytes, &scratch);
        if (st == RESHARD_OK)
            st = cuda_pack(&da, src, (void *)(uintptr_t)scratch, ipc->stream);
        if (st == RESHARD_OK)
            st = cuda_unpack(&db, dst, (const void *)(uintptr_t)scratch, ipc->stream);
        if (st != RESHARD_OK) {
            exec_run_fail(r, st);
            return 1;
        }
    } else {
        struct region_pair p;
        uint64_t ao, bo, len;
        region_pair_init(&p, &a, &b);
        while (e == CU_SUCCESS && region_pair_next(&p, &ao, &bo, &len))
            e = f->memcpy_async((cu_deviceptr)(uintptr_t)(dst + bo),
                                (cu_deviceptr)(uintptr_t)(src + ao), len, ipc->stream);
    }
    if (e != CU_SUCCESS) {
        char what[64];
        snprintf(what, sizeof(what), "%s (%s)",
                 self ? "a device copy inside the rank" : "a CUDA IPC copy to a local peer", call);
        exec_run_fail(r, cuda_error(what, e));
        return 1;
    }
    if ((e = f->event_record(ipc->ev[ring], ipc->stream)) != CU_SUCCESS) {
        exec_run_fail(r, cuda_error("the event after a CUDA IPC copy (cuEventRecord)", e));
        return 1;
    }
    r->ipc_q[r->ipc_tail++ % CUDA_IPC_EVENTS] = (struct exec_ipc_copy){o, chunk};
    if (self) {
        comm->self += region_bytes(&a);
    } else {
        comm->local_out += region_bytes(&a);
        comm->ipc_out += region_bytes(&a);
    }
    return 1;
}

void exec_dev_poll(struct exec_run *r)
{
    while (r->ipc_head < r->ipc_tail && r->st == RESHARD_OK) {
        struct cuda_ipc *ipc = r->x->comm->ipc;
        cu_result e = cuda_lib()->event_query(ipc->ev[r->ipc_head % CUDA_IPC_EVENTS]);
        if (e == CU_ERROR_NOT_READY)
            return;
        struct exec_ipc_copy c = r->ipc_q[r->ipc_head++ % CUDA_IPC_EVENTS];
        const struct xfer *xf = &r->x->xs.x[r->x->share.out[c.pos]];
        reshard_status_t st = RESHARD_OK;
        if (e != CU_SUCCESS)
            st =
                cuda_error(xf->path == XFER_SELF ? "a device copy inside the rank (cuEventQuery)"
                                                 : "a CUDA IPC copy to a local peer (cuEventQuery)",
                           e);
        else if (xf->path == XFER_SELF) {
            r->out_left--;
            exec_post_arrived(r, -1, c.chunk, xf);
        } else
            st = exec_post_notify(r, c.pos, c.chunk);
        if (st != RESHARD_OK)
            exec_run_fail(r, st);
        r->last_event_ms = rs_now_ms();
    }
}

/* ---- before the run: GPUDirect registrations and staged sources ---- */

/* Otherwise (the transport cannot, RESHARD_GPUDIRECT=0, or a registration fails) network
 * chunks stage through host memory, and the first run says why at INFO.
 * RESHARD_TEST_DEVICE_AS_HOST=1 registers device buffers as host memory: the stand-in driver's
 * device memory is host memory, so tests run this path on any transport. */
int exec_dev_try_gdr(struct exec *x, const reshard_buffers_t *dev)
{
    struct tp_ctx *net = x->comm->net;
    struct exec_regs *g = &x->regs;
    enum tp_mem mem = rs_param_int(RS_PARAM_TEST_DEVICE_AS_HOST) == 1 ? TP_MEM_HOST : TP_MEM_CUDA;
    char why[RS_ERROR_MAX] = "";
    struct rs_saved_error saved;
    rs_error_save(&saved);
    if (!rs_param_int(RS_PARAM_GPUDIRECT))
        snprintf(why, sizeof(why), "RESHARD_GPUDIRECT=0");
    else if (mem == TP_MEM_CUDA && !net->device_mem)
        snprintf(why, sizeof(why), "%s", net->device_mem_why);
    else if (!g->dev && !(g->dev = rs_calloc((size_t)g->n, sizeof(*g->dev), "registrations")))
        snprintf(why, sizeof(why), "%s", rs_error_message());
    for (int i = 0; !why[0] && i < g->n; i++) {
        const reshard_buffers_t *b = &dev[i / 2];
        const void *p = i % 2 ? b->dst : b->src;
        size_t n = i % 2 ? b->dst_bytes : b->src_bytes;
        uint64_t id = 0;
        if (b->mem == RESHARD_MEM_CUDA && p &&
            cuda_lib()->pointer_get_attribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                              (cu_deviceptr)(uintptr_t)p) != CU_SUCCESS)
            id = 0;
        if (b->mem == RESHARD_MEM_CUDA &&
            exec_reg_one(net, &g->dev[i], p, n, mem, id) != RESHARD_OK)
            snprintf(why, sizeof(why), "%s", rs_error_message());
    }
    rs_error_restore(&saved); /* falling back is not failing */
    if (!g->dev_reported++)
        rs_log(RS_LOG_INFO, "rank %d: network chunks of device buffers: %s%s", x->comm->rank,
               why[0] ? "staged through host memory: " : "GPUDirect RDMA", why);
    return !why[0];
}

/* Does network transfer out[o] leave from the device buffer for every chunk (GPUDirect, each
 * chunk contiguous there and none packed with others)? */
static int net_direct(const struct exec_run *r, size_t o)
{
    const struct exec *x = r->x;
    const struct exec_share *s = &x->share;
    const struct xfer *xf = &x->xs.x[s->out[o]];
    if (!r->gdr)
        return 0;
    for (size_t c = 0; c < s->out_off[o + 1] - s->out_off[o]; c++) {
        struct region a;
        exec_chunk_region(&x->cut, xf, (uint32_t)c, 0, &a);
        if (x->out_b.bundled[s->out_off[o] + c] || !exec_dev_gdr_at(r, xf, 0, &a))
            return 0;
    }
    return 1;
}

/* Network chunks without GPUDirect (or strided, or packed), cross-memory writes, copies inside
 * the rank into host memory. Before the exchange (after 0) local peers are taken to be written
 * through CUDA IPC when it is on; after it, the ones that turned out not to be get their
 * sources too. */
reshard_status_t exec_dev_stage_sources(struct exec_run *r, int after)
{
    struct exec *x = r->x;
    for (size_t o = 0; o < x->share.nout; o++) {
        const struct xfer *xf = &x->xs.x[x->share.out[o]];
        const reshard_buffers_t *d = &r->dev[xf->tensor];
        if (xf->src_buf != XBUF_SRC || d->mem != RESHARD_MEM_CUDA || !d->src || !d->src_bytes ||
            r->src_staged[xf->tensor])
            continue;
        int host = xf->path == XFER_SELF ? !exec_dev_self(r, xf)
                   : xf->path == XFER_LOCAL
                       ? (after ? !exec_dev_via_ipc(r, xf) : !rs_param_int(RS_PARAM_CUDA_IPC))
                       : !net_direct(r, (size_t)o);
        if (!host || exec_delta_dev_owns(r, o, after)) /* compared on the device, not staged */
            continue;
        cu_result e = cuda_lib()->memcpy_dtoh((void *)r->bufs[xf->tensor].src,
                                              (cu_deviceptr)(uintptr_t)d->src, d->src_bytes);
        if (e != CU_SUCCESS)
            return cuda_error("staging a device source (cuMemcpyDtoH)", e);
        r->src_staged[xf->tensor] = 1;
    }
    return RESHARD_OK;
}

/* ---- the staged run ---- */

int exec_dev_any(const struct exec *x, const reshard_buffers_t *bufs)
{
    for (int t = 0; t < x->plan->ntensors; t++)
        if (bufs[t].mem == RESHARD_MEM_CUDA && (bufs[t].src || bufs[t].dst))
            return 1;
    return 0;
}

/* host[] is bufs with every device buffer replaced by a host shadow of it. Sources are copied
 * in where something reads them there (exec_dev_stage_sources); destinations get each chunk
 * back as it lands (exec_dev_land), so bytes outside the shard's view are never touched. */
static reshard_status_t stage_in(struct exec *x, const reshard_buffers_t *bufs,
                                 reshard_buffers_t *host)
{
    int nt = x->plan->ntensors;
    if (!cuda_lib()) {
        struct rs_saved_error why;
        rs_error_save(&why);
        return rs_error(RESHARD_ERR_UNAVAILABLE,
                        "rank %d: device buffers need the CUDA driver to be staged: %s",
                        x->comm->rank, why.msg);
    }
    for (int t = 0; t < nt; t++) /* the context of the first device buffer */
        if (bufs[t].mem == RESHARD_MEM_CUDA && (bufs[t].src || bufs[t].dst)) {
            RS_CHECK(cuda_context_of(bufs[t].src ? bufs[t].src : bufs[t].dst));
            break;
        }
    return exec_shadows_stage(&x->shadows, nt, bufs, host);
}

/* Every chunk is on the device once it has landed, so after a failure the tensors
 * reshard_plan_outcome calls complete hold their new values. */
reshard_status_t exec_dev_run(struct exec *x, const reshard_buffers_t *bufs)
{
    int nt = x->plan->ntensors;
    reshard_buffers_t *host = rs_calloc((size_t)nt, sizeof(*host), "staging");
    reshard_status_t pre = host ? stage_in(x, bufs, host) : RESHARD_ERR_NO_MEMORY;
    if (!x->shadows.reported++ && pre == RESHARD_OK) {
        const char *kind = "pinned host";
        for (int i = 0; i < 2 * nt; i++)
            if (x->shadows.buf[i] && !cuda_host_pinned(x->shadows.buf[i]))
                kind = "pageable host (cuMemAllocHost failed)";
        rs_log(RS_LOG_INFO, "rank %d: device buffers: host shadows in %s memory; local peers %s",
               x->comm->rank, kind,
               rs_param_int(RS_PARAM_CUDA_IPC) ? "write device destinations through CUDA IPC"
                                               : "staged too (RESHARD_CUDA_IPC=0)");
    }
    reshard_status_t st =
        exec_run_all(x, pre == RESHARD_OK ? host : bufs, pre == RESHARD_OK ? bufs : NULL, pre);
    free(host);
    return st;
}
