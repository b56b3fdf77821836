/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Every tool and script answers -h/--help with its usage on stdout and exit 0, and says what
 * is wrong in one line, once: the library leaves a failure to a caller that prints it
 * (reshard_log_set_failures), and the tools' own mistakes are one line, not a synopsis.
 */
#include "plugin/reshard.h"

#include "run_util.h"

#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OUT_MAX (1 << 16)

static char out[OUT_MAX];

static int lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

static char *stderr_text(void)
{
    static char log[8192];
    fflush(stderr);
    size_t n = fread(log, 1, sizeof(log) - 1, cr_get_redirected_stderr());
    log[n] = '\0';
    return log;
}

/* A plan that loses data: its only holder is excluded (RESHARD_ERR_DATA_LOST, logged at WARN
 * by default). */
static reshard_status_t lose_data(void)
{
    reshard_layout_t *src, *dst;
    reshard_topo_t *topo;
    reshard_plan_t *plan = NULL;
    cr_assert_eq(reshard_layout_parse("shape=8 ranks=0-1 place=S(0)", 0, &src), RESHARD_OK);
    cr_assert_eq(reshard_layout_parse("shape=8 ranks=2", 0, &dst), RESHARD_OK);
    cr_assert_eq(reshard_topo_create(3, 1, NULL, &topo), RESHARD_OK);
    int gone = 1;
    cr_assert_eq(reshard_topo_exclude(topo, &gone, 1), RESHARD_OK);
    reshard_tensor_t t = {"w", src, dst};
    reshard_status_t st = reshard_plan_create(&t, 1, topo, NULL, &plan);
    reshard_plan_destroy(plan);
    reshard_topo_destroy(topo);
    reshard_layout_destroy(src);
    reshard_layout_destroy(dst);
    return st;
}

Test(tool_errors, the_library_warns_of_a_failure_unless_the_caller_prints_it,
     .init = cr_redirect_stderr)
{
    unsetenv("RESHARD_DEBUG");
    cr_assert_eq(lose_data(), RESHARD_ERR_DATA_LOST);
    reshard_log_set_failures(0);
    cr_assert_eq(lose_data(), RESHARD_ERR_DATA_LOST);
    cr_assert(strstr(reshard_last_error(), "'w' (held by rank 1 only)"), "the caller has it: %s",
              reshard_last_error());
    reshard_log_set_failures(1);
    const char *log = stderr_text();
    const char *first = strstr(log, "RESHARD WARN reshard_plan_create: plan: 1 tensor cannot be "
                                    "refit");
    cr_assert_not_null(first, "%s", log);
    cr_assert_null(strstr(strchr(first, '\n'), "reshard_plan_create"),
                   "logged for the first call only: %s", log);
}

/* ---- reshard_perf ---- */

Test(tool_errors, reshard_perf_help_and_one_line_mistakes, .timeout = 60)
{
    const char *b = build_dir();
    cr_assert_eq(run_capturef(out, sizeof(out), "%s/bin/reshard_perf -h 2>/dev/null", b), 0);
    cr_assert_eq(strncmp(out, "usage: reshard_perf", 19), 0, "%s", out);
    cr_assert(strstr(out, "\n  -h, --help "), "%s", out);
    cr_assert_eq(run_capturef(out, sizeof(out), "%s/bin/reshard_perf --help --src x", b), 0);
    cr_assert_eq(run_capturef(out, sizeof(out), "%s/bin/reshard_perf --bogus", b), 2);
    cr_assert_str_eq(out, "reshard_perf: unknown option '--bogus' (--help lists them)\n");
    cr_assert_eq(run_capturef(out, sizeof(out), "%s/bin/reshard_perf --src x --dst y -n", b), 2);
    cr_assert_str_eq(out, "reshard_perf: --iters needs a value\n");
    cr_assert_eq(run_capturef(out, sizeof(out), "%s/bin/reshard_perf --src x --dst y -b 1Q", b), 2);
    cr_assert_str_eq(out, "reshard_perf: bad value '1Q' for --minbytes\n");
}

/* A rank whose transport cannot start: the library's message, once, in the tool's line. */
Test(tool_errors, reshard_perf_reports_a_failed_start_once, .timeout = 120)
{
    int rc = run_capturef(out, sizeof(out),
                          "RESHARD_TRANSPORT=ib RESHARD_IB_LIB=libibverbs-absent.so.1 "
                          "%s/bin/reshard_perf -np 1 -n 1 -w 0 --src 'shape=64 ranks=0 place=R' "
                          "--dst 'shape=64 ranks=0 place=R'",
                          build_dir());
    cr_assert_eq(rc, 1, "%s", out);
    cr_assert_eq(lines(out), 1, "%s", out);
    cr_assert_eq(strncmp(out, "reshard_perf: rank 0: reshard_comm_init_rank: ", 46), 0, "%s", out);
    cr_assert_null(strstr(out, "RESHARD WARN"), "%s", out);
}

/* ---- reshard_net_perf ---- */

Test(tool_errors, reshard_net_perf_help_and_one_line_mistakes, .timeout = 60)
{
    const char *b = build_dir();
    cr_assert_eq(run_capturef(out, sizeof(out), "%s/bin/reshard_net_perf --help 2>/dev/null", b),
                 0);
    cr_assert_eq(strncmp(out, "usage: reshard_net_perf", 23), 0, "%s", out);
    cr_assert_eq(run_capturef(out, sizeof(out), "%s/bin/reshard_net_perf -h", b), 0);
    cr_assert_eq(run_capturef(out, sizeof(out), "%s/bin/reshard_net_perf --bogus", b), 2);
    cr_assert_str_eq(out, "reshard_net_perf: unknown option '--bogus' (--help lists them)\n");
    cr_assert_eq(run_capturef(out, sizeof(out), "%s/bin/reshard_net_perf -W 65", b), 2);
    cr_assert_str_eq(out, "reshard_net_perf: bad value '65' for -W\n");
    cr_assert_eq(run_capturef(out, sizeof(out), "%s/bin/reshard_net_perf -b 1K -e 512", b), 2);
    cr_assert_str_eq(out, "reshard_net_perf: -e must not be below -b\n");
    cr_assert_eq(run_capturef(out, sizeof(out), "%s/bin/reshard_net_perf -b", b), 2);
    cr_assert_str_eq(out, "reshard_net_perf: -b needs a value\n");
    cr_assert_eq(run_capturef(out, sizeof(out), "%s/bin/reshard_net_perf --role send", b), 2);
    cr_assert_str_eq(out, "reshard_net_perf: --role needs --handle FILE\n");
}

/* The plugin cannot start, or offers no device: one line from the receiver, naming the call
 * and the plugin's reason; the forked sender, which starts only once it has a handle, says
 * nothing more. */
Test(tool_errors, reshard_net_perf_reports_a_plugin_failure_once, .timeout = 120)
{
    const char *b = build_dir();
    int rc = run_capturef(out, sizeof(out),
                          "RESHARD_TRANSPORT=ib RESHARD_IB_LIB=libibverbs-absent.so.1 "
                          "%s/bin/reshard_net_perf -b 1K -e 1K -n 2",
                          b);
    cr_assert_eq(rc, 1, "%s", out);
    cr_assert_eq(lines(out), 1, "%s", out);
    /* at init, or as no device (the plugin then lets NCCL use another network) */
    cr_assert(!strncmp(out, "reshard_net_perf: init", 22) ||
                  !strncmp(out, "reshard_net_perf: device 0 asked, the plugin has 0: ", 52),
              "%s", out);
    cr_assert(strstr(out, "libibverbs-absent.so.1"), "the plugin's reason: %s", out);
    rc = run_capturef(out, sizeof(out),
                      "RESHARD_NET_DEVICES=no-such-if %s/bin/reshard_net_perf -b 1K -e 1K -n 2", b);
    cr_assert_eq(rc, 1, "%s", out);
    cr_assert_eq(lines(out), 1, "%s", out);
    cr_assert(strstr(out, "reshard_net_perf: device 0 asked, the plugin has 0: "), "%s", out);
    cr_assert(strstr(out, "no-such-if"), "the plugin's reason: %s", out);
}

/* ---- scripts ---- */

Test(tool_errors, every_script_answers_help_with_its_usage, .timeout = 60)
{
    static const char *const scripts[] = {
        "bench-refit.sh",  "bench-net.sh", "bench-scale.sh", "bench-boot.sh",   "bench-control.sh",
        "bench-models.sh", "cluster.sh",   "demo.sh",        "gpu-check.sh",    "gpu-bundle.sh",
        "gpu-probe.py",    "rxe-test.sh",  "embed.py",       "gen-manifest.py", "check-layers.py",
        "apt-install.sh",  "bench-fp8.sh", "bench-delta.sh", "bench-elastic.sh"};
    for (size_t i = 0; i < sizeof(scripts) / sizeof(scripts[0]); i++) {
        for (int form = 0; form < 2; form++) {
            int rc = run_capturef(out, sizeof(out), "scripts/%s %s 2>&1 </dev/null", scripts[i],
                                  form ? "--help" : "-h");
            cr_assert_eq(rc, 0, "%s %s: %s", scripts[i], form ? "--help" : "-h", out);
            cr_assert(strstr(out, "usage: "), "%s: %s", scripts[i], out);
        }
        int rc =
            run_capturef(out, sizeof(out), "scripts/%s --no-such-option </dev/null", scripts[i]);
        cr_assert_neq(rc, 0, "%s takes a bad option: %s", scripts[i], out);
    }
}
