/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The listen comm and the handle it fills: what net_listen.c makes and closes, what the
 * connector (net_connect.c) reads from the handle, and the connections the listener works on
 * at once (net_accept.c), whose progress lives in the listen comm between calls.
 */
#ifndef RS_NET_LISTEN_H
#define RS_NET_LISTEN_H

#include "net_int.h"
#include "net_wire.h"

#define NET_HANDLE_MAGIC 0x52534841u /* RSHA */
#define NET_STAGE_MAGIC  0x52535447u /* RSTG */
/* Connections one listener works on at once; past that the oldest that has not shown its
 * handle's nonce is dropped for a new one, or, when all have, new ones wait in the kernel. */
#define NET_PENDING_MAX 64

/* What travels out of band. The stage fields are the connector's, zero until it starts. */
struct net_handle {
    uint32_t magic, version;
    uint64_t nonce;
    union sock_addr addr;
    uint32_t stage_magic;
    uint64_t stage; /* the registry's handle of the connector's progress (net_live.h) */
};
_Static_assert(sizeof(struct net_handle) <= NET_HANDLE_BYTES, "handle fits NCCL's 128 bytes");

enum net_pend_state {
    NET_PEND_FREE,  /* no connection in this slot */
    NET_PEND_HELLO, /* waiting for the hello's header: not authenticated, a short deadline */
    NET_PEND_ADDR,  /* the nonce matched: waiting for the connector's transport address */
    NET_PEND_REPLY, /* sending the reply */
    NET_PEND_ACK,   /* waiting for the connector's acknowledgement */
    NET_PEND_READY, /* acknowledged: a receive comm for the next accept to hand NCCL */
};

/* One connection a listener is accepting. */
struct net_pending {
    enum net_pend_state state;
    int fd;
    char peer[SOCK_ADDR_STR];
    int64_t since_ms;    /* accepted then: the oldest unauthenticated one is dropped first */
    int64_t deadline_ms; /* NET_HELLO_MS until authenticated, then RESHARD_TIMEOUT */
    unsigned char hello[NET_HELLO_BYTES];
    size_t got;           /* bytes of the hello, then of the address, read */
    unsigned char *caddr; /* the connector's transport address */
    size_t caddr_len;
    unsigned char *reply;
    size_t reply_len, sent;
    struct net_comm *comm; /* made when the address is in */
};

/* What reading or writing a connection came to. */
enum net_pend_step {
    NET_PEND_WAIT,   /* the socket has nothing more for now */
    NET_PEND_ANSWER, /* the address is in: the listener must make the comm and the reply */
    NET_PEND_DONE,   /* the acknowledgement is in: the comm is NCCL's */
    NET_PEND_DROP,   /* *why says why the connection goes (a refusal was sent where due) */
};

/* A listen comm. */
struct net_listen {
    struct net_dev *dev;
    void *handle;    /* its registry handle */
    const void *ctx; /* the context it was made through: its finalize closes it */
    int fd;
    uint64_t nonce;
    char name[SOCK_ADDR_STR];
    struct net_pending pend[NET_PENDING_MAX];
    /* Connections dropped before they showed the nonce: counted, and said at most once a
     * second, so that a flood does not flood the log as well. */
    unsigned long quiet_drops;
    int64_t quiet_next_ms;
    char quiet_why[96];
};

/* Moves p's handshake on as far as its socket allows: reads the hello (checked against nonce,
 * with a refusal sent when it does not match), the address and the acknowledgement, and writes
 * the reply once net_pending_answer gave one. No transport is touched: the fuzz target drives
 * it over a socketpair. */
enum net_pend_step net_pending_step(struct net_pending *p, uint64_t nonce, const char **why);
/* Gives p its reply (copied) and moves it on to sending it; RESHARD_ERR_NO_MEMORY. */
reshard_status_t net_pending_answer(struct net_pending *p, const unsigned char *reply, size_t len);
/* Frees what p holds but its comm, and closes its socket: the slot is free again. */
void net_pending_clear(struct net_pending *p);

/* Drops every connection being accepted (closeListen). */
void net_listen_drop_all(struct net_listen *l);
/* In a forked child: closes this process's copies of the parent's listening and handshake
 * sockets (close, never shutdown: the parent's stay as they are), touching nothing else, so
 * that the parent's port closes when the parent closes it. */
void net_listen_forget(struct net_listen *l);
/* The same for a connection in progress (a registry object of kind NET_KIND_STAGE). */
void net_stage_forget(void *stage);
/* Finalize of ctx: a connection in progress made through it is given up and released (its
 * socket, transport peer and comm); one of another context is left alone. */
void net_stage_finalize(void *stage, const void *ctx);
/* Says how many unauthenticated connections were dropped since it last said (force: now). */
void net_listen_report_drops(struct net_listen *l, int force);

#endif
