/* SPDX-License-Identifier: Apache-2.0 */
/* Running the conformance driver from the plugin's suites (net_run.h). */
#include "net_run.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

char net_out[NET_OUT_MAX];
const int net_versions[NET_NVERSIONS] = {8, 9, 10, 11, 12};

int net_count_lines(const char *prefix)
{
    int n = 0;
    size_t len = strlen(prefix);
    for (const char *p = net_out; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        n += strncmp(p, prefix, len) == 0;
    return n;
}

/* A leak report in net_out whose stack reaches the project's code, or a module that is gone
 * (UCX's own, in the versions that never finalize, do not count: the same rule as
 * test/asan-run.sh). */
static int leak_in_our_code(void)
{
    int in_leak = 0;
    for (const char *p = net_out; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        char line[1024];
        snprintf(line, sizeof(line), "%.*s", (int)(len < sizeof(line) ? len : sizeof(line) - 1), p);
        if (strstr(line, "Direct leak of") || strstr(line, "Indirect leak of"))
            in_leak = 1;
        else if (in_leak && !strstr(line, " #"))
            in_leak = 0;
        else if (in_leak &&
                 (strstr(line, " plugin/") || strstr(line, " transport/") ||
                  strstr(line, " planner/") || strstr(line, " test/") || strstr(line, "(plugin/") ||
                  strstr(line, "(transport/") || strstr(line, "(<unknown module>)")))
            return 1;
    }
    return 0;
}

void net_no_sanitizer_reports(void)
{
    cr_assert_null(strstr(net_out, "ERROR: AddressSanitizer"), "%s", net_out);
    cr_assert_null(strstr(net_out, "runtime error:"), "%s", net_out);
    cr_assert_null(strstr(net_out, "LeakSanitizer has encountered a fatal error"), "%s", net_out);
    cr_assert(!leak_in_our_code(), "a leak reaches the project's code:\n%s", net_out);
}

int net_case(int v, const char *env, const char *name)
{
    return net_run("LD_LIBRARY_PATH=%s " NET_LOOPBACK " %s %s/test/net_driver --version %d "
                   "--case %s 2>&1",
                   build_dir(), env, build_dir(), v, name);
}

void net_each_version(const char *env, const char *name, const char *const *expect)
{
    for (int i = 0; i < NET_NVERSIONS; i++) {
        int rc = net_case(net_versions[i], env, name);
        cr_assert_eq(rc, 0, "v%d %s:\n%s", net_versions[i], name, net_out);
        for (const char *const *e = expect; *e; e++)
            cr_assert(strstr(net_out, *e), "v%d %s: no '%s':\n%s", net_versions[i], name, *e,
                      net_out);
        cr_assert_null(strstr(net_out, "FAIL"), "%s", net_out);
        net_no_sanitizer_reports();
    }
}
