/* SPDX-License-Identifier: Apache-2.0 */
/* Only the public API leaves the shared object (-fvisibility=hidden). */
#include "run_util.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

Test(exports, only_the_public_api_is_visible, .timeout = 60)
{
    char cmd[512], out[1 << 15];
    snprintf(cmd, sizeof(cmd), "nm -D --defined-only %s/libnccl-net-reshard.so", build_dir());
    cr_assert_eq(run_capture(cmd, out, sizeof(out)), 0, "%s", out);
    int count = 0, plan_create = 0;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        const char *sym = strrchr(line, ' ');
        cr_assert_not_null(sym, "odd nm line '%s'", line);
        sym++;
        cr_assert_eq(strncmp(sym, "reshard_", 8), 0, "'%s' leaks out of the library", sym);
        plan_create |= !strcmp(sym, "reshard_plan_create");
        count++;
    }
    cr_assert(plan_create, "reshard_plan_create is exported");
    cr_assert_gt(count, 10);
}
