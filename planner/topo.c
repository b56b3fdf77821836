/* SPDX-License-Identifier: Apache-2.0 */
#include "topo.h"

#include "layout.h"
#include "base/error.h"

#include <stdlib.h>
#include <string.h>

struct id_rank {
    int id, rank;
};

static int cmp_id_rank(const void *a, const void *b)
{
    const struct id_rank *x = a, *y = b;
    if (x->id != y->id)
        return (x->id > y->id) - (x->id < y->id);
    return (x->rank > y->rank) - (x->rank < y->rank);
}

/* Renumbers arbitrary ids densely, in order of each domain's lowest rank. */
static reshard_status_t number_domains(struct rs_topo *t, const int *id)
{
    int n = t->nranks;
    struct id_rank *v = rs_calloc((size_t)n, sizeof(*v), "topology");
    int *run_of = rs_calloc((size_t)n, sizeof(int), "topology");
    int *dense = rs_calloc((size_t)n, sizeof(int), "topology");
    reshard_status_t st = RESHARD_ERR_NO_MEMORY;
    if (!v || !run_of || !dense)
        goto free_scratch;
    for (int r = 0; r < n; r++)
        v[r] = (struct id_rank){id[r], r};
    qsort(v, (size_t)n, sizeof(*v), cmp_id_rank);
    for (int i = 0, run = -1; i < n; i++) { /* a run of equal ids is one domain */
        if (i == 0 || v[i].id != v[i - 1].id)
            dense[++run] = -1;
        run_of[v[i].rank] = run;
    }
    t->ndomains = 0;
    for (int r = 0; r < n; r++) {
        int *d = &dense[run_of[r]];
        if (*d < 0)
            *d = t->ndomains++;
        t->domain[r] = *d;
    }
    st = RESHARD_OK;
free_scratch:
    free(dense);
    free(run_of);
    free(v);
    return st;
}

reshard_status_t topo_create(int nranks, int domain_size, const int *domain_of, struct rs_topo *out)
{
    if (nranks < 1 || nranks > RS_MAX_RANK + 1)
        return rs_error(RESHARD_ERR_INVALID_ARG, "topology: world size %d is outside 1..%d", nranks,
                        RS_MAX_RANK + 1);
    if (!domain_of && domain_size < 1)
        return rs_error(RESHARD_ERR_INVALID_ARG, "topology: domain size %d is not positive",
                        domain_size);
    struct rs_topo t = {.nranks = nranks};
    reshard_status_t st = RESHARD_ERR_NO_MEMORY;
    t.domain = rs_calloc((size_t)nranks, sizeof(int), "topology");
    t.local_index = rs_calloc((size_t)nranks, sizeof(int), "topology");
    int *id = rs_calloc((size_t)nranks, sizeof(int), "topology");
    if (!t.domain || !t.local_index || !id)
        goto err_free;
    for (int r = 0; r < nranks; r++) {
        id[r] = domain_of ? domain_of[r] : r / domain_size;
        if (id[r] < 0) {
            st = rs_error(RESHARD_ERR_INVALID_ARG, "topology: rank %d has domain id %d", r, id[r]);
            goto err_free;
        }
    }
    RS_CHECK_GOTO(number_domains(&t, id), st, err_free);
    st = RESHARD_ERR_NO_MEMORY;
    t.domain_size = rs_calloc((size_t)t.ndomains, sizeof(int), "topology");
    if (!t.domain_size)
        goto err_free;
    for (int r = 0; r < nranks; r++)
        t.local_index[r] = t.domain_size[t.domain[r]]++;
    free(id);
    *out = t;
    return RESHARD_OK;
err_free:
    free(id);
    topo_free(&t);
    return st;
}

reshard_status_t topo_copy(const struct rs_topo *from, struct rs_topo *to)
{
    struct rs_topo t = *from;
    t.absent = NULL; /* until copied: a failure below frees only what is t's */
    t.domain = rs_calloc((size_t)from->nranks, sizeof(int), "topology");
    t.local_index = rs_calloc((size_t)from->nranks, sizeof(int), "topology");
    t.domain_size = rs_calloc((size_t)from->ndomains, sizeof(int), "topology");
    if (!t.domain || !t.local_index || !t.domain_size) {
        topo_free(&t);
        return RESHARD_ERR_NO_MEMORY;
    }
    memcpy(t.domain, from->domain, (size_t)from->nranks * sizeof(int));
    memcpy(t.local_index, from->local_index, (size_t)from->nranks * sizeof(int));
    memcpy(t.domain_size, from->domain_size, (size_t)from->ndomains * sizeof(int));
    if (from->absent) {
        if (!(t.absent = rs_calloc((size_t)from->nranks, 1, "topology"))) {
            topo_free(&t);
            return RESHARD_ERR_NO_MEMORY;
        }
        memcpy(t.absent, from->absent, (size_t)from->nranks);
    }
    *to = t;
    return RESHARD_OK;
}

reshard_status_t topo_set_absent(struct rs_topo *t, const int *ranks, int n)
{
    return topo_set_off(t, ranks, n, TOPO_BOTH);
}

reshard_status_t topo_set_off(struct rs_topo *t, const int *ranks, int n, unsigned role)
{
    for (int i = 0; i < n; i++)
        if (ranks[i] < 0 || ranks[i] >= t->nranks)
            return rs_error(RESHARD_ERR_INVALID_ARG, "topology: rank %d is outside 0..%d", ranks[i],
                            t->nranks - 1);
    if (n > 0 && !t->absent && !(t->absent = rs_calloc((size_t)t->nranks, 1, "topology")))
        return RESHARD_ERR_NO_MEMORY;
    for (int i = 0; i < n; i++)
        t->absent[ranks[i]] |= (unsigned char)(role & TOPO_BOTH);
    return RESHARD_OK;
}

void topo_free(struct rs_topo *t)
{
    free(t->absent);
    t->absent = NULL;
    free(t->domain);
    free(t->local_index);
    free(t->domain_size);
    t->domain = t->local_index = t->domain_size = NULL;
}
