/* SPDX-License-Identifier: Apache-2.0 */
#include "manifest_json.h"

#include "base/dl.h"

static struct json_fns fns;

#define JSON_SYM(field, symbol)                                                                    \
    {                                                                                              \
        symbol, offsetof(struct json_fns, field), RS_DL_REQUIRED                                   \
    }
static const struct rs_dl_sym json_syms[] = {
    JSON_SYM(load_file, "json_load_file"),
    JSON_SYM(loadb, "json_loadb"),
    JSON_SYM(loadf, "json_loadf"),
    JSON_SYM(destroy, "json_delete"),
    JSON_SYM(object_get, "json_object_get"),
    JSON_SYM(object_size, "json_object_size"),
    JSON_SYM(object_iter, "json_object_iter"),
    JSON_SYM(object_iter_next, "json_object_iter_next"),
    JSON_SYM(object_iter_key, "json_object_iter_key"),
    JSON_SYM(object_iter_value, "json_object_iter_value"),
    JSON_SYM(array_size, "json_array_size"),
    JSON_SYM(array_get, "json_array_get"),
    JSON_SYM(string_value, "json_string_value"),
    JSON_SYM(integer_value, "json_integer_value"),
};
#undef JSON_SYM

static struct rs_dl json_dl = {
    .what = "manifest",
    .file = RS_PARAM_JANSSON_LIB,
    .fallback = "libjansson.so.4",
    .open_prefix = "cannot read JSON: ",
    .open_hint = " (install libjansson4)",
    .syms = json_syms,
    .nsyms = sizeof(json_syms) / sizeof(json_syms[0]),
    .table = &fns,
    .table_size = sizeof(fns),
};

const struct json_fns *manifest_json(void)
{
    return rs_dl_load(&json_dl);
}

void manifest_json_release(const struct json_fns *j, json_t *v)
{
    if (v && v->refcount != (size_t)-1 && --v->refcount == 0)
        j->destroy(v);
}
