/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The NCCL network plugin ABI, declared by this project from NCCL's documented plugin
 * interface (docs/nccl.md): what every ncclNet_vN table shares. Names follow NCCL's so that a
 * reader who knows the ABI recognises them; only the plugin's NCCL boundary
 * (plugin/net/net_nccl.c, net_compat.c) and the tools that drive it include these headers.
 */
#ifndef RS_NCCL_NET_COMMON_H
#define RS_NCCL_NET_COMMON_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,   /* the network or the system failed */
    ncclInternalError = 3, /* the caller broke the contract */
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5, /* bad user configuration */
    ncclRemoteError = 6,
    ncclInProgress = 7,
} ncclResult_t;

typedef enum {
    NCCL_LOG_NONE = 0,
    NCCL_LOG_VERSION = 1,
    NCCL_LOG_WARN = 2,
    NCCL_LOG_INFO = 3,
    NCCL_LOG_ABORT = 4,
    NCCL_LOG_TRACE = 5,
} ncclDebugLogLevel;

/* Subsystem flags of a log line. */
enum { NCCL_INIT = 1, NCCL_NET = 16, NCCL_ENV = 128 };

typedef void (*ncclDebugLogger_t)(ncclDebugLogLevel level, unsigned long flags, const char *file,
                                  int line, const char *fmt, ...);

/* v10 and later hand the plugin a profiler callback; this plugin records no events. */
typedef ncclResult_t (*ncclProfilerCallback_t)(void **eHandle, int type, void *pHandle,
                                               int64_t pluginId, void *extData);

#define NCCL_NET_HANDLE_MAXSIZE 128
#define NCCL_NET_MAX_REQUESTS   32 /* outstanding requests per comm (per receive group) */

#define NCCL_PTR_HOST   0x1
#define NCCL_PTR_CUDA   0x2
#define NCCL_PTR_DMABUF 0x4

typedef enum {
    NCCL_NET_DEVICE_HOST = 0,
    NCCL_NET_DEVICE_UNPACK = 1,
} ncclNetDeviceType;

#define NCCL_NET_DEVICE_INVALID_VERSION 0x0

/* What connect/accept hand back for device-side networking; always NULL here (HOST). */
typedef struct {
    ncclNetDeviceType netDeviceType;
    int netDeviceVersion;
    void *handle;
    size_t size;
    int needsProxyProgress;
} ncclNetDeviceHandle_t;

_Static_assert(sizeof(ncclNetDeviceHandle_t) == 32, "device handle is 32 bytes");

#endif
