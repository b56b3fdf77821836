/* SPDX-License-Identifier: Apache-2.0 */
#include "param.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

extern char **environ;

#define PARAM_WHY_MAX 160

struct param {
    const char *name, *env, *def, *meaning;
    enum rs_param_type type;
    int64_t min;
    const char *value; /* environment, the canonical spelling of a choice, or default */
    int64_t ival;
    int from_env;
    char rejected[PARAM_WHY_MAX]; /* why the environment's value was refused, "" when it was not */
};

static struct param params[RS_PARAM_COUNT] = {
#define RS_PARAM_ROW_(id, t, d, lo, m)                                                             \
    [RS_PARAM_##                                                                                   \
        id] = {.name = #id, .env = "RESHARD_" #id, .def = d, .meaning = m, .type = t, .min = lo},
    RS_PARAM_MAP(RS_PARAM_ROW_)
#undef RS_PARAM_ROW_
};

/* What a row of the table cannot say in one line: the largest integer a setting takes (past it
 * the value would overflow where it is used, or mean nothing), and the words a string setting
 * takes (matched ignoring case; the table's spelling is the value in force). TRANSPORT and
 * EXECUTOR are not here: a transport or executor that does not exist is an error where it is
 * used, naming the value, rather than a quiet fall back to the default. */
static const struct {
    enum rs_param id;
    int64_t max;
} param_max[] = {
    {RS_PARAM_TIMEOUT, INT32_MAX / 1000}, /* milliseconds in an int */
    {RS_PARAM_BOOT_PORT, 65535},
    {RS_PARAM_DOMAIN_SIZE, INT32_MAX},
    {RS_PARAM_DOMAIN, INT32_MAX},
    {RS_PARAM_IB_QPS_PER_PEER, 8},
    {RS_PARAM_NET_PEER_ERRORS, 1},
    {RS_PARAM_NET_ALLOW_LO, 1},
    {RS_PARAM_CUDA_IPC, 1},
    {RS_PARAM_GPUDIRECT, 1},
    {RS_PARAM_TEST_DEVICE_AS_HOST, 1},
};

static const struct {
    enum rs_param id;
    const char *words[5]; /* NULL-terminated */
} param_words[] = {
    {RS_PARAM_DEBUG, {"NONE", "WARN", "INFO", "TRACE", NULL}},
};

/* RESHARD_ names that the project's tests, scripts and Python binding read, not the library:
 * not settings, and not misspellings of one. */
static const char *const param_known_elsewhere[] = {
    "LIB",             /* python/reshard: where the library is */
    "BUILD",           /* tests: the build folder under test */
    "MAKE_KNOBS",      /* tests: make's knobs of that build */
    "SKIP_RDMA",       /* make test: skip the soft-RoCE VM */
    "TEST_SEED",       /* tests: replay one seed of a property test */
    "TEST_REPEAT",     /* tests: how often a test that looks for a race runs its case */
    "TEST_STREAM_MIB", /* tests: MiB the plugin's life cycle streams */
    "NODE",            /* scripts/cluster.sh: the emulated node of a rank */
};

static pthread_once_t once = PTHREAD_ONCE_INIT;

static int parse_int(const char *s, int64_t *v)
{
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 0);
    if (errno || end == s || *end)
        return -1;
    *v = x;
    return 0;
}

static int64_t param_max_of(enum rs_param id)
{
    for (size_t i = 0; i < sizeof(param_max) / sizeof(param_max[0]); i++)
        if (param_max[i].id == id)
            return param_max[i].max;
    return INT64_MAX;
}

/* The words a string setting takes, or NULL when it takes any string. */
static const char *const *param_words_of(enum rs_param id)
{
    for (size_t i = 0; i < sizeof(param_words) / sizeof(param_words[0]); i++)
        if (param_words[i].id == id)
            return param_words[i].words;
    return NULL;
}

/* Checks env against p's rules: 0 with the value in force (*value, *ival), or -1 with why. */
static int param_check(struct param *p, enum rs_param id, const char *env, const char **value,
                       int64_t *ival)
{
    char *why = p->rejected;
    if (p->type == RS_PARAM_INT) {
        int64_t v, max = param_max_of(id);
        if (parse_int(env, &v) != 0) {
            snprintf(why, PARAM_WHY_MAX, "is not an integer");
            return -1;
        }
        if (v < p->min || v > max) {
            snprintf(why, PARAM_WHY_MAX, "is %s %lld", v < p->min ? "below" : "above",
                     (long long)(v < p->min ? p->min : max));
            return -1;
        }
        *value = env;
        *ival = v;
        return 0;
    }
    const char *const *words = param_words_of(id);
    if (!words) {
        *value = env;
        return 0;
    }
    for (int i = 0; words[i]; i++)
        if (!strcasecmp(env, words[i])) {
            *value = words[i];
            return 0;
        }
    size_t n = (size_t)snprintf(why, PARAM_WHY_MAX, "is not");
    for (int i = 0; words[i] && n < PARAM_WHY_MAX; i++)
        n += (size_t)snprintf(why + n, PARAM_WHY_MAX - n, "%s %s",
                              i ? (words[i + 1] ? "," : " or") : "", words[i]);
    return -1;
}

static void load(void)
{
    for (int i = 0; i < RS_PARAM_COUNT; i++) {
        struct param *p = &params[i];
        const char *env = getenv(p->env);
        p->value = p->def;
        p->from_env = 0;
        p->rejected[0] = '\0';
        if (p->type == RS_PARAM_INT)
            parse_int(p->def, &p->ival);
        if (env && param_check(p, (enum rs_param)i, env, &p->value, &p->ival) == 0)
            p->from_env = 1;
    }
}

/* Edit distance between a and b ignoring case, capped at cap + 1 (names are short). */
static int param_distance(const char *a, const char *b, int cap)
{
    size_t la = strlen(a), lb = strlen(b);
    int row[64];
    if (la >= 64 || lb >= 64)
        return cap + 1;
    for (size_t j = 0; j <= lb; j++)
        row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diag = row[0], best;
        row[0] = best = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int up = row[j];
            int same = toupper((unsigned char)a[i - 1]) == toupper((unsigned char)b[j - 1]);
            int v = diag + !same;
            if (up + 1 < v)
                v = up + 1;
            if (row[j - 1] + 1 < v)
                v = row[j - 1] + 1;
            row[j] = v;
            diag = up;
            if (v < best)
                best = v;
        }
        if (best > cap)
            return cap + 1;
    }
    return row[lb];
}

/* An environment entry RESHARD_X=... that names no setting: why says so, with the setting it
 * is closest to when one is near. 0 when the name is a setting or read elsewhere. */
static int param_unknown(const char *entry, char *name, size_t n, char *why)
{
    const char *eq = strchr(entry, '=');
    size_t len = eq ? (size_t)(eq - entry) : strlen(entry);
    if (strncmp(entry, "RESHARD_", 8) || len >= n)
        return 0;
    memcpy(name, entry, len);
    name[len] = '\0';
    const char *suffix = name + 8;
    for (int i = 0; i < RS_PARAM_COUNT; i++)
        if (!strcmp(suffix, params[i].name))
            return 0;
    for (size_t i = 0; i < sizeof(param_known_elsewhere) / sizeof(param_known_elsewhere[0]); i++)
        if (!strcmp(suffix, param_known_elsewhere[i]))
            return 0;
    int best = -1, best_d = 3; /* suggest within two edits */
    for (int i = 0; i < RS_PARAM_COUNT; i++) {
        int d = param_distance(suffix, params[i].name, best_d - 1);
        if (d < best_d)
            best = i, best_d = d;
    }
    if (best >= 0)
        snprintf(why, PARAM_WHY_MAX, "is not a reshard setting (did you mean %s?); ignored",
                 params[best].env);
    else
        snprintf(why, PARAM_WHY_MAX,
                 "is not a reshard setting (--dump-config lists them); ignored");
    return 1;
}

void rs_param_overrides(void (*fn)(const char *env, const char *value, const char *why))
{
    pthread_once(&once, load);
    char why[PARAM_WHY_MAX + 64];
    for (int i = 0; i < RS_PARAM_COUNT; i++) {
        const struct param *p = &params[i];
        if (p->rejected[0])
            snprintf(why, sizeof(why), "%s; the default stays", p->rejected);
        if (p->from_env || p->rejected[0])
            fn(p->env, p->rejected[0] ? getenv(p->env) : p->value, p->rejected[0] ? why : NULL);
    }
    for (char **e = environ; e && *e; e++) {
        char name[128];
        if (param_unknown(*e, name, sizeof(name), why))
            fn(name, strchr(*e, '=') ? strchr(*e, '=') + 1 : "", why);
    }
}

void rs_param_reload(void)
{
    pthread_once(&once, load);
    load();
}

int64_t rs_param_int(enum rs_param p)
{
    pthread_once(&once, load);
    return params[p].ival;
}

const char *rs_param_str(enum rs_param p)
{
    pthread_once(&once, load);
    return params[p].value;
}

void rs_param_print(FILE *out)
{
    pthread_once(&once, load);
    for (int i = 0; i < RS_PARAM_COUNT; i++) {
        const struct param *p = &params[i];
        fprintf(out, "%-30s %-12s %-8s # %s", p->env, p->value, p->from_env ? "env" : "default",
                p->meaning);
        if (p->rejected[0])
            fprintf(out, " (the environment's '%s' %s)", getenv(p->env) ? getenv(p->env) : "",
                    p->rejected);
        fputc('\n', out);
    }
}
