/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Refits that prove themselves, across forked ranks: reshard_plan_check_layouts names exactly
 * the tensors whose two descriptions disagree, RESHARD_VERIFY / config.verify catch a flipped
 * bit a non-counted source replica sent, and right refits pass (replicated, uneven, viewed,
 * shrunk) without a false alarm.
 */
#include "ranks.h"
#include "base/error.h"
#include "base/param.h"
#include "planner/fingerprint.h"
#include "plugin/exec/exec_verify.h"
#include "plugin/handles.h"
#include "plugin/reshard.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static void set_env(void)
{
    setenv("RESHARD_DOMAIN_SIZE", "2", 1);
    setenv("RESHARD_TIMEOUT", "20", 1);
    setenv("UCX_LOG_LEVEL", "error", 1);
    unsetenv("RESHARD_VERIFY");
}

TestSuite(verify, .init = set_env, .timeout = 120);

/* ---- the weights of a checkpoint, placed as a layout (views included) says ---- */

static uint64_t weight(uint64_t salt, int64_t g)
{
    return fp_mix((uint64_t)g + 1, salt);
}

/* Writes (or, with check, counts the elements that differ from) rank's shard of the tensor
 * whose element g is weight(salt, g), at the places the layout's view gives them. */
static int64_t place(const reshard_layout_t *L, int rank, uint64_t salt, void *buf, int check)
{
    const struct rs_layout *l = &L->l;
    int64_t shape[8], numel = 0, bad = 0;
    reshard_layout_shard_shape(L, rank, shape, &numel);
    if (!numel)
        return 0;
    reshard_layout_info_t info;
    reshard_layout_info(L, &info);
    int nd = l->ndim;
    int64_t *idx[8];
    for (int j = 0; j < nd; j++) {
        idx[j] = calloc((size_t)shape[j], sizeof(int64_t));
        reshard_layout_shard_index(L, rank, j, idx[j]);
    }
    const struct rs_view *v = &l->view;
    int vd = v->ndim ? v->ndim : nd;
    const int64_t *vs = v->ndim ? v->shape : shape;
    for (int64_t e = 0; e < numel; e++) {
        int64_t rem = e, g = 0, stride = 1;
        for (int j = nd - 1; j >= 0; j--) {
            g += idx[j][rem % shape[j]] * stride;
            rem /= shape[j];
            stride *= l->shape[j];
        }
        int64_t at = v->offset, r2 = e, st = 1;
        for (int k = vd - 1; k >= 0; k--) {
            at += r2 % vs[k] * (v->nstrides ? v->strides[k] : st);
            r2 /= vs[k];
            st *= vs[k];
        }
        uint64_t w = weight(salt, g);
        char *p = (char *)buf + at * (int64_t)info.elem_size;
        if (check)
            bad += memcmp(p, &w, info.elem_size) != 0;
        else
            memcpy(p, &w, info.elem_size);
    }
    for (int j = 0; j < nd; j++)
        free(idx[j]);
    return bad;
}

/* ---- one rank's buffers for a list of tensors: named buffers shared, as manifests say ---- */

#define MAXT 16

struct bufset {
    int n;
    char name[2 * MAXT][96];
    char *p[2 * MAXT];
    size_t bytes[2 * MAXT];
};

/* The buffer of one side of a tensor: its view's buffer (shared) or one of its own. */
static int buf_slot(struct bufset *s, const reshard_layout_t *L, int rank, int side, int t)
{
    char key[96];
    if (L->l.view.buffer[0])
        snprintf(key, sizeof(key), "%d:%s", side, L->l.view.buffer);
    else
        snprintf(key, sizeof(key), "%d:#%d", side, t);
    size_t bytes = 0;
    reshard_layout_shard_bytes(L, rank, &bytes);
    int i = 0;
    while (i < s->n && strcmp(s->name[i], key))
        i++;
    if (i == s->n) {
        snprintf(s->name[s->n++], sizeof(s->name[0]), "%s", key);
        s->bytes[i] = 0;
    }
    if (bytes > s->bytes[i])
        s->bytes[i] = bytes;
    return i;
}

/* Buffers for every tensor on rank; sources hold the checkpoint (salt = tensor index + 1). With
 * fill_dst, destinations hold it too, placed as place_dst[t] says (the real layout, which the
 * plan's may misdescribe). */
static void bufs_make(const reshard_tensor_t *ts, int n, int rank, struct bufset *s,
                      reshard_buffers_t *b, const reshard_tensor_t *place_dst)
{
    memset(s, 0, sizeof(*s));
    int slot[MAXT][2];
    for (int t = 0; t < n; t++) {
        slot[t][0] = buf_slot(s, ts[t].src, rank, 0, t);
        slot[t][1] = buf_slot(s, ts[t].dst, rank, 1, t);
    }
    for (int i = 0; i < s->n; i++)
        s->p[i] = s->bytes[i] ? calloc(1, s->bytes[i]) : NULL;
    for (int t = 0; t < n; t++) {
        size_t sb = 0, db = 0;
        reshard_layout_shard_bytes(ts[t].src, rank, &sb);
        reshard_layout_shard_bytes(ts[t].dst, rank, &db);
        b[t] = (reshard_buffers_t){.src = sb ? s->p[slot[t][0]] : NULL,
                                   .src_bytes = sb ? s->bytes[slot[t][0]] : 0,
                                   .dst = db ? s->p[slot[t][1]] : NULL,
                                   .dst_bytes = db ? s->bytes[slot[t][1]] : 0};
        if (sb)
            place(ts[t].src, rank, (uint64_t)t + 1, s->p[slot[t][0]], 0);
        if (db && place_dst)
            place(place_dst[t].dst, rank, (uint64_t)t + 1, s->p[slot[t][1]], 0);
    }
}

static void bufs_free(struct bufset *s)
{
    for (int i = 0; i < s->n; i++)
        free(s->p[i]);
}

static int64_t wrong_in_dst(const reshard_tensor_t *ts, int n, int rank, const reshard_buffers_t *b)
{
    int64_t bad = 0;
    for (int t = 0; t < n; t++)
        if (b[t].dst)
            bad += place(ts[t].dst, rank, (uint64_t)t + 1, b[t].dst, 1);
    return bad;
}

/* ---- manifests: two layers of a fused qkv buffer (GQA-like: q, k, v of 2 groups each) ---- */

/* Each rank's fused buffer holds, per group, q's row, k's row and v's row: 2 x 3 x 4. */
static const char *qkv_side(char *out, size_t n, const char *ranks, int layer, int q_off)
{
    snprintf(out, n,
             "{\"ranks\": \"%s\", \"place\": \"S(0)\", \"buffer\": \"l%d.qkv\", \"offset\": %d, "
             "\"view\": [2, 1, 4], \"strides\": [12, 4, 1]}",
             ranks, layer, q_off);
    return out;
}

/* swap_layer: the layer whose destination describes q at k's place and k at q's, or -1. */
static void write_manifest(const char *path, int swap_layer)
{
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fprintf(f, "{\"version\": 1, \"world_size\": 4, \"domains\": {\"size\": 2}, \"tensors\": [\n");
    const char *names[3] = {"q_proj", "k_proj", "v_proj"};
    for (int layer = 0; layer < 2; layer++)
        for (int k = 0; k < 3; k++) {
            char s[256], d[256];
            int off = 4 * k, doff = off;
            if (layer == swap_layer && k < 2)
                doff = 4 * (1 - k);
            fprintf(f,
                    "{\"name\": \"l%d.%s.weight\", \"shape\": [4, 4], \"dtype\": \"bf16\", "
                    "\"src\": %s, \"dst\": %s},\n",
                    layer, names[k], qkv_side(s, sizeof(s), "0-1", layer, off),
                    qkv_side(d, sizeof(d), "2-3", layer, doff));
        }
    /* an uneven one and a replicated one beside them */
    fprintf(f, "{\"name\": \"o_proj.weight\", \"shape\": [7, 5], \"dtype\": \"bf16\", "
               "\"src\": \"ranks=0-2 place=S(0)\", \"dst\": \"ranks=0-3 mesh=2x2 place=R,S(1)\"},\n"
               "{\"name\": \"norm.weight\", \"shape\": [5], \"dtype\": \"f32\", "
               "\"src\": \"ranks=0-1 place=R\", \"dst\": \"ranks=0-3 place=R\"}\n]}\n");
    fclose(f);
}

static char true_path[64], swapped_path[64];

static void write_manifests(void)
{
    snprintf(true_path, sizeof(true_path), "/tmp/rs_verify_true_%d.json", (int)getpid());
    snprintf(swapped_path, sizeof(swapped_path), "/tmp/rs_verify_swap_%d.json", (int)getpid());
    write_manifest(true_path, -1);
    write_manifest(swapped_path, 1);
}

static void remove_manifests(void)
{
    unlink(true_path);
    unlink(swapped_path);
}

static reshard_plan_config_t verify_config(void)
{
    reshard_plan_config_t cfg = RESHARD_PLAN_CONFIG_INIT;
    cfg.verify = 1;
    return cfg;
}

/* Loads `plan_path`, fills buffers as the true manifest places the weights, and checks the
 * layouts; then a refit with verification. want_check: the status check_layouts must give. */
static reshard_status_t check_manifest(int rank, reshard_comm_t *comm, const char *plan_path,
                                       reshard_status_t want_check)
{
    reshard_manifest_t *mt = NULL, *mp = NULL;
    reshard_status_t st = reshard_manifest_load(true_path, &mt);
    if (st == RESHARD_OK)
        st = reshard_manifest_load(plan_path, &mp);
    if (st != RESHARD_OK)
        return st;
    int n = reshard_manifest_ntensors(mp);
    const reshard_tensor_t *ts = reshard_manifest_tensors(mp);
    reshard_plan_config_t cfg = verify_config();
    reshard_plan_t *plan = NULL;
    struct bufset s;
    reshard_buffers_t b[MAXT];
    st = reshard_comm_plan_create(comm, ts, n, &cfg, &plan);
    if (st == RESHARD_OK) {
        bufs_make(ts, n, rank, &s, b, reshard_manifest_tensors(mt));
        st = reshard_plan_check_layouts(plan, b);
        if (st != want_check) {
            fprintf(stderr, "rank %d: check_layouts gave %s: %s\n", rank, reshard_strerror(st),
                    reshard_last_error());
            st = RESHARD_ERR_INTERNAL;
        } else if (st == RESHARD_ERR_VERIFY) {
            const char *m = reshard_last_error();
            /* the swapped layer's q and k, with both layouts, and nothing else */
            int ok = strstr(m, "2 tensors") && strstr(m, "l1.q_proj.weight (source '") &&
                     strstr(m, "destination '") && strstr(m, "l1.k_proj.weight") &&
                     !strstr(m, "l0.") && !strstr(m, "v_proj") && !strstr(m, "o_proj") &&
                     !strstr(m, "norm");
            if (!ok)
                fprintf(stderr, "rank %d: unexpected message: %s\n", rank, m);
            st = ok ? RESHARD_OK : RESHARD_ERR_INTERNAL;
        } else if (st == RESHARD_OK) { /* a right description refits and verifies */
            for (int t = 0; t < n; t++)
                if (b[t].dst)
                    memset(b[t].dst, 0, b[t].dst_bytes);
            st = reshard_plan_execute(plan, b);
            if (st == RESHARD_OK && wrong_in_dst(ts, n, rank, b))
                st = RESHARD_ERR_INTERNAL;
        }
        bufs_free(&s);
        reshard_plan_destroy(plan);
    }
    reshard_manifest_destroy(mp);
    reshard_manifest_destroy(mt);
    return st;
}

static reshard_status_t swapped_qk(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    return check_manifest(rank, comm, swapped_path, RESHARD_ERR_VERIFY);
}

static reshard_status_t true_layouts(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    return check_manifest(rank, comm, true_path, RESHARD_OK);
}

Test(verify, check_layouts_names_the_swapped_q_and_k_views_of_one_layer_and_nothing_else)
{
    write_manifests();
    struct outcome *o = run_ranks(4, swapped_qk);
    remove_manifests();
    all_ok(o, 4);
}

Test(verify, right_layouts_pass_the_check_and_a_verified_refit_of_views_uneven_and_replicas)
{
    write_manifests();
    struct outcome *o = run_ranks(4, true_layouts);
    remove_manifests();
    all_ok(o, 4);
}

/* ---- a flipped bit on a source replica that does not count ---- */

#define FLIP_SRC "shape=16x8 dtype=i32 ranks=0-1 place=R"
#define FLIP_DST "shape=16x8 dtype=i32 ranks=2-3 place=S(0)"

/* Rank 1 holds a replica of 'a' (rank 0's is the one that counts) and, being on rank 3's rail,
 * sends rank 3 its half over the network: a bit flipped there lands on rank 3. 'b' is clean. */
static reshard_status_t flipped_bit(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    reshard_layout_t *src = NULL, *dst = NULL;
    reshard_layout_parse(FLIP_SRC, 0, &src);
    reshard_layout_parse(FLIP_DST, 0, &dst);
    reshard_tensor_t ts[2] = {{"a", src, dst}, {"b", src, dst}};
    reshard_plan_config_t cfg = verify_config();
    reshard_plan_t *plan = NULL;
    reshard_status_t st = reshard_comm_plan_create(comm, ts, 2, &cfg, &plan);
    struct bufset s;
    reshard_buffers_t b[2];
    if (st != RESHARD_OK)
        goto out;
    bufs_make(ts, 2, rank, &s, b, NULL);
    if (rank == 1)
        ((int32_t *)s.p[0])[15 * 8 + 3] ^= 0x100; /* a's row 15: rank 3's half */
    reshard_comm_counters_t before, after;
    reshard_comm_counters(comm, &before);
    st = reshard_plan_execute(plan, b);
    char m[512];
    snprintf(m, sizeof(m), "%s", reshard_last_error());
    reshard_comm_counters(comm, &after);
    int named = st == RESHARD_ERR_VERIFY && strstr(m, "1 tensor differs") &&
                strstr(m, "refit: a") && !strstr(m, ", b");
    /* the planner did send from the bad replica, and the bad bit did land on rank 3 */
    int sent = rank != 1 || after.net_out - before.net_out == 2 * 8 * 8 * 4;
    int landed = rank != 3 || place(dst, 3, 1, b[0].dst, 1) == 1;
    if (!named || !sent || !landed) {
        fprintf(stderr, "rank %d: %s (%s), sent %d, landed %d\n", rank, reshard_strerror(st), m,
                sent, landed);
        st = RESHARD_ERR_INTERNAL;
    } else {
        st = RESHARD_OK;
    }
    bufs_free(&s);
    reshard_plan_destroy(plan);
out:
    reshard_layout_destroy(src);
    reshard_layout_destroy(dst);
    return st;
}

Test(verify, a_flipped_bit_on_a_replica_that_does_not_count_fails_the_refit_naming_the_tensor)
{
    all_ok(run_ranks(4, flipped_bit), 4);
}

/* ---- a bit flipped on the way (RESHARD_TEST_CORRUPT) ---- */

/* Every source is right; rank 3 flips one bit of what landed in its first destination ('a'),
 * as a fault between the sender's memory and its own would. The verified refit names 'a' and
 * only it on every rank; the same fault without verification goes unnoticed (the refit
 * "succeeds"), which is what the check is for. */
static reshard_status_t corrupted_on_the_way(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    setenv("RESHARD_TEST_CORRUPT", "4", 1);
    rs_param_reload();
    reshard_layout_t *src = NULL, *dst = NULL;
    reshard_layout_parse(FLIP_SRC, 0, &src);
    reshard_layout_parse(FLIP_DST, 0, &dst);
    reshard_tensor_t ts[2] = {{"a", src, dst}, {"b", src, dst}};
    reshard_status_t st = RESHARD_OK;
    for (int verify = 1; verify >= 0 && st == RESHARD_OK; verify--) {
        reshard_plan_config_t cfg = verify_config();
        cfg.verify = verify;
        reshard_plan_t *plan = NULL;
        st = reshard_comm_plan_create(comm, ts, 2, &cfg, &plan);
        if (st != RESHARD_OK)
            break;
        struct bufset s;
        reshard_buffers_t b[2];
        bufs_make(ts, 2, rank, &s, b, NULL);
        st = reshard_plan_execute(plan, b);
        char m[512];
        snprintf(m, sizeof(m), "%s", reshard_last_error());
        int want = verify ? st == RESHARD_ERR_VERIFY && strstr(m, "1 tensor differs") &&
                                strstr(m, "refit: a") && !strstr(m, ", b")
                          : st == RESHARD_OK && (rank != 3 || wrong_in_dst(ts, 2, rank, b) == 1);
        if (!want) {
            fprintf(stderr, "rank %d, verify %d: %s (%s)\n", rank, verify, reshard_strerror(st), m);
            st = RESHARD_ERR_INTERNAL;
        } else {
            st = RESHARD_OK;
        }
        bufs_free(&s);
        reshard_plan_destroy(plan);
    }
    reshard_layout_destroy(src);
    reshard_layout_destroy(dst);
    unsetenv("RESHARD_TEST_CORRUPT");
    rs_param_reload();
    return st;
}

Test(verify, a_bit_flipped_on_the_way_fails_the_verified_refit_naming_the_tensor)
{
    all_ok(run_ranks(4, corrupted_on_the_way), 4);
}

/* ---- RESHARD_VERIFY=1 without the config field, and a right refit of a shrunk world ---- */

#define SHR_SRC "shape=9x6 dtype=bf16 ranks=0-3 mesh=2x2 place=S(1),R"
#define SHR_DST "shape=9x6 dtype=bf16 ranks=0-3 mesh=2x2 place=R,S(0)"

/* Rank 3 leaves: the destination tuples {0, 2} and {1, 3} keep 2 and 1 replicas. */
static reshard_status_t shrunk_refit(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    if (rank == 3)
        return RESHARD_OK;
    setenv("RESHARD_VERIFY", "1", 1);
    rs_param_reload();
    int three = 3;
    reshard_comm_t *c1 = NULL;
    reshard_status_t st = reshard_comm_shrink(comm, &three, 1, &c1);
    if (st != RESHARD_OK)
        return st;
    reshard_layout_t *src = NULL, *dst = NULL, *lost = NULL;
    reshard_layout_parse(SHR_SRC, 0, &src);
    reshard_layout_parse(SHR_DST, 0, &dst);
    reshard_layout_parse("shape=9x6 dtype=bf16 ranks=3", 0, &lost);
    reshard_tensor_t ts[1] = {{"w", src, dst}};
    reshard_plan_t *plan = NULL;
    struct bufset s;
    reshard_buffers_t b[1];
    st = reshard_comm_plan_create(c1, ts, 1, NULL, &plan);
    if (st == RESHARD_OK) {
        bufs_make(ts, 1, rank, &s, b, NULL);
        st = reshard_plan_execute(plan, b);
        if (st == RESHARD_OK && wrong_in_dst(ts, 1, rank, b))
            st = RESHARD_ERR_INTERNAL;
        if (st == RESHARD_OK) { /* a wrong replica on the tuple of two is caught */
            if (rank == 2)
                ((uint16_t *)b[0].dst)[0] ^= 1;
            st = reshard_plan_check_layouts(plan, b);
            st = st == RESHARD_ERR_VERIFY ? RESHARD_OK : RESHARD_ERR_INTERNAL;
        }
        bufs_free(&s);
        reshard_plan_destroy(plan);
    }
    /* a destination only the rank that left held: refused, since nobody receives it */
    reshard_tensor_t gone[1] = {{"gone", src, lost}};
    if (st == RESHARD_OK) {
        st = reshard_comm_plan_create(c1, gone, 1, NULL, &plan);
        int ok = st == RESHARD_ERR_DATA_LOST && strstr(reshard_last_error(), "tensor gone") &&
                 strstr(reshard_last_error(), "rank 3");
        if (!ok)
            fprintf(stderr, "rank %d: %s: %s\n", rank, reshard_strerror(st), reshard_last_error());
        st = ok ? RESHARD_OK : RESHARD_ERR_INTERNAL;
    }
    reshard_layout_destroy(src);
    reshard_layout_destroy(dst);
    reshard_layout_destroy(lost);
    if (st == RESHARD_OK)
        reshard_comm_destroy(c1);
    return st;
}

Test(verify, a_shrunk_world_verifies_its_refit_and_refuses_a_box_nobody_receives)
{
    all_ok(run_ranks(4, shrunk_refit), 4);
}

/* ---- a rank that cannot fingerprint: every rank fails, naming it ---- */

static reshard_status_t short_buffer(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    reshard_layout_t *src = NULL, *dst = NULL;
    reshard_layout_parse(FLIP_SRC, 0, &src);
    reshard_layout_parse(FLIP_DST, 0, &dst);
    reshard_tensor_t ts[1] = {{"a", src, dst}};
    reshard_plan_t *plan = NULL;
    reshard_status_t st = reshard_comm_plan_create(comm, ts, 1, NULL, &plan);
    struct bufset s;
    reshard_buffers_t b[1];
    if (st == RESHARD_OK) {
        bufs_make(ts, 1, rank, &s, b, NULL);
        if (rank == 2)
            b[0].dst_bytes -= 4;
        st = reshard_plan_check_layouts(plan, b);
        const char *m = reshard_last_error();
        int ok = st == RESHARD_ERR_BUFFER && strstr(m, "rank 2") && strstr(m, "tensor a");
        if (!ok)
            fprintf(stderr, "rank %d: %s: %s\n", rank, reshard_strerror(st), m);
        st = ok ? RESHARD_OK : RESHARD_ERR_INTERNAL;
        bufs_free(&s);
        reshard_plan_destroy(plan);
    }
    reshard_layout_destroy(src);
    reshard_layout_destroy(dst);
    return st;
}

Test(verify, a_short_buffer_fails_the_check_on_every_rank_naming_rank_and_tensor)
{
    all_ok(run_ranks(4, short_buffer), 4);
}

/* ---- what a check costs the control plane ---- */

struct ctl_bytes {
    uint64_t out, in;
};

static struct ctl_bytes *ctl; /* [MAX_RANKS], shared with the forked ranks */
static int ctl_tensors;

/* One check of ctl_tensors right tensors; the bootstrap bytes it took on this rank. */
static reshard_status_t count_check(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    reshard_layout_t *src = NULL, *dst = NULL;
    reshard_layout_parse("shape=64x8 dtype=bf16 ranks=0 place=R", 0, &src);
    reshard_layout_parse("shape=64x8 dtype=bf16 place=S(0)", size, &dst);
    reshard_tensor_t ts[MAXT];
    char names[MAXT][16];
    for (int t = 0; t < ctl_tensors; t++) {
        snprintf(names[t], sizeof(names[t]), "t%d", t);
        ts[t] = (reshard_tensor_t){names[t], src, dst};
    }
    reshard_plan_t *plan = NULL;
    reshard_status_t st = reshard_comm_plan_create(comm, ts, ctl_tensors, NULL, &plan);
    struct bufset s;
    reshard_buffers_t b[MAXT];
    if (st == RESHARD_OK) {
        bufs_make(ts, ctl_tensors, rank, &s, b, ts);
        reshard_comm_counters_t c0, c1;
        reshard_comm_counters(comm, &c0);
        st = reshard_plan_check_layouts(plan, b);
        reshard_comm_counters(comm, &c1);
        ctl[rank] = (struct ctl_bytes){c1.boot_out - c0.boot_out, c1.boot_in - c0.boot_in};
        bufs_free(&s);
        reshard_plan_destroy(plan);
    }
    reshard_layout_destroy(src);
    reshard_layout_destroy(dst);
    return st;
}

/* With the bootstrap's fan-out of 8, every rank but 0 is a leaf up to 9 ranks: a leaf's bytes
 * must not change with the world or the model, and rank 0's grow by one leaf's per child. */
Test(verify, a_check_costs_a_fixed_few_hundred_control_bytes_per_rank_at_any_world_or_model)
{
    ctl = mmap(NULL, sizeof(*ctl) * MAX_RANKS, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
               -1, 0);
    cr_assert_neq(ctl, MAP_FAILED);
    uint64_t leaf_out = 0, leaf_in = 0;
    for (int size = 2; size <= 8; size *= 2)
        for (ctl_tensors = 1; ctl_tensors <= MAXT; ctl_tensors += MAXT - 1) {
            memset(ctl, 0, sizeof(*ctl) * MAX_RANKS);
            all_ok(run_ranks(size, count_check), size);
            cr_log_info("check of %d tensors on %d ranks: control bytes out/in: rank 0 %llu/%llu, "
                        "rank %d %llu/%llu (fold %zu bytes)",
                        ctl_tensors, size, (unsigned long long)ctl[0].out,
                        (unsigned long long)ctl[0].in, size - 1,
                        (unsigned long long)ctl[size - 1].out, (unsigned long long)ctl[size - 1].in,
                        exec_verify_fold_bytes());
            if (!leaf_out) {
                leaf_out = ctl[1].out;
                leaf_in = ctl[1].in;
                cr_assert_gt(leaf_out, exec_verify_fold_bytes());
                cr_assert_lt(leaf_out, 2 * exec_verify_fold_bytes());
            }
            for (int r = 1; r < size; r++) {
                cr_assert_eq(ctl[r].out, leaf_out, "rank %d of %d", r, size);
                cr_assert_eq(ctl[r].in, leaf_in, "rank %d of %d", r, size);
            }
            cr_assert_eq(ctl[0].out, (uint64_t)(size - 1) * leaf_in, "%d ranks", size);
            cr_assert_eq(ctl[0].in, (uint64_t)(size - 1) * leaf_out, "%d ranks", size);
        }
    munmap(ctl, sizeof(*ctl) * MAX_RANKS);
}

/* ---- buffers declared device memory ---- */

/* On the stand-in driver (whose pointers all read as host memory, so they are fingerprinted in
 * place; a GPU's device memory is copied to the host first): a verified refit of buffers
 * declared device memory passes, and a wrong destination element is caught by the check. */
static reshard_status_t device_check(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    reshard_layout_t *src = NULL, *dst = NULL;
    reshard_layout_parse(SHR_SRC, 0, &src);
    reshard_layout_parse(SHR_DST, 0, &dst);
    reshard_tensor_t ts[1] = {{"w", src, dst}};
    reshard_plan_config_t cfg = verify_config();
    reshard_plan_t *plan = NULL;
    reshard_status_t st = reshard_comm_plan_create(comm, ts, 1, &cfg, &plan);
    struct bufset s;
    reshard_buffers_t b[1];
    if (st == RESHARD_OK) {
        bufs_make(ts, 1, rank, &s, b, NULL);
        b[0].mem = RESHARD_MEM_CUDA;
        st = reshard_plan_execute(plan, b);
        if (st == RESHARD_OK && wrong_in_dst(ts, 1, rank, b))
            st = RESHARD_ERR_INTERNAL;
        if (st == RESHARD_OK) {
            if (rank == 1)
                ((uint16_t *)b[0].dst)[3] ^= 0x8000;
            st = reshard_plan_check_layouts(plan, b);
            int ok = st == RESHARD_ERR_VERIFY && strstr(reshard_last_error(), ": w (source");
            if (!ok)
                fprintf(stderr, "rank %d: %s: %s\n", rank, reshard_strerror(st),
                        reshard_last_error());
            st = ok ? RESHARD_OK : RESHARD_ERR_INTERNAL;
        }
        bufs_free(&s);
        reshard_plan_destroy(plan);
    }
    reshard_layout_destroy(src);
    reshard_layout_destroy(dst);
    return st;
}

static void fake_driver(void)
{
    char cuda[512];
    const char *b = getenv("RESHARD_BUILD");
    snprintf(cuda, sizeof(cuda), "%s/test/fake/libcuda.so.1", b && *b ? b : "build");
    cr_assert_eq(access(cuda, R_OK), 0, "build %s first", cuda);
    setenv("RESHARD_CUDA_LIB", cuda, 1);
}

Test(verify, buffers_declared_device_memory_are_verified_on_the_stand_in_driver)
{
    fake_driver();
    all_ok(run_ranks(4, device_check), 4);
}

/* Without a driver, a rank whose buffers are device memory cannot fingerprint them: it says so,
 * and the others name it. */
static reshard_status_t device_no_driver(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    reshard_layout_t *src = NULL, *dst = NULL;
    reshard_layout_parse(FLIP_SRC, 0, &src);
    reshard_layout_parse(FLIP_DST, 0, &dst);
    reshard_tensor_t ts[1] = {{"a", src, dst}};
    reshard_plan_t *plan = NULL;
    reshard_status_t st = reshard_comm_plan_create(comm, ts, 1, NULL, &plan);
    struct bufset s;
    reshard_buffers_t b[1];
    if (st == RESHARD_OK) {
        bufs_make(ts, 1, rank, &s, b, ts);
        if (rank == 3)
            b[0].mem = RESHARD_MEM_CUDA;
        st = reshard_plan_check_layouts(plan, b);
        const char *m = reshard_last_error();
        int ok = rank == 3 ? st == RESHARD_ERR_UNAVAILABLE &&
                                 strstr(m, "rank 3: destination of tensor a: device memory, and "
                                           "no CUDA driver")
                           : st == RESHARD_ERR_REMOTE &&
                                 strstr(m, "rank 3 could not fingerprint its shards");
        if (!ok)
            fprintf(stderr, "rank %d: %s: %s\n", rank, reshard_strerror(st), m);
        st = ok ? RESHARD_OK : RESHARD_ERR_INTERNAL;
        bufs_free(&s);
        reshard_plan_destroy(plan);
    }
    reshard_layout_destroy(src);
    reshard_layout_destroy(dst);
    return st;
}

Test(verify, device_buffers_without_a_driver_fail_the_check_naming_the_rank)
{
    setenv("RESHARD_CUDA_LIB", "libcuda-not-here.so.1", 1);
    all_ok(run_ranks(4, device_no_driver), 4);
}

/* ---- arguments ---- */

Test(verify, check_layouts_refuses_a_plan_without_a_communicator_and_null_arguments)
{
    reshard_layout_t *src = NULL, *dst = NULL;
    reshard_layout_parse(FLIP_SRC, 0, &src);
    reshard_layout_parse(FLIP_DST, 0, &dst);
    reshard_tensor_t ts[1] = {{"a", src, dst}};
    reshard_topo_t *topo = NULL;
    cr_assert_eq(reshard_topo_create(4, 2, NULL, &topo), RESHARD_OK);
    reshard_plan_t *plan = NULL;
    cr_assert_eq(reshard_plan_create(ts, 1, topo, NULL, &plan), RESHARD_OK);
    reshard_buffers_t b[1] = {{0}};
    cr_assert_eq(reshard_plan_check_layouts(plan, b), RESHARD_ERR_INVALID_ARG);
    cr_assert(strstr(reshard_last_error(), "made by reshard_plan_create"), "%s",
              reshard_last_error());
    cr_assert_eq(reshard_plan_check_layouts(plan, NULL), RESHARD_ERR_INVALID_ARG);
    cr_assert(strstr(reshard_last_error(), "bufs"), "%s", reshard_last_error());
    cr_assert_eq(reshard_plan_check_layouts(NULL, b), RESHARD_ERR_INVALID_ARG);
    reshard_plan_destroy(plan);
    reshard_topo_destroy(topo);
    reshard_layout_destroy(src);
    reshard_layout_destroy(dst);
}
