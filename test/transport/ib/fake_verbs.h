/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A stand-in RDMA device for the ib transport's tests and fuzz targets: an ib context of rank
 * 1 whose peer, rank 0, is up over two queue pairs, where every work request posted is
 * recorded and completions are what the caller queues (it plays the device and the peer).
 */
#ifndef RS_TEST_FAKE_VERBS_H
#define RS_TEST_FAKE_VERBS_H

#include "transport/ib/ib_int.h"

#define FAKE_MAX_WR 256

struct fake_wr { /* a posted work request, as the device saw it */
    int qp;
    int op; /* enum ibv_wr_opcode */
    uint64_t wr_id;
    uint32_t imm, rkey, new_rkey, inv_rkey, mw_access;
    uint64_t raddr, addr, len;
    struct ibv_mr *mr;
    struct ib_ctl ctl; /* a SEND's payload */
};

struct fake_dev {
    struct fake_wr wrs[FAKE_MAX_WR];
    int nwr, dropped_wr; /* recorded; posted past the record */
    struct ibv_wc cqe[FAKE_MAX_WR];
    int ncqe, cqe_next;
    struct ibv_context dev;
    struct ibv_qp qps[IB_MAX_QPS];
    int nqps;
    struct ibv_mr mrs[64];
    int nmrs, nderegs;
    struct ibv_mw mws[64];
    int nmws, ndeallocs;
    struct ibv_cq cq;
    struct ibv_pd pd;
    struct ib_fns fns;
    struct ib_ctx x;
    struct ib_peer *peer;
    int says; /* control messages delivered: each takes the next receive slot */
};

extern struct fake_dev fake;

/* Makes the context and its peer (0 when that failed); fake_down undoes it all. */
int fake_up(void);
void fake_down(void);
/* The device completes recorded work request i with status. */
void fake_complete(int i, enum ibv_wc_status status);
/* The peer writes bytes with an immediate; sends a control message (got bytes of it). */
void fake_peer_writes(uint32_t imm, uint32_t bytes);
void fake_peer_says(const struct ib_ctl *c, uint32_t got);
/* Polls the completion queue and delivers what completed. */
void fake_run(void);
/* How many recorded requests have opcode op; the first at or after from (-1: none). */
int fake_count(int op);
int fake_find(int op, int from);

#endif
