/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What a context's end, or a fork, does to the objects the plugin handed out (net_int.h):
 * finalize closes what was made through its context and left open, and the last one the
 * registrations left; a forked child closes its copies of the parent's plain sockets.
 */
#include "net_listen.h"

struct sweep {
    const void *ctx;
    int comms;
};

static void close_owned(void *h, void *obj, enum net_kind kind, void *arg)
{
    struct sweep *sw = arg;
    switch (kind) {
    case NET_KIND_STAGE: /* logs it when it is the context's */
        net_stage_finalize(obj, sw->ctx);
        break;
    case NET_KIND_LISTEN:
        if (((struct net_listen *)obj)->ctx == sw->ctx && net_close_listen(h) == RESHARD_OK)
            sw->comms++;
        break;
    case NET_KIND_SEND:
    case NET_KIND_RECV:
        if (((struct net_comm *)obj)->ctx == sw->ctx &&
            (kind == NET_KIND_SEND ? net_close_send(h) : net_close_recv(h)) == RESHARD_OK)
            sw->comms++;
        break;
    default:
        break;
    }
}

int net_close_owned(const void *ctx)
{
    struct sweep sw = {.ctx = ctx};
    net_live_each(NET_KINDS(NET_KIND_STAGE) | NET_KINDS(NET_KIND_LISTEN) |
                      NET_KINDS(NET_KIND_SEND) | NET_KINDS(NET_KIND_RECV),
                  close_owned, &sw);
    return sw.comms;
}

static void free_mr(void *h, void *obj, enum net_kind kind, void *arg)
{
    (void)h, (void)kind;
    ++*(int *)arg;
    net_mr_free(obj);
}

int net_free_mrs(void)
{
    int n = 0;
    net_live_each(NET_KINDS(NET_KIND_MR), free_mr, &n);
    return n;
}

void net_forget_object(void *obj, enum net_kind kind)
{
    switch (kind) {
    case NET_KIND_LISTEN:
        net_listen_forget(obj);
        break;
    case NET_KIND_SEND:
    case NET_KIND_RECV:
        sock_close(&((struct net_comm *)obj)->fd);
        break;
    case NET_KIND_STAGE:
        net_stage_forget(obj);
        break;
    default: /* contexts, requests, registrations: memory only */
        break;
    }
}
