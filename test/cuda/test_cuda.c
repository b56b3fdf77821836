/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA driver loader: without a driver (hidden here through RESHARD_CUDA_LIB, or simply
 * absent) everything says why and host memory still works; with a GPU the memory kinds are
 * told apart. GPU cases skip with the loader's reason where there is none.
 */
#include "base/error.h"
#include "cuda/cuda_lib.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

Test(cuda, a_hidden_driver_is_a_clear_unavailable_status)
{
    setenv("RESHARD_CUDA_LIB", "libcuda-not-here.so.1", 1);
    cr_assert_null(cuda_lib());
    cr_assert(strstr(rs_error_message(), "cuda: no driver: libcuda-not-here.so.1"), "%s",
              rs_error_message());
}

Test(cuda, a_library_that_is_not_the_driver_is_named)
{
    setenv("RESHARD_CUDA_LIB", "libjansson.so.4", 1); /* loads, but has no cuInit */
    cr_assert_null(cuda_lib());
    cr_assert(strstr(rs_error_message(), "cuda: libjansson.so.4 lacks cuInit"), "%s",
              rs_error_message());
}

Test(cuda, without_a_driver_host_memory_is_host_and_the_error_is_untouched)
{
    setenv("RESHARD_CUDA_LIB", "libcuda-not-here.so.1", 1);
    rs_error(RESHARD_ERR_TIMEOUT, "an earlier failure");
    char stack[16];
    void *heap = malloc(16);
    cr_assert_eq(cuda_mem_kind(stack), CUDA_MEM_HOST);
    cr_assert_eq(cuda_mem_kind(heap), CUDA_MEM_HOST);
    cr_assert_eq(cuda_mem_kind(NULL), CUDA_MEM_HOST);
    cr_assert_str_eq(rs_error_message(), "an earlier failure", "asking must not fail");
    cr_assert_str_eq(cuda_mem_kind_name(CUDA_MEM_DEVICE), "device");
    free(heap);
}

/* ---- with a GPU ---- */

static const struct cuda_fns *gpu(void)
{
    const struct cuda_fns *f = cuda_lib();
    if (!f)
        cr_skip_test("no CUDA device (%s)", rs_error_message());
    cr_assert_eq(cuda_current_context(), RESHARD_OK, "%s", rs_error_message());
    return f;
}

Test(gpu, device_and_host_memory_are_told_apart)
{
    const struct cuda_fns *f = gpu();
    cu_deviceptr d = 0;
    cr_assert_eq(f->mem_alloc(&d, 4096), CU_SUCCESS);
    void *h = malloc(64);
    cr_assert_eq(cuda_mem_kind((void *)(uintptr_t)d), CUDA_MEM_DEVICE);
    cr_assert_eq(cuda_mem_kind(h), CUDA_MEM_HOST);
    int pattern[16], back[16] = {0};
    for (int i = 0; i < 16; i++)
        pattern[i] = i * 7;
    cr_assert_eq(f->memcpy_htod(d, pattern, sizeof(pattern)), CU_SUCCESS);
    cr_assert_eq(f->memcpy_dtoh(back, d, sizeof(back)), CU_SUCCESS);
    cr_assert_arr_eq(back, pattern, sizeof(back));
    f->mem_free(d);
    free(h);
}
