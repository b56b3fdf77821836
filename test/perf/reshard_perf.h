/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What reshard_perf's files share (reshard_perf.c: the measurement, the table and main;
 * perf_sweep.c: the sweep of tensors, the model and the shard maps; perf_args.c: the command
 * line): the options, the sweep, one rank's context, and the helpers every part reports with.
 */
#ifndef RESHARD_PERF_H
#define RESHARD_PERF_H

#include "plugin/reshard.h"

#include "perf_pattern.h"
#include "perf_quant.h"

#include <stddef.h>
#include <stdint.h>

#define EXIT_USAGE 2
#define MAX_ALGOS  8
#define MAX_SIZES  64
#define MAX_NOTES  4 /* differing ranks listed under the byte-count line */

extern const char *const algo_names[]; /* by reshard_algo_t */

struct opts {
    int np; /* 0: rank and size from the launcher's environment */
    size_t min_bytes, max_bytes;
    long factor;
    int iters, warmup, check, dump_config, help;
    struct perf_change change; /* --changed, --changed-runs */
    int keep_dst;              /* destinations keep what the last refit left (delta refits) */
    int delta;                 /* RESHARD_DELTA asks for delta refits */
    const char *dtype, *src, *dst, *manifest;
    reshard_algo_t algos[MAX_ALGOS];
    int nalgos;
    char algo_list[64];
};

/* The tensors of the sweep: full specs, and what validation learned of them. */
struct sweep {
    int n, fixed; /* fixed: a spec named its shape, so one tensor and no sweep */
    char *src[MAX_SIZES], *dst[MAX_SIZES];
    size_t bytes[MAX_SIZES];
    int64_t count[MAX_SIZES];
    char type[MAX_SIZES][16];
};

struct tensor_run {
    reshard_layout_t *src, *dst;
    struct shard_map smap, dmap;
    void *sbuf, *dbuf;
    void *dprev; /* --changed: the destination before the refit, to check what did not change */
    struct perf_quant q; /* an FP8 destination (perf_quant.h) */
};

/* --manifest: every tensor of a model in one plan, one row per algorithm. */
struct model {
    reshard_manifest_t *man;
    int n;
    size_t bytes;
    int64_t count;
    char type[16]; /* the dtype when all tensors share it, else "mixed" */
};

struct ctx {
    const struct opts *o;
    struct sweep *sw;
    reshard_comm_t *comm;
    int rank, size;
    reshard_comm_counters_t *before, *after; /* [size] */
    reshard_rank_stats_t *ranks;             /* [size] */
    double *gather, *times;                  /* [size], [iters] */
    uint64_t *wrong_all;                     /* [size] */
    uint64_t wrong;                          /* totals over the run */
    int differ, nrows, nnotes;
    double busbw_sum;
    char notes[MAX_NOTES][256]; /* the first ranks whose byte counts differ */
    const struct model *model;  /* --manifest, else NULL */
    double max_msgs;            /* most data messages a rank sent per iteration */
    int max_msgs_rank;
    double local_mb; /* bytes written into peers of the same domain, all ranks, per iteration */
    /* This rank's control plane per execute (bootstrap and control messages, both ways): the
     * most in a plan's first refit and in the others; and how long making things took. */
    struct ctrl_figures {
        double first, steady, comm_ms, plan_ms;
    } ctrl;
    double most[5]; /* over the ranks (gather_control) */
    int most_rank[5];
};

/* ---- perf_sweep.c: small helpers ---- */

double now_s(void);
/* Reports a failed library call on stderr; returns 1. rank < 0: not known yet. */
int lib_fail(int rank, const char *call, reshard_status_t st);
/* 1 when st is success; otherwise reports the failed call and returns 0. */
int ok(const struct ctx *c, reshard_status_t st, const char *call);
void *xcalloc(size_t n, size_t size, int rank);
/* The value of item `key` of a spec ("shape" in "shape=4x8 dtype=f32"): 1 when present. */
int spec_item(const char *spec, const char *key, char *val, size_t n);
/* The canonical spec of a layout (malloc'd), or NULL. */
char *layout_string(const reshard_layout_t *l);

/* ---- perf_sweep.c: shard maps, the sweep, the model ---- */

/* Where each element of this rank's shard of l sits in the global tensor; 0 on success. */
int map_build(struct shard_map *m, const reshard_layout_t *l, int rank, const char *side);
/* The sweep's tensors from the options (one with a fixed shape, else one per size); 0 or the
 * exit status. */
int sweep_build(struct sweep *sw, const struct opts *o);
void sweep_free(struct sweep *sw);
/* Parses every tensor of the sweep for `world` ranks and records its size. */
int sweep_validate(struct sweep *sw, int world, int loud);
/* --manifest: loads the model and checks what the tool refuses (views, a world that is not
 * the run's), naming the tensor. */
int model_load(struct model *m, const char *path, int world, int loud);

/* ---- perf_args.c ---- */

/* The synopsis and what each option does (-h). */
void usage(void);
/* 0 to go on, else the exit status (help: 0 after printing, so check o->help first). */
int parse_args(int argc, char **argv, struct opts *o);

#endif
