/* SPDX-License-Identifier: Apache-2.0 */
/* ncclNet_v12 (NCCL 2.30 and later): the v11 functions; properties with up to 8 devices per virtual
 * NIC and rail / plane ids. NCCL casts this table without an adapter, so every offset counts. */
#ifndef RS_NCCL_NET_V12_H
#define RS_NCCL_NET_V12_H

#include "net_v11.h"

#define NCCL_NET_MAX_DEVS_PER_NIC_V12 8
#define NCCL_NET_ID_UNDEF             (-1)

typedef struct {
    int ndevs;
    int devs[NCCL_NET_MAX_DEVS_PER_NIC_V12];
} ncclNetVDeviceProps_v12_t;

typedef ncclNetCommConfig_v11_t ncclNetCommConfig_v12_t;
typedef ncclNetAttr_v11_t ncclNetAttr_v12_t;

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
    ncclNetVDeviceProps_v12_t vProps;
    size_t maxP2pBytes;
    size_t maxCollBytes;
    int maxMultiRequestSize;
    int16_t railId;  /* NCCL_NET_ID_UNDEF: no rail constraint */
    int16_t planeId; /* NCCL_NET_ID_UNDEF: no plane constraint */
} ncclNetProperties_v12_t;

_Static_assert(offsetof(ncclNetProperties_v12_t, name) == 0, "v12 name at 0");
_Static_assert(offsetof(ncclNetProperties_v12_t, pciPath) == 8, "v12 pciPath at 8");
_Static_assert(offsetof(ncclNetProperties_v12_t, guid) == 16, "v12 guid at 16");
_Static_assert(offsetof(ncclNetProperties_v12_t, ptrSupport) == 24, "v12 ptrSupport at 24");
_Static_assert(offsetof(ncclNetProperties_v12_t, regIsGlobal) == 28, "v12 regIsGlobal at 28");
_Static_assert(offsetof(ncclNetProperties_v12_t, forceFlush) == 32, "v12 forceFlush at 32");
_Static_assert(offsetof(ncclNetProperties_v12_t, speed) == 36, "v12 speed at 36");
_Static_assert(offsetof(ncclNetProperties_v12_t, port) == 40, "v12 port at 40");
_Static_assert(offsetof(ncclNetProperties_v12_t, latency) == 44, "v12 latency at 44");
_Static_assert(offsetof(ncclNetProperties_v12_t, maxComms) == 48, "v12 maxComms at 48");
_Static_assert(offsetof(ncclNetProperties_v12_t, maxRecvs) == 52, "v12 maxRecvs at 52");
_Static_assert(offsetof(ncclNetProperties_v12_t, netDeviceType) == 56, "v12 device type at 56");
_Static_assert(offsetof(ncclNetProperties_v12_t, netDeviceVersion) == 60, "v12 version at 60");
_Static_assert(offsetof(ncclNetProperties_v12_t, vProps) == 64, "v12 vProps at 64");
_Static_assert(offsetof(ncclNetProperties_v12_t, maxP2pBytes) == 104, "v12 maxP2pBytes at 104");
_Static_assert(offsetof(ncclNetProperties_v12_t, maxCollBytes) == 112, "v12 maxCollBytes at 112");
_Static_assert(offsetof(ncclNetProperties_v12_t, maxMultiRequestSize) == 120,
               "v12 maxMultiRequestSize at 120");
_Static_assert(offsetof(ncclNetProperties_v12_t, railId) == 124, "v12 railId at 124");
_Static_assert(offsetof(ncclNetProperties_v12_t, planeId) == 126, "v12 planeId at 126");
_Static_assert(sizeof(ncclNetProperties_v12_t) == 128, "v12 properties are 128 bytes");

typedef struct {
    const char *name;
    ncclResult_t (*init)(void **ctx, uint64_t commId, ncclNetCommConfig_v12_t *config,
                         ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction);
    ncclResult_t (*devices)(int *ndev);
    ncclResult_t (*getProperties)(int dev, ncclNetProperties_v12_t *props);
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
    ncclResult_t (*makeVDevice)(int *d, ncclNetVDeviceProps_v12_t *props);
    ncclResult_t (*finalize)(void *ctx);
    ncclResult_t (*setNetAttr)(void *ctx, ncclNetAttr_v12_t *netAttr);
} ncclNet_v12_t;

_Static_assert(sizeof(ncclNet_v12_t) == 22 * sizeof(void *), "v12: name and 21 functions");

#endif
