/* SPDX-License-Identifier: Apache-2.0 */
/*
 * How one rank runs its share of a transfer list.
 *
 * Every transfer is cut into chunks (RESHARD_CHUNK_BYTES), the same way on both sides, so a
 * chunk is named by (transfer, chunk) in message tags and the fan-out of a received chunk can
 * start before the rest of its transfer arrives. All receives are posted up front: into the
 * destination itself when the chunk is contiguous there, else as a scatter list over it, so a
 * receive never waits for memory and senders can always make progress. A sender sends a
 * contiguous chunk from its source buffer and packs a strided one into a staging slot (at most
 * RESHARD_STAGING_BYTES per rank, and no more than the send window uses). Local transfers are
 * cross-memory writes followed by an empty message that tells the receiver the chunk is there.
 *
 * Device buffers (RESHARD_MEM_CUDA): network slices and copies inside the rank go through host
 * shadows of them (pinned when the driver allows), each chunk copied to the device as it lands;
 * local peers write device destinations directly through CUDA IPC, on a stream, and tell the
 * receiver once the chunk's event has completed.
 */
#include "exec_int.h"

#include "exec_nccl.h"
#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "base/param.h"
#include "cuda/cuda_lib.h"
#include "cuda/ipc.h"
#include "cuda/pack_desc.h"
#include "transport/cma.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Network sends in flight: per rank, and per peer. More than 2 to one peer let UCX interleave
 * them, so that none ends early and the receiver's fan-out (or a ring's next hop) waits for
 * the last. Sends queued behind a busy peer are passed over, SEND_SCAN at most. */
#define SEND_WINDOW   16
#define PEER_WINDOW   2
#define SEND_SCAN     64
#define DRAIN_MS      1000 /* how long a failed run waits for its requests */
#define WAIT_CAP_MS   2    /* longest sleep: UCX over TCP may not re-signal a half-read socket */
#define BOOT_CHECK_MS 20   /* how often a run looks for failures the others report */
#define CAUSE_WAIT_MS 100  /* how long a failed run listens for another rank's report */

enum req_kind { REQ_SEND_DATA, REQ_SEND_CTRL, REQ_RECV_DATA, REQ_RECV_CTRL };

struct run;

/* A ready entry naming a bundle (its index in chunk) rather than a transfer's chunk. */
#define BUNDLE_POS UINT32_MAX

/* One posted message. */
struct chunk_req {
    struct tp_req req;
    struct run *run;
    uint32_t pos;   /* index in the rank's in[] (receives) or out[] (sends), or BUNDLE_POS */
    uint32_t chunk; /* or the bundle's index */
    int slot;       /* staging slot, or -1 */
    uint8_t kind;
    struct iovec *iov;
};

struct ready {
    uint32_t pos, chunk;
};

/* The state of one execution. */
struct run {
    struct exec *x; /* not to be touched once draining: a kept run may outlive its plan */
    struct reshard_comm *comm;
    const reshard_buffers_t *bufs;
    char **peer_dst, **peer_tmp; /* [size * ntensors]: where local writes go */
    uint32_t seq;
    reshard_status_t st;
    char why[RS_ERROR_MAX];
    int draining;                       /* failed: completions now only count down */
    struct chunk_req *in_req, *out_req; /* by chunk, via in_off / out_off */
    size_t nin_req;
    uint32_t *in_arrived; /* [nin] */
    struct queue {
        struct ready *q;
        size_t head, tail, cap;
    } net_q, local_q; /* network sends wait for the window; local work never waits */
    size_t in_left, out_left;
    /* Acknowledgements: received from send_peers, sent to recv_peers once all arrived. */
    struct chunk_req *ack_in, *ack_out;
    int acks_in_left, acks_out_left, acked;
    size_t *tmp_left; /* [ntensors]: chunks still to reach the whole-tensor buffer */
    size_t *dst_left; /* [ntensors]: chunks still to land in this rank's destination buffer */
    int inflight, posted;
    int *peer_inflight; /* [size] */
    int64_t last_event_ms;
    /* Device buffers: dev is the caller's buffers, bufs their host shadows (NULL: no device
     * buffers). Every rank's exported destinations (exports, by peer and tensor in peer_exp)
     * and whether it has device buffers (peer_cuda: such a rank writes through IPC). */
    const reshard_buffers_t *dev;
    struct cuda_ipc_export *exports;
    const struct cuda_ipc_export **peer_exp; /* [size * ntensors] */
    char **peer_ipc;                         /* [size * ntensors]: mapped here, on first use */
    uint8_t *peer_cuda;                      /* [size] */
    int gdr; /* device buffers are registered (x->dreg): contiguous network chunks use them */
    int gdr_landed;      /* a chunk came in that way: flushed before the GPU reads it */
    uint8_t *src_staged; /* [ntensors]: the device source was copied to its shadow */
    struct ipc_copy {
        uint32_t pos, chunk;
    } ipc_q[CUDA_IPC_EVENTS]; /* copies on the IPC stream, in order; event i % CUDA_IPC_EVENTS */
    size_t ipc_head, ipc_tail;
};

/* ---- buffers ---- */

/* Packed sends use at most SEND_WINDOW slots at once: no more are made. */
static reshard_status_t staging_init(struct exec *x)
{
    int64_t cap = rs_param_int(RS_PARAM_STAGING_BYTES) / x->chunk_bytes;
    int slots = (int)(cap < 1 ? 1 : cap > SEND_WINDOW ? SEND_WINDOW : cap);
    return comm_staging(x->comm, x->chunk_bytes, slots);
}

/* Registers a buffer, once per pointer, size and allocation (id: 0 for host memory, or when
 * the driver cannot tell). */
static reshard_status_t reg_one(struct exec *x, struct reg *g, const void *addr, size_t len,
                                enum tp_mem mem, uint64_t id)
{
    if (g->addr == addr && g->len == len && g->id == id)
        return RESHARD_OK;
    struct tp_ctx *net = x->comm->net;
    net->ops->mem_dereg(net, g->mh);
    *g = (struct reg){0};
    if (!addr || !len)
        return RESHARD_OK;
    RS_CHECK(net->ops->mem_reg(net, (void *)addr, len, mem, &g->mh));
    g->addr = addr;
    g->len = len;
    g->id = id;
    return RESHARD_OK;
}

static char *my_base(const struct run *r, const struct xfer *xf, int side)
{
    int buf = side ? xf->dst_buf : xf->src_buf;
    const reshard_buffers_t *b = &r->bufs[xf->tensor];
    if (buf == XBUF_TMP)
        return r->x->tmp[xf->tensor];
    return buf == XBUF_SRC ? (char *)b->src : (char *)b->dst;
}

static void *my_mh(const struct run *r, const struct xfer *xf, int side)
{
    int buf = side ? xf->dst_buf : xf->src_buf;
    return buf == XBUF_TMP ? NULL : r->x->reg[2 * xf->tensor + (buf == XBUF_DST)].mh;
}

/* ---- the execution ---- */

static reshard_status_t fail(struct run *r, reshard_status_t st)
{
    if (r->st == RESHARD_OK) {
        r->st = st;
        snprintf(r->why, sizeof(r->why), "%s", rs_error_message());
    }
    return st;
}

static reshard_status_t push_ready(struct run *r, uint32_t pos, uint32_t chunk)
{
    int net = pos == BUNDLE_POS || r->x->xs.x[r->x->out[pos]].path == XFER_NET;
    struct queue *q = net ? &r->net_q : &r->local_q;
    if (q->tail == q->cap) {
        if (q->head) { /* slide down before growing */
            memmove(q->q, q->q + q->head, (q->tail - q->head) * sizeof(*q->q));
            q->tail -= q->head;
            q->head = 0;
        } else {
            struct ready *n = rs_grow(q->q, &q->cap, q->cap + 1, sizeof(*n), "queue");
            if (!n)
                return fail(r, RESHARD_ERR_NO_MEMORY);
            q->q = n;
        }
    }
    q->q[q->tail++] = (struct ready){pos, chunk};
    return RESHARD_OK;
}

/* Tensor t arrived whole in this rank's buffer: start what waited for it. */
static void release_whole(struct run *r, uint32_t t)
{
    const struct exec *x = r->x;
    for (uint32_t i = x->after_first[t]; i < x->after_first[t + 1]; i++) {
        uint32_t o = x->after[i];
        for (size_t c = 0; c < x->out_off[o + 1] - x->out_off[o]; c++)
            push_ready(r, o, (uint32_t)c);
    }
}

/* ---- device buffers ---- */

/* Rows at least this wide copy well on the copy engines, which leave the SMs to the caller's
 * kernels; narrower ones go through the pack kernels (see pack_bench). */
#define CE_MIN_ROW_BYTES 512
#define CE_MAX_PITCH     (UINT64_C(1) << 31) /* cuMemcpy2D's pitches stay below the device's */

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

static size_t slot_of(const struct exec *x, int rank, uint32_t tensor)
{
    return (size_t)rank * (size_t)x->plan->ntensors + tensor;
}

/* Does this local transfer write through CUDA IPC? Both sides answer alike: the destination
 * exported its buffer and the source has device buffers (so a driver and a context). */
static int via_ipc(const struct run *r, const struct xfer *xf)
{
    return r->peer_exp && xf->path == XFER_LOCAL && xf->dst_buf == XBUF_DST &&
           r->peer_exp[slot_of(r->x, xf->dst, xf->tensor)] && r->peer_cuda[xf->src];
}

/* This rank's device buffer behind a transfer's side, or NULL when that buffer is host memory
 * (whole-tensor buffers always are). */
static char *dev_base(const struct run *r, const struct xfer *xf, int side)
{
    int buf = side ? xf->dst_buf : xf->src_buf;
    const reshard_buffers_t *b = r->dev ? &r->dev[xf->tensor] : NULL;
    if (!b || buf == XBUF_TMP || b->mem != RESHARD_MEM_CUDA)
        return NULL;
    return buf == XBUF_SRC ? (char *)b->src : (char *)b->dst;
}

static void *dev_mh(const struct run *r, const struct xfer *xf, int side)
{
    int buf = side ? xf->dst_buf : xf->src_buf;
    return r->x->dreg[2 * xf->tensor + (buf == XBUF_DST)].mh;
}

/* The device address a network chunk moves from (side 0) or into (side 1) directly, with
 * GPUDirect: when the run registered its device buffers and the chunk is contiguous there;
 * NULL otherwise (host staging). Both ends of a message decide on their own. */
static char *gdr_at(const struct run *r, const struct xfer *xf, int side, const struct region *rg)
{
    uint64_t off;
    char *d = r->gdr ? dev_base(r, xf, side) : NULL;
    return d && region_contiguous(rg, &off) ? d + off : NULL;
}

/* A copy inside this rank between two device buffers: on the GPU, never through the shadows. */
static int self_on_device(const struct run *r, const struct xfer *xf)
{
    return xf->path == XFER_SELF && dev_base(r, xf, 0) && dev_base(r, xf, 1);
}

/* A chunk landed in a device destination of this rank: in its host shadow (from the network,
 * a copy inside the rank, or a peer's cross-memory write), which the device then gets; or in
 * the device buffer itself (a peer's IPC write), which the shadow then gets only if the chunk
 * is forwarded from there. */
static reshard_status_t land(struct run *r, long k, uint32_t chunk, const struct xfer *xf)
{
    char *dev = dev_base(r, xf, 1);
    if (!dev || self_on_device(r, xf)) /* copied on the device; nothing forwards from it */
        return RESHARD_OK;
    const struct exec *x = r->x;
    struct region rg;
    exec_chunk_region(x, xf, chunk, 1, &rg);
    int to_host = via_ipc(r, xf) || (xf->path == XFER_NET && k >= 0 &&
                                     !x->in_bundled[x->in_off[k] + chunk] && gdr_at(r, xf, 1, &rg));
    if (to_host && (k < 0 || x->child_first[k] == x->child_first[k + 1]))
        return RESHARD_OK;
    if (to_host && !via_ipc(r, xf)) /* the NIC's writes, visible before the copy reads them */
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

/* A chunk reached this rank: release what waits for it. */
static void arrived(struct run *r, long k, uint32_t chunk, const struct xfer *xf)
{
    const struct exec *x = r->x;
    reshard_status_t st = r->dev ? land(r, k, chunk, xf) : RESHARD_OK;
    if (st != RESHARD_OK) {
        fail(r, st);
        return;
    }
    if (k >= 0) {
        r->in_arrived[k]++;
        r->in_left--;
        for (uint32_t i = x->child_first[k]; i < x->child_first[k + 1]; i++)
            push_ready(r, x->child[i], chunk);
    }
    if (xf->dst_buf == XBUF_TMP && --r->tmp_left[xf->tensor] == 0)
        release_whole(r, xf->tensor);
    if (xf->dst_buf == XBUF_DST)
        r->dst_left[xf->tensor]--;
    r->last_event_ms = rs_now_ms();
}

static uint64_t chunk_bytes(const struct exec *x, const struct xfer *xf, uint32_t chunk)
{
    struct region rg;
    exec_chunk_region(x, xf, chunk, 1, &rg);
    return region_bytes(&rg);
}

static void on_recv(struct tp_req *req, reshard_status_t st, size_t bytes)
{
    struct chunk_req *c = container_of(req, struct chunk_req, req);
    struct run *r = c->run;
    r->posted--;
    free(c->iov);
    c->iov = NULL;
    if (r->draining)
        return;
    struct exec *x = r->x;
    if (c->pos == BUNDLE_POS) {
        const struct bundle *b = &x->in_b[c->chunk];
        if (st != RESHARD_OK || bytes != b->bytes) {
            fail(r, rs_error(st != RESHARD_OK ? st : RESHARD_ERR_INTERNAL,
                             "rank %d: packed message %u from rank %d: %s (%zu bytes, expected "
                             "%llu)",
                             x->comm->rank, b->id, b->peer,
                             st != RESHARD_OK ? rs_status_string(st) : "wrong size", bytes,
                             (unsigned long long)b->bytes));
            return;
        }
        for (uint32_t i = b->first; i < b->first + b->n; i++) {
            const struct piece *p = &x->in_p[i];
            arrived(r, (long)p->pos, p->chunk, &x->xs.x[x->in[p->pos]]);
        }
        return;
    }
    const struct xfer *xf = &x->xs.x[x->in[c->pos]];
    if (st != RESHARD_OK) {
        fail(r, rs_error(st, "rank %d: receiving chunk %u of transfer %u from rank %d failed",
                         x->comm->rank, c->chunk, x->in[c->pos], req->peer));
        return;
    }
    uint64_t want = chunk_bytes(x, xf, c->chunk);
    if (c->kind == REQ_RECV_DATA && bytes != want) {
        fail(r, rs_error(RESHARD_ERR_INTERNAL,
                         "rank %d: chunk %u of transfer %u from rank %d: %zu bytes, expected %llu",
                         x->comm->rank, c->chunk, x->in[c->pos], req->peer, bytes,
                         (unsigned long long)want));
        return;
    }
    if (c->kind == REQ_RECV_CTRL)
        x->comm->local_in += want; /* the sender wrote it into our memory */
    if (c->kind == REQ_RECV_DATA && r->gdr) {
        struct region rg;
        exec_chunk_region(x, xf, c->chunk, 1, &rg);
        if (gdr_at(r, xf, 1, &rg)) {
            x->comm->gdr_in += want;
            r->gdr_landed = 1;
        }
    }
    arrived(r, (long)c->pos, c->chunk, xf);
}

static void on_send(struct tp_req *req, reshard_status_t st, size_t bytes)
{
    (void)bytes;
    struct chunk_req *c = container_of(req, struct chunk_req, req);
    struct run *r = c->run;
    struct reshard_comm *comm = r->comm;
    r->posted--;
    if (c->kind == REQ_SEND_DATA) {
        r->inflight--;
        r->peer_inflight[req->peer]--;
    }
    if (c->slot >= 0) {
        comm->free_slots[comm->nfree++] = c->slot;
        c->slot = -1;
    }
    if (r->draining)
        return;
    int bundle = c->pos == BUNDLE_POS;
    if (st != RESHARD_OK && bundle) {
        fail(r, rs_error(st, "rank %d: sending packed message %u to rank %d failed", comm->rank,
                         r->x->out_b[c->chunk].id, req->peer));
        return;
    }
    if (st != RESHARD_OK) {
        fail(r, rs_error(st, "rank %d: sending chunk %u of transfer %u to rank %d failed",
                         comm->rank, c->chunk, r->x->out[c->pos], req->peer));
        return;
    }
    r->out_left -= bundle ? r->x->out_b[c->chunk].n : 1;
    r->last_event_ms = rs_now_ms();
}

static void on_ack(struct tp_req *req, reshard_status_t st, size_t bytes)
{
    (void)bytes;
    struct chunk_req *c = container_of(req, struct chunk_req, req);
    struct run *r = c->run;
    r->posted--;
    if (r->draining)
        return;
    if (st != RESHARD_OK) {
        fail(r, rs_error(st, "rank %d: the acknowledgement %s rank %d failed", r->comm->rank,
                         c->kind == REQ_RECV_CTRL ? "from" : "to", req->peer));
        return;
    }
    if (c->kind == REQ_RECV_CTRL)
        r->acks_in_left--;
    else
        r->acks_out_left--;
    r->last_event_ms = rs_now_ms();
}

/* Everything bound for this rank arrived: tell each sender. */
static reshard_status_t send_acks(struct run *r)
{
    struct exec *x = r->x;
    struct tp_ctx *net = x->comm->net;
    r->acked = 1;
    for (int i = 0; i < x->nrecv_peers; i++) {
        struct chunk_req *c = &r->ack_out[i];
        *c = (struct chunk_req){.req.done = on_ack, .run = r, .slot = -1, .kind = REQ_SEND_CTRL};
        RS_CHECK(net->ops->send(net, x->recv_peers[i],
                                make_tag(TAG_CTRL, r->seq, ACK_XFER, (uint32_t)x->comm->rank), NULL,
                                0, NULL, 1, &c->req));
        r->posted++;
    }
    return RESHARD_OK;
}

/* The scatter list of a strided destination chunk. */
static reshard_status_t chunk_iov(const struct region *rg, char *base, struct iovec **iov,
                                  size_t *n)
{
    struct region_iter it;
    uint64_t off, len;
    size_t count = 0, cap = 0;
    *iov = NULL;
    region_iter_init(&it, rg);
    while (region_iter_next(&it, &off, &len)) {
        if (count == cap) {
            struct iovec *v = rs_grow(*iov, &cap, count + 1, sizeof(*v), "scatter list");
            if (!v) {
                free(*iov);
                *iov = NULL;
                return RESHARD_ERR_NO_MEMORY;
            }
            *iov = v;
        }
        (*iov)[count++] = (struct iovec){base + off, len};
    }
    *n = count;
    return RESHARD_OK;
}

static reshard_status_t post_recv(struct run *r, size_t k, uint32_t chunk)
{
    struct exec *x = r->x;
    const struct xfer *xf = &x->xs.x[x->in[k]];
    struct chunk_req *c = &r->in_req[x->in_off[k] + chunk];
    *c = (struct chunk_req){
        .req.done = on_recv, .run = r, .pos = (uint32_t)k, .chunk = chunk, .slot = -1};
    struct tp_ctx *net = x->comm->net;
    reshard_status_t st;
    if (xf->path == XFER_LOCAL) {
        c->kind = REQ_RECV_CTRL;
        st = net->ops->recv(net, xf->src, make_tag(TAG_CTRL, r->seq, x->in[k], chunk), NULL, 0,
                            NULL, &c->req);
    } else {
        c->kind = REQ_RECV_DATA;
        struct region rg;
        uint64_t off;
        exec_chunk_region(x, xf, chunk, 1, &rg);
        char *base = my_base(r, xf, 1), *direct = gdr_at(r, xf, 1, &rg);
        uint64_t tag = make_tag(TAG_DATA, r->seq, x->in[k], chunk);
        if (direct) { /* GPUDirect: straight into the device buffer */
            st = net->ops->recv(net, xf->src, tag, direct, region_bytes(&rg), dev_mh(r, xf, 1),
                                &c->req);
        } else if (region_contiguous(&rg, &off)) {
            st = net->ops->recv(net, xf->src, tag, base + off, region_bytes(&rg), my_mh(r, xf, 1),
                                &c->req);
        } else {
            size_t n;
            RS_CHECK(chunk_iov(&rg, base, &c->iov, &n));
            st = net->ops->recv_iov(net, xf->src, tag, c->iov, n, &c->req);
            if (st != RESHARD_OK) {
                free(c->iov);
                c->iov = NULL;
            }
        }
    }
    if (st == RESHARD_OK)
        r->posted++;
    return st;
}

/* A packed message: one receive scattering straight into every piece's destination. */
static reshard_status_t post_bundle_recv(struct run *r, uint32_t bi)
{
    struct exec *x = r->x;
    const struct bundle *b = &x->in_b[bi];
    const struct piece *first = &x->in_p[b->first];
    struct chunk_req *c = &r->in_req[x->in_off[first->pos] + first->chunk];
    *c = (struct chunk_req){.req.done = on_recv,
                            .run = r,
                            .pos = BUNDLE_POS,
                            .chunk = bi,
                            .slot = -1,
                            .kind = REQ_RECV_DATA};
    size_t n = 0, cap = 0;
    for (uint32_t i = b->first; i < b->first + b->n; i++) {
        const struct piece *p = &x->in_p[i];
        const struct xfer *xf = &x->xs.x[x->in[p->pos]];
        struct region rg;
        struct iovec *v;
        size_t m;
        exec_chunk_region(x, xf, p->chunk, 1, &rg);
        reshard_status_t st = chunk_iov(&rg, my_base(r, xf, 1), &v, &m);
        struct iovec *all = st == RESHARD_OK
                                ? rs_grow(c->iov, &cap, n + m + 1, sizeof(*all), "scatter list")
                                : NULL;
        if (!all) {
            free(v);
            free(c->iov);
            c->iov = NULL;
            return st == RESHARD_OK ? RESHARD_ERR_NO_MEMORY : st;
        }
        c->iov = all;
        memcpy(c->iov + n, v, m * sizeof(*v));
        n += m;
        free(v);
    }
    struct tp_ctx *net = x->comm->net;
    reshard_status_t st = net->ops->recv_iov(
        net, b->peer, make_tag(TAG_PACK, r->seq, b->id, (uint32_t)b->peer), c->iov, n, &c->req);
    if (st != RESHARD_OK) {
        free(c->iov);
        c->iov = NULL;
        return st;
    }
    r->posted++;
    return RESHARD_OK;
}

/* Tells the receiver of out[o] that the chunk is in its memory. */
static reshard_status_t notify(struct run *r, uint32_t o, uint32_t chunk)
{
    struct exec *x = r->x;
    struct chunk_req *c = &r->out_req[x->out_off[o] + chunk];
    *c = (struct chunk_req){
        .req.done = on_send, .run = r, .pos = o, .chunk = chunk, .slot = -1, .kind = REQ_SEND_CTRL};
    struct tp_ctx *net = x->comm->net;
    RS_CHECK(net->ops->send(net, x->xs.x[x->out[o]].dst,
                            make_tag(TAG_CTRL, r->seq, x->out[o], chunk), NULL, 0, NULL, 1,
                            &c->req));
    r->posted++;
    return RESHARD_OK;
}

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
static int ipc_kernels(const struct run *r, const struct xfer *xf, const struct region *a,
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

/* A local transfer into a peer's device buffer, or a copy between this rank's own device
 * buffers: copies on the IPC stream and an event after them, which poll_ipc waits for before
 * it tells the peer (or counts the chunk arrived). Returns 0 when every event is in use (the
 * chunk waits). */
static int do_device(struct run *r, uint32_t o, uint32_t chunk)
{
    struct exec *x = r->x;
    struct reshard_comm *comm = x->comm;
    if (r->ipc_tail - r->ipc_head == CUDA_IPC_EVENTS)
        return 0;
    const struct xfer *xf = &x->xs.x[x->out[o]];
    int self = xf->path == XFER_SELF;
    size_t slot = slot_of(x, xf->dst, xf->tensor);
    reshard_status_t st = cuda_ipc_get(&comm->ipc);
    if (st == RESHARD_OK && !self && !r->peer_ipc[slot])
        st = cuda_ipc_open(&x->maps, xf->dst, r->peer_exp[slot], &r->peer_ipc[slot]);
    if (st != RESHARD_OK) {
        fail(r, st);
        return 1;
    }
    const struct cuda_fns *f = cuda_lib();
    struct cuda_ipc *ipc = comm->ipc;
    const char *src = dev_base(r, xf, 0);
    if (!src) /* a host buffer: the driver copies from it as well */
        src = my_base(r, xf, 0);
    char *dst = self ? dev_base(r, xf, 1) : r->peer_ipc[slot];
    struct region a, b;
    exec_chunk_region(x, xf, chunk, 0, &a);
    exec_chunk_region(x, xf, chunk, 1, &b);
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
        st = cuda_ipc_scratch(ipc, ring, (uint64_t)x->chunk_bytes, &scratch);
        if (st == RESHARD_OK)
            st = cuda_pack(&da, src, (void *)(uintptr_t)scratch, ipc->stream);
        if (st == RESHARD_OK)
            st = cuda_unpack(&db, dst, (const void *)(uintptr_t)scratch, ipc->stream);
        if (st != RESHARD_OK) {
            fail(r, st);
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
        fail(r, cuda_error(what, e));
        return 1;
    }
    if ((e = f->event_record(ipc->ev[ring], ipc->stream)) != CU_SUCCESS) {
        fail(r, cuda_error("the event after a CUDA IPC copy (cuEventRecord)", e));
        return 1;
    }
    r->ipc_q[r->ipc_tail++ % CUDA_IPC_EVENTS] = (struct ipc_copy){o, chunk};
    if (self) {
        comm->self += region_bytes(&a);
    } else {
        comm->local_out += region_bytes(&a);
        comm->ipc_out += region_bytes(&a);
    }
    return 1;
}

/* Tells the peers about the IPC copies that have completed, in stream order. */
static void poll_ipc(struct run *r)
{
    while (r->ipc_head < r->ipc_tail && r->st == RESHARD_OK) {
        struct cuda_ipc *ipc = r->x->comm->ipc;
        cu_result e = cuda_lib()->event_query(ipc->ev[r->ipc_head % CUDA_IPC_EVENTS]);
        if (e == CU_ERROR_NOT_READY)
            return;
        struct ipc_copy c = r->ipc_q[r->ipc_head++ % CUDA_IPC_EVENTS];
        const struct xfer *xf = &r->x->xs.x[r->x->out[c.pos]];
        reshard_status_t st = RESHARD_OK;
        if (e != CU_SUCCESS)
            st =
                cuda_error(xf->path == XFER_SELF ? "a device copy inside the rank (cuEventQuery)"
                                                 : "a CUDA IPC copy to a local peer (cuEventQuery)",
                           e);
        else if (xf->path == XFER_SELF) {
            r->out_left--;
            arrived(r, -1, c.chunk, xf);
        } else
            st = notify(r, c.pos, c.chunk);
        if (st != RESHARD_OK)
            fail(r, st);
        r->last_event_ms = rs_now_ms();
    }
}

/* A local transfer: write the chunk into the peer's memory, then tell it. */
static reshard_status_t do_local(struct run *r, uint32_t o, uint32_t chunk)
{
    struct exec *x = r->x;
    const struct xfer *xf = &x->xs.x[x->out[o]];
    struct region a, b;
    exec_chunk_region(x, xf, chunk, 0, &a);
    exec_chunk_region(x, xf, chunk, 1, &b);
    const char *src = my_base(r, xf, 0);
    size_t slot = (size_t)xf->dst * (size_t)x->plan->ntensors + xf->tensor;
    char *dst = xf->dst_buf == XBUF_TMP ? r->peer_tmp[slot] : r->peer_dst[slot];
    struct iovec l[256], rm[256];
    size_t n = 0;
    struct region_pair p;
    uint64_t ao, bo, len;
    region_pair_init(&p, &a, &b);
    while (region_pair_next(&p, &ao, &bo, &len)) {
        l[n] = (struct iovec){(char *)src + ao, len};
        rm[n] = (struct iovec){dst + bo, len};
        if (++n == 256) {
            RS_CHECK(cma_write(x->comm->pid[xf->dst], xf->dst, l, rm, n));
            n = 0;
        }
    }
    if (n)
        RS_CHECK(cma_write(x->comm->pid[xf->dst], xf->dst, l, rm, n));
    x->comm->local_out += region_bytes(&a);
    return notify(r, o, chunk);
}

static void do_self(struct run *r, uint32_t o, uint32_t chunk)
{
    struct exec *x = r->x;
    const struct xfer *xf = &x->xs.x[x->out[o]];
    struct region a, b;
    exec_chunk_region(x, xf, chunk, 0, &a);
    exec_chunk_region(x, xf, chunk, 1, &b);
    region_copy(&a, my_base(r, xf, 0), &b, my_base(r, xf, 1));
    x->comm->self += region_bytes(&a);
    r->out_left--;
    arrived(r, -1, chunk, xf);
}

/* A packed message: every piece packed into one staging slot, one send. Returns 0 when it
 * must wait for a slot or the window. */
static int do_bundle(struct run *r, uint32_t bi)
{
    struct exec *x = r->x;
    struct reshard_comm *comm = x->comm;
    const struct bundle *b = &x->out_b[bi];
    if (r->inflight >= SEND_WINDOW || r->peer_inflight[b->peer] >= PEER_WINDOW || !comm->nfree)
        return 0;
    const struct piece *first = &x->out_p[b->first];
    struct chunk_req *c = &r->out_req[x->out_off[first->pos] + first->chunk];
    *c = (struct chunk_req){.req.done = on_send,
                            .run = r,
                            .pos = BUNDLE_POS,
                            .chunk = bi,
                            .slot = comm->free_slots[--comm->nfree],
                            .kind = REQ_SEND_DATA};
    char *buf = comm->staging + (size_t)c->slot * (size_t)comm->slot_bytes, *at = buf;
    for (uint32_t i = b->first; i < b->first + b->n; i++) {
        const struct piece *p = &x->out_p[i];
        const struct xfer *xf = &x->xs.x[x->out[p->pos]];
        struct region a;
        exec_chunk_region(x, xf, p->chunk, 0, &a);
        region_pack(&a, my_base(r, xf, 0), at);
        at += region_bytes(&a);
    }
    struct tp_ctx *net = comm->net;
    reshard_status_t st =
        net->ops->send(net, b->peer, make_tag(TAG_PACK, r->seq, b->id, (uint32_t)comm->rank), buf,
                       b->bytes, comm->staging_mh, 0, &c->req);
    if (st != RESHARD_OK) {
        comm->free_slots[comm->nfree++] = c->slot;
        fail(r, st);
        return 1;
    }
    r->posted++;
    r->inflight++;
    r->peer_inflight[b->peer]++;
    return 1;
}

/* A network send: straight from the source when contiguous, else packed into staging.
 * Returns 0 when it must wait for a slot or the window. */
static int do_net(struct run *r, uint32_t o, uint32_t chunk)
{
    if (o == BUNDLE_POS)
        return do_bundle(r, chunk);
    struct exec *x = r->x;
    struct reshard_comm *comm = x->comm;
    const struct xfer *xf = &x->xs.x[x->out[o]];
    if (r->inflight >= SEND_WINDOW || r->peer_inflight[xf->dst] >= PEER_WINDOW)
        return 0;
    struct region a;
    uint64_t off = 0;
    exec_chunk_region(x, xf, chunk, 0, &a);
    int contiguous = region_contiguous(&a, &off);
    if (!contiguous && !comm->nfree)
        return 0;
    struct chunk_req *c = &r->out_req[x->out_off[o] + chunk];
    *c = (struct chunk_req){
        .req.done = on_send, .run = r, .pos = o, .chunk = chunk, .slot = -1, .kind = REQ_SEND_DATA};
    const char *buf;
    void *mh;
    char *direct = gdr_at(r, xf, 0, &a);
    if (direct) { /* GPUDirect: straight from the device buffer */
        buf = direct;
        mh = dev_mh(r, xf, 0);
        comm->gdr_out += region_bytes(&a);
    } else if (contiguous) {
        buf = my_base(r, xf, 0) + off;
        mh = my_mh(r, xf, 0);
    } else {
        c->slot = comm->free_slots[--comm->nfree];
        buf = comm->staging + (size_t)c->slot * (size_t)comm->slot_bytes;
        mh = comm->staging_mh;
        region_pack(&a, my_base(r, xf, 0), (char *)buf);
    }
    struct tp_ctx *net = comm->net;
    reshard_status_t st = net->ops->send(net, xf->dst, make_tag(TAG_DATA, r->seq, x->out[o], chunk),
                                         buf, region_bytes(&a), mh, 0, &c->req);
    if (st != RESHARD_OK) {
        if (c->slot >= 0)
            comm->free_slots[comm->nfree++] = c->slot;
        fail(r, st);
        return 1;
    }
    r->posted++;
    r->inflight++;
    r->peer_inflight[xf->dst]++;
    return 1;
}

/* Posts queued network sends in order, passing over (at most SEND_SCAN) ones whose peer has
 * its window full; those keep their place. */
static void drain_net(struct run *r)
{
    struct queue *q = &r->net_q;
    size_t keep = q->head, i = q->head;
    for (; i < q->tail && keep - q->head < SEND_SCAN && r->st == RESHARD_OK; i++) {
        if (r->inflight >= SEND_WINDOW)
            break;
        if (!do_net(r, q->q[i].pos, q->q[i].chunk))
            q->q[keep++] = q->q[i]; /* not now: stays, ahead of what follows */
    }
    if (keep == i)
        return; /* nothing sent (or nothing queued: q->q may be NULL) */
    /* Entries [keep, i) were sent: close the gap. */
    memmove(q->q + keep, q->q + i, (q->tail - i) * sizeof(*q->q));
    q->tail -= i - keep;
}

/* Works through the ready queues: network sends first, while the window and the staging
 * slots allow (posting is cheap and keeps the wire busy), then local work to the end. */
static void drain_ready(struct run *r)
{
    struct exec *x = r->x;
    drain_net(r);
    for (struct queue *q = &r->local_q; q->head < q->tail && r->st == RESHARD_OK; q->head++) {
        struct ready w = q->q[q->head];
        const struct xfer *xf = &x->xs.x[x->out[w.pos]];
        if (xf->path == XFER_SELF && !self_on_device(r, xf)) {
            do_self(r, w.pos, w.chunk);
            continue;
        }
        if (via_ipc(r, xf) || self_on_device(r, xf)) {
            if (!do_device(r, w.pos, w.chunk))
                break; /* this one and what follows wait for an event */
            continue;
        }
        reshard_status_t st = do_local(r, w.pos, w.chunk);
        if (st != RESHARD_OK)
            fail(r, st);
    }
}

/* ---- start: every rank checks its buffers and learns where the others' are ---- */

#define SIDE_STAGING 2 /* hello.side: device buffers could not be staged */

struct hello {
    uint64_t hash;
    uint32_t seq;
    int32_t status; /* RESHARD_OK, or why this rank cannot run */
    int32_t tensor, side;
    uint64_t need, have;
    int32_t cuda;     /* this rank has device buffers and IPC on: it writes peers through IPC */
    uint32_t nexp;    /* device destinations it exports for local peers to write */
    uint64_t exp_sum; /* their checksum */
    uint64_t held;    /* the export table this rank holds for the plan (0: none) */
    char why[128];    /* status != OK: this rank's own message, for the others to repeat */
};

static size_t hello_bytes(const struct exec *x)
{
    return sizeof(struct hello) + 2 * sizeof(uint64_t) * (size_t)x->plan->ntensors;
}

/* This rank's buffers against its shards. */
static void check_buffers(const struct exec *x, const reshard_buffers_t *bufs, int on_nccl,
                          struct hello *h)
{
    int me = x->comm->rank;
    for (int t = 0; t < x->plan->ntensors; t++) {
        const struct plan_tensor *pt = &x->plan->tensors[t];
        for (int side = 0; side < 2; side++) {
            const struct rs_shardmap *m = side ? &pt->dst_map : &pt->src_map;
            int pos = shardmap_position(m, me);
            if (pos < 0)
                continue;
            int64_t shape[RS_MAX_DIMS];
            for (int j = 0; j < pt->dst.ndim; j++)
                shape[j] = dimmap_group_len(&m->dim[j], shardmap_group(m, pos, j));
            uint64_t need = region_span_bytes(m->layout, shape);
            const void *p = side ? bufs[t].dst : bufs[t].src;
            size_t have = side ? bufs[t].dst_bytes : bufs[t].src_bytes;
            if (need && (!p || have < need)) {
                h->status = RESHARD_ERR_BUFFER;
                h->tensor = t;
                h->side = side;
                h->need = need;
                h->have = p ? have : 0;
                return;
            }
            if (on_nccl && bufs[t].mem != RESHARD_MEM_CUDA) {
                h->status = RESHARD_ERR_INVALID_ARG;
                h->tensor = t;
                h->side = side;
                return;
            }
            if (on_nccl)
                continue;
            enum cuda_mem_kind kind = cuda_mem_kind(p); /* staged device buffers are host */
            if (bufs[t].mem != RESHARD_MEM_HOST || kind == CUDA_MEM_DEVICE) {
                h->status = RESHARD_ERR_UNAVAILABLE;
                h->tensor = t;
                h->side = side;
                h->need = bufs[t].mem != RESHARD_MEM_HOST; /* declared, or found by the driver */
                return;
            }
        }
    }
}

static reshard_status_t refuse(const struct exec *x, int rank, const struct hello *h)
{
    const char *name = x->plan->tensors[h->tensor].name;
    const char *side = h->side ? "destination" : "source";
    if (h->status == RESHARD_ERR_BUFFER)
        return rs_error(RESHARD_ERR_BUFFER,
                        "rank %d: %s buffer of tensor %s holds %llu bytes, its shard needs %llu",
                        rank, side, name, (unsigned long long)h->have, (unsigned long long)h->need);
    if (h->status == RESHARD_ERR_UNAVAILABLE && h->side == SIDE_STAGING)
        return rs_error(RESHARD_ERR_UNAVAILABLE,
                        "rank %d has device buffers and no CUDA driver to stage them with", rank);
    if (h->status == RESHARD_ERR_UNAVAILABLE)
        return rs_error(RESHARD_ERR_UNAVAILABLE,
                        "rank %d: %s buffer of tensor %s is device memory (%s): the executor moves "
                        "host memory only so far",
                        rank, side, name,
                        h->need ? "declared RESHARD_MEM_CUDA"
                                : "declared host, but the CUDA "
                                  "driver says device");
    if (h->status == RESHARD_ERR_INVALID_ARG)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "rank %d: %s buffer of tensor %s is host memory: the NCCL executor moves "
                        "device memory (RESHARD_MEM_CUDA)",
                        rank, side, name);
    return rs_error(RESHARD_ERR_REMOTE, "rank %d could not start the execution: %s", rank,
                    h->why[0] ? h->why : rs_status_string((reshard_status_t)h->status));
}

/* This rank's exports (x->my_exp, *n of them): its device destinations that local peers write,
 * when CUDA IPC is on. An export is made again only when its buffer or allocation changed. */
static reshard_status_t make_exports(struct exec *x, const struct run *r, uint32_t *n)
{
    *n = 0;
    if (!r || !r->dev || !rs_param_int(RS_PARAM_CUDA_IPC))
        return RESHARD_OK;
    size_t nt = (size_t)x->plan->ntensors;
    if (!x->exp_cache &&
        (!(x->exp_cache = rs_calloc(nt, sizeof(*x->exp_cache), "CUDA IPC exports")) ||
         !(x->my_exp = rs_calloc(nt, sizeof(*x->my_exp), "CUDA IPC exports")) ||
         !(x->exp_key = rs_calloc(2 * nt, sizeof(uint64_t), "CUDA IPC exports"))))
        return RESHARD_ERR_NO_MEMORY;
    uint8_t *wanted = rs_calloc(nt, 1, "CUDA IPC exports");
    if (!wanted)
        return RESHARD_ERR_NO_MEMORY;
    for (size_t k = 0; k < x->nin; k++) {
        const struct xfer *xf = &x->xs.x[x->in[k]];
        if (xf->path == XFER_LOCAL && xf->dst_buf == XBUF_DST)
            wanted[xf->tensor] = 1;
    }
    const struct cuda_fns *f = cuda_lib(); /* there: r->dev was staged with it */
    struct rs_saved_error saved;
    rs_error_save(&saved);
    for (size_t t = 0; t < nt; t++) {
        const reshard_buffers_t *b = &r->dev[t];
        if (!wanted[t] || b->mem != RESHARD_MEM_CUDA || !b->dst || !b->dst_bytes)
            continue;
        uint64_t ptr = (uint64_t)(uintptr_t)b->dst, id = 0;
        if (f->pointer_get_attribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, ptr) != CU_SUCCESS)
            id = 0; /* unknown: export again every time */
        if (!id || x->exp_key[2 * t] != ptr || x->exp_key[2 * t + 1] != id) {
            cuda_ipc_unexport(&x->exp_cache[t]); /* a descriptor it held */
            /* Not every allocation exports (cuMemCreate without a shareable handle,
             * stream-ordered pools): its writers then stage, and the first run says why. */
            if (cuda_ipc_export(b->dst, b->dst_bytes, (uint32_t)t, &x->exp_cache[t]) !=
                RESHARD_OK) {
                x->exp_cache[t].tensor = UINT32_MAX;
                rs_log(x->exp_refused++ ? RS_LOG_TRACE : RS_LOG_INFO,
                       "rank %d: tensor %s: local peers stage: %s", x->comm->rank,
                       x->plan->tensors[t].name, rs_error_message());
            }
            x->exp_key[2 * t] = id ? ptr : 0;
            x->exp_key[2 * t + 1] = id;
        }
        if (x->exp_cache[t].tensor != UINT32_MAX)
            x->my_exp[(*n)++] = x->exp_cache[t];
    }
    rs_error_restore(&saved);
    free(wanted);
    return RESHARD_OK;
}

static uint64_t checksum(const void *p, size_t n)
{
    uint64_t h = UINT64_C(14695981039346656037);
    for (size_t i = 0; i < n; i++)
        h = (h ^ ((const unsigned char *)p)[i]) * UINT64_C(1099511628211);
    return h;
}

/* After a good verdict: every rank's exports, gathered again only when some rank's changed,
 * and what the run makes of them. A failure here breaks the communicator (the bootstrap may
 * be half-way through a collective). */
static reshard_status_t gather_exports(struct exec *x, struct run *r, const char *all, size_t hb,
                                       uint32_t mine)
{
    struct reshard_comm *c = x->comm;
    uint32_t max = 0;
    uint64_t table = UINT64_C(14695981039346656037); /* the exports now, as the hellos tell */
    for (int q = 0; q < c->size; q++) {
        const struct hello *h = (const struct hello *)(all + (size_t)q * hb);
        if (h->nexp > max)
            max = h->nexp;
        uint64_t sum = h->exp_sum ^ (uint64_t)h->nexp << 32;
        table = checksum(&sum, sizeof(sum)) ^ (table * UINT64_C(1099511628211));
        if (r && r->peer_cuda)
            r->peer_cuda[q] = (uint8_t)(h->cuda != 0);
    }
    if (!max) { /* nobody exports */
        x->exp_table = 0;
        return RESHARD_OK;
    }
    /* Gathered again unless every rank holds this table already: decided from the hellos
     * alone, so that all ranks join the all-gather or none does. */
    int same = 1;
    for (int q = 0; q < c->size; q++)
        same = same &&
               (!comm_has(c, q) || ((const struct hello *)(all + (size_t)q * hb))->held == table);
    if (!same) {
        size_t bytes = max * sizeof(struct cuda_ipc_export);
        struct cuda_ipc_export *e = rs_calloc((size_t)c->size, bytes, "CUDA IPC exports");
        if (!x->exp_n)
            x->exp_n = rs_calloc((size_t)c->size, sizeof(uint32_t), "CUDA IPC exports");
        if (!e || !x->exp_n) {
            free(e);
            boot_abort(c->boot, RESHARD_ERR_NO_MEMORY, "out of memory gathering CUDA IPC exports");
            return RESHARD_ERR_NO_MEMORY;
        }
        if (mine)
            memcpy(e + (size_t)c->rank * max, x->my_exp, mine * sizeof(*e));
        x->exp_table = 0; /* until the gathering succeeded */
        reshard_status_t st = comm_allgather(c, e, bytes);
        if (st != RESHARD_OK) {
            free(e);
            return st;
        }
        free(x->exports);
        x->exports = e;
        x->exp_max = max;
        x->exp_table = table;
        for (int q = 0; q < c->size; q++) {
            const struct hello *h = (const struct hello *)(all + (size_t)q * hb);
            x->exp_n[q] = h->nexp;
            if (x->maps.nopen && q != c->rank) /* buffers a peer no longer exports: unmapped */
                cuda_ipc_prune(&x->maps, q, x->exports + (size_t)q * max, h->nexp);
        }
    }
    for (int q = 0; r && r->peer_exp && q < c->size; q++)
        for (uint32_t i = 0; i < x->exp_n[q]; i++) {
            const struct cuda_ipc_export *e = x->exports + (size_t)q * x->exp_max + i;
            if (e->tensor < (uint32_t)x->plan->ntensors)
                r->peer_exp[slot_of(x, q, e->tensor)] = e;
        }
    return RESHARD_OK;
}

/* Every rank joins, even one that already failed locally (local != OK), so that all reach the
 * same verdict instead of waiting for it. On success peer_dst / peer_tmp are filled. */
static reshard_status_t exchange(struct exec *x, const reshard_buffers_t *bufs, uint32_t seq,
                                 reshard_status_t local, struct run *r, int on_nccl)
{
    struct reshard_comm *c = x->comm;
    size_t hb = hello_bytes(x);
    char *all = rs_calloc((size_t)c->size, hb, "hello");
    if (!all)
        local = RESHARD_ERR_NO_MEMORY; /* still join, with a zero-sized view of our own */
    char mine[sizeof(struct hello)];
    struct hello *me = all ? (struct hello *)(all + (size_t)c->rank * hb) : (struct hello *)mine;
    uint32_t nexp = 0;
    if (local == RESHARD_OK)
        local = make_exports(x, r, &nexp);
    *me = (struct hello){.hash = x->plan->hash,
                         .seq = seq,
                         .status = local,
                         .cuda = r && r->dev && rs_param_int(RS_PARAM_CUDA_IPC),
                         .nexp = nexp,
                         .exp_sum = nexp ? checksum(x->my_exp, nexp * sizeof(*x->my_exp)) : 0,
                         .held = x->exp_table};
    if (local == RESHARD_ERR_UNAVAILABLE) /* only staging fails so before the exchange */
        me->side = SIDE_STAGING;
    if (local != RESHARD_OK)
        snprintf(me->why, sizeof(me->why), "%s", rs_error_message());
    if (local == RESHARD_OK)
        check_buffers(x, bufs, on_nccl, me);
    if (!all) { /* cannot take part: tell the others rather than let them time out */
        boot_abort(c->boot, local, "out of memory starting an execution");
        c->broken = local;
        snprintf(c->broken_why, sizeof(c->broken_why), "out of memory starting an execution");
        return local;
    }
    uint64_t *addr = (uint64_t *)(me + 1);
    for (int t = 0; t < x->plan->ntensors; t++) {
        addr[2 * t] = (uint64_t)(uintptr_t)bufs[t].dst;
        addr[2 * t + 1] = (uint64_t)(uintptr_t)(x->tmp ? x->tmp[t] : NULL);
    }
    reshard_status_t st = comm_allgather(c, all, hb);
    if (st != RESHARD_OK) { /* the bootstrap is unusable now: so is the communicator */
        c->broken = st;
        snprintf(c->broken_why, sizeof(c->broken_why), "%s", rs_error_message());
    }
    for (int q = 0; st == RESHARD_OK && q < c->size; q++) { /* every rank: the same verdict */
        const struct hello *h = (const struct hello *)(all + (size_t)q * hb);
        if (!comm_has(c, q))
            continue;
        if (h->status != RESHARD_OK && q == c->rank && local != RESHARD_OK)
            st = local; /* our own failure: its message is already recorded */
        else if (h->status != RESHARD_OK)
            st = refuse(x, q, h);
        else if (h->hash != x->plan->hash || h->seq != seq)
            st = rs_error(RESHARD_ERR_PLAN_MISMATCH,
                          "rank %d executes another plan (hash %016llx, execution %u; here "
                          "%016llx, %u): every rank must execute the same plans in the same "
                          "order",
                          q, (unsigned long long)h->hash, h->seq, (unsigned long long)x->plan->hash,
                          seq);
    }
    if (st == RESHARD_OK && (st = gather_exports(x, r, all, hb, nexp)) != RESHARD_OK) {
        c->broken = st;
        snprintf(c->broken_why, sizeof(c->broken_why), "%s", rs_error_message());
    }
    for (int q = 0; r && st == RESHARD_OK && q < c->size; q++) {
        const uint64_t *a = (const uint64_t *)((const struct hello *)(all + (size_t)q * hb) + 1);
        for (int t = 0; t < x->plan->ntensors; t++) {
            size_t slot = (size_t)q * (size_t)x->plan->ntensors + (size_t)t;
            r->peer_dst[slot] = (char *)(uintptr_t)a[2 * t];
            r->peer_tmp[slot] = (char *)(uintptr_t)a[2 * t + 1];
        }
    }
    free(all);
    return st;
}

/* ---- the run ---- */

static void run_free(struct run *r)
{
    if (!r)
        return;
    for (size_t i = 0; r->in_req && i < r->nin_req; i++)
        free(r->in_req[i].iov);
    free(r->peer_dst);
    free(r->peer_tmp);
    free(r->peer_exp);
    free(r->peer_ipc);
    free(r->peer_cuda);
    free(r->src_staged);
    free(r->in_req);
    free(r->out_req);
    free(r->in_arrived);
    free(r->tmp_left);
    free(r->dst_left);
    free(r->peer_inflight);
    free(r->ack_in);
    free(r->ack_out);
    free(r->net_q.q);
    free(r->local_q.q);
    free(r);
}

static void run_free_any(void *r)
{
    run_free(r);
}

/* Whole-tensor buffers for the broadcast baseline, on the ranks that use one; made by the
 * first run, kept for the next (fresh pages would fault in under every cross-memory write). */
static reshard_status_t alloc_tmp(struct exec *x)
{
    int me = x->comm->rank;
    if (!x->xs.needs_tmp || x->tmp)
        return RESHARD_OK;
    if (!(x->tmp = rs_calloc((size_t)x->plan->ntensors + 1, sizeof(char *), "tensor buffers")))
        return RESHARD_ERR_NO_MEMORY;
    for (size_t i = 0; i < x->xs.n; i++) {
        const struct xfer *xf = &x->xs.x[i];
        int mine = (xf->src == me && xf->src_buf == XBUF_TMP) ||
                   (xf->dst == me && xf->dst_buf == XBUF_TMP);
        if (!mine || x->tmp[xf->tensor])
            continue;
        const struct rs_layout *l = &x->plan->tensors[xf->tensor].dst;
        size_t n = (size_t)layout_numel(l) * dtype_size(l->dtype);
        if (!(x->tmp[xf->tensor] = malloc(n ? n : 1)))
            return rs_error(RESHARD_ERR_NO_MEMORY, "no memory for a %zu-byte tensor buffer", n);
    }
    return RESHARD_OK;
}

static reshard_status_t run_create(struct exec *x, const reshard_buffers_t *bufs,
                                   const reshard_buffers_t *dev, uint32_t seq, struct run **out)
{
    struct run *r = rs_calloc(1, sizeof(*r), "execution");
    if (!r)
        return RESHARD_ERR_NO_MEMORY;
    r->x = x;
    r->comm = x->comm;
    r->bufs = bufs;
    r->seq = seq;
    size_t slots = (size_t)x->comm->size * (size_t)x->plan->ntensors;
    r->peer_dst = rs_calloc(slots, sizeof(char *), "peer buffers");
    r->peer_tmp = rs_calloc(slots, sizeof(char *), "peer buffers");
    if (dev) {
        r->dev = dev;
        r->peer_exp = rs_calloc(slots, sizeof(*r->peer_exp), "peer buffers");
        r->peer_ipc = rs_calloc(slots, sizeof(char *), "peer buffers");
        r->peer_cuda = rs_calloc((size_t)x->comm->size, 1, "peer buffers");
        r->src_staged = rs_calloc((size_t)x->plan->ntensors, 1, "peer buffers");
    }
    r->nin_req = x->in_off[x->nin];
    r->in_req = rs_calloc(r->nin_req + 1, sizeof(*r->in_req), "receives");
    r->out_req = rs_calloc(x->out_off[x->nout] + 1, sizeof(*r->out_req), "sends");
    r->in_arrived = rs_calloc(x->nin + 1, sizeof(uint32_t), "arrivals");
    r->tmp_left = rs_calloc((size_t)x->plan->ntensors, sizeof(size_t), "arrivals");
    r->dst_left = rs_calloc((size_t)x->plan->ntensors, sizeof(size_t), "arrivals");
    r->peer_inflight = rs_calloc((size_t)x->comm->size, sizeof(int), "sends in flight");
    r->ack_in = rs_calloc((size_t)x->nsend_peers + 1, sizeof(*r->ack_in), "acknowledgements");
    r->ack_out = rs_calloc((size_t)x->nrecv_peers + 1, sizeof(*r->ack_out), "acknowledgements");
    if (!r->peer_dst || !r->peer_tmp ||
        (dev && (!r->peer_exp || !r->peer_ipc || !r->peer_cuda || !r->src_staged)) || !r->in_req ||
        !r->out_req || !r->in_arrived || !r->tmp_left || !r->dst_left || !r->peer_inflight ||
        !r->ack_in || !r->ack_out) {
        run_free(r);
        return RESHARD_ERR_NO_MEMORY;
    }
    r->in_left = x->in_off[x->nin];
    r->out_left = x->out_off[x->nout];
    r->acks_in_left = x->nsend_peers;
    r->acks_out_left = x->nrecv_peers;
    memcpy(r->tmp_left, x->tmp_chunks, (size_t)x->plan->ntensors * sizeof(size_t));
    memcpy(r->dst_left, x->dst_chunks, (size_t)x->plan->ntensors * sizeof(size_t));
    *out = r;
    return RESHARD_OK;
}

static reshard_status_t start(struct run *r)
{
    struct exec *x = r->x;
    struct tp_ctx *net = x->comm->net;
    for (int i = 0; i < x->nsend_peers; i++) {
        struct chunk_req *c = &r->ack_in[i];
        int peer = x->send_peers[i];
        *c = (struct chunk_req){.req.done = on_ack, .run = r, .slot = -1, .kind = REQ_RECV_CTRL};
        RS_CHECK(net->ops->recv(net, peer, make_tag(TAG_CTRL, r->seq, ACK_XFER, (uint32_t)peer),
                                NULL, 0, NULL, &c->req));
        r->posted++;
    }
    for (size_t k = 0; k < x->nin; k++)
        for (size_t c = 0; c < x->in_off[k + 1] - x->in_off[k]; c++)
            if (!x->in_bundled[x->in_off[k] + c])
                RS_CHECK(post_recv(r, k, (uint32_t)c));
    for (size_t b = 0; b < x->nin_b; b++)
        RS_CHECK(post_bundle_recv(r, (uint32_t)b));
    /* Packed messages first (their small pieces unblock fan-out early), starting at the first
     * peer after this rank as the other sends do, so that ranks do not all open on rank 0. */
    size_t first = 0;
    while (first < x->nout_b && x->out_b[first].peer < x->comm->rank)
        first++;
    for (size_t i = 0; i < x->nout_b; i++)
        RS_CHECK(push_ready(r, BUNDLE_POS, (uint32_t)((first + i) % x->nout_b)));
    for (size_t o = 0; o < x->nout; o++)
        if (x->xs.x[x->out[o]].parent == XFER_NONE)
            for (size_t c = 0; c < x->out_off[o + 1] - x->out_off[o]; c++)
                if (!x->out_bundled[x->out_off[o] + c])
                    RS_CHECK(push_ready(r, (uint32_t)o, (uint32_t)c));
    for (int t = 0; t < x->plan->ntensors; t++)
        if (r->tmp_left[t] == 0) /* nothing to wait for: a root holding the whole tensor */
            release_whole(r, (uint32_t)t);
    return r->st;
}

/* Who this rank still waits for, for the timeout message. */
static void describe_wait(const struct run *r, char *buf, size_t n)
{
    const struct exec *x = r->x;
    size_t used = 0;
    int shown = 0;
    buf[0] = 0;
    for (size_t k = 0; k < x->nin && shown < 4 && used < n; k++) {
        size_t want = x->in_off[k + 1] - x->in_off[k];
        if (r->in_arrived[k] == want)
            continue;
        int w = snprintf(buf + used, n - used, "%s%zu chunk(s) from rank %d", shown++ ? ", " : "",
                         want - r->in_arrived[k], x->xs.x[x->in[k]].src);
        used += w > 0 ? (size_t)w : 0;
    }
    for (size_t i = 0; i < x->out_off[x->nout] && shown < 4 && used < n; i++) {
        const struct chunk_req *c = &r->out_req[i];
        if (!c->req.handle)
            continue;
        int w = snprintf(buf + used, n - used, "%sa send of chunk %u to rank %d",
                         shown++ ? ", " : "", c->chunk, c->req.peer);
        used += w > 0 ? (size_t)w : 0;
    }
    for (int i = 0; i < x->nsend_peers && shown < 4 && used < n; i++) {
        if (!r->ack_in[i].req.handle)
            continue;
        int w = snprintf(buf + used, n - used, "%sthe acknowledgement of rank %d",
                         shown++ ? ", " : "", x->send_peers[i]);
        used += w > 0 ? (size_t)w : 0;
    }
    if (!shown && r->ipc_tail > r->ipc_head)
        snprintf(buf, n, "%zu device copies to complete", r->ipc_tail - r->ipc_head);
    else if (!shown)
        snprintf(buf, n, "%zu send(s) to complete", r->out_left);
}

static int run_done(const struct run *r)
{
    return !r->in_left && !r->out_left && r->acked && !r->acks_in_left && !r->acks_out_left;
}

static reshard_status_t wait_done(struct run *r)
{
    struct exec *x = r->x;
    struct tp_ctx *net = x->comm->net;
    int timeout = comm_timeout_ms();
    r->last_event_ms = rs_now_ms();
    int64_t next_check = r->last_event_ms + BOOT_CHECK_MS;
    while (r->st == RESHARD_OK && !run_done(r)) {
        if (atomic_load(&x->comm->abort_req))
            return fail(r,
                        rs_error(RESHARD_ERR_ABORTED,
                                 "rank %d: execution aborted (reshard_comm_abort)", x->comm->rank));
        if (rs_now_ms() >= next_check) { /* a rank that failed or aborted says so here */
            reshard_status_t st = boot_check(x->comm->boot);
            if (st != RESHARD_OK)
                return fail(r, st);
            next_check = rs_now_ms() + BOOT_CHECK_MS;
        }
        poll_ipc(r);
        drain_ready(r);
        if (!r->in_left && !r->acked) {
            reshard_status_t st = send_acks(r);
            if (st != RESHARD_OK)
                return fail(r, st);
        }
        if (net->ops->progress(net))
            continue;
        if (r->st != RESHARD_OK || run_done(r))
            break;
        if (net->failed_peer >= 0) { /* a rank's own report names the cause better */
            reshard_status_t st = boot_check(x->comm->boot);
            if (st != RESHARD_OK)
                return fail(r, st);
        }
        if (net->failed_peer >= 0)
            return fail(r,
                        rs_error(RESHARD_ERR_NETWORK, "rank %d: connection to rank %d failed: %s",
                                 x->comm->rank, net->failed_peer, net->failed_why));
        int64_t idle = rs_now_ms() - r->last_event_ms;
        if (idle >= timeout) {
            char what[192];
            describe_wait(r, what, sizeof(what));
            return fail(r, rs_error(RESHARD_ERR_TIMEOUT,
                                    "rank %d: no progress for %d s, still waiting for %s",
                                    x->comm->rank, timeout / 1000, what));
        }
        if (r->inflight > 0 || r->ipc_tail > r->ipc_head) {
            /* Our own sends need our progress to leave (UCX over TCP does not always signal
             * a socket that drained), and copies on the GPU signal nothing: poll, but let
             * other ranks on this core run. */
            sched_yield();
            continue;
        }
        int64_t left = timeout - idle;
        reshard_status_t st = net->ops->wait(net, left < WAIT_CAP_MS ? (int)left : WAIT_CAP_MS);
        if (st != RESHARD_OK)
            return fail(r, st);
    }
    return r->st;
}

/* After a failure in flight: cancel the receives and let the callbacks run, for a while.
 * Sends to a failed peer fail by themselves (endpoints are in peer error mode); force-closing
 * endpoints here instead made UCX 1.13's TCP transport assert on a peer that had just died. */
static void drain_failed(struct run *r)
{
    struct exec *x = r->x;
    struct tp_ctx *net = x->comm->net;
    r->draining = 1;
    for (size_t i = 0; i < x->in_off[x->nin]; i++)
        if (r->in_req[i].req.handle)
            net->ops->cancel(net, &r->in_req[i].req);
    for (int i = 0; i < x->nsend_peers; i++)
        if (r->ack_in[i].req.handle)
            net->ops->cancel(net, &r->ack_in[i].req);
    if (x->comm->ipc) { /* nothing keeps writing into a peer once we return */
        (void)cuda_lib()->stream_synchronize(x->comm->ipc->stream);
        r->ipc_head = r->ipc_tail;
    }
    int64_t until = rs_now_ms() + DRAIN_MS;
    while (r->posted > 0 && rs_now_ms() < until)
        if (!net->ops->progress(net))
            (void)net->ops->wait(net, WAIT_CAP_MS);
}

/* GPUDirect: the device buffers registered with the transport, so that contiguous network
 * chunks move between the wire and the device directly. Otherwise (the transport cannot,
 * RESHARD_GPUDIRECT=0, or a registration fails) they stage through host memory, and the first
 * run says why at INFO. RESHARD_TEST_DEVICE_AS_HOST=1 registers device buffers as host memory:
 * the stand-in driver's device memory is host memory, so tests run this path on any transport. */
static int try_gdr(struct exec *x, const reshard_buffers_t *dev)
{
    struct tp_ctx *net = x->comm->net;
    const char *as_host = getenv("RESHARD_TEST_DEVICE_AS_HOST");
    enum tp_mem mem = as_host && !strcmp(as_host, "1") ? TP_MEM_HOST : TP_MEM_CUDA;
    char why[RS_ERROR_MAX] = "";
    struct rs_saved_error saved;
    rs_error_save(&saved);
    int nt = x->plan->ntensors;
    if (!rs_param_int(RS_PARAM_GPUDIRECT))
        snprintf(why, sizeof(why), "RESHARD_GPUDIRECT=0");
    else if (mem == TP_MEM_CUDA && !net->device_mem)
        snprintf(why, sizeof(why), "%s", net->device_mem_why);
    else if (!x->dreg && !(x->dreg = rs_calloc(2 * (size_t)nt, sizeof(*x->dreg), "registrations")))
        snprintf(why, sizeof(why), "%s", rs_error_message());
    for (int i = 0; !why[0] && i < 2 * nt; i++) {
        const reshard_buffers_t *b = &dev[i / 2];
        const void *p = i % 2 ? b->dst : b->src;
        size_t n = i % 2 ? b->dst_bytes : b->src_bytes;
        uint64_t id = 0;
        if (b->mem == RESHARD_MEM_CUDA && p &&
            cuda_lib()->pointer_get_attribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                              (cu_deviceptr)(uintptr_t)p) != CU_SUCCESS)
            id = 0;
        if (b->mem == RESHARD_MEM_CUDA && reg_one(x, &x->dreg[i], p, n, mem, id) != RESHARD_OK)
            snprintf(why, sizeof(why), "%s", rs_error_message());
    }
    rs_error_restore(&saved); /* falling back is not failing */
    if (!x->gdr_reported++)
        rs_log(RS_LOG_INFO, "rank %d: network chunks of device buffers: %s%s", x->comm->rank,
               why[0] ? "staged through host memory: " : "GPUDirect RDMA", why);
    return !why[0];
}

/* Does network transfer out[o] leave from the device buffer for every chunk (GPUDirect, each
 * chunk contiguous there and none packed with others)? */
static int net_direct(const struct run *r, size_t o)
{
    const struct exec *x = r->x;
    const struct xfer *xf = &x->xs.x[x->out[o]];
    if (!r->gdr)
        return 0;
    for (size_t c = 0; c < x->out_off[o + 1] - x->out_off[o]; c++) {
        struct region a;
        exec_chunk_region(x, xf, (uint32_t)c, 0, &a);
        if (x->out_bundled[x->out_off[o] + c] || !gdr_at(r, xf, 0, &a))
            return 0;
    }
    return 1;
}

/* Copies device sources to their shadows where something reads them there: network chunks
 * without GPUDirect (or strided, or packed), cross-memory writes, copies inside the rank into
 * host memory. Before the exchange (after 0) local peers are taken to be written through CUDA
 * IPC when it is on; after it, the ones that turned out not to be get their sources too. */
static reshard_status_t stage_sources(struct run *r, int after)
{
    struct exec *x = r->x;
    for (size_t o = 0; o < x->nout; o++) {
        const struct xfer *xf = &x->xs.x[x->out[o]];
        const reshard_buffers_t *d = &r->dev[xf->tensor];
        if (xf->src_buf != XBUF_SRC || d->mem != RESHARD_MEM_CUDA || !d->src || !d->src_bytes ||
            r->src_staged[xf->tensor])
            continue;
        int host = xf->path == XFER_SELF ? !self_on_device(r, xf)
                   : xf->path == XFER_LOCAL
                       ? (after ? !via_ipc(r, xf) : !rs_param_int(RS_PARAM_CUDA_IPC))
                       : !net_direct(r, o);
        if (!host)
            continue;
        cu_result e = cuda_lib()->memcpy_dtoh((void *)r->bufs[xf->tensor].src,
                                              (cu_deviceptr)(uintptr_t)d->src, d->src_bytes);
        if (e != CU_SUCCESS)
            return cuda_error("staging a device source (cuMemcpyDtoH)", e);
        r->src_staged[xf->tensor] = 1;
    }
    return RESHARD_OK;
}

/* Everything this rank prepares before the others hear from it. */
static reshard_status_t prepare(struct exec *x, const reshard_buffers_t *bufs,
                                const reshard_buffers_t *dev, uint32_t seq, struct run **r)
{
    RS_CHECK(staging_init(x));
    for (int t = 0; t < x->plan->ntensors; t++) {
        RS_CHECK(reg_one(x, &x->reg[2 * t], bufs[t].src, bufs[t].src_bytes, TP_MEM_HOST, 0));
        RS_CHECK(reg_one(x, &x->reg[2 * t + 1], bufs[t].dst, bufs[t].dst_bytes, TP_MEM_HOST, 0));
    }
    RS_CHECK(alloc_tmp(x));
    int gdr = dev && try_gdr(x, dev);
    RS_CHECK(run_create(x, bufs, dev, seq, r));
    (*r)->gdr = gdr;
    return dev ? stage_sources(*r, 0) : RESHARD_OK;
}

/* A network failure here may be the echo of another rank's (its connections closed as it
 * stopped): that rank's own report, if it comes within CAUSE_WAIT_MS, names the cause. */
static void remote_cause(struct exec *x, struct run *r)
{
    if (r->st != RESHARD_ERR_NETWORK) /* a timeout names whom it waited for: more precise */
        return;
    for (int64_t end = rs_now_ms() + CAUSE_WAIT_MS;; usleep(5000)) {
        reshard_status_t st = boot_check(x->comm->boot);
        if (st != RESHARD_OK) {
            r->st = st;
            snprintf(r->why, sizeof(r->why), "%s", rs_error_message());
            return;
        }
        if (rs_now_ms() >= end)
            return;
    }
}

/* A failure once bytes may be moving: the transports are in an unknown state. */
static void break_comm(struct exec *x, struct run *r)
{
    struct reshard_comm *c = x->comm;
    c->broken = r->st;
    snprintf(c->broken_why, sizeof(c->broken_why), "%s", r->why);
    /* Peers that finished may enter the next collective: it fails at once instead of at the
     * timeout. */
    boot_abort(c->boot, r->st, r->why);
    drain_failed(r);
    /* Requests still pointing into it complete when the communicator closes its context; if
     * even that bookkeeping fails, it is leaked rather than freed under them. */
    if (r->posted == 0)
        run_free(r);
    else
        (void)comm_keep(c, run_free_any, r);
}

/* What the execution left in this rank's destination buffers: r NULL when it failed before
 * any byte moved. A chunk counts once its receive (or copy) completed; one still in flight
 * may be partly written, so its tensor is torn. */
static void record_outcome(struct exec *x, const struct run *r)
{
    for (int t = 0; t < x->plan->ntensors; t++) {
        reshard_tensor_state_t s = RESHARD_TENSOR_UNTOUCHED;
        if (!x->dst_chunks[t])
            s = RESHARD_TENSOR_NONE;
        else if (r && !r->dst_left[t])
            s = RESHARD_TENSOR_COMPLETE;
        else if (r)
            s = RESHARD_TENSOR_TORN;
        x->outcome[t] = (uint8_t)s;
    }
    x->executed = 1;
}

/* Everything bound for this rank is known to have landed (a synchronized NCCL execution). */
static void record_completed(struct exec *x)
{
    for (int t = 0; t < x->plan->ntensors; t++)
        x->outcome[t] = (uint8_t)(x->dst_chunks[t] ? RESHARD_TENSOR_COMPLETE : RESHARD_TENSOR_NONE);
    x->executed = 1;
    x->on_nccl = 0;
}

/* pre: a failure found before (staging device buffers): this rank still joins the exchange
 * with it, so every rank reaches the same verdict. dev: the caller's buffers when bufs are
 * their host shadows, else NULL. */
static reshard_status_t run_all(struct exec *x, const reshard_buffers_t *bufs,
                                const reshard_buffers_t *dev, reshard_status_t pre)
{
    struct reshard_comm *c = x->comm;
    uint32_t seq = c->seq++; /* every rank counts every execution, failed or not */
    struct run *r = NULL;
    reshard_status_t local = pre != RESHARD_OK ? pre : prepare(x, bufs, dev, seq, &r);
    char why[RS_ERROR_MAX];
    snprintf(why, sizeof(why), "%s", rs_error_message());
    reshard_status_t st = exchange(x, bufs, seq, local, r, 0);
    if (st == local && local != RESHARD_OK)
        rs_error(local, "%s", why);
    if (st != RESHARD_OK) { /* nothing moved: the communicator stays usable */
        record_outcome(x, NULL);
        run_free(r);
        return st;
    }
    st = dev ? stage_sources(r, 1) : RESHARD_OK; /* local peers that stage after all */
    if (st == RESHARD_OK)
        st = start(r);
    if (st == RESHARD_OK)
        st = wait_done(r);
    if (st == RESHARD_OK && r->gdr_landed) /* the caller's kernels see what the NIC wrote */
        st = cuda_flush_rdma_writes();
    if (st == RESHARD_OK) {
        record_outcome(x, r);
        run_free(r);
        return RESHARD_OK;
    }
    fail(r, st); /* the first failure's message, not its echoes */
    remote_cause(x, r);
    record_outcome(x, r);
    break_comm(x, r);
    return rs_error(c->broken, "%s", c->broken_why);
}

/* ---- device buffers on the native executor: staged through host copies ---- */

static int any_device(const struct exec *x, const reshard_buffers_t *bufs)
{
    for (int t = 0; t < x->plan->ntensors; t++)
        if (bufs[t].mem == RESHARD_MEM_CUDA && (bufs[t].src || bufs[t].dst))
            return 1;
    return 0;
}

/* host[] is bufs with every device buffer replaced by a host shadow of it, kept across runs
 * (pinned when the driver allows). Sources are copied in where something reads them there
 * (stage_sources); destinations get each chunk back as it lands (land), so bytes outside the
 * shard's view are never touched. */
static reshard_status_t stage_in(struct exec *x, const reshard_buffers_t *bufs,
                                 reshard_buffers_t *host)
{
    int nt = x->plan->ntensors;
    const struct cuda_fns *f = cuda_lib();
    if (!f) {
        char why[RS_ERROR_MAX];
        snprintf(why, sizeof(why), "%s", rs_error_message());
        return rs_error(RESHARD_ERR_UNAVAILABLE,
                        "rank %d: device buffers need the CUDA driver to be staged: %s",
                        x->comm->rank, why);
    }
    for (int t = 0; t < nt; t++) /* the context of the first device buffer */
        if (bufs[t].mem == RESHARD_MEM_CUDA && (bufs[t].src || bufs[t].dst)) {
            RS_CHECK(cuda_context_of(bufs[t].src ? bufs[t].src : bufs[t].dst));
            break;
        }
    if (!x->shadow && (!(x->shadow = rs_calloc(2 * (size_t)nt + 1, sizeof(char *), "staging")) ||
                       !(x->shadow_cap = rs_calloc(2 * (size_t)nt, sizeof(size_t), "staging"))))
        return RESHARD_ERR_NO_MEMORY;
    for (int t = 0; t < nt; t++) {
        host[t] = bufs[t];
        if (bufs[t].mem != RESHARD_MEM_CUDA)
            continue;
        host[t].mem = RESHARD_MEM_HOST;
        for (int side = 0; side < 2; side++) {
            const void *dev = side ? bufs[t].dst : bufs[t].src;
            size_t n = side ? bufs[t].dst_bytes : bufs[t].src_bytes;
            int i = 2 * t + side;
            if (!dev || !n)
                continue;
            if (x->shadow_cap[i] < n) {
                cuda_host_free(x->shadow[i]);
                x->shadow_cap[i] = 0;
                if (!(x->shadow[i] = cuda_host_alloc(n)))
                    return rs_error(RESHARD_ERR_NO_MEMORY, "no memory to stage %zu bytes", n);
                x->shadow_cap[i] = n;
            }
            if (side)
                host[t].dst = x->shadow[i];
            else
                host[t].src = x->shadow[i];
        }
    }
    return RESHARD_OK;
}

/* The native executor on device buffers. Every chunk is on the device once it has landed, so
 * after a failure the tensors reshard_plan_outcome calls complete hold their new values. */
static reshard_status_t run_staged(struct exec *x, const reshard_buffers_t *bufs)
{
    int nt = x->plan->ntensors;
    reshard_buffers_t *host = rs_calloc((size_t)nt, sizeof(*host), "staging");
    reshard_status_t pre = host ? stage_in(x, bufs, host) : RESHARD_ERR_NO_MEMORY;
    if (!x->staged_before++ && pre == RESHARD_OK) {
        const char *kind = "pinned host";
        for (int i = 0; i < 2 * nt; i++)
            if (x->shadow[i] && !cuda_host_pinned(x->shadow[i]))
                kind = "pageable host (cuMemAllocHost failed)";
        rs_log(RS_LOG_INFO, "rank %d: device buffers: host shadows in %s memory; local peers %s",
               x->comm->rank, kind,
               rs_param_int(RS_PARAM_CUDA_IPC) ? "write device destinations through CUDA IPC"
                                               : "staged too (RESHARD_CUDA_IPC=0)");
    }
    reshard_status_t st =
        run_all(x, pre == RESHARD_OK ? host : bufs, pre == RESHARD_OK ? bufs : NULL, pre);
    free(host);
    return st;
}

/* RESHARD_EXECUTOR=nccl: the same vote and buffer checks, then the plan enqueued on NCCL. */
static reshard_status_t nccl_run(struct exec *x, const reshard_buffers_t *bufs, int on_stream,
                                 void *stream)
{
    struct reshard_comm *c = x->comm;
    record_outcome(x, NULL); /* until something is enqueued */
    if (!c->nccl)            /* the same on every rank: nobody waits */
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "RESHARD_EXECUTOR=nccl runs on a communicator made by "
                        "reshard_comm_init_nccl");
    uint32_t seq = c->seq++, rounds;
    const struct nccl_fns *f = nccl_lib();
    reshard_status_t local = f ? nccl_rounds(&x->xs, &rounds) : RESHARD_ERR_UNAVAILABLE;
    char why[RS_ERROR_MAX];
    snprintf(why, sizeof(why), "%s", rs_error_message());
    reshard_status_t st = exchange(x, bufs, seq, local, NULL, 1);
    if (st == local && local != RESHARD_OK)
        rs_error(local, "%s", why);
    if (st != RESHARD_OK)
        return st;
    x->on_nccl = 1; /* no outcome: the stream owns completion */
    st = nccl_lower(x->plan, &x->xs, c->rank, bufs, f, c->nccl, stream);
    if (st == RESHARD_OK && !on_stream) { /* reshard_plan_execute returns when it is done */
        const struct cuda_fns *cu = cuda_lib();
        cu_result r = cu ? cu->stream_synchronize(NULL) : CU_SUCCESS;
        if (r != CU_SUCCESS)
            st = cuda_error("cuStreamSynchronize after the NCCL rounds", r);
        else
            record_completed(x);
    }
    if (st != RESHARD_OK) { /* what NCCL holds now is unknown: as after any failure in flight */
        c->broken = st;
        snprintf(c->broken_why, sizeof(c->broken_why), "%s", rs_error_message());
        boot_abort(c->boot, st, c->broken_why);
    }
    return st;
}

/* The native executor on a stream: what is queued there first finishes. Without a driver
 * the default stream (NULL) can hold no work; another stream is a mistake. */
static reshard_status_t wait_stream(int on_stream, void *stream)
{
    if (!on_stream)
        return RESHARD_OK;
    struct rs_saved_error caller;
    rs_error_save(&caller);
    const struct cuda_fns *f = cuda_lib();
    if (!f && !stream) {
        rs_error_restore(&caller); /* the caller's message, as it was */
        return RESHARD_OK;
    }
    if (!f) {
        struct rs_saved_error why;
        rs_error_save(&why);
        return rs_error(RESHARD_ERR_INVALID_ARG, "a CUDA stream, but %s", why.msg);
    }
    cu_result r = f->stream_synchronize(stream);
    return r == CU_SUCCESS ? RESHARD_OK : cuda_error("cuStreamSynchronize", r);
}

reshard_status_t exec_run(struct exec *x, const reshard_buffers_t *bufs, int on_stream,
                          void *stream)
{
    struct reshard_comm *c = x->comm;
    const char *executor = rs_param_str(RS_PARAM_EXECUTOR);
    int on_nccl = !strcmp(executor, "nccl");
    if (!on_nccl && strcmp(executor, "native"))
        return rs_error(RESHARD_ERR_INVALID_ARG, "RESHARD_EXECUTOR=%s: expected native or nccl",
                        executor);
    int idle = 0;
    if (!atomic_compare_exchange_strong(&c->busy, &idle, 1))
        return rs_error(RESHARD_ERR_BUSY,
                        "the communicator is already executing (this plan or another, from "
                        "another thread)");
    if (atomic_load(&c->abort_req))
        comm_abort_now(c);
    x->on_nccl = 0;
    reshard_status_t st = comm_usable(c);
    if (st == RESHARD_OK && on_nccl)
        st = nccl_run(x, bufs, on_stream, stream);
    else if (st == RESHARD_OK && any_device(x, bufs) &&
             (st = wait_stream(1, on_stream ? stream : NULL)) == RESHARD_OK)
        st = run_staged(x, bufs); /* copies run on a stream of ours: the caller's work first */
    else if (st == RESHARD_OK && (st = wait_stream(on_stream, stream)) == RESHARD_OK)
        st = run_all(x, bufs, NULL, RESHARD_OK);
    else
        record_outcome(x, NULL); /* nothing moved this time */
    atomic_store(&c->busy, 0);
    return st;
}
