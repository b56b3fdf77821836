/* SPDX-License-Identifier: Apache-2.0 */
/* What the network plugin's files share: devices, comms, requests, registrations. */
#ifndef RS_NET_INT_H
#define RS_NET_INT_H

#include "net.h"
#include "transport/sock/sock.h"
#include "transport/tp.h"

#include <pthread.h>

/* Every object handed to NCCL starts with a magic, checked before anything else is read. */
enum {
    NET_MAGIC_CTX = 0x52534358,    /* RSCX */
    NET_MAGIC_LISTEN = 0x52534c4e, /* RSLN */
    NET_MAGIC_SEND = 0x52535344,   /* RSSD */
    NET_MAGIC_RECV = 0x52535256,   /* RSRV */
    NET_MAGIC_REQ = 0x52535251,    /* RSRQ */
    NET_MAGIC_MR = 0x52534d52,     /* RSMR */
    NET_MAGIC_DEAD = 0x64656164,   /* freed or completed */
};

struct net_comm;

struct net_dev {
    char name[64];
    char tp_dev[80];      /* the transport's device selector (ib: "=mlx5_0:1") */
    int port;             /* ib: the port number; 0 otherwise */
    union sock_addr addr; /* where listeners bind */
    int speed_mbps;
    char *pci_path;
    uint64_t guid;
    pthread_mutex_t lock; /* everything below, and every comm of this device */
    struct tp_ctx *tp;    /* made on first listen or connect */
    int next_peer;        /* transport peer index of the next send comm, unless one is free */
    int *free_peers;      /* indices of closed send comms, for the next ones */
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
    uint32_t magic;
    enum net_req_state state;
    struct net_comm *comm;
    int n;       /* transfers */
    int pending; /* transfers the transport has not completed */
    reshard_status_t st;
    size_t sizes[NET_MAX_RECVS];
    struct net_sub *sub;
};

struct net_comm {
    uint32_t magic; /* NET_MAGIC_SEND or NET_MAGIC_RECV */
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
    uint32_t magic;
    struct net_dev *dev;
    void *tp_mh;
    char *base;
    size_t len;
};

/* net_dev.c */
struct net_dev *net_dev_get(int dev);
int net_dev_count(void);
/* Makes the device's transport context on first use; called with dev->lock held. */
reshard_status_t net_dev_tp(struct net_dev *d);
/* Releases the closed comms whose transfers have all completed; dev->lock held. */
void net_dev_reap(struct net_dev *d);
/* Transport peer numbers, dev->lock held: a closed comm's number serves the next one. */
int net_dev_peer_take(struct net_dev *d);
void net_dev_peer_give(struct net_dev *d, int peer);

/* net_comm.c */
/* A send or receive comm (magic) on the handshake socket fd, with its request pool; NULL when
 * out of memory. */
struct net_comm *net_comm_new(struct net_dev *d, uint32_t magic, int fd, const char *peer);
/* Closes c (dev->lock held): says goodbye, gives its peer back, and frees it, or leaves it on
 * d->dead while the transport still holds its transfers. */
void net_comm_retire(struct net_comm *c);
void net_comm_free(struct net_comm *c);

/* net_io.c */
/* Fails every transfer of c (the peer is gone): receives are cancelled, requests report why. */
void net_comm_fail(struct net_comm *c, reshard_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Reads the handshake socket for a goodbye, its end, or an error (at most once a millisecond
 * unless forced), and fails the comm when its peer is gone with transfers outstanding; called
 * while a request waits, dev->lock held. */
void net_comm_watch(struct net_comm *c, int force);

#endif
