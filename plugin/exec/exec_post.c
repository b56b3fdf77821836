/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Queues and posting: how a run puts its messages on the wire and what their completions do.
 *
 * All receives are posted up front: into the destination itself when the chunk is contiguous
 * there, else as a scatter list over it, so a receive never waits for memory and senders can
 * always make progress. A sender sends a contiguous chunk from its source buffer and packs a
 * strided one into a staging slot. Local transfers are cross-memory writes followed by an empty
 * message that tells the receiver the chunk is there. Chunks wait in two queues: network sends
 * for the send window, local work for nothing.
 */
#include "exec_run.h"

#include "exec_tag.h"
#include "base/clock.h"
#include "base/error.h"
#include "transport/cma.h"

#include <stdlib.h>
#include <string.h>

/* Sends queued behind a busy peer are passed over, SEND_SCAN at most. */
#define SEND_SCAN 64

/* ---- buffers ---- */

char *exec_post_base(const struct exec_run *r, const struct xfer *xf, int side)
{
    int buf = side ? xf->dst_buf : xf->src_buf;
    const reshard_buffers_t *b = &r->bufs[xf->tensor];
    if (buf == XBUF_TMP)
        return r->x->tmp.buf[xf->tensor];
    if (buf == XBUF_QSRC)
        return r->x->quant.qsrc[xf->tensor];
    if (buf == XBUF_STAGE)
        return r->x->quant.stage[xf->tensor];
    return buf == XBUF_SRC ? (char *)b->src : (char *)b->dst;
}

static void *my_mh(const struct exec_run *r, const struct xfer *xf, int side)
{
    int buf = side ? xf->dst_buf : xf->src_buf;
    if (buf != XBUF_SRC && buf != XBUF_DST) /* the executor's own buffers are not registered */
        return NULL;
    return r->x->regs.host[2 * xf->tensor + (buf == XBUF_DST)].mh;
}

/* ---- the ready queues ---- */

static reshard_status_t push_ready(struct exec_run *r, uint32_t pos, uint32_t chunk)
{
    int net = pos == EXEC_BUNDLE_POS || r->x->xs.x[r->x->share.out[pos]].path == XFER_NET;
    struct exec_queue *q = net ? &r->net_q : &r->local_q;
    if (q->tail == q->cap) {
        if (q->head) { /* slide down before growing */
            memmove(q->q, q->q + q->head, (q->tail - q->head) * sizeof(*q->q));
            q->tail -= q->head;
            q->head = 0;
        } else {
            struct exec_ready *n = rs_grow(q->q, &q->cap, q->cap + 1, sizeof(*n), "queue");
            if (!n)
                return exec_run_fail(r, RESHARD_ERR_NO_MEMORY);
            q->q = n;
        }
    }
    q->q[q->tail++] = (struct exec_ready){pos, chunk};
    return RESHARD_OK;
}

/* Tensor t arrived whole in this rank's buffer: start what waited for it. */
static void release_whole(struct exec_run *r, uint32_t t)
{
    const struct exec_share *s = &r->x->share;
    for (uint32_t i = s->after_first[t]; i < s->after_first[t + 1]; i++) {
        uint32_t o = s->after[i];
        for (size_t c = 0; c < s->out_off[o + 1] - s->out_off[o]; c++)
            push_ready(r, o, (uint32_t)c);
    }
}

void exec_post_arrived(struct exec_run *r, long k, uint32_t chunk, const struct xfer *xf)
{
    const struct exec_share *s = &r->x->share;
    reshard_status_t st = r->dev ? exec_dev_land(r, k, chunk, xf) : RESHARD_OK;
    if (st != RESHARD_OK) {
        exec_run_fail(r, st);
        return;
    }
    if (k >= 0) {
        r->in_arrived[k]++;
        r->in_left--;
        for (uint32_t i = s->child_first[k]; i < s->child_first[k + 1]; i++)
            push_ready(r, s->child[i], chunk);
    }
    if (xf->dst_buf == XBUF_TMP && --r->tmp_left[xf->tensor] == 0)
        release_whole(r, xf->tensor);
    if (xf->dst_buf == XBUF_DST || xf->dst_buf == XBUF_STAGE)
        r->dst_left[xf->tensor]--;
    r->last_event_ms = rs_now_ms();
}

/* ---- completions ---- */

static void on_recv(struct tp_req *req, reshard_status_t st, size_t bytes)
{
    struct exec_req *c = container_of(req, struct exec_req, req);
    struct exec_run *r = c->run;
    r->posted--;
    free(c->iov);
    c->iov = NULL;
    if (r->draining)
        return;
    struct exec *x = r->x;
    const struct exec_share *s = &x->share;
    if (c->pos == EXEC_BUNDLE_POS) {
        const struct exec_bundle *b = &x->in_b.b[c->chunk];
        if (st != RESHARD_OK || bytes != b->bytes) {
            exec_run_fail(r, rs_error(st != RESHARD_OK ? st : RESHARD_ERR_INTERNAL,
                                      "rank %d: packed message %u from rank %d: %s (%zu bytes, "
                                      "expected %llu)",
                                      x->comm->rank, b->id, b->peer,
                                      st != RESHARD_OK ? rs_status_string(st) : "wrong size", bytes,
                                      (unsigned long long)b->bytes));
            return;
        }
        for (uint32_t i = b->first; i < b->first + b->n; i++) {
            const struct exec_piece *p = &x->in_b.p[i];
            exec_post_arrived(r, (long)p->pos, p->chunk, &x->xs.x[s->in[p->pos]]);
        }
        return;
    }
    const struct xfer *xf = &x->xs.x[s->in[c->pos]];
    if (st != RESHARD_OK) {
        exec_run_fail(r,
                      rs_error(st, "rank %d: receiving chunk %u of transfer %u from rank %d failed",
                               x->comm->rank, c->chunk, s->in[c->pos], req->peer));
        return;
    }
    uint64_t want = exec_chunk_bytes_of(&x->cut, xf, c->chunk);
    int encoded = c->kind == EXEC_REQ_RECV_DATA && exec_delta_in(r, c->pos, c->chunk);
    if (c->kind == EXEC_REQ_RECV_DATA && (encoded ? bytes > want : bytes != want)) {
        exec_run_fail(r, rs_error(RESHARD_ERR_INTERNAL,
                                  "rank %d: chunk %u of transfer %u from rank %d: %zu bytes, "
                                  "expected %llu",
                                  x->comm->rank, c->chunk, s->in[c->pos], req->peer, bytes,
                                  (unsigned long long)want));
        return;
    }
    if (c->kind == EXEC_REQ_RECV_CTRL && bytes) { /* a forwarder passed its encoding on */
        if (!exec_delta_fwd_in(r, c->pos, c->chunk) || bytes >= want) {
            exec_run_fail(r, rs_error(RESHARD_ERR_INTERNAL,
                                      "rank %d: notice of chunk %u of transfer %u from rank %d "
                                      "carries %zu bytes, which it cannot",
                                      x->comm->rank, c->chunk, s->in[c->pos], req->peer, bytes));
            return;
        }
        x->comm->net->counters.bytes_in -= bytes; /* it crossed inside the domain */
        x->comm->local_in += bytes;
        if ((st = exec_delta_land(r, c->pos, c->chunk, bytes)) != RESHARD_OK) {
            exec_run_fail(r, st);
            return;
        }
    } else if (c->kind == EXEC_REQ_RECV_CTRL) {
        x->comm->local_in += want; /* the sender wrote it into our memory */
    }
    if (c->kind == EXEC_REQ_RECV_DATA && r->gdr) {
        struct region rg;
        exec_chunk_region(&x->cut, xf, c->chunk, 1, &rg);
        if (exec_dev_gdr_at(r, xf, 1, &rg)) {
            x->comm->gdr_in += want;
            r->gdr_landed = 1;
        }
    }
    if (encoded && (st = exec_delta_land(r, c->pos, c->chunk, bytes)) != RESHARD_OK) {
        exec_run_fail(r, st); /* before a byte of it is written */
        return;
    }
    if (c->kind == EXEC_REQ_RECV_DATA)
        exec_delta_arrived(r, c->pos, c->chunk, bytes);
    exec_post_arrived(r, (long)c->pos, c->chunk, xf);
}

static void on_send(struct tp_req *req, reshard_status_t st, size_t bytes)
{
    (void)bytes;
    struct exec_req *c = container_of(req, struct exec_req, req);
    struct exec_run *r = c->run;
    struct reshard_comm *comm = r->comm;
    r->posted--;
    if (c->kind == EXEC_REQ_SEND_DATA) {
        r->inflight--;
        r->peer_inflight[req->peer]--;
    }
    if (c->slot >= 0) {
        comm->free_slots[comm->nfree++] = c->slot;
        c->slot = -1;
    }
    if (r->draining)
        return;
    int bundle = c->pos == EXEC_BUNDLE_POS;
    if (st != RESHARD_OK && bundle) {
        exec_run_fail(r, rs_error(st, "rank %d: sending packed message %u to rank %d failed",
                                  comm->rank, r->x->out_b.b[c->chunk].id, req->peer));
        return;
    }
    if (st != RESHARD_OK) {
        exec_run_fail(r, rs_error(st, "rank %d: sending chunk %u of transfer %u to rank %d failed",
                                  comm->rank, c->chunk, r->x->share.out[c->pos], req->peer));
        return;
    }
    r->out_left -= bundle ? r->x->out_b.b[c->chunk].n : 1;
    r->last_event_ms = rs_now_ms();
}

static void on_ack(struct tp_req *req, reshard_status_t st, size_t bytes)
{
    (void)bytes;
    struct exec_req *c = container_of(req, struct exec_req, req);
    struct exec_run *r = c->run;
    r->posted--;
    if (r->draining)
        return;
    if (st != RESHARD_OK) {
        exec_run_fail(r,
                      rs_error(st, "rank %d: the acknowledgement %s rank %d failed", r->comm->rank,
                               c->kind == EXEC_REQ_RECV_CTRL ? "from" : "to", req->peer));
        return;
    }
    if (c->kind == EXEC_REQ_RECV_CTRL)
        r->acks_in_left--;
    else
        r->acks_out_left--;
    r->last_event_ms = rs_now_ms();
}

/* ---- receives ---- */

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

static reshard_status_t post_recv(struct exec_run *r, size_t k, uint32_t chunk)
{
    struct exec *x = r->x;
    const struct exec_share *s = &x->share;
    const struct xfer *xf = &x->xs.x[s->in[k]];
    struct exec_req *c = &r->in_req[s->in_off[k] + chunk];
    *c = (struct exec_req){
        .req.done = on_recv, .run = r, .pos = (uint32_t)k, .chunk = chunk, .slot = -1};
    struct tp_ctx *net = x->comm->net;
    reshard_status_t st;
    if (xf->path == XFER_LOCAL) { /* a notice, which may carry a forwarded encoding */
        c->kind = EXEC_REQ_RECV_CTRL;
        char *fwd = exec_delta_fwd_in(r, k, chunk);
        st = net->ops->recv(net, xf->src, exec_tag(EXEC_TAG_NOTE, r->seq, s->in_tag[k], chunk), fwd,
                            fwd ? exec_chunk_bytes_of(&x->cut, xf, chunk) : 0, NULL, &c->req);
    } else {
        c->kind = EXEC_REQ_RECV_DATA;
        struct region rg;
        uint64_t off;
        exec_chunk_region(&x->cut, xf, chunk, 1, &rg);
        char *base = exec_post_base(r, xf, 1), *direct = exec_dev_gdr_at(r, xf, 1, &rg);
        uint64_t tag = exec_tag(EXEC_TAG_DATA, r->seq, s->in_tag[k], chunk);
        char *scratch = exec_delta_in(r, k, chunk);
        if (scratch) { /* a delta refit's chunk: applied from there once it landed */
            st = net->ops->recv(net, xf->src, tag, scratch, region_bytes(&rg), NULL, &c->req);
        } else if (direct) { /* GPUDirect: straight into the device buffer */
            st = net->ops->recv(net, xf->src, tag, direct, region_bytes(&rg), exec_dev_mh(r, xf, 1),
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
static reshard_status_t post_bundle_recv(struct exec_run *r, uint32_t bi)
{
    struct exec *x = r->x;
    const struct exec_share *s = &x->share;
    const struct exec_bundle *b = &x->in_b.b[bi];
    const struct exec_piece *first = &x->in_b.p[b->first];
    struct exec_req *c = &r->in_req[s->in_off[first->pos] + first->chunk];
    *c = (struct exec_req){.req.done = on_recv,
                           .run = r,
                           .pos = EXEC_BUNDLE_POS,
                           .chunk = bi,
                           .slot = -1,
                           .kind = EXEC_REQ_RECV_DATA};
    size_t n = 0, cap = 0;
    for (uint32_t i = b->first; i < b->first + b->n; i++) {
        const struct exec_piece *p = &x->in_b.p[i];
        const struct xfer *xf = &x->xs.x[s->in[p->pos]];
        struct region rg;
        struct iovec *v;
        size_t m;
        exec_chunk_region(&x->cut, xf, p->chunk, 1, &rg);
        reshard_status_t st = chunk_iov(&rg, exec_post_base(r, xf, 1), &v, &m);
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
        net, b->peer, exec_tag(EXEC_TAG_PACK, r->seq, b->id, 0), c->iov, n, &c->req);
    if (st != RESHARD_OK) {
        free(c->iov);
        c->iov = NULL;
        return st;
    }
    r->posted++;
    return RESHARD_OK;
}

/* ---- sends ---- */

/* Everything bound for this rank arrived: tell each sender. */
static reshard_status_t send_acks(struct exec_run *r)
{
    struct exec *x = r->x;
    const struct exec_share *s = &x->share;
    struct tp_ctx *net = x->comm->net;
    r->acked = 1;
    for (int i = 0; i < s->nrecv_peers; i++) {
        struct exec_req *c = &r->ack_out[i];
        *c =
            (struct exec_req){.req.done = on_ack, .run = r, .slot = -1, .kind = EXEC_REQ_SEND_CTRL};
        RS_CHECK(net->ops->send(net, s->recv_peers[i],
                                exec_tag(EXEC_TAG_RUN, r->seq, EXEC_RUN_ACK, 0), NULL, 0, NULL, 1,
                                &c->req));
        r->posted++;
    }
    return RESHARD_OK;
}

/* The notice of chunk `chunk` of out[o]: empty, or carrying a forwarded encoding. */
static reshard_status_t notify(struct exec_run *r, uint32_t o, uint32_t chunk, const char *buf,
                               size_t len)
{
    struct exec *x = r->x;
    const struct exec_share *s = &x->share;
    struct exec_req *c = &r->out_req[s->out_off[o] + chunk];
    *c = (struct exec_req){.req.done = on_send,
                           .run = r,
                           .pos = o,
                           .chunk = chunk,
                           .slot = -1,
                           .kind = EXEC_REQ_SEND_CTRL};
    struct tp_ctx *net = x->comm->net;
    RS_CHECK(net->ops->send(net, x->xs.x[s->out[o]].dst,
                            exec_tag(EXEC_TAG_NOTE, r->seq, s->out_tag[o], chunk), buf, len, NULL,
                            1, &c->req));
    r->posted++;
    return RESHARD_OK;
}

reshard_status_t exec_post_notify(struct exec_run *r, uint32_t o, uint32_t chunk)
{
    return notify(r, o, chunk, NULL, 0);
}

/* A local transfer: write the chunk into the peer's memory, then tell it. */
static reshard_status_t do_local(struct exec_run *r, uint32_t o, uint32_t chunk)
{
    struct exec *x = r->x;
    const struct xfer *xf = &x->xs.x[x->share.out[o]];
    const char *msg;
    size_t msg_len;
    if (exec_delta_fwd_out(r, o, chunk, &msg, &msg_len)) { /* the encoding it got, passed on */
        x->comm->local_out += msg_len;
        return notify(r, o, chunk, msg, msg_len);
    }
    struct region a, b;
    exec_chunk_region(&x->cut, xf, chunk, 0, &a);
    exec_chunk_region(&x->cut, xf, chunk, 1, &b);
    const char *src = exec_post_base(r, xf, 0);
    char *dst = (char *)(uintptr_t)x->links.addr[x->links.ent_of[xf - x->xs.x]];
    struct iovec l[256], rm[256];
    size_t n = 0;
    struct region_pair p;
    uint64_t ao, bo, len;
    region_pair_init(&p, &a, &b);
    while (region_pair_next(&p, &ao, &bo, &len)) {
        l[n] = (struct iovec){(char *)src + ao, len};
        rm[n] = (struct iovec){dst + bo, len};
        if (++n == 256) {
            RS_CHECK(cma_write(x->comm->pid[xf->dst], x->comm->pidfd[xf->dst], xf->dst, l, rm, n));
            n = 0;
        }
    }
    if (n)
        RS_CHECK(cma_write(x->comm->pid[xf->dst], x->comm->pidfd[xf->dst], xf->dst, l, rm, n));
    x->comm->local_out += region_bytes(&a);
    return exec_post_notify(r, o, chunk);
}

static void do_self(struct exec_run *r, uint32_t o, uint32_t chunk)
{
    struct exec *x = r->x;
    const struct xfer *xf = &x->xs.x[x->share.out[o]];
    struct region a, b;
    exec_chunk_region(&x->cut, xf, chunk, 0, &a);
    exec_chunk_region(&x->cut, xf, chunk, 1, &b);
    region_copy(&a, exec_post_base(r, xf, 0), &b, exec_post_base(r, xf, 1));
    x->comm->self += region_bytes(&a);
    r->out_left--;
    exec_post_arrived(r, -1, chunk, xf);
}

/* A packed message: every piece packed into one staging slot, one send. Returns 0 when it
 * must wait for a slot or the window. */
static int do_bundle(struct exec_run *r, uint32_t bi)
{
    struct exec *x = r->x;
    struct reshard_comm *comm = x->comm;
    const struct exec_bundle *b = &x->out_b.b[bi];
    if (r->inflight >= EXEC_SEND_WINDOW || r->peer_inflight[b->peer] >= EXEC_PEER_WINDOW ||
        !comm->nfree)
        return 0;
    const struct exec_piece *first = &x->out_b.p[b->first];
    struct exec_req *c = &r->out_req[x->share.out_off[first->pos] + first->chunk];
    *c = (struct exec_req){.req.done = on_send,
                           .run = r,
                           .pos = EXEC_BUNDLE_POS,
                           .chunk = bi,
                           .slot = comm->free_slots[--comm->nfree],
                           .kind = EXEC_REQ_SEND_DATA};
    char *buf = comm->staging + (size_t)c->slot * (size_t)comm->slot_bytes, *at = buf;
    for (uint32_t i = b->first; i < b->first + b->n; i++) {
        const struct exec_piece *p = &x->out_b.p[i];
        const struct xfer *xf = &x->xs.x[x->share.out[p->pos]];
        struct region a;
        exec_chunk_region(&x->cut, xf, p->chunk, 0, &a);
        region_pack(&a, exec_post_base(r, xf, 0), at);
        at += region_bytes(&a);
    }
    struct tp_ctx *net = comm->net;
    reshard_status_t st = net->ops->send(net, b->peer, exec_tag(EXEC_TAG_PACK, r->seq, b->id, 0),
                                         buf, b->bytes, comm->staging_mh, 0, &c->req);
    if (st != RESHARD_OK) {
        comm->free_slots[comm->nfree++] = c->slot;
        exec_run_fail(r, st);
        return 1;
    }
    r->posted++;
    r->inflight++;
    r->peer_inflight[b->peer]++;
    return 1;
}

/* A network send: straight from the source when contiguous, else packed into staging.
 * Returns 0 when it must wait for a slot or the window. */
static int do_net(struct exec_run *r, uint32_t o, uint32_t chunk)
{
    if (o == EXEC_BUNDLE_POS)
        return do_bundle(r, chunk);
    struct exec *x = r->x;
    struct reshard_comm *comm = x->comm;
    const struct xfer *xf = &x->xs.x[x->share.out[o]];
    if (r->inflight >= EXEC_SEND_WINDOW || r->peer_inflight[xf->dst] >= EXEC_PEER_WINDOW)
        return 0;
    struct region a;
    uint64_t off = 0;
    exec_chunk_region(&x->cut, xf, chunk, 0, &a);
    int contiguous = region_contiguous(&a, &off);
    if (!contiguous && !comm->nfree)
        return 0;
    struct exec_req *c = &r->out_req[x->share.out_off[o] + chunk];
    *c = (struct exec_req){.req.done = on_send,
                           .run = r,
                           .pos = o,
                           .chunk = chunk,
                           .slot = -1,
                           .kind = EXEC_REQ_SEND_DATA};
    const char *buf;
    void *mh;
    size_t len = region_bytes(&a);
    char *direct = exec_dev_gdr_at(r, xf, 0, &a);
    if (exec_delta_out(r, o, chunk, &buf, &len)) { /* a delta refit: encoded, or its snapshot */
        mh = NULL;
    } else if (direct) { /* GPUDirect: straight from the device buffer */
        buf = direct;
        mh = exec_dev_mh(r, xf, 0);
        comm->gdr_out += region_bytes(&a);
    } else if (contiguous) {
        buf = exec_post_base(r, xf, 0) + off;
        mh = my_mh(r, xf, 0);
    } else {
        c->slot = comm->free_slots[--comm->nfree];
        buf = comm->staging + (size_t)c->slot * (size_t)comm->slot_bytes;
        mh = comm->staging_mh;
        region_pack(&a, exec_post_base(r, xf, 0), (char *)buf);
    }
    struct tp_ctx *net = comm->net;
    reshard_status_t st =
        net->ops->send(net, xf->dst, exec_tag(EXEC_TAG_DATA, r->seq, x->share.out_tag[o], chunk),
                       buf, len, mh, 0, &c->req);
    if (st != RESHARD_OK) {
        if (c->slot >= 0)
            comm->free_slots[comm->nfree++] = c->slot;
        exec_run_fail(r, st);
        return 1;
    }
    r->posted++;
    r->inflight++;
    r->peer_inflight[xf->dst]++;
    return 1;
}

/* ---- the queues ---- */

/* Posts queued network sends in order, passing over (at most SEND_SCAN) ones whose peer has
 * its window full; those keep their place. */
static void drain_net(struct exec_run *r)
{
    struct exec_queue *q = &r->net_q;
    size_t keep = q->head, i = q->head;
    for (; i < q->tail && keep - q->head < SEND_SCAN && r->st == RESHARD_OK; i++) {
        if (r->inflight >= EXEC_SEND_WINDOW)
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
static void drain_ready(struct exec_run *r)
{
    struct exec *x = r->x;
    drain_net(r);
    for (struct exec_queue *q = &r->local_q; q->head < q->tail && r->st == RESHARD_OK; q->head++) {
        struct exec_ready w = q->q[q->head];
        const struct xfer *xf = &x->xs.x[x->share.out[w.pos]];
        if (xf->path == XFER_SELF && !exec_dev_self(r, xf)) {
            do_self(r, w.pos, w.chunk);
            continue;
        }
        if (exec_dev_via_ipc(r, xf) || exec_dev_self(r, xf)) {
            if (!exec_dev_copy(r, w.pos, w.chunk))
                break; /* this one and what follows wait for an event */
            continue;
        }
        reshard_status_t st = do_local(r, w.pos, w.chunk);
        if (st != RESHARD_OK)
            exec_run_fail(r, st);
    }
}

reshard_status_t exec_post_drain(struct exec_run *r)
{
    drain_ready(r);
    if (!r->in_left && !r->acked) {
        reshard_status_t st = send_acks(r);
        if (st != RESHARD_OK)
            return exec_run_fail(r, st);
    }
    return RESHARD_OK;
}

reshard_status_t exec_post_start(struct exec_run *r)
{
    struct exec *x = r->x;
    const struct exec_share *s = &x->share;
    struct tp_ctx *net = x->comm->net;
    for (int i = 0; i < s->nsend_peers; i++) {
        struct exec_req *c = &r->ack_in[i];
        int peer = s->send_peers[i];
        *c =
            (struct exec_req){.req.done = on_ack, .run = r, .slot = -1, .kind = EXEC_REQ_RECV_CTRL};
        RS_CHECK(net->ops->recv(net, peer, exec_tag(EXEC_TAG_RUN, r->seq, EXEC_RUN_ACK, 0), NULL, 0,
                                NULL, &c->req));
        r->posted++;
    }
    for (size_t k = 0; k < s->nin; k++)
        for (size_t c = 0; c < s->in_off[k + 1] - s->in_off[k]; c++)
            if (!x->in_b.bundled[s->in_off[k] + c])
                RS_CHECK(post_recv(r, k, (uint32_t)c));
    for (size_t b = 0; b < x->in_b.n; b++)
        RS_CHECK(post_bundle_recv(r, (uint32_t)b));
    /* Packed messages first (their small pieces unblock fan-out early), starting at the first
     * peer after this rank as the other sends do, so that ranks do not all open on rank 0. */
    size_t first = 0;
    while (first < x->out_b.n && x->out_b.b[first].peer < x->comm->rank)
        first++;
    for (size_t i = 0; i < x->out_b.n; i++)
        RS_CHECK(push_ready(r, EXEC_BUNDLE_POS, (uint32_t)((first + i) % x->out_b.n)));
    for (size_t o = 0; o < s->nout; o++)
        if (x->xs.x[s->out[o]].parent == XFER_NONE)
            for (size_t c = 0; c < s->out_off[o + 1] - s->out_off[o]; c++)
                if (!x->out_b.bundled[s->out_off[o] + c])
                    RS_CHECK(push_ready(r, (uint32_t)o, (uint32_t)c));
    for (int t = 0; t < x->plan->ntensors; t++)
        if (r->tmp_left[t] == 0) /* nothing to wait for: a root holding the whole tensor */
            release_whole(r, (uint32_t)t);
    return r->st;
}
