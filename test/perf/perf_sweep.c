/* SPDX-License-Identifier: Apache-2.0 */
/*
 * reshard_perf's tensors (reshard_perf.h): the sweep of sizes or the one shape a spec names,
 * each pair of specs validated for the run's world; the model of --manifest; where each
 * element of a rank's shard sits (the shard maps the pattern is checked through); and the
 * small helpers every part reports with.
 */
#include "reshard_perf.h"

#include <errno.h>
#include <stddef.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- small helpers ---- */

double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* rank < 0: not known yet. */
int lib_fail(int rank, const char *call, reshard_status_t st)
{
    char who[16] = "?";
    if (rank >= 0)
        snprintf(who, sizeof(who), "%d", rank);
    fprintf(stderr, "reshard_perf: rank %s: %s: %s: %s\n", who, call, reshard_strerror(st),
            reshard_last_error());
    return 1;
}

/* 1 when st is success; otherwise reports the failed call and returns 0. */
int ok(const struct ctx *c, reshard_status_t st, const char *call)
{
    if (st == RESHARD_OK)
        return 1;
    lib_fail(c->rank, call, st);
    return 0;
}

void *xcalloc(size_t n, size_t size, int rank)
{
    void *p = calloc(n ? n : 1, size);
    if (!p)
        fprintf(stderr, "reshard_perf: rank %d: out of memory (%zu x %zu bytes)\n", rank, n, size);
    return p;
}

/* The value of item `key` of a spec ("shape" in "shape=4x8 dtype=f32"): 1 when present. */
int spec_item(const char *spec, const char *key, char *val, size_t n)
{
    size_t klen = strlen(key);
    for (const char *p = spec; *p;) {
        while (*p == ' ' || *p == '\t')
            p++;
        size_t len = strcspn(p, " \t");
        if (len > klen && !strncmp(p, key, klen) && p[klen] == '=') {
            if (val && n)
                snprintf(val, n, "%.*s", (int)(len - klen - 1), p + klen + 1);
            return 1;
        }
        p += len;
    }
    return 0;
}

/* The canonical spec of a layout (malloc'd), or NULL. */
char *layout_string(const reshard_layout_t *l)
{
    size_t n = reshard_layout_format(l, NULL, 0) + 1;
    char *s = malloc(n);
    if (s)
        reshard_layout_format(l, s, n);
    return s;
}

/* ---- shard maps ---- */

int map_build(struct shard_map *m, const reshard_layout_t *l, int rank, const char *side)
{
    reshard_layout_info_t info;
    memset(m, 0, sizeof(*m));
    reshard_status_t st = reshard_layout_info(l, &info);
    if (st == RESHARD_OK)
        st = reshard_layout_shard_shape(l, rank, m->shape, &m->numel);
    if (st == RESHARD_OK)
        st = reshard_layout_shard_bytes(l, rank, &m->bytes);
    if (st != RESHARD_OK)
        return lib_fail(rank, "reshard_layout_shard_shape", st);
    m->ndim = info.ndim;
    m->elem_size = info.elem_size;
    if ((size_t)m->numel * m->elem_size != m->bytes) {
        fprintf(stderr,
                "reshard_perf: rank %d: %s shard spans %zu bytes for %" PRId64 " elements: "
                "local views are not supported by reshard_perf\n",
                rank, side, m->bytes, m->numel);
        return 1;
    }
    m->stride[m->ndim - 1] = 1;
    for (int d = m->ndim - 2; d >= 0; d--)
        m->stride[d] = m->stride[d + 1] * info.shape[d + 1];
    if (m->numel == 0)
        return 0;
    for (int d = 0; d < m->ndim; d++) {
        m->index[d] = xcalloc((size_t)m->shape[d], sizeof(int64_t), rank);
        if (!m->index[d])
            return 1;
        st = reshard_layout_shard_index(l, rank, d, m->index[d]);
        if (st != RESHARD_OK)
            return lib_fail(rank, "reshard_layout_shard_index", st);
    }
    return 0;
}

/* ---- the sweep ---- */

/* spec with "shape=SHAPE dtype=DTYPE " in front, each only where the spec lacks it. */
static char *with_shape(const char *spec, const char *shape, const char *dtype)
{
    char *s = NULL;
    if (spec_item(spec, "shape", NULL, 0))
        return strdup(spec);
    int add_dtype = dtype && !spec_item(spec, "dtype", NULL, 0);
    if (asprintf(&s, "shape=%s%s%s %s", shape, add_dtype ? " dtype=" : "", add_dtype ? dtype : "",
                 spec) < 0)
        return NULL;
    return s;
}

static int elem_size_of(const char *dtype, size_t *es)
{
    char spec[64];
    reshard_layout_t *l;
    reshard_layout_info_t info;
    snprintf(spec, sizeof(spec), "shape=1 dtype=%.40s", dtype);
    if (reshard_layout_parse(spec, 1, &l) != RESHARD_OK) {
        fprintf(stderr, "reshard_perf: -d %s: %s\n", dtype, reshard_last_error());
        return EXIT_USAGE;
    }
    reshard_layout_info(l, &info);
    reshard_layout_destroy(l);
    *es = info.elem_size;
    return 0;
}

static int sweep_add(struct sweep *sw, const struct opts *o, const char *shape, const char *dtype)
{
    sw->src[sw->n] = with_shape(o->src, shape, dtype);
    sw->dst[sw->n] = with_shape(o->dst, shape, dtype);
    sw->n++;
    if (sw->src[sw->n - 1] && sw->dst[sw->n - 1])
        return 0;
    fprintf(stderr, "reshard_perf: out of memory\n");
    return 1;
}

/* One spec names the shape: that tensor alone, the other spec borrowing its shape and dtype. */
static int sweep_fixed(struct sweep *sw, const struct opts *o)
{
    const char *shaped = spec_item(o->src, "shape", NULL, 0) ? o->src : o->dst;
    char shape[256], dtype[32];
    spec_item(shaped, "shape", shape, sizeof(shape));
    int has_dtype = spec_item(shaped, "dtype", dtype, sizeof(dtype));
    sw->fixed = 1;
    return sweep_add(sw, o, shape, has_dtype ? dtype : NULL);
}

/* Sizes from -b to -e by -f; the shape is [count/1024, 1024], or [1, count] below 1024. The
 * dtype is the one a spec names (src first), else -d. */
static int sweep_sized(struct sweep *sw, const struct opts *o)
{
    char own[32], shape[64];
    /* a quantized destination's dtype is its own: the sizes are the source's */
    int named =
        spec_item(o->src, "dtype", own, sizeof(own)) ||
        (!spec_item(o->dst, "quant", NULL, 0) && spec_item(o->dst, "dtype", own, sizeof(own)));
    const char *dtype = named ? own : o->dtype;
    size_t es = 1;
    int rc = elem_size_of(dtype, &es);
    for (size_t b = o->min_bytes; !rc && sw->n < MAX_SIZES; b *= (size_t)o->factor) {
        int64_t count = (int64_t)(b / es);
        if (count == 0) {
            fprintf(stderr, "reshard_perf: %zu bytes is less than one %s element\n", b, dtype);
            return EXIT_USAGE;
        }
        if (count >= 1024)
            snprintf(shape, sizeof(shape), "%" PRId64 "x1024", count / 1024);
        else
            snprintf(shape, sizeof(shape), "1x%" PRId64, count);
        rc = sweep_add(sw, o, shape, dtype);
        if (b > o->max_bytes / (size_t)o->factor || o->factor < 2)
            break;
    }
    return rc;
}

void sweep_free(struct sweep *sw)
{
    for (int i = 0; i < sw->n; i++) {
        free(sw->src[i]);
        free(sw->dst[i]);
    }
    sw->n = 0;
}

int sweep_build(struct sweep *sw, const struct opts *o)
{
    memset(sw, 0, sizeof(*sw));
    if (spec_item(o->src, "shape", NULL, 0) || spec_item(o->dst, "shape", NULL, 0))
        return sweep_fixed(sw, o);
    return sweep_sized(sw, o);
}

static int parse_side(const char *flag, const char *spec, int world, int loud, reshard_layout_t **l)
{
    if (reshard_layout_parse(spec, world, l) == RESHARD_OK)
        return 0;
    if (loud)
        fprintf(stderr, "reshard_perf: %s '%s': %s\n", flag, spec, reshard_last_error());
    return EXIT_USAGE;
}

/* Does a canonical spec place the shard in a view (not row-major from its buffer's start)? */
static int has_view(const char *canonical)
{
    static const char *const keys[] = {"buffer", "offset", "view", "strides"};
    for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++)
        if (spec_item(canonical, keys[k], NULL, 0))
            return 1;
    return 0;
}

/* What the tool refuses up front: ranks beyond the world, src and dst that differ, views. */
static int check_pair(const reshard_layout_t *s, const reshard_layout_t *d, int world,
                      char type[16], const char **why)
{
    reshard_layout_info_t si, di;
    char *sf = layout_string(s), *df = layout_string(d), st[16] = "", dt[16] = "";
    *why = NULL;
    if (!sf || !df)
        *why = "out of memory";
    else if (reshard_layout_info(s, &si) != RESHARD_OK || reshard_layout_info(d, &di) != RESHARD_OK)
        *why = reshard_last_error();
    else if (si.max_rank >= world || di.max_rank >= world)
        *why = "the layouts name ranks beyond the number of ranks running";
    else if (si.ndim != di.ndim || memcmp(si.shape, di.shape, sizeof(si.shape)) ||
             !spec_item(sf, "dtype", st, sizeof(st)) || !spec_item(df, "dtype", dt, sizeof(dt)) ||
             (strcmp(st, dt) && !spec_item(df, "quant", NULL, 0)))
        *why = "--src and --dst differ in shape or dtype";
    else if (has_view(sf) || has_view(df))
        *why = "local views (buffer, offset, view, strides) are not supported by reshard_perf";
    if (strcmp(st, dt)) /* quantized on the way: bf16>e4m3 */
        snprintf(type, 16, "%.6s>%.6s", st, strncmp(dt, "fp8", 3) ? dt : dt + 3);
    else
        snprintf(type, 16, "%s", st);
    free(sf);
    free(df);
    return *why ? EXIT_USAGE : 0;
}

/* Parses every tensor of the sweep for `world` ranks and records its size. */
int sweep_validate(struct sweep *sw, int world, int loud)
{
    int rc = 0;
    for (int i = 0; i < sw->n && !rc; i++) {
        reshard_layout_t *s = NULL, *d = NULL;
        reshard_layout_info_t info;
        const char *why = NULL;
        rc = parse_side("--src", sw->src[i], world, loud, &s);
        if (!rc)
            rc = parse_side("--dst", sw->dst[i], world, loud, &d);
        if (!rc)
            rc = check_pair(s, d, world, sw->type[i], &why);
        if (why && loud)
            fprintf(stderr, "reshard_perf: %s\n  src: %s\n  dst: %s\n", why, sw->src[i],
                    sw->dst[i]);
        if (!rc && reshard_layout_info(s, &info) == RESHARD_OK) {
            sw->count[i] = 1;
            for (int k = 0; k < info.ndim; k++)
                sw->count[i] *= info.shape[k];
            sw->bytes[i] = (size_t)sw->count[i] * info.elem_size;
        }
        reshard_layout_destroy(s);
        reshard_layout_destroy(d);
    }
    return rc;
}

/* --manifest: loads the model and checks what the tool refuses (views, a world that is not
 * the run's), naming the tensor. */
int model_load(struct model *m, const char *path, int world, int loud)
{
    memset(m, 0, sizeof(*m));
    if (reshard_manifest_load(path, &m->man) != RESHARD_OK) {
        if (loud)
            fprintf(stderr, "reshard_perf: %s\n", reshard_last_error());
        return EXIT_USAGE;
    }
    if (reshard_manifest_world_size(m->man) != world) {
        if (loud)
            fprintf(stderr, "reshard_perf: %s is for %d ranks, %d are running\n", path,
                    reshard_manifest_world_size(m->man), world);
        return EXIT_USAGE;
    }
    m->n = reshard_manifest_ntensors(m->man);
    const reshard_tensor_t *t = reshard_manifest_tensors(m->man);
    for (int i = 0; i < m->n; i++) {
        const char *why;
        char type[16];
        reshard_layout_info_t info;
        if (check_pair(t[i].src, t[i].dst, world, type, &why)) {
            if (loud)
                fprintf(stderr, "reshard_perf: %s: tensor %s: %s\n", path, t[i].name, why);
            return EXIT_USAGE;
        }
        reshard_layout_info(t[i].src, &info);
        int64_t count = 1;
        for (int k = 0; k < info.ndim; k++)
            count *= info.shape[k];
        m->count += count;
        m->bytes += (size_t)count * info.elem_size;
        snprintf(m->type, sizeof(m->type), "%s", !i || !strcmp(m->type, type) ? type : "mixed");
    }
    return 0;
}
