/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The cost model (plugin/exec/predict.c): the flow model of reshard_plan_predict, by hand for one
 * case, and the messages it counts per rank, which are the executor's own (its chunking and its
 * bundling): hand-worked for small tensors that travel packed and a large one that travels in
 * chunks.
 */
#include "base/param.h"
#include "plugin/exec/predict.h"
#include "plugin/reshard.h"
#include "test/planner/plan_util.h"

#include <criterion/criterion.h>
#include <stdlib.h>

/* reshard_plan_predict: the per-rank flow model, by hand for one case, and its bad input. */
Test(predict, prediction_is_the_busiest_ranks_bytes_over_its_link_plus_latency)
{
    reshard_layout_t *s, *d;
    cr_assert_eq(reshard_layout_parse("shape=1024x1024 dtype=f32 ranks=0", 0, &s), RESHARD_OK);
    cr_assert_eq(reshard_layout_parse("shape=1024x1024 dtype=f32 ranks=2-3 place=R", 0, &d),
                 RESHARD_OK);
    reshard_topo_t *topo;
    cr_assert_eq(reshard_topo_create(4, 2, NULL, &topo), RESHARD_OK);
    reshard_tensor_t t = {"w", s, d};
    reshard_plan_t *plan;
    cr_assert_eq(reshard_plan_create(&t, 1, topo, NULL, &plan), RESHARD_OK);
    reshard_cluster_t c = {.nic_bytes_per_s = 1e9, .nvlink_bytes_per_s = 1e10, .latency_s = 1e-3};
    reshard_prediction_t p;
    cr_assert_eq(reshard_plan_predict(plan, &c, &p), RESHARD_OK, "%s", reshard_last_error());
    /* reshard: 4 MiB once over rank 0's NIC, split between the destination domain's two rails
     * (two messages, one latency), each half then forwarded over NVLink (2 MiB, hidden).
     * direct: rank 0 sends both whole copies. */
    double mib = 1048576.0;
    cr_assert_float_eq(p.seconds[RESHARD_ALGO_RESHARD], 4 * mib / 1e9 + 1e-3, 1e-9);
    cr_assert_eq(p.max_nic_bytes[RESHARD_ALGO_RESHARD], 4 << 20);
    cr_assert_eq(p.max_nvlink_bytes[RESHARD_ALGO_RESHARD], 2 << 20);
    cr_assert_eq(p.max_msgs[RESHARD_ALGO_RESHARD], 2);
    cr_assert_float_eq(p.seconds[RESHARD_ALGO_DIRECT], 8 * mib / 1e9 + 1e-3, 1e-9);
    cr_assert_eq(p.max_nvlink_bytes[RESHARD_ALGO_DIRECT], 0);
    c.latency_s = -1;
    cr_assert_eq(reshard_plan_predict(plan, &c, &p), RESHARD_ERR_INVALID_ARG);
    cr_assert_eq(reshard_plan_predict(plan, NULL, &p), RESHARD_ERR_INVALID_ARG);
    reshard_plan_destroy(plan);
    reshard_topo_destroy(topo);
    reshard_layout_destroy(s);
    reshard_layout_destroy(d);
}

/* The busiest NIC of each algo for one tensor: bf16 sources on ranks 0-3 (one domain), a
 * destination on ranks 4-11 (two domains of 4), optionally quantized to FP8. */
static void nic_bytes(const char *dst, uint64_t *nic)
{
    reshard_layout_t *s, *d;
    cr_assert_eq(
        reshard_layout_parse("shape=512x256 dtype=bf16 ranks=0-3 mesh=4 place=S(0)", 0, &s),
        RESHARD_OK);
    cr_assert_eq(reshard_layout_parse(dst, 0, &d), RESHARD_OK, "%s", reshard_last_error());
    reshard_topo_t *topo;
    cr_assert_eq(reshard_topo_create(12, 4, NULL, &topo), RESHARD_OK);
    reshard_tensor_t t = {"w.weight", s, d};
    reshard_plan_t *plan;
    cr_assert_eq(reshard_plan_create(&t, 1, topo, NULL, &plan), RESHARD_OK, "%s",
                 reshard_last_error());
    reshard_cluster_t c = {.nic_bytes_per_s = 1e9, .nvlink_bytes_per_s = 1e10, .latency_s = 1e-6};
    reshard_prediction_t p;
    cr_assert_eq(reshard_plan_predict(plan, &c, &p), RESHARD_OK, "%s", reshard_last_error());
    for (int a = 0; a < 3; a++)
        nic[a] = p.max_nic_bytes[a];
    reshard_plan_destroy(plan);
    reshard_topo_destroy(topo);
    reshard_layout_destroy(s);
    reshard_layout_destroy(d);
}

/* An FP8 destination: reshard sends what the sources quantized (half the bytes, and the
 * scales), while the broadcast baseline does what users do today, broadcasting bf16 and
 * quantizing where it lands: its bytes are the bf16 refit's. */
Test(predict, an_fp8_destination_halves_reshard_and_leaves_the_broadcast_in_bf16)
{
    uint64_t bf16[3], fp8[3];
    nic_bytes("shape=512x256 dtype=bf16 ranks=4-11 mesh=2x4 place=R,S(0)", bf16);
    nic_bytes("shape=512x256 dtype=fp8e4m3 ranks=4-11 mesh=2x4 place=R,S(0) quant=block(128,128)",
              fp8);
    /* each source rank holds a 128-row band: whole blocks, quantized where it is; it sends the
     * band once to each destination domain: 2 x (128 x 256 bytes + 2 scales) */
    cr_assert_eq(bf16[RESHARD_ALGO_RESHARD], 2 * 128 * 256 * 2);
    cr_assert_eq(fp8[RESHARD_ALGO_RESHARD], 2 * (128 * 256 + 2 * 4));
    cr_assert_eq(fp8[RESHARD_ALGO_BCAST], bf16[RESHARD_ALGO_BCAST]);
    cr_assert_gt(fp8[RESHARD_ALGO_BCAST], 0);
}

#define NSMALL 200

/* NSMALL 8x8 i32 tensors from row halves on ranks 0-1 to column halves on ranks 2-3 (two
 * domains of 2): each source rank sends each destination rank a 4x4 block (64 bytes) of every
 * tensor, over the network. The messages predict_msgs counts per rank. */
static void small_tensor_msgs(uint64_t *msgs)
{
    const char *src[NSMALL], *dst[NSMALL];
    for (int i = 0; i < NSMALL; i++) {
        src[i] = "shape=8x8 dtype=i32 ranks=0-1 mesh=2 place=S(0)";
        dst[i] = "shape=8x8 dtype=i32 ranks=2-3 mesh=2 place=S(1)";
    }
    rs_param_reload();
    struct rs_plan *p = plan_specs(NSMALL, src, dst, 4, 2, NULL, 0);
    struct xfer_set xs;
    cr_assert_eq(xfer_build(p, RESHARD_ALGO_RESHARD, &xs), RESHARD_OK);
    cr_assert_eq(xs.n, 4 * NSMALL);
    cr_assert_eq(predict_msgs(p, &xs, 4, msgs), RESHARD_OK);
    xfer_free(&xs);
    plan_free(p);
}

Test(predict, small_chunks_to_one_peer_count_as_one_packed_message)
{
    uint64_t msgs[4];
    small_tensor_msgs(msgs); /* 200 x 64 bytes fit one 4 MiB bundle per peer */
    cr_assert_eq(msgs[0], 2);
    cr_assert_eq(msgs[1], 2);
    cr_assert_eq(msgs[2], 0);
    cr_assert_eq(msgs[3], 0);
}

Test(predict, without_coalescing_every_small_chunk_is_a_message)
{
    setenv("RESHARD_COALESCE_BYTES", "0", 1);
    uint64_t msgs[4];
    small_tensor_msgs(msgs);
    cr_assert_eq(msgs[0], 2 * NSMALL);
    cr_assert_eq(msgs[1], 2 * NSMALL);
    cr_assert_eq(msgs[2], 0);
}

/* 4 KiB chunks: a bundle holds 4096 / 64 = 64 pieces, so 200 to a peer make 4 bundles. */
Test(predict, bundles_fill_up_to_a_chunk)
{
    setenv("RESHARD_CHUNK_BYTES", "4096", 1);
    uint64_t msgs[4];
    small_tensor_msgs(msgs);
    cr_assert_eq(msgs[0], 2 * 4);
    cr_assert_eq(msgs[1], 2 * 4);
}

/* A 4 MiB tensor and a 256-byte one from rank 0 to rank 2: a message per chunk of the large
 * one, and the small one packed. */
static uint64_t mixed_msgs_of_rank0(void)
{
    const char *src[] = {"shape=1024x1024 dtype=f32 ranks=0", "shape=8x8 dtype=i32 ranks=0"};
    const char *dst[] = {"shape=1024x1024 dtype=f32 ranks=2", "shape=8x8 dtype=i32 ranks=2"};
    rs_param_reload();
    struct rs_plan *p = plan_specs(2, src, dst, 4, 2, NULL, 0);
    struct xfer_set xs;
    uint64_t msgs[4];
    cr_assert_eq(xfer_build(p, RESHARD_ALGO_RESHARD, &xs), RESHARD_OK);
    cr_assert_eq(predict_msgs(p, &xs, 4, msgs), RESHARD_OK);
    cr_assert_eq(msgs[2], 0);
    xfer_free(&xs);
    plan_free(p);
    return msgs[0];
}

Test(predict, a_large_transfer_counts_its_chunks_and_a_small_one_its_bundle)
{
    cr_assert_eq(mixed_msgs_of_rank0(), 1 + 1); /* 4 MiB is one chunk of the default 4 MiB */
}

Test(predict, smaller_chunks_mean_more_messages_for_the_large_transfer)
{
    setenv("RESHARD_CHUNK_BYTES", "1048576", 1);
    cr_assert_eq(mixed_msgs_of_rank0(), 4 + 1);
}
