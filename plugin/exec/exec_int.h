/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The executor's insides, shared by exec_share.c (this rank's share of a transfer list, its
 * chunks and regions) and exec.c (running it).
 */
#ifndef RS_EXEC_INT_H
#define RS_EXEC_INT_H

#include "exec.h"
#include "region.h"
#include "cuda/ipc.h"

#include <stdint.h>

/* Tags: kind (2 bits) | execution (10) | transfer (32) | chunk (20). A packed message (TAG_PACK)
 * puts its number among the sender's bundles to that peer in the transfer field and the
 * sender's rank in the chunk field. */
#define TAG_DATA        UINT64_C(1)
#define TAG_CTRL        UINT64_C(2)
#define TAG_PACK        UINT64_C(3)
#define MAX_CHUNKS      (INT64_C(1) << 20)
#define MAX_CHUNK_BYTES (INT64_C(1) << 30)
#define ACK_XFER        UINT32_MAX /* the transfer field of an acknowledgement's tag */

static inline uint64_t make_tag(uint64_t kind, uint32_t seq, uint32_t xfer, uint32_t chunk)
{
    return kind << 62 | (uint64_t)(seq & 1023) << 52 | (uint64_t)xfer << 20 | chunk;
}

struct exec {
    struct reshard_comm *comm;
    const struct rs_plan *plan;
    struct xfer_set xs;
    int64_t chunk_bytes;
    /* This rank's share: outgoing transfers (src == me) in rotated peer order, incoming ones
     * (dst == me, src != me) by index, and which outgoing ones each incoming one releases. */
    uint32_t *out, *in;
    size_t nout, nin;
    size_t *out_off, *in_off; /* first chunk of each, then the total */
    uint32_t *child_first, *child;
    /* Distinct peers this rank sends to (data or notices) and receives from: at the end each
     * receiver acknowledges to its senders, so that an execution ends on a sender only when
     * its bytes have landed (UCX may still hold a completed send in its buffers). */
    int *send_peers, *recv_peers;
    int nsend_peers, nrecv_peers;
    /* Per tensor: outgoing transfers that wait for the whole tensor (bcast), and how many
     * chunks must reach this rank's whole-tensor buffer first. */
    uint32_t *after_first, *after; /* [ntensors + 1], [nout] */
    size_t *tmp_chunks;            /* [ntensors] */
    /* Per tensor: chunks that land in this rank's destination buffer (from peers or itself),
     * and what the last execution left there (reshard_tensor_state_t; NULL before the first). */
    size_t *dst_chunks;
    uint8_t *outcome;
    int executed;
    int on_nccl; /* the last execution was enqueued on NCCL (RESHARD_EXECUTOR=nccl) */
    /* Registrations of the caller's buffers, redone when a pointer changes. */
    struct reg {
        const void *addr;
        size_t len;
        uint64_t id; /* device memory: the allocation's id (new memory, new registration) */
        void *mh;
    } * reg;          /* [2 * ntensors]: src, dst */
    struct reg *dreg; /* the same for device buffers, with GPUDirect (NULL until then) */
    int gdr_reported;
    char **tmp; /* [ntensors]: whole-tensor buffers (bcast), kept across runs */
    /* Device buffers on the native executor are staged through host copies: [2 * ntensors]
     * (source, destination) shadows and their sizes, kept across runs. */
    char **shadow;
    size_t *shadow_cap;
    int staged_before;
    /* CUDA IPC: this rank's exports of its device destinations that local peers write, by
     * tensor (exp_cache, made again when a buffer or its allocation changes: exp_key holds the
     * pointer and allocation id of each) and in a row (my_exp); and every rank's from the last
     * gathering: exp_n[q] at exports + q * exp_max, that table's checksum exp_table (0:
     * none). exp_refused counts allocations that would not export. */
    struct cuda_ipc_export *exp_cache, *my_exp, *exports;
    uint64_t *exp_key; /* [2 * ntensors] */
    uint32_t exp_max;
    uint32_t *exp_n; /* [size] */
    uint64_t exp_table;
    int exp_refused;
    struct cuda_ipc_maps maps; /* the peers' allocations this plan writes, mapped here */
    /* Coalescing (RESHARD_COALESCE_BYTES): network chunks of at most coalesce_bytes that leave
     * a source buffer at the start travel to each peer packed into messages of at most
     * chunk_bytes (bundles), which sender and receiver group alike: per peer, by transfer
     * index, then chunk. A bundle's pieces are (position in out[] or in[], chunk). */
    int64_t coalesce_bytes;
    struct bundle {
        int32_t peer;
        uint32_t id, first, n; /* id among this pair's bundles; pieces[first .. first + n) */
        uint64_t bytes;
    } * out_b, *in_b;
    size_t nout_b, nin_b;
    struct piece {
        uint32_t pos, chunk;
    } * out_p, *in_p;
    uint8_t *out_bundled, *in_bundled; /* by chunk, via out_off / in_off */
};

/* ---- exec_share.c ---- */

/* Chunks of a transfer: as many on both sides, since both derive them alike. */
int64_t exec_nchunks(const struct exec *x, const struct xfer *xf);
/* The chunk inside the buffer `side` (0 source, 1 destination) of the transfer. */
void exec_chunk_region(const struct exec *x, const struct xfer *xf, uint32_t chunk, int side,
                       struct region *r);
/* Position of an incoming transfer in x->in, or -1. */
long exec_in_pos(const struct exec *x, uint32_t xfer);
/* Bytes of a chunk (alike on both sides). */
uint64_t exec_chunk_bytes_of(const struct exec *x, const struct xfer *xf, uint32_t chunk);

#endif
