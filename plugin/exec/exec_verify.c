/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The check of a refit or of two layouts (exec_verify.h). Per tensor t, every rank computes its
 * imbalance: its destination shard's fingerprint weighted by lcm / replicas (every replica
 * counts: a bad one is caught), less lcm times its source shard's when it is the one of its
 * replicas that counts. The sum over ranks is 0 for every tensor that arrived right (or whose
 * two descriptions agree). Phase 1 folds two sums over t of odd per-tensor multipliers times the
 * imbalance: a fixed payload per rank at any world size and model size. Only when it is not 0,
 * phase 2 sums the imbalances themselves, 8 bytes per tensor, to name the tensors.
 */
#include "exec_verify.h"

#include "exec_int.h"
#include "exec_vote.h"
#include "region.h"
#include "base/clock.h"
#include "base/error.h"
#include "base/hindex.h"
#include "base/log.h"
#include "base/param.h"
#include "cuda/cuda_lib.h"
#include "planner/fingerprint.h"
#include "planner/spec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define VERIFY_CHUNK  4096 /* tensors per reduction of phase 2: 32 KiB */
#define VERIFY_NAMES  3    /* tensors the message names; the log has more */
#define VERIFY_LOGGED 32

struct verify_fold {
    int32_t fail_rank, fail_status;
    char why[EXEC_VOTE_WHY];
    uint64_t sum[2];
};

size_t exec_verify_fold_bytes(void)
{
    return sizeof(struct verify_fold);
}

static void fold_combine(void *acc_, const void *in_, void *arg)
{
    (void)arg;
    struct verify_fold *a = acc_;
    const struct verify_fold *b = in_;
    if (b->fail_rank < a->fail_rank) {
        a->fail_rank = b->fail_rank;
        a->fail_status = b->fail_status;
        memcpy(a->why, b->why, sizeof(a->why));
    }
    a->sum[0] += b->sum[0];
    a->sum[1] += b->sum[1];
}

static void sums_combine(void *acc_, const void *in_, void *arg)
{
    size_t n = *(const size_t *)arg;
    uint64_t *a = acc_;
    const uint64_t *b = in_;
    for (size_t i = 0; i < n; i++)
        a[i] += b[i];
}

/* The lcm of a destination map's replica counts depends on its rank arrays and the topology
 * only: a model repeats a few over thousands of tensors, so each is counted once per check,
 * found by its tuple array (the plan shares one between equal maps). */
struct lcm_memo {
    const int *key;
    uint64_t lcm;
};

struct lcm_probe {
    const struct lcm_memo *memo;
    const int *key;
};

static uint64_t key_hash(const int *key)
{
    return fp_mix((uint64_t)(uintptr_t)key, 0);
}

static uint64_t memo_hash(void *arg, size_t pos)
{
    return key_hash(((const struct lcm_probe *)arg)->memo[pos].key);
}

static int memo_eq(void *arg, size_t pos)
{
    const struct lcm_probe *q = arg;
    return q->memo[pos].key == q->key;
}

static reshard_status_t map_lcm(struct lcm_memo *memo, int *n, struct rs_hindex *index,
                                const struct rs_shardmap *map, const struct rs_topo *topo,
                                uint64_t *lcm)
{
    struct lcm_probe q = {memo, map->tuple};
    RS_CHECK(rs_hindex_fit(index, memo_hash, &q));
    size_t at;
    long found = rs_hindex_find(index, key_hash(map->tuple), memo_eq, &q, &at);
    if (found >= 0) {
        *lcm = memo[found].lcm;
        return RESHARD_OK;
    }
    RS_CHECK(fingerprint_lcm(map, topo, lcm));
    memo[*n].key = map->tuple;
    memo[*n].lcm = *lcm;
    rs_hindex_put(index, at, (size_t)(*n)++);
    return RESHARD_OK;
}

reshard_status_t exec_verify_possible(const struct rs_plan *p)
{
    if (!p->topo.absent)
        return RESHARD_OK;
    for (int t = 0; t < p->ntensors; t++) {
        const struct plan_tensor *pt = &p->tensors[t];
        int pos = fingerprint_lost(&pt->dst_map, &p->topo);
        if (pos >= 0)
            return rs_error(RESHARD_ERR_DATA_LOST,
                            "verification: tensor %s: the destination shard of rank %d has no "
                            "replica on a present rank, so nobody receives it and the check "
                            "could not add up; plan without verify on this communicator",
                            pt->name, pt->dst.ranks[pos]);
    }
    return RESHARD_OK;
}

/* The fingerprint of the shard at pos of map in buf: in place for host memory, else from a
 * host copy of the bytes its view spans (device, pinned or managed memory: cuMemcpyDtoH reads
 * each through unified addressing). */
static reshard_status_t shard_fp(const struct rs_shardmap *map, int pos, const void *buf,
                                 size_t bytes, reshard_mem_t mem, uint64_t *out)
{
    const struct rs_layout *l = map->layout;
    int64_t shape[RS_MAX_DIMS];
    for (int j = 0; j < l->ndim; j++)
        shape[j] = dimmap_group_len(&map->dim[j], shardmap_group(map, pos, j));
    uint64_t span = region_span_bytes(l, shape);
    if (!buf || bytes < span)
        return rs_error(RESHARD_ERR_BUFFER, "%s, and its shard needs %llu bytes",
                        buf ? "the buffer is shorter" : "no buffer", (unsigned long long)span);
    if (mem != RESHARD_MEM_CUDA)
        return fingerprint_shard(map, pos, buf, bytes, out);
    const struct cuda_fns *f = cuda_lib();
    if (!f) {
        struct rs_saved_error why;
        rs_error_save(&why);
        return rs_error(RESHARD_ERR_UNAVAILABLE, "device memory, and no CUDA driver: %s", why.msg);
    }
    /* A pair declared device memory may hold a host buffer on one side (the Python binding
     * declares the pair by either): memory the driver does not know is read in place. */
    if (cuda_mem_kind(buf) == CUDA_MEM_HOST)
        return fingerprint_shard(map, pos, buf, bytes, out);
    RS_CHECK(cuda_context_of(buf));
    void *host = rs_calloc(1, span, "a host copy to fingerprint");
    if (!host)
        return RESHARD_ERR_NO_MEMORY;
    cu_result e = f->memcpy_dtoh(host, (cu_deviceptr)(uintptr_t)buf, span);
    reshard_status_t st = e == CU_SUCCESS ? fingerprint_shard(map, pos, host, span, out)
                                          : cuda_error("fingerprint: cuMemcpyDtoH", e);
    free(host);
    return st;
}

/* A weight quantized on the way (bf16/f16/f32 -> FP8), or the scales its quantization computes:
 * its two sides hold different values (an FP8 source with the same blocks is plain data). */
static int quantized_on_the_way(const struct rs_plan *p, const struct plan_tensor *pt)
{
    return pt->quant == PLAN_QUANT_CAST ||
           (pt->scales_of >= 0 && p->tensors[pt->scales_of].quant == PLAN_QUANT_CAST);
}

/* One side of tensor t on this rank: its destination shard's fingerprint fd with its weight
 * lcm / reps (read_dst), the source shard's fs when it counts (fs_counts, read_src) with lcm. */
struct verify_side {
    uint64_t lcm, fd, fs;
    int dpos, spos, reps, fs_counts;
};

static reshard_status_t side_of(const struct reshard_comm *c, const struct rs_plan *p, int t,
                                struct lcm_memo *memo, int *nmemo, struct rs_hindex *index,
                                const reshard_buffers_t *bufs, int read_dst, int read_src,
                                const char **where, struct verify_side *v)
{
    const struct plan_tensor *pt = &p->tensors[t];
    *v = (struct verify_side){.lcm = 1};
    v->dpos = shardmap_position(&pt->dst_map, c->rank);
    v->spos = shardmap_position(&pt->src_map, c->rank);
    v->reps = v->dpos >= 0 ? fingerprint_replicas(&pt->dst_map, v->dpos, &p->topo) : 0;
    v->fs_counts = v->spos >= 0 && fingerprint_counts(&pt->src_map, v->spos, &p->topo) &&
                   shardmap_local_numel(&pt->src_map, v->spos);
    *where = "destination layout";
    RS_CHECK(map_lcm(memo, nmemo, index, &pt->dst_map, &p->topo, &v->lcm));
    if (read_dst && v->reps && shardmap_local_numel(&pt->dst_map, v->dpos)) {
        *where = "destination";
        RS_CHECK(
            shard_fp(&pt->dst_map, v->dpos, bufs[t].dst, bufs[t].dst_bytes, bufs[t].mem, &v->fd));
    }
    if (read_src && v->fs_counts) {
        *where = "source";
        RS_CHECK(
            shard_fp(&pt->src_map, v->spos, bufs[t].src, bufs[t].src_bytes, bufs[t].mem, &v->fs));
    }
    return RESHARD_OK;
}

/* Weight w quantized on the way and its scales s, after a refit: their destinations (FP8 codes,
 * float32 scales) against the fingerprints made where the blocks were quantized
 * (exec_quant_expect), so a flipped code or scale is named as a bf16 element is. */
static reshard_status_t quantized_imbalance(const struct exec *x, const reshard_buffers_t *bufs,
                                            int w, struct lcm_memo *memo, int *nmemo,
                                            struct rs_hindex *index, const char **where,
                                            uint64_t *delta)
{
    const struct rs_plan *p = x->plan;
    int s = p->tensors[w].scales;
    struct verify_side vw, vs;
    struct exec_quant_fp e;
    RS_CHECK(side_of(x->comm, p, w, memo, nmemo, index, bufs, 0, 0, where, &vw));
    *where = "quantized blocks";
    RS_CHECK(exec_quant_expect(x, bufs, (uint32_t)w, vw.fs_counts, &e));
    if (e.grouped) /* the codes it holds, eight at a time */
        vw.fd = e.dst_held;
    else
        RS_CHECK(side_of(x->comm, p, w, memo, nmemo, index, bufs, 1, 0, where, &vw));
    RS_CHECK(side_of(x->comm, p, s, memo, nmemo, index, bufs, 1, 0, where, &vs));
    uint64_t dw = vw.fd - e.dst_codes + e.dst_plain, ds = vs.fd - e.dst_scales;
    delta[w] =
        (vw.reps ? dw * (vw.lcm / (uint64_t)vw.reps) : 0) - vw.lcm * (e.src_codes + e.src_plain);
    delta[s] = (vs.reps ? ds * (vs.lcm / (uint64_t)vs.reps) : 0) - vs.lcm * e.src_scales;
    return RESHARD_OK;
}

/* This rank's imbalance of every tensor (delta[ntensors]); x: the plan's executor after a
 * refit, NULL for a check of layouts (which leaves out what is quantized on the way). */
static reshard_status_t local_imbalance(const struct reshard_comm *c, const struct rs_plan *p,
                                        const struct exec *x, const reshard_buffers_t *bufs,
                                        uint64_t *delta)
{
    struct lcm_memo *memo = rs_calloc((size_t)p->ntensors, sizeof(*memo), "verification");
    if (!memo)
        return RESHARD_ERR_NO_MEMORY;
    int nmemo = 0, unchecked = 0;
    struct rs_hindex index = {0};
    reshard_status_t st = RESHARD_OK;
    const char *side = "";
    int t = 0;
    for (; t < p->ntensors && st == RESHARD_OK; t++) {
        const struct plan_tensor *pt = &p->tensors[t];
        if (quantized_on_the_way(p, pt) && !x) { /* bf16 against FP8: the sums cannot agree */
            delta[t] = 0;
            unchecked++;
            continue;
        }
        if (pt->quant == PLAN_QUANT_CAST) {
            st = quantized_imbalance(x, bufs, t, memo, &nmemo, &index, &side, delta);
            continue;
        }
        if (quantized_on_the_way(p, pt)) /* a weight's scales, with the weight */
            continue;
        struct verify_side v;
        st = side_of(c, p, t, memo, &nmemo, &index, bufs, 1, 1, &side, &v);
        if (st == RESHARD_OK)
            delta[t] = (v.reps ? v.fd * (v.lcm / (uint64_t)v.reps) : 0) - v.lcm * v.fs;
    }
    if (st == RESHARD_OK && unchecked && c->rank == c->member[0])
        rs_log(RS_LOG_INFO,
               "check_layouts: %d tensor(s) quantized on the way, and their scales, are not "
               "checked (their sources hold the training dtype, their destinations FP8)",
               unchecked);
    if (st != RESHARD_OK) { /* say where, once: tensor t - 1 failed */
        struct rs_saved_error why;
        rs_error_save(&why);
        st = rs_error(st, "rank %d: %s of tensor %s: %s", c->rank, side, p->tensors[t - 1].name,
                      why.msg);
    }
    rs_hindex_free(&index);
    free(memo);
    return st;
}

/* RESHARD_TEST_FLIP=RANK:TENSOR[:BYTE]: rank RANK flips the lowest bit of byte BYTE of its
 * destination buffer of TENSOR, host or device memory, once the refit landed and before it is
 * checked (the verification's tests: FP8 codes and scales, on device buffers too). */
static void test_flip(const struct reshard_comm *c, const struct rs_plan *p,
                      const reshard_buffers_t *bufs)
{
    const char *spec = rs_param_str(RS_PARAM_TEST_FLIP);
    char name[256];
    int rank = -1;
    long long byte = 0;
    if (!*spec || sscanf(spec, "%d:%255[^:]:%lld", &rank, name, &byte) < 2 || rank != c->rank)
        return;
    for (int t = 0; t < p->ntensors; t++) {
        if (strcmp(p->tensors[t].name, name) || !bufs[t].dst || byte < 0 ||
            (size_t)byte >= bufs[t].dst_bytes)
            continue;
        unsigned char *at = (unsigned char *)bufs[t].dst + byte, v = 0;
        const struct cuda_fns *f = bufs[t].mem == RESHARD_MEM_CUDA ? cuda_lib() : NULL;
        if (f && cuda_mem_kind(at) != CUDA_MEM_HOST) {
            cu_deviceptr d = (cu_deviceptr)(uintptr_t)at;
            if (f->memcpy_dtoh(&v, d, 1) != CU_SUCCESS)
                return;
            v ^= 1;
            f->memcpy_htod(d, &v, 1);
        } else {
            *at ^= 1;
        }
        rs_log(RS_LOG_WARN, "rank %d: RESHARD_TEST_FLIP flipped a bit of byte %lld of tensor %s",
               c->rank, byte, name);
        return;
    }
}

/* What the fingerprints cost this thread, apart from waiting for a core on a loaded host. */
static double thread_cpu_ms(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts))
        return 0;
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static uint64_t multiplier(const struct rs_plan *p, int t, int k)
{
    return fp_mix((uint64_t)t, k ? ~p->hash : p->hash) | 1;
}

/* Phase 2: every tensor's imbalance summed over the ranks, in pieces of VERIFY_CHUNK. */
static reshard_status_t sum_all(struct reshard_comm *c, uint64_t *delta, int n)
{
    for (int at = 0; at < n; at += VERIFY_CHUNK) {
        size_t k = (size_t)(n - at < VERIFY_CHUNK ? n - at : VERIFY_CHUNK);
        RS_CHECK(boot_allreduce(c->boot, delta + at, k * sizeof(uint64_t), sums_combine, &k));
    }
    return RESHARD_OK;
}

static void layout_text(const struct rs_layout *l, char *buf, size_t n)
{
    if (spec_format(l, buf, n) >= n && n > 4)
        memcpy(buf + n - 4, "...", 4);
}

/* The verdict once phase 2 named the tensors that differ. */
static reshard_status_t name_tensors(const struct reshard_comm *c, const struct rs_plan *p,
                                     const uint64_t *delta, enum exec_verify_mode mode)
{
    char list[RS_ERROR_MAX], src[192], dst[192];
    size_t used = 0;
    int bad = 0, logs = c->rank == c->member[0];
    list[0] = '\0';
    for (int t = 0; t < p->ntensors; t++) {
        if (!delta[t])
            continue;
        const struct plan_tensor *pt = &p->tensors[t];
        if (mode == EXEC_VERIFY_LAYOUTS && (bad < 1 || (logs && bad < VERIFY_LOGGED))) {
            layout_text(&pt->src, src, sizeof(src));
            layout_text(&pt->dst, dst, sizeof(dst));
        }
        if (logs && bad < VERIFY_LOGGED)
            rs_log(RS_LOG_WARN,
                   mode == EXEC_VERIFY_LAYOUTS
                       ? "check_layouts: tensor %s: source '%s' and destination "
                         "'%s' describe different element orders"
                       : "verification: tensor %s differs from its source after "
                         "the refit%s%s",
                   pt->name, mode == EXEC_VERIFY_LAYOUTS ? src : "",
                   mode == EXEC_VERIFY_LAYOUTS ? dst : "");
        if (bad < VERIFY_NAMES && used < sizeof(list)) {
            int w =
                mode == EXEC_VERIFY_LAYOUTS && !bad
                    ? snprintf(list + used, sizeof(list) - used,
                               "%s (source '%s', destination '%s')", pt->name, src, dst)
                    : snprintf(list + used, sizeof(list) - used, "%s%s", bad ? ", " : "", pt->name);
            used += w > 0 ? (size_t)w : 0;
        }
        bad++;
    }
    if (!bad) /* both sums moved and no tensor did: a rank folded another plan's values */
        return rs_error(RESHARD_ERR_INTERNAL,
                        "verification: the ranks' sums disagree but no tensor's does");
    char more[48] = "";
    if (bad > VERIFY_NAMES)
        snprintf(more, sizeof(more), " and %d more", bad - VERIFY_NAMES);
    if (mode == EXEC_VERIFY_LAYOUTS)
        return rs_error(RESHARD_ERR_VERIFY,
                        "check_layouts: %d tensor%s whose source and destination describe "
                        "different element orders of the same weights: %s%s",
                        bad, bad > 1 ? "s" : "", list, more);
    return rs_error(RESHARD_ERR_VERIFY, "verification: %d tensor%s after the refit: %s%s", bad,
                    bad > 1 ? "s differ from their sources" : " differs from its source", list,
                    more);
}

/* A failure another rank reported in phase 1. */
static reshard_status_t remote_failure(const struct reshard_comm *c, const struct verify_fold *f)
{
    char why[EXEC_VOTE_WHY + 1];
    exec_vote_text(f->why, sizeof(f->why), why);
    reshard_status_t st = (reshard_status_t)f->fail_status;
    if (f->fail_rank < 0 || f->fail_rank >= c->size)
        return rs_error(RESHARD_ERR_REMOTE, "verification: a malformed report (rank %d): %s",
                        f->fail_rank, why);
    return rs_error(st == RESHARD_ERR_BUFFER ? st : RESHARD_ERR_REMOTE,
                    "verification: rank %d could not fingerprint its shards: %s", f->fail_rank,
                    why);
}

reshard_status_t exec_verify(struct reshard_comm *c, const struct rs_plan *p, const struct exec *x,
                             const reshard_buffers_t *bufs, enum exec_verify_mode mode)
{
    if (mode == EXEC_VERIFY_REFIT)
        test_flip(c, p, bufs);
    else
        x = NULL; /* no refit: nothing was quantized */
    double t0 = rs_now_ms_f(), c0 = thread_cpu_ms();
    uint64_t *delta = rs_calloc((size_t)p->ntensors + 1, sizeof(uint64_t), "verification");
    reshard_status_t mine = delta ? local_imbalance(c, p, x, bufs, delta) : RESHARD_ERR_NO_MEMORY;
    double t1 = rs_now_ms_f(), c1 = thread_cpu_ms();
    struct rs_saved_error why;
    rs_error_save(&why);
    struct verify_fold f = {.fail_rank = EXEC_VOTE_NONE};
    if (mine != RESHARD_OK) {
        f.fail_rank = c->rank;
        f.fail_status = (int32_t)mine;
        size_t n = strnlen(why.msg, sizeof(f.why) - 1);
        memcpy(f.why, why.msg, n); /* the rest stays zero */
    } else {
        for (int t = 0; t < p->ntensors; t++)
            for (int k = 0; k < 2; k++)
                f.sum[k] += multiplier(p, t, k) * delta[t];
    }
    /* A rank that failed still folds, so that nobody waits for it. */
    reshard_status_t st = boot_allreduce(c->boot, &f, sizeof(f), fold_combine, NULL);
    if (st == RESHARD_OK && mine != RESHARD_OK) {
        rs_error_restore(&why);
        st = mine;
    } else if (st == RESHARD_OK && f.fail_rank != EXEC_VOTE_NONE) {
        st = remote_failure(c, &f);
    } else if (st == RESHARD_OK && (f.sum[0] || f.sum[1])) {
        if ((st = sum_all(c, delta, p->ntensors)) == RESHARD_OK)
            st = name_tensors(c, p, delta, mode);
    }
    free(delta);
    rs_log(RS_LOG_INFO,
           "rank %d: %s of %d tensors: fingerprints %.1f ms (%.1f ms of CPU), reductions %.1f ms",
           c->rank, mode == EXEC_VERIFY_LAYOUTS ? "check_layouts" : "verification", p->ntensors,
           t1 - t0, c1 - c0, rs_now_ms_f() - t1);
    return st;
}
