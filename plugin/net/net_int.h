/* SPDX-License-Identifier: Apache-2.0 */
/* What the network plugin's files share: devices, comms, requests, registrations. */
#ifndef RS_NET_INT_H
#define RS_NET_INT_H

#include "net.h"
#include "net_live.h"
#include "transport/sock/sock.h"
#include "transport/tp.h"

#include <pthread.h>

struct net_comm;

#define NET_MAX_RAILS 8 /* devices one virtual NIC merges (NCCL v12's limit) */

struct net_dev {
    char name[64];
    char tp_dev[80];      /* the transport's device selector (ib: "=mlx5_0:1") */
    int port;             /* ib: the port number; 0 otherwise */
    union sock_addr addr; /* where listeners bind */
    int speed_mbps;
    char *pci_path;
    uint64_t guid;
    int ptr_support;       /* NET_PTR_*: what regMr takes here (net_dev_gdr_probe) */
    int rail_id, plane_id; /* v12: where the port sits (-1: unknown) */
    /* A virtual NIC (makeVDevice) merges physical devices (members, for vProps). Where the
     * transport places bytes at an offset (send_part: ib) each member is a rail with its own
     * transport context (tp, then more[]) and every message is striped over them; elsewhere
     * (UCX) one context spans every member's interface and UCX spreads it over its lanes. */
    int nmembers, members[NET_MAX_RAILS];
    int nrails;                       /* transport contexts: 1, or nmembers */
    char rail_dev[NET_MAX_RAILS][80]; /* each context's device selector */
    pthread_mutex_t lock;             /* everything below, and every comm of this device */
    struct tp_ctx *tp; /* made on first listen or connect; a virtual NIC's first rail */
    struct tp_ctx *more[NET_MAX_RAILS - 1]; /* the other rails */
    int next_peer;   /* transport peer index of the next send comm, unless one is free */
    int *free_peers; /* indices of closed send comms, for the next ones */
    size_t n_free, free_cap;
    uint32_t next_id;      /* tag prefix of the next receive comm */
    int users;             /* open listen, send and receive comms, and registrations */
    struct net_comm *dead; /* closed comms whose transfers the transport still holds */
};

/* One transfer of a request: a message sent, or one of a grouped receive. */
struct net_sub {
    struct tp_req tp;
    struct net_req *req;
};

enum net_req_state { REQ_FREE, REQ_ACTIVE, REQ_ABANDONED };

struct net_req {
    enum net_req_state state;
    void *handle; /* NCCL's, while active (net_live.h) */
    struct net_comm *comm;
    int n;       /* transfers */
    int nsub;    /* transport requests: n times the rails (sub[i * rails + rail]) */
    int pending; /* transport requests not completed */
    reshard_status_t st;
    size_t sizes[NET_MAX_RECVS];
    int failed_sub;     /* the first transfer that failed (-1: none) */
    const char *tp_why; /* its transport's status (a static string, or NULL) */
    struct net_sub *sub;
};

struct net_comm {
    enum net_kind kind; /* NET_KIND_SEND or NET_KIND_RECV */
    void *handle;       /* NCCL's, once handed out (net_live.h) */
    const void *ctx;    /* the context it was made through: its finalize closes it */
    struct net_dev *dev;
    int fd;   /* the handshake socket, kept to learn of the peer's death */
    int peer; /* send: the transport peer index */
    uint32_t id;
    char peer_name[SOCK_ADDR_STR];
    int64_t goodbye_ms;      /* when the peer said goodbye (0: not yet): it closed the comm */
    int64_t eof_ms;          /* when its end of the socket closed (0: open) */
    reshard_status_t failed; /* the connection broke: every request fails with this */
    char why[160];
    int64_t next_check_ms;
    struct net_req *reqs;
    int nreqs, active;
    int in_transport; /* transfers posted and not yet completed */
    struct net_comm *next_dead;
};

struct net_mr {
    void *handle; /* NCCL's (net_live.h) */
    struct net_dev *dev;
    void *tp_mh[NET_MAX_RAILS]; /* one per rail */
    char *base;
    size_t len;
    int device; /* device memory (NCCL_PTR_CUDA, or a dma-buf): receives into it are flushed */
};

/* net_dev.c */
/* Whether RESHARD_NET_DEVICES's list (NCCL_SOCKET_IFNAME's syntax: "eth,ib" name prefixes,
 * "=eth0" exact names, a leading "^" for all but those; empty for all) takes interface name.
 * Virtual interfaces (net_if_virtual) are taken only when an include list names them. */
int net_if_selected(const char *list, const char *name);
/* Bridges and container or VM link ends: docker*, virbr*, veth*, cni*, flannel*. */
int net_if_virtual(const char *name);
struct net_dev *net_dev_get(int dev);
int net_dev_count(void);
/* Device memory registers as host memory (RESHARD_TEST_DEVICE_AS_HOST=1: the stand-in driver's
 * device memory is host memory). */
int net_device_as_host(void);
/* Makes the device's transport contexts on first use; called with dev->lock held. */
reshard_status_t net_dev_tp(struct net_dev *d);
/* Rail r's transport context (0 <= r < d->nrails). */
static inline struct tp_ctx *net_rail(const struct net_dev *d, int r)
{
    return r ? d->more[r - 1] : d->tp;
}
/* The device's transport address for peer, its rails' framed together on a virtual NIC; and the
 * peer's (set_peer and connect on every rail). dev->lock held. */
reshard_status_t net_dev_address(struct net_dev *d, int peer, void *buf, size_t *len);
reshard_status_t net_dev_set_peer(struct net_dev *d, int peer, const void *addr, size_t len);
/* Advances every rail's transport. dev->lock held. */
void net_dev_progress(struct net_dev *d);
/* Releases the closed comms whose transfers have all completed; dev->lock held. */
void net_dev_reap(struct net_dev *d);
/* Transport peer numbers, dev->lock held: a closed comm's number serves the next one. */
int net_dev_peer_take(struct net_dev *d);
void net_dev_peer_give(struct net_dev *d, int peer);

/* net_accept.c */
/* The comm's socket carries nothing after the handshake, so without keepalive a host that
 * vanishes (no FIN, no RST) would go unnoticed: probes after 10 s idle, every 5 s, 3 tries. */
void net_keepalive(int fd);

/* net_comm.c */
/* A send or receive comm (kind) on the handshake socket fd, with its request pool; NULL when
 * out of memory. */
struct net_comm *net_comm_new(struct net_dev *d, enum net_kind kind, int fd, const char *peer);
/* Closes c (dev->lock held): retires its handle and its requests', says goodbye, gives its
 * peer back, and frees it, or leaves it on d->dead while the transport still holds its
 * transfers. */
void net_comm_retire(struct net_comm *c);
void net_comm_free(struct net_comm *c);

/* net_ctx.c */
/* Finalize of ctx: gives up its connects in progress and closes its listen, send and receive
 * comms that are still open; returns how many comms. */
int net_close_owned(const void *ctx);
/* The last finalize: releases every registration left (on comms closed since); how many. */
int net_free_mrs(void);
/* In a forked child (net_live_fork_child): closes this process's copies of the parent's plain
 * sockets (close, never shutdown, no goodbye), so that the parent's listeners and connections
 * end when the parent ends them; touches nothing else. */
void net_forget_object(void *obj, enum net_kind kind);

/* net_io.c */
/* Asks the transport to end every transfer of r early (its rail's context for each). */
void net_req_cancel(struct net_req *r);
/* Releases a registration whatever became of its comm (finalize; deregMr). */
void net_mr_free(struct net_mr *m);
/* Fails every transfer of c (the peer is gone): receives are cancelled, requests report why. */
void net_comm_fail(struct net_comm *c, reshard_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Reads the handshake socket for a goodbye, its end, or an error (at most once a millisecond
 * unless forced), and fails the comm when its peer is gone with transfers outstanding; called
 * while a request waits, dev->lock held. */
void net_comm_watch(struct net_comm *c, int force);

#endif
