/* SPDX-License-Identifier: Apache-2.0 */
/* make install lays out a usable prefix: library, headers, tool, pkg-config file. */
#include "run_util.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

Test(install, prefix_holds_a_working_tool_and_pkg_config, .timeout = 120)
{
    char prefix[] = "/tmp/reshard-install-XXXXXX", cmd[1024], out[8192];
    cr_assert_not_null(mkdtemp(prefix));
    /* With the knobs the build under test was made with: else make would rebuild it with
     * other flags (an ASan build without the sanitizers) under the tests still running. */
    const char *knobs = getenv("RESHARD_MAKE_KNOBS");
    snprintf(cmd, sizeof(cmd), "make -s install PREFIX=%s BUILD=%s %s", prefix, build_dir(),
             knobs ? knobs : "");
    cr_assert_eq(run_capture(cmd, out, sizeof(out)), 0, "%s", out);

    /* the installed tool finds the installed library through its rpath */
    snprintf(cmd, sizeof(cmd),
             "%s/bin/reshard-plan --src 'shape=8 ranks=0-1 place=S(0)' --dst 'shape=8 ranks=2-3' "
             "--domain-size 2",
             prefix);
    cr_assert_eq(run_capture(cmd, out, sizeof(out)), 0, "%s", out);
    cr_assert(strstr(out, "\nvalid yes\n"), "%s", out);

    snprintf(cmd, sizeof(cmd),
             "PKG_CONFIG_PATH=%s/lib/pkgconfig pkg-config --cflags --libs reshard", prefix);
    cr_assert_eq(run_capture(cmd, out, sizeof(out)), 0, "%s", out);
    char want[512];
    snprintf(want, sizeof(want), "-I%s/include -L%s/lib -lnccl-net-reshard", prefix, prefix);
    cr_assert(strstr(out, want), "'%s' lacks '%s'", out, want);
    snprintf(cmd, sizeof(cmd),
             "test -f %s/include/reshard.h && test -f %s/include/reshard_status.h", prefix, prefix);
    cr_assert_eq(run_capture(cmd, out, sizeof(out)), 0, "headers installed");
    /* the installed headers stand alone: a program compiles against them and links */
    snprintf(cmd, sizeof(cmd),
             "printf '#include <reshard.h>\nint main(void){return reshard_strerror(RESHARD_OK)"
             "==0;}\n' | cc -x c - -o %s/prog -I%s/include -L%s/lib -lnccl-net-reshard "
             "-Wl,-rpath,%s/lib && %s/prog",
             prefix, prefix, prefix, prefix, prefix);
    cr_assert_eq(run_capture(cmd, out, sizeof(out)), 0, "%s", out);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", prefix);
    run_capture(cmd, out, sizeof(out));
}
