/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A push to the joiners of a growth (boot_push_joiners): data that every member already holds
 * reaches every joiner along the tree, and nothing else moves. A joiner takes it from its
 * parent; every rank hands it to each child that is a joiner. So no byte crosses an edge
 * between two members: rank 0 (a member) sends only to the joiners among its children, and a
 * member with none sends nothing. This holds for any tree whose root is a member, whatever the
 * order the ranks took their slots in.
 */
#include "boot_int.h"

#include <string.h>

reshard_status_t boot_push_joiners(struct boot *b, void *buf, size_t bytes)
{
    static unsigned char none;
    unsigned char *base = buf ? buf : &none;
    struct boot_coll c;
    reshard_status_t st;
    if (b && (b->members < 1 || b->members > b->size))
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "bootstrap: a push to the joiners on a bootstrap with %d members of %d",
                        b->members, b->size);
    RS_CHECK(boot_coll_begin(b, SOCK_OP_PUSH, buf, bytes, 1, &c));
    if (b->rank >= b->members) {
        struct boot_leg leg = {0, bytes, base};
        RS_CHECK_GOTO(boot_coll_legs(&c, &leg, 1, 0, boot_deadline_parent(b, c.deadline)), st,
                      err_tell_others);
    }
    struct boot_leg legs[BOOT_FANOUT_MAX];
    int n = 0;
    for (int i = 0; i < b->nchildren; i++)
        if (b->nb[1 + i].rank >= b->members)
            legs[n++] = (struct boot_leg){1 + i, bytes, base};
    RS_CHECK_GOTO(
        boot_coll_legs(&c, legs, n, 1, boot_deadline_parent(b, c.deadline) + BOOT_LEVEL_MS), st,
        err_tell_others);
    return RESHARD_OK;
err_tell_others:
    return boot_fail(b, st, &c.err, c.from);
}
