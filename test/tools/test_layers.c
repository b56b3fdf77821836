/* SPDX-License-Identifier: Apache-2.0 */
/* scripts/check-layers.py: the repository passes, and each kind of include against the layers
 * planted in a scratch tree is caught and named. */
#include "run_util.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static char tree[64];

static void put(const char *path, const char *text)
{
    char full[256], dir[256];
    snprintf(full, sizeof(full), "%s/%s", tree, path);
    snprintf(dir, sizeof(dir), "%s", full);
    for (char *s = strchr(dir + strlen(tree) + 1, '/'); s; s = strchr(s + 1, '/')) {
        *s = 0;
        mkdir(dir, 0755);
        *s = '/';
    }
    FILE *f = fopen(full, "w");
    cr_assert_not_null(f, "%s", full);
    fputs(text, f);
    fclose(f);
}

/* A clean tree of every layer; each test plants one more file. */
static void make_tree(void)
{
    snprintf(tree, sizeof(tree), "/tmp/reshard-layers-XXXXXX");
    cr_assert_not_null(mkdtemp(tree));
    put("base/error.h", "#include <stdio.h>\n");
    put("planner/plan.h", "#include \"base/error.h\"\n#include <stdint.h>\n");
    put("cuda/cuda_lib.h", "#include \"base/error.h\"\n");
    put("transport/tp.h", "#include \"base/error.h\"\n");
    put("transport/sock/sock.h", "#include \"transport/tp.h\"\n");
    put("transport/ucx/ucx_lib.h", "#include \"transport/sock/sock.h\"\n");
    put("transport/ib/ib_lib.h", "#include \"cuda/cuda_lib.h\"\n");
    put("transport/tp_pick.c", "#include \"transport/ib/ib_lib.h\"\n");
    put("plugin/reshard.h", "\n");
    put("plugin/exec/exec.h", "#include \"plugin/reshard.h\"\n#include \"transport/tp.h\"\n");
    put("plugin/exec/exec.c", "#include \"exec.h\"\n");
    put("plugin/api/api.c", "#include \"plugin/exec/exec.h\"\n");
}

static void drop_tree(void)
{
    char out[256];
    run_capturef(out, sizeof(out), "rm -rf %s", tree);
}

static int check(char *out, size_t n)
{
    return run_capturef(out, n, "scripts/check-layers.py %s", tree);
}

TestSuite(check_layers, .init = make_tree, .fini = drop_tree, .timeout = 60);

Test(check_layers, the_repository_passes)
{
    char out[8192];
    cr_assert_eq(run_capture("scripts/check-layers.py", out, sizeof(out)), 0, "%s", out);
    cr_assert(strstr(out, "every include points down the layers"), "%s", out);
}

Test(check_layers, a_clean_tree_passes)
{
    char out[4096];
    cr_assert_eq(check(out, sizeof(out)), 0, "%s", out);
}

Test(check_layers, an_upward_include_is_named)
{
    char out[4096];
    put("planner/spec.c", "#include \"plan.h\"\n#include \"plugin/exec/exec.h\"\n");
    cr_assert_eq(check(out, sizeof(out)), 1, "%s", out);
    cr_assert(strstr(out, "planner/spec.c:2: includes \"plugin/exec/exec.h\": plugin is above "
                          "planner"),
              "%s", out);
}

Test(check_layers, a_sibling_room_is_refused)
{
    char out[4096];
    put("transport/ib/ib_ctx.c", "#include \"transport/ucx/ucx_lib.h\"\n");
    cr_assert_eq(check(out, sizeof(out)), 1, "%s", out);
    cr_assert(strstr(out, "transport/ucx is not below transport/ib"), "%s", out);
}

Test(check_layers, a_room_above_is_refused)
{
    char out[4096];
    put("plugin/exec/predict.c", "#include \"plugin/api/api.h\"\n");
    put("plugin/api/api.h", "\n");
    cr_assert_eq(check(out, sizeof(out)), 1, "%s", out);
    cr_assert(strstr(out, "plugin/api is not below plugin/exec"), "%s", out);
}

Test(check_layers, a_bare_name_must_be_beside_the_file)
{
    char out[4096];
    put("transport/ib/ib_dev.c", "#include \"tp.h\"\n");
    cr_assert_eq(check(out, sizeof(out)), 1, "%s", out);
    cr_assert(strstr(out, "\"tp.h\" is not beside the file"), "%s", out);
}

Test(check_layers, the_planner_takes_only_the_c_library)
{
    char out[4096];
    put("planner/grid.c", "#include <pthread.h>\n");
    cr_assert_eq(check(out, sizeof(out)), 1, "%s", out);
    cr_assert(strstr(out, "not <pthread.h>"), "%s", out);
}
