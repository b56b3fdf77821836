/* SPDX-License-Identifier: Apache-2.0 */
/* reshard-plan's reports (docs/figures.md defines every line): the per-rank table, the closing
 * lines, JSON, one rank's report and the --cluster prediction. */
#ifndef RS_TOOLS_PLAN_PRINT_H
#define RS_TOOLS_PLAN_PRINT_H

#include "plugin/reshard.h"

/* The whole plan's figures: what plan_print_text and plan_print_json report. */
struct plan_report {
    const char *src, *dst; /* canonical specs, or the manifest's name and "" */
    const reshard_plan_stats_t *stats;
    const reshard_rank_stats_t *ranks; /* [stats->world_size] */
    uint64_t hash;
    int valid;
    const char *why; /* when not valid */
};

void plan_print_table(const reshard_plan_stats_t *s, const reshard_rank_stats_t *r, int all);
void plan_print_tail(const reshard_plan_stats_t *s, int valid);
void plan_print_json(const struct plan_report *rep);
/* --rank: one rank's figures (what: the tensor's or manifest's name); 0 or the exit status. */
int plan_print_rank(const reshard_plan_t *plan, int rank, int world, const char *what, int json);
/* --cluster: 0 or the exit status. */
int plan_print_prediction(const reshard_plan_t *plan, const reshard_cluster_t *c, const char *spec);
double plan_peak_rss_mib(void);

#endif
