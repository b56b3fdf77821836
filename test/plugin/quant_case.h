/* SPDX-License-Identifier: Apache-2.0 */
/* The FP8 refits of the quant_exec suites (test_quant_exec*.c): one case, the host reference
 * over the whole tensor, one rank's buffers for the weight and its scales, and the refit every
 * rank runs and checks bit for bit. The suite (its setup and timeout) is declared in
 * quant_case.c; each test file adds its tests to it by name. */
#ifndef RS_TEST_QUANT_CASE_H
#define RS_TEST_QUANT_CASE_H

#include "cuda/quant.h"
#include "plugin/reshard.h"

#include <stdint.h>

/* One case: the layouts (2-D), the source dtype, the destination's FP8 format and the extent
 * of one scale along each dim, and the same destination in bf16 for the byte comparison. */
struct qcase {
    const char *src, *dst, *dst_bf16;
    int src_kind; /* 0 bf16, 1 f16, 2 f32, 3 FP8 with its scales (MOVE) */
    enum rs_fp8 fmt;
    int64_t er, ec;
    reshard_algo_t algo;
    int refits;
    int64_t src_off, dst_off; /* the weight's shards start this many elements into its buffers */
    unsigned dev_ranks;       /* ranks that pass every buffer as (the stand-in's) device memory */
    int verify;               /* the plan's verify option */
    int64_t src_pitch, dst_pitch; /* elements between rows of a shard (0: its width) */
    int fresh;                    /* each refit into (and from) newly allocated buffers */
    /* verified refits with one bit flipped in a destination (RESHARD_TEST_FLIP): the rank and
     * the byte of its FP8 weight buffer, then of its scales buffer */
    int flip_code_rank, flip_scale_rank;
    long long flip_code_byte, flip_scale_byte;
};

extern struct qcase qc; /* set before the ranks fork */
/* What every rank reports beside its status: the network bytes of the FP8 and bf16 refits. */
extern uint64_t *net_fp8, *net_bf16;
extern double *at_src_pct;       /* reshard_plan_stats' quant_at_source_pct, per rank */
extern uint64_t *quant_launches; /* the stand-in's quantization kernels run, per rank */

#define BLOCK "quant=block(128,128)"

/* The whole tensor quantized by the reference: q[rows x cols], scales[nbr x nbc]. */
struct ref {
    int64_t rows, cols, nbr, nbc;
    uint8_t *q;
    float *scales;
};

void ref_make(struct ref *r, int64_t rows, int64_t cols, int it);
void ref_free(struct ref *r);

/* Buffers for every tensor of the plan (the weight, its scales), sized for this rank's shards. */
struct qside {
    reshard_plan_t *plan;
    int nt;
    reshard_layout_t *l[2][2]; /* [tensor][side] */
    reshard_buffers_t b[2];
};

reshard_status_t qside_open(struct qside *x, reshard_comm_t *comm, int rank, const char *src,
                            const char *dst);
void qside_close(struct qside *x);
/* The sources of refit `it`: the weight in its dtype (or FP8 and its scales, for a MOVE). */
void qside_fill(struct qside *x, int rank, const struct ref *r, int it);
/* Destination elements and scales that differ from the reference, bit for bit. */
int64_t qside_wrong(const struct qside *x, int rank, const struct ref *r, char *why, size_t n);

/* ---- device buffers: the stand-in libcuda's (host memory it hands out as device memory) ---- */

/* A function of the stand-in libcuda (RESHARD_CUDA_LIB), or NULL. */
void *fake_fn(const char *name);
/* Skips the test where this build has no kernels (no nvcc). */
void need_kernels(void);
/* The library's driver: the stand-in libcuda of this build. */
void use_fake_cuda(void);
/* The buffers execute gets: x's, or device copies of them on the ranks of qc.dev_ranks. */
reshard_status_t bufs_for(const struct qside *x, int rank, reshard_buffers_t *b);
/* The device destinations back into x's, and the device copies freed. */
void bufs_back(const struct qside *x, int rank, const reshard_buffers_t *b);

/* One rank of qc: every refit executed and checked against the reference, outcomes and stats
 * recorded; then the same layouts into qc.dst_bf16 for the network bytes. */
reshard_status_t refit_and_check(int rank, int size, reshard_comm_t *comm);

/* The suite's init and fini: the shared per-rank reports mapped, unmapped. */
void quant_exec_setup(void);
void quant_exec_teardown(void);

#endif
