/* SPDX-License-Identifier: Apache-2.0 */
#include "cuda_lib.h"

#include "base/dl.h"
#include "base/error.h"

#include <stdio.h>
#include <stdlib.h>

static struct cuda_fns fns;

static const struct rs_dl_sym cuda_syms[] = {
    {"cuMemGetHandleForAddressRange", offsetof(struct cuda_fns, get_handle_for_address_range),
     RS_DL_OPTIONAL},
    {"cuFlushGPUDirectRDMAWrites", offsetof(struct cuda_fns, flush_gpu_direct_rdma_writes),
     RS_DL_OPTIONAL},
#define CUDA_SYM_(field, symbol, ret, params)                                                      \
    {symbol, offsetof(struct cuda_fns, field), RS_DL_REQUIRED},
    CUDA_FN_MAP(CUDA_SYM_)
#undef CUDA_SYM_
#define CUDA_VMM_SYM_(field, symbol, ret, params)                                                  \
    {symbol, offsetof(struct cuda_fns, field), RS_DL_OPTIONAL},
    /* clang-format off: it cannot see that the map above ends its rows with a comma */
    CUDA_VMM_FN_MAP(CUDA_VMM_SYM_)
/* clang-format on */
#undef CUDA_VMM_SYM_
};

/* The driver serves when cuInit finds a device; the VMM path needs all of its entries. */
static int cuda_ready(void *table, char *why, size_t cap)
{
    struct cuda_fns *f = table;
    f->has_vmm = 1;
#define CUDA_VMM_HAS_(field, symbol, ret, params) f->has_vmm &= f->field != NULL;
    CUDA_VMM_FN_MAP(CUDA_VMM_HAS_)
#undef CUDA_VMM_HAS_
    int n = 0;
    cu_result r = f->init(0);
    if (r == CU_SUCCESS)
        r = f->device_get_count(&n);
    if (r == CU_ERROR_NO_DEVICE || (r == CU_SUCCESS && n == 0)) {
        snprintf(why, cap, "cuda: no CUDA device");
        return -1;
    }
    if (r != CU_SUCCESS) {
        const char *s = NULL;
        f->get_error_string(r, &s);
        snprintf(why, cap, "cuda: cuInit: %s (%d)", s ? s : "?", r);
        return -1;
    }
    return 0;
}

static struct rs_dl cuda_dl = {
    .what = "cuda",
    .file = RS_PARAM_CUDA_LIB,
    .fallback = "libcuda.so.1",
    .open_prefix = "no driver: ",
    .syms = cuda_syms,
    .nsyms = sizeof(cuda_syms) / sizeof(cuda_syms[0]),
    .table = &fns,
    .table_size = sizeof(fns),
    .ready = cuda_ready,
};

const struct cuda_fns *cuda_lib(void)
{
    return rs_dl_load(&cuda_dl);
}

reshard_status_t cuda_current_context(void)
{
    const struct cuda_fns *f = cuda_lib();
    if (!f)
        return RESHARD_ERR_UNAVAILABLE;
    cu_ctx ctx = NULL;
    cu_device dev;
    cu_result r = f->ctx_get_current(&ctx);
    if (r == CU_SUCCESS && ctx)
        return RESHARD_OK;
    if (r == CU_SUCCESS)
        r = f->device_get(&dev, 0);
    if (r == CU_SUCCESS)
        r = f->primary_ctx_retain(&ctx, dev);
    if (r == CU_SUCCESS)
        r = f->ctx_set_current(ctx);
    return r == CU_SUCCESS ? RESHARD_OK : cuda_error("making a CUDA context current", r);
}

reshard_status_t cuda_flush_rdma_writes(void)
{
    const struct cuda_fns *f = cuda_lib();
    if (!f || !f->flush_gpu_direct_rdma_writes)
        return RESHARD_OK;
    cu_result r = f->flush_gpu_direct_rdma_writes(0 /* the current context */, 100 /* its owner */);
    return r == CU_SUCCESS ? RESHARD_OK : cuda_error("cuFlushGPUDirectRDMAWrites", r);
}

reshard_status_t cuda_error(const char *what, cu_result r)
{
    const char *s = NULL;
    if (fns.get_error_string)
        fns.get_error_string(r, &s);
    return rs_error(r == 2 ? RESHARD_ERR_NO_MEMORY : RESHARD_ERR_NETWORK, "cuda: %s: %s (%d)", what,
                    s ? s : "unknown error", r);
}

enum cuda_mem_kind cuda_mem_kind(const void *p)
{
    struct rs_saved_error saved;
    rs_error_save(&saved);
    const struct cuda_fns *f = cuda_lib();
    rs_error_restore(&saved); /* asking is not failing */
    unsigned type = 0, managed = 0;
    if (!f || !p ||
        f->pointer_get_attribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                 (cu_deviceptr)(uintptr_t)p) != CU_SUCCESS)
        return CUDA_MEM_HOST; /* unknown to the driver: ordinary host memory */
    (void)f->pointer_get_attribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                   (cu_deviceptr)(uintptr_t)p);
    if (managed)
        return CUDA_MEM_MANAGED;
    return type == CU_MEMORYTYPE_DEVICE ? CUDA_MEM_DEVICE : CUDA_MEM_PINNED;
}

const char *cuda_mem_kind_name(enum cuda_mem_kind k)
{
    static const char *const names[] = {"host", "pinned host", "device", "managed"};
    return (unsigned)k < 4 ? names[k] : "?";
}

/* Host allocations carry their kind in a header, so that freeing needs no driver query (the
 * context may be gone by then). 64 bytes keep the caller's pointer aligned. */
#define HOST_HEADER 64

void *cuda_host_alloc(size_t bytes)
{
    struct rs_saved_error saved;
    rs_error_save(&saved);
    const struct cuda_fns *f = cuda_lib();
    char *p = NULL;
    int pinned = f && cuda_current_context() == RESHARD_OK &&
                 f->mem_alloc_host((void **)&p, bytes + HOST_HEADER) == CU_SUCCESS;
    rs_error_restore(&saved); /* falling back is not failing */
    if (!pinned && !(p = malloc(bytes + HOST_HEADER)))
        return NULL;
    p[0] = (char)pinned;
    return p + HOST_HEADER;
}

int cuda_host_pinned(const void *p)
{
    return ((const char *)p)[-HOST_HEADER] != 0;
}

void cuda_host_free(void *p)
{
    if (!p)
        return;
    char *at = (char *)p - HOST_HEADER;
    if (cuda_host_pinned(p))
        (void)fns.mem_free_host(at); /* loaded: it made the allocation */
    else
        free(at);
}

reshard_status_t cuda_context_of(const void *dev)
{
    const struct cuda_fns *f = cuda_lib();
    if (!f)
        return RESHARD_ERR_UNAVAILABLE;
    cu_ctx mine = NULL, cur = NULL;
    if (f->pointer_get_attribute(&mine, CU_POINTER_ATTRIBUTE_CONTEXT,
                                 (cu_deviceptr)(uintptr_t)dev) != CU_SUCCESS ||
        !mine)
        return cuda_current_context(); /* not the driver's allocation: any context */
    if (f->ctx_get_current(&cur) == CU_SUCCESS && cur == mine)
        return RESHARD_OK;
    cu_result r = f->ctx_set_current(mine);
    return r == CU_SUCCESS ? RESHARD_OK : cuda_error("making a buffer's CUDA context current", r);
}
