/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Manifests (DESIGN.md section 4): a whole model's tensors and their two placements, read from
 * JSON with jansson. Every side becomes a layout spec that the spec parser checks, so a
 * manifest and a command line are held to the same rules; errors name the tensor and the JSON
 * path of the field.
 */
#include "api.h"

#include "base/error.h"
#include "base/log.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SPEC_MAX 4096

struct reshard_manifest {
    int world_size;
    int domain_size; /* 0 when domain_of says */
    int *domain_of;  /* [world_size] or NULL */
    int ntensors;
    reshard_tensor_t *tensors;
    char **names;
    reshard_layout_t **layouts; /* [2 * ntensors]: src, dst */
};

/* Where an error is: "tensors[12] (model.layers.0.q_proj.weight).src.place". */
struct where {
    const char *file;
    int index;
    const char *name;
};

static reshard_status_t bad(const struct where *w, const char *field, reshard_status_t st,
                            const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static reshard_status_t bad(const struct where *w, const char *field, reshard_status_t st,
                            const char *fmt, ...)
{
    char what[RS_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    if (w->index < 0)
        return rs_error(st, "manifest %s: %s: %s", w->file, field, what);
    if (w->name)
        return rs_error(st, "manifest %s: tensors[%d] (%s).%s: %s", w->file, w->index, w->name,
                        field, what);
    return rs_error(st, "manifest %s: tensors[%d].%s: %s", w->file, w->index, field, what);
}

static const char *type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    default:
        return "null";
    }
}

/* Appends " key=value" to spec, value from a string or from an array of integers (joined by
 * sep) or strings (joined by ","), as the spec grammar writes them. */
static reshard_status_t put_item(const struct where *w, const char *field, const char *key,
                                 const json_t *v, char sep, char *spec, size_t *len)
{
    char buf[SPEC_MAX];
    size_t n = 0;
    if (json_is_string(v)) {
        n = (size_t)snprintf(buf, sizeof(buf), "%s", json_string_value(v));
    } else if (json_is_integer(v)) {
        n = (size_t)snprintf(buf, sizeof(buf), "%lld", (long long)json_integer_value(v));
    } else if (json_is_array(v) && json_array_size(v)) {
        size_t i;
        const json_t *e;
        json_array_foreach(v, i, e)
        {
            if (json_is_integer(e))
                n += (size_t)snprintf(buf + n, sizeof(buf) - n, "%s%lld", i ? (char[]){sep, 0} : "",
                                      (long long)json_integer_value(e));
            else if (json_is_string(e) && !strcmp(key, "place"))
                n += (size_t)snprintf(buf + n, sizeof(buf) - n, "%s%s", i ? "," : "",
                                      json_string_value(e));
            else
                return bad(w, field, RESHARD_ERR_SPEC_SYNTAX, "%s[%zu] is %s", key, i,
                           type_name(e));
            if (n >= sizeof(buf))
                break;
        }
    } else {
        return bad(w, field, RESHARD_ERR_SPEC_SYNTAX, "%s is %s", key, type_name(v));
    }
    if (n >= sizeof(buf) || strpbrk(buf, " \t\n"))
        return bad(w, field, RESHARD_ERR_SPEC_SYNTAX, "%s is too long or holds spaces", key);
    int m = snprintf(spec + *len, SPEC_MAX - *len, "%s%s=%s", *len ? " " : "", key, buf);
    if (m < 0 || (size_t)m >= SPEC_MAX - *len)
        return bad(w, field, RESHARD_ERR_TOO_LARGE, "the placement is too long");
    *len += (size_t)m;
    return RESHARD_OK;
}

/* A side: a spec string without shape and dtype, or an object of its items. */
static reshard_status_t side_spec(const struct where *w, const char *field, const json_t *side,
                                  char *spec, size_t *len)
{
    *len = 0;
    spec[0] = '\0';
    if (!side)
        return bad(w, field, RESHARD_ERR_SPEC_SYNTAX, "missing");
    if (json_is_string(side)) {
        const char *s = json_string_value(side);
        if (strstr(s, "shape=") || strstr(s, "dtype="))
            return bad(w, field, RESHARD_ERR_SPEC_SYNTAX,
                       "shape and dtype belong to the tensor, not to one side");
        int m = snprintf(spec, SPEC_MAX, "%s", s);
        if (m < 0 || m >= SPEC_MAX)
            return bad(w, field, RESHARD_ERR_TOO_LARGE, "the placement is too long");
        *len = (size_t)m;
        return RESHARD_OK;
    }
    if (!json_is_object(side))
        return bad(w, field, RESHARD_ERR_SPEC_SYNTAX, "%s, not a spec string or an object",
                   type_name(side));
    static const struct {
        const char *key;
        char sep;
    } items[] = {{"ranks", ','}, {"mesh", 'x'}, {"place", ','},  {"buffer", 0},
                 {"offset", 0},  {"view", 'x'}, {"strides", 'x'}};
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)side, key, v)
    {
        size_t i = 0;
        while (i < sizeof(items) / sizeof(items[0]) && strcmp(items[i].key, key))
            i++;
        if (i == sizeof(items) / sizeof(items[0]))
            return bad(w, field, RESHARD_ERR_SPEC_SYNTAX,
                       "unknown key '%s' (ranks, mesh, place, buffer, offset, view, strides)", key);
        RS_CHECK(put_item(w, field, key, v, items[i].sep ? items[i].sep : ',', spec, len));
    }
    return RESHARD_OK;
}

static reshard_status_t layout_of(const struct where *w, const char *field, const json_t *side,
                                  const char *shape_dtype, int world, reshard_layout_t **out)
{
    char spec[SPEC_MAX + 256];
    size_t len;
    RS_CHECK(side_spec(w, field, side, spec, &len));
    /* The side first, so that the parser's columns are the side string's own. */
    snprintf(spec + len, sizeof(spec) - len, "%s%s", len ? " " : "", shape_dtype);
    reshard_status_t st = reshard_layout_parse(spec, world, out);
    if (st != RESHARD_OK) {
        char msg[RS_ERROR_MAX];
        snprintf(msg, sizeof(msg), "%s", rs_error_message());
        return bad(w, field, st, "%s", msg);
    }
    reshard_layout_info_t info;
    reshard_layout_info(*out, &info);
    if (info.max_rank >= world) {
        reshard_layout_destroy(*out);
        *out = NULL;
        return bad(w, field, RESHARD_ERR_RANK_RANGE, "rank %d is outside world_size %d",
                   info.max_rank, world);
    }
    return RESHARD_OK;
}

static reshard_status_t shape_dtype_of(const struct where *w, const json_t *t, char *buf, size_t n)
{
    const json_t *shape = json_object_get(t, "shape"), *dtype = json_object_get(t, "dtype");
    if (!json_is_array(shape) || !json_array_size(shape) || json_array_size(shape) > 8)
        return bad(w, "shape", RESHARD_ERR_SPEC_SYNTAX,
                   shape ? "is %s, not an array of 1 to 8 sizes" : "missing%s",
                   shape ? type_name(shape) : "");
    size_t len = (size_t)snprintf(buf, n, "shape=");
    size_t i;
    const json_t *e;
    json_array_foreach(shape, i, e)
    {
        if (!json_is_integer(e) || json_integer_value(e) < 0)
            return bad(w, "shape", RESHARD_ERR_SPEC_SYNTAX, "shape[%zu] is %s", i,
                       json_is_integer(e) ? "negative" : type_name(e));
        len += (size_t)snprintf(buf + len, n - len, "%s%lld", i ? "x" : "",
                                (long long)json_integer_value(e));
    }
    if (!dtype)
        return bad(w, "dtype", RESHARD_ERR_SPEC_SYNTAX, "missing");
    if (!json_is_string(dtype))
        return bad(w, "dtype", RESHARD_ERR_SPEC_SYNTAX, "is %s, not a string", type_name(dtype));
    snprintf(buf + len, n - len, " dtype=%s", json_string_value(dtype));
    return RESHARD_OK;
}

static reshard_status_t tensor_of(struct reshard_manifest *m, const struct where *file_w, int i,
                                  const json_t *t)
{
    struct where w = {.file = file_w->file, .index = i};
    if (!json_is_object(t))
        return bad(&w, "", RESHARD_ERR_SPEC_SYNTAX, "is %s, not an object", type_name(t));
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)t, key, v)
    {
        if (strcmp(key, "name") && strcmp(key, "shape") && strcmp(key, "dtype") &&
            strcmp(key, "src") && strcmp(key, "dst"))
            return bad(&w, key, RESHARD_ERR_SPEC_SYNTAX,
                       "unknown key (name, shape, dtype, src, dst)");
    }
    const json_t *name = json_object_get(t, "name");
    if (!json_is_string(name) || !*json_string_value(name))
        return bad(&w, "name", RESHARD_ERR_SPEC_SYNTAX,
                   name ? "is %s, not a non-empty string" : "missing%s",
                   name ? type_name(name) : "");
    w.name = json_string_value(name);
    if (!(m->names[i] = strdup(w.name)))
        return rs_error(RESHARD_ERR_NO_MEMORY, "manifest: no memory for names");
    char sd[256];
    RS_CHECK(shape_dtype_of(&w, t, sd, sizeof(sd)));
    RS_CHECK(
        layout_of(&w, "src", json_object_get(t, "src"), sd, m->world_size, &m->layouts[2 * i]));
    RS_CHECK(
        layout_of(&w, "dst", json_object_get(t, "dst"), sd, m->world_size, &m->layouts[2 * i + 1]));
    m->tensors[i] = (reshard_tensor_t){m->names[i], m->layouts[2 * i], m->layouts[2 * i + 1]};
    return RESHARD_OK;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static reshard_status_t check_unique(const struct reshard_manifest *m, const char *file)
{
    char **sorted = rs_calloc((size_t)m->ntensors, sizeof(*sorted), "manifest names");
    if (!sorted)
        return RESHARD_ERR_NO_MEMORY;
    memcpy(sorted, m->names, (size_t)m->ntensors * sizeof(*sorted));
    qsort(sorted, (size_t)m->ntensors, sizeof(*sorted), cmp_names);
    reshard_status_t st = RESHARD_OK;
    for (int i = 1; i < m->ntensors && st == RESHARD_OK; i++)
        if (!strcmp(sorted[i - 1], sorted[i]))
            st = rs_error(RESHARD_ERR_SPEC_SYNTAX,
                          "manifest %s: tensors: the name '%s' appears "
                          "twice",
                          file, sorted[i]);
    free(sorted);
    return st;
}

static reshard_status_t domains_of(struct reshard_manifest *m, const struct where *w,
                                   const json_t *d)
{
    m->domain_size = 8;
    if (!d)
        return RESHARD_OK;
    const json_t *size = json_object_get(d, "size"), *of = json_object_get(d, "of_rank");
    if (!json_is_object(d) || (!size == !of) || json_object_size(d) != 1)
        return bad(w, "domains", RESHARD_ERR_SPEC_SYNTAX,
                   "must be {\"size\": N} or {\"of_rank\": [domain of every rank]}");
    if (size) {
        if (!json_is_integer(size) || json_integer_value(size) < 1)
            return bad(w, "domains.size", RESHARD_ERR_SPEC_SYNTAX, "is not a positive integer");
        m->domain_size = (int)json_integer_value(size);
        return RESHARD_OK;
    }
    if (!json_is_array(of) || json_array_size(of) != (size_t)m->world_size)
        return bad(w, "domains.of_rank", RESHARD_ERR_SPEC_SYNTAX,
                   "must be an array of world_size (%d) domain ids", m->world_size);
    if (!(m->domain_of = rs_calloc((size_t)m->world_size, sizeof(int), "manifest domains")))
        return RESHARD_ERR_NO_MEMORY;
    size_t i;
    const json_t *e;
    json_array_foreach(of, i, e)
    {
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > INT32_MAX)
            return bad(w, "domains.of_rank", RESHARD_ERR_SPEC_SYNTAX,
                       "entry %zu is not a domain id", i);
        m->domain_of[i] = (int)json_integer_value(e);
    }
    m->domain_size = 0;
    return RESHARD_OK;
}

/* ---- shared buffers: views of one buffer must not overlap ---- */

/* Elements [lo, hi) of a buffer that one tensor's view covers on one rank. */
struct span {
    int64_t lo, hi;
    int tensor;
};

#define MAX_SPANS_PER_VIEW (1 << 20) /* beyond, the view goes unchecked */

/* Appends the runs of rank's view to *s: contiguous inner dims merged, the outer ones walked.
 * A view of more than MAX_SPANS_PER_VIEW runs is left unchecked (*skipped). */
static reshard_status_t view_spans(const reshard_layout_t *layout, int rank, int tensor,
                                   struct span **s, size_t *n, size_t *cap, int *skipped)
{
    const struct rs_layout *l = &layout->l;
    int64_t shape[8], numel;
    RS_CHECK(reshard_layout_shard_shape(layout, rank, shape, &numel));
    if (!numel)
        return RESHARD_OK;
    const struct rs_view *v = &l->view;
    int nd = v->ndim ? v->ndim : l->ndim;
    const int64_t *vs = v->ndim ? v->shape : shape;
    int64_t st[RS_MAX_DIMS];
    for (int d = nd - 1; d >= 0; d--)
        st[d] = v->nstrides ? v->strides[d] : d == nd - 1 ? 1 : st[d + 1] * vs[d + 1];
    /* inner: the dims from k on are one contiguous run */
    int k = nd;
    int64_t run = 1;
    while (k > 0 && st[k - 1] == run) {
        run *= vs[k - 1];
        k--;
    }
    int64_t outer = 1;
    for (int d = 0; d < k; d++)
        outer *= vs[d];
    if (outer > MAX_SPANS_PER_VIEW) {
        *skipped = 1;
        return RESHARD_OK;
    }
    int64_t idx[RS_MAX_DIMS] = {0};
    for (int64_t i = 0; i < outer; i++) {
        int64_t at = v->offset;
        for (int d = 0; d < k; d++)
            at += idx[d] * st[d];
        struct span *g = rs_grow(*s, cap, *n + 1, sizeof(**s), "manifest buffers");
        if (!g)
            return RESHARD_ERR_NO_MEMORY;
        *s = g;
        (*s)[(*n)++] = (struct span){at, at + run, tensor};
        for (int d = k - 1; d >= 0 && ++idx[d] == vs[d]; d--)
            idx[d] = 0;
    }
    return RESHARD_OK;
}

static int cmp_span(const void *a, const void *b)
{
    const struct span *p = a, *q = b;
    return p->lo < q->lo ? -1 : p->lo > q->lo;
}

static const struct rs_layout *side_layout(const struct reshard_manifest *m, int t, int side)
{
    return &((const struct reshard_layout *)m->layouts[2 * t + side])->l;
}

struct by_buffer {
    const struct reshard_manifest *m;
    int side;
};

static int cmp_buffer(const void *a, const void *b, void *arg)
{
    const struct by_buffer *c = arg;
    int x = *(const int *)a, y = *(const int *)b;
    int d = strcmp(side_layout(c->m, x, c->side)->view.buffer,
                   side_layout(c->m, y, c->side)->view.buffer);
    return d ? d : (x > y) - (x < y);
}

/* Tensors ids[0 .. n), which share one buffer, on one rank: no element in two views. */
static reshard_status_t check_group(const struct reshard_manifest *m, const char *path, int side,
                                    const int *ids, int n, int rank, struct span **s, size_t *cap,
                                    int *skipped)
{
    size_t ns = 0;
    for (int i = 0; i < n; i++)
        RS_CHECK(view_spans(m->layouts[2 * ids[i] + side], rank, ids[i], s, &ns, cap, skipped));
    if (ns < 2)
        return RESHARD_OK;
    qsort(*s, ns, sizeof(**s), cmp_span);
    const struct span *reach = &(*s)[0]; /* the span reaching furthest so far */
    for (size_t i = 1; i < ns; i++) {
        const struct span *x = &(*s)[i];
        if (x->lo < reach->hi && x->tensor != reach->tensor) {
            const char *which = side ? "dst" : "src";
            return rs_error(RESHARD_ERR_VIEW,
                            "manifest %s: tensors[%d] (%s).%s and tensors[%d] (%s).%s overlap in "
                            "buffer '%s' on rank %d (elements %lld to %lld)",
                            path, reach->tensor, m->names[reach->tensor], which, x->tensor,
                            m->names[x->tensor], which,
                            side_layout(m, x->tensor, side)->view.buffer, rank, (long long)x->lo,
                            (long long)(x->hi < reach->hi ? x->hi : reach->hi) - 1);
        }
        if (x->hi > reach->hi)
            reach = x;
    }
    return RESHARD_OK;
}

/* Views that name one buffer must not overlap on any rank. */
static reshard_status_t check_buffers(const struct reshard_manifest *m, const char *path)
{
    int *ids = rs_calloc((size_t)m->ntensors, sizeof(int), "manifest buffers");
    struct span *s = NULL;
    size_t cap = 0;
    int skipped = 0;
    reshard_status_t st = ids ? RESHARD_OK : RESHARD_ERR_NO_MEMORY;
    for (int side = 0; side < 2 && st == RESHARD_OK; side++) {
        int n = 0;
        for (int t = 0; t < m->ntensors; t++)
            if (side_layout(m, t, side)->view.buffer[0])
                ids[n++] = t;
        struct by_buffer ctx = {m, side};
        qsort_r(ids, (size_t)n, sizeof(int), cmp_buffer, &ctx);
        for (int i = 0, j; i < n && st == RESHARD_OK; i = j) {
            const char *name = side_layout(m, ids[i], side)->view.buffer;
            for (j = i + 1; j < n && !strcmp(side_layout(m, ids[j], side)->view.buffer, name);)
                j++;
            for (int r = 0; j - i > 1 && r < m->world_size && st == RESHARD_OK; r++)
                st = check_group(m, path, side, ids + i, j - i, r, &s, &cap, &skipped);
        }
    }
    if (skipped && st == RESHARD_OK)
        rs_log(RS_LOG_INFO, "manifest %s: a view with over %d runs was not checked for overlaps",
               path, MAX_SPANS_PER_VIEW);
    free(s);
    free(ids);
    return st;
}

/* "buffers": {"name": elements}: each named buffer's size on every rank; a view reaching past
 * it is an error. Buffers not listed are not checked. */
static reshard_status_t check_sizes(const struct reshard_manifest *m, const char *path,
                                    const json_t *buffers)
{
    struct where w = {.file = path, .index = -1};
    if (!buffers)
        return RESHARD_OK;
    if (!json_is_object(buffers))
        return bad(&w, "buffers", RESHARD_ERR_SPEC_SYNTAX,
                   "must be an object of buffer names and sizes in elements");
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)buffers, key, v)
    {
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return bad(&w, "buffers", RESHARD_ERR_SPEC_SYNTAX,
                       "'%s' must be a size in elements (a non-negative integer)", key);
    }
    for (int t = 0; t < m->ntensors; t++)
        for (int side = 0; side < 2; side++) {
            const reshard_layout_t *l = m->layouts[2 * t + side];
            const json_t *size = json_object_get(buffers, l->l.view.buffer);
            if (!l->l.view.buffer[0] || !size)
                continue;
            int64_t have = json_integer_value(size);
            size_t es = dtype_size(l->l.dtype);
            for (int r = 0; r < m->world_size; r++) {
                size_t bytes = 0;
                RS_CHECK(reshard_layout_shard_bytes(l, r, &bytes));
                if ((int64_t)(bytes / es) > have)
                    return rs_error(RESHARD_ERR_VIEW,
                                    "manifest %s: tensors[%d] (%s).%s: its view reaches element "
                                    "%lld of buffer '%s', which holds %lld (rank %d)",
                                    path, t, m->names[t], side ? "dst" : "src",
                                    (long long)(bytes / es) - 1, l->l.view.buffer, (long long)have,
                                    r);
            }
        }
    return RESHARD_OK;
}

static reshard_status_t load(struct reshard_manifest *m, const char *path, const json_t *root)
{
    struct where w = {.file = path, .index = -1};
    if (!json_is_object(root))
        return bad(&w, "(top)", RESHARD_ERR_SPEC_SYNTAX, "is %s, not an object", type_name(root));
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)root, key, v)
    {
        if (strcmp(key, "version") && strcmp(key, "world_size") && strcmp(key, "domains") &&
            strcmp(key, "tensors") && strcmp(key, "buffers") && strcmp(key, "meta"))
            return bad(&w, key, RESHARD_ERR_SPEC_SYNTAX,
                       "unknown key (version, world_size, domains, tensors, buffers, meta)");
    }
    const json_t *ver = json_object_get(root, "version");
    if (!json_is_integer(ver) || json_integer_value(ver) != 1)
        return bad(&w, "version", RESHARD_ERR_SPEC_SYNTAX,
                   ver ? "must be 1 (the only version this library reads)" : "missing");
    const json_t *ws = json_object_get(root, "world_size");
    if (!json_is_integer(ws) || json_integer_value(ws) < 1 || json_integer_value(ws) > 1 << 20)
        return bad(&w, "world_size", RESHARD_ERR_SPEC_SYNTAX,
                   ws ? "must be an integer in [1, 2^20]" : "missing");
    m->world_size = (int)json_integer_value(ws);
    RS_CHECK(domains_of(m, &w, json_object_get(root, "domains")));
    const json_t *ts = json_object_get(root, "tensors");
    if (!json_is_array(ts) || !json_array_size(ts) || json_array_size(ts) > INT32_MAX / 2)
        return bad(&w, "tensors", RESHARD_ERR_SPEC_SYNTAX,
                   ts ? "must be a non-empty array" : "missing");
    size_t n = json_array_size(ts);
    m->tensors = rs_calloc(n, sizeof(*m->tensors), "manifest tensors");
    m->names = rs_calloc(n, sizeof(*m->names), "manifest names");
    m->layouts = rs_calloc(2 * n, sizeof(*m->layouts), "manifest layouts");
    if (!m->tensors || !m->names || !m->layouts)
        return RESHARD_ERR_NO_MEMORY;
    m->ntensors = (int)n;
    for (size_t i = 0; i < n; i++)
        RS_CHECK(tensor_of(m, &w, (int)i, json_array_get(ts, i)));
    RS_CHECK(check_unique(m, path));
    RS_CHECK(check_buffers(m, path));
    return check_sizes(m, path, json_object_get(root, "buffers"));
}

/* The parsed document (or NULL, jerr saying why) into a manifest named `name`. */
static reshard_status_t from_root(json_t *root, const json_error_t *jerr, const char *name,
                                  reshard_manifest_t **out)
{
    if (!root)
        return rs_error(RESHARD_ERR_SPEC_SYNTAX, "manifest %s:%d:%d: %s", name, jerr->line,
                        jerr->column, jerr->text);
    struct reshard_manifest *m = rs_calloc(1, sizeof(*m), "manifest");
    reshard_status_t st = m ? load(m, name, root) : RESHARD_ERR_NO_MEMORY;
    json_decref(root);
    if (st != RESHARD_OK) {
        reshard_manifest_destroy(m);
        return st;
    }
    *out = m;
    return RESHARD_OK;
}

reshard_status_t reshard_manifest_load(const char *path, reshard_manifest_t **out)
{
    api_enter();
    if (!path || !out)
        return api_null_arg("reshard_manifest_load", !path ? "path" : "out");
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    return api_leave("reshard_manifest_load", from_root(root, &jerr, path, out));
}

reshard_status_t manifest_load_buffer(const char *buf, size_t len, const char *name,
                                      reshard_manifest_t **out)
{
    json_error_t jerr;
    json_t *root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
    return from_root(root, &jerr, name, out);
}

void reshard_manifest_destroy(reshard_manifest_t *m)
{
    if (!m)
        return;
    for (int i = 0; m->layouts && i < 2 * m->ntensors; i++)
        reshard_layout_destroy(m->layouts[i]);
    for (int i = 0; m->names && i < m->ntensors; i++)
        free(m->names[i]);
    free(m->layouts);
    free(m->names);
    free(m->tensors);
    free(m->domain_of);
    free(m);
}

int reshard_manifest_world_size(const reshard_manifest_t *m)
{
    return m ? m->world_size : 0;
}

int reshard_manifest_ntensors(const reshard_manifest_t *m)
{
    return m ? m->ntensors : 0;
}

const reshard_tensor_t *reshard_manifest_tensors(const reshard_manifest_t *m)
{
    return m ? m->tensors : NULL;
}

reshard_status_t reshard_manifest_topo(const reshard_manifest_t *m, reshard_topo_t **topo)
{
    if (!m || !topo)
        return api_null_arg("reshard_manifest_topo", !m ? "manifest" : "topo");
    return reshard_topo_create(m->world_size, m->domain_size, m->domain_of, topo);
}
