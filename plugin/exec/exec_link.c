/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The local pairs of an executor: which local peers this rank writes into and which write
 * into it, with what (the entries), and the exchange that tells them where, only when
 * something changed. A receiver announces its buffers' addresses and CUDA IPC exports to each
 * of its writers, a writer says whether it writes through CUDA IPC; both are control messages
 * of the network transport between the two, a few bytes per entry. Nothing goes to a rank that
 * does not write, nor to any rank when no buffer changed: a steady refit exchanges none.
 *
 * A local peer the kernel did not vouch for (comm_local_ok) is not written directly: its local
 * transfers go over the network, alike on both ends, which the plan vote checks.
 */
#include "exec_link.h"

#include "exec_tag.h"
#include "base/clock.h"
#include "base/error.h"
#include "base/param.h"
#include "cuda/ipc.h"

#include <stdlib.h>
#include <string.h>

#define LINK_DRAIN_MS 1000 /* how long a failed exchange waits for its requests */
#define LINK_WAIT_MS  2
#define LINK_CHECK_MS 20 /* how often it looks for failures the others report */

/* ---- the pairs ---- */

static uint64_t mix64(uint64_t z)
{
    z += UINT64_C(0x9e3779b97f4a7c15);
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Local transfers to or from peers the kernel did not vouch for go over the network. Each end
 * adds a term per local pair to the fingerprint, so the terms cancel when both ends decided
 * alike. */
static reshard_status_t route(struct exec *x)
{
    struct reshard_comm *c = x->comm;
    int me = c->rank, n = 0;
    int *peers = rs_calloc(x->xs.n + 1, sizeof(int), "local peers");
    if (!peers)
        return RESHARD_ERR_NO_MEMORY;
    for (size_t i = 0; i < x->xs.n; i++) {
        const struct xfer *xf = &x->xs.x[i];
        if (xf->path == XFER_LOCAL && (xf->src == me || xf->dst == me))
            peers[n++] = xf->src == me ? xf->dst : xf->src;
    }
    qsort(peers, (size_t)n, sizeof(int), cmp_int);
    uint64_t fp = 0;
    for (int i = 0; i < n; i++) {
        if (i && peers[i] == peers[i - 1])
            continue;
        int lo = me < peers[i] ? me : peers[i], hi = me ^ lo ^ peers[i];
        fp ^= mix64((uint64_t)lo << 32 ^ (uint64_t)hi ^
                    (comm_local_ok(c, peers[i]) ? UINT64_C(1) << 63 : 0));
    }
    free(peers);
    for (size_t i = 0; i < x->xs.n; i++) {
        struct xfer *xf = &x->xs.x[i];
        int peer = xf->src == me ? xf->dst : xf->src;
        if (xf->path == XFER_LOCAL && (xf->src == me || xf->dst == me) && !comm_local_ok(c, peer))
            xf->path = XFER_NET;
    }
    x->links.local_fp = fp;
    return RESHARD_OK;
}

struct triple {
    int peer;
    uint32_t tensor, buf, xfer;
};

static int cmp_triple(const void *a, const void *b)
{
    const struct triple *p = a, *q = b;
    if (p->peer != q->peer)
        return p->peer < q->peer ? -1 : 1;
    if (p->tensor != q->tensor)
        return p->tensor < q->tensor ? -1 : 1;
    return p->buf < q->buf ? -1 : p->buf > q->buf;
}

/* Bytes rank's buffer of a tensor spans: its destination shard, or the whole tensor. */
static uint64_t span_of(const struct rs_plan *plan, uint32_t t, uint32_t buf, int rank)
{
    const struct plan_tensor *pt = &plan->tensors[t];
    if (buf == XBUF_TMP)
        return (uint64_t)layout_numel(&pt->dst) * dtype_size(pt->dst.dtype);
    const struct rs_shardmap *m = &pt->dst_map;
    int pos = shardmap_position(m, rank);
    int64_t shape[RS_MAX_DIMS];
    if (pos < 0)
        return 0;
    for (int j = 0; j < pt->dst.ndim; j++)
        shape[j] = dimmap_group_len(&m->dim[j], shardmap_group(m, pos, j));
    if (buf == XBUF_STAGE) { /* the executor's staging copy: the shard, row-major */
        uint64_t n = dtype_size(pt->src.dtype);
        for (int j = 0; j < pt->dst.ndim; j++)
            n *= (uint64_t)shape[j];
        return n;
    }
    return region_span_bytes(m->layout, shape);
}

/* The pairs one way (writer: this rank's outgoing local transfers), and each transfer's entry
 * (writer) or writer (receiver) in idx. */
static reshard_status_t pairs_of(struct exec *x, int writer, struct exec_pairs *p, int32_t *idx)
{
    int me = x->comm->rank;
    size_t n = 0;
    struct triple *tr = rs_calloc(x->xs.n + 1, sizeof(*tr), "local pairs");
    if (!tr)
        return RESHARD_ERR_NO_MEMORY;
    for (size_t i = 0; i < x->xs.n; i++) {
        const struct xfer *xf = &x->xs.x[i];
        idx[i] = -1;
        if (xf->path == XFER_LOCAL && (writer ? xf->src == me : xf->dst == me && xf->src != me))
            tr[n++] =
                (struct triple){writer ? xf->dst : xf->src, xf->tensor, xf->dst_buf, (uint32_t)i};
    }
    qsort(tr, n, sizeof(*tr), cmp_triple);
    size_t npeers = 0, nent = 0;
    for (size_t i = 0; i < n; i++) {
        npeers += !i || tr[i].peer != tr[i - 1].peer;
        nent += !i || cmp_triple(&tr[i], &tr[i - 1]);
    }
    p->peer = rs_calloc(npeers + 1, sizeof(int), "local pairs");
    p->first = rs_calloc(npeers + 1, sizeof(uint32_t), "local pairs");
    p->ent = rs_calloc(nent + 1, sizeof(*p->ent), "local pairs");
    if (!p->peer || !p->first || !p->ent) {
        free(tr);
        return RESHARD_ERR_NO_MEMORY;
    }
    p->n = 0;
    uint32_t e = 0;
    for (size_t i = 0; i < n; i++) {
        if (!i || tr[i].peer != tr[i - 1].peer) {
            p->first[p->n] = e;
            p->peer[p->n++] = tr[i].peer;
        }
        if (!i || cmp_triple(&tr[i], &tr[i - 1]))
            p->ent[e++] = (struct exec_entry){
                tr[i].tensor, tr[i].buf,
                writer ? span_of(x->plan, tr[i].tensor, tr[i].buf, tr[i].peer) : 0};
        idx[tr[i].xfer] = writer ? (int32_t)(e - 1) : (int32_t)(p->n - 1);
    }
    p->first[p->n] = e;
    free(tr);
    return RESHARD_OK;
}

static void pairs_fini(struct exec_pairs *p)
{
    free(p->peer);
    free(p->first);
    free(p->ent);
    *p = (struct exec_pairs){0};
}

reshard_status_t exec_links_build(struct exec *x)
{
    struct exec_links *l = &x->links;
    size_t nt = (size_t)x->plan->ntensors;
    RS_CHECK(route(x));
    l->ent_of = rs_calloc(x->xs.n + 1, sizeof(int32_t), "local pairs");
    l->writer_of = rs_calloc(x->xs.n + 1, sizeof(int32_t), "local pairs");
    if (!l->ent_of || !l->writer_of)
        return RESHARD_ERR_NO_MEMORY;
    RS_CHECK(pairs_of(x, 1, &l->to, l->ent_of));
    RS_CHECK(pairs_of(x, 0, &l->from, l->writer_of));
    size_t nto = l->to.first[l->to.n];
    l->addr = rs_calloc(nto + 1, sizeof(*l->addr), "local pairs");
    l->exp = rs_calloc(nto + 1, sizeof(*l->exp), "local pairs");
    l->has_exp = rs_calloc(nto + 1, 1, "local pairs");
    l->cuda = rs_calloc((size_t)l->from.n + 1, 1, "local pairs");
    l->exported = rs_calloc(nt, 1, "local pairs");
    l->told_key = rs_calloc(nt, sizeof(uint64_t), "local pairs");
    if (!l->addr || !l->exp || !l->has_exp || !l->cuda || !l->exported || !l->told_key)
        return RESHARD_ERR_NO_MEMORY;
    return RESHARD_OK;
}

static void phase_free(void *p);

void exec_links_fini(struct exec_links *l)
{
    if (l->phase) /* no request points into it: an exchange that failed gave it away */
        phase_free(l->phase);
    pairs_fini(&l->to);
    pairs_fini(&l->from);
    free(l->ent_of);
    free(l->writer_of);
    free(l->addr);
    free(l->exp);
    free(l->has_exp);
    free(l->cuda);
    free(l->exported);
    free(l->told_key);
    *l = (struct exec_links){0};
}

/* ---- what changed ---- */

static uint64_t digest(uint64_t h, const void *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h = (h ^ ((const unsigned char *)p)[i]) * UINT64_C(1099511628211);
    return h;
}

/* What this rank's writers are told of tensor t: where its buffers are, and its export. */
static uint64_t tensor_key(const struct exec *x, uint32_t t, const reshard_buffers_t *bufs)
{
    uint64_t h = UINT64_C(14695981039346656037);
    const void *tmp = x->tmp.buf ? x->tmp.buf[t] : NULL;
    const struct cuda_ipc_export *e = exec_export_of(x, t);
    h = digest(h, &bufs[t].dst, sizeof(bufs[t].dst));
    h = digest(h, &bufs[t].dst_bytes, sizeof(bufs[t].dst_bytes));
    h = digest(h, &tmp, sizeof(tmp));
    if (e)
        h = digest(h, e, sizeof(*e));
    return h | 1; /* never the 0 of "not told" */
}

static int my_cuda(const reshard_buffers_t *dev)
{
    return dev && rs_param_int(RS_PARAM_CUDA_IPC);
}

int exec_links_changed(const struct exec *x, const reshard_buffers_t *bufs,
                       const reshard_buffers_t *dev)
{
    const struct exec_links *l = &x->links;
    if (!l->told)
        return 1;
    if (l->to.n && l->told_cuda != my_cuda(dev))
        return 1;
    for (uint32_t e = 0; e < l->from.first[l->from.n]; e++) {
        uint32_t t = l->from.ent[e].tensor;
        if (l->told_key[t] != tensor_key(x, t, bufs))
            return 1;
    }
    return 0;
}

/* ---- the messages ---- */

size_t exec_ann_max_bytes(uint32_t nent)
{
    return sizeof(struct exec_ann_hdr) +
           (size_t)nent * (sizeof(uint64_t) + sizeof(struct cuda_ipc_export));
}

static int find_entry(const struct exec_ann_want *w, uint32_t tensor)
{
    int lo = 0, hi = (int)w->nent - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        const struct exec_entry *e = &w->ent[mid];
        if (e->tensor == tensor && e->buf == XBUF_DST)
            return mid;
        if (e->tensor < tensor || (e->tensor == tensor && e->buf < XBUF_DST))
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

static reshard_status_t bad_ann(const struct exec_ann_want *w, const char *what)
{
    return rs_error(RESHARD_ERR_REMOTE, "rank %d sent a malformed announcement of its buffers: %s",
                    w->peer, what);
}

/* One export: of a destination this rank writes, once, of a kind the driver knows, and large
 * enough for the shard it holds; a descriptor comes from the announcer's own process. */
static reshard_status_t check_export(const struct exec_ann_want *w, const struct cuda_ipc_export *e,
                                     const uint8_t *has, int *at)
{
    char what[160];
    int i = find_entry(w, e->tensor);
    if (i < 0) {
        snprintf(what, sizeof(what), "an export of tensor %u, which this rank does not write",
                 e->tensor);
        return bad_ann(w, what);
    }
    if (has[i]) {
        snprintf(what, sizeof(what), "tensor %u exported twice", e->tensor);
        return bad_ann(w, what);
    }
    if (e->kind > CUDA_IPC_FABRIC || !e->bytes || e->offset > e->bytes ||
        w->ent[i].span > e->bytes - e->offset) {
        snprintf(what, sizeof(what),
                 "tensor %u exported as kind %u, %llu bytes at offset %llu, for a shard of %llu",
                 e->tensor, e->kind, (unsigned long long)e->bytes, (unsigned long long)e->offset,
                 (unsigned long long)w->ent[i].span);
        return bad_ann(w, what);
    }
    if (e->kind == CUDA_IPC_POSIX_FD) {
        struct cuda_ipc_fd fd;
        memcpy(&fd, &e->handle, sizeof(fd));
        if (fd.pid != w->pid || fd.fd < 0) {
            snprintf(what, sizeof(what),
                     "tensor %u's descriptor %d in process %d, not in its own process %d",
                     e->tensor, fd.fd, fd.pid, w->pid);
            return bad_ann(w, what);
        }
    }
    *at = i;
    return RESHARD_OK;
}

reshard_status_t exec_ann_decode(const void *msg, size_t len, const struct exec_ann_want *w,
                                 uint64_t *addr, struct cuda_ipc_export *exp, uint8_t *has)
{
    struct exec_ann_hdr h;
    char what[160];
    if (len < sizeof(h))
        return bad_ann(w, "shorter than its header");
    memcpy(&h, msg, sizeof(h));
    if (h.magic != EXEC_ANN_MAGIC || h.seq != w->seq || h.hash != w->hash) {
        snprintf(what, sizeof(what),
                 "magic %08x, execution %u, plan %016llx (expected %08x, %u, %016llx)", h.magic,
                 h.seq, (unsigned long long)h.hash, EXEC_ANN_MAGIC, w->seq,
                 (unsigned long long)w->hash);
        return bad_ann(w, what);
    }
    uint32_t ndst = 0;
    for (uint32_t i = 0; i < w->nent; i++)
        ndst += w->ent[i].buf == XBUF_DST;
    /* Counts first, against this rank's own plan: the length then follows from them. */
    if (h.nent != w->nent || h.nexp > ndst ||
        len != sizeof(h) + (size_t)h.nent * sizeof(uint64_t) +
                   (size_t)h.nexp * sizeof(struct cuda_ipc_export)) {
        snprintf(what, sizeof(what),
                 "%u entries and %u exports in %zu bytes (this rank writes %u entries, %u of "
                 "them exportable)",
                 h.nent, h.nexp, len, w->nent, ndst);
        return bad_ann(w, what);
    }
    const char *at = (const char *)msg + sizeof(h);
    memset(has, 0, w->nent);
    for (uint32_t i = 0; i < w->nent; i++) {
        memcpy(&addr[i], at + (size_t)i * sizeof(uint64_t), sizeof(uint64_t));
        if (!addr[i]) {
            snprintf(what, sizeof(what), "no buffer for tensor %u", w->ent[i].tensor);
            return bad_ann(w, what);
        }
    }
    at += (size_t)w->nent * sizeof(uint64_t);
    for (uint32_t k = 0; k < h.nexp; k++) {
        struct cuda_ipc_export e;
        int i = -1;
        memcpy(&e, at + (size_t)k * sizeof(e), sizeof(e));
        RS_CHECK(check_export(w, &e, has, &i));
        exp[i] = e;
        has[i] = 1;
    }
    return RESHARD_OK;
}

reshard_status_t exec_writer_decode(const void *msg, size_t len, int peer, uint32_t seq,
                                    uint64_t hash, uint8_t *cuda)
{
    struct exec_writer_msg m;
    if (len != sizeof(m))
        return rs_error(RESHARD_ERR_REMOTE, "rank %d sent a %zu-byte writer's message (%zu)", peer,
                        len, sizeof(m));
    memcpy(&m, msg, sizeof(m));
    if (m.magic != EXEC_WRITER_MAGIC || m.seq != seq || m.hash != hash || m.cuda > 1)
        return rs_error(RESHARD_ERR_REMOTE,
                        "rank %d sent a malformed writer's message (magic %08x, execution %u, "
                        "plan %016llx, cuda %u)",
                        peer, m.magic, m.seq, (unsigned long long)m.hash, m.cuda);
    *cuda = (uint8_t)m.cuda;
    return RESHARD_OK;
}

/* ---- the exchange ---- */

struct link_msg {
    struct tp_req req;
    struct link_phase *ph;
    reshard_status_t st;
    size_t got;
    int recv, done;
};

/* One exchange: a message each way per pair, and its buffers, freed together (or kept by the
 * communicator while a request may still point into them). */
struct link_phase {
    struct reshard_comm *c;
    int n, left;
    int64_t last_event_ms;
    struct link_msg *m; /* [2 * (to.n + from.n)]: per to-peer (recv, send), then per from-peer */
    char **buf;
    size_t *len;
    struct cuda_ipc_export *live; /* scratch: one receiver's exports, for pruning mappings */
};

static void phase_free(void *p)
{
    struct link_phase *ph = p;
    for (int i = 0; ph->buf && i < ph->n; i++)
        free(ph->buf[i]);
    free(ph->buf);
    free(ph->len);
    free(ph->m);
    free(ph->live);
    free(ph);
}

static void on_link(struct tp_req *req, reshard_status_t st, size_t bytes)
{
    struct link_msg *m = container_of(req, struct link_msg, req);
    struct link_phase *ph = m->ph;
    m->st = st;
    m->got = bytes;
    m->done = 1;
    ph->left--;
    ph->last_event_ms = rs_now_ms();
    if (m->recv && st == RESHARD_OK) {
        /* a control message: the transport counted it as data */
        req->ctx->counters.bytes_in -= bytes;
        ph->c->ctrl_bytes_in += bytes;
    }
}

/* This rank's announcement to writer j (of from). */
static size_t encode_ann(const struct exec *x, int j, const reshard_buffers_t *bufs, uint32_t seq,
                         char *out)
{
    const struct exec_pairs *p = &x->links.from;
    uint32_t first = p->first[j], n = p->first[j + 1] - first, nexp = 0;
    struct exec_ann_hdr h = {EXEC_ANN_MAGIC, seq, x->plan->hash, n, 0};
    char *at = out + sizeof(h);
    for (uint32_t i = 0; i < n; i++) {
        const struct exec_entry *e = &p->ent[first + i];
        const void *base = e->buf == XBUF_TMP     ? x->tmp.buf[e->tensor]
                           : e->buf == XBUF_STAGE ? x->quant.stage[e->tensor]
                                                  : bufs[e->tensor].dst;
        uint64_t a = (uint64_t)(uintptr_t)base;
        memcpy(at + (size_t)i * sizeof(a), &a, sizeof(a));
    }
    at += (size_t)n * sizeof(uint64_t);
    for (uint32_t i = 0; i < n; i++) {
        const struct exec_entry *e = &p->ent[first + i];
        const struct cuda_ipc_export *ex = e->buf == XBUF_DST ? exec_export_of(x, e->tensor) : NULL;
        if (ex)
            memcpy(at + (size_t)nexp++ * sizeof(*ex), ex, sizeof(*ex));
    }
    h.nexp = nexp;
    memcpy(out, &h, sizeof(h));
    return sizeof(h) + (size_t)n * sizeof(uint64_t) + nexp * sizeof(struct cuda_ipc_export);
}

/* The exchange's messages and buffers, made before the start vote (so that failing to make
 * them is a refusal, not a failure in flight) and kept for the next. */
reshard_status_t exec_links_prepare(struct exec *x)
{
    struct exec_links *l = &x->links;
    if (l->phase)
        return RESHARD_OK;
    int n = 2 * (l->to.n + l->from.n);
    struct link_phase *ph = rs_calloc(1, sizeof(*ph), "buffer announcements");
    if (!ph)
        return RESHARD_ERR_NO_MEMORY;
    ph->c = x->comm;
    ph->m = rs_calloc((size_t)n + 1, sizeof(*ph->m), "buffer announcements");
    ph->buf = rs_calloc((size_t)n + 1, sizeof(char *), "buffer announcements");
    ph->len = rs_calloc((size_t)n + 1, sizeof(size_t), "buffer announcements");
    ph->live = rs_calloc(l->to.first[l->to.n] + 1, sizeof(*ph->live), "buffer announcements");
    if (!ph->m || !ph->buf || !ph->len || !ph->live) {
        phase_free(ph);
        return RESHARD_ERR_NO_MEMORY;
    }
    ph->n = n;
    for (int i = 0; i < n; i++) {
        int to = i < 2 * l->to.n, k = to ? i / 2 : (i - 2 * l->to.n) / 2, recv = !(i % 2);
        const struct exec_pairs *p = to ? &l->to : &l->from;
        uint32_t nent = p->first[k + 1] - p->first[k];
        /* to-peer: its announcement in, our writer's message out; from-peer: the reverse */
        size_t bytes = to == recv ? exec_ann_max_bytes(nent) : sizeof(struct exec_writer_msg);
        ph->m[i] = (struct link_msg){.ph = ph, .recv = recv};
        ph->len[i] = bytes;
        if (!(ph->buf[i] = rs_calloc(1, bytes, "buffer announcements"))) {
            phase_free(ph);
            return RESHARD_ERR_NO_MEMORY;
        }
    }
    l->phase = ph;
    return RESHARD_OK;
}

/* Posts every message of the exchange: receives first. */
static reshard_status_t phase_post(struct exec *x, struct link_phase *ph,
                                   const reshard_buffers_t *bufs, const reshard_buffers_t *dev,
                                   uint32_t seq)
{
    const struct exec_links *l = &x->links;
    struct tp_ctx *net = x->comm->net;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < ph->n; i++) {
            struct link_msg *m = &ph->m[i];
            int to = i < 2 * l->to.n, k = to ? i / 2 : (i - 2 * l->to.n) / 2;
            int peer = to ? l->to.peer[k] : l->from.peer[k];
            if (m->recv != !pass)
                continue;
            enum exec_run_msg kind = to == m->recv ? EXEC_RUN_ANNOUNCE : EXEC_RUN_WRITER;
            uint64_t tag = exec_tag(EXEC_TAG_RUN, seq, kind, 0);
            m->req.done = on_link;
            if (m->recv) {
                RS_CHECK(net->ops->recv(net, peer, tag, ph->buf[i], ph->len[i], NULL, &m->req));
            } else {
                size_t len = sizeof(struct exec_writer_msg);
                if (kind == EXEC_RUN_ANNOUNCE) {
                    len = encode_ann(x, k, bufs, seq, ph->buf[i]);
                } else {
                    struct exec_writer_msg w = {EXEC_WRITER_MAGIC, seq, x->plan->hash,
                                                (uint32_t)my_cuda(dev), 0};
                    memcpy(ph->buf[i], &w, sizeof(w));
                }
                RS_CHECK(net->ops->send(net, peer, tag, ph->buf[i], len, NULL, 1, &m->req));
                x->comm->ctrl_bytes_out += len;
            }
            ph->left++;
        }
    return RESHARD_OK;
}

static reshard_status_t decode_received(struct exec *x, struct link_phase *ph, uint32_t seq,
                                        int only_done);

/* A message failed: a peer's malformed announcement, already here, says more about why than
 * our send to it that its exit broke. */
static reshard_status_t failed(struct exec *x, struct link_phase *ph, uint32_t seq, int i)
{
    struct rs_saved_error why;
    rs_error_save(&why);
    reshard_status_t st = decode_received(x, ph, seq, 1);
    if (st != RESHARD_OK)
        return st;
    rs_error_restore(&why);
    return rs_error(ph->m[i].st, "rank %d: %s rank %d's buffers failed", x->comm->rank,
                    ph->m[i].recv ? "hearing of" : "telling", ph->m[i].req.peer);
}

static reshard_status_t phase_wait(struct exec *x, struct link_phase *ph, uint32_t seq)
{
    struct reshard_comm *c = x->comm;
    struct tp_ctx *net = c->net;
    int timeout = comm_timeout_ms();
    ph->last_event_ms = rs_now_ms();
    int64_t next_check = ph->last_event_ms + LINK_CHECK_MS;
    int gone = -1; /* a rank heard to leave after its part (exec_heard_leave) */
    while (ph->left > 0) {
        if (atomic_load(&c->abort_req))
            return rs_error(RESHARD_ERR_ABORTED, "rank %d: execution aborted (reshard_comm_abort)",
                            c->rank);
        if (gone < 0 && rs_now_ms() >= next_check) {
            reshard_status_t st = boot_check(c->boot);
            if (exec_heard_leave(c, st))
                gone = boot_left(c->boot);
            else if (st != RESHARD_OK)
                return st;
            next_check = rs_now_ms() + LINK_CHECK_MS;
        }
        if (net->ops->progress(net))
            continue;
        for (int i = 0; i < ph->n; i++)
            if (ph->m[i].done && ph->m[i].st != RESHARD_OK)
                return failed(x, ph, seq, i);
        if (net->failed_peer >= 0 && net->failed_peer != gone) {
            reshard_status_t st = gone < 0 ? boot_check(c->boot) : RESHARD_OK;
            if (exec_heard_leave(c, st)) /* a leaver's connection may close */
                gone = boot_left(c->boot);
            else if (st != RESHARD_OK) /* its own report names the cause better */
                return st;
        }
        if (net->failed_peer >= 0 && net->failed_peer != gone)
            return rs_error(RESHARD_ERR_NETWORK, "rank %d: connection to rank %d failed: %s",
                            c->rank, net->failed_peer, net->failed_why);
        int64_t idle = rs_now_ms() - ph->last_event_ms;
        if (idle >= timeout)
            return rs_error(RESHARD_ERR_TIMEOUT,
                            "rank %d: no progress for %d s exchanging buffer addresses with the "
                            "local peers",
                            c->rank, timeout / 1000);
        RS_CHECK(net->ops->wait(net, LINK_WAIT_MS));
    }
    for (int i = 0; i < ph->n; i++)
        if (ph->m[i].st != RESHARD_OK)
            return failed(x, ph, seq, i);
    return RESHARD_OK;
}

/* What the peers said, checked, into the links (only_done: of the receives that completed
 * well, when others failed); mappings of buffers a receiver no longer exports are closed. */
static reshard_status_t decode_received(struct exec *x, struct link_phase *ph, uint32_t seq,
                                        int only_done)
{
    struct exec_links *l = &x->links;
    struct reshard_comm *c = x->comm;
    for (int k = 0; k < l->to.n; k++) {
        if (only_done && (!ph->m[2 * k].done || ph->m[2 * k].st != RESHARD_OK))
            continue;
        uint32_t first = l->to.first[k], n = l->to.first[k + 1] - first;
        struct exec_ann_want w = {l->to.peer[k],    c->pid[l->to.peer[k]], seq, x->plan->hash, n,
                                  l->to.ent + first};
        RS_CHECK(exec_ann_decode(ph->buf[2 * k], ph->m[2 * k].got, &w, l->addr + first,
                                 l->exp + first, l->has_exp + first));
        if (x->exp.maps.nopen) {
            uint32_t nlive = 0;
            for (uint32_t i = 0; i < n; i++)
                if (l->has_exp[first + i])
                    ph->live[nlive++] = l->exp[first + i];
            cuda_ipc_prune(&x->exp.maps, l->to.peer[k], ph->live, nlive);
        }
    }
    for (int j = 0; j < l->from.n; j++) {
        int i = 2 * l->to.n + 2 * j; /* the writer's message in */
        if (only_done && (!ph->m[i].done || ph->m[i].st != RESHARD_OK))
            continue;
        RS_CHECK(exec_writer_decode(ph->buf[i], ph->m[i].got, l->from.peer[j], seq, x->plan->hash,
                                    &l->cuda[j]));
    }
    return RESHARD_OK;
}

/* After a failure: receives cancelled, the rest given a while; what still points into the
 * buffers keeps them until the communicator closes its context. */
static void phase_drop(struct exec *x, struct link_phase *ph)
{
    struct tp_ctx *net = x->comm->net;
    for (int i = 0; i < ph->n; i++)
        if (ph->m[i].recv && ph->m[i].req.handle)
            net->ops->cancel(net, &ph->m[i].req);
    int64_t until = rs_now_ms() + LINK_DRAIN_MS;
    while (ph->left > 0 && rs_now_ms() < until)
        if (!net->ops->progress(net))
            (void)net->ops->wait(net, LINK_WAIT_MS);
    if (ph->left > 0 && comm_keep(x->comm, phase_free, ph))
        return;
    if (ph->left == 0)
        phase_free(ph); /* else leaked rather than freed under a request */
}

reshard_status_t exec_links_announce(struct exec *x, const reshard_buffers_t *bufs,
                                     const reshard_buffers_t *dev, uint32_t seq)
{
    struct exec_links *l = &x->links;
    struct link_phase *ph = l->phase;
    l->told = 0; /* until the exchange completes */
    if (!ph)     /* exec_links_prepare failed, yet the vote passed: cannot be */
        return rs_error(RESHARD_ERR_INTERNAL, "rank %d: no buffers to announce with",
                        x->comm->rank);
    ph->left = 0;
    for (int i = 0; i < ph->n; i++)
        ph->m[i] = (struct link_msg){.ph = ph, .recv = !(i % 2)};
    reshard_status_t st = phase_post(x, ph, bufs, dev, seq);
    if (st == RESHARD_OK)
        st = phase_wait(x, ph, seq);
    if (st == RESHARD_OK)
        st = decode_received(x, ph, seq, 0);
    if (st != RESHARD_OK && ph->left > 0) { /* requests may still point into it */
        struct rs_saved_error why;
        rs_error_save(&why);
        l->phase = NULL;
        phase_drop(x, ph);
        rs_error_restore(&why);
        return st;
    }
    RS_CHECK(st);
    for (uint32_t e = 0; e < l->from.first[l->from.n]; e++) {
        uint32_t t = l->from.ent[e].tensor;
        l->told_key[t] = tensor_key(x, t, bufs);
        l->exported[t] = exec_export_of(x, t) != NULL;
    }
    l->told_cuda = my_cuda(dev);
    l->told = 1;
    return RESHARD_OK;
}
