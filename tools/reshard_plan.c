/* SPDX-License-Identifier: Apache-2.0 */
/*
 * reshard-plan: explains the plan of one reshard (docs/figures.md defines what it prints). Uses
 * only the public API. Exit status: 0 valid plan, 1 invalid plan, 2 bad input, 3 data lost.
 * Every failure is one "error: ..." line on stderr: the library is told not to log failures
 * at WARN as well (reshard_log_set_failures), since this tool prints each one.
 */
#include "plugin/reshard.h"

#include "plan_args.h"
#include "plan_print.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_DOMAIN_SIZE 8

/* What is being planned: the tensors, their world and topology, and how to name them. */
struct plan_input {
    const reshard_tensor_t *tensors;
    int ntensors, world;
    reshard_topo_t *topo;
    const char *manifest;     /* its name, or NULL for --src/--dst */
    const char *src, *dst;    /* canonical specs, for --src/--dst */
    int dsize, dsize_default; /* the domain size used, for --src/--dst */
};

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

/* --domains against the world: 0, or the exit status after saying which way it is off. */
static int check_domains(const struct plan_args *a, int world, const char *whose)
{
    if (!a->domains || a->ndomains == world)
        return 0;
    char msg[256];
    snprintf(msg, sizeof(msg),
             "--domains is too %s: it lists %d domain ids, %s has %d ranks (one id per rank)",
             a->ndomains < world ? "short" : "long", a->ndomains, whose, world);
    return plan_bad_input(msg, NULL);
}

static int check_rank(const struct plan_args *a, int world)
{
    if (a->rank < world)
        return 0;
    char msg[128];
    snprintf(msg, sizeof(msg), "--rank %d: the world has %d ranks (0-%d)", a->rank, world,
             world - 1);
    return plan_bad_input(msg, NULL);
}

/* --exclude: marks the ranks gone. 0, or the exit status. */
static int exclude_ranks(const struct plan_args *a, reshard_topo_t *topo)
{
    if (!a->exclude)
        return 0;
    if (reshard_topo_exclude(topo, a->exclude, a->nexclude) != RESHARD_OK)
        return plan_bad_input("--exclude", reshard_last_error());
    return 0;
}

static void print_header(const struct plan_args *a, const struct plan_input *in,
                         const reshard_plan_stats_t *s, uint64_t hash)
{
    if (in->manifest) {
        printf("manifest: %s, %d tensors\n", in->manifest, in->ntensors);
        printf("world: %d ranks in %d domains, plan hash 0x%016" PRIx64 "\n\n", in->world,
               s->ndomains, hash);
    } else {
        printf("src: %s\ndst: %s\n", in->src, in->dst);
        if (a->domains)
            printf("world: %d ranks in %d domains (--domains), plan hash 0x%016" PRIx64 "\n\n",
                   in->world, s->ndomains, hash);
        else
            printf("world: %d ranks in %d domains of %d%s, plan hash 0x%016" PRIx64 "\n\n",
                   in->world, s->ndomains, in->dsize, in->dsize_default ? " (default)" : "", hash);
    }
    if (a->exclude)
        printf("excluded (gone, as after a shrink): %s\n\n", a->exclude_spec);
    if (a->joiners)
        printf("catch-up of ranks %s (joined, holding nothing): only what they receive\n\n",
               a->joiners_spec);
}

/* Plans, validates and reports: the exit status. */
static int plan_and_report(const struct plan_args *a, const struct plan_input *in)
{
    reshard_plan_t *plan = NULL;
    reshard_rank_stats_t *ranks = NULL;
    reshard_status_t st =
        a->rank >= 0
            ? reshard_plan_create_rank(in->tensors, in->ntensors, in->topo, NULL, a->rank, &plan)
            : reshard_plan_create(in->tensors, in->ntensors, in->topo, NULL, &plan);
    if (st == RESHARD_OK && a->joiners) { /* the refit's catch-up instead */
        reshard_plan_t *refit = plan;
        st = reshard_plan_catch_up(refit, a->joiners, a->njoiners, NULL, &plan);
        reshard_plan_destroy(refit);
    }
    if (st != RESHARD_OK) {
        plan_bad_input(reshard_last_error(), NULL);
        return st == RESHARD_ERR_DATA_LOST ? PLAN_EXIT_LOST : PLAN_EXIT_USAGE;
    }
    int rc = PLAN_EXIT_USAGE;
    const char *name = in->manifest ? in->manifest : "tensor";
    if (a->rank >= 0) {
        rc = plan_print_rank(plan, a->rank, in->world, name, a->json);
        goto destroy_plan;
    }
    int valid = reshard_plan_validate(plan) == RESHARD_OK;
    char why[512];
    snprintf(why, sizeof(why), "%s", valid ? "" : reshard_last_error());
    reshard_plan_stats_t s;
    if (!(ranks = calloc((size_t)in->world, sizeof(*ranks)))) {
        plan_bad_input("out of memory", NULL);
        goto destroy_plan;
    }
    if (reshard_plan_stats(plan, &s, ranks) != RESHARD_OK) {
        plan_bad_input(reshard_last_error(), NULL);
        goto free_ranks;
    }
    uint64_t hash = reshard_plan_hash(plan);
    if (a->json) {
        struct plan_report rep = {
            .src = in->manifest ? in->manifest : in->src,
            .dst = in->manifest ? "" : in->dst,
            .stats = &s,
            .ranks = ranks,
            .hash = hash,
            .valid = valid,
            .why = why,
        };
        plan_print_json(&rep);
    } else {
        print_header(a, in, &s, hash);
        plan_print_table(&s, ranks, a->all_ranks);
        if (!valid)
            plan_bad_input(why, NULL);
        if (in->manifest) {
            printf("tensors %d\n", in->ntensors);
            printf("peak_rss_mib %.1f\n", plan_peak_rss_mib());
        }
        plan_print_tail(&s, valid);
    }
    rc = valid ? 0 : PLAN_EXIT_INVALID;
    if (a->cluster_spec && plan_print_prediction(plan, &a->cluster, a->cluster_spec))
        rc = PLAN_EXIT_USAGE;
free_ranks:
    free(ranks);
destroy_plan:
    reshard_plan_destroy(plan);
    return rc;
}

/* --manifest FILE (or - for standard input). */
static int run_manifest(const struct plan_args *a)
{
    reshard_manifest_t *m = NULL;
    struct plan_input in = {.manifest = a->manifest};
    if (reshard_manifest_load(a->manifest, &m) != RESHARD_OK)
        return plan_bad_input(reshard_last_error(), NULL);
    in.world = reshard_manifest_world_size(m);
    in.ntensors = reshard_manifest_ntensors(m);
    in.tensors = reshard_manifest_tensors(m);
    int rc = check_domains(a, in.world, "the manifest's world");
    if (!rc)
        rc = check_rank(a, in.world);
    if (rc)
        goto destroy_manifest;
    reshard_status_t st = a->domains || a->domain_size
                              ? reshard_topo_create(in.world, a->domain_size, a->domains, &in.topo)
                              : reshard_manifest_topo(m, &in.topo);
    if (st != RESHARD_OK) {
        rc = plan_bad_input(reshard_last_error(), NULL);
        goto destroy_manifest;
    }
    if ((rc = exclude_ranks(a, in.topo)) == 0)
        rc = plan_and_report(a, &in);
    reshard_topo_destroy(in.topo);
destroy_manifest:
    reshard_manifest_destroy(m);
    return rc;
}

/* The world of --src/--dst: --world-size, else one rank per --domains id, else past the
 * highest rank used. 0, or the exit status. */
static int spec_world(const struct plan_args *a, const reshard_layout_t *src,
                      const reshard_layout_t *dst, int *world)
{
    int top = max_rank(src) > max_rank(dst) ? max_rank(src) : max_rank(dst);
    int w = a->world_size ? a->world_size : a->ndomains ? a->ndomains : top + 1;
    char msg[256];
    if (top >= w && !a->world_size) {
        snprintf(msg, sizeof(msg),
                 "--domains is too short: it lists %d domain ids, the layouts use ranks 0-%d "
                 "(one id per rank)",
                 a->ndomains, top);
        return plan_bad_input(msg, NULL);
    }
    if (top >= w) {
        snprintf(msg, sizeof(msg), "rank %d is outside the world of %d ranks (--world-size)", top,
                 w);
        return plan_bad_input(msg, NULL);
    }
    *world = w;
    return 0;
}

/* --src SPEC --dst SPEC: one tensor. */
static int run_spec(const struct plan_args *a)
{
    reshard_layout_t *src = NULL, *dst = NULL;
    char *sbuf = NULL, *dbuf = NULL;
    struct plan_input in = {.ntensors = 1};
    int rc = PLAN_EXIT_USAGE, world = a->world_size ? a->world_size : a->ndomains;
    if (reshard_layout_parse(a->src, world, &src) != RESHARD_OK) {
        fprintf(stderr, "error: %s (in --src)\n", reshard_last_error());
        goto destroy_layouts;
    }
    if (reshard_layout_parse(a->dst, world, &dst) != RESHARD_OK) {
        fprintf(stderr, "error: %s (in --dst)\n", reshard_last_error());
        goto destroy_layouts;
    }
    if ((rc = spec_world(a, src, dst, &in.world)) != 0 ||
        (rc = check_domains(a, in.world, "the world")) != 0 || (rc = check_rank(a, in.world)) != 0)
        goto destroy_layouts;
    rc = PLAN_EXIT_USAGE;
    if (!(sbuf = format_layout(src)) || !(dbuf = format_layout(dst))) {
        plan_bad_input("out of memory", NULL);
        goto free_specs;
    }
    in.src = sbuf;
    in.dst = dbuf;
    in.dsize = a->domain_size ? a->domain_size : DEFAULT_DOMAIN_SIZE;
    in.dsize_default = !a->domain_size;
    if (reshard_topo_create(in.world, in.dsize, a->domains, &in.topo) != RESHARD_OK) {
        plan_bad_input(reshard_last_error(), NULL);
        goto free_specs;
    }
    reshard_tensor_t t = {"tensor", src, dst};
    in.tensors = &t;
    if ((rc = exclude_ranks(a, in.topo)) == 0)
        rc = plan_and_report(a, &in);
    reshard_topo_destroy(in.topo);
free_specs:
    free(sbuf);
    free(dbuf);
destroy_layouts:
    reshard_layout_destroy(src);
    reshard_layout_destroy(dst);
    return rc;
}

int main(int argc, char **argv)
{
    struct plan_args a;
    reshard_log_set_failures(0);
    int rc = plan_args_parse(argc, argv, &a);
    if (!rc && a.help)
        fputs(plan_usage, stdout);
    else if (!rc && a.dump_config)
        reshard_config_print(stdout);
    else if (!rc)
        rc = a.manifest ? run_manifest(&a) : run_spec(&a);
    plan_args_free(&a);
    return rc;
}
