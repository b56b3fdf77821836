/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The compare-and-compact kernels (cuda_delta_encode / cuda_delta_apply, pack.cu through
 * cuda/delta_desc.h) against the host codec (plugin/exec/delta.c): for elements of 1, 2, 4 and
 * 8 bytes, chunks that are and are not whole 64-element words, and changes from none to all,
 * uniform and in runs, the device's message is the host's byte for byte (the chunks stay below
 * the host's sampled shortcut to dense), the snapshot holds the chunk afterwards, and applying
 * the host's message on the device gives the chunk. On the stand-in libcuda the kernels'
 * emulation runs (its launch counter says so); with a GPU the kernels themselves.
 */
#include "base/error.h"
#include "cuda/cuda_lib.h"
#include "cuda/delta_desc.h"
#include "plugin/exec/delta.h"

#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void fake_driver(void)
{
    char path[512];
    const char *b = getenv("RESHARD_BUILD");
    snprintf(path, sizeof(path), "%s/test/fake/libcuda.so.1", b && *b ? b : "build");
    setenv("RESHARD_CUDA_LIB", path, 1);
}

static int fake_delta_launches(void)
{
    void *h = dlopen(getenv("RESHARD_CUDA_LIB"), RTLD_NOW | RTLD_NOLOAD);
    int (*f)(void) = h ? (int (*)(void))dlsym(h, "fake_cuda_delta_launches") : NULL;
    return f ? f() : -1;
}

static uint64_t mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15u;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

/* Element i changes under pattern p: 0 none, 1 one element, 2..5 uniform 1/5/30/60 %, 6 runs
 * of 100 at 5 %, 7 every element, 8 every other element. */
static int changes(int p, int64_t i, int64_t n)
{
    static const unsigned pct[] = {0, 0, 1, 5, 30, 60};
    switch (p) {
    case 0:
        return 0;
    case 1:
        return i == n / 2;
    case 6:
        return mix((uint64_t)(i / 100) * 7) % 100 < 5;
    case 7:
        return 1;
    case 8:
        return i % 2;
    default:
        return mix((uint64_t)i * 3 + (uint64_t)p) % 100 < pct[p];
    }
}

struct dev_bufs {
    cu_deviceptr cur, snap, msg, words, cnt, starts, info;
};

static cu_deviceptr dalloc(const struct cuda_fns *fn, size_t n)
{
    cu_deviceptr p;
    cr_assert_eq(fn->mem_alloc(&p, n ? n : 1), CU_SUCCESS);
    return p;
}

/* One chunk: returns the encoding's kind. */
static int check_chunk(const struct cuda_fns *fn, int es, int64_t n, int p)
{
    size_t bytes = (size_t)n * (size_t)es, nw = (size_t)rs_delta_nwords(n);
    char *snap = malloc(bytes), *cur = malloc(bytes), *hsnap = malloc(bytes);
    char *hout = malloc(bytes), *dout = malloc(bytes), *got = malloc(bytes);
    uint64_t *words = calloc(nw + 1, 8);
    for (size_t b = 0; b < bytes; b++)
        snap[b] = (char)mix(b * 11 + (size_t)es);
    memcpy(cur, snap, bytes);
    for (int64_t i = 0; i < n; i++)
        if (changes(p, i, n))
            cur[(size_t)i * (size_t)es] ^= 0x5a; /* the first byte: the element differs */
    memcpy(hsnap, snap, bytes);
    size_t hlen;
    delta_encode(cur, hsnap, (size_t)n, (size_t)es, hout, &hlen, words);

    struct dev_bufs d = {dalloc(fn, bytes),
                         dalloc(fn, bytes),
                         dalloc(fn, bytes),
                         dalloc(fn, nw * 8),
                         dalloc(fn, (nw + 1) * 4),
                         dalloc(fn, (nw + 1) * 4),
                         dalloc(fn, sizeof(struct rs_delta_info))};
    cr_assert_eq(fn->memcpy_htod(d.cur, cur, bytes), CU_SUCCESS);
    cr_assert_eq(fn->memcpy_htod(d.snap, snap, bytes), CU_SUCCESS);
    struct rs_delta_desc desc = {.n = n,
                                 .nwords = (int64_t)nw,
                                 .esize = es,
                                 .cur = (const char *)(uintptr_t)d.cur,
                                 .snap = (char *)(uintptr_t)d.snap,
                                 .msg = (char *)(uintptr_t)d.msg,
                                 .words = (uint64_t *)(uintptr_t)d.words,
                                 .cnt = (uint32_t *)(uintptr_t)d.cnt,
                                 .starts = (uint32_t *)(uintptr_t)d.starts,
                                 .info = (struct rs_delta_info *)(uintptr_t)d.info};
    cr_assert_eq(cuda_delta_encode(&desc, NULL), RESHARD_OK, "%s", rs_error_message());
    struct rs_delta_info in;
    cr_assert_eq(fn->ctx_synchronize(), CU_SUCCESS);
    cr_assert_eq(fn->memcpy_dtoh(&in, d.info, sizeof(in)), CU_SUCCESS);
    cr_assert_eq(fn->memcpy_dtoh(got, d.snap, bytes), CU_SUCCESS);
    cr_assert(!memcmp(got, cur, bytes), "es %d n %lld pattern %d: the snapshot is not the chunk",
              es, (long long)n, p);
    if (hlen == 0) {
        cr_assert_eq(in.kind, RS_DELTA_DENSE,
                     "es %d n %lld pattern %d: the host went dense, the "
                     "device chose kind %u (%llu bytes)",
                     es, (long long)n, p, in.kind, (unsigned long long)in.len);
        cr_assert_eq(in.len, bytes);
    } else {
        cr_assert_eq(in.len, hlen, "es %d n %lld pattern %d: %llu bytes, the host %zu", es,
                     (long long)n, p, (unsigned long long)in.len, hlen);
        cr_assert_eq(fn->memcpy_dtoh(dout, d.msg, hlen), CU_SUCCESS);
        for (size_t b = 0; b < hlen; b++)
            cr_assert_eq(dout[b], hout[b],
                         "es %d n %lld pattern %d (kind %u): byte %zu of %zu is 0x%02x, the "
                         "host's 0x%02x",
                         es, (long long)n, p, in.kind, b, hlen, (unsigned char)dout[b],
                         (unsigned char)hout[b]);
        /* The host's message, applied on the device to the old chunk, gives the new one. */
        struct delta_hdr h;
        memcpy(&h, hout, sizeof(h));
        cr_assert_eq(fn->memcpy_htod(d.snap, snap, bytes), CU_SUCCESS);
        cr_assert_eq(fn->memcpy_htod(d.msg, hout, hlen), CU_SUCCESS);
        struct rs_delta_desc a = desc;
        a.nruns = h.nruns;
        if (h.kind != DELTA_NONE)
            cr_assert_eq(cuda_delta_apply(&a, h.kind, NULL), RESHARD_OK, "%s", rs_error_message());
        cr_assert_eq(fn->ctx_synchronize(), CU_SUCCESS);
        cr_assert_eq(fn->memcpy_dtoh(got, d.snap, bytes), CU_SUCCESS);
        cr_assert(!memcmp(got, cur, bytes),
                  "es %d n %lld pattern %d (kind %u): applied on the "
                  "device, the chunk differs",
                  es, (long long)n, p, h.kind);
    }
    fn->mem_free(d.cur), fn->mem_free(d.snap), fn->mem_free(d.msg), fn->mem_free(d.words);
    fn->mem_free(d.cnt), fn->mem_free(d.starts), fn->mem_free(d.info);
    free(snap), free(cur), free(hsnap), free(hout), free(dout), free(got), free(words);
    return (int)in.kind;
}

static void check_all(const struct cuda_fns *fn)
{
    static const int64_t sizes[] = {1, 63, 64, 65, 1000, 4097, 40000};
    int kinds[4] = {0};
    for (int es = 1; es <= 8; es *= 2)
        for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++)
            for (int p = 0; p <= 8; p++)
                kinds[check_chunk(fn, es, sizes[s], p)]++;
    for (int k = 0; k < 4; k++) /* dense, none, bitmap and runs were all made */
        cr_assert_gt(kinds[k], 0, "no chunk was encoded as kind %d", k);
}

_Static_assert(RS_DELTA_MAGIC == DELTA_MAGIC && RS_DELTA_NONE == DELTA_NONE &&
                   RS_DELTA_BITMAP == DELTA_BITMAP && RS_DELTA_RUNS == DELTA_RUNS &&
                   RS_DELTA_HDR == sizeof(struct delta_hdr),
               "the kernels write the host codec's header");

Test(delta_kernel, the_stand_in_gives_the_host_codecs_bytes)
{
    fake_driver();
    const struct cuda_fns *fn = cuda_lib();
    cr_assert_not_null(fn, "%s", rs_error_message());
    cr_assert_eq(cuda_current_context(), RESHARD_OK, "%s", rs_error_message());
    if (cuda_kernels() != RESHARD_OK)
        cr_skip_test("%s", rs_error_message()); /* a build without nvcc */
    check_all(fn);
    cr_assert_gt(fake_delta_launches(), 4 * 7 * 9 * 4, "the kernels ran %d times",
                 fake_delta_launches());
}

Test(delta_kernel, a_chunk_no_kernel_can_encode_is_refused)
{
    fake_driver();
    struct rs_delta_desc d = {.n = 100, .nwords = 2, .esize = 3};
    cr_assert_eq(cuda_delta_encode(&d, NULL), RESHARD_ERR_INVALID_ARG);
    cr_assert(strstr(rs_error_message(), "100 elements of 3 bytes"), "%s", rs_error_message());
    d.esize = 2;
    cr_assert_eq(cuda_delta_apply(&d, RS_DELTA_DENSE, NULL), RESHARD_ERR_INVALID_ARG);
    cr_assert(strstr(rs_error_message(), "kind 0"), "%s", rs_error_message());
}

Test(gpu, delta_kernel_gives_the_host_codecs_bytes)
{
    const struct cuda_fns *fn = cuda_lib();
    if (!fn)
        cr_skip_test("no CUDA device (%s)", rs_error_message());
    cr_assert_eq(cuda_current_context(), RESHARD_OK, "%s", rs_error_message());
    size_t fatbin = 0;
    if (!cuda_fatbin(&fatbin))
        cr_skip_test("this build had no nvcc: no delta kernels");
    cr_assert_eq(cuda_kernels(), RESHARD_OK, "%s", rs_error_message());
    check_all(fn);
}
