/* SPDX-License-Identifier: Apache-2.0 */
/* The public planning API (reshard.h), used as a caller would. */
#include "plugin/reshard.h"

#include <criterion/criterion.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

static reshard_status_t parse_status(const char *spec)
{
    reshard_layout_t *l = NULL;
    reshard_status_t st = reshard_layout_parse(spec, 8, &l);
    reshard_layout_destroy(l);
    return st;
}

static reshard_status_t plan_status(const char *src, const char *dst, int world)
{
    reshard_layout_t *s = NULL, *d = NULL;
    reshard_topo_t *t = NULL;
    reshard_plan_t *p = NULL;
    cr_assert_eq(reshard_layout_parse(src, world, &s), RESHARD_OK, "%s", reshard_last_error());
    cr_assert_eq(reshard_layout_parse(dst, world, &d), RESHARD_OK, "%s", reshard_last_error());
    cr_assert_eq(reshard_topo_create(world, 2, NULL, &t), RESHARD_OK);
    reshard_tensor_t tensor = {"w", s, d};
    reshard_status_t st = reshard_plan_create(&tensor, 1, t, NULL, &p);
    reshard_plan_destroy(p);
    reshard_topo_destroy(t);
    reshard_layout_destroy(s);
    reshard_layout_destroy(d);
    return st;
}

Test(api, each_kind_of_bad_input_has_its_own_status)
{
    reshard_status_t got[] = {
        parse_status("shape=4x4 place=X"),
        parse_status("shape=4x4 ranks=0-3 mesh=2x3"),
        parse_status("shape=4x4 ranks=0-3 place=S(2)"),
        plan_status("shape=4x4 ranks=0-1", "shape=4x4 dtype=f32 ranks=2-3", 4),
        plan_status("shape=4x4 ranks=0-1", "shape=4x4 ranks=2-9", 4),
        parse_status("shape=4x4 ranks=0-1 place=S(0) view=3"),
    };
    reshard_status_t want[] = {RESHARD_ERR_SPEC_SYNTAX, RESHARD_ERR_MESH_SIZE,
                               RESHARD_ERR_SHARD_DIM,   RESHARD_ERR_MISMATCH,
                               RESHARD_ERR_RANK_RANGE,  RESHARD_ERR_VIEW};
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        cr_assert_eq(got[i], want[i], "case %zu: %s", i, reshard_strerror(got[i]));
        for (size_t j = 0; j < i; j++)
            cr_assert_neq(got[i], got[j], "cases %zu and %zu share a status", i, j);
    }
}

Test(api, last_error_describes_the_last_failure_and_resets)
{
    reshard_layout_t *l = NULL;
    cr_assert_eq(reshard_layout_parse("shape=4 ranks=1-0", 0, &l), RESHARD_ERR_SPEC_SYNTAX);
    cr_assert_null(l, "outputs are written only on success");
    cr_assert_str_eq(reshard_last_error(), "ranks: range 1-0 is descending at column 15");
    cr_assert_eq(reshard_layout_parse("shape=4 ranks=0-1", 0, &l), RESHARD_OK);
    cr_assert_str_eq(reshard_last_error(), "");
    reshard_layout_destroy(l);
}

/* The public face of the status list (test/base/test_error.c checks the list itself). */
Test(api, strerror_gives_each_status_its_message)
{
    cr_assert_str_eq(reshard_strerror(RESHARD_OK), "success");
    cr_assert_str_eq(reshard_strerror(RESHARD_ERR_DATA_LOST),
                     "data was held only by ranks that left (no replica remains)");
    cr_assert_str_eq(reshard_strerror((reshard_status_t)1000), "unknown status");
}

Test(api, null_arguments_are_invalid_not_crashes)
{
    reshard_layout_t *l;
    reshard_topo_t *t;
    reshard_plan_t *p;
    reshard_plan_stats_t s;
    cr_assert_eq(reshard_layout_parse(NULL, 0, &l), RESHARD_ERR_INVALID_ARG);
    cr_assert_str_eq(reshard_last_error(), "reshard_layout_parse: spec is NULL");
    cr_assert_eq(reshard_layout_parse("shape=4", 1, NULL), RESHARD_ERR_INVALID_ARG);
    cr_assert_eq(reshard_topo_create(4, 2, NULL, NULL), RESHARD_ERR_INVALID_ARG);
    cr_assert_eq(reshard_topo_create(0, 2, NULL, &t), RESHARD_ERR_INVALID_ARG);
    cr_assert_eq(reshard_plan_create(NULL, 1, NULL, NULL, &p), RESHARD_ERR_INVALID_ARG);
    cr_assert_eq(reshard_plan_validate(NULL), RESHARD_ERR_INVALID_ARG);
    cr_assert_eq(reshard_plan_stats(NULL, &s, NULL), RESHARD_ERR_INVALID_ARG);
    cr_assert_eq(reshard_layout_info(NULL, NULL), RESHARD_ERR_INVALID_ARG);
    cr_assert_eq(reshard_plan_hash(NULL), 0);
    cr_assert_eq(reshard_layout_format(NULL, NULL, 0), 0);
    reshard_layout_destroy(NULL);
    reshard_topo_destroy(NULL);
    reshard_plan_destroy(NULL);
}

struct fixture {
    reshard_layout_t *src, *dst;
    reshard_topo_t *topo;
};

static void fixture_make(struct fixture *f, const char *src, const char *dst, int world, int dsize)
{
    cr_assert_eq(reshard_layout_parse(src, world, &f->src), RESHARD_OK, "%s", reshard_last_error());
    cr_assert_eq(reshard_layout_parse(dst, world, &f->dst), RESHARD_OK, "%s", reshard_last_error());
    cr_assert_eq(reshard_topo_create(world, dsize, NULL, &f->topo), RESHARD_OK);
}

static void fixture_free(struct fixture *f)
{
    reshard_layout_destroy(f->src);
    reshard_layout_destroy(f->dst);
    reshard_topo_destroy(f->topo);
}

Test(api, plan_outlives_its_inputs_and_reports_stats)
{
    struct fixture f;
    fixture_make(&f, "shape=16x8 ranks=0-3 place=S(0)",
                 "shape=16x8 ranks=4-7 mesh=2x2 place=R,S(1)", 8, 4);
    reshard_tensor_t t = {"layer.0.w", f.src, f.dst};
    reshard_plan_t *p = NULL;
    cr_assert_eq(reshard_plan_create(&t, 1, f.topo, NULL, &p), RESHARD_OK, "%s",
                 reshard_last_error());
    fixture_free(&f);
    cr_assert_eq(reshard_plan_validate(p), RESHARD_OK);
    reshard_plan_stats_t s;
    reshard_rank_stats_t r[8];
    cr_assert_eq(reshard_plan_stats(p, &s, r), RESHARD_OK);
    cr_assert_eq(s.net_bytes, 16 * 8 * 2, "one copy crosses into the destination domain");
    cr_assert_eq(s.min_net_bytes, s.net_bytes);
    cr_assert_eq(s.world_size, 8);
    cr_assert_eq(s.ndomains, 2);
    cr_assert_eq(s.ntensors, 1);
    cr_assert_eq(s.max_nic_bytes, s.lb_nic_bytes);
    cr_assert_eq(r[5].domain, 1);
    cr_assert_eq(r[5].local_index, 1);
    uint64_t in = 0;
    for (int k = 4; k < 8; k++)
        in += r[k].net_in;
    cr_assert_eq(in, s.net_bytes);
    /* 4 row chunks x 2 column halves = 8 cells, each needed by 2 replicas: 2 slices each */
    cr_assert_eq(s.net_ops, 16);
    cr_assert_eq(s.fwd_ops, 16);
    cr_assert_eq(s.local_ops + s.self_ops, 0);
    cr_assert_neq(reshard_plan_hash(p), 0);
    reshard_plan_destroy(p);
}

/* One rank's figures (reshard_plan_rank_stats) are its row of the world's (reshard_plan_stats),
 * for ranks that copy in place, forward, and send over the network. */
Test(api, a_ranks_own_stats_are_its_row_of_the_worlds)
{
    struct fixture f;
    fixture_make(&f, "shape=16x8 ranks=0-7 place=S(0)",
                 "shape=16x8 ranks=0-7 mesh=2x4 place=R,S(1)", 8, 4);
    reshard_tensor_t t = {"w", f.src, f.dst};
    reshard_plan_t *p = NULL;
    cr_assert_eq(reshard_plan_create(&t, 1, f.topo, NULL, &p), RESHARD_OK, "%s",
                 reshard_last_error());
    fixture_free(&f);
    reshard_plan_stats_t s;
    reshard_rank_stats_t r[8];
    cr_assert_eq(reshard_plan_stats(p, &s, r), RESHARD_OK);
    cr_assert_gt(s.self_bytes, 0);
    cr_assert_gt(s.net_bytes, 0);
    for (int k = 0; k < 8; k++) {
        reshard_rank_stats_t own;
        cr_assert_eq(reshard_plan_rank_stats(p, k, &own, NULL, NULL), RESHARD_OK);
        cr_assert_eq(own.net_out, r[k].net_out, "rank %d", k);
        cr_assert_eq(own.net_in, r[k].net_in, "rank %d", k);
        cr_assert_eq(own.local_out, r[k].local_out, "rank %d: local_out %llu, the world's %llu", k,
                     (unsigned long long)own.local_out, (unsigned long long)r[k].local_out);
        cr_assert_eq(own.local_in, r[k].local_in, "rank %d: local_in %llu, the world's %llu", k,
                     (unsigned long long)own.local_in, (unsigned long long)r[k].local_in);
        cr_assert_eq(own.self, r[k].self, "rank %d", k);
        cr_assert_eq(own.delta_snapshot, r[k].delta_snapshot, "rank %d", k);
    }
    reshard_plan_destroy(p);
}

Test(api, layout_info_and_format)
{
    reshard_layout_t *l;
    cr_assert_eq(reshard_layout_parse("shape=3x5 dtype=f64 ranks=9,4 place=S(1)", 0, &l),
                 RESHARD_OK);
    reshard_layout_info_t info;
    cr_assert_eq(reshard_layout_info(l, &info), RESHARD_OK);
    cr_assert_eq(info.ndim, 2);
    cr_assert_eq(info.shape[1], 5);
    cr_assert_eq(info.elem_size, 8);
    cr_assert_eq(info.nranks, 2);
    cr_assert_eq(info.max_rank, 9);
    char buf[128];
    reshard_layout_format(l, buf, sizeof(buf));
    cr_assert_str_eq(buf, "shape=3x5 dtype=f64 ranks=9,4 mesh=2 place=S(1)");
    reshard_layout_destroy(l);
}

/* 16 KiB held by two replicas in two domains, wanted by a rank of a third: returns the
 * network ops of its plan under cfg (NULL: the environment's settings). */
static uint64_t replica_split_ops(const reshard_plan_config_t *cfg)
{
    struct fixture f;
    int dom[] = {0, 1, 2};
    cr_assert_eq(reshard_layout_parse("shape=64x64 dtype=f32 ranks=0-1 place=R", 0, &f.src),
                 RESHARD_OK);
    cr_assert_eq(reshard_layout_parse("shape=64x64 dtype=f32 ranks=2", 0, &f.dst), RESHARD_OK);
    cr_assert_eq(reshard_topo_create(3, 0, dom, &f.topo), RESHARD_OK);
    reshard_tensor_t tensor = {NULL, f.src, f.dst};
    reshard_plan_t *p;
    cr_assert_eq(reshard_plan_create(&tensor, 1, f.topo, cfg, &p), RESHARD_OK, "%s",
                 reshard_last_error());
    reshard_plan_stats_t st;
    cr_assert_eq(reshard_plan_stats(p, &st, NULL), RESHARD_OK);
    reshard_plan_destroy(p);
    fixture_free(&f);
    return st.net_ops;
}

static char *config_text(void)
{
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    reshard_config_print(out);
    fclose(out);
    return text;
}

Test(api, config_sets_the_replica_split)
{
    reshard_plan_config_t cfg = RESHARD_PLAN_CONFIG_INIT;
    cr_assert_eq(replica_split_ops(&cfg), 1, "1 MiB by default: 16 KiB stays whole");
    cfg.split_min_bytes = 4096;
    cr_assert_eq(replica_split_ops(&cfg), 2, "16 KiB split between two replicas");

    struct fixture f;
    fixture_make(&f, "shape=8 ranks=0", "shape=8 ranks=1", 2, 1);
    reshard_tensor_t tensor = {NULL, f.src, f.dst};
    reshard_plan_t *p;
    cfg.size = 4;
    cr_assert_eq(reshard_plan_create(&tensor, 1, f.topo, &cfg, &p), RESHARD_ERR_INVALID_ARG);
    cr_assert_eq(reshard_plan_create(&tensor, 0, f.topo, NULL, &p), RESHARD_ERR_INVALID_ARG);
    fixture_free(&f);
}

Test(api, environment_sets_the_replica_split)
{
    setenv("RESHARD_PLAN_SPLIT_MIN_BYTES", "4096", 1);
    cr_assert_eq(replica_split_ops(NULL), 2);
    char *text = config_text();
    cr_assert(strstr(text, "RESHARD_PLAN_SPLIT_MIN_BYTES   4096         env"), "%s", text);
    cr_assert(strstr(text, "RESHARD_DEBUG                  WARN         default"), "%s", text);
    free(text);
}

Test(api, config_and_environment_cap_the_ops)
{
    struct fixture f;
    fixture_make(&f, "shape=16x16 ranks=0-3 place=S(0)", "shape=16x16 ranks=4-7 place=S(1)", 8, 4);
    reshard_tensor_t t = {"w", f.src, f.dst};
    reshard_plan_config_t cfg = RESHARD_PLAN_CONFIG_INIT;
    cfg.max_ops = 8;
    reshard_plan_t *p = NULL;
    cr_assert_eq(reshard_plan_create(&t, 1, f.topo, &cfg, &p), RESHARD_ERR_TOO_LARGE);
    cr_assert_null(p);
    /* a caller built against a header without max_ops: the field is not read */
    cfg.size = offsetof(reshard_plan_config_t, max_ops);
    cr_assert_eq(reshard_plan_create(&t, 1, f.topo, &cfg, &p), RESHARD_OK, "%s",
                 reshard_last_error());
    reshard_plan_destroy(p);
    fixture_free(&f);
}
