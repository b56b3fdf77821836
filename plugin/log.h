/* SPDX-License-Identifier: Apache-2.0 */
/* Logging. Levels follow NCCL's numbering so the plugin can hand lines to NCCL's logger. */
#ifndef RS_LOG_H
#define RS_LOG_H

enum rs_log_level { RS_LOG_NONE = 0, RS_LOG_WARN = 2, RS_LOG_INFO = 3, RS_LOG_TRACE = 5 };

void rs_log(enum rs_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int rs_log_enabled(enum rs_log_level level);

#endif
