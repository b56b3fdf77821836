/* SPDX-License-Identifier: Apache-2.0 */
/*
 * reshard_perf's command line (reshard_perf.h): the options nccl-tests has and reshard's own,
 * each checked with the flag it came from, and -h.
 */
#include "reshard_perf.h"

#include <errno.h>
#include <stddef.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- arguments ---- */

/* The synopsis and what each option does (-h). */
void usage(void)
{
    fputs("usage: reshard_perf [-np N] [-b MINBYTES] [-e MAXBYTES] [-f FACTOR] [-n ITERS]\n"
          "                    [-w WARMUP] [-c 0|1] [-d DTYPE]\n"
          "                    (--src SPEC --dst SPEC | --manifest FILE)\n"
          "                    [--algo reshard,direct,bcast] [--changed PCT[,SEED]]\n"
          "                    [--changed-runs] [--dump-config] [-h]\n"
          "  -np N                 fork N local ranks (default: torchrun/mpirun/srun env)\n"
          "  -b, --minbytes SIZE   smallest size, K/M/G suffixes allowed (default 32M)\n"
          "  -e, --maxbytes SIZE   largest size (default 32M)\n"
          "  -f, --stepfactor N    size multiplier between steps (default 2)\n"
          "  -n, --iters N         timed iterations (default 20)\n"
          "  -w, --warmup_iters N  untimed iterations first (default 5)\n"
          "  -c, --check 0|1       check every destination element (default 1)\n"
          "  -d, --datatype DTYPE  dtype of derived shapes (default bf16)\n"
          "  --src, --dst SPEC     layouts; without shape= the shape follows each size:\n"
          "                        [count/1024, 1024], or [1, count] below 1024 elements\n"
          "  --manifest FILE       a whole model (JSON): every tensor in one plan, one row per\n"
          "                        algorithm; its world_size must be the number of ranks\n"
          "  --algo LIST           comma-separated reshard, direct, bcast (default reshard)\n"
          "  --changed PCT[,SEED]  between iterations change PCT%% of each source shard's\n"
          "                        elements (uniformly; FP8 destinations change whole), so a\n"
          "                        delta refit (RESHARD_DELTA=1) sends what changed\n"
          "  --changed-runs        ... in runs of 4096 elements, as optimizer steps on a few\n"
          "                        layers do\n"
          "  --dump-config         print every RESHARD_* setting and exit\n"
          "  -h, --help            this text\n"
          "Exit status: 0 every check passed, 1 a run or a check failed, 2 bad arguments.\n",
          stdout);
}

static int parse_size(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    unsigned shift = 0;
    if (*end == 'K' || *end == 'k')
        shift = 10;
    else if (*end == 'M' || *end == 'm')
        shift = 20;
    else if (*end == 'G' || *end == 'g')
        shift = 30;
    if (end == s || *s == '-' || errno || (shift && end[1]) || (!shift && *end) ||
        v > (SIZE_MAX >> shift))
        return 1;
    *out = (size_t)v << shift;
    return 0;
}

static int parse_long(const char *s, long min, long max, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < min || v > max)
        return 1;
    *out = v;
    return 0;
}

static int parse_algos(const char *s, struct opts *o)
{
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", s);
    o->nalgos = 0;
    o->algo_list[0] = '\0';
    for (char *save, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int a = 0;
        while (a < 3 && strcmp(tok, algo_names[a]))
            a++;
        if (a == 3 || o->nalgos == MAX_ALGOS)
            return 1;
        o->algos[o->nalgos++] = (reshard_algo_t)a;
        size_t len = strlen(o->algo_list);
        snprintf(o->algo_list + len, sizeof(o->algo_list) - len, "%s%s", len ? "," : "", tok);
    }
    return o->nalgos == 0;
}

static int parse_count(const char *arg, long min, int *out)
{
    long v;
    if (parse_long(arg, min, 1 << 24, &v))
        return 1;
    *out = (int)v;
    return 0;
}

/* Applies one option; 1 when its value is bad. */
static int parse_opt(int ch, const char *arg, struct opts *o)
{
    switch (ch) {
    case 'P':
        return parse_count(arg, 1, &o->np);
    case 'b':
        return parse_size(arg, &o->min_bytes);
    case 'e':
        return parse_size(arg, &o->max_bytes);
    case 'f':
        return parse_long(arg, 1, 1 << 20, &o->factor);
    case 'n':
        return parse_count(arg, 1, &o->iters);
    case 'w':
        return parse_count(arg, 0, &o->warmup);
    case 'c':
        return parse_count(arg, 0, &o->check) || o->check > 1;
    case 'd':
        o->dtype = arg;
        return 0;
    case 'S':
        o->src = arg;
        return 0;
    case 'M':
        o->manifest = arg;
        return 0;
    case 'D':
        o->dst = arg;
        return 0;
    case 'X': {
        char *end;
        errno = 0;
        double pct = strtod(arg, &end);
        o->change.seed = 1;
        if (*end == ',')
            o->change.seed = strtoull(end + 1, &end, 0);
        o->change.pct = pct;
        return end == arg || *end || errno || pct < 0 || pct > 100;
    }
    case 'R':
        o->change.runs = 1;
        return 0;
    default: /* 'a' */
        return parse_algos(arg, o);
    }
}

/* clang-format off */
static const struct option long_opts[] = {
    {"np",           required_argument, NULL, 'P'},
    {"minbytes",     required_argument, NULL, 'b'},
    {"maxbytes",     required_argument, NULL, 'e'},
    {"stepfactor",   required_argument, NULL, 'f'},
    {"iters",        required_argument, NULL, 'n'},
    {"warmup_iters", required_argument, NULL, 'w'},
    {"check",        required_argument, NULL, 'c'},
    {"datatype",     required_argument, NULL, 'd'},
    {"src",          required_argument, NULL, 'S'},
    {"dst",          required_argument, NULL, 'D'},
    {"algo",         required_argument, NULL, 'a'},
    {"manifest",     required_argument, NULL, 'M'},
    {"changed",      required_argument, NULL, 'X'},
    {"changed-runs", no_argument,       NULL, 'R'},
    {"dump-config",  no_argument,       NULL, 'C'},
    {"help",         no_argument,       NULL, 'h'},
    {NULL, 0, NULL, 0},
};
/* clang-format on */

static const char *opt_name(int ch)
{
    const struct option *p = long_opts;
    while (p->name && p->val != ch)
        p++;
    return p->name ? p->name : "?";
}

/* Rejects combinations no single option can: missing specs, an empty or endless sweep. */
static const char *check_opts(const struct opts *o)
{
    if (o->manifest && (o->src || o->dst))
        return "--manifest excludes --src and --dst";
    if (!o->manifest && (!o->src || !o->dst))
        return "--src and --dst (or --manifest) are required";
    if (o->max_bytes < o->min_bytes)
        return "-e must not be below -b";
    if (o->factor < 2 && o->max_bytes > o->min_bytes)
        return "-f must be at least 2 when -e exceeds -b";
    return NULL;
}

/* 0 to go on, else the exit status (help: 0 after printing, so check o->help first). */
int parse_args(int argc, char **argv, struct opts *o)
{
    static char np_long[] = "--np";
    int ch;
    *o = (struct opts){.min_bytes = 32u << 20,
                       .max_bytes = 32u << 20,
                       .factor = 2,
                       .iters = 20,
                       .warmup = 5,
                       .check = 1,
                       .dtype = "bf16",
                       .change = {.pct = -1}};
    parse_algos("reshard", o);
    for (int i = 1; i < argc; i++) /* nccl-tests and mpirun spell it with one dash */
        if (!strcmp(argv[i], "-np"))
            argv[i] = np_long;
    opterr = 0; /* one line of our own per mistake, not getopt's and a synopsis */
    while ((ch = getopt_long(argc, argv, ":b:e:f:n:w:c:d:h", long_opts, NULL)) != -1) {
        if (ch == 'h') {
            o->help = 1;
            return 0;
        }
        if (ch == 'C') {
            o->dump_config = 1;
        } else if (ch == ':') {
            fprintf(stderr, "reshard_perf: --%s needs a value\n", opt_name(optopt));
            return EXIT_USAGE;
        } else if (ch == '?') {
            char shortopt[3] = {'-', (char)optopt, '\0'};
            fprintf(stderr, "reshard_perf: unknown option '%s' (--help lists them)\n",
                    optopt ? shortopt : argv[optind - 1]);
            return EXIT_USAGE;
        } else if (parse_opt(ch, optarg, o)) {
            fprintf(stderr, "reshard_perf: bad value '%s' for --%s\n", optarg, opt_name(ch));
            return EXIT_USAGE;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "reshard_perf: unexpected argument '%s'\n", argv[optind]);
        return EXIT_USAGE;
    }
    if (o->change.runs && o->change.pct < 0) {
        fprintf(stderr, "reshard_perf: --changed-runs goes with --changed PCT\n");
        return EXIT_USAGE;
    }
    /* A delta refit applies changes to what the last one left: the destinations are not
     * poisoned between iterations then (only before the first). */
    const char *delta = getenv("RESHARD_DELTA");
    o->delta = delta && *delta && strcmp(delta, "0");
    o->keep_dst = o->change.pct >= 0 || o->delta;
    const char *why = o->help || o->dump_config ? NULL : check_opts(o);
    if (why)
        fprintf(stderr, "reshard_perf: %s\n", why);
    return why ? EXIT_USAGE : 0;
}
