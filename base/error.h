/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Error reporting for every layer. The function that first sees an error records one line
 * saying what it was doing (rs_error); callers only pass the status up (RS_CHECK). The last
 * message is kept per thread and surfaces as reshard_last_error().
 */
#ifndef RS_ERROR_H
#define RS_ERROR_H

#include "reshard_status.h"

#include <stddef.h>

#define RS_ERROR_MAX 512

/* Records the message for the calling thread, with the file and line that recorded it, and
 * returns st, so that callers can write `return rs_error(RESHARD_ERR_..., "...")`. */
reshard_status_t rs_error_at(const char *file, int line, reshard_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define rs_error(...) rs_error_at(__FILE__, __LINE__, __VA_ARGS__)

/* The message of the last error recorded by this thread ("" when none). */
const char *rs_error_message(void);
/* Where that message was recorded (a path from the repository root; "?" and 0 when none). */
void rs_error_origin(const char **file, int *line);
void rs_error_clear(void);

/* The message a best-effort step (a question, a fallback, a courtesy send) may overwrite and
 * must put back, so that asking is never reported as failing. */
struct rs_saved_error {
    char msg[RS_ERROR_MAX];
    const char *file;
    int line;
};
void rs_error_save(struct rs_saved_error *s);
void rs_error_restore(const struct rs_saved_error *s);

const char *rs_status_name(reshard_status_t st);
const char *rs_status_string(reshard_status_t st);

/* Breadcrumbs: upper layers install a hook (the logger) that sees every failed RS_CHECK. */
typedef void (*rs_trace_fn)(const char *file, int line, const char *expr, reshard_status_t st);
void rs_error_set_trace(rs_trace_fn fn);
void rs_error_trace(const char *file, int line, const char *expr, reshard_status_t st);

#define RS_CHECK(call)                                                                             \
    do {                                                                                           \
        reshard_status_t rs_st_ = (call);                                                          \
        if (rs_st_ != RESHARD_OK) {                                                                \
            rs_error_trace(__FILE__, __LINE__, #call, rs_st_);                                     \
            return rs_st_;                                                                         \
        }                                                                                          \
    } while (0)

#define RS_CHECK_GOTO(call, st, label)                                                             \
    do {                                                                                           \
        (st) = (call);                                                                             \
        if ((st) != RESHARD_OK) {                                                                  \
            rs_error_trace(__FILE__, __LINE__, #call, (st));                                       \
            goto label;                                                                            \
        }                                                                                          \
    } while (0)

/* Allocation helpers that record the failure, so call sites stay one line. */
void *rs_calloc(size_t n, size_t size, const char *what);
void *rs_realloc_array(void *p, size_t n, size_t size, const char *what);
/* Room for at least `need` entries of `size` bytes in array p of capacity *cap, doubling (from
 * 64 entries). Returns the array, perhaps moved, and updates *cap; on failure returns NULL
 * with the error recorded, and p and *cap stay as they were. */
void *rs_grow(void *p, size_t *cap, size_t need, size_t size, const char *what);

/* Tests only: the n-th allocation through the helpers above from now on fails, as out of
 * memory would (n = 0 turns it off). For the error paths of partial allocations. */
void rs_test_fail_alloc(long n);

#endif
