/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Delta refits of device buffers on the stand-in libcuda (docs/delta.md): sources compared and
 * compacted by the kernels (their emulation through cuda/delta_desc.h), destinations applied on
 * the device. On random layout pairs with device buffers on random ranks (host on the others),
 * refit after refit with a random share of elements changed, uniformly or in runs, and random
 * ranks given new device destinations: every destination equals the source exactly. What
 * crosses the network, and what the sender copies off its GPU, shrinks with what changed; a
 * device snapshot that cannot be allocated leaves its tensor in full.
 */
#include "ranks.h"
#include "base/error.h"
#include "cuda/cuda_lib.h"
#include "planner/spec.h"
#include "plugin/reshard.h"
#include "test/planner/oracle.h"

#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define CASES  10
#define REFITS 6

static char src_spec[512], dst_spec[512];
static uint64_t case_seed;

static uint64_t mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15u;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

static void *fake_fn(const char *name)
{
    void *h = dlopen(getenv("RESHARD_CUDA_LIB"), RTLD_NOW | RTLD_GLOBAL);
    return h ? dlsym(h, name) : NULL;
}

static void use_fake_cuda(void)
{
    size_t n;
    if (!cuda_fatbin(&n))
        cr_skip_test("this build had no nvcc: no delta kernels");
    char path[512];
    const char *b = getenv("RESHARD_BUILD");
    snprintf(path, sizeof(path), "%s/test/fake/libcuda.so.1", b && *b ? b : "build");
    setenv("RESHARD_CUDA_LIB", path, 1);
}

/* Refit k's share of changed elements (percent), and whether they come in runs of 64. */
static unsigned pct_of(int k)
{
    static const unsigned pcts[] = {0, 1, 5, 30, 100};
    return k == 0 ? 100 : pcts[mix(case_seed ^ (uint64_t)k * 77) % 5];
}

static int changed(int64_t g, int k)
{
    int runs = mix(case_seed + (uint64_t)k) & 1;
    uint64_t h = mix(case_seed ^ ((uint64_t)(runs ? g / 64 : g) << 8) ^ (uint64_t)k);
    return h % 100 < pct_of(k);
}

/* The value of element g after refit k: that of the last refit that changed it. */
static uint64_t value(int64_t g, int k)
{
    int j = k;
    while (j > 0 && !changed(g, j))
        j--;
    return mix((uint64_t)g * 1000003u + (uint64_t)j);
}

/* Writes (put) or counts wrong elements of the rank's shard of l in buf, for refit k. */
static void each_element(const reshard_layout_t *l, int rank, char *buf, int put, int k, int *wrong)
{
    reshard_layout_info_t info;
    int64_t shape[8], numel;
    reshard_layout_info(l, &info);
    reshard_layout_shard_shape(l, rank, shape, &numel);
    if (!numel)
        return;
    int64_t *index[8];
    for (int d = 0; d < info.ndim; d++) {
        index[d] = malloc((size_t)shape[d] * sizeof(int64_t));
        reshard_layout_shard_index(l, rank, d, index[d]);
    }
    int64_t at[8] = {0};
    for (int64_t i = 0; i < numel; i++) {
        int64_t global = 0;
        for (int d = 0; d < info.ndim; d++)
            global = global * info.shape[d] + index[d][at[d]];
        uint64_t v = value(global, k), got = 0;
        char *p = buf + (size_t)i * info.elem_size;
        if (put) {
            memcpy(p, &v, info.elem_size);
        } else {
            memcpy(&got, p, info.elem_size);
            if (info.elem_size < 8)
                v &= (UINT64_C(1) << (8 * info.elem_size)) - 1;
            *wrong += got != v;
        }
        for (int d = info.ndim - 1; d >= 0 && ++at[d] == shape[d]; d--)
            at[d] = 0;
    }
    for (int d = 0; d < info.ndim; d++)
        free(index[d]);
}

static cu_deviceptr dev_alloc(size_t n)
{
    cu_deviceptr p = 0;
    if (n && cuda_lib()->mem_alloc(&p, n) != CU_SUCCESS)
        p = 0;
    return p;
}

static reshard_status_t refit_random(int rank, int size, reshard_comm_t *comm)
{
    /* Every rank asks (the same machine: the same answer), before anything collective. */
    const struct cuda_fns *f = cuda_lib();
    if (!f || cuda_current_context() != RESHARD_OK) {
        char why[200];
        snprintf(why, sizeof(why), "%s", rs_error_message());
        return rs_error(RESHARD_ERR_UNAVAILABLE, "rank %d: no CUDA driver: %s", rank, why);
    }
    reshard_layout_t *src = NULL, *dst = NULL;
    reshard_layout_parse(src_spec, size, &src);
    reshard_layout_parse(dst_spec, size, &dst);
    reshard_tensor_t t = {"w", src, dst};
    reshard_plan_config_t cfg = RESHARD_PLAN_CONFIG_INIT;
    cfg.delta = 1;
    reshard_plan_t *plan = NULL;
    reshard_status_t st = reshard_comm_plan_create(comm, &t, 1, &cfg, &plan);
    size_t sb = 0, db = 0;
    reshard_layout_shard_bytes(src, rank, &sb);
    reshard_layout_shard_bytes(dst, rank, &db);
    /* Device buffers on most ranks; host buffers on some (both kinds meet in one refit). */
    int on_dev = mix(case_seed * 13 + (uint64_t)rank) % 4 != 0;
    char *s = calloc(1, sb + 1), *d = calloc(1, db + 1);
    cu_deviceptr ds = on_dev ? dev_alloc(sb) : 0, dd = on_dev ? dev_alloc(db) : 0;
    int wrong = 0;
    for (int k = 0; k < REFITS && st == RESHARD_OK && !wrong; k++) {
        if (k && mix(case_seed * 31 + (uint64_t)rank * 7 + (uint64_t)k) % 5 == 0) {
            /* New destination buffers (made before the old go): their bytes are unknown. */
            memset(d, 0xa5, db);
            if (on_dev && db) {
                cu_deviceptr fresh = dev_alloc(db);
                f->memcpy_htod(fresh, d, db);
                f->mem_free(dd);
                dd = fresh;
            } else {
                char *fresh = malloc(db + 1);
                memcpy(fresh, d, db + 1);
                free(d);
                d = fresh;
            }
        }
        each_element(src, rank, s, 1, k, &wrong);
        reshard_buffers_t b = {sb ? s : NULL, sb, db ? d : NULL, db, RESHARD_MEM_HOST};
        if (on_dev && (sb || db)) { /* a rank with nothing declares nothing */
            if (sb)
                f->memcpy_htod(ds, s, sb);
            b = (reshard_buffers_t){sb ? (void *)(uintptr_t)ds : NULL, sb,
                                    db ? (void *)(uintptr_t)dd : NULL, db, RESHARD_MEM_CUDA};
        }
        st = reshard_plan_execute(plan, &b);
        if (st == RESHARD_OK && on_dev && db)
            f->memcpy_dtoh(d, dd, db);
        if (st == RESHARD_OK)
            each_element(dst, rank, d, 0, k, &wrong);
        if (wrong)
            fprintf(stderr, "rank %d (%s buffers): refit %d (%u%% changed): %d wrong element(s)\n",
                    rank, on_dev ? "device" : "host", k, pct_of(k), wrong);
    }
    if (st == RESHARD_OK && wrong)
        st = rs_error(RESHARD_ERR_INTERNAL, "rank %d: %d wrong element(s)", rank, wrong);
    reshard_plan_destroy(plan);
    if (ds)
        f->mem_free(ds);
    if (dd)
        f->mem_free(dd);
    free(s);
    free(d);
    reshard_layout_destroy(src);
    reshard_layout_destroy(dst);
    return st;
}

static int draw(uint64_t *seed)
{
    for (;; (*seed)++) {
        struct random_case c;
        random_case_make(*seed, &c);
        int world = c.world;
        spec_format(&c.src, src_spec, sizeof(src_spec));
        spec_format(&c.dst, dst_spec, sizeof(dst_spec));
        random_case_free(&c);
        if (world <= MAX_RANKS)
            return world;
    }
}

static void setup(void)
{
    setenv("RESHARD_DOMAIN_SIZE", "1", 1);
    setenv("RESHARD_TIMEOUT", "30", 1);
    setenv("UCX_LOG_LEVEL", "error", 1);
    setenv("RESHARD_CHUNK_BYTES", "4096", 1); /* many chunks even on small shards */
    setenv("RESHARD_COALESCE_BYTES", "0", 1);
}

TestSuite(delta_dev, .init = setup, .timeout = 240);

/* cases random cases from seed on (RESHARD_TEST_SEED: that one only). may_skip: without a
 * driver the test skips (with a GPU, gpu-check's gpu-unit step; else the stand-in's). */
static void random_cases(uint64_t seed, int cases, int may_skip)
{
    const char *env = getenv("RESHARD_TEST_SEED");
    seed = env ? strtoull(env, NULL, 0) : seed;
    for (int k = 0; k < (env ? 1 : cases); k++, seed++) {
        int world = draw(&seed);
        case_seed = seed;
        setenv("RESHARD_DOMAIN_SIZE", k % 3 == 2 ? "2" : "1", 1);
        struct outcome *o = run_ranks(world, refit_random);
        if (may_skip && o[0].status == RESHARD_ERR_UNAVAILABLE)
            cr_skip_test("%s", o[0].msg);
        for (int r = 0; r < world; r++)
            cr_assert_eq(o[r].status, RESHARD_OK,
                         "seed %llu (RESHARD_TEST_SEED replays it), world %d, rank %d: %s\n"
                         "  src: %s\n  dst: %s",
                         (unsigned long long)seed, world, r, o[r].msg, src_spec, dst_spec);
    }
}

Test(delta_dev, device_buffers_equal_the_source_after_every_refit)
{
    use_fake_cuda();
    random_cases(9100, CASES, 0);
}

/* With a GPU (gpu-check's gpu-unit step): the kernels themselves inside the executor, the same
 * random refits on device buffers. */
Test(gpu, delta_refits_on_device_buffers_equal_the_source, .timeout = 240)
{
    size_t n;
    if (!cuda_fatbin(&n))
        cr_skip_test("this build had no nvcc: no delta kernels");
    setup();
    random_cases(9700, CASES, 1);
}

/* Small chunks packed into one message per peer (RESHARD_COALESCE_BYTES): they travel dense,
 * from the source's shadow into the destination's, beside the encoded chunks of the same
 * transfers. */
Test(delta_dev, device_buffers_with_packed_small_chunks_equal_the_source_too)
{
    use_fake_cuda();
    setenv("RESHARD_COALESCE_BYTES", "65536", 1);
    random_cases(9500, CASES / 2, 0);
}

/* Device buffers registered for GPUDirect (the stand-in's are host memory): encoded chunks
 * still go through the compare and the device landing, the others straight off the wire. */
Test(delta_dev, device_buffers_registered_for_gpudirect_equal_the_source_too)
{
    use_fake_cuda();
    setenv("RESHARD_TEST_DEVICE_AS_HOST", "1", 1);
    random_cases(9300, CASES / 2, 0);
}

/* Two domains of one rank: rank 0's device source, rank 1's device destination. */
#define BIG_N (1 << 18)

struct two {
    uint64_t net[3], dtoh[3]; /* per refit: rank 0's network bytes out, bytes off its GPU */
    uint64_t snap, snap_dev;  /* rank 0's stats after them: its snapshot, and on the device */
};
static struct two *seen;

static reshard_status_t three_refits(int rank, int size, reshard_comm_t *comm, unsigned pct)
{
    reshard_layout_t *src = NULL, *dst = NULL;
    char spec[96];
    snprintf(spec, sizeof(spec), "shape=%d dtype=bf16 ranks=0 place=R", BIG_N);
    reshard_layout_parse(spec, size, &src);
    snprintf(spec, sizeof(spec), "shape=%d dtype=bf16 ranks=1 place=R", BIG_N);
    reshard_layout_parse(spec, size, &dst);
    reshard_tensor_t t = {"w", src, dst};
    reshard_plan_config_t cfg = RESHARD_PLAN_CONFIG_INIT;
    cfg.delta = 1;
    reshard_plan_t *plan = NULL;
    reshard_status_t st = reshard_comm_plan_create(comm, &t, 1, &cfg, &plan);
    const struct cuda_fns *f = cuda_lib();
    if (!f || cuda_current_context() != RESHARD_OK)
        return rs_error(RESHARD_ERR_UNAVAILABLE, "rank %d: no stand-in driver", rank);
    unsigned long long (*dtoh)(void) =
        (unsigned long long (*)(void))fake_fn("fake_cuda_dtoh_bytes");
    size_t n = BIG_N * 2;
    uint16_t *h = calloc(BIG_N, 2);
    cu_deviceptr p = dev_alloc(n);
    for (size_t i = 0; i < BIG_N; i++)
        h[i] = (uint16_t)mix(i);
    reshard_buffers_t b = {rank == 0 ? (void *)(uintptr_t)p : NULL, rank == 0 ? n : 0,
                           rank == 1 ? (void *)(uintptr_t)p : NULL, rank == 1 ? n : 0,
                           RESHARD_MEM_CUDA};
    for (int k = 0; k < 3 && st == RESHARD_OK; k++) {
        for (size_t i = 0; k && i < BIG_N; i++) /* refit 1: pct % changed; refit 2: none */
            if (k == 1 && mix(i * 3 + 1) % 100 < pct)
                h[i] ^= 0x100;
        if (rank == 0)
            f->memcpy_htod(p, h, n);
        reshard_comm_counters_t c0, c1;
        reshard_comm_counters(comm, &c0);
        unsigned long long d0 = dtoh();
        st = reshard_plan_execute(plan, &b);
        reshard_comm_counters(comm, &c1);
        if (rank == 0) {
            seen->net[k] = c1.net_out - c0.net_out;
            seen->dtoh[k] = dtoh() - d0;
        }
    }
    reshard_plan_stats_t ps;
    reshard_rank_stats_t rs[2];
    if (st == RESHARD_OK && rank == 0 && reshard_plan_stats(plan, &ps, rs) == RESHARD_OK) {
        seen->snap = rs[0].delta_snapshot;
        seen->snap_dev = rs[0].delta_snapshot_device;
    }
    if (st == RESHARD_OK && rank == 1) {
        uint16_t *got = malloc(n);
        f->memcpy_dtoh(got, p, n);
        for (size_t i = 0; i < BIG_N && st == RESHARD_OK; i++)
            if (got[i] != h[i])
                st = rs_error(RESHARD_ERR_INTERNAL, "element %zu is 0x%04x, not 0x%04x", i, got[i],
                              h[i]);
        free(got);
    }
    f->mem_free(p);
    free(h);
    reshard_plan_destroy(plan);
    reshard_layout_destroy(src);
    reshard_layout_destroy(dst);
    return st;
}

static unsigned the_pct;
static reshard_status_t refits_at_pct(int rank, int size, reshard_comm_t *comm)
{
    return three_refits(rank, size, comm, the_pct);
}

static void run_at(unsigned pct)
{
    the_pct = pct;
    memset(seen, 0, sizeof(*seen));
    all_ok(run_ranks(2, refits_at_pct), 2);
}

static void shared_seen(void)
{
    seen = mmap(NULL, sizeof(*seen), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert(seen != MAP_FAILED);
}

/* 5 % changed: under 15 % of the full refit crosses the network and leaves the sender's GPU;
 * nothing changed: a header per chunk; all changed: no more than the full refit and 2 %. */
static void check_bytes(unsigned pct)
{
    use_fake_cuda();
    setenv("RESHARD_CHUNK_BYTES", "65536", 1);
    shared_seen();
    run_at(pct);
    uint64_t full = seen->net[0], part = seen->net[1], none = seen->net[2];
    cr_assert_eq(seen->snap, (uint64_t)BIG_N * 2, "the plan's stats: a snapshot of %llu bytes",
                 (unsigned long long)seen->snap);
    cr_assert_eq(seen->snap_dev, seen->snap, "the plan's stats: %llu bytes of it on the device",
                 (unsigned long long)seen->snap_dev);
    cr_assert_geq(full, (uint64_t)BIG_N * 2, "the first refit is in full: %llu",
                  (unsigned long long)full);
    cr_assert_leq(none * 100, full, "nothing changed, %llu of %llu bytes sent",
                  (unsigned long long)none, (unsigned long long)full);
    cr_assert_leq(seen->dtoh[2] * 100, full, "nothing changed, %llu bytes off the GPU",
                  (unsigned long long)seen->dtoh[2]);
    if (pct == 5) {
        cr_assert_leq(part * 100, full * 15, "5%% changed: %llu of %llu bytes sent",
                      (unsigned long long)part, (unsigned long long)full);
        cr_assert_leq(seen->dtoh[1] * 100, full * 15,
                      "5%% changed: %llu bytes off the sender's GPU (the source staged?)",
                      (unsigned long long)seen->dtoh[1]);
    } else {
        cr_assert_leq(part * 100, full * 102, "all changed: %llu of %llu bytes sent",
                      (unsigned long long)part, (unsigned long long)full);
    }
}

Test(delta_dev, five_percent_changed_on_device_sends_under_fifteen_percent)
{
    check_bytes(5);
}

Test(delta_dev, all_changed_on_device_sends_no_more_than_a_full_refit)
{
    check_bytes(100);
}

/* With the buffers registered for GPUDirect, encoded chunks still go through the compare rather
 * than straight off the device (which would send them dense every time). */
Test(delta_dev, gpudirect_registrations_do_not_bypass_the_compare)
{
    setenv("RESHARD_TEST_DEVICE_AS_HOST", "1", 1);
    check_bytes(5);
}

static int fail_alloc_at; /* rank 0's stand-in fails its cuMemAlloc from this call on */

static void arm_alloc(int rank)
{
    if (rank == 0 && fail_alloc_at) {
        char v[32];
        snprintf(v, sizeof(v), "cuMemAlloc_v2:%d", fail_alloc_at);
        setenv("FAKE_CUDA_FAIL", v, 1);
    }
}

/* Rank 0's allocations: its source (1), the delta scratch (2), the snapshot (3). Without the
 * snapshot every refit is in full, and exact; without the scratch too. */
Test(delta_dev, a_device_snapshot_that_cannot_be_allocated_leaves_its_tensor_in_full)
{
    use_fake_cuda();
    setenv("RESHARD_CHUNK_BYTES", "65536", 1);
    shared_seen();
    rank_setup = arm_alloc;
    for (fail_alloc_at = 3; fail_alloc_at >= 2; fail_alloc_at--) {
        run_at(5);
        cr_assert_geq(seen->net[1], (uint64_t)BIG_N * 2,
                      "cuMemAlloc failing from call %d: the second refit sent %llu bytes",
                      fail_alloc_at, (unsigned long long)seen->net[1]);
        cr_assert_eq(seen->snap_dev, 0, "no snapshot on the device, yet the stats say %llu",
                     (unsigned long long)seen->snap_dev);
    }
    rank_setup = NULL;
    fail_alloc_at = 0;
    run_at(5); /* and with the allocations, it is a delta again */
    cr_assert_lt(seen->net[1] * 100, seen->net[0] * 15);
}
