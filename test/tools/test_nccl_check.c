/* SPDX-License-Identifier: Apache-2.0 */
/* nccl_check, the GPU script's NCCL step, run here on the stand-ins of test/fake. */
#include "run_util.h"
#include "cuda/cuda_lib.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

Test(nccl_check, moves_device_memory_through_nccl_on_the_stand_ins, .timeout = 60)
{
    char out[4096];
    const char *b = build_dir();
    int rc = run_capturef(out, sizeof(out),
                          "RESHARD_CUDA_LIB=%s/test/fake/libcuda.so.1 "
                          "RESHARD_NCCL_LIB=%s/test/fake/libnccl.so.2 %s/test/perf/nccl_check 8",
                          b, b, b);
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "nccl_check: 8 MiB through NCCL (RESHARD_EXECUTOR=nccl) in "), "%s", out);
    cr_assert(strstr(out, "#wrong 0\n"), "%s", out);
}

Test(nccl_check, without_a_gpu_stack_it_skips_with_77, .timeout = 60)
{
    char out[4096];
    int rc = run_capturef(out, sizeof(out),
                          "RESHARD_CUDA_LIB=libcuda-not-here.so.1 %s/test/perf/nccl_check 8",
                          build_dir());
    cr_assert_eq(rc, 77, "%s", out);
    cr_assert(strstr(out, "libcuda-not-here.so.1"), "%s", out);
}

Test(device_refit, cumemcreate_destinations_on_the_stand_in, .timeout = 60)
{
    char out[4096];
    const char *b = build_dir();
    int rc = run_capturef(out, sizeof(out),
                          "DEVICE_REFIT_VMM=1 RESHARD_CUDA_LIB=%s/test/fake/libcuda.so.1 "
                          "%s/test/perf/device_refit 4",
                          b, b);
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "8.00 MiB per refit through CUDA IPC: #wrong 0 on every rank"), "%s",
              out);
}

Test(device_refit, four_processes_refit_device_buffers_on_the_stand_in, .timeout = 60)
{
    char out[4096];
    const char *b = build_dir();
    int rc = run_capturef(out, sizeof(out),
                          "RESHARD_CUDA_LIB=%s/test/fake/libcuda.so.1 %s/test/perf/device_refit 4",
                          b, b);
    cr_assert_eq(rc, 0, "%s", out);
    /* Ranks 0 and 1 hold the row halves, in domains {0,1} and {2,3}: every rank gets one half
     * (2 MiB) from its domain peer through CUDA IPC (the stand-in maps the peer's shared
     * memory); rank 2 and 3 get the other over the network. */
    cr_assert(strstr(out, "4 MiB, device to device across 4 processes, 8.00 MiB per refit "
                          "through CUDA IPC: #wrong 0 on every rank"),
              "%s", out);
}

/* Delta refits of device buffers end to end (gpu-check's refit-delta step): 5 % of the f32
 * source changes between refits; the last refit sends its bitmap (1/32 of the bytes) and the
 * changed elements, about 0.08 of the tensor, and every destination holds the new values. A
 * build without nvcc has no kernels, and each refit of device buffers goes in full. */
Test(device_refit, delta_refits_of_device_buffers_on_the_stand_in, .timeout = 60)
{
    char out[4096];
    const char *b = build_dir();
    int rc = run_capturef(out, sizeof(out),
                          "DEVICE_REFIT_CHANGED=5 RESHARD_CUDA_LIB=%s/test/fake/libcuda.so.1 "
                          "%s/test/perf/device_refit 4",
                          b, b);
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "#wrong 0 on every rank"), "%s", out);
    const char *at = strstr(out, "the last refit sent ");
    cr_assert_not_null(at, "%s", out);
    double mib = 0, share = 1;
    cr_assert_eq(
        sscanf(at, "the last refit sent %lf MiB over the network in all (%lf", &mib, &share), 2,
        "%s", out);
    size_t fatbin = 0;
    if (!cuda_fatbin(&fatbin)) { /* no compare-and-compact kernels: each refit goes in full */
        cr_assert(share > 0.999, "without kernels 5%% changed sent %.3f of the tensor:\n%s", share,
                  out);
        return;
    }
    cr_assert(share > 0.05 && share < 0.12, "5%% changed sent %.3f of the tensor:\n%s", share, out);
}

Test(m2n_check, the_m2n_api_moves_device_memory_through_nccl_on_the_stand_ins, .timeout = 120)
{
    char out[4096];
    const char *b = build_dir();
    int rc = run_capturef(out, sizeof(out),
                          "RESHARD_CUDA_LIB=%s/test/fake/libcuda.so.1 "
                          "RESHARD_NCCL_LIB=%s/test/fake/libnccl.so.2 %s/test/perf/m2n_check 2",
                          b, b, b);
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, "m2n_check: 75 reshards through NCCL (2-D 2 MiB, 3-D, 4-D), "), "%s",
              out);
    cr_assert(strstr(out, "#wrong 0, unnamed dtype refused, stream of another context refused\n"),
              "%s", out);
}
