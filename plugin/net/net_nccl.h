/* SPDX-License-Identifier: Apache-2.0 */
/* The NCCL boundary shared by every ncclNet_vN table (net_nccl.c, net_compat.c). */
#ifndef RS_NET_NCCL_H
#define RS_NET_NCCL_H

#include "net.h"
#include "plugin/net/nccl/net_v12.h"

#define NET_PLUGIN_NAME "Reshard"
#define NET_EXPORT      __attribute__((visibility("default")))

/* The one mapping from a status to ncclResult_t; a failure is logged here, once, at WARN. */
ncclResult_t net_result(reshard_status_t st, const char *call);
/* Sends this library's log lines to NCCL's logger (NULL keeps stderr). */
void net_use_logger(ncclDebugLogger_t logger);

/* Functions every version shares, with the NCCL signatures they have in all of them. */
ncclResult_t net_nccl_devices(int *ndev);
/* The newest properties; each older version's are converted from them. */
ncclResult_t net_nccl_get_properties(int dev, ncclNetProperties_v12_t *props);
ncclResult_t net_nccl_accept(void *listen_comm, void **recv_comm, ncclNetDeviceHandle_t **dev);
ncclResult_t net_nccl_reg_mr(void *comm, void *data, size_t size, int type, void **mh);
ncclResult_t net_nccl_reg_mr_dmabuf(void *comm, void *data, size_t size, int type, uint64_t offset,
                                    int fd, void **mh);
ncclResult_t net_nccl_dereg_mr(void *comm, void *mh);
ncclResult_t net_nccl_iflush(void *recv_comm, int n, void **data, int *sizes, void **mhs,
                             void **req);
ncclResult_t net_nccl_test(void *req, int *done, int *sizes);
ncclResult_t net_nccl_close_send(void *comm);
ncclResult_t net_nccl_close_recv(void *comm);
ncclResult_t net_nccl_close_listen(void *comm);
/* makeVDevice of v9 to v11 (4 devices at most). */
ncclResult_t net_nccl_make_vdevice_v9(int *d, ncclNetVDeviceProps_v9_t *props);

#endif
