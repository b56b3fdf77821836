/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The listen comm of the network plugin: a socket on the device's address, a random nonce
 * that only its own handles carry, and closeListen. Accepting on it is the listener's half of
 * the handshake, in net_connect.c.
 */
#include "net_listen.h"

#include "base/error.h"
#include "base/log.h"

#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

reshard_status_t net_listen(struct net_ctx *ctx, int dev, void *handle, void **listen_comm)
{
    RS_CHECK(net_check_ctx(ctx));
    struct net_dev *d = net_dev_get(dev);
    if (!d)
        return RESHARD_ERR_INVALID_ARG;
    if (!handle || !listen_comm)
        return rs_error(RESHARD_ERR_INVALID_ARG, "NET/Reshard: listen without a handle");
    struct net_listen *l = rs_calloc(1, sizeof(*l), "NET/Reshard listen comm");
    if (!l)
        return RESHARD_ERR_NO_MEMORY;
    l->magic = NET_MAGIC_LISTEN;
    l->dev = d;
    l->afd = -1;
    union sock_addr a = d->addr;
    sock_addr_set_port(&a, 0);
    reshard_status_t st;
    RS_CHECK_GOTO(sock_listen(&a, &l->fd), st, err_free_listen);
    if (getrandom(&l->nonce, sizeof(l->nonce), 0) != sizeof(l->nonce)) {
        st = rs_error(RESHARD_ERR_NETWORK, "NET/Reshard: getrandom: %m");
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
    *listen_comm = l;
    return RESHARD_OK;
err_close_listener:
    sock_close(&l->fd);
err_free_listen:
    free(l);
    return st;
}

void net_listen_reset_accept(struct net_listen *l)
{
    sock_close(&l->afd);
    free(l->reply);
    free(l->caddr);
    l->reply = NULL;
    l->caddr = NULL;
    l->got = l->sent = l->reply_len = l->caddr_len = l->caddr_got = 0;
    l->comm = NULL;
}

reshard_status_t net_close_listen(void *listen_comm)
{
    struct net_listen *l = listen_comm;
    if (!l || l->magic != NET_MAGIC_LISTEN)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "NET/Reshard: closeListen of %p, which is not an open listen comm",
                        listen_comm);
    if (l->comm) {
        pthread_mutex_lock(&l->dev->lock);
        net_comm_retire(l->comm);
        pthread_mutex_unlock(&l->dev->lock);
        l->comm = NULL;
    }
    net_listen_reset_accept(l);
    sock_close(&l->fd);
    pthread_mutex_lock(&l->dev->lock);
    l->dev->users--;
    pthread_mutex_unlock(&l->dev->lock);
    l->magic = NET_MAGIC_DEAD;
    free(l);
    return RESHARD_OK;
}
