/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA driver API, loaded at run time (dlopen("libcuda.so.1")) so that the library builds
 * without CUDA and loads on hosts without a GPU. The few types and constants are declared here
 * from the driver API's documented ABI (no cuda.h at build time); functions come from dlsym
 * once per process, by their versioned symbol names where the API has several.
 */
#ifndef RS_CUDA_LIB_H
#define RS_CUDA_LIB_H

#include "reshard_status.h"

#include <stddef.h>
#include <stdint.h>

typedef int cu_result;         /* CUresult: 0 is CUDA_SUCCESS */
typedef uint64_t cu_deviceptr; /* CUdeviceptr */
typedef int cu_device;         /* CUdevice */
typedef struct cu_ctx *cu_ctx; /* CUcontext */
typedef struct cu_stream *cu_stream;
typedef struct cu_module *cu_module;
typedef struct cu_function *cu_function;

#define CU_SUCCESS         0
#define CU_ERROR_NO_DEVICE 100
#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE                                                           \
    2 /* CUmemorytype: 1 host, 2 device, 3 array, 4 unified                                        \
       */
#define CU_POINTER_ATTRIBUTE_IS_MANAGED 8
#define CU_MEMORYTYPE_HOST              1
#define CU_MEMORYTYPE_DEVICE            2

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
       unsigned bz, unsigned shared, cu_stream stream, void **params, void **extra))

struct cuda_fns {
#define CUDA_FN_FIELD_(field, symbol, ret, params) ret(*field) params;
    CUDA_FN_MAP(CUDA_FN_FIELD_)
#undef CUDA_FN_FIELD_
};

/* The driver, initialized (cuInit) with at least one device; NULL otherwise, with
 * RESHARD_ERR_UNAVAILABLE and why ("no CUDA device", "libcuda.so.1: cannot open ...") as the
 * thread's error. RESHARD_CUDA_LIB names another file (tests use it to hide the driver). */
const struct cuda_fns *cuda_lib(void);

/* Makes sure the calling thread has a current context: its own, else device 0's primary. */
reshard_status_t cuda_current_context(void);
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

enum cuda_mem_kind { CUDA_MEM_HOST, CUDA_MEM_PINNED, CUDA_MEM_DEVICE, CUDA_MEM_MANAGED };
/* What p points to: plain host memory when the driver is absent or does not know it. */
enum cuda_mem_kind cuda_mem_kind(const void *p);
const char *cuda_mem_kind_name(enum cuda_mem_kind k);

#endif
