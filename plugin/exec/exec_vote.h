/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The votes of a communicator: on a plan (made on every rank, each holding its own transfers)
 * and on the start of each execution. Each is a boot_allreduce of a few hundred bytes per rank
 * at most, never a record of every rank: the fold keeps the lowest failing rank's status and
 * message, the smallest and largest of the values that must agree (so every rank can name one
 * that differs), and sums of every rank's figures. Every rank reaches the same verdict.
 *
 * The records cross the bootstrap, so what a peer put in them is checked before it is used:
 * ranks and statuses in range, texts cut at their size (exec_vote_text).
 */
#ifndef RS_EXEC_VOTE_H
#define RS_EXEC_VOTE_H

#include "plugin/comm/comm.h"
#include "plugin/reshard.h"

#include <stdint.h>

#define EXEC_VOTE_WHY    192 /* the failing rank's message, as the others repeat it */
#define EXEC_VOTE_NONE   INT32_MAX
#define EXEC_STALE_WORDS 4 /* the start vote's filter of stale destinations: 256 bits */

/* ---- the plan vote (reshard_comm_plan_create) ---- */

/* What one rank planned, and its own part of the world's figures. */
struct exec_plan_ballot {
    reshard_status_t status; /* RESHARD_OK, or why this rank could not plan */
    const char *why;         /* its message (NULL: none) */
    int32_t algo;
    uint64_t hash;
    int64_t chunk_bytes, coalesce_bytes; /* both ends must cut and pack alike */
    uint64_t local_fp; /* the local pairs it writes or is written by, as it sees them */
    /* the rank's own figures: what it sends (each transfer counted once, at its sender) */
    uint64_t net_out, net_in, local_out, self;
    uint64_t ops[4];             /* plan ops it sends, by enum plan_op_kind */
    uint64_t in_domain, lb_part; /* its parts of min_net_bytes and lb_nic_bytes */
    /* FP8 bytes it receives quantized on the way, and of them by their senders */
    uint64_t quant, quant_at_src;
    double plan_ms;
};

/* Folds every rank's ballot: RESHARD_OK with the world's figures in *world (net_bytes ..
 * plan_ms), or the verdict every rank reaches: the lowest failing rank's status where it says
 * something of the inputs every rank shares (RESHARD_ERR_DATA_LOST, _TOO_LARGE), else
 * RESHARD_ERR_REMOTE, with its message; RESHARD_ERR_PLAN_MISMATCH naming the ranks whose
 * plan, algorithm, chunk or coalescing sizes or local pairs differ from this one's. A rank that
 * failed keeps its own status and message. */
reshard_status_t exec_vote_plan(struct reshard_comm *c, const struct exec_plan_ballot *mine,
                                reshard_plan_stats_t *world);

/* ---- the start of an execution ---- */

/* What a rank says before any byte moves: the plan and execution it runs, whether it can, and
 * whether its buffers changed since its local peers last heard of them. */
struct exec_start_fold {
    struct exec_start_key {
        uint64_t hash;
        uint32_t seq;
        int32_t rank;
    } lo, hi;         /* the smallest and largest (hash, execution) and a rank holding each */
    int32_t fail;     /* the lowest rank that cannot run, or EXEC_VOTE_NONE */
    uint32_t changed; /* some rank's buffers (or way of writing) changed */
    /* Delta refits: the lowest rank that cannot encode (EXEC_VOTE_NONE: every rank can), the
     * smallest and largest last refit the ranks hold, and a filter (bits ORed) of the
     * (tensor, rank) destinations that do not hold it (exec_delta.c): a pair in it gets its
     * tensor in full; a false positive costs bytes, never a wrong element. */
    int32_t plain;
    uint32_t ver_lo, ver_hi, pad; /* pad: zero, so no stack byte crosses the bootstrap */
    uint64_t stale[EXEC_STALE_WORDS];
};

void exec_start_fold_init(struct exec_start_fold *f, int rank, uint64_t hash, uint32_t seq,
                          int failed, int changed);
/* This rank's part of the delta verdict (by default it cannot encode and holds no version). */
void exec_start_fold_delta(struct exec_start_fold *f, int rank, int can, uint32_t version,
                           const uint64_t *stale);
/* boot_allreduce's combine for exec_start_fold. */
void exec_start_combine(void *acc, const void *in, void *arg);

/* report.side: 0 or 1, a buffer check failed on that side of report.tensor; else: */
#define EXEC_SIDE_NONE    (-1) /* another failure, which why says */
#define EXEC_SIDE_STAGING 2    /* device buffers could not be staged */

/* Why a rank cannot run: sent by it (a bcast) once the fold named it. */
struct exec_start_report {
    int32_t status, tensor, side, pad;
    uint64_t need, have;
    char why[EXEC_VOTE_WHY];
};

/* The error every rank reports for rank's report r on plan: checked first, so a tensor out of
 * range or an unknown status is a clear refusal, not an index followed. */
reshard_status_t exec_start_refuse(const struct rs_plan *plan, int rank,
                                   const struct exec_start_report *r);
/* The start fold's verdict on every rank that can run (mine: this rank's own key). */
reshard_status_t exec_start_mismatch(const struct exec_start_fold *f, uint64_t hash, uint32_t seq);

/* A peer's text: at most n bytes, cut at the first NUL, anything unprintable replaced, into
 * out[n + 1]. */
void exec_vote_text(const char *in, size_t n, char *out);

#endif
