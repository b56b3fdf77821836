/* SPDX-License-Identifier: Apache-2.0 */
/*
 * FP8 destinations executed on forked ranks: bf16, f16 and f32 sources quantized on the way
 * (at the senders where they hold the blocks whole, else where the blocks land), per block, per
 * channel and per tensor, and FP8 sources moved with their scales. Every FP8 element and every
 * scale of every destination shard is compared bit for bit with the host reference
 * (cuda/quant.h) computed over the whole tensor. The same on device buffers of the stand-in
 * libcuda (test/fake), where the quantization kernel's emulation runs and is counted.
 */
#include "ranks.h"
#include "side.h"
#include "base/error.h"
#include "base/log.h"
#include "base/param.h"
#include "cuda/cuda_lib.h"
#include "cuda/quant.h"
#include "plugin/reshard.h"

#include <criterion/criterion.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/time.h>

/* One case: the layouts (2-D), the source dtype, the destination's FP8 format and the extent
 * of one scale along each dim, and the same destination in bf16 for the byte comparison. */
struct qcase {
    const char *src, *dst, *dst_bf16;
    int src_kind; /* 0 bf16, 1 f16, 2 f32, 3 FP8 with its scales (MOVE) */
    enum rs_fp8 fmt;
    int64_t er, ec;
    reshard_algo_t algo;
    int refits;
    int64_t src_off, dst_off; /* the weight's shards start this many elements into its buffers */
    unsigned dev_ranks;       /* ranks that pass every buffer as (the stand-in's) device memory */
    int verify;               /* the plan's verify option */
    int64_t src_pitch, dst_pitch; /* elements between rows of a shard (0: its width) */
    int fresh;                    /* each refit into (and from) newly allocated buffers */
    /* verified refits with one bit flipped in a destination (RESHARD_TEST_FLIP): the rank and
     * the byte of its FP8 weight buffer, then of its scales buffer */
    int flip_code_rank, flip_scale_rank;
    long long flip_code_byte, flip_scale_byte;
};

static struct qcase qc; /* set before the ranks fork */
/* What every rank reports beside its status: the network bytes of the FP8 and bf16 refits. */
static uint64_t *net_fp8, *net_bf16;
static double *at_src_pct;       /* reshard_plan_stats' quant_at_source_pct, per rank */
static uint64_t *quant_launches; /* the stand-in's quantization kernels run, per rank */

/* The source's value at (i, j) in refit `it`: signs, magnitudes that change every 64 rows and
 * columns, a block of zeros, a NaN, and values small enough to go subnormal in FP8. */
static float value_at(int64_t i, int64_t j, int it)
{
    if (i / 128 == 1 && j / 128 == 1)
        return 0.0f;
    if (i == 7 && j == 9)
        return NAN;
    int e = (int)((i / 64 * 5 + j / 64 * 3 + it) % 24) - 12;
    return ldexpf((float)((i * 131 + j * 71 + it * 17) % 1001 - 500) / 500.0f, e);
}

/* float32 -> f16 bits, truncating (any rule does, as long as the fill and the reference
 * agree): NaN stays NaN, values below f16's normal range become zero, above it the largest
 * finite. Not _Float16: not every compiler has it on every target. */
static inline uint16_t f16_bits_of(float v)
{
    uint32_t u = rs_f32_bits(v), s = (u >> 16) & 0x8000;
    int e = (int)((u >> 23) & 0xff) - 127 + 15;
    if ((u & 0x7fffffff) > 0x7f800000)
        return (uint16_t)(s | 0x7e00);
    if (e <= 0)
        return (uint16_t)s;
    if (e >= 31)
        return (uint16_t)(s | 0x7bff);
    return (uint16_t)(s | (uint32_t)e << 10 | ((u >> 13) & 0x3ff));
}

/* The value as the source dtype stores it, and read back. Not inlined: with GCC 12.2 at -O2,
 * inlined into ref_make's loops, the reference came out as if the bf16 truncation were not
 * there (FP8 values one step off, scales of the unrounded amax), and the library's output
 * matched this noinline version. Not understood: the same round trip in a small program keeps
 * the truncation. The library is not exposed: it reads stored 16-bit values. */
__attribute__((noinline)) static float stored(float v, int kind, uint8_t *out)
{
    if (kind == 0) {
        uint16_t h = (uint16_t)(rs_f32_bits(v) >> 16);
        if (out)
            memcpy(out, &h, 2);
        return rs_bf16_to_f32(h);
    }
    if (kind == 1) {
        uint16_t bits = f16_bits_of(v);
        if (out)
            memcpy(out, &bits, 2);
        return rs_f16_to_f32(bits);
    }
    if (out)
        memcpy(out, &v, 4);
    return v;
}

/* The whole tensor quantized by the reference: q[rows x cols], scales[nbr x nbc]. */
struct ref {
    int64_t rows, cols, nbr, nbc;
    uint8_t *q;
    float *scales;
};

static void ref_make(struct ref *r, int64_t rows, int64_t cols, int it)
{
    r->rows = rows;
    r->cols = cols;
    r->nbr = (rows + qc.er - 1) / qc.er;
    r->nbc = (cols + qc.ec - 1) / qc.ec;
    r->q = calloc((size_t)(rows * cols), 1);
    r->scales = calloc((size_t)(r->nbr * r->nbc), sizeof(float));
    int kind = qc.src_kind == 3 ? 0 : qc.src_kind; /* an FP8 source: quantized from bf16 */
    for (int64_t bi = 0; bi < r->nbr; bi++)
        for (int64_t bj = 0; bj < r->nbc; bj++) {
            int64_t i1 = (bi + 1) * qc.er < rows ? (bi + 1) * qc.er : rows;
            int64_t j1 = (bj + 1) * qc.ec < cols ? (bj + 1) * qc.ec : cols;
            float amax = 0;
            for (int64_t i = bi * qc.er; i < i1; i++)
                for (int64_t j = bj * qc.ec; j < j1; j++)
                    amax = rs_amax_step(amax, stored(value_at(i, j, it), kind, NULL));
            float s = rs_fp8_scale(amax, qc.fmt);
            r->scales[bi * r->nbc + bj] = s;
            for (int64_t i = bi * qc.er; i < i1; i++)
                for (int64_t j = bj * qc.ec; j < j1; j++)
                    r->q[i * cols + j] =
                        rs_f32_to_fp8(stored(value_at(i, j, it), kind, NULL) / s, qc.fmt);
        }
}

static void ref_free(struct ref *r)
{
    free(r->q);
    free(r->scales);
}

/* A rank's shard of a 2-D layout: its shape and global indices. */
struct shard {
    int64_t shape[8], numel, *rows, *cols;
};

static void shard_of(const reshard_layout_t *l, int rank, struct shard *s)
{
    memset(s, 0, sizeof(*s));
    reshard_layout_shard_shape(l, rank, s->shape, &s->numel);
    s->rows = calloc((size_t)s->shape[0] + 1, sizeof(int64_t));
    s->cols = calloc((size_t)s->shape[1] + 1, sizeof(int64_t));
    if (s->numel) {
        reshard_layout_shard_index(l, rank, 0, s->rows);
        reshard_layout_shard_index(l, rank, 1, s->cols);
    }
}

static void shard_free(struct shard *s)
{
    free(s->rows);
    free(s->cols);
}

/* Buffers for every tensor of the plan (the weight, its scales), sized for this rank's shards. */
struct qside {
    reshard_plan_t *plan;
    int nt;
    reshard_layout_t *l[2][2]; /* [tensor][side] */
    reshard_buffers_t b[2];
};

static reshard_status_t qside_open(struct qside *x, reshard_comm_t *comm, int rank, const char *src,
                                   const char *dst)
{
    memset(x, 0, sizeof(*x));
    reshard_layout_t *ls = parse(src), *ld = parse(dst);
    reshard_tensor_t t = {"layer.w.weight", ls, ld};
    reshard_plan_config_t cfg = RESHARD_PLAN_CONFIG_INIT;
    cfg.algo = qc.algo;
    cfg.verify = qc.verify;
    reshard_status_t st = reshard_comm_plan_create(comm, &t, 1, &cfg, &x->plan);
    reshard_layout_destroy(ls);
    reshard_layout_destroy(ld);
    if (st != RESHARD_OK)
        return st;
    x->nt = reshard_plan_ntensors(x->plan);
    if (x->nt > 2)
        return RESHARD_ERR_INTERNAL;
    for (int k = 0; k < x->nt; k++)
        for (int side = 0; side < 2; side++) {
            RS_CHECK(reshard_plan_tensor_layout(x->plan, k, side, &x->l[k][side]));
            size_t bytes = 0;
            reshard_layout_shard_bytes(x->l[k][side], rank, &bytes);
            void *p = bytes ? calloc(1, bytes) : NULL;
            if (side) {
                x->b[k].dst = p;
                x->b[k].dst_bytes = bytes;
            } else {
                x->b[k].src = p;
                x->b[k].src_bytes = bytes;
            }
        }
    return RESHARD_OK;
}

static void qside_close(struct qside *x)
{
    reshard_plan_destroy(x->plan);
    for (int k = 0; k < 2; k++) {
        free((void *)x->b[k].src);
        free(x->b[k].dst);
        for (int side = 0; side < 2; side++)
            reshard_layout_destroy(x->l[k][side]);
    }
}

/* The sources of refit `it`: the weight in its dtype (or FP8 and its scales, for a MOVE). A
 * plan's scales of a weight quantized on the way take no source buffer: it is left NULL. */
static void qside_fill(struct qside *x, int rank, const struct ref *r, int it)
{
    struct shard s;
    shard_of(x->l[0][0], rank, &s);
    size_t es = qc.src_kind == 3 ? 1 : qc.src_kind == 2 ? 4 : 2;
    uint8_t *w = (uint8_t *)x->b[0].src + (size_t)qc.src_off * es;
    for (int64_t i = 0; i < s.shape[0]; i++)
        for (int64_t j = 0; j < s.shape[1]; j++) {
            uint8_t *at = w + (size_t)(i * (qc.src_pitch ? qc.src_pitch : s.shape[1]) + j) * es;
            if (qc.src_kind == 3)
                *at = r->q[s.rows[i] * r->cols + s.cols[j]];
            else
                stored(value_at(s.rows[i], s.cols[j], it), qc.src_kind, at);
        }
    shard_free(&s);
    if (qc.src_kind != 3) {
        free((void *)x->b[1].src);
        x->b[1].src = NULL;
        x->b[1].src_bytes = 0;
        return;
    }
    shard_of(x->l[1][0], rank, &s);
    float *sc = (float *)x->b[1].src;
    for (int64_t i = 0; i < s.shape[0]; i++)
        for (int64_t j = 0; j < s.shape[1]; j++)
            sc[i * s.shape[1] + j] = r->scales[s.rows[i] * r->nbc + s.cols[j]];
    shard_free(&s);
}

/* Destination elements and scales that differ from the reference, bit for bit. */
static int64_t qside_wrong(const struct qside *x, int rank, const struct ref *r, char *why,
                           size_t n)
{
    int64_t wrong = 0;
    struct shard s;
    shard_of(x->l[1][1], rank, &s);
    const float *sc = x->b[1].dst;
    for (int64_t i = 0; i < s.shape[0]; i++)
        for (int64_t j = 0; j < s.shape[1]; j++) {
            float want = r->scales[s.rows[i] * r->nbc + s.cols[j]], got = sc[i * s.shape[1] + j];
            if (rs_f32_bits(got) != rs_f32_bits(want) && !wrong++)
                snprintf(why, n, "rank %d: scale (%lld, %lld) is %a, expected %a", rank,
                         (long long)s.rows[i], (long long)s.cols[j], (double)got, (double)want);
        }
    shard_free(&s);
    shard_of(x->l[0][1], rank, &s);
    const uint8_t *q = (const uint8_t *)x->b[0].dst + qc.dst_off;
    for (int64_t i = 0; i < s.shape[0]; i++)
        for (int64_t j = 0; j < s.shape[1]; j++) {
            uint8_t want = r->q[s.rows[i] * r->cols + s.cols[j]],
                    got = q[i * (qc.dst_pitch ? qc.dst_pitch : s.shape[1]) + j];
            if (got != want && !wrong++)
                snprintf(why, n, "rank %d: element (%lld, %lld) is 0x%02x, expected 0x%02x", rank,
                         (long long)s.rows[i], (long long)s.cols[j], got, want);
        }
    shard_free(&s);
    return wrong;
}

static uint64_t net_out_of(reshard_comm_t *comm)
{
    reshard_comm_counters_t c;
    return reshard_comm_counters(comm, &c) == RESHARD_OK ? c.net_out : 0;
}

/* The world's network bytes since `before` on this rank, summed over the ranks. */
static reshard_status_t world_net(reshard_comm_t *comm, uint64_t before, uint64_t *sum)
{
    uint64_t all[MAX_RANKS] = {0};
    all[reshard_comm_rank(comm)] = net_out_of(comm) - before;
    RS_CHECK(reshard_comm_allgather(comm, all, sizeof(uint64_t)));
    *sum = 0;
    for (int r = 0; r < reshard_comm_size(comm); r++)
        *sum += all[r];
    return RESHARD_OK;
}

/* The same layouts into an unquantized destination: the world's network bytes of one refit. */
static reshard_status_t plain_refit_bytes(reshard_comm_t *comm, int rank, const char *src,
                                          const char *dst, uint64_t *sum)
{
    reshard_layout_t *ls = parse(src), *ld = parse(dst);
    reshard_tensor_t t = {"layer.w.weight", ls, ld};
    reshard_plan_t *plan = NULL;
    reshard_buffers_t b = {0};
    reshard_status_t st = reshard_comm_plan_create(comm, &t, 1, NULL, &plan);
    reshard_layout_shard_bytes(ls, rank, &b.src_bytes);
    reshard_layout_shard_bytes(ld, rank, &b.dst_bytes);
    b.src = b.src_bytes ? calloc(1, b.src_bytes) : NULL;
    b.dst = b.dst_bytes ? calloc(1, b.dst_bytes) : NULL;
    uint64_t before = net_out_of(comm);
    if (st == RESHARD_OK)
        st = reshard_plan_execute(plan, &b);
    if (st == RESHARD_OK)
        st = world_net(comm, before, sum);
    reshard_plan_destroy(plan);
    free((void *)b.src);
    free(b.dst);
    reshard_layout_destroy(ls);
    reshard_layout_destroy(ld);
    return st;
}

/* ---- device buffers: the stand-in libcuda's (host memory it hands out as device memory) ---- */

static void *fake_fn(const char *name)
{
    void *h = dlopen(getenv("RESHARD_CUDA_LIB"), RTLD_NOW | RTLD_GLOBAL);
    return h ? dlsym(h, name) : NULL;
}

/* The device cases need the kernels (the stand-in emulates them, but loads only a fatbin). */
static void need_kernels(void)
{
    size_t n;
    if (!cuda_fatbin(&n))
        cr_skip_test("this build had no nvcc: no quantization kernels");
}

static void use_fake_cuda(void)
{
    need_kernels();
    char path[512];
    const char *b = getenv("RESHARD_BUILD");
    snprintf(path, sizeof(path), "%s/test/fake/libcuda.so.1", b && *b ? b : "build");
    setenv("RESHARD_CUDA_LIB", path, 1);
}

/* Device memory of the driver the library uses (the stand-in's, or a GPU's), holding host's n
 * bytes; NULL for none. */
static reshard_status_t dev_copy(const void *host, size_t n, void **out)
{
    const struct cuda_fns *f = cuda_lib();
    cu_deviceptr p;
    *out = NULL;
    if (!host)
        return RESHARD_OK;
    if (!f)
        return RESHARD_ERR_UNAVAILABLE; /* cuda_lib said why */
    RS_CHECK(cuda_current_context());
    if (f->mem_alloc(&p, n) != CU_SUCCESS || f->memcpy_htod(p, host, n) != CU_SUCCESS)
        return rs_error(RESHARD_ERR_NO_MEMORY, "device copy of %zu bytes", n);
    *out = (void *)(uintptr_t)p;
    return RESHARD_OK;
}

/* The buffers execute gets: x's, or device copies of them on the ranks of qc.dev_ranks. */
static reshard_status_t bufs_for(const struct qside *x, int rank, reshard_buffers_t *b)
{
    memcpy(b, x->b, sizeof(x->b));
    if (!(qc.dev_ranks >> rank & 1))
        return RESHARD_OK;
    for (int k = 0; k < x->nt; k++) {
        void *src, *dst;
        b[k].mem = RESHARD_MEM_CUDA;
        b[k].src = b[k].dst = NULL;
        RS_CHECK(dev_copy(x->b[k].src, x->b[k].src_bytes, &src));
        b[k].src = src;
        RS_CHECK(dev_copy(x->b[k].dst, x->b[k].dst_bytes, &dst));
        b[k].dst = dst;
    }
    return RESHARD_OK;
}

/* The device destinations back into x's, and the device copies freed. */
static void bufs_back(const struct qside *x, int rank, const reshard_buffers_t *b)
{
    const struct cuda_fns *f = cuda_lib();
    if (!(qc.dev_ranks >> rank & 1) || !f)
        return;
    for (int k = 0; k < x->nt; k++) {
        if (b[k].dst)
            f->memcpy_dtoh(x->b[k].dst, (cu_deviceptr)(uintptr_t)b[k].dst, x->b[k].dst_bytes);
        if (b[k].src)
            f->mem_free((cu_deviceptr)(uintptr_t)b[k].src);
        if (b[k].dst)
            f->mem_free((cu_deviceptr)(uintptr_t)b[k].dst);
    }
}

static reshard_status_t refit_and_check(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    struct qside x;
    reshard_status_t st = qside_open(&x, comm, rank, qc.src, qc.dst);
    reshard_layout_info_t info = {0};
    if (st == RESHARD_OK)
        st = reshard_layout_info(x.l[0][1], &info);
    if (st == RESHARD_OK &&
        (x.nt != 2 || strcmp(reshard_plan_tensor_name(x.plan, 1), "layer.w.weight_scale_inv")))
        st = rs_error(RESHARD_ERR_INTERNAL, "rank %d: the plan has %d tensors, the second '%s'",
                      rank, x.nt, x.nt > 1 ? reshard_plan_tensor_name(x.plan, 1) : "");
    uint64_t fp8 = 0;
    reshard_plan_stats_t ps;
    if (st == RESHARD_OK && (st = reshard_plan_stats(x.plan, &ps, NULL)) == RESHARD_OK)
        at_src_pct[rank] = ps.quant_at_source_pct;
    for (int it = 0; st == RESHARD_OK && it < qc.refits; it++) {
        struct ref r;
        ref_make(&r, info.shape[0], info.shape[1], it);
        for (int k = 0; qc.fresh && it && k < 2; k++) {
            void *keep[2] = {(void *)x.b[k].src, x.b[k].dst};
            x.b[k].src = x.b[k].src_bytes ? calloc(1, x.b[k].src_bytes) : NULL;
            x.b[k].dst = x.b[k].dst_bytes ? calloc(1, x.b[k].dst_bytes) : NULL;
            free(keep[0]);
            free(keep[1]);
        }
        qside_fill(&x, rank, &r, it);
        for (int k = 0; k < 2; k++)
            if (x.b[k].dst)
                memset(x.b[k].dst, 0xa5, x.b[k].dst_bytes);
        uint64_t before = net_out_of(comm);
        reshard_buffers_t b[2];
        if ((st = bufs_for(&x, rank, b)) == RESHARD_OK)
            st = reshard_plan_execute(x.plan, b);
        bufs_back(&x, rank, b);
        if (qc.dev_ranks) {
            int (*n)(void) = (int (*)(void))fake_fn("fake_cuda_quant_launches");
            quant_launches[rank] = n ? (uint64_t)n() : 0;
        }
        if (st == RESHARD_OK && it == 0)
            st = world_net(comm, before, &fp8);
        char why[200] = "";
        int64_t wrong = st == RESHARD_OK ? qside_wrong(&x, rank, &r, why, sizeof(why)) : 0;
        if (wrong)
            st = rs_error(RESHARD_ERR_INTERNAL, "refit %d: %lld wrong; first: %s", it,
                          (long long)wrong, why);
        reshard_tensor_state_t states[2];
        if (st == RESHARD_OK && (st = reshard_plan_outcome(x.plan, states)) == RESHARD_OK &&
            x.b[0].dst &&
            (states[0] != RESHARD_TENSOR_COMPLETE || states[1] != RESHARD_TENSOR_COMPLETE))
            st = rs_error(RESHARD_ERR_INTERNAL, "rank %d: outcomes %d, %d", rank, states[0],
                          states[1]);
        ref_free(&r);
    }
    qside_close(&x);
    if (st != RESHARD_OK || !qc.dst_bf16)
        return st;
    /* The same layouts into bf16, for the bytes. */
    uint64_t bf = 0;
    st = plain_refit_bytes(comm, rank, qc.src, qc.dst_bf16, &bf);
    net_fp8[rank] = fp8;
    net_bf16[rank] = bf;
    return st;
}

static void setup(void)
{
    setenv("RESHARD_DOMAIN_SIZE", "2", 1);
    setenv("RESHARD_TIMEOUT", "20", 1);
    setenv("UCX_LOG_LEVEL", "error", 1);
    net_fp8 = mmap(NULL, 4 * MAX_RANKS * sizeof(uint64_t), PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(net_fp8, MAP_FAILED);
    memset(net_fp8, 0, 4 * MAX_RANKS * sizeof(uint64_t));
    net_bf16 = net_fp8 + MAX_RANKS;
    at_src_pct = (double *)(void *)(net_fp8 + 2 * MAX_RANKS);
    quant_launches = net_fp8 + 3 * MAX_RANKS;
}

static void teardown(void)
{
    munmap(net_fp8, 4 * MAX_RANKS * sizeof(uint64_t));
}

TestSuite(quant_exec, .init = setup, .fini = teardown, .timeout = 120);

#define BLOCK "quant=block(128,128)"

Test(quant_exec, aligned_bf16_sources_quantize_at_the_senders_and_halve_the_network_bytes)
{
    qc = (struct qcase){.src = "shape=512x256 dtype=bf16 ranks=0-3 place=S(0)",
                        .dst = "shape=512x256 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=R,S(1) " BLOCK,
                        .dst_bf16 = "shape=512x256 dtype=bf16 ranks=0-3 mesh=2x2 place=R,S(1)",
                        .src_kind = 0,
                        .fmt = RS_FP8_E4M3,
                        .er = 128,
                        .ec = 128,
                        .refits = 2};
    all_ok(run_ranks(4, refit_and_check), 4);
    uint64_t fp8 = net_fp8[0], bf = net_bf16[0];
    cr_log_info("aligned 512x256 bf16 -> fp8e4m3 block(128,128), 4 ranks in 2 domains: network "
                "%llu bytes, bf16 refit %llu (%.3f x)",
                (unsigned long long)fp8, (unsigned long long)bf, (double)fp8 / (double)bf);
    cr_assert_gt(fp8, 0);
    for (int r = 0; r < 4; r++)
        cr_assert_eq(at_src_pct[r], 100.0, "rank %d: every block quantized at its sender", r);
    cr_assert_leq(fp8 * 100, bf * 51, "FP8 %llu bytes, bf16 %llu", (unsigned long long)fp8,
                  (unsigned long long)bf);
}

Test(quant_exec, uneven_sources_that_cut_blocks_land_staged_and_quantize_where_they_land)
{
    /* 512 rows on 3 ranks (171, 171, 170): the blocks at rows 128 and 256 straddle them */
    qc = (struct qcase){.src = "shape=512x256 dtype=bf16 ranks=0-2 place=S(0)",
                        .dst =
                            "shape=512x256 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=S(0),S(1) " BLOCK,
                        .src_kind = 0,
                        .fmt = RS_FP8_E4M3,
                        .er = 128,
                        .ec = 128,
                        .refits = 2};
    all_ok(run_ranks(4, refit_and_check), 4);
    /* of the 4 block rows, 0 (rows 0-127, on rank 0) and 3 (384-511, on rank 2) are held whole */
    cr_assert_eq(at_src_pct[0], 50.0, "the world's figure, from the plan vote: %f", at_src_pct[0]);
    cr_assert_eq(at_src_pct[3], at_src_pct[0]);
}

Test(quant_exec, a_partial_last_block_and_columns_cut_inside_blocks)
{
    /* 320 x 200: the last block row holds 64 rows, the last block column 72; the source's
     * columns split at 100, inside block column 0 */
    qc = (struct qcase){.src = "shape=320x200 dtype=f32 ranks=0-3 mesh=2x2 place=R,S(1)",
                        .dst = "shape=320x200 dtype=fp8e4m3 ranks=1-3 place=R " BLOCK,
                        .src_kind = 2,
                        .fmt = RS_FP8_E4M3,
                        .er = 128,
                        .ec = 128,
                        .refits = 1};
    all_ok(run_ranks(4, refit_and_check), 4);
}

Test(quant_exec, shards_placed_at_offsets_in_their_buffers)
{
    /* a weight inside a fused buffer on both sides (as vLLM's fused_qkv_a_proj): the source's
     * values are read, and the destination's written, at their offsets; blocks quantized at the
     * senders and where they land alike */
    qc = (struct qcase){.src = "shape=512x256 dtype=bf16 ranks=0-2 place=S(0) buffer=fused "
                               "offset=1000",
                        .dst = "shape=512x256 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=R,S(1) "
                               "buffer=fused offset=333 " BLOCK,
                        .src_kind = 0,
                        .fmt = RS_FP8_E4M3,
                        .er = 128,
                        .ec = 128,
                        .refits = 1,
                        .src_off = 1000,
                        .dst_off = 333};
    all_ok(run_ranks(4, refit_and_check), 4);
}

/* What each rank logged as its quantization buffers (exec_quant.c, at INFO). */
static uint64_t *quant_bytes;

static void quant_bytes_sink(enum rs_log_level level, unsigned long flags, const char *msg)
{
    (void)level;
    (void)flags;
    int r = -1;
    unsigned long long n = 0;
    const char *at = strstr(msg, "rank ");
    if (at && sscanf(at, "rank %d: %llu bytes for quantizing", &r, &n) == 2 && r >= 0 &&
        r < MAX_RANKS)
        quant_bytes[r] = n;
}

static reshard_status_t refit_logging_quant_bytes(int rank, int size, reshard_comm_t *comm)
{
    rs_log_set_sink(quant_bytes_sink);
    reshard_status_t st = refit_and_check(rank, size, comm);
    rs_log_set_sink(NULL);
    return st;
}

/* Weights 4 Mi elements into fused buffers on both sides: the sender's FP8 copy and the
 * receiver's staging copy hold the rank's shard (docs/layouts.md: "a staging copy of its
 * destination shard"), not the fused buffer up to the weight's offset. With every tensor of a
 * model at its offset in one flat buffer, copies reaching back to each offset would add up to
 * the buffer's size times the number of tensors. */
Test(quant_exec, fp8_and_staging_copies_hold_the_shard_not_the_fused_buffer_before_it)
{
    quant_bytes = mmap(NULL, MAX_RANKS * sizeof(uint64_t), PROT_READ | PROT_WRITE,
                       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(quant_bytes, MAP_FAILED);
    memset(quant_bytes, 0, MAX_RANKS * sizeof(uint64_t));
    qc = (struct qcase){.src = "shape=512x256 dtype=bf16 ranks=0-2 place=S(0) buffer=fused "
                               "offset=4194304",
                        .dst = "shape=512x256 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=R,S(1) "
                               "buffer=fused offset=4194304 " BLOCK,
                        .src_kind = 0,
                        .fmt = RS_FP8_E4M3,
                        .er = 128,
                        .ec = 128,
                        .refits = 2,
                        .src_off = 4194304,
                        .dst_off = 4194304};
    all_ok(run_ranks(4, refit_logging_quant_bytes), 4);
    for (int r = 0; r < 4; r++) {
        /* at most: a source shard of 171 x 256 in FP8, the scales, a destination shard of
         * 512 x 128 in bf16 */
        uint64_t most = 171 * 256 + 4 * 2 * 4 + 512 * 128 * 2;
        cr_log_info("rank %d: %llu bytes for quantizing", r, (unsigned long long)quant_bytes[r]);
        cr_assert_gt(quant_bytes[r], 0, "rank %d logged its quantization buffers", r);
        cr_assert_leq(quant_bytes[r], most, "rank %d: %llu bytes, the shards need %llu", r,
                      (unsigned long long)quant_bytes[r], (unsigned long long)most);
    }
    munmap(quant_bytes, MAX_RANKS * sizeof(uint64_t));
}

/* A failed execution: rank 1 receives an FP8 weight from ranks 0 and 2 (block row 1 cut
 * between them, so it lands staged) and a plain 64 MiB tensor from rank 3, which stops itself
 * 150 ms into the execution. Rank 1 times out; the weight's chunks had all landed, and
 * reshard_plan_outcome calls a complete tensor one that holds the new values. */
#define FAIL_W_SRC "shape=384x256 dtype=bf16 ranks=0,2 mesh=2 place=S(0)"
#define FAIL_W_DST "shape=384x256 dtype=fp8e4m3 ranks=1 place=R " BLOCK
#define FAIL_V_SRC "shape=2048x8192 dtype=i32 ranks=3 place=R"
#define FAIL_V_DST "shape=2048x8192 dtype=i32 ranks=1 place=R"

static int *fail_seen; /* [0]: rank 1 failed, [1]: with the weight complete, [2]: right */

static void stop_self(int sig)
{
    (void)sig;
    raise(SIGSTOP);
}

static reshard_status_t weight_complete_then_a_peer_stops(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    struct qside x;
    memset(&x, 0, sizeof(x));
    reshard_layout_t *ws = parse(FAIL_W_SRC), *wd = parse(FAIL_W_DST), *vs = parse(FAIL_V_SRC),
                     *vd = parse(FAIL_V_DST);
    reshard_tensor_t t[2] = {{"layer.w.weight", ws, wd}, {"v", vs, vd}};
    reshard_status_t st = reshard_comm_plan_create(comm, t, 2, NULL, &x.plan);
    reshard_buffers_t b[3] = {{0}};
    if (st == RESHARD_OK && reshard_plan_ntensors(x.plan) != 3)
        st = rs_error(RESHARD_ERR_INTERNAL, "%d tensors", reshard_plan_ntensors(x.plan));
    for (int k = 0; st == RESHARD_OK && k < 3; k++)
        for (int side = 0; side < 2; side++) {
            reshard_layout_t *l = NULL;
            size_t bytes = 0;
            reshard_plan_tensor_layout(x.plan, k, side, &l);
            reshard_layout_shard_bytes(l, rank, &bytes);
            void *p = bytes ? calloc(1, bytes) : NULL;
            if (side) {
                b[k].dst = p;
                b[k].dst_bytes = bytes;
            } else {
                b[k].src = p;
                b[k].src_bytes = bytes;
            }
            if (k != 1) /* the weight and its scales, as qside holds them */
                x.l[k / 2][side] = l;
            else
                reshard_layout_destroy(l);
        }
    x.nt = 2;
    x.b[0] = b[0];
    x.b[1] = b[2];
    struct ref r = {0};
    if (st == RESHARD_OK) {
        ref_make(&r, 384, 256, 0);
        qside_fill(&x, rank, &r, 0);
        b[0] = x.b[0];
        b[2] = x.b[1];
        for (int k = 0; k < 3; k++)
            if (b[k].dst)
                memset(b[k].dst, 0xa5, b[k].dst_bytes);
    }
    if (rank == 3) {
        struct itimerval soon = {.it_value = {.tv_usec = 150 * 1000}};
        signal(SIGALRM, stop_self);
        setitimer(ITIMER_REAL, &soon, NULL);
    }
    if (st == RESHARD_OK)
        st = reshard_plan_execute(x.plan, b);
    reshard_tensor_state_t states[3];
    if (rank == 1 && st != RESHARD_OK && reshard_plan_outcome(x.plan, states) == RESHARD_OK) {
        char why[200] = "";
        fail_seen[0] = 1;
        fail_seen[1] = states[0] == RESHARD_TENSOR_COMPLETE && states[2] == RESHARD_TENSOR_COMPLETE;
        fail_seen[2] = fail_seen[1] && !qside_wrong(&x, rank, &r, why, sizeof(why));
        fprintf(stderr, "rank 1: %s; outcomes %d %d %d; %s\n", reshard_strerror(st), states[0],
                states[1], states[2], why);
    }
    ref_free(&r);
    reshard_plan_destroy(x.plan);
    for (int k = 0; k < 3; k++) {
        free((void *)b[k].src);
        free(b[k].dst);
    }
    for (int k = 0; k < 2; k++)
        for (int side = 0; side < 2; side++)
            reshard_layout_destroy(x.l[k][side]);
    reshard_layout_destroy(ws);
    reshard_layout_destroy(wd);
    reshard_layout_destroy(vs);
    reshard_layout_destroy(vd);
    return RESHARD_OK;
}

Test(quant_exec, a_weight_complete_in_a_failed_execution_holds_its_new_values)
{
    qc = (struct qcase){.src = FAIL_W_SRC,
                        .dst = FAIL_W_DST,
                        .src_kind = 0,
                        .fmt = RS_FP8_E4M3,
                        .er = 128,
                        .ec = 128};
    setenv("RESHARD_TIMEOUT", "3", 1);
    setenv("RESHARD_CHUNK_BYTES", "4096", 1);
    setenv("UCX_LOG_LEVEL", "fatal", 1);
    setenv("RESHARD_NET_PEER_ERRORS", "1", 1);
    fail_seen =
        mmap(NULL, 3 * sizeof(int), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(fail_seen, MAP_FAILED);
    memset(fail_seen, 0, 3 * sizeof(int));
    run_ranks_stalling(4, weight_complete_then_a_peer_stops, 3);
    unsetenv("RESHARD_CHUNK_BYTES");
    unsetenv("RESHARD_NET_PEER_ERRORS");
    setenv("RESHARD_TIMEOUT", "20", 1);
    if (!fail_seen[0] || !fail_seen[1])
        cr_skip_test("rank 1 %s: nothing to check (a loaded host)",
                     fail_seen[0] ? "failed before the weight landed" : "did not fail");
    cr_assert(fail_seen[2], "rank 1: the weight and its scales are reported complete after the "
                            "failure, yet hold other values (its stderr line says which)");
    munmap(fail_seen, 3 * sizeof(int));
}

Test(quant_exec, per_channel_scales_from_f16_into_e5m2)
{
    qc = (struct qcase){.src = "shape=256x192 dtype=f16 ranks=0-3 place=S(1)",
                        .dst = "shape=256x192 dtype=fp8e5m2 ranks=0-3 place=S(0) quant=channel",
                        .src_kind = 1,
                        .fmt = RS_FP8_E5M2,
                        .er = 1,
                        .ec = 192,
                        .refits = 1};
    all_ok(run_ranks(4, refit_and_check), 4);
}

Test(quant_exec, per_channel_scales_quantized_at_the_senders)
{
    qc = (struct qcase){.src = "shape=256x192 dtype=bf16 ranks=0-3 place=S(0)",
                        .dst = "shape=256x192 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=S(0),R "
                               "quant=channel",
                        .src_kind = 0,
                        .fmt = RS_FP8_E4M3,
                        .er = 1,
                        .ec = 192,
                        .refits = 1};
    all_ok(run_ranks(4, refit_and_check), 4);
}

Test(quant_exec, one_scale_per_tensor)
{
    qc = (struct qcase){.src = "shape=200x96 dtype=bf16 ranks=0-3 place=S(0)",
                        .dst = "shape=200x96 dtype=fp8e4m3 ranks=0-3 place=R quant=tensor",
                        .src_kind = 0,
                        .fmt = RS_FP8_E4M3,
                        .er = 200,
                        .ec = 96,
                        .refits = 1};
    all_ok(run_ranks(4, refit_and_check), 4);
}

Test(quant_exec, fp8_sources_move_with_their_scales_unchanged)
{
    qc = (struct qcase){.src = "shape=512x256 dtype=fp8e4m3 ranks=0-3 place=S(0) " BLOCK,
                        .dst = "shape=512x256 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=R,S(1) " BLOCK,
                        .src_kind = 3,
                        .fmt = RS_FP8_E4M3,
                        .er = 128,
                        .ec = 128,
                        .refits = 1};
    all_ok(run_ranks(4, refit_and_check), 4);
}

/* A verified plan: the weight quantized on the way and its computed scales are checked
 * against the codes and scales made where they were quantized, so a right refit passes (blocks
 * quantized at the senders and where they land); an FP8 source moving with its scales is plain
 * data, and checked as such. */
Test(quant_exec, a_right_verified_refit_passes_quantized_on_the_way_or_moved_as_fp8)
{
    qc = (struct qcase){.src = "shape=512x256 dtype=bf16 ranks=0-2 place=S(0)",
                        .dst = "shape=512x256 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=R,S(1) " BLOCK,
                        .src_kind = 0,
                        .fmt = RS_FP8_E4M3,
                        .er = 128,
                        .ec = 128,
                        .refits = 2,
                        .verify = 1};
    all_ok(run_ranks(4, refit_and_check), 4);
    qc.src = "shape=256x256 dtype=fp8e4m3 ranks=0-1 place=S(0) " BLOCK;
    qc.dst = "shape=256x256 dtype=fp8e4m3 ranks=2-3 place=S(1) " BLOCK;
    qc.src_kind = 3;
    all_ok(run_ranks(4, refit_and_check), 4);
}

Test(quant_exec, the_direct_baseline_quantizes_alike)
{
    qc = (struct qcase){.src = "shape=512x256 dtype=bf16 ranks=0-2 place=S(0)",
                        .dst = "shape=512x256 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=R,S(1) " BLOCK,
                        .src_kind = 0,
                        .fmt = RS_FP8_E4M3,
                        .er = 128,
                        .ec = 128,
                        .algo = RESHARD_ALGO_DIRECT,
                        .refits = 1};
    all_ok(run_ranks(4, refit_and_check), 4);
}

/* The broadcast baseline moves bytes and does not quantize: a plan of it with a quantized
 * destination is refused on every rank when it is made, naming the tensor. */
static reshard_status_t bcast_plan(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    struct qside x;
    reshard_status_t st = qside_open(&x, comm, rank, qc.src, qc.dst);
    qside_close(&x);
    return st;
}

Test(quant_exec, the_broadcast_baseline_refuses_a_quantized_destination)
{
    qc = (struct qcase){.src = "shape=512x256 dtype=bf16 ranks=0-3 place=S(0)",
                        .dst = "shape=512x256 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=R,S(1) " BLOCK,
                        .algo = RESHARD_ALGO_BCAST};
    struct outcome *o = run_ranks(4, bcast_plan);
    for (int r = 0; r < 4; r++) {
        cr_assert_eq(o[r].status, RESHARD_ERR_INVALID_ARG, "rank %d: %s", r, o[r].msg);
        cr_assert(strstr(o[r].msg, "tensor 'layer.w.weight' has a quantized destination, which the "
                                   "broadcast baseline does not run"),
                  "rank %d: %s", r, o[r].msg);
    }
}

/* Rank 2 passes its weight as device memory and its scales as host memory: a destination and
 * its scales are quantized together, in one kind of memory. Every rank is told before any byte
 * moves, naming the tensor, and the communicator stays usable: the same plan then runs on host
 * buffers and is checked. */
static reshard_status_t device_weight_on_rank2(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    struct qside x;
    reshard_status_t st = qside_open(&x, comm, rank, qc.src, qc.dst);
    reshard_layout_info_t info = {0};
    if (st == RESHARD_OK)
        st = reshard_layout_info(x.l[0][1], &info);
    if (st != RESHARD_OK) {
        qside_close(&x);
        return st;
    }
    struct ref r;
    ref_make(&r, info.shape[0], info.shape[1], 0);
    qside_fill(&x, rank, &r, 0);
    if (rank == 2)
        x.b[0].mem = RESHARD_MEM_CUDA;
    st = reshard_plan_execute(x.plan, x.b);
    char why[256];
    snprintf(why, sizeof(why), "%s", reshard_last_error());
    x.b[0].mem = RESHARD_MEM_HOST;
    char bad[200] = "";
    if (st != RESHARD_OK && reshard_plan_execute(x.plan, x.b) != RESHARD_OK)
        st = rs_error(RESHARD_ERR_INTERNAL, "the host run after the refusal: %s",
                      reshard_last_error());
    else if (st != RESHARD_OK && qside_wrong(&x, rank, &r, bad, sizeof(bad)))
        st = rs_error(RESHARD_ERR_INTERNAL, "the host run after the refusal: %s", bad);
    else if (st != RESHARD_OK)
        st = rs_error(st, "%s", why);
    /* run_ranks destroys no communicator of a failed rank: leave together, so that no rank
     * exits while another still waits for its acknowledgement */
    char msg[256];
    snprintf(msg, sizeof(msg), "%s", reshard_last_error());
    if (st != RESHARD_OK && reshard_comm_barrier(comm) != RESHARD_OK)
        st = rs_error(RESHARD_ERR_INTERNAL, "barrier: %s", reshard_last_error());
    else if (st != RESHARD_OK)
        st = rs_error(st, "%s", msg); /* the barrier's entry cleared it */
    ref_free(&r);
    qside_close(&x);
    return st;
}

Test(quant_exec, a_device_weight_with_host_scales_is_refused_on_every_rank)
{
    qc = (struct qcase){.src = "shape=512x256 dtype=bf16 ranks=0-3 place=S(0)",
                        .dst = "shape=512x256 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=R,S(1) " BLOCK,
                        .src_kind = 0,
                        .fmt = RS_FP8_E4M3,
                        .er = 128,
                        .ec = 128,
                        .refits = 1};
    struct outcome *o = run_ranks(4, device_weight_on_rank2);
    for (int r = 0; r < 4; r++) {
        cr_assert_eq(o[r].status, r == 2 ? RESHARD_ERR_INVALID_ARG : RESHARD_ERR_REMOTE,
                     "rank %d: %s", r, o[r].msg);
        cr_assert(strstr(o[r].msg, "rank 2: tensor 'layer.w.weight' is in device memory and its "
                                   "scales 'layer.w.weight_scale_inv' in host memory"),
                  "rank %d: %s", r, o[r].msg);
    }
}

Test(quant_exec, plan_tensor_queries_name_the_scales_and_refuse_what_is_not_there)
{
    reshard_layout_t *s = parse("shape=256x256 dtype=bf16 ranks=0-1 place=S(0)");
    reshard_layout_t *d = parse("shape=256x256 dtype=fp8e4m3 ranks=2-3 place=S(1) " BLOCK);
    reshard_tensor_t t[2] = {{"a.weight", s, d}, {"b", s, d}};
    reshard_topo_t *topo = NULL;
    cr_assert_eq(reshard_topo_create(4, 2, NULL, &topo), RESHARD_OK);
    reshard_plan_t *p = NULL;
    cr_assert_eq(reshard_plan_create(t, 2, topo, NULL, &p), RESHARD_OK, "%s", reshard_last_error());
    cr_assert_eq(reshard_plan_ntensors(p), 4);
    cr_assert_str_eq(reshard_plan_tensor_name(p, 2), "a.weight_scale_inv");
    cr_assert_str_eq(reshard_plan_tensor_name(p, 3), "b.scale");
    cr_assert_null(reshard_plan_tensor_name(p, 4));
    cr_assert_null(reshard_plan_tensor_name(p, -1));
    reshard_layout_t *l = NULL;
    cr_assert_eq(reshard_plan_tensor_layout(p, 2, 1, &l), RESHARD_OK);
    reshard_layout_info_t info;
    cr_assert_eq(reshard_layout_info(l, &info), RESHARD_OK);
    cr_assert_eq(info.shape[0], 2);
    cr_assert_eq(info.shape[1], 2);
    cr_assert_eq(info.elem_size, 4, "float32 scales");
    size_t bytes = 0;
    cr_assert_eq(reshard_layout_shard_bytes(l, 3, &bytes), RESHARD_OK);
    cr_assert_eq(bytes, 2 * 1 * 4, "rank 3 holds the second block column");
    reshard_layout_destroy(l);
    cr_assert_eq(reshard_plan_tensor_layout(p, 4, 0, &l), RESHARD_ERR_INVALID_ARG);
    cr_assert(strstr(reshard_last_error(), "tensor 4 side 0: the plan has 4 tensors"), "%s",
              reshard_last_error());
    cr_assert_eq(reshard_plan_tensor_layout(p, 0, 2, &l), RESHARD_ERR_INVALID_ARG);
    cr_assert_eq(reshard_plan_ntensors(NULL), 0);
    reshard_plan_destroy(p);
    reshard_topo_destroy(topo);
    reshard_layout_destroy(s);
    reshard_layout_destroy(d);
}

/* ---- device buffers, quantized by the kernels (the stand-in runs them on the host) ---- */

/* Ranks 0 and 1 pass device buffers, 2 and 3 host ones: the device senders quantize their
 * blocks with the kernels, the host senders on the host, to the same bits. */
Test(quant_exec, device_sources_quantize_at_the_senders_with_the_kernels)
{
    use_fake_cuda();
    qc = (struct qcase){.src = "shape=512x256 dtype=bf16 ranks=0-3 place=S(0)",
                        .dst = "shape=512x256 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=R,S(1) " BLOCK,
                        .src_kind = 0,
                        .fmt = RS_FP8_E4M3,
                        .er = 128,
                        .ec = 128,
                        .refits = 2,
                        .dev_ranks = 0x3};
    all_ok(run_ranks(4, refit_and_check), 4);
    for (int r = 0; r < 4; r++)
        cr_assert_eq(quant_launches[r] > 0, r < 2, "rank %d: %llu kernel launches", r,
                     (unsigned long long)quant_launches[r]);
}

/* Sources that cut blocks: what lands staged on the device ranks is quantized there by the
 * kernels, straight into the device destination and scales. */
Test(quant_exec, device_destinations_quantize_staged_blocks_with_the_kernels)
{
    use_fake_cuda();
    qc = (struct qcase){.src = "shape=512x256 dtype=bf16 ranks=0-2 place=S(0)",
                        .dst =
                            "shape=512x256 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=S(0),S(1) " BLOCK,
                        .src_kind = 0,
                        .fmt = RS_FP8_E4M3,
                        .er = 128,
                        .ec = 128,
                        .refits = 2,
                        .dev_ranks = 0xa};
    all_ok(run_ranks(4, refit_and_check), 4);
    cr_assert_eq(at_src_pct[0], 50.0, "half the blocks staged: %f", at_src_pct[0]);
    for (int r = 0; r < 4; r++)
        cr_assert_eq(quant_launches[r] > 0, r % 2 == 1, "rank %d: %llu kernel launches", r,
                     (unsigned long long)quant_launches[r]);
}

/* Every rank on the device: f32 with a partial last block and columns cut inside blocks. */
Test(quant_exec, device_buffers_with_partial_blocks_from_f32)
{
    use_fake_cuda();
    qc = (struct qcase){.src = "shape=320x200 dtype=f32 ranks=0-3 mesh=2x2 place=R,S(1)",
                        .dst = "shape=320x200 dtype=fp8e4m3 ranks=1-3 place=R " BLOCK,
                        .src_kind = 2,
                        .fmt = RS_FP8_E4M3,
                        .er = 128,
                        .ec = 128,
                        .refits = 1,
                        .dev_ranks = 0xf};
    all_ok(run_ranks(4, refit_and_check), 4);
    for (int r = 1; r < 4; r++)
        cr_assert_gt(quant_launches[r], 0, "rank %d quantized on its device", r);
}

Test(quant_exec, device_buffers_per_channel_f16_into_e5m2_and_at_offsets)
{
    use_fake_cuda();
    qc = (struct qcase){.src = "shape=256x192 dtype=f16 ranks=0-3 place=S(1)",
                        .dst = "shape=256x192 dtype=fp8e5m2 ranks=0-3 place=S(0) quant=channel "
                               "buffer=fused offset=77",
                        .src_kind = 1,
                        .fmt = RS_FP8_E5M2,
                        .er = 1,
                        .ec = 192,
                        .refits = 1,
                        .dst_off = 77,
                        .dev_ranks = 0xf};
    all_ok(run_ranks(4, refit_and_check), 4);
    for (int r = 0; r < 4; r++)
        cr_assert_gt(quant_launches[r], 0, "rank %d quantized on its device", r);
}

Test(quant_exec, device_buffers_one_scale_per_tensor_at_the_sender)
{
    use_fake_cuda();
    qc = (struct qcase){.src = "shape=200x96 dtype=bf16 ranks=0-1 place=R",
                        .dst = "shape=200x96 dtype=fp8e4m3 ranks=2-3 place=R quant=tensor",
                        .src_kind = 0,
                        .fmt = RS_FP8_E4M3,
                        .er = 200,
                        .ec = 96,
                        .refits = 1,
                        .dev_ranks = 0xf};
    all_ok(run_ranks(4, refit_and_check), 4);
    cr_assert_eq(at_src_pct[0], 100.0, "the senders hold the tensor whole: %f", at_src_pct[0]);
    for (int r = 0; r < 2; r++)
        cr_assert_gt(quant_launches[r], 0, "rank %d quantized on its device", r);
}

/* Rank 2 passes device buffers the kernels cannot take: refused on every rank before anything
 * moves. */
static reshard_status_t device_bufs_on_rank2(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    struct qside x;
    reshard_status_t st = qside_open(&x, comm, rank, qc.src, qc.dst);
    if (st == RESHARD_OK) {
        if (rank == 2)
            x.b[0].mem = x.b[1].mem = RESHARD_MEM_CUDA; /* refused before any access */
        st = reshard_plan_execute(x.plan, x.b);
    }
    char msg[256];
    snprintf(msg, sizeof(msg), "%s", reshard_last_error());
    if (reshard_comm_barrier(comm) != RESHARD_OK)
        st = rs_error(RESHARD_ERR_INTERNAL, "barrier: %s", reshard_last_error());
    else if (st != RESHARD_OK)
        st = rs_error(st, "%s", msg);
    qside_close(&x);
    return st;
}

Test(quant_exec, a_strided_device_destination_is_refused_on_every_rank)
{
    use_fake_cuda();
    qc = (struct qcase){.src = "shape=512x256 dtype=bf16 ranks=0-3 place=S(0)",
                        .dst = "shape=512x256 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=R,S(1) "
                               "view=512x128 strides=130x1 " BLOCK,
                        .src_kind = 0,
                        .fmt = RS_FP8_E4M3,
                        .er = 128,
                        .ec = 128,
                        .refits = 1};
    struct outcome *o = run_ranks(4, device_bufs_on_rank2);
    for (int r = 0; r < 4; r++) {
        cr_assert_eq(o[r].status, r == 2 ? RESHARD_ERR_INVALID_ARG : RESHARD_ERR_REMOTE,
                     "rank %d: %s", r, o[r].msg);
        cr_assert(strstr(o[r].msg, "rank 2: tensor 'layer.w.weight' is quantized on the way on "
                                   "the device, which takes a destination shard that is one "
                                   "row-major box: this one is a strided view"),
                  "rank %d: %s", r, o[r].msg);
    }
}

Test(quant_exec, a_device_source_of_several_runs_is_refused_on_every_rank)
{
    use_fake_cuda();
    /* SS(0,2) over 4 ranks: each holds two runs of 64 rows */
    qc = (struct qcase){.src = "shape=512x256 dtype=bf16 ranks=0-3 mesh=4 place=SS(0,2)",
                        .dst = "shape=512x256 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=R,S(1) " BLOCK,
                        .src_kind = 0,
                        .fmt = RS_FP8_E4M3,
                        .er = 128,
                        .ec = 128,
                        .refits = 1};
    struct outcome *o = run_ranks(4, device_bufs_on_rank2);
    for (int r = 0; r < 4; r++) {
        cr_assert_eq(o[r].status, r == 2 ? RESHARD_ERR_INVALID_ARG : RESHARD_ERR_REMOTE,
                     "rank %d: %s", r, o[r].msg);
        cr_assert(strstr(o[r].msg, "rank 2: tensor 'layer.w.weight' is quantized on the way on "
                                   "the device, which takes a source shard that is one "
                                   "row-major box: this one holds several runs of dim 0"),
                  "rank %d: %s", r, o[r].msg);
    }
}

/* With a GPU (gpu-check's gpu-unit step): the kernels themselves, in forked ranks on device
 * buffers, senders and receivers of staged blocks, every element and scale against the
 * reference; on the stand-in the same through its emulation. */
Test(gpu, quant_exec_on_device_buffers_gives_the_host_reference, .timeout = 120)
{
    need_kernels();
    setup();
    qc = (struct qcase){.src = "shape=512x256 dtype=bf16 ranks=0-2 place=S(0)",
                        .dst =
                            "shape=512x256 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=S(0),S(1) " BLOCK,
                        .src_kind = 0,
                        .fmt = RS_FP8_E4M3,
                        .er = 128,
                        .ec = 128,
                        .refits = 2,
                        .dev_ranks = 0xf};
    struct outcome *o = run_ranks(4, refit_and_check);
    if (o[0].status == RESHARD_ERR_UNAVAILABLE)
        cr_skip_test("no CUDA device (%s)", o[0].msg);
    all_ok(o, 4);
    cr_assert_eq(at_src_pct[0], 50.0, "half the blocks at the senders: %f", at_src_pct[0]);
    teardown();
}

static int failing_rank;

static void fail_launches_on(int rank)
{
    if (rank == failing_rank)
        setenv("FAKE_CUDA_FAIL", "cuLaunchKernel", 1);
}

/* The quantization kernel fails on a device sender (before it sends: every rank fails, none
 * waits for it) and on a device receiver (after everything landed: it fails, naming the
 * call). */
Test(quant_exec, a_failed_quantization_kernel_fails_the_refit)
{
    use_fake_cuda();
    qc = (struct qcase){.src = "shape=512x256 dtype=bf16 ranks=0-2 place=S(0)",
                        .dst =
                            "shape=512x256 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=S(0),S(1) " BLOCK,
                        .src_kind = 0,
                        .fmt = RS_FP8_E4M3,
                        .er = 128,
                        .ec = 128,
                        .refits = 1,
                        .dev_ranks = 0xf};
    rank_setup = fail_launches_on;
    failing_rank = 0; /* holds block row 0 whole: quantizes it before sending */
    struct outcome *o = run_ranks(4, refit_and_check);
    for (int r = 0; r < 4; r++) {
        cr_assert_neq(o[r].status, RESHARD_OK, "rank %d succeeded", r);
        cr_assert(strstr(o[r].msg, "rank 0: quantizing tensor 'layer.w.weight' on the device "
                                   "before sending: cuda: cuLaunchKernel: fake error"),
                  "rank %d: %s", r, o[r].msg);
    }
    failing_rank = 3; /* receives block row 2 staged: quantizes it once it landed */
    o = run_ranks(4, refit_and_check);
    rank_setup = NULL;
    cr_assert_neq(o[3].status, RESHARD_OK, "rank 3 succeeded");
    cr_assert(strstr(o[3].msg, "rank 3: quantizing tensor 'layer.w.weight' on the device where it "
                               "landed: cuda: cuLaunchKernel: fake error"),
              "rank 3: %s", o[3].msg);
}

/* Both sides inside fused device buffers, at offsets: blocks quantized at the device senders
 * and where they land alike. */
Test(quant_exec, device_shards_placed_at_offsets_in_their_buffers)
{
    use_fake_cuda();
    qc = (struct qcase){.src = "shape=512x256 dtype=bf16 ranks=0-2 place=S(0) buffer=fused "
                               "offset=1000",
                        .dst = "shape=512x256 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=R,S(1) "
                               "buffer=fused offset=333 " BLOCK,
                        .src_kind = 0,
                        .fmt = RS_FP8_E4M3,
                        .er = 128,
                        .ec = 128,
                        .refits = 2,
                        .src_off = 1000,
                        .dst_off = 333,
                        .dev_ranks = 0xf};
    all_ok(run_ranks(4, refit_and_check), 4);
    for (int r = 0; r < 4; r++)
        cr_assert_gt(quant_launches[r], 0, "rank %d quantized on its device", r);
}

/* More layouts, each on both algorithms, three refits: strided shards on either side, padded
 * rows (strides) on both, a replicated destination of staged blocks, blocks smaller than the
 * shards with partial last ones, and every other case into and out of freshly allocated
 * buffers each refit (so that nothing of an earlier execution's addresses is reused). */
Test(quant_exec, more_layouts_and_fresh_buffers_each_refit)
{
    const char *cases[][2] = {
        {"shape=512x256 dtype=bf16 ranks=0-3 mesh=2x2 place=SS(0,2),S(0)",
         "shape=512x256 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=R,S(1) " BLOCK},
        {"shape=512x256 dtype=bf16 ranks=0-3 place=S(1)",
         "shape=512x256 dtype=fp8e4m3 ranks=0-1 place=SS(0,2) " BLOCK},
        {"shape=512x256 dtype=bf16 ranks=0-2 place=S(1)",
         "shape=512x256 dtype=fp8e4m3 ranks=0-3 place=R " BLOCK},
        {"shape=256x200 dtype=f32 ranks=0-2 mesh=3 place=S(0)",
         "shape=256x200 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=S(0),R quant=block(128,128)"},
        {"shape=300x256 dtype=bf16 ranks=1-3 place=S(1)",
         "shape=300x256 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=S(1),R quant=block(64,32)"},
        {"shape=512x256 dtype=bf16 ranks=0-2 place=S(0) strides=300x1",
         "shape=512x256 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=R,S(1) strides=200x1 " BLOCK},
        {"shape=512x256 dtype=bf16 ranks=3 place=R",
         "shape=512x256 dtype=fp8e4m3 ranks=0-3 mesh=4 place=R " BLOCK},
        {"shape=512x256 dtype=bf16 ranks=0-3 mesh=2x2 place=S(1),S(0)",
         "shape=512x256 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=SS(1,2),S(0) "
         "quant=block(128,64)"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        for (int algo = 0; algo < 2; algo++) {
            int er = 128, ec = 128;
            if (strstr(cases[i][1], "block(64,32)"))
                er = 64, ec = 32;
            if (strstr(cases[i][1], "block(128,64)"))
                ec = 64;
            qc = (struct qcase){.src = cases[i][0],
                                .dst = cases[i][1],
                                .src_kind = strstr(cases[i][0], "f32") ? 2 : 0,
                                .fmt = RS_FP8_E4M3,
                                .er = er,
                                .ec = ec,
                                .algo = algo ? RESHARD_ALGO_DIRECT : RESHARD_ALGO_RESHARD,
                                .refits = 2};
            qc.fresh = i % 2;
            qc.refits = 3;
            if (strstr(cases[i][0], "strides"))
                qc.src_pitch = 300, qc.dst_pitch = 200;
            struct outcome *o = run_ranks(4, refit_and_check);
            for (int r = 0; r < 4; r++)
                cr_assert_eq(o[r].status, RESHARD_OK, "case %zu (%s -> %s) algo %d rank %d: %s", i,
                             cases[i][0], cases[i][1], algo, r, o[r].msg);
        }
}

/* ---- a flipped bit in an FP8 destination, caught by the verified refit ---- */

/* One verified refit with RESHARD_TEST_FLIP set to spec ("" for none): RESHARD_OK when it
 * passes, RESHARD_ERR_VERIFY when it fails naming `name` and nothing else, else an error. */
static reshard_status_t flipped_refit(struct qside *x, int rank, int it, const char *spec,
                                      const char *name)
{
    struct ref r;
    reshard_layout_info_t info = {0};
    reshard_status_t st = reshard_layout_info(x->l[0][1], &info);
    if (st != RESHARD_OK)
        return st;
    ref_make(&r, info.shape[0], info.shape[1], it);
    qside_fill(x, rank, &r, it);
    setenv("RESHARD_TEST_FLIP", spec, 1);
    rs_param_reload();
    reshard_buffers_t b[2];
    if ((st = bufs_for(x, rank, b)) == RESHARD_OK)
        st = reshard_plan_execute(x->plan, b);
    char m[512];
    snprintf(m, sizeof(m), "%s", reshard_last_error());
    bufs_back(x, rank, b);
    if (qc.dev_ranks) {
        int (*n)(void) = (int (*)(void))fake_fn("fake_cuda_quant_launches");
        quant_launches[rank] = n ? (uint64_t)n() : 0;
    }
    unsetenv("RESHARD_TEST_FLIP");
    rs_param_reload();
    char why[200] = "";
    int64_t wrong = qside_wrong(x, rank, &r, why, sizeof(why));
    ref_free(&r);
    if (!name) {
        if (st != RESHARD_OK || wrong)
            return rs_error(RESHARD_ERR_INTERNAL, "rank %d: unflipped refit: %s, %lld wrong (%s)",
                            rank, m, (long long)wrong, why);
        return RESHARD_OK;
    }
    char want[128];
    snprintf(want, sizeof(want), "differs from its source after the refit: %s", name);
    const char *at = strstr(m, want);
    /* the weight's name is the start of its scales' */
    int named = at && (at[strlen(want)] == '\0' || at[strlen(want)] == ' ');
    if (st != RESHARD_ERR_VERIFY || !named)
        return rs_error(RESHARD_ERR_INTERNAL, "rank %d: flipped %s: %s: %s", rank, name,
                        reshard_strerror(st), m);
    return RESHARD_ERR_VERIFY;
}

/* A verified plan: a right refit passes; one bit flipped in an FP8 code on one rank fails the
 * refit on every rank naming the weight; one flipped in a scale, naming its scales. */
static reshard_status_t flips_caught(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    struct qside x;
    qc.verify = 1;
    reshard_status_t st = qside_open(&x, comm, rank, qc.src, qc.dst);
    char spec[2][128];
    snprintf(spec[0], sizeof(spec[0]), "%d:layer.w.weight:%lld", qc.flip_code_rank,
             qc.flip_code_byte);
    snprintf(spec[1], sizeof(spec[1]), "%d:layer.w.weight_scale_inv:%lld", qc.flip_scale_rank,
             qc.flip_scale_byte);
    if (st == RESHARD_OK)
        st = flipped_refit(&x, rank, 0, "", NULL);
    if (st == RESHARD_OK)
        st = flipped_refit(&x, rank, 1, spec[0], "layer.w.weight");
    if (st == RESHARD_ERR_VERIFY)
        st = flipped_refit(&x, rank, 2, spec[1], "layer.w.weight_scale_inv");
    if (st == RESHARD_ERR_VERIFY) /* and the plan still refits right */
        st = flipped_refit(&x, rank, 3, "", NULL);
    if (st == RESHARD_ERR_VERIFY)
        st = RESHARD_OK;
    qside_close(&x);
    return st;
}

/* 512 x 256 bf16 on ranks 0-3 by rows into e4m3 128 x 128 blocks on a 2 x 2 mesh (R, S(1)):
 * every block is quantized at its sender. Ranks 1 and 3 hold columns 128-255. */
#define FLIP_AT_SRC_SRC "shape=512x256 dtype=bf16 ranks=0-3 place=S(0)"
#define FLIP_AT_SRC_DST "shape=512x256 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=R,S(1) " BLOCK
/* the same from three source ranks (171, 171, 170 rows), into S(0), S(1): the blocks of rows
 * 128-383 are cut between sources and quantized where they land; rank 0 holds rows 0-255 and
 * columns 0-127, rank 3 rows 256-511 and columns 128-255 */
#define FLIP_AT_DST_SRC "shape=512x256 dtype=bf16 ranks=0-2 place=S(0)"
#define FLIP_AT_DST_DST "shape=512x256 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=S(0),S(1) " BLOCK

Test(quant_exec, a_flipped_fp8_code_or_scale_quantized_at_the_sender_fails_the_verified_refit)
{
    qc = (struct qcase){.src = FLIP_AT_SRC_SRC,
                        .dst = FLIP_AT_SRC_DST,
                        .fmt = RS_FP8_E4M3,
                        .er = 128,
                        .ec = 128,
                        .flip_code_rank = 3,
                        .flip_code_byte = 300 * 128 + 77,
                        .flip_scale_rank = 2,
                        .flip_scale_byte = 4};
    all_ok(run_ranks(4, flips_caught), 4);
}

Test(quant_exec, a_flipped_fp8_code_or_scale_quantized_where_it_lands_fails_the_verified_refit)
{
    /* rank 0's row 200 is in block row 1 (cut between sources); its second scale, block (1, 0) */
    qc = (struct qcase){.src = FLIP_AT_DST_SRC,
                        .dst = FLIP_AT_DST_DST,
                        .fmt = RS_FP8_E4M3,
                        .er = 128,
                        .ec = 128,
                        .flip_code_rank = 0,
                        .flip_code_byte = 200 * 128 + 5,
                        .flip_scale_rank = 0,
                        .flip_scale_byte = 4};
    all_ok(run_ranks(4, flips_caught), 4);
    /* rank 3's row 400 is in block row 3, whole on source rank 2: quantized at its sender */
    qc.flip_code_rank = 3;
    qc.flip_code_byte = (400 - 256) * 128 + 9;
    qc.flip_scale_rank = 3;
    qc.flip_scale_byte = 4;
    all_ok(run_ranks(4, flips_caught), 4);
}

/* A bit flipped in a rank's staged bf16 before it is quantized (as on the way): the codes are
 * made from the flipped value and agree with it, and the staged elements' transit check, made
 * as the block is quantized, fails every rank naming the weight; the next refit passes. */
static reshard_status_t staged_flip_caught(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    struct qside x;
    qc.verify = 1;
    reshard_status_t st = qside_open(&x, comm, rank, qc.src, qc.dst);
    char spec[128];
    snprintf(spec, sizeof(spec), "%d:layer.w.weight@staged:%lld", qc.flip_code_rank,
             qc.flip_code_byte);
    if (st == RESHARD_OK)
        st = flipped_refit(&x, rank, 0, "", NULL);
    if (st == RESHARD_OK)
        st = flipped_refit(&x, rank, 1, spec, "layer.w.weight");
    if (st == RESHARD_ERR_VERIFY)
        st = flipped_refit(&x, rank, 2, "", NULL);
    qside_close(&x);
    return st;
}

Test(quant_exec, a_bit_flipped_in_staged_bf16_before_quantizing_fails_the_verified_refit)
{
    /* rank 0's staged row 200 (block row 1, cut between sources), column 5, its low byte */
    qc = (struct qcase){.src = FLIP_AT_DST_SRC,
                        .dst = FLIP_AT_DST_DST,
                        .fmt = RS_FP8_E4M3,
                        .er = 128,
                        .ec = 128,
                        .flip_code_rank = 0,
                        .flip_code_byte = 2 * (200 * 128 + 5)};
    all_ok(run_ranks(4, staged_flip_caught), 4);
}

/* Blocks 100 columns wide: codes are fingerprinted one at a time (eight at a time needs every
 * block to start on a multiple of 8), and a flip is caught alike. */
Test(quant_exec, a_flipped_fp8_code_in_blocks_not_a_multiple_of_8_wide_fails_the_verified_refit)
{
    qc = (struct qcase){.src = "shape=512x200 dtype=bf16 ranks=0-3 place=S(0)",
                        .dst = "shape=512x200 dtype=fp8e4m3 ranks=0-3 mesh=2x2 place=R,S(1) "
                               "quant=block(64,100)",
                        .fmt = RS_FP8_E4M3,
                        .er = 64,
                        .ec = 100,
                        .flip_code_rank = 3,
                        .flip_code_byte = 300 * 100 + 7,
                        .flip_scale_rank = 1,
                        .flip_scale_byte = 8};
    all_ok(run_ranks(4, flips_caught), 4);
}

/* The four refits of flips_caught, each into newly allocated device buffers of the stand-in:
 * local peers write them through CUDA IPC, so each refit's handles must open the new
 * allocations, not a mapping of a freed one kept since an earlier refit. */
Test(quant_exec, flipped_fp8_codes_and_scales_on_device_buffers_fail_the_verified_refit)
{
    use_fake_cuda();
    qc = (struct qcase){.src = FLIP_AT_SRC_SRC,
                        .dst = FLIP_AT_SRC_DST,
                        .fmt = RS_FP8_E4M3,
                        .er = 128,
                        .ec = 128,
                        .dev_ranks = 0xf,
                        .flip_code_rank = 1,
                        .flip_code_byte = 17,
                        .flip_scale_rank = 3,
                        .flip_scale_byte = 0};
    all_ok(run_ranks(4, flips_caught), 4);
    qc.src = FLIP_AT_DST_SRC; /* quantized where they land, on the device */
    qc.dst = FLIP_AT_DST_DST;
    qc.flip_code_rank = 0;
    qc.flip_code_byte = 200 * 128 + 5;
    qc.flip_scale_rank = 0;
    qc.flip_scale_byte = 4;
    all_ok(run_ranks(4, flips_caught), 4);
    for (int r = 0; r < 4; r++)
        cr_assert_gt(quant_launches[r], 0, "rank %d quantized on its device", r);
}
