/* SPDX-License-Identifier: Apache-2.0 */
/*
 * reshard-plan's command line: every option and its value checked before anything is planned
 * (a whole model can take a minute to plan; a typo in --cluster must not wait for it).
 */
#ifndef RS_TOOLS_PLAN_ARGS_H
#define RS_TOOLS_PLAN_ARGS_H

#include "plugin/reshard.h"

#define PLAN_EXIT_INVALID 1 /* the plan failed validation */
#define PLAN_EXIT_USAGE   2 /* bad input */
#define PLAN_EXIT_LOST    3 /* only excluded ranks held a piece that is needed */

struct plan_args {
    const char *src, *dst, *manifest, *cluster_spec, *exclude_spec;
    int domain_size, world_size, json, all_ranks, dump_config, help;
    int rank;               /* --rank, or -1 */
    int *domains, ndomains; /* --domains: one id per rank */
    int *exclude, nexclude; /* --exclude */
    int *joiners, njoiners; /* --catch-up */
    const char *joiners_spec;
    reshard_cluster_t cluster; /* --cluster, when cluster_spec is set */
};

/* Parses argv into a; 0 to go on (a->help: print plan_usage and exit 0), else the exit status
 * after one line on stderr. plan_args_free releases the lists either way. */
int plan_args_parse(int argc, char **argv, struct plan_args *a);
void plan_args_free(struct plan_args *a);

/* One "error: ..." line on stderr; returns PLAN_EXIT_USAGE. detail may be NULL. */
int plan_bad_input(const char *what, const char *detail);

extern const char plan_usage[];

#endif
