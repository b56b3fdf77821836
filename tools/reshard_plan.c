/* SPDX-License-Identifier: Apache-2.0 */
/*
 * reshard-plan: explains the plan of one reshard (docs/figures.md defines what it prints). Uses
 * only the public API. Exit status: 0 valid plan, 1 invalid plan, 2 bad input, 3 data lost.
 */
#include "plugin/reshard.h"

#include <getopt.h>
#include <sys/resource.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_DOMAIN_SIZE 8
#define TABLE_ROWS          32

static const char usage[] =
    "usage: reshard-plan --src SPEC --dst SPEC [--domain-size N | --domains LIST]\n"
    "                    [--world-size N] [--json] [--all-ranks]\n"
    "       reshard-plan --manifest FILE [--domain-size N | --domains LIST] [--json]\n"
    "                    [--all-ranks]\n"
    "       (either form) [--cluster nic=50GB/s,nvlink=450GB/s,latency=5us]\n"
    "                     [--exclude RANKS] [--rank R]\n"
    "       reshard-plan --dump-config\n"
    "\n"
    "  --src, --dst SPEC   layouts, e.g. 'shape=7168x2048 dtype=bf16 ranks=0-7 mesh=2x4 "
    "place=R,S(0)'\n"
    "  --domain-size N     NVLink domains of N consecutive ranks (default 8)\n"
    "  --domains LIST      the domain id of every rank, comma separated\n"
    "  --world-size N      ranks in the communicator (default: past the highest rank used)\n"
    "  --manifest FILE     a whole model (JSON, docs/manifest.md): every tensor in one plan;\n"
    "                      its domains unless --domain-size or --domains says otherwise\n"
    "  --json              the same report as JSON\n"
    "  --cluster SPEC      also predict the refit's time for reshard, direct and bcast on a\n"
    "                      cluster: each rank's NIC and NVLink bandwidth (per direction; B/s\n"
    "                      or b/s with K, M, G, T) and the latency of a message (ns, us, ms,\n"
    "                      s). A flow model from the plans' per-rank bytes and messages, not a\n"
    "                      measurement\n"
    "  --all-ranks         list every rank with traffic (the table stops at 32 otherwise)\n"
    "  --exclude RANKS     plan as after reshard_comm_shrink: these ranks (comma separated)\n"
    "                      are gone, their pieces come from replicas\n"
    "  --rank R            plan rank R alone, as its communicator rank would (only what it\n"
    "                      sends, receives or forwards); the report ends with rank_ops,\n"
    "                      plan_ms and peak_rss_mib\n"
    "\n"
    "The report ends with net_bytes, min_net_bytes, gather_bcast_bytes, local_bytes,\n"
    "max_nic_bytes, lb_nic_bytes, plan_ms and valid. Exit status: 0 valid, 1 invalid,\n"
    "2 bad input, 3 data lost (only excluded ranks held a piece that is needed).\n"
    "\n"
    "Documentation, in the source tree's docs/: layouts.md (the SPEC grammar),\n"
    "manifest.md (the FILE schema), figures.md (every figure printed here).\n";

struct args {
    const char *src, *dst, *domains, *manifest, *cluster, *exclude;
    int domain_size, world_size, json, all_ranks, dump_config;
    int rank; /* --rank, or -1 */
};

static int bad_input(const char *what, const char *detail)
{
    fprintf(stderr, "error: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    return 2;
}

static int parse_count(const char *s, int *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end || v < 1 || v > (1 << 20))
        return -1;
    *out = (int)v;
    return 0;
}

static int parse_args(int argc, char **argv, struct args *a)
{
    static const struct option opts[] = {
        {"src", required_argument, NULL, 's'},
        {"dst", required_argument, NULL, 'd'},
        {"domain-size", required_argument, NULL, 'n'},
        {"domains", required_argument, NULL, 'D'},
        {"world-size", required_argument, NULL, 'w'},
        {"json", no_argument, NULL, 'j'},
        {"all-ranks", no_argument, NULL, 'a'},
        {"dump-config", no_argument, NULL, 'c'},
        {"manifest", required_argument, NULL, 'm'},
        {"cluster", required_argument, NULL, 'k'},
        {"exclude", required_argument, NULL, 'x'},
        {"rank", required_argument, NULL, 'r'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 's':
            a->src = optarg;
            break;
        case 'd':
            a->dst = optarg;
            break;
        case 'n':
            if (parse_count(optarg, &a->domain_size))
                return bad_input("--domain-size: expected a positive integer", optarg);
            break;
        case 'D':
            a->domains = optarg;
            break;
        case 'w':
            if (parse_count(optarg, &a->world_size))
                return bad_input("--world-size: expected a positive integer", optarg);
            break;
        case 'j':
            a->json = 1;
            break;
        case 'a':
            a->all_ranks = 1;
            break;
        case 'c':
            a->dump_config = 1;
            break;
        case 'm':
            a->manifest = optarg;
            break;
        case 'k':
            a->cluster = optarg;
            break;
        case 'x':
            a->exclude = optarg;
            break;
        case 'r': {
            int r;
            if (!strcmp(optarg, "0"))
                a->rank = 0;
            else if (parse_count(optarg, &r) == 0)
                a->rank = r;
            else
                return bad_input("--rank: expected a rank number", optarg);
            break;
        }
        case 'h':
            fputs(usage, stdout);
            exit(0);
        default:
            fprintf(stderr, "error: unknown or incomplete option '%s'\n%s", argv[optind - 1],
                    usage);
            return 2;
        }
    }
    if (optind < argc)
        return bad_input("unexpected argument", argv[optind]);
    if (a->dump_config)
        return 0;
    if (a->rank >= 0 && (a->cluster || a->all_ranks))
        return bad_input("--rank plans one rank: --cluster and --all-ranks need every rank's plan",
                         NULL);
    if (a->cluster && a->json)
        return bad_input("--cluster reports in text only: drop --json", NULL);
    if (a->manifest && (a->src || a->dst || a->world_size))
        return bad_input("--manifest excludes --src, --dst and --world-size", NULL);
    if (a->domains && a->domain_size)
        return bad_input("--domains and --domain-size exclude each other", NULL);
    if (a->manifest)
        return 0;
    if (!a->src || !a->dst) {
        fprintf(stderr, "error: --src and --dst are required\n%s", usage);
        return 2;
    }
    if (a->domains && a->domain_size)
        return bad_input("--domains and --domain-size exclude each other", NULL);
    return 0;
}

/* "0,0,1,1" -> ids; returns the count, or -1 on a malformed list. */
static int parse_domains(const char *s, int **ids)
{
    int n = 1;
    for (const char *p = s; *p; p++)
        n += *p == ',';
    int *v = calloc((size_t)n, sizeof(int));
    if (!v)
        return -1;
    const char *p = s;
    for (int i = 0; i < n; i++) {
        char *end;
        long x = strtol(p, &end, 10);
        if (end == p || x < 0 || x > (1 << 20) || (*end != ',' && *end != '\0')) {
            free(v);
            return -1;
        }
        v[i] = (int)x;
        p = end + 1;
    }
    *ids = v;
    return n;
}

static void human(char *buf, size_t n, uint64_t bytes)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024 && u < 5) {
        v /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(buf, n, "%" PRIu64 " B", bytes);
    else
        snprintf(buf, n, "%.2f %s", v, units[u]);
}

static int has_traffic(const reshard_rank_stats_t *r)
{
    return r->net_out || r->net_in || r->local_out || r->local_in || r->self;
}

static void print_table(const reshard_plan_stats_t *s, const reshard_rank_stats_t *r, int all)
{
    printf("%6s %5s %5s %12s %12s %12s %12s %12s %8s\n", "rank", "dom", "rail", "net_out", "net_in",
           "local_out", "local_in", "self", "msgs");
    int shown = 0, busy = 0;
    for (int k = 0; k < s->world_size; k++) {
        if (!has_traffic(&r[k]))
            continue;
        busy++;
        if (!all && shown == TABLE_ROWS)
            continue;
        char b[5][32];
        human(b[0], sizeof(b[0]), r[k].net_out);
        human(b[1], sizeof(b[1]), r[k].net_in);
        human(b[2], sizeof(b[2]), r[k].local_out);
        human(b[3], sizeof(b[3]), r[k].local_in);
        human(b[4], sizeof(b[4]), r[k].self);
        printf("%6d %5d %5d %12s %12s %12s %12s %12s %8" PRIu64 "\n", k, r[k].domain,
               r[k].local_index, b[0], b[1], b[2], b[3], b[4], r[k].net_msgs);
        shown++;
    }
    if (busy > shown)
        printf("   ... %d more ranks with traffic (--all-ranks lists them)\n", busy - shown);
    printf("ops: %" PRIu64 " net, %" PRIu64 " local, %" PRIu64 " fwd, %" PRIu64 " self\n",
           s->net_ops, s->local_ops, s->fwd_ops, s->self_ops);
    if (s->max_nic_rank >= 0)
        printf("busiest NIC: rank %d, %.3f x the lower bound\n", s->max_nic_rank,
               s->lb_nic_bytes ? (double)s->max_nic_bytes / (double)s->lb_nic_bytes : 0.0);
    printf("\n");
}

static void print_tail(const reshard_plan_stats_t *s, int valid)
{
    printf("net_bytes %" PRIu64 "\n", s->net_bytes);
    printf("min_net_bytes %" PRIu64 "\n", s->min_net_bytes);
    printf("gather_bcast_bytes %" PRIu64 "\n", s->gather_bcast_bytes);
    printf("local_bytes %" PRIu64 "\n", s->local_bytes);
    printf("max_nic_bytes %" PRIu64 "\n", s->max_nic_bytes);
    printf("lb_nic_bytes %" PRIu64 "\n", s->lb_nic_bytes);
    printf("plan_ms %.3f\n", s->plan_ms);
    printf("valid %s\n", valid ? "yes" : "no");
}

static void json_string(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            printf("\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            printf("\\u%04x", *s);
        else
            putchar(*s);
    }
    putchar('"');
}

static void print_json(const reshard_plan_stats_t *s, const reshard_rank_stats_t *r,
                       const char *src, const char *dst, uint64_t hash, int valid, const char *why)
{
    printf("{\n  \"src\": ");
    json_string(src);
    printf(",\n  \"dst\": ");
    json_string(dst);
    printf(",\n  \"world_size\": %d,\n  \"ndomains\": %d,\n  \"plan_hash\": \"0x%016" PRIx64
           "\",\n",
           s->world_size, s->ndomains, hash);
    printf("  \"ranks\": [");
    int first = 1;
    for (int k = 0; k < s->world_size; k++) {
        if (!has_traffic(&r[k]))
            continue;
        printf("%s\n    {\"rank\": %d, \"domain\": %d, \"rail\": %d, \"net_out\": %" PRIu64
               ", \"net_in\": %" PRIu64 ", \"local_out\": %" PRIu64 ", \"local_in\": %" PRIu64
               ", \"self\": %" PRIu64 ", \"net_msgs\": %" PRIu64 "}",
               first ? "" : ",", k, r[k].domain, r[k].local_index, r[k].net_out, r[k].net_in,
               r[k].local_out, r[k].local_in, r[k].self, r[k].net_msgs);
        first = 0;
    }
    printf("\n  ],\n  \"ops\": {\"net\": %" PRIu64 ", \"local\": %" PRIu64 ", \"fwd\": %" PRIu64
           ", \"self\": %" PRIu64 "},\n",
           s->net_ops, s->local_ops, s->fwd_ops, s->self_ops);
    printf("  \"net_bytes\": %" PRIu64 ",\n  \"min_net_bytes\": %" PRIu64
           ",\n  \"gather_bcast_bytes\": %" PRIu64 ",\n  \"local_bytes\": %" PRIu64
           ",\n  \"self_bytes\": %" PRIu64 ",\n  \"max_nic_bytes\": %" PRIu64
           ",\n  \"max_nic_rank\": %d,\n  \"lb_nic_bytes\": %" PRIu64
           ",\n  \"plan_ms\": %.3f,\n  \"valid\": %s",
           s->net_bytes, s->min_net_bytes, s->gather_bcast_bytes, s->local_bytes, s->self_bytes,
           s->max_nic_bytes, s->max_nic_rank, s->lb_nic_bytes, s->plan_ms,
           valid ? "true" : "false");
    if (!valid) {
        printf(",\n  \"error\": ");
        json_string(why);
    }
    printf("\n}\n");
}

/* The canonical spec, however long its rank list; NULL when out of memory. */
static char *format_layout(const reshard_layout_t *l)
{
    size_t n = reshard_layout_format(l, NULL, 0) + 1;
    char *buf = malloc(n);
    if (buf)
        reshard_layout_format(l, buf, n);
    return buf;
}

static int max_rank(const reshard_layout_t *l)
{
    reshard_layout_info_t info;
    return reshard_layout_info(l, &info) == RESHARD_OK ? info.max_rank : -1;
}

/* Validates the plan (why: the reason when not valid) and gathers its statistics; 0 or -1 after
 * reporting the failure. *ranks is the caller's to free. */
static int evaluate(const reshard_plan_t *plan, int world, int *valid, char *why, size_t n,
                    reshard_plan_stats_t *s, reshard_rank_stats_t **ranks)
{
    *valid = reshard_plan_validate(plan) == RESHARD_OK;
    snprintf(why, n, "%s", *valid ? "" : reshard_last_error());
    if (!(*ranks = calloc((size_t)world, sizeof(**ranks))) ||
        reshard_plan_stats(plan, s, *ranks) != RESHARD_OK) {
        fprintf(stderr, "error: %s\n", *ranks ? reshard_last_error() : "out of memory");
        return -1;
    }
    return 0;
}

/* "50GB/s", "400Gb/s": bytes per second. */
static int parse_rate(const char *s, double *out)
{
    char *end;
    double v = strtod(s, &end);
    double scale = 1;
    switch (*end) {
    case 'K':
        scale = 1e3, end++;
        break;
    case 'M':
        scale = 1e6, end++;
        break;
    case 'G':
        scale = 1e9, end++;
        break;
    case 'T':
        scale = 1e12, end++;
        break;
    default:
        break;
    }
    if (!strcmp(end, "B/s"))
        *out = v * scale;
    else if (!strcmp(end, "b/s"))
        *out = v * scale / 8;
    else
        return -1;
    return end == s || !(*out > 0) ? -1 : 0;
}

/* "5us": seconds. */
static int parse_latency(const char *s, double *out)
{
    char *end;
    double v = strtod(s, &end);
    static const struct {
        const char *unit;
        double scale;
    } units[] = {{"ns", 1e-9}, {"us", 1e-6}, {"ms", 1e-3}, {"s", 1}};
    for (size_t i = 0; end != s && v >= 0 && i < sizeof(units) / sizeof(units[0]); i++)
        if (!strcmp(end, units[i].unit)) {
            *out = v * units[i].scale;
            return 0;
        }
    return -1;
}

/* nic=..,nvlink=..,latency=..: every key required once. */
static int parse_cluster(const char *spec, reshard_cluster_t *c)
{
    char buf[256], *save;
    int seen = 0;
    snprintf(buf, sizeof(buf), "%s", spec);
    for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '=');
        if (!eq)
            return bad_input("--cluster: expected key=value", item);
        *eq++ = '\0';
        if (!strcmp(item, "nic") && !parse_rate(eq, &c->nic_bytes_per_s))
            seen |= 1;
        else if (!strcmp(item, "nvlink") && !parse_rate(eq, &c->nvlink_bytes_per_s))
            seen |= 2;
        else if (!strcmp(item, "latency") && !parse_latency(eq, &c->latency_s))
            seen |= 4;
        else
            return bad_input("--cluster: expected nic=RATE, nvlink=RATE, latency=TIME (RATE like "
                             "50GB/s or 400Gb/s, TIME like 5us)",
                             item);
    }
    return seen == 7 ? 0 : bad_input("--cluster: nic, nvlink and latency are all needed", spec);
}

static int print_prediction(const reshard_plan_t *plan, const char *spec)
{
    reshard_cluster_t c;
    reshard_prediction_t p;
    if (parse_cluster(spec, &c))
        return 2;
    if (reshard_plan_predict(plan, &c, &p) != RESHARD_OK) {
        fprintf(stderr, "error: %s\n", reshard_last_error());
        return 2;
    }
    static const char *const names[] = {"reshard", "direct", "bcast"};
    printf("\nPREDICTION for %s (a flow model from each rank's bytes and messages, not a "
           "measurement)\n",
           spec);
    for (int a = 0; a < 3; a++) {
        char nic[32], nvl[32];
        human(nic, sizeof(nic), p.max_nic_bytes[a]);
        human(nvl, sizeof(nvl), p.max_nvlink_bytes[a]);
        printf("predicted_%s_s %.6f   (busiest NIC %s, busiest NVLink %s, at most %" PRIu64
               " messages from one rank)\n",
               names[a], p.seconds[a], nic, nvl, p.max_msgs[a]);
    }
    return 0;
}

static double peak_rss_mib(void)
{
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? (double)ru.ru_maxrss / 1024.0 : 0.0;
}

/* --manifest: every tensor of a model in one plan. */
/* --exclude: marks the ranks gone. 0, or the exit status. */
static int exclude_ranks(const struct args *a, reshard_topo_t *topo)
{
    int *gone = NULL, n;
    if (!a->exclude)
        return 0;
    if ((n = parse_domains(a->exclude, &gone)) < 0)
        return bad_input("--exclude: expected comma-separated ranks", a->exclude);
    reshard_status_t st = reshard_topo_exclude(topo, gone, n);
    free(gone);
    if (st != RESHARD_OK)
        return bad_input("--exclude", reshard_last_error());
    return 0;
}

/* The plan of every rank, or of --rank alone. */
static reshard_status_t make_plan(const struct args *a, const reshard_tensor_t *t, int n,
                                  const reshard_topo_t *topo, reshard_plan_t **plan)
{
    if (a->rank >= 0)
        return reshard_plan_create_rank(t, n, topo, NULL, a->rank, plan);
    return reshard_plan_create(t, n, topo, NULL, plan);
}

/* --rank: what the rank's own plan holds and what making it cost. */
static int report_rank(const struct args *a, reshard_plan_t *plan, int world, const char *what)
{
    reshard_rank_stats_t r;
    uint64_t nops;
    double ms;
    if (reshard_plan_rank_stats(plan, a->rank, &r, &nops, &ms) != RESHARD_OK) {
        fprintf(stderr, "error: %s\n", reshard_last_error());
        return 2;
    }
    double rss = peak_rss_mib();
    if (a->json) {
        printf("{\"src\": \"%s\", \"world_size\": %d, \"rank\": %d, \"domain\": %d, "
               "\"rail\": %d, \"plan_hash\": \"0x%016" PRIx64 "\", \"rank_ops\": %" PRIu64
               ", \"net_out\": %" PRIu64 ", \"net_in\": %" PRIu64 ", \"local_out\": %" PRIu64
               ", \"local_in\": %" PRIu64 ", \"self\": %" PRIu64 ", \"net_msgs\": %" PRIu64
               ", \"plan_ms\": %.3f, \"peak_rss_mib\": %.1f}\n",
               what, world, a->rank, r.domain, r.local_index, reshard_plan_hash(plan), nops,
               r.net_out, r.net_in, r.local_out, r.local_in, r.self, r.net_msgs, ms, rss);
        return 0;
    }
    printf("%s: rank %d of %d (domain %d, rail %d), plan hash 0x%016" PRIx64 "\n", what, a->rank,
           world, r.domain, r.local_index, reshard_plan_hash(plan));
    printf("net_out %" PRIu64 "\nnet_in %" PRIu64 "\nlocal_out %" PRIu64 "\nlocal_in %" PRIu64
           "\nself %" PRIu64 "\nnet_msgs %" PRIu64 "\n",
           r.net_out, r.net_in, r.local_out, r.local_in, r.self, r.net_msgs);
    printf("rank_ops %" PRIu64 "\nplan_ms %.3f\npeak_rss_mib %.1f\n", nops, ms, rss);
    return 0;
}

/* A plan that could not be made: exit 3 when only excluded ranks held what is needed. */
static int plan_failed(reshard_status_t st)
{
    fprintf(stderr, "error: %s\n", reshard_last_error());
    return st == RESHARD_ERR_DATA_LOST ? 3 : 2;
}

static int run_manifest(const struct args *a, const int *ids, int nids)
{
    reshard_manifest_t *m = NULL;
    reshard_topo_t *topo = NULL;
    reshard_plan_t *plan = NULL;
    reshard_rank_stats_t *ranks = NULL;
    int rc = 2;
    if (reshard_manifest_load(a->manifest, &m) != RESHARD_OK) {
        fprintf(stderr, "error: %s\n", reshard_last_error());
        return 2;
    }
    int world = reshard_manifest_world_size(m), n = reshard_manifest_ntensors(m);
    reshard_status_t st;
    if (nids && nids != world) {
        fprintf(stderr, "error: --domains lists %d ranks, the manifest's world has %d\n", nids,
                world);
        goto free_manifest_run;
    }
    st = nids || a->domain_size ? reshard_topo_create(world, a->domain_size, ids, &topo)
                                : reshard_manifest_topo(m, &topo);
    if (st != RESHARD_OK) {
        fprintf(stderr, "error: %s\n", reshard_last_error());
        goto free_manifest_run;
    }
    if ((rc = exclude_ranks(a, topo)) != 0)
        goto free_manifest_run;
    rc = 2;
    if ((st = make_plan(a, reshard_manifest_tensors(m), n, topo, &plan)) != RESHARD_OK) {
        rc = plan_failed(st);
        goto free_manifest_run;
    }
    if (a->rank >= 0) {
        rc = a->rank < world ? report_rank(a, plan, world, a->manifest) : 2;
        goto free_manifest_run;
    }
    int valid;
    char why[512];
    reshard_plan_stats_t s;
    if (evaluate(plan, world, &valid, why, sizeof(why), &s, &ranks))
        goto free_manifest_run;
    if (a->json) {
        print_json(&s, ranks, a->manifest, "", reshard_plan_hash(plan), valid, why);
    } else {
        printf("manifest: %s, %d tensors\n", a->manifest, n);
        printf("world: %d ranks in %d domains, plan hash 0x%016" PRIx64 "\n\n", world, s.ndomains,
               reshard_plan_hash(plan));
        if (a->exclude)
            printf("excluded (gone, as after a shrink): %s\n\n", a->exclude);
        print_table(&s, ranks, a->all_ranks);
        if (!valid)
            fprintf(stderr, "error: %s\n", why);
        printf("tensors %d\n", n);
        printf("peak_rss_mib %.1f\n", peak_rss_mib());
        print_tail(&s, valid);
    }
    rc = valid ? 0 : 1;
    if (a->cluster && print_prediction(plan, a->cluster))
        rc = 2;
free_manifest_run:
    free(ranks);
    reshard_plan_destroy(plan);
    reshard_topo_destroy(topo);
    reshard_manifest_destroy(m);
    return rc;
}

int main(int argc, char **argv)
{
    struct args a = {.rank = -1};
    int rc = parse_args(argc, argv, &a);
    if (rc)
        return rc;
    if (a.dump_config) {
        reshard_config_print(stdout);
        return 0;
    }
    int *ids = NULL, nids = 0;
    if (a.domains && (nids = parse_domains(a.domains, &ids)) < 0)
        return bad_input("--domains: expected comma-separated non-negative domain ids", a.domains);
    if (a.manifest) {
        rc = run_manifest(&a, ids, nids);
        free(ids);
        return rc;
    }
    int world = a.world_size ? a.world_size : nids;
    reshard_layout_t *src = NULL, *dst = NULL;
    reshard_topo_t *topo = NULL;
    reshard_plan_t *plan = NULL;
    rc = 2;
    if (reshard_layout_parse(a.src, world, &src) != RESHARD_OK) {
        fprintf(stderr, "error: %s (in --src)\n", reshard_last_error());
        goto free_spec_run;
    }
    if (reshard_layout_parse(a.dst, world, &dst) != RESHARD_OK) {
        fprintf(stderr, "error: %s (in --dst)\n", reshard_last_error());
        goto free_spec_run;
    }
    int top = max_rank(src) > max_rank(dst) ? max_rank(src) : max_rank(dst);
    if (!world)
        world = top + 1;
    if (top >= world) {
        fprintf(stderr, "error: rank %d is outside the world of %d ranks\n", top, world);
        goto free_spec_run;
    }
    if (nids && nids != world) {
        fprintf(stderr, "error: --domains lists %d ranks, the world has %d\n", nids, world);
        goto free_spec_run;
    }
    int dsize = a.domain_size ? a.domain_size : DEFAULT_DOMAIN_SIZE;
    if (reshard_topo_create(world, dsize, ids, &topo) != RESHARD_OK) {
        fprintf(stderr, "error: %s\n", reshard_last_error());
        goto free_spec_run;
    }
    if ((rc = exclude_ranks(&a, topo)) != 0)
        goto free_spec_run;
    rc = 2;
    reshard_tensor_t t = {"tensor", src, dst};
    reshard_status_t st = make_plan(&a, &t, 1, topo, &plan);
    if (st != RESHARD_OK) {
        rc = plan_failed(st);
        goto free_spec_run;
    }
    if (a.rank >= 0) {
        rc = report_rank(&a, plan, world, "tensor");
        goto free_spec_run;
    }
    int valid;
    char why[512];
    reshard_plan_stats_t s;
    reshard_rank_stats_t *ranks = NULL;
    if (evaluate(plan, world, &valid, why, sizeof(why), &s, &ranks)) {
        free(ranks);
        goto free_spec_run;
    }
    char *sbuf = format_layout(src), *dbuf = format_layout(dst);
    if (!sbuf || !dbuf) {
        fprintf(stderr, "error: out of memory\n");
        free(sbuf);
        free(dbuf);
        free(ranks);
        goto free_spec_run;
    }
    if (a.json) {
        print_json(&s, ranks, sbuf, dbuf, reshard_plan_hash(plan), valid, why);
    } else {
        printf("src: %s\ndst: %s\n", sbuf, dbuf);
        if (ids)
            printf("world: %d ranks in %d domains (--domains), plan hash 0x%016" PRIx64 "\n\n",
                   world, s.ndomains, reshard_plan_hash(plan));
        else
            printf("world: %d ranks in %d domains of %d%s, plan hash 0x%016" PRIx64 "\n\n", world,
                   s.ndomains, dsize, a.domain_size ? "" : " (default)", reshard_plan_hash(plan));
        if (a.exclude)
            printf("excluded (gone, as after a shrink): %s\n\n", a.exclude);
        print_table(&s, ranks, a.all_ranks);
        if (!valid)
            fprintf(stderr, "error: %s\n", why);
        print_tail(&s, valid);
    }
    free(sbuf);
    free(dbuf);
    free(ranks);
    rc = valid ? 0 : 1;
    if (a.cluster && print_prediction(plan, a.cluster))
        rc = 2;
free_spec_run:
    reshard_plan_destroy(plan);
    reshard_topo_destroy(topo);
    reshard_layout_destroy(src);
    reshard_layout_destroy(dst);
    free(ids);
    return rc;
}
