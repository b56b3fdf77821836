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
#include "side.h"
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

static uint64_t value_at(int64_t g, const void *refit)
{
    return value(g, *(const int *)refit);
}

/* Writes (put) or counts wrong elements of the rank's shard of l in buf, for refit k. */
static void each_element(const reshard_layout_t *l, int rank, char *buf, int put, int k, int *wrong)
{
    shard_values(l, rank, buf, put, value_at, &k, wrong);
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

#define MAX_REFITS 10
struct two {
    /* per refit: rank 0's network bytes out, bytes off its GPU, delta kernels it launched */
    uint64_t net[MAX_REFITS], dtoh[MAX_REFITS], launches[MAX_REFITS];
    uint64_t snap, snap_dev; /* rank 0's stats after them: its snapshot, and on the device */
};
static struct two *seen;

/* Refit 0 in full, refit 1 with pct % changed, the rest (up to nrefits) with none. */
static reshard_status_t refits(int rank, int size, reshard_comm_t *comm, unsigned pct, int nrefits)
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
    int (*launches)(void) = (int (*)(void))fake_fn("fake_cuda_delta_launches");
    size_t n = BIG_N * 2;
    uint16_t *h = calloc(BIG_N, 2);
    cu_deviceptr p = dev_alloc(n);
    for (size_t i = 0; i < BIG_N; i++)
        h[i] = (uint16_t)mix(i);
    reshard_buffers_t b = {rank == 0 ? (void *)(uintptr_t)p : NULL, rank == 0 ? n : 0,
                           rank == 1 ? (void *)(uintptr_t)p : NULL, rank == 1 ? n : 0,
                           RESHARD_MEM_CUDA};
    for (int k = 0; k < nrefits && st == RESHARD_OK; k++) {
        for (size_t i = 0; k && i < BIG_N; i++) /* refit 1: pct % changed; refit 2: none */
            if (k == 1 && mix(i * 3 + 1) % 100 < pct)
                h[i] ^= 0x100;
        if (rank == 0)
            f->memcpy_htod(p, h, n);
        reshard_comm_counters_t c0, c1;
        reshard_comm_counters(comm, &c0);
        unsigned long long d0 = dtoh();
        int l0 = launches();
        st = reshard_plan_execute(plan, &b);
        reshard_comm_counters(comm, &c1);
        if (rank == 0) {
            seen->net[k] = c1.net_out - c0.net_out;
            seen->dtoh[k] = dtoh() - d0;
            seen->launches[k] = (uint64_t)(launches() - l0);
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
static int the_refits = 3;
static reshard_status_t refits_at_pct(int rank, int size, reshard_comm_t *comm)
{
    return refits(rank, size, comm, the_pct, the_refits);
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
    the_refits = 3;
    run_at(pct);
    uint64_t full = seen->net[0], part = seen->net[1], none = seen->net[2];
    cr_assert_eq(seen->snap, (uint64_t)BIG_N * 2, "the plan's stats: a snapshot of %llu bytes",
                 (unsigned long long)seen->snap);
    cr_assert_eq(seen->snap_dev, seen->snap, "the plan's stats: %llu bytes of it on the device",
                 (unsigned long long)seen->snap_dev);
    cr_assert_geq(full, (uint64_t)BIG_N * 2, "the first refit is in full: %llu",
                  (unsigned long long)full);
    if (pct == 5) {
        cr_assert_leq(none * 100, full, "nothing changed, %llu of %llu bytes sent",
                      (unsigned long long)none, (unsigned long long)full);
        cr_assert_leq(seen->dtoh[2] * 100, full, "nothing changed, %llu bytes off the GPU",
                      (unsigned long long)seen->dtoh[2]);
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

/* Chunks of a device source that travelled dense twice in a row (the first refit, then all
 * changed) go on dense without the compare kernels, as host ones do (docs/delta.md: both ends
 * count the streak alike, or the receiver would refuse an encoded chunk), until the 8th refit
 * probes again; with nothing changed since, deltas are back there. */
Test(delta_dev, a_device_chunk_changed_whole_goes_dense_without_a_compare_then_back_to_deltas)
{
    use_fake_cuda();
    setenv("RESHARD_CHUNK_BYTES", "65536", 1);
    shared_seen();
    the_refits = MAX_REFITS;
    run_at(100);
    the_refits = 3;
    uint64_t full = seen->net[0];
    cr_assert_gt(seen->launches[1], 0, "the all-changed refit is compared on the device");
    for (int k = 2; k < 8; k++) {
        cr_assert_geq(seen->net[k], full, "refit %d (a dense streak) sent %llu of %llu bytes", k,
                      (unsigned long long)seen->net[k], (unsigned long long)full);
        cr_assert_eq(seen->launches[k], 0, "refit %d (a dense streak) launched %llu kernels", k,
                     (unsigned long long)seen->launches[k]);
    }
    for (int k = 8; k < MAX_REFITS; k++)
        cr_assert_leq(seen->net[k] * 100, full, "refit %d (nothing changed) sent %llu of %llu", k,
                      (unsigned long long)seen->net[k], (unsigned long long)full);
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

/* Three ranks, two bf16 tensors: rank 0's device sources, ranks 1 and 2 each a device
 * destination of half of each. Refit 0 sets every element, each later one changes 5 %. */
#define NEW_N      (1 << 18)
#define NEW_REFITS 4
#define NEW_AT     2 /* before this refit, rank 1 gets a new device buffer for "a" */

struct new_run {
    uint64_t in[3][NEW_REFITS]; /* net bytes in, per rank and refit */
    int wrong[3][NEW_REFITS];   /* device elements that differ from the source after each refit */
};
static struct new_run *nr;

static reshard_status_t new_buffer_refits(int rank, int size, reshard_comm_t *comm)
{
    const struct cuda_fns *f = cuda_lib();
    if (!f || cuda_current_context() != RESHARD_OK)
        return rs_error(RESHARD_ERR_UNAVAILABLE, "rank %d: no stand-in driver", rank);
    reshard_layout_t *l[2] = {NULL, NULL};
    char spec[96];
    snprintf(spec, sizeof(spec), "shape=%d dtype=bf16 ranks=0 place=R", NEW_N);
    reshard_layout_parse(spec, size, &l[0]);
    snprintf(spec, sizeof(spec), "shape=%d dtype=bf16 ranks=1-2 mesh=2 place=S(0)", NEW_N);
    reshard_layout_parse(spec, size, &l[1]);
    reshard_tensor_t ts[2] = {{"a", l[0], l[1]}, {"b", l[0], l[1]}};
    reshard_plan_config_t cfg = RESHARD_PLAN_CONFIG_INIT;
    cfg.delta = 1;
    reshard_plan_t *plan = NULL;
    reshard_status_t st = reshard_comm_plan_create(comm, ts, 2, &cfg, &plan);
    size_t sb = 0, db = 0, half = NEW_N / 2, off = rank ? (size_t)(rank - 1) * half : 0;
    reshard_layout_shard_bytes(l[0], rank, &sb);
    reshard_layout_shard_bytes(l[1], rank, &db);
    uint16_t *want[2], *got = malloc(db + 2);
    cu_deviceptr s[2], d[2];
    for (int t = 0; t < 2; t++) {
        want[t] = calloc(NEW_N, 2); /* the source, as every rank can compute it */
        s[t] = dev_alloc(sb);
        d[t] = dev_alloc(db);
    }
    for (int k = 0; k < NEW_REFITS && st == RESHARD_OK; k++) {
        for (int t = 0; t < 2; t++) /* refit 0 sets every element, then 5% change each time */
            for (size_t i = 0; i < NEW_N; i++)
                if (!k || mix(i * 5 + (uint64_t)(k * 2 + t)) % 100 < 5)
                    want[t][i] = (uint16_t)mix(i + (uint64_t)(k * 2 + t) * 1000003u);
        if (k == NEW_AT && rank == 1) { /* made before the old goes: another address */
            cu_deviceptr fresh = dev_alloc(db);
            memset(got, 0xa5, db);
            f->memcpy_htod(fresh, got, db);
            f->mem_free(d[0]);
            d[0] = fresh;
        }
        reshard_buffers_t b[2];
        for (int t = 0; t < 2; t++) {
            if (sb)
                f->memcpy_htod(s[t], want[t], sb);
            b[t] = (reshard_buffers_t){sb ? (void *)(uintptr_t)s[t] : NULL, sb,
                                       db ? (void *)(uintptr_t)d[t] : NULL, db, RESHARD_MEM_CUDA};
        }
        reshard_comm_counters_t c0, c1;
        reshard_comm_counters(comm, &c0);
        st = reshard_plan_execute(plan, b);
        reshard_comm_counters(comm, &c1);
        nr->in[rank][k] = c1.net_in - c0.net_in;
        for (int t = 0; t < 2 && rank && st == RESHARD_OK; t++) {
            f->memcpy_dtoh(got, d[t], db);
            for (size_t i = 0; i < half; i++)
                nr->wrong[rank][k] += got[i] != want[t][off + i];
        }
    }
    reshard_plan_destroy(plan);
    for (int t = 0; t < 2; t++) {
        free(want[t]);
        if (s[t])
            f->mem_free(s[t]);
        if (d[t])
            f->mem_free(d[t]);
    }
    free(got);
    reshard_layout_destroy(l[0]);
    reshard_layout_destroy(l[1]);
    return st;
}

/* A new device destination buffer is known by the caller's device pointer (its host shadow is
 * the same buffer as before): rank 1 gets "a" in full there, its "b" and rank 2's tensors keep
 * their deltas, and every device element equals the source after every refit. */
Test(delta_dev, a_new_device_buffer_on_one_rank_brings_only_that_tensor_there_in_full)
{
    use_fake_cuda();
    setenv("RESHARD_DOMAIN_SIZE", "1", 1);
    setenv("RESHARD_CHUNK_BYTES", "65536", 1);
    nr = mmap(NULL, sizeof(*nr), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert(nr != MAP_FAILED);
    memset(nr, 0, sizeof(*nr));
    all_ok(run_ranks(3, new_buffer_refits), 3);
    for (int r = 1; r < 3; r++)
        for (int k = 0; k < NEW_REFITS; k++)
            cr_assert_eq(nr->wrong[r][k], 0, "rank %d, refit %d: %d wrong", r, k, nr->wrong[r][k]);
    const uint64_t full = (uint64_t)NEW_N * 2, delta = full * 15 / 100; /* both tensors' halves */
    cr_assert_lt(nr->in[1][1], delta, "refit 1 is a delta: %llu", (unsigned long long)nr->in[1][1]);
    /* rank 1: "a" in full (half of full), "b" a delta */
    cr_assert_geq(nr->in[1][NEW_AT], full / 2, "%llu", (unsigned long long)nr->in[1][NEW_AT]);
    cr_assert_lt(nr->in[1][NEW_AT], full / 2 + delta, "%llu",
                 (unsigned long long)nr->in[1][NEW_AT]);
    cr_assert_lt(nr->in[2][NEW_AT], delta, "rank 2 kept its buffers: %llu",
                 (unsigned long long)nr->in[2][NEW_AT]);
    cr_assert_lt(nr->in[1][NEW_AT + 1], delta, "and deltas again after: %llu",
                 (unsigned long long)nr->in[1][NEW_AT + 1]);
}

/* Rank 0's device source; ranks 2 and 3, one domain, each a device destination of all of it:
 * one gets it over the network and forwards it to the other. Three refits, the last two 5 %
 * changed: the forward carries the encoding the forwarder got (applied on the device there
 * too), so the fan-out shrinks as the network bytes do, and every device element is exact. */
static uint64_t (*fan)[3]; /* [rank][refit]: local bytes out (a shared page) */

static reshard_status_t fan_out(int rank, int size, reshard_comm_t *comm)
{
    const struct cuda_fns *f = cuda_lib();
    if (!f || cuda_current_context() != RESHARD_OK)
        return rs_error(RESHARD_ERR_UNAVAILABLE, "rank %d: no stand-in driver", rank);
    reshard_layout_t *src = NULL, *dst = NULL;
    char spec[96];
    snprintf(spec, sizeof(spec), "shape=%d dtype=bf16 ranks=0 place=R", BIG_N);
    reshard_layout_parse(spec, size, &src);
    snprintf(spec, sizeof(spec), "shape=%d dtype=bf16 ranks=2-3 mesh=2 place=R", BIG_N);
    reshard_layout_parse(spec, size, &dst);
    reshard_tensor_t t = {"w", src, dst};
    reshard_plan_config_t cfg = RESHARD_PLAN_CONFIG_INIT;
    cfg.delta = 1;
    reshard_plan_t *plan = NULL;
    reshard_status_t st = reshard_comm_plan_create(comm, &t, 1, &cfg, &plan);
    size_t n = BIG_N * 2;
    uint16_t *want = calloc(BIG_N, 2), *got = calloc(BIG_N, 2);
    cu_deviceptr p = rank == 0 || rank >= 2 ? dev_alloc(n) : 0;
    int wrong = 0;
    for (int k = 0; k < 3 && st == RESHARD_OK; k++) {
        for (size_t i = 0; i < BIG_N; i++)
            if (!k || mix(i * 7 + (uint64_t)k) % 100 < 5)
                want[i] = (uint16_t)mix(i + (uint64_t)k * 1000003u);
        if (rank == 0)
            f->memcpy_htod(p, want, n);
        reshard_buffers_t b = {rank == 0 ? (void *)(uintptr_t)p : NULL, rank == 0 ? n : 0,
                               rank >= 2 ? (void *)(uintptr_t)p : NULL, rank >= 2 ? n : 0,
                               RESHARD_MEM_CUDA};
        reshard_comm_counters_t c0, c1;
        reshard_comm_counters(comm, &c0);
        st = reshard_plan_execute(plan, &b);
        reshard_comm_counters(comm, &c1);
        fan[rank][k] = c1.local_out - c0.local_out;
        if (rank >= 2 && st == RESHARD_OK) {
            f->memcpy_dtoh(got, p, n);
            for (size_t i = 0; i < BIG_N; i++)
                wrong += got[i] != want[i];
        }
    }
    if (st == RESHARD_OK && wrong)
        st = rs_error(RESHARD_ERR_INTERNAL, "rank %d: %d wrong elements", rank, wrong);
    reshard_plan_destroy(plan);
    if (p)
        f->mem_free(p);
    free(want);
    free(got);
    reshard_layout_destroy(src);
    reshard_layout_destroy(dst);
    return st;
}

static void fan_case(void)
{
    use_fake_cuda();
    setenv("RESHARD_DOMAIN_SIZE", "2", 1); /* {0, 1} {2, 3} */
    setenv("RESHARD_CHUNK_BYTES", "65536", 1);
    fan = mmap(NULL, 4 * sizeof(*fan), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert(fan != MAP_FAILED);
    memset(fan, 0, 4 * sizeof(*fan));
    all_ok(run_ranks(4, fan_out), 4); /* every device element exact after every refit */
}

/* Peers that write device destinations through host staging (RESHARD_CUDA_IPC=0): the
 * forwarder sends its encoding in the notice, and the peer applies it on its device. */
Test(delta_dev, a_forwarder_passes_the_encoding_on_to_a_device_destination)
{
    setenv("RESHARD_CUDA_IPC", "0", 1);
    fan_case();
    uint64_t first = fan[2][0] + fan[3][0], then = fan[2][2] + fan[3][2];
    cr_assert_eq(first, (uint64_t)BIG_N * 2, "the first refit forwards the tensor whole");
    cr_assert_lt(then * 100, first * 15, "5%% changed: %llu of %llu bytes forwarded",
                 (unsigned long long)then, (unsigned long long)first);
}

/* Through CUDA IPC the forwarder copies the applied chunk device to device (no encoding passed
 * on: the copy never touches host memory); the peer still ends exact after every refit. */
Test(delta_dev, a_forwarder_copies_the_applied_chunk_through_cuda_ipc)
{
    fan_case();
    cr_assert_eq(fan[2][0] + fan[3][0], (uint64_t)BIG_N * 2, "the first refit forwards it whole");
}
