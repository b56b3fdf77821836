/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Layout spec strings (docs/layouts.md has the grammar):
 *
 *   shape=7168x2048 dtype=bf16 ranks=0-7,16-23 mesh=2x8 place=R,S(1)
 *
 * plus the local view items buffer=NAME offset=N view=AxB strides=AxB. An error names the item
 * and the 1-based column of the first character it could not take.
 */
#ifndef RS_SPEC_H
#define RS_SPEC_H

#include "layout.h"

#include <stddef.h>

struct spec_opts {
    int world_size; /* ranks default to 0..world_size-1 when neither ranks nor mesh is given */
    /* The tensor when the context supplies it (a manifest entry): ndim > 0 makes shape and
     * dtype items an error; ndim == 0 makes shape required and dtype default to bf16. */
    int ndim;
    const int64_t *shape;
    enum rs_dtype dtype;
};

/* Parses and checks a spec (shard map checks included). On success *out owns its rank list
 * (layout_free); on failure *out is untouched and the message names item and column. */
reshard_status_t spec_parse(const char *spec, const struct spec_opts *opts, struct rs_layout *out);

/* Writes the canonical spec of l into buf (snprintf semantics); returns the length needed. */
size_t spec_format(const struct rs_layout *l, char *buf, size_t n);

#endif
