/* SPDX-License-Identifier: Apache-2.0 */
/* What the manifest's files share: the object, where an error is, the buffer checks. */
#ifndef RS_MANIFEST_INT_H
#define RS_MANIFEST_INT_H

#include "api.h"
#include "manifest_json.h"

struct reshard_manifest {
    int world_size;
    int domain_size; /* 0 when domain_of says */
    int *domain_of;  /* [world_size] or NULL */
    int ntensors;
    reshard_tensor_t *tensors;
    char **names;
    /* [2 * ntensors]: src, dst. Sides with the same spec and shape share one layout (a model
     * names the same few placements thousands of times, and each holds its rank list). */
    reshard_layout_t **layouts;
    reshard_layout_t **distinct; /* each layout once, owned */
    int ndistinct, distinct_cap;
};

/* Where an error is: "tensors[12] (model.layers.0.q_proj.weight).src.place". */
struct where {
    const char *file;
    int index;
    const char *name;
};

reshard_status_t manifest_bad(const struct where *w, const char *field, reshard_status_t st,
                              const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* Views that name one buffer must not overlap on any rank, and must fit the size "buffers"
 * gives it (NULL: no sizes). Each check runs once per distinct combination of the shards the
 * ranks hold, not once per rank: its cost does not grow with replicas. */
reshard_status_t manifest_check_buffers(const struct reshard_manifest *m, const char *path,
                                        const struct json_fns *j, const json_t *buffers);

#endif
