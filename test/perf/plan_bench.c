/* SPDX-License-Identifier: Apache-2.0 */
/*
 * plan_bench: how long planning takes and how much memory it holds (make bench).
 *
 * Default case (issue 2): 1,000 tensors of 7168x18432 bf16 from ranks 0-255 (mesh 16x16,
 * S(0),S(1)) to ranks 256-511 (mesh 8x32, R,S(0)), 8 ranks per domain, planned together.
 * Target: <= 1 ms per tensor on one core. Also prints the busiest NIC against its bound.
 * --manifest FILE plans a whole model instead (make bench: DeepSeek-V3 from
 * scripts/gen-manifest.py, target <= 2 s and <= 1 GiB).
 */
#include "plugin/reshard.h"

#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static double peak_mib(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0; /* KiB on Linux */
}

/* A positive count, or -1. */
static int count_arg(const char *s)
{
    char *end;
    long v = strtol(s, &end, 10);
    return end != s && !*end && v > 0 && v <= (1 << 24) ? (int)v : -1;
}

static int fail(const char *what)
{
    fprintf(stderr, "plan_bench: %s: %s\n", what, reshard_last_error());
    return 1;
}

int main(int argc, char **argv)
{
    const char *src = "shape=7168x18432 dtype=bf16 ranks=0-255 mesh=16x16 place=S(0),S(1)";
    const char *dst = "shape=7168x18432 dtype=bf16 ranks=256-511 mesh=8x32 place=R,S(0)";
    const char *manifest = NULL;
    int ntensors = 1000, domain_size = 8, world = 512, validate = 1, c;
    static const struct option opts[] = {
        {"tensors", required_argument, NULL, 'n'},    {"src", required_argument, NULL, 's'},
        {"dst", required_argument, NULL, 'd'},        {"domain-size", required_argument, NULL, 'D'},
        {"world-size", required_argument, NULL, 'w'}, {"no-validate", no_argument, NULL, 'V'},
        {"manifest", required_argument, NULL, 'm'},   {NULL, 0, NULL, 0},
    };
    while ((c = getopt_long(argc, argv, "n:", opts, NULL)) != -1) {
        switch (c) {
        case 'n':
            ntensors = count_arg(optarg);
            break;
        case 's':
            src = optarg;
            break;
        case 'd':
            dst = optarg;
            break;
        case 'D':
            domain_size = count_arg(optarg);
            break;
        case 'w':
            world = count_arg(optarg);
            break;
        case 'V':
            validate = 0;
            break;
        case 'm':
            manifest = optarg;
            break;
        default:
            fprintf(stderr, "usage: plan_bench [-n TENSORS] [--src SPEC] [--dst SPEC] "
                            "[--domain-size N] [--world-size N] [--no-validate] "
                            "[--manifest FILE]\n");
            return 2;
        }
    }
    if (ntensors < 1 || domain_size < 1 || world < 1) {
        fprintf(stderr, "plan_bench: -n, --domain-size and --world-size take positive counts\n");
        return 2;
    }
    reshard_layout_t *s = NULL, *d = NULL;
    reshard_topo_t *topo;
    reshard_manifest_t *m = NULL;
    reshard_tensor_t *t = NULL;
    const reshard_tensor_t *tensors;
    if (manifest) {
        if (reshard_manifest_load(manifest, &m) != RESHARD_OK)
            return fail("--manifest");
        if (reshard_manifest_topo(m, &topo) != RESHARD_OK)
            return fail("topology");
        tensors = reshard_manifest_tensors(m);
        ntensors = reshard_manifest_ntensors(m);
        world = reshard_manifest_world_size(m);
        src = dst = manifest;
    } else {
        if (reshard_layout_parse(src, world, &s) != RESHARD_OK)
            return fail("--src");
        if (reshard_layout_parse(dst, world, &d) != RESHARD_OK)
            return fail("--dst");
        if (reshard_topo_create(world, domain_size, NULL, &topo) != RESHARD_OK)
            return fail("topology");
        if (!(t = calloc((size_t)ntensors, sizeof(*t))))
            return fail("out of memory");
        for (int i = 0; i < ntensors; i++)
            t[i] = (reshard_tensor_t){NULL, s, d};
        tensors = t;
    }

    double rss0 = peak_mib();
    double t0 = now_ms();
    reshard_plan_t *plan;
    if (reshard_plan_create(tensors, ntensors, topo, NULL, &plan) != RESHARD_OK)
        return fail("plan");
    double t1 = now_ms();
    double rss1 = peak_mib();
    reshard_plan_stats_t st;
    if (reshard_plan_stats(plan, &st, NULL) != RESHARD_OK)
        return fail("stats");
    double t2 = now_ms();
    int valid = !validate || reshard_plan_validate(plan) == RESHARD_OK;
    double t3 = now_ms();

    if (manifest)
        printf("# plan_bench: %d tensors of manifest %s\n#  %d ranks\n", ntensors, manifest, world);
    else
        printf("# plan_bench: %d tensors\n#  src %s\n#  dst %s\n#  %d ranks, domains of %d\n",
               ntensors, src, dst, world, domain_size);
    printf("%-28s %14s\n", "metric", "value");
    printf("%-28s %14.3f\n", "plan_ms_total", t1 - t0);
    printf("%-28s %14.4f\n", "plan_ms_per_tensor", (t1 - t0) / ntensors);
    printf("%-28s %14.1f\n", "peak_rss_mib", rss1);
    printf("%-28s %14.1f\n", "plan_rss_growth_mib", rss1 - rss0);
    printf("%-28s %14" PRIu64 "\n", "ops", st.net_ops + st.local_ops + st.fwd_ops + st.self_ops);
    printf("%-28s %14.3f\n", "stats_ms_per_tensor", (t2 - t1) / ntensors);
    printf("%-28s %14.3f\n", "validate_ms_per_tensor", (t3 - t2) / ntensors);
    printf("%-28s %14" PRIu64 "\n", "net_bytes", st.net_bytes);
    printf("%-28s %14" PRIu64 "\n", "min_net_bytes", st.min_net_bytes);
    printf("%-28s %14" PRIu64 "\n", "max_nic_bytes", st.max_nic_bytes);
    printf("%-28s %14" PRIu64 "\n", "lb_nic_bytes", st.lb_nic_bytes);
    printf("%-28s %14.4f\n", "max_nic_over_lb",
           st.lb_nic_bytes ? (double)st.max_nic_bytes / (double)st.lb_nic_bytes : 0.0);
    printf("%-28s %14s\n", "valid", !validate ? "skipped" : valid ? "yes" : "no");
    reshard_plan_destroy(plan);
    reshard_topo_destroy(topo);
    reshard_layout_destroy(s);
    reshard_layout_destroy(d);
    reshard_manifest_destroy(m);
    free(t);
    return valid ? 0 : 1;
}
