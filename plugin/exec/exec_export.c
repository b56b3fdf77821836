/* SPDX-License-Identifier: Apache-2.0 */
/*
 * CUDA IPC exports: this rank's device destinations that local peers write directly, exported
 * once per buffer and allocation and kept across runs; they go to the local peers that write
 * them with the buffers' addresses (exec_link.c), when those change.
 */
#include "exec_int.h"

#include "base/error.h"
#include "base/log.h"
#include "base/param.h"
#include "cuda/cuda_lib.h"

#include <stdlib.h>
#include <string.h>

/* The per-tensor tables, made on the first run with device buffers: all or none, so that a run
 * after an allocation failed finds either. */
static reshard_status_t tables_init(struct exec_exports *e, size_t nt)
{
    if (e->cache)
        return RESHARD_OK;
    struct cuda_ipc_export *cache = rs_calloc(nt, sizeof(*cache), "CUDA IPC exports");
    uint8_t *live = cache ? rs_calloc(nt, 1, "CUDA IPC exports") : NULL;
    uint64_t *key = live ? rs_calloc(2 * nt, sizeof(*key), "CUDA IPC exports") : NULL;
    if (!key) {
        free(cache);
        free(live);
        return RESHARD_ERR_NO_MEMORY;
    }
    e->cache = cache;
    e->live = live;
    e->key = key;
    return RESHARD_OK;
}

/* Tensors whose destination a local peer writes here. */
static uint8_t *wanted_tensors(const struct exec *x)
{
    uint8_t *wanted = rs_calloc((size_t)x->plan->ntensors, 1, "CUDA IPC exports");
    for (size_t k = 0; wanted && k < x->share.nin; k++) {
        const struct xfer *xf = &x->xs.x[x->share.in[k]];
        if (xf->path == XFER_LOCAL && xf->dst_buf == XBUF_DST)
            wanted[xf->tensor] = 1;
    }
    return wanted;
}

/* An export is made again only when its buffer or allocation changed. */
reshard_status_t exec_exports_make(struct exec *x, const reshard_buffers_t *dev, uint32_t *n)
{
    struct exec_exports *e = &x->exp;
    size_t nt = (size_t)x->plan->ntensors;
    *n = 0;
    if (e->live)
        memset(e->live, 0, nt);
    if (!dev || !rs_param_int(RS_PARAM_CUDA_IPC))
        return RESHARD_OK;
    RS_CHECK(tables_init(e, nt));
    uint8_t *wanted = wanted_tensors(x);
    if (!wanted)
        return RESHARD_ERR_NO_MEMORY;
    const struct cuda_fns *f = cuda_lib(); /* there: dev was staged with it */
    struct rs_saved_error saved;
    rs_error_save(&saved);
    for (size_t t = 0; t < nt; t++) {
        const reshard_buffers_t *b = &dev[t];
        if (!wanted[t] || b->mem != RESHARD_MEM_CUDA || !b->dst || !b->dst_bytes)
            continue;
        uint64_t ptr = (uint64_t)(uintptr_t)b->dst, id = 0;
        if (f->pointer_get_attribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, ptr) != CU_SUCCESS)
            id = 0; /* unknown: export again every time */
        if (!id || e->key[2 * t] != ptr || e->key[2 * t + 1] != id) {
            cuda_ipc_unexport(&e->cache[t]); /* a descriptor it held */
            /* Not every allocation exports (cuMemCreate without a shareable handle,
             * stream-ordered pools): its writers then stage, and the first run says why. */
            if (cuda_ipc_export(b->dst, b->dst_bytes, (uint32_t)t, &e->cache[t]) != RESHARD_OK) {
                e->cache[t].tensor = UINT32_MAX;
                rs_log(e->refused++ ? RS_LOG_TRACE : RS_LOG_INFO,
                       "rank %d: tensor %s: local peers stage: %s", x->comm->rank,
                       x->plan->tensors[t].name, rs_error_message());
            }
            e->key[2 * t] = id ? ptr : 0;
            e->key[2 * t + 1] = id;
        }
        if (e->cache[t].tensor != UINT32_MAX) {
            e->live[t] = 1;
            (*n)++;
        }
    }
    rs_error_restore(&saved);
    free(wanted);
    return RESHARD_OK;
}

const struct cuda_ipc_export *exec_export_of(const struct exec *x, uint32_t t)
{
    const struct exec_exports *e = &x->exp;
    return e->live && e->live[t] ? &e->cache[t] : NULL;
}

void exec_exports_fini(struct exec_exports *e, int ntensors)
{
    for (int t = 0; e->cache && t < ntensors; t++)
        cuda_ipc_unexport(&e->cache[t]);
    free(e->cache);
    free(e->live);
    free(e->key);
    if (e->maps.nopen) /* no copy of this plan's is in flight: runs end after theirs */
        cuda_ipc_close_all(&e->maps);
    *e = (struct exec_exports){0};
}
