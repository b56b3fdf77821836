/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The network plugin in this library's own terms: NCCL's point-to-point net semantics
 * (docs/nccl.md) over the transport ops table. Every function returns a reshard status;
 * net_nccl.c maps it to ncclResult_t once, logs the failure, and fills each ncclNet_vN table.
 *
 * Devices are the host's network interfaces that are up and not virtual (RESHARD_NET_DEVICES,
 * in NCCL_SOCKET_IFNAME's syntax, chooses others; loopback only on request), or the active
 * RDMA ports with the ib transport; when the transport cannot run here (UCX or verbs missing)
 * there are none, so that NCCL uses another network. Each device gets one transport context,
 * shared by every plugin context and comm of the process; a mutex per device serialises calls
 * on it, since NCCL calls connect and accept from its proxy service thread and
 * isend/irecv/test from its progress thread.
 *
 * Everything handed to NCCL is a handle of the registry of live objects (net_live.h), so a
 * handle closed already, stale, or of another kind is refused without reading freed memory.
 *
 * A connection is a TCP handshake on a socket the listener opened (its address and a random
 * nonce travel in the handle), after which the receiver's transport address is known to the
 * sender and the data moves as tagged messages: tag = receive comm id << 32 | NCCL tag. A
 * listener works on many connections at once and drops those that do not show the nonce within
 * RESHARD_NET_HELLO_MS. The socket stays open for the comm's life: a peer process that dies
 * closes it without the goodbye byte that an orderly close sends, which fails the comm's
 * requests at once.
 */
#ifndef RS_NET_H
#define RS_NET_H

#include "base/reshard_status.h"

#include <stddef.h>
#include <stdint.h>

#define NET_MAX_RECVS    8  /* receives grouped in one irecv */
#define NET_MAX_REQUESTS 32 /* outstanding per comm (per grouped receive on the send side) */
#define NET_HANDLE_BYTES 128
/* Largest message: test() reports sizes as int, and 1 GiB keeps chunks sensible. */
#define NET_MAX_MESSAGE ((size_t)1 << 30)

enum net_ptr { NET_PTR_HOST = 1, NET_PTR_CUDA = 2, NET_PTR_DMABUF = 4 };

struct net_props {
    const char *name;     /* interface name, unique per device */
    const char *pci_path; /* NULL when the interface has no PCI device */
    uint64_t guid;
    int ptr_support; /* NET_PTR_* */
    int speed_mbps;
    int port;
    float latency_us;
    int max_comms, max_recvs;
    size_t max_p2p_bytes, max_coll_bytes;
    int ndevs, devs[8];    /* the physical devices behind it (vProps): itself, or a virtual NIC's */
    int rail_id, plane_id; /* -1: unknown */
};

/* A plugin context (v11+: one per NCCL communicator; older versions: one for the process).
 * The first finds the devices; the last finalize releases them. */
reshard_status_t net_init(uint64_t comm_id, void **ctx);
/* Closes what was made through ctx and is still open (connects under way, comms), and at the
 * last context what registrations are left; NULL is fine. */
reshard_status_t net_finalize(void *ctx);
/* v8-v10's unload hook (at dlclose or exit, while NCCL's threads may still run): the same, but
 * what is still open stays untouched. */
reshard_status_t net_finalize_idle(void *ctx);
/* RESHARD_OK when ctx is a live context, else an error saying what it is instead. */
reshard_status_t net_ctx_check(const void *ctx);

reshard_status_t net_devices(int *ndev);
reshard_status_t net_properties(int dev, struct net_props *out);
/* makeVDevice: a new device merging the physical devices devs[0..n-1] (2 to max, distinct),
 * whose messages are striped over them; *dev is its index. */
reshard_status_t net_make_vdevice(const int *devs, int n, int max, int *dev);

/* Non-blocking, as NCCL requires: a NULL comm with RESHARD_OK means "call again" (connect with
 * the same handle, which carries the connection's progress). */
reshard_status_t net_listen(void *ctx, int dev, void *handle, void **listen_comm);
reshard_status_t net_connect(void *ctx, int dev, void *handle, void **send_comm);
reshard_status_t net_accept(void *listen_comm, void **recv_comm);

reshard_status_t net_reg_mr(void *comm, void *data, size_t size, int type, void **mh);
reshard_status_t net_reg_mr_dmabuf(void *comm, void *data, size_t size, int type, uint64_t offset,
                                   int fd, void **mh);
reshard_status_t net_dereg_mr(void *comm, void *mh);

/* A NULL *req with RESHARD_OK would mean "retry later"; this transport always posts. */
reshard_status_t net_isend(void *send_comm, void *data, size_t size, int tag, void *mh, void **req);
reshard_status_t net_irecv(void *recv_comm, int n, void **data, const size_t *sizes,
                           const int *tags, void **mhs, void **req);
/* Host memory needs no flush: *req = NULL, which NCCL reads as done. */
reshard_status_t net_iflush(void *recv_comm, int n, void **data, const int *sizes, void **mhs,
                            void **req);
/* *done = 1 and the sizes that arrived (sizes may be NULL); the request is then gone. */
reshard_status_t net_test(void *req, int *done, int *sizes);

reshard_status_t net_close_send(void *send_comm);
reshard_status_t net_close_recv(void *recv_comm);
reshard_status_t net_close_listen(void *listen_comm);

#endif
