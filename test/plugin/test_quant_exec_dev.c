/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The FP8 refits of test_quant_exec.c on device buffers of the stand-in libcuda (test/fake),
 * where the quantization kernel's emulation runs and is counted, and on a GPU where there is
 * one: the same bits as the host reference, and device buffers the kernels cannot take refused
 * on every rank. Suite quant_exec (declared in quant_case.c).
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

/* ---- device buffers, quantized by the kernels (the stand-in runs them on the host) ---- */

/* Ranks 0 and 1 pass device buffers, 2 and 3 host ones: the device senders quantize their
 * blocks with the kernels, the host senders on the host, to the same bits. */
Test(quant_exec, device_sources_quantize_at_the_senders_with_the_kernels)
{
    use_fake_cuda();
    qc = (struct qcase){.src = "shape=512x256 dtype=bf16 ranks=0-3 place=S(0)",
                        .dst = "shape=512x256 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=R,S(1) " BLOCK,
                        .src_kind = 0,
                        .fmt = RS_FP8_E4M3,
                        .er = 128,
                        .ec = 128,
                        .refits = 2,
                        .dev_ranks = 0x3};
    all_ok(run_ranks(4, refit_and_check), 4);
    for (int r = 0; r < 4; r++)
        cr_assert_eq(quant_launches[r] > 0, r < 2, "rank %d: %llu kernel launches", r,
                     (unsigned long long)quant_launches[r]);
}

/* Sources that cut blocks: what lands staged on the device ranks is quantized there by the
 * kernels, straight into the device destination and scales. */
Test(quant_exec, device_destinations_quantize_staged_blocks_with_the_kernels)
{
    use_fake_cuda();
    qc = (struct qcase){.src = "shape=512x256 dtype=bf16 ranks=0-2 place=S(0)",
                        .dst =
                            "shape=512x256 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=S(0),S(1) " BLOCK,
                        .src_kind = 0,
                        .fmt = RS_FP8_E4M3,
                        .er = 128,
                        .ec = 128,
                        .refits = 2,
                        .dev_ranks = 0xa};
    all_ok(run_ranks(4, refit_and_check), 4);
    cr_assert_eq(at_src_pct[0], 50.0, "half the blocks staged: %f", at_src_pct[0]);
    for (int r = 0; r < 4; r++)
        cr_assert_eq(quant_launches[r] > 0, r % 2 == 1, "rank %d: %llu kernel launches", r,
                     (unsigned long long)quant_launches[r]);
}

/* Every rank on the device: f32 with a partial last block and columns cut inside blocks. */
Test(quant_exec, device_buffers_with_partial_blocks_from_f32)
{
    use_fake_cuda();
    qc = (struct qcase){.src = "shape=320x200 dtype=f32 ranks=0-3 mesh=2x2 place=R,S(1)",
                        .dst = "shape=320x200 dtype=fp8e4m3 ranks=1-3 place=R " BLOCK,
                        .src_kind = 2,
                        .fmt = RS_FP8_E4M3,
                        .er = 128,
                        .ec = 128,
                        .refits = 1,
                        .dev_ranks = 0xf};
    all_ok(run_ranks(4, refit_and_check), 4);
    for (int r = 1; r < 4; r++)
        cr_assert_gt(quant_launches[r], 0, "rank %d quantized on its device", r);
}

Test(quant_exec, device_buffers_per_channel_f16_into_e5m2_and_at_offsets)
{
    use_fake_cuda();
    qc = (struct qcase){.src = "shape=256x192 dtype=f16 ranks=0-3 place=S(1)",
                        .dst = "shape=256x192 dtype=fp8e5m2 ranks=0-3 place=S(0) quant=channel "
                               "buffer=fused offset=77",
                        .src_kind = 1,
                        .fmt = RS_FP8_E5M2,
                        .er = 1,
                        .ec = 192,
                        .refits = 1,
                        .dst_off = 77,
                        .dev_ranks = 0xf};
    all_ok(run_ranks(4, refit_and_check), 4);
    for (int r = 0; r < 4; r++)
        cr_assert_gt(quant_launches[r], 0, "rank %d quantized on its device", r);
}

Test(quant_exec, device_buffers_one_scale_per_tensor_at_the_sender)
{
    use_fake_cuda();
    qc = (struct qcase){.src = "shape=200x96 dtype=bf16 ranks=0-1 place=R",
                        .dst = "shape=200x96 dtype=fp8e4m3 ranks=2-3 place=R quant=tensor",
                        .src_kind = 0,
                        .fmt = RS_FP8_E4M3,
                        .er = 200,
                        .ec = 96,
                        .refits = 1,
                        .dev_ranks = 0xf};
    all_ok(run_ranks(4, refit_and_check), 4);
    cr_assert_eq(at_src_pct[0], 100.0, "the senders hold the tensor whole: %f", at_src_pct[0]);
    for (int r = 0; r < 2; r++)
        cr_assert_gt(quant_launches[r], 0, "rank %d quantized on its device", r);
}

/* Rank 2 passes device buffers the kernels cannot take: refused on every rank before anything
 * moves. */
static reshard_status_t device_bufs_on_rank2(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    struct qside x;
    reshard_status_t st = qside_open(&x, comm, rank, qc.src, qc.dst);
    if (st == RESHARD_OK) {
        if (rank == 2)
            x.b[0].mem = x.b[1].mem = RESHARD_MEM_CUDA; /* refused before any access */
        st = reshard_plan_execute(x.plan, x.b);
    }
    char msg[256];
    snprintf(msg, sizeof(msg), "%s", reshard_last_error());
    if (reshard_comm_barrier(comm) != RESHARD_OK)
        st = rs_error(RESHARD_ERR_INTERNAL, "barrier: %s", reshard_last_error());
    else if (st != RESHARD_OK)
        st = rs_error(st, "%s", msg);
    qside_close(&x);
    return st;
}

Test(quant_exec, a_strided_device_destination_is_refused_on_every_rank)
{
    use_fake_cuda();
    qc = (struct qcase){.src = "shape=512x256 dtype=bf16 ranks=0-3 place=S(0)",
                        .dst = "shape=512x256 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=R,S(1) "
                               "view=512x128 strides=130x1 " BLOCK,
                        .src_kind = 0,
                        .fmt = RS_FP8_E4M3,
                        .er = 128,
                        .ec = 128,
                        .refits = 1};
    struct outcome *o = run_ranks(4, device_bufs_on_rank2);
    for (int r = 0; r < 4; r++) {
        cr_assert_eq(o[r].status, r == 2 ? RESHARD_ERR_INVALID_ARG : RESHARD_ERR_REMOTE,
                     "rank %d: %s", r, o[r].msg);
        cr_assert(strstr(o[r].msg, "rank 2: tensor 'layer.w.weight' is quantized on the way on "
                                   "the device, which takes a destination shard that is one "
                                   "row-major box: this one is a strided view"),
                  "rank %d: %s", r, o[r].msg);
    }
}

Test(quant_exec, a_device_source_of_several_runs_is_refused_on_every_rank)
{
    use_fake_cuda();
    /* SS(0,2) over 4 ranks: each holds two runs of 64 rows */
    qc = (struct qcase){.src = "shape=512x256 dtype=bf16 ranks=0-3 mesh=4 place=SS(0,2)",
                        .dst = "shape=512x256 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=R,S(1) " BLOCK,
                        .src_kind = 0,
                        .fmt = RS_FP8_E4M3,
                        .er = 128,
                        .ec = 128,
                        .refits = 1};
    struct outcome *o = run_ranks(4, device_bufs_on_rank2);
    for (int r = 0; r < 4; r++) {
        cr_assert_eq(o[r].status, r == 2 ? RESHARD_ERR_INVALID_ARG : RESHARD_ERR_REMOTE,
                     "rank %d: %s", r, o[r].msg);
        cr_assert(strstr(o[r].msg, "rank 2: tensor 'layer.w.weight' is quantized on the way on "
                                   "the device, which takes a source shard that is one "
                                   "row-major box: this one holds several runs of dim 0"),
                  "rank %d: %s", r, o[r].msg);
    }
}

/* With a GPU (gpu-check's gpu-unit step): the kernels themselves, in forked ranks on device
 * buffers, senders and receivers of staged blocks, every element and scale against the
 * reference; on the stand-in the same through its emulation. */
Test(gpu, quant_exec_on_device_buffers_gives_the_host_reference, .timeout = 120)
{
    need_kernels();
    quant_exec_setup();
    qc = (struct qcase){.src = "shape=512x256 dtype=bf16 ranks=0-2 place=S(0)",
                        .dst =
                            "shape=512x256 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=S(0),S(1) " BLOCK,
                        .src_kind = 0,
                        .fmt = RS_FP8_E4M3,
                        .er = 128,
                        .ec = 128,
                        .refits = 2,
                        .dev_ranks = 0xf};
    struct outcome *o = run_ranks(4, refit_and_check);
    if (o[0].status == RESHARD_ERR_UNAVAILABLE)
        cr_skip_test("no CUDA device (%s)", o[0].msg);
    all_ok(o, 4);
    cr_assert_eq(at_src_pct[0], 50.0, "half the blocks at the senders: %f", at_src_pct[0]);
    quant_exec_teardown();
}

static int failing_rank;

static void fail_launches_on(int rank)
{
    if (rank == failing_rank)
        setenv("FAKE_CUDA_FAIL", "cuLaunchKernel", 1);
}

/* The quantization kernel fails on a device sender (before it sends: every rank fails, none
 * waits for it) and on a device receiver (after everything landed: it fails, naming the
 * call). */
Test(quant_exec, a_failed_quantization_kernel_fails_the_refit)
{
    use_fake_cuda();
    qc = (struct qcase){.src = "shape=512x256 dtype=bf16 ranks=0-2 place=S(0)",
                        .dst =
                            "shape=512x256 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=S(0),S(1) " BLOCK,
                        .src_kind = 0,
                        .fmt = RS_FP8_E4M3,
                        .er = 128,
                        .ec = 128,
                        .refits = 1,
                        .dev_ranks = 0xf};
    rank_setup = fail_launches_on;
    failing_rank = 0; /* holds block row 0 whole: quantizes it before sending */
    struct outcome *o = run_ranks(4, refit_and_check);
    for (int r = 0; r < 4; r++) {
        cr_assert_neq(o[r].status, RESHARD_OK, "rank %d succeeded", r);
        cr_assert(strstr(o[r].msg, "rank 0: quantizing tensor 'layer.w.weight' on the device "
                                   "before sending: cuda: cuLaunchKernel: fake error"),
                  "rank %d: %s", r, o[r].msg);
    }
    failing_rank = 3; /* receives block row 2 staged: quantizes it once it landed */
    o = run_ranks(4, refit_and_check);
    rank_setup = NULL;
    cr_assert_neq(o[3].status, RESHARD_OK, "rank 3 succeeded");
    cr_assert(strstr(o[3].msg, "rank 3: quantizing tensor 'layer.w.weight' on the device where it "
                               "landed: cuda: cuLaunchKernel: fake error"),
              "rank 3: %s", o[3].msg);
}

/* Both sides inside fused device buffers, at offsets: blocks quantized at the device senders
 * and where they land alike. */
Test(quant_exec, device_shards_placed_at_offsets_in_their_buffers)
{
    use_fake_cuda();
    qc = (struct qcase){.src = "shape=512x256 dtype=bf16 ranks=0-2 place=S(0) buffer=fused "
                               "offset=1000",
                        .dst = "shape=512x256 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=R,S(1) "
                               "buffer=fused offset=333 " BLOCK,
                        .src_kind = 0,
                        .fmt = RS_FP8_E4M3,
                        .er = 128,
                        .ec = 128,
                        .refits = 2,
                        .src_off = 1000,
                        .dst_off = 333,
                        .dev_ranks = 0xf};
    all_ok(run_ranks(4, refit_and_check), 4);
    for (int r = 0; r < 4; r++)
        cr_assert_gt(quant_launches[r], 0, "rank %d quantized on its device", r);
}

/* More layouts, each on both algorithms, three refits: strided shards on either side, padded
 * rows (strides) on both, a replicated destination of staged blocks, blocks smaller than the
 * shards with partial last ones, and every other case into and out of freshly allocated
 * buffers each refit (so that nothing of an earlier execution's addresses is reused). */
Test(quant_exec, more_layouts_and_fresh_buffers_each_refit)
{
    const char *cases[][2] = {
        {"shape=512x256 dtype=bf16 ranks=0-3 mesh=2x2 place=SS(0,2),S(0)",
         "shape=512x256 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=R,S(1) " BLOCK},
        {"shape=512x256 dtype=bf16 ranks=0-3 place=S(1)",
         "shape=512x256 dtype=fp8e4m3 ranks=0-1 place=SS(0,2) " BLOCK},
        {"shape=512x256 dtype=bf16 ranks=0-2 place=S(1)",
         "shape=512x256 dtype=fp8e4m3 ranks=0-3 place=R " BLOCK},
        {"shape=256x200 dtype=f32 ranks=0-2 mesh=3 place=S(0)",
         "shape=256x200 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=S(0),R quant=block(128,128)"},
        {"shape=300x256 dtype=bf16 ranks=1-3 place=S(1)",
         "shape=300x256 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=S(1),R quant=block(64,32)"},
        {"shape=512x256 dtype=bf16 ranks=0-2 place=S(0) strides=300x1",
         "shape=512x256 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=R,S(1) strides=200x1 " BLOCK},
        {"shape=512x256 dtype=bf16 ranks=3 place=R",
         "shape=512x256 dtype=fp8e4m3 ranks=0-3 mesh=4 place=R " BLOCK},
        {"shape=512x256 dtype=bf16 ranks=0-3 mesh=2x2 place=S(1),S(0)",
         "shape=512x256 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=SS(1,2),S(0) "
         "quant=block(128,64)"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        for (int algo = 0; algo < 2; algo++) {
            int er = 128, ec = 128;
            if (strstr(cases[i][1], "block(64,32)"))
                er = 64, ec = 32;
            if (strstr(cases[i][1], "block(128,64)"))
                ec = 64;
            qc = (struct qcase){.src = cases[i][0],
                                .dst = cases[i][1],
                                .src_kind = strstr(cases[i][0], "f32") ? 2 : 0,
                                .fmt = RS_FP8_E4M3,
                                .er = er,
                                .ec = ec,
                                .algo = algo ? RESHARD_ALGO_DIRECT : RESHARD_ALGO_RESHARD,
                                .refits = 2};
            qc.fresh = i % 2;
            qc.refits = 3;
            if (strstr(cases[i][0], "strides"))
                qc.src_pitch = 300, qc.dst_pitch = 200;
            struct outcome *o = run_ranks(4, refit_and_check);
            for (int r = 0; r < 4; r++)
                cr_assert_eq(o[r].status, RESHARD_OK, "case %zu (%s -> %s) algo %d rank %d: %s", i,
                             cases[i][0], cases[i][1], algo, r, o[r].msg);
        }
}
