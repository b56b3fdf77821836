/* SPDX-License-Identifier: Apache-2.0 */
#include "plan_print.h"

#include "plan_args.h"

#include <inttypes.h>
#include <stdio.h>
#include <sys/resource.h>

#define TABLE_ROWS 32

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

double plan_peak_rss_mib(void)
{
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? (double)ru.ru_maxrss / 1024.0 : 0.0;
}

void plan_print_table(const reshard_plan_stats_t *s, const reshard_rank_stats_t *r, int all)
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
    int most = 0;
    for (int k = 1; k < s->world_size; k++)
        most = r[k].delta_snapshot > r[most].delta_snapshot ? k : most;
    if (s->world_size && r[most].delta_snapshot) {
        char b[32];
        human(b, sizeof(b), r[most].delta_snapshot);
        printf("delta refits (RESHARD_DELTA=1): snapshots of at most %s per rank (rank %d; in "
               "device memory where its sources are device buffers)\n",
               b, most);
    }
    printf("\n");
}

void plan_print_tail(const reshard_plan_stats_t *s, int valid)
{
    printf("net_bytes %" PRIu64 "\n", s->net_bytes);
    printf("min_net_bytes %" PRIu64 "\n", s->min_net_bytes);
    printf("gather_bcast_bytes %" PRIu64 "\n", s->gather_bcast_bytes);
    printf("local_bytes %" PRIu64 "\n", s->local_bytes);
    printf("max_nic_bytes %" PRIu64 "\n", s->max_nic_bytes);
    printf("lb_nic_bytes %" PRIu64 "\n", s->lb_nic_bytes);
    printf("plan_ms %.3f\n", s->plan_ms);
    if (s->quant_bytes) /* FP8 destinations quantized on the way */
        printf("quant_bytes %" PRIu64 "\nquant_at_source_pct %.1f\n", s->quant_bytes,
               s->quant_at_source_pct);
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

void plan_print_json(const struct plan_report *rep)
{
    const reshard_plan_stats_t *s = rep->stats;
    const reshard_rank_stats_t *r = rep->ranks;
    printf("{\n  \"src\": ");
    json_string(rep->src);
    printf(",\n  \"dst\": ");
    json_string(rep->dst);
    printf(",\n  \"world_size\": %d,\n  \"ndomains\": %d,\n  \"plan_hash\": \"0x%016" PRIx64
           "\",\n",
           s->world_size, s->ndomains, rep->hash);
    printf("  \"ranks\": [");
    int first = 1;
    for (int k = 0; k < s->world_size; k++) {
        if (!has_traffic(&r[k]))
            continue;
        printf("%s\n    {\"rank\": %d, \"domain\": %d, \"rail\": %d, \"net_out\": %" PRIu64
               ", \"net_in\": %" PRIu64 ", \"local_out\": %" PRIu64 ", \"local_in\": %" PRIu64
               ", \"self\": %" PRIu64 ", \"net_msgs\": %" PRIu64 ", \"delta_snapshot\": %" PRIu64
               "}",
               first ? "" : ",", k, r[k].domain, r[k].local_index, r[k].net_out, r[k].net_in,
               r[k].local_out, r[k].local_in, r[k].self, r[k].net_msgs, r[k].delta_snapshot);
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
           rep->valid ? "true" : "false");
    if (s->quant_bytes)
        printf(",\n  \"quant_bytes\": %" PRIu64 ",\n  \"quant_at_source_pct\": %.1f",
               s->quant_bytes, s->quant_at_source_pct);
    if (!rep->valid) {
        printf(",\n  \"error\": ");
        json_string(rep->why);
    }
    printf("\n}\n");
}

int plan_print_rank(const reshard_plan_t *plan, int rank, int world, const char *what, int json)
{
    reshard_rank_stats_t r;
    uint64_t nops;
    double ms;
    if (reshard_plan_rank_stats(plan, rank, &r, &nops, &ms) != RESHARD_OK)
        return plan_bad_input(reshard_last_error(), NULL);
    double rss = plan_peak_rss_mib();
    uint64_t hash = reshard_plan_hash(plan);
    if (json) {
        printf("{\"src\": ");
        json_string(what);
        printf(", \"world_size\": %d, \"rank\": %d, \"domain\": %d, \"rail\": %d, "
               "\"plan_hash\": \"0x%016" PRIx64 "\", \"rank_ops\": %" PRIu64
               ", \"net_out\": %" PRIu64 ", \"net_in\": %" PRIu64 ", \"local_out\": %" PRIu64
               ", \"local_in\": %" PRIu64 ", \"self\": %" PRIu64 ", \"net_msgs\": %" PRIu64
               ", \"delta_snapshot\": %" PRIu64 ", \"plan_ms\": %.3f, \"peak_rss_mib\": %.1f}\n",
               world, rank, r.domain, r.local_index, hash, nops, r.net_out, r.net_in, r.local_out,
               r.local_in, r.self, r.net_msgs, r.delta_snapshot, ms, rss);
        return 0;
    }
    printf("%s: rank %d of %d (domain %d, rail %d), plan hash 0x%016" PRIx64 "\n", what, rank,
           world, r.domain, r.local_index, hash);
    printf("net_out %" PRIu64 "\nnet_in %" PRIu64 "\nlocal_out %" PRIu64 "\nlocal_in %" PRIu64
           "\nself %" PRIu64 "\nnet_msgs %" PRIu64 "\ndelta_snapshot %" PRIu64 "\n",
           r.net_out, r.net_in, r.local_out, r.local_in, r.self, r.net_msgs, r.delta_snapshot);
    printf("rank_ops %" PRIu64 "\nplan_ms %.3f\npeak_rss_mib %.1f\n", nops, ms, rss);
    return 0;
}

int plan_print_prediction(const reshard_plan_t *plan, const reshard_cluster_t *c, const char *spec)
{
    reshard_prediction_t p;
    if (reshard_plan_predict(plan, c, &p) != RESHARD_OK)
        return plan_bad_input(reshard_last_error(), NULL);
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
