/* SPDX-License-Identifier: Apache-2.0 */
/* What the public handles of reshard.h hold: shared by every room of the plugin layer. */
#ifndef RS_HANDLES_H
#define RS_HANDLES_H

#include "reshard.h"
#include "planner/layout.h"
#include "planner/plan.h"
#include "planner/topo.h"

#include <stdatomic.h>

struct reshard_layout {
    struct rs_layout l;
};

struct reshard_topo {
    struct rs_topo t;
};

/* A handle the caller holds, linked into the list of live ones (api_guard.c): a call takes a
 * reference under the lock a destroy unlinks it with, so a destroy from another thread either
 * comes first (the call is refused) or leaves the object to the call. */
struct live_handle {
    struct live_handle *prev, *next;
    atomic_int *refs;
};

struct exec;

struct reshard_plan {
    struct rs_plan *p;
    struct exec *x; /* communicator plans: the executor of the chosen algorithm */
    int verify;     /* check each execution (reshard_plan_config_t.verify, RESHARD_VERIFY) */
    /* A catch-up plan (reshard_plan_catch_up): from_dst[t] is 1 where tensor t's sources are
     * the destination replicas, whose source buffers are the destination buffers the caller
     * passes; NULL for any other plan. */
    unsigned char *from_dst;
    /* One reference for the caller's handle and one for each call in flight on the plan: the
     * last to go frees it (api_plan_release), so a destroy from another thread during an
     * execution leaves the plan to that execution. live: linked until reshard_plan_destroy. */
    atomic_int refs;
    struct live_handle live;
};

#endif
