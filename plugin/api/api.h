/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the public entry points share: entering and leaving, argument checks, plan building.
 * The entries live by the object they work on: api_guard.c (the guard below, status strings,
 * the configuration), api_layout.c, api_plan.c, api_comm.c, api_exec.c (communicator plans)
 * and manifest.c.
 */
#ifndef RS_API_H
#define RS_API_H

#include "plugin/handles.h"

/* api_guard.c. Every public call that can fail starts with api_enter and returns through
 * api_leave, which logs a failure once. */
void api_enter(void);
reshard_status_t api_leave(const char *fn, reshard_status_t st);
reshard_status_t api_null_arg(const char *fn, const char *what);

/* api_plan.c. Checks a plan config and plans the tensors on topo (both public entry points:
 * reshard_plan_create and reshard_comm_plan_create). */
reshard_status_t api_plan_build(const char *fn, const reshard_tensor_t *tensors, int ntensors,
                                const struct rs_topo *topo, const reshard_plan_config_t *config,
                                int scope, struct rs_plan **out);

/* manifest.c. reshard_manifest_load from memory (name stands for the file in messages): the fuzz
 * target's entry. */
reshard_status_t manifest_load_buffer(const char *buf, size_t len, const char *name,
                                      reshard_manifest_t **out);

#endif
