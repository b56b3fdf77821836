/* SPDX-License-Identifier: Apache-2.0 */
#ifndef RS_VALIDATE_H
#define RS_VALIDATE_H

#include "plan.h"

/* RESHARD_OK when the plan writes every destination element exactly once, from a rank that
 * holds it, crossing into each domain at most once; else RESHARD_ERR_INVALID_PLAN with a
 * message naming the first offending op. */
reshard_status_t plan_validate(const struct rs_plan *p);

#endif
