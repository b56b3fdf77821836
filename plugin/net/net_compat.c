/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ncclNetPlugin_v10 (NCCL 2.26, 2.27), _v9 (2.24, 2.25) and _v8 (2.20 to 2.23): thin adapters.
 * Those versions call init once per process, without a context and without finalize, so one
 * process-wide context serves them; sizes and properties are converted to each version's own
 * types. They do unload the plugin (dlclose) when their last communicator goes, so the
 * unload hook (legacy_unload) finalizes that context: with no comm left, everything is released,
 * and the next load starts afresh.
 */
#include "net_live.h"
#include "net_nccl.h"

#include "base/error.h"
#include "base/log.h"
#include "plugin/net/nccl/net_v10.h"
#include "plugin/net/nccl/net_v8.h"

#include <limits.h>
#include <pthread.h>
#include <stdlib.h>

static pthread_mutex_t legacy_lock = PTHREAD_MUTEX_INITIALIZER;
static void *legacy_ctx;
static int unload_hooked;
static pthread_once_t legacy_fork_once = PTHREAD_ONCE_INIT;

/* A child forked while another thread of its parent held legacy_lock (in an init, which may
 * take long) holds a copy that nobody will release: it starts with the lock free (the context
 * it names is the parent's, which legacy_init makes again in the child). */
static void legacy_fork_child(void)
{
    pthread_mutex_init(&legacy_lock, NULL);
}

static void legacy_hook_fork(void)
{
    if (pthread_atfork(NULL, NULL, legacy_fork_child) != 0)
        rs_log(RS_LOG_WARN, "NET/Reshard: pthread_atfork failed: a child forked during an init "
                            "may wait for ever in its own");
}

/* Runs at dlclose of this library, or at the process's exit, before any library's destructor
 * (an atexit handler of a shared object runs at whichever comes first, and the loader's own
 * handler, which calls the destructors, runs after it), so UCX and verbs are still whole.
 * With comms still open nothing of theirs is touched. */
static void legacy_unload(void)
{
    pthread_mutex_lock(&legacy_lock);
    if (legacy_ctx && net_finalize_idle(legacy_ctx) == RESHARD_OK)
        legacy_ctx = NULL;
    pthread_mutex_unlock(&legacy_lock);
}

static ncclResult_t legacy_init(ncclDebugLogger_t logger)
{
    net_use_logger(logger);
    reshard_status_t st = RESHARD_OK;
    pthread_once(&legacy_fork_once, legacy_hook_fork);
    pthread_mutex_lock(&legacy_lock);
    /* A forked child finds its parent's context here, which it may not use (net_dev.c). */
    if (!legacy_ctx || !net_live_get(legacy_ctx, NET_KINDS(NET_KIND_CTX), NULL))
        st = net_init(0, &legacy_ctx);
    if (st == RESHARD_OK && !unload_hooked) {
        if (atexit(legacy_unload) == 0)
            unload_hooked = 1;
        else
            rs_log(RS_LOG_INFO, "NET/Reshard: atexit refused the unload hook: an unload of the "
                                "plugin will not release its devices");
    }
    pthread_mutex_unlock(&legacy_lock);
    return net_result(st, "init");
}

static ncclResult_t v9_get_properties(int dev, ncclNetProperties_v9_t *props)
{
    ncclNetProperties_v12_t p;
    if (!props)
        return net_nccl_get_properties(dev, NULL);
    ncclResult_t r = net_nccl_get_properties(dev, &p);
    if (r != ncclSuccess)
        return r;
    *props = (ncclNetProperties_v9_t){
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
    };
    for (int i = 0; i < p.vProps.ndevs && i < NCCL_NET_MAX_DEVS_PER_NIC_V9; i++)
        props->vProps.devs[i] = p.vProps.devs[i];
    return ncclSuccess;
}

static ncclResult_t legacy_listen(int dev, void *handle, void **listen_comm)
{
    return net_result(net_listen(legacy_ctx, dev, handle, listen_comm), "listen");
}

static ncclResult_t legacy_connect(int dev, void *handle, void **send_comm,
                                   ncclNetDeviceHandle_t **dev_comm)
{
    if (dev_comm)
        *dev_comm = NULL;
    return net_result(net_connect(legacy_ctx, dev, handle, send_comm), "connect");
}

static ncclResult_t v9_isend(void *send_comm, void *data, size_t size, int tag, void *mh,
                             void **req)
{
    return net_result(net_isend(send_comm, data, size, tag, mh, req), "isend");
}

static ncclResult_t v9_irecv(void *recv_comm, int n, void **data, size_t *sizes, int *tags,
                             void **mhs, void **req)
{
    return net_result(net_irecv(recv_comm, n, data, sizes, tags, mhs, req), "irecv");
}

/* ---- v10 ---- */

static ncclResult_t v10_init(ncclDebugLogger_t logger, ncclProfilerCallback_t prof)
{
    (void)prof;
    return legacy_init(logger);
}

static ncclResult_t v10_connect(int dev, ncclNetCommConfig_v10_t *config, void *handle,
                                void **send_comm, ncclNetDeviceHandle_t **dev_comm)
{
    (void)config; /* the traffic class is not applied on the UCX path */
    return legacy_connect(dev, handle, send_comm, dev_comm);
}

static ncclResult_t v10_isend(void *send_comm, void *data, size_t size, int tag, void *mh,
                              void *phandle, void **req)
{
    (void)phandle;
    return v9_isend(send_comm, data, size, tag, mh, req);
}

static ncclResult_t v10_irecv(void *recv_comm, int n, void **data, size_t *sizes, int *tags,
                              void **mhs, void **phandles, void **req)
{
    (void)phandles;
    return v9_irecv(recv_comm, n, data, sizes, tags, mhs, req);
}

NET_EXPORT const ncclNet_v10_t ncclNetPlugin_v10 = {
    .name = NET_PLUGIN_NAME,
    .init = v10_init,
    .devices = net_nccl_devices,
    .getProperties = v9_get_properties,
    .listen = legacy_listen,
    .connect = v10_connect,
    .accept = net_nccl_accept,
    .regMr = net_nccl_reg_mr,
    .regMrDmaBuf = net_nccl_reg_mr_dmabuf,
    .deregMr = net_nccl_dereg_mr,
    .isend = v10_isend,
    .irecv = v10_irecv,
    .iflush = net_nccl_iflush,
    .test = net_nccl_test,
    .closeSend = net_nccl_close_send,
    .closeRecv = net_nccl_close_recv,
    .closeListen = net_nccl_close_listen,
    .getDeviceMr = NULL,   /* HOST devices: no device-side registrations */
    .irecvConsumed = NULL, /* host receives need no consumption notice (NCCL checks) */
    .makeVDevice = net_nccl_make_vdevice_v9,
};

/* ---- v9 ---- */

NET_EXPORT const ncclNet_v9_t ncclNetPlugin_v9 = {
    .name = NET_PLUGIN_NAME,
    .init = legacy_init,
    .devices = net_nccl_devices,
    .getProperties = v9_get_properties,
    .listen = legacy_listen,
    .connect = legacy_connect,
    .accept = net_nccl_accept,
    .regMr = net_nccl_reg_mr,
    .regMrDmaBuf = net_nccl_reg_mr_dmabuf,
    .deregMr = net_nccl_dereg_mr,
    .isend = v9_isend,
    .irecv = v9_irecv,
    .iflush = net_nccl_iflush,
    .test = net_nccl_test,
    .closeSend = net_nccl_close_send,
    .closeRecv = net_nccl_close_recv,
    .closeListen = net_nccl_close_listen,
    .getDeviceMr = NULL,   /* HOST devices: no device-side registrations */
    .irecvConsumed = NULL, /* host receives need no consumption notice (NCCL checks) */
    .makeVDevice = net_nccl_make_vdevice_v9,
};

/* ---- v8: int sizes ---- */

static ncclResult_t v8_get_properties(int dev, ncclNetProperties_v8_t *props)
{
    ncclNetProperties_v9_t p;
    if (!props)
        return v9_get_properties(dev, NULL);
    ncclResult_t r = v9_get_properties(dev, &p);
    if (r != ncclSuccess)
        return r;
    *props = (ncclNetProperties_v8_t){
        .name = p.name,
        .pciPath = p.pciPath,
        .guid = p.guid,
        .ptrSupport = p.ptrSupport,
        .regIsGlobal = p.regIsGlobal,
        .speed = p.speed,
        .port = p.port,
        .latency = p.latency,
        .maxComms = p.maxComms,
        .maxRecvs = p.maxRecvs,
        .netDeviceType = p.netDeviceType,
        .netDeviceVersion = p.netDeviceVersion,
    };
    return ncclSuccess;
}

static ncclResult_t v8_isend(void *send_comm, void *data, int size, int tag, void *mh, void **req)
{
    if (size < 0)
        return net_result(rs_error(RESHARD_ERR_INVALID_ARG, "NET/Reshard: isend of %d bytes", size),
                          "isend");
    return v9_isend(send_comm, data, (size_t)size, tag, mh, req);
}

static ncclResult_t v8_irecv(void *recv_comm, int n, void **data, int *sizes, int *tags, void **mhs,
                             void **req)
{
    size_t s[8];
    if (n < 1 || n > (int)(sizeof(s) / sizeof(s[0])) || !sizes)
        return v9_irecv(recv_comm, n, data, NULL, tags, mhs, req); /* reports the misuse */
    for (int i = 0; i < n; i++) {
        if (sizes[i] < 0)
            return net_result(
                rs_error(RESHARD_ERR_INVALID_ARG, "NET/Reshard: irecv of %d bytes", sizes[i]),
                "irecv");
        s[i] = (size_t)sizes[i];
    }
    return v9_irecv(recv_comm, n, data, s, tags, mhs, req);
}

NET_EXPORT const ncclNet_v8_t ncclNetPlugin_v8 = {
    .name = NET_PLUGIN_NAME,
    .init = legacy_init,
    .devices = net_nccl_devices,
    .getProperties = v8_get_properties,
    .listen = legacy_listen,
    .connect = legacy_connect,
    .accept = net_nccl_accept,
    .regMr = net_nccl_reg_mr,
    .regMrDmaBuf = net_nccl_reg_mr_dmabuf,
    .deregMr = net_nccl_dereg_mr,
    .isend = v8_isend,
    .irecv = v8_irecv,
    .iflush = net_nccl_iflush,
    .test = net_nccl_test,
    .closeSend = net_nccl_close_send,
    .closeRecv = net_nccl_close_recv,
    .closeListen = net_nccl_close_listen,
    .getDeviceMr = NULL,   /* HOST devices: no device-side registrations */
    .irecvConsumed = NULL, /* host receives need no consumption notice (NCCL checks) */
};
