/* SPDX-License-Identifier: Apache-2.0 */
#include "spec.h"

#include "base/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ELEMS 64 /* columns remembered per list item */

static const char *const item_names[] = {
    [RS_ITEM_SHAPE] = "shape",   [RS_ITEM_DTYPE] = "dtype", [RS_ITEM_RANKS] = "ranks",
    [RS_ITEM_MESH] = "mesh",     [RS_ITEM_PLACE] = "place", [RS_ITEM_BUFFER] = "buffer",
    [RS_ITEM_OFFSET] = "offset", [RS_ITEM_VIEW] = "view",   [RS_ITEM_STRIDES] = "strides",
    [RS_ITEM_QUANT] = "quant",
};
#define NITEMS ((int)(sizeof(item_names) / sizeof(item_names[0])))

struct parser {
    const char *spec;
    struct rs_layout l;
    int seen[NITEMS];                /* column of each item's value, 0 = absent */
    int elem_col[NITEMS][MAX_ELEMS]; /* column of each element of a list item */
    size_t rank_cap;
};

/* Records a syntax error at the 0-based offset `at` of the spec. */
static reshard_status_t syntax(struct parser *p, enum rs_item item, const char *at, const char *fmt,
                               ...) __attribute__((format(printf, 4, 5)));

static reshard_status_t syntax(struct parser *p, enum rs_item item, const char *at, const char *fmt,
                               ...)
{
    char what[RS_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    return rs_error(RESHARD_ERR_SPEC_SYNTAX, "%s: %s at column %d", item_names[item], what,
                    (int)(at - p->spec) + 1);
}

static int is_end(char c)
{
    return c == '\0' || c == ' ' || c == '\t';
}

/* Reads a decimal integer; returns NULL when there is none or it exceeds max. */
static const char *read_int(const char *s, int64_t max, int64_t *v)
{
    if (*s < '0' || *s > '9')
        return NULL;
    int64_t x = 0;
    for (; *s >= '0' && *s <= '9'; s++) {
        if (x > (max - (*s - '0')) / 10)
            return NULL;
        x = x * 10 + (*s - '0');
    }
    *v = x;
    return s;
}

/* AxBxC: positive (or non-negative, min 0) integers. */
static reshard_status_t parse_dims(struct parser *p, enum rs_item item, const char *s, int maxdims,
                                   int64_t min, int64_t max, int64_t *dims, int *ndim)
{
    int n = 0;
    for (;;) {
        int64_t v;
        const char *e = read_int(s, max, &v);
        if (!e || v < min)
            return syntax(p, item, s, "expected %s integer", min ? "a positive" : "an");
        if (n == maxdims)
            return syntax(p, item, s, "more than %d dims", maxdims);
        if (n < MAX_ELEMS)
            p->elem_col[item][n] = (int)(s - p->spec) + 1;
        dims[n++] = v;
        if (is_end(*e))
            break;
        if (*e != 'x')
            return syntax(p, item, e, "expected 'x' between dims");
        s = e + 1;
    }
    *ndim = n;
    return RESHARD_OK;
}

static reshard_status_t push_rank(struct parser *p, int64_t r, const char *at)
{
    if (p->l.nranks == RS_MAX_RANK + 1)
        return syntax(p, RS_ITEM_RANKS, at, "more than %d ranks", RS_MAX_RANK + 1);
    int *v = rs_grow(p->l.ranks, &p->rank_cap, (size_t)p->l.nranks + 1, sizeof(int), "rank list");
    if (!v)
        return RESHARD_ERR_NO_MEMORY;
    p->l.ranks = v;
    if (p->l.nranks < MAX_ELEMS)
        p->elem_col[RS_ITEM_RANKS][p->l.nranks] = (int)(at - p->spec) + 1;
    p->l.ranks[p->l.nranks++] = (int)r;
    return RESHARD_OK;
}

/* 0-7,16,20-23 */
static reshard_status_t parse_ranks(struct parser *p, const char *s)
{
    for (;;) {
        int64_t a, b;
        const char *e = read_int(s, RS_MAX_RANK, &a);
        if (!e)
            return syntax(p, RS_ITEM_RANKS, s, "expected a rank (0..%d) or a range a-b",
                          RS_MAX_RANK);
        b = a;
        if (*e == '-') {
            const char *f = read_int(e + 1, RS_MAX_RANK, &b);
            if (!f)
                return syntax(p, RS_ITEM_RANKS, e + 1, "expected the end of the range (0..%d)",
                              RS_MAX_RANK);
            if (b < a)
                return syntax(p, RS_ITEM_RANKS, s, "range %lld-%lld is descending", (long long)a,
                              (long long)b);
            e = f;
        }
        for (int64_t r = a; r <= b; r++)
            RS_CHECK(push_rank(p, r, s));
        if (is_end(*e))
            return RESHARD_OK;
        if (*e != ',')
            return syntax(p, RS_ITEM_RANKS, e, "expected ',' between ranks");
        s = e + 1;
    }
}

/* R | S(d) | SS(d,k), comma separated */
static reshard_status_t parse_place(struct parser *p, const char *s, int *nplace)
{
    int n = 0;
    for (;;) {
        struct rs_place pl = {RS_PLACE_R, 0, 1};
        const char *e = s;
        int64_t d = 0, k = 1;
        if (n == RS_MAX_MESH_DIMS)
            return syntax(p, RS_ITEM_PLACE, s, "more than %d placements", RS_MAX_MESH_DIMS);
        if (*s == 'R') {
            e = s + 1;
        } else if (s[0] == 'S' && (s[1] == '(' || (s[1] == 'S' && s[2] == '('))) {
            pl.kind = s[1] == 'S' ? RS_PLACE_SS : RS_PLACE_S;
            e = s + (pl.kind == RS_PLACE_SS ? 3 : 2);
            const char *f = read_int(e, RS_MAX_DIMS, &d);
            if (!f)
                return syntax(p, RS_ITEM_PLACE, e, "expected a tensor dim in %s(",
                              pl.kind == RS_PLACE_SS ? "SS" : "S");
            e = f;
            if (pl.kind == RS_PLACE_SS) {
                if (*e != ',')
                    return syntax(p, RS_ITEM_PLACE, e, "expected ',k' in SS(d,k)");
                f = read_int(e + 1, RS_MAX_SEGMENTS, &k);
                if (!f)
                    return syntax(p, RS_ITEM_PLACE, e + 1, "expected a piece count k in SS(d,k)");
                e = f;
            }
            if (*e != ')')
                return syntax(p, RS_ITEM_PLACE, e, "expected ')'");
            e++;
        } else {
            return syntax(p, RS_ITEM_PLACE, s, "expected R, S(d) or SS(d,k)");
        }
        pl.dim = (int)d;
        pl.k = k;
        p->elem_col[RS_ITEM_PLACE][n] = (int)(s - p->spec) + 1;
        p->l.place[n++] = pl;
        if (is_end(*e))
            break;
        if (*e != ',')
            return syntax(p, RS_ITEM_PLACE, e, "expected ',' between placements");
        s = e + 1;
    }
    *nplace = n;
    return RESHARD_OK;
}

static reshard_status_t parse_buffer(struct parser *p, const char *s)
{
    const char *e = s;
    for (; !is_end(*e); e++) {
        char c = *e;
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 strchr("_.:/-", c);
        if (!ok)
            return syntax(p, RS_ITEM_BUFFER, e, "unexpected character '%c' in a buffer name", c);
    }
    if (e == s || e - s >= RS_NAME_MAX)
        return syntax(p, RS_ITEM_BUFFER, s, "a buffer name has 1 to %d characters",
                      RS_NAME_MAX - 1);
    memcpy(p->l.view.buffer, s, (size_t)(e - s));
    p->l.view.buffer[e - s] = '\0';
    return RESHARD_OK;
}

/* block(R,C), channel or tensor. */
static reshard_status_t parse_quant(struct parser *p, const char *s)
{
    struct rs_quant *q = &p->l.quant;
    const char *e;
    if (!strncmp(s, "channel", 7) && is_end(s[7])) {
        q->kind = RS_QUANT_CHANNEL;
        return RESHARD_OK;
    }
    if (!strncmp(s, "tensor", 6) && is_end(s[6])) {
        q->kind = RS_QUANT_TENSOR;
        return RESHARD_OK;
    }
    if (strncmp(s, "block(", 6))
        return syntax(p, RS_ITEM_QUANT, s, "expected block(R,C), channel or tensor");
    if (!(e = read_int(s + 6, 1 << 20, &q->rows)) || *e != ',')
        return syntax(p, RS_ITEM_QUANT, e ? e : s + 6, "expected block(R,C): rows, then ','");
    const char *c = e + 1;
    if (!(e = read_int(c, 1 << 20, &q->cols)) || *e != ')' || !is_end(e[1]))
        return syntax(p, RS_ITEM_QUANT, e ? e : c, "expected block(R,C): columns, then ')'");
    if (q->rows < 1 || q->cols < 1)
        return syntax(p, RS_ITEM_QUANT, s + 6, "block sizes must be positive");
    q->kind = RS_QUANT_BLOCK;
    return RESHARD_OK;
}

static reshard_status_t parse_item(struct parser *p, enum rs_item item, const char *v,
                                   const struct spec_opts *opts, int *nplace)
{
    struct rs_layout *l = &p->l;
    const char *e;
    int64_t x;
    switch (item) {
    case RS_ITEM_SHAPE:
    case RS_ITEM_DTYPE:
        if (opts->ndim > 0)
            return syntax(p, item, v, "the tensor is given by its manifest entry");
        if (item == RS_ITEM_SHAPE)
            return parse_dims(p, item, v, RS_MAX_DIMS, 1, INT64_MAX, l->shape, &l->ndim);
        for (e = v; !is_end(*e); e++)
            ;
        x = dtype_parse(v, (size_t)(e - v));
        if (x < 0)
            return syntax(p, item, v, "unknown dtype '%.*s' (one of %s)", (int)(e - v), v,
                          dtype_list());
        l->dtype = (enum rs_dtype)x;
        return RESHARD_OK;
    case RS_ITEM_RANKS:
        return parse_ranks(p, v);
    case RS_ITEM_MESH: {
        int64_t dims[RS_MAX_MESH_DIMS];
        RS_CHECK(parse_dims(p, item, v, RS_MAX_MESH_DIMS, 1, RS_MAX_RANK + 1, dims, &l->mesh_ndim));
        for (int i = 0; i < l->mesh_ndim; i++)
            l->mesh[i] = (int)dims[i];
        return RESHARD_OK;
    }
    case RS_ITEM_PLACE:
        return parse_place(p, v, nplace);
    case RS_ITEM_BUFFER:
        return parse_buffer(p, v);
    case RS_ITEM_OFFSET:
        e = read_int(v, INT64_MAX, &x);
        if (!e || !is_end(*e))
            return syntax(p, item, e ? e : v, "expected a non-negative integer");
        l->view.offset = x;
        return RESHARD_OK;
    case RS_ITEM_VIEW:
        return parse_dims(p, item, v, RS_MAX_DIMS, 1, INT64_MAX, l->view.shape, &l->view.ndim);
    case RS_ITEM_STRIDES:
        return parse_dims(p, item, v, RS_MAX_DIMS, 0, INT64_MAX, l->view.strides,
                          &l->view.nstrides);
    case RS_ITEM_QUANT:
        return parse_quant(p, v);
    case RS_ITEM_NONE:
        break;
    }
    return rs_error(RESHARD_ERR_INTERNAL, "spec: unhandled item %d", (int)item);
}

static reshard_status_t tokenize(struct parser *p, const struct spec_opts *opts, int *nplace)
{
    const char *s = p->spec;
    for (;;) {
        while (*s == ' ' || *s == '\t')
            s++;
        if (!*s)
            return RESHARD_OK;
        const char *key = s;
        while (!is_end(*s) && *s != '=')
            s++;
        int klen = (int)(s - key);
        enum rs_item item = RS_ITEM_NONE;
        for (int i = 1; i < NITEMS; i++)
            if ((int)strlen(item_names[i]) == klen && !memcmp(item_names[i], key, (size_t)klen))
                item = (enum rs_item)i;
        if (*s != '=' || klen == 0)
            return rs_error(RESHARD_ERR_SPEC_SYNTAX, "%.*s: expected key=value at column %d",
                            klen ? klen : 1, key, (int)(key - p->spec) + 1);
        if (item == RS_ITEM_NONE)
            return rs_error(RESHARD_ERR_SPEC_SYNTAX,
                            "%.*s: unknown item at column %d (expected shape, dtype, ranks, "
                            "mesh, place, buffer, offset, view, strides or quant)",
                            klen, key, (int)(key - p->spec) + 1);
        if (p->seen[item])
            return syntax(p, item, key, "given twice");
        const char *v = s + 1;
        p->seen[item] = (int)(v - p->spec) + 1;
        RS_CHECK(parse_item(p, item, v, opts, nplace));
        while (!is_end(*s))
            s++;
    }
}

/* Fills what the spec left out: tensor from the context, ranks, mesh and placements. */
static reshard_status_t apply_defaults(struct parser *p, const struct spec_opts *opts, int nplace)
{
    struct rs_layout *l = &p->l;
    if (opts->ndim > 0) {
        l->ndim = opts->ndim;
        memcpy(l->shape, opts->shape, (size_t)opts->ndim * sizeof(int64_t));
        l->dtype = opts->dtype;
    } else if (!p->seen[RS_ITEM_SHAPE]) {
        return rs_error(RESHARD_ERR_SPEC_SYNTAX, "shape: required item missing");
    }
    if (!p->seen[RS_ITEM_RANKS]) {
        int64_t n = opts->world_size;
        if (p->seen[RS_ITEM_MESH]) {
            n = 1;
            for (int i = 0; i < l->mesh_ndim && n <= RS_MAX_RANK + 1; i++)
                n *= l->mesh[i]; /* each dim <= 2^20: stops before it could wrap */
            if (n > RS_MAX_RANK + 1)
                return rs_error(RESHARD_ERR_MESH_SIZE, "mesh: more than %d ranks at column %d",
                                RS_MAX_RANK + 1, p->seen[RS_ITEM_MESH]);
        } else if (n > RS_MAX_RANK + 1) {
            return rs_error(RESHARD_ERR_RANK_RANGE,
                            "ranks: not given, and the world size %lld exceeds %d ranks",
                            (long long)n, RS_MAX_RANK + 1);
        }
        if (n < 1)
            return rs_error(RESHARD_ERR_SPEC_SYNTAX,
                            "ranks: not given, and neither mesh nor a world size says how many");
        for (int64_t r = 0; r < n; r++)
            RS_CHECK(push_rank(p, r, p->spec));
    }
    if (!p->seen[RS_ITEM_MESH]) {
        l->mesh_ndim = 1;
        l->mesh[0] = l->nranks;
    }
    /* without place= every mesh dim replicates (DTensor's default); the zeroed places say R */
    if (p->seen[RS_ITEM_PLACE] && nplace != l->mesh_ndim) {
        return rs_error(RESHARD_ERR_SPEC_SYNTAX,
                        "place: %d placement%s for a %d-D mesh at column %d", nplace,
                        nplace == 1 ? "" : "s", l->mesh_ndim, p->seen[RS_ITEM_PLACE]);
    }
    return RESHARD_OK;
}

/* A semantic check failed on a whole layout: point its message at the item's column. */
static reshard_status_t locate(const struct parser *p, const struct rs_fault *f,
                               reshard_status_t st)
{
    if (f->item <= RS_ITEM_NONE || f->item >= NITEMS || !p->seen[f->item])
        return st; /* a default or the context supplied it: no column to name */
    int col = p->seen[f->item];
    if (f->index >= 0 && f->index < MAX_ELEMS && p->elem_col[f->item][f->index])
        col = p->elem_col[f->item][f->index];
    char msg[RS_ERROR_MAX];
    snprintf(msg, sizeof(msg), "%s", rs_error_message());
    return rs_error(st, "%s at column %d", msg, col);
}

reshard_status_t spec_parse(const char *spec, const struct spec_opts *opts, struct rs_layout *out)
{
    static const struct spec_opts none;
    if (!spec)
        return rs_error(RESHARD_ERR_INVALID_ARG, "spec: NULL string");
    if (!opts)
        opts = &none;
    struct parser *p = rs_calloc(1, sizeof(*p), "spec parser");
    if (!p)
        return RESHARD_ERR_NO_MEMORY;
    p->spec = spec;
    int nplace = 0;
    reshard_status_t st;
    struct rs_shardmap map;
    struct rs_fault fault = {RS_ITEM_NONE, -1};
    RS_CHECK_GOTO(tokenize(p, opts, &nplace), st, err_free);
    RS_CHECK_GOTO(apply_defaults(p, opts, nplace), st, err_free);
    st = shardmap_build(&p->l, &map, &fault); /* runs layout_check first */
    if (st != RESHARD_OK) {
        st = locate(p, &fault, st);
        goto err_free;
    }
    shardmap_free(&map);
    *out = p->l;
    free(p);
    return RESHARD_OK;
err_free:
    free(p->l.ranks);
    free(p);
    return st;
}

/* ---- formatting ---- */

struct out {
    char *buf;
    size_t n, len;
};

static void put(struct out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void put(struct out *o, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(o->len < o->n ? o->buf + o->len : NULL, o->len < o->n ? o->n - o->len : 0,
                      fmt, ap);
    va_end(ap);
    if (w > 0)
        o->len += (size_t)w;
}

static void put_dims(struct out *o, const char *key, const int64_t *dims, int ndim)
{
    put(o, "%s%s=", o->len ? " " : "", key);
    for (int d = 0; d < ndim; d++)
        put(o, "%s%lld", d ? "x" : "", (long long)dims[d]);
}

size_t spec_format(const struct rs_layout *l, char *buf, size_t n)
{
    struct out o = {buf, n, 0};
    if (n)
        buf[0] = '\0';
    put_dims(&o, "shape", l->shape, l->ndim);
    put(&o, " dtype=%s ranks=", dtype_name(l->dtype));
    for (int i = 0; i < l->nranks;) {
        int j = i;
        while (j + 1 < l->nranks && l->ranks[j + 1] == l->ranks[j] + 1)
            j++;
        put(&o, "%s%d", i ? "," : "", l->ranks[i]);
        if (j > i)
            put(&o, "-%d", l->ranks[j]);
        i = j + 1;
    }
    int64_t mesh[RS_MAX_MESH_DIMS];
    for (int i = 0; i < l->mesh_ndim; i++)
        mesh[i] = l->mesh[i];
    put_dims(&o, "mesh", mesh, l->mesh_ndim);
    put(&o, " place=");
    for (int i = 0; i < l->mesh_ndim; i++) {
        const struct rs_place *p = &l->place[i];
        const char *sep = i ? "," : "";
        if (p->kind == RS_PLACE_R)
            put(&o, "%sR", sep);
        else if (p->kind == RS_PLACE_S)
            put(&o, "%sS(%d)", sep, p->dim);
        else
            put(&o, "%sSS(%d,%lld)", sep, p->dim, (long long)p->k);
    }
    const struct rs_view *v = &l->view;
    if (v->buffer[0])
        put(&o, " buffer=%s", v->buffer);
    if (v->offset)
        put(&o, " offset=%lld", (long long)v->offset);
    if (v->ndim)
        put_dims(&o, "view", v->shape, v->ndim);
    if (v->nstrides)
        put_dims(&o, "strides", v->strides, v->nstrides);
    const struct rs_quant *q = &l->quant;
    if (q->kind == RS_QUANT_BLOCK)
        put(&o, " quant=block(%lld,%lld)", (long long)q->rows, (long long)q->cols);
    else if (q->kind == RS_QUANT_CHANNEL)
        put(&o, " quant=channel");
    else if (q->kind == RS_QUANT_TENSOR)
        put(&o, " quant=tensor");
    return o.len;
}
