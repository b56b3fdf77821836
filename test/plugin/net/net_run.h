/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Running the conformance driver (test/plugin/net/net_driver.c) from the plugin's suites: its
 * output, the environment it runs in, and what every run must not show (a sanitizer's report).
 */
#ifndef RS_TEST_NET_RUN_H
#define RS_TEST_NET_RUN_H

#include "test/tools/run_util.h"

#define NET_OUT_MAX (1 << 20)
/* UCX_MEM_EVENTS=no: v8 to v10 never finalize, so UCX's memory hooks are still in place when
 * the driver exits, and under ASAN=1 LeakSanitizer's exit-time scan crashes on them. The TCP
 * path registers nothing that the hooks would keep track of. */
#define NET_DRIVER_ENV "UCX_MEM_EVENTS=no LSAN_OPTIONS=exitcode=0" /* net_no_sanitizer_reports */
#define NET_LOOPBACK   NET_DRIVER_ENV " RESHARD_NET_ALLOW_LO=1 RESHARD_NET_DEVICES=lo"
#define NET_NVERSIONS  5
/* GPUDirect on the stand-in driver (test/fake/fake_cuda.c), whose device memory is host memory:
 * the plugin registers it as such, and offers host, CUDA and dma-buf memory (ptrSupport 7). */
#define NET_GDR_ENV_FMT                                                                            \
    "RESHARD_TEST_DEVICE_AS_HOST=1 FAKE_CUDA_MEMORY_TYPE=1 NET_EXPECT_PTR=7 "                      \
    "RESHARD_CUDA_LIB=%s/test/fake/libcuda.so.1"

/* The last run's stdout and stderr. */
extern char net_out[NET_OUT_MAX];
extern const int net_versions[NET_NVERSIONS]; /* 8 to 12 */

#define net_run(...) run_capturef(net_out, sizeof(net_out), __VA_ARGS__)

/* Lines of net_out that start with prefix. */
int net_count_lines(const char *prefix);
/* Under ASAN=1 the driver and the plugin are instrumented: their reports land in net_out, and
 * none may be there (a leak counts when its stack reaches the project's code, or code that was
 * unloaded: the plugin's, after dlclose). */
void net_no_sanitizer_reports(void);
/* The driver's case `name` on version v over loopback, env (variables) added; its status. */
int net_case(int v, const char *env, const char *name);
/* The case on every version: each run must pass and print every line of `expect`. */
void net_each_version(const char *env, const char *name, const char *const *expect);

#endif
