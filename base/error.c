/* SPDX-License-Identifier: Apache-2.0 */
#include "error.h"
#include "text.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

static _Thread_local char last_message[RS_ERROR_MAX];
static _Thread_local const char *last_file;
static _Thread_local int last_line;
static rs_trace_fn trace_hook;

reshard_status_t rs_error_at(const char *file, int line, reshard_status_t st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_message, sizeof(last_message), fmt, ap);
    va_end(ap);
    rs_text_clean(last_message); /* names from manifests and peers are in it */
    last_file = file;
    last_line = line;
    return st;
}

const char *rs_error_message(void)
{
    return last_message;
}

void rs_error_origin(const char **file, int *line)
{
    *file = last_file && last_message[0] ? last_file : "?";
    *line = last_file && last_message[0] ? last_line : 0;
}

void rs_error_clear(void)
{
    last_message[0] = '\0';
    last_file = NULL;
}

void rs_error_save(struct rs_saved_error *s)
{
    snprintf(s->msg, sizeof(s->msg), "%s", last_message);
    s->file = last_file;
    s->line = last_line;
}

void rs_error_restore(const struct rs_saved_error *s)
{
    snprintf(last_message, sizeof(last_message), "%s", s->msg);
    last_file = s->file;
    last_line = s->line;
}

static atomic_long fail_countdown;

void rs_test_fail_alloc(long n)
{
    atomic_store(&fail_countdown, n);
}

/* True when the test hook says this allocation fails. */
static int injected_failure(void)
{
    long n = atomic_load(&fail_countdown);
    while (n > 0 && !atomic_compare_exchange_weak(&fail_countdown, &n, n - 1))
        ;
    return n == 1;
}

const char *rs_status_name(reshard_status_t st)
{
    switch (st) {
#define RS_NAME_(name, value, msg)                                                                 \
    case RESHARD_##name:                                                                           \
        return "RESHARD_" #name;
        RESHARD_STATUS_MAP(RS_NAME_)
#undef RS_NAME_
    }
    return "RESHARD_UNKNOWN";
}

const char *rs_status_string(reshard_status_t st)
{
    switch (st) {
#define RS_MSG_(name, value, msg)                                                                  \
    case RESHARD_##name:                                                                           \
        return msg;
        RESHARD_STATUS_MAP(RS_MSG_)
#undef RS_MSG_
    }
    return "unknown status";
}

void rs_error_set_trace(rs_trace_fn fn)
{
    trace_hook = fn;
}

void rs_error_trace(const char *file, int line, const char *expr, reshard_status_t st)
{
    if (trace_hook)
        trace_hook(file, line, expr, st);
}

void *rs_calloc(size_t n, size_t size, const char *what)
{
    void *p = injected_failure() ? NULL : calloc(n ? n : 1, size ? size : 1);
    if (!p)
        rs_error(RESHARD_ERR_NO_MEMORY, "out of memory allocating %zu x %zu bytes for %s", n, size,
                 what);
    return p;
}

void *rs_realloc_array(void *p, size_t n, size_t size, const char *what)
{
    if (size && n > SIZE_MAX / size) {
        rs_error(RESHARD_ERR_NO_MEMORY, "size overflow growing %s to %zu entries", what, n);
        return NULL;
    }
    size_t bytes = n * size;
    void *q = injected_failure() ? NULL : realloc(p, bytes ? bytes : 1);
    if (!q)
        rs_error(RESHARD_ERR_NO_MEMORY, "out of memory growing %s to %zu entries", what, n);
    return q;
}

#define PREFAULT_MIN   (1u << 20)
#define GROW_SLOW_FROM (64u << 20)

/* Maps the pages of a large array's new tail in one call rather than a fault each (a plan of a
 * whole model grows arrays of hundreds of MiB; a fault a page was a fifth of its planning time).
 * Best effort: kernels before 5.14 refuse the advice and the pages fault in as before. */
static void prefault(char *base, size_t from, size_t to)
{
    uintptr_t page = 4096, a = ((uintptr_t)base + from + page - 1) & ~(page - 1);
    uintptr_t e = ((uintptr_t)base + to) & ~(page - 1);
    if (to - from >= PREFAULT_MIN && e > a)
        (void)madvise((void *)a, e - a, MADV_POPULATE_WRITE);
}

void *rs_grow(void *p, size_t *cap, size_t need, size_t size, const char *what)
{
    if (need <= *cap)
        return p;
    /* Doubling, then a quarter more a step once large: the tail beyond `need` is prefaulted,
     * so it costs memory and time (and a realloc that large moves page tables, not bytes). */
    size_t n = *cap ? *cap : 64;
    while (n < need)
        n = n > SIZE_MAX / 2 ? need : n * size < GROW_SLOW_FROM ? 2 * n : n + n / 4;
    void *q = rs_realloc_array(p, n, size, what);
    if (q) {
        prefault(q, *cap * size, n * size);
        *cap = n;
    }
    return q;
}
