/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the bootstrap's files share: the bootstrap object (struct boot) and its connections,
 * one collective turn (struct boot_coll), the id codec and the registry of listeners
 * (boot_id.c), and the frame moving and failure spreading of the collectives (boot_coll.c)
 * that the rendezvous (boot_rendezvous.c) and the launcher environment (boot_env.c) build on.
 */
#ifndef RS_BOOT_INT_H
#define RS_BOOT_INT_H

#include "bootstrap.h"

#include "base/error.h"
#include "transport/sock/sock.h"
#include "transport/sock/sock_frame.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define BOOT_VERSION         1
#define BOOT_SECRET_BYTES    32
#define BOOT_PEER_NAME_BYTES (SOCK_ADDR_STR + 24)

/* ---- the bootstrap object ---- */

struct boot_conn {
    int fd;
    int send_torn;                   /* a frame went out cut short: nothing more may follow it */
    char name[BOOT_PEER_NAME_BYTES]; /* "rank 3 (10.0.0.1:4242)" */
};

struct boot {
    int rank, size, timeout_ms;
    uint32_t seq;             /* collectives so far, to tell ranks out of step */
    struct boot_conn *conns;  /* by rank: rank 0 holds 1..size-1, a peer holds [0] */
    int *label;               /* [size]: the number each rank goes by in messages and reports */
    const atomic_int *cancel; /* collectives end when it turns non-zero (NULL: never) */
    reshard_status_t failed;  /* RESHARD_OK while usable */
    char fail_msg[RS_ERROR_MAX];
    char refusal[RS_ERROR_MAX];
    uint64_t sent, received; /* bytes of collectives, headers included */
};

/* One exchange in progress: the frame header its frames carry and when it must end. */
struct boot_coll {
    struct boot *b;
    struct sock_frame_hdr hdr;
    int64_t deadline;
    char what[64];               /* "allgather #3 on rank 2", for messages */
    struct sock_frame_error err; /* what a failed rank reported (origin -1: nothing) */
};

/* ---- ids (boot_id.c) ---- */

/* Layout: magic 0-3, version 4, family 5 (4 or 6), port 6-7, address 8-23, IPv6 scope 24-27,
 * secret 28-59, zeros after. */
void boot_id_encode(const union sock_addr *a, const unsigned char *secret, struct boot_id *id);
/* 0, or -1 when id is not one of ours. secret may be NULL. */
int boot_id_decode(const struct boot_id *id, union sock_addr *a, unsigned char *secret);
/* A string to BOOT_SECRET_BYTES (not cryptographic: see boot_id.c). */
void boot_secret_hash(const char *s, unsigned char *out);
/* Removes the id's listener from this process's registry: its socket, or -1. */
int boot_registry_take(const struct boot_id *id);
/* RESHARD_BOOT_PORT, checked to be a port (0: any). */
reshard_status_t boot_param_port(int *port);

/* ---- the bootstrap object and its collectives (boot_coll.c) ---- */

/* A bootstrap with no connection yet (NULL when out of memory); label as for boot_init_labeled. */
struct boot *boot_alloc(int rank, int size, const int *label, int timeout_ms);
/* One frame with rank `only`, or (only < 0) with every peer of rank 0 but `skip`: sent from,
 * or received into, base + rank * stride. */
reshard_status_t boot_coll_transfer(struct boot_coll *c, int only, int skip, int send, uint64_t len,
                                    unsigned char *base, size_t stride);
/* An exchange failed on this rank with st (its message is the thread's): makes the bootstrap
 * unusable and tells the others. err: what another rank reported, or NULL. */
reshard_status_t boot_fail(struct boot *b, reshard_status_t st, const struct sock_frame_error *err);

#endif
