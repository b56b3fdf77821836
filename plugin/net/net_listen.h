/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The listen comm and the handle it fills: what net_listen.c makes and closes, and what the
 * handshake (net_connect.c) reads: the connector the handle, the acceptor the connection it is
 * accepting, whose progress lives in the listen comm between calls.
 */
#ifndef RS_NET_LISTEN_H
#define RS_NET_LISTEN_H

#include "net_int.h"

#define NET_HANDLE_MAGIC 0x52534841u /* RSHA */
#define NET_WIRE_VERSION 2
#define NET_HELLO_BYTES  20

struct net_connecting;

/* What travels out of band. The stage fields are the connector's, zero until it starts. */
struct net_handle {
    uint32_t magic, version;
    uint64_t nonce;
    union sock_addr addr;
    uint32_t stage_magic;
    struct net_connecting *stage;
    uint64_t stage_gen; /* with the pointer: a stale copy never matches a reused address */
};
_Static_assert(sizeof(struct net_handle) <= NET_HANDLE_BYTES, "handle fits NCCL's 128 bytes");

/* A listen comm, and the connection it is accepting (one at a time). */
struct net_listen {
    uint32_t magic;
    struct net_dev *dev;
    int fd;
    uint64_t nonce;
    char name[SOCK_ADDR_STR];
    /* the connection being accepted */
    int afd;
    char apeer[SOCK_ADDR_STR];
    unsigned char hello[NET_HELLO_BYTES];
    size_t got;
    unsigned char *caddr; /* the connector's transport address */
    size_t caddr_len, caddr_got;
    unsigned char *reply;
    size_t reply_len, sent;
    struct net_comm *comm;
    int64_t deadline_ms;
};

/* Forgets the connection being accepted: its socket, its address, its reply. */
void net_listen_reset_accept(struct net_listen *l);

#endif
