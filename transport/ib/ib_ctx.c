/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The ibverbs transport's context: one RDMA port with its device, protection domain,
 * completion channel and queue, and the side channel's listener; made by init, undone in
 * reverse by close. The ops table at the end says which file serves each op (ib_int.h says
 * how the transport works as a whole).
 */
#include "ib_int.h"

#include "base/error.h"
#include "base/param.h"

#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#define CQ_INITIAL 4096

static void ib_close(struct tp_ctx *c);

static reshard_status_t pick_port(const struct tp_config *cfg, struct ib_port *out)
{
    const struct ib_port *ports;
    int n;
    RS_CHECK(ib_ports(&ports, &n));
    const struct ib_port *match[64];
    int m = 0;
    for (int i = 0; i < n && m < 64; i++)
        if (!cfg->devices || !*cfg->devices ||
            ib_hca_selects(cfg->devices, ports[i].dev, ports[i].port))
            match[m++] = &ports[i];
    const struct ib_port *chosen = m ? match[cfg->local_rank > 0 ? cfg->local_rank % m : 0] : NULL;
    if (!chosen)
        return rs_error(RESHARD_ERR_UNAVAILABLE, "ib: no active RDMA port%s%s%s",
                        cfg->devices ? " matches '" : "", cfg->devices ? cfg->devices : "",
                        cfg->devices ? "'" : " (RESHARD_IB_HCA, ibv_devinfo)");
    *out = *chosen;
    return RESHARD_OK;
}

static reshard_status_t ib_init(const struct tp_config *cfg, struct tp_ctx **out)
{
    const struct ib_fns *f = ib_lib();
    if (!f)
        return RESHARD_ERR_UNAVAILABLE;
    struct ib_ctx *x = rs_calloc(1, sizeof(*x), "ib context");
    if (!x)
        return RESHARD_ERR_NO_MEMORY;
    x->super.ops = &tp_ib_ops;
    x->super.failed_peer = -1;
    tp_deferred_init(&x->deferred);
    x->f = f;
    x->lfd = -1;
    x->hello_ms = IB_HELLO_MS;
    x->rank = cfg->size > 0 ? cfg->rank : -1;
    reshard_status_t st;
    int64_t q = rs_param_int(RS_PARAM_IB_QPS_PER_PEER);
    x->nqp = q > IB_MAX_QPS ? IB_MAX_QPS : (int)q;
    RS_CHECK_GOTO(pick_port(cfg, &x->port), st, err_close);
    struct ibv_device **list = f->get_device_list(NULL);
    for (int i = 0; list && list[i] && !x->dev; i++)
        if (!strcmp(f->get_device_name(list[i]), x->port.dev))
            x->dev = f->open_device(list[i]);
    if (list)
        f->free_device_list(list);
    st = RESHARD_ERR_NETWORK;
    if (!x->dev) {
        rs_error(st, "ib: cannot open %s: %m", x->port.dev);
        goto err_close;
    }
    if (!(x->pd = f->alloc_pd(x->dev)) || !(x->chan = f->create_comp_channel(x->dev))) {
        rs_error(st, "ib: %s: protection domain or completion channel: %m", x->port.name);
        goto err_close;
    }
    fcntl(x->chan->fd, F_SETFL, fcntl(x->chan->fd, F_GETFL) | O_NONBLOCK);
    ib_mr_probe_dmabuf(x);
    struct ibv_device_attr da;
    if (f->query_device(x->dev, &da)) {
        rs_error(st, "ib: %s: ibv_query_device: %m", x->port.name);
        goto err_close;
    }
    x->max_cqe = da.max_cqe;
    ib_key_probe(x, &da);
    x->cq_cap = CQ_INITIAL < da.max_cqe ? CQ_INITIAL : da.max_cqe;
    if (!(x->cq = f->create_cq(x->dev, x->cq_cap, NULL, x->chan, 0))) {
        rs_error(st, "ib: %s: ibv_create_cq: %m", x->port.name);
        goto err_close;
    }
    if (getrandom(&x->nonce, sizeof(x->nonce), 0) != sizeof(x->nonce)) {
        rs_error(st, "ib: no random nonce: %m");
        goto err_close;
    }
    RS_CHECK_GOTO(ib_cm_listen(x), st, err_close);
    x->peers = rs_calloc(cfg->size > 0 ? (size_t)cfg->size : 1, sizeof(*x->peers), "ib peers");
    if (!x->peers) {
        st = RESHARD_ERR_NO_MEMORY;
        goto err_close;
    }
    x->npeers = cfg->size > 0 ? (size_t)cfg->size : 1;
    *out = &x->super;
    return RESHARD_OK;
err_close:
    ib_close(&x->super);
    return st;
}

static void ib_close(struct tp_ctx *c)
{
    if (!c)
        return;
    struct ib_ctx *x = to_ib(c);
    if (x->peers)
        ib_disconnect(c);
    ib_peer_free_all(x);
    ib_cm_drop_stash(x);
    ib_send_close_all(x);
    ib_tmr_drop_all(x);
    ib_bounce_drop_all(x);
    ib_flush_close(x);
    if (x->cq)
        x->f->destroy_cq(x->cq);
    if (x->chan)
        x->f->destroy_comp_channel(x->chan);
    if (x->pd)
        x->f->dealloc_pd(x->pd);
    if (x->dev)
        x->f->close_device(x->dev);
    sock_close(&x->lfd);
    free(x->peers);
    free(x->tokens);
    free(x->ids);
    free(x->free_ids);
    free(x);
}

/* ib_init and ib_close are here; address comes from ib_cm.c; set_peer, connect, disconnect and
 * close_peer from ib_peer.c; mem_* from ib_mr.c; flush from ib_flush.c; send, recv*, cancel from
 * ib_post.c; progress and wait from ib_cq.c. */
const struct tp_ops tp_ib_ops = {
    .size = sizeof(struct tp_ops),
    .name = "ib",
    .init = ib_init,
    .address = ib_address,
    .set_peer = ib_set_peer,
    .connect = ib_connect,
    .mem_reg = ib_mem_reg,
    .mem_dereg = ib_mem_dereg,
    .mem_reg_dmabuf = ib_mem_reg_dmabuf,
    .flush = ib_flush,
    .send = ib_send,
    .send_part = ib_send_part,
    .recv = ib_recv,
    .recv_iov = ib_recv_iov,
    .cancel = ib_cancel,
    .progress = ib_progress,
    .wait = ib_wait,
    .disconnect = ib_disconnect,
    .close_peer = ib_close_peer,
    .close = ib_close,
};
