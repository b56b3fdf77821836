/* SPDX-License-Identifier: Apache-2.0 */
/*
 * This rank's share of a transfer list: which transfers it sends and receives, in what order,
 * where each one's chunks start, which received ones release which sends, and what each tensor
 * waits for. Computed once per plan from the list alone (no network), so it can be checked
 * without one.
 */
#include "exec_int.h"

#include "base/error.h"

#include <stdlib.h>
#include <string.h>

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

long exec_share_in_pos(const struct exec_share *s, uint32_t xfer)
{
    const uint32_t *p = bsearch(&xfer, s->in, s->nin, sizeof(*s->in), cmp_u32);
    return p ? p - s->in : -1;
}

struct rotation {
    const struct xfer_set *xs;
    int rank, size;
};

/* Outgoing order: by distance from this rank to the peer (r+1, r+2, ...), so the ranks of a
 * job start on different peers instead of all on rank 0. */
static int cmp_rotated(const void *a, const void *b, void *arg)
{
    const struct rotation *rot = arg;
    const struct xfer *p = &rot->xs->x[*(const uint32_t *)a],
                      *q = &rot->xs->x[*(const uint32_t *)b];
    int n = rot->size, me = rot->rank;
    int dp = (p->dst - me + n) % n, dq = (q->dst - me + n) % n;
    if (dp != dq)
        return dp - dq;
    return cmp_u32(a, b);
}

static reshard_status_t prefix_chunks(const struct exec_cut *cut, const uint32_t *list, size_t n,
                                      size_t **off)
{
    *off = rs_calloc(n + 1, sizeof(**off), "chunk offsets");
    if (!*off)
        return RESHARD_ERR_NO_MEMORY;
    for (size_t i = 0; i < n; i++) {
        int64_t c = exec_nchunks(cut, &cut->xs->x[list[i]]);
        if (c > EXEC_MAX_CHUNKS)
            return rs_error(RESHARD_ERR_TOO_LARGE,
                            "a transfer of %lld bytes of tensor %s (rank %d to rank %d) is %lld "
                            "chunks of RESHARD_CHUNK_BYTES=%lld, more than the %lld a message tag "
                            "can number: raise RESHARD_CHUNK_BYTES",
                            (long long)cut->xs->x[list[i]].bytes,
                            cut->plan->tensors[cut->xs->x[list[i]].tensor].name,
                            cut->xs->x[list[i]].src, cut->xs->x[list[i]].dst, (long long)c,
                            (long long)cut->chunk_bytes, (long long)EXEC_MAX_CHUNKS);
        (*off)[i + 1] = (*off)[i] + (size_t)c;
    }
    return RESHARD_OK;
}

/* Children: outgoing transfers whose parent is an incoming one, grouped by that parent. */
static reshard_status_t link_children(struct exec_share *s, const struct exec_cut *cut, int rank)
{
    const struct xfer_set *xs = cut->xs;
    s->child_first = rs_calloc(s->nin + 1, sizeof(uint32_t), "children");
    s->child = rs_calloc(s->nout + 1, sizeof(uint32_t), "children");
    if (!s->child_first || !s->child)
        return RESHARD_ERR_NO_MEMORY;
    for (size_t o = 0; o < s->nout; o++) { /* count per parent */
        const struct xfer *xf = &xs->x[s->out[o]];
        if (xf->parent == XFER_NONE || xf->parent == XFER_AFTER_INPUTS)
            continue;
        long k = exec_share_in_pos(s, xf->parent);
        const struct xfer *par = &xs->x[xf->parent];
        int ndim = cut->plan->tensors[xf->tensor].dst.ndim;
        if (k < 0 ||
            memcmp(xs->coords + par->box, xs->coords + xf->box, 2 * sizeof(int64_t) * (size_t)ndim))
            return rs_error(RESHARD_ERR_INTERNAL,
                            "transfer %u: parent %u is not a delivery of the same box to rank %d",
                            s->out[o], xf->parent, rank);
        s->child_first[k + 1]++;
    }
    for (size_t k = 0; k < s->nin; k++) /* counts to starts */
        s->child_first[k + 1] += s->child_first[k];
    uint32_t *fill = rs_calloc(s->nin + 1, sizeof(uint32_t), "children");
    if (!fill)
        return RESHARD_ERR_NO_MEMORY;
    for (size_t o = 0; o < s->nout; o++) {
        const struct xfer *xf = &xs->x[s->out[o]];
        if (xf->parent == XFER_NONE || xf->parent == XFER_AFTER_INPUTS)
            continue;
        long k = exec_share_in_pos(s, xf->parent);
        s->child[s->child_first[k] + fill[k]++] = (uint32_t)o;
    }
    free(fill);
    return RESHARD_OK;
}

/* Per tensor (the bcast baseline): what waits for the whole tensor, and how many chunks must
 * land in this rank's whole-tensor buffer first, its own part of the gather included. */
static reshard_status_t link_whole_tensors(struct exec_share *s, const struct xfer_set *xs, int nt,
                                           int rank)
{
    s->after_first = rs_calloc((size_t)nt + 1, sizeof(uint32_t), "tensor waits");
    s->after = rs_calloc(s->nout + 1, sizeof(uint32_t), "tensor waits");
    s->tmp_chunks = rs_calloc((size_t)nt, sizeof(size_t), "tensor waits");
    if (!s->after_first || !s->after || !s->tmp_chunks)
        return RESHARD_ERR_NO_MEMORY;
    for (size_t o = 0; o < s->nout; o++) {
        const struct xfer *xf = &xs->x[s->out[o]];
        if (xf->parent == XFER_AFTER_INPUTS)
            s->after_first[xf->tensor + 1]++;
        if (xf->dst == rank && xf->dst_buf == XBUF_TMP)
            s->tmp_chunks[xf->tensor] += s->out_off[o + 1] - s->out_off[o];
    }
    for (size_t k = 0; k < s->nin; k++) {
        const struct xfer *xf = &xs->x[s->in[k]];
        if (xf->dst_buf == XBUF_TMP)
            s->tmp_chunks[xf->tensor] += s->in_off[k + 1] - s->in_off[k];
    }
    for (int t = 0; t < nt; t++)
        s->after_first[t + 1] += s->after_first[t];
    uint32_t *fill = rs_calloc((size_t)nt + 1, sizeof(uint32_t), "tensor waits");
    if (!fill)
        return RESHARD_ERR_NO_MEMORY;
    for (size_t o = 0; o < s->nout; o++) {
        const struct xfer *xf = &xs->x[s->out[o]];
        if (xf->parent == XFER_AFTER_INPUTS)
            s->after[s->after_first[xf->tensor] + fill[xf->tensor]++] = (uint32_t)o;
    }
    free(fill);
    return RESHARD_OK;
}

static reshard_status_t count_landing(struct exec_share *s, const struct xfer_set *xs, int nt,
                                      int rank)
{
    s->dst_chunks = rs_calloc((size_t)nt, sizeof(size_t), "tensor outcomes");
    if (!s->dst_chunks)
        return RESHARD_ERR_NO_MEMORY;
    for (size_t o = 0; o < s->nout; o++) {
        const struct xfer *xf = &xs->x[s->out[o]];
        if (xf->dst == rank && (xf->dst_buf == XBUF_DST || xf->dst_buf == XBUF_STAGE))
            s->dst_chunks[xf->tensor] += s->out_off[o + 1] - s->out_off[o];
    }
    for (size_t k = 0; k < s->nin; k++) {
        const struct xfer *xf = &xs->x[s->in[k]];
        if (xf->dst_buf == XBUF_DST || xf->dst_buf == XBUF_STAGE)
            s->dst_chunks[xf->tensor] += s->in_off[k + 1] - s->in_off[k];
    }
    return RESHARD_OK;
}

/* The distinct peers of the share, each way: senders' in rotated order (as out is). */
static reshard_status_t list_peers(struct exec_share *s, const struct xfer_set *xs, int size)
{
    char *seen = rs_calloc((size_t)size, 1, "peers");
    s->send_peers = rs_calloc((size_t)size, sizeof(int), "peers");
    s->recv_peers = rs_calloc((size_t)size, sizeof(int), "peers");
    if (!seen || !s->send_peers || !s->recv_peers) {
        free(seen);
        return RESHARD_ERR_NO_MEMORY;
    }
    for (size_t o = 0; o < s->nout; o++) {
        const struct xfer *xf = &xs->x[s->out[o]];
        if (xf->path != XFER_SELF && !seen[xf->dst]) {
            seen[xf->dst] = 1;
            s->send_peers[s->nsend_peers++] = xf->dst;
        }
    }
    memset(seen, 0, (size_t)size);
    for (size_t k = 0; k < s->nin; k++) {
        int src = xs->x[s->in[k]].src;
        if (!seen[src]) {
            seen[src] = 1;
            s->recv_peers[s->nrecv_peers++] = src;
        }
    }
    free(seen);
    return RESHARD_OK;
}

/* The transfers this rank sends and receives. */
static reshard_status_t pick(struct exec_share *s, const struct xfer_set *xs, int rank, int size)
{
    for (size_t i = 0; i < xs->n; i++) {
        s->nout += xs->x[i].src == rank;
        s->nin += xs->x[i].dst == rank && xs->x[i].src != rank;
    }
    s->out = rs_calloc(s->nout + 1, sizeof(uint32_t), "transfers");
    s->in = rs_calloc(s->nin + 1, sizeof(uint32_t), "transfers");
    s->out_tag = rs_calloc(s->nout + 1, sizeof(uint32_t), "transfers");
    s->in_tag = rs_calloc(s->nin + 1, sizeof(uint32_t), "transfers");
    if (!s->out || !s->in || !s->out_tag || !s->in_tag)
        return RESHARD_ERR_NO_MEMORY;
    size_t no = 0, ni = 0;
    for (size_t i = 0; i < xs->n; i++) {
        if (xs->x[i].src == rank)
            s->out[no++] = (uint32_t)i;
        else if (xs->x[i].dst == rank)
            s->in[ni++] = (uint32_t)i; /* ascending: in_pos searches it */
    }
    struct rotation rot = {xs, rank, size};
    qsort_r(s->out, s->nout, sizeof(*s->out), cmp_rotated, &rot);
    return RESHARD_OK;
}

reshard_status_t exec_share_init(struct exec_share *s, const struct exec_cut *cut, int rank,
                                 int size)
{
    const struct xfer_set *xs = cut->xs;
    int nt = cut->plan->ntensors;
    reshard_status_t st;
    *s = (struct exec_share){0};
    RS_CHECK_GOTO(pick(s, xs, rank, size), st, err_fini);
    RS_CHECK_GOTO(prefix_chunks(cut, s->out, s->nout, &s->out_off), st, err_fini);
    RS_CHECK_GOTO(prefix_chunks(cut, s->in, s->nin, &s->in_off), st, err_fini);
    RS_CHECK_GOTO(link_children(s, cut, rank), st, err_fini);
    RS_CHECK_GOTO(link_whole_tensors(s, xs, nt, rank), st, err_fini);
    RS_CHECK_GOTO(count_landing(s, xs, nt, rank), st, err_fini);
    RS_CHECK_GOTO(list_peers(s, xs, size), st, err_fini);
    return RESHARD_OK;
err_fini:
    exec_share_fini(s);
    return st;
}

reshard_status_t exec_share_connect(const struct exec_share *s, const struct xfer_set *xs,
                                    struct tp_ctx *net)
{
    for (int i = 0; i < s->nsend_peers; i++)
        RS_CHECK(net->ops->connect(net, s->send_peers[i]));
    for (size_t k = 0; k < s->nin; k++)
        RS_CHECK(net->ops->connect(net, xs->x[s->in[k]].src));
    return RESHARD_OK;
}

void exec_share_fini(struct exec_share *s)
{
    free(s->out);
    free(s->in);
    free(s->out_off);
    free(s->in_off);
    free(s->out_tag);
    free(s->in_tag);
    free(s->child_first);
    free(s->child);
    free(s->send_peers);
    free(s->recv_peers);
    free(s->after_first);
    free(s->after);
    free(s->tmp_chunks);
    free(s->dst_chunks);
    *s = (struct exec_share){0};
}
