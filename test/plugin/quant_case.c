/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The FP8 refits of the quant_exec suite (quant_case.h): the host reference, one rank's
 * buffers, the device copies of the stand-in libcuda, the refit each rank runs and checks, and
 * the suite itself, whose tests are in test_quant_exec.c (host buffers), test_quant_exec_dev.c
 * (device buffers) and test_quant_exec_verify.c (flipped bits caught by a verified refit).
 */
#include "quant_case.h"
#include "ranks.h"
#include "side.h"
#include "base/error.h"
#include "cuda/cuda_lib.h"

#include <criterion/criterion.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

struct qcase qc;
uint64_t *net_fp8, *net_bf16;
double *at_src_pct;
uint64_t *quant_launches;

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

void ref_make(struct ref *r, int64_t rows, int64_t cols, int it)
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

void ref_free(struct ref *r)
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

reshard_status_t qside_open(struct qside *x, reshard_comm_t *comm, int rank, const char *src,
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

void qside_close(struct qside *x)
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
void qside_fill(struct qside *x, int rank, const struct ref *r, int it)
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
int64_t qside_wrong(const struct qside *x, int rank, const struct ref *r, char *why, size_t n)
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

void *fake_fn(const char *name)
{
    void *h = dlopen(getenv("RESHARD_CUDA_LIB"), RTLD_NOW | RTLD_GLOBAL);
    return h ? dlsym(h, name) : NULL;
}

/* The device cases need the kernels (the stand-in emulates them, but loads only a fatbin). */
void need_kernels(void)
{
    size_t n;
    if (!cuda_fatbin(&n))
        cr_skip_test("this build had no nvcc: no quantization kernels");
}

void use_fake_cuda(void)
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
reshard_status_t bufs_for(const struct qside *x, int rank, reshard_buffers_t *b)
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
void bufs_back(const struct qside *x, int rank, const reshard_buffers_t *b)
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

reshard_status_t refit_and_check(int rank, int size, reshard_comm_t *comm)
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

void quant_exec_setup(void)
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

void quant_exec_teardown(void)
{
    munmap(net_fp8, 4 * MAX_RANKS * sizeof(uint64_t));
}

TestSuite(quant_exec, .init = quant_exec_setup, .fini = quant_exec_teardown, .timeout = 120);
