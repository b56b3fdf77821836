/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What a send or receive comm of the network plugin is: its handshake socket, its transport
 * peer and its fixed pool of requests; how it is retired (a goodbye to the peer, its peer
 * number given back, kept on the device's dead list while the transport still holds its
 * transfers) and freed; and NCCL's closeSend and closeRecv.
 */
#include "net_int.h"

#include "base/error.h"
#include "base/log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>

/* NCCL's limit of outstanding requests (times the receive group size on the send side), each
 * with room for its transfers. */
static reshard_status_t comm_alloc_reqs(struct net_comm *c, int nreqs, int subs_per_req)
{
    c->reqs = rs_calloc((size_t)nreqs, sizeof(*c->reqs), "NET/Reshard requests");
    struct net_sub *subs =
        rs_calloc((size_t)nreqs * (size_t)subs_per_req, sizeof(*subs), "NET/Reshard transfers");
    if (!c->reqs || !subs) {
        free(c->reqs);
        free(subs);
        c->reqs = NULL;
        return RESHARD_ERR_NO_MEMORY;
    }
    c->nreqs = nreqs;
    for (int i = 0; i < nreqs; i++) {
        c->reqs[i].comm = c;
        c->reqs[i].sub = subs + (size_t)i * (size_t)subs_per_req;
    }
    return RESHARD_OK;
}

void net_comm_free(struct net_comm *c)
{
    if (c->reqs)
        free(c->reqs[0].sub);
    free(c->reqs);
    sock_close(&c->fd);
    free(c);
}

struct net_comm *net_comm_new(struct net_dev *d, enum net_kind kind, int fd, const char *peer)
{
    struct net_comm *c = rs_calloc(1, sizeof(*c), "NET/Reshard comm");
    if (!c)
        return NULL;
    c->kind = kind;
    c->dev = d;
    c->fd = fd;
    c->peer = -1;
    snprintf(c->peer_name, sizeof(c->peer_name), "%s", peer);
    int send = kind == NET_KIND_SEND;
    if (comm_alloc_reqs(c, send ? NET_MAX_REQUESTS * NET_MAX_RECVS : NET_MAX_REQUESTS,
                        (send ? 1 : NET_MAX_RECVS) * d->nrails) != RESHARD_OK) {
        free(c);
        return NULL;
    }
    return c;
}

/* Tells the peer this end closes on purpose, so that its watch does not take the socket's
 * end for a death. Best effort: a full or broken socket changes nothing here. */
static void say_goodbye(int fd)
{
    if (fd >= 0 && send(fd, "B", 1, MSG_DONTWAIT | MSG_NOSIGNAL) < 0 && errno != EAGAIN)
        rs_log(RS_LOG_TRACE, "NET/Reshard: goodbye not sent: %m");
}

/* dev->lock held. A comm whose transfers the transport still holds waits on dev->dead. */
void net_comm_retire(struct net_comm *c)
{
    struct net_dev *d = c->dev;
    net_live_drop(c->handle); /* from now on the comm and its requests are stale handles */
    for (int i = 0; i < c->nreqs; i++)
        if (c->reqs[i].state == REQ_ACTIVE)
            net_live_drop(c->reqs[i].handle);
    say_goodbye(c->fd);
    sock_close(&c->fd);
    if (d->tp && c->kind == NET_KIND_RECV)
        for (int i = 0; i < c->nreqs; i++)
            if (c->reqs[i].state != REQ_FREE)
                net_req_cancel(&c->reqs[i]);
    if (d->tp && c->peer >= 0) {
        for (int r = 0; r < d->nrails; r++)
            net_rail(d, r)->ops->close_peer(net_rail(d, r), c->peer);
        net_dev_peer_give(d, c->peer);
    }
    d->users--;
    if (d->tp)
        net_dev_progress(d);
    if (c->in_transport) {
        rs_log(RS_LOG_INFO,
               "NET/Reshard: the transport still holds %d transfer(s) of the comm "
               "with %s; it is released when they end",
               c->in_transport, c->peer_name);
        c->next_dead = d->dead;
        d->dead = c;
    } else {
        net_comm_free(c);
    }
    net_dev_reap(d);
}

static reshard_status_t close_comm(void *comm, enum net_kind kind, const char *what)
{
    int stale;
    struct net_comm *c = net_live_get(comm, NET_KINDS(kind), &stale);
    if (!c)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "NET/Reshard: close%s of %p, which is not an open %s%s", what, comm,
                        net_kind_name(kind), stale ? " (it was closed already)" : "");
    struct net_dev *d = c->dev;
    pthread_mutex_lock(&d->lock);
    if (c->active)
        rs_log(RS_LOG_INFO, "NET/Reshard: %s with %s closed with %d requests in flight",
               net_kind_name(kind), c->peer_name, c->active);
    net_comm_retire(c);
    pthread_mutex_unlock(&d->lock);
    return RESHARD_OK;
}

reshard_status_t net_close_send(void *comm)
{
    return close_comm(comm, NET_KIND_SEND, "Send");
}

reshard_status_t net_close_recv(void *comm)
{
    return close_comm(comm, NET_KIND_RECV, "Recv");
}
