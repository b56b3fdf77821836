/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Flushes of device memory after a receive (GPUDirect RDMA). A NIC's writes into GPU memory
 * may still be on their way through PCIe when the write's completion arrives; a read from the
 * same memory by the same NIC is ordered after them, so once a read of the receive's last
 * bytes completes, a kernel sees all of it. NCCL's own IB network flushes the same way.
 *
 * The read goes through a queue pair connected to itself, made at the first flush, which alone
 * of the context's queue pairs allows remote reads: the peers' queue pairs allow remote writes
 * only, so the read access that device registrations carry gives no peer a way to read them.
 * A read's work request id is its tp_req with low bits 4 (ib_cq.c).
 */
#include "ib_int.h"

#include "base/error.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FLUSH_DEPTH 64 /* reads outstanding at once */
#define FLUSH_BYTES 64

static reshard_status_t flush_fail(struct ib_ctx *x, const char *call)
{
    return rs_error(RESHARD_ERR_NETWORK, "ib: flush queue pair on %s: %s: %m", x->port.name, call);
}

/* The loopback queue pair: INIT, then RTR and RTS towards itself. */
static reshard_status_t flush_qp_make(struct ib_ctx *x)
{
    if (x->cq_need + FLUSH_DEPTH > x->max_cqe)
        return rs_error(RESHARD_ERR_TOO_LARGE,
                        "ib: no room in the completion queue of %s for flushes (%d entries)",
                        x->port.name, x->max_cqe);
    if (x->cq_need + FLUSH_DEPTH > x->cq_cap) {
        int cap = x->cq_need + FLUSH_DEPTH;
        if (x->f->resize_cq(x->cq, cap))
            return rs_error(RESHARD_ERR_NETWORK, "ib: growing the completion queue to %d: %m", cap);
        x->cq_cap = cap;
    }
    if (!(x->flush_buf = calloc(1, FLUSH_BYTES)))
        return rs_error(RESHARD_ERR_NO_MEMORY, "ib: no memory for the flush buffer");
    if (!(x->flush_mr = x->f->reg_mr(x->pd, x->flush_buf, FLUSH_BYTES, IBV_ACCESS_LOCAL_WRITE)))
        return flush_fail(x, "ibv_reg_mr");
    struct ibv_qp_init_attr ia = {
        .send_cq = x->cq,
        .recv_cq = x->cq,
        .cap = {.max_send_wr = FLUSH_DEPTH, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1},
        .qp_type = IBV_QPT_RC,
    };
    if (!(x->flush_qp = x->f->create_qp(x->pd, &ia)))
        return flush_fail(x, "ibv_create_qp");
    x->cq_need += FLUSH_DEPTH; /* from here on ib_flush_close gives them back */
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_INIT,
        .port_num = (uint8_t)x->port.port,
        .qp_access_flags = IBV_ACCESS_REMOTE_READ,
    };
    if (x->f->modify_qp(x->flush_qp, &a,
                        IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        return flush_fail(x, "ibv_modify_qp(INIT)");
    struct ibv_qp_attr r = {
        .qp_state = IBV_QPS_RTR,
        .path_mtu = (enum ibv_mtu)x->port.mtu,
        .dest_qp_num = x->flush_qp->qp_num,
        .max_dest_rd_atomic = 1,
        .min_rnr_timer = 12,
        .ah_attr = {.dlid = x->port.lid, .port_num = (uint8_t)x->port.port},
    };
    if (x->port.link_layer == IBV_LINK_LAYER_ETHERNET) {
        r.ah_attr.is_global = 1;
        memcpy(r.ah_attr.grh.dgid.raw, x->port.gid, 16);
        r.ah_attr.grh.sgid_index = (uint8_t)x->port.gid_index;
        r.ah_attr.grh.hop_limit = 1;
    }
    if (x->f->modify_qp(x->flush_qp, &r,
                        IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                            IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
        return flush_fail(x, "ibv_modify_qp(RTR)");
    struct ibv_qp_attr s = {
        .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7, .max_rd_atomic = 1};
    if (x->f->modify_qp(x->flush_qp, &s,
                        IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                            IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
        return flush_fail(x, "ibv_modify_qp(RTS)");
    return RESHARD_OK;
}

void ib_flush_close(struct ib_ctx *x)
{
    if (x->flush_qp) {
        x->f->destroy_qp(x->flush_qp);
        x->cq_need -= FLUSH_DEPTH;
    }
    if (x->flush_mr)
        x->f->dereg_mr(x->flush_mr);
    free(x->flush_buf);
    x->flush_qp = NULL;
    x->flush_mr = NULL;
    x->flush_buf = NULL;
}

void ib_flush_done(struct ib_ctx *x, struct tp_req *req, const struct ibv_wc *wc)
{
    x->flush_used--;
    if (wc->status == IBV_WC_SUCCESS) {
        ib_complete(x, req, RESHARD_OK, 0);
        return;
    }
    ib_complete(x, req,
                rs_error(RESHARD_ERR_NETWORK, "ib: the flush's read on %s failed: %s (%d)",
                         x->port.name, x->f->wc_status_str(wc->status), wc->status),
                0);
}

reshard_status_t ib_flush(struct tp_ctx *c, void *mh, const void *addr, size_t len,
                          struct tp_req *req)
{
    struct ib_ctx *x = to_ib(c);
    struct ib_reg *g = mh;
    const char *p = addr;
    if (!g || !len || p < g->base || p + len > g->base + g->len || p + len < p)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "ib: flush of %zu bytes at %p outside its registration", len, addr);
    if (x->flush_used >= FLUSH_DEPTH)
        return rs_error(RESHARD_ERR_TOO_LARGE, "ib: more than %d flushes outstanding on %s",
                        FLUSH_DEPTH, x->port.name);
    if (!x->flush_qp) {
        reshard_status_t st = flush_qp_make(x);
        if (st != RESHARD_OK) {
            ib_flush_close(x);
            return st;
        }
    }
    if (!g->read_mr && /* host memory: readable only by the flush queue pair, from now on */
        !(g->read_mr = x->f->reg_mr(x->pd, g->base, g->len, IBV_ACCESS_REMOTE_READ)))
        return rs_error(RESHARD_ERR_NETWORK, "ib: registering %zu bytes at %p for flushes: %m",
                        g->len, (void *)g->base);
    size_t n = len < FLUSH_BYTES ? len : FLUSH_BYTES;
    struct ibv_sge sge = {
        .addr = (uintptr_t)x->flush_buf, .length = (uint32_t)n, .lkey = x->flush_mr->lkey};
    struct ibv_send_wr wr =
                           {
                               .wr_id = (uintptr_t)req | 4,
                               .sg_list = &sge,
                               .num_sge = 1,
                               .opcode = IBV_WR_RDMA_READ,
                               .send_flags = IBV_SEND_SIGNALED,
                               .wr.rdma = {.remote_addr = (uintptr_t)(p + len - n),
                                           .rkey = g->read_mr->rkey},
                           },
                       *bad;
    tp_req_start(c, req, -1, len, 0, 0);
    int e = ibv_post_send(x->flush_qp, &wr, &bad);
    if (e) {
        errno = e;
        return rs_error(RESHARD_ERR_NETWORK, "ib: posting the flush's read on %s: %m",
                        x->port.name);
    }
    req->handle = req;
    x->flush_used++;
    return RESHARD_OK;
}
