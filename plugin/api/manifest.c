/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Manifests (docs/manifest.md): a whole model's tensors and their two placements, read from
 * JSON (jansson, loaded on first use: manifest_json.c). Every side becomes a layout spec that
 * the spec parser checks, so a manifest and a command line are held to the same rules; errors
 * name the tensor and the JSON path of the field. Sides with equal specs share one parsed
 * layout; the buffer checks are manifest_views.c's.
 */
#include "manifest_int.h"

#include "base/error.h"
#include "base/hindex.h"
#include "base/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SPEC_MAX 4096

/* The JSON functions: loaded before any document is read (reshard_manifest_load). */
static const struct json_fns *J(void)
{
    return manifest_json();
}

reshard_status_t manifest_bad(const struct where *w, const char *field, reshard_status_t st,
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
        n = (size_t)snprintf(buf, sizeof(buf), "%s", J()->string_value(v));
    } else if (json_is_integer(v)) {
        n = (size_t)snprintf(buf, sizeof(buf), "%lld", (long long)J()->integer_value(v));
    } else if (json_is_array(v) && J()->array_size(v)) {
        size_t i;
        const json_t *e;
        for (i = 0; i < J()->array_size(v) && (e = J()->array_get(v, i)); i++) {
            if (json_is_integer(e))
                n += (size_t)snprintf(buf + n, sizeof(buf) - n, "%s%lld", i ? (char[]){sep, 0} : "",
                                      (long long)J()->integer_value(e));
            else if (json_is_string(e) && !strcmp(key, "place"))
                n += (size_t)snprintf(buf + n, sizeof(buf) - n, "%s%s", i ? "," : "",
                                      J()->string_value(e));
            else
                return manifest_bad(w, field, RESHARD_ERR_SPEC_SYNTAX, "%s[%zu] is %s", key, i,
                                    type_name(e));
            if (n >= sizeof(buf))
                break;
        }
    } else {
        return manifest_bad(w, field, RESHARD_ERR_SPEC_SYNTAX, "%s is %s", key, type_name(v));
    }
    if (n >= sizeof(buf) || strpbrk(buf, " \t\n"))
        return manifest_bad(w, field, RESHARD_ERR_SPEC_SYNTAX, "%s is too long or holds spaces",
                            key);
    int m = snprintf(spec + *len, SPEC_MAX - *len, "%s%s=%s", *len ? " " : "", key, buf);
    if (m < 0 || (size_t)m >= SPEC_MAX - *len)
        return manifest_bad(w, field, RESHARD_ERR_TOO_LARGE, "the placement is too long");
    *len += (size_t)m;
    return RESHARD_OK;
}

/* A side: a spec string without shape and dtype, or an object of its items. */
static reshard_status_t manifest_side_spec(const struct where *w, const char *field,
                                           const json_t *side, char *spec, size_t *len)
{
    *len = 0;
    spec[0] = '\0';
    if (!side)
        return manifest_bad(w, field, RESHARD_ERR_SPEC_SYNTAX, "missing");
    if (json_is_string(side)) {
        const char *s = J()->string_value(side);
        if (strstr(s, "shape=") || strstr(s, "dtype="))
            return manifest_bad(w, field, RESHARD_ERR_SPEC_SYNTAX,
                                "shape and dtype belong to the tensor, not to one side");
        int m = snprintf(spec, SPEC_MAX, "%s", s);
        if (m < 0 || m >= SPEC_MAX)
            return manifest_bad(w, field, RESHARD_ERR_TOO_LARGE, "the placement is too long");
        *len = (size_t)m;
        return RESHARD_OK;
    }
    if (!json_is_object(side))
        return manifest_bad(w, field, RESHARD_ERR_SPEC_SYNTAX, "%s, not a spec string or an object",
                            type_name(side));
    static const struct {
        const char *key;
        char sep;
    } items[] = {{"ranks", ','}, {"mesh", 'x'}, {"place", ','},   {"buffer", 0},
                 {"offset", 0},  {"view", 'x'}, {"strides", 'x'}, {"quant", 0}};
    const char *key;
    const json_t *v;
    for (void *it_ = J()->object_iter((json_t *)side);
         it_ && (key = J()->object_iter_key(it_)) && (v = J()->object_iter_value(it_));
         it_ = J()->object_iter_next((json_t *)side, it_)) {
        size_t i = 0;
        while (i < sizeof(items) / sizeof(items[0]) && strcmp(items[i].key, key))
            i++;
        if (i == sizeof(items) / sizeof(items[0]))
            return manifest_bad(
                w, field, RESHARD_ERR_SPEC_SYNTAX,
                "unknown key '%s' (ranks, mesh, place, buffer, offset, view, strides, quant)", key);
        RS_CHECK(put_item(w, field, key, v, items[i].sep ? items[i].sep : ',', spec, len));
    }
    return RESHARD_OK;
}

/* The specs read so far and the layouts they gave, while a manifest loads. */
struct spec_cache {
    struct cached_spec {
        uint64_t hash;
        char *spec;
        reshard_layout_t *layout;
    } * v;
    size_t n, cap;
    struct rs_hindex index;
};

static uint64_t hash_spec(const char *s)
{
    uint64_t h = 0xcbf29ce484222325u;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3u;
    return h;
}

static uint64_t spec_hash_of(void *arg, size_t i)
{
    return ((struct spec_cache *)arg)->v[i].hash;
}

/* What layout_of looks for. */
struct spec_probe {
    const struct spec_cache *c;
    const char *spec;
    uint64_t hash;
};

static int spec_eq(void *arg, size_t i)
{
    const struct spec_probe *q = arg;
    return q->c->v[i].hash == q->hash && !strcmp(q->c->v[i].spec, q->spec);
}

static void cache_free(struct spec_cache *c)
{
    for (size_t i = 0; i < c->n; i++)
        free(c->v[i].spec);
    free(c->v);
    rs_hindex_free(&c->index);
}

/* Keeps a layout the manifest owns. */
static reshard_status_t keep_layout(struct reshard_manifest *m, reshard_layout_t *l)
{
    size_t cap = (size_t)m->distinct_cap;
    reshard_layout_t **v =
        rs_grow(m->distinct, &cap, (size_t)m->ndistinct + 1, sizeof(*v), "manifest layouts");
    if (!v)
        return RESHARD_ERR_NO_MEMORY;
    m->distinct = v;
    m->distinct_cap = (int)cap;
    m->distinct[m->ndistinct++] = l;
    return RESHARD_OK;
}

static reshard_status_t parse_side(const struct where *w, const char *field, const char *spec,
                                   int world, reshard_layout_t **out)
{
    reshard_status_t st = reshard_layout_parse(spec, world, out);
    if (st != RESHARD_OK) {
        struct rs_saved_error msg;
        rs_error_save(&msg);
        return manifest_bad(w, field, st, "%s", msg.msg);
    }
    reshard_layout_info_t info;
    reshard_layout_info(*out, &info);
    if (info.max_rank >= world) {
        reshard_layout_destroy(*out);
        *out = NULL;
        return manifest_bad(w, field, RESHARD_ERR_RANK_RANGE, "rank %d is outside world_size %d",
                            info.max_rank, world);
    }
    return RESHARD_OK;
}

/* The layout of one side: the one an equal spec gave earlier, else parsed and kept. */
static reshard_status_t layout_of(struct reshard_manifest *m, struct spec_cache *c,
                                  const struct where *w, const char *field, const json_t *side,
                                  const char *shape_dtype, reshard_layout_t **out)
{
    char spec[SPEC_MAX + 256];
    size_t len;
    RS_CHECK(manifest_side_spec(w, field, side, spec, &len));
    /* The side first, so that the parser's columns are the side string's own. */
    snprintf(spec + len, sizeof(spec) - len, "%s%s", len ? " " : "", shape_dtype);
    uint64_t h = hash_spec(spec);
    RS_CHECK(rs_hindex_fit(&c->index, spec_hash_of, c));
    struct spec_probe q = {c, spec, h};
    size_t at;
    long found = rs_hindex_find(&c->index, h, spec_eq, &q, &at);
    if (found >= 0) {
        *out = c->v[found].layout;
        return RESHARD_OK;
    }
    struct cached_spec *v = rs_grow(c->v, &c->cap, c->n + 1, sizeof(*v), "manifest specs");
    if (!v)
        return RESHARD_ERR_NO_MEMORY;
    c->v = v;
    char *copy = strdup(spec);
    if (!copy)
        return rs_error(RESHARD_ERR_NO_MEMORY, "manifest: no memory for specs");
    reshard_layout_t *l;
    reshard_status_t st = parse_side(w, field, spec, m->world_size, &l);
    if (st == RESHARD_OK && (st = keep_layout(m, l)) != RESHARD_OK)
        reshard_layout_destroy(l);
    if (st != RESHARD_OK) {
        free(copy);
        return st;
    }
    rs_hindex_put(&c->index, at, c->n);
    c->v[c->n++] = (struct cached_spec){h, copy, l};
    *out = l;
    return RESHARD_OK;
}

static reshard_status_t shape_dtype_of(const struct where *w, const json_t *t, char *buf, size_t n)
{
    const json_t *shape = J()->object_get(t, "shape"), *dtype = J()->object_get(t, "dtype");
    if (!json_is_array(shape) || !J()->array_size(shape) || J()->array_size(shape) > 8)
        return manifest_bad(w, "shape", RESHARD_ERR_SPEC_SYNTAX,
                            shape ? "is %s, not an array of 1 to 8 sizes" : "missing%s",
                            shape ? type_name(shape) : "");
    size_t len = (size_t)snprintf(buf, n, "shape=");
    size_t i;
    const json_t *e;
    for (i = 0; i < J()->array_size(shape) && (e = J()->array_get(shape, i)); i++) {
        if (!json_is_integer(e) || J()->integer_value(e) < 0)
            return manifest_bad(w, "shape", RESHARD_ERR_SPEC_SYNTAX, "shape[%zu] is %s", i,
                                json_is_integer(e) ? "negative" : type_name(e));
        len += (size_t)snprintf(buf + len, n - len, "%s%lld", i ? "x" : "",
                                (long long)J()->integer_value(e));
    }
    if (!dtype)
        return manifest_bad(w, "dtype", RESHARD_ERR_SPEC_SYNTAX, "missing");
    if (!json_is_string(dtype))
        return manifest_bad(w, "dtype", RESHARD_ERR_SPEC_SYNTAX, "is %s, not a string",
                            type_name(dtype));
    snprintf(buf + len, n - len, " dtype=%s", J()->string_value(dtype));
    return RESHARD_OK;
}

static reshard_status_t tensor_of(struct reshard_manifest *m, struct spec_cache *c,
                                  const struct where *file_w, int i, const json_t *t)
{
    struct where w = {.file = file_w->file, .index = i};
    if (!json_is_object(t))
        return manifest_bad(&w, "", RESHARD_ERR_SPEC_SYNTAX, "is %s, not an object", type_name(t));
    const char *key;
    const json_t *v;
    for (void *it_ = J()->object_iter((json_t *)t);
         it_ && (key = J()->object_iter_key(it_)) && (v = J()->object_iter_value(it_));
         it_ = J()->object_iter_next((json_t *)t, it_)) {
        if (strcmp(key, "name") && strcmp(key, "shape") && strcmp(key, "dtype") &&
            strcmp(key, "src") && strcmp(key, "dst") && strcmp(key, "dst_dtype"))
            return manifest_bad(&w, key, RESHARD_ERR_SPEC_SYNTAX,
                                "unknown key (name, shape, dtype, dst_dtype, src, dst)");
    }
    const json_t *name = J()->object_get(t, "name");
    if (!json_is_string(name) || !*J()->string_value(name))
        return manifest_bad(&w, "name", RESHARD_ERR_SPEC_SYNTAX,
                            name ? "is %s, not a non-empty string" : "missing%s",
                            name ? type_name(name) : "");
    w.name = J()->string_value(name);
    if (!(m->names[i] = strdup(w.name)))
        return rs_error(RESHARD_ERR_NO_MEMORY, "manifest: no memory for names");
    char sd[256], dd[256];
    RS_CHECK(shape_dtype_of(&w, t, sd, sizeof(sd)));
    /* an FP8 destination of a bf16 weight (its quant on the dst side) has a dtype of its own */
    const json_t *dst_dtype = J()->object_get(t, "dst_dtype");
    if (dst_dtype && !json_is_string(dst_dtype))
        return manifest_bad(&w, "dst_dtype", RESHARD_ERR_SPEC_SYNTAX, "is %s, not a string",
                            type_name(dst_dtype));
    snprintf(dd, sizeof(dd), "%.*s dtype=%.32s", (int)(strstr(sd, " dtype=") - sd), sd,
             dst_dtype ? J()->string_value(dst_dtype) : strstr(sd, " dtype=") + 7);
    RS_CHECK(layout_of(m, c, &w, "src", J()->object_get(t, "src"), sd, &m->layouts[2 * i]));
    RS_CHECK(layout_of(m, c, &w, "dst", J()->object_get(t, "dst"), dd, &m->layouts[2 * i + 1]));
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
    const json_t *size = J()->object_get(d, "size"), *of = J()->object_get(d, "of_rank");
    if (!json_is_object(d) || (!size == !of) || J()->object_size(d) != 1)
        return manifest_bad(w, "domains", RESHARD_ERR_SPEC_SYNTAX,
                            "must be {\"size\": N} or {\"of_rank\": [domain of every rank]}");
    if (size) {
        if (!json_is_integer(size) || J()->integer_value(size) < 1)
            return manifest_bad(w, "domains.size", RESHARD_ERR_SPEC_SYNTAX,
                                "is not a positive integer");
        m->domain_size = (int)J()->integer_value(size);
        return RESHARD_OK;
    }
    if (!json_is_array(of) || J()->array_size(of) != (size_t)m->world_size)
        return manifest_bad(w, "domains.of_rank", RESHARD_ERR_SPEC_SYNTAX,
                            "must be an array of world_size (%d) domain ids", m->world_size);
    if (!(m->domain_of = rs_calloc((size_t)m->world_size, sizeof(int), "manifest domains")))
        return RESHARD_ERR_NO_MEMORY;
    size_t i;
    const json_t *e;
    for (i = 0; i < J()->array_size(of) && (e = J()->array_get(of, i)); i++) {
        if (!json_is_integer(e) || J()->integer_value(e) < 0 || J()->integer_value(e) > INT32_MAX)
            return manifest_bad(w, "domains.of_rank", RESHARD_ERR_SPEC_SYNTAX,
                                "entry %zu is not a domain id", i);
        m->domain_of[i] = (int)J()->integer_value(e);
    }
    m->domain_size = 0;
    return RESHARD_OK;
}

static reshard_status_t load(struct reshard_manifest *m, const char *path, const json_t *root)
{
    struct where w = {.file = path, .index = -1};
    if (!json_is_object(root))
        return manifest_bad(&w, "(top)", RESHARD_ERR_SPEC_SYNTAX, "is %s, not an object",
                            type_name(root));
    const char *key;
    const json_t *v;
    for (void *it_ = J()->object_iter((json_t *)root);
         it_ && (key = J()->object_iter_key(it_)) && (v = J()->object_iter_value(it_));
         it_ = J()->object_iter_next((json_t *)root, it_)) {
        if (strcmp(key, "version") && strcmp(key, "world_size") && strcmp(key, "domains") &&
            strcmp(key, "tensors") && strcmp(key, "buffers") && strcmp(key, "meta"))
            return manifest_bad(
                &w, key, RESHARD_ERR_SPEC_SYNTAX,
                "unknown key (version, world_size, domains, tensors, buffers, meta)");
    }
    const json_t *ver = J()->object_get(root, "version");
    if (!json_is_integer(ver) || J()->integer_value(ver) != 1)
        return manifest_bad(&w, "version", RESHARD_ERR_SPEC_SYNTAX,
                            ver ? "must be 1 (the only version this library reads)" : "missing");
    const json_t *ws = J()->object_get(root, "world_size");
    if (!json_is_integer(ws) || J()->integer_value(ws) < 1 || J()->integer_value(ws) > 1 << 20)
        return manifest_bad(&w, "world_size", RESHARD_ERR_SPEC_SYNTAX,
                            ws ? "must be an integer in [1, 2^20]" : "missing");
    m->world_size = (int)J()->integer_value(ws);
    RS_CHECK(domains_of(m, &w, J()->object_get(root, "domains")));
    const json_t *ts = J()->object_get(root, "tensors");
    if (!json_is_array(ts) || !J()->array_size(ts) || J()->array_size(ts) > INT32_MAX / 2)
        return manifest_bad(&w, "tensors", RESHARD_ERR_SPEC_SYNTAX,
                            ts ? "must be a non-empty array" : "missing");
    size_t n = J()->array_size(ts);
    m->tensors = rs_calloc(n, sizeof(*m->tensors), "manifest tensors");
    m->names = rs_calloc(n, sizeof(*m->names), "manifest names");
    m->layouts = rs_calloc(2 * n, sizeof(*m->layouts), "manifest layouts");
    if (!m->tensors || !m->names || !m->layouts)
        return RESHARD_ERR_NO_MEMORY;
    m->ntensors = (int)n;
    struct spec_cache cache = {0};
    reshard_status_t st = RESHARD_OK;
    for (size_t i = 0; i < n && st == RESHARD_OK; i++)
        st = tensor_of(m, &cache, &w, (int)i, J()->array_get(ts, i));
    cache_free(&cache);
    RS_CHECK(st);
    RS_CHECK(check_unique(m, path));
    return manifest_check_buffers(m, path, J(), J()->object_get(root, "buffers"));
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
    manifest_json_release(J(), root);
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
    if (!J())
        return api_leave("reshard_manifest_load", RESHARD_ERR_UNAVAILABLE);
    json_error_t jerr;
    int from_stdin = !strcmp(path, "-");
    json_t *root = from_stdin ? J()->loadf(stdin, JSON_REJECT_DUPLICATES, &jerr)
                              : J()->load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    return api_leave("reshard_manifest_load",
                     from_root(root, &jerr, from_stdin ? "<stdin>" : path, out));
}

reshard_status_t manifest_load_buffer(const char *buf, size_t len, const char *name,
                                      reshard_manifest_t **out)
{
    if (!J())
        return RESHARD_ERR_UNAVAILABLE;
    json_error_t jerr;
    json_t *root = J()->loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
    return from_root(root, &jerr, name, out);
}

void reshard_manifest_destroy(reshard_manifest_t *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->ndistinct; i++)
        reshard_layout_destroy(m->distinct[i]);
    free(m->distinct);
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
