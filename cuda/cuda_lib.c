/* SPDX-License-Identifier: Apache-2.0 */
#include "cuda_lib.h"

#include "base/error.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static struct cuda_fns fns;
static reshard_status_t load_status = RESHARD_ERR_UNAVAILABLE;
static char load_error[256];
static pthread_once_t load_once = PTHREAD_ONCE_INIT;

static void load(void)
{
    const char *file = getenv("RESHARD_CUDA_LIB");
    if (!file || !*file)
        file = "libcuda.so.1";
    void *h = dlopen(file, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(load_error, sizeof(load_error), "cuda: no driver: %s", dlerror());
        return;
    }
#define CUDA_FN_LOAD_(field, symbol, ret, params)                                                  \
    if (!(*(void **)&fns.field = dlsym(h, symbol))) {                                              \
        snprintf(load_error, sizeof(load_error), "cuda: %s lacks %s", file, symbol);               \
        return;                                                                                    \
    }
    CUDA_FN_MAP(CUDA_FN_LOAD_)
#undef CUDA_FN_LOAD_
    *(void **)&fns.get_handle_for_address_range = dlsym(h, "cuMemGetHandleForAddressRange");
    *(void **)&fns.flush_gpu_direct_rdma_writes = dlsym(h, "cuFlushGPUDirectRDMAWrites");
    fns.has_vmm = 1;
#define CUDA_VMM_LOAD_(field, symbol, ret, params)                                                 \
    fns.has_vmm &= (*(void **)&fns.field = dlsym(h, symbol)) != NULL;
    CUDA_VMM_FN_MAP(CUDA_VMM_LOAD_)
#undef CUDA_VMM_LOAD_
    int n = 0;
    cu_result r = fns.init(0);
    if (r == CU_SUCCESS)
        r = fns.device_get_count(&n);
    if (r == CU_ERROR_NO_DEVICE || (r == CU_SUCCESS && n == 0)) {
        snprintf(load_error, sizeof(load_error), "cuda: no CUDA device");
        return;
    }
    if (r != CU_SUCCESS) {
        const char *s = NULL;
        fns.get_error_string(r, &s);
        snprintf(load_error, sizeof(load_error), "cuda: cuInit: %s (%d)", s ? s : "?", r);
        return;
    }
    load_status = RESHARD_OK;
}

const struct cuda_fns *cuda_lib(void)
{
    pthread_once(&load_once, load);
    if (load_status != RESHARD_OK) {
        rs_error(load_status, "%s", load_error);
        return NULL;
    }
    return &fns;
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
