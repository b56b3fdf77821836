/* SPDX-License-Identifier: Apache-2.0 */
#include "plan_args.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char plan_usage[] =
    "usage: reshard-plan --src SPEC --dst SPEC [--domain-size N | --domains LIST]\n"
    "                    [--world-size N] [--json] [--all-ranks]\n"
    "       reshard-plan --manifest FILE|- [--domain-size N | --domains LIST] [--json]\n"
    "                    [--all-ranks]\n"
    "       (either form) [--cluster nic=50GB/s,nvlink=450GB/s,latency=5us]\n"
    "                     [--exclude RANKS] [--catch-up RANKS] [--rank R]\n"
    "       reshard-plan --dump-config | -h | --help\n"
    "\n"
    "  --src, --dst SPEC   layouts, e.g. 'shape=7168x2048 dtype=bf16 ranks=0-7 mesh=2x4 "
    "place=R,S(0)'\n"
    "  --domain-size N     NVLink domains of N consecutive ranks (default 8)\n"
    "  --domains LIST      the domain id of every rank, comma separated (one per rank)\n"
    "  --world-size N      ranks in the communicator (default: the length of --domains, else\n"
    "                      past the highest rank used)\n"
    "  --manifest FILE     a whole model (JSON, docs/manifest.md): every tensor in one plan;\n"
    "                      its domains unless --domain-size or --domains says otherwise;\n"
    "                      - reads it from standard input\n"
    "  --json              the same report as JSON\n"
    "  --cluster SPEC      also predict the refit's time for reshard, direct and bcast on a\n"
    "                      cluster: each rank's NIC and NVLink bandwidth (per direction; B/s\n"
    "                      or b/s with K, M, G, T) and the latency of a message (ns, us, ms,\n"
    "                      s). A flow model from the plans' per-rank bytes and messages, not a\n"
    "                      measurement\n"
    "  --all-ranks         list every rank with traffic (the table stops at 32 otherwise)\n"
    "  --exclude RANKS     plan as after reshard_comm_shrink: these ranks (comma separated)\n"
    "                      are gone, their pieces come from replicas\n"
    "  --catch-up RANKS    report the catch-up of these destination ranks (comma separated),\n"
    "                      which joined holding nothing (reshard_plan_catch_up): their\n"
    "                      shards from the replicas that hold them, else from the sources\n"
    "  --rank R            plan rank R alone, as its communicator rank would (only what it\n"
    "                      sends, receives or forwards); the report ends with rank_ops,\n"
    "                      plan_ms and peak_rss_mib\n"
    "  --dump-config       print every RESHARD_* setting, its value and where it came from\n"
    "\n"
    "The report ends with net_bytes, min_net_bytes, gather_bcast_bytes, local_bytes,\n"
    "max_nic_bytes, lb_nic_bytes, quant_at_source_pct (FP8 destinations only), plan_ms\n"
    "and valid. Exit status: 0 valid, 1 invalid,\n"
    "2 bad input, 3 data lost (only excluded ranks held a piece that is needed).\n"
    "\n"
    "Documentation, in the source tree's docs/: layouts.md (the SPEC grammar),\n"
    "manifest.md (the FILE schema), figures.md (every figure printed here).\n";

#define MAX_COUNT (1 << 20)

int plan_bad_input(const char *what, const char *detail)
{
    fprintf(stderr, "error: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    return PLAN_EXIT_USAGE;
}

/* A decimal integer in [lo, MAX_COUNT]. */
static int parse_int(const char *s, int lo, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > MAX_COUNT)
        return -1;
    *out = (int)v;
    return 0;
}

/* "0,0,1,1": non-negative integers, comma separated; the count, -1 when malformed, -2 when out
 * of memory (said). */
static int parse_list(const char *s, int **ids)
{
    int n = 1;
    for (const char *p = s; *p; p++)
        n += *p == ',';
    int *v = calloc((size_t)n, sizeof(int));
    if (!v) {
        plan_bad_input("out of memory", NULL);
        return -2;
    }
    const char *p = s;
    for (int i = 0; i < n; i++) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < 0 || x > MAX_COUNT || (*end != ',' && *end != '\0')) {
            free(v);
            return -1;
        }
        v[i] = (int)x;
        p = end + 1;
    }
    *ids = v;
    return n;
}

/* "50GB/s", "400Gb/s": bytes per second. */
static int parse_rate(const char *s, double *out)
{
    char *end;
    double v = strtod(s, &end), scale = 1;
    if (end == s)
        return -1;
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
        v *= scale;
    else if (!strcmp(end, "b/s"))
        v *= scale / 8;
    else
        return -1;
    if (!isfinite(v) || !(v > 0))
        return -1;
    *out = v;
    return 0;
}

/* "5us": seconds. */
static int parse_latency(const char *s, double *out)
{
    static const struct {
        const char *unit;
        double scale;
    } units[] = {{"ns", 1e-9}, {"us", 1e-6}, {"ms", 1e-3}, {"s", 1}};
    char *end;
    double v = strtod(s, &end);
    if (end == s || !isfinite(v) || v < 0)
        return -1;
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++)
        if (!strcmp(end, units[i].unit)) {
            *out = v * units[i].scale;
            return 0;
        }
    return -1;
}

/* nic=..,nvlink=..,latency=..: every key once. */
static int parse_cluster(const char *spec, reshard_cluster_t *c)
{
    static const char expect[] = "expected nic=RATE,nvlink=RATE,latency=TIME (RATE like 50GB/s "
                                 "or 400Gb/s, TIME like 5us)";
    static const char *const keys[] = {"nic", "nvlink", "latency"};
    char msg[512], *buf = strdup(spec), *save;
    int seen = 0, rc = 0;
    if (!buf)
        return plan_bad_input("out of memory", NULL);
    for (char *item = strtok_r(buf, ",", &save); item && !rc; item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '=');
        int k = 0;
        if (eq)
            *eq = '\0';
        while (k < 3 && strcmp(item, keys[k]))
            k++;
        if (eq)
            *eq = '=';
        if (!eq || k == 3) {
            snprintf(msg, sizeof(msg), "'%s': %s", item, expect);
            rc = plan_bad_input("--cluster", msg);
        } else if (seen & 1 << k) {
            snprintf(msg, sizeof(msg), "%s is given twice", keys[k]);
            rc = plan_bad_input("--cluster", msg);
        } else if (k < 2 ? parse_rate(eq + 1, k ? &c->nvlink_bytes_per_s : &c->nic_bytes_per_s)
                         : parse_latency(eq + 1, &c->latency_s)) {
            snprintf(msg, sizeof(msg), "'%s': %s", item,
                     k < 2 ? "expected a positive rate like 50GB/s or 400Gb/s"
                           : "expected a time like 5us (ns, us, ms or s)");
            rc = plan_bad_input("--cluster", msg);
        }
        seen |= 1 << k;
    }
    free(buf);
    if (!rc && seen != 7) {
        snprintf(msg, sizeof(msg), "'%s': nic, nvlink and latency are all needed", spec);
        rc = plan_bad_input("--cluster", msg);
    }
    return rc;
}

static const struct option plan_opts[] = {
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
    {"catch-up", required_argument, NULL, 'u'},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

static const char *opt_name(int val)
{
    for (const struct option *o = plan_opts; o->name; o++)
        if (o->val == val)
            return o->name;
    return "?";
}

/* One option's value into a; 0, or the exit status after saying what is wrong. */
static int take(int c, const char *v, struct plan_args *a)
{
    switch (c) {
    case 's':
        a->src = v;
        return 0;
    case 'd':
        a->dst = v;
        return 0;
    case 'm':
        a->manifest = v;
        return 0;
    case 'n':
        return parse_int(v, 1, &a->domain_size)
                   ? plan_bad_input("--domain-size: expected a positive integer", v)
                   : 0;
    case 'w':
        return parse_int(v, 1, &a->world_size)
                   ? plan_bad_input("--world-size: expected a positive integer", v)
                   : 0;
    case 'r':
        return parse_int(v, 0, &a->rank) ? plan_bad_input("--rank: expected a rank number", v) : 0;
    case 'D':
        free(a->domains);
        a->domains = NULL;
        a->ndomains = parse_list(v, &a->domains);
        return a->ndomains == -2 ? PLAN_EXIT_USAGE
               : a->ndomains < 0
                   ? plan_bad_input("--domains: expected comma-separated non-negative domain ids",
                                    v)
                   : 0;
    case 'x':
        free(a->exclude);
        a->exclude = NULL;
        a->exclude_spec = v;
        a->nexclude = parse_list(v, &a->exclude);
        return a->nexclude == -2 ? PLAN_EXIT_USAGE
               : a->nexclude < 0 ? plan_bad_input("--exclude: expected comma-separated ranks", v)
                                 : 0;
    case 'u':
        free(a->joiners);
        a->joiners = NULL;
        a->joiners_spec = v;
        a->njoiners = parse_list(v, &a->joiners);
        return a->njoiners == -2 ? PLAN_EXIT_USAGE
               : a->njoiners < 0 ? plan_bad_input("--catch-up: expected comma-separated ranks", v)
                                 : 0;
    case 'k':
        a->cluster_spec = v;
        return parse_cluster(v, &a->cluster);
    default:
        return 0;
    }
}

/* Combinations no single option can refuse. */
static int check_combination(const struct plan_args *a)
{
    if (a->rank >= 0 && (a->cluster_spec || a->all_ranks))
        return plan_bad_input(
            "--rank plans one rank: --cluster and --all-ranks need every rank's plan", NULL);
    if (a->cluster_spec && a->json)
        return plan_bad_input("--cluster reports in text only: drop --json", NULL);
    if (a->manifest && (a->src || a->dst || a->world_size))
        return plan_bad_input("--manifest excludes --src, --dst and --world-size", NULL);
    if (a->domains && a->domain_size)
        return plan_bad_input("--domains and --domain-size exclude each other", NULL);
    if (!a->manifest && (!a->src || !a->dst))
        return plan_bad_input("--src and --dst (or --manifest) are required; --help says more",
                              NULL);
    return 0;
}

int plan_args_parse(int argc, char **argv, struct plan_args *a)
{
    *a = (struct plan_args){.rank = -1};
    int c, rc;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":h", plan_opts, NULL)) != -1) {
        if (c == 'h') {
            a->help = 1;
            return 0;
        }
        if (c == 'j' || c == 'a' || c == 'c') {
            *(c == 'j' ? &a->json : c == 'a' ? &a->all_ranks : &a->dump_config) = 1;
            continue;
        }
        if (c == ':') {
            char what[64];
            snprintf(what, sizeof(what), "--%s needs a value", opt_name(optopt));
            return plan_bad_input(what, NULL);
        }
        if (c == '?') {
            char what[128], shortopt[3] = {'-', (char)optopt, '\0'};
            snprintf(what, sizeof(what), "unknown option '%.80s' (--help lists them)",
                     optopt ? shortopt : argv[optind - 1]);
            return plan_bad_input(what, NULL);
        }
        if ((rc = take(c, optarg, a)) != 0)
            return rc;
    }
    if (optind < argc)
        return plan_bad_input("unexpected argument", argv[optind]);
    return a->dump_config ? 0 : check_combination(a);
}

void plan_args_free(struct plan_args *a)
{
    free(a->domains);
    free(a->exclude);
    free(a->joiners);
    a->domains = a->exclude = a->joiners = NULL;
}
