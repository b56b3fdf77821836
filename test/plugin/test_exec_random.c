/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The executor on random layout pairs (the property suite's generator: 1-4-D tensors with
 * uneven sizes, R / S / SS on 1-3-D meshes, replicas, permuted and overlapping rank sets),
 * across forked ranks in domains of 2, with every algorithm: every destination element must
 * hold the value its global index gives it. Cases the forked harness cannot host (more than
 * MAX_RANKS ranks) are drawn again with the next seed.
 */
#include "ranks.h"
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

/* Calls fn(element address, global linear index) for every element of rank's shard, stored
 * row-major over the shard's local shape. */
static void each_element(const reshard_layout_t *l, int rank, char *buf,
                         void (*fn)(char *at, size_t esize, int64_t global, int *wrong), int *wrong)
{
    reshard_layout_info_t info;
    int64_t shape[8], numel;
    reshard_layout_info(l, &info);
    reshard_layout_shard_shape(l, rank, shape, &numel);
    if (!numel)
        return;
    int64_t *index[8];
    for (int d = 0; d < info.ndim; d++) {
        index[d] = malloc((size_t)shape[d] * sizeof(int64_t));
        reshard_layout_shard_index(l, rank, d, index[d]);
    }
    int64_t at[8] = {0};
    for (int64_t i = 0; i < numel; i++) {
        int64_t global = 0;
        for (int d = 0; d < info.ndim; d++)
            global = global * info.shape[d] + index[d][at[d]];
        fn(buf + (size_t)i * info.elem_size, info.elem_size, global, wrong);
        for (int d = info.ndim - 1; d >= 0 && ++at[d] == shape[d]; d--)
            at[d] = 0;
    }
    for (int d = 0; d < info.ndim; d++)
        free(index[d]);
}

static void put(char *at, size_t esize, int64_t global, int *wrong)
{
    (void)wrong;
    uint64_t v = value_of(global);
    memcpy(at, &v, esize); /* the low bytes on this little-endian machine */
}

static void check(char *at, size_t esize, int64_t global, int *wrong)
{
    uint64_t v = value_of(global), got = 0;
    memcpy(&got, at, esize);
    if (esize < 8)
        v &= (UINT64_C(1) << (8 * esize)) - 1;
    *wrong += got != v;
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
    each_element(src, rank, s, put, &wrong);
    reshard_buffers_t b = {sb ? s : NULL, sb, db ? d : NULL, db, RESHARD_MEM_HOST};
    for (int it = 0; it < 2 && st == RESHARD_OK; it++) { /* the second run reuses everything */
        memset(d, 0xa5, db);
        st = reshard_plan_execute(plan, &b);
        if (st == RESHARD_OK)
            each_element(dst, rank, d, check, &wrong);
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
