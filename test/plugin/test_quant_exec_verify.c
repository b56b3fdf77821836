/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A flipped bit in an FP8 destination (its code or its scale, host or device buffers, landed
 * or staged), caught by the verified refit on every rank. Suite quant_exec (declared in
 * quant_case.c).
 */
#include "quant_case.h"
#include "ranks.h"
#include "side.h"
#include "base/error.h"
#include "base/log.h"
#include "base/param.h"
#include "cuda/cuda_lib.h"
#include "cuda/quant.h"
#include "plugin/reshard.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/time.h>

/* ---- a flipped bit in an FP8 destination, caught by the verified refit ---- */

/* One verified refit with RESHARD_TEST_FLIP set to spec ("" for none): RESHARD_OK when it
 * passes, RESHARD_ERR_VERIFY when it fails naming `name` and nothing else, else an error. */
static reshard_status_t flipped_refit(struct qside *x, int rank, int it, const char *spec,
                                      const char *name)
{
    struct ref r;
    reshard_layout_info_t info = {0};
    reshard_status_t st = reshard_layout_info(x->l[0][1], &info);
    if (st != RESHARD_OK)
        return st;
    ref_make(&r, info.shape[0], info.shape[1], it);
    qside_fill(x, rank, &r, it);
    setenv("RESHARD_TEST_FLIP", spec, 1);
    rs_param_reload();
    reshard_buffers_t b[2];
    if ((st = bufs_for(x, rank, b)) == RESHARD_OK)
        st = reshard_plan_execute(x->plan, b);
    char m[512];
    snprintf(m, sizeof(m), "%s", reshard_last_error());
    bufs_back(x, rank, b);
    if (qc.dev_ranks) {
        int (*n)(void) = (int (*)(void))fake_fn("fake_cuda_quant_launches");
        quant_launches[rank] = n ? (uint64_t)n() : 0;
    }
    unsetenv("RESHARD_TEST_FLIP");
    rs_param_reload();
    char why[200] = "";
    int64_t wrong = qside_wrong(x, rank, &r, why, sizeof(why));
    ref_free(&r);
    if (!name) {
        if (st != RESHARD_OK || wrong)
            return rs_error(RESHARD_ERR_INTERNAL, "rank %d: unflipped refit: %s, %lld wrong (%s)",
                            rank, m, (long long)wrong, why);
        return RESHARD_OK;
    }
    char want[128];
    snprintf(want, sizeof(want), "differs from its source after the refit: %s", name);
    const char *at = strstr(m, want);
    /* the weight's name is the start of its scales' */
    int named = at && (at[strlen(want)] == '\0' || at[strlen(want)] == ' ');
    if (st != RESHARD_ERR_VERIFY || !named)
        return rs_error(RESHARD_ERR_INTERNAL, "rank %d: flipped %s: %s: %s", rank, name,
                        reshard_strerror(st), m);
    return RESHARD_ERR_VERIFY;
}

/* A verified plan: a right refit passes; one bit flipped in an FP8 code on one rank fails the
 * refit on every rank naming the weight; one flipped in a scale, naming its scales. */
static reshard_status_t flips_caught(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    struct qside x;
    qc.verify = 1;
    reshard_status_t st = qside_open(&x, comm, rank, qc.src, qc.dst);
    char spec[2][128];
    snprintf(spec[0], sizeof(spec[0]), "%d:layer.w.weight:%lld", qc.flip_code_rank,
             qc.flip_code_byte);
    snprintf(spec[1], sizeof(spec[1]), "%d:layer.w.weight_scale_inv:%lld", qc.flip_scale_rank,
             qc.flip_scale_byte);
    if (st == RESHARD_OK)
        st = flipped_refit(&x, rank, 0, "", NULL);
    if (st == RESHARD_OK)
        st = flipped_refit(&x, rank, 1, spec[0], "layer.w.weight");
    if (st == RESHARD_ERR_VERIFY)
        st = flipped_refit(&x, rank, 2, spec[1], "layer.w.weight_scale_inv");
    if (st == RESHARD_ERR_VERIFY) /* and the plan still refits right */
        st = flipped_refit(&x, rank, 3, "", NULL);
    if (st == RESHARD_ERR_VERIFY)
        st = RESHARD_OK;
    qside_close(&x);
    return st;
}

/* 512 x 256 bf16 on ranks 0-3 by rows into e4m3 128 x 128 blocks on a 2 x 2 mesh (R, S(1)):
 * every block is quantized at its sender. Ranks 1 and 3 hold columns 128-255. */
#define FLIP_AT_SRC_SRC "shape=512x256 dtype=bf16 ranks=0-3 place=S(0)"
#define FLIP_AT_SRC_DST "shape=512x256 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=R,S(1) " BLOCK
/* the same from three source ranks (171, 171, 170 rows), into S(0), S(1): the blocks of rows
 * 128-383 are cut between sources and quantized where they land; rank 0 holds rows 0-255 and
 * columns 0-127, rank 3 rows 256-511 and columns 128-255 */
#define FLIP_AT_DST_SRC "shape=512x256 dtype=bf16 ranks=0-2 place=S(0)"
#define FLIP_AT_DST_DST "shape=512x256 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=S(0),S(1) " BLOCK

Test(quant_exec, a_flipped_fp8_code_or_scale_quantized_at_the_sender_fails_the_verified_refit)
{
    qc = (struct qcase){.src = FLIP_AT_SRC_SRC,
                        .dst = FLIP_AT_SRC_DST,
                        .fmt = RS_FP8_E4M3,
                        .er = 128,
                        .ec = 128,
                        .flip_code_rank = 3,
                        .flip_code_byte = 300 * 128 + 77,
                        .flip_scale_rank = 2,
                        .flip_scale_byte = 4};
    all_ok(run_ranks(4, flips_caught), 4);
}

Test(quant_exec, a_flipped_fp8_code_or_scale_quantized_where_it_lands_fails_the_verified_refit)
{
    /* rank 0's row 200 is in block row 1 (cut between sources); its second scale, block (1, 0) */
    qc = (struct qcase){.src = FLIP_AT_DST_SRC,
                        .dst = FLIP_AT_DST_DST,
                        .fmt = RS_FP8_E4M3,
                        .er = 128,
                        .ec = 128,
                        .flip_code_rank = 0,
                        .flip_code_byte = 200 * 128 + 5,
                        .flip_scale_rank = 0,
                        .flip_scale_byte = 4};
    all_ok(run_ranks(4, flips_caught), 4);
    /* rank 3's row 400 is in block row 3, whole on source rank 2: quantized at its sender */
    qc.flip_code_rank = 3;
    qc.flip_code_byte = (400 - 256) * 128 + 9;
    qc.flip_scale_rank = 3;
    qc.flip_scale_byte = 4;
    all_ok(run_ranks(4, flips_caught), 4);
}

/* A bit flipped in a rank's staged bf16 before it is quantized (as on the way): the codes are
 * made from the flipped value and agree with it, and the staged elements' transit check, made
 * as the block is quantized, fails every rank naming the weight; the next refit passes. */
static reshard_status_t staged_flip_caught(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    struct qside x;
    qc.verify = 1;
    reshard_status_t st = qside_open(&x, comm, rank, qc.src, qc.dst);
    char spec[128];
    snprintf(spec, sizeof(spec), "%d:layer.w.weight@staged:%lld", qc.flip_code_rank,
             qc.flip_code_byte);
    if (st == RESHARD_OK)
        st = flipped_refit(&x, rank, 0, "", NULL);
    if (st == RESHARD_OK)
        st = flipped_refit(&x, rank, 1, spec, "layer.w.weight");
    if (st == RESHARD_ERR_VERIFY)
        st = flipped_refit(&x, rank, 2, "", NULL);
    qside_close(&x);
    return st;
}

Test(quant_exec, a_bit_flipped_in_staged_bf16_before_quantizing_fails_the_verified_refit)
{
    /* rank 0's staged row 200 (block row 1, cut between sources), column 5, its low byte */
    qc = (struct qcase){.src = FLIP_AT_DST_SRC,
                        .dst = FLIP_AT_DST_DST,
                        .fmt = RS_FP8_E4M3,
                        .er = 128,
                        .ec = 128,
                        .flip_code_rank = 0,
                        .flip_code_byte = 2 * (200 * 128 + 5)};
    all_ok(run_ranks(4, staged_flip_caught), 4);
}

/* Blocks 100 columns wide: codes are fingerprinted one at a time (eight at a time needs every
 * block to start on a multiple of 8), and a flip is caught alike. */
Test(quant_exec, a_flipped_fp8_code_in_blocks_not_a_multiple_of_8_wide_fails_the_verified_refit)
{
    qc = (struct qcase){.src = "shape=512x200 dtype=bf16 ranks=0-3 place=S(0)",
                        .dst = "shape=512x200 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=R,S(1) "
                               "quant=block(64,100)",
                        .fmt = RS_FP8_E4M3,
                        .er = 64,
                        .ec = 100,
                        .flip_code_rank = 3,
                        .flip_code_byte = 300 * 100 + 7,
                        .flip_scale_rank = 1,
                        .flip_scale_byte = 8};
    all_ok(run_ranks(4, flips_caught), 4);
}

/* The four refits of flips_caught, each into newly allocated device buffers of the stand-in:
 * local peers write them through CUDA IPC, so each refit's handles must open the new
 * allocations, not a mapping of a freed one kept since an earlier refit. */
Test(quant_exec, flipped_fp8_codes_and_scales_on_device_buffers_fail_the_verified_refit)
{
    use_fake_cuda();
    qc = (struct qcase){.src = FLIP_AT_SRC_SRC,
                        .dst = FLIP_AT_SRC_DST,
                        .fmt = RS_FP8_E4M3,
                        .er = 128,
                        .ec = 128,
                        .dev_ranks = 0xf,
                        .flip_code_rank = 1,
                        .flip_code_byte = 17,
                        .flip_scale_rank = 3,
                        .flip_scale_byte = 0};
    all_ok(run_ranks(4, flips_caught), 4);
    qc.src = FLIP_AT_DST_SRC; /* quantized where they land, on the device */
    qc.dst = FLIP_AT_DST_DST;
    qc.flip_code_rank = 0;
    qc.flip_code_byte = 200 * 128 + 5;
    qc.flip_scale_rank = 0;
    qc.flip_scale_byte = 4;
    all_ok(run_ranks(4, flips_caught), 4);
    for (int r = 0; r < 4; r++)
        cr_assert_gt(quant_launches[r], 0, "rank %d quantized on its device", r);
}
