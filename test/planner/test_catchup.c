/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Absence by role and catch-up plans (planner/plan_catchup.c). A rank may be off as a source
 * only (it holds nothing: a joiner) or as a destination only (it needs nothing: a replica that
 * holds its shard). A catch-up plan writes the joiners' shards from the replicas that hold
 * them, in their domain first, the trainers sending nothing while a replica holds every piece,
 * and moves exactly min_net_bytes.
 */
#include "plan_util.h"
#include "base/error.h"
#include "planner/stats.h"
#include "planner/validate.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* 4 trainers (ranks 0-3, rows sharded) and 4 inference ranks as DP2 x TP2 (4-5 and 6-7, the
 * columns sharded), in domains of 2 ranks. */
#define TRAIN     "shape=64x48 dtype=i32 ranks=0-3 mesh=4 place=S(0)"
#define INFER     "shape=64x48 dtype=i32 ranks=4-7 mesh=2x2 place=R,S(1)"
#define TP_SHARD  (64 * 24 * 4) /* bytes of one TP rank's shard */
#define ALL_BYTES (64 * 48 * 4)

static struct rs_plan *catch_up(const struct rs_plan *refit, const int *joiners, int n,
                                unsigned char **from_dst)
{
    struct rs_plan *p = NULL;
    cr_assert_eq(plan_catch_up(refit, joiners, n, PLAN_ALL_RANKS, &p, from_dst), RESHARD_OK, "%s",
                 rs_error_message());
    cr_assert_eq(plan_validate(p), RESHARD_OK, "%s", rs_error_message());
    return p;
}

/* net_bytes == min_net_bytes, every rank's own plan is its slice of the whole, and only the
 * joiners receive. */
static struct plan_stats check_catch_up(const struct rs_plan *p, const int *joiners, int n,
                                        struct plan_rank_stats *r)
{
    struct plan_stats s = stats_of(p, r);
    cr_assert_eq(s.net_bytes, s.min_net_bytes, "net %lld, min %lld", (long long)s.net_bytes,
                 (long long)s.min_net_bytes);
    check_rank_scopes(p, "catch-up");
    for (size_t i = 0; i < p->nops; i++) {
        int j = 0;
        while (j < n && joiners[j] != p->ops[i].dst)
            j++;
        cr_assert_lt(j, n, "op %zu writes rank %d, which is no joiner", i, p->ops[i].dst);
    }
    return s;
}

Test(catchup, a_replacement_takes_its_shard_from_the_other_replica_and_trainers_send_nothing)
{
    const char *src[] = {TRAIN}, *dst[] = {INFER};
    struct rs_plan *refit = plan_specs(1, src, dst, 8, 2, NULL, 0);
    int joiner = 7;
    unsigned char *fd = NULL;
    struct rs_plan *p = catch_up(refit, &joiner, 1, &fd);
    cr_assert_eq(fd[0], 1, "the replicas serve the tensor");
    struct plan_rank_stats r[8];
    struct plan_stats s = check_catch_up(p, &joiner, 1, r);
    cr_assert_eq(s.net_bytes, TP_SHARD, "the joiner's shard crosses once: %lld",
                 (long long)s.net_bytes);
    cr_assert_eq(r[7].net_in, TP_SHARD);
    cr_assert_eq(r[5].net_out, TP_SHARD, "rank 5 holds the joiner's columns");
    for (int t = 0; t < 4; t++)
        cr_assert_eq(r[t].net_out + r[t].local_out, 0, "trainer %d sends", t);
    cr_assert_neq(p->hash, refit->hash);
    free(fd);
    plan_free(p);
    plan_free(refit);
}

Test(catchup, a_joiner_beside_a_replica_of_its_shard_takes_it_over_the_local_path)
{
    /* one domain of 4 inference ranks: 5 holds what 7 needs, next to it */
    const char *src[] = {TRAIN}, *dst[] = {INFER};
    int domain_of[8] = {0, 0, 1, 1, 2, 2, 2, 2};
    struct rs_plan *refit = plan_specs(1, src, dst, 8, 0, domain_of, 0);
    int joiner = 7;
    unsigned char *fd = NULL;
    struct rs_plan *p = catch_up(refit, &joiner, 1, &fd);
    struct plan_stats s = check_catch_up(p, &joiner, 1, NULL);
    cr_assert_eq(s.net_bytes, 0);
    cr_assert_eq(s.local_bytes, TP_SHARD);
    cr_assert_eq(p->nops, 1);
    cr_assert_eq(p->ops[0].src, 5);
    cr_assert_eq(p->ops[0].kind, PLAN_OP_LOCAL);
    free(fd);
    plan_free(p);
    plan_free(refit);
}

Test(catchup, a_new_replica_takes_one_copy_into_its_domain_and_trainers_send_nothing)
{
    /* ranks 8-9 are a new TP2 replica on a node of their own; 6-7 are not there (absent) */
    const char *src[] = {TRAIN, "shape=48 dtype=f32 ranks=0-3 mesh=4 place=S(0)"};
    const char *dst[] = {"shape=64x48 dtype=i32 ranks=4-5,8-9 mesh=2x2 place=R,S(1)",
                         "shape=48 dtype=f32 ranks=4-5,8-9 place=R"}; /* a norm: replicated */
    struct rs_plan *grown = plan_specs(2, src, dst, 10, 2, NULL, 0);
    struct rs_topo t;
    cr_assert_eq(topo_copy(&grown->topo, &t), RESHARD_OK);
    int gone[] = {6, 7};
    cr_assert_eq(topo_set_absent(&t, gone, 2), RESHARD_OK);
    struct plan_input in[2];
    plan_inputs_of(grown, in);
    struct rs_plan *refit = NULL;
    cr_assert_eq(plan_build(in, 2, &t, NULL, PLAN_ALL_RANKS, &refit), RESHARD_OK);
    int joiners[] = {8, 9};
    unsigned char *fd = NULL;
    struct rs_plan *p = catch_up(refit, joiners, 2, &fd);
    cr_assert(fd[0] && fd[1]);
    struct plan_rank_stats r[10];
    struct plan_stats s = check_catch_up(p, joiners, 2, r);
    /* one copy of each tensor enters the new domain; the norm is forwarded inside it */
    cr_assert_eq(s.net_bytes, ALL_BYTES + 48 * 4, "net %lld", (long long)s.net_bytes);
    cr_assert_eq(s.local_bytes, 48 * 4, "the norm's two halves forwarded");
    for (int k = 0; k < 4; k++)
        cr_assert_eq(r[k].net_out + r[k].local_out, 0, "trainer %d sends", k);
    cr_assert_eq(r[8].net_in + r[9].net_in, s.net_bytes);
    free(fd);
    plan_free(p);
    plan_free(refit);
    plan_free(grown);
    topo_free(&t);
}

Test(catchup, a_shard_no_replica_holds_comes_from_the_trainers)
{
    /* the second tensor has one inference replica: 7's shard of it is nowhere else */
    const char *src[] = {TRAIN, "shape=32x8 dtype=i32 ranks=0-3 place=R"};
    const char *dst[] = {INFER, "shape=32x8 dtype=i32 ranks=6-7 place=S(0)"};
    struct rs_plan *refit = plan_specs(2, src, dst, 8, 2, NULL, 0);
    int joiner = 7;
    unsigned char *fd = NULL;
    struct rs_plan *p = catch_up(refit, &joiner, 1, &fd);
    cr_assert_eq(fd[0], 1);
    cr_assert_eq(fd[1], 0, "no replica: the trainers' layout");
    struct plan_rank_stats r[8];
    struct plan_stats s = check_catch_up(p, &joiner, 1, r);
    cr_assert_eq(r[7].net_in, TP_SHARD + 16 * 8 * 4);
    int64_t trainers = 0;
    for (int k = 0; k < 4; k++)
        trainers += r[k].net_out;
    cr_assert_eq(trainers, 16 * 8 * 4, "the trainers send the second tensor's rows only");
    cr_assert_eq(s.net_bytes, r[7].net_in);
    free(fd);
    plan_free(p);
    plan_free(refit);
}

Test(catchup, bad_joiner_lists_are_refused_naming_the_rank)
{
    const char *src[] = {TRAIN}, *dst[] = {INFER};
    struct rs_plan *refit = plan_specs(1, src, dst, 8, 2, NULL, 0), *p = NULL;
    unsigned char *fd = NULL;
    int twice[] = {7, 7}, outside[] = {8};
    cr_assert_eq(plan_catch_up(refit, twice, 2, PLAN_ALL_RANKS, &p, &fd), RESHARD_ERR_INVALID_ARG);
    cr_assert(strstr(rs_error_message(), "joiner 7 is listed twice"), "%s", rs_error_message());
    cr_assert_eq(plan_catch_up(refit, outside, 1, PLAN_ALL_RANKS, &p, &fd), RESHARD_ERR_RANK_RANGE);
    cr_assert_eq(plan_catch_up(refit, twice, 0, PLAN_ALL_RANKS, &p, &fd), RESHARD_ERR_INVALID_ARG);
    cr_assert_null(p);
    cr_assert_null(fd);
    plan_free(refit);
}

Test(catchup, absence_by_role_keeps_the_both_roles_flag_and_changes_the_hash)
{
    struct rs_topo t;
    cr_assert_eq(topo_create(8, 2, NULL, &t), RESHARD_OK);
    int a = 1, b = 2, c = 3;
    cr_assert_eq(topo_set_off(&t, &a, 1, TOPO_SRC), RESHARD_OK);
    cr_assert_eq(topo_set_off(&t, &b, 1, TOPO_DST), RESHARD_OK);
    cr_assert_eq(topo_set_absent(&t, &c, 1), RESHARD_OK);
    cr_assert(!topo_absent(&t, 1) && topo_off(&t, 1, TOPO_SRC) && !topo_off(&t, 1, TOPO_DST));
    cr_assert(!topo_absent(&t, 2) && !topo_off(&t, 2, TOPO_SRC) && topo_off(&t, 2, TOPO_DST));
    cr_assert(topo_absent(&t, 3) && topo_off(&t, 3, TOPO_SRC) && topo_off(&t, 3, TOPO_DST));
    cr_assert(!topo_off(&t, 0, TOPO_SRC) && !topo_off(&t, 0, TOPO_DST));
    cr_assert_eq(topo_set_off(&t, &a, 1, TOPO_DST), RESHARD_OK); /* both roles: absent */
    cr_assert(topo_absent(&t, 1));

    /* a rank off in one role is part of the plan's inputs */
    const char *spec_s = "shape=16x8 dtype=i32 ranks=0-3 place=R",
               *spec_d = "shape=16x8 dtype=i32 ranks=4-7 place=S(0)";
    struct rs_plan *whole = plan_one(spec_s, spec_d, 8, 2), *p = NULL;
    struct rs_topo u;
    cr_assert_eq(topo_copy(&whole->topo, &u), RESHARD_OK);
    int src_rank = 0;
    cr_assert_eq(topo_set_off(&u, &src_rank, 1, TOPO_DST), RESHARD_OK); /* needs nothing anyway */
    struct plan_input in;
    plan_inputs_of(whole, &in);
    cr_assert_eq(plan_build(&in, 1, &u, NULL, PLAN_ALL_RANKS, &p), RESHARD_OK);
    cr_assert_neq(p->hash, whole->hash);
    cr_assert_eq(p->nops, whole->nops, "rank 0 receives nothing in either");
    plan_free(p);
    /* off as a source, rank 0's replicas serve in its place */
    cr_assert_eq(topo_set_off(&u, &src_rank, 1, TOPO_SRC), RESHARD_OK);
    cr_assert_eq(plan_build(&in, 1, &u, NULL, PLAN_ALL_RANKS, &p), RESHARD_OK);
    cr_assert_eq(plan_validate(p), RESHARD_OK, "%s", rs_error_message());
    for (size_t i = 0; i < p->nops; i++)
        cr_assert_neq(p->ops[i].src, 0);
    plan_free(p);
    plan_free(whole);
    topo_free(&u);
    topo_free(&t);
}

/* A joiner that holds a source shard of its own is still served from elsewhere: off as a
 * source, it copies nothing from itself. */
Test(catchup, a_joiner_never_copies_from_itself)
{
    const char *src[] = {"shape=32x8 dtype=i32 ranks=0-7 place=R"};
    const char *dst[] = {"shape=32x8 dtype=i32 ranks=0-7 mesh=2x4 place=R,S(0)"};
    int domain_of[8] = {0, 1, 0, 1, 0, 1, 0, 1}; /* 1 beside 5, 6 beside 2 */
    struct rs_plan *refit = plan_specs(1, src, dst, 8, 0, domain_of, 0);
    cr_assert_gt(count_ops(refit, PLAN_OP_SELF), 0, "the refit copies in place");
    int joiners[] = {1, 6};
    unsigned char *fd = NULL;
    struct rs_plan *p = catch_up(refit, joiners, 2, &fd);
    check_catch_up(p, joiners, 2, NULL);
    cr_assert_eq(count_ops(p, PLAN_OP_SELF), 0);
    cr_assert_eq(count_ops(p, PLAN_OP_NET), 0, "each joiner's replica is in its domain");
    free(fd);
    plan_free(p);
    plan_free(refit);
}

/* An FP8 destination with its scales: the joiner takes codes and scales from its replica as
 * plain data (an FP8 source with the same blocks), never from the trainers' bf16. */
Test(catchup, an_fp8_destination_catches_up_codes_and_scales_from_its_replica)
{
    const char *src[] = {"shape=512x256 dtype=bf16 ranks=0-3 place=S(0)"};
    const char *dst[] = {"shape=512x256 dtype=fp8e4m3 ranks=4-7 mesh=2x2 place=R,S(1) "
                         "quant=block(128,128)"};
    struct rs_plan *refit = plan_specs(1, src, dst, 8, 2, NULL, 0);
    cr_assert_eq(refit->ntensors, 2, "the weight and its scales");
    int joiner = 7;
    unsigned char *fd = NULL;
    struct rs_plan *p = catch_up(refit, &joiner, 1, &fd);
    cr_assert_eq(p->ntensors, 2);
    cr_assert(fd[0] && fd[1], "codes and scales from the replica");
    struct plan_rank_stats r[8];
    struct plan_stats s = check_catch_up(p, &joiner, 1, r);
    /* its half of the columns in FP8, and its 4 x 1 scales */
    cr_assert_eq(s.net_bytes, 512 * 128 + 4 * 4, "net %lld", (long long)s.net_bytes);
    cr_assert_eq(r[5].net_out, s.net_bytes);
    cr_assert_eq(s.quant_bytes, 0, "nothing is quantized again");
    free(fd);
    plan_free(p);
    plan_free(refit);
}
