/* SPDX-License-Identifier: Apache-2.0 */
/*
 * jansson, loaded on the first manifest (RESHARD_JANSSON_LIB): the plugin object needs only libc,
 * and a node without jansson still serves NCCL and the collective; only manifests then fail,
 * saying what is missing. jansson.h gives the types and the json_is_* macros (they read the
 * value's type field); every function goes through this table, never by its own symbol.
 */
#ifndef RS_MANIFEST_JSON_H
#define RS_MANIFEST_JSON_H

#include <jansson.h>
#include <stdio.h>

struct json_fns {
    json_t *(*load_file)(const char *path, size_t flags, json_error_t *error);
    json_t *(*loadb)(const char *buf, size_t len, size_t flags, json_error_t *error);
    json_t *(*loadf)(FILE *f, size_t flags, json_error_t *error);
    void (*destroy)(json_t *json); /* json_delete: jansson's decref calls it at zero */
    json_t *(*object_get)(const json_t *object, const char *key);
    size_t (*object_size)(const json_t *object);
    void *(*object_iter)(json_t *object);
    void *(*object_iter_next)(json_t *object, void *iter);
    const char *(*object_iter_key)(void *iter);
    json_t *(*object_iter_value)(void *iter);
    size_t (*array_size)(const json_t *array);
    json_t *(*array_get)(const json_t *array, size_t index);
    const char *(*string_value)(const json_t *string);
    json_int_t (*integer_value)(const json_t *integer);
};

/* The table, or NULL with RESHARD_ERR_UNAVAILABLE recorded ("manifest: ... (install
 * libjansson4)"). */
const struct json_fns *manifest_json(void);
/* Drops a reference the way json_decref does. */
void manifest_json_release(const struct json_fns *j, json_t *v);

#endif
