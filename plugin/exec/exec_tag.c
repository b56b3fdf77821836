/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The numbers in an execution's tags: each side's transfers numbered per peer in the canonical
 * order, so that the sender's k-th transfer to a peer is the receiver's k-th from it, whatever
 * else either list holds.
 */
#include "exec_tag.h"

#include "base/error.h"

#include <stdlib.h>

int exec_xfer_cmp(const struct exec_cut *cut, const struct xfer *a, const struct xfer *b)
{
    if (a->tensor != b->tensor)
        return a->tensor < b->tensor ? -1 : 1;
    if (a->src_buf != b->src_buf)
        return a->src_buf < b->src_buf ? -1 : 1;
    if (a->dst_buf != b->dst_buf)
        return a->dst_buf < b->dst_buf ? -1 : 1;
    int n = 2 * cut->plan->tensors[a->tensor].dst.ndim;
    const int64_t *p = cut->xs->coords + a->box, *q = cut->xs->coords + b->box;
    for (int i = 0; i < n; i++)
        if (p[i] != q[i])
            return p[i] < q[i] ? -1 : 1;
    return 0;
}

struct by_pair {
    const struct exec_cut *cut;
    const uint32_t *list;
    int send;
};

static int peer_of(const struct by_pair *k, uint32_t pos)
{
    const struct xfer *xf = &k->cut->xs->x[k->list[pos]];
    return k->send ? xf->dst : xf->src;
}

static int cmp_by_pair(const void *a, const void *b, void *arg)
{
    const struct by_pair *k = arg;
    uint32_t p = *(const uint32_t *)a, q = *(const uint32_t *)b;
    int pp = peer_of(k, p), pq = peer_of(k, q);
    if (pp != pq)
        return pp < pq ? -1 : 1;
    return exec_xfer_cmp(k->cut, &k->cut->xs->x[k->list[p]], &k->cut->xs->x[k->list[q]]);
}

/* Does transfer list[pos] carry a tag of its own (a message that is not a bundle)? */
static int numbered(const struct xfer *xf, const size_t *off, size_t pos,
                    const struct exec_bundles *b)
{
    if (xf->path == XFER_SELF)
        return 0;
    if (xf->path == XFER_LOCAL || !b || !b->bundled)
        return 1;
    for (size_t c = off[pos]; c < off[pos + 1]; c++)
        if (!b->bundled[c])
            return 1;
    return 0;
}

reshard_status_t exec_tags_number(const struct exec_cut *cut, const uint32_t *list, size_t n,
                                  const size_t *off, const struct exec_bundles *b, int send,
                                  uint32_t *num)
{
    for (size_t i = 0; b && i < b->n; i++)
        if (b->b[i].id >= EXEC_MAX_PAIR_TAGS)
            return rs_error(RESHARD_ERR_TOO_LARGE,
                            "%s rank %d: more than %u packed messages, as many as a message tag "
                            "can number: raise RESHARD_CHUNK_BYTES (a packed message holds up to "
                            "a chunk)",
                            send ? "to" : "from", b->b[i].peer, EXEC_MAX_PAIR_TAGS);
    uint32_t *order = rs_calloc(n + 1, sizeof(*order), "tag numbers");
    if (!order)
        return RESHARD_ERR_NO_MEMORY;
    for (size_t i = 0; i < n; i++)
        order[i] = (uint32_t)i;
    struct by_pair k = {cut, list, send};
    qsort_r(order, n, sizeof(*order), cmp_by_pair, &k);
    reshard_status_t st = RESHARD_OK;
    uint32_t next = 0;
    for (size_t i = 0; i < n && st == RESHARD_OK; i++) {
        uint32_t pos = order[i];
        const struct xfer *xf = &cut->xs->x[list[pos]];
        if (i == 0 || peer_of(&k, pos) != peer_of(&k, order[i - 1]))
            next = 0;
        num[pos] = UINT32_MAX;
        if (!numbered(xf, off, pos, b))
            continue;
        if (next == EXEC_MAX_PAIR_TAGS)
            st = rs_error(RESHARD_ERR_TOO_LARGE,
                          "rank %d sends rank %d more than %u transfers with messages of their "
                          "own, as many as a message tag can number: raise RESHARD_COALESCE_BYTES "
                          "so that more of them travel packed",
                          xf->src, xf->dst, EXEC_MAX_PAIR_TAGS);
        num[pos] = next++;
    }
    free(order);
    return st;
}
