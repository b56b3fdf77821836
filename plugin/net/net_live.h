/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The registry of live objects: what the plugin hands NCCL (contexts, listen, send and receive
 * comms, requests, registrations) and what a handle carries (a connection in progress) is a
 * handle into this table, never the object's address. A handle is a slot and the generation it
 * was issued with; closing the object retires the slot's generation, so a handle used after its
 * close, closed twice, or of another kind is recognised from the table alone, without reading
 * the memory the object had, and a stale handle never reaches an object that reused its slot.
 *
 * Handles are 64 bits: 0xA (so they are never a canonical user address, and never NULL), the
 * kind (4 bits), the generation (36 bits, from a counter that starts at a random value per
 * process) and the slot (20 bits: at most NET_LIVE_MAX objects live at once).
 */
#ifndef RS_NET_LIVE_H
#define RS_NET_LIVE_H

#include "base/reshard_status.h"

#include <stdint.h>

#define NET_LIVE_MAX (1u << 20)

enum net_kind {
    NET_KIND_CTX = 1,
    NET_KIND_LISTEN,
    NET_KIND_SEND,
    NET_KIND_RECV,
    NET_KIND_REQ,
    NET_KIND_MR,
    NET_KIND_STAGE, /* a connector's progress, carried in the handle */
    NET_KIND_COUNT
};

/* The kinds a lookup accepts: a bit per kind. */
#define NET_KINDS(k) (1u << (k))

/* A handle for obj of kind; NULL when NET_LIVE_MAX objects are live or memory is out (the
 * error is recorded). */
void *net_live_add(void *obj, enum net_kind kind);
/* The object behind handle h when h is live and of one of the kinds; else NULL, and *stale
 * (when not NULL) says whether h was issued by this table and has since been closed. */
void *net_live_get(const void *h, unsigned kinds, int *stale);
/* Retires h (a handle that is not live is ignored). */
void net_live_drop(const void *h);
/* Calls fn for every object live now of one of the kinds, with its handle, without the table's
 * lock (fn may close the object); an object closed meanwhile is skipped. RESHARD_ERR_NO_MEMORY
 * when the list of handles cannot be made. */
reshard_status_t net_live_each(unsigned kinds,
                               void (*fn)(void *h, void *obj, enum net_kind kind, void *arg),
                               void *arg);
/* Live handles: for tests and for the last finalize, which frees the table when none is. */
unsigned net_live_count(void);
/* Frees the table when nothing is live (the last finalize, or the library's unload). */
void net_live_release(void);
/* In a child just forked (pthread_atfork): calls forget for every live object, which are the
 * parent's, then starts an empty table, so that every handle the parent issued is refused.
 * The parent's table is left allocated, never freed or used. */
void net_live_fork_child(void (*forget)(void *obj, enum net_kind kind));
/* "context", "listen comm", ... for messages. */
const char *net_kind_name(enum net_kind kind);

#endif
