/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Error reporting (base/error.c): the status names and messages against the one list they
 * come from, the save and restore of a message around a best-effort step, the allocation
 * helpers and the hook that fails the n-th allocation.
 */
#include "base/error.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Every status, with its name and message, straight from the X-macro: a status added to the
 * list is checked here without touching this file. */
static const struct {
    reshard_status_t st;
    int value;
    const char *name, *msg;
} all[] = {
#define RS_ALL_(name, value, msg) {RESHARD_##name, value, "RESHARD_" #name, msg},
    RESHARD_STATUS_MAP(RS_ALL_)
#undef RS_ALL_
};
#define NALL (sizeof(all) / sizeof(all[0]))

Test(error, strerror_covers_every_status)
{
    int last = 0;
    for (size_t s = 0; s < NALL; s++) {
        const char *str = rs_status_string(all[s].st);
        cr_assert(str && *str, "%s has no message", all[s].name);
        cr_assert_str_eq(str, all[s].msg);
        cr_assert_str_eq(rs_status_name(all[s].st), all[s].name);
        cr_assert_eq((int)all[s].st, all[s].value);
        for (size_t t = 0; t < s; t++) {
            cr_assert_str_neq(str, rs_status_string(all[t].st), "%s and %s share a message",
                              all[s].name, all[t].name);
            cr_assert_neq(all[s].st, all[t].st);
        }
        if (all[s].value > last)
            last = all[s].value;
    }
    cr_assert_geq(last, RESHARD_ERR_DATA_LOST, "the list reaches its last status");
    cr_assert_str_eq(rs_status_string((reshard_status_t)(last + 1)), "unknown status");
    cr_assert_str_eq(rs_status_string((reshard_status_t)1000), "unknown status");
    cr_assert_str_eq(rs_status_name((reshard_status_t)(last + 1)), "RESHARD_UNKNOWN");
}

Test(error, a_recorded_error_returns_its_status_and_keeps_its_message)
{
    cr_assert_eq(rs_error(RESHARD_ERR_TIMEOUT, "waited %d s for rank %d", 5, 3),
                 RESHARD_ERR_TIMEOUT);
    cr_assert_str_eq(rs_error_message(), "waited 5 s for rank 3");
    rs_error_clear();
    cr_assert_str_eq(rs_error_message(), "");
}

Test(error, a_saved_message_survives_what_a_best_effort_step_records)
{
    rs_error(RESHARD_ERR_NETWORK, "the first failure");
    struct rs_saved_error saved;
    rs_error_save(&saved);
    rs_error(RESHARD_ERR_UNAVAILABLE, "a question that failed");
    cr_assert_str_eq(rs_error_message(), "a question that failed");
    rs_error_restore(&saved);
    cr_assert_str_eq(rs_error_message(), "the first failure");
}

Test(error, a_message_of_the_longest_length_is_saved_whole)
{
    char longest[RS_ERROR_MAX];
    memset(longest, 'x', sizeof(longest) - 1);
    longest[sizeof(longest) - 1] = '\0';
    rs_error(RESHARD_ERR_INTERNAL, "%s", longest);
    struct rs_saved_error saved;
    rs_error_save(&saved);
    rs_error_clear();
    rs_error_restore(&saved);
    cr_assert_eq(strlen(rs_error_message()), RS_ERROR_MAX - 1);
    cr_assert_str_eq(rs_error_message(), longest);
}

static int traced;
static char traced_expr[64];

static void on_trace(const char *file, int line, const char *expr, reshard_status_t st)
{
    (void)file, (void)line;
    traced++;
    snprintf(traced_expr, sizeof(traced_expr), "%s=%d", expr, st);
}

static reshard_status_t fails(void)
{
    return RESHARD_ERR_BUSY;
}

static reshard_status_t checks(void)
{
    RS_CHECK(RESHARD_OK);
    RS_CHECK(fails());
    return RESHARD_OK;
}

static reshard_status_t checks_to_label(int *undone)
{
    reshard_status_t st;
    RS_CHECK_GOTO(fails(), st, err_undo);
    return RESHARD_OK;
err_undo:
    (*undone)++;
    return st;
}

Test(error, a_failed_check_passes_its_status_up_and_leaves_a_breadcrumb)
{
    rs_error_set_trace(on_trace);
    cr_assert_eq(checks(), RESHARD_ERR_BUSY);
    cr_assert_eq(traced, 1);
    cr_assert_str_eq(traced_expr, "fails()=16");
    int undone = 0;
    cr_assert_eq(checks_to_label(&undone), RESHARD_ERR_BUSY);
    cr_assert_eq(undone, 1);
    cr_assert_eq(traced, 2);
    rs_error_set_trace(NULL);
}

Test(error, the_nth_allocation_fails_once_as_out_of_memory_would)
{
    rs_test_fail_alloc(3);
    void *a = rs_calloc(1, 8, "first");
    void *b = rs_realloc_array(NULL, 4, 8, "second");
    cr_assert_not_null(a);
    cr_assert_not_null(b);
    cr_assert_null(rs_calloc(2, 16, "the third"));
    cr_assert_str_eq(rs_error_message(), "out of memory allocating 2 x 16 bytes for the third");
    void *d = rs_calloc(1, 8, "fourth");
    cr_assert_not_null(d, "the hook fails one allocation, then turns itself off");
    free(a);
    free(b);
    free(d);
}

Test(error, a_failed_growth_leaves_the_array_and_its_capacity)
{
    size_t cap = 0;
    int *p = rs_grow(NULL, &cap, 10, sizeof(int), "numbers");
    cr_assert_not_null(p);
    cr_assert_eq(cap, 64, "growth starts at 64 entries");
    p[9] = 42;
    rs_test_fail_alloc(1);
    cr_assert_null(rs_grow(p, &cap, 100, sizeof(int), "numbers"));
    cr_assert_str_eq(rs_error_message(), "out of memory growing numbers to 128 entries");
    cr_assert_eq(cap, 64);
    cr_assert_eq(p[9], 42);
    cr_assert_eq(rs_grow(p, &cap, 64, sizeof(int), "numbers"), p, "room enough: no move");
    int *q = rs_grow(p, &cap, 100, sizeof(int), "numbers");
    cr_assert_not_null(q);
    cr_assert_eq(cap, 128);
    cr_assert_eq(q[9], 42);
    free(q);
}

Test(error, the_hook_turned_off_fails_nothing)
{
    rs_test_fail_alloc(2);
    rs_test_fail_alloc(0);
    for (int i = 0; i < 4; i++) {
        void *p = rs_calloc(1, 1, "anything");
        cr_assert_not_null(p, "allocation %d", i);
        free(p);
    }
}

Test(error, an_array_whose_bytes_overflow_is_refused)
{
    char want[96];
    snprintf(want, sizeof(want), "size overflow growing huge to %zu entries", SIZE_MAX / 4);
    cr_assert_null(rs_realloc_array(NULL, SIZE_MAX / 4, 8, "huge"));
    cr_assert_str_eq(rs_error_message(), want);
}
