/* SPDX-License-Identifier: Apache-2.0 */
#include "param.h"

#include <errno.h>
#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>

struct param {
    const char *name, *env, *def, *meaning;
    enum rs_param_type type;
    int64_t min;
    const char *value; /* environment or default */
    int64_t ival;
    int from_env;
    char rejected[64]; /* why the environment's value was refused, "" when it was not */
};

static struct param params[RS_PARAM_COUNT] = {
#define RS_PARAM_ROW_(id, t, d, lo, m)                                                             \
    [RS_PARAM_##                                                                                   \
        id] = {.name = #id, .env = "RESHARD_" #id, .def = d, .meaning = m, .type = t, .min = lo},
    RS_PARAM_MAP(RS_PARAM_ROW_)
#undef RS_PARAM_ROW_
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
        if (!env)
            continue;
        int64_t v = 0;
        if (p->type == RS_PARAM_INT && parse_int(env, &v) != 0) {
            snprintf(p->rejected, sizeof(p->rejected), "is not an integer");
            continue;
        }
        if (p->type == RS_PARAM_INT && v < p->min) {
            snprintf(p->rejected, sizeof(p->rejected), "is below %lld", (long long)p->min);
            continue;
        }
        p->value = env;
        p->ival = v;
        p->from_env = 1;
    }
}

void rs_param_overrides(void (*fn)(const char *env, const char *value, const char *why))
{
    pthread_once(&once, load);
    for (int i = 0; i < RS_PARAM_COUNT; i++)
        if (params[i].from_env || params[i].rejected[0])
            fn(params[i].env, params[i].rejected[0] ? getenv(params[i].env) : params[i].value,
               params[i].rejected[0] ? params[i].rejected : NULL);
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
        fprintf(out, "%-30s %-12s %-8s # %s\n", p->env, p->value, p->from_env ? "env" : "default",
                p->meaning);
    }
}
