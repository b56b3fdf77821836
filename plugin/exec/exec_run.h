/* SPDX-License-Identifier: Apache-2.0 */
/*
 * One execution of an executor (struct exec_run) and the steps that share it: its life
 * (exec_run.c) and stages (stage.h, one file each), the start-up exchange and vote
 * (exec_hello.c), the queues and posting (exec_post.c) and the device path (exec_dev.c).
 */
#ifndef RS_EXEC_RUN_H
#define RS_EXEC_RUN_H

#include "exec_int.h"
#include "exec_vote.h"

#include <sys/uio.h>

enum exec_req_kind {
    EXEC_REQ_SEND_DATA,
    EXEC_REQ_SEND_CTRL,
    EXEC_REQ_RECV_DATA,
    EXEC_REQ_RECV_CTRL
};

struct exec_run;

/* A ready entry naming a bundle (its index in chunk) rather than a transfer's chunk. */
#define EXEC_BUNDLE_POS UINT32_MAX

/* One posted message. */
struct exec_req {
    struct tp_req req;
    struct exec_run *run;
    uint32_t pos;   /* index in the share's in[] (receives) or out[] (sends), or EXEC_BUNDLE_POS */
    uint32_t chunk; /* or the bundle's index */
    int slot;       /* staging slot, or -1 */
    uint8_t kind;
    struct iovec *iov;
};

struct exec_ready {
    uint32_t pos, chunk;
};

struct exec_queue {
    struct exec_ready *q;
    size_t head, tail, cap;
};

/* The state of one execution. */
struct exec_run {
    struct exec *x; /* not to be touched once draining: a kept run may outlive its plan */
    struct reshard_comm *comm;
    const reshard_buffers_t *bufs;
    uint32_t seq;
    reshard_status_t st;
    char why[RS_ERROR_MAX];
    int draining;                      /* failed: completions now only count down */
    struct exec_req *in_req, *out_req; /* by chunk, via in_off / out_off */
    size_t nin_req;
    uint32_t *in_arrived;             /* [nin] */
    struct exec_queue net_q, local_q; /* network sends wait for the window; local work never */
    size_t in_left, out_left;
    /* Acknowledgements: received from send_peers, sent to recv_peers once all arrived. */
    struct exec_req *ack_in, *ack_out;
    int acks_in_left, acks_out_left, acked;
    size_t *tmp_left; /* [ntensors]: chunks still to reach the whole-tensor buffer */
    size_t *dst_left; /* [ntensors]: chunks still to land in this rank's destination buffer */
    int inflight, posted;
    int *peer_inflight; /* [size] */
    int64_t last_event_ms;
    /* Device buffers: dev is the caller's buffers, bufs their host shadows (NULL: no device
     * buffers). Where the local peers' exported destinations are mapped here, by entry of the
     * links' to (on first use). */
    const reshard_buffers_t *dev;
    char **ent_ipc;
    int gdr; /* device buffers are registered (regs.dev): contiguous network chunks use them */
    int gdr_landed;      /* a chunk came in that way: flushed before the GPU reads it */
    uint8_t *src_staged; /* [ntensors]: the device source was copied to its shadow */
    struct exec_ipc_copy {
        uint32_t pos, chunk;
    } ipc_q[CUDA_IPC_EVENTS]; /* copies on the IPC stream, in order; event i % CUDA_IPC_EVENTS */
    size_t ipc_head, ipc_tail;
    /* Delta refits (exec_delta.c): what this rank votes (it can encode, the last refit it
     * holds, its destinations that do not hold it), and the verdict: this rank's chunks are
     * encoded; they may carry changes only (to destinations not in the world's stale filter). */
    int delta_can;
    uint32_t delta_version;
    uint64_t delta_stale[EXEC_STALE_WORDS];
    int delta, sparse;
};

/* ---- exec_run.c, stage_land.c ---- */

/* Records the run's first failure (and its message); returns st. */
reshard_status_t exec_run_fail(struct exec_run *r, reshard_status_t st);
/* The native executor on host buffers bufs, or on their shadows when dev (the caller's device
 * buffers) is not NULL. pre: a failure found before (staging device buffers), with which this
 * rank still joins the start, so every rank reaches the same verdict. */
reshard_status_t exec_run_all(struct exec *x, const reshard_buffers_t *bufs,
                              const reshard_buffers_t *dev, reshard_status_t pre);
/* The NCCL executor: the same start, then the plan enqueued on NCCL. */
reshard_status_t exec_run_nccl(struct exec *x, const reshard_buffers_t *bufs, int on_stream,
                               void *stream);
/* What the execution left in this rank's destination buffers: r NULL when it failed before
 * any byte moved. */
void exec_run_record(struct exec *x, const struct exec_run *r);

/* ---- exec_hello.c ---- */

/* The start of an execution: every rank says whether it can run (local), with what buffers,
 * and the verdict is the same on all. Every rank joins, even one that already failed locally,
 * so that all reach the verdict instead of waiting for it. On success the run (r, NULL on the
 * NCCL executor) knows where its peers' buffers and exports are. */
reshard_status_t exec_hello_exchange(struct exec *x, const reshard_buffers_t *bufs, uint32_t seq,
                                     reshard_status_t local, struct exec_run *r, int on_nccl);

/* ---- exec_post.c ---- */

/* This rank's buffer behind a transfer's side (host memory: the shadow of a device buffer). */
char *exec_post_base(const struct exec_run *r, const struct xfer *xf, int side);
/* Posts every receive and queues the first sends. */
reshard_status_t exec_post_start(struct exec_run *r);
/* Works through the ready queues, and acknowledges once everything arrived. */
reshard_status_t exec_post_drain(struct exec_run *r);
/* A chunk reached this rank (k: its position in in[], -1 for a copy inside the rank): release
 * what waits for it. */
void exec_post_arrived(struct exec_run *r, long k, uint32_t chunk, const struct xfer *xf);
/* Tells the receiver of out[o] that the chunk is in its memory. */
reshard_status_t exec_post_notify(struct exec_run *r, uint32_t o, uint32_t chunk);

/* ---- exec_dev.c ---- */

/* Does this local transfer write through CUDA IPC? Both sides answer alike. */
int exec_dev_via_ipc(const struct exec_run *r, const struct xfer *xf);
/* A copy inside this rank between two device buffers: on the GPU, never through the shadows. */
int exec_dev_self(const struct exec_run *r, const struct xfer *xf);
/* The device address a network chunk moves from (side 0) or into (side 1) directly, with
 * GPUDirect, or NULL (host staging); mh its registration. */
char *exec_dev_gdr_at(const struct exec_run *r, const struct xfer *xf, int side,
                      const struct region *rg);
void *exec_dev_mh(const struct exec_run *r, const struct xfer *xf, int side);
/* A chunk landed in a device destination of this rank: what the device (or the shadow) then
 * gets. k as for exec_post_arrived. */
reshard_status_t exec_dev_land(struct exec_run *r, long k, uint32_t chunk, const struct xfer *xf);
/* A copy on the IPC stream (to a local peer's device buffer, or inside the rank). Returns 0
 * when every event is in use (the chunk waits). */
int exec_dev_copy(struct exec_run *r, uint32_t o, uint32_t chunk);
/* Tells the peers about the IPC copies that have completed, in stream order. */
void exec_dev_poll(struct exec_run *r);
/* Registers the device buffers for GPUDirect: whether the run may use them. */
int exec_dev_try_gdr(struct exec *x, const reshard_buffers_t *dev);
/* Copies device sources to their shadows where something reads them there. after: the start's
 * exchange is done (local peers that do not take IPC writes are known). */
reshard_status_t exec_dev_stage_sources(struct exec_run *r, int after);
/* Does bufs hold a device buffer? */
int exec_dev_any(const struct exec *x, const reshard_buffers_t *bufs);
/* The native executor on device buffers, through their host shadows. */
reshard_status_t exec_dev_run(struct exec *x, const reshard_buffers_t *bufs);

/* ---- exec_delta.c ---- */

/* Are xf's chunks encoded in a delta run (both ends answer alike, from the plan)? */
int exec_delta_encoded(const struct exec *x, const struct xfer *xf);

/* Before the start vote, into r's delta_*: whether this rank can encode this run (the plan asked
 * for deltas, the buffers made, and for device buffers the kernels and device scratch), the last
 * refit it holds, and its destinations that do not hold it (new buffers, a run in full, a refit
 * found wrong). A device tensor's destination is the caller's device buffer. */
void exec_delta_vote(struct exec *x, const reshard_buffers_t *bufs, const reshard_buffers_t *dev,
                     struct exec_run *r);
/* The vote's verdict: the lowest rank that cannot encode (INT32_MAX: none), the smallest and
 * largest last refits, the world's stale filter; what goes in full says why at INFO. */
void exec_delta_start(struct exec_run *r, int plain_rank, uint32_t lo, uint32_t hi,
                      const uint64_t *stale);
/* As chunk `chunk` of out[o] is sent: compared with its snapshot (which then holds it) unless it
 * travels dense anyway; 1 and the message (its encoding, or the dense chunk from the snapshot),
 * or 0: it travels dense from the source, as always. */
int exec_delta_out(struct exec_run *r, uint32_t o, uint32_t chunk, const char **buf, size_t *len);
/* Where chunk `chunk` of in[k] is received, or NULL (into the destination, as always). */
char *exec_delta_in(const struct exec_run *r, size_t k, uint32_t chunk);
/* The same for a local in[k] out of a forwarder's destination: where a forwarded encoding
 * lands (its notice carries it), or NULL (the forwarder writes the chunk, the notice is empty). */
char *exec_delta_fwd_in(const struct exec_run *r, size_t k, uint32_t chunk);
/* The forwarder's side: 1 and the encoding to pass on when chunk `chunk` of out[o] forwards
 * what came encoded to a peer that holds the last refit; 0: write the applied chunk. */
int exec_delta_fwd_out(const struct exec_run *r, uint32_t o, uint32_t chunk, const char **buf,
                       size_t *len);
/* Did this run apply chunk `chunk` of in[k] on the device destination (exec_delta_dev_land), so
 * that its host shadow does not hold it? */
int exec_delta_on_dev(const struct exec_run *r, size_t k, uint32_t chunk);
/* Chunk `chunk` of in[k] arrived over the network, bytes long: its streak goes on. */
void exec_delta_arrived(const struct exec_run *r, size_t k, uint32_t chunk, size_t bytes);
/* Chunk `chunk` of in[k] arrived (bytes long) in its scratch: checked, then applied to the
 * destination; a message that does not fit is refused naming its sender (or forwarder). */
reshard_status_t exec_delta_land(struct exec_run *r, size_t k, uint32_t chunk, size_t bytes);
/* After a run that moved bytes; ok: it succeeded here (and so everywhere: a failure in flight
 * breaks the communicator). */
void exec_delta_done(struct exec *x, const struct exec_run *r, const reshard_buffers_t *bufs,
                     int ok);
/* After an execution on NCCL's stream: no destination or snapshot holds a known refit. */
void exec_delta_nccl(struct exec *x);
/* Bytes this rank holds in snapshots now, and what they come to once made (reshard_rank_stats's
 * delta_snapshot). */
uint64_t exec_delta_held(const struct exec *x);
uint64_t exec_delta_snapshot_bytes(const struct exec *x);
void exec_delta_fini(struct exec_delta *d, int ntensors, struct reshard_comm *c);

#endif
