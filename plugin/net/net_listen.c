/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The listen comm of the network plugin: a socket on the device's address, a random nonce
 * that only its own handles carry, and closeListen. Accepting on it is the listener's half of
 * the handshake, in net_accept.c.
 */
#include "net_listen.h"

#include "base/error.h"
#include "base/log.h"

#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

reshard_status_t net_listen(void *ctx, int dev, void *handle, void **listen_comm)
{
    RS_CHECK(net_ctx_check(ctx));
    struct net_dev *d = net_dev_get(dev);
    if (!d)
        return RESHARD_ERR_INVALID_ARG;
    if (!handle || !listen_comm)
        return rs_error(RESHARD_ERR_INVALID_ARG, "NET/Reshard: listen without a handle");
    struct net_listen *l = rs_calloc(1, sizeof(*l), "NET/Reshard listen comm");
    if (!l)
        return RESHARD_ERR_NO_MEMORY;
    l->dev = d;
    l->ctx = ctx;
    for (int i = 0; i < NET_PENDING_MAX; i++)
        l->pend[i].fd = -1;
    union sock_addr a = d->addr;
    sock_addr_set_port(&a, 0);
    reshard_status_t st;
    RS_CHECK_GOTO(sock_listen(&a, &l->fd), st, err_free_listen);
    if (getrandom(&l->nonce, sizeof(l->nonce), 0) != sizeof(l->nonce)) {
        st = rs_error(RESHARD_ERR_NETWORK, "NET/Reshard: getrandom: %m");
        goto err_close_listener;
    }
    if (!(l->handle = net_live_add(l, NET_KIND_LISTEN))) {
        st = RESHARD_ERR_NO_MEMORY;
        goto err_close_listener;
    }
    sock_addr_str(&a, l->name, sizeof(l->name));
    struct net_handle *h = handle;
    memset(handle, 0, NET_HANDLE_BYTES);
    h->magic = NET_HANDLE_MAGIC;
    h->version = NET_WIRE_VERSION;
    h->nonce = l->nonce;
    h->addr = a;
    pthread_mutex_lock(&d->lock);
    d->users++;
    pthread_mutex_unlock(&d->lock);
    rs_log(RS_LOG_INFO, "NET/Reshard: listening on %s (%s)", l->name, d->name);
    *listen_comm = l->handle;
    return RESHARD_OK;
err_close_listener:
    sock_close(&l->fd);
err_free_listen:
    free(l);
    return st;
}

void net_listen_drop_all(struct net_listen *l)
{
    for (int i = 0; i < NET_PENDING_MAX; i++) {
        struct net_pending *p = &l->pend[i];
        if (p->state == NET_PEND_FREE)
            continue;
        if (p->comm) {
            pthread_mutex_lock(&l->dev->lock);
            net_comm_retire(p->comm);
            pthread_mutex_unlock(&l->dev->lock);
            p->comm = NULL;
        }
        net_pending_clear(p);
    }
}

void net_listen_forget(struct net_listen *l)
{
    sock_close(&l->fd);
    for (int i = 0; i < NET_PENDING_MAX; i++)
        sock_close(&l->pend[i].fd);
}

reshard_status_t net_close_listen(void *listen_comm)
{
    int stale;
    struct net_listen *l = net_live_get(listen_comm, NET_KINDS(NET_KIND_LISTEN), &stale);
    if (!l)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "NET/Reshard: closeListen of %p, which is not an open listen comm%s",
                        listen_comm, stale ? " (it was closed already)" : "");
    net_live_drop(l->handle);
    net_listen_drop_all(l);
    net_listen_report_drops(l, 1);
    sock_close(&l->fd);
    pthread_mutex_lock(&l->dev->lock);
    l->dev->users--;
    pthread_mutex_unlock(&l->dev->lock);
    free(l);
    return RESHARD_OK;
}
