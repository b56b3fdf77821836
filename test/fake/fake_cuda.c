/* SPDX-License-Identifier: Apache-2.0 */
/* libcuda.so.1's calls that reshard makes, for one pretend device whose memory is the host's
 * (pointer queries fail, so every pointer reads as host memory). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define API __attribute__((visibility("default")))

static int context;

API int cuInit(unsigned flags)
{
    (void)flags;
    return 0;
}

API int cuGetErrorString(int err, const char **s)
{
    *s = err ? "fake error" : "no error";
    return 0;
}

API int cuDeviceGetCount(int *n)
{
    *n = 1;
    return 0;
}

API int cuDeviceGet(int *dev, int ordinal)
{
    *dev = ordinal;
    return ordinal == 0 ? 0 : 101;
}

API int cuDevicePrimaryCtxRetain(void **ctx, int dev)
{
    (void)dev;
    *ctx = &context;
    return 0;
}

API int cuCtxGetCurrent(void **ctx)
{
    *ctx = NULL; /* so reshard retains and sets the primary one */
    return 0;
}

API int cuCtxSetCurrent(void *ctx)
{
    return ctx == &context ? 0 : 201;
}

API int cuPointerGetAttribute(void *data, int attr, uint64_t ptr)
{
    (void)data, (void)attr, (void)ptr;
    return 1; /* CUDA_ERROR_INVALID_VALUE: not the driver's memory */
}

API int cuMemAlloc_v2(uint64_t *p, size_t n)
{
    void *m = malloc(n ? n : 1);
    *p = (uint64_t)(uintptr_t)m;
    return m ? 0 : 2;
}

API int cuMemFree_v2(uint64_t p)
{
    free((void *)(uintptr_t)p);
    return 0;
}

API int cuMemcpyHtoD_v2(uint64_t dst, const void *src, size_t n)
{
    memcpy((void *)(uintptr_t)dst, src, n);
    return 0;
}

API int cuMemcpyDtoH_v2(void *dst, uint64_t src, size_t n)
{
    memcpy(dst, (const void *)(uintptr_t)src, n);
    return 0;
}

API int cuStreamSynchronize(void *stream)
{
    (void)stream;
    return 0;
}

API int cuCtxSynchronize(void)
{
    return 0;
}

API int cuMemcpyDtoD_v2(uint64_t dst, uint64_t src, size_t n)
{
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    return 0;
}

/* No kernels run on the pretend device. */
API int cuModuleLoadData(void **mod, const void *image)
{
    (void)mod, (void)image;
    return 200; /* CUDA_ERROR_INVALID_IMAGE */
}

API int cuModuleGetFunction(void **f, void *mod, const char *name)
{
    (void)f, (void)mod, (void)name;
    return 500; /* CUDA_ERROR_NOT_FOUND */
}

API int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                       unsigned bz, unsigned shared, void *stream, void **params, void **extra)
{
    (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shared;
    (void)stream, (void)params, (void)extra;
    return 98; /* CUDA_ERROR_INVALID_HANDLE */
}
