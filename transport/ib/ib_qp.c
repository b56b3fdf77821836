/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A peer's RC queue pairs: created in INIT with their receives posted and the control buffers
 * registered, brought to RTR and RTS once the handshake names the other side's, moved to the
 * error state when the peer fails, destroyed once they have flushed.
 */
#include "ib_int.h"

#include "base/error.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

reshard_status_t ib_qp_fail(struct ib_ctx *x, const struct ib_peer *p, const char *call)
{
    return rs_error(RESHARD_ERR_NETWORK, "ib: %s for rank %d on %s: %m", call, p->index,
                    x->port.name);
}

static reshard_status_t qp_init(struct ib_ctx *x, struct ib_peer *p, int i)
{
    struct ibv_qp_init_attr ia = {
        .send_cq = x->cq,
        .recv_cq = x->cq,
        .cap = {.max_send_wr = SQ_DEPTH,
                .max_recv_wr = RQ_DEPTH,
                .max_send_sge = 1,
                .max_recv_sge = 1},
        .qp_type = IBV_QPT_RC,
    };
    if (!(p->qp[i] = x->f->create_qp(x->pd, &ia)))
        return ib_qp_fail(x, p, "ibv_create_qp");
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_INIT,
        .pkey_index = 0,
        .port_num = (uint8_t)x->port.port,
        .qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
    };
    if (x->f->modify_qp(p->qp[i], &a,
                        IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        return ib_qp_fail(x, p, "ibv_modify_qp(INIT)");
    return RESHARD_OK;
}

/* The peer's QPs (in INIT, receives posted) and control buffers; the CQ grows to match. */
reshard_status_t ib_qp_setup(struct ib_ctx *x, struct ib_peer *p)
{
    int need = x->cq_need + p->nqp * (SQ_DEPTH + RQ_DEPTH);
    RS_CHECK(ib_cq_fit(x, p, need));
    size_t nslots = (size_t)p->nqp * RQ_DEPTH;
    p->rx = calloc(nslots, sizeof(*p->rx));
    p->tx = calloc(SQ_DEPTH, sizeof(*p->tx));
    if (!p->rx || !p->tx)
        return rs_error(RESHARD_ERR_NO_MEMORY, "ib: no memory for rank %d's buffers", p->index);
    p->rx_mr = x->f->reg_mr(x->pd, p->rx, nslots * sizeof(*p->rx), IBV_ACCESS_LOCAL_WRITE);
    p->tx_mr = x->f->reg_mr(x->pd, p->tx, SQ_DEPTH * sizeof(*p->tx), 0);
    if (!p->rx_mr || !p->tx_mr)
        return ib_qp_fail(x, p, "ibv_reg_mr (control buffers)");
    p->psn = (uint32_t)(x->nonce ^ (uint64_t)p->index * 0x9e3779b97f4a7c15u) & 0xffffff;
    for (int i = 0; i < p->nqp; i++)
        RS_CHECK(qp_init(x, p, i));
    for (size_t k = 0; k < nslots; k++) {
        p->rx[k] = (struct ib_slot){.peer = p, .qp = (int)(k / RQ_DEPTH)};
        RS_CHECK(ib_post_slot(x, p, &p->rx[k]));
    }
    x->cq_need = need;
    p->cq_share = p->nqp * (SQ_DEPTH + RQ_DEPTH);
    return RESHARD_OK;
}

reshard_status_t ib_qp_connect(struct ib_ctx *x, struct ib_peer *p, const struct ib_hs *h)
{
    if (h->nqp != (uint32_t)p->nqp)
        return rs_error(RESHARD_ERR_MISMATCH,
                        "ib: rank %d uses %u queue pairs a peer, this rank %d "
                        "(RESHARD_IB_QPS_PER_PEER must agree)",
                        p->index, h->nqp, p->nqp);
    const struct ib_wire_addr *r = &p->addr;
    int mtu = (int)r->mtu < x->port.mtu ? (int)r->mtu : x->port.mtu;
    for (int i = 0; i < p->nqp; i++) {
        struct ibv_qp_attr a = {
            .qp_state = IBV_QPS_RTR,
            .path_mtu = (enum ibv_mtu)mtu,
            .dest_qp_num = h->qpn[i],
            .rq_psn = h->psn,
            .max_dest_rd_atomic = 1,
            .min_rnr_timer = 12, /* 0.64 ms */
            .ah_attr = {.dlid = r->lid, .port_num = (uint8_t)x->port.port},
        };
        if (x->port.link_layer == IBV_LINK_LAYER_ETHERNET ||
            r->link_layer != IBV_LINK_LAYER_INFINIBAND) {
            a.ah_attr.is_global = 1;
            memcpy(a.ah_attr.grh.dgid.raw, r->gid, 16);
            a.ah_attr.grh.sgid_index = (uint8_t)x->port.gid_index;
            a.ah_attr.grh.hop_limit = 64;
        }
        if (x->f->modify_qp(p->qp[i], &a,
                            IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
            return ib_qp_fail(x, p, "ibv_modify_qp(RTR)");
        struct ibv_qp_attr s = {
            .qp_state = IBV_QPS_RTS,
            .timeout = 14, /* 67 ms; with 7 retries a dead peer shows within ~0.5 s */
            .retry_cnt = 7,
            .rnr_retry = 7, /* forever: receives are reposted as they are consumed */
            .sq_psn = p->psn,
            .max_rd_atomic = 1,
        };
        if (x->f->modify_qp(p->qp[i], &s,
                            IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
            return ib_qp_fail(x, p, "ibv_modify_qp(RTS)");
    }
    return RESHARD_OK;
}

void ib_qp_break(struct ib_ctx *x, struct ib_peer *p)
{
    for (int i = 0; i < p->nqp; i++) {
        struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
        if (p->qp[i])
            x->f->modify_qp(p->qp[i], &a, IBV_QP_STATE); /* flushes what is posted */
    }
}

void ib_qp_teardown(struct ib_ctx *x, struct ib_peer *p)
{
    x->cq_need -= p->cq_share;
    for (int i = 0; i < p->nqp; i++)
        if (p->qp[i])
            x->f->destroy_qp(p->qp[i]);
    if (p->rx_mr)
        x->f->dereg_mr(p->rx_mr);
    if (p->tx_mr)
        x->f->dereg_mr(p->tx_mr);
    free(p->rx);
    free(p->tx);
}
