/* SPDX-License-Identifier: Apache-2.0 */
/* The stand-in RDMA device (fake_verbs.h). */
#include "fake_verbs.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct fake_dev fake;

static int post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    (void)bad;
    for (; wr; wr = wr->next) {
        if (fake.nwr == FAKE_MAX_WR) {
            fake.dropped_wr++;
            continue;
        }
        struct fake_wr *p = &fake.wrs[fake.nwr++];
        *p = (struct fake_wr){.qp = (int)(qp - fake.qps), .op = wr->opcode, .wr_id = wr->wr_id};
        if (wr->opcode == IBV_WR_BIND_MW) {
            p->new_rkey = wr->bind_mw.rkey;
            p->mr = wr->bind_mw.bind_info.mr;
            p->addr = wr->bind_mw.bind_info.addr;
            p->len = wr->bind_mw.bind_info.length;
            p->mw_access = wr->bind_mw.bind_info.mw_access_flags;
        } else if (wr->opcode == IBV_WR_LOCAL_INV) {
            p->inv_rkey = wr->invalidate_rkey;
        } else if (wr->opcode == IBV_WR_SEND) {
            size_t n =
                wr->sg_list[0].length < sizeof(p->ctl) ? wr->sg_list[0].length : sizeof(p->ctl);
            memcpy(&p->ctl, (void *)(uintptr_t)wr->sg_list[0].addr, n);
        } else {
            p->imm = ntohl(wr->imm_data);
            p->rkey = wr->wr.rdma.rkey;
            p->raddr = wr->wr.rdma.remote_addr;
            p->len = wr->num_sge ? wr->sg_list[0].length : 0;
        }
    }
    return 0;
}

static int post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
    (void)qp, (void)wr, (void)bad;
    return 0;
}

static int poll_cq(struct ibv_cq *c, int n, struct ibv_wc *wc)
{
    (void)c;
    int k = 0;
    while (k < n && fake.cqe_next < fake.ncqe)
        wc[k++] = fake.cqe[fake.cqe_next++];
    if (fake.cqe_next == fake.ncqe) /* all taken: the queue starts over */
        fake.cqe_next = fake.ncqe = 0;
    return k;
}

static struct ibv_mw *alloc_mw(struct ibv_pd *p, enum ibv_mw_type type)
{
    if (fake.nmws == 64)
        return NULL;
    struct ibv_mw *mw = &fake.mws[fake.nmws];
    *mw = (struct ibv_mw){
        .context = &fake.dev, .pd = p, .rkey = (uint32_t)(fake.nmws + 1) << 8, .type = type};
    fake.nmws++;
    return mw;
}

static int dealloc_mw(struct ibv_mw *mw)
{
    (void)mw;
    fake.ndeallocs++;
    return 0;
}

static struct ibv_qp *create_qp(struct ibv_pd *p, struct ibv_qp_init_attr *a)
{
    (void)p, (void)a;
    if (fake.nqps == IB_MAX_QPS)
        return NULL;
    fake.qps[fake.nqps] =
        (struct ibv_qp){.context = &fake.dev, .qp_num = 0x100 + (uint32_t)fake.nqps};
    return &fake.qps[fake.nqps++];
}

static int modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask)
{
    (void)qp, (void)a, (void)mask;
    return 0;
}

static int destroy_qp(struct ibv_qp *qp)
{
    (void)qp;
    return 0;
}

static struct ibv_mr *reg_mr(struct ibv_pd *p, void *addr, size_t len, int access)
{
    (void)p;
    if (fake.nmrs == 64)
        return NULL;
    struct ibv_mr *mr = &fake.mrs[fake.nmrs];
    *mr = (struct ibv_mr){.addr = addr,
                          .length = len,
                          .lkey = (uint32_t)access,
                          .rkey = 0x1000 + (uint32_t)fake.nmrs};
    fake.nmrs++;
    return mr;
}

static int dereg_mr(struct ibv_mr *mr)
{
    (void)mr;
    fake.nderegs++;
    return 0;
}

static const char *wc_status_str(enum ibv_wc_status status)
{
    return status == IBV_WC_SUCCESS ? "success" : "an error the stand-in made";
}

static int resize_cq(struct ibv_cq *c, int n)
{
    (void)c, (void)n;
    return 0;
}

int fake_up(void)
{
    memset(&fake, 0, sizeof(fake));
    fake.dev.ops.post_send = post_send;
    fake.dev.ops.post_recv = post_recv;
    fake.dev.ops.poll_cq = poll_cq;
    fake.dev.ops.alloc_mw = alloc_mw;
    fake.dev.ops.dealloc_mw = dealloc_mw;
    fake.pd = (struct ibv_pd){.context = &fake.dev};
    fake.cq = (struct ibv_cq){.context = &fake.dev};
    fake.fns = (struct ib_fns){.reg_mr = reg_mr,
                               .dereg_mr = dereg_mr,
                               .create_qp = create_qp,
                               .modify_qp = modify_qp,
                               .destroy_qp = destroy_qp,
                               .resize_cq = resize_cq,
                               .wc_status_str = wc_status_str};
    struct ib_ctx *x = &fake.x;
    *x = (struct ib_ctx){.f = &fake.fns,
                         .pd = &fake.pd,
                         .cq = &fake.cq,
                         .cq_cap = 1 << 16,
                         .max_cqe = 1 << 20,
                         .nqp = 2,
                         .windows = 1,
                         .rank = 1,
                         .lfd = -1,
                         .hello_ms = IB_HELLO_MS};
    x->super.ops = &tp_ib_ops;
    x->super.failed_peer = -1;
    tp_deferred_init(&x->deferred);
    snprintf(x->port.name, sizeof(x->port.name), "fake0:1");
    x->peers = calloc(1, sizeof(*x->peers));
    struct ib_peer *p = calloc(1, sizeof(*p));
    if (!x->peers || !p) {
        free(x->peers);
        free(p);
        return 0;
    }
    *p = (struct ib_peer){.index = 0, .state = P_ADDR, .fd = -1, .nqp = 2};
    p->sends_tail = &p->sends;
    p->cts_tail = &p->cts;
    p->out_tail = &p->out;
    x->npeers = 1;
    x->peers[0] = fake.peer = p;
    if (ib_qp_setup(x, p) != RESHARD_OK)
        return 0;
    p->state = P_UP;
    return 1;
}

void fake_down(void)
{
    struct ib_ctx *x = &fake.x;
    if (fake.peer && fake.peer->state != P_DOWN)
        ib_peer_down(x, fake.peer, RESHARD_OK, "the test is over");
    ib_send_close_all(x); /* sends whose writes the stand-in never completes */
    ib_peer_free_all(x);
    ib_tmr_drop_all(x);
    ib_bounce_drop_all(x);
    free(x->peers);
    free(x->ids);
    free(x->free_ids);
    x->peers = NULL;
    x->ids = NULL;
    x->free_ids = NULL;
    fake.peer = NULL;
}

static void push(struct ibv_wc wc)
{
    if (fake.ncqe < FAKE_MAX_WR)
        fake.cqe[fake.ncqe++] = wc;
}

void fake_complete(int i, enum ibv_wc_status status)
{
    const struct fake_wr *w = &fake.wrs[i];
    push((struct ibv_wc){.wr_id = w->wr_id,
                         .status = status,
                         .opcode = w->op == IBV_WR_BIND_MW     ? IBV_WC_BIND_MW
                                   : w->op == IBV_WR_LOCAL_INV ? IBV_WC_LOCAL_INV
                                                               : IBV_WC_SEND,
                         .qp_num = fake.qps[w->qp].qp_num});
}

void fake_peer_writes(uint32_t imm, uint32_t bytes)
{
    push((struct ibv_wc){.wr_id = (uintptr_t)&fake.peer->rx[0] | 2,
                         .status = IBV_WC_SUCCESS,
                         .opcode = IBV_WC_RECV_RDMA_WITH_IMM,
                         .byte_len = bytes,
                         .imm_data = htonl(imm)});
}

void fake_peer_says(const struct ib_ctl *c, uint32_t got)
{
    struct ib_slot *s = &fake.peer->rx[1 + fake.says++ % (RQ_DEPTH - 1)];
    memcpy(&s->ctl, c, sizeof(*c));
    push((struct ibv_wc){.wr_id = (uintptr_t)s | 2,
                         .status = IBV_WC_SUCCESS,
                         .opcode = IBV_WC_RECV,
                         .byte_len = got});
}

void fake_run(void)
{
    ib_cq_poll(&fake.x);
    ib_deliver(&fake.x);
}

int fake_count(int op)
{
    int n = 0;
    for (int i = 0; i < fake.nwr; i++)
        n += fake.wrs[i].op == op;
    return n;
}

int fake_find(int op, int from)
{
    for (int i = from; i < fake.nwr; i++)
        if (fake.wrs[i].op == op)
            return i;
    return -1;
}
