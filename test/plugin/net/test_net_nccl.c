/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The plugin as an NCCL deployment meets it (issue 21's NCCL face), through the conformance
 * driver: NCCL unloads the plugin when its last communicator goes and loads it again for the
 * next; entries that do nothing are NULL, as NCCL checks; log lines say where they come from.
 *
 * net_nccl: each behaviour in the test's name, on every version.
 */
#include "net_run.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

Test(net_nccl, unload_and_reload_leave_nothing_behind, .timeout = 300)
{
    const char *expect[] = {"ok 10 rounds of dlclose, dlopen, init, a connection, finalize: "
                            "unloaded each time",
                            NULL};
    net_each_version("", "reload", expect);
}

Test(net_nccl, get_device_mr_and_irecv_consumed_are_null, .timeout = 90)
{
    const char *expect[] = {"ok getDeviceMr and irecvConsumed are NULL", NULL};
    net_each_version("", "devices", expect);
}

/* Every line the plugin hands NCCL's logger names a file of the project and a line; a failed
 * call's WARN names where the failure was seen. */
Test(net_nccl, log_lines_carry_a_real_file_and_line, .timeout = 60)
{
    cr_assert_eq(net_case(12, "RESHARD_DEBUG=INFO", "bad-args"), 0, "%s", net_out);
    int lines = 0;
    for (const char *p = strstr(net_out, "[nccl-log "); p; p = strstr(p + 1, "[nccl-log ")) {
        int level, line = -1;
        unsigned long flags;
        char file[256] = "";
        cr_assert_eq(sscanf(p, "[nccl-log %d %lx %255[^:]:%d]", &level, &flags, file, &line), 4,
                     "%.200s", p);
        cr_assert(line > 0 && strchr(file, '/') && strstr(file, ".c"),
                  "a line without a real file and line: %.200s", p);
        lines++;
    }
    cr_assert_geq(lines, 8, "%s", net_out);
    cr_assert(strstr(net_out, "plugin/net/net_io.c:"), "%s", net_out);
    cr_assert(strstr(net_out, "isend failed: NET/Reshard: isend on"), "%s", net_out);
}
