/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Out of memory inside an execution: rank 0 fails its n-th allocation (rs_test_fail_alloc) for
 * n = 1, 2, ... on a fresh plan each time. Every failure must be clean (a status and a message
 * on every rank), and the next execution of the same plan must move every element, since a
 * failure before any byte moves leaves the communicator usable. The sweep ends when the armed
 * execution no longer fails, or at the first failure once bytes move (which breaks the
 * communicator, as it must: then every rank's next execution fails cleanly too).
 */
#include "base/error.h"
#include "plugin/reshard.h"
#include "test/plugin/ranks.h"
#include "test/plugin/side.h"

#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define ROWS   "shape=48x40 dtype=i32 ranks=0-3 mesh=4 place=S(0)"
#define COLS   "shape=48x40 dtype=i32 ranks=0-3 mesh=4 place=S(1)"
#define HALVES "shape=48x40 dtype=i32 ranks=0-1 mesh=2 place=S(0)"
#define WHOLE  "shape=48x40 dtype=i32 ranks=0-3 place=R"

#define MAX_N  400 /* allocations of one execution, at most */
#define STREAK 3   /* armed executions in a row that succeed: the hook is past them all */

/* What rank 0 saw, for the test process (a shared page: the ranks are forked). */
struct sweep {
    int clean;  /* armed executions that failed before any byte moved */
    int ended;  /* the n the sweep stopped at */
    int broken; /* it stopped at a failure in flight */
    int swept;  /* it stopped because the armed execution succeeded STREAK times */
};

static struct sweep *seen;
static const char *src_spec, *dst_spec;
static reshard_algo_t algo;
static int on_device;

static void *fake(void)
{
    static char path[512];
    const char *b = getenv("RESHARD_BUILD");
    snprintf(path, sizeof(path), "%s/test/fake/libcuda.so.1", b && *b ? b : "build");
    void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        fprintf(stderr, "%s: %s (build it first)\n", path, dlerror());
        abort();
    }
    return h;
}

/* The stand-in driver's device memory (the host can read it), holding a copy of host. */
static void *device_copy(const void *host, size_t n)
{
    int (*alloc)(uint64_t *, size_t) = (int (*)(uint64_t *, size_t))dlsym(fake(), "cuMemAlloc_v2");
    uint64_t p = 0;
    if (!n)
        return NULL;
    if (alloc(&p, n))
        abort();
    memcpy((void *)(uintptr_t)p, host, n);
    return (void *)(uintptr_t)p;
}

static void device_free(void *p)
{
    if (p)
        ((int (*)(uint64_t))dlsym(fake(), "cuMemFree_v2"))((uint64_t)(uintptr_t)p);
}

static reshard_status_t open_side(struct side *x, reshard_comm_t *comm, int rank)
{
    memset(x, 0, sizeof(*x));
    x->src = parse(src_spec);
    x->dst = parse(dst_spec);
    reshard_tensor_t t = {"w", x->src, x->dst};
    reshard_layout_shard_bytes(x->src, rank, &x->b.src_bytes);
    reshard_layout_shard_bytes(x->dst, rank, &x->b.dst_bytes);
    x->s = calloc(1, x->b.src_bytes + 1);
    x->d = calloc(1, x->b.dst_bytes + 1);
    fill(x->src, rank, x->s);
    x->b.src = x->b.src_bytes ? x->s : NULL;
    x->b.dst = x->b.dst_bytes ? x->d : NULL;
    if (on_device) {
        x->b.src = device_copy(x->s, x->b.src_bytes);
        x->b.dst = device_copy(x->d, x->b.dst_bytes);
        x->b.mem = RESHARD_MEM_CUDA;
    }
    reshard_plan_config_t c = RESHARD_PLAN_CONFIG_INIT;
    c.algo = algo;
    return reshard_comm_plan_create(comm, &t, 1, &c, &x->plan);
}

static void close_side(struct side *x)
{
    if (on_device) {
        device_free((void *)x->b.src);
        device_free(x->b.dst);
    }
    side_close(x);
}

/* One execution into a zeroed destination, every element checked. */
static reshard_status_t refit_once(struct side *x, int rank)
{
    if (x->b.dst)
        memset(x->b.dst, 0, x->b.dst_bytes);
    reshard_status_t st = reshard_plan_execute(x->plan, &x->b);
    if (st == RESHARD_OK && x->b.dst && count_wrong(x->dst, rank, x->b.dst))
        st = rs_error(RESHARD_ERR_INTERNAL, "rank %d: wrong data after a failed execution", rank);
    return st;
}

static reshard_status_t sweep_allocations(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    int streak = 0;
    for (int n = 1; n <= MAX_N; n++) {
        struct side a;
        reshard_status_t st = open_side(&a, comm, rank);
        if (st != RESHARD_OK)
            return st;
        if (rank == 0)
            rs_test_fail_alloc(n);
        reshard_status_t armed = reshard_plan_execute(a.plan, &a.b);
        rs_test_fail_alloc(0);
        char why[256];
        snprintf(why, sizeof(why), "%s", reshard_last_error());
        if (armed != RESHARD_OK && !why[0])
            st = rs_error(RESHARD_ERR_INTERNAL, "rank %d: n = %d failed with no message", rank, n);
        if (st == RESHARD_OK && rank == 0 && armed != RESHARD_OK && armed != RESHARD_ERR_NO_MEMORY)
            st = rs_error(RESHARD_ERR_INTERNAL, "rank 0: n = %d: %s, not out of memory: %s", n,
                          reshard_strerror(armed), why);
        reshard_status_t next = st == RESHARD_OK ? refit_once(&a, rank) : st;
        close_side(&a);
        if (st != RESHARD_OK)
            return st;
        if (next != RESHARD_OK) { /* the communicator broke: fine only after a failure */
            if (rank == 0 && armed == RESHARD_OK)
                return rs_error(next, "rank 0: n = %d succeeded, the next execution did not: %s", n,
                                reshard_last_error());
            if (rank == 0)
                *seen = (struct sweep){.clean = seen->clean, .ended = n, .broken = 1};
            return reshard_last_error()[0] ? RESHARD_OK
                                           : rs_error(RESHARD_ERR_INTERNAL, "no message");
        }
        if (rank == 0 && armed != RESHARD_OK)
            seen->clean++;
        streak = armed == RESHARD_OK ? streak + 1 : 0;
        if (streak == STREAK) {
            if (rank == 0)
                *seen = (struct sweep){.clean = seen->clean, .ended = n, .swept = 1};
            return RESHARD_OK;
        }
    }
    return rs_error(RESHARD_ERR_INTERNAL, "rank %d: still failing after %d allocations", rank,
                    MAX_N);
}

static void set_env(void)
{
    setenv("RESHARD_DOMAIN_SIZE", "2", 1);
    setenv("RESHARD_TIMEOUT", "10", 1);
    setenv("UCX_LOG_LEVEL", "error", 1);
    char path[512];
    const char *b = getenv("RESHARD_BUILD");
    snprintf(path, sizeof(path), "%s/test/fake/libcuda.so.1", b && *b ? b : "build");
    setenv("RESHARD_CUDA_LIB", path, 1);
    seen = mmap(NULL, sizeof(*seen), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(seen, MAP_FAILED);
    *seen = (struct sweep){0};
}

TestSuite(exec_alloc, .init = set_env, .timeout = 120);

/* Runs the sweep and checks that it got somewhere: at least `min_clean` allocations of the
 * execution failed before any byte moved, each followed by a good execution. */
static void sweep(const char *src, const char *dst, reshard_algo_t a, int device, int min_clean)
{
    src_spec = src;
    dst_spec = dst;
    algo = a;
    on_device = device;
    all_ok(run_ranks(4, sweep_allocations), 4);
    cr_log_info("%d clean failures, ended at n = %d (%s)", seen->clean, seen->ended,
                seen->broken ? "a failure in flight" : "past every allocation");
    cr_assert(seen->broken || seen->swept, "the sweep did not end");
    cr_assert_geq(seen->clean, min_clean, "only %d clean failures (ended at n = %d, %s)",
                  seen->clean, seen->ended, seen->broken ? "broken" : "swept");
}

Test(exec_alloc, every_allocation_before_bytes_move_fails_cleanly_on_host_buffers)
{
    sweep(ROWS, COLS, RESHARD_ALGO_RESHARD, 0, 10);
}

/* The broadcast baseline's whole-tensor buffers: one made, another not, the next run makes
 * the rest. */
Test(exec_alloc, whole_tensor_buffers_are_made_again_after_a_failed_allocation)
{
    sweep(HALVES, WHOLE, RESHARD_ALGO_BCAST, 0, 12);
}

/* Device buffers: the host shadows and the CUDA IPC export tables are made all or none, so the
 * run after a failed one finds them whole. */
Test(exec_alloc, shadows_and_ipc_exports_survive_a_failed_allocation)
{
    sweep(ROWS, COLS, RESHARD_ALGO_RESHARD, 1, 20);
}
