/* SPDX-License-Identifier: Apache-2.0 */
/* What the public handles of reshard.h hold: shared by every room of the plugin layer. */
#ifndef RS_HANDLES_H
#define RS_HANDLES_H

#include "reshard.h"
#include "planner/layout.h"
#include "planner/plan.h"
#include "planner/topo.h"

struct reshard_layout {
    struct rs_layout l;
};

struct reshard_topo {
    struct rs_topo t;
};

struct exec;

struct reshard_plan {
    struct rs_plan *p;
    struct exec *x; /* communicator plans: the executor of the chosen algorithm */
    int verify;     /* check each execution (reshard_plan_config_t.verify, RESHARD_VERIFY) */
};

#endif
