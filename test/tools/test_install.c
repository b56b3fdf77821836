/* SPDX-License-Identifier: Apache-2.0 */
/* make install lays out a usable prefix: library, headers, the three tools, pkg-config file;
 * and the build folder holds the tools as installed (bin/ beside lib/), old paths linked. */
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
    /* so do the two perf tools, with no LD_LIBRARY_PATH, through RUNPATH $ORIGIN/../lib */
    static const char *const tools[] = {"reshard_perf", "reshard_net_perf"};
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof(cmd), "env -u LD_LIBRARY_PATH %s/bin/%s --dump-config", prefix,
                 tools[i]);
        cr_assert_eq(run_capture(cmd, out, sizeof(out)), 0, "%s: %s", tools[i], out);
        cr_assert(strstr(out, "RESHARD_TIMEOUT "), "%s: %s", tools[i], out);
        snprintf(cmd, sizeof(cmd), "readelf -d %s/bin/%s", prefix, tools[i]);
        cr_assert_eq(run_capture(cmd, out, sizeof(out)), 0, "%s", out);
        cr_assert(strstr(out, "[$ORIGIN/../lib]"), "%s: %s", tools[i], out);
    }

    snprintf(cmd, sizeof(cmd),
             "PKG_CONFIG_PATH=%s/lib/pkgconfig pkg-config --cflags --libs reshard", prefix);
    cr_assert_eq(run_capture(cmd, out, sizeof(out)), 0, "%s", out);
    char want[512];
    snprintf(want, sizeof(want), "-I%s/include -L%s/lib -lnccl-net-reshard", prefix, prefix);
    cr_assert(strstr(out, want), "'%s' lacks '%s'", out, want);
    snprintf(cmd, sizeof(cmd),
             "test -f %s/include/reshard.h && test -f %s/include/reshard_status.h", prefix, prefix);
    cr_assert_eq(run_capture(cmd, out, sizeof(out)), 0, "headers installed");
    /* the installed headers stand alone: a program compiles against them and links (against
     * an ASan library, with the sanitizers: their runtime must come first, or it stops the
     * program before main) */
    const char *san = knobs && strstr(knobs, "ASAN=1") ? "-fsanitize=address,undefined" : "";
    snprintf(cmd, sizeof(cmd),
             "printf '#include <reshard.h>\nint main(void){return reshard_strerror(RESHARD_OK)"
             "==0;}\n' | cc %s -x c - -o %s/prog -I%s/include -L%s/lib -lnccl-net-reshard "
             "-Wl,-rpath,%s/lib && %s/prog",
             san, prefix, prefix, prefix, prefix, prefix);
    cr_assert_eq(run_capture(cmd, out, sizeof(out)), 0, "%s", out);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", prefix);
    run_capture(cmd, out, sizeof(out));
}

Test(install, the_build_holds_the_tools_in_bin_and_their_old_paths_still_run, .timeout = 60)
{
    char cmd[512], out[4096];
    static const char *const old[] = {"reshard-plan", "test/perf/reshard_perf", "reshard_net_perf"};
    static const char *const bin[] = {"reshard-plan", "reshard_perf", "reshard_net_perf"};
    for (int i = 0; i < 3; i++) {
        snprintf(cmd, sizeof(cmd), "%s/bin/%s --help", build_dir(), bin[i]);
        cr_assert_eq(run_capture(cmd, out, sizeof(out)), 0, "%s", out);
        cr_assert(strstr(out, "usage: "), "%s", out);
        snprintf(cmd, sizeof(cmd), "%s/%s --help", build_dir(), old[i]);
        cr_assert_eq(run_capture(cmd, out, sizeof(out)), 0, "%s", out);
        cr_assert(strstr(out, "usage: "), "%s", out);
    }
}
