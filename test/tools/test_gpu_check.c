/* SPDX-License-Identifier: Apache-2.0 */
/*
 * scripts/gpu-bundle.sh and scripts/gpu-check.sh without a GPU: the bundle is whole and finds
 * its libraries by itself, and the check, on the stand-in driver, runs its steps and tells a
 * call the sandbox refuses (the stand-in refusing CUDA IPC) from a defect (a copy failing).
 */
#include "run_util.h"
#include "cuda/cuda_lib.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define OUT_MAX (1 << 17)

static char out[OUT_MAX];
static char dir[64];

static void make_dir(void)
{
    snprintf(dir, sizeof(dir), "/tmp/reshard-gpucheck-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void drop_dir(void)
{
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    run_capture(cmd, out, sizeof(out));
}

TestSuite(gpu_check, .init = make_dir, .fini = drop_dir, .timeout = 180);

/* The row of a step in the table: "NAME RESULT ...", or NULL. */
static const char *row_of(const char *name)
{
    char key[64];
    snprintf(key, sizeof(key), "\n%-13s ", name);
    const char *p = NULL, *q = out;
    while ((q = strstr(q, key))) /* the table comes last: its row is the last match */
        p = q++;
    return p ? p + 1 : NULL;
}

static void assert_result(const char *name, const char *result)
{
    const char *r = row_of(name);
    cr_assert_not_null(r, "no row for %s:\n%s", name, out);
    cr_assert_eq(strncmp(r + 14, result, strlen(result)), 0, "%s is not %s:\n%s", name, result,
                 out);
}

static int check(const char *env, const char *steps)
{
    return run_capturef(out, sizeof(out),
                        "%s scripts/gpu-check.sh --stand-in --bundle %s --logs %s/logs --steps %s",
                        env, build_dir(), dir, steps);
}

Test(gpu_check, the_stand_in_runs_the_device_steps)
{
    int rc = check(
        "", "device,gpu-unit,pack,delta-kernel,refit-ipc,refit-vmm,refit-staged,refit-delta,nccl,"
            "net-plugin,m2n");
    cr_assert_eq(rc, 0, "%s", out);
    assert_result("probe", "PASS");
    assert_result("gpu-unit", "PASS");
    assert_result("pack", "SKIP");
    size_t fatbin = 0;
    int kernels = cuda_fatbin(&fatbin) != NULL; /* a build without nvcc has none to check */
    assert_result("delta-kernel", kernels ? "PASS" : "SKIP");
    assert_result("refit-ipc", "PASS");
    assert_result("refit-vmm", "PASS");
    assert_result("refit-staged", "PASS");
    assert_result("refit-delta", "PASS");
    assert_result("nccl", "PASS");
    assert_result("net-plugin", "PASS");
    assert_result("m2n", "PASS");
    cr_assert(strstr(row_of("refit-ipc"), "#wrong 0 on every rank"), "%s", out);
    cr_assert(strstr(row_of("m2n"), "#wrong 0, unnamed dtype refused"), "%s", out);
    cr_assert(strstr(row_of("delta-kernel"),
                     kernels ? "every message the host codec's" : "built without nvcc"),
              "%s", out);
    cr_assert(strstr(row_of("refit-delta"), "delta refits, 5% changed"), "%s", out);
    cr_assert(strstr(out, "0 failed"), "%s", out);
}

/* The stand-in refuses cuIpcOpenMemHandle as a sandbox would: the probe finds it, and the step
 * that fails at it is REFUSED, not FAIL; a copy that fails is a defect. */
Test(gpu_check, a_refused_call_is_told_apart_from_a_defect)
{
    const char *knobs = getenv("RESHARD_MAKE_KNOBS");
    if (knobs && strstr(knobs, "ASAN=1"))
        cr_skip_test("the probe loads the stand-in into python3, which an ASan library cannot "
                     "enter (the probe says unknown)");
    int rc = check("FAKE_CUDA_FAIL=cuIpcOpenMemHandle_v2", "refit-ipc,refit-staged");
    cr_assert_eq(rc, 0, "a refusal is no failure:\n%s", out);
    cr_assert(strstr(row_of("probe"), " 1 refused, "), "%s", out);
    cr_assert(strstr(row_of("probe"), "cuda-ipc refused"), "%s", out);
    assert_result("refit-ipc", "REFUSED");
    cr_assert(strstr(row_of("refit-ipc"), "the sandbox refuses cuda-ipc"), "%s", out);
    assert_result("refit-staged", "PASS");
    rc = check("FAKE_CUDA_FAIL=cuMemcpyAsync", "refit-ipc");
    cr_assert_eq(rc, 1, "%s", out);
    assert_result("refit-ipc", "FAIL");
}

/* net-plugin on the stand-in: both runs (NCCL_NET=Reshard, then Socket) go through the stand-in
 * NCCL's collectives between two processes with every element checked, the busbw of both
 * appear side by side, and the row says that NCCL's log was not checked and why. */
Test(gpu_check, net_plugin_checks_every_element_of_both_networks_on_the_stand_in)
{
    int rc = check("", "net-plugin");
    cr_assert_eq(rc, 0, "%s", out);
    assert_result("net-plugin", "PASS");
    const char *r = row_of("net-plugin");
    cr_assert(strstr(r, "busbw GB/s Reshard/Socket at 1 MiB: all_reduce "), "%s", out);
    cr_assert(strstr(r, "; #wrong 0; stand-in: no log\n"), "%s", out);
    /* every size of every operation, on both networks, with nothing wrong */
    rc = run_capturef(out, sizeof(out),
                      "cd %s/logs && for n in Reshard Socket; do awk '$1 ~ /^(all_reduce|all_gather"
                      "|sendrecv)$/ && $8 == 0' net-plugin.$n.txt | wc -l; done",
                      dir);
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert_str_eq(out, "30\n30\n", "3 operations x 10 sizes (8 B .. 1 MiB) per network");
    rc = run_capturef(out, sizeof(out),
                      "awk '$1 == \"sendrecv\" && $2 == 1048576 && NF == 5' %s/logs/net-plugin.log",
                      dir);
    cr_assert_eq(rc, 0, "%s", out);
    double plugin, socket;
    cr_assert_eq(sscanf(out, "sendrecv 1048576 %lf %lf", &plugin, &socket), 2,
                 "the side-by-side table has the last size once:\n%s", out);
    cr_assert(plugin > 0 && socket > 0, "%s", out);
}

/* A wrong element anywhere fails the step (the stand-in flips a bit of the last rank's result),
 * and so does a log without 'Using network Reshard' (NET_LOG_CHECK=1 checks the stand-in's,
 * which has none): neither check passes vacuously. */
Test(gpu_check, net_plugin_fails_on_a_wrong_element_or_a_log_without_the_plugin)
{
    static const char *const calls[] = {"ncclAllReduce", "ncclAllGather", "ncclRecv"};
    static const char *const ops[] = {"all_reduce", "all_gather", "sendrecv"};
    for (int i = 0; i < 3; i++) {
        char env[64];
        snprintf(env, sizeof(env), "FAKE_NCCL_CORRUPT=%s", calls[i]);
        int rc = check(env, "net-plugin");
        cr_assert_eq(rc, 1, "%s", out);
        assert_result("net-plugin", "FAIL");
        /* one element of each of the 10 sizes, and the first named */
        rc = run_capturef(out, sizeof(out),
                          "grep -c 'every element checked on both ranks: #wrong 10;' "
                          "%s/logs/net-plugin.log; grep -c '%s of 8 bytes: element 1 is ' "
                          "%s/logs/net-plugin.log",
                          dir, ops[i], dir);
        cr_assert_str_eq(out, "1\n1\n", "%s", calls[i]);
    }
    int rc = check("NET_LOG_CHECK=1", "net-plugin");
    cr_assert_eq(rc, 1, "%s", out);
    assert_result("net-plugin", "FAIL");
    cr_assert(strstr(row_of("net-plugin"), "NCCL wrote no log"), "%s", out);
}

Test(gpu_check, bad_usage_is_one_line)
{
    cr_assert_eq(run_capture("scripts/gpu-check.sh --steps pack,nope", out, sizeof(out)), 2);
    cr_assert_str_eq(out,
                     "gpu-check: --steps: no step 'nope' (steps: device,gpu-unit,pack,"
                     "delta-kernel,refit-ipc,refit-vmm,refit-staged,refit-delta,nccl,net-plugin,"
                     "m2n,dtensor,python)\n");
    cr_assert_eq(run_capture("scripts/gpu-check.sh --budget soon", out, sizeof(out)), 2);
    cr_assert_str_eq(out, "gpu-check: --budget needs a number of seconds\n");
}

/* The bundle holds what the check runs and every library it needs beyond glibc, found through
 * RUNPATH alone, and stays under its size. */
Test(gpu_check, the_bundle_finds_its_libraries_by_itself)
{
    if (run_capture("command -v patchelf", out, sizeof(out)) != 0)
        cr_skip_test("patchelf is not installed (make deps installs it)");
    /* --no-make: the suite's make built everything, and another test may run make meanwhile */
    int rc = run_capturef(out, sizeof(out),
                          "BUILD=%s scripts/gpu-bundle.sh --no-make --out %s/b --max-mib 60",
                          build_dir(), dir);
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "gpu-bundle: "), "%s", out);
    rc = run_capturef(out, sizeof(out), "cat %s/b/BUNDLE.txt", dir);
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "\nlib/libcriterion.so.3 "), "%s", out);
    cr_assert(strstr(out, "\nlib/libucp.so.0 "), "%s", out);
    cr_assert(strstr(out, "\nlib/libnccl-net-reshard.so "), "%s", out);
    cr_assert(strstr(out, "\ntest/perf/nccl_net_check "), "%s", out);
    cr_assert(strstr(out, "\nlib/libreshard-m2n.so "), "%s", out);
    cr_assert(strstr(out, "\ntest/perf/m2n_check "), "%s", out);
    cr_assert(strstr(out, "\ntest/perf/delta_dev_bench "), "%s", out);
    cr_assert_null(strstr(out, "\nlib/libc.so.6 "), "glibc stays the image's:\n%s", out);
    /* every dependency resolves inside the bundle (or to glibc) */
    rc =
        run_capturef(out, sizeof(out),
                     "cd %s/b && for f in test/unit bin/reshard_perf test/perf/m2n_check "
                     "lib/libucp.so.0; do ldd $f; "
                     "done | awk '$2 == \"=>\"' | grep -v \"%s/b/\" | grep -v 'libc.so\\|libm.so"
                     "\\|libpthread\\|libdl\\|libresolv\\|librt\\|libgcc_s\\|libstdc++\\|libasan\\|"
                     "libubsan'",
                     dir, dir);
    cr_assert_neq(rc, 0, "libraries from outside the bundle:\n%s", out);
    rc = run_capturef(out, sizeof(out),
                      "%s/b/bin/reshard-plan --src 'shape=8 ranks=0-1 place=S(0)' "
                      "--dst 'shape=8 ranks=2' | tail -1",
                      dir);
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert_str_eq(out, "valid yes\n");
}
