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
    /* [nranks], or NULL when every rank takes part: the roles a rank does not play, a mask of
     * enum topo_role. An absent rank (one a communicator shrank away: both roles) keeps its
     * place and domain but neither sends nor receives: plans take its source pieces from
     * replicas and give it nothing. A rank off as a source only holds nothing (a joiner that
     * catches up); one off as a destination only needs nothing (it holds its shard already). */
    unsigned char *absent;
};

enum topo_role {
    TOPO_SRC = 1, /* sends what its source shards hold */
    TOPO_DST = 2, /* receives its destination shards */
    TOPO_BOTH = TOPO_SRC | TOPO_DST
};

/* From explicit ids (domain_of[r] >= 0, any numbering) or, with domain_of NULL, consecutive
 * blocks of domain_size ranks (the last one may be short). */
reshard_status_t topo_create(int nranks, int domain_size, const int *domain_of,
                             struct rs_topo *out);
reshard_status_t topo_copy(const struct rs_topo *from, struct rs_topo *to);
/* Marks ranks absent (each in [0, nranks)): in both roles. */
reshard_status_t topo_set_absent(struct rs_topo *t, const int *ranks, int n);
/* Takes the roles of `role` (a mask of enum topo_role) from ranks (each in [0, nranks)). */
reshard_status_t topo_set_off(struct rs_topo *t, const int *ranks, int n, unsigned role);
/* Absent: in both roles. */
static inline int topo_absent(const struct rs_topo *t, int rank)
{
    return t->absent && (t->absent[rank] & TOPO_BOTH) == TOPO_BOTH;
}
/* Does not play `role` (TOPO_SRC or TOPO_DST). */
static inline int topo_off(const struct rs_topo *t, int rank, unsigned role)
{
    return t->absent && (t->absent[rank] & role);
}
void topo_free(struct rs_topo *t);

#endif
