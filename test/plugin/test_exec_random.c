/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The executor on random layout pairs (the property suite's generator: 1-4-D tensors with
 * uneven sizes, R / S / SS on 1-3-D meshes, replicas, permuted and overlapping rank sets),
 * across forked ranks in domains of 2, with every algorithm: every destination element must
 * hold the value its global index gives it. Cases the forked harness cannot host (more than
 * MAX_RANKS ranks) are drawn again with the next seed.
 */
#include "ranks.h"
#include "side.h"
#include "planner/spec.h"
#include "plugin/reshard.h"
#include "test/planner/oracle.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#define CASES 30

static char src_spec[512], dst_spec[512];
static reshard_algo_t algo;

static uint64_t value_of(int64_t global)
{
    uint64_t z = (uint64_t)global * 0x9e3779b97f4a7c15u + 0x632be59bd9b4e019u;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    return z ^ (z >> 31);
}

static uint64_t value_at(int64_t global, const void *arg)
{
    (void)arg;
    return value_of(global);
}

static reshard_status_t move_random(int rank, int size, reshard_comm_t *comm)
{
    reshard_layout_t *src = NULL, *dst = NULL;
    reshard_layout_parse(src_spec, size, &src);
    reshard_layout_parse(dst_spec, size, &dst);
    reshard_tensor_t t = {"w", src, dst};
    reshard_plan_config_t cfg = RESHARD_PLAN_CONFIG_INIT;
    cfg.algo = algo;
    reshard_plan_t *plan = NULL;
    reshard_status_t st = reshard_comm_plan_create(comm, &t, 1, &cfg, &plan);
    size_t sb = 0, db = 0;
    reshard_layout_shard_bytes(src, rank, &sb);
    reshard_layout_shard_bytes(dst, rank, &db);
    char *s = calloc(1, sb + 1), *d = calloc(1, db + 1);
    int wrong = 0;
    shard_values(src, rank, s, 1, value_at, NULL, &wrong);
    reshard_buffers_t b = {sb ? s : NULL, sb, db ? d : NULL, db, RESHARD_MEM_HOST};
    for (int it = 0; it < 2 && st == RESHARD_OK; it++) { /* the second run reuses everything */
        memset(d, 0xa5, db);
        st = reshard_plan_execute(plan, &b);
        if (st == RESHARD_OK)
            shard_values(dst, rank, d, 0, value_at, NULL, &wrong);
    }
    if (st == RESHARD_OK && wrong) {
        fprintf(stderr, "rank %d: %d wrong element(s)\n", rank, wrong);
        st = RESHARD_ERR_INTERNAL;
    }
    reshard_plan_destroy(plan);
    free(s);
    free(d);
    reshard_layout_destroy(src);
    reshard_layout_destroy(dst);
    return st;
}

/* The next seed from `seed` whose case fits the harness; its specs and world size. */
static int draw(uint64_t *seed)
{
    for (;; (*seed)++) {
        struct random_case c;
        random_case_make(*seed, &c);
        int world = c.world;
        spec_format(&c.src, src_spec, sizeof(src_spec));
        spec_format(&c.dst, dst_spec, sizeof(dst_spec));
        random_case_free(&c);
        if (world <= MAX_RANKS)
            return world;
    }
}

static void run_cases(reshard_algo_t a, uint64_t first)
{
    setenv("RESHARD_DOMAIN_SIZE", "2", 1);
    setenv("RESHARD_TIMEOUT", "20", 1);
    setenv("UCX_LOG_LEVEL", "error", 1);
    const char *env = getenv("RESHARD_TEST_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 0) : first;
    algo = a;
    for (int k = 0; k < (env ? 1 : CASES); k++, seed++) {
        int world = draw(&seed);
        struct outcome *o = run_ranks(world, move_random);
        for (int r = 0; r < world; r++)
            cr_assert_eq(o[r].status, RESHARD_OK,
                         "seed %llu (RESHARD_TEST_SEED replays it), world %d, rank %d: %s\n"
                         "  src: %s\n  dst: %s",
                         (unsigned long long)seed, world, r, o[r].msg, src_spec, dst_spec);
    }
}

TestSuite(exec_random, .timeout = 120);

Test(exec_random, reshard_lands_every_element_of_random_layouts)
{
    run_cases(RESHARD_ALGO_RESHARD, 1000);
}

Test(exec_random, direct_lands_every_element_of_random_layouts)
{
    run_cases(RESHARD_ALGO_DIRECT, 2000);
}

Test(exec_random, bcast_lands_every_element_of_random_layouts)
{
    run_cases(RESHARD_ALGO_BCAST, 3000);
}
