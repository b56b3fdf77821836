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
 * RESHARD_STAGING_BYTES per rank). Local transfers are cross-memory writes followed by an empty
 * message that tells the receiver the chunk is there.
 */
#include "exec.h"

#include "cma.h"
#include "error.h"
#include "log.h"
#include "param.h"
#include "region.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define container_of(p, type, member) ((type *)((char *)(p)-offsetof(type, member)))

/* Tags: kind (2 bits) | execution (6) | transfer (32) | chunk (24). */
#define TAG_DATA    UINT64_C(1)
#define TAG_CTRL    UINT64_C(2)
#define MAX_CHUNKS  (INT64_C(1) << 24)
#define SEND_WINDOW 16 /* network sends in flight per rank */
#define DRAIN_MS    2000

static uint64_t make_tag(uint64_t kind, uint32_t seq, uint32_t xfer, uint32_t chunk)
{
    return kind << 62 | (uint64_t)(seq & 63) << 56 | (uint64_t)xfer << 24 | chunk;
}

enum req_kind { REQ_SEND_DATA, REQ_SEND_CTRL, REQ_RECV_DATA, REQ_RECV_CTRL };

struct run;

/* One posted message. */
struct chunk_req {
    struct tp_req req;
    struct run *run;
    uint32_t pos; /* index in the rank's in[] (receives) or out[] (sends) */
    uint32_t chunk;
    int slot; /* staging slot, or -1 */
    uint8_t kind;
    struct iovec *iov;
};

struct ready {
    uint32_t pos, chunk;
};

/* The state of one execution. */
struct run {
    struct exec *x;
    const reshard_buffers_t *bufs;
    char **peer_dst, **peer_tmp; /* [size * ntensors]: where local writes go */
    uint32_t seq;
    reshard_status_t st;
    char why[256];
    struct chunk_req *in_req, *out_req; /* by chunk, via in_off / out_off */
    uint32_t *in_arrived;               /* [nin] */
    struct queue {
        struct ready *q;
        size_t head, tail, cap;
    } net_q, local_q; /* network sends wait for the window; local work never waits */
    size_t in_left, out_left, tmp_left;
    int inflight, posted;
    int64_t last_event_ms;
};

struct exec {
    struct reshard_comm *comm;
    const struct rs_plan *plan;
    struct xfer_set xs;
    atomic_int busy;
    int64_t chunk_bytes;
    /* This rank's share: outgoing transfers (src == me) in rotated peer order, incoming ones
     * (dst == me, src != me) by index, and which outgoing ones each incoming one releases. */
    uint32_t *out, *in;
    size_t nout, nin;
    size_t *out_off, *in_off; /* first chunk of each, then the total */
    uint32_t *child_first, *child;
    uint32_t *after_inputs;
    size_t nafter;
    /* Staging for packed sends, registered once. */
    char *staging;
    void *staging_mh;
    int nslots, *free_slots, nfree;
    /* Registrations of the caller's buffers, redone when a pointer changes. */
    struct reg {
        const void *addr;
        size_t len;
        void *mh;
    } * reg;            /* [2 * ntensors]: src, dst */
    struct run *zombie; /* a failed run whose requests never finished */
    char **tmp;         /* [ntensors]: whole-tensor buffers (bcast), kept across runs */
};

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- chunks ---- */

static const int64_t *xfer_start(const struct exec *x, const struct xfer *xf)
{
    return x->xs.coords + xf->box;
}

static int xfer_ndim(const struct exec *x, const struct xfer *xf)
{
    return x->plan->tensors[xf->tensor].dst.ndim;
}

/* Cuts a box along its outermost dim whose inner part fits a chunk: `step` indices of dim
 * `split` per chunk, every index of the dims before it one at a time. */
struct cut {
    int split;
    int64_t step, per_outer, n;
};

static struct cut cut_of(const struct exec *x, const struct xfer *xf)
{
    int ndim = xfer_ndim(x, xf);
    const int64_t *len = xfer_start(x, xf) + ndim;
    int64_t inner = (int64_t)dtype_size(x->plan->tensors[xf->tensor].dst.dtype);
    int split = ndim - 1;
    while (split > 0 && inner * len[split] <= x->chunk_bytes) {
        inner *= len[split];
        split--;
    }
    struct cut c = {.split = split};
    c.step = x->chunk_bytes / inner;
    if (c.step < 1)
        c.step = 1;
    if (c.step > len[split])
        c.step = len[split] ? len[split] : 1;
    c.per_outer = len[split] ? (len[split] + c.step - 1) / c.step : 0;
    c.n = c.per_outer;
    for (int j = 0; j < split; j++)
        c.n *= len[j];
    return c;
}

static void chunk_box(const struct exec *x, const struct xfer *xf, uint32_t chunk, int64_t *s,
                      int64_t *l)
{
    int ndim = xfer_ndim(x, xf);
    const int64_t *start = xfer_start(x, xf), *len = start + ndim;
    struct cut c = cut_of(x, xf);
    int64_t outer = chunk / c.per_outer, piece = chunk % c.per_outer;
    for (int j = ndim - 1; j >= 0; j--) {
        if (j > c.split) {
            s[j] = start[j];
            l[j] = len[j];
        } else if (j == c.split) {
            s[j] = start[j] + piece * c.step;
            l[j] = len[j] - piece * c.step < c.step ? len[j] - piece * c.step : c.step;
        } else {
            s[j] = start[j] + outer % len[j];
            l[j] = 1;
            outer /= len[j];
        }
    }
}

/* The chunk inside the buffer `side` (0 source, 1 destination) of the transfer. */
static void chunk_region(const struct exec *x, const struct xfer *xf, uint32_t chunk, int side,
                         struct region *r)
{
    int64_t s[RS_MAX_DIMS], l[RS_MAX_DIMS];
    chunk_box(x, xf, chunk, s, l);
    const struct plan_tensor *pt = &x->plan->tensors[xf->tensor];
    int buf = side ? xf->dst_buf : xf->src_buf, rank = side ? xf->dst : xf->src;
    if (buf == XBUF_TMP) {
        region_of_full(&pt->dst, s, l, r);
        return;
    }
    const struct rs_shardmap *m = buf == XBUF_SRC ? &pt->src_map : &pt->dst_map;
    region_of_shard(m, shardmap_position(m, rank), s, l, r);
}

/* ---- this rank's share ---- */

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

static long in_pos(const struct exec *x, uint32_t xfer)
{
    const uint32_t *p = bsearch(&xfer, x->in, x->nin, sizeof(*x->in), cmp_u32);
    return p ? p - x->in : -1;
}

static const struct exec *rotate_ctx; /* qsort has no argument: exec_create holds the lock */

/* Outgoing order: by distance from this rank to the peer (r+1, r+2, ...), so the ranks of a
 * job start on different peers instead of all on rank 0. */
static int cmp_rotated(const void *a, const void *b)
{
    const struct exec *x = rotate_ctx;
    const struct xfer *p = &x->xs.x[*(const uint32_t *)a], *q = &x->xs.x[*(const uint32_t *)b];
    int n = x->comm->size, me = x->comm->rank;
    int dp = (p->dst - me + n) % n, dq = (q->dst - me + n) % n;
    if (dp != dq)
        return dp - dq;
    return cmp_u32(a, b);
}

static reshard_status_t prefix_chunks(struct exec *x, const uint32_t *list, size_t n, size_t **off)
{
    *off = rs_calloc(n + 1, sizeof(**off), "chunk offsets");
    if (!*off)
        return RESHARD_ERR_NO_MEMORY;
    for (size_t i = 0; i < n; i++) {
        struct cut c = cut_of(x, &x->xs.x[list[i]]);
        if (c.n > MAX_CHUNKS)
            return rs_error(RESHARD_ERR_TOO_LARGE, "transfer of %lld bytes: over 2^24 chunks",
                            (long long)x->xs.x[list[i]].bytes);
        (*off)[i + 1] = (*off)[i] + (size_t)c.n;
    }
    return RESHARD_OK;
}

/* Children: outgoing transfers whose parent is an incoming one, grouped by that parent. */
static reshard_status_t link_children(struct exec *x)
{
    x->child_first = rs_calloc(x->nin + 1, sizeof(uint32_t), "children");
    x->child = rs_calloc(x->nout ? x->nout : 1, sizeof(uint32_t), "children");
    x->after_inputs = rs_calloc(x->nout ? x->nout : 1, sizeof(uint32_t), "children");
    if (!x->child_first || !x->child || !x->after_inputs)
        return RESHARD_ERR_NO_MEMORY;
    for (int pass = 0; pass < 2; pass++) {
        for (size_t o = 0; o < x->nout; o++) {
            const struct xfer *xf = &x->xs.x[x->out[o]];
            if (xf->parent == XFER_NONE)
                continue;
            if (xf->parent == XFER_AFTER_INPUTS) {
                if (pass)
                    x->after_inputs[x->nafter++] = (uint32_t)o;
                continue;
            }
            long k = in_pos(x, xf->parent);
            const struct xfer *par = &x->xs.x[xf->parent];
            if (k < 0 || memcmp(x->xs.coords + par->box, x->xs.coords + xf->box,
                                2 * sizeof(int64_t) * (size_t)xfer_ndim(x, xf)))
                return rs_error(RESHARD_ERR_INTERNAL,
                                "transfer %u: parent %u is not a delivery "
                                "of the same box to rank %d",
                                x->out[o], xf->parent, x->comm->rank);
            if (pass)
                x->child[x->child_first[k + 1]++] = (uint32_t)o;
            else
                x->child_first[k + 1]++;
        }
        if (!pass) /* counts to starts, then fill advances them back to ends */
            for (size_t k = 0; k < x->nin; k++)
                x->child_first[k + 1] += x->child_first[k];
        if (!pass)
            for (size_t k = x->nin; k > 0; k--)
                x->child_first[k] = x->child_first[k - 1];
    }
    return RESHARD_OK;
}

static reshard_status_t share(struct exec *x)
{
    int me = x->comm->rank;
    for (size_t i = 0; i < x->xs.n; i++) {
        x->nout += x->xs.x[i].src == me;
        x->nin += x->xs.x[i].dst == me && x->xs.x[i].src != me;
    }
    x->out = rs_calloc(x->nout + 1, sizeof(uint32_t), "transfers");
    x->in = rs_calloc(x->nin + 1, sizeof(uint32_t), "transfers");
    if (!x->out || !x->in)
        return RESHARD_ERR_NO_MEMORY;
    size_t no = 0, ni = 0;
    for (size_t i = 0; i < x->xs.n; i++) {
        if (x->xs.x[i].src == me)
            x->out[no++] = (uint32_t)i;
        else if (x->xs.x[i].dst == me)
            x->in[ni++] = (uint32_t)i; /* ascending: in_pos searches it */
    }
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&lock);
    rotate_ctx = x;
    qsort(x->out, x->nout, sizeof(*x->out), cmp_rotated);
    pthread_mutex_unlock(&lock);
    RS_CHECK(prefix_chunks(x, x->out, x->nout, &x->out_off));
    RS_CHECK(prefix_chunks(x, x->in, x->nin, &x->in_off));
    return link_children(x);
}

reshard_status_t exec_create(struct reshard_comm *comm, const struct rs_plan *plan,
                             struct xfer_set *xs, struct exec **out)
{
    struct exec *x = rs_calloc(1, sizeof(*x), "executor");
    if (!x) {
        xfer_free(xs);
        return RESHARD_ERR_NO_MEMORY;
    }
    x->comm = comm;
    x->plan = plan;
    x->xs = *xs;
    memset(xs, 0, sizeof(*xs));
    x->chunk_bytes = rs_param_int(RS_PARAM_CHUNK_BYTES);
    reshard_status_t st = RESHARD_ERR_NO_MEMORY;
    x->reg = rs_calloc(2 * (size_t)plan->ntensors, sizeof(*x->reg), "registrations");
    if (!x->reg)
        goto err;
    RS_CHECK_GOTO(share(x), st, err);
    *out = x;
    return RESHARD_OK;
err:
    exec_destroy(x);
    return st;
}

static void run_free(struct run *r);

void exec_destroy(struct exec *x)
{
    if (!x)
        return;
    struct tp_ctx *net = x->comm->net;
    for (int i = 0; x->reg && i < 2 * x->plan->ntensors; i++)
        net->ops->mem_dereg(net, x->reg[i].mh);
    net->ops->mem_dereg(net, x->staging_mh);
    if (x->zombie) /* its requests are gone now or never will be: the context is closing */
        run_free(x->zombie);
    for (int t = 0; x->tmp && t < x->plan->ntensors; t++)
        free(x->tmp[t]);
    free(x->tmp);
    free(x->reg);
    free(x->staging);
    free(x->free_slots);
    free(x->out);
    free(x->in);
    free(x->out_off);
    free(x->in_off);
    free(x->child_first);
    free(x->child);
    free(x->after_inputs);
    xfer_free(&x->xs);
    free(x);
}

reshard_status_t exec_stats(const struct exec *x, reshard_plan_stats_t *stats,
                            reshard_rank_stats_t *ranks)
{
    int n = x->comm->size;
    reshard_rank_stats_t *b = rs_calloc((size_t)n, sizeof(*b), "rank stats");
    if (!b)
        return RESHARD_ERR_NO_MEMORY;
    stats->net_bytes = stats->local_bytes = stats->self_bytes = 0;
    for (size_t i = 0; i < x->xs.n; i++) {
        const struct xfer *xf = &x->xs.x[i];
        uint64_t bytes = (uint64_t)xf->bytes;
        if (xf->path == XFER_SELF) {
            b[xf->src].self += bytes;
            stats->self_bytes += bytes;
        } else if (xf->path == XFER_LOCAL) {
            b[xf->src].local_out += bytes;
            b[xf->dst].local_in += bytes;
            stats->local_bytes += bytes;
        } else {
            b[xf->src].net_out += bytes;
            b[xf->dst].net_in += bytes;
            stats->net_bytes += bytes;
        }
    }
    stats->max_nic_bytes = 0;
    stats->max_nic_rank = -1;
    for (int r = 0; r < n; r++) {
        uint64_t nic = b[r].net_out > b[r].net_in ? b[r].net_out : b[r].net_in;
        if (nic > stats->max_nic_bytes) {
            stats->max_nic_bytes = nic;
            stats->max_nic_rank = r;
        }
        if (ranks) {
            b[r].domain = ranks[r].domain;
            b[r].local_index = ranks[r].local_index;
            ranks[r] = b[r];
        }
    }
    free(b);
    return RESHARD_OK;
}

/* ---- buffers ---- */

static reshard_status_t staging_init(struct exec *x)
{
    if (x->staging)
        return RESHARD_OK;
    int64_t cap = rs_param_int(RS_PARAM_STAGING_BYTES);
    x->nslots = (int)(cap / x->chunk_bytes < 2 ? 2 : cap / x->chunk_bytes);
    if (x->nslots > 1024)
        x->nslots = 1024;
    x->staging = malloc((size_t)x->nslots * (size_t)x->chunk_bytes);
    x->free_slots = calloc((size_t)x->nslots, sizeof(int));
    if (!x->staging || !x->free_slots)
        return rs_error(RESHARD_ERR_NO_MEMORY, "no memory for %d staging slots of %lld bytes",
                        x->nslots, (long long)x->chunk_bytes);
    struct tp_ctx *net = x->comm->net;
    RS_CHECK(net->ops->mem_reg(net, x->staging, (size_t)x->nslots * (size_t)x->chunk_bytes,
                               TP_MEM_HOST, &x->staging_mh));
    for (int i = 0; i < x->nslots; i++)
        x->free_slots[x->nfree++] = i;
    return RESHARD_OK;
}

/* Registers a caller's buffer, once per pointer and size. */
static reshard_status_t reg_buffer(struct exec *x, int i, const void *addr, size_t len)
{
    struct reg *g = &x->reg[i];
    if (g->addr == addr && g->len == len)
        return RESHARD_OK;
    struct tp_ctx *net = x->comm->net;
    net->ops->mem_dereg(net, g->mh);
    *g = (struct reg){0};
    if (!addr || !len)
        return RESHARD_OK;
    RS_CHECK(net->ops->mem_reg(net, (void *)addr, len, TP_MEM_HOST, &g->mh));
    g->addr = addr;
    g->len = len;
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
    const struct xfer *xf = &r->x->xs.x[r->x->out[pos]];
    struct queue *q = xf->path == XFER_NET ? &r->net_q : &r->local_q;
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

static void release_after_inputs(struct run *r)
{
    const struct exec *x = r->x;
    for (size_t i = 0; i < x->nafter; i++) {
        uint32_t o = x->after_inputs[i];
        for (size_t c = 0; c < x->out_off[o + 1] - x->out_off[o]; c++)
            push_ready(r, o, (uint32_t)c);
    }
}

/* A chunk reached this rank: release what waits for it. */
static void arrived(struct run *r, long k, uint32_t chunk, const struct xfer *xf)
{
    const struct exec *x = r->x;
    if (k >= 0) {
        r->in_arrived[k]++;
        r->in_left--;
        for (uint32_t i = x->child_first[k]; i < x->child_first[k + 1]; i++)
            push_ready(r, x->child[i], chunk);
    }
    if (xf->dst_buf == XBUF_TMP && --r->tmp_left == 0)
        release_after_inputs(r);
    r->last_event_ms = now_ms();
}

static uint64_t chunk_bytes(const struct exec *x, const struct xfer *xf, uint32_t chunk)
{
    struct region rg;
    chunk_region(x, xf, chunk, 1, &rg);
    return region_bytes(&rg);
}

static void on_recv(struct tp_req *req, reshard_status_t st, size_t bytes)
{
    struct chunk_req *c = container_of(req, struct chunk_req, req);
    struct run *r = c->run;
    struct exec *x = r->x;
    const struct xfer *xf = &x->xs.x[x->in[c->pos]];
    r->posted--;
    free(c->iov);
    c->iov = NULL;
    if (st != RESHARD_OK) {
        fail(r, rs_error(st, "rank %d: receiving chunk %u of transfer %u from rank %d failed",
                         x->comm->rank, c->chunk, x->in[c->pos], req->peer));
        return;
    }
    uint64_t want = chunk_bytes(x, xf, c->chunk);
    if (c->kind == REQ_RECV_DATA && bytes != want) {
        fail(r, rs_error(RESHARD_ERR_INTERNAL, "chunk %u of transfer %u: %zu bytes, expected %llu",
                         c->chunk, x->in[c->pos], bytes, (unsigned long long)want));
        return;
    }
    if (c->kind == REQ_RECV_CTRL)
        x->comm->local_in += want; /* the sender wrote it into our memory */
    arrived(r, (long)c->pos, c->chunk, xf);
}

static void on_send(struct tp_req *req, reshard_status_t st, size_t bytes)
{
    (void)bytes;
    struct chunk_req *c = container_of(req, struct chunk_req, req);
    struct run *r = c->run;
    struct exec *x = r->x;
    r->posted--;
    if (c->kind == REQ_SEND_DATA)
        r->inflight--;
    if (c->slot >= 0) {
        x->free_slots[x->nfree++] = c->slot;
        c->slot = -1;
    }
    if (st != RESHARD_OK) {
        fail(r, rs_error(st, "rank %d: sending chunk %u of transfer %u to rank %d failed",
                         x->comm->rank, c->chunk, x->out[c->pos], req->peer));
        return;
    }
    r->out_left--;
    r->last_event_ms = now_ms();
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
        chunk_region(x, xf, chunk, 1, &rg);
        char *base = my_base(r, xf, 1);
        uint64_t tag = make_tag(TAG_DATA, r->seq, x->in[k], chunk);
        if (region_contiguous(&rg, &off)) {
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

/* A local transfer: write the chunk into the peer's memory, then tell it. */
static reshard_status_t do_local(struct run *r, uint32_t o, uint32_t chunk)
{
    struct exec *x = r->x;
    const struct xfer *xf = &x->xs.x[x->out[o]];
    struct region a, b;
    chunk_region(x, xf, chunk, 0, &a);
    chunk_region(x, xf, chunk, 1, &b);
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
    struct chunk_req *c = &r->out_req[x->out_off[o] + chunk];
    *c = (struct chunk_req){
        .req.done = on_send, .run = r, .pos = o, .chunk = chunk, .slot = -1, .kind = REQ_SEND_CTRL};
    struct tp_ctx *net = x->comm->net;
    RS_CHECK(net->ops->send(net, xf->dst, make_tag(TAG_CTRL, r->seq, x->out[o], chunk), NULL, 0,
                            NULL, 1, &c->req));
    r->posted++;
    return RESHARD_OK;
}

static void do_self(struct run *r, uint32_t o, uint32_t chunk)
{
    struct exec *x = r->x;
    const struct xfer *xf = &x->xs.x[x->out[o]];
    struct region a, b;
    chunk_region(x, xf, chunk, 0, &a);
    chunk_region(x, xf, chunk, 1, &b);
    region_copy(&a, my_base(r, xf, 0), &b, my_base(r, xf, 1));
    x->comm->self += region_bytes(&a);
    r->out_left--;
    arrived(r, -1, chunk, xf);
}

/* A network send: straight from the source when contiguous, else packed into staging.
 * Returns 0 when it must wait for a slot or the window. */
static int do_net(struct run *r, uint32_t o, uint32_t chunk)
{
    struct exec *x = r->x;
    const struct xfer *xf = &x->xs.x[x->out[o]];
    struct region a;
    uint64_t off;
    chunk_region(x, xf, chunk, 0, &a);
    int contiguous = region_contiguous(&a, &off);
    if (r->inflight >= SEND_WINDOW || (!contiguous && !x->nfree))
        return 0;
    struct chunk_req *c = &r->out_req[x->out_off[o] + chunk];
    *c = (struct chunk_req){
        .req.done = on_send, .run = r, .pos = o, .chunk = chunk, .slot = -1, .kind = REQ_SEND_DATA};
    const char *buf = my_base(r, xf, 0) + off;
    void *mh = my_mh(r, xf, 0);
    if (!contiguous) {
        c->slot = x->free_slots[--x->nfree];
        buf = x->staging + (size_t)c->slot * (size_t)x->chunk_bytes;
        mh = x->staging_mh;
        region_pack(&a, my_base(r, xf, 0), (char *)buf);
    }
    struct tp_ctx *net = x->comm->net;
    reshard_status_t st = net->ops->send(net, xf->dst, make_tag(TAG_DATA, r->seq, x->out[o], chunk),
                                         buf, region_bytes(&a), mh, 0, &c->req);
    if (st != RESHARD_OK) {
        if (c->slot >= 0)
            x->free_slots[x->nfree++] = c->slot;
        fail(r, st);
        return 1;
    }
    r->posted++;
    r->inflight++;
    return 1;
}

/* Works through the ready queues: local work to the end, network sends while the window and
 * the staging slots allow. */
static void drain_ready(struct run *r)
{
    struct exec *x = r->x;
    for (struct queue *q = &r->local_q; q->head < q->tail && r->st == RESHARD_OK; q->head++) {
        struct ready w = q->q[q->head];
        if (x->xs.x[x->out[w.pos]].path == XFER_SELF) {
            do_self(r, w.pos, w.chunk);
            continue;
        }
        reshard_status_t st = do_local(r, w.pos, w.chunk);
        if (st != RESHARD_OK)
            fail(r, st);
    }
    for (struct queue *q = &r->net_q; q->head < q->tail && r->st == RESHARD_OK; q->head++)
        if (!do_net(r, q->q[q->head].pos, q->q[q->head].chunk))
            break;
}

/* ---- start: every rank checks its buffers and learns where the others' are ---- */

struct hello {
    uint64_t hash;
    uint32_t seq;
    int32_t status; /* RESHARD_OK, or why this rank cannot run */
    int32_t tensor, side;
    uint64_t need, have;
};

static size_t hello_bytes(const struct exec *x)
{
    return sizeof(struct hello) + 2 * sizeof(uint64_t) * (size_t)x->plan->ntensors;
}

/* This rank's buffers against its shards. */
static void check_buffers(const struct exec *x, const reshard_buffers_t *bufs, struct hello *h)
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
                *h = (struct hello){.hash = h->hash,
                                    .seq = h->seq,
                                    .status = RESHARD_ERR_BUFFER,
                                    .tensor = t,
                                    .side = side,
                                    .need = need,
                                    .have = p ? have : 0};
                return;
            }
            if (bufs[t].mem != RESHARD_MEM_HOST) {
                *h = (struct hello){.hash = h->hash,
                                    .seq = h->seq,
                                    .status = RESHARD_ERR_UNAVAILABLE,
                                    .tensor = t,
                                    .side = side};
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
    if (h->status == RESHARD_ERR_UNAVAILABLE)
        return rs_error(RESHARD_ERR_UNAVAILABLE,
                        "rank %d: %s buffer of tensor %s is device memory: this build moves host "
                        "memory only",
                        rank, side, name);
    return rs_error(RESHARD_ERR_REMOTE, "rank %d cannot run: %s", rank,
                    rs_status_string((reshard_status_t)h->status));
}

static reshard_status_t exchange(struct run *r, char *all)
{
    struct exec *x = r->x;
    struct reshard_comm *c = x->comm;
    size_t hb = hello_bytes(x);
    struct hello *me = (struct hello *)(all + (size_t)c->rank * hb);
    *me = (struct hello){.hash = x->plan->hash, .seq = r->seq, .status = RESHARD_OK};
    check_buffers(x, r->bufs, me);
    uint64_t *addr = (uint64_t *)(me + 1);
    for (int t = 0; t < x->plan->ntensors; t++) {
        addr[2 * t] = (uint64_t)(uintptr_t)r->bufs[t].dst;
        addr[2 * t + 1] = (uint64_t)(uintptr_t)(x->tmp ? x->tmp[t] : NULL);
    }
    RS_CHECK(boot_allgather(c->boot, all, hb));
    for (int q = 0; q < c->size; q++) { /* every rank reaches the same verdict */
        const struct hello *h = (const struct hello *)(all + (size_t)q * hb);
        if (h->status != RESHARD_OK)
            return refuse(x, q, h);
        if (h->hash != x->plan->hash || h->seq != r->seq)
            return rs_error(RESHARD_ERR_PLAN_MISMATCH,
                            "rank %d executes another plan (hash %016llx, execution %u; here "
                            "%016llx, %u): every rank must execute the same plans in the same "
                            "order",
                            q, (unsigned long long)h->hash, h->seq,
                            (unsigned long long)x->plan->hash, r->seq);
        const uint64_t *a = (const uint64_t *)(h + 1);
        for (int t = 0; t < x->plan->ntensors; t++) {
            size_t slot = (size_t)q * (size_t)x->plan->ntensors + (size_t)t;
            r->peer_dst[slot] = (char *)(uintptr_t)a[2 * t];
            r->peer_tmp[slot] = (char *)(uintptr_t)a[2 * t + 1];
        }
    }
    return RESHARD_OK;
}

/* ---- the run ---- */

static void run_free(struct run *r)
{
    if (!r)
        return;
    if (r->in_req)
        for (size_t i = 0; i < r->x->in_off[r->x->nin]; i++)
            free(r->in_req[i].iov);
    free(r->peer_dst);
    free(r->peer_tmp);
    free(r->in_req);
    free(r->out_req);
    free(r->in_arrived);
    free(r->net_q.q);
    free(r->local_q.q);
    free(r);
}

/* Whole-tensor buffers for the broadcast baseline, on the ranks that use one; made by the
 * first run, kept for the next. */
static reshard_status_t alloc_tmp(struct exec *x)
{
    int me = x->comm->rank;
    if (!x->xs.needs_tmp || x->tmp)
        return RESHARD_OK;
    if (!(x->tmp = rs_calloc((size_t)x->plan->ntensors, sizeof(char *), "tensor buffers")))
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

static reshard_status_t run_create(struct exec *x, const reshard_buffers_t *bufs, struct run **out)
{
    struct run *r = rs_calloc(1, sizeof(*r), "execution");
    if (!r)
        return RESHARD_ERR_NO_MEMORY;
    r->x = x;
    r->bufs = bufs;
    r->seq = x->comm->seq++;
    size_t slots = (size_t)x->comm->size * (size_t)x->plan->ntensors;
    r->peer_dst = rs_calloc(slots, sizeof(char *), "peer buffers");
    r->peer_tmp = rs_calloc(slots, sizeof(char *), "peer buffers");
    r->in_req = rs_calloc(x->in_off[x->nin] + 1, sizeof(*r->in_req), "receives");
    r->out_req = rs_calloc(x->out_off[x->nout] + 1, sizeof(*r->out_req), "sends");
    r->in_arrived = rs_calloc(x->nin + 1, sizeof(uint32_t), "arrivals");
    reshard_status_t st = RESHARD_ERR_NO_MEMORY;
    if (!r->peer_dst || !r->peer_tmp || !r->in_req || !r->out_req || !r->in_arrived)
        goto err;
    RS_CHECK_GOTO(alloc_tmp(x), st, err);
    r->in_left = x->in_off[x->nin];
    r->out_left = x->out_off[x->nout];
    int me = x->comm->rank;
    for (size_t i = 0; i < x->nin; i++)
        if (x->xs.x[x->in[i]].dst_buf == XBUF_TMP)
            r->tmp_left += x->in_off[i + 1] - x->in_off[i];
    for (size_t o = 0; o < x->nout; o++) {
        const struct xfer *xf = &x->xs.x[x->out[o]];
        if (xf->dst == me && xf->dst_buf == XBUF_TMP) /* a gather of our own part */
            r->tmp_left += x->out_off[o + 1] - x->out_off[o];
    }
    *out = r;
    return RESHARD_OK;
err:
    run_free(r);
    return st;
}

static reshard_status_t start(struct run *r)
{
    struct exec *x = r->x;
    for (size_t k = 0; k < x->nin; k++)
        for (size_t c = 0; c < x->in_off[k + 1] - x->in_off[k]; c++)
            RS_CHECK(post_recv(r, k, (uint32_t)c));
    for (size_t o = 0; o < x->nout; o++)
        if (x->xs.x[x->out[o]].parent == XFER_NONE)
            for (size_t c = 0; c < x->out_off[o + 1] - x->out_off[o]; c++)
                RS_CHECK(push_ready(r, (uint32_t)o, (uint32_t)c));
    if (x->xs.needs_tmp && r->tmp_left == 0)
        release_after_inputs(r);
    return r->st;
}

/* Who this rank still waits for, for the timeout message. */
static void describe_wait(const struct run *r, char *buf, size_t n)
{
    const struct exec *x = r->x;
    size_t used = 0;
    int shown = 0;
    for (size_t k = 0; k < x->nin && shown < 4; k++) {
        size_t want = x->in_off[k + 1] - x->in_off[k];
        if (r->in_arrived[k] == want)
            continue;
        const struct xfer *xf = &x->xs.x[x->in[k]];
        used += (size_t)snprintf(buf + used, used < n ? n - used : 0, "%s%zu chunk(s) from rank %d",
                                 shown++ ? ", " : "", want - r->in_arrived[k], xf->src);
    }
    if (!shown)
        snprintf(buf, n, "%zu send(s) to complete", r->out_left);
}

static reshard_status_t wait_done(struct run *r)
{
    struct exec *x = r->x;
    struct tp_ctx *net = x->comm->net;
    int timeout = comm_timeout_ms();
    r->last_event_ms = now_ms();
    while (r->st == RESHARD_OK && (r->in_left || r->out_left)) {
        drain_ready(r);
        if (net->ops->progress(net))
            continue;
        if (r->st != RESHARD_OK || (!r->in_left && !r->out_left))
            break;
        if (net->failed_peer >= 0)
            return fail(r, rs_error(RESHARD_ERR_NETWORK, "rank %d: connection to rank %d failed",
                                    x->comm->rank, net->failed_peer));
        int64_t idle = now_ms() - r->last_event_ms;
        if (idle >= timeout) {
            char what[192];
            describe_wait(r, what, sizeof(what));
            return fail(r, rs_error(RESHARD_ERR_TIMEOUT,
                                    "rank %d: no progress for %d s, still waiting for %s",
                                    x->comm->rank, timeout / 1000, what));
        }
        int64_t left = timeout - idle;
        RS_CHECK(net->ops->wait(net, left < 100 ? (int)left : 100));
    }
    return r->st;
}

/* After a failure: cancel what can be cancelled and let the rest finish, for a while. */
static void drain_failed(struct run *r)
{
    struct exec *x = r->x;
    struct tp_ctx *net = x->comm->net;
    for (size_t i = 0; i < x->in_off[x->nin]; i++)
        if (r->in_req[i].req.handle)
            net->ops->cancel(net, &r->in_req[i].req);
    int64_t until = now_ms() + DRAIN_MS;
    while (r->posted > 0 && now_ms() < until)
        if (!net->ops->progress(net))
            (void)net->ops->wait(net, 10);
}

reshard_status_t exec_run(struct exec *x, const reshard_buffers_t *bufs)
{
    int idle = 0;
    if (!atomic_compare_exchange_strong(&x->busy, &idle, 1))
        return rs_error(RESHARD_ERR_BUSY, "this plan is already executing (another thread)");
    struct run *r = NULL;
    char *hello = NULL;
    reshard_status_t st = RESHARD_ERR_NO_MEMORY;
    if (!(hello = rs_calloc((size_t)x->comm->size, hello_bytes(x), "hello")))
        goto out;
    RS_CHECK_GOTO(staging_init(x), st, out);
    for (int t = 0; t < x->plan->ntensors; t++) {
        RS_CHECK_GOTO(reg_buffer(x, 2 * t, bufs[t].src, bufs[t].src_bytes), st, out);
        RS_CHECK_GOTO(reg_buffer(x, 2 * t + 1, bufs[t].dst, bufs[t].dst_bytes), st, out);
    }
    RS_CHECK_GOTO(run_create(x, bufs, &r), st, out);
    RS_CHECK_GOTO(exchange(r, hello), st, out);
    st = start(r);
    if (st == RESHARD_OK)
        st = wait_done(r);
    if (st != RESHARD_OK) {
        if (r->st != RESHARD_OK) /* the message of the first failure, not of its echoes */
            rs_error(r->st, "%s", r->why);
        drain_failed(r);
        if (r->posted > 0) { /* requests still point into it: keep it until destroy */
            run_free(x->zombie);
            x->zombie = r;
            r = NULL;
        }
    }
out:
    run_free(r);
    free(hello);
    atomic_store(&x->busy, 0);
    return st;
}
