/* SPDX-License-Identifier: Apache-2.0 */
#include "param.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

struct param {
    const char *name, *env, *def, *meaning;
    enum rs_param_type type;
    const char *value; /* environment or default */
    int64_t ival;
    int from_env;
    int rejected; /* the environment held a value of the wrong type */
};

static struct param params[RS_PARAM_COUNT] = {
#define RS_PARAM_ROW_(id, t, d, m)                                                                 \
    [RS_PARAM_##id] = {.name = #id, .env = "RESHARD_" #id, .def = d, .meaning = m, .type = t},
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
        if (p->type == RS_PARAM_INT)
            parse_int(p->def, &p->ival);
        if (!env)
            continue;
        p->value = env;
        if (p->type == RS_PARAM_INT && parse_int(env, &p->ival) != 0) {
            parse_int(p->def, &p->ival);
            p->value = p->def;
            p->rejected = 1;
            continue;
        }
        p->from_env = 1;
    }
}

void rs_param_overrides(void (*fn)(const char *env, const char *value, int rejected))
{
    pthread_once(&once, load);
    for (int i = 0; i < RS_PARAM_COUNT; i++)
        if (params[i].from_env || params[i].rejected)
            fn(params[i].env, params[i].rejected ? getenv(params[i].env) : params[i].value,
               params[i].rejected);
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
