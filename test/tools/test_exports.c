/* SPDX-License-Identifier: Apache-2.0 */
/* Only the public API and the NCCL net plugin tables v8 to v12 leave the shared object
 * (-fvisibility=hidden). */
#include "run_util.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

Test(exports, only_the_public_api_is_visible, .timeout = 60)
{
    char cmd[512], out[1 << 15];
    snprintf(cmd, sizeof(cmd), "nm -D --defined-only %s/libnccl-net-reshard.so", build_dir());
    cr_assert_eq(run_capture(cmd, out, sizeof(out)), 0, "%s", out);
    int count = 0, plan_create = 0, tables = 0;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        const char *sym = strrchr(line, ' ');
        cr_assert_not_null(sym, "odd nm line '%s'", line);
        sym++;
        if (!strncmp(sym, "__odr_asan.", 11)) /* ASan's twin of an exported global */
            sym += 11;
        int v = 0;
        if (sscanf(sym, "ncclNetPlugin_v%d", &v) == 1 && v >= 8 && v <= 12) {
            tables |= 1 << v;
            continue;
        }
        cr_assert_eq(strncmp(sym, "reshard_", 8), 0, "'%s' leaks out of the library", sym);
        plan_create |= !strcmp(sym, "reshard_plan_create");
        count++;
    }
    cr_assert(plan_create, "reshard_plan_create is exported");
    cr_assert_gt(count, 10);
    for (int v = 8; v <= 12; v++)
        cr_assert(tables & 1 << v, "ncclNetPlugin_v%d is not exported", v);
}

/* The object needs only libc (and the loader, and the sanitizers in a sanitizer build): UCX,
 * verbs, CUDA, NCCL and jansson are all opened at run time, so NCCL can load the plugin on a
 * node that has none of them. */
Test(exports, the_object_needs_only_libc, .timeout = 60)
{
    char cmd[512], out[1 << 14];
    snprintf(cmd, sizeof(cmd), "readelf -d %s/libnccl-net-reshard.so", build_dir());
    cr_assert_eq(run_capture(cmd, out, sizeof(out)), 0, "%s", out);
    static const char *const allowed[] = {"libc.so.",     "ld-linux", "libasan.so.",
                                          "libubsan.so.", "libm.so.", "libpthread.so.",
                                          "libdl.so."};
    int n = 0;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        char *lib = strstr(line, "(NEEDED)");
        if (!lib || !(lib = strchr(lib, '[')))
            continue;
        int ok = 0;
        for (size_t i = 0; i < sizeof(allowed) / sizeof(allowed[0]); i++)
            ok |= !strncmp(lib + 1, allowed[i], strlen(allowed[i]));
        cr_assert(ok, "the object needs %s", lib);
        n++;
    }
    cr_assert_gt(n, 0, "readelf listed no NEEDED entry:\n%s", out);
}
