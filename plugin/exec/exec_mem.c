/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Memory the executor keeps from one run to the next: the registrations of the caller's
 * buffers, the whole-tensor buffers of the broadcast baseline, and the host shadows of device
 * buffers. What they share is how they end: after a failed execution, transport requests may
 * still use the registrations and peers may still write into the buffers, so they go with the
 * communicator's network context instead of here.
 */
#include "exec_int.h"

#include "base/error.h"
#include "cuda/cuda_lib.h"

#include <stdlib.h>

/* ---- registrations ---- */

reshard_status_t exec_regs_init(struct exec_regs *g, int ntensors)
{
    *g = (struct exec_regs){.n = 2 * ntensors};
    g->host = rs_calloc((size_t)g->n, sizeof(*g->host), "registrations");
    return g->host ? RESHARD_OK : RESHARD_ERR_NO_MEMORY;
}

reshard_status_t exec_reg_one(struct tp_ctx *net, struct exec_reg *g, const void *addr, size_t len,
                              enum tp_mem mem, uint64_t id)
{
    if (g->addr == addr && g->len == len && g->id == id)
        return RESHARD_OK;
    net->ops->mem_dereg(net, g->mh);
    *g = (struct exec_reg){0};
    if (!addr || !len)
        return RESHARD_OK;
    RS_CHECK(net->ops->mem_reg(net, (void *)addr, len, mem, &g->mh));
    g->addr = addr;
    g->len = len;
    g->id = id;
    return RESHARD_OK;
}

static void dereg_all(struct exec_reg *regs, int n, struct reshard_comm *c)
{
    int broken = c->broken != RESHARD_OK;
    for (int i = 0; regs && i < n; i++)
        if (regs[i].mh && (!broken || !comm_keep_mh(c, regs[i].mh)))
            c->net->ops->mem_dereg(c->net, regs[i].mh);
}

void exec_regs_fini(struct exec_regs *g, struct reshard_comm *c)
{
    dereg_all(g->host, g->n, c);
    dereg_all(g->dev, g->n, c);
    free(g->host);
    free(g->dev);
    *g = (struct exec_regs){0};
}

/* ---- buffers peers may still write into ---- */

/* Frees a NULL-ended array of buffers and the array. */
static void free_bufs(void *p)
{
    char **buf = p;
    for (int i = 0; buf[i]; i++)
        free(buf[i]);
    free(buf);
}

/* The same for host shadows: pinned when the driver gave pinned memory. */
static void free_shadows(void *p)
{
    char **buf = p;
    for (int i = 0; buf[i]; i++)
        cuda_host_free(buf[i]);
    free(buf);
}

/* buf[n] (with room for one more) compacted so that NULL ends it, then freed with free_fn, or
 * kept by the communicator when a failed execution may still write into it (and leaked when
 * even that cannot be arranged: never freed under a writer). */
static void release(char **buf, int n, void (*free_fn)(void *), struct reshard_comm *c)
{
    if (!buf)
        return;
    int k = 0;
    for (int i = 0; i < n; i++)
        if (buf[i])
            buf[k++] = buf[i];
    buf[k] = NULL;
    if (c->broken == RESHARD_OK)
        free_fn(buf);
    else
        (void)comm_keep(c, free_fn, buf);
}

void exec_bufs_release(char **buf, int n, struct reshard_comm *c)
{
    release(buf, n, free_bufs, c);
}

reshard_status_t exec_tmp_alloc(struct exec_tmp *t, const struct rs_plan *plan,
                                const struct xfer_set *xs, int rank)
{
    if (!xs->needs_tmp)
        return RESHARD_OK;
    if (!t->buf &&
        !(t->buf = rs_calloc((size_t)plan->ntensors + 1, sizeof(char *), "tensor buffers")))
        return RESHARD_ERR_NO_MEMORY;
    /* Every buffer this rank uses, also after a run that could make only some of them. */
    for (size_t i = 0; i < xs->n; i++) {
        const struct xfer *xf = &xs->x[i];
        int mine = (xf->src == rank && xf->src_buf == XBUF_TMP) ||
                   (xf->dst == rank && xf->dst_buf == XBUF_TMP);
        if (!mine || t->buf[xf->tensor])
            continue;
        const struct rs_layout *l = &plan->tensors[xf->tensor].dst;
        size_t n = (size_t)layout_numel(l) * dtype_size(l->dtype);
        if (!(t->buf[xf->tensor] = rs_calloc(n ? n : 1, 1, "a whole-tensor buffer")))
            return RESHARD_ERR_NO_MEMORY;
    }
    return RESHARD_OK;
}

void exec_tmp_fini(struct exec_tmp *t, int ntensors, struct reshard_comm *c)
{
    release(t->buf, ntensors, free_bufs, c);
    t->buf = NULL;
}

reshard_status_t exec_shadows_stage(struct exec_shadows *s, int ntensors,
                                    const reshard_buffers_t *bufs, reshard_buffers_t *host)
{
    if (!s->buf) { /* both or neither, so that a later run never finds half of them */
        char **buf = rs_calloc(2 * (size_t)ntensors + 1, sizeof(char *), "staging");
        size_t *cap = buf ? rs_calloc(2 * (size_t)ntensors, sizeof(size_t), "staging") : NULL;
        if (!cap) {
            free(buf);
            return RESHARD_ERR_NO_MEMORY;
        }
        s->buf = buf;
        s->cap = cap;
    }
    for (int t = 0; t < ntensors; t++) {
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
            if (s->cap[i] < n) {
                cuda_host_free(s->buf[i]);
                s->cap[i] = 0;
                if (!(s->buf[i] = cuda_host_alloc(n)))
                    return rs_error(RESHARD_ERR_NO_MEMORY, "no memory to stage %zu bytes", n);
                s->cap[i] = n;
            }
            if (side)
                host[t].dst = s->buf[i];
            else
                host[t].src = s->buf[i];
        }
    }
    return RESHARD_OK;
}

void exec_shadows_fini(struct exec_shadows *s, int ntensors, struct reshard_comm *c)
{
    release(s->buf, 2 * ntensors, free_shadows, c);
    free(s->cap);
    *s = (struct exec_shadows){0};
}
