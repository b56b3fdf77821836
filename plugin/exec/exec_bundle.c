/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Bundles: which chunks of one side of an executor travel packed, and into which messages.
 * Building and counting share every step (the candidates, their order, the greedy fill); only
 * building writes the result down.
 */
#include "exec_bundle.h"

#include "exec_tag.h"
#include "base/error.h"

#include <stdlib.h>

/* A chunk both sides pack: on the network, out of a source buffer, ready at the start. */
static int packable(const struct exec_cut *cut, const struct xfer *xf)
{
    return cut->coalesce_bytes > 0 && xf->path == XFER_NET && xf->parent == XFER_NONE &&
           (xf->src_buf == XBUF_SRC || xf->src_buf == XBUF_QSRC);
}

struct cand {
    int32_t peer;
    uint32_t xfer, pos, chunk;
    uint64_t bytes;
};

/* By peer, then the transfers' canonical order (exec_tag.h), which both ends of a pair see
 * alike in their own lists, then chunk. */
static int cmp_cand(const void *a, const void *b, void *arg)
{
    const struct exec_cut *cut = arg;
    const struct cand *p = a, *q = b;
    if (p->peer != q->peer)
        return p->peer < q->peer ? -1 : 1;
    if (p->xfer != q->xfer) {
        int c = exec_xfer_cmp(cut, &cut->xs->x[p->xfer], &cut->xs->x[q->xfer]);
        if (c)
            return c;
    }
    return p->chunk < q->chunk ? -1 : p->chunk > q->chunk;
}

/* The chunks small enough to pack, in bundling order. */
static reshard_status_t candidates(const struct exec_cut *cut, const uint32_t *list, size_t n,
                                   int send, struct cand **out, size_t *nout)
{
    size_t ncand = 0, cap = 0;
    struct cand *c = NULL;
    for (size_t pos = 0; pos < n; pos++) {
        const struct xfer *xf = &cut->xs->x[list[pos]];
        if (!packable(cut, xf))
            continue;
        int64_t nchunks = exec_nchunks(cut, xf);
        for (uint32_t k = 0; k < (uint64_t)nchunks; k++) {
            uint64_t bytes = exec_chunk_bytes_of(cut, xf, k);
            if (bytes > (uint64_t)cut->coalesce_bytes)
                continue;
            struct cand *g = rs_grow(c, &cap, ncand + 1, sizeof(*c), "coalescing");
            if (!g) {
                free(c);
                return RESHARD_ERR_NO_MEMORY;
            }
            c = g;
            c[ncand++] =
                (struct cand){send ? xf->dst : xf->src, list[pos], (uint32_t)pos, k, bytes};
        }
    }
    if (ncand) /* qsort wants a real array, even of nothing */
        qsort_r(c, ncand, sizeof(*c), cmp_cand, (void *)cut);
    *out = c;
    *nout = ncand;
    return RESHARD_OK;
}

/* The greedy fill: a new bundle at each peer, and wherever the next piece would overflow a
 * chunk. Writes the bundles down when out is not NULL; returns how many there are. */
static size_t fill(const struct exec_cut *cut, const struct cand *c, size_t ncand,
                   const size_t *off, struct exec_bundles *out)
{
    size_t nb = 0;
    int32_t peer = -1;
    uint32_t id = 0;
    uint64_t bytes = 0;
    for (size_t i = 0; i < ncand; i++) {
        int fresh = !nb || peer != c[i].peer || bytes + c[i].bytes > (uint64_t)cut->chunk_bytes;
        if (fresh) {
            id = nb && peer == c[i].peer ? id + 1 : 0;
            peer = c[i].peer;
            bytes = 0;
            if (out)
                out->b[nb] = (struct exec_bundle){.peer = peer, .id = id, .first = (uint32_t)i};
            nb++;
        }
        bytes += c[i].bytes;
        if (!out)
            continue;
        out->b[nb - 1].n++;
        out->b[nb - 1].bytes = bytes;
        out->p[i] = (struct exec_piece){c[i].pos, c[i].chunk};
        out->bundled[off[c[i].pos] + c[i].chunk] = 1;
    }
    return nb;
}

reshard_status_t exec_bundles_build(const struct exec_cut *cut, const uint32_t *list, size_t n,
                                    const size_t *off, int send, struct exec_bundles *out)
{
    struct cand *c;
    size_t ncand;
    RS_CHECK(candidates(cut, list, n, send, &c, &ncand));
    struct exec_bundles b = {
        .b = rs_calloc(ncand + 1, sizeof(*b.b), "coalescing"),
        .p = rs_calloc(ncand + 1, sizeof(*b.p), "coalescing"),
        .bundled = rs_calloc(off[n] + 1, 1, "coalescing"),
    };
    if (!b.b || !b.p || !b.bundled) {
        exec_bundles_fini(&b);
        free(c);
        return RESHARD_ERR_NO_MEMORY;
    }
    b.n = fill(cut, c, ncand, off, &b);
    free(c);
    *out = b;
    return RESHARD_OK;
}

reshard_status_t exec_bundles_count(const struct exec_cut *cut, const uint32_t *list, size_t n,
                                    int send, size_t *nbundles, size_t *npieces)
{
    struct cand *c;
    size_t ncand;
    RS_CHECK(candidates(cut, list, n, send, &c, &ncand));
    *nbundles = fill(cut, c, ncand, NULL, NULL);
    *npieces = ncand;
    free(c);
    return RESHARD_OK;
}

void exec_bundles_fini(struct exec_bundles *b)
{
    free(b->b);
    free(b->p);
    free(b->bundled);
    *b = (struct exec_bundles){0};
}
