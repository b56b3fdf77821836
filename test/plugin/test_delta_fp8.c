/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Delta refits into FP8 destinations quantized on the way (issue 28, item 3): where the plan
 * quantizes at the sender, the changes of the FP8 codes and scales travel; where the
 * destination quantizes, the changes of the bf16 source travel into the staged copy and only
 * the blocks they touch are quantized again. On forked ranks, refit after refit with a random
 * share of the source changed (uniformly or in runs, small steps or new values): a delta plan
 * and a plain plan of the same layouts run on the same sources, and every code and scale of
 * the delta plan's destinations equals the plain plan's, bit for bit. The delta plan verifies
 * every refit (the applied result, not the delta), and a bit flipped in it fails every rank
 * naming the tensor, after which the next refit runs in full and passes.
 */
#include "ranks.h"
#include "base/error.h"
#include "base/log.h"
#include "base/param.h"
#include "cuda/cuda_lib.h"
#include "plugin/reshard.h"

#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define REFITS 6

struct fcase {
    const char *src, *dst;
    uint64_t seed;
    int fixed;     /* refit k changes fixed_pct[k] % (uniform, small steps): the bytes test */
    int flip_rank; /* >= 0: refit 3 flips a code of this rank's destination (verified) */
    long long flip_byte;
    int dev; /* the delta plan's buffers are (stand-in) device buffers */
};
static struct fcase fc; /* set before the ranks fork */

/* What each rank reports: the world's network bytes of each refit of the delta plan, and the
 * staged blocks it quantized again in each (its INFO line). */
struct report {
    uint64_t net[REFITS];
    long long requant[REFITS];
};
static struct report *rep; /* [MAX_RANKS], shared with the forked ranks */
static int refit_no;       /* in the forked rank */
static int my_rank;

static uint64_t mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15u;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

static const unsigned fixed_pct[REFITS] = {100, 5, 0, 5, 1, 30};

static unsigned pct_of(int k)
{
    static const unsigned pcts[] = {0, 1, 5, 30, 100};
    if (fc.fixed)
        return fixed_pct[k];
    return pcts[mix(fc.seed ^ (uint64_t)k * 77) % 5];
}

static int changed(int64_t g, int k)
{
    int runs = !fc.fixed && (mix(fc.seed + (uint64_t)k) & 1);
    uint64_t h = mix(fc.seed ^ ((uint64_t)(runs ? g / 64 : g) << 8) ^ (uint64_t)k);
    return h % 100 < pct_of(k);
}

/* A bf16 of either sign, 2^-7 to 2^9 in magnitude. */
static uint16_t fresh_bf16(uint64_t h)
{
    return (uint16_t)(((h >> 20) & 1) << 15 | (0x78 + (h >> 8) % 16) << 7 | (h & 0x7f));
}

/* The bf16 bits of element g after refit k: each refit that changed it took it one step (its
 * lowest mantissa bit, as a small learning rate does) or, one time in four, to a new value. */
static uint16_t value(int64_t g, int k)
{
    uint16_t v = fresh_bf16(mix((uint64_t)g * 1000003u));
    for (int j = 1; j <= k; j++) {
        if (!changed(g, j))
            continue;
        uint64_t h = mix((uint64_t)g * 7919u + (uint64_t)j);
        v = !fc.fixed && h % 4 == 0 ? fresh_bf16(h >> 2) : (uint16_t)(v ^ 1);
    }
    return v;
}

static reshard_layout_t *parse_spec(const char *spec)
{
    reshard_layout_t *l = NULL;
    return reshard_layout_parse(spec, 0, &l) == RESHARD_OK ? l : NULL;
}

static void fill_source(const reshard_layout_t *l, int rank, uint16_t *buf)
{
    int64_t shape[8], numel, *rows, *cols;
    reshard_layout_info_t info;
    reshard_layout_info(l, &info);
    reshard_layout_shard_shape(l, rank, shape, &numel);
    if (!numel)
        return;
    rows = calloc((size_t)shape[0], sizeof(int64_t));
    cols = calloc((size_t)shape[1], sizeof(int64_t));
    reshard_layout_shard_index(l, rank, 0, rows);
    reshard_layout_shard_index(l, rank, 1, cols);
    for (int64_t i = 0; i < shape[0]; i++)
        for (int64_t j = 0; j < shape[1]; j++)
            buf[i * shape[1] + j] = value(rows[i] * info.shape[1] + cols[j], refit_no);
    free(rows);
    free(cols);
}

static void requant_sink(enum rs_log_level level, unsigned long flags, const char *msg)
{
    (void)level;
    (void)flags;
    int r = -1;
    long long n = 0;
    const char *at = strstr(msg, "rank ");
    if (at && sscanf(at, "rank %d: delta refit: %lld staged block(s)", &r, &n) == 2 &&
        r == my_rank && refit_no < REFITS)
        rep[r].requant[refit_no] += n;
}

static uint64_t net_out_of(reshard_comm_t *comm)
{
    reshard_comm_counters_t c;
    return reshard_comm_counters(comm, &c) == RESHARD_OK ? c.net_out : 0;
}

/* A plan of the weight and its scales, and this rank's destination buffers for both. */
struct side {
    reshard_plan_t *plan;
    reshard_buffers_t b[2];
};

static reshard_status_t fside_open(struct side *s, reshard_comm_t *comm, int rank, int delta)
{
    memset(s, 0, sizeof(*s));
    reshard_layout_t *ls = parse_spec(fc.src), *ld = parse_spec(fc.dst);
    reshard_tensor_t t = {"layer.w.weight", ls, ld};
    reshard_plan_config_t cfg = RESHARD_PLAN_CONFIG_INIT;
    cfg.delta = delta;
    cfg.verify = delta; /* the delta plan verifies every refit */
    reshard_status_t st = reshard_comm_plan_create(comm, &t, 1, &cfg, &s->plan);
    reshard_layout_destroy(ls);
    reshard_layout_destroy(ld);
    if (st != RESHARD_OK)
        return st;
    if (reshard_plan_ntensors(s->plan) != 2)
        return rs_error(RESHARD_ERR_INTERNAL, "a weight and its scales: %d tensors",
                        reshard_plan_ntensors(s->plan));
    for (int k = 0; k < 2; k++) {
        reshard_layout_t *l = NULL;
        RS_CHECK(reshard_plan_tensor_layout(s->plan, k, 1, &l));
        reshard_layout_shard_bytes(l, rank, &s->b[k].dst_bytes);
        reshard_layout_destroy(l);
        s->b[k].dst = s->b[k].dst_bytes ? malloc(s->b[k].dst_bytes) : NULL;
        if (s->b[k].dst)
            memset(s->b[k].dst, 0xa5, s->b[k].dst_bytes);
        s->b[k].mem = RESHARD_MEM_HOST;
    }
    return RESHARD_OK;
}

static void fside_close(struct side *s)
{
    reshard_plan_destroy(s->plan);
    free(s->b[0].dst);
    free(s->b[1].dst);
}

/* The first byte where the delta plan's destination differs from the plain plan's, or -1. */
static long long differs(const struct side *a, const struct side *b, int k)
{
    const unsigned char *x = a->b[k].dst, *y = b->b[k].dst;
    for (size_t i = 0; i < a->b[k].dst_bytes; i++)
        if (x[i] != y[i])
            return (long long)i;
    return -1;
}

static reshard_status_t refits(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    my_rank = rank;
    rs_log_set_sink(requant_sink);
    reshard_layout_t *ls = parse_spec(fc.src);
    size_t sb = 0;
    reshard_layout_shard_bytes(ls, rank, &sb);
    uint16_t *src = calloc(1, sb + 2);
    struct side d, f;
    reshard_status_t st = fside_open(&d, comm, rank, 1);
    if (st == RESHARD_OK)
        st = fside_open(&f, comm, rank, 0);
    const struct cuda_fns *cu = fc.dev ? cuda_lib() : NULL;
    cu_deviceptr dsrc = 0, ddst[2] = {0, 0};
    if (st == RESHARD_OK && fc.dev) { /* the delta plan's buffers on the device */
        if (!cu || cuda_current_context() != RESHARD_OK)
            return rs_error(RESHARD_ERR_UNAVAILABLE, "rank %d: no stand-in driver", rank);
        if (sb && cu->mem_alloc(&dsrc, sb) != CU_SUCCESS)
            return rs_error(RESHARD_ERR_NO_MEMORY, "rank %d: device source", rank);
        for (int k = 0; k < 2; k++)
            if (d.b[k].dst_bytes && (cu->mem_alloc(&ddst[k], d.b[k].dst_bytes) != CU_SUCCESS ||
                                     cu->memcpy_htod(ddst[k], d.b[k].dst, d.b[k].dst_bytes)))
                return rs_error(RESHARD_ERR_NO_MEMORY, "rank %d: device destination", rank);
    }
    for (refit_no = 0; refit_no < REFITS && st == RESHARD_OK; refit_no++) {
        fill_source(ls, rank, src);
        reshard_buffers_t bd[2] = {d.b[0], d.b[1]}, bf[2] = {f.b[0], f.b[1]};
        bd[0].src = bf[0].src = sb ? src : NULL;
        bd[0].src_bytes = bf[0].src_bytes = sb;
        if (fc.dev) {
            if (sb)
                cu->memcpy_htod(dsrc, src, sb);
            bd[0].src = sb ? (void *)(uintptr_t)dsrc : NULL;
            for (int k = 0; k < 2; k++) {
                bd[k].dst = d.b[k].dst_bytes ? (void *)(uintptr_t)ddst[k] : NULL;
                bd[k].mem = RESHARD_MEM_CUDA;
            }
        }
        int flip = fc.flip_rank >= 0 && refit_no == 3;
        char spec[96];
        snprintf(spec, sizeof(spec), "%d:layer.w.weight:%lld", fc.flip_rank, fc.flip_byte);
        if (flip) {
            setenv("RESHARD_TEST_FLIP", spec, 1);
            rs_param_reload();
        }
        uint64_t before = net_out_of(comm);
        st = reshard_plan_execute(d.plan, bd);
        if (flip) {
            unsetenv("RESHARD_TEST_FLIP");
            rs_param_reload();
            char want[] = "differs from its source after the refit: layer.w.weight";
            const char *at = strstr(reshard_last_error(), want);
            if (st != RESHARD_ERR_VERIFY || !at || at[sizeof(want) - 1] != '\0')
                return rs_error(RESHARD_ERR_INTERNAL, "rank %d: the flipped refit: %s: %s", rank,
                                reshard_strerror(st), reshard_last_error());
            st = RESHARD_OK;
        }
        uint64_t all[MAX_RANKS] = {0};
        all[rank] = net_out_of(comm) - before;
        if (st == RESHARD_OK)
            st = reshard_comm_allgather(comm, all, sizeof(uint64_t));
        for (int r = 0; st == RESHARD_OK && r < reshard_comm_size(comm); r++)
            rep[rank].net[refit_no] += all[r];
        if (st == RESHARD_OK)
            st = reshard_plan_execute(f.plan, bf);
        for (int k = 0; k < 2 && st == RESHARD_OK && fc.dev; k++) /* for differs() */
            if (d.b[k].dst_bytes)
                cu->memcpy_dtoh(d.b[k].dst, ddst[k], d.b[k].dst_bytes);
        for (int k = 0; k < 2 && st == RESHARD_OK && !flip; k++) {
            long long at = differs(&d, &f, k);
            if (at >= 0)
                st = rs_error(RESHARD_ERR_INTERNAL,
                              "rank %d, refit %d (%u%% changed): %s byte %lld is 0x%02x, a full "
                              "refit's 0x%02x",
                              rank, refit_no, pct_of(refit_no), k ? "scales" : "codes", at,
                              ((unsigned char *)d.b[k].dst)[at], ((unsigned char *)f.b[k].dst)[at]);
        }
    }
    rs_log_set_sink(NULL);
    if (dsrc)
        cu->mem_free(dsrc);
    for (int k = 0; k < 2; k++)
        if (ddst[k])
            cu->mem_free(ddst[k]);
    fside_close(&d);
    fside_close(&f);
    free(src);
    reshard_layout_destroy(ls);
    return st;
}

static void run_case(int world)
{
    memset(rep, 0, MAX_RANKS * sizeof(*rep));
    struct outcome *o = run_ranks(world, refits);
    for (int r = 0; r < world; r++)
        cr_assert_eq(o[r].status, RESHARD_OK, "seed %llu, rank %d: %s\n  src: %s\n  dst: %s",
                     (unsigned long long)fc.seed, r, o[r].msg, fc.src, fc.dst);
}

static void setup(void)
{
    setenv("RESHARD_TIMEOUT", "30", 1);
    setenv("UCX_LOG_LEVEL", "error", 1);
    setenv("RESHARD_CHUNK_BYTES", "8192", 1); /* many chunks even on small shards */
    setenv("RESHARD_COALESCE_BYTES", "0", 1);
    rep = mmap(NULL, MAX_RANKS * sizeof(*rep), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
               -1, 0);
    cr_assert_neq(rep, MAP_FAILED);
}

static void teardown(void)
{
    munmap(rep, MAX_RANKS * sizeof(*rep));
}

TestSuite(delta_fp8, .init = setup, .fini = teardown, .timeout = 300);

/* 512 x 512 bf16 by rows on 4 ranks into e4m3 128 x 128 blocks on a 2 x 2 mesh: every block
 * is whole at its sender, which quantizes it; the codes and scales travel. */
#define AT_SRC_SRC "shape=512x512 dtype=bf16 ranks=0-3 place=S(0)"
#define AT_SRC_DST                                                                                 \
    "shape=512x512 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=R,S(1) quant=block(128,128)"
/* by columns on 3 ranks (171, 171, 170): the blocks of columns 128-383 are cut between
 * sources, cross in bf16 and are quantized where they land */
#define AT_DST_SRC "shape=512x512 dtype=bf16 ranks=0-2 place=S(1)"
#define AT_DST_DST                                                                                 \
    "shape=512x512 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=S(0),S(1) quant=block(128,128)"
/* the same from ranks 1, 4 and 0, none of which holds any of its own source's columns as a
 * destination: every staged box crosses the network, as a delta (a rank's copy of its own
 * source into its staged copy is not compared, and its blocks are quantized again) */
#define AT_DST_SRC_APART "shape=512x512 dtype=bf16 ranks=1,4,0 place=S(1)"

Test(delta_fp8, every_code_and_scale_equals_a_full_refit_after_random_changes)
{
    const char *layouts[][2] = {
        {AT_SRC_SRC, AT_SRC_DST}, {AT_DST_SRC, AT_DST_DST}, {AT_DST_SRC_APART, AT_DST_DST}};
    for (int k = 0; k < 9; k++) {
        fc = (struct fcase){.src = layouts[k % 3][0],
                            .dst = layouts[k % 3][1],
                            .seed = 9100 + (uint64_t)k,
                            .flip_rank = -1};
        /* domains of 1 (every transfer between ranks crosses the network) or 2 */
        setenv("RESHARD_DOMAIN_SIZE", k / 3 % 2 ? "2" : "1", 1);
        run_case(k % 3 == 2 ? 5 : 4);
    }
}

static void bytes_case(const char *src, const char *dst, int world, const char *what)
{
    fc = (struct fcase){.src = src, .dst = dst, .seed = 77, .fixed = 1, .flip_rank = -1};
    setenv("RESHARD_DOMAIN_SIZE", "1", 1);
    run_case(world);
    uint64_t full = rep[0].net[0];
    cr_assert_gt(full, 0);
    for (int k = 1; k < REFITS; k++)
        cr_log_info("%s: refit %d, %u%% changed: %llu of %llu bytes (%.3f)", what, k, fixed_pct[k],
                    (unsigned long long)rep[0].net[k], (unsigned long long)full,
                    (double)rep[0].net[k] / (double)full);
    /* 5% of the elements one step each: far less than the full refit */
    cr_assert_lt(rep[0].net[1] * 100, full * 30, "%s: 5%% changed sent %llu of %llu bytes", what,
                 (unsigned long long)rep[0].net[1], (unsigned long long)full);
    cr_assert_lt(rep[0].net[2] * 100, full * 5, "%s: nothing changed sent %llu of %llu bytes", what,
                 (unsigned long long)rep[0].net[2], (unsigned long long)full);
}

Test(delta_fp8, codes_and_scales_quantized_at_the_sender_travel_as_changes)
{
    bytes_case(AT_SRC_SRC, AT_SRC_DST, 4, "at the sender");
}

Test(delta_fp8, staged_blocks_travel_as_changes_and_only_changed_blocks_are_quantized_again)
{
    bytes_case(AT_DST_SRC_APART, AT_DST_DST, 5, "where they land");
    /* refit 2 changed nothing: no staged block is quantized again; refit 1 changed some */
    long long r1 = 0, r2 = 0;
    for (int r = 0; r < 5; r++) {
        r1 += rep[r].requant[1];
        r2 += rep[r].requant[2];
    }
    cr_assert_eq(r2, 0, "refit 2 changed nothing, yet %lld blocks were quantized again", r2);
    cr_assert_gt(r1, 0, "refit 1 changed 5%% and no block was quantized again");
}

/* A code flipped after a delta refit fails it on every rank naming the weight; the next refit
 * runs in full, never a delta on top of the wrong code, and equals a full refit again. */
Test(delta_fp8, a_flipped_code_fails_the_verified_delta_refit_and_the_next_one_mends_it)
{
    const char *layouts[][2] = {{AT_SRC_SRC, AT_SRC_DST}, {AT_DST_SRC, AT_DST_DST}};
    for (int k = 0; k < 2; k++) {
        fc = (struct fcase){.src = layouts[k][0],
                            .dst = layouts[k][1],
                            .seed = 5,
                            .fixed = 1,
                            .flip_rank = 1 + k,
                            .flip_byte = 129 * 256 + 3};
        setenv("RESHARD_DOMAIN_SIZE", "2", 1);
        run_case(4);
    }
}

/* The delta plan on (stand-in) device buffers: a quantized tensor's device source is staged and
 * compared on the host, its device destination gets the codes in full each refit (nothing on the
 * device is known to hold a refit); every code and scale equals the plain host plan's. */
Test(delta_fp8, device_buffers_get_every_code_and_scale_of_a_full_refit)
{
    size_t n;
    if (!cuda_fatbin(&n))
        cr_skip_test("this build had no nvcc: no quantization kernels");
    char path[512];
    const char *b = getenv("RESHARD_BUILD");
    snprintf(path, sizeof(path), "%s/test/fake/libcuda.so.1", b && *b ? b : "build");
    setenv("RESHARD_CUDA_LIB", path, 1);
    const char *layouts[][2] = {{AT_SRC_SRC, AT_SRC_DST}, {AT_DST_SRC, AT_DST_DST}};
    for (int k = 0; k < 4; k++) {
        fc = (struct fcase){.src = layouts[k % 2][0],
                            .dst = layouts[k % 2][1],
                            .seed = 9300 + (uint64_t)k,
                            .flip_rank = -1,
                            .dev = 1};
        setenv("RESHARD_DOMAIN_SIZE", k / 2 ? "2" : "1", 1);
        run_case(4);
    }
}
