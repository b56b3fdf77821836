/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA driver API, loaded at run time (dlopen("libcuda.so.1")) so that the library builds
 * without CUDA and loads on hosts without a GPU. The few types and constants are declared here
 * from the driver API's documented ABI (no cuda.h at build time); functions come from dlsym
 * once per process, by their versioned symbol names where the API has several.
 */
#ifndef RS_CUDA_LIB_H
#define RS_CUDA_LIB_H

#include "base/reshard_status.h"

#include <stddef.h>
#include <stdint.h>

typedef int cu_result;         /* CUresult: 0 is CUDA_SUCCESS */
typedef uint64_t cu_deviceptr; /* CUdeviceptr */
typedef int cu_device;         /* CUdevice */
typedef struct cu_ctx *cu_ctx; /* CUcontext */
typedef struct cu_stream *cu_stream;
typedef struct cu_module *cu_module;
typedef struct cu_function *cu_function;
typedef struct cu_event *cu_event;

#define CU_IPC_HANDLE_SIZE 64
typedef struct cu_ipc_mem_handle {
    char reserved[CU_IPC_HANDLE_SIZE];
} cu_ipc_mem_handle; /* CUipcMemHandle: passed by value to cuIpcOpenMemHandle */

#define CU_SUCCESS         0
#define CU_ERROR_NO_DEVICE 100
#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE                                                           \
    2 /* CUmemorytype: 1 host, 2 device, 3 array, 4 unified                                        \
       */
#define CU_POINTER_ATTRIBUTE_CONTEXT        1 /* CUcontext */
#define CU_POINTER_ATTRIBUTE_IS_MANAGED     8
#define CU_POINTER_ATTRIBUTE_BUFFER_ID      7 /* unsigned long long: unique per allocation */
#define CU_MEMORYTYPE_HOST                  1
#define CU_MEMORYTYPE_DEVICE                2
#define CU_ERROR_NOT_READY                  600 /* cuEventQuery: the work is still running */
#define CU_STREAM_NON_BLOCKING              1
#define CU_EVENT_DISABLE_TIMING             2
#define CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS  1
#define CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD 1

/* CUDA_MEMCPY2D: a copy of `height` rows of `width` bytes between pitched memory. Types are
 * CUmemorytype (CU_MEMORYTYPE_HOST / _DEVICE); the array fields stay NULL. */
typedef struct cu_memcpy2d {
    size_t src_x_bytes, src_y;
    int src_type;
    const void *src_host;
    cu_deviceptr src_device;
    void *src_array;
    size_t src_pitch;
    size_t dst_x_bytes, dst_y;
    int dst_type;
    void *dst_host;
    cu_deviceptr dst_device;
    void *dst_array;
    size_t dst_pitch;
    size_t width_bytes, height;
} cu_memcpy2d;

/* X(field, symbol, return, parameters) */
#define CUDA_FN_MAP(X)                                                                             \
    X(init, "cuInit", cu_result, (unsigned flags))                                                 \
    X(get_error_string, "cuGetErrorString", cu_result, (cu_result err, const char **str))          \
    X(device_get_count, "cuDeviceGetCount", cu_result, (int *count))                               \
    X(device_get, "cuDeviceGet", cu_result, (cu_device * dev, int ordinal))                        \
    X(primary_ctx_retain, "cuDevicePrimaryCtxRetain", cu_result, (cu_ctx * ctx, cu_device dev))    \
    X(ctx_get_current, "cuCtxGetCurrent", cu_result, (cu_ctx * ctx))                               \
    X(ctx_set_current, "cuCtxSetCurrent", cu_result, (cu_ctx ctx))                                 \
    X(pointer_get_attribute, "cuPointerGetAttribute", cu_result,                                   \
      (void *data, int attribute, cu_deviceptr ptr))                                               \
    X(mem_alloc, "cuMemAlloc_v2", cu_result, (cu_deviceptr * ptr, size_t bytes))                   \
    X(mem_free, "cuMemFree_v2", cu_result, (cu_deviceptr ptr))                                     \
    X(memcpy_htod, "cuMemcpyHtoD_v2", cu_result, (cu_deviceptr dst, const void *src, size_t n))    \
    X(memcpy_dtoh, "cuMemcpyDtoH_v2", cu_result, (void *dst, cu_deviceptr src, size_t n))          \
    X(stream_synchronize, "cuStreamSynchronize", cu_result, (cu_stream stream))                    \
    X(ctx_synchronize, "cuCtxSynchronize", cu_result, (void))                                      \
    X(memcpy_dtod, "cuMemcpyDtoD_v2", cu_result, (cu_deviceptr dst, cu_deviceptr src, size_t n))   \
    X(module_load_data, "cuModuleLoadData", cu_result, (cu_module * mod, const void *image))       \
    X(module_get_function, "cuModuleGetFunction", cu_result,                                       \
      (cu_function * f, cu_module mod, const char *name))                                          \
    X(launch_kernel, "cuLaunchKernel", cu_result,                                                  \
      (cu_function f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,             \
       unsigned bz, unsigned shared, cu_stream stream, void **params, void **extra))               \
    X(mem_get_address_range, "cuMemGetAddressRange_v2", cu_result,                                 \
      (cu_deviceptr * base, size_t * size, cu_deviceptr ptr))                                      \
    X(ipc_get_mem_handle, "cuIpcGetMemHandle", cu_result, (cu_ipc_mem_handle * h, cu_deviceptr p)) \
    X(ipc_open_mem_handle, "cuIpcOpenMemHandle_v2", cu_result,                                     \
      (cu_deviceptr * p, cu_ipc_mem_handle h, unsigned flags))                                     \
    X(ipc_close_mem_handle, "cuIpcCloseMemHandle", cu_result, (cu_deviceptr p))                    \
    X(memcpy_async, "cuMemcpyAsync", cu_result,                                                    \
      (cu_deviceptr dst, cu_deviceptr src, size_t n, cu_stream stream))                            \
    X(memcpy_2d_async, "cuMemcpy2DAsync_v2", cu_result, (const cu_memcpy2d *p, cu_stream stream))  \
    X(memcpy_2d, "cuMemcpy2D_v2", cu_result, (const cu_memcpy2d *p))                               \
    X(stream_create, "cuStreamCreate", cu_result, (cu_stream * stream, unsigned flags))            \
    X(stream_destroy, "cuStreamDestroy_v2", cu_result, (cu_stream stream))                         \
    X(stream_get_ctx, "cuStreamGetCtx", cu_result, (cu_stream stream, cu_ctx * ctx))               \
    X(event_create, "cuEventCreate", cu_result, (cu_event * ev, unsigned flags))                   \
    X(event_record, "cuEventRecord", cu_result, (cu_event ev, cu_stream stream))                   \
    X(event_query, "cuEventQuery", cu_result, (cu_event ev))                                       \
    X(event_destroy, "cuEventDestroy_v2", cu_result, (cu_event ev))                                \
    X(mem_alloc_host, "cuMemAllocHost_v2", cu_result, (void **p, size_t bytes))                    \
    X(mem_free_host, "cuMemFreeHost", cu_result, (void *p))

/* The virtual memory management API (cuMemCreate allocations: PyTorch's expandable segments,
 * NCCL's buffers). CUmemGenericAllocationHandle, CUmemAllocationProp, CUmemAccessDesc. */
typedef unsigned long long cu_mem_handle;
#define CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR 0x1 /* exported as an int */
#define CU_MEM_HANDLE_TYPE_FABRIC                0x8 /* exported as 64 bytes */
#define CU_MEM_LOCATION_TYPE_DEVICE              1
#define CU_MEM_ACCESS_FLAGS_PROT_READWRITE       3
typedef struct cu_mem_location {
    int type, id;
} cu_mem_location;
typedef struct cu_mem_prop {
    int type;
    int requested_handle_types;
    cu_mem_location location;
    void *win32_metadata;
    struct {
        unsigned char compression, gpu_direct_rdma_capable;
        unsigned short usage;
        unsigned char reserved[4];
    } flags;
} cu_mem_prop;
typedef struct cu_mem_access {
    cu_mem_location location;
    int flags;
} cu_mem_access;

/* X(field, symbol, return, parameters): present since CUDA 10.2 or 11; looked up one by one,
 * and the path that needs them is skipped when one is missing. */
#define CUDA_VMM_FN_MAP(X)                                                                         \
    X(mem_retain_allocation_handle, "cuMemRetainAllocationHandle", cu_result,                      \
      (cu_mem_handle * h, void *addr))                                                             \
    X(mem_get_allocation_properties, "cuMemGetAllocationPropertiesFromHandle", cu_result,          \
      (cu_mem_prop * prop, cu_mem_handle h))                                                       \
    X(mem_export, "cuMemExportToShareableHandle", cu_result,                                       \
      (void *out, cu_mem_handle h, int type, unsigned long long flags))                            \
    X(mem_import, "cuMemImportFromShareableHandle", cu_result,                                     \
      (cu_mem_handle * h, void *os_handle, int type))                                              \
    X(mem_release, "cuMemRelease", cu_result, (cu_mem_handle h))                                   \
    X(mem_address_reserve, "cuMemAddressReserve", cu_result,                                       \
      (cu_deviceptr * p, size_t size, size_t align, cu_deviceptr addr, unsigned long long flags))  \
    X(mem_address_free, "cuMemAddressFree", cu_result, (cu_deviceptr p, size_t size))              \
    X(mem_map, "cuMemMap", cu_result,                                                              \
      (cu_deviceptr p, size_t size, size_t offset, cu_mem_handle h, unsigned long long flags))     \
    X(mem_unmap, "cuMemUnmap", cu_result, (cu_deviceptr p, size_t size))                           \
    X(mem_set_access, "cuMemSetAccess", cu_result,                                                 \
      (cu_deviceptr p, size_t size, const cu_mem_access *desc, size_t count))                      \
    X(ctx_get_device, "cuCtxGetDevice", cu_result, (cu_device * dev))

struct cuda_fns {
#define CUDA_FN_FIELD_(field, symbol, ret, params) ret(*field) params;
    CUDA_FN_MAP(CUDA_FN_FIELD_)
    CUDA_VMM_FN_MAP(CUDA_FN_FIELD_)
#undef CUDA_FN_FIELD_
    int has_vmm; /* every CUDA_VMM_FN_MAP entry was found */
    /* CUDA 11.3 and later; NULL before. */
    cu_result (*flush_gpu_direct_rdma_writes)(int target, int scope);
    /* CUDA 11.7 and later; NULL before (no dma-buf for GPUDirect RDMA). */
    cu_result (*get_handle_for_address_range)(void *handle, cu_deviceptr ptr, size_t size, int type,
                                              unsigned long long flags);
};

/* The driver, initialized (cuInit) with at least one device; NULL otherwise, with
 * RESHARD_ERR_UNAVAILABLE and why ("no CUDA device", "libcuda.so.1: cannot open ...") as the
 * thread's error. RESHARD_CUDA_LIB names another file (tests use it to hide the driver). */
const struct cuda_fns *cuda_lib(void);

/* Makes sure the calling thread has a current context: its own, else device 0's primary. */
reshard_status_t cuda_current_context(void);
/* Makes the network's writes into this context's memory (GPUDirect RDMA) visible to it
 * (cuFlushGPUDirectRDMAWrites, to the owner); nothing to do on drivers without it. */
reshard_status_t cuda_flush_rdma_writes(void);
/* A driver call's failure as a status and message: "cuMemAlloc: out of memory (2)". */
reshard_status_t cuda_error(const char *what, cu_result r);

/* ---- the pack and unpack kernels (pack.cu, embedded as a fatbin) ---- */

struct rs_pack_desc;
/* The fatbin built into this library: NULL (and *size 0) when it was built without nvcc. */
const unsigned char *cuda_fatbin(size_t *size);
/* Loads the kernels into the current context (once); RESHARD_ERR_UNAVAILABLE and why when
 * there is no driver, no device, or no fatbin. */
reshard_status_t cuda_kernels(void);
/* Gathers the box d describes from buf into packed (contiguous, box order), or the reverse;
 * both device pointers, enqueued on stream. */
reshard_status_t cuda_pack(const struct rs_pack_desc *d, const void *buf, void *packed,
                           cu_stream stream);
reshard_status_t cuda_unpack(const struct rs_pack_desc *d, void *buf, const void *packed,
                             cu_stream stream);
struct rs_quant_desc;
/* Quantizes the region d describes (pack_desc.h) from src into FP8 at dst with its block
 * scales at scales, as d->mode says; device pointers, enqueued on stream.
 * RESHARD_ERR_INVALID_ARG for a descriptor no kernel can run. */
reshard_status_t cuda_quant(const struct rs_quant_desc *d, const void *src, void *dst,
                            float *scales, cu_stream stream);

struct rs_delta_desc;
/* Compare-and-compact (delta_desc.h): encodes the chunk d->cur against its snapshot d->snap
 * into the message d->msg (the host codec's format), updates the snapshot, and writes which
 * encoding and its length to d->info; device pointers (d->words, d->cnt, d->starts scratch of
 * delta_desc.h's sizes), enqueued on stream. */
reshard_status_t cuda_delta_encode(const struct rs_delta_desc *d, cu_stream stream);
/* Applies a message of kind RS_DELTA_BITMAP or RS_DELTA_RUNS (d->nruns runs) that the host
 * checked (delta_check), at d->msg, to the packed chunk d->snap; d->cnt scratch. */
reshard_status_t cuda_delta_apply(const struct rs_delta_desc *d, int kind, cu_stream stream);

/* Host memory for staging: pinned (cuMemAllocHost) when the driver is there, so that copies
 * to and from the device run at the copy engines' speed; else malloc. cuda_host_pinned tells
 * which; cuda_host_free frees either kind. */
void *cuda_host_alloc(size_t bytes);
int cuda_host_pinned(const void *p);
void cuda_host_free(void *p);
/* Makes the context a device buffer was allocated in current (a process may drive several
 * GPUs); for memory the driver does not know, as cuda_current_context. */
reshard_status_t cuda_context_of(const void *dev);

enum cuda_mem_kind { CUDA_MEM_HOST, CUDA_MEM_PINNED, CUDA_MEM_DEVICE, CUDA_MEM_MANAGED };
/* What p points to: plain host memory when the driver is absent or does not know it. */
enum cuda_mem_kind cuda_mem_kind(const void *p);
const char *cuda_mem_kind_name(enum cuda_mem_kind k);

#endif
