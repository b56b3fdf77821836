/* SPDX-License-Identifier: Apache-2.0 */
/*
 * This rank's share of a transfer list: which transfers it sends and receives, in what order,
 * which received ones release which sends, and how each transfer is cut into chunks.
 */
#include "exec_int.h"

#include "base/error.h"
#include "base/param.h"
#include "cuda/cuda_lib.h"

#include <stdlib.h>
#include <string.h>

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
    int64_t wider;
    while (split > 0 && !__builtin_mul_overflow(inner, len[split], &wider) &&
           wider <= x->chunk_bytes) {
        inner = wider;
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

int64_t exec_nchunks(const struct exec *x, const struct xfer *xf)
{
    return cut_of(x, xf).n;
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
void exec_chunk_region(const struct exec *x, const struct xfer *xf, uint32_t chunk, int side,
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

long exec_in_pos(const struct exec *x, uint32_t xfer)
{
    const uint32_t *p = bsearch(&xfer, x->in, x->nin, sizeof(*x->in), cmp_u32);
    return p ? p - x->in : -1;
}

/* Outgoing order: by distance from this rank to the peer (r+1, r+2, ...), so the ranks of a
 * job start on different peers instead of all on rank 0. */
static int cmp_rotated(const void *a, const void *b, void *arg)
{
    const struct exec *x = arg;
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
            return rs_error(RESHARD_ERR_TOO_LARGE, "transfer of %lld bytes: over 2^20 chunks",
                            (long long)x->xs.x[list[i]].bytes);
        (*off)[i + 1] = (*off)[i] + (size_t)c.n;
    }
    return RESHARD_OK;
}

/* Children: outgoing transfers whose parent is an incoming one, grouped by that parent. */
static reshard_status_t link_children(struct exec *x)
{
    x->child_first = rs_calloc(x->nin + 1, sizeof(uint32_t), "children");
    x->child = rs_calloc(x->nout + 1, sizeof(uint32_t), "children");
    if (!x->child_first || !x->child)
        return RESHARD_ERR_NO_MEMORY;
    for (size_t o = 0; o < x->nout; o++) { /* count per parent */
        const struct xfer *xf = &x->xs.x[x->out[o]];
        if (xf->parent == XFER_NONE || xf->parent == XFER_AFTER_INPUTS)
            continue;
        long k = exec_in_pos(x, xf->parent);
        const struct xfer *par = &x->xs.x[xf->parent];
        if (k < 0 || memcmp(x->xs.coords + par->box, x->xs.coords + xf->box,
                            2 * sizeof(int64_t) * (size_t)xfer_ndim(x, xf)))
            return rs_error(RESHARD_ERR_INTERNAL,
                            "transfer %u: parent %u is not a delivery of the same box to rank %d",
                            x->out[o], xf->parent, x->comm->rank);
        x->child_first[k + 1]++;
    }
    for (size_t k = 0; k < x->nin; k++) /* counts to starts */
        x->child_first[k + 1] += x->child_first[k];
    uint32_t *fill = rs_calloc(x->nin + 1, sizeof(uint32_t), "children");
    if (!fill)
        return RESHARD_ERR_NO_MEMORY;
    for (size_t o = 0; o < x->nout; o++) {
        const struct xfer *xf = &x->xs.x[x->out[o]];
        if (xf->parent == XFER_NONE || xf->parent == XFER_AFTER_INPUTS)
            continue;
        long k = exec_in_pos(x, xf->parent);
        x->child[x->child_first[k] + fill[k]++] = (uint32_t)o;
    }
    free(fill);
    return RESHARD_OK;
}

/* Per tensor (the bcast baseline): what waits for the whole tensor, and how many chunks must
 * land in this rank's whole-tensor buffer first, its own part of the gather included. */
static reshard_status_t link_whole_tensors(struct exec *x)
{
    int nt = x->plan->ntensors, me = x->comm->rank;
    x->after_first = rs_calloc((size_t)nt + 1, sizeof(uint32_t), "tensor waits");
    x->after = rs_calloc(x->nout + 1, sizeof(uint32_t), "tensor waits");
    x->tmp_chunks = rs_calloc((size_t)nt, sizeof(size_t), "tensor waits");
    if (!x->after_first || !x->after || !x->tmp_chunks)
        return RESHARD_ERR_NO_MEMORY;
    for (size_t o = 0; o < x->nout; o++) {
        const struct xfer *xf = &x->xs.x[x->out[o]];
        if (xf->parent == XFER_AFTER_INPUTS)
            x->after_first[xf->tensor + 1]++;
        if (xf->dst == me && xf->dst_buf == XBUF_TMP)
            x->tmp_chunks[xf->tensor] += x->out_off[o + 1] - x->out_off[o];
    }
    for (size_t k = 0; k < x->nin; k++) {
        const struct xfer *xf = &x->xs.x[x->in[k]];
        if (xf->dst_buf == XBUF_TMP)
            x->tmp_chunks[xf->tensor] += x->in_off[k + 1] - x->in_off[k];
    }
    for (int t = 0; t < nt; t++)
        x->after_first[t + 1] += x->after_first[t];
    uint32_t *fill = rs_calloc((size_t)nt + 1, sizeof(uint32_t), "tensor waits");
    if (!fill)
        return RESHARD_ERR_NO_MEMORY;
    for (size_t o = 0; o < x->nout; o++) {
        const struct xfer *xf = &x->xs.x[x->out[o]];
        if (xf->parent == XFER_AFTER_INPUTS)
            x->after[x->after_first[xf->tensor] + fill[xf->tensor]++] = (uint32_t)o;
    }
    free(fill);
    return RESHARD_OK;
}

static reshard_status_t count_landing(struct exec *x)
{
    int me = x->comm->rank;
    x->dst_chunks = rs_calloc((size_t)x->plan->ntensors, sizeof(size_t), "tensor outcomes");
    x->outcome = rs_calloc((size_t)x->plan->ntensors, 1, "tensor outcomes");
    if (!x->dst_chunks || !x->outcome)
        return RESHARD_ERR_NO_MEMORY;
    for (size_t o = 0; o < x->nout; o++) {
        const struct xfer *xf = &x->xs.x[x->out[o]];
        if (xf->dst == me && xf->dst_buf == XBUF_DST)
            x->dst_chunks[xf->tensor] += x->out_off[o + 1] - x->out_off[o];
    }
    for (size_t k = 0; k < x->nin; k++) {
        const struct xfer *xf = &x->xs.x[x->in[k]];
        if (xf->dst_buf == XBUF_DST)
            x->dst_chunks[xf->tensor] += x->in_off[k + 1] - x->in_off[k];
    }
    return RESHARD_OK;
}

/* Connects to every peer this rank exchanges messages with, so that a rank that only
 * receives also hears when a sender's connection fails. */
static reshard_status_t connect_peers(struct exec *x)
{
    struct tp_ctx *net = x->comm->net;
    char *seen = rs_calloc((size_t)x->comm->size, 1, "peers");
    x->send_peers = rs_calloc((size_t)x->comm->size, sizeof(int), "peers");
    if (!seen || !x->send_peers) {
        free(seen);
        return RESHARD_ERR_NO_MEMORY;
    }
    for (size_t o = 0; o < x->nout; o++) { /* out is in rotated order: so is the list */
        const struct xfer *xf = &x->xs.x[x->out[o]];
        if (xf->path != XFER_SELF && !seen[xf->dst]) {
            seen[xf->dst] = 1;
            x->send_peers[x->nsend_peers++] = xf->dst;
        }
    }
    memset(seen, 0, (size_t)x->comm->size);
    x->recv_peers = rs_calloc((size_t)x->comm->size, sizeof(int), "peers");
    for (size_t k = 0; x->recv_peers && k < x->nin; k++) {
        int src = x->xs.x[x->in[k]].src;
        if (!seen[src]) {
            seen[src] = 1;
            x->recv_peers[x->nrecv_peers++] = src;
        }
    }
    free(seen);
    if (!x->recv_peers)
        return RESHARD_ERR_NO_MEMORY;
    for (int i = 0; i < x->nsend_peers; i++)
        RS_CHECK(net->ops->connect(net, x->send_peers[i]));
    for (size_t k = 0; k < x->nin; k++)
        RS_CHECK(net->ops->connect(net, x->xs.x[x->in[k]].src));
    return RESHARD_OK;
}

/* ---- coalescing ---- */

uint64_t exec_chunk_bytes_of(const struct exec *x, const struct xfer *xf, uint32_t chunk)
{
    struct region rg;
    exec_chunk_region(x, xf, chunk, 1, &rg);
    return region_bytes(&rg);
}

/* A chunk both sides pack: on the network, out of a source buffer, ready at the start. */
static int packable(const struct exec *x, const struct xfer *xf)
{
    return x->coalesce_bytes > 0 && xf->path == XFER_NET && xf->parent == XFER_NONE &&
           xf->src_buf == XBUF_SRC;
}

struct cand {
    int32_t peer;
    uint32_t xfer, pos, chunk;
    uint64_t bytes;
};

static int cmp_cand(const void *a, const void *b)
{
    const struct cand *p = a, *q = b;
    if (p->peer != q->peer)
        return p->peer < q->peer ? -1 : 1;
    if (p->xfer != q->xfer)
        return p->xfer < q->xfer ? -1 : 1;
    return p->chunk < q->chunk ? -1 : p->chunk > q->chunk;
}

/* Bundles of one side: list[n] with chunk offsets off, the peer being the transfers' dst
 * (send) or src (receive). */
static reshard_status_t bundle_side(struct exec *x, const uint32_t *list, size_t n,
                                    const size_t *off, int send, struct bundle **bundles,
                                    size_t *nbundles, struct piece **pieces, uint8_t **bundled)
{
    size_t ncand = 0, cap = 0;
    struct cand *c = NULL;
    reshard_status_t st = RESHARD_ERR_NO_MEMORY;
    for (size_t pos = 0; pos < n; pos++) {
        const struct xfer *xf = &x->xs.x[list[pos]];
        if (!packable(x, xf))
            continue;
        for (uint32_t k = 0; k < off[pos + 1] - off[pos]; k++) {
            uint64_t bytes = exec_chunk_bytes_of(x, xf, k);
            if (bytes > (uint64_t)x->coalesce_bytes)
                continue;
            struct cand *g = rs_grow(c, &cap, ncand + 1, sizeof(*c), "coalescing");
            if (!g)
                goto out;
            c = g;
            c[ncand++] =
                (struct cand){send ? xf->dst : xf->src, list[pos], (uint32_t)pos, k, bytes};
        }
    }
    *bundled = rs_calloc(off[n] + 1, 1, "coalescing");
    *pieces = rs_calloc(ncand + 1, sizeof(**pieces), "coalescing");
    *bundles = rs_calloc(ncand + 1, sizeof(**bundles), "coalescing");
    if (!*bundled || !*pieces || !*bundles)
        goto out;
    if (ncand) /* qsort wants a real array, even of nothing */
        qsort(c, ncand, sizeof(*c), cmp_cand);
    size_t nb = 0;
    for (size_t i = 0; i < ncand; i++) {
        struct bundle *b = nb ? &(*bundles)[nb - 1] : NULL;
        if (!b || b->peer != c[i].peer || b->bytes + c[i].bytes > (uint64_t)x->chunk_bytes) {
            uint32_t id = b && b->peer == c[i].peer ? b->id + 1 : 0;
            b = &(*bundles)[nb++];
            *b = (struct bundle){.peer = c[i].peer, .id = id, .first = (uint32_t)i};
        }
        b->n++;
        b->bytes += c[i].bytes;
        (*pieces)[i] = (struct piece){c[i].pos, c[i].chunk};
        (*bundled)[off[c[i].pos] + c[i].chunk] = 1;
    }
    *nbundles = nb;
    st = RESHARD_OK;
out:
    free(c);
    return st;
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
    qsort_r(x->out, x->nout, sizeof(*x->out), cmp_rotated, x);
    RS_CHECK(prefix_chunks(x, x->out, x->nout, &x->out_off));
    RS_CHECK(prefix_chunks(x, x->in, x->nin, &x->in_off));
    RS_CHECK(link_children(x));
    RS_CHECK(link_whole_tensors(x));
    RS_CHECK(count_landing(x));
    RS_CHECK(bundle_side(x, x->out, x->nout, x->out_off, 1, &x->out_b, &x->nout_b, &x->out_p,
                         &x->out_bundled));
    RS_CHECK(
        bundle_side(x, x->in, x->nin, x->in_off, 0, &x->in_b, &x->nin_b, &x->in_p, &x->in_bundled));
    return connect_peers(x);
}

int64_t exec_chunk_bytes(void)
{
    int64_t b = rs_param_int(RS_PARAM_CHUNK_BYTES);
    return b > MAX_CHUNK_BYTES ? MAX_CHUNK_BYTES : b;
}

int64_t exec_coalesce_bytes(void)
{
    int64_t b = rs_param_int(RS_PARAM_COALESCE_BYTES), chunk = exec_chunk_bytes();
    return b > chunk ? chunk : b;
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
    x->chunk_bytes = exec_chunk_bytes();
    x->coalesce_bytes = exec_coalesce_bytes();
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

static void free_tmp(void *p)
{
    char **tmp = p;
    for (int t = 0; tmp[t]; t++)
        free(tmp[t]);
    free(tmp);
}

/* Host copies of device buffers: pinned when the driver gave pinned memory. */
static void free_shadows(void *p)
{
    char **shadow = p;
    for (int i = 0; shadow[i]; i++)
        cuda_host_free(shadow[i]);
    free(shadow);
}

void exec_destroy(struct exec *x)
{
    if (!x)
        return;
    struct reshard_comm *c = x->comm;
    /* After a failed execution, requests may still use our registrations and peers may still
     * write into our whole-tensor buffers: both go when the communicator's context closes. */
    int broken = c->broken != RESHARD_OK;
    for (int i = 0; x->reg && i < 4 * x->plan->ntensors; i++) {
        struct reg *g = i < 2 * x->plan->ntensors ? &x->reg[i]
                        : x->dreg                 ? &x->dreg[i - 2 * x->plan->ntensors]
                                                  : NULL;
        if (!g || !g->mh)
            continue;
        if (!broken || !comm_keep_mh(c, g->mh))
            c->net->ops->mem_dereg(c->net, g->mh);
    }
    if (x->tmp) {
        /* compact the array (it has room for one more) so that NULL ends it */
        int n = 0;
        for (int t = 0; t < x->plan->ntensors; t++)
            if (x->tmp[t])
                x->tmp[n++] = x->tmp[t];
        x->tmp[n] = NULL;
        if (!broken)
            free_tmp(x->tmp);
        else
            (void)comm_keep(c, free_tmp, x->tmp); /* else leaked: never freed under a writer */
    }
    if (x->shadow) { /* the same for the host copies of device buffers */
        int n = 0;
        for (int i = 0; i < 2 * x->plan->ntensors; i++)
            if (x->shadow[i])
                x->shadow[n++] = x->shadow[i];
        x->shadow[n] = NULL;
        if (!broken)
            free_shadows(x->shadow);
        else
            (void)comm_keep(c, free_shadows, x->shadow);
    }
    free(x->shadow_cap);
    for (int t = 0; x->exp_cache && t < x->plan->ntensors; t++)
        cuda_ipc_unexport(&x->exp_cache[t]);
    free(x->exp_cache);
    free(x->my_exp);
    free(x->exports);
    free(x->exp_key);
    free(x->exp_n);
    if (x->maps.nopen) /* no copy of this plan's is in flight: runs end after theirs */
        cuda_ipc_close_all(&x->maps);
    free(x->reg);
    free(x->dreg);
    free(x->out);
    free(x->in);
    free(x->out_off);
    free(x->in_off);
    free(x->child_first);
    free(x->child);
    free(x->after_first);
    free(x->after);
    free(x->tmp_chunks);
    free(x->dst_chunks);
    free(x->outcome);
    free(x->send_peers);
    free(x->recv_peers);
    free(x->out_b);
    free(x->in_b);
    free(x->out_p);
    free(x->in_p);
    free(x->out_bundled);
    free(x->in_bundled);
    xfer_free(&x->xs);
    free(x);
}

reshard_status_t exec_outcome(const struct exec *x, reshard_tensor_state_t *states)
{
    if (x->on_nccl)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "the last execution was enqueued on NCCL: it completes on the stream, "
                        "which knows its outcome");
    if (!x->executed)
        return rs_error(RESHARD_ERR_INVALID_ARG, "the plan has not been executed yet");
    for (int t = 0; t < x->plan->ntensors; t++)
        states[t] = (reshard_tensor_state_t)x->outcome[t];
    return RESHARD_OK;
}

const struct xfer_set *exec_xfers(const struct exec *x)
{
    return &x->xs;
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
