/* SPDX-License-Identifier: Apache-2.0 */
#include "log.h"

#include "error.h"
#include "param.h"
#include "text.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static enum rs_log_level level = RS_LOG_WARN;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static rs_log_sink_fn _Atomic sink;
/* Where the line being emitted comes from, for the sink (rs_log_origin). */
static _Thread_local const char *origin_file = "?";
static _Thread_local int origin_line;

void rs_log_origin(const char **file, int *line)
{
    *file = origin_file;
    *line = origin_line;
}

void rs_log_set_sink(rs_log_sink_fn fn)
{
    sink = fn;
}

/* Every failed RS_CHECK leaves a breadcrumb at TRACE, so a failure shows the path it took. */
static void trace_check(const char *file, int line, const char *expr, reshard_status_t st)
{
    rs_log_at(file, line, RS_LOG_TRACE, RS_LOGF_NET, "%s:%d %s -> %s", file, line, expr,
              rs_status_name(st));
}

static void emit_at(const char *file, int line, enum rs_log_level l, unsigned long flags,
                    const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* Lines of the logger itself, which must not wait for its own initialisation. */
#define emit(...) emit_at(__FILE__, __LINE__, __VA_ARGS__)

static void announce(const char *env, const char *value, const char *why)
{
    if (why)
        emit(RS_LOG_WARN, RS_LOGF_ENV, "%s=%s %s", env, value, why);
    else
        emit(RS_LOG_INFO, RS_LOGF_ENV, "%s set by environment to %s", env, value);
}

static void init(void)
{
    const char *v = rs_param_str(RS_PARAM_DEBUG);
    if (!strcasecmp(v, "NONE"))
        level = RS_LOG_NONE;
    else if (!strcasecmp(v, "INFO"))
        level = RS_LOG_INFO;
    else if (!strcasecmp(v, "TRACE"))
        level = RS_LOG_TRACE;
    else
        level = RS_LOG_WARN;
    rs_error_set_trace(trace_check);
    rs_param_overrides(announce);
}

/* NCCL's logger filters by NCCL_DEBUG itself: WARN and INFO always reach it. */
static enum rs_log_level threshold(void)
{
    return sink && level < RS_LOG_INFO ? RS_LOG_INFO : level;
}

int rs_log_enabled(enum rs_log_level l)
{
    pthread_once(&once, init);
    return l <= threshold();
}

static void vemit(enum rs_log_level l, unsigned long flags, const char *fmt, va_list ap)
{
    if (l > threshold())
        return;
    rs_log_sink_fn to = sink;
    if (to) {
        char msg[1024];
        vsnprintf(msg, sizeof(msg), fmt, ap);
        to(l, flags, rs_text_clean(msg));
        return;
    }
    static const char *const names[] = {
        [RS_LOG_WARN] = "WARN", [RS_LOG_INFO] = "INFO", [RS_LOG_TRACE] = "TRACE"};
    char host[64] = "?", msg[1024];
    gethostname(host, sizeof(host));
    host[sizeof(host) - 1] = '\0';
    vsnprintf(msg, sizeof(msg), fmt, ap);
    rs_text_clean(msg); /* names from manifests and peers are in it */
    fprintf(stderr, "%s:%d RESHARD %s %s\n", host, (int)getpid(), names[l] ? names[l] : "?", msg);
}

static void emit_at(const char *file, int line, enum rs_log_level l, unsigned long flags,
                    const char *fmt, ...)
{
    const char *outer_file = origin_file;
    int outer_line = origin_line;
    origin_file = file;
    origin_line = line;
    va_list ap;
    va_start(ap, fmt);
    vemit(l, flags, fmt, ap);
    va_end(ap);
    origin_file = outer_file;
    origin_line = outer_line;
}

void rs_log_at(const char *file, int line, enum rs_log_level l, unsigned long flags,
               const char *fmt, ...)
{
    if (!rs_log_enabled(l))
        return;
    const char *outer_file = origin_file; /* a sink may log itself: put the outer line back */
    int outer_line = origin_line;
    origin_file = file;
    origin_line = line;
    va_list ap;
    va_start(ap, fmt);
    vemit(l, flags, fmt, ap);
    va_end(ap);
    origin_file = outer_file;
    origin_line = outer_line;
}
