/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Topology: the NVLink domain of every rank of the communicator. Inside a domain ranks share
 * the local path; between domains bytes cross the network, one NIC per rank. A rank's local
 * index (its position among its domain's ranks, by rank) names its NIC rail.
 */
#ifndef RS_TOPO_H
#define RS_TOPO_H

#include "base/reshard_status.h"

struct rs_topo {
    int nranks;
    int ndomains;
    int *domain;      /* [nranks]: dense ids, numbered in order of their lowest rank */
    int *local_index; /* [nranks] */
    int *domain_size; /* [ndomains] */
    /* [nranks], or NULL when every rank takes part. An absent rank (one a communicator shrank
     * away) keeps its place and domain but neither sends nor receives: plans take its source
     * pieces from replicas and give it nothing. */
    unsigned char *absent;
};

/* From explicit ids (domain_of[r] >= 0, any numbering) or, with domain_of NULL, consecutive
 * blocks of domain_size ranks (the last one may be short). */
reshard_status_t topo_create(int nranks, int domain_size, const int *domain_of,
                             struct rs_topo *out);
reshard_status_t topo_copy(const struct rs_topo *from, struct rs_topo *to);
/* Marks ranks absent (each in [0, nranks)). */
reshard_status_t topo_set_absent(struct rs_topo *t, const int *ranks, int n);
static inline int topo_absent(const struct rs_topo *t, int rank)
{
    return t->absent && t->absent[rank];
}
void topo_free(struct rs_topo *t);

#endif
