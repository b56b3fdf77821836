/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Shrinking a communicator: the ranks that stay form a new one with their old numbers, the
 * parent's domains (the others absent), and a bootstrap met at the listener the lowest member
 * has held since the parent formed, under the parent's secret salted with who stays and how
 * often the job shrank (boot_group_id): nothing needs to be exchanged first, so a parent that
 * failed still serves.
 */
#include "comm.h"
#include "comm_int.h"

#include "base/error.h"

#include <stdlib.h>
#include <string.h>

reshard_status_t comm_shrink(struct reshard_comm *old, const int *exclude, int n,
                             struct reshard_comm **out)
{
    RS_CHECK(comm_owned(old));
    for (int i = 0; i < n; i++) {
        if (exclude[i] < 0 || exclude[i] >= old->size)
            return rs_error(RESHARD_ERR_INVALID_ARG,
                            "shrink: excluded rank %d is outside the communicator (0..%d)",
                            exclude[i], old->size - 1);
        if (exclude[i] == old->rank)
            return rs_error(RESHARD_ERR_INVALID_ARG,
                            "shrink: rank %d excludes itself: only the ranks that stay call "
                            "reshard_comm_shrink",
                            old->rank);
    }
    struct reshard_comm *c = comm_alloc(old->rank, old->size, old->local_rank);
    if (!c)
        return RESHARD_ERR_NO_MEMORY;
    c->shrinks = old->shrinks + 1;
    c->nmembers = 0;
    for (int r = 0; r < old->size; r++) {
        int stays = comm_has(old, r);
        for (int i = 0; i < n && stays; i++)
            stays = exclude[i] != r;
        c->boot_of[r] = stays ? c->nmembers : -1;
        if (stays)
            c->member[c->nmembers++] = r;
    }
    /* Ranks with another view of who stays, or of how often the job shrank, derive another
     * secret: the lowest member refuses them by name instead of forming a wrong group. */
    size_t salt_len = sizeof(uint32_t) + (size_t)c->nmembers * sizeof(int);
    char *salt = rs_calloc(1, salt_len, "shrink");
    struct boot_id id;
    reshard_status_t st = RESHARD_ERR_NO_MEMORY;
    if (!salt)
        goto err_destroy_comm;
    memcpy(salt, &c->shrinks, sizeof(uint32_t));
    memcpy(salt + sizeof(uint32_t), c->member, (size_t)c->nmembers * sizeof(int));
    st = boot_group_id(old->boot, old->boot_of[c->member[0]], salt, salt_len, &id);
    free(salt);
    if (st != RESHARD_OK)
        goto err_destroy_comm;
    st = boot_init_labeled(&id, c->boot_of[c->rank], c->nmembers, c->member, comm_timeout_ms(),
                           &c->boot);
    boot_id_release(&id); /* the lowest member's listener, if its rendezvous did not take it */
    RS_CHECK_GOTO(st, st, err_destroy_comm);
    RS_CHECK_GOTO(comm_join(c, &old->topo.t, NULL), st, err_destroy_comm);
    *out = c;
    return RESHARD_OK;
err_destroy_comm:
    comm_destroy(c);
    return st;
}
