/* SPDX-License-Identifier: Apache-2.0 */
/* Logging. Levels and subsystem flags follow NCCL's numbering so that, inside NCCL, the plugin
 * hands its lines to NCCL's logger (rs_log_set_sink) and NCCL_DEBUG / NCCL_DEBUG_SUBSYS apply. */
#ifndef RS_LOG_H
#define RS_LOG_H

enum rs_log_level { RS_LOG_NONE = 0, RS_LOG_WARN = 2, RS_LOG_INFO = 3, RS_LOG_TRACE = 5 };
enum rs_log_flag { RS_LOGF_INIT = 1, RS_LOGF_NET = 16, RS_LOGF_ENV = 128 };

/* A line from file:line of subsystem flags; rs_log and rs_log_sub say where they are called. */
void rs_log_at(const char *file, int line, enum rs_log_level level, unsigned long flags,
               const char *fmt, ...) __attribute__((format(printf, 5, 6)));
#define rs_log(level, ...) rs_log_at(__FILE__, __LINE__, (level), RS_LOGF_NET, __VA_ARGS__)
/* The same for a subsystem other than NET. */
#define rs_log_sub(level, flags, ...) rs_log_at(__FILE__, __LINE__, (level), (flags), __VA_ARGS__)
int rs_log_enabled(enum rs_log_level level);

/* Where lines go instead of stderr (NULL: back to stderr). Set before the first line is logged
 * so that the settings read from the environment are reported there, once. */
typedef void (*rs_log_sink_fn)(enum rs_log_level level, unsigned long flags, const char *msg);
void rs_log_set_sink(rs_log_sink_fn sink);
/* Inside a sink: the file (from the repository root) and line the line being logged comes from,
 * for loggers that print them (NCCL's does at WARN). */
void rs_log_origin(const char **file, int *line);

#endif
