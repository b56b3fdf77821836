/* SPDX-License-Identifier: Apache-2.0 */
/* Multi-process runs of reshard_perf, and the emulated-cluster launcher they use.
 *
 * cluster_sh:   scripts/cluster.sh run itself: torchrun variables, hostnames, exit statuses,
 *               grace, timeout, teardown.
 * cluster_perf: reshard_perf on 2 emulated nodes x 2 ranks (one network namespace per node, so
 *               one NVLink domain per node), one test per layout pair.
 * local_perf:   reshard_perf -np 4 with RESHARD_DOMAIN_SIZE=2 (two domains over loopback): no
 *               root needed, so CI without root still moves bytes between processes.
 *
 * The cluster suites need root and a kernel with network namespaces: when
 * `scripts/cluster.sh check` fails they are skipped with the reason it printed. */
#include "test/tools/run_util.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define OUT_MAX (1 << 20)
#define MIB     (1024.0 * 1024.0)
#define CLUSTER "scripts/cluster.sh"
/* cluster.sh gives up before Criterion does, so it always tears its cluster down itself. */
#define CLUSTER_RUN CLUSTER " run --nodes 2 --ranks-per-node 2 --rate none --timeout 100"
#define PERF_ARGS   "-n 2 -w 1 -c 1"

static char out[OUT_MAX];

/* Runs a printf-formatted command, output into `out`; returns its exit status. */
#define run(...) run_capturef(out, sizeof(out), __VA_ARGS__)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Skips the test, with cluster.sh's reason, where this host cannot build a cluster. */
static void need_cluster(void)
{
    if (run(CLUSTER " check") != 0) {
        out[strcspn(out, "\n")] = '\0';
        cr_skip_test("%s", out);
    }
}

/* The line of `out` that starts with `prefix`, or NULL. */
static const char *line_starting(const char *prefix)
{
    size_t n = strlen(prefix);
    for (const char *p = out; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (strncmp(p, prefix, n) == 0)
            return p;
    return NULL;
}

/* ---- cluster.sh ---- */

Test(cluster_sh, every_rank_gets_torchrun_variables_and_its_nodes_hostname, .timeout = 60)
{
    need_cluster();
    /* Each rank prints its variables, whether MASTER_ADDR is one of its own addresses, and its
     * namespace (to look for it after the run). ip complains of what another job changes
     * meanwhile (namespaces deleted, "Dump was interrupted" while addresses change, which
     * may also cut the dump short: hence three looks): not this test's business. */
    int rc =
        run(CLUSTER " run --nodes 2 --ranks-per-node 2 --rate none --port 23456 -- sh -c '"
                    "own=no; for t in 1 2 3; do ip -4 -o addr show 2>/dev/null | "
                    "grep -q \" inet $MASTER_ADDR/\" && { own=yes; break; }; done; "
                    "echo vars $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $RESHARD_NODE "
                    "$(hostname) $MASTER_PORT $own; echo ns $(ip netns identify 2>/dev/null) >&2'");
    cr_assert_eq(rc, 0, "%s", out);
    for (int r = 0; r < 4; r++) {
        char want[128];
        if (r == 0)
            snprintf(want, sizeof(want), "vars 0 4 0 2 0 rsnode0 23456 yes\n");
        else
            snprintf(want, sizeof(want), "[rank %d] vars %d 4 %d 2 %d rsnode%d 23456 %s\n", r, r,
                     r % 2, r / 2, r / 2, r / 2 ? "no" : "yes");
        cr_assert_not_null(strstr(out, want), "no line '%.*s' in:\n%s", (int)strlen(want) - 1, want,
                           out);
    }
    /* Rank 0's stdout alone is not prefixed, and it comes first. */
    cr_assert_eq(strncmp(out, "vars 0 ", 7), 0, "%s", out);

    /* The namespaces are gone after the run. */
    const char *ns = strstr(out, "[rank 3] ns ");
    cr_assert_not_null(ns, "%s", out);
    char name[32] = "";
    cr_assert_eq(sscanf(ns, "[rank 3] ns %31s", name), 1, "%s", out);
    char *node = strrchr(name, 'n'); /* <prefix>n<node> */
    cr_assert(node && node > name, "odd namespace name '%s'", name);
    *node = '\0';
    /* Read from the file systems, not through ip: a netlink dump of the links is cut short
     * ("Dump was interrupted") while other jobs change theirs, and would miss what it skipped. */
    run("ls /run/netns 2>/dev/null | grep '^%sn[0-9]'; ls /sys/class/net | grep '^%s[a-z]*[0-9]*$';"
        " true",
        name, name);
    cr_assert_str_empty(out, "cluster %s left behind:\n%s", name, out);
}

Test(cluster_sh, first_failing_status_is_returned_and_the_others_are_killed_after_grace,
     .timeout = 60)
{
    need_cluster();
    double t0 = now_s();
    int rc = run(CLUSTER " run --nodes 2 --ranks-per-node 2 --rate none --grace 1 -- sh -c '"
                         "if [ $RANK = 2 ]; then echo bye >&2; exit 7; fi; sleep 60'");
    double took = now_s() - t0;
    cr_assert_eq(rc, 7, "%s", out);
    cr_assert_lt(took, 20.0, "the sleeping ranks were not killed (%.1f s)", took);
    cr_assert_not_null(strstr(out, "[rank 2] bye\n"), "%s", out);
}

Test(cluster_sh, timeout_kills_every_rank_and_exits_124, .timeout = 60)
{
    need_cluster();
    double t0 = now_s();
    int rc = run(CLUSTER " run --nodes 1 --ranks-per-node 2 --rate none --timeout 2 -- "
                         "sh -c 'trap \"\" TERM; sleep 60'");
    double took = now_s() - t0;
    cr_assert_eq(rc, 124, "%s", out);
    cr_assert_lt(took, 20.0, "ranks that ignore TERM were not killed (%.1f s)", took);
}

Test(cluster_sh, bad_usage_exits_2, .timeout = 30)
{
    cr_assert_eq(run(CLUSTER " run --nodes 0 --ranks-per-node 1 -- true"), 2, "%s", out);
    cr_assert_eq(run(CLUSTER " run --nodes 1 --ranks-per-node 1 --rate fast -- true"), 2, "%s",
                 out);
    cr_assert_eq(run(CLUSTER " run --nodes 1 --ranks-per-node 1"), 2, "%s", out);
    cr_assert_eq(run(CLUSTER " frobnicate"), 2, "%s", out);
}

/* ---- reshard_perf ---- */

struct row {
    char algo[16];
    long long wrong;
    double time_us, net_mb, min_mb, nic_mb;
    char net_s[32], min_s[32];
};

static struct row rows[8]; /* the last output's table, parsed by check_perf */
static int nrows;

/* Table rows of reshard_perf's output (lines not starting with '#' that parse as a row). */
static int parse_rows(struct row *into, int max)
{
    int n = 0;
    for (const char *p = out; *p && n < max;) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        char line[512];
        if (*p != '#' && len < sizeof(line)) {
            memcpy(line, p, len);
            line[len] = '\0';
            unsigned long long size;
            long long count;
            char type[16];
            double algbw, busbw;
            struct row *r = &into[n];
            if (sscanf(line, "%llu %lld %15s %15s %lf %lf %lf %lld %31s %31s %lf", &size, &count,
                       type, r->algo, &r->time_us, &algbw, &busbw, &r->wrong, r->net_s, r->min_s,
                       &r->nic_mb) == 11) {
                r->net_mb = atof(r->net_s);
                r->min_mb = atof(r->min_s);
                n++;
            }
        }
        p += len + (eol != NULL);
    }
    return n;
}

/* min_net_bytes from reshard-plan for the pair on 4 ranks in domains of 2. */
static long long plan_min_net_bytes(const char *src, const char *dst)
{
    int rc = run("%s/reshard-plan --src '%s' --dst '%s' --world-size 4 --domain-size 2",
                 build_dir(), src, dst);
    cr_assert_eq(rc, 0, "reshard-plan refuses the pair:\n%s", out);
    const char *p = strstr(out, "\nmin_net_bytes ");
    cr_assert_not_null(p, "%s", out);
    return atoll(p + strlen("\nmin_net_bytes "));
}

/* Asserts, on reshard_perf's own figures: exit 0, one row per algo with no wrong element, the
 * planner's minimum as minMB, at least that much over the network for every algo and exactly
 * that much for reshard, and both footer verdicts. */
static void check_perf(int rc, const char *algos, long long min_bytes)
{
    cr_assert_eq(rc, 0, "reshard_perf failed (status %d):\n%s", rc, out);
    int n = nrows = parse_rows(rows, 8);
    char want_min[32];
    snprintf(want_min, sizeof(want_min), "%.2f", (double)min_bytes / MIB);

    char list[64];
    snprintf(list, sizeof(list), "%s", algos);
    for (char *save, *a = strtok_r(list, ",", &save); a; a = strtok_r(NULL, ",", &save)) {
        const struct row *r = NULL;
        for (int i = 0; i < n && !r; i++)
            if (strcmp(rows[i].algo, a) == 0)
                r = &rows[i];
        cr_assert_not_null(r, "no %s row in:\n%s", a, out);
        cr_assert_eq(r->wrong, 0, "%s: %lld wrong elements\n%s", a, r->wrong, out);
        cr_assert_str_eq(r->min_s, want_min, "%s: minMB %s, the plan's minimum is %lld bytes\n%s",
                         a, r->min_s, min_bytes, out);
        cr_assert_geq(r->net_mb, r->min_mb, "%s moved less than the minimum:\n%s", a, out);
        if (strcmp(a, "reshard") == 0)
            cr_assert_str_eq(r->net_s, r->min_s, "reshard moved more than the minimum:\n%s", out);
    }
    cr_assert_not_null(line_starting("# Out of bounds values : 0 OK\n"), "%s", out);
    cr_assert_not_null(line_starting("# Byte counts vs plan : 0 ranks differ OK\n"), "%s", out);
}

static const char *perf_bin(void)
{
    static char path[512];
    snprintf(path, sizeof(path), "%s/test/perf/reshard_perf", build_dir());
    return path;
}

/* reshard_perf over 2 emulated nodes of 2 ranks. */
static void cluster_pair(const char *src, const char *dst, const char *algos)
{
    need_cluster();
    long long min_bytes = plan_min_net_bytes(src, dst);
    int rc = run(CLUSTER_RUN " -- %s " PERF_ARGS " --src '%s' --dst '%s' --algo %s", perf_bin(),
                 src, dst, algos);
    check_perf(rc, algos, min_bytes);
    /* The library sees one host, hence one domain, per node. */
    for (int r = 0; r < 4; r++) {
        char prefix[32], host[16], dom[16];
        snprintf(prefix, sizeof(prefix), "#  Rank %2d ", r);
        snprintf(host, sizeof(host), " rsnode%d ", r / 2);
        snprintf(dom, sizeof(dom), " domain %d\n", r / 2);
        const char *l = line_starting(prefix);
        cr_assert_not_null(l, "no '%s' line:\n%s", prefix, out);
        size_t len = strcspn(l, "\n") + 1;
        cr_assert(memmem(l, len, host, strlen(host)) && memmem(l, len, dom, strlen(dom)),
                  "rank %d should be on rsnode%d in domain %d: %.*s", r, r / 2, r / 2, (int)len - 1,
                  l);
    }
}

/* reshard_perf -np 4 on this host, in two domains of two ranks. */
static void local_pair(const char *src, const char *dst, const char *algos)
{
    long long min_bytes = plan_min_net_bytes(src, dst);
    int rc = run("RESHARD_DOMAIN_SIZE=2 timeout 100 %s -np 4 " PERF_ARGS
                 " --src '%s' --dst '%s' --algo %s",
                 perf_bin(), src, dst, algos);
    check_perf(rc, algos, min_bytes);
}

/* The NIC cap holds: 4 MiB from node 0 to node 1 at 100mbit cannot take less than the time
 * the busiest NIC needs at that rate (tbf's 256 KiB burst aside). */
Test(cluster_sh, rate_caps_every_nodes_nic, .timeout = 120)
{
    need_cluster();
    const char *src = "shape=4096x1024 dtype=u8 ranks=0-1 place=S(0)";
    const char *dst = "shape=4096x1024 dtype=u8 ranks=2-3 place=S(0)";
    long long min_bytes = plan_min_net_bytes(src, dst);
    int rc = run(CLUSTER " run --nodes 2 --ranks-per-node 2 --rate 100mbit --timeout 100 -- "
                         "%s " PERF_ARGS " --src '%s' --dst '%s' --algo reshard",
                 perf_bin(), src, dst);
    check_perf(rc, "reshard", min_bytes);
    cr_assert_eq(nrows, 1, "%s", out);
    cr_assert_str_eq(rows[0].net_s, "4.00", "%s", out);
    double bound_us = rows[0].nic_mb * MIB / (100e6 / 8) * 1e6;
    cr_assert_gt(bound_us, 0.0, "%s", out);
    cr_assert_geq(rows[0].time_us, 0.8 * bound_us,
                  "4 MiB through a 100mbit NIC in %.0f us, faster than its %.0f us at line rate",
                  rows[0].time_us, bound_us);
}

#define RD  "reshard,direct"
#define RDB "reshard,direct,bcast"

/* ---- cluster_perf: one test per layout pair. Ranks 0-1 are node 0, ranks 2-3 node 1. ---- */

Test(cluster_perf, rows_to_columns_f32_colocated, .timeout = 120)
{
    cluster_pair("shape=1024x768 dtype=f32 ranks=0-3 place=S(0)",
                 "shape=1024x768 dtype=f32 ranks=0-3 place=S(1)", RDB);
}

Test(cluster_perf, uneven_7x13_bf16_onto_2d_mesh, .timeout = 120)
{
    cluster_pair("shape=7x13 dtype=bf16 ranks=0-3 place=S(1)",
                 "shape=7x13 dtype=bf16 ranks=0-3 mesh=2x2 place=S(0),S(1)", RD);
}

Test(cluster_perf, uneven_1001x777_f16_to_reversed_ranks, .timeout = 120)
{
    cluster_pair("shape=1001x777 dtype=f16 ranks=0-3 place=S(0)",
                 "shape=1001x777 dtype=f16 ranks=3,2,1,0 place=S(1)", RD);
}

Test(cluster_perf, source_replicas_inside_each_node_f32, .timeout = 120)
{
    cluster_pair("shape=512x384 dtype=f32 ranks=0-3 mesh=2x2 place=S(0),R",
                 "shape=512x384 dtype=f32 ranks=0-3 place=S(1)", RDB);
}

Test(cluster_perf, source_replicas_across_nodes_i32_to_one_node, .timeout = 120)
{
    cluster_pair("shape=256x192 dtype=i32 ranks=0,2,1,3 mesh=2x2 place=R,S(0)",
                 "shape=256x192 dtype=i32 ranks=2-3 place=S(1)", RD);
}

Test(cluster_perf, disjoint_ranks_node0_to_node1_f64, .timeout = 120)
{
    cluster_pair("shape=300x200 dtype=f64 ranks=0-1 place=S(0)",
                 "shape=300x200 dtype=f64 ranks=2-3 place=S(1)", RDB);
}

Test(cluster_perf, partially_overlapping_ranks_uneven_i64, .timeout = 120)
{
    cluster_pair("shape=333x100 dtype=i64 ranks=0-2 place=S(0)",
                 "shape=333x100 dtype=i64 ranks=1-3 place=S(1)", RD);
}

Test(cluster_perf, strided_shards_on_both_sides_bf16, .timeout = 120)
{
    cluster_pair("shape=1024x512 dtype=bf16 ranks=0-1 place=SS(0,2)",
                 "shape=1024x512 dtype=bf16 ranks=0-3 place=SS(0,2)", RDB);
}

Test(cluster_perf, strided_shard_on_2d_mesh_to_shuffled_ranks_f32, .timeout = 120)
{
    cluster_pair("shape=64x96 dtype=f32 ranks=0-3 mesh=2x2 place=SS(1,3),S(0)",
                 "shape=64x96 dtype=f32 ranks=2,3,0,1 place=S(1)", RD);
}

Test(cluster_perf, one_dim_uneven_i8_gathered_on_node1, .timeout = 120)
{
    cluster_pair("shape=100003 dtype=i8 ranks=0-3 place=S(0)",
                 "shape=100003 dtype=i8 ranks=2-3 place=R", RD);
}

Test(cluster_perf, one_dim_fp8e4m3_scattered_from_rank0, .timeout = 120)
{
    cluster_pair("shape=65536 dtype=fp8e4m3 ranks=0 place=R",
                 "shape=65536 dtype=fp8e4m3 ranks=0-3 place=S(0)", RDB);
}

Test(cluster_perf, three_dims_small_bf16_on_2d_mesh, .timeout = 120)
{
    cluster_pair("shape=6x10x12 dtype=bf16 ranks=0-3 mesh=2x2 place=S(0),S(2)",
                 "shape=6x10x12 dtype=bf16 ranks=0-3 place=S(1)", RD);
}

Test(cluster_perf, three_dims_experts_i32_to_replicated_tp, .timeout = 120)
{
    cluster_pair("shape=8x64x128 dtype=i32 ranks=0-3 place=S(0)",
                 "shape=8x64x128 dtype=i32 ranks=0-3 mesh=2x2 place=R,S(2)", RDB);
}

Test(cluster_perf, two_mesh_dims_on_one_tensor_dim_u8, .timeout = 120)
{
    cluster_pair("shape=130x50 dtype=u8 ranks=0-3 mesh=2x2 place=S(0),S(0)",
                 "shape=130x50 dtype=u8 ranks=0-3 mesh=2x2 place=S(1),S(0)", RD);
}

Test(cluster_perf, replicated_to_replicated_on_more_ranks_f64, .timeout = 120)
{
    cluster_pair("shape=96x64 dtype=f64 ranks=0-1 place=R",
                 "shape=96x64 dtype=f64 ranks=0-3 place=R", RDB);
}

Test(cluster_perf, same_layout_moves_nothing_fp8e5m2, .timeout = 120)
{
    cluster_pair("shape=200x300 dtype=fp8e5m2 ranks=0-3 mesh=2x2 place=S(0),S(1)",
                 "shape=200x300 dtype=fp8e5m2 ranks=0-3 mesh=2x2 place=S(0),S(1)", RD);
}

/* ---- local_perf: no root, 4 processes, domains {0,1} and {2,3} ---- */

Test(local_perf, disjoint_domains_f64, .timeout = 120)
{
    local_pair("shape=300x200 dtype=f64 ranks=0-1 place=S(0)",
               "shape=300x200 dtype=f64 ranks=2-3 place=S(1)", RDB);
}

Test(local_perf, source_replicas_across_domains_i32, .timeout = 120)
{
    local_pair("shape=256x192 dtype=i32 ranks=0,2,1,3 mesh=2x2 place=R,S(0)",
               "shape=256x192 dtype=i32 ranks=0-3 place=S(1)", RD);
}

Test(local_perf, strided_shards_on_both_sides_bf16, .timeout = 120)
{
    local_pair("shape=1024x512 dtype=bf16 ranks=0-1 place=SS(0,2)",
               "shape=1024x512 dtype=bf16 ranks=0-3 place=SS(0,2)", RDB);
}

Test(local_perf, uneven_three_dims_u8_to_2d_mesh, .timeout = 120)
{
    local_pair("shape=5x33x17 dtype=u8 ranks=0-3 place=S(1)",
               "shape=5x33x17 dtype=u8 ranks=3,1,2,0 mesh=2x2 place=S(2),R", RD);
}

/* ---- model_perf: a whole model, every tensor in one plan ---- */

/* Qwen3-30B-A3B's structure (12,723 tensors) at 1/32 of its hidden sizes: training EP2 x PP2
 * (4 ranks) to inference TP2 x DP2 (4 ranks), domains of 2. Every element is checked, the bytes
 * each rank moved are the plan's, and the small tensors travel packed: at most a few data
 * messages per peer (7 peers), not one per tensor. On 4 emulated nodes x 2 ranks when this host
 * can make them, else 8 local processes in domains of 2. */
Test(model_perf, scaled_qwen3_30b_end_to_end_in_few_messages_per_peer, .timeout = 300)
{
    char path[] = "/tmp/reshard-model-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    int rc = run("scripts/gen-manifest.py --model qwen3-30b-a3b --train ep=2,pp=2,dp=2 "
                 "--infer tp=2,dp=2 --domain-size 2 --scale 32 --no-views -o %s",
                 path);
    cr_assert_eq(rc, 0, "%s", out);
    rc = run("%s/reshard-plan --manifest %s", build_dir(), path);
    cr_assert_eq(rc, 0, "%s", out);
    const char *p = strstr(out, "\nmin_net_bytes ");
    cr_assert_not_null(p, "%s", out);
    long long min_bytes = atoll(p + strlen("\nmin_net_bytes "));
    cr_assert(strstr(out, "tensors 12723\n"), "%s", out);
    if (run(CLUSTER " check") == 0)
        rc = run(CLUSTER " run --nodes 4 --ranks-per-node 2 --rate none --timeout 250 -- %s "
                         "--manifest %s -n 2 -w 1",
                 perf_bin(), path);
    else
        rc = run("RESHARD_DOMAIN_SIZE=2 timeout 250 %s -np 8 --manifest %s -n 2 -w 1", perf_bin(),
                 path);
    unlink(path);
    check_perf(rc, "reshard", min_bytes);
    const char *m = line_starting("# Data messages        : at most ");
    cr_assert_not_null(m, "%s", out);
    long msgs = atol(m + strlen("# Data messages        : at most "));
    cr_assert(msgs >= 1 && msgs <= 4 * 7, "%ld data messages on one rank per iteration:\n%s", msgs,
              out);
}

/* ---- cluster_faults ---- */

/* Node 1's link goes down (its veth set down from inside its namespace: no FIN, no RST, just
 * silence) `seconds` into a run of 30 x 64 MiB across a 1 gbit NIC. Every rank must fail on its
 * own, within RESHARD_TIMEOUT (5 s) + 2 s of the drop, naming a rank it waited for; none may
 * hang until cluster.sh's grace kills it. (Leak checks off: under ASan, LeakSanitizer cannot
 * run in the node's namespace and its exit code would replace the rank's.) */
static void link_down_after(const char *seconds)
{
    need_cluster();
    double t0 = now_s();
    int rc =
        run(CLUSTER " run --nodes 2 --ranks-per-node 2 --rate 1gbit --grace 8 --timeout 60 "
                    "-- sh -c 'if [ \"$RESHARD_NODE\" = 1 ] && [ \"$LOCAL_RANK\" = 0 ]; then "
                    "(sleep %s; ip link set \"$(ls /sys/class/net | grep -vx lo)\" down) & "
                    "fi; RESHARD_TIMEOUT=5 ASAN_OPTIONS=detect_leaks=0 exec %s -n 30 -w 0 -c 0 "
                    "--src \"shape=8192x8192 dtype=u8 ranks=0-1 place=S(0)\" "
                    "--dst \"shape=8192x8192 dtype=u8 ranks=2-3 place=S(1)\"'",
            seconds, perf_bin());
    double took = now_s() - t0;
    cr_log_info("link down after %s s: exit %d after %.1f s:\n%s", seconds, rc, took, out);
    cr_assert(rc != 0 && rc != 124, "exit %d (124: a rank hung until the timeout):\n%s", rc, out);
    /* A rank that hung would be killed by the grace, and print no failure of its own (below);
     * the bound leaves start-up on a loaded host room. */
    cr_assert_lt(took, 20, "took %.1f s (drop at 1.5 s, timeout 5 s, grace 8 s):\n%s", took, out);
    for (int r = 0; r < 4; r++) {
        char who[48];
        snprintf(who, sizeof(who), "reshard_perf: rank %d: ", r);
        const char *l = strstr(out, who);
        cr_assert_not_null(l, "rank %d did not fail on its own:\n%s", r, out);
        size_t len = strcspn(l, "\n");
        cr_assert(memmem(l + strlen(who), len - strlen(who), "rank ", 5),
                  "rank %d's error names no rank: %.*s", r, (int)len, l);
    }
}

Test(cluster_faults, a_link_that_goes_down_mid_transfer_fails_every_rank, .timeout = 120)
{
    link_down_after("1.5");
}

/* The same while the ranks are still connecting (plan creation): UCX's TCP transport connected
 * blocking and waited out the kernel's SYN retries, so ranks hung until the grace killed them
 * (UCX_TCP_CONN_NB is now set). */
Test(cluster_faults, a_link_that_goes_down_while_ranks_connect_fails_every_rank, .timeout = 120)
{
    link_down_after("0.3");
}
