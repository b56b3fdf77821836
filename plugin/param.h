/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Every tunable, declared once: its name (environment variable RESHARD_<NAME>), default and
 * meaning. Values are read once per process; an override is logged once at INFO.
 */
#ifndef RS_PARAM_H
#define RS_PARAM_H

#include <stdint.h>
#include <stdio.h>

enum rs_param_type { RS_PARAM_INT, RS_PARAM_STR };

/* X(id, type, default, meaning) */
#define RS_PARAM_MAP(X)                                                                            \
    X(DEBUG, RS_PARAM_STR, "WARN", "log level: NONE, WARN, INFO or TRACE")                         \
    X(PLAN_SPLIT_MIN_BYTES, RS_PARAM_INT, "1048576",                                               \
      "split a network slice among source replicas when each part keeps this many bytes")

enum rs_param {
#define RS_PARAM_ENUM_(id, type, def, meaning) RS_PARAM_##id,
    RS_PARAM_MAP(RS_PARAM_ENUM_)
#undef RS_PARAM_ENUM_
        RS_PARAM_COUNT
};

int64_t rs_param_int(enum rs_param p);
const char *rs_param_str(enum rs_param p);
void rs_param_print(FILE *out);
/* Calls fn for each value the environment set, or set wrongly (rejected: the default stays).
 * The logger reports them once; nothing here logs, since the logger reads DEBUG from here. */
void rs_param_overrides(void (*fn)(const char *env, const char *value, int rejected));

#endif
