/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The tunables table (base/param.c): values from the environment, refused values that keep
 * the default (and say so once, through the logger), the printed table that --dump-config
 * shows, and reading the environment again in a forked child.
 */
#include "base/log.h"
#include "base/param.h"

#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What reshard_config_print shows: the logger first reports refused values, once. */
static char *config_text(void)
{
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    rs_log_enabled(RS_LOG_WARN);
    rs_param_print(out);
    fclose(out);
    return text;
}

static char *stderr_text(void)
{
    static char log[4096];
    fflush(stderr);
    size_t n = fread(log, 1, sizeof(log) - 1, cr_get_redirected_stderr());
    log[n] = '\0';
    return log;
}

static int count(const char *text, const char *what)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, what)); p += strlen(what))
        n++;
    return n;
}

Test(param, a_malformed_environment_value_keeps_the_default, .init = cr_redirect_stderr)
{
    setenv("RESHARD_PLAN_SPLIT_MIN_BYTES", "lots", 1);
    char *text = config_text();
    cr_assert(strstr(text, "RESHARD_PLAN_SPLIT_MIN_BYTES   1048576      default"), "%s", text);
    free(text);
    const char *log = stderr_text();
    cr_assert(strstr(log, "RESHARD WARN RESHARD_PLAN_SPLIT_MIN_BYTES=lots is not an integer; the "
                          "default stays"),
              "%s", log);
}

Test(param, tunables_below_their_minimum_keep_the_default, .init = cr_redirect_stderr)
{
    setenv("RESHARD_PLAN_SPLIT_MIN_BYTES", "0", 1);
    setenv("RESHARD_DEBUG", "loud", 1);
    char *text = config_text();
    cr_assert(strstr(text, "RESHARD_PLAN_SPLIT_MIN_BYTES   1048576      default"), "%s", text);
    free(text);
    const char *log = stderr_text();
    cr_assert(strstr(log, "RESHARD_PLAN_SPLIT_MIN_BYTES=0 is below 1; the default stays"), "%s",
              log);
    cr_assert(strstr(log, "RESHARD_DEBUG=loud is not NONE, WARN, INFO or TRACE; the default "
                          "stays"),
              "%s", log);
}

/* A word setting takes its words in any case and holds the table's spelling; another word is
 * refused like a malformed integer, and --dump-config shows the value in force. */
Test(param, a_word_setting_is_one_of_its_words_or_keeps_the_default, .init = cr_redirect_stderr)
{
    setenv("RESHARD_DEBUG", "info", 1);
    cr_assert_str_eq(rs_param_str(RS_PARAM_DEBUG), "INFO");
    char *text = config_text();
    cr_assert(strstr(text, "RESHARD_DEBUG                  INFO         env "), "%s", text);
    free(text);
    setenv("RESHARD_DEBUG", "verbose", 1);
    rs_param_reload();
    cr_assert_str_eq(rs_param_str(RS_PARAM_DEBUG), "WARN", "the default stays");
    text = config_text();
    cr_assert(strstr(text, "RESHARD_DEBUG                  WARN         default  # "), "%s", text);
    cr_assert(strstr(text, "(the environment's 'verbose' is not NONE, WARN, INFO or TRACE)\n"),
              "%s", text);
    free(text);
    /* a transport that does not exist is refused where it is used, naming it */
    setenv("RESHARD_TRANSPORT", "verbs", 1);
    rs_param_reload();
    cr_assert_str_eq(rs_param_str(RS_PARAM_TRANSPORT), "verbs");
}

/* Past its largest value a setting would overflow where it is used (seconds into int
 * milliseconds) or mean nothing (a port, a switch). */
Test(param, integers_above_their_largest_value_keep_the_default, .init = cr_redirect_stderr)
{
    setenv("RESHARD_TIMEOUT", "9223372036854775807", 1);
    setenv("RESHARD_BOOT_PORT", "65536", 1);
    setenv("RESHARD_CUDA_IPC", "2", 1);
    setenv("RESHARD_IB_QPS_PER_PEER", "8", 1);
    cr_assert_eq(rs_param_int(RS_PARAM_TIMEOUT), 300);
    cr_assert_eq(rs_param_int(RS_PARAM_BOOT_PORT), 0);
    cr_assert_eq(rs_param_int(RS_PARAM_CUDA_IPC), 1);
    cr_assert_eq(rs_param_int(RS_PARAM_IB_QPS_PER_PEER), 8, "8 is the largest, and taken");
    char *text = config_text();
    cr_assert(strstr(text, "RESHARD_BOOT_PORT              0            default  # "), "%s", text);
    free(text);
    const char *log = stderr_text();
    cr_assert(strstr(log, "RESHARD_TIMEOUT=9223372036854775807 is above 2147483; the default "
                          "stays"),
              "%s", log);
    cr_assert(strstr(log, "RESHARD_BOOT_PORT=65536 is above 65535"), "%s", log);
    cr_assert(strstr(log, "RESHARD_CUDA_IPC=2 is above 1"), "%s", log);
    cr_assert_null(strstr(log, "RESHARD_IB_QPS_PER_PEER"), "%s", log);
}

/* An unknown RESHARD_ name is one WARN, naming the setting it is nearest to; the names the
 * project's tests and scripts read are not settings and not warned about. */
Test(param, a_misspelled_name_is_one_warning_naming_the_setting, .init = cr_redirect_stderr)
{
    setenv("RESHARD_TIMOUT", "3", 1);
    setenv("RESHARD_chunk_bytes", "1", 1);
    setenv("RESHARD_NOTHING_LIKE_IT", "1", 1);
    setenv("RESHARD_BUILD", "build", 1);
    setenv("RESHARD_LIB", "/x.so", 1);
    rs_log(RS_LOG_WARN, "first line");
    rs_log(RS_LOG_WARN, "second line");
    cr_assert_eq(rs_param_int(RS_PARAM_TIMEOUT), 300, "a misspelling sets nothing");
    const char *log = stderr_text();
    cr_assert_eq(count(log, "RESHARD_TIMOUT=3 is not a reshard setting (did you mean "
                            "RESHARD_TIMEOUT?); ignored"),
                 1, "%s", log);
    cr_assert_eq(count(log, "RESHARD_chunk_bytes=1 is not a reshard setting (did you mean "
                            "RESHARD_CHUNK_BYTES?)"),
                 1, "%s", log);
    cr_assert_eq(count(log, "RESHARD_NOTHING_LIKE_IT=1 is not a reshard setting (--dump-config "
                            "lists them); ignored"),
                 1, "%s", log);
    cr_assert_null(strstr(log, "RESHARD_BUILD"), "%s", log);
    cr_assert_null(strstr(log, "RESHARD_LIB"), "%s", log);
}

Test(param, an_environment_value_is_read_and_shown_as_set_by_it)
{
    setenv("RESHARD_PLAN_SPLIT_MIN_BYTES", "4096", 1);
    setenv("RESHARD_NET_TLS", "tcp", 1);
    cr_assert_eq(rs_param_int(RS_PARAM_PLAN_SPLIT_MIN_BYTES), 4096);
    cr_assert_str_eq(rs_param_str(RS_PARAM_NET_TLS), "tcp");
    cr_assert_eq(rs_param_int(RS_PARAM_TIMEOUT), 300, "the rest keep their defaults");
    char *text = config_text();
    cr_assert(strstr(text, "RESHARD_PLAN_SPLIT_MIN_BYTES   4096         env"), "%s", text);
    cr_assert(strstr(text, "RESHARD_NET_TLS                tcp          env"), "%s", text);
    cr_assert(strstr(text, "RESHARD_TIMEOUT                300          default"), "%s", text);
    free(text);
}

Test(param, integers_take_any_base_strtoll_reads)
{
    setenv("RESHARD_CHUNK_BYTES", "0x100000", 1);
    setenv("RESHARD_DOMAIN", "-1", 1);
    cr_assert_eq(rs_param_int(RS_PARAM_CHUNK_BYTES), 1 << 20);
    cr_assert_eq(rs_param_int(RS_PARAM_DOMAIN), -1, "-1 is this row's smallest value");
}

Test(param, values_are_read_once_until_reloaded)
{
    cr_assert_eq(rs_param_int(RS_PARAM_TIMEOUT), 300);
    setenv("RESHARD_TIMEOUT", "7", 1);
    cr_assert_eq(rs_param_int(RS_PARAM_TIMEOUT), 300, "read once per process");
    rs_param_reload(); /* what a forked child does after setting its own */
    cr_assert_eq(rs_param_int(RS_PARAM_TIMEOUT), 7);
    unsetenv("RESHARD_TIMEOUT");
    rs_param_reload();
    cr_assert_eq(rs_param_int(RS_PARAM_TIMEOUT), 300, "unset again: the default");
}

Test(param, an_override_is_logged_once_at_info, .init = cr_redirect_stderr)
{
    setenv("RESHARD_DEBUG", "INFO", 1);
    setenv("RESHARD_TIMEOUT", "9", 1);
    rs_log(RS_LOG_INFO, "first line");
    rs_log(RS_LOG_INFO, "second line");
    const char *log = stderr_text();
    cr_assert_eq(count(log, "RESHARD INFO RESHARD_TIMEOUT set by environment to 9"), 1, "%s", log);
    cr_assert_eq(count(log, "RESHARD INFO first line"), 1, "%s", log);
}

/* The libraries opened at run time are tunables like the rest: --dump-config shows them. */
Test(param, the_libraries_loaded_at_run_time_are_in_the_table)
{
    setenv("RESHARD_UCX_LIB", "libucp-elsewhere.so.0", 1);
    char *text = config_text();
    cr_assert(strstr(text, "RESHARD_CUDA_LIB               libcuda.so.1 default"), "%s", text);
    cr_assert(strstr(text, "RESHARD_IB_LIB                 libibverbs.so.1 default"), "%s", text);
    cr_assert(strstr(text, "RESHARD_NCCL_LIB                            default"), "%s", text);
    cr_assert(strstr(text, "RESHARD_UCX_LIB                libucp-elsewhere.so.0 env"), "%s", text);
    free(text);
    cr_assert_str_eq(rs_param_str(RS_PARAM_CUDA_LIB), "libcuda.so.1");
    cr_assert_str_eq(rs_param_str(RS_PARAM_NCCL_LIB), "");
}
