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

/* api_guard.c: the live handles. api_live_add links a handle the caller is given (cannot
 * fail); api_live_take takes a reference (*refs + 1) on a linked one and says whether it was;
 * api_live_remove unlinks it and says whether it was linked (0: destroyed already, or never
 * made). A scan of the live plans and communicators: a handful in a job. */
void api_live_add(struct live_handle *h, atomic_int *refs);
int api_live_take(const struct live_handle *h);
int api_live_remove(struct live_handle *h);

/* api_comm.c. Every public call on a communicator holds it for its duration (a reference), so
 * that a reshard_comm_destroy from another thread leaves the teardown to the call's end; one
 * not live (destroyed) is refused (RESHARD_ERR_INVALID_ARG naming fn). api_comm_drop ends the
 * hold and returns st. */
struct reshard_comm;
reshard_status_t api_comm_hold(const char *fn, struct reshard_comm *c);
reshard_status_t api_comm_drop(struct reshard_comm *c, reshard_status_t st);

/* api_plan.c. The same for plans: a reference for each call in flight on a plan (calls on a
 * destroyed one are refused), the caller's given up by reshard_plan_destroy; the last
 * api_plan_release frees the plan and gives up its communicator's reference. api_plan_given
 * sets a new plan's caller reference and links it. */
void api_plan_given(struct reshard_plan *h);
reshard_status_t api_plan_hold(const char *fn, struct reshard_plan *h);
void api_plan_release(struct reshard_plan *h);

/* manifest.c. reshard_manifest_load from memory (name stands for the file in messages): the fuzz
 * target's entry. */
reshard_status_t manifest_load_buffer(const char *buf, size_t len, const char *name,
                                      reshard_manifest_t **out);

#endif
