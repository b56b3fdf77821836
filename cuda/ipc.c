/* SPDX-License-Identifier: Apache-2.0 */
#include "ipc.h"

#include "error.h"
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

reshard_status_t cuda_ipc_export(const void *dev, uint32_t tensor, struct cuda_ipc_export *e)
{
    const struct cuda_fns *f = cuda_lib();
    if (!f)
        return RESHARD_ERR_UNAVAILABLE;
    RS_CHECK(cuda_current_context());
    cu_deviceptr p = (cu_deviceptr)(uintptr_t)dev, base = 0;
    size_t bytes = 0;
    *e = (struct cuda_ipc_export){.tensor = tensor};
    cu_result r = f->mem_get_address_range(&base, &bytes, p);
    if (r != CU_SUCCESS)
        return cuda_error("cuMemGetAddressRange on a device destination buffer", r);
    if ((r = f->ipc_get_mem_handle(&e->handle, base)) != CU_SUCCESS)
        return cuda_error("cuIpcGetMemHandle on a device destination buffer", r);
    e->offset = p - base;
    e->bytes = bytes;
    return RESHARD_OK;
}

reshard_status_t cuda_ipc_get(struct cuda_ipc **ipc)
{
    if (*ipc)
        return RESHARD_OK;
    const struct cuda_fns *f = cuda_lib();
    if (!f)
        return RESHARD_ERR_UNAVAILABLE;
    RS_CHECK(cuda_current_context());
    struct cuda_ipc *c = rs_calloc(1, sizeof(*c), "CUDA IPC state");
    if (!c)
        return RESHARD_ERR_NO_MEMORY;
    cu_result r = f->stream_create(&c->stream, CU_STREAM_NON_BLOCKING);
    for (int i = 0; r == CU_SUCCESS && i < CUDA_IPC_EVENTS; i++)
        r = f->event_create(&c->ev[i], CU_EVENT_DISABLE_TIMING);
    if (r != CU_SUCCESS) {
        cuda_ipc_free(c);
        return cuda_error("creating the CUDA IPC stream and events", r);
    }
    *ipc = c;
    return RESHARD_OK;
}

reshard_status_t cuda_ipc_open(struct cuda_ipc_maps *ipc, int peer, const struct cuda_ipc_export *e,
                               char **ptr)
{
    for (size_t i = 0; i < ipc->nopen; i++) {
        const struct cuda_ipc_open *o = &ipc->open[i];
        if (o->peer == peer && !memcmp(&o->handle, &e->handle, sizeof(e->handle))) {
            *ptr = (char *)(uintptr_t)o->base + e->offset;
            return RESHARD_OK;
        }
    }
    struct cuda_ipc_open *n =
        rs_grow(ipc->open, &ipc->cap, ipc->nopen + 1, sizeof(*n), "CUDA IPC mappings");
    if (!n)
        return RESHARD_ERR_NO_MEMORY;
    ipc->open = n;
    cu_deviceptr base = 0;
    cu_result r =
        cuda_lib()->ipc_open_mem_handle(&base, e->handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    if (r != CU_SUCCESS) {
        char what[96];
        snprintf(what, sizeof(what),
                 "cuIpcOpenMemHandle of rank %d's buffer (RESHARD_CUDA_IPC=0 "
                 "stages instead)",
                 peer);
        return cuda_error(what, r);
    }
    n[ipc->nopen++] = (struct cuda_ipc_open){peer, e->handle, base, e->bytes};
    rs_log(RS_LOG_TRACE, "cuda ipc: opened rank %d's %llu-byte allocation", peer,
           (unsigned long long)e->bytes);
    *ptr = (char *)(uintptr_t)base + e->offset;
    return RESHARD_OK;
}

void cuda_ipc_prune(struct cuda_ipc_maps *ipc, int peer, const struct cuda_ipc_export *e, size_t n)
{
    size_t keep = 0;
    for (size_t i = 0; i < ipc->nopen; i++) {
        const struct cuda_ipc_open *o = &ipc->open[i];
        int live = o->peer != peer;
        for (size_t k = 0; !live && k < n; k++)
            live = !memcmp(&o->handle, &e[k].handle, sizeof(o->handle));
        if (live)
            ipc->open[keep++] = *o;
        else
            (void)cuda_lib()->ipc_close_mem_handle(o->base);
    }
    ipc->nopen = keep;
}

reshard_status_t cuda_ipc_scratch(struct cuda_ipc *ipc, int i, uint64_t bytes, cu_deviceptr *p)
{
    const struct cuda_fns *f = cuda_lib();
    if (bytes > ipc->scratch_bytes) {
        cu_result r = f->stream_synchronize(ipc->stream);
        for (int k = 0; k < CUDA_IPC_EVENTS; k++) {
            if (ipc->scratch[k])
                (void)f->mem_free(ipc->scratch[k]);
            ipc->scratch[k] = 0;
        }
        ipc->scratch_bytes = bytes;
        if (r != CU_SUCCESS)
            return cuda_error("cuStreamSynchronize before growing the IPC scratch", r);
    }
    if (!ipc->scratch[i]) {
        cu_result r = f->mem_alloc(&ipc->scratch[i], ipc->scratch_bytes);
        if (r != CU_SUCCESS)
            return cuda_error("cuMemAlloc of a CUDA IPC scratch buffer", r);
    }
    *p = ipc->scratch[i];
    return RESHARD_OK;
}

void cuda_ipc_free(struct cuda_ipc *ipc)
{
    if (!ipc)
        return;
    const struct cuda_fns *f = cuda_lib();
    if (ipc->stream)
        (void)f->stream_synchronize(ipc->stream);
    for (int i = 0; i < CUDA_IPC_EVENTS; i++) {
        if (ipc->ev[i])
            (void)f->event_destroy(ipc->ev[i]);
        if (ipc->scratch[i])
            (void)f->mem_free(ipc->scratch[i]);
    }
    if (ipc->stream)
        (void)f->stream_destroy(ipc->stream);
    free(ipc);
}

void cuda_ipc_close_all(struct cuda_ipc_maps *m)
{
    for (size_t i = 0; i < m->nopen; i++)
        (void)cuda_lib()->ipc_close_mem_handle(m->open[i].base);
    free(m->open);
    *m = (struct cuda_ipc_maps){0};
}
