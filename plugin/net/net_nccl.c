/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The NCCL boundary: ncclNetPlugin_v12, the newest table, over the native functions of net.h,
 * and ncclNetPlugin_v11, which differs only in its properties struct. Statuses become
 * ncclResult_t in net_result alone. The older tables are adapters in net_compat.c.
 */
#include "net_nccl.h"

#include "base/error.h"
#include "base/log.h"
#include "plugin/net/nccl/net_v12.h"

#include <stdatomic.h>
#include <string.h>

static ncclDebugLogger_t _Atomic nccl_logger;

/* NCCL prints the file and line of WARN and TRACE lines: the ones that logged them. */
static void to_nccl(enum rs_log_level level, unsigned long flags, const char *msg)
{
    ncclDebugLogger_t log = nccl_logger;
    const char *file;
    int line;
    rs_log_origin(&file, &line);
    if (log)
        log((ncclDebugLogLevel)level, flags, file, line, "%s", msg);
}

void net_use_logger(ncclDebugLogger_t logger)
{
    if (!logger)
        return;
    nccl_logger = logger;
    rs_log_set_sink(to_nccl);
}

ncclResult_t net_result(reshard_status_t st, const char *call)
{
    if (st == RESHARD_OK)
        return ncclSuccess;
    const char *file; /* the line says where the failure was seen, not where it is reported */
    int line;
    rs_error_origin(&file, &line);
    if (*rs_error_message())
        rs_log_at(file, line, RS_LOG_WARN, RS_LOGF_NET, "%s failed: %s", call, rs_error_message());
    else
        rs_log(RS_LOG_WARN, "%s failed: %s", call, rs_status_string(st));
    switch (st) {
    case RESHARD_ERR_NETWORK:
    case RESHARD_ERR_TIMEOUT:
    case RESHARD_ERR_REFUSED:
    case RESHARD_ERR_REMOTE:
    case RESHARD_ERR_NO_MEMORY:
        return ncclSystemError;
    case RESHARD_ERR_UNAVAILABLE: /* the installation or environment does not allow it */
        return ncclInvalidUsage;
    case RESHARD_ERR_BUFFER: /* memory that is not what the call says, or past its registration */
        return ncclInvalidArgument;
    default: /* the caller broke the plugin contract */
        return ncclInternalError;
    }
}

/* ---- functions whose signature every version shares ---- */

ncclResult_t net_nccl_devices(int *ndev)
{
    if (!ndev)
        return net_result(rs_error(RESHARD_ERR_INVALID_ARG, "NET/Reshard: devices(NULL)"),
                          "devices");
    return net_result(net_devices(ndev), "devices");
}

ncclResult_t net_nccl_accept(void *listen_comm, void **recv_comm, ncclNetDeviceHandle_t **dev)
{
    if (dev)
        *dev = NULL; /* netDeviceType HOST: no device-side handle */
    return net_result(net_accept(listen_comm, recv_comm), "accept");
}

ncclResult_t net_nccl_reg_mr(void *comm, void *data, size_t size, int type, void **mh)
{
    return net_result(net_reg_mr(comm, data, size, type, mh), "regMr");
}

ncclResult_t net_nccl_reg_mr_dmabuf(void *comm, void *data, size_t size, int type, uint64_t offset,
                                    int fd, void **mh)
{
    return net_result(net_reg_mr_dmabuf(comm, data, size, type, offset, fd, mh), "regMrDmaBuf");
}

ncclResult_t net_nccl_dereg_mr(void *comm, void *mh)
{
    return net_result(net_dereg_mr(comm, mh), "deregMr");
}

ncclResult_t net_nccl_iflush(void *recv_comm, int n, void **data, int *sizes, void **mhs,
                             void **req)
{
    return net_result(net_iflush(recv_comm, n, data, sizes, mhs, req), "iflush");
}

ncclResult_t net_nccl_test(void *req, int *done, int *sizes)
{
    return net_result(net_test(req, done, sizes), "test");
}

ncclResult_t net_nccl_close_send(void *comm)
{
    return net_result(net_close_send(comm), "closeSend");
}

ncclResult_t net_nccl_close_recv(void *comm)
{
    return net_result(net_close_recv(comm), "closeRecv");
}

ncclResult_t net_nccl_close_listen(void *comm)
{
    return net_result(net_close_listen(comm), "closeListen");
}

/* ---- v12 ---- */

static ncclResult_t v12_init(void **ctx, uint64_t comm_id, ncclNetCommConfig_v12_t *config,
                             ncclDebugLogger_t logger, ncclProfilerCallback_t prof)
{
    (void)prof; /* this plugin records no profiler events */
    net_use_logger(logger);
    if (!ctx)
        return net_result(rs_error(RESHARD_ERR_INVALID_ARG, "NET/Reshard: init without a context "
                                                            "pointer"),
                          "init");
    if (config && config->trafficClass != NCCL_NET_TRAFFIC_CLASS_UNDEF)
        rs_log(RS_LOG_INFO, "NET/Reshard: traffic class %d is not applied on the UCX path",
               config->trafficClass);
    void *c = NULL;
    ncclResult_t r = net_result(net_init(comm_id, &c), "init");
    if (r == ncclSuccess)
        *ctx = c;
    return r;
}

ncclResult_t net_nccl_get_properties(int dev, ncclNetProperties_v12_t *props)
{
    struct net_props p;
    if (!props)
        return net_result(rs_error(RESHARD_ERR_INVALID_ARG, "NET/Reshard: getProperties(NULL)"),
                          "getProperties");
    reshard_status_t st = net_properties(dev, &p);
    if (st != RESHARD_OK)
        return net_result(st, "getProperties");
    *props = (ncclNetProperties_v12_t){
        .name = (char *)p.name,
        .pciPath = (char *)p.pci_path,
        .guid = p.guid,
        .ptrSupport = p.ptr_support,
        .speed = p.speed_mbps,
        .port = p.port,
        .latency = p.latency_us,
        .maxComms = p.max_comms,
        .maxRecvs = p.max_recvs,
        .netDeviceType = NCCL_NET_DEVICE_HOST,
        .netDeviceVersion = NCCL_NET_DEVICE_INVALID_VERSION,
        .vProps = {.ndevs = p.ndevs},
        .maxP2pBytes = p.max_p2p_bytes,
        .maxCollBytes = p.max_coll_bytes,
        .maxMultiRequestSize = 1,
        .railId = (int16_t)p.rail_id, /* -1 is NCCL_NET_ID_UNDEF */
        .planeId = (int16_t)p.plane_id,
    };
    for (int i = 0; i < p.ndevs && i < NCCL_NET_MAX_DEVS_PER_NIC_V12; i++)
        props->vProps.devs[i] = p.devs[i];
    return ncclSuccess;
}

static ncclResult_t net_nccl_make_vdevice(int *d, int ndevs, const int *devs, int max)
{
    if (!d)
        return net_result(rs_error(RESHARD_ERR_INVALID_ARG, "NET/Reshard: makeVDevice(NULL)"),
                          "makeVDevice");
    return net_result(net_make_vdevice(devs, ndevs, max, d), "makeVDevice");
}

static ncclResult_t v12_make_vdevice(int *d, ncclNetVDeviceProps_v12_t *props)
{
    return net_nccl_make_vdevice(d, props ? props->ndevs : 0, props ? props->devs : NULL,
                                 NCCL_NET_MAX_DEVS_PER_NIC_V12);
}

ncclResult_t net_nccl_make_vdevice_v9(int *d, ncclNetVDeviceProps_v9_t *props)
{
    return net_nccl_make_vdevice(d, props ? props->ndevs : 0, props ? props->devs : NULL,
                                 NCCL_NET_MAX_DEVS_PER_NIC_V9);
}

static ncclResult_t v12_listen(void *ctx, int dev, void *handle, void **listen_comm)
{
    return net_result(net_listen(ctx, dev, handle, listen_comm), "listen");
}

static ncclResult_t v12_connect(void *ctx, int dev, void *handle, void **send_comm,
                                ncclNetDeviceHandle_t **dev_comm)
{
    if (dev_comm)
        *dev_comm = NULL;
    return net_result(net_connect(ctx, dev, handle, send_comm), "connect");
}

static ncclResult_t v12_isend(void *send_comm, void *data, size_t size, int tag, void *mh,
                              void *phandle, void **req)
{
    (void)phandle;
    return net_result(net_isend(send_comm, data, size, tag, mh, req), "isend");
}

static ncclResult_t v12_irecv(void *recv_comm, int n, void **data, size_t *sizes, int *tags,
                              void **mhs, void **phandles, void **req)
{
    (void)phandles;
    return net_result(net_irecv(recv_comm, n, data, sizes, tags, mhs, req), "irecv");
}

static ncclResult_t v12_finalize(void *ctx)
{
    return net_result(net_finalize(ctx), "finalize");
}

static ncclResult_t v12_set_net_attr(void *ctx, ncclNetAttr_v12_t *attr)
{
    reshard_status_t st = net_ctx_check(ctx);
    if (st == RESHARD_OK && attr)
        rs_log(RS_LOG_TRACE, "NET/Reshard: setNetAttr op %#x algo %#x proto %#x (hints unused)",
               attr->op, attr->algo, attr->proto);
    return net_result(st, "setNetAttr");
}

NET_EXPORT const ncclNet_v12_t ncclNetPlugin_v12 = {
    .name = NET_PLUGIN_NAME,
    .init = v12_init,
    .devices = net_nccl_devices,
    .getProperties = net_nccl_get_properties,
    .listen = v12_listen,
    .connect = v12_connect,
    .accept = net_nccl_accept,
    .regMr = net_nccl_reg_mr,
    .regMrDmaBuf = net_nccl_reg_mr_dmabuf,
    .deregMr = net_nccl_dereg_mr,
    .isend = v12_isend,
    .irecv = v12_irecv,
    .iflush = net_nccl_iflush,
    .test = net_nccl_test,
    .closeSend = net_nccl_close_send,
    .closeRecv = net_nccl_close_recv,
    .closeListen = net_nccl_close_listen,
    .getDeviceMr = NULL,   /* HOST devices: no device-side registrations */
    .irecvConsumed = NULL, /* host receives need no consumption notice (NCCL checks) */
    .makeVDevice = v12_make_vdevice,
    .finalize = v12_finalize,
    .setNetAttr = v12_set_net_attr,
};

/* ---- v11: the same functions, with the v11 properties ---- */

static ncclResult_t v11_get_properties(int dev, ncclNetProperties_v11_t *props)
{
    ncclNetProperties_v12_t p;
    if (!props)
        return net_nccl_get_properties(dev, NULL);
    ncclResult_t r = net_nccl_get_properties(dev, &p);
    if (r != ncclSuccess)
        return r;
    *props = (ncclNetProperties_v11_t){
        .name = p.name,
        .pciPath = p.pciPath,
        .guid = p.guid,
        .ptrSupport = p.ptrSupport,
        .regIsGlobal = p.regIsGlobal,
        .forceFlush = p.forceFlush,
        .speed = p.speed,
        .port = p.port,
        .latency = p.latency,
        .maxComms = p.maxComms,
        .maxRecvs = p.maxRecvs,
        .netDeviceType = p.netDeviceType,
        .netDeviceVersion = p.netDeviceVersion,
        .vProps = {.ndevs = p.vProps.ndevs},
        .maxP2pBytes = p.maxP2pBytes,
        .maxCollBytes = p.maxCollBytes,
        .maxMultiRequestSize = p.maxMultiRequestSize,
    };
    for (int i = 0; i < p.vProps.ndevs && i < NCCL_NET_MAX_DEVS_PER_NIC_V9; i++)
        props->vProps.devs[i] = p.vProps.devs[i];
    return ncclSuccess;
}

NET_EXPORT const ncclNet_v11_t ncclNetPlugin_v11 = {
    .name = NET_PLUGIN_NAME,
    .init = v12_init,
    .devices = net_nccl_devices,
    .getProperties = v11_get_properties,
    .listen = v12_listen,
    .connect = v12_connect,
    .accept = net_nccl_accept,
    .regMr = net_nccl_reg_mr,
    .regMrDmaBuf = net_nccl_reg_mr_dmabuf,
    .deregMr = net_nccl_dereg_mr,
    .isend = v12_isend,
    .irecv = v12_irecv,
    .iflush = net_nccl_iflush,
    .test = net_nccl_test,
    .closeSend = net_nccl_close_send,
    .closeRecv = net_nccl_close_recv,
    .closeListen = net_nccl_close_listen,
    .getDeviceMr = NULL,
    .irecvConsumed = NULL,
    .makeVDevice = net_nccl_make_vdevice_v9,
    .finalize = v12_finalize,
    .setNetAttr = v12_set_net_attr,
};
