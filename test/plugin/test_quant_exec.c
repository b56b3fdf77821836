/* SPDX-License-Identifier: Apache-2.0 */
/*
 * FP8 destinations executed on forked ranks on host buffers: bf16, f16 and f32 sources
 * quantized on the way (at the senders where they hold the blocks whole, else where the blocks
 * land), per block, per channel and per tensor, and FP8 sources moved with their scales. Every
 * FP8 element and every scale of every destination shard is compared bit for bit with the host
 * reference (cuda/quant.h) computed over the whole tensor (quant_case.c). Device buffers are in
 * test_quant_exec_dev.c, flipped bits caught by a verified refit in test_quant_exec_verify.c.
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

Test(quant_exec, aligned_bf16_sources_quantize_at_the_senders_and_halve_the_network_bytes)
{
    qc = (struct qcase){.src = "shape=512x256 dtype=bf16 ranks=0-3 place=S(0)",
                        .dst = "shape=512x256 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=R,S(1) " BLOCK,
                        .dst_bf16 = "shape=512x256 dtype=bf16 ranks=0-3 mesh=2x2 place=R,S(1)",
                        .src_kind = 0,
                        .fmt = RS_FP8_E4M3,
                        .er = 128,
                        .ec = 128,
                        .refits = 2};
    all_ok(run_ranks(4, refit_and_check), 4);
    uint64_t fp8 = net_fp8[0], bf = net_bf16[0];
    cr_log_info("aligned 512x256 bf16 -> fp8e4m3 block(128,128), 4 ranks in 2 domains: network "
                "%llu bytes, bf16 refit %llu (%.3f x)",
                (unsigned long long)fp8, (unsigned long long)bf, (double)fp8 / (double)bf);
    cr_assert_gt(fp8, 0);
    for (int r = 0; r < 4; r++)
        cr_assert_eq(at_src_pct[r], 100.0, "rank %d: every block quantized at its sender", r);
    cr_assert_leq(fp8 * 100, bf * 51, "FP8 %llu bytes, bf16 %llu", (unsigned long long)fp8,
                  (unsigned long long)bf);
}

Test(quant_exec, uneven_sources_that_cut_blocks_land_staged_and_quantize_where_they_land)
{
    /* 512 rows on 3 ranks (171, 171, 170): the blocks at rows 128 and 256 straddle them */
    qc = (struct qcase){.src = "shape=512x256 dtype=bf16 ranks=0-2 place=S(0)",
                        .dst =
                            "shape=512x256 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=S(0),S(1) " BLOCK,
                        .src_kind = 0,
                        .fmt = RS_FP8_E4M3,
                        .er = 128,
                        .ec = 128,
                        .refits = 2};
    all_ok(run_ranks(4, refit_and_check), 4);
    /* of the 4 block rows, 0 (rows 0-127, on rank 0) and 3 (384-511, on rank 2) are held whole */
    cr_assert_eq(at_src_pct[0], 50.0, "the world's figure, from the plan vote: %f", at_src_pct[0]);
    cr_assert_eq(at_src_pct[3], at_src_pct[0]);
}

Test(quant_exec, a_partial_last_block_and_columns_cut_inside_blocks)
{
    /* 320 x 200: the last block row holds 64 rows, the last block column 72; the source's
     * columns split at 100, inside block column 0 */
    qc = (struct qcase){.src = "shape=320x200 dtype=f32 ranks=0-3 mesh=2x2 place=R,S(1)",
                        .dst = "shape=320x200 dtype=fp8e4m3 ranks=1-3 place=R " BLOCK,
                        .src_kind = 2,
                        .fmt = RS_FP8_E4M3,
                        .er = 128,
                        .ec = 128,
                        .refits = 1};
    all_ok(run_ranks(4, refit_and_check), 4);
}

Test(quant_exec, shards_placed_at_offsets_in_their_buffers)
{
    /* a weight inside a fused buffer on both sides (as vLLM's fused_qkv_a_proj): the source's
     * values are read, and the destination's written, at their offsets; blocks quantized at the
     * senders and where they land alike */
    qc = (struct qcase){.src = "shape=512x256 dtype=bf16 ranks=0-2 place=S(0) buffer=fused "
                               "offset=1000",
                        .dst = "shape=512x256 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=R,S(1) "
                               "buffer=fused offset=333 " BLOCK,
                        .src_kind = 0,
                        .fmt = RS_FP8_E4M3,
                        .er = 128,
                        .ec = 128,
                        .refits = 1,
                        .src_off = 1000,
                        .dst_off = 333};
    all_ok(run_ranks(4, refit_and_check), 4);
}

/* What each rank logged as its quantization buffers (exec_quant.c, at INFO). */
static uint64_t *quant_bytes;

static void quant_bytes_sink(enum rs_log_level level, unsigned long flags, const char *msg)
{
    (void)level;
    (void)flags;
    int r = -1;
    unsigned long long n = 0;
    const char *at = strstr(msg, "rank ");
    if (at && sscanf(at, "rank %d: %llu bytes for quantizing", &r, &n) == 2 && r >= 0 &&
        r < MAX_RANKS)
        quant_bytes[r] = n;
}

static reshard_status_t refit_logging_quant_bytes(int rank, int size, reshard_comm_t *comm)
{
    rs_log_set_sink(quant_bytes_sink);
    reshard_status_t st = refit_and_check(rank, size, comm);
    rs_log_set_sink(NULL);
    return st;
}

/* Weights 4 Mi elements into fused buffers on both sides: the sender's FP8 copy and the
 * receiver's staging copy hold the rank's shard (docs/layouts.md: "a staging copy of its
 * destination shard"), not the fused buffer up to the weight's offset. With every tensor of a
 * model at its offset in one flat buffer, copies reaching back to each offset would add up to
 * the buffer's size times the number of tensors. */
Test(quant_exec, fp8_and_staging_copies_hold_the_shard_not_the_fused_buffer_before_it)
{
    quant_bytes = mmap(NULL, MAX_RANKS * sizeof(uint64_t), PROT_READ | PROT_WRITE,
                       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(quant_bytes, MAP_FAILED);
    memset(quant_bytes, 0, MAX_RANKS * sizeof(uint64_t));
    qc = (struct qcase){.src = "shape=512x256 dtype=bf16 ranks=0-2 place=S(0) buffer=fused "
                               "offset=4194304",
                        .dst = "shape=512x256 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=R,S(1) "
                               "buffer=fused offset=4194304 " BLOCK,
                        .src_kind = 0,
                        .fmt = RS_FP8_E4M3,
                        .er = 128,
                        .ec = 128,
                        .refits = 2,
                        .src_off = 4194304,
                        .dst_off = 4194304};
    all_ok(run_ranks(4, refit_logging_quant_bytes), 4);
    for (int r = 0; r < 4; r++) {
        /* at most: a source shard of 171 x 256 in FP8, the scales, a destination shard of
         * 512 x 128 in bf16 */
        uint64_t most = 171 * 256 + 4 * 2 * 4 + 512 * 128 * 2;
        cr_log_info("rank %d: %llu bytes for quantizing", r, (unsigned long long)quant_bytes[r]);
        cr_assert_gt(quant_bytes[r], 0, "rank %d logged its quantization buffers", r);
        cr_assert_leq(quant_bytes[r], most, "rank %d: %llu bytes, the shards need %llu", r,
                      (unsigned long long)quant_bytes[r], (unsigned long long)most);
    }
    munmap(quant_bytes, MAX_RANKS * sizeof(uint64_t));
}

/* A failed execution: rank 1 receives an FP8 weight from ranks 0 and 2 (block row 1 cut
 * between them, so it lands staged) and a plain 64 MiB tensor from rank 3, which stops itself
 * 150 ms into the execution. Rank 1 times out; the weight's chunks had all landed, and
 * reshard_plan_outcome calls a complete tensor one that holds the new values. */
#define FAIL_W_SRC "shape=384x256 dtype=bf16 ranks=0,2 mesh=2 place=S(0)"
#define FAIL_W_DST "shape=384x256 dtype=fp8e4m3 ranks=1 place=R " BLOCK
#define FAIL_V_SRC "shape=2048x8192 dtype=i32 ranks=3 place=R"
#define FAIL_V_DST "shape=2048x8192 dtype=i32 ranks=1 place=R"

static int *fail_seen; /* [0]: rank 1 failed, [1]: with the weight complete, [2]: right */

static void stop_self(int sig)
{
    (void)sig;
    raise(SIGSTOP);
}

static reshard_status_t weight_complete_then_a_peer_stops(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    struct qside x;
    memset(&x, 0, sizeof(x));
    reshard_layout_t *ws = parse(FAIL_W_SRC), *wd = parse(FAIL_W_DST), *vs = parse(FAIL_V_SRC),
                     *vd = parse(FAIL_V_DST);
    reshard_tensor_t t[2] = {{"layer.w.weight", ws, wd}, {"v", vs, vd}};
    reshard_status_t st = reshard_comm_plan_create(comm, t, 2, NULL, &x.plan);
    reshard_buffers_t b[3] = {{0}};
    if (st == RESHARD_OK && reshard_plan_ntensors(x.plan) != 3)
        st = rs_error(RESHARD_ERR_INTERNAL, "%d tensors", reshard_plan_ntensors(x.plan));
    for (int k = 0; st == RESHARD_OK && k < 3; k++)
        for (int side = 0; side < 2; side++) {
            reshard_layout_t *l = NULL;
            size_t bytes = 0;
            reshard_plan_tensor_layout(x.plan, k, side, &l);
            reshard_layout_shard_bytes(l, rank, &bytes);
            void *p = bytes ? calloc(1, bytes) : NULL;
            if (side) {
                b[k].dst = p;
                b[k].dst_bytes = bytes;
            } else {
                b[k].src = p;
                b[k].src_bytes = bytes;
            }
            if (k != 1) /* the weight and its scales, as qside holds them */
                x.l[k / 2][side] = l;
            else
                reshard_layout_destroy(l);
        }
    x.nt = 2;
    x.b[0] = b[0];
    x.b[1] = b[2];
    struct ref r = {0};
    if (st == RESHARD_OK) {
        ref_make(&r, 384, 256, 0);
        qside_fill(&x, rank, &r, 0);
        b[0] = x.b[0];
        b[2] = x.b[1];
        for (int k = 0; k < 3; k++)
            if (b[k].dst)
                memset(b[k].dst, 0xa5, b[k].dst_bytes);
    }
    if (rank == 3) {
        struct itimerval soon = {.it_value = {.tv_usec = 150 * 1000}};
        signal(SIGALRM, stop_self);
        setitimer(ITIMER_REAL, &soon, NULL);
    }
    if (st == RESHARD_OK)
        st = reshard_plan_execute(x.plan, b);
    reshard_tensor_state_t states[3];
    if (rank == 1 && st != RESHARD_OK && reshard_plan_outcome(x.plan, states) == RESHARD_OK) {
        char why[200] = "";
        fail_seen[0] = 1;
        fail_seen[1] = states[0] == RESHARD_TENSOR_COMPLETE && states[2] == RESHARD_TENSOR_COMPLETE;
        fail_seen[2] = fail_seen[1] && !qside_wrong(&x, rank, &r, why, sizeof(why));
        fprintf(stderr, "rank 1: %s; outcomes %d %d %d; %s\n", reshard_strerror(st), states[0],
                states[1], states[2], why);
    }
    ref_free(&r);
    reshard_plan_destroy(x.plan);
    for (int k = 0; k < 3; k++) {
        free((void *)b[k].src);
        free(b[k].dst);
    }
    for (int k = 0; k < 2; k++)
        for (int side = 0; side < 2; side++)
            reshard_layout_destroy(x.l[k][side]);
    reshard_layout_destroy(ws);
    reshard_layout_destroy(wd);
    reshard_layout_destroy(vs);
    reshard_layout_destroy(vd);
    return RESHARD_OK;
}

Test(quant_exec, a_weight_complete_in_a_failed_execution_holds_its_new_values)
{
    qc = (struct qcase){.src = FAIL_W_SRC,
                        .dst = FAIL_W_DST,
                        .src_kind = 0,
                        .fmt = RS_FP8_E4M3,
                        .er = 128,
                        .ec = 128};
    setenv("RESHARD_TIMEOUT", "3", 1);
    setenv("RESHARD_CHUNK_BYTES", "4096", 1);
    setenv("UCX_LOG_LEVEL", "fatal", 1);
    setenv("RESHARD_NET_PEER_ERRORS", "1", 1);
    fail_seen =
        mmap(NULL, 3 * sizeof(int), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(fail_seen, MAP_FAILED);
    memset(fail_seen, 0, 3 * sizeof(int));
    run_ranks_stalling(4, weight_complete_then_a_peer_stops, 3);
    unsetenv("RESHARD_CHUNK_BYTES");
    unsetenv("RESHARD_NET_PEER_ERRORS");
    setenv("RESHARD_TIMEOUT", "20", 1);
    if (!fail_seen[0] || !fail_seen[1])
        cr_skip_test("rank 1 %s: nothing to check (a loaded host)",
                     fail_seen[0] ? "failed before the weight landed" : "did not fail");
    cr_assert(fail_seen[2], "rank 1: the weight and its scales are reported complete after the "
                            "failure, yet hold other values (its stderr line says which)");
    munmap(fail_seen, 3 * sizeof(int));
}

Test(quant_exec, per_channel_scales_from_f16_into_e5m2)
{
    qc = (struct qcase){.src = "shape=256x192 dtype=f16 ranks=0-3 place=S(1)",
                        .dst = "shape=256x192 dtype=fp8e5m2 ranks=0-3 place=S(0) quant=channel",
                        .src_kind = 1,
                        .fmt = RS_FP8_E5M2,
                        .er = 1,
                        .ec = 192,
                        .refits = 1};
    all_ok(run_ranks(4, refit_and_check), 4);
}

Test(quant_exec, per_channel_scales_quantized_at_the_senders)
{
    qc = (struct qcase){.src = "shape=256x192 dtype=bf16 ranks=0-3 place=S(0)",
                        .dst = "shape=256x192 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=S(0),R "
                               "quant=channel",
                        .src_kind = 0,
                        .fmt = RS_FP8_E4M3,
                        .er = 1,
                        .ec = 192,
                        .refits = 1};
    all_ok(run_ranks(4, refit_and_check), 4);
}

Test(quant_exec, one_scale_per_tensor)
{
    qc = (struct qcase){.src = "shape=200x96 dtype=bf16 ranks=0-3 place=S(0)",
                        .dst = "shape=200x96 dtype=fp8e4m3 ranks=0-3 place=R quant=tensor",
                        .src_kind = 0,
                        .fmt = RS_FP8_E4M3,
                        .er = 200,
                        .ec = 96,
                        .refits = 1};
    all_ok(run_ranks(4, refit_and_check), 4);
}

Test(quant_exec, fp8_sources_move_with_their_scales_unchanged)
{
    qc = (struct qcase){.src = "shape=512x256 dtype=fp8e4m3 ranks=0-3 place=S(0) " BLOCK,
                        .dst = "shape=512x256 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=R,S(1) " BLOCK,
                        .src_kind = 3,
                        .fmt = RS_FP8_E4M3,
                        .er = 128,
                        .ec = 128,
                        .refits = 1};
    all_ok(run_ranks(4, refit_and_check), 4);
}

/* A verified plan: the weight quantized on the way and its computed scales are checked
 * against the codes and scales made where they were quantized, so a right refit passes (blocks
 * quantized at the senders and where they land); an FP8 source moving with its scales is plain
 * data, and checked as such. */
Test(quant_exec, a_right_verified_refit_passes_quantized_on_the_way_or_moved_as_fp8)
{
    qc = (struct qcase){.src = "shape=512x256 dtype=bf16 ranks=0-2 place=S(0)",
                        .dst = "shape=512x256 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=R,S(1) " BLOCK,
                        .src_kind = 0,
                        .fmt = RS_FP8_E4M3,
                        .er = 128,
                        .ec = 128,
                        .refits = 2,
                        .verify = 1};
    all_ok(run_ranks(4, refit_and_check), 4);
    qc.src = "shape=256x256 dtype=fp8e4m3 ranks=0-1 place=S(0) " BLOCK;
    qc.dst = "shape=256x256 dtype=fp8e4m3 ranks=2-3 place=S(1) " BLOCK;
    qc.src_kind = 3;
    all_ok(run_ranks(4, refit_and_check), 4);
}

Test(quant_exec, the_direct_baseline_quantizes_alike)
{
    qc = (struct qcase){.src = "shape=512x256 dtype=bf16 ranks=0-2 place=S(0)",
                        .dst = "shape=512x256 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=R,S(1) " BLOCK,
                        .src_kind = 0,
                        .fmt = RS_FP8_E4M3,
                        .er = 128,
                        .ec = 128,
                        .algo = RESHARD_ALGO_DIRECT,
                        .refits = 1};
    all_ok(run_ranks(4, refit_and_check), 4);
}

/* The broadcast baseline moves bytes and does not quantize: a plan of it with a quantized
 * destination is refused on every rank when it is made, naming the tensor. */
static reshard_status_t bcast_plan(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    struct qside x;
    reshard_status_t st = qside_open(&x, comm, rank, qc.src, qc.dst);
    qside_close(&x);
    return st;
}

Test(quant_exec, the_broadcast_baseline_refuses_a_quantized_destination)
{
    qc = (struct qcase){.src = "shape=512x256 dtype=bf16 ranks=0-3 place=S(0)",
                        .dst = "shape=512x256 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=R,S(1) " BLOCK,
                        .algo = RESHARD_ALGO_BCAST};
    struct outcome *o = run_ranks(4, bcast_plan);
    for (int r = 0; r < 4; r++) {
        cr_assert_eq(o[r].status, RESHARD_ERR_INVALID_ARG, "rank %d: %s", r, o[r].msg);
        cr_assert(strstr(o[r].msg, "tensor 'layer.w.weight' has a quantized destination, which the "
                                   "broadcast baseline does not run"),
                  "rank %d: %s", r, o[r].msg);
    }
}

/* Rank 2 passes its weight as device memory and its scales as host memory: a destination and
 * its scales are quantized together, in one kind of memory. Every rank is told before any byte
 * moves, naming the tensor, and the communicator stays usable: the same plan then runs on host
 * buffers and is checked. */
static reshard_status_t device_weight_on_rank2(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    struct qside x;
    reshard_status_t st = qside_open(&x, comm, rank, qc.src, qc.dst);
    reshard_layout_info_t info = {0};
    if (st == RESHARD_OK)
        st = reshard_layout_info(x.l[0][1], &info);
    if (st != RESHARD_OK) {
        qside_close(&x);
        return st;
    }
    struct ref r;
    ref_make(&r, info.shape[0], info.shape[1], 0);
    qside_fill(&x, rank, &r, 0);
    if (rank == 2)
        x.b[0].mem = RESHARD_MEM_CUDA;
    st = reshard_plan_execute(x.plan, x.b);
    char why[256];
    snprintf(why, sizeof(why), "%s", reshard_last_error());
    x.b[0].mem = RESHARD_MEM_HOST;
    char bad[200] = "";
    if (st != RESHARD_OK && reshard_plan_execute(x.plan, x.b) != RESHARD_OK)
        st = rs_error(RESHARD_ERR_INTERNAL, "the host run after the refusal: %s",
                      reshard_last_error());
    else if (st != RESHARD_OK && qside_wrong(&x, rank, &r, bad, sizeof(bad)))
        st = rs_error(RESHARD_ERR_INTERNAL, "the host run after the refusal: %s", bad);
    else if (st != RESHARD_OK)
        st = rs_error(st, "%s", why);
    /* run_ranks destroys no communicator of a failed rank: leave together, so that no rank
     * exits while another still waits for its acknowledgement */
    char msg[256];
    snprintf(msg, sizeof(msg), "%s", reshard_last_error());
    if (st != RESHARD_OK && reshard_comm_barrier(comm) != RESHARD_OK)
        st = rs_error(RESHARD_ERR_INTERNAL, "barrier: %s", reshard_last_error());
    else if (st != RESHARD_OK)
        st = rs_error(st, "%s", msg); /* the barrier's entry cleared it */
    ref_free(&r);
    qside_close(&x);
    return st;
}

Test(quant_exec, a_device_weight_with_host_scales_is_refused_on_every_rank)
{
    qc = (struct qcase){.src = "shape=512x256 dtype=bf16 ranks=0-3 place=S(0)",
                        .dst = "shape=512x256 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=R,S(1) " BLOCK,
                        .src_kind = 0,
                        .fmt = RS_FP8_E4M3,
                        .er = 128,
                        .ec = 128,
                        .refits = 1};
    struct outcome *o = run_ranks(4, device_weight_on_rank2);
    for (int r = 0; r < 4; r++) {
        cr_assert_eq(o[r].status, r == 2 ? RESHARD_ERR_INVALID_ARG : RESHARD_ERR_REMOTE,
                     "rank %d: %s", r, o[r].msg);
        cr_assert(strstr(o[r].msg, "rank 2: tensor 'layer.w.weight' is in device memory and its "
                                   "scales 'layer.w.weight_scale_inv' in host memory"),
                  "rank %d: %s", r, o[r].msg);
    }
}

Test(quant_exec, plan_tensor_queries_name_the_scales_and_refuse_what_is_not_there)
{
    reshard_layout_t *s = parse("shape=256x256 dtype=bf16 ranks=0-1 place=S(0)");
    reshard_layout_t *d = parse("shape=256x256 dtype=fp8e4m3 ranks=2-3 place=S(1) " BLOCK);
    reshard_tensor_t t[2] = {{"a.weight", s, d}, {"b", s, d}};
    reshard_topo_t *topo = NULL;
    cr_assert_eq(reshard_topo_create(4, 2, NULL, &topo), RESHARD_OK);
    reshard_plan_t *p = NULL;
    cr_assert_eq(reshard_plan_create(t, 2, topo, NULL, &p), RESHARD_OK, "%s", reshard_last_error());
    cr_assert_eq(reshard_plan_ntensors(p), 4);
    cr_assert_str_eq(reshard_plan_tensor_name(p, 2), "a.weight_scale_inv");
    cr_assert_str_eq(reshard_plan_tensor_name(p, 3), "b.scale");
    cr_assert_null(reshard_plan_tensor_name(p, 4));
    cr_assert_null(reshard_plan_tensor_name(p, -1));
    reshard_layout_t *l = NULL;
    cr_assert_eq(reshard_plan_tensor_layout(p, 2, 1, &l), RESHARD_OK);
    reshard_layout_info_t info;
    cr_assert_eq(reshard_layout_info(l, &info), RESHARD_OK);
    cr_assert_eq(info.shape[0], 2);
    cr_assert_eq(info.shape[1], 2);
    cr_assert_eq(info.elem_size, 4, "float32 scales");
    size_t bytes = 0;
    cr_assert_eq(reshard_layout_shard_bytes(l, 3, &bytes), RESHARD_OK);
    cr_assert_eq(bytes, 2 * 1 * 4, "rank 3 holds the second block column");
    reshard_layout_destroy(l);
    cr_assert_eq(reshard_plan_tensor_layout(p, 4, 0, &l), RESHARD_ERR_INVALID_ARG);
    cr_assert(strstr(reshard_last_error(), "tensor 4 side 0: the plan has 4 tensors"), "%s",
              reshard_last_error());
    cr_assert_eq(reshard_plan_tensor_layout(p, 0, 2, &l), RESHARD_ERR_INVALID_ARG);
    cr_assert_eq(reshard_plan_ntensors(NULL), 0);
    reshard_plan_destroy(p);
    reshard_topo_destroy(topo);
    reshard_layout_destroy(s);
    reshard_layout_destroy(d);
}
