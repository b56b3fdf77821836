/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The executor's insides: struct exec and the objects it is made of, each with its own init and
 * fini, so that exec_create and exec_destroy (exec.c) read as a list of them.
 */
#ifndef RS_EXEC_INT_H
#define RS_EXEC_INT_H

#include "exec.h"
#include "exec_bundle.h"
#include "exec_chunk.h"
#include "cuda/ipc.h"

#include <stdint.h>

/* ---- a leave heard while a run waits ---- */

/* Whether st, a failure boot_check heard, is a rank's leave (reshard_comm_leave). A rank leaves
 * only while it does not execute, and this run's vote had its ballot: it left after its part of
 * this run was done, so the run may still complete. The leave stays with the bootstrap, for the
 * next collective to report. */
static inline int exec_heard_leave(const struct reshard_comm *c, reshard_status_t st)
{
    return st == RESHARD_ERR_REMOTE && boot_left(c->boot) >= 0;
}

/* ---- this rank's share of the transfer list (exec_share.c) ---- */

struct exec_share {
    /* Outgoing transfers (src == me) in rotated peer order, incoming ones (dst == me, src !=
     * me) by index, and which outgoing ones each incoming one releases. */
    uint32_t *out, *in;
    size_t nout, nin;
    size_t *out_off, *in_off;   /* first chunk of each, then the total */
    uint32_t *out_tag, *in_tag; /* each one's number in its pair's tags (exec_tag.h) */
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
    /* Per tensor: chunks that land in this rank's destination buffer (from peers or itself). */
    size_t *dst_chunks;
};

/* The share of rank `rank` of a communicator of `size` ranks in cut's transfer list. */
reshard_status_t exec_share_init(struct exec_share *s, const struct exec_cut *cut, int rank,
                                 int size);
/* Connects to every peer the share exchanges messages with, so that a rank that only receives
 * also hears when a sender's connection fails. */
reshard_status_t exec_share_connect(const struct exec_share *s, const struct xfer_set *xs,
                                    struct tp_ctx *net);
void exec_share_fini(struct exec_share *s);
/* Position of an incoming transfer in s->in, or -1. */
long exec_share_in_pos(const struct exec_share *s, uint32_t xfer);

/* ---- memory the executor keeps across runs (exec_mem.c) ---- */

/* After a failed execution, requests may still use its registrations and peers may still write
 * into its buffers: every fini below then hands them to the communicator, which frees them once
 * its network context is closed. */

/* Registrations of the caller's buffers, redone when a pointer changes. */
struct exec_reg {
    const void *addr;
    size_t len;
    uint64_t id; /* device memory: the allocation's id (new memory, new registration) */
    void *mh;
};

struct exec_regs {
    int n; /* 2 * ntensors: src, dst */
    struct exec_reg *host;
    struct exec_reg *dev; /* the same for device buffers, with GPUDirect (NULL until then) */
    int dev_reported;     /* the first run said whether device buffers use GPUDirect */
};

reshard_status_t exec_regs_init(struct exec_regs *g, int ntensors);
/* Registers a buffer, once per pointer, size and allocation (id: 0 for host memory, or when
 * the driver cannot tell). */
reshard_status_t exec_reg_one(struct tp_ctx *net, struct exec_reg *g, const void *addr, size_t len,
                              enum tp_mem mem, uint64_t id);
void exec_regs_fini(struct exec_regs *g, struct reshard_comm *c);

/* Whole-tensor buffers for the broadcast baseline, on the ranks that use one; made by the
 * first run, kept for the next (fresh pages would fault in under every cross-memory write). */
struct exec_tmp {
    char **buf; /* [ntensors + 1]: NULL where this rank holds none */
};

reshard_status_t exec_tmp_alloc(struct exec_tmp *t, const struct rs_plan *plan,
                                const struct xfer_set *xs, int rank);
void exec_tmp_fini(struct exec_tmp *t, int ntensors, struct reshard_comm *c);

/* A buffer array of n (with room for one more) freed, or kept by the communicator when a
 * failed execution may still write into it. */
void exec_bufs_release(char **buf, int n, struct reshard_comm *c);

/* ---- FP8 destinations quantized on the way (exec_quant.c) ---- */

/* By tensor, made once per plan for the transfers of this rank (xfer.h, XBUF_QSRC and
 * XBUF_STAGE): a CAST weight's FP8 values of this rank's source shard and its scales tensor
 * whole (float32), as this rank quantizes them before sending; a CAST weight's destination
 * shard in the source dtype, where what crosses unquantized lands. done: per scales tensor,
 * the blocks done this run: scales computed as a sender [0, n), as a receiver [n, 2n), blocks
 * cast as a sender [2n, 3n). */
struct qgeo;
struct exec_quant {
    char **qsrc, **stage; /* [ntensors + 1] */
    uint8_t **done;       /* [ntensors] */
    struct qgeo **geo;    /* [2 * ntensors]: where this rank's source, destination elements are */
    uint64_t bytes;       /* what they hold */
    /* By CAST weight w: the transfers of w and its scales this rank quantizes for, as a sender
     * (QSRC) or where they land (STAGE): xfer[first[w] .. first[w + 1]). */
    size_t *first, *xfer; /* [ntensors + 1], [their count] */
    /* [3 * ntensors]: device memory for device buffers (exec_quant_dev.c), made at first use:
     * a sender's FP8 copy and scales, a receiver's staged shard; 0 where none */
    uint64_t *dev;
    /* By CAST weight w, for a verified refit (exec_quant_expect; verify: the plan verifies, so
     * they are made): the fingerprints of the cut blocks this rank quantizes where they land on
     * the host, made as each is quantized: its codes and scale, and its staged elements for the
     * transit check ([3w], [3w + 1], [3w + 2]), landed_ok[w] once they are; landed_tmp a row */
    int verify;
    uint64_t *landed_fp;
    uint8_t *landed_ok, *landed_tmp;
    int64_t landed_tmp_n;
    /* Delta refits (exec_delta.c), by CAST weight w quantized where it lands: blk_fp[w] the
     * fingerprints of each cut block as last made ([3k] .. [3k + 2], as landed_fp's), kept
     * across runs, since a delta run quantizes again only the blocks it changed; blk_ok[w]
     * once they are all there; dirty[w] the blocks a delta changed this run. By transfer:
     * via_delta[i], the chunks of a staged transfer a delta run applied (exec_quant_touched). */
    uint64_t **blk_fp;
    uint8_t **dirty, *blk_ok;
    uint32_t *via_delta;
    /* By CAST weight w this rank quantizes as a sender on the host, for a verified refit:
     * sent_fp[w][k] the fingerprint of block k's codes as cast this run (the cast flags say
     * which), sent_ok[w] once they are made. */
    uint64_t **sent_fp;
    uint8_t *sent_ok;
};

reshard_status_t exec_quant_init(struct exec_quant *q, const struct rs_plan *plan,
                                 const struct xfer_set *xs, int rank);
void exec_quant_fini(struct exec_quant *q, int ntensors, struct reshard_comm *c);
struct exec;
/* Before a run: quantized tensors' buffers are ones the executor can quantize (a clear refusal
 * names the tensor). */
reshard_status_t exec_quant_check(const struct exec *x, const reshard_buffers_t *bufs);
/* Before the first send: the blocks this rank quantizes as a sender, from its sources (bufs;
 * dev: the caller's device buffers behind them, or NULL). */
reshard_status_t exec_quant_at_src(struct exec *x, const reshard_buffers_t *bufs,
                                   const reshard_buffers_t *dev);
/* Once everything bound for this rank landed: its staged blocks quantized into the
 * destinations, with their scales. left (or NULL: every tensor): after a failure, the chunks
 * of each tensor still to land: only the tensors with none left, which the outcome calls
 * complete (nothing writes into them any more). sparse: a delta run where only changes
 * travelled: of the transfers it applied whole (exec_quant_touched), the blocks it changed. */
reshard_status_t exec_quant_landed(struct exec *x, const reshard_buffers_t *bufs,
                                   const reshard_buffers_t *dev, const size_t *left, int sparse);
/* A delta run (sparse: only changes travel) landed chunk `chunk` (region rg of the staged
 * copy) of staged transfer xs index i: msg, the encoded message, changed some of its elements,
 * or NULL: it came dense. Its weight's blocks that changed are quantized again, no others. */
void exec_quant_touched(struct exec *x, size_t i, const struct region *rg, const void *msg);
/* The same on device buffers, with the kernels (exec_quant_dev.c), for CAST weight w. */
reshard_status_t exec_quant_dev_check(const struct exec *x, const reshard_buffers_t *bufs,
                                      uint32_t w);
int exec_quant_dev_src(const reshard_buffers_t *dev, uint32_t w);
int exec_quant_dev_dst(const reshard_buffers_t *dev, uint32_t w);
reshard_status_t exec_quant_dev_at_src(struct exec *x, uint32_t w, const reshard_buffers_t *dev);
reshard_status_t exec_quant_dev_landed(struct exec *x, uint32_t w, const reshard_buffers_t *dev);
void exec_quant_dev_fini(struct exec_quant *q, int ntensors);

/* What a verified refit compares CAST weight w's destinations with, made where its blocks are
 * quantized (exec_quant_expect.c): fingerprints in the weight's and its scales' global index space.
 */
struct exec_quant_fp {
    /* the blocks of this rank's source shard, when src_counts (it is the replica that counts):
     * codes and scales of those whole in it, the elements of those it holds part of */
    uint64_t src_codes, src_scales, src_plain;
    /* the blocks of its destination shard quantized here: codes and scales quantized again from
     * the staged copy, and the staged elements */
    uint64_t dst_codes, dst_scales, dst_plain;
    /* grouped: the codes are fingerprinted eight at a time (fingerprint_run8, every block
     * starting on a multiple of 8 along the last dim), and dst_held is the fingerprint of the
     * codes this rank's destination buffer holds; else the destination's codes are
     * fingerprinted one at a time, as any shard (fingerprint_shard) */
    int grouped;
    uint64_t dst_held;
};
reshard_status_t exec_quant_expect(const struct exec *x, const reshard_buffers_t *bufs, uint32_t w,
                                   int src_counts, struct exec_quant_fp *fp);

/* Device buffers on the native executor are staged through host copies (pinned when the driver
 * allows): [2 * ntensors] (source, destination) shadows and their sizes, kept across runs. */
struct exec_shadows {
    char **buf;   /* [2 * ntensors + 1] */
    size_t *cap;  /* [2 * ntensors] */
    int reported; /* the first staged run said where the shadows live */
};

/* host[] is bufs with every device buffer replaced by its shadow, grown to the buffer's size
 * (the device's bytes are not copied here). */
reshard_status_t exec_shadows_stage(struct exec_shadows *s, int ntensors,
                                    const reshard_buffers_t *bufs, reshard_buffers_t *host);
void exec_shadows_fini(struct exec_shadows *s, int ntensors, struct reshard_comm *c);

/* ---- CUDA IPC exports (exec_export.c) ---- */

/* This rank's exports of its device destinations that local peers write, by tensor (cache[t],
 * tensor UINT32_MAX where the allocation would not export; made again when a buffer or its
 * allocation changes: key holds the pointer and allocation id of each). refused counts
 * allocations that would not export. maps: the peers' allocations this plan writes, mapped
 * here. */
struct exec_exports {
    struct cuda_ipc_export *cache; /* [ntensors] */
    uint8_t *live;                 /* [ntensors]: exported for this run */
    uint64_t *key;                 /* [2 * ntensors] */
    int refused;
    struct cuda_ipc_maps maps;
};

struct exec;
/* The exports of this rank's device destinations in dev[] (NULL: none) that local peers write,
 * when CUDA IPC is on: *n of them in the cache. */
reshard_status_t exec_exports_make(struct exec *x, const reshard_buffers_t *dev, uint32_t *n);
/* Tensor t's export, or NULL (none, or not made this run). */
const struct cuda_ipc_export *exec_export_of(const struct exec *x, uint32_t t);
void exec_exports_fini(struct exec_exports *e, int ntensors);

/* ---- the local pairs: who writes whose memory (exec_link.c) ---- */

/* The local transfers of a pair, writer to receiver, come down to entries: the distinct
 * (tensor, buffer) the writer writes, ascending, which each end lists from its own transfers.
 * span: the bytes the receiver's buffer must span (its shard, or the whole tensor). */
struct exec_entry {
    uint32_t tensor;
    uint32_t buf; /* XBUF_DST or XBUF_TMP */
    uint64_t span;
};

struct exec_pairs {
    int n;
    int *peer;              /* [n], ascending */
    uint32_t *first;        /* [n + 1]: the peer's entries */
    struct exec_entry *ent; /* [first[n]] */
};

/* What a run writes where, kept across runs, and told again only when it changes: a receiver
 * announces its buffers (and CUDA IPC exports) to each local peer that writes them, a writer
 * says whether it writes through CUDA IPC. */
struct exec_links {
    struct exec_pairs to, from; /* the peers this rank writes into, and those writing into it */
    int32_t *ent_of;            /* [xs.n]: an outgoing local transfer's entry in to, else -1 */
    int32_t *writer_of;         /* [xs.n]: an incoming local transfer's writer in from, else -1 */
    /* As a writer, what each receiver announced, by entry of to. */
    uint64_t *addr;
    struct cuda_ipc_export *exp;
    uint8_t *has_exp;
    /* As a receiver: whether each writer (of from) writes through CUDA IPC, which of this
     * rank's destinations went out exported, and what it announced (a digest per tensor). */
    uint8_t *cuda;
    uint8_t *exported;  /* [ntensors] */
    uint64_t *told_key; /* [ntensors] */
    int told;           /* the peers know the current state (0: tell them at the next start) */
    int told_cuda;      /* the way of writing this rank last told its receivers */
    uint64_t local_fp;  /* the local pairs and their paths, for the plan vote */
    struct link_phase *phase; /* the exchange's messages, made once (exec_links_prepare) */
};

/* Sends a local transfer to a peer the kernel did not vouch for over the network instead (both
 * ends alike: exec_vote_plan compares local_fp), then lists the pairs. */
reshard_status_t exec_links_build(struct exec *x);
void exec_links_fini(struct exec_links *l);
/* Did this rank's buffers (bufs, with dev the caller's device buffers or NULL) or its way of
 * writing change since its peers last heard? */
int exec_links_changed(const struct exec *x, const reshard_buffers_t *bufs,
                       const reshard_buffers_t *dev);
/* The exchange's buffers, made before the start vote so that failing to is a refusal. */
reshard_status_t exec_links_prepare(struct exec *x);
/* The exchange itself, on every rank once the start vote said some rank's changed. */
reshard_status_t exec_links_announce(struct exec *x, const reshard_buffers_t *bufs,
                                     const reshard_buffers_t *dev, uint32_t seq);

/* ---- delta refits (exec_delta.c, docs/delta.md) ---- */

/* A transfer's chunks are encoded in a delta run when it crosses the network from the caller's
 * source straight into the caller's destination, unquantized, and the chunk is not packed
 * with others: both ends decide alike. The sender keeps, per tensor, a snapshot of what it last
 * sent of such transfers (chunk i of out[] at snap_at[i] in snap[tensor]); the receiver takes each
 * such chunk into scratch (at in_at[chunk]) and applies it in place.
 *
 * Versions (docs/delta.md): `last` is seq + 1 of this plan's last refit that succeeded (the same
 * on every rank: a refit that fails in flight breaks the communicator). Each of this rank's
 * destinations holds a version (dst_ver: seq + 1 of the refit that last wrote it whole, into
 * the buffer dst_seen), each snapshot too (snap_ver). A chunk to (tensor, destination) carries
 * changes only when both hold `last`; the start vote tells every sender which destinations do
 * not (exec_vote.h's stale filter). */
struct exec_delta {
    int on; /* the plan asked for delta refits */
    int ready;
    int said;   /* why this rank cannot encode, said once */
    int forged; /* RESHARD_TEST_DELTA_FORGE did its one forgery */
    uint32_t last;
    const void **dst_seen; /* [ntensors] */
    size_t *dst_len;       /* [ntensors] */
    uint32_t *dst_ver;     /* [ntensors] */
    uint8_t *dst_why;      /* [ntensors]: why dst_ver is not `last` (enum delta_why) */
    uint8_t *in_t;         /* [ntensors]: some chunk of it comes in encoded */
    uint32_t *snap_ver;    /* [ntensors] */
    uint8_t *out_enc;      /* [nout]: out[o] is encoded */
    uint8_t *in_enc;       /* [nin]: in[k] may come encoded (DELTA_IN_*) */
    char **snap;           /* [ntensors + 1] */
    uint64_t *snap_at;     /* [out chunks]: where each chunk's snapshot is in its tensor's */
    uint64_t *snap_bytes;  /* [ntensors] */
    uint8_t *warned;       /* [ntensors]: its snapshot could not be made, said once */
    uint64_t *enc_at;      /* [out chunks]: where each chunk's encoding is in mem[DELTA_MEM_ENC] */
    uint64_t *in_at;       /* [in chunks]: where each chunk lands in mem[DELTA_MEM_SCRATCH] */
    uint32_t *in_len;      /* [in chunks]: its encoding's length, as it landed (0: dense) */
    uint8_t *in_streak;    /* [in chunks]: runs in a row it came dense (exec_delta.c's forced) */
    uint8_t *out_streak;   /* [out chunks]: the same, as its sender counts */
    uint8_t *snap_ok;      /* [out chunks]: its snapshot holds what it last sent */
    uint8_t *in_dev;       /* [in chunks]: this run applied it on the device destination */
    long *fwd_of;          /* [nout]: a forward of what in[k] brought encoded (k), or -1 */
    uint64_t scratch_bytes, enc_bytes, max_chunk;
    uint64_t *words; /* scratch of the encoder */
    /* The run's own buffers, which a failed run's requests may still use (exec_bufs_release). */
    char **mem;                 /* [DELTA_MEM_N + 1] */
    uint64_t held;              /* bytes of the snapshots in host memory */
    struct exec_delta_dev *dev; /* device snapshots and scratch (exec_delta_dev.c), or NULL */
};

/* in_enc[k]: how in[k] may come encoded: over the network from its source, or passed on by
 * a forwarder in its domain (exec_delta_fwd_out). */
enum { DELTA_IN_NET = 1, DELTA_IN_FWD = 2 };

/* Why a destination does not hold the last refit. */
enum delta_why {
    DELTA_WHY_FIRST,
    DELTA_WHY_BUFFERS,
    DELTA_WHY_FULL,
    DELTA_WHY_VERIFY,
    DELTA_WHY_FP8_DEVICE
};
enum { DELTA_MEM_SCRATCH, DELTA_MEM_ENC, DELTA_MEM_PACK, DELTA_MEM_N };

/* ---- what the last execution left (stage_land.c records it) ---- */

struct exec_last {
    uint8_t *state; /* [ntensors]: reshard_tensor_state_t */
    int executed;   /* 0 before the first execution */
    int on_nccl;    /* it was enqueued on NCCL (RESHARD_EXECUTOR=nccl): the stream knows */
};

/* ---- the executor ---- */

struct exec {
    struct reshard_comm *comm;
    const struct rs_plan *plan;
    struct xfer_set xs;
    struct exec_cut cut;             /* how each transfer is cut into chunks */
    struct exec_share share;         /* what this rank sends and receives */
    struct exec_bundles out_b, in_b; /* the small chunks it packs, each way */
    struct exec_regs regs;
    struct exec_tmp tmp;
    struct exec_quant quant;
    struct exec_shadows shadows;
    struct exec_exports exp;
    struct exec_links links;
    struct exec_last last;
    struct exec_delta delta;
    /* A communicator plan's world figures, from the plan vote (reshard_plan_stats). */
    reshard_plan_stats_t world;
};

#endif
