/* SPDX-License-Identifier: Apache-2.0 */
/* ncclNet_v11 (NCCL 2.28, 2.29): init once per communicator with a context that listen,
 * connect, finalize and setNetAttr take; maxMultiRequestSize in the properties. */
#ifndef RS_NCCL_NET_V11_H
#define RS_NCCL_NET_V11_H

#include "net_v10.h"

typedef ncclNetVDeviceProps_v9_t ncclNetVDeviceProps_v11_t;
typedef ncclNetCommConfig_v10_t ncclNetCommConfig_v11_t;

typedef struct {
    char *name;
    char *pciPath;
    uint64_t guid;
    int ptrSupport;
    int regIsGlobal;
    int forceFlush;
    int speed; /* Mbps */
    int port;
    float latency; /* us */
    int maxComms;
    int maxRecvs;
    ncclNetDeviceType netDeviceType;
    int netDeviceVersion;
    ncclNetVDeviceProps_v11_t vProps;
    size_t maxP2pBytes;
    size_t maxCollBytes;
    int maxMultiRequestSize;
} ncclNetProperties_v11_t;

_Static_assert(offsetof(ncclNetProperties_v11_t, speed) == 36, "v11 speed at 36");
_Static_assert(offsetof(ncclNetProperties_v11_t, vProps) == 64, "v11 vProps at 64");
_Static_assert(offsetof(ncclNetProperties_v11_t, maxP2pBytes) == 88, "v11 maxP2pBytes at 88");
_Static_assert(offsetof(ncclNetProperties_v11_t, maxMultiRequestSize) == 104,
               "v11 maxMultiRequestSize at 104");
_Static_assert(sizeof(ncclNetProperties_v11_t) == 112, "v11 properties are 112 bytes");

/* Hints NCCL may pass through setNetAttr; -1 is "unset". */
typedef struct {
    int32_t maxConcurrentPeers, minConcurrentPeers, maxFlowsPerPeer, minFlowsPerPeer;
} ncclNetCommAttr_v11_t;

typedef struct {
    ncclNetCommAttr_v11_t sendCommAttr, recvCommAttr;
    uint32_t op, algo, proto;
} ncclNetAttr_v11_t;

_Static_assert(sizeof(ncclNetAttr_v11_t) == 44, "v11 net attributes are 44 bytes");

typedef struct {
    const char *name;
    ncclResult_t (*init)(void **ctx, uint64_t commId, ncclNetCommConfig_v11_t *config,
                         ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction);
    ncclResult_t (*devices)(int *ndev);
    ncclResult_t (*getProperties)(int dev, ncclNetProperties_v11_t *props);
    ncclResult_t (*listen)(void *ctx, int dev, void *handle, void **listenComm);
    ncclResult_t (*connect)(void *ctx, int dev, void *handle, void **sendComm,
                            ncclNetDeviceHandle_t **sendDevComm);
    ncclResult_t (*accept)(void *listenComm, void **recvComm, ncclNetDeviceHandle_t **recvDevComm);
    ncclResult_t (*regMr)(void *comm, void *data, size_t size, int type, void **mhandle);
    ncclResult_t (*regMrDmaBuf)(void *comm, void *data, size_t size, int type, uint64_t offset,
                                int fd, void **mhandle);
    ncclResult_t (*deregMr)(void *comm, void *mhandle);
    ncclResult_t (*isend)(void *sendComm, void *data, size_t size, int tag, void *mhandle,
                          void *phandle, void **request);
    ncclResult_t (*irecv)(void *recvComm, int n, void **data, size_t *sizes, int *tags,
                          void **mhandles, void **phandles, void **request);
    ncclResult_t (*iflush)(void *recvComm, int n, void **data, int *sizes, void **mhandles,
                           void **request);
    ncclResult_t (*test)(void *request, int *done, int *sizes);
    ncclResult_t (*closeSend)(void *sendComm);
    ncclResult_t (*closeRecv)(void *recvComm);
    ncclResult_t (*closeListen)(void *listenComm);
    ncclResult_t (*getDeviceMr)(void *comm, void *mhandle, void **dptr_mhandle);
    ncclResult_t (*irecvConsumed)(void *recvComm, int n, void *request);
    ncclResult_t (*makeVDevice)(int *d, ncclNetVDeviceProps_v11_t *props);
    ncclResult_t (*finalize)(void *ctx);
    ncclResult_t (*setNetAttr)(void *ctx, ncclNetAttr_v11_t *netAttr);
} ncclNet_v11_t;

_Static_assert(sizeof(ncclNet_v11_t) == 22 * sizeof(void *), "v11: name and 21 functions");

#endif
